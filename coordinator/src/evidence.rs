//! Evidence a third party can check (DESIGN §12, docs/evidence.md): the agents' signed
//! answers as they arrive, the coordinator's signed statement and checkpoint when a run
//! ends, the bundle `tally evidence` writes, and the offline checks of `tally verify`.
//!
//! What is signed is always bytes kept as they were signed (DSSE payloads, the result
//! text, the run log's lines): nothing here re-serialises a signed document to check it.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::UnixTime;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tally_common::chain::{line_hash, verify_lines};
use tally_common::dsse::{AGENT_RESULT, CHECKPOINT, CertificateChecker, Envelope, IN_TOTO, Usage};
use tally_common::evidence::{AgentResult, DigestsHash, SignedBucket, hex64, parse_hex64};
use tally_common::seal::{TlsSigner, certificates_from_pem, dns_names};
use tally_common::wire::AggregateResponse;
use tally_common::wire::measures::{Labels, MeasureGroup};

use crate::client::Digests;
use crate::config::ClientTls;
use crate::runlog::RunLog;
use tally_engine::fidelity::Fidelity;
use tally_engine::result::{DiffCounts, RunResult};
use tally_engine::{Event, Side};

/// How far an agent's clock may be from the coordinator's: an answer's signed time must
/// fall between the run's start and its checkpoint, give or take this.
pub const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

use time::format_description::well_known::Rfc3339;

/// The bundle's `format`.
pub const FORMAT: &str = "tally-evidence/1";
/// The in-toto Statement's `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The Statement's `predicateType`.
pub const PREDICATE_TYPE: &str = "https://tally.dev/reconciliation/v1";

// ---------------------------------------------------------------------------------
// As answers arrive

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
/// certificate by [`verify`]).
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

// ---------------------------------------------------------------------------------
// When a run ends

/// The coordinator's signing identity: the key of its TLS client certificate, as the
/// certificate's first DNS name.
pub struct Signer {
    pub name: String,
    signer: TlsSigner,
    pub certificate_pem: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Signer {
    pub fn load(tls: &ClientTls) -> Result<Signer, String> {
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let cert = read(&tls.cert)?;
        let chain = certificates_from_pem(&cert).map_err(|e| format!("{}: {e}", tls.cert.display()))?;
        let name = dns_names(&chain[0]).into_iter().next().ok_or_else(|| {
            format!(
                "{} has no DNS name to sign evidence as (verifiers match names, never common names)",
                tls.cert.display()
            )
        })?;
        let signer =
            TlsSigner::from_pem(&read(&tls.key)?).map_err(|e| format!("{}: {e}", tls.key.display()))?;
        Ok(Signer {
            name,
            signer,
            certificate_pem: String::from_utf8(cert)
                .map_err(|_| format!("{}: not PEM text", tls.cert.display()))?,
        })
    }

    pub fn sign(&self, payload_type: &str, payload: &[u8]) -> Result<Envelope, String> {
        Envelope::sign(payload_type, payload, &self.name, &self.signer).map_err(|e| e.to_string())
    }
}

/// One side's level-1 totals as the statement states them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Totals {
    pub agent: String,
    pub dataset: String,
    pub count: u64,
    pub sum: String,
    #[serde(deserialize_with = "nullable")]
    pub xor: Option<String>,
    /// The window the agent signed it read (absent for a run without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<tally_common::segment::Window>,
}

/// The agent that signed a side's answers, and the dataset it answered for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideAgent {
    /// Its certificate's DNS name it signs as (its envelopes' keyid).
    pub agent: String,
    pub dataset: String,
}

/// Each side's signing agent (`null` for a side that never answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideAgents {
    #[serde(deserialize_with = "nullable")]
    pub source: Option<SideAgent>,
    #[serde(deserialize_with = "nullable")]
    pub target: Option<SideAgent>,
}

impl SideAgents {
    fn get(&self, side: Side) -> Option<&SideAgent> {
        match side {
            Side::Source => self.source.as_ref(),
            Side::Target => self.target.as_ref(),
        }
    }
}

/// Each side's signing agent from a run's events: the agent and dataset of the first
/// answer the event records for that side.
fn side_agents(events: &[Value]) -> SideAgents {
    let mut out = SideAgents {
        source: None,
        target: None,
    };
    for v in events {
        let Some(env) = envelope_of(v) else { continue };
        let Ok(p) = serde_json::from_value::<Envelope>(env)
            .map_err(|e| e.to_string())
            .and_then(|e| AgentResult::open(&e))
        else {
            continue;
        };
        let slot = match v["side"].as_str() {
            Some("source") => &mut out.source,
            Some("target") => &mut out.target,
            _ => continue,
        };
        slot.get_or_insert(SideAgent {
            agent: p.agent,
            dataset: p.dataset,
        });
    }
    out
}

/// A member that must be present and may be `null` (serde reads a missing `Option`
/// as `None`; a statement that leaves out a side's totals is refused, not read as a
/// run that ended before them).
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// The Statement's predicate (`predicateType` [`PREDICATE_TYPE`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    pub run_id: String,
    pub spec_sha256: String,
    pub verdict: String,
    /// The result's `fidelity`: `full`, or `reduced` naming each column compared below
    /// what a side stores. Absent in statements signed before it (and for a run that
    /// ended before its columns were resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<Fidelity>,
    pub hash_method: String,
    pub canonical_form_version: u32,
    /// The privacy level the run reported at.
    pub level: String,
    /// Each side's signing agent and dataset: every answer of a side is signed by it.
    /// Absent only in statements signed before it, which no longer verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<SideAgents>,
    /// `null` when the run ended before that side's level-1 answer (never absent).
    #[serde(deserialize_with = "nullable")]
    pub source: Option<Totals>,
    #[serde(deserialize_with = "nullable")]
    pub target: Option<Totals>,
    /// The number of differing leaf segments.
    pub leaves: u64,
    #[serde(deserialize_with = "nullable")]
    pub difference_counts: Option<DiffCounts>,
    pub false_match_bound: f64,
    pub started: String,
    pub finished: String,
    pub events_head: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// An in-toto Statement v1 over the run's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

/// A signed head of a chain (payloadType [`CHECKPOINT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub seq: u64,
    pub head: String,
    pub time: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The SHA-256 of a spec's RFC 8785 canonical JSON.
pub fn spec_sha256(spec: &Value) -> Result<String, String> {
    let text = tally_common::jcs::canonical_json(&spec.to_string()).map_err(|e| format!("the spec: {e}"))?;
    Ok(sha256_hex(text.as_bytes()))
}

/// The sum of buckets: count, SUM mod 2^64, XOR (when every bucket has one).
fn total(buckets: &[SignedBucket]) -> Result<(u64, u64, Option<u64>), String> {
    let (mut count, mut sum, mut xor) = (0u64, 0u64, Some(0u64));
    for b in buckets {
        count = count.checked_add(b.count).ok_or("the bucket counts overflow")?;
        sum = sum.wrapping_add(
            parse_hex64(&b.sum).ok_or_else(|| format!("sum {:?} is not 16 hex digits", b.sum))?,
        );
        xor = match (xor, &b.xor) {
            (Some(x), Some(t)) => {
                Some(x ^ parse_hex64(t).ok_or_else(|| format!("xor {t:?} is not 16 hex digits"))?)
            }
            _ => None,
        };
    }
    Ok((count, sum, xor))
}

/// Mode measures: a fingerprint of one side's level-1 groups, equal on both sides
/// exactly when every group's labels, count and measure digests are: the first 8 bytes
/// of the SHA-256 of each group's row string (labels, count, then each digest as 16 hex
/// digits), in order (docs/evidence.md).
pub fn groups_fingerprint(groups: &[tally_common::wire::measures::MeasureGroup]) -> u64 {
    let mut h = Sha256::new();
    for g in groups {
        let count = g.count.to_string();
        let digests: Vec<String> = g.measures.iter().map(|m| hex64(m.digest)).collect();
        let row = tally_common::canonical::row_string(
            g.labels
                .iter()
                .map(Option::as_deref)
                .chain(std::iter::once(Some(count.as_str())))
                .chain(digests.iter().map(|d| Some(d.as_str()))),
        );
        h.update(row.as_bytes());
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Whether a level-1 Measures answer was asked for the spec's first group_by level and
/// its measures, in order (names compared as the run matches columns: ignoring case).
fn scope_is_specs(scope: &tally_common::evidence::Scope, spec: &Value) -> Result<(), String> {
    let spec: tally_engine::spec::Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let first: Vec<String> = spec
        .group_by
        .iter()
        .take(1)
        .map(|g| match g.granularity() {
            Some(gr) => format!("{}:{}", g.column(), gr.name()),
            None => g.column().to_string(),
        })
        .collect();
    let same = |a: &[String], b: &[String]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.eq_ignore_ascii_case(y))
    };
    match (&scope.group_by, &scope.measures) {
        (Some(g), Some(m)) if same(g, &first) && same(m, &spec.measures) => Ok(()),
        (g, m) => Err(format!(
            "the agent signed groups by {g:?} of measures {m:?}; the spec's first level is {first:?} of {:?}",
            spec.measures
        )),
    }
}

