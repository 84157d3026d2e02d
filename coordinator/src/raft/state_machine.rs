//! The replicated state (runs' event logs, schedules) and its snapshots in SQLite.

use std::collections::BTreeMap;
use std::io::Cursor;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use sqlx::Row;

use super::types::{Command, NodeId, Replica, Response, Schedule, StateImage, TypeConfig};
use super::{Db, RaftStoreError, StorageResult, from_sql_int, io_err, read_meta, to_sql_int, write_meta};

const LAST_APPLIED: &str = "last_applied";
const LAST_MEMBERSHIP: &str = "last_membership";
const SNAPSHOT_SEQ: &str = "snapshot_seq";

type Membership = StoredMembership<NodeId, Replica>;
type Meta = SnapshotMeta<NodeId, Replica>;

/// The state machine. Each applied batch is one transaction: the commands' effects and
/// the last applied log id commit together, so the state is never ahead of or behind what
/// it says it applied.
#[derive(Debug)]
pub struct SqliteStateMachine {
    db: Db,
}

/// Builds snapshots from a consistent read of the state machine.
#[derive(Debug)]
pub struct SqliteSnapshotBuilder {
    db: Db,
}

/// Read access to the applied state for the rest of the coordinator; cheap to clone. It
/// sees what this replica has applied, which on a follower may lag the leader.
#[derive(Debug, Clone)]
pub struct StateReader {
    db: Db,
}

impl SqliteStateMachine {
    pub(crate) fn new(db: Db) -> SqliteStateMachine {
        SqliteStateMachine { db }
    }

    pub fn reader(&self) -> StateReader {
        StateReader { db: self.db.clone() }
    }

    async fn applied(&self) -> Result<(Option<LogId<NodeId>>, Membership), RaftStoreError> {
        let mut conn = self.db.read.acquire().await?;
        let last_applied = read_meta(&mut *conn, LAST_APPLIED).await?.flatten();
        let membership = read_meta(&mut *conn, LAST_MEMBERSHIP).await?.unwrap_or_default();
        Ok((last_applied, membership))
    }

    async fn apply_entries(&self, entries: Vec<Entry<TypeConfig>>) -> Result<Vec<Response>, RaftStoreError> {
        let Some(last) = entries.last().map(|e| e.log_id) else {
            return Ok(Vec::new());
        };
        let mut tx = self.db.write.begin().await?;
        let mut responses = Vec::with_capacity(entries.len());
        let mut membership = None;
        for entry in entries {
            let response = match entry.payload {
                EntryPayload::Blank => Response::None,
                EntryPayload::Normal(command) => apply_command(&mut tx, command).await?,
                EntryPayload::Membership(m) => {
                    membership = Some(Membership::new(Some(entry.log_id), m));
                    Response::None
                }
            };
            responses.push(response);
        }
        write_meta(&mut *tx, LAST_APPLIED, &Some(last)).await?;
        if let Some(membership) = membership {
            write_meta(&mut *tx, LAST_MEMBERSHIP, &membership).await?;
        }
        tx.commit().await?;
        Ok(responses)
    }

    async fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, RaftStoreError> {
        let row = sqlx::query("SELECT meta, data FROM sm_snapshot WHERE id = 1")
            .fetch_optional(&self.db.read)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let meta: Meta = serde_json::from_str(row.try_get::<&str, _>(0)?)?;
        let data: Vec<u8> = row.try_get(1)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }

    async fn install(&self, meta: &Meta, data: Vec<u8>) -> Result<(), RaftStoreError> {
        // Parse before touching anything: a bad snapshot leaves the state as it was.
        let image: StateImage = serde_json::from_slice(&data)?;
        let mut tx = self.db.write.begin().await?;
        sqlx::query("DELETE FROM sm_run_event").execute(&mut *tx).await?;
        sqlx::query("DELETE FROM sm_schedule").execute(&mut *tx).await?;
        for (run_id, events) in &image.runs {
            for (seq, event) in events.iter().enumerate() {
                insert_event(&mut tx, run_id, seq as u64, event).await?;
            }
        }
        for (name, schedule) in &image.schedules {
            put_schedule(&mut tx, name, schedule).await?;
        }
        write_meta(&mut *tx, LAST_APPLIED, &meta.last_log_id).await?;
        write_meta(&mut *tx, LAST_MEMBERSHIP, &meta.last_membership).await?;
        store_snapshot(&mut tx, meta, &data).await?;
        tx.commit().await?;
        Ok(())
    }
}

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

