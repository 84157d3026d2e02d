//! DuckDB through the duckdb crate (behind the `duckdb` cargo feature). The driver is
//! blocking: every call runs on `spawn_blocking` with its session's cloned connection, and
//! row streams cross back to the async side through a bounded channel ([`super::blocking`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use duckdb::types::{TimeUnit, ValueRef};
use duckdb::{AccessMode, Config, Connection};
use tally_common::civil;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::{AggRow, EngineConn, EngineConnector, RowSink, agg_row, blocking};
use crate::config::Source;
use crate::dialect::{Dialect, FetchShape, Sql, duckdb::DuckDb, relation};
use crate::error::{AgentError, Result};
use crate::files::{S3Url, s3_of_url};
use crate::schema::{BoundColumn, DatasetInfo};

#[derive(Clone)]
pub struct DuckDbConnector {
    /// `None`: an in-memory database (datasets are queries over files).
    path: Option<PathBuf>,
    /// S3-compatible storage the queries read (`?s3=1&…` in the URL, file datasets).
    s3: Option<S3Url>,
    conn: Arc<Mutex<Option<Connection>>>,
    pub dialect: DuckDb,
}

fn db_err(dataset: &str, e: duckdb::Error) -> AgentError {
    tracing::warn!(dataset, error = %e, "duckdb call failed");
    AgentError::Query {
        dataset: dataset.to_string(),
        kind: "duckdb error",
    }
}

fn text(v: ValueRef<'_>) -> Option<String> {
    match v {
        ValueRef::Null => None,
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
        ValueRef::Boolean(b) => Some(if b { "1" } else { "0" }.into()),
        ValueRef::TinyInt(i) => Some(i.to_string()),
        ValueRef::SmallInt(i) => Some(i.to_string()),
        ValueRef::Int(i) => Some(i.to_string()),
        ValueRef::BigInt(i) => Some(i.to_string()),
        ValueRef::HugeInt(i) => Some(i.to_string()),
        ValueRef::UHugeInt(i) => Some(i.to_string()),
        ValueRef::UTinyInt(i) => Some(i.to_string()),
        ValueRef::USmallInt(i) => Some(i.to_string()),
        ValueRef::UInt(i) => Some(i.to_string()),
        ValueRef::UBigInt(i) => Some(i.to_string()),
        ValueRef::Timestamp(unit, t) => Some(timestamp_text(unit, t)),
        other => Some(format!("{other:?}")),
    }
}

/// A scanned field's text: a timestamp read in a dataset's zone (a zoned `TIMESTAMP`'s
/// stored count, `Dialect::text_expr`) is its local reading followed by the zone's
/// offset, which the reference converts to UTC for every year.
fn field(v: ValueRef<'_>, zone: Option<&str>) -> Option<String> {
    let mut s = text(v)?;
    if let (ValueRef::Timestamp(_, t), Some(z)) = (v, zone)
        && infinity(t).is_none()
    {
        s.push_str(z);
    }
    Some(s)
}

/// DuckDB's infinite timestamps, in every unit: `i64::MAX` and `-i64::MAX`.
fn infinity(t: i64) -> Option<&'static str> {
    match t {
        i64::MAX => Some("infinity"),
        t if t == -i64::MAX => Some("-infinity"),
        _ => None,
    }
}

/// `YYYY-MM-DD HH:MM:SS[.f]` of a DuckDB timestamp, a count of `unit`s since 1970-01-01
/// on the proleptic Gregorian calendar: a year outside 0001-9999 in ISO 8601 expanded
/// form (DuckDB's own text writes `0044-03-15 (BC)`), the fraction in the unit's digits
/// (nanoseconds too: a cast to `TIMESTAMP` would drop them); `infinity`, `-infinity`.
fn timestamp_text(unit: TimeUnit, t: i64) -> String {
    if let Some(token) = infinity(t) {
        return token.to_string();
    }
    let (per_second, digits) = match unit {
        TimeUnit::Second => (1, 0),
        TimeUnit::Millisecond => (1_000, 3),
        TimeUnit::Microsecond => (1_000_000, 6),
        TimeUnit::Nanosecond => (1_000_000_000, 9),
    };
    let (secs, frac) = (t.div_euclid(per_second), t.rem_euclid(per_second));
    let (day, clock) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil::civil_from_days(day);
    let mut out = String::with_capacity(32);
    civil::push_year(&mut out, y);
    let _ = write!(
        out,
        "-{m:02}-{d:02} {:02}:{:02}:{:02}",
        clock / 3600,
        clock / 60 % 60,
        clock % 60
    );
    if digits > 0 {
        let _ = write!(out, ".{frac:0digits$}");
    }
    out
}