/// Mode measures: whether both sides' level-1 groups agree, by the run's comparison
/// (counts exactly; measures by digest, or in clear within the spec's tolerance).
fn measures_agree(events: &[Value], spec: &Value) -> Result<bool, String> {
    let spec: tally_engine::spec::Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let mut sides: [Option<tally_common::wire::measures::MeasuresResponse>; 2] = [None, None];
    for v in events
        .iter()
        .filter(|v| v["event"] == "measured" && v["level"] == 1)
    {
        if let Ok(Event::Measured { side, response, .. }) = serde_json::from_value::<Event>(v.clone()) {
            sides[side as usize] = Some(response);
        }
    }
    let [Some(s), Some(t)] = sides else {
        return Ok(false);
    };
    let tolerances: Vec<_> = spec.measures.iter().map(|m| spec.tolerance_of(m)).collect();
    fn index(r: &tally_common::wire::measures::MeasuresResponse) -> BTreeMap<&Labels, &MeasureGroup> {
        r.groups.iter().map(|g| (&g.labels, g)).collect()
    }
    let (a, b) = (index(&s), index(&t));
    if a.len() != s.groups.len() || b.len() != t.groups.len() || a.keys().ne(b.keys()) {
        return Ok(false);
    }
    let n = tolerances.len();
    Ok(a.iter().all(|(labels, x)| {
        let y = b[*labels];
        x.count == y.count
            && x.measures.len() == n
            && y.measures.len() == n
            && tally_engine::measures::compare_group(x, y, &tolerances)
                .0
                .is_empty()
    }))
}

/// Each side's level-1 totals from the run's events: the signed buckets of its one
/// level-1 aggregate answer (in mode measures: the count and fingerprint of its
/// level-1 groups), which must cover the whole dataset.
fn level_one(events: &[Value]) -> Result<[Option<Totals>; 2], String> {
    let spec = events
        .iter()
        .find(|e| e["event"] == "started")
        .map(|e| e["spec"].clone())
        .unwrap_or_default();
    // a run's level-1 answers are of its mode's kind: Measures answers never stand
    // for a checksum run's totals, nor Aggregate answers for a measures run's
    let measures_mode = spec["mode"] == "measures";
    let wanted = if measures_mode { "measured" } else { "aggregated" };
    type Answer = (
        String,
        String,
        Vec<SignedBucket>,
        Option<tally_common::segment::Window>,
    );
    let mut out: [Option<Answer>; 2] = [None, None];
    let mut scopes: [Option<tally_common::evidence::Scope>; 2] = [None, None];
    for v in events {
        if (v["event"] == "aggregated" || v["event"] == "measured") && v["event"] != wanted {
            return Err(format!(
                "event {} is a {} answer in a run of mode {}",
                v["seq"],
                v["event"],
                if measures_mode {
                    "measures"
                } else {
                    "checksum or count"
                }
            ));
        }
        if v["event"] != wanted || v["level"] != 1 {
            continue;
        }
        let (side, envelope, groups) = match serde_json::from_value::<Event>(v.clone()) {
            Ok(Event::Aggregated { side, response, .. }) => (side, response.envelope, None),
            Ok(Event::Measured { side, response, .. }) => (side, response.envelope, Some(response.groups)),
            _ => return Err(format!("event {} does not load", v["seq"])),
        };
        let env = envelope.as_ref().ok_or("a level-1 answer is unsigned")?;
        let p = AgentResult::open(env)?;
        let slot = &mut out[side as usize];
        if slot.is_some() {
            return Err(format!("the {} side has two level-1 answers", side.name()));
        }
        if !p.scope.whole {
            return Err(format!(
                "the {} side's level-1 answer (event {}) was not asked of the whole dataset",
                side.name(),
                v["seq"]
            ));
        }
        // a measures answer's groups stand for one bucket: their count and fingerprint,
        // of the spec's first group_by level and its measures, as the agent signed
        let buckets = match &groups {
            Some(g) => {
                scope_is_specs(&p.scope, &spec).map_err(|m| format!("event {}: {m}", v["seq"]))?;
                if p.groups_sha256.as_deref() != Some(tally_common::evidence::groups_sha256(g).as_str()) {
                    return Err(format!(
                        "event {}: the groups are not the ones the agent signed",
                        v["seq"]
                    ));
                }
                vec![SignedBucket::new(
                    0,
                    0,
                    g.iter().map(|g| g.count).sum(),
                    groups_fingerprint(g),
                    None,
                )]
            }
            None => p.buckets.unwrap_or_default(),
        };
        *slot = Some((p.agent, p.dataset, buckets, p.scope.window.clone()));
        scopes[side as usize] = Some(p.scope);
    }
    if let [Some(s), Some(t)] = &scopes
        && s.window != t.window
    {
        return Err(format!(
            "the sides' level-1 answers read different windows: source {:?}, target {:?}",
            s.window, t.window
        ));
    }
    if let [Some(s), Some(t)] = &scopes
        && (s.method != t.method || s.columns.len() != t.columns.len() || s.key_len != t.key_len)
    {
        return Err(format!(
            "the sides' level-1 answers hash differently: source {} over {} columns ({} key), target {} over {} ({} key)",
            s.method,
            s.columns.len(),
            s.key_len,
            t.method,
            t.columns.len(),
            t.key_len
        ));
    }
    let mut totals = [None, None];
    for (i, s) in out.into_iter().enumerate() {
        if let Some((agent, dataset, buckets, window)) = s {
            let (count, sum, xor) = total(&buckets)?;
            totals[i] = Some(Totals {
                agent,
                dataset,
                count,
                sum: hex64(sum),
                xor: xor.map(hex64),
                window,
            });
        }
    }
    Ok(totals)
}

/// Signs a finished run's evidence and appends it to its record as one `evidence`
/// event: the result text, the statement over it, the checkpoint of the run's log head
/// before this event, and the signer's certificate. A run sealed already is left as
/// it is. Call only once the run's last other event is in.
pub async fn seal_run(
    log: &dyn RunLog,
    run_id: &str,
    result: &RunResult,
    signer: &Signer,
) -> Result<(), String> {
    let lines = log.verified_lines(run_id).await.map_err(|e| e.to_string())?;
    if lines.iter().any(|(_, v)| v["event"] == "evidence") {
        return Ok(());
    }
    let Some((last, _)) = lines.last() else {
        return Err(format!("run {run_id} has no events"));
    };
    let head = line_hash(last);
    let events: Vec<Value> = lines.iter().map(|(_, v)| v.clone()).collect();
    let result_text = serde_json::to_string(result).map_err(|e| e.to_string())?;
    let started = events
        .iter()
        .find(|e| e["event"] == "started")
        .ok_or_else(|| format!("run {run_id} has no started event"))?;
    let [source, target] = level_one(&events)?;
    let predicate = Predicate {
        run_id: run_id.to_string(),
        spec_sha256: spec_sha256(&started["spec"])?,
        verdict: serde_json::to_value(&result.verdict)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        fidelity: result.fidelity.clone(),
        hash_method: result.hash_method.clone(),
        canonical_form_version: tally_common::canonical::CANONICAL_FORM_VERSION,
        level: result.level.clone(),
        agents: Some(side_agents(&events)),
        source,
        target,
        leaves: result.leaves.len() as u64,
        difference_counts: result.difference_counts.clone(),
        false_match_bound: result.false_match_bound,
        started: started["started"].as_str().unwrap_or_default().to_string(),
        finished: tally_common::evidence::now_rfc3339(),
        events_head: head.clone(),
    };
    let statement = Statement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: format!("tally-run:{run_id}"),
            digest: BTreeMap::from([("sha256".to_string(), sha256_hex(result_text.as_bytes()))]),
        }],
        predicate_type: PREDICATE_TYPE.into(),
        predicate,
    };
    let statement = signer.sign(
        IN_TOTO,
        &serde_json::to_vec(&statement).map_err(|e| e.to_string())?,
    )?;
    let checkpoint = Checkpoint {
        seq: lines.len() as u64,
        head,
        time: tally_common::evidence::now_rfc3339(),
    };
    let checkpoint = signer.sign(
        CHECKPOINT,
        &serde_json::to_vec(&checkpoint).map_err(|e| e.to_string())?,
    )?;
    let event = json!({"event": "evidence", "result": result_text, "statement": statement,
                       "checkpoint": checkpoint, "signer": signer.name,
                       "certificate": signer.certificate_pem});
    let Value::Object(fields) = event else {
        unreachable!()
    };
    log.append(run_id, fields).await.map_err(|e| e.to_string())?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// The bundle

/// A certificate (leaf first, then intermediates) of a party that signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertEntry {
    /// The DNS name the party signs as (its envelopes' keyid).
    pub name: String,
    /// `coordinator` or `agent`.
    pub role: String,
    pub pem: String,
}

/// `tally-evidence/1` (docs/evidence.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub format: String,
    /// Base64 of the result's exact bytes.
    pub result: String,
    pub statement: Envelope,
    pub agent_results: Vec<Envelope>,
    /// Base64 of each run-log line up to the checkpointed head.
    pub events: Vec<String>,
    pub checkpoint: Envelope,
    pub certificates: Vec<CertEntry>,
}

/// The envelope an event carries, if it is an agent's answer: `Some(None)` for an
/// answer without one.
fn answer_envelope(v: &Value) -> Option<Option<Value>> {
    match v["event"].as_str() {
        Some("aggregated") => Some(v["response"].get("envelope").cloned()),
        Some("digests") => Some(v.get("envelope").cloned()),
        Some("measured") | Some("rechecked") => Some(v["response"].get("envelope").cloned()),
        _ => None,
    }
}

