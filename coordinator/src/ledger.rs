//! Checkpoints of the whole run log (DESIGN §12): a verifier holding an older signed
//! checkpoint can check that a newer export of the log extends it, so no run recorded
//! before the checkpoint was rewritten, removed or re-chained since.
//!
//! Two chains of the run log itself (ids starting with `_`, which no run has):
//! - [`LEDGER`]: each line (`{"event": "ledger", "time", "runs": [{"run", "seq",
//!   "head"}]}`) pins the head of every run that changed since the line before;
//! - [`CHECKPOINTS`]: each line (`{"event": "checkpoint", "checkpoint": DSSE,
//!   "certificate": PEM}`) is the coordinator's signed checkpoint `{seq, head, time}`
//!   of a ledger line, with the certificate that signed it.
//!
//! So a checkpoint of ledger line n pins, through the ledger's chain, every run head
//! pinned by lines 1..n. The service writes a ledger line and its checkpoint after each
//! run and every minute while runs change; `tally run --data-dir` after its run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tally_common::chain::{line_hash, verify_lines};
use tally_common::dsse::{CHECKPOINT, CertificateChecker, Envelope, Usage};
use tally_common::seal::certificates_from_pem;

use crate::runlog::RunLog;
use crate::signing::{Check, Checkpoint, Signer};

/// The ledger's id in the run log.
pub const LEDGER: &str = "_ledger";
/// The signed checkpoints' id in the run log.
pub const CHECKPOINTS: &str = "_checkpoints";

/// Whether `id` is one of the log's own chains rather than a run.
pub fn is_internal(id: &str) -> bool {
    id.starts_with('_')
}

/// A signed checkpoint as `tally audit checkpoint` writes it and `--since` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedCheckpoint {
    pub checkpoint: Envelope,
    /// The signer's certificate (and intermediates).
    pub certificate: String,
}

/// Pins every run (and the audit trail) whose head moved since the ledger's last pin, and signs the new
/// ledger head; nothing when no run moved. Returns the new checkpoint, if any.
pub async fn checkpoint(log: &dyn RunLog, signer: &Signer) -> Result<Option<SignedCheckpoint>, String> {
    let ledger = log.load(LEDGER).await.map_err(|e| e.to_string())?;
    let mut pinned: BTreeMap<String, u64> = BTreeMap::new();
    for line in &ledger {
        for r in line["runs"].as_array().into_iter().flatten() {
            if let (Some(run), Some(seq)) = (r["run"].as_str(), r["seq"].as_u64()) {
                pinned.insert(run.to_string(), seq);
            }
        }
    }
    let moved: Vec<Value> = log
        .runs()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        // the audit trail is pinned like a run (a rewrite of it shows at the next
        // `audit verify --since`); the ledger and the checkpoints cannot pin themselves
        .filter(|h| h.run_id != LEDGER && h.run_id != CHECKPOINTS && pinned.get(&h.run_id) != Some(&h.events))
        .map(|h| json!({"run": h.run_id, "seq": h.events, "head": h.head}))
        .collect();
    // the trail alone moving (refused logins, say) makes no checkpoint: it is pinned
    // with the next run that moves, so a stream of refusals is not a stream of signatures
    if moved.iter().all(|m| m["run"] == crate::audit::AUDIT) {
        return Ok(None);
    }
    let time = tally_common::evidence::now_rfc3339();
    let Value::Object(line) = json!({"event": "ledger", "time": time, "runs": moved}) else {
        unreachable!()
    };
    let at = log.append(LEDGER, line).await.map_err(|e| e.to_string())?;
    let payload = Checkpoint {
        seq: at.seq,
        head: at.head,
        time,
    };
    let signed = SignedCheckpoint {
        checkpoint: signer.sign(
            CHECKPOINT,
            &serde_json::to_vec(&payload).map_err(|e| e.to_string())?,
        )?,
        certificate: signer.certificate_pem.clone(),
    };
    let Value::Object(line) = json!({"event": "checkpoint", "checkpoint": signed.checkpoint,
                                       "certificate": signed.certificate})
    else {
        unreachable!()
    };
    log.append(CHECKPOINTS, line).await.map_err(|e| e.to_string())?;
    Ok(Some(signed))
}