fn params(binds: &[KeyPart]) -> Vec<Box<dyn duckdb::ToSql>> {
    binds
        .iter()
        .map(|b| -> Box<dyn duckdb::ToSql> {
            match b {
                KeyPart::Int(i) => Box::new(*i),
                KeyPart::Text(s) => Box::new(s.clone()),
            }
        })
        .collect()
}

/// A SQL string literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Loads DuckDB's httpfs extension (from `TALLY_DUCKDB_EXTENSIONS` when set: a
/// directory laid out as DuckDB's own, `v1.5.5/linux_amd64/httpfs.duckdb_extension`)
/// and makes the storage's secret from the agent's environment. The secret lives in
/// this process's memory only (a temporary secret), and no credential is logged.
fn with_s3(c: &Connection, s3: &S3Url, dataset: &str) -> Result<()> {
    let unavailable = |kind: &'static str| AgentError::DatabaseUnavailable {
        dataset: dataset.into(),
        kind,
    };
    if let Ok(dir) = std::env::var("TALLY_DUCKDB_EXTENSIONS") {
        c.execute_batch(&format!("SET extension_directory = {}", lit(&dir)))
            .map_err(|e| db_err(dataset, e))?;
    }
    c.execute_batch("LOAD httpfs").map_err(|e| {
        tracing::error!(
            dataset,
            error = %e,
            "s3:// files need DuckDB's httpfs extension: with internet access DuckDB installs it (INSTALL httpfs); offline, set TALLY_DUCKDB_EXTENSIONS to a directory holding it (docs/engines.md)"
        );
        unavailable("httpfs extension not available")
    })?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut opts = vec![
        "TYPE s3".to_string(),
        format!("REGION {}", lit(&s3.region)),
        format!("USE_SSL {}", s3.use_ssl),
    ];
    if let Some(e) = &s3.endpoint {
        opts.push(format!("ENDPOINT {}", lit(e)));
    }
    if let Some(u) = &s3.url_style {
        opts.push(format!("URL_STYLE {}", lit(u)));
    }
    let mut hidden = Vec::new();
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => {
            opts.push(format!("KEY_ID {}", lit(&id)));
            opts.push(format!("SECRET {}", lit(&secret)));
            hidden.push(secret);
            if let Some(t) = env("AWS_SESSION_TOKEN") {
                opts.push(format!("SESSION_TOKEN {}", lit(&t)));
                hidden.push(t);
            }
        }
        (None, None) => tracing::info!(
            dataset,
            "s3: no AWS_ACCESS_KEY_ID in the environment: reading anonymously"
        ),
        _ => {
            tracing::error!(
                dataset,
                "s3: set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither"
            );
            return Err(unavailable(
                "incomplete S3 credentials in the agent's environment",
            ));
        }
    }
    c.execute_batch(&format!(
        "CREATE OR REPLACE TEMPORARY SECRET tally_s3 ({})",
        opts.join(", ")
    ))
    .map_err(|e| {
        // the log never holds the secret, should DuckDB's message quote it
        let error = hidden
            .iter()
            .fold(e.to_string(), |t, h| t.replace(h.as_str(), "***"));
        tracing::error!(dataset, %error, "s3: cannot create the storage secret");
        unavailable("cannot configure S3 access")
    })
}

impl DuckDbConnector {
    /// `duckdb:///path/file.duckdb` opens a file read-only; `duckdb://` or
    /// `duckdb::memory:` an in-memory database for queries over CSV/Parquet files.
    /// Storage settings follow `?` (`s3=1&s3_endpoint=…`, see [`crate::files`]).
    pub fn open(url: &str) -> Result<DuckDbConnector> {
        let s3 = s3_of_url(url).map_err(AgentError::Config)?;
        let base = url.split_once('?').map_or(url, |(b, _)| b);
        let rest = base.trim_start_matches("duckdb:").trim_start_matches("//");
        let path = match rest {
            "" | ":memory:" => None,
            p => Some(PathBuf::from(p)),
        };
        Ok(DuckDbConnector {
            path,
            s3,
            conn: Arc::new(Mutex::new(None)),
            dialect: DuckDb,
        })
    }