/// The envelope an event carries, if it is a signed answer.
fn envelope_of(v: &Value) -> Option<Value> {
    answer_envelope(v).flatten()
}

/// The bundle of a sealed run, from its record.
pub async fn bundle(log: &dyn RunLog, run_id: &str) -> Result<Bundle, BundleError> {
    let lines = log
        .verified_lines(run_id)
        .await
        .map_err(|e| BundleError::Store(e.to_string()))?;
    if lines.is_empty() {
        return Err(BundleError::NoRun(run_id.to_string()));
    }
    let Some(at) = lines.iter().position(|(_, v)| v["event"] == "evidence") else {
        return Err(BundleError::NotSealed(run_id.to_string()));
    };
    let sealed = &lines[at].1;
    let field = |k: &str| -> Result<Envelope, BundleError> {
        serde_json::from_value(sealed[k].clone())
            .map_err(|e| BundleError::Store(format!("run {run_id}: its evidence event's {k}: {e}")))
    };
    let (statement, checkpoint) = (field("statement")?, field("checkpoint")?);
    let events = &lines[..at];
    let mut agent_results = Vec::new();
    let mut agents: Vec<CertEntry> = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for (_, v) in events {
        if let Some(e) = envelope_of(v) {
            let env: Envelope = serde_json::from_value(e)
                .map_err(|e| BundleError::Store(format!("event {}: its envelope: {e}", v["seq"])))?;
            if let Ok(p) = AgentResult::open(&env) {
                names
                    .entry(v["side"].as_str().unwrap_or_default().to_string())
                    .or_insert(p.agent);
            }
            agent_results.push(env);
        }
    }
    if let Some((_, d)) = events.iter().find(|(_, v)| v["event"] == "described") {
        for side in ["source", "target"] {
            let pem = d[side]["certificate_pem"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if pem.is_empty() {
                continue;
            }
            let name = match names.get(side) {
                Some(n) => n.clone(),
                None => certificates_from_pem(pem.as_bytes())
                    .ok()
                    .and_then(|c| c.first().map(|l| dns_names(l)))
                    .and_then(|n| n.into_iter().next())
                    .unwrap_or_default(),
            };
            // an agent reconciling two of its own datasets signs once for both
            if !agents.iter().any(|a| a.name == name && a.pem == pem) {
                agents.push(CertEntry {
                    name,
                    role: "agent".into(),
                    pem,
                });
            }
        }
    }
    let mut certificates = vec![CertEntry {
        name: sealed["signer"].as_str().unwrap_or_default().to_string(),
        role: "coordinator".into(),
        pem: sealed["certificate"].as_str().unwrap_or_default().to_string(),
    }];
    certificates.extend(agents);
    Ok(Bundle {
        format: FORMAT.into(),
        result: STANDARD.encode(sealed["result"].as_str().unwrap_or_default()),
        statement,
        agent_results,
        events: events.iter().map(|(l, _)| STANDARD.encode(l)).collect(),
        checkpoint,
        certificates,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("no run {0}")]
    NoRun(String),
    #[error("run {0} has no evidence yet: it is running, or it ended before this coordinator signed runs")]
    NotSealed(String),
    #[error("{0}")]
    Store(String),
}

// ---------------------------------------------------------------------------------
// tally verify

/// One check of [`verify`]: what was checked and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub outcome: Result<String, String>,
}

/// Whether every check passed.
pub fn valid(checks: &[Check]) -> bool {
    !checks.is_empty() && checks.iter().all(|c| c.outcome.is_ok())
}

struct Checks(Vec<Check>);

impl Checks {
    /// Records a check; `false` (stop) when it failed.
    fn check(&mut self, name: impl Into<String>, outcome: Result<String, String>) -> bool {
        let ok = outcome.is_ok();
        self.0.push(Check {
            name: name.into(),
            outcome,
        });
        ok
    }
}

/// `YYYY-MM-DDTHH:MM:SS` then, with `fraction`, an optional `.` and 1 to 9 digits,
/// then `Z`: RFC 3339 in UTC, never `+00:00` nor lowercase `t`/`z`; a real time.
fn utc_time(t: &str, fraction: bool) -> Result<time::OffsetDateTime, String> {
    let b = t.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let shape = b.len() >= 20
        && (0..19).all(|i| match i {
            4 | 7 => b[i] == b'-',
            10 => b[i] == b'T',
            13 | 16 => b[i] == b':',
            _ => digit(i),
        })
        && b[b.len() - 1] == b'Z'
        && match b.len() {
            20 => true,
            n => fraction && b[19] == b'.' && (22..=30).contains(&n) && (20..n - 1).all(digit),
        };
    if !shape {
        return Err(format!(
            "time {t:?} is not RFC 3339 in UTC{} (YYYY-MM-DDTHH:MM:SS{}Z)",
            if fraction { "" } else { " in whole seconds" },
            if fraction { "[.fraction]" } else { "" }
        ));
    }
    time::OffsetDateTime::parse(t, &Rfc3339).map_err(|e| format!("time {t:?}: {e}"))
}

/// 64 lowercase hex digits (a SHA-256).
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The shape of an agent's payload that no other check reads: its digests are 64
/// lowercase hex digits, its time RFC 3339 UTC in whole seconds, `key_len` between 1
/// and the number of columns, and a seal exactly when the method is sealed.
fn payload_shape(sp: &AgentResult) -> Result<time::OffsetDateTime, String> {
    for (field, v) in [
        ("request_sha256", Some(&sp.request_sha256)),
        ("release_log_head", Some(&sp.release_log_head)),
        ("digests_sha256", sp.digests_sha256.as_ref()),
        ("groups_sha256", sp.groups_sha256.as_ref()),
    ] {
        if let Some(v) = v
            && !is_sha256_hex(v)
        {
            return Err(format!("its {field} {v:?} is not 64 lowercase hex digits"));
        }
    }
    let scope = &sp.scope;
    if scope.key_len == 0 || scope.key_len > scope.columns.len() {
        return Err(format!(
            "its scope's key_len {} is not between 1 and its {} columns",
            scope.key_len,
            scope.columns.len()
        ));
    }
    if scope.method.starts_with("sealed_") != scope.seal.is_some() {
        return Err(if scope.seal.is_some() {
            format!(
                "its method {} is not sealed and its scope names a seal",
                scope.method
            )
        } else {
            format!(
                "its method {} is sealed and its scope names no seal",
                scope.method
            )
        });
    }
    utc_time(&sp.time, false).map_err(|e| format!("its {e}"))
}

/// No object of a JSON text has two members of one name (docs/evidence.md: a parser
/// that keeps the first and one that keeps the last would read two documents).
fn unique_members(what: &str, bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))?;
    tally_common::jcs::unique_members(text).map_err(|e| format!("{what}: {e}"))
}

fn b64(field: &str, text: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(text)
        .map_err(|_| format!("{field} is not strict base64"))
}

/// Checks a bundle offline against `ca_pem` (one or more CA certificates), in the
/// order of docs/evidence.md; stops at the first check that fails.
pub fn verify(bundle_text: &[u8], ca_pem: &[u8]) -> Vec<Check> {
    let mut c = Checks(Vec::new());
    let _ = verify_into(&mut c, bundle_text, ca_pem);
    c.0
}

/// [`verify`], then, against an export of the whole log (`tally audit export`), the
/// log's own checks (`crate::ledger::verify`, with `since`) and that the bundle's events
/// are, byte for byte, the first lines of its run in the export, and that a ledger line
/// pins the run at or past them: the bundle is the run the signed log holds.
pub fn verify_with_log(
    bundle_text: &[u8],
    ca_pem: &[u8],
    export: &str,
    since: Option<&crate::ledger::SignedCheckpoint>,
) -> Vec<Check> {
    let mut checks = verify(bundle_text, ca_pem);
    if !valid(&checks) {
        return checks;
    }
    let log = crate::ledger::verify(export, ca_pem, since);
    let log_ok = valid(&log);
    checks.extend(log.into_iter().map(|c| Check {
        name: format!("log: {}", c.name),
        outcome: c.outcome,
    }));
    if !log_ok {
        return checks;
    }
    let outcome = (|| {
        let b: Bundle = serde_json::from_slice(bundle_text).map_err(|e| e.to_string())?;
        let mut lines = Vec::with_capacity(b.events.len());
        for e in &b.events {
            lines.push(
                String::from_utf8(STANDARD.decode(e).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?,
            );
        }
        let first: Value = serde_json::from_str(lines.first().ok_or("the bundle has no events")?)
            .map_err(|e| e.to_string())?;
        let run = first["run"].as_str().unwrap_or_default().to_string();
        let in_log: Vec<&str> = export
            .lines()
            .filter(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .is_some_and(|v| v["run"] == run.as_str())
            })
            .collect();
        if in_log.len() < lines.len() || lines.iter().zip(&in_log).any(|(a, b)| a != b) {
            return Err(format!(
                "the bundle's {} events are not the first lines of run {run} in the log ({} lines there)",
                lines.len(),
                in_log.len()
            ));
        }
        let pinned = export
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["run"] == crate::ledger::LEDGER)
            .flat_map(|v| v["runs"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["run"] == run.as_str())
            .filter_map(|r| r["seq"].as_u64())
            .max()
            .unwrap_or(0);
        if pinned < lines.len() as u64 {
            return Err(format!(
                "the log's ledger pins run {run} only up to line {pinned}, the bundle has {} events",
                lines.len()
            ));
        }
        Ok(format!(
            "its {} events are run {run}'s first lines in the log, pinned by its ledger (up to line {pinned})",
            lines.len()
        ))
    })();
    checks.push(Check {
        name: "bundle in the log".into(),
        outcome,
    });
    checks
}