/// The latest signed checkpoint.
pub async fn latest(log: &dyn RunLog) -> Result<Option<SignedCheckpoint>, String> {
    let lines = log.load(CHECKPOINTS).await.map_err(|e| e.to_string())?;
    lines
        .last()
        .map(|l| {
            serde_json::from_value(json!({"checkpoint": l["checkpoint"], "certificate": l["certificate"]}))
                .map_err(|e| format!("{CHECKPOINTS}: {e}"))
        })
        .transpose()
}

/// Every line of the run log, run by run in the order runs started (the log's own
/// chains included): what `tally audit export` writes, one line per line.
pub async fn export(log: &dyn RunLog) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for h in log.runs().await.map_err(|e| e.to_string())? {
        out.extend(log.lines(&h.run_id).await.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// Checks a signed checkpoint: its certificate chains to the CA as a coordinator's,
/// as of the checkpoint's time, and signed it. Returns the payload.
fn open(cp: &SignedCheckpoint, checker: &CertificateChecker) -> Result<Checkpoint, String> {
    let [sig] = cp.checkpoint.signatures.as_slice() else {
        return Err("a checkpoint carries one signature".into());
    };
    let payload: Checkpoint =
        serde_json::from_slice(&cp.checkpoint.payload_bytes().map_err(|e| e.to_string())?)
            .map_err(|e| format!("payload: {e}"))?;
    let at = time::OffsetDateTime::parse(&payload.time, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("time {:?}: {e}", payload.time))?;
    let at = rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        at.unix_timestamp().max(0) as u64,
    ));
    let chain = certificates_from_pem(cp.certificate.as_bytes())?;
    checker
        .check(&chain, &sig.keyid, Usage::Coordinator, at)
        .map_err(|e| e.to_string())?;
    cp.checkpoint
        .verify(CHECKPOINT, &sig.keyid, &chain[0])
        .map_err(|e| e.to_string())?;
    Ok(payload)
}

