//! Watermarks (DESIGN §5): how a dataset's replication position is read, per dataset
//! in the agent's config, and the agent's side of `window: {watermark: wait}`: read
//! this side's position (a source), or wait until this side has applied a given
//! position (a target). The coordinator never sends SQL: it names the dataset and
//! passes a position it got from the other agent, which is parsed and compared here,
//! never spliced into SQL.
//!
//! Reads run outside any request snapshot, on a connection of their own: a position is
//! "now", and a poll inside one REPEATABLE READ transaction would see the same value
//! forever.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use tally_common::config_file::ConfigError;
use tally_common::position::{Position, PositionKind};

use crate::dataset::Dataset;
use crate::error::{AgentError, Result};

/// The longest one `WaitPosition` call waits, whatever the request asks.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The engines' own ways to read a position.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Builtin {
    /// PostgreSQL primary: `pg_current_wal_insert_lsn()`, the end of every WAL record
    /// written so far (past every commit a reader can see; `pg_current_wal_lsn()`, the
    /// write position, can trail a visible commit under `synchronous_commit = off`).
    PgWalLsn,
    /// PostgreSQL physical standby: `pg_last_wal_replay_lsn()`.
    PgReplayLsn,
    /// PostgreSQL logical subscriber: how far subscription `subscription` has applied
    /// its publisher's WAL (the replication origin's progress, or the publisher's end of
    /// WAL its main apply worker last handled in a keepalive, whichever is further;
    /// 0/0 while a table is still in its initial copy).
    PgSubscription,
    /// MariaDB primary: `@@gtid_binlog_pos`.
    GtidBinlogPos,
    /// MariaDB replica: `@@gtid_slave_pos`, what its SQL thread has applied.
    GtidSlavePos,
}

impl Builtin {
    pub fn name(self) -> &'static str {
        match self {
            Builtin::PgWalLsn => "pg_wal_lsn",
            Builtin::PgReplayLsn => "pg_replay_lsn",
            Builtin::PgSubscription => "pg_subscription",
            Builtin::GtidBinlogPos => "gtid_binlog_pos",
            Builtin::GtidSlavePos => "gtid_slave_pos",
        }
    }

    pub fn kind(self) -> PositionKind {
        match self {
            Builtin::PgWalLsn | Builtin::PgReplayLsn | Builtin::PgSubscription => PositionKind::Lsn,
            Builtin::GtidBinlogPos | Builtin::GtidSlavePos => PositionKind::Gtid,
        }
    }

    /// Whether it reads what the server applied from its source (a target's
    /// position), rather than what the server itself wrote (a source's).
    pub fn reads_applied(self) -> bool {
        matches!(
            self,
            Builtin::PgReplayLsn | Builtin::PgSubscription | Builtin::GtidSlavePos
        )
    }

    fn engine(self) -> &'static str {
        match self.kind() {
            PositionKind::Lsn => "PostgreSQL",
            _ => "MariaDB",
        }
    }
}

/// `datasets.NAME.watermark`: a built-in, or the zone's own query over the pipeline's
/// offset or heartbeat table with the kind of position it returns.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WatermarkConfig {
    #[serde(default)]
    pub builtin: Option<Builtin>,
    /// `builtin: pg_subscription`: the subscription's name.
    #[serde(default)]
    pub subscription: Option<String>,
    /// A query returning one row with one value: the position.
    #[serde(default)]
    pub query: Option<String>,
    /// `query` only: `integer`, `lsn` or `gtid`.
    #[serde(default)]
    pub kind: Option<PositionKind>,
    /// How often `WaitPosition` reads the position again, in milliseconds.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
}

fn default_poll_ms() -> u64 {
    200
}

/// What a dialect renders: the validated form of [`WatermarkConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatermarkRead {
    Builtin(Builtin),
    Subscription(String),
    Query(String),
}

impl WatermarkConfig {
    pub fn validate(&self, file: &Path, at: &str) -> std::result::Result<(), ConfigError> {
        let bad = |k: &str, m: String| Err(ConfigError::invalid(file, format!("{at}.{k}"), m));
        match (&self.builtin, &self.query) {
            (Some(_), Some(_)) => return bad("query", "give builtin or query, not both".into()),
            (None, None) => {
                return Err(ConfigError::invalid(
                    file,
                    at,
                    "give builtin (pg_wal_lsn, pg_replay_lsn, pg_subscription, gtid_binlog_pos, gtid_slave_pos) \
                     or query with kind",
                ));
            }
            (Some(b), None) => {
                if self.kind.is_some_and(|k| k != b.kind()) {
                    return bad(
                        "kind",
                        format!("builtin {} reads a {} position", b.name(), b.kind()),
                    );
                }
                match (b, &self.subscription) {
                    (Builtin::PgSubscription, None) => {
                        return bad(
                            "subscription",
                            "missing: name the subscription whose progress to read".into(),
                        );
                    }
                    (Builtin::PgSubscription, Some(s)) if s.trim().is_empty() => {
                        return bad("subscription", "empty subscription name".into());
                    }
                    (Builtin::PgSubscription, Some(_)) => {}
                    (_, Some(_)) => {
                        return bad(
                            "subscription",
                            "only builtin pg_subscription takes a subscription".into(),
                        );
                    }
                    (_, None) => {}
                }
            }
            (None, Some(q)) => {
                if q.trim().is_empty() {
                    return bad("query", "empty query".into());
                }
                if q.trim().trim_end_matches(';').contains(';') {
                    return bad("query", "one SELECT statement, no ';' inside".into());
                }
                if self.kind.is_none() {
                    return bad(
                        "kind",
                        "missing: integer, lsn or gtid (what the query returns)".into(),
                    );
                }
                if self.subscription.is_some() {
                    return bad(
                        "subscription",
                        "only builtin pg_subscription takes a subscription".into(),
                    );
                }
            }
        }
        if !(50..=60_000).contains(&self.poll_ms) {
            return bad("poll_ms", "between 50 and 60000".into());
        }
        Ok(())
    }

    pub fn kind(&self) -> PositionKind {
        match self.builtin {
            Some(b) => b.kind(),
            None => self.kind.expect("validated: a query has a kind"),
        }
    }

    pub fn read(&self) -> WatermarkRead {
        match (&self.builtin, &self.query) {
            (Some(Builtin::PgSubscription), _) => {
                WatermarkRead::Subscription(self.subscription.clone().expect("validated"))
            }
            (Some(b), _) => WatermarkRead::Builtin(*b),
            (None, Some(q)) => WatermarkRead::Query(q.trim().trim_end_matches(';').to_string()),
            (None, None) => unreachable!("validated: builtin or query"),
        }
    }

    /// What reads the position, for messages.
    pub fn describe(&self) -> String {
        match self.builtin {
            Some(b) => format!("builtin {}", b.name()),
            None => "the configured query".to_string(),
        }
    }

    /// Whether the dataset's engine (its dialect `engine`) can run this read: a
    /// built-in is one engine's.
    pub fn check_engine(&self, dataset: &str, engine: &str) -> Result<()> {
        if let Some(b) = self.builtin {
            let ok = match b.kind() {
                PositionKind::Lsn => engine == "postgres",
                _ => engine == "mysql",
            };
            if !ok {
                return Err(AgentError::Config(format!(
                    "datasets.{dataset}.watermark.builtin: {} reads a {} position; this dataset's database is {engine}",
                    b.name(),
                    b.engine()
                )));
            }
        }
        Ok(())
    }
}

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
