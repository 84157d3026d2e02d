//! The coordinator's append-only, hash-chained JSON-lines files (the run store's index
//! and the API's audit log): line n carries `seq: n` and `prev`, the SHA-256 of line
//! n-1 (zeros for the first), so a removed, reordered or edited line breaks the chain.
//! Each append is synced before it counts.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[derive(Debug)]
pub struct ChainFile {
    path: PathBuf,
    /// The last line's seq and hash.
    head: Mutex<(u64, String)>,
}

impl ChainFile {
    /// Opens (or starts) the chain at `path`, verifying every line.
    pub fn open(path: &Path) -> Result<ChainFile, String> {
        let (seq, head, _) = read::<serde_json::Value>(path)?;
        Ok(ChainFile {
            path: path.to_path_buf(),
            head: Mutex::new((seq, head)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last line's seq and hash.
    pub fn head(&self) -> (u64, String) {
        self.head.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Appends the entry `make(seq, prev)` builds; it must serialize `seq` and `prev`
    /// as given. Holds the chain's lock throughout, so appends are ordered. The chain
    /// does not advance when the write fails.
    pub fn append<T: Serialize>(&self, make: impl FnOnce(u64, &str) -> T) -> Result<T, String> {
        let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let entry = make(head.0 + 1, &head.1);
        let line = serde_json::to_string(&entry).map_err(|e| e.to_string())?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        writeln!(f, "{line}")
            .and_then(|_| f.sync_data())
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        *head = (head.0 + 1, sha256_hex(line.as_bytes()));
        Ok(entry)
    }
}

/// Reads and verifies the chain at `path` (a missing file is an empty chain): returns
/// the last seq, the last line's hash and the entries.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<(u64, String, Vec<T>), String> {
    let mut prev = GENESIS.to_string();
    let mut entries = Vec::new();
    let Ok(f) = std::fs::File::open(path) else {
        return Ok((0, prev, entries));
    };
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let at = || format!("{}:{}", path.display(), i + 1);
        let line = line.map_err(|e| format!("{}: {e}", at()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| format!("{}: {e}", at()))?;
        if v["prev"].as_str() != Some(prev.as_str()) || v["seq"].as_u64() != Some(entries.len() as u64 + 1) {
            return Err(format!("{}: the chain is broken", at()));
        }
        entries.push(serde_json::from_value(v).map_err(|e| format!("{}: {e}", at()))?);
        prev = sha256_hex(line.as_bytes());
    }
    Ok((entries.len() as u64, prev, entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn appends_chain_survive_reopening_and_edits_break_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.jsonl");
        let c = ChainFile::open(&p).unwrap();
        for what in ["a", "b"] {
            c.append(|seq, prev| json!({ "seq": seq, "prev": prev, "what": what }))
                .unwrap();
        }
        let head = c.head();
        drop(c);
        let c = ChainFile::open(&p).unwrap();
        assert_eq!(c.head(), head);
        let e = c
            .append(|seq, prev| json!({ "seq": seq, "prev": prev, "what": "c" }))
            .unwrap();
        assert_eq!(e["seq"], 3);
        assert_eq!(read::<serde_json::Value>(&p).unwrap().2.len(), 3);
        let text = std::fs::read_to_string(&p).unwrap().replace("\"b\"", "\"x\"");
        std::fs::write(&p, text).unwrap();
        assert!(
            read::<serde_json::Value>(&p)
                .unwrap_err()
                .contains("log.jsonl:3: the chain is broken")
        );
        assert!(ChainFile::open(&p).is_err());
    }
}
