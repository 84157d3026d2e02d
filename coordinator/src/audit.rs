//! The API's audit trail (DESIGN §12): every request that changes state, or tries to,
//! and every scheduled run a tick starts, is one event of who (token name or
//! certificate name), from where, what, on which replica, and whether it was done.
//!
//! The trail is a chain of the run log, [`AUDIT`], beside the ledger's: on a single
//! node in its SQLite file, in a group in the replicated state, where each event is a
//! Raft command written by the leader (a follower hands the events it records to the
//! leader, see `serve/cluster.rs`). Every replica therefore serves the same hash-chained
//! trail, and losing a minority of replicas loses none of it. A state change whose event
//! cannot be written is not made.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tally_common::chain::line_hash;

use crate::runlog::{RunLog, RunLogError};

/// The audit trail's id in the run log.
pub const AUDIT: &str = "_audit";

/// One event as `GET /v1/audit` lists it: the call, and its place in the chain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditEvent {
    pub seq: u64,
    pub time: String,
    /// The token's name or the certificate's name; absent when nobody logged in.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub actor: Option<String>,
    /// `token` or `certificate`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub via: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub role: Option<String>,
    /// The client's address as the coordinator saw it.
    pub remote: String,
    pub method: String,
    pub path: String,
    /// `start_run`, `cancel_run`, `put_schedule`, `delete_schedule`, `scheduled_run`,
    /// or `request` for one refused before routing.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub run: Option<String>,
    /// `accepted` or `refused`.
    pub outcome: String,
    /// The HTTP status answered.
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// The replica that answered the caller (a group's node id; a call a follower
    /// forwarded is the leader's, which answered it), absent on a single node.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub replica: Option<u64>,
    /// SHA-256 of the previous line of the chain.
    pub prev: String,
}

/// An event before the trail numbers and chains it (what a follower hands the leader).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub actor: Option<String>,
    pub via: Option<String>,
    pub role: Option<String>,
    pub remote: String,
    pub method: String,
    pub path: String,
    pub action: String,
    pub run: Option<String>,
    pub status: u16,
    pub reason: Option<String>,
    /// Set by the replica that handled the call.
    #[serde(default)]
    pub replica: Option<u64>,
    /// When the call was handled (set by [`AuditLog::record`] when absent).
    #[serde(default)]
    pub time: Option<String>,
}

/// The trail, on the run log.
pub struct AuditLog {
    log: Arc<dyn RunLog>,
    /// One append at a time: each takes the next number of the chain.
    writing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").finish_non_exhaustive()
    }
}

/// The events of an `audit.jsonl` written before the trail moved into the run log, and
/// the name the file is kept under once they are copied.
const LEGACY: &str = "audit.jsonl";
const LEGACY_KEPT: &str = "audit.jsonl.imported";

