//! The agent's own record of every request and what it released: JSON lines, each
//! carrying the SHA-256 of the previous line, so deleting or editing a line breaks the
//! chain. A zone owner audits it without trusting the coordinator (`verify_chain`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub struct ReleaseLog {
    inner: Mutex<State>,
}

impl std::fmt::Debug for ReleaseLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseLog")
    }
}

struct State {
    /// `None`: records go to the tracing output only.
    path: Option<PathBuf>,
    seq: u64,
    prev: String,
}

fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}

impl ReleaseLog {
    /// Opens (or creates) the log at `path`, continuing its chain; `None` logs to the
    /// tracing output only.
    pub fn open(path: Option<&Path>) -> std::io::Result<ReleaseLog> {
        let mut state = State {
            path: None,
            seq: 0,
            prev: GENESIS.to_string(),
        };
        if let Some(p) = path {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            if p.exists() {
                let (seq, prev) = verify_chain(p).map_err(std::io::Error::other)?;
                state.seq = seq;
                state.prev = prev;
            }
            // created here, once: a log that disappears later is an error, never a
            // fresh chain
            std::fs::OpenOptions::new().create(true).append(true).open(p)?;
            state.path = Some(p.to_path_buf());
        }
        Ok(ReleaseLog {
            inner: Mutex::new(state),
        })
    }

    /// Appends one record (an object with the request and what was released) and
    /// returns the new head: the SHA-256 of the line just written, which the next line
    /// carries as `prev`. The file is reopened and synced for every record, so a log
    /// whose file or directory went away fails here rather than writing to an unlinked
    /// inode; on failure nothing is recorded and the caller must release nothing.
    pub fn append(&self, mut record: Value) -> std::io::Result<String> {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let obj = record.as_object_mut().expect("release records are objects");
        obj.insert("seq".into(), json!(s.seq + 1));
        obj.insert("ts".into(), json!(now_rfc3339()));
        obj.insert("prev".into(), json!(s.prev));
        let line = serde_json::to_string(&record).expect("json");
        match &s.path {
            Some(path) => {
                let written = std::fs::OpenOptions::new()
                    .append(true)
                    .open(path)
                    .and_then(|mut f| {
                        f.write_all(format!("{line}\n").as_bytes())?;
                        f.sync_data()
                    });
                if let Err(e) = written {
                    tracing::error!(path = %path.display(), error = %e, "cannot append to the release log");
                    return Err(e);
                }
            }
            None => tracing::info!(target: "tally::release", "{line}"),
        }
        s.seq += 1;
        s.prev = line_hash(&line);
        Ok(s.prev.clone())
    }

    /// The hash of the last line written (all zeros for an empty log).
    pub fn head(&self) -> String {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).prev.clone()
    }
}

fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(now.as_nanos() as i128)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Checks the whole chain; returns the last sequence number and line hash.
pub fn verify_chain(path: &Path) -> Result<(u64, String), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut prev = GENESIS.to_string();
    let mut seq = 0;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), i + 1))?;
        if v["prev"] != json!(prev) {
            return Err(format!(
                "{}:{}: chain broken (prev hash does not match the line before)",
                path.display(),
                i + 1
            ));
        }
        let s = v["seq"].as_u64().unwrap_or(0);
        if s != seq + 1 {
            return Err(format!(
                "{}:{}: sequence {s} follows {seq}",
                path.display(),
                i + 1
            ));
        }
        seq = s;
        prev = line_hash(&line);
    }
    Ok((seq, prev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_survives_reopen_and_detects_edits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("release.jsonl");
        let log = ReleaseLog::open(Some(&p)).unwrap();
        log.append(json!({"rpc": "Aggregate", "released": {"buckets": 32}}))
            .unwrap();
        log.append(json!({"rpc": "RevealKeys", "released": {"keys": 3}}))
            .unwrap();
        drop(log);
        let log = ReleaseLog::open(Some(&p)).unwrap();
        let head = log.append(json!({"rpc": "Describe"})).unwrap();
        assert_eq!(verify_chain(&p).unwrap(), (3, head.clone()));
        assert_eq!(log.head(), head);
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"keys\":3", "\"keys\":0");
        std::fs::write(&p, text).unwrap();
        assert!(verify_chain(&p).unwrap_err().contains("chain broken"));
    }

    #[test]
    fn a_log_that_cannot_be_written_refuses_and_keeps_its_chain() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("logs");
        let p = sub.join("release.jsonl");
        let log = ReleaseLog::open(Some(&p)).unwrap();
        let head = log.append(json!({"rpc": "Describe"})).unwrap();
        // the directory goes away under the running agent (root ignores chmod)
        std::fs::remove_dir_all(&sub).unwrap();
        assert!(log.append(json!({"rpc": "Aggregate"})).is_err());
        assert_eq!(log.head(), head, "a failed write must not advance the chain");
        // a file replaced by a directory
        std::fs::create_dir_all(&p).unwrap();
        assert!(log.append(json!({"rpc": "Aggregate"})).is_err());
        // and back: the chain continues from the last line that was written
        std::fs::remove_dir(&p).unwrap();
        std::fs::write(&p, "").unwrap();
        assert!(log.append(json!({"rpc": "Aggregate"})).is_ok());
        let e = verify_chain(&p).unwrap_err();
        assert!(e.contains("chain broken"), "a truncated log must not verify: {e}");
    }
}
