//! The run store of earlier versions of a single-node `tally serve`, read only: one JSON
//! document per run (`data_dir/runs/ID.json`) and a hash-chained index (`runs.jsonl`)
//! whose lines each carry the SHA-256 of the run's document and of the line before.
//!
//! Finished runs now live in one store, the run log: every service (single node or
//! group) closes a run with a `finished` event that carries its document. A data
//! directory written by an earlier version keeps its `runs.jsonl`; it is verified when
//! the service starts (a broken chain or an edited document refuses the start) and read
//! for the runs it holds, and never written again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::chain::{self, sha256_hex as sha};

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

/// A verified earlier run store.
#[derive(Debug)]
pub struct LegacyRunStore {
    dir: PathBuf,
    entries: Vec<IndexEntry>,
    seq: u64,
    head: String,
}

impl LegacyRunStore {
    /// The store in `dir` when there is one (`runs.jsonl` exists), its whole chain and
    /// every document verified.
    pub fn open(dir: &Path) -> Result<Option<LegacyRunStore>, String> {
        if !dir.join("runs.jsonl").exists() {
            return Ok(None);
        }
        let (seq, head, entries) = verify(dir)?;
        Ok(Some(LegacyRunStore {
            dir: dir.to_path_buf(),
            entries,
            seq,
            head,
        }))
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The index's last seq and line hash.
    pub fn head(&self) -> (u64, &str) {
        (self.seq, &self.head)
    }

    /// A run's document, checked against its index entry again as it is read.
    pub fn document(&self, id: &str) -> Option<serde_json::Value> {
        let entry = self.entries.iter().find(|e| e.id == id)?;
        let bytes = std::fs::read(document_path(&self.dir, id)).ok()?;
        if sha(&bytes) != entry.document_sha256 {
            tracing::error!(run = %id, "runs/{id}.json no longer matches its index entry (edited?): not served");
            return None;
        }
        serde_json::from_slice(&bytes).ok()
    }
}

fn document_path(dir: &Path, id: &str) -> PathBuf {
    dir.join("runs").join(format!("{id}.json"))
}

/// Checks the index chain and every document's hash; returns the last sequence number,
/// the last line's hash and the entries.
pub fn verify(dir: &Path) -> Result<(u64, String, Vec<IndexEntry>), String> {
    let (seq, head, entries) = chain::read::<IndexEntry>(&dir.join("runs.jsonl"))?;
    for e in &entries {
        if !tally_common::evidence::valid_run_id(&e.id) {
            return Err(format!(
                "runs.jsonl: entry {} names no valid run id: {:?}",
                e.seq, e.id
            ));
        }
        let doc = document_path(dir, &e.id);
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

/// Writes a store as an earlier version did: each run's document
/// `{"id", "finished", "spec": {"name": "orders"}, "result": {"verdict"}}`.
#[cfg(test)]
pub(crate) fn write_for_test(dir: &Path, runs: &[(&str, &str)]) {
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let index = chain::ChainFile::open(&dir.join("runs.jsonl")).unwrap();
    for (id, verdict) in runs {
        let doc = serde_json::json!({"id": id, "finished": "2026-01-01T00:00:00Z",
                "spec": {"name": "orders"}, "result": {"verdict": verdict}});
        let text = serde_json::to_vec_pretty(&doc).unwrap();
        std::fs::write(document_path(dir, id), &text).unwrap();
        index
            .append(|seq, prev| IndexEntry {
                seq,
                id: id.to_string(),
                name: "orders".into(),
                verdict: verdict.to_string(),
                finished: "2026-01-01T00:00:00Z".into(),
                document_sha256: sha(&text),
                prev: prev.to_string(),
            })
            .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_store_is_read_and_an_edit_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            LegacyRunStore::open(dir.path()).unwrap().is_none(),
            "no runs.jsonl: no store"
        );
        write_for_test(dir.path(), &[("r1", "match"), ("r2", "differ")]);
        let s = LegacyRunStore::open(dir.path()).unwrap().unwrap();
        assert_eq!(s.entries().len(), 2);
        assert_eq!(s.head().0, 2);
        assert_eq!(s.document("r2").unwrap()["result"]["verdict"], "differ");
        assert!(s.document("r3").is_none());
        // edited after the service started: not served
        std::fs::write(
            document_path(dir.path(), "r2"),
            b"{\"result\": {\"verdict\": \"match\"}}",
        )
        .unwrap();
        assert!(s.document("r2").is_none());
        // and the next start is refused, naming the file
        assert!(verify(dir.path()).unwrap_err().contains("r2.json"));
        assert!(LegacyRunStore::open(dir.path()).is_err());
    }
}
