//! Reading a `tally serve` replica's Raft store (`raft.db` under its `data_dir`) from a
//! test, read-only beside the running replica (the store is in WAL mode), with Python's
//! sqlite3 (the tests crate links no SQLite driver).

use std::path::Path;
use std::process::Command;

const QUERY: &str = "import json, sqlite3, sys\n\
c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n\
print(json.dumps(c.execute(sys.argv[2]).fetchall()))";

/// Every row `query` returns, as JSON arrays; none when the store does not exist yet.
pub fn rows(db: &Path, query: &str) -> Vec<Vec<serde_json::Value>> {
    if !db.exists() {
        return Vec::new();
    }
    let out = Command::new("python3")
        .args(["-c", QUERY])
        .arg(db)
        .arg(query)
        .output()
        .expect("running python3 (its sqlite3 module reads the replicas' stores)");
    // a store being created has no tables yet: no rows
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// The first column of the first row, as text ("" for none or NULL).
pub fn value(db: &Path, query: &str) -> String {
    match rows(db, query).first().and_then(|r| r.first()) {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// Level events of run `id` that the replica has applied.
pub fn levels(db: &Path, id: &str) -> u64 {
    // each event is its chain line stored as a JSON string
    value(
        db,
        &format!(
            "SELECT count(*) FROM sm_run_event WHERE run_id = '{id}' AND event LIKE '%\\\"event\\\":\\\"level\\\"%'"
        ),
    )
    .parse()
    .unwrap_or(0)
}

/// The replica's whole Raft log: (index, term, entry as stored).
pub fn log(db: &Path) -> Vec<(u64, u64, String)> {
    rows(db, "SELECT idx, term, entry FROM raft_log ORDER BY idx")
        .into_iter()
        .filter_map(|r| match r.as_slice() {
            [i, t, e] => Some((i.as_u64()?, t.as_u64()?, e.as_str()?.to_string())),
            _ => None,
        })
        .collect()
}

/// The replica's own vote: (term, the node it names leader, whether that leader was
/// elected), as it last stored it.
pub fn vote(db: &Path) -> Option<(u64, u64, bool)> {
    let v: serde_json::Value =
        serde_json::from_str(&value(db, "SELECT value FROM raft_meta WHERE key = 'vote'")).ok()?;
    Some((
        v["leader_id"]["term"].as_u64()?,
        v["leader_id"]["node_id"].as_u64()?,
        v["committed"].as_bool()?,
    ))
}
