//! The bundle `tally evidence` writes (`tally-evidence/1`, docs/evidence.md): a sealed
//! run's result, statement, checkpoint, events and the signed answers they carry, with
//! the certificates of every party that signed.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_common::dsse::Envelope;
use tally_common::evidence::AgentResult;
use tally_common::seal::{certificates_from_pem, dns_names};

use super::FORMAT;
use crate::runlog::RunLog;

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
pub(super) fn answer_envelope(v: &Value) -> Option<Option<Value>> {
    match v["event"].as_str() {
        Some("aggregated") => Some(v["response"].get("envelope").cloned()),
        Some("digests") => Some(v.get("envelope").cloned()),
        Some("measured") | Some("rechecked") => Some(v["response"].get("envelope").cloned()),
        _ => None,
    }
}

/// The envelope an event carries, if it is a signed answer.
pub(super) fn envelope_of(v: &Value) -> Option<Value> {
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
