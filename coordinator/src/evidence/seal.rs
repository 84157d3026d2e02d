//! When a run ends: the coordinator signs its statement over the result and a
//! checkpoint of the run's log head, into the run's record.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tally_common::chain::line_hash;
use tally_common::dsse::{CHECKPOINT, IN_TOTO};

use super::statement::{Predicate, Statement, Subject, level_one, sha256_hex, side_agents, spec_sha256};
use super::{PREDICATE_TYPE, STATEMENT_TYPE};
use crate::runlog::RunLog;
use crate::signing::{Checkpoint, Signer};
use tally_engine::result::RunResult;

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