    /// Opens the database once (see [`super::Connector::ping`]). DuckDB's own error text
    /// is in the agent's log (`db_err`); a missing file is named here.
    pub async fn ping(&self) -> std::result::Result<(), String> {
        if let Some(p) = self.path.as_ref().filter(|p| !p.exists()) {
            return Err(format!("{}: no such file", p.display()));
        }
        self.connection("check").map(drop).map_err(|e| e.to_string())
    }

    /// A connection of its own for one call (opened once, then cloned).
    fn connection(&self, dataset: &str) -> Result<Connection> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let c = match &self.path {
                Some(p) => {
                    if !p.exists() {
                        return Err(AgentError::DatabaseUnavailable {
                            dataset: dataset.into(),
                            kind: "file not found",
                        });
                    }
                    let cfg = Config::default()
                        .access_mode(AccessMode::ReadOnly)
                        .map_err(|e| db_err(dataset, e))?;
                    Connection::open_with_flags(p, cfg)
                }
                None => Connection::open_in_memory(),
            }
            .map_err(|e| {
                tracing::warn!(dataset, error = %e, "cannot open duckdb");
                AgentError::DatabaseUnavailable {
                    dataset: dataset.into(),
                    kind: "cannot open",
                }
            })?;
            // TIMESTAMPTZ renders in UTC (a no-op where the ICU extension is absent)
            let _ = c.execute_batch("SET TimeZone = 'UTC'");
            if let Some(s3) = &self.s3 {
                with_s3(&c, s3, dataset)?;
            }
            *guard = Some(c);
        }
        guard
            .as_ref()
            .expect("opened")
            .try_clone()
            .map_err(|e| db_err(dataset, e))
    }

    /// Rows of a query as text, first row only.
    fn first_row(
        conn: &Connection,
        dataset: &str,
        sql: &str,
        binds: &[KeyPart],
    ) -> Result<Vec<Option<String>>> {
        let mut stmt = conn.prepare(sql).map_err(|e| db_err(dataset, e))?;
        let p = params(binds);
        let mut rows = stmt
            .query(duckdb::params_from_iter(p.iter()))
            .map_err(|e| db_err(dataset, e))?;
        let n = rows.as_ref().map_or(0, |s| s.column_count());
        let row = rows.next().map_err(|e| db_err(dataset, e))?;
        Ok(match row {
            Some(r) => (0..n).map(|i| r.get_ref(i).ok().and_then(text)).collect(),
            None => vec![None; n.max(1)],
        })
    }

    pub async fn describe(
        &self,
        conn: &mut Option<Connection>,
        dataset: &str,
        source: &Source,
    ) -> Result<DatasetInfo> {
        let rel = relation(&self.dialect, source);
        let table = match source {
            Source::Table(parts) => parts.last().cloned(),
            Source::Query(_) => None,
        };
        let ds = dataset.to_string();
        blocking::run(conn, dataset, move |conn| {
            let mut stmt = conn
                .prepare(&format!("DESCRIBE SELECT * FROM {rel}"))
                .map_err(|e| db_err(&ds, e))?;
            let mut rows = stmt.query([]).map_err(|e| db_err(&ds, e))?;
            let mut columns = Vec::new();
            while let Some(r) = rows.next().map_err(|e| db_err(&ds, e))? {
                let name = r.get_ref(0).ok().and_then(text).unwrap_or_default();
                let declared = r.get_ref(1).ok().and_then(text).unwrap_or_default();
                let nullable = r.get_ref(2).ok().and_then(text).is_none_or(|n| n != "NO");
                let entry = crate::dialect::duckdb::classify(&declared);
                columns.push(entry.column(name, declared, nullable));
            }
            let version = Self::first_row(conn, &ds, "SELECT version()", &[])?
                .remove(0)
                .unwrap_or_default();
            let row_estimate = match table {
                Some(t) => Self::first_row(
                    conn,
                    &ds,
                    "SELECT estimated_size FROM duckdb_tables() WHERE table_name = ?",
                    &[KeyPart::Text(t)],
                )?
                .remove(0)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
                None => 0,
            };
            Ok(DatasetInfo {
                columns,
                key: Vec::new(),
                row_estimate,
                engine: "duckdb",
                engine_version: version,
            })
        })
        .await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        conn: &mut Option<Connection>,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        let (text_sql, binds, ds) = (sql.text.clone(), sql.binds.clone(), dataset.to_string());
        let zones: Vec<Option<String>> = cols.iter().map(|c| c.zone.clone()).collect();
        blocking::scan(conn, dataset, cols, key_len, reread, f, move |conn, out| {
            let mut stmt = conn.prepare(&text_sql).map_err(|e| db_err(&ds, e))?;
            let p = params(&binds);
            let mut rows = stmt
                .query(duckdb::params_from_iter(p.iter()))
                .map_err(|e| db_err(&ds, e))?;
            while let Some(r) = rows.next().map_err(|e| db_err(&ds, e))? {
                let fields = zones
                    .iter()
                    .enumerate()
                    .map(|(i, z)| r.get_ref(i).ok().and_then(|v| field(v, z.as_deref())))
                    .collect();
                if !out.send(fields) {
                    break; // the caller stopped listening
                }
            }
            Ok(())
        })
        .await
    }

    pub async fn count(&self, conn: &mut Option<Connection>, dataset: &str, sql: &Sql) -> Result<u64> {
        let (text_sql, binds, ds) = (sql.text.clone(), sql.binds.clone(), dataset.to_string());
        blocking::run(conn, dataset, move |conn| {
            let n = Self::first_row(conn, &ds, &text_sql, &binds)?.remove(0);
            super::counted(&ds, n.and_then(|s| s.parse().ok()))
        })
        .await
    }

    pub async fn aggregate(
        &self,
        conn: &mut Option<Connection>,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let (text_sql, binds, ds, classes) = (
            sql.text.clone(),
            sql.binds.clone(),
            dataset.to_string(),
            key_classes.to_vec(),
        );
        blocking::run(conn, dataset, move |conn| {
            let mut stmt = conn.prepare(&text_sql).map_err(|e| db_err(&ds, e))?;
            let p = params(&binds);
            let mut rows = stmt
                .query(duckdb::params_from_iter(p.iter()))
                .map_err(|e| db_err(&ds, e))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(|e| db_err(&ds, e))? {
                let t = |i: usize| r.get_ref(i).ok().and_then(text);
                out.push(agg_row(
                    &ds,
                    &classes,
                    |i| t(i).and_then(|s| s.parse().ok()),
                    |i| Ok(t(i)),
                )?);
            }
            Ok(out)
        })
        .await
    }

    pub async fn query_text(
        &self,
        conn: &mut Option<Connection>,
        dataset: &str,
        sql: &str,
    ) -> Result<Option<String>> {
        let (text_sql, ds) = (sql.to_string(), dataset.to_string());
        blocking::run(conn, dataset, move |conn| {
            Ok(Self::first_row(conn, &ds, &text_sql, &[])?.remove(0))
        })
        .await
    }

    /// Runs statements (tests and sample data).
    pub async fn execute_batch(&self, dataset: &str, sql: &str) -> Result<()> {
        let (text_sql, ds) = (sql.to_string(), dataset.to_string());
        let mut conn = Some(self.connection(dataset)?);
        blocking::run(&mut conn, dataset, move |conn| {
            conn.execute_batch(&text_sql).map_err(|e| db_err(&ds, e))
        })
        .await
    }
}

