//! The coordinator's hash-chained JSON-lines files (an earlier version's run store
//! index and API audit log, both read only now), on the one chain of
//! `tally_common::chain` that the agents' release logs use too: one genesis, one
//! writer, one verifier. This module adapts it to the coordinator's `String` errors.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tally_common::chain as common;

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[derive(Debug)]
pub struct ChainFile {
    inner: common::ChainFile,
    path: std::path::PathBuf,
}

impl ChainFile {
    /// Opens (or starts) the chain at `path`, verifying every line.
    pub fn open(path: &Path) -> Result<ChainFile, String> {
        Ok(ChainFile {
            inner: common::ChainFile::open(path).map_err(|e| e.to_string())?,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last line's seq and hash.
    pub fn head(&self) -> (u64, String) {
        self.inner.head()
    }

    /// Appends the entry `make(seq, prev)` builds; it must serialize `seq` and `prev`
    /// as given. Appends are ordered, and the chain does not advance when the write fails.
    pub fn append<T: Serialize>(&self, make: impl FnOnce(u64, &str) -> T) -> Result<T, String> {
        self.inner
            .append_with(make)
            .map(|(entry, _)| entry)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// Reads and verifies the chain at `path` (a missing file is an empty chain): returns
/// the last seq, the last line's hash and the entries.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<(u64, String, Vec<T>), String> {
    common::read(path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_coordinator_chains_are_the_common_chain() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.jsonl");
        let c = ChainFile::open(&p).unwrap();
        for what in ["a", "b"] {
            c.append(|seq, prev| json!({ "seq": seq, "prev": prev, "what": what }))
                .unwrap();
        }
        // the agents' verifier accepts it: one chain format for every record
        assert_eq!(common::verify(&p).unwrap(), c.head());
        // an entry that does not carry the seq and prev it was given is refused
        assert!(c.append(|_, prev| json!({ "seq": 7, "prev": prev })).is_err());
        c.append(|seq, prev| json!({ "seq": seq, "prev": prev, "what": "c" }))
            .unwrap();
        let head = c.head();
        let text = std::fs::read_to_string(&p).unwrap();
        // the last line edited: the chain holds, its head does not (the head names it)
        std::fs::write(&p, text.replace("\"c\"", "\"y\"")).unwrap();
        assert_ne!(read::<serde_json::Value>(&p).unwrap().1, head.1);
        // an earlier line edited: the next line's prev no longer matches
        std::fs::write(&p, text.replace("\"b\"", "\"x\"")).unwrap();
        assert!(
            read::<serde_json::Value>(&p)
                .unwrap_err()
                .contains("log.jsonl:3: the chain is broken")
        );
        assert!(ChainFile::open(&p).is_err());
    }
}
