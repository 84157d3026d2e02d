//! The run log (DESIGN §9): every event of a run, appended before the run engine takes
//! its next step, so a run that stops anywhere resumes by replaying its events.
//!
//! Each run's events form one hash chain of `tally_common::chain` (the format of the
//! agents' release logs): event n carries `seq: n` and `prev`, the SHA-256 of event
//! n-1's line (`GENESIS` for the first), so a run's events can be checked on their own,
//! in an evidence bundle or after a restore. Loading a run verifies its chain.
//!
//! Back-ends: [`SqliteRunLog`], the single-node store under `data_dir` (one SQLite
//! file, WAL, `synchronous = FULL`: an append has returned only once it is on disk),
//! and [`MemoryRunLog`] for tests. The Raft back-end, `raft::RaftRunLog`, stores the same
//! lines in the replicated state machine, so a run's events are byte for byte the same
//! whichever back-end holds them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde_json::{Map, Value};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tally_common::chain::{GENESIS, line_hash, verify_lines};

/// Where an appended event landed: its sequence number in its run and the run's new head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub head: String,
}

/// One run as the log knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHead {
    pub run_id: String,
    pub events: u64,
    pub head: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    #[error("run log: {0}")]
    Store(String),
    /// A run's stored events do not verify: edited, reordered or lost.
    #[error("run log: run {run}: {what}")]
    Broken { run: String, what: String },
    #[error("run log: an event must be a JSON object without run, seq and prev (the log sets them)")]
    BadEvent,
    /// The Raft back-end on a replica that is not (or no longer) the leader: only the
    /// leader writes, and a deposed leader's run stops here.
    #[error("run log: this replica is not the leader{}", leader.as_ref().map(|l| format!(" (the leader is {l})")).unwrap_or_default())]
    NotLeader { leader: Option<String> },
    /// The run has more events than the writer knew: another replica wrote to it.
    #[error("run log: run {run}: event {seq} was written by another replica")]
    Conflict { run: String, seq: u64 },
}

fn store_err(e: impl std::fmt::Display) -> RunLogError {
    RunLogError::Store(e.to_string())
}

/// A scheduled run as the service keeps it (single node: this run log's SQLite file; a
/// group: the replicated state). Parsed and checked by the scheduler (`serve::schedules`),
/// not by the store.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    /// A cron expression (`crate::cron`), UTC.
    pub cron: String,
    /// The run's spec as submitted, validated.
    pub spec: Value,
    /// When it was put (Unix seconds): no tick before it starts a run.
    #[serde(default)]
    pub created: i64,
    /// Who put it.
    #[serde(default)]
    pub by: String,
}

