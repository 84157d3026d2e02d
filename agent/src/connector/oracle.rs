//! Oracle through the `oracle` crate (ODPI-C). NOT LIVE-VERIFIED (see
//! [`crate::dialect::oracle`]).
//!
//! The driver loads Oracle's client library (`libclntsh`, Instant Client) at the first
//! connect; without it a call fails with an error naming what to install, and nothing
//! else in the agent is affected. The driver is blocking: each call runs on
//! `spawn_blocking` with the connection moved in and back out ([`super::blocking`]).
//!
//! Rows are read raw and made canonical in the agent by default: [`cell`] renders each
//! driver value, unit-tested on the values the driver hands out.
//!
//! URL: `oracle://user:password@host:1521/service_name`.

use oracle::sql_type::{OracleType, Timestamp};
use oracle::{Connection, SqlValue};
use tally_common::canonical::{CanonicalError, Value, canonical_from_text, canonical_value};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::{AggRow, EngineConn, EngineConnector, IdlePool, Pooled, RowSink, agg_row, blocking};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::oracle::{self as dialect, Oracle};
use crate::dialect::{Dialect, FetchShape, Sql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo, canonical_error};

/// What every result and `check` involving Oracle carries.
pub const NOT_LIVE_VERIFIED: &str = "Oracle support is not live-verified: its SQL is golden-tested and \
     parse-checked, but no test here ran it against a server (docs/engines.md)";

/// Where to connect, as parsed from the URL.
#[derive(Clone)]
pub struct Target {
    user: String,
    password: String,
    /// Easy Connect: `//host:port/service`.
    connect_string: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the password
        write!(f, "{}@{}", self.user, self.connect_string)
    }
}

#[derive(Clone)]
pub struct OracleConnector {
    target: Target,
    /// Connections returned after a finished call, reused by the next.
    idle: IdlePool<Connection>,
    pub dialect: Oracle,
}

/// Oracle in the agent's engine list.
pub const ENGINE: super::Engine = super::Engine {
    name: "oracle",
    schemes: &["oracle"],
    open: |url, limits| Ok(Box::new(OracleConnector::open(url, limits)?)),
};

fn db_err(dataset: &str, e: oracle::Error) -> AgentError {
    // the driver's text can hold values: it stays in the zone's log
    tracing::warn!(dataset, error = %e, "oracle call failed");
    let text = e.to_string();
    if text.contains("DPI-1047") {
        return AgentError::Unsupported(format!(
            "dataset {dataset}: the Oracle client library (libclntsh) cannot be loaded: install Oracle Instant \
             Client (basic or basic-lite) beside the agent and put it on LD_LIBRARY_PATH"
        ));
    }
    if text.contains("ORA-12541")
        || text.contains("ORA-12514")
        || text.contains("DPI-1080")
        || text.contains("ORA-03113")
    {
        return AgentError::DatabaseUnavailable {
            dataset: dataset.to_string(),
            kind: "connection failed",
        };
    }
    AgentError::Query {
        dataset: dataset.to_string(),
        kind: "oracle error",
    }
}

/// Parses `oracle://user:password@host:port/service`.
pub fn parse_url(url: &str) -> Result<Target> {
    let bad = |why: &str| {
        AgentError::Config(format!(
            "invalid oracle URL ({why}; expected oracle://user:password@host:1521/service_name)"
        ))
    };
    let u = url::Url::parse(url).map_err(|_| bad("unparseable"))?;
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("no host"))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| bad("user or password is not UTF-8"))
    };
    if u.username().is_empty() {
        return Err(bad("no user"));
    }
    let service = u.path().trim_start_matches('/');
    if service.is_empty() {
        return Err(bad("no service name"));
    }
    if u.query().is_some() {
        return Err(bad("no options are known"));
    }
    Ok(Target {
        user: decode(u.username())?,
        password: decode(u.password().unwrap_or(""))?,
        connect_string: format!("//{host}:{}/{}", u.port().unwrap_or(1521), decode(service)?),
    })
}

impl OracleConnector {
    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<OracleConnector> {
        Ok(OracleConnector {
            target: parse_url(url)?,
            idle: IdlePool::new(limits),
            dialect: Oracle,
        })
    }

    fn connect_new(target: &Target) -> std::result::Result<Connection, oracle::Error> {
        let c = Connection::connect(&target.user, &target.password, &target.connect_string)?;
        for s in dialect::SESSION_SETTINGS {
            c.execute(s, &[])?;
        }
        Ok(c)
    }
}

