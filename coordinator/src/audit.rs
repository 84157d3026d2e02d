//! The API's audit log (DESIGN §12): every request that changes state, or tries to,
//! is one line of `audit.jsonl` in `data_dir`, hash-chained like the run store's index
//! (chain.rs): who (token name or certificate name), from where, what, and whether it
//! was done. A state change whose event cannot be written is not made.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::chain::{self, ChainFile};

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
    /// `start_run`, `cancel_run`, or `request` for one refused before routing.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub run: Option<String>,
    /// `accepted` or `refused`.
    pub outcome: String,
    /// The HTTP status answered.
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// SHA-256 of the previous line.
    pub prev: String,
}

/// An event before the log numbers and chains it.
#[derive(Debug, Clone, Default)]
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
}

#[derive(Debug)]
pub struct AuditLog {
    file: ChainFile,
}

impl AuditLog {
    /// Opens `audit.jsonl` in `dir`, verifying its chain.
    pub fn open(dir: &Path) -> Result<AuditLog, String> {
        Ok(AuditLog {
            file: ChainFile::open(&dir.join("audit.jsonl"))?,
        })
    }

    /// Appends one event (fields a caller chose, such as the path, are cut to
    /// [`MAX_FIELD`] characters).
    pub fn record(&self, e: Event) -> Result<AuditEvent, String> {
        let outcome = if e.status < 400 { "accepted" } else { "refused" };
        let time = crate::lifecycle::now_rfc3339();
        // what a caller sends is cut to a bounded length: an anonymous request cannot
        // make the log grow by more than a line of this size
        let cut = |s: String| bounded(s, MAX_FIELD);
        self.file.append(|seq, prev| AuditEvent {
            seq,
            time,
            actor: e.actor,
            via: e.via,
            role: e.role,
            remote: e.remote,
            method: cut(e.method),
            path: cut(e.path),
            action: e.action,
            run: e.run.map(cut),
            outcome: outcome.into(),
            status: e.status,
            reason: e.reason,
            prev: prev.to_string(),
        })
    }

    /// Every event, the chain verified again.
    pub fn events(&self) -> Result<Vec<AuditEvent>, String> {
        chain::read(self.file.path()).map(|(_, _, e)| e)
    }

    pub fn head(&self) -> (u64, String) {
        self.file.head()
    }
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

    #[test]
    fn events_are_chained_and_say_whether_they_were_done() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path()).unwrap();
        let ev = |status, run: Option<&str>| Event {
            actor: Some("ci".into()),
            via: Some("token".into()),
            role: Some("operator".into()),
            remote: "127.0.0.1:5000".into(),
            method: "POST".into(),
            path: "/v1/runs".into(),
            action: "start_run".into(),
            run: run.map(str::to_string),
            status,
            reason: None,
        };
        log.record(ev(202, Some("r1"))).unwrap();
        log.record(ev(403, None)).unwrap();
        drop(log);
        let log = AuditLog::open(dir.path()).unwrap();
        let events = log.events().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].outcome, "accepted");
        assert_eq!(events[0].run.as_deref(), Some("r1"));
        assert_eq!(events[1].outcome, "refused");
        assert_eq!(
            events[1].prev,
            chain::sha256_hex(
                std::fs::read_to_string(dir.path().join("audit.jsonl"))
                    .unwrap()
                    .lines()
                    .next()
                    .unwrap()
                    .as_bytes()
            )
        );
        assert_eq!(log.head().0, 2);
    }
}
