//! The one hash chain of Tally's append-only JSON-lines records: the agent's release
//! log, the coordinator's run store index and its API audit log. Line n is a JSON
//! object carrying `seq: n` and `prev`, the lowercase hex SHA-256 of line n-1's bytes
//! (without its newline), [`GENESIS`] for the first; so a removed, reordered, inserted
//! or edited line breaks the chain, and the head (the hash of the last line) names the
//! whole history. One writer ([`ChainFile`]) and one verifier ([`verify`]) for all.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// `prev` of the first line, and the head of an empty chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The hash a line is chained by: lowercase hex SHA-256 of its bytes.
pub fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}

/// Why a chain does not verify: the file and 1-based line, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {what}")]
pub struct ChainError {
    pub at: String,
    pub what: String,
}

/// Checks every line of a chain: JSON objects whose `seq` counts from 1 and whose
/// `prev` is the hash of the line before. Blank lines are skipped. Returns the last
/// `seq` and the head; `each` sees every entry in order.
pub fn verify_lines(
    label: &str,
    lines: impl Iterator<Item = std::io::Result<String>>,
    mut each: impl FnMut(Value) -> Result<(), String>,
) -> Result<(u64, String), ChainError> {
    let mut prev = GENESIS.to_string();
    let mut seq = 0u64;
    for (i, line) in lines.enumerate() {
        let err = |what: String| ChainError {
            at: format!("{label}:{}", i + 1),
            what,
        };
        let line = line.map_err(|e| err(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| err(format!("not JSON: {e}")))?;
        if v["prev"].as_str() != Some(prev.as_str()) {
            return Err(err(
                "the chain is broken: prev is not the hash of the line before".into(),
            ));
        }
        let s = v["seq"].as_u64();
        if s != Some(seq + 1) {
            return Err(err(format!(
                "the chain is broken: seq {} follows {seq}",
                s.map_or_else(|| "missing".to_string(), |s| s.to_string())
            )));
        }
        seq += 1;
        prev = line_hash(&line);
        each(v).map_err(err)?;
    }
    Ok((seq, prev))
}

/// Verifies the chain in `path` (a missing file is an empty chain).
pub fn verify(path: &Path) -> Result<(u64, String), ChainError> {
    read::<Value>(path).map(|(seq, head, _)| (seq, head))
}

/// Verifies the chain in `path` and returns its entries as `T`.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<(u64, String, Vec<T>), ChainError> {
    let label = path.display().to_string();
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((0, GENESIS.to_string(), Vec::new()));
        }
        Err(e) => {
            return Err(ChainError {
                at: label,
                what: e.to_string(),
            });
        }
    };
    let mut entries = Vec::new();
    let (seq, head) = verify_lines(&label, std::io::BufReader::new(f).lines(), |v| {
        entries.push(serde_json::from_value(v).map_err(|e| e.to_string())?);
        Ok(())
    })?;
    Ok((seq, head, entries))
}

/// An open chain: appends are ordered (one lock) and synced before they count; a
/// failed write does not advance the chain. Without a path the chain is kept in memory
/// and each line goes to `tracing` (target `tally::chain`) instead of a file.
#[derive(Debug)]
pub struct ChainFile {
    path: Option<PathBuf>,
    head: Mutex<(u64, String)>,
}