#[async_trait::async_trait]
impl EngineConnector for OracleConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Raw
    }

    fn not_live_verified(&self) -> Option<&'static str> {
        Some(NOT_LIVE_VERIFIED)
    }

    fn notes(&self) -> &'static [&'static str] {
        &[
            "Oracle stores an empty string as NULL: set empty_string_is_null: true on the other side's dataset to \
           compare its empty strings alike",
        ]
    }

    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>> {
        let reused = self.idle.reuse();
        let conn = match reused {
            Some(c) => c,
            None => {
                let target = self.target.clone();
                let ds = dataset.to_string();
                tokio::time::timeout(
                    super::CONNECT_TIMEOUT,
                    tokio::task::spawn_blocking(move || {
                        Self::connect_new(&target).map_err(|e| db_err(&ds, e))
                    }),
                )
                .await
                .map_err(|_| AgentError::DatabaseUnavailable {
                    dataset: dataset.to_string(),
                    kind: "connect timed out",
                })?
                .map_err(|_| AgentError::Query {
                    dataset: dataset.to_string(),
                    kind: "worker panicked",
                })??
            }
        };
        Ok(Box::new(Conn {
            conn: self.idle.lend(conn),
        }))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        let target = self.target.clone();
        tokio::task::spawn_blocking(move || {
            let c = Self::connect_new(&target).map_err(|e| e.to_string())?;
            c.close().map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One connection; back to the idle list when a call or request finished cleanly.
pub struct Conn {
    conn: Pooled<Connection>,
}

/// Bind values for the driver.
fn params(binds: &[KeyPart]) -> Vec<Box<dyn oracle::sql_type::ToSql + Send>> {
    binds
        .iter()
        .map(|b| -> Box<dyn oracle::sql_type::ToSql + Send> {
            match b {
                KeyPart::Int(i) => Box::new(*i),
                KeyPart::Text(s) => Box::new(s.clone()),
            }
        })
        .collect()
}

impl Conn {
    /// Runs `f` with the connection on a blocking thread; the connection comes back
    /// unless `f` panicked (then the call fails and the connection is gone).
    async fn blocking<T: Send + 'static>(
        &mut self,
        dataset: &str,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        blocking::run(self.conn.slot(), dataset, f).await
    }

    /// Every row of a statement as its values' texts (catalog and aggregate results).
    async fn texts(&mut self, dataset: &str, sql: &Sql) -> Result<Vec<Vec<Option<String>>>> {
        let (text, binds, ds) = (sql.text.clone(), sql.binds.clone(), dataset.to_string());
        self.blocking(dataset, move |c| {
            let p = params(&binds);
            let refs: Vec<&dyn oracle::sql_type::ToSql> = p.iter().map(|b| b.as_ref() as _).collect();
            let rows = c.query(&text, &refs).map_err(|e| db_err(&ds, e))?;
            let mut out = Vec::new();
            for r in rows {
                let r = r.map_err(|e| db_err(&ds, e))?;
                out.push(
                    r.sql_values()
                        .iter()
                        .map(|v| match v.is_null() {
                            Ok(true) => Ok(None),
                            _ => v.get::<String>().map(Some),
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|e| db_err(&ds, e))?,
                );
            }
            Ok(out)
        })
        .await
    }
}

/// A driver timestamp as text the reference parses: `YYYY-MM-DD HH:MM:SS.nnnnnnnnn`,
/// with its offset when it has one; a year before 1 as `… BC` (Oracle's -1 is 1 BC).
pub fn timestamp_text(t: &Timestamp) -> String {
    let (year, bc) = if t.year() < 1 {
        (-t.year(), " BC")
    } else {
        (t.year(), "")
    };
    let mut s = format!(
        "{year:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:09}",
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.nanosecond()
    );
    if t.with_tz() {
        let off = t.tz_offset();
        let sign = if off < 0 { '-' } else { '+' };
        s.push_str(&format!(
            "{sign}{:02}:{:02}",
            off.abs() / 3600,
            off.abs() / 60 % 60
        ));
    }
    s.push_str(bc);
    s
}

/// A zone-less timestamp text with the dataset's offset, before any ` BC` mark.
fn with_zone(text: &str, zone: &str) -> String {
    match text.strip_suffix(" BC") {
        Some(t) => format!("{t}{zone} BC"),
        None => format!("{text}{zone}"),
    }
}

/// The canonical text of one driver value at the column's format, `None` for NULL.
pub fn cell(c: &BoundColumn, v: &SqlValue) -> std::result::Result<Option<String>, CanonicalError> {
    let f = &c.spec.format;
    let bad = |what: &str| {
        CanonicalError::Unsupported(if what.is_empty() {
            "oracle value"
        } else {
            "oracle type"
        })
    };
    if v.is_null().map_err(|_| bad(""))? {
        return Ok(None);
    }
    let ty = v.oracle_type().map_err(|_| bad(""))?.clone();
    match ty {
        // FLOAT(p) is a decimal NUMBER too, not a double
        OracleType::Number(..) | OracleType::Float(_) => {
            // the driver's text of a NUMBER is exact (it may use an exponent)
            let t: String = v.get().map_err(|_| bad(""))?;
            canonical_from_text(f, Some(&t))
        }
        OracleType::BinaryFloat => {
            let x: f32 = v.get().map_err(|_| bad(""))?;
            canonical_value(f, &Value::Float(f64::from(x)))
        }
        OracleType::BinaryDouble => {
            let x: f64 = v.get().map_err(|_| bad(""))?;
            canonical_value(f, &Value::Float(x))
        }
        OracleType::Boolean => {
            let b: bool = v.get().map_err(|_| bad(""))?;
            canonical_value(f, &Value::Bool(b))
        }
        OracleType::Varchar2(_)
        | OracleType::NVarchar2(_)
        | OracleType::Char(_)
        | OracleType::NChar(_)
        | OracleType::CLOB
        | OracleType::NCLOB
        | OracleType::Long => {
            let s: String = v.get().map_err(|_| bad(""))?;
            canonical_value(f, &Value::Text(&s))
        }
        OracleType::Raw(_) | OracleType::BLOB | OracleType::LongRaw => {
            let b: Vec<u8> = v.get().map_err(|_| bad(""))?;
            canonical_value(f, &Value::Bytes(&b))
        }
        OracleType::Date
        | OracleType::Timestamp(_)
        | OracleType::TimestampTZ(_)
        | OracleType::TimestampLTZ(_) => {
            let t: Timestamp = v.get().map_err(|_| bad(""))?;
            let mut text = timestamp_text(&t);
            // a timestamp without zone compared as one with zone is read in the dataset's
            if !t.with_tz()
                && let Some(z) = &c.zone
            {
                text = with_zone(&text, z);
            }
            canonical_from_text(f, Some(&text))
        }
        _ => Err(bad("type")),
    }
}

/// The driver's type as the type table reads it: name, precision, scale.
fn type_parts(t: &OracleType) -> (String, i32, i32) {
    match t {
        OracleType::Number(p, s) => ("NUMBER".into(), i32::from(*p), i32::from(*s)),
        OracleType::Float(p) => ("FLOAT".into(), i32::from(*p), 0),
        OracleType::Timestamp(p) => ("TIMESTAMP".into(), i32::from(*p), 0),
        OracleType::TimestampTZ(p) => ("TIMESTAMP WITH TIME ZONE".into(), i32::from(*p), 0),
        OracleType::TimestampLTZ(p) => ("TIMESTAMP WITH LOCAL TIME ZONE".into(), i32::from(*p), 0),
        OracleType::Varchar2(_) => ("VARCHAR2".into(), 0, 0),
        OracleType::NVarchar2(_) => ("NVARCHAR2".into(), 0, 0),
        OracleType::Char(_) => ("CHAR".into(), 0, 0),
        OracleType::NChar(_) => ("NCHAR".into(), 0, 0),
        OracleType::Raw(_) => ("RAW".into(), 0, 0),
        OracleType::LongRaw => ("LONG RAW".into(), 0, 0),
        other => (other.to_string(), 0, 0),
    }
}

#[async_trait::async_trait]
impl EngineConn for Conn {
    async fn begin(&mut self, dataset: &str) -> Result<()> {
        self.conn.in_tx = true;
        let ds = dataset.to_string();
        self.blocking(dataset, move |c| {
            c.execute(dialect::BEGIN, &[])
                .map(drop)
                .map_err(|e| db_err(&ds, e))
        })
        .await
    }

    async fn commit(&mut self, dataset: &str) -> Result<()> {
        let ds = dataset.to_string();
        self.blocking(dataset, move |c| c.commit().map_err(|e| db_err(&ds, e)))
            .await?;
        self.conn.in_tx = false;
        Ok(())
    }

    fn discard(&mut self) {
        self.conn.discard();
    }

    async fn describe(&mut self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        let one = |text: &str, binds: Vec<KeyPart>| Sql {
            text: text.to_string(),
            binds,
        };
        let charset = self.texts(dataset, &one(dialect::CHARSET_SQL, vec![])).await?;
        let charset = charset
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .unwrap_or_default();
        if charset != "AL32UTF8" {
            return Err(AgentError::Unsupported(format!(
                "dataset {dataset}: the database character set is {charset}; only AL32UTF8 databases hash text identically"
            )));
        }
        let rel = relation(&Oracle, source);
        let (probe, ds) = (dialect::describe_sql(&rel), dataset.to_string());
        let (version, described) = self
            .blocking(dataset, move |c| {
                let version = c.server_version().map(|(v, _)| v.to_string()).unwrap_or_default();
                let rows = c.query(&probe, &[]).map_err(|e| db_err(&ds, e))?;
                let cols: Vec<(String, OracleType, bool)> = rows
                    .column_info()
                    .iter()
                    .map(|ci| (ci.name().to_string(), ci.oracle_type().clone(), ci.nullable()))
                    .collect();
                Ok((version, cols))
            })
            .await
            .map_err(|e| match e {
                AgentError::Query { .. } => AgentError::Config(format!(
                    "dataset {dataset}: Oracle cannot describe {rel} (a missing table, a query that does not compile, or \
                     no privilege to read it; lower-case names are folded to upper case; the agent's log has the \
                     server's message)"
                )),
                other => other,
            })?;
        let columns = described
            .into_iter()
            .map(|(name, ty, nullable)| {
                let (base, p, s) = type_parts(&ty);
                dialect::classify(&base, p, s).column(name, ty.to_string(), nullable)
            })
            .collect();
        let row_estimate = match source {
            Source::Table(parts) => {
                let (owner, table) = match parts.as_slice() {
                    [t] => (None, t),
                    [o, t] => (Some(o), t),
                    _ => return Err(AgentError::Config("bad table name".into())),
                };
                let unquote = |s: &str| dialect::fold(s);
                let binds = vec![
                    KeyPart::Text(owner.map(|o| unquote(o)).unwrap_or_default()),
                    KeyPart::Text(unquote(table)),
                ];
                self.texts(dataset, &one(dialect::ROW_ESTIMATE_SQL, binds))
                    .await?
                    .first()
                    .and_then(|r| r.first().cloned().flatten())
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or(0)
            }
            Source::Query(_) => 0,
        };
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate,
            engine: "oracle",
            engine_version: version,
        })
    }

    async fn scan(
        &mut self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        _reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        // rows cross from the blocking reader through a bounded channel
        let (text, binds, ds, owned) = (
            sql.text.clone(),
            sql.binds.clone(),
            dataset.to_string(),
            cols.to_vec(),
        );
        blocking::scan(self.conn.slot(), dataset, cols, key_len, &[], f, move |c, out| {
            let p = params(&binds);
            let refs: Vec<&dyn oracle::sql_type::ToSql> = p.iter().map(|b| b.as_ref() as _).collect();
            for r in c.query(&text, &refs).map_err(|e| db_err(&ds, e))? {
                let fields = r.map_err(|e| db_err(&ds, e)).and_then(|r| {
                    r.sql_values()
                        .iter()
                        .zip(&owned)
                        .map(|(v, col)| cell(col, v).map_err(|e| canonical_error(&ds, &col.info.name, e)))
                        .collect::<Result<Vec<_>>>()
                })?;
                if !out.send(fields) {
                    break; // the receiver stopped
                }
            }
            Ok(())
        })
        .await
    }

    async fn count(&mut self, dataset: &str, sql: &Sql) -> Result<u64> {
        let rows = self.texts(dataset, sql).await?;
        let n = rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|t| t.parse::<i64>().ok());
        super::counted(dataset, n)
    }

    async fn aggregate(
        &mut self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let rows = self.texts(dataset, sql).await?;
        rows.iter()
            .map(|r| {
                let t = |i: usize| r.get(i).cloned().flatten();
                agg_row(
                    dataset,
                    key_classes,
                    |i| t(i).and_then(|s| s.parse().ok()),
                    |i| Ok(t(i)),
                )
            })
            .collect()
    }

    async fn query_text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>> {
        let rows = self
            .texts(
                dataset,
                &Sql {
                    text: sql.to_string(),
                    binds: vec![],
                },
            )
            .await?;
        Ok(rows.first().and_then(|r| r.first().cloned().flatten()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_easy_connect_strings_or_are_refused() {
        let t = parse_url("oracle://tally:p%40ss@db.dc3.internal:1522/ORCLPDB1").unwrap();
        assert_eq!(t.connect_string, "//db.dc3.internal:1522/ORCLPDB1");
        assert_eq!((t.user.as_str(), t.password.as_str()), ("tally", "p@ss"));
        assert_eq!(parse_url("oracle://u@h/s").unwrap().connect_string, "//h:1521/s");
        for (url, why) in [
            ("oracle://h/svc", "no user"),
            ("oracle://u@h", "no service name"),
            ("oracle://u@h/s?x=1", "no options"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    fn fmt(class: TypeClass, scale: u32) -> BoundColumn {
        BoundColumn {
            info: crate::schema::TypeEntry::of(class).scale(Some(scale)).column(
                "c".into(),
                String::new(),
                true,
            ),
            spec: tally_common::segment::ColumnSpec {
                name: "c".into(),
                format: tally_common::canonical::FieldFormat::new(class).with_scale(scale),
            },
            zone: None,
        }
    }

    // driver timestamps (a DATE is one at precision 0) through the text the reference
    // parses, to the canonical text of DESIGN §3
    #[test]
    fn driver_timestamps_render_canonically() {
        let render = |t: &Timestamp, class, scale| {
            canonical_from_text(&fmt(class, scale).spec.format, Some(&timestamp_text(t)))
                .unwrap()
                .unwrap()
        };
        let t = Timestamp::new(2024, 3, 15, 14, 30, 0, 123_456_789).unwrap();
        assert_eq!(render(&t, TypeClass::Timestamp, 0), "2024-03-15T14:30:00");
        assert_eq!(render(&t, TypeClass::Timestamp, 6), "2024-03-15T14:30:00.123456");
        // +02:00 to UTC
        let z = t.and_tz_hm_offset(2, 0).unwrap();
        assert_eq!(render(&z, TypeClass::TimestampTz, 3), "2024-03-15T12:30:00.123Z");
        let west = Timestamp::new(2024, 12, 31, 23, 0, 0, 0)
            .unwrap()
            .and_tz_hm_offset(-5, -30)
            .unwrap();
        assert_eq!(render(&west, TypeClass::TimestampTz, 0), "2025-01-01T04:30:00Z");
        // Oracle's year -1 is 1 BC: astronomical 0000
        let bc = Timestamp::new(-1, 6, 1, 0, 0, 0, 0).unwrap();
        assert_eq!(render(&bc, TypeClass::Timestamp, 0), "0000-06-01T00:00:00");
    }

    #[test]
    fn types_read_back_from_the_driver_classify() {
        let (n, p, s) = type_parts(&OracleType::Number(12, 2));
        assert_eq!(dialect::classify(&n, p, s).scale, Some(2));
        let (n, p, s) = type_parts(&OracleType::TimestampTZ(3));
        assert_eq!(dialect::classify(&n, p, s).class, TypeClass::TimestampTz);
        let (n, p, s) = type_parts(&OracleType::Number(0, -127));
        assert_eq!(dialect::classify(&n, p, s).scale, None);
    }

    #[test]
    fn a_call_without_the_client_library_says_what_to_install() {
        // this machine has no Oracle client: the first connect must fail cleanly
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let c = OracleConnector::open("oracle://tally:x@127.0.0.1:1/none", &ConnectionsConfig::default())
            .unwrap();
        let e = rt
            .block_on(c.connect("orders"))
            .err()
            .expect("no Oracle client or server here");
        // without Instant Client: an error that names what to install; where one is
        // installed, nothing listens on port 1: the database is unavailable
        match e {
            AgentError::Unsupported(text) => assert!(
                text.contains("libclntsh") && text.contains("Instant Client"),
                "{text}"
            ),
            AgentError::DatabaseUnavailable { .. } => {}
            other => panic!("neither a missing client nor an unreachable server: {other}"),
        }
    }
}