/// The run log's contract: appends are durable when they return, per run in order; a
/// run loads only when its chain verifies.
#[tonic::async_trait]
pub trait RunLog: Send + Sync {
    /// Appends `event` (a JSON object) to `run`, with `seq` and `prev` set.
    async fn append(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError>;
    /// Appends the first event of a new run; `Conflict` when `run` has events already,
    /// whoever wrote them (so a scheduled tick, named by its time, starts once).
    async fn start(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError>;
    /// Every schedule, by name.
    async fn schedules(&self) -> Result<BTreeMap<String, Schedule>, RunLogError>;
    /// Creates or replaces a schedule.
    async fn put_schedule(&self, name: &str, schedule: Schedule) -> Result<(), RunLogError>;
    /// Removes a schedule; whether there was one.
    async fn delete_schedule(&self, name: &str) -> Result<bool, RunLogError>;
    /// Every line of `run` as stored, in order (empty for an unknown run): the bytes
    /// its chain hashes. Unverified: [`RunLog::load`] and [`RunLog::verified_lines`] check.
    async fn lines(&self, run: &str) -> Result<Vec<String>, RunLogError>;
    /// Every event of `run` in order, its chain verified (empty for an unknown run).
    async fn load(&self, run: &str) -> Result<Vec<Value>, RunLogError> {
        verified(run, self.lines(run).await?)
    }
    /// Every line of `run` with its parsed event, the chain verified: what an evidence
    /// bundle carries (the exact bytes) beside what it says.
    async fn verified_lines(&self, run: &str) -> Result<Vec<(String, Value)>, RunLogError> {
        let lines = self.lines(run).await?;
        let events = verified(run, lines.clone())?;
        Ok(lines.into_iter().zip(events).collect())
    }
    /// Every run with its event count and head, in the order runs were started.
    async fn runs(&self) -> Result<Vec<RunHead>, RunLogError>;
}

/// The next line of a run's chain after `(seq, head)`.
/// Every line names its run (`run`), so one run's lines stored under another id (a
/// restore, a replica or an editor mixing runs up) do not load: the chain alone starts
/// at the same genesis for every run.
pub(crate) fn next_line(
    run: &str,
    seq: u64,
    head: &str,
    mut event: Map<String, Value>,
) -> Result<(u64, String), RunLogError> {
    if event.contains_key("seq") || event.contains_key("prev") || event.contains_key("run") {
        return Err(RunLogError::BadEvent);
    }
    event.insert("run".into(), Value::from(run));
    event.insert("seq".into(), Value::from(seq + 1));
    event.insert("prev".into(), Value::from(head));
    let line = serde_json::to_string(&Value::Object(event)).map_err(store_err)?;
    Ok((seq + 1, line))
}

/// Verifies a run's stored lines and returns them parsed.
pub(crate) fn verified(run: &str, lines: Vec<String>) -> Result<Vec<Value>, RunLogError> {
    let mut out = Vec::with_capacity(lines.len());
    verify_lines(run, lines.into_iter().map(Ok), |v| {
        if v.get("run").and_then(Value::as_str) != Some(run) {
            return Err(format!(
                "event {} names run {} (not this run)",
                out.len() + 1,
                v["run"]
            ));
        }
        out.push(v);
        Ok(())
    })
    .map_err(|e| RunLogError::Broken {
        run: run.to_string(),
        what: e.to_string(),
    })?;
    Ok(out)
}

/// The single-node run log: one SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteRunLog {
    pool: SqlitePool,
}

impl SqliteRunLog {
    /// Opens (or creates) `path` (e.g. `data_dir/runs.sqlite`).
    pub async fn open(path: &Path) -> Result<SqliteRunLog, RunLogError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // an append has returned only when it is on disk, power loss included
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true);
        // one writer: appends of a run are ordered by the connection, not by luck
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await
            .map_err(|e| RunLogError::Store(format!("{}: {e}", path.display())))?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS runs (
                 ord INTEGER PRIMARY KEY AUTOINCREMENT,
                 run_id TEXT NOT NULL UNIQUE,
                 events INTEGER NOT NULL,
                 head TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS events (
                 run_id TEXT NOT NULL REFERENCES runs (run_id),
                 seq INTEGER NOT NULL,
                 line TEXT NOT NULL,
                 PRIMARY KEY (run_id, seq));
             CREATE TABLE IF NOT EXISTS schedules (
                 name TEXT PRIMARY KEY,
                 schedule TEXT NOT NULL);",
        )
        .execute(&pool)
        .await
        .map_err(store_err)?;
        Ok(SqliteRunLog { pool })
    }
}

impl SqliteRunLog {
    async fn write(&self, run: &str, event: Map<String, Value>, new: bool) -> Result<Appended, RunLogError> {
        let mut tx = self.pool.begin().await.map_err(store_err)?;
        let current: Option<(i64, String)> = sqlx::query_as("SELECT events, head FROM runs WHERE run_id = ?")
            .bind(run)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_err)?;
        if new && current.is_some() {
            return Err(RunLogError::Conflict {
                run: run.to_string(),
                seq: 1,
            });
        }
        let (seq, head) = current.map_or((0, GENESIS.to_string()), |(n, h)| (n as u64, h));
        let (seq, line) = next_line(run, seq, &head, event)?;
        let head = line_hash(&line);
        sqlx::query(
            "INSERT INTO runs (run_id, events, head) VALUES (?, ?, ?)
             ON CONFLICT (run_id) DO UPDATE SET events = excluded.events, head = excluded.head",
        )
        .bind(run)
        .bind(seq as i64)
        .bind(&head)
        .execute(&mut *tx)
        .await
        .map_err(store_err)?;
        sqlx::query("INSERT INTO events (run_id, seq, line) VALUES (?, ?, ?)")
            .bind(run)
            .bind(seq as i64)
            .bind(&line)
            .execute(&mut *tx)
            .await
            .map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        Ok(Appended { seq, head })
    }
}

#[tonic::async_trait]
impl RunLog for SqliteRunLog {
    async fn append(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write(run, event, false).await
    }

    async fn start(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write(run, event, true).await
    }