fn verify_into(c: &mut Checks, bundle_text: &[u8], ca_pem: &[u8]) -> Option<()> {
    let checker = CertificateChecker::from_ca_pem(ca_pem);
    if !c.check(
        "the CA",
        checker
            .as_ref()
            .map(|_| "loaded".to_string())
            .map_err(Clone::clone),
    ) {
        return None;
    }
    let checker = checker.ok()?;
    let bundle: Result<Bundle, String> = unique_members("the bundle", bundle_text)
        .and_then(|()| serde_json::from_slice(bundle_text).map_err(|e| format!("not a bundle: {e}")))
        .and_then(|b: Bundle| {
            if b.format == FORMAT {
                Ok(b)
            } else {
                Err(format!("format is {:?}, expected {FORMAT:?}", b.format))
            }
        });
    if !c.check(
        "bundle format",
        bundle.as_ref().map(|_| FORMAT.to_string()).map_err(Clone::clone),
    ) {
        return None;
    }
    let b = bundle.ok()?;

    // the certificates are checked at the checkpoint's time: when the coordinator says
    // it signed (an expired certificate does not void evidence signed while it was valid)
    let at = b
        .checkpoint
        .payload_bytes()
        .map_err(|e| e.to_string())
        .and_then(|p| {
            unique_members("the checkpoint payload", &p)?;
            serde_json::from_slice::<Checkpoint>(&p).map_err(|e| format!("checkpoint payload: {e}"))
        })
        .and_then(|cp| utc_time(&cp.time, false).map_err(|e| format!("the checkpoint's {e}")));
    let shown = at
        .as_ref()
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default();
    if !c.check(
        "checkpoint time",
        at.as_ref()
            .map(|_| format!("{shown}: certificates are checked as of then"))
            .map_err(Clone::clone),
    ) {
        return None;
    }
    let signed_at = at.ok()?;
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        signed_at.unix_timestamp().max(0) as u64
    ));
    let mut certs: BTreeMap<(String, &str), Vec<u8>> = BTreeMap::new();
    for (i, e) in b.certificates.iter().enumerate() {
        let name = format!("certificates[{i}] ({} {:?})", e.role, e.name);
        let usage = match e.role.as_str() {
            "coordinator" => Some(Usage::Coordinator),
            "agent" => Some(Usage::Agent),
            _ => None,
        };
        let outcome = (|| {
            let usage = usage.ok_or_else(|| format!("role {:?} is neither coordinator nor agent", e.role))?;
            let chain = certificates_from_pem(e.pem.as_bytes())?;
            checker
                .check(&chain, &e.name, usage, at)
                .map_err(|e| e.to_string())?;
            let role = if usage == Usage::Agent {
                "agent"
            } else {
                "coordinator"
            };
            if certs.insert((e.name.clone(), role), chain[0].clone()).is_some() {
                return Err("a second certificate for the same name and role".to_string());
            }
            Ok("chains to the CA, for its role and name".to_string())
        })();
        if !c.check(name, outcome) {
            return None;
        }
    }
    let signed_by =
        |env: &Envelope, role: &'static str, payload_type: &str| -> Result<(String, Vec<u8>), String> {
            let [sig] = env.signatures.as_slice() else {
                return Err(format!("{} signatures, expected one", env.signatures.len()));
            };
            let cert = certs.get(&(sig.keyid.clone(), role)).ok_or_else(|| {
                format!(
                    "signed as {:?}, which has no {role} certificate in the bundle",
                    sig.keyid
                )
            })?;
            let payload = env
                .verify(payload_type, &sig.keyid, cert)
                .map_err(|e| e.to_string())?;
            Ok((sig.keyid.clone(), payload))
        };

    // the statement
    let statement = signed_by(&b.statement, "coordinator", IN_TOTO);
    if !c.check(
        "statement signature",
        statement
            .as_ref()
            .map(|(k, _)| format!("by coordinator {k:?}"))
            .map_err(Clone::clone),
    ) {
        return None;
    }
    let (coordinator, payload) = statement.ok()?;
    let st: Result<Statement, String> = unique_members("the statement payload", &payload)
        .and_then(|()| serde_json::from_slice(&payload).map_err(|e| format!("does not parse: {e}")))
        .and_then(|s: Statement| {
            if s.type_ != STATEMENT_TYPE || s.predicate_type != PREDICATE_TYPE {
                return Err(format!(
                    "_type {:?} / predicateType {:?}",
                    s.type_, s.predicate_type
                ));
            }
            utc_time(&s.predicate.started, true).map_err(|e| format!("started: {e}"))?;
            // one spelling of a fidelity: absent or an object (never null), and a full
            // one without a `columns` member (docs/evidence.md, the statement)
            let raw: Value = serde_json::from_slice(&payload).unwrap_or_default();
            match raw["predicate"].get("fidelity") {
                Some(Value::Null) => {
                    return Err("the predicate's fidelity is null (absent, or an object)".into());
                }
                Some(f)
                    if f.get("columns")
                        .is_some_and(|c| c.as_array().is_some_and(Vec::is_empty)) =>
                {
                    return Err(
                        "the predicate's fidelity lists an empty columns member (a full fidelity has none)"
                            .into(),
                    );
                }
                _ => {}
            }
            utc_time(&s.predicate.finished, false).map_err(|e| format!("finished: {e}"))?;
            match s.subject.as_slice() {
                [one] if one.name == format!("tally-run:{}", s.predicate.run_id) => Ok(s),
                _ => Err("the subject must be the one result, named tally-run:<run_id>".into()),
            }
        });
    if !c.check(
        "statement",
        st.as_ref()
            .map(|s| format!("run {}", s.predicate.run_id))
            .map_err(Clone::clone),
    ) {
        return None;
    }
    let st = st.ok()?;
    let p = &st.predicate;
    let run_id = p.run_id.as_str();

    // the result
    let result = b64("result", &b.result).and_then(|bytes| {
        let want = st.subject[0].digest.get("sha256").cloned().unwrap_or_default();
        if sha256_hex(&bytes) == want {
            unique_members("the result", &bytes)?;
            Ok(bytes)
        } else {
            Err("the SHA-256 of the result bytes is not the statement's subject digest".into())
        }
    });
    if !c.check(
        "result digest",
        result
            .as_ref()
            .map(|r| format!("{} bytes", r.len()))
            .map_err(Clone::clone),
    ) {
        return None;
    }
    let result_json: Value = serde_json::from_slice(&result.ok()?).unwrap_or(Value::Null);
    let outcome = (|| {
        let r = &result_json;
        if !r.is_object() {
            return Err("the result is not a JSON object".to_string());
        }
        let same = |k: &str, v: Value| {
            if r[k] == v {
                Ok(())
            } else {
                Err(format!("the result's {k} is {}, the statement's {v}", r[k]))
            }
        };
        same("verdict", json!(p.verdict))?;
        same("hash_method", json!(p.hash_method))?;
        same("level", json!(p.level))?;
        if r["false_match_bound"].as_f64().map(f64::to_bits) != Some(p.false_match_bound.to_bits()) {
            return Err(format!(
                "the result's false_match_bound is {}, the statement's {}",
                r["false_match_bound"], p.false_match_bound
            ));
        }
        let leaves = r["leaves"]
            .as_array()
            .ok_or("the result has no leaves list")?
            .len() as u64;
        if leaves != p.leaves {
            return Err(format!(
                "the result has {leaves} leaves, the statement {}",
                p.leaves
            ));
        }
        same(
            "difference_counts",
            serde_json::to_value(&p.difference_counts).unwrap_or_default(),
        )?;
        same("fidelity", serde_json::to_value(&p.fidelity).unwrap_or_default())?;
        if p.fidelity.as_ref().is_some_and(|f| !f.consistent()) {
            return Err("the statement's fidelity is reduced without a column, or full with one".into());
        }
        Ok("says what the statement says".to_string())
    })();
    if !c.check("result", outcome) {
        return None;
    }

    // the events: one chain of this run, ending at the statement's head
    let mut lines = Vec::with_capacity(b.events.len());
    for (i, e) in b.events.iter().enumerate() {
        match b64(&format!("events[{i}]"), e)
            .and_then(|l| String::from_utf8(l).map_err(|_| format!("events[{i}] is not UTF-8")))
            .and_then(|l| unique_members(&format!("events[{i}]"), l.as_bytes()).map(|()| l))
        {
            Ok(l) => lines.push(l),
            Err(e) => {
                c.check("event chain", Err(e));
                return None;
            }
        }
    }
    if lines.is_empty() {
        c.check("event chain", Err("the bundle has no events".into()));
        return None;
    }
    if let Some(i) = lines.iter().position(|l| l.trim().is_empty()) {
        c.check("event chain", Err(format!("events[{i}] is a blank line")));
        return None;
    }
    // a log line is one line: the export (`tally audit export`) writes one per line
    if let Some(i) = lines.iter().position(|l| l.contains(['\n', '\r'])) {
        c.check("event chain", Err(format!("events[{i}] holds a line break")));
        return None;
    }
    let mut events = Vec::with_capacity(lines.len());
    let chained = verify_lines("events", lines.iter().cloned().map(Ok), |v| {
        if v["run"] != run_id {
            return Err(format!("names run {}, not {run_id}", v["run"]));
        }
        events.push(v);
        Ok(())
    })
    .map_err(|e| e.to_string())
    .and_then(|(seq, head)| {
        if head == p.events_head {
            Ok(format!("{seq} events link, ending at the statement's head"))
        } else {
            Err(format!(
                "the events end at {head}, the statement says {}",
                p.events_head
            ))
        }
    });
    if !c.check("event chain", chained) {
        return None;
    }

    // the checkpoint
    let cp = signed_by(&b.checkpoint, "coordinator", CHECKPOINT).and_then(|(k, payload)| {
        let cp: Checkpoint = serde_json::from_slice(&payload).map_err(|e| format!("does not parse: {e}"))?;
        if cp.head != p.events_head || cp.seq != events.len() as u64 {
            return Err(format!(
                "signs seq {} head {}, the events end at seq {} head {}",
                cp.seq,
                cp.head,
                events.len(),
                p.events_head
            ));
        }
        Ok(format!("by coordinator {k:?} at {}", cp.time))
    });
    if !c.check("checkpoint", cp) {
        return None;
    }

    // the spec the run started with
    let started_events = events.iter().filter(|e| e["event"] == "started").count();
    let spec = events
        .iter()
        .find(|e| e["event"] == "started")
        .ok_or_else(|| "no started event".to_string())
        .and_then(|s| {
            if started_events != 1 {
                return Err(format!(
                    "the record has {started_events} started events: a run starts once"
                ));
            }
            if spec_sha256(&s["spec"])? != p.spec_sha256 {
                return Err("the started event's spec is not the statement's spec_sha256".into());
            }
            if s["started"] != json!(p.started) {
                return Err(format!(
                    "started at {}, the statement says {}",
                    s["started"], p.started
                ));
            }
            Ok(format!(
                "spec {:?}",
                s["spec"]["name"].as_str().unwrap_or_default()
            ))
        });
    if !c.check("spec", spec) {
        return None;
    }

    // every answer, signed; one agent, dataset, method and seal per side throughout
    let mut n = 0usize;
    let mut sides: BTreeMap<String, (String, String, String, Option<tally_common::evidence::SignedSeal>)> =
        BTreeMap::new();
    // an answer's identity is its signed payload (the bytes the signature covers), never
    // the envelope's text: an ECDSA signature (r, s) is also valid as (r, n − s), and a
    // payload has more than one base64 spelling, so anyone could list one agent-signed
    // answer for two events under a second, equally valid envelope (issue 32 D1)
    let mut seen: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    // what each side's requests must ask: the record's resolved columns
    let started_spec = events
        .iter()
        .find(|e| e["event"] == "started")
        .map(|e| e["spec"].clone())
        .unwrap_or_default();
    let resolved_columns = recorded_columns(&events, &started_spec).unwrap_or(None);
    // every bucket each side's agent signed: a result's leaf aggregates must be among them
    let mut signed_aggregates: BTreeMap<String, std::collections::HashSet<SignedBucketTotals>> =
        BTreeMap::new();
    for v in &events {
        let Some(env) = answer_envelope(v) else { continue };
        let name = format!(
            "agent_results[{n}] (event {} {} {})",
            v["seq"], v["event"], v["side"]
        );
        let outcome = (|| {
            let env = env.ok_or("the event's answer is unsigned")?;
            let listed = b
                .agent_results
                .get(n)
                .ok_or("is missing: the events carry more signed answers")?;
            let (agent, payload) = signed_by(listed, "agent", AGENT_RESULT)?;
            unique_members("its payload", &payload)?;
            let sp: AgentResult = serde_json::from_slice(&payload).map_err(|e| format!("payload: {e}"))?;
            if sp.agent != agent {
                return Err(format!("signed by {agent:?} but names agent {:?}", sp.agent));
            }
            if sp.run_id != run_id {
                return Err(format!("names run {:?}, not {run_id:?}", sp.run_id));
            }
            // answered while the run ran, by the agent's clock (within CLOCK_SKEW)
            let t = payload_shape(&sp)?;
            let started = time::OffsetDateTime::parse(&p.started, &Rfc3339)
                .map_err(|e| format!("the statement's started {:?}: {e}", p.started))?;
            if t < started - CLOCK_SKEW || t > signed_at + CLOCK_SKEW {
                return Err(format!(
                    "signed at {}, outside the run ({} to the checkpoint at {}, give or take {} s)",
                    sp.time,
                    p.started,
                    signed_at.format(&Rfc3339).unwrap_or_default(),
                    CLOCK_SKEW.whole_seconds()
                ));
            }
            let env: Envelope =
                serde_json::from_value(env).map_err(|e| format!("the event's envelope: {e}"))?;
            if *listed != env {
                return Err("is not the envelope the event recorded".into());
            }
            if !seen.insert(payload.clone()) {
                return Err(
                    "signs the same answer as an earlier event's (however its envelope is spelled): one answer counts once"
                        .into(),
                );
            }
            let side = v["side"].as_str().unwrap_or_default().to_string();
            let asked = match side.as_str() {
                "source" => Side::Source,
                "target" => Side::Target,
                _ => return Err(format!("the event's side is {side:?}")),
            };
            // only what an agent signs binds a side: the coordinator signs the events
            // and the statement, and could swap the sides throughout (issue 32 E5)
            match sp.scope.side {
                Some(s) if s == asked => {}
                Some(s) => {
                    return Err(format!(
                        "the agent signed it answered as the {} side, the event puts it on the {side} side",
                        s.name()
                    ));
                }
                None => {
                    return Err(
                        "the agent did not sign which side it answered as (an agent from before sides were \
                         signed): its answer could stand for either side, so the bundle cannot be verified"
                            .into(),
                    );
                }
            }
            let named = p
                .agents
                .as_ref()
                .ok_or("the statement names no signing agent per side (a coordinator from before sides were bound)")?
                .get(asked)
                .ok_or_else(|| format!("the statement names no {side} agent, and this answer is one"))?;
            if named.agent != sp.agent || named.dataset != sp.dataset {
                return Err(format!(
                    "signed by {:?} for dataset {:?}; the statement's {side} side is {:?}'s {:?}",
                    sp.agent, sp.dataset, named.agent, named.dataset
                ));
            }
            if sp.scope.method != p.hash_method {
                return Err(format!(
                    "hashed with {}, the run with {}",
                    sp.scope.method, p.hash_method
                ));
            }
            let (a, d, m, seal) = sides.entry(side.clone()).or_insert_with(|| {
                (
                    sp.agent.clone(),
                    sp.dataset.clone(),
                    sp.scope.method.clone(),
                    sp.scope.seal.clone(),
                )
            });
            if *a != sp.agent || *d != sp.dataset || *m != sp.scope.method || *seal != sp.scope.seal {
                return Err(format!(
                    "{:?} signs for the {side} side's dataset {:?}, whose answers are {a:?}'s of {d:?} \
                     (each side's agent, dataset, method and seal are one throughout the run)",
                    sp.agent, sp.dataset
                ));
            }
            request_matches(&sp, v.get("request"), run_id, resolved_columns.as_ref())?;
            let event: Event = serde_json::from_value(v.clone()).map_err(|e| format!("the event: {e}"))?;
            match event {
                Event::Aggregated { response, .. } | Event::Rechecked { response, .. } => {
                    if sp.rpc != "Aggregate" || sp.buckets.as_deref() != Some(&signed_buckets(&response)[..])
                    {
                        return Err("the event's buckets are not the ones the agent signed".into());
                    }
                    signed_aggregates.entry(side.clone()).or_default().extend(
                        sp.buckets
                            .iter()
                            .flatten()
                            .map(|b| (b.count, b.sum.clone(), b.xor.clone())),
                    );
                    if sp.release_log_head != response.release_log_head {
                        return Err("the event's release-log head is not the one the agent signed".into());
                    }
                }
                Event::Measured { response, .. } => {
                    if sp.rpc != "Measures"
                        || sp.groups_sha256.as_deref()
                            != Some(tally_common::evidence::groups_sha256(&response.groups).as_str())
                    {
                        return Err("the event's groups are not the ones the agent signed".into());
                    }
                    if sp.release_log_head != response.release_log_head {
                        return Err("the event's release-log head is not the one the agent signed".into());
                    }
                }
                Event::Digests { digests, .. } => {
                    if sp.rpc != "RowDigests"
                        || sp.digests_sha256.as_deref() != Some(digests_hash(&digests).as_str())
                    {
                        return Err("the event's digests are not the ones the agent signed".into());
                    }
                }
                _ => return Err("not a signed answer".into()),
            }
            Ok(format!("by agent {agent:?}, {} of {}", sp.rpc, sp.dataset))
        })();
        if !c.check(name, outcome) {
            return None;
        }
        n += 1;
    }
    let all = if n == b.agent_results.len() {
        Ok(format!("{n} signed answers, each the one its event recorded"))
    } else {
        Err(format!("{} listed, the events carry {n}", b.agent_results.len()))
    };
    if !c.check("agent_results", all) {
        return None;
    }

    // the two sides are the spec's datasets, two different ones, and in a sealed run
    // each names the other as the peer it derived the run key with, under one nonce
    let spec = events
        .iter()
        .find(|e| e["event"] == "started")
        .map(|e| e["spec"].clone())
        .unwrap_or_default();
    let paired = (|| {
        // the statement names the agent of exactly the sides that answered (each answer
        // was checked above to be signed by its side's named agent)
        let named = p
            .agents
            .as_ref()
            .ok_or("the statement names no signing agent per side")?;
        for side in [Side::Source, Side::Target] {
            if let Some(a) = named.get(side)
                && !sides.contains_key(side.name())
            {
                return Err(format!(
                    "the statement names {:?} of {:?} as the {} agent, and no answer of that side is in the record",
                    a.agent,
                    a.dataset,
                    side.name()
                ));
            }
        }
        let (src, tgt) = match (sides.get("source"), sides.get("target")) {
            (Some(s), Some(t)) => (s, t),
            (None, None) if p.verdict == "error" => {
                return Ok("no answers: the run ended before any".to_string());
            }
            _ if p.verdict == "error" => return Ok("one side answered before the run ended".to_string()),
            _ => {
                return Err(format!(
                    "a {} verdict needs signed answers of both sides",
                    p.verdict
                ));
            }
        };
        for (side, (agent, dataset, ..)) in [("source", src), ("target", tgt)] {
            if spec[side]["dataset"] != json!(dataset) {
                return Err(format!(
                    "the {side} answers are {agent:?}'s of dataset {dataset:?}, the spec's {side} dataset is {}",
                    spec[side]["dataset"]
                ));
            }
        }
        if src.0 == tgt.0 && src.1 == tgt.1 {
            return Err(format!("both sides' answers are {:?}'s of {:?}", src.0, src.1));
        }

        match (&src.3, &tgt.3) {
            (Some(s), Some(t)) => {
                if s.peer != tgt.0 || s.peer_dataset != tgt.1 || t.peer != src.0 || t.peer_dataset != src.1 {
                    return Err(format!(
                        "the sides do not name each other as peers: {:?} of {:?} paired with {:?}/{:?}, {:?} of {:?} with {:?}/{:?}",
                        src.0, src.1, s.peer, s.peer_dataset, tgt.0, tgt.1, t.peer, t.peer_dataset
                    ));
                }
                if s.nonce != t.nonce {
                    return Err("the sides' answers are of two run nonces".into());
                }
                Ok(format!(
                    "source {:?} of {:?} and target {:?} of {:?}, each sealed with the other under one nonce",
                    src.0, src.1, tgt.0, tgt.1
                ))
            }
            (None, None) => Ok(format!(
                "source {:?} of {:?} and target {:?} of {:?} (unsealed: the agents do not name each other)",
                src.0, src.1, tgt.0, tgt.1
            )),
            _ => Err("one side's answers are sealed and the other's are not".into()),
        }
    })();
    if !c.check("sides", paired) {
        return None;
    }
    if !c.check(
        "result fields",
        result_fields(&result_json, &spec, &signed_aggregates),
    ) {
        return None;
    }

    // the totals the statement states are the agents' signed level-1 buckets
    let signed = level_one(&events);
    let totals = signed.as_ref().map_err(Clone::clone).and_then(|[s, t]| {
        for (side, signed, stated) in [("source", s, &p.source), ("target", t, &p.target)] {
            if signed != stated {
                return Err(format!(
                    "the {side} totals stated ({}) are not the sums of its agent-signed level-1 buckets ({})",
                    serde_json::to_string(stated).unwrap_or_default(),
                    serde_json::to_string(signed).unwrap_or_default()
                ));
            }
        }
        for (side, stated) in [("source", &p.source), ("target", &p.target)] {
            // the window the result reports is the one both agents signed they read
            let reported = result_json
                .get("window")
                .map(|w| (w["column"].clone(), w["upper"].clone()));
            if let Some(t) = stated
                && reported != t.window.as_ref().map(|w| (json!(w.column), json!(w.upper)))
            {
                return Err(format!(
                    "the result's window ({}) is not the one the {side} agent signed it read ({})",
                    result_json
                        .get("window")
                        .map(|w| w.to_string())
                        .unwrap_or_else(|| "none".into()),
                    t.window
                        .as_ref()
                        .map(|w| format!("{} <= {}", w.column, w.upper))
                        .unwrap_or_else(|| "none".into())
                ));
            }
            if let Some(t) = stated
                && result_json[side]["count"] != json!(t.count)
            {
                return Err(format!(
                    "the result's {side} count is {}, the agent-signed level-1 count {}",
                    result_json[side]["count"], t.count
                ));
            }
        }
        // and the window they read is the one the spec asked for
        let signed_window = p
            .source
            .as_ref()
            .or(p.target.as_ref())
            .and_then(|t| t.window.as_ref());
        window_claim(&events, signed_window, &p.started)?;
        Ok("each side's equals the sum of its agent-signed level-1 buckets".to_string())
    });
    if !c.check("level-1 totals", totals) {
        return None;
    }
    let verdict = (|| {
        let equal = match (&p.source, &p.target) {
            (Some(s), Some(t)) => {
                s.count == t.count
                    && s.sum == t.sum
                    && match (&s.xor, &t.xor) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            }
            _ => false,
        };
        let counts_only = spec["mode"] == "count";
        let equal = if counts_only {
            matches!((&p.source, &p.target), (Some(s), Some(t)) if s.count == t.count)
        } else if spec["mode"] == "measures" {
            // equal fingerprints are equal groups; else the groups may agree within
            // the spec's tolerances, judged from the signed level-1 answers
            equal || measures_agree(&events, &spec)?
        } else {
            equal
        };
        if p.verdict == "match" && events.iter().any(|e| e["event"] == "failed") {
            return Err("a match of a run whose record holds a failure".into());
        }
        let follows = match p.verdict.as_str() {
            "match" => equal && p.leaves == 0,
            "differ" => !(equal && p.leaves == 0),
            "error" => true,
            v => return Err(format!("verdict {v:?} is none of match, differ, error")),
        };
        if follows {
            Ok(format!(
                "{}{} (totals {}, {} differing leaves), signed by {coordinator:?}",
                p.verdict,
                match &p.fidelity {
                    Some(f) if f.is_reduced() => format!(" at reduced fidelity ({})", f.summary()),
                    _ => String::new(),
                },
                if equal { "equal" } else { "differ" },
                p.leaves
            ))
        } else {
            Err(format!(
                "verdict {} does not follow from totals that {} and {} differing leaves",
                p.verdict,
                if equal { "are equal" } else { "differ" },
                p.leaves
            ))
        }
    })();
    if !c.check("verdict", verdict) {
        return None;
    }
    if !c.check("fidelity", fidelity_claim(&events, &spec, p.fidelity.as_ref())) {
        return None;
    }
    Some(())
}

