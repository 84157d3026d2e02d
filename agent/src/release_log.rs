//! The agent's own record of every request and what it released: JSON lines on the
//! one hash chain of `tally_common::chain`, so deleting or editing a line breaks the
//! chain. A zone owner audits it without trusting the coordinator (`verify_chain`).

use std::path::Path;

use serde_json::{Value, json};
use tally_common::chain::{self, ChainFile};

pub struct ReleaseLog {
    chain: ChainFile,
}

impl std::fmt::Debug for ReleaseLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseLog")
    }
}

impl ReleaseLog {
    /// Opens (or creates) the log at `path`, continuing its chain and refusing a broken
    /// one; `None` logs to the tracing output only.
    pub fn open(path: Option<&Path>) -> std::io::Result<ReleaseLog> {
        let chain = match path {
            // created here, once: a log that disappears later is an error, never a
            // fresh chain
            Some(p) => ChainFile::open(p).map_err(std::io::Error::other)?,
            None => ChainFile::in_memory(),
        };
        Ok(ReleaseLog { chain })
    }

    /// Appends one record (an object with the request and what was released) and
    /// returns the new head: the SHA-256 of the line just written, which the next line
    /// carries as `prev`. The file is reopened and synced for every record, so a log
    /// whose file or directory went away fails here rather than writing to an unlinked
    /// inode; on failure nothing is recorded and the caller must release nothing.
    pub fn append(&self, record: Value) -> std::io::Result<String> {
        let Value::Object(mut fields) = record else {
            return Err(std::io::Error::other("release records are objects"));
        };
        fields.insert("ts".into(), json!(now_rfc3339()));
        match self.chain.append(fields) {
            Ok((_, head)) => Ok(head),
            Err(e) => {
                tracing::error!(path = ?self.chain.path(), error = %e, "cannot append to the release log");
                Err(e)
            }
        }
    }

    /// The hash of the last line written (all zeros for an empty log).
    pub fn head(&self) -> String {
        self.chain.head().1
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
    if !path.exists() {
        return Err(format!("{}: no such file", path.display()));
    }
    chain::verify(path).map_err(|e| e.to_string())
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
        assert!(verify_chain(&p).unwrap_err().contains("chain is broken"));
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
        assert!(
            e.contains("chain is broken"),
            "a truncated log must not verify: {e}"
        );
    }
}