    async fn schedules(&self) -> Result<BTreeMap<String, Schedule>, RunLogError> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT name, schedule FROM schedules ORDER BY name")
                .fetch_all(&self.pool)
                .await
                .map_err(store_err)?;
        rows.into_iter()
            .map(|(name, s)| Ok((name, serde_json::from_str(&s).map_err(store_err)?)))
            .collect()
    }

    async fn put_schedule(&self, name: &str, schedule: Schedule) -> Result<(), RunLogError> {
        sqlx::query(
            "INSERT INTO schedules (name, schedule) VALUES (?, ?) \
             ON CONFLICT (name) DO UPDATE SET schedule = excluded.schedule",
        )
        .bind(name)
        .bind(serde_json::to_string(&schedule).map_err(store_err)?)
        .execute(&self.pool)
        .await
        .map_err(store_err)?;
        Ok(())
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, RunLogError> {
        let done = sqlx::query("DELETE FROM schedules WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(store_err)?;
        Ok(done.rows_affected() > 0)
    }

    async fn lines(&self, run: &str) -> Result<Vec<String>, RunLogError> {
        // one transaction: a load beside a running run's appends sees the lines and the
        // head of the same moment
        let mut tx = self.pool.begin().await.map_err(store_err)?;
        let lines: Vec<(String,)> = sqlx::query_as("SELECT line FROM events WHERE run_id = ? ORDER BY seq")
            .bind(run)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_err)?;
        // the run's recorded head must be its last line's: a removed last event shows
        let recorded: Option<(i64, String)> =
            sqlx::query_as("SELECT events, head FROM runs WHERE run_id = ?")
                .bind(run)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        let lines: Vec<String> = lines.into_iter().map(|(l,)| l).collect();
        if let Some((n, _)) = &recorded
            && *n as usize != lines.len()
        {
            return Err(RunLogError::Broken {
                run: run.to_string(),
                what: format!("{} events stored, the run's head counts {n}", lines.len()),
            });
        }
        Ok(lines)
    }

    async fn runs(&self) -> Result<Vec<RunHead>, RunLogError> {
        let rows: Vec<(String, i64, String)> =
            sqlx::query_as("SELECT run_id, events, head FROM runs ORDER BY ord")
                .fetch_all(&self.pool)
                .await
                .map_err(store_err)?;
        Ok(rows
            .into_iter()
            .map(|(run_id, n, head)| RunHead {
                run_id,
                events: n as u64,
                head,
            })
            .collect())
    }
}

/// Runs in start order, and each run's event lines.
type Runs = (Vec<String>, BTreeMap<String, Vec<String>>);

impl MemoryRunLog {
    fn write(&self, run: &str, event: Map<String, Value>, new: bool) -> Result<Appended, RunLogError> {
        let mut g = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let (order, runs) = &mut *g;
        if new && runs.contains_key(run) {
            return Err(RunLogError::Conflict {
                run: run.to_string(),
                seq: 1,
            });
        }
        let lines = runs.entry(run.to_string()).or_insert_with(|| {
            order.push(run.to_string());
            Vec::new()
        });
        let head = lines.last().map_or_else(|| GENESIS.to_string(), |l| line_hash(l));
        let (seq, line) = next_line(run, lines.len() as u64, &head, event)?;
        let head = line_hash(&line);
        lines.push(line);
        Ok(Appended { seq, head })
    }
}

/// A run log in memory, for engine tests.
#[derive(Debug, Default)]
pub struct MemoryRunLog {
    runs: Mutex<Runs>,
    schedules: Mutex<BTreeMap<String, Schedule>>,
}

#[tonic::async_trait]
impl RunLog for MemoryRunLog {
    async fn append(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write(run, event, false)
    }

    async fn start(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write(run, event, true)
    }

