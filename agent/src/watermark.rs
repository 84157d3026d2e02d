//! Watermarks (DESIGN §5), declared: how a dataset's replication position is read, per
//! dataset in the agent's config (`datasets.NAME.watermark`), validated here and
//! rendered by each dialect. Reading and waiting for a position through a dataset is
//! [`crate::dataset::watermark`].

use std::path::Path;

use serde::Deserialize;
use tally_common::config_file::ConfigError;
use tally_common::position::PositionKind;

use crate::error::{AgentError, Result};

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