/// Applies one command. The outcome depends only on the state and the command, never on
/// the clock or the replica, so every replica answers alike.
async fn apply_command(tx: &mut Tx, command: Command) -> Result<Response, RaftStoreError> {
    match command {
        Command::AppendRunEvent { run_id, seq, event } => {
            let expected = next_seq(tx, &run_id).await?;
            if seq != expected {
                return Ok(Response::SeqConflict { expected });
            }
            insert_event(tx, &run_id, seq, &event).await?;
            Ok(Response::EventAppended { seq })
        }
        Command::PutSchedule { name, schedule } => {
            put_schedule(tx, &name, &schedule).await?;
            Ok(Response::SchedulePut)
        }
        Command::DeleteSchedule { name } => {
            let done = sqlx::query("DELETE FROM sm_schedule WHERE name = ?")
                .bind(&name)
                .execute(&mut **tx)
                .await?;
            Ok(Response::ScheduleDeleted {
                existed: done.rows_affected() > 0,
            })
        }
    }
}

async fn next_seq(tx: &mut Tx, run_id: &str) -> Result<u64, RaftStoreError> {
    let next: i64 = sqlx::query("SELECT COALESCE(MAX(seq) + 1, 0) FROM sm_run_event WHERE run_id = ?")
        .bind(run_id)
        .fetch_one(&mut **tx)
        .await?
        .try_get(0)?;
    from_sql_int(next)
}