    async fn schedules(&self) -> Result<BTreeMap<String, Schedule>, RunLogError> {
        Ok(self.schedules.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    async fn put_schedule(&self, name: &str, schedule: Schedule) -> Result<(), RunLogError> {
        let mut g = self.schedules.lock().unwrap_or_else(|e| e.into_inner());
        g.insert(name.to_string(), schedule);
        Ok(())
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, RunLogError> {
        let mut g = self.schedules.lock().unwrap_or_else(|e| e.into_inner());
        Ok(g.remove(name).is_some())
    }

    async fn lines(&self, run: &str) -> Result<Vec<String>, RunLogError> {
        let g = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(g.1.get(run).cloned().unwrap_or_default())
    }

    async fn runs(&self) -> Result<Vec<RunHead>, RunLogError> {
        let g = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(g.0
            .iter()
            .map(|id| {
                let lines = &g.1[id];
                RunHead {
                    run_id: id.clone(),
                    events: lines.len() as u64,
                    head: lines.last().map_or_else(|| GENESIS.to_string(), |l| line_hash(l)),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    async fn contract(log: &dyn RunLog) {
        let a1 = log.append("r1", ev(json!({"kind": "started"}))).await.unwrap();
        assert_eq!(a1.seq, 1);
        log.append("r2", ev(json!({"kind": "started"}))).await.unwrap();
        let a2 = log
            .append("r1", ev(json!({"kind": "level", "level": 1})))
            .await
            .unwrap();
        assert_eq!(a2.seq, 2);
        let events = log.load("r1").await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["prev"], GENESIS);
        assert_eq!(events[1]["level"], 1);
        // each run is its own chain, checkable with the agents' verifier
        let lines: Vec<String> = events.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
        assert_eq!(line_hash(&lines[1]), a2.head);
        let runs = log.runs().await.unwrap();
        assert_eq!(
            runs.iter()
                .map(|r| (r.run_id.as_str(), r.events))
                .collect::<Vec<_>>(),
            vec![("r1", 2), ("r2", 1)]
        );
        assert_eq!(runs[0].head, a2.head);
        assert!(log.load("nothing").await.unwrap().is_empty());
        assert!(matches!(
            log.append("r1", ev(json!({"seq": 9}))).await,
            Err(RunLogError::BadEvent)
        ));
        // a run is started once: a second start of the same id is refused, whatever it holds
        let s = log.start("t1", ev(json!({"kind": "started"}))).await.unwrap();
        assert_eq!(s.seq, 1);
        for run in ["t1", "r1"] {
            assert!(
                matches!(
                    log.start(run, ev(json!({"kind": "started"}))).await,
                    Err(RunLogError::Conflict { .. })
                ),
                "{run}"
            );
        }
        assert_eq!(log.load("t1").await.unwrap().len(), 1);
        // schedules: put, replace, list, delete
        let nightly = |cron: &str| Schedule {
            cron: cron.to_string(),
            spec: json!({"name": "orders"}),
            created: 1_700_000_000,
            by: "ops".to_string(),
        };
        assert!(log.schedules().await.unwrap().is_empty());
        log.put_schedule("nightly", nightly("0 3 * * *")).await.unwrap();
        log.put_schedule("hourly", nightly("@hourly")).await.unwrap();
        log.put_schedule("nightly", nightly("0 4 * * *")).await.unwrap();
        let all = log.schedules().await.unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["hourly", "nightly"]);
        assert_eq!(all["nightly"], nightly("0 4 * * *"));
        assert!(log.delete_schedule("hourly").await.unwrap());
        assert!(!log.delete_schedule("hourly").await.unwrap());
        assert_eq!(log.schedules().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn the_memory_log_keeps_the_contract() {
        contract(&MemoryRunLog::default()).await;
    }

    #[tokio::test]
    async fn the_sqlite_log_keeps_the_contract_survives_reopening_and_refuses_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.sqlite");
        let log = SqliteRunLog::open(&path).await.unwrap();
        contract(&log).await;
        drop(log);
        let log = SqliteRunLog::open(&path).await.unwrap();
        assert_eq!(log.load("r1").await.unwrap().len(), 2);
        let a3 = log.append("r1", ev(json!({"kind": "finished"}))).await.unwrap();
        assert_eq!(a3.seq, 3);
        // an edited event breaks its run's chain
        sqlx::query("UPDATE events SET line = replace(line, '\"level\":1', '\"level\":7') WHERE run_id = 'r1' AND seq = 2")
            .execute(&log.pool)
            .await
            .unwrap();
        let e = log.load("r1").await.unwrap_err().to_string();
        assert!(e.contains("run r1") && e.contains("the chain is broken"), "{e}");
        // a removed last event: the count the run's head keeps tells
        sqlx::query("DELETE FROM events WHERE run_id = 'r2' AND seq = 1")
            .execute(&log.pool)
            .await
            .unwrap();
        let e = log.load("r2").await.unwrap_err().to_string();
        assert!(e.contains("0 events stored"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_beside_appends_sees_one_moment() {
        // `tally serve` shows a running run's levels while the run appends: a load
        // between an append's two writes reported a broken run
        let dir = tempfile::tempdir().unwrap();
        let log = std::sync::Arc::new(SqliteRunLog::open(&dir.path().join("runs.sqlite")).await.unwrap());
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                for i in 0..300 {
                    log.append("r", ev(json!({"event": "level", "i": i})))
                        .await
                        .unwrap();
                }
            })
        };
        let mut seen = 0;
        while !writer.is_finished() {
            let n = log.load("r").await.unwrap().len();
            assert!(n >= seen, "a later load saw fewer events");
            seen = n;
        }
        writer.await.unwrap();
        assert_eq!(log.load("r").await.unwrap().len(), 300);
    }
}