impl ChainFile {
    /// Opens the chain at `path`, verifying every line, and creates the file (and its
    /// directory) if it is not there. Appends never create it again: a chain whose file
    /// disappears fails, and never starts over.
    pub fn open(path: &Path) -> Result<ChainFile, ChainError> {
        let io = |e: std::io::Error| ChainError {
            at: path.display().to_string(),
            what: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let (seq, head) = verify(path)?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        Ok(ChainFile {
            path: Some(path.to_path_buf()),
            head: Mutex::new((seq, head)),
        })
    }

    /// A chain that writes no file (lines go to the log output).
    pub fn in_memory() -> ChainFile {
        ChainFile {
            path: None,
            head: Mutex::new((0, GENESIS.to_string())),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The last line's seq and hash.
    pub fn head(&self) -> (u64, String) {
        self.head.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Appends `fields` (a JSON object) with `seq` and `prev` set, and returns the
    /// entry written and the new head.
    pub fn append(&self, fields: Map<String, Value>) -> std::io::Result<(Value, String)> {
        self.append_with(|seq, prev| {
            let mut obj = fields;
            obj.insert("seq".into(), Value::from(seq));
            obj.insert("prev".into(), Value::from(prev));
            Value::Object(obj)
        })
    }

    /// Appends the entry `make(seq, prev)` builds; it must serialize `seq` and `prev`
    /// as given (checked: an entry that does not is refused, never written). Returns
    /// the entry and the new head.
    pub fn append_with<T: serde::Serialize>(
        &self,
        make: impl FnOnce(u64, &str) -> T,
    ) -> std::io::Result<(T, String)> {
        let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let entry = make(head.0 + 1, &head.1);
        let line = serde_json::to_string(&entry).map_err(std::io::Error::other)?;
        let v: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
        if v["seq"].as_u64() != Some(head.0 + 1) || v["prev"].as_str() != Some(head.1.as_str()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a chain entry must carry the seq and prev it was given",
            ));
        }
        match &self.path {
            Some(path) => {
                let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
                f.write_all(format!("{line}\n").as_bytes())?;
                f.sync_data()?;
            }
            None => tracing::info!(target: "tally::chain", "{line}"),
        }
        *head = (head.0 + 1, line_hash(&line));
        Ok((entry, head.1.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn appends_survive_reopening_and_every_tampering_breaks_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/log.jsonl");
        let c = ChainFile::open(&p).unwrap();
        assert_eq!(c.head(), (0, GENESIS.to_string()));
        for what in ["a", "b", "c"] {
            c.append(obj(json!({ "what": what }))).unwrap();
        }
        let head = c.head();
        drop(c);
        let c = ChainFile::open(&p).unwrap();
        assert_eq!(c.head(), head);
        let (entry, h4) = c.append(obj(json!({ "what": "d" }))).unwrap();
        assert_eq!(
            (entry["seq"].as_u64(), entry["prev"].as_str()),
            (Some(4), Some(head.1.as_str()))
        );
        assert_eq!(verify(&p).unwrap(), (4, h4));
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let broken = |t: String| {
            std::fs::write(&p, t).unwrap();
            verify(&p).unwrap_err().to_string()
        };
        // an edit
        let e = broken(text.replace("\"b\"", "\"x\""));
        assert!(e.contains("log.jsonl:3: the chain is broken"), "{e}");
        // a removed line
        let e = broken(format!("{}\n{}\n{}\n", lines[0], lines[2], lines[3]));
        assert!(e.contains(":2: the chain is broken"), "{e}");
        // two lines swapped
        let e = broken(format!(
            "{}\n{}\n{}\n{}\n",
            lines[0], lines[2], lines[1], lines[3]
        ));
        assert!(e.contains(":2: the chain is broken"), "{e}");
        // a last line removed still verifies, as a shorter chain: the head says so
        std::fs::write(&p, format!("{}\n{}\n", lines[0], lines[1])).unwrap();
        assert_ne!(verify(&p).unwrap().1, head.1);
        assert!(ChainFile::open(&p).is_ok());
    }

    #[test]
    fn a_chain_whose_file_went_away_refuses_and_keeps_its_head() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("logs");
        let p = sub.join("release.jsonl");
        let c = ChainFile::open(&p).unwrap();
        let (_, head) = c.append(obj(json!({"rpc": "Describe"}))).unwrap();
        std::fs::remove_dir_all(&sub).unwrap();
        assert!(c.append(obj(json!({"rpc": "Aggregate"}))).is_err());
        assert_eq!(c.head().1, head, "a failed write must not advance the chain");
    }
}