/// `tally audit verify`: checks an exported log (every chain, every pin, every signed
/// checkpoint) and, with `since`, that it extends that older checkpoint. Stops at the
/// first check that fails.
pub fn verify(export: &str, ca_pem: &[u8], since: Option<&SignedCheckpoint>) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut check = |name: String, outcome: Result<String, String>| {
        let ok = outcome.is_ok();
        checks.push(Check { name, outcome });
        ok
    };
    let checker = match CertificateChecker::from_ca_pem(ca_pem) {
        Ok(c) => c,
        Err(e) => {
            check("the CA".into(), Err(e));
            return checks;
        }
    };
    // every chain: lines grouped by the run they name, in order
    let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, line) in export.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let run = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v["run"].as_str().map(str::to_string));
        match run {
            Some(r) => chains.entry(r).or_default().push(line.to_string()),
            None => {
                check(
                    format!("line {}", i + 1),
                    Err("not a run-log line (JSON naming its run)".into()),
                );
                return checks;
            }
        }
    }
    let mut parsed: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (run, lines) in &chains {
        let mut events = Vec::new();
        let r = verify_lines(run, lines.iter().cloned().map(Ok), |v| {
            events.push(v);
            Ok(())
        });
        let ok = check(
            format!("chain {run}"),
            r.map(|(n, _)| format!("{n} lines link"))
                .map_err(|e| e.to_string()),
        );
        if !ok {
            return checks;
        }
        parsed.insert(run.clone(), events);
    }
    let hash_at = |run: &str, seq: u64| -> Option<String> {
        let lines = chains.get(run)?;
        lines
            .get(usize::try_from(seq).ok()?.checked_sub(1)?)
            .map(|l| line_hash(l))
    };
    // every pin of the ledger: the run still has that line
    let ledger = parsed.get(LEDGER).cloned().unwrap_or_default();
    for (i, line) in ledger.iter().enumerate() {
        for r in line["runs"].as_array().into_iter().flatten() {
            let (run, seq, head) = (
                r["run"].as_str().unwrap_or_default(),
                r["seq"].as_u64().unwrap_or(0),
                r["head"].as_str().unwrap_or_default(),
            );
            let found = hash_at(run, seq);
            if found.as_deref() != Some(head) {
                check(
                    format!("ledger line {}", i + 1),
                    Err(format!(
                        "pins run {run} at line {seq} with head {head}; the export's run {}",
                        match found {
                            None => "has no such line".to_string(),
                            Some(h) => format!("line {seq} hashes to {h}"),
                        }
                    )),
                );
                return checks;
            }
        }
    }
    let pins = ledger
        .iter()
        .map(|l| l["runs"].as_array().map_or(0, Vec::len))
        .sum::<usize>();
    if !check(
        "ledger".into(),
        Ok(format!(
            "{} lines, {pins} run heads pinned, each found in the export",
            ledger.len()
        )),
    ) {
        return checks;
    }
    // every signed checkpoint pins a ledger line of this export
    let signed = parsed.get(CHECKPOINTS).cloned().unwrap_or_default();
    for (i, line) in signed.iter().enumerate() {
        let outcome = serde_json::from_value::<SignedCheckpoint>(
            json!({"checkpoint": line["checkpoint"], "certificate": line["certificate"]}),
        )
        .map_err(|e| e.to_string())
        .and_then(|cp| open(&cp, &checker))
        .and_then(|p| {
            if hash_at(LEDGER, p.seq).as_deref() == Some(p.head.as_str()) {
                Ok(format!("ledger line {} at {}", p.seq, p.time))
            } else {
                Err(format!(
                    "signs ledger line {} head {}, which the export's ledger does not have",
                    p.seq, p.head
                ))
            }
        });
        if !check(format!("checkpoint {}", i + 1), outcome) {
            return checks;
        }
    }
    if let Some(cp) = since {
        let outcome = open(cp, &checker).and_then(|p| {
            if hash_at(LEDGER, p.seq).as_deref() == Some(p.head.as_str()) {
                Ok(format!(
                    "the export's ledger line {} is the checkpointed one ({}): every run pinned by then is unchanged",
                    p.seq, p.time
                ))
            } else {
                Err(format!(
                    "the checkpoint of {} signs ledger line {} head {}; the export's ledger {}",
                    p.time,
                    p.seq,
                    p.head,
                    match hash_at(LEDGER, p.seq) {
                        None => format!("has {} lines: it does not extend the checkpoint", ledger.len()),
                        Some(h) => format!("line {} hashes to {h}: the log was rewritten since", p.seq),
                    }
                ))
            }
        });
        check("--since".into(), outcome);
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::MemoryRunLog;
    use tally_common::chain::GENESIS;

    fn signer(dir: &std::path::Path) -> Signer {
        tally_common::pki::init_dir(dir, &[tally_common::pki::AgentLeaf::new("dc1")]).unwrap();
        Signer::load(&crate::config::ClientTls {
            ca: dir.join("ca.pem"),
            cert: dir.join("coordinator.pem"),
            key: dir.join("coordinator-key.pem"),
        })
        .unwrap()
    }

    fn ev(v: Value) -> serde_json::Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    /// The export with run `run`'s line `seq` edited and the run re-chained: a rewrite
    /// of history that keeps each chain valid on its own.
    fn rewritten(export: &[String], run: &str, seq: u64) -> Vec<String> {
        let mut prev = GENESIS.to_string();
        export
            .iter()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                if v["run"] != run {
                    return l.clone();
                }
                if v["seq"] == seq {
                    v["verdict"] = json!("match");
                }
                v["prev"] = json!(prev);
                let line = serde_json::to_string(&v).unwrap();
                prev = line_hash(&line);
                line
            })
            .collect()
    }

    fn failed(checks: &[Check]) -> Option<&str> {
        checks
            .iter()
            .find(|c| c.outcome.is_err())
            .map(|c| c.name.as_str())
    }

    #[tokio::test]
    async fn a_newer_export_extends_an_older_checkpoint_and_a_rewrite_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let s = signer(dir.path());
        let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let log = MemoryRunLog::default();
        assert_eq!(checkpoint(&log, &s).await.unwrap(), None, "nothing to pin");
        log.start("r1", ev(json!({"event": "started"}))).await.unwrap();
        log.append("r1", ev(json!({"event": "finished", "verdict": "differ"})))
            .await
            .unwrap();
        let c1 = checkpoint(&log, &s).await.unwrap().expect("r1 moved");
        assert_eq!(checkpoint(&log, &s).await.unwrap(), None, "nothing moved since");
        assert_eq!(latest(&log).await.unwrap().as_ref(), Some(&c1));
        log.start("r2", ev(json!({"event": "started"}))).await.unwrap();
        let c2 = checkpoint(&log, &s).await.unwrap().expect("r2 moved");
        assert_ne!(c1, c2);
        let export = export(&log).await.unwrap();
        let text = export.join("\n");

        let checks = verify(&text, &ca, Some(&c1));
        assert_eq!(failed(&checks), None, "{checks:?}");
        assert!(checks.iter().any(|c| c.name == "--since"));
        assert_eq!(failed(&verify(&text, &ca, Some(&c2))), None);

        // r1 rewritten and re-chained: the ledger's pin of r1 no longer holds
        let forged = rewritten(&export, "r1", 2).join("\n");
        assert_eq!(failed(&verify(&forged, &ca, Some(&c1))), Some("ledger line 1"));

        // ... and a ledger rebuilt over the rewrite, with checkpoints re-signed by the
        // coordinator's own key: valid on its own, but it does not extend c1
        let rebuilt = MemoryRunLog::default();
        for line in rewritten(&export, "r1", 2) {
            let mut v: Value = serde_json::from_str(&line).unwrap();
            let run = v["run"].as_str().unwrap().to_string();
            if is_internal(&run) {
                continue;
            }
            let m = v.as_object_mut().unwrap();
            for k in ["run", "seq", "prev"] {
                m.remove(k);
            }
            rebuilt.append(&run, m.clone()).await.unwrap();
        }
        checkpoint(&rebuilt, &s).await.unwrap().unwrap();
        let rebuilt = super::export(&rebuilt).await.unwrap().join("\n");
        assert_eq!(failed(&verify(&rebuilt, &ca, None)), None, "valid on its own");
        assert_eq!(failed(&verify(&rebuilt, &ca, Some(&c2))), Some("--since"));

        // an export cut before the checkpoint's ledger line does not extend it
        let cut: Vec<&str> = text
            .lines()
            .filter(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                !(is_internal(v["run"].as_str().unwrap()) && v["seq"] == 2)
            })
            .collect();
        assert_eq!(failed(&verify(&cut.join("\n"), &ca, Some(&c2))), Some("--since"));

        // a checkpoint whose signature or certificate is not the coordinator's
        let mut bad = c1.clone();
        // a bit of the signature flipped (replacing a base64 letter the signature may
        // not contain would change nothing)
        {
            use base64::Engine as _;
            let b64 = base64::engine::general_purpose::STANDARD;
            let mut sig = b64.decode(&bad.checkpoint.signatures[0].sig).unwrap();
            sig[8] ^= 0x01;
            bad.checkpoint.signatures[0].sig = b64.encode(sig);
        }
        let checks = verify(&text, &ca, Some(&bad));
        assert_eq!(failed(&checks), Some("--since"), "{checks:?}");
        let mut agent_cert = c1.clone();
        agent_cert.certificate = std::fs::read_to_string(dir.path().join("dc1.pem")).unwrap();
        assert_eq!(failed(&verify(&text, &ca, Some(&agent_cert))), Some("--since"));
        let other = tempfile::tempdir().unwrap();
        signer(other.path());
        let other_ca = std::fs::read(other.path().join("ca.pem")).unwrap();
        assert!(failed(&verify(&text, &other_ca, None)).is_some_and(|n| n.starts_with("checkpoint")));
    }

    #[tokio::test]
    async fn the_audit_trail_is_pinned_so_a_rewrite_of_it_shows() {
        let dir = tempfile::tempdir().unwrap();
        let s = signer(dir.path());
        let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let log = std::sync::Arc::new(MemoryRunLog::default());
        let trail = crate::audit::AuditLog::new(log.clone());
        for status in [202, 401] {
            trail
                .record(crate::audit::Event {
                    remote: "127.0.0.1:1".into(),
                    method: "POST".into(),
                    path: "/v1/runs".into(),
                    action: "start_run".into(),
                    status,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert_eq!(
            checkpoint(log.as_ref(), &s).await.unwrap(),
            None,
            "the trail alone pins nothing"
        );
        log.start("r1", ev(json!({"event": "started"}))).await.unwrap();
        let c = checkpoint(log.as_ref(), &s)
            .await
            .unwrap()
            .expect("a run moved, and the trail with it");
        let export = export(log.as_ref()).await.unwrap();
        assert_eq!(failed(&verify(&export.join("\n"), &ca, Some(&c))), None);
        // the trail's first call rewritten and the trail re-chained
        let forged = rewritten(&export, crate::audit::AUDIT, 1).join("\n");
        assert_eq!(failed(&verify(&forged, &ca, Some(&c))), Some("ledger line 1"));
    }
}
