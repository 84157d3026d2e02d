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
    file: Option<(PathBuf, std::fs::File)>,
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
            file: None,
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
            let f = std::fs::OpenOptions::new().create(true).append(true).open(p)?;
            state.file = Some((p.to_path_buf(), f));
        }
        Ok(ReleaseLog {
            inner: Mutex::new(state),
        })
    }

    /// Appends one record; `record` is an object with the request and what was released.
    pub fn append(&self, mut record: Value) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.seq += 1;
        let obj = record.as_object_mut().expect("release records are objects");
        obj.insert("seq".into(), json!(s.seq));
        obj.insert("ts".into(), json!(now_rfc3339()));
        obj.insert("prev".into(), json!(s.prev));
        let line = serde_json::to_string(&record).expect("json");
        s.prev = line_hash(&line);
        match &mut s.file {
            Some((path, f)) => {
                if let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush()) {
                    tracing::error!(path = %path.display(), error = %e, "cannot append to the release log");
                }
            }
            None => tracing::info!(target: "tally::release", "{line}"),
        }
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
        log.append(json!({"rpc": "Aggregate", "released": {"buckets": 32}}));
        log.append(json!({"rpc": "RevealKeys", "released": {"keys": 3}}));
        drop(log);
        let log = ReleaseLog::open(Some(&p)).unwrap();
        log.append(json!({"rpc": "Describe"}));
        assert_eq!(verify_chain(&p).unwrap().0, 3);
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"keys\":3", "\"keys\":0");
        std::fs::write(&p, text).unwrap();
        assert!(verify_chain(&p).unwrap_err().contains("chain broken"));
    }
}