async fn insert_event(
    tx: &mut Tx,
    run_id: &str,
    seq: u64,
    event: &serde_json::Value,
) -> Result<(), RaftStoreError> {
    sqlx::query("INSERT INTO sm_run_event (run_id, seq, event) VALUES (?, ?, ?)")
        .bind(run_id)
        .bind(to_sql_int(seq)?)
        .bind(serde_json::to_string(event)?)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn put_schedule(tx: &mut Tx, name: &str, schedule: &Schedule) -> Result<(), RaftStoreError> {
    sqlx::query(
        "INSERT INTO sm_schedule (name, schedule) VALUES (?, ?) \
         ON CONFLICT (name) DO UPDATE SET schedule = excluded.schedule",
    )
    .bind(name)
    .bind(serde_json::to_string(schedule)?)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn store_snapshot(tx: &mut Tx, meta: &Meta, data: &[u8]) -> Result<(), RaftStoreError> {
    sqlx::query(
        "INSERT INTO sm_snapshot (id, meta, data) VALUES (1, ?, ?) \
         ON CONFLICT (id) DO UPDATE SET meta = excluded.meta, data = excluded.data",
    )
    .bind(serde_json::to_string(meta)?)
    .bind(data)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl StateReader {
    /// A run's events in sequence order (empty for an unknown run).
    pub async fn run_events(&self, run_id: &str) -> Result<Vec<serde_json::Value>, RaftStoreError> {
        let rows = sqlx::query("SELECT event FROM sm_run_event WHERE run_id = ? ORDER BY seq")
            .bind(run_id)
            .fetch_all(&self.db.read)
            .await?;
        rows.iter()
            .map(|row| Ok(serde_json::from_str(row.try_get::<&str, _>(0)?)?))
            .collect()
    }

    /// A run's event count and last event (`None` for a run with no events): what an
    /// append needs, read without the run's other events.
    pub async fn run_tail(&self, run_id: &str) -> Result<Option<(u64, serde_json::Value)>, RaftStoreError> {
        let row =
            sqlx::query("SELECT seq, event FROM sm_run_event WHERE run_id = ? ORDER BY seq DESC LIMIT 1")
                .bind(run_id)
                .fetch_optional(&self.db.read)
                .await?;
        row.map(|row| {
            let last: i64 = row.try_get(0)?;
            Ok((
                from_sql_int(last)? + 1,
                serde_json::from_str(row.try_get::<&str, _>(1)?)?,
            ))
        })
        .transpose()
    }

    /// Every run's id, event count and last event, by run id (run ids start with the
    /// hex milliseconds of their start, so this is start order).
    pub async fn run_heads(&self) -> Result<Vec<(String, u64, serde_json::Value)>, RaftStoreError> {
        // SQLite takes the bare column `event` from the row that holds MAX(seq)
        let rows =
            sqlx::query("SELECT run_id, MAX(seq), event FROM sm_run_event GROUP BY run_id ORDER BY run_id")
                .fetch_all(&self.db.read)
                .await?;
        rows.iter()
            .map(|row| {
                let run_id: String = row.try_get(0)?;
                let last: i64 = row.try_get(1)?;
                let event = serde_json::from_str(row.try_get::<&str, _>(2)?)?;
                Ok((run_id, from_sql_int(last)? + 1, event))
            })
            .collect()
    }

    pub async fn schedules(&self) -> Result<BTreeMap<String, Schedule>, RaftStoreError> {
        let rows = sqlx::query("SELECT name, schedule FROM sm_schedule ORDER BY name")
            .fetch_all(&self.db.read)
            .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get(0)?;
                let schedule = serde_json::from_str(row.try_get::<&str, _>(1)?)?;
                Ok((name, schedule))
            })
            .collect()
    }
}

impl SqliteSnapshotBuilder {
    async fn build(&self) -> Result<Snapshot<TypeConfig>, RaftStoreError> {
        // One read transaction: the image and the log id it stands for are the same moment.
        let mut tx = self.db.read.begin().await?;
        let last_applied: Option<LogId<NodeId>> = read_meta(&mut *tx, LAST_APPLIED).await?.flatten();
        let last_membership: Membership = read_meta(&mut *tx, LAST_MEMBERSHIP).await?.unwrap_or_default();
        let mut image = StateImage::default();
        let rows = sqlx::query("SELECT run_id, event FROM sm_run_event ORDER BY run_id, seq")
            .fetch_all(&mut *tx)
            .await?;
        for row in &rows {
            let run_id: String = row.try_get(0)?;
            let event = serde_json::from_str(row.try_get::<&str, _>(1)?)?;
            image.runs.entry(run_id).or_default().push(event);
        }
        let rows = sqlx::query("SELECT name, schedule FROM sm_schedule")
            .fetch_all(&mut *tx)
            .await?;
        for row in &rows {
            let name: String = row.try_get(0)?;
            image
                .schedules
                .insert(name, serde_json::from_str(row.try_get::<&str, _>(1)?)?);
        }
        tx.commit().await?;
        let data = serde_json::to_vec(&image)?;

        let mut tx = self.db.write.begin().await?;
        let seq: u64 = read_meta(&mut *tx, SNAPSHOT_SEQ).await?.unwrap_or(0) + 1;
        write_meta(&mut *tx, SNAPSHOT_SEQ, &seq).await?;
        let snapshot_id = match &last_applied {
            Some(id) => format!("{}-{}-{seq}", id.leader_id, id.index),
            None => format!("none-{seq}"),
        };
        let meta = Meta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        // openraft builds in a task of its own, so a snapshot installed from the leader
        // meanwhile may be newer than this one: never replace it with an older state.
        let row = sqlx::query("SELECT meta FROM sm_snapshot WHERE id = 1")
            .fetch_optional(&mut *tx)
            .await?;
        let current: Option<Meta> = match row {
            Some(row) => Some(serde_json::from_str(row.try_get::<&str, _>(0)?)?),
            None => None,
        };
        if current.is_none_or(|c| c.last_log_id <= meta.last_log_id) {
            store_snapshot(&mut tx, &meta, &data).await?;
        }
        tx.commit().await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SqliteSnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        self.build()
            .await
            .map_err(io_err(|e| StorageIOError::write_snapshot(None, e)))
    }
}

impl RaftStateMachine<TypeConfig> for SqliteStateMachine {
    type SnapshotBuilder = SqliteSnapshotBuilder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<NodeId>>, Membership)> {
        self.applied()
            .await
            .map_err(io_err(StorageIOError::read_state_machine))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        self.apply_entries(entries.into_iter().collect())
            .await
            .map_err(io_err(StorageIOError::write_state_machine))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SqliteSnapshotBuilder { db: self.db.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<Cursor<Vec<u8>>>) -> StorageResult<()> {
        let signature = meta.signature();
        self.install(meta, snapshot.into_inner())
            .await
            .map_err(io_err(move |e| {
                StorageIOError::write_snapshot(Some(signature), e)
            }))
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        self.current_snapshot()
            .await
            .map_err(io_err(|e| StorageIOError::read_snapshot(None, e)))
    }
}
