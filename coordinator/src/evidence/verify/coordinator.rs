//! The checks of what the coordinator signed: its statement, the result the statement
//! is over, the run's events ending at the statement's head, the checkpoint of that
//! head, and the spec the run started with.

use serde_json::{Value, json};
use tally_common::chain::verify_lines;
use tally_common::dsse::{CHECKPOINT, IN_TOTO};

use super::super::bundle::Bundle;
use super::super::statement::{Predicate, Statement, sha256_hex, spec_sha256};
use super::super::{PREDICATE_TYPE, STATEMENT_TYPE};
use super::certificates::Certs;
use super::{b64, unique_members, utc_time};
use crate::signing::Checkpoint;

/// "statement signature": one signature, by a coordinator certificate of the bundle.
/// Gives the coordinator's name and the statement's payload.
pub(super) fn statement_signature(certs: &Certs, b: &Bundle) -> Result<((String, Vec<u8>), String), String> {
    let (k, payload) = certs.signed_by(&b.statement, "coordinator", IN_TOTO)?;
    let found = format!("by coordinator {k:?}");
    Ok(((k, payload), found))
}

/// "statement": the payload is an in-toto Statement of a reconciliation, its times in
/// UTC, its fidelity spelt one way, its subject the run's one result.
pub(super) fn statement(payload: &[u8]) -> Result<(Statement, String), String> {
    unique_members("the statement payload", payload)?;
    let s: Statement = serde_json::from_slice(payload).map_err(|e| format!("does not parse: {e}"))?;
    if s.type_ != STATEMENT_TYPE || s.predicate_type != PREDICATE_TYPE {
        return Err(format!(
            "_type {:?} / predicateType {:?}",
            s.type_, s.predicate_type
        ));
    }
    utc_time(&s.predicate.started, true).map_err(|e| format!("started: {e}"))?;
    // one spelling of a fidelity: absent or an object (never null), and a full
    // one without a `columns` member (docs/evidence.md, the statement)
    let raw: Value = serde_json::from_slice(payload).unwrap_or_default();
    match raw["predicate"].get("fidelity") {
        Some(Value::Null) => {
            return Err("the predicate's fidelity is null (absent, or an object)".into());
        }
        Some(f)
            if f.get("columns")
                .is_some_and(|c| c.as_array().is_some_and(Vec::is_empty)) =>
        {
            return Err(
                "the predicate's fidelity lists an empty columns member (a full fidelity has none)".into(),
            );
        }
        _ => {}
    }
    utc_time(&s.predicate.finished, false).map_err(|e| format!("finished: {e}"))?;
    match s.subject.as_slice() {
        [one] if one.name == format!("tally-run:{}", s.predicate.run_id) => {
            let found = format!("run {}", s.predicate.run_id);
            Ok((s, found))
        }
        _ => Err("the subject must be the one result, named tally-run:<run_id>".into()),
    }
}

/// "result digest": the result's bytes are the statement's subject. Gives the result
/// as JSON (`null` when it is not JSON, which the "result" check refuses).
pub(super) fn result_digest(b: &Bundle, st: &Statement) -> Result<(Value, String), String> {
    let bytes = b64("result", &b.result)?;
    let want = st.subject[0].digest.get("sha256").cloned().unwrap_or_default();
    if sha256_hex(&bytes) != want {
        return Err("the SHA-256 of the result bytes is not the statement's subject digest".into());
    }
    unique_members("the result", &bytes)?;
    let found = format!("{} bytes", bytes.len());
    Ok((serde_json::from_slice(&bytes).unwrap_or(Value::Null), found))
}

/// "result": the result says what the statement says.
pub(super) fn result(r: &Value, p: &Predicate) -> Result<String, String> {
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
}

/// "event chain": the events are one chain of this run, ending at the statement's
/// head. Gives the events.
pub(super) fn event_chain(b: &Bundle, p: &Predicate) -> Result<(Vec<Value>, String), String> {
    let run_id = p.run_id.as_str();
    let mut lines = Vec::with_capacity(b.events.len());
    for (i, e) in b.events.iter().enumerate() {
        let line = b64(&format!("events[{i}]"), e)
            .and_then(|l| String::from_utf8(l).map_err(|_| format!("events[{i}] is not UTF-8")))?;
        unique_members(&format!("events[{i}]"), line.as_bytes())?;
        lines.push(line);
    }
    if lines.is_empty() {
        return Err("the bundle has no events".into());
    }
    if let Some(i) = lines.iter().position(|l| l.trim().is_empty()) {
        return Err(format!("events[{i}] is a blank line"));
    }
    // a log line is one line: the export (`tally audit export`) writes one per line
    if let Some(i) = lines.iter().position(|l| l.contains(['\n', '\r'])) {
        return Err(format!("events[{i}] holds a line break"));
    }
    let mut events = Vec::with_capacity(lines.len());
    let (seq, head) = verify_lines("events", lines.iter().cloned().map(Ok), |v| {
        if v["run"] != run_id {
            return Err(format!("names run {}, not {run_id}", v["run"]));
        }
        events.push(v);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    if head != p.events_head {
        return Err(format!(
            "the events end at {head}, the statement says {}",
            p.events_head
        ));
    }
    let found = format!("{seq} events link, ending at the statement's head");
    Ok((events, found))
}

/// "checkpoint": the coordinator signed the head and length of the events.
pub(super) fn checkpoint(certs: &Certs, b: &Bundle, p: &Predicate, events: usize) -> Result<String, String> {
    let (k, payload) = certs.signed_by(&b.checkpoint, "coordinator", CHECKPOINT)?;
    let cp: Checkpoint = serde_json::from_slice(&payload).map_err(|e| format!("does not parse: {e}"))?;
    if cp.head != p.events_head || cp.seq != events as u64 {
        return Err(format!(
            "signs seq {} head {}, the events end at seq {events} head {}",
            cp.seq, cp.head, p.events_head
        ));
    }
    Ok(format!("by coordinator {k:?} at {}", cp.time))
}

/// "spec": the run started once, with the spec and at the time the statement says.
/// Gives that spec.
pub(super) fn spec(events: &[Value], p: &Predicate) -> Result<(Value, String), String> {
    let started_events = events.iter().filter(|e| e["event"] == "started").count();
    let s = events
        .iter()
        .find(|e| e["event"] == "started")
        .ok_or_else(|| "no started event".to_string())?;
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
    let found = format!("spec {:?}", s["spec"]["name"].as_str().unwrap_or_default());
    Ok((s["spec"].clone(), found))
}
