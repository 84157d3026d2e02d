//! Durable storage for the coordinator's Raft group (openraft 0.9, storage v2): the log
//! store ([`SqliteLogStore`]) and the state machine ([`SqliteStateMachine`]), both in one
//! SQLite database, `raft.db` under the replica's `data_dir`.
//!
//! What is replicated: each run's event log and the scheduled runs ([`Command`]). The run
//! engine appends every event it takes through [`Command::AppendRunEvent`] before its next
//! step ([`runlog::RaftRunLog`]), so a new leader resumes a run by replaying the committed
//! events. The replicas talk over mutual TLS with peer certificates: [`network`] is the
//! client side, [`peer`] the server side (Raft, forwarded API writes, `tally cluster`),
//! [`node`] starts a replica.
//!
//! Durability: the database runs in WAL mode with `synchronous=FULL`, so every commit is
//! fsynced before it returns. NORMAL would be faster but may forget the last commits on
//! power loss, and Raft must never forget a vote it gave or an entry it acknowledged.
//! `append` reports the entries flushed only after their transaction committed; `save_vote`,
//! `save_committed`, `truncate` and `purge` return after theirs. The state machine writes
//! each applied batch (its state and last applied log id) in one transaction, so after a
//! restart it is exactly as of its last applied entry; snapshots are stored beside it.
//!
//! All writes go through one connection (a pool of one), so they are serialised as
//! openraft requires and never meet SQLite's `BUSY` between writers; reads (replication,
//! snapshot building) use a separate pool that WAL lets run beside the writer.
//!
//! The store depends on `openraft` and `sqlx` only; nothing here knows about agents or
//! specs.

mod log_store;
pub mod network;
pub mod node;
pub mod peer;
pub mod runlog;
mod state_machine;
mod types;

use std::path::{Path, PathBuf};
use std::time::Duration;

use openraft::{AnyError, StorageError, StorageIOError};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use log_store::SqliteLogStore;
pub use node::Node;
pub use runlog::RaftRunLog;
pub use state_machine::{SqliteSnapshotBuilder, SqliteStateMachine, StateReader};
pub use types::{Command, NodeId, Replica, Response, Schedule, StateImage, TypeConfig};

/// The database file under `data_dir`.
pub const DB_FILE: &str = "raft.db";

/// The schema this build writes, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &[&str] = &[
    // The log: one row per entry; `entry` is the JSON of the whole `openraft::Entry`
    // (log id and payload), `term` is there for inspection.
    "CREATE TABLE raft_log (idx INTEGER PRIMARY KEY, term INTEGER NOT NULL, entry TEXT NOT NULL)",
    // Single values as JSON: `vote`, `committed`, `last_purged` (the log store's) and
    // `last_applied`, `last_membership`, `snapshot_seq` (the state machine's).
    "CREATE TABLE raft_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    // The state machine.
    "CREATE TABLE sm_run_event (run_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, \
     PRIMARY KEY (run_id, seq))",
    "CREATE TABLE sm_schedule (name TEXT PRIMARY KEY, schedule TEXT NOT NULL)",
    // The current snapshot (at most one): its meta as JSON and its data.
    "CREATE TABLE sm_snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), meta TEXT NOT NULL, data BLOB NOT NULL)",
];

/// Errors of the SQLite Raft store, before they are mapped to openraft's `StorageError`.
#[derive(Debug, thiserror::Error)]
pub enum RaftStoreError {
    #[error("raft store {path}: {source}")]
    Open { path: PathBuf, source: sqlx::Error },
    #[error("raft store schema version {found} is not {SCHEMA_VERSION} (written by another build)")]
    SchemaVersion { found: i64 },
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("raft store holds invalid json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("raft store: {0}")]
    Invalid(String),
}

pub(crate) type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Maps an internal error to openraft's, naming what was being done.
pub(crate) fn io_err(
    what: impl FnOnce(AnyError) -> StorageIOError<NodeId>,
) -> impl FnOnce(RaftStoreError) -> StorageError<NodeId> {
    move |e| StorageError::from(what(AnyError::new(&e)))
}

/// The two pools over the one database file.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    /// One connection: every write goes through it, in the order it was asked for.
    pub(crate) write: SqlitePool,
    pub(crate) read: SqlitePool,
}