impl AuditLog {
    pub fn new(log: Arc<dyn RunLog>) -> AuditLog {
        AuditLog {
            log,
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// A single node's trail: an `audit.jsonl` left in `dir` by an earlier version is
    /// verified and its events copied into the trail (their times and callers kept,
    /// `imported: true`) when the trail is empty; the file is then kept as
    /// `audit.jsonl.imported`.
    pub async fn open_single(log: Arc<dyn RunLog>, dir: &Path) -> Result<AuditLog, String> {
        let trail = AuditLog::new(log);
        let legacy = dir.join(LEGACY);
        if legacy.exists() {
            let (_, _, old) = crate::chain::read::<AuditEvent>(&legacy)?;
            // copied one event at a time: a start that stopped part-way goes on from
            // where it stopped (the trail then holds only imported events, a prefix)
            let lines = trail.log.verified_lines(AUDIT).await.map_err(|e| e.to_string())?;
            let imported = lines.iter().take_while(|(_, v)| v["imported"] == true).count();
            if imported == lines.len() && imported < old.len() {
                for e in &old[imported..] {
                    let mut event = stored(e);
                    event.insert("imported".into(), Value::Bool(true));
                    trail.log.append(AUDIT, event).await.map_err(|e| e.to_string())?;
                }
            }
            let kept = dir.join(LEGACY_KEPT);
            std::fs::rename(&legacy, &kept).map_err(|e| format!("{}: {e}", legacy.display()))?;
            tracing::info!(file = %kept.display(), "audit: the events of audit.jsonl are now in the run log's audit trail");
        }
        Ok(trail)
    }

    /// Appends one event (fields a caller chose, such as the path or a reason quoting
    /// a spec, are cut to [`MAX_FIELD`] characters); its number in the trail. On a
    /// replica that does not lead its group this is [`RunLogError::NotLeader`].
    pub async fn record(&self, e: Event) -> Result<u64, RunLogError> {
        let outcome = if e.status < 400 { "accepted" } else { "refused" };
        // what a caller sends is cut to a bounded length: an anonymous request cannot
        // make the trail grow by more than an event of this size
        let cut = |s: String| bounded(s, MAX_FIELD);
        let event = AuditEvent {
            seq: 0,
            time: e.time.unwrap_or_else(crate::lifecycle::now_rfc3339),
            actor: e.actor.map(cut),
            via: e.via.map(cut),
            role: e.role.map(cut),
            remote: cut(e.remote),
            method: cut(e.method),
            path: cut(e.path),
            action: cut(e.action),
            run: e.run.map(cut),
            outcome: outcome.into(),
            status: e.status,
            reason: e.reason.map(cut),
            replica: e.replica,
            prev: String::new(),
        };
        let _one = self.writing.lock().await;
        // a leader elected a moment ago may find an event of its predecessor committed
        // after it read the chain's head: it reads again
        let mut tries = 0;
        loop {
            match self.log.append(AUDIT, stored(&event)).await {
                Ok(at) => return Ok(at.seq),
                Err(RunLogError::Conflict { .. }) if tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Every event, the chain verified as it is read, and the trail's (seq, head).
    pub async fn events(&self) -> Result<(Vec<AuditEvent>, u64, String), String> {
        let lines = self.log.verified_lines(AUDIT).await.map_err(|e| e.to_string())?;
        let head = lines
            .last()
            .map(|(l, _)| line_hash(l))
            .unwrap_or_else(|| tally_common::chain::GENESIS.to_string());
        let events = lines
            .into_iter()
            .map(|(_, v)| listed(v))
            .collect::<Result<Vec<_>, _>>()?;
        let seq = events.len() as u64;
        Ok((events, seq, head))
    }
}

/// The event as the run log stores it: the call under `call` (the log sets `run`,
/// `seq` and `prev` on the line itself, and `run` is the trail's id there).
fn stored(e: &AuditEvent) -> serde_json::Map<String, Value> {
    let mut call = serde_json::to_value(e).unwrap_or_default();
    if let Value::Object(m) = &mut call {
        for k in ["seq", "prev", "time"] {
            m.remove(k);
        }
    }
    let Value::Object(m) = json!({"event": "audit", "time": e.time, "call": call}) else {
        unreachable!()
    };
    m
}

/// A stored line back as the event `GET /v1/audit` lists.
fn listed(v: Value) -> Result<AuditEvent, String> {
    let mut call = v["call"].clone();
    let Value::Object(m) = &mut call else {
        return Err(format!("{AUDIT}: event {} holds no call", v["seq"]));
    };
    m.insert("seq".into(), v["seq"].clone());
    m.insert("prev".into(), v["prev"].clone());
    m.insert("time".into(), v["time"].clone());
    serde_json::from_value(call).map_err(|e| format!("{AUDIT}: event {}: {e}", v["seq"]))
}

/// The longest a caller-chosen field is recorded.
pub const MAX_FIELD: usize = 200;

fn bounded(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut cut: String = s.chars().take(max).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::MemoryRunLog;

    fn ev(status: u16, run: Option<&str>) -> Event {
        Event {
            actor: Some("ci".into()),
            via: Some("token".into()),
            role: Some("operator".into()),
            remote: "127.0.0.1:5000".into(),
            method: "POST".into(),
            path: "/v1/runs".into(),
            action: "start_run".into(),
            run: run.map(str::to_string),
            status,
            ..Event::default()
        }
    }

    #[tokio::test]
    async fn events_are_chained_in_the_run_log_and_say_whether_they_were_done() {
        let log: Arc<dyn RunLog> = Arc::new(MemoryRunLog::default());
        let trail = AuditLog::new(log.clone());
        assert_eq!(trail.record(ev(202, Some("r1"))).await.unwrap(), 1);
        assert_eq!(trail.record(ev(403, None)).await.unwrap(), 2);
        let (events, seq, head) = AuditLog::new(log.clone()).events().await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(seq, 2);
        assert_eq!(events[0].prev, tally_common::chain::GENESIS);
        assert_eq!(events[0].outcome, "accepted");
        assert_eq!(events[0].run.as_deref(), Some("r1"));
        assert_eq!(events[1].outcome, "refused");
        let lines = log.lines(AUDIT).await.unwrap();
        assert_eq!(events[1].prev, line_hash(&lines[0]));
        assert_eq!(head, line_hash(&lines[1]));
        // the run the call named is the event's, not the line's (the line's is the trail)
        let line: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(line["run"], AUDIT);
        assert_eq!(line["call"]["run"], "r1");
    }

    #[tokio::test]
    async fn calls_recorded_at_once_each_get_their_own_number() {
        let trail = Arc::new(AuditLog::new(Arc::new(MemoryRunLog::default())));
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let t = trail.clone();
                tokio::spawn(async move { t.record(ev(202, Some(&format!("r{i}")))).await.unwrap() })
            })
            .collect();
        let mut seqs = Vec::new();
        for c in calls {
            seqs.push(c.await.unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=16).collect::<Vec<u64>>());
        assert_eq!(trail.events().await.unwrap().0.len(), 16);
    }

    #[tokio::test]
    async fn an_old_audit_file_is_copied_into_the_trail_once_and_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        // the format an earlier version wrote: one chain file
        let file = crate::chain::ChainFile::open(&dir.path().join(LEGACY)).unwrap();
        for status in [202u16, 401] {
            file.append(|seq, prev| AuditEvent {
                seq,
                time: "2026-01-02T03:04:05Z".into(),
                actor: None,
                via: None,
                role: None,
                remote: "10.0.0.1:1".into(),
                method: "POST".into(),
                path: "/v1/runs".into(),
                action: "start_run".into(),
                run: None,
                outcome: if status < 400 { "accepted" } else { "refused" }.into(),
                status,
                reason: None,
                replica: None,
                prev: prev.to_string(),
            })
            .unwrap();
        }
        drop(file);
        let log: Arc<dyn RunLog> = Arc::new(MemoryRunLog::default());
        let trail = AuditLog::open_single(log.clone(), dir.path()).await.unwrap();
        let (events, _, _) = trail.events().await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].status, 401);
        assert_eq!(events[0].time, "2026-01-02T03:04:05Z");
        assert!(!dir.path().join(LEGACY).exists());
        assert!(dir.path().join(LEGACY_KEPT).exists());
        // opened again: nothing copied twice
        let trail = AuditLog::open_single(log, dir.path()).await.unwrap();
        assert_eq!(trail.events().await.unwrap().0.len(), 2);
        // a copy that stopped after the first event goes on with the second, once
        std::fs::rename(dir.path().join(LEGACY_KEPT), dir.path().join(LEGACY)).unwrap();
        let log: Arc<dyn RunLog> = Arc::new(MemoryRunLog::default());
        let mut first = stored(
            &crate::chain::read::<AuditEvent>(&dir.path().join(LEGACY))
                .unwrap()
                .2[0],
        );
        first.insert("imported".into(), Value::Bool(true));
        log.append(AUDIT, first).await.unwrap();
        let trail = AuditLog::open_single(log, dir.path()).await.unwrap();
        let (events, _, _) = trail.events().await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.status).collect::<Vec<_>>(),
            vec![202, 401]
        );
    }
}
