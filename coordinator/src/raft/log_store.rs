//! The Raft log, the vote and the committed log id in SQLite.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, StorageIOError, Vote};
use sqlx::Row;

use super::{
    Db, NodeId, RaftStoreError, StorageResult, TypeConfig, io_err, read_meta, to_sql_int, write_meta,
};

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

/// The log store; cheap to clone (clones share the database). A clone is also the log
/// reader that replication tasks use.
#[derive(Debug, Clone)]
pub struct SqliteLogStore {
    db: Db,
}

impl SqliteLogStore {
    pub(crate) fn new(db: Db) -> SqliteLogStore {
        SqliteLogStore { db }
    }

    async fn entries(&self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, RaftStoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        // Indexes above i64::MAX cannot be stored, so a bound beyond it means "to the end".
        let start = to_sql_int(start)?;
        let end = to_sql_int(end.min(i64::MAX as u64))?;
        let rows = sqlx::query("SELECT entry FROM raft_log WHERE idx >= ? AND idx < ? ORDER BY idx")
            .bind(start)
            .bind(end)
            .fetch_all(&self.db.read)
            .await?;
        rows.iter()
            .map(|row| Ok(serde_json::from_str(row.try_get::<&str, _>(0)?)?))
            .collect()
    }

    async fn log_state(&self) -> Result<LogState<TypeConfig>, RaftStoreError> {
        let mut conn = self.db.read.acquire().await?;
        let last_purged: Option<LogId<NodeId>> = read_meta(&mut *conn, LAST_PURGED).await?.flatten();
        let last = sqlx::query("SELECT entry FROM raft_log ORDER BY idx DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
        let last_log_id = match last {
            Some(row) => {
                let entry: Entry<TypeConfig> = serde_json::from_str(row.try_get::<&str, _>(0)?)?;
                Some(entry.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id,
        })
    }

    async fn write_entries(&self, entries: Vec<Entry<TypeConfig>>) -> Result<(), RaftStoreError> {
        let rows = entries
            .iter()
            .map(|e| {
                Ok((
                    to_sql_int(e.log_id.index)?,
                    to_sql_int(e.log_id.leader_id.term)?,
                    serde_json::to_string(e)?,
                ))
            })
            .collect::<Result<Vec<_>, RaftStoreError>>()?;
        let mut tx = self.db.write.begin().await?;
        for (idx, term, entry) in rows {
            // Replacing is safe: openraft truncates a conflicting suffix before it appends.
            sqlx::query("INSERT OR REPLACE INTO raft_log (idx, term, entry) VALUES (?, ?, ?)")
                .bind(idx)
                .bind(term)
                .bind(entry)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn delete_since(&self, index: u64) -> Result<(), RaftStoreError> {
        sqlx::query("DELETE FROM raft_log WHERE idx >= ?")
            .bind(to_sql_int(index)?)
            .execute(&self.db.write)
            .await?;
        Ok(())
    }

    async fn purge_upto(&self, log_id: &LogId<NodeId>) -> Result<(), RaftStoreError> {
        let mut tx = self.db.write.begin().await?;
        // The purged id goes first in the same transaction, so the log state never shows a
        // hole: either the entries are there or the purged id covers them.
        write_meta(&mut *tx, LAST_PURGED, &Some(log_id)).await?;
        sqlx::query("DELETE FROM raft_log WHERE idx <= ?")
            .bind(to_sql_int(log_id.index)?)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

fn index_bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for SqliteLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = index_bounds(&range);
        self.entries(start, end)
            .await
            .map_err(io_err(StorageIOError::read_logs))
    }
}

impl RaftLogStorage<TypeConfig> for SqliteLogStore {
    type LogReader = SqliteLogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        self.log_state().await.map_err(io_err(StorageIOError::read_logs))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        write_meta(&self.db.write, VOTE, vote)
            .await
            .map_err(io_err(StorageIOError::write_vote))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        read_meta(&self.db.read, VOTE)
            .await
            .map_err(io_err(StorageIOError::read_vote))
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        write_meta(&self.db.write, COMMITTED, &committed)
            .await
            .map_err(io_err(StorageIOError::write))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let committed: Option<Option<LogId<NodeId>>> = read_meta(&self.db.read, COMMITTED)
            .await
            .map_err(io_err(StorageIOError::read))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        // The transaction commits with synchronous=FULL, so once it returns the entries
        // are on disk: only then is openraft told they are flushed.
        match self.write_entries(entries.into_iter().collect()).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(io_err(StorageIOError::write_logs)(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.delete_since(log_id.index)
            .await
            .map_err(io_err(StorageIOError::write_logs))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.purge_upto(&log_id)
            .await
            .map_err(io_err(StorageIOError::write_logs))
    }
}

#[cfg(test)]
mod tests {
    use super::index_bounds;

    #[test]
    fn bounds_of_every_range_form() {
        assert_eq!(index_bounds(&(2..5)), (2, 5));
        assert_eq!(index_bounds(&(2..=5)), (2, 6));
        assert_eq!(index_bounds(&(..5)), (0, 5));
        assert_eq!(index_bounds(&(3..)), (3, u64::MAX));
        assert_eq!(index_bounds(&(..)), (0, u64::MAX));
        assert_eq!(index_bounds(&(0..=u64::MAX)), (0, u64::MAX));
    }
}
