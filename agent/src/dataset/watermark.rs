//! The agent's side of `window: {watermark: wait}` (DESIGN §5): read this side's
//! position (a source), or wait until this side has applied a given position (a
//! target), as its dataset's `watermark` ([`crate::watermark`]) says. The coordinator
//! never sends SQL: it names the dataset and passes a position it got from the other
//! agent, which is parsed and compared here, never spliced into SQL.
//!
//! Reads run outside any request snapshot, on a connection of their own: a position is
//! "now", and a poll inside one REPEATABLE READ transaction would see the same value
//! forever.

use std::time::Duration;

use tally_common::position::Position;

use super::Dataset;
use crate::error::{AgentError, Result};
use crate::watermark::{Builtin, WatermarkRead};

/// The longest one `WaitPosition` call waits, whatever the request asks.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

fn refused(ds: &Dataset, message: String) -> AgentError {
    AgentError::Watermark {
        dataset: ds.name.clone(),
        message,
    }
}

/// One read of a position may take this long (a lock, a stuck server) before the call
/// fails; a wait's deadline is checked between reads.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The dataset's replication position now: one statement in a read-only transaction
/// of its own (a new one per read, so a poll sees the position move).
pub async fn read(ds: &Dataset) -> Result<Position> {
    let w = ds.config.watermark.as_ref().ok_or_else(|| {
        refused(
            ds,
            "no watermark is configured for it in the agent's config (datasets.NAME.watermark)".into(),
        )
    })?;
    let read = w.read();
    let sql = ds
        .connector
        .dialect()
        .watermark_sql(&read)
        .ok_or_else(|| refused(ds, format!("{} is not available on its engine", w.describe())))?;
    let text = tokio::time::timeout(READ_TIMEOUT, async {
        let mut s = ds.session().await?;
        let text = s.query_text(&sql).await?;
        s.finish().await?;
        Ok(text)
    })
    .await
    .map_err(|_| {
        refused(
            ds,
            format!(
                "reading the position with {} took longer than {} s",
                w.describe(),
                READ_TIMEOUT.as_secs()
            ),
        )
    })?
    .map_err(|e| match e {
        AgentError::Query { kind, .. } => refused(
            ds,
            format!(
                "reading the position with {} failed ({kind}; the agent's log has the database's message: \
                 a missing privilege, or a server that is not what the builtin expects)",
                w.describe()
            ),
        ),
        other => other,
    })?;
    let Some(text) = text else {
        return Err(refused(
            ds,
            match &read {
                WatermarkRead::Builtin(Builtin::PgReplayLsn) => {
                    "pg_last_wal_replay_lsn() is NULL: the server has never been a standby".into()
                }
                WatermarkRead::Builtin(Builtin::GtidBinlogPos) => {
                    "the binary log is off (log_bin): the server writes no GTID position".into()
                }
                WatermarkRead::Subscription(s) => format!("no subscription {s:?} in the dataset's database"),
                _ => format!("{} returned no position (NULL or no row)", w.describe()),
            },
        ));
    };
    Position::parse(w.kind(), &text).map_err(|m| {
        // the value may be anything the zone's query returns: it stays in the zone
        tracing::warn!(dataset = %ds.name, reason = %m, "watermark value is not a position");
        refused(
            ds,
            format!(
                "{} returned a value that is not a {} position (the agent's log says why)",
                w.describe(),
                w.kind()
            ),
        )
    })
}

/// The position a source reports for a target to wait for: [`read`], refused when it
/// is empty (a GTID position of a server that has logged no transaction could not be
/// told from one that does not log the tables' changes, and any target "reaches" it).
pub async fn read_source(ds: &Dataset) -> Result<Position> {
    let p = read(ds).await?;
    if p.value.is_empty() {
        return Err(refused(
            ds,
            "its GTID position is empty: the server has logged no transaction with a GTID (is it the \
             primary the target replicates from, with log_bin on?)"
                .into(),
        ));
    }
    Ok(p)
}

/// Waits until the dataset's position reaches `wanted` or `timeout` (at most
/// [`MAX_WAIT`]) passes; the position last read, and whether it reached `wanted`.
/// Refused for a builtin that reads a primary's own position: a server's WAL or binary
/// log position says nothing about what it applied from another.
pub async fn wait(ds: &Dataset, wanted: &Position, timeout: Duration) -> Result<(Position, bool)> {
    let w = ds.config.watermark.as_ref().ok_or_else(|| {
        refused(
            ds,
            "no watermark is configured for it in the agent's config (datasets.NAME.watermark)".into(),
        )
    })?;
    if let Some(b) = w.builtin
        && !b.reads_applied()
    {
        return Err(refused(
            ds,
            format!(
                "builtin {} reads this server's own write position; a target waits with one that reads what it \
                 applied (pg_replay_lsn, pg_subscription, gtid_slave_pos) or with a query",
                b.name()
            ),
        ));
    }
    if w.kind() != wanted.kind {
        return Err(AgentError::InvalidArgument(format!(
            "dataset {} reads {} positions; a {} position cannot be waited for",
            ds.name,
            w.kind(),
            wanted.kind
        )));
    }
    if wanted.value.is_empty() {
        return Err(AgentError::InvalidArgument(
            "an empty position cannot be waited for: every server has reached it".into(),
        ));
    }
    let poll = Duration::from_millis(w.poll_ms);
    let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
    loop {
        let have = read(ds).await?;
        let reached = have.reached(wanted).map_err(AgentError::InvalidArgument)?;
        let now = tokio::time::Instant::now();
        if reached || now >= deadline {
            return Ok((have, reached));
        }
        tokio::time::sleep(poll.min(deadline - now)).await;
    }
}
