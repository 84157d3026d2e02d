//! The checks of the agents' signed answers: each answer the events carry is listed,
//! signed by its side's agent while the run ran, for the request the event records,
//! and says what the event says; and the two sides are the spec's, paired as sealed.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};
use tally_common::dsse::{AGENT_RESULT, Envelope};
use tally_common::evidence::{AgentResult, SignedSeal};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::super::CLOCK_SKEW;
use super::super::answers::{digests_hash, signed_buckets};
use super::super::bundle::{Bundle, answer_envelope};
use super::super::statement::{Predicate, sha256_hex};
use super::certificates::Certs;
use super::claims::recorded_columns;
use super::{Checks, unique_members, utc_time};
use tally_engine::{Event, Side};

/// A bucket's aggregates as an agent signed them: count, sum, xor.
pub(super) type SignedBucketTotals = (u64, String, Option<String>);

/// A side's agent, dataset, method and seal, as its first answer signed them.
type SideSigner = (String, String, String, Option<SignedSeal>);

/// What the signed answers give the checks after them.
#[derive(Default)]
pub(super) struct Answers {
    /// How many signed answers the events carry.
    n: usize,
    /// Each side's agent, dataset, method and seal: one throughout the run.
    sides: BTreeMap<String, SideSigner>,
    /// Every bucket each side's agent signed: a result's leaf aggregates must be among
    /// them.
    pub(super) aggregates: BTreeMap<String, HashSet<SignedBucketTotals>>,
    /// Each answer's identity: its signed payload (the bytes the signature covers),
    /// never the envelope's text. An ECDSA signature (r, s) is also valid as (r, n − s),
    /// and a payload has more than one base64 spelling, so anyone could list one
    /// agent-signed answer for two events under a second, equally valid envelope
    /// (issue 32 D1).
    seen: HashSet<Vec<u8>>,
}

/// What every answer is checked against.
struct Record<'a> {
    certs: &'a Certs,
    b: &'a Bundle,
    p: &'a Predicate,
    signed_at: OffsetDateTime,
    /// What each side's requests must ask: the record's resolved columns.
    resolved: Option<[Value; 2]>,
}

/// "agent_results[n] (event seq kind side)", one check per answer the events carry:
/// every answer signed, one agent, dataset, method and seal per side throughout.
pub(super) fn each(
    c: &mut Checks,
    certs: &Certs,
    b: &Bundle,
    events: &[Value],
    p: &Predicate,
    spec: &Value,
    signed_at: OffsetDateTime,
) -> Option<Answers> {
    let record = Record {
        certs,
        b,
        p,
        signed_at,
        resolved: recorded_columns(events, spec).unwrap_or(None),
    };
    let mut answers = Answers::default();
    for v in events {
        let Some(env) = answer_envelope(v) else { continue };
        let name = format!(
            "agent_results[{}] (event {} {} {})",
            answers.n, v["seq"], v["event"], v["side"]
        );
        c.check(name, answers.agent_result(&record, v, env))?;
        answers.n += 1;
    }
    Some(answers)
}

impl Answers {
    /// One answer: the one the event recorded, signed by the statement's agent of its
    /// side while the run ran, for the request the event records.
    fn agent_result(&mut self, r: &Record, v: &Value, env: Option<Value>) -> Result<String, String> {
        let (p, run_id) = (r.p, r.p.run_id.as_str());
        let env = env.ok_or("the event's answer is unsigned")?;
        let listed =
            r.b.agent_results
                .get(self.n)
                .ok_or("is missing: the events carry more signed answers")?;
        let (agent, payload) = r.certs.signed_by(listed, "agent", AGENT_RESULT)?;
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
        let started = OffsetDateTime::parse(&p.started, &Rfc3339)
            .map_err(|e| format!("the statement's started {:?}: {e}", p.started))?;
        if t < started - CLOCK_SKEW || t > r.signed_at + CLOCK_SKEW {
            return Err(format!(
                "signed at {}, outside the run ({} to the checkpoint at {}, give or take {} s)",
                sp.time,
                p.started,
                r.signed_at.format(&Rfc3339).unwrap_or_default(),
                CLOCK_SKEW.whole_seconds()
            ));
        }
        let env: Envelope = serde_json::from_value(env).map_err(|e| format!("the event's envelope: {e}"))?;
        if *listed != env {
            return Err("is not the envelope the event recorded".into());
        }
        if !self.seen.insert(payload.clone()) {
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
            .ok_or(
                "the statement names no signing agent per side (a coordinator from before sides were bound)",
            )?
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
        let (a, d, m, seal) = self.sides.entry(side.clone()).or_insert_with(|| {
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
        request_matches(&sp, v.get("request"), run_id, r.resolved.as_ref())?;
        let event: Event = serde_json::from_value(v.clone()).map_err(|e| format!("the event: {e}"))?;
        match event {
            Event::Aggregated { response, .. } | Event::Rechecked { response, .. } => {
                if sp.rpc != "Aggregate" || sp.buckets.as_deref() != Some(&signed_buckets(&response)[..]) {
                    return Err("the event's buckets are not the ones the agent signed".into());
                }
                self.aggregates.entry(side.clone()).or_default().extend(
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
    }
}

/// "agent_results": the bundle lists exactly the answers the events carry.
pub(super) fn agent_results(b: &Bundle, answers: &Answers) -> Result<String, String> {
    let n = answers.n;
    if n == b.agent_results.len() {
        Ok(format!("{n} signed answers, each the one its event recorded"))
    } else {
        Err(format!("{} listed, the events carry {n}", b.agent_results.len()))
    }
}

/// "sides": the two sides are the spec's datasets, two different ones, and in a sealed
/// run each names the other as the peer it derived the run key with, under one nonce.
pub(super) fn sides(p: &Predicate, answers: &Answers, spec: &Value) -> Result<String, String> {
    let sides = &answers.sides;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
