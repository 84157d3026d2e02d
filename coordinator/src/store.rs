//! The run store of `tally serve`: one JSON document per run (spec snapshot, result)
//! and an append-only, hash-chained index. Each index line carries the SHA-256 of the
//! run's document and of the line before it, so a removed or edited run shows.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One line of the index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IndexEntry {
    pub seq: u64,
    pub id: String,
    pub name: String,
    pub verdict: String,
    pub finished: String,
    /// SHA-256 of the run's document as stored.
    pub document_sha256: String,
    /// SHA-256 of the previous index line.
    pub prev: String,
}

#[derive(Debug)]
pub struct RunStore {
    dir: PathBuf,
    state: Mutex<(u64, String)>,
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl RunStore {
    /// Opens the store in `dir`, verifying the whole chain.
    pub fn open(dir: &Path) -> Result<RunStore, String> {
        std::fs::create_dir_all(dir.join("runs")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (seq, prev, _) = verify(dir)?;
        Ok(RunStore {
            dir: dir.to_path_buf(),
            state: Mutex::new((seq, prev)),
        })
    }

    pub fn document_path(&self, id: &str) -> PathBuf {
        self.dir.join("runs").join(format!("{id}.json"))
    }

    /// Stores a finished run's document and appends it to the chain.
    pub fn append(
        &self,
        id: &str,
        name: &str,
        verdict: &str,
        document: &serde_json::Value,
    ) -> Result<IndexEntry, String> {
        let text = serde_json::to_vec_pretty(document).map_err(|e| e.to_string())?;
        let path = self.document_path(id);
        std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = IndexEntry {
            seq: st.0 + 1,
            id: id.to_string(),
            name: name.to_string(),
            verdict: verdict.to_string(),
            finished: now(),
            document_sha256: sha(&text),
            prev: st.1.clone(),
        };
        let line = serde_json::to_string(&entry).map_err(|e| e.to_string())?;
        let index = self.dir.join("runs.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&index)
            .map_err(|e| e.to_string())?;
        writeln!(f, "{line}")
            .and_then(|_| f.sync_data())
            .map_err(|e| format!("{}: {e}", index.display()))?;
        *st = (entry.seq, sha(line.as_bytes()));
        Ok(entry)
    }

    pub fn entries(&self) -> Result<Vec<IndexEntry>, String> {
        verify(&self.dir).map(|(_, _, e)| e)
    }

    pub fn document(&self, id: &str) -> Option<serde_json::Value> {
        if !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return None;
        }
        let text = std::fs::read(self.document_path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Checks the index chain and every document's hash; returns the last sequence number,
/// the last line's hash and the entries.
pub fn verify(dir: &Path) -> Result<(u64, String, Vec<IndexEntry>), String> {
    let index = dir.join("runs.jsonl");
    let mut prev = GENESIS.to_string();
    let mut entries = Vec::new();
    let Ok(f) = std::fs::File::open(&index) else {
        return Ok((0, prev, entries));
    };
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", index.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let e: IndexEntry =
            serde_json::from_str(&line).map_err(|e| format!("{}:{}: {e}", index.display(), i + 1))?;
        if e.prev != prev || e.seq != entries.len() as u64 + 1 {
            return Err(format!("{}:{}: the chain is broken", index.display(), i + 1));
        }
        let doc = dir.join("runs").join(format!("{}.json", e.id));
        let bytes = std::fs::read(&doc).map_err(|err| format!("{}: {err}", doc.display()))?;
        if sha(&bytes) != e.document_sha256 {
            return Err(format!(
                "{}: does not match its index entry (edited?)",
                doc.display()
            ));
        }
        prev = sha(line.as_bytes());
        entries.push(e);
    }
    Ok((entries.len() as u64, prev, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_detects_edits_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let s = RunStore::open(dir.path()).unwrap();
        s.append("r1", "orders", "match", &serde_json::json!({"verdict": "match"}))
            .unwrap();
        s.append(
            "r2",
            "orders",
            "differ",
            &serde_json::json!({"verdict": "differ"}),
        )
        .unwrap();
        drop(s);
        let s = RunStore::open(dir.path()).unwrap();
        let e = s
            .append("r3", "accounts", "match", &serde_json::json!({}))
            .unwrap();
        assert_eq!(e.seq, 3);
        assert_eq!(s.entries().unwrap().len(), 3);
        std::fs::write(s.document_path("r2"), b"{\"verdict\": \"match\"}").unwrap();
        assert!(verify(dir.path()).unwrap_err().contains("r2.json"));
        assert!(RunStore::open(dir.path()).is_err());
    }
}
