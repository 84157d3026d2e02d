//! The run store of `tally serve`: one JSON document per run (spec snapshot, result)
//! and an append-only, hash-chained index. Each index line carries the SHA-256 of the
//! run's document and of the line before it, so a removed or edited run shows.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::chain::{self, ChainFile, sha256_hex as sha};

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
    index: ChainFile,
}

impl RunStore {
    /// Opens the store in `dir`, verifying the whole chain.
    pub fn open(dir: &Path) -> Result<RunStore, String> {
        std::fs::create_dir_all(dir.join("runs")).map_err(|e| format!("{}: {e}", dir.display()))?;
        verify(dir)?;
        Ok(RunStore {
            dir: dir.to_path_buf(),
            index: ChainFile::open(&dir.join("runs.jsonl"))?,
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
        self.index.append(|seq, prev| IndexEntry {
            seq,
            id: id.to_string(),
            name: name.to_string(),
            verdict: verdict.to_string(),
            finished: now(),
            document_sha256: sha(&text),
            prev: prev.to_string(),
        })
    }

    pub fn entries(&self) -> Result<Vec<IndexEntry>, String> {
        verify(&self.dir).map(|(_, _, e)| e)
    }

    /// The index's last seq and line hash.
    pub fn head(&self) -> (u64, String) {
        self.index.head()
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
    crate::lifecycle::now_rfc3339()
}

/// Checks the index chain and every document's hash; returns the last sequence number,
/// the last line's hash and the entries.
pub fn verify(dir: &Path) -> Result<(u64, String, Vec<IndexEntry>), String> {
    let (seq, head, entries) = chain::read::<IndexEntry>(&dir.join("runs.jsonl"))?;
    for e in &entries {
        let doc = dir.join("runs").join(format!("{}.json", e.id));
        let bytes = std::fs::read(&doc).map_err(|err| format!("{}: {err}", doc.display()))?;
        if sha(&bytes) != e.document_sha256 {
            return Err(format!(
                "{}: does not match its index entry (edited?)",
                doc.display()
            ));
        }
    }
    Ok((seq, head, entries))
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