/// Opens (creating it if needed) the Raft store of a replica under `data_dir`.
pub async fn open(data_dir: &Path) -> Result<(SqliteLogStore, SqliteStateMachine), RaftStoreError> {
    let db = open_db(data_dir).await?;
    Ok((SqliteLogStore::new(db.clone()), SqliteStateMachine::new(db)))
}

async fn open_db(data_dir: &Path) -> Result<Db, RaftStoreError> {
    let path = data_dir.join(DB_FILE);
    let open_err = |source| RaftStoreError::Open {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(|e| open_err(sqlx::Error::Io(e)))?;
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let write = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options.clone().create_if_missing(true))
        .await
        .map_err(open_err)?;
    migrate(&write).await?;
    let read = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .map_err(open_err)?;
    Ok(Db { write, read })
}

async fn migrate(write: &SqlitePool) -> Result<(), RaftStoreError> {
    let mut tx = write.begin().await?;
    let version: i64 = sqlx::query("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    match version {
        0 => {
            for stmt in SCHEMA {
                sqlx::query(*stmt).execute(&mut *tx).await?;
            }
            // PRAGMA takes no bound parameters; the value is a constant of this build.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA user_version = {SCHEMA_VERSION}"
            )))
            .execute(&mut *tx)
            .await?;
        }
        SCHEMA_VERSION => {}
        found => return Err(RaftStoreError::SchemaVersion { found }),
    }
    tx.commit().await?;
    Ok(())
}

/// Reads one JSON value of `raft_meta`.
pub(crate) async fn read_meta<'c, T, E>(executor: E, key: &str) -> Result<Option<T>, RaftStoreError>
where
    T: serde::de::DeserializeOwned,
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let row = sqlx::query("SELECT value FROM raft_meta WHERE key = ?")
        .bind(key)
        .fetch_optional(executor)
        .await?;
    match row {
        None => Ok(None),
        Some(row) => Ok(Some(serde_json::from_str(row.try_get::<&str, _>(0)?)?)),
    }
}

/// Writes one JSON value of `raft_meta`.
pub(crate) async fn write_meta<'c, T, E>(executor: E, key: &str, value: &T) -> Result<(), RaftStoreError>
where
    T: serde::Serialize,
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    sqlx::query(
        "INSERT INTO raft_meta (key, value) VALUES (?, ?) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(key)
    .bind(serde_json::to_string(value)?)
    .execute(executor)
    .await?;
    Ok(())
}

/// A log index or sequence number as SQLite stores it (a signed 64-bit integer).
pub(crate) fn to_sql_int(n: u64) -> Result<i64, RaftStoreError> {
    i64::try_from(n).map_err(|_| RaftStoreError::Invalid(format!("{n} does not fit a sqlite integer")))
}

pub(crate) fn from_sql_int(n: i64) -> Result<u64, RaftStoreError> {
    u64::try_from(n).map_err(|_| RaftStoreError::Invalid(format!("negative index {n}")))
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    #[tokio::test]
    async fn every_connection_is_wal_with_full_sync_and_the_schema_is_versioned() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::open_db(dir.path()).await.unwrap();
        for pool in [&db.write, &db.read] {
            let mode: String = sqlx::query("PRAGMA journal_mode")
                .fetch_one(pool)
                .await
                .unwrap()
                .get(0);
            assert_eq!(mode, "wal");
            // 2 is FULL.
            let sync: i64 = sqlx::query("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .unwrap()
                .get(0);
            assert_eq!(sync, 2);
        }
        drop(db);
        // Reopening an existing store of this version is fine; another version is refused.
        let db = super::open_db(dir.path()).await.unwrap();
        sqlx::query("PRAGMA user_version = 7")
            .execute(&db.write)
            .await
            .unwrap();
        drop(db);
        let err = super::open_db(dir.path()).await.unwrap_err();
        assert!(
            matches!(err, super::RaftStoreError::SchemaVersion { found: 7 }),
            "{err}"
        );
    }
}