/// Whether the request an event records is the one its agent signed an answer to (its
/// RFC 8785 SHA-256 is the payload's `request_sha256`), and says what the payload's
/// scope says: rpc, run, dataset, side, method, columns, `key_len`, seal, window, and
/// whether it covered the whole dataset (docs/evidence.md, "The requests").
fn request_matches(
    sp: &AgentResult,
    req: Option<&Value>,
    run_id: &str,
    resolved: Option<&[Value; 2]>,
) -> Result<(), String> {
    let req = req.filter(|r| r.is_object()).ok_or(
        "the event records no request (a coordinator from before requests were recorded): \
         what the agent was asked cannot be checked",
    )?;
    let digest = tally_common::jcs::canonical_json(&req.to_string())
        .map(|t| sha256_hex(t.as_bytes()))
        .map_err(|e| format!("the event's request: {e}"))?;
    if digest != sp.request_sha256 {
        return Err(format!(
            "the event's request hashes to {digest}, the agent signed request_sha256 {}",
            sp.request_sha256
        ));
    }
    let scope = &sp.scope;
    let differ = |what: &str, asked: &Value, signed: Value| -> Result<(), String> {
        if *asked == signed {
            Ok(())
        } else {
            Err(format!(
                "the request's {what} is {asked}, the agent signed {signed}"
            ))
        }
    };
    differ("rpc", &req["rpc"], json!(sp.rpc))?;
    differ("run_id", &req["run_id"], json!(run_id))?;
    differ("dataset", &req["dataset"], json!(sp.dataset))?;
    differ("side", &req["side"], json!(scope.side.map(Side::name)))?;
    differ("method", &req["method"], json!(scope.method))?;
    differ("key_len", &req["key_len"], json!(scope.key_len))?;
    let names: Vec<Value> = req["columns"]
        .as_array()
        .map(|c| c.iter().map(|c| c["name"].clone()).collect())
        .unwrap_or_default();
    differ("column names", &Value::Array(names), json!(scope.columns))?;
    // and each column's form is the one the record resolves for that side: a request
    // that asks a decimal at a lower scale than the sides declare (or leaves a column
    // out) would compare less than the statement's fidelity claims
    let side = scope
        .side
        .ok_or("the agent did not sign which side it answered as")?;
    let want = resolved
        .map(|r| &r[side as usize])
        .ok_or("the record's descriptions do not resolve, so what the answer was asked cannot be checked")?;
    match sp.rpc.as_str() {
        "Measures" => {
            let listed = want.as_array().map(Vec::as_slice).unwrap_or_default();
            for c in req["columns"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let name = c["name"].as_str().unwrap_or_default();
                let same = listed
                    .iter()
                    .find(|w| w["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)));
                if same != Some(c) {
                    return Err(format!(
                        "the request asks column {c}, the record resolves it as {}",
                        same.map_or_else(|| "no compared column".to_string(), Value::to_string)
                    ));
                }
            }
        }
        _ if req["columns"] != *want => {
            return Err(format!(
                "the request asks the columns {}, the record resolves them as {want}",
                req["columns"]
            ));
        }
        _ => {}
    }
    let seal = match &req["seal"] {
        Value::Null => Value::Null,
        s => json!({"peer": s["peer"], "peer_dataset": s["peer_dataset"], "nonce": s["nonce"]}),
    };
    differ(
        "seal",
        &seal,
        serde_json::to_value(&scope.seal).unwrap_or_default(),
    )?;
    let window = |w: &Value| match w {
        Value::Null => Value::Null,
        w => json!({"column": w["column"], "upper": w["upper"]}),
    };
    let signed_window = serde_json::to_value(&scope.window).unwrap_or_default();
    // a segment covers every row (of the window) when it bounds no key, hash or period
    let unbounded = |seg: &Value| {
        seg.is_object()
            && ["lower", "upper", "hash_lo", "hash_hi", "period"]
                .iter()
                .all(|k| seg[*k].is_null())
    };
    let whole = match sp.rpc.as_str() {
        "Aggregate" => {
            let segs = req["segments"]
                .as_array()
                .filter(|s| !s.is_empty())
                .ok_or("the request has no segments")?;
            for s in segs {
                differ("window", &window(&s["segment"]["window"]), signed_window.clone())?;
            }
            let parents = segs.len() as u64;
            if let Some(b) = sp.buckets.iter().flatten().find(|b| b.parent >= parents) {
                return Err(format!(
                    "the agent signed a bucket of parent {}, the request has {parents} segments",
                    b.parent
                ));
            }
            matches!(segs.as_slice(), [one] if unbounded(&one["segment"]))
        }
        "RowDigests" => {
            differ("window", &window(&req["segment"]["window"]), signed_window)?;
            unbounded(&req["segment"])
        }
        "Measures" => {
            differ("window", &window(&req["window"]), signed_window)?;
            let group_by: Vec<String> = req["group_by"]
                .as_array()
                .map(|g| {
                    g.iter()
                        .map(|g| {
                            let c = g["column"].as_str().unwrap_or_default();
                            match g["granularity"].as_str().unwrap_or_default() {
                                "" => c.to_string(),
                                gr => format!("{c}:{gr}"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            differ("group_by", &json!(group_by), json!(scope.group_by))?;
            differ("measures", &req["measures"], json!(scope.measures))?;
            req["parents"].as_array().is_some_and(Vec::is_empty)
        }
        other => return Err(format!("a {other} answer is not one a bundle holds")),
    };
    if whole != scope.whole {
        return Err(format!(
            "the request covered {}, the agent signed whole: {}",
            if whole {
                "the whole dataset"
            } else {
                "part of the dataset"
            },
            scope.whole
        ));
    }
    Ok(())
}

/// A bucket's aggregates as an agent signed them: count, sum, xor.
type SignedBucketTotals = (u64, String, Option<String>);

/// The result's fields that name what was compared, checked against the record (the
/// started spec, whose sides' datasets the agents signed) and the agents' signed
/// buckets (issue 32 E15): its `name`; each side's `agent` and `dataset`; and each
/// leaf's `source` / `target` aggregates (`count`, `checksum`, `xor`), each a bucket
/// that side's agent signed, or empty (count 0, checksum 0, no xor or xor 0). The
/// result's `verdict`, `hash_method`, `level`, `fidelity`, `false_match_bound`,
/// `difference_counts`, number of `leaves`, `window` and sides' `count` are checked
/// by the checks named for them.
fn result_fields(
    result: &Value,
    spec: &Value,
    signed: &BTreeMap<String, std::collections::HashSet<SignedBucketTotals>>,
) -> Result<String, String> {
    if result["name"] != spec["name"] {
        return Err(format!(
            "the result's name is {}, the started spec's {}",
            result["name"], spec["name"]
        ));
    }
    for side in ["source", "target"] {
        for k in ["agent", "dataset"] {
            if result[side][k] != spec[side][k] {
                return Err(format!(
                    "the result's {side}.{k} is {}, the started spec's {}",
                    result[side][k], spec[side][k]
                ));
            }
        }
    }
    let leaves = result["leaves"].as_array().map(Vec::as_slice).unwrap_or_default();
    let none = std::collections::HashSet::new();
    for (i, leaf) in leaves.iter().enumerate() {
        for side in ["source", "target"] {
            let a = &leaf[side];
            let count = a["count"].as_u64();
            let sum = a["checksum"].as_str();
            let xor = match &a["xor"] {
                Value::Null => Some(None),
                Value::String(x) => Some(Some(x.clone())),
                _ => None,
            };
            let (Some(count), Some(sum), Some(xor)) = (count, sum, xor) else {
                return Err(format!(
                    "the result's leaves[{i}].{side} is not {{count, checksum, xor}}: {a}"
                ));
            };
            let empty = count == 0 && sum == hex64(0) && xor.as_deref().is_none_or(|x| x == hex64(0));
            let bucket = (count, sum.to_string(), xor);
            if !empty && !signed.get(side).unwrap_or(&none).contains(&bucket) {
                return Err(format!(
                    "the result's leaves[{i}].{side} ({count} rows, checksum {sum}) is no bucket the {side} agent signed"
                ));
            }
        }
    }
    Ok(format!(
        "name, sides and {} leaves' aggregates are the record's and the agents'",
        leaves.len()
    ))
}

/// The fidelity the run's record gives: its `started` spec resolved against its
/// `described` answers, as `tally run` resolves them; `None` for a record without a
/// description (a run that ended before it).
fn recorded_fidelity(events: &[Value], spec: &Value) -> Result<Option<Fidelity>, String> {
    Ok(recorded_resolution(events, spec)?.and_then(|r| r.fidelity))
}

/// The record's `started` spec resolved against its first `described` event, as `tally
/// run` resolved it: `None` without a description, or with one that does not resolve
/// (the run then ended in an error before asking anything).
fn recorded_resolution(
    events: &[Value],
    spec: &Value,
) -> Result<Option<tally_engine::resolve::Resolved>, String> {
    let Some(described) = events.iter().find(|e| e["event"] == "described") else {
        return Ok(None);
    };
    let spec: tally_engine::spec::Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let side = |k: &str| {
        serde_json::from_value::<tally_common::wire::Describe>(described[k].clone())
            .map_err(|e| format!("the described event's {k}: {e}"))
    };
    let (s, t) = (side("source")?, side("target")?);
    let spec = if spec.mode == tally_engine::spec::Mode::Measures {
        tally_engine::measures::resolve_spec(&spec)
    } else {
        spec
    };
    // a description that does not resolve (drift) ended the run with an error
    Ok(tally_engine::resolve::resolve(&spec, &s, &t).ok())
}

/// Each side's compared columns as a request writes them (name, class, scale, exact,
/// fixed: docs/evidence.md, "The requests"), from the record's resolution.
fn recorded_columns(events: &[Value], spec: &Value) -> Result<Option<[Value; 2]>, String> {
    let as_json = |cols: Vec<tally_common::segment::ColumnSpec>| {
        let refs: Vec<tally_proto::v1::ColumnRef> =
            cols.iter().map(tally_proto::v1::ColumnRef::from).collect();
        tally_common::request_json::columns(&refs)
    };
    Ok(
        recorded_resolution(events, spec)?
            .map(|r| [as_json(r.source_columns()), as_json(r.target_columns())]),
    )
}

/// Whether the statement's fidelity is the one the record gives. A statement signed
/// before fidelity was stated has none; it verifies, and the check says what the
/// record gives instead, so such a pass is not read as a plain one.
fn fidelity_claim(events: &[Value], spec: &Value, stated: Option<&Fidelity>) -> Result<String, String> {
    let recorded = recorded_fidelity(events, spec)?;
    let describe = |f: Option<&Fidelity>| match f {
        None => "none".to_string(),
        Some(f) if f.is_reduced() => format!("reduced: {}", f.summary()),
        Some(_) => "full".to_string(),
    };
    match (stated, &recorded) {
        (None, _) => Ok(format!(
            "not stated (a statement from before fidelity); the record resolves to {}",
            describe(recorded.as_ref())
        )),
        (Some(s), Some(r)) if s == r => Ok(describe(Some(s))),
        (Some(s), r) => Err(format!(
            "the statement says {}, the recorded spec and descriptions resolve to {}",
            describe(Some(s)),
            describe(r.as_ref())
        )),
    }
}

/// Whether the window both agents signed is the one the run's `started` spec asks for:
/// none for a spec without one; for `as_of`, the bound normalised in some class the
/// column can compare as; for `lag`, the recorded `clock_read` (within [`CLOCK_SKEW`]
/// of the run's start) minus the lag. Otherwise a coordinator could have the agents
/// read an empty window and claim a match of the whole table.
fn window_claim(
    events: &[Value],
    signed: Option<&tally_common::segment::Window>,
    started_at: &str,
) -> Result<(), String> {
    use tally_common::TypeClass;
    let started = events.iter().find(|e| e["event"] == "started");
    let spec: Option<tally_engine::spec::WindowSpec> = started
        .and_then(|e| e["spec"].get("window"))
        .filter(|w| !w.is_null())
        .map(|w| serde_json::from_value(w.clone()).map_err(|e| format!("the spec's window: {e}")))
        .transpose()?;
    // a window that only waits for a watermark bounds no column
    let spec = spec.and_then(|w| w.column.clone().map(|c| (c, w)));
    let ((column, spec), signed) = match (spec, signed) {
        (None, None) => return Ok(()),
        (None, Some(w)) => {
            return Err(format!(
                "the agents read a window ({} <= {}) the run's spec does not have",
                w.column, w.upper
            ));
        }
        (Some((column, _)), None) => {
            return Err(format!("the spec has a window on {column}, the agents read none"));
        }
        (Some(s), Some(w)) => (s, w),
    };
    if !column.eq_ignore_ascii_case(&signed.column) {
        return Err(format!(
            "the agents read a window on {}, the spec asks for {column}",
            signed.column
        ));
    }
    // the spec is the coordinator's: checked here as tally run checks it, never trusted
    match (&spec.as_of, &spec.lag) {
        (Some(_), None) => {}
        (None, Some(l))
            if tally_engine::spec::parse_duration(l)
                .is_some_and(|d| d <= tally_engine::spec::MAX_LAG_SECS) => {}
        _ => return Err("the spec's window sets neither a valid as_of nor a valid lag".into()),
    }
    let now = match &spec.lag {
        None => None,
        Some(_) => {
            let clock = events
                .iter()
                .find(|e| e["event"] == "clock_read")
                .and_then(|e| e["unix_ms"].as_i64())
                .ok_or("the spec's window has a lag and the record has no clock_read")?;
            let start = time::OffsetDateTime::parse(started_at, &Rfc3339)
                .map_err(|e| format!("the statement's started {started_at:?}: {e}"))?;
            let read = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(clock) * 1_000_000)
                .map_err(|e| format!("clock_read {clock}: {e}"))?;
            let (lo, hi) = (start.checked_sub(CLOCK_SKEW), start.checked_add(CLOCK_SKEW * 12));
            if lo.is_none_or(|lo| read < lo) || hi.is_none_or(|hi| read > hi) {
                return Err(format!(
                    "the window's clock was read at {}, not at the run's start ({started_at})",
                    read.format(&Rfc3339).unwrap_or_default()
                ));
            }
            Some(clock)
        }
    };
    let zone = events
        .iter()
        .find(|e| e["event"] == "described")
        .and_then(|e| e["source"]["time_zone"].as_str())
        .unwrap_or("UTC")
        .to_string();
    let fits = [
        TypeClass::Integer,
        TypeClass::Date,
        TypeClass::Timestamp,
        TypeClass::TimestampTz,
    ]
    .into_iter()
    .any(|class| {
        tally_engine::drill::window_upper(&spec, class, now, &zone).is_ok_and(|u| u == signed.upper)
    });
    if fits {
        Ok(())
    } else {
        Err(format!(
            "the agents read the window {} <= {}, which is not the spec's ({})",
            signed.column,
            signed.upper,
            spec.as_of
                .as_ref()
                .map(|a| format!("as_of {}", a.text()))
                .or(spec.lag.as_ref().map(|l| format!("lag {l}")))
                .unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use tally_common::TypeClass;
    use tally_common::checksum::HashMethod;
    use tally_common::wire::{Column, Describe};

    use super::*;

    fn describe(class: TypeClass, declared: &str) -> Describe {
        let col = |name: &str, class, declared: &str| Column {
            name: name.into(),
            class,
            declared_type: declared.into(),
            nullable: true,
            scale: None,
            fixed_char: false,
            masked: false,
        };
        Describe {
            dataset: "d".into(),
            columns: vec![col("id", TypeClass::Integer, "bigint"), col("v", class, declared)],
            key: vec!["id".into()],
            hash_methods: vec![HashMethod::Sha256_64],
            ..Default::default()
        }
    }

    /// A run's record as the verifier reads it: `started` with its spec, then `described`.
    fn record(target: TypeClass, declared: &str) -> (Vec<Value>, Value) {
        let spec: tally_engine::spec::Spec = tally_common::config_file::parse_yaml(
            Path::new("s.yaml"),
            "name: t\nsource: { agent: a, dataset: d }\ntarget: { agent: b, dataset: d }\n",
        )
        .unwrap();
        let spec = serde_json::to_value(&spec).unwrap();
        let described = serde_json::to_value(Event::Described {
            source: Box::new(describe(TypeClass::Float, "double precision")),
            target: Box::new(describe(target, declared)),
        })
        .unwrap();
        (vec![json!({"event": "started", "spec": spec}), described], spec)
    }

    use std::path::Path;

    #[test]
    fn times_are_rfc3339_in_utc_and_whole_seconds_where_the_format_says() {
        assert!(utc_time("2026-12-01T20:17:49Z", false).is_ok());
        for bad in [
            "2026-12-01T20:17:49.5Z",
            "2026-12-01T20:17:49+00:00",
            "2026-12-01t20:17:49z",
            "2026-12-01 20:17:49Z",
            "2026-13-01T20:17:49Z",
            "2026-12-01T20:17:49",
            "",
        ] {
            assert!(utc_time(bad, false).is_err(), "{bad}");
        }
        // a run's start may carry a fraction, in UTC still
        assert!(utc_time("2026-12-01T21:17:29.20226721Z", true).is_ok());
        assert!(utc_time("2026-12-01T21:17:29Z", true).is_ok());
        assert!(utc_time("2026-12-04T23:16:53.881977077Z", true).is_ok());
        assert!(utc_time("2026-12-04T23:16:53.1Z", true).is_ok());
        for bad in [
            "2026-12-01T21:17:29.Z",
            "2026-12-01T21:17:29.1234567890Z",
            "2026-12-01T21:17:29.5+00:00",
        ] {
            assert!(utc_time(bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_agents_payload_has_the_shape_the_format_gives() {
        let ok = AgentResult {
            run_id: "r".into(),
            agent: "a".into(),
            dataset: "d".into(),
            rpc: "RowDigests".into(),
            request_sha256: "ab".repeat(32),
            scope: tally_common::evidence::Scope {
                side: Some(Side::Source),
                method: "sha256_64".into(),
                columns: vec!["id".into(), "v".into()],
                key_len: 1,
                whole: false,
                seal: None,
                window: None,
                group_by: None,
                measures: None,
            },
            buckets: None,
            digests_sha256: Some("cd".repeat(32)),
            groups_sha256: None,
            release_log_head: "ef".repeat(32),
            time: "2026-12-01T20:17:49Z".into(),
        };
        assert!(payload_shape(&ok).is_ok());
        let refused = |f: &dyn Fn(&mut AgentResult)| {
            let mut p = ok.clone();
            f(&mut p);
            payload_shape(&p).unwrap_err()
        };
        assert!(refused(&|p| p.request_sha256 = "AB".repeat(32)).contains("request_sha256"));
        assert!(refused(&|p| p.release_log_head.pop().map(drop).unwrap_or(())).contains("release_log_head"));
        assert!(refused(&|p| p.digests_sha256 = Some("x".into())).contains("digests_sha256"));
        assert!(refused(&|p| p.scope.key_len = 0).contains("key_len"));
        assert!(refused(&|p| p.scope.key_len = 3).contains("key_len"));
        assert!(refused(&|p| p.scope.method = "sealed_sha256_64".into()).contains("seal"));
        assert!(refused(&|p| p.time = "2026-12-01T20:17:49.1Z".into()).contains("whole seconds"));
    }

    #[test]
    fn the_stated_fidelity_must_be_the_one_the_record_resolves_to() {
        let (events, spec) = record(TypeClass::Float, "double");
        let recorded = recorded_fidelity(&events, &spec).unwrap().unwrap();
        assert!(recorded.is_reduced());
        assert_eq!(
            fidelity_claim(&events, &spec, Some(&recorded)),
            Ok("reduced: v float at scale 6".to_string())
        );
        // a coordinator that states a plain pass where the record says otherwise
        let full = Fidelity::of(Vec::new());
        assert_eq!(
            fidelity_claim(&events, &spec, Some(&full)),
            Err(
                "the statement says full, the recorded spec and descriptions resolve to reduced: v float at \
                 scale 6"
                    .to_string()
            )
        );
        // a statement from before fidelity verifies, and says what the record gives
        assert_eq!(
            fidelity_claim(&events, &spec, None),
            Ok(
                "not stated (a statement from before fidelity); the record resolves to reduced: v float at \
                scale 6"
                    .to_string()
            )
        );
        // a run that ended before its description states none, and may not claim one
        let started = &events[..1];
        assert!(fidelity_claim(started, &spec, None).is_ok());
        assert!(fidelity_claim(started, &spec, Some(&full)).is_err());
        // drift: the run ended with an error, no fidelity
        let (events, spec) = record(TypeClass::Date, "date");
        assert_eq!(recorded_fidelity(&events, &spec), Ok(None));
    }
}
