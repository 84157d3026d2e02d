//! As answers arrive: the checks the runtime makes of each agent's answer before it
//! uses it, that the envelope the answer carries signs exactly what it says, for this
//! run, side, dataset and request.

use serde_json::Value;
use tally_common::evidence::{AgentResult, DigestsHash, SignedBucket};
use tally_common::wire::AggregateResponse;

use crate::client::Digests;
use tally_engine::Side;

/// The side an answer signs it answered as: the side asked, or none from an agent
/// before sides were signed (its answer verifies nowhere, docs/evidence.md, but the run
/// is not refused for it).
fn check_side(p: &AgentResult, side: Side) -> Result<(), String> {
    match p.scope.side {
        Some(s) if s != side => Err(format!(
            "signs it answered as the {} side, asked as the {}",
            s.name(),
            side.name()
        )),
        _ => Ok(()),
    }
}

/// The parts of a signed answer every RPC shares.
fn check_common(
    p: &AgentResult,
    run_id: &str,
    side: Side,
    dataset: &str,
    rpc: &str,
    head: &str,
    asked: &Value,
) -> Result<(), String> {
    if p.run_id != run_id {
        return Err(format!("names run {:?}, not this run {run_id:?}", p.run_id));
    }
    check_side(p, side)?;
    if p.dataset != dataset {
        return Err(format!("names dataset {:?}, not {dataset:?}", p.dataset));
    }
    if p.rpc != rpc {
        return Err(format!("signs a {} answer, not {rpc}", p.rpc));
    }
    if p.release_log_head != head {
        return Err("names another release-log head than the answer".into());
    }
    check_request(p, asked)
}

/// The answer signs the request the coordinator sent (its RFC 8785 digest): an agent
/// (or anything between) that answered another request is refused, and the request
/// recorded beside the answer is one a verifier can check against the signature.
fn check_request(p: &AgentResult, asked: &Value) -> Result<(), String> {
    let sent = tally_common::request_json::digest(asked);
    if p.request_sha256 != sent {
        return Err(format!(
            "signs request {}, not the request sent ({sent})",
            p.request_sha256
        ));
    }
    Ok(())
}

/// The buckets of an aggregate as they are signed.
pub fn signed_buckets(r: &AggregateResponse) -> Vec<SignedBucket> {
    r.buckets
        .iter()
        .map(|b| SignedBucket::new(b.parent as u64, b.child as u64, b.count, b.sum, b.xor))
        .collect()
}

/// Checks that an Aggregate answer carries its agent's envelope over exactly what it
/// says, for this run and dataset (the signature itself is checked against the agent's
/// certificate by [`super::verify`]).
pub fn check_aggregate(
    run_id: &str,
    side: Side,
    dataset: &str,
    r: &AggregateResponse,
    asked: &Value,
) -> Result<(), String> {
    let env = r.envelope.as_ref().ok_or("is missing")?;
    let p = AgentResult::open(env)?;
    check_common(&p, run_id, side, dataset, "Aggregate", &r.release_log_head, asked)?;
    if p.buckets.as_deref() != Some(&signed_buckets(r)[..]) {
        return Err("signs other buckets than the answer's".into());
    }
    Ok(())
}

/// As [`check_aggregate`], for a Measures answer: the envelope signs its groups.
pub fn check_measures(
    run_id: &str,
    side: Side,
    dataset: &str,
    r: &tally_common::wire::measures::MeasuresResponse,
    asked: &Value,
) -> Result<(), String> {
    let env = r.envelope.as_ref().ok_or("is missing")?;
    let p = AgentResult::open(env)?;
    check_common(&p, run_id, side, dataset, "Measures", &r.release_log_head, asked)?;
    if p.groups_sha256.as_deref() != Some(tally_common::evidence::groups_sha256(&r.groups).as_str()) {
        return Err("signs other groups than the answer's".into());
    }
    Ok(())
}

/// The digests hash of a RowDigests answer.
pub fn digests_hash(d: &[tally_common::wire::RowDigest]) -> String {
    let mut h = DigestsHash::default();
    for r in d {
        h.add(r.key_hash, r.row_hash);
    }
    h.hex()
}

/// As [`check_aggregate`], for a collected RowDigests stream.
pub fn check_digests(
    run_id: &str,
    side: Side,
    dataset: &str,
    d: &Digests,
    asked: &Value,
) -> Result<(), String> {
    let env = d.envelope.as_ref().ok_or("is missing")?;
    let p = AgentResult::open(env)?;
    if p.run_id != run_id {
        return Err(format!("names run {:?}, not this run {run_id:?}", p.run_id));
    }
    check_side(&p, side)?;
    if p.dataset != dataset || p.rpc != "RowDigests" {
        return Err(format!(
            "signs {} of dataset {:?}, not RowDigests of {dataset:?}",
            p.rpc, p.dataset
        ));
    }
    if p.digests_sha256.as_deref() != Some(digests_hash(&d.digests).as_str()) {
        return Err("signs other digests than the stream's".into());
    }
    check_request(&p, asked)
}