/// DuckDB in the agent's engine list (the `duckdb` cargo feature).
pub const ENGINE: super::Engine = super::Engine {
    name: "duckdb",
    schemes: &["duckdb"],
    open: |url, _limits| Ok(Box::new(DuckDbConnector::open(url)?)),
};

/// One call's or one request's connection (a clone of the database's).
pub struct Conn {
    engine: DuckDbConnector,
    conn: Option<Connection>,
}

#[async_trait::async_trait]
impl EngineConnector for DuckDbConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    /// DuckDB renders canonical text in SQL, vectorised.
    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Canonical
    }

    /// DuckDB's vectorised, multi-threaded SQL hashing does not lose to a
    /// row-at-a-time read (docs/performance.md).
    fn prefers_in_process(&self) -> bool {
        false
    }

    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>> {
        Ok(Box::new(Conn {
            engine: self.clone(),
            conn: Some(self.connection(dataset)?),
        }))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        DuckDbConnector::ping(self).await
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[async_trait::async_trait]
impl EngineConn for Conn {
    async fn begin(&mut self, dataset: &str) -> Result<()> {
        begin(&mut self.conn, dataset)
    }

    async fn commit(&mut self, dataset: &str) -> Result<()> {
        end(&mut self.conn, dataset)
    }

    fn discard(&mut self) {
        drop(self.conn.take());
    }

    async fn describe(&mut self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        self.engine.describe(&mut self.conn, dataset, source).await
    }

    async fn scan(
        &mut self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        self.engine
            .scan(&mut self.conn, dataset, sql, cols, key_len, reread, f)
            .await
    }

    async fn count(&mut self, dataset: &str, sql: &Sql) -> Result<u64> {
        self.engine.count(&mut self.conn, dataset, sql).await
    }

    async fn aggregate(
        &mut self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        self.engine
            .aggregate(&mut self.conn, dataset, sql, key_classes)
            .await
    }

    async fn query_text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>> {
        self.engine.query_text(&mut self.conn, dataset, sql).await
    }
}

/// The session's connection, unless an earlier call lost it.
/// Opens a request's transaction: a DuckDB transaction reads one snapshot.
fn begin(conn: &mut Option<Connection>, dataset: &str) -> Result<()> {
    match conn {
        Some(c) => c
            .execute_batch("BEGIN TRANSACTION")
            .map_err(|e| db_err(dataset, e)),
        None => blocking::take(conn, dataset).map(drop),
    }
}

/// Ends a request's transaction.
fn end(conn: &mut Option<Connection>, dataset: &str) -> Result<()> {
    match conn {
        Some(c) => c.execute_batch("COMMIT").map_err(|e| db_err(dataset, e)),
        None => blocking::take(conn, dataset).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_in_expanded_years_with_the_unit_s_digits() {
        assert_eq!(
            timestamp_text(TimeUnit::Microsecond, 0),
            "1970-01-01 00:00:00.000000"
        );
        assert_eq!(
            timestamp_text(TimeUnit::Microsecond, -1),
            "1969-12-31 23:59:59.999999"
        );
        assert_eq!(
            timestamp_text(TimeUnit::Nanosecond, -1),
            "1969-12-31 23:59:59.999999999"
        );
        assert_eq!(
            timestamp_text(TimeUnit::Millisecond, 1),
            "1970-01-01 00:00:00.001"
        );
        assert_eq!(timestamp_text(TimeUnit::Second, 86_399), "1970-01-01 23:59:59");
        // 1 BC is year 0000, 44 BC is -0043; 10000 takes its sign
        let day = |y, m, d| civil::days_from_civil(y, m, d) * 86_400;
        assert_eq!(
            timestamp_text(TimeUnit::Second, day(0, 12, 31)),
            "0000-12-31 00:00:00"
        );
        assert_eq!(
            timestamp_text(TimeUnit::Second, day(-43, 3, 15)),
            "-0043-03-15 00:00:00"
        );
        assert_eq!(
            timestamp_text(TimeUnit::Second, day(10_000, 1, 1)),
            "+10000-01-01 00:00:00"
        );
        for unit in [
            TimeUnit::Second,
            TimeUnit::Millisecond,
            TimeUnit::Microsecond,
            TimeUnit::Nanosecond,
        ] {
            assert_eq!(timestamp_text(unit, i64::MAX), "infinity");
            assert_eq!(timestamp_text(unit, -i64::MAX), "-infinity");
        }
    }

    #[test]
    fn a_zoned_timestamp_carries_its_offset_and_an_infinity_none() {
        let t = ValueRef::Timestamp(TimeUnit::Second, 0);
        assert_eq!(
            field(t, Some("+14:00")).as_deref(),
            Some("1970-01-01 00:00:00+14:00")
        );
        assert_eq!(field(t, None).as_deref(), Some("1970-01-01 00:00:00"));
        let inf = ValueRef::Timestamp(TimeUnit::Microsecond, i64::MAX);
        assert_eq!(field(inf, Some("+14:00")).as_deref(), Some("infinity"));
        assert_eq!(field(ValueRef::Null, Some("+14:00")), None);
    }
}
