//! SQL Server through tiberius (TDS 7.3+, TLS through rustls). NOT LIVE-VERIFIED (see
//! [`crate::dialect::mssql`]).
//!
//! Rows are read raw and made canonical in the agent by default, as on PostgreSQL: each
//! TDS value ([`ColumnData`]) is rendered by [`cell`], a pure function unit-tested on
//! the values the driver hands out. The pushed-down aggregate uses the dialect's SQL.
//!
//! URL: `mssql://user:password@host:1433/database?encrypt=required&ca=/path/ca.pem`.
//! `encrypt` is `required` (the default: TLS or no connection) or `off` (TLS for the
//! login only, as the server allows); the server certificate is verified against `ca`,
//! or the system roots, unless `trust_server_certificate=true` (warned).

use futures::TryStreamExt;
use tally_common::canonical::{Value, canonical_from_text, canonical_value};
use tally_common::civil::{civil_from_days, days_from_civil};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;
use tiberius::{AuthMethod, Client, ColumnData, Config, EncryptionLevel, Query};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::{AggRow, EngineConn, EngineConnector, IdlePool, Pooled, RowBuilder, RowSink, agg_row, obey};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::mssql::{self as dialect, MsSql};
use crate::dialect::{Dialect, FetchShape, Sql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo, canonical_error};

type Tds = Client<Compat<TcpStream>>;

/// What every result and `check` involving SQL Server carries.
pub const NOT_LIVE_VERIFIED: &str = "SQL Server support is not live-verified: its SQL is golden-tested and \
     parse-checked, but no test here ran it against a server (docs/engines.md)";

#[derive(Clone)]
pub struct MsSqlConnector {
    config: Config,
    /// Connections returned after a finished call, reused by the next.
    idle: IdlePool<Tds>,
    pub dialect: MsSql,
}

/// SQL Server in the agent's engine list.
pub const ENGINE: super::Engine = super::Engine {
    name: "mssql",
    schemes: &["mssql", "sqlserver"],
    open: |url, limits| Ok(Box::new(MsSqlConnector::open(url, limits)?)),
};

fn db_err(dataset: &str, e: tiberius::error::Error) -> AgentError {
    // the driver's text can hold values: it stays in the zone's log
    tracing::warn!(dataset, error = %e, "sql server call failed");
    match e {
        tiberius::error::Error::Io { .. } | tiberius::error::Error::Tls(_) => {
            AgentError::DatabaseUnavailable {
                dataset: dataset.to_string(),
                kind: "connection failed",
            }
        }
        ref server if server.code() == Some(3952) => AgentError::Unsupported(format!(
            "dataset {dataset}: the database does not allow SNAPSHOT isolation; run \
             ALTER DATABASE <db> SET ALLOW_SNAPSHOT_ISOLATION ON (requests read one snapshot)"
        )),
        _ => AgentError::Query {
            dataset: dataset.to_string(),
            kind: "sql server error",
        },
    }
}

/// Parses `mssql://user:password@host:port/database?options` into a driver config.
pub fn parse_url(url: &str) -> Result<Config> {
    let bad = |why: &str| {
        AgentError::Config(format!(
            "invalid mssql URL ({why}; expected mssql://user:password@host:1433/database?encrypt=required&ca=/path/ca.pem)"
        ))
    };
    let u = url::Url::parse(&url.replacen("sqlserver://", "mssql://", 1)).map_err(|_| bad("unparseable"))?;
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
    let mut c = Config::new();
    c.host(host);
    c.port(u.port().unwrap_or(1433));
    c.application_name("tally-agent");
    c.authentication(AuthMethod::sql_server(
        decode(u.username())?,
        decode(u.password().unwrap_or(""))?,
    ));
    let db = u.path().trim_start_matches('/');
    if !db.is_empty() {
        c.database(decode(db)?);
    }
    c.encryption(EncryptionLevel::Required);
    for (k, v) in u.query_pairs() {
        match (k.as_ref(), v.as_ref()) {
            ("encrypt", "required" | "true") => c.encryption(EncryptionLevel::Required),
            ("encrypt", "off" | "false") => c.encryption(EncryptionLevel::Off),
            ("encrypt", _) => return Err(bad("encrypt is required or off")),
            ("ca", path) => c.trust_cert_ca(path),
            ("trust_server_certificate", "true") => {
                tracing::warn!(
                    "mssql URL: trust_server_certificate=true, the server's certificate is not verified"
                );
                c.trust_cert()
            }
            ("trust_server_certificate", "false") => {}
            ("application_intent", "readonly") => c.readonly(true),
            (other, _) => return Err(bad(&format!("unknown option {other:?}"))),
        }
    }
    Ok(c)
}

impl MsSqlConnector {
    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<MsSqlConnector> {
        Ok(MsSqlConnector {
            config: parse_url(url)?,
            idle: IdlePool::new(limits),
            dialect: MsSql,
        })
    }

    async fn connect_new(&self) -> std::result::Result<Tds, tiberius::error::Error> {
        let tcp = TcpStream::connect(self.config.get_addr()).await?;
        tcp.set_nodelay(true)?;
        let mut client = Client::connect(self.config.clone(), tcp.compat_write()).await?;
        client
            .simple_query(dialect::SESSION_SETTINGS)
            .await?
            .into_results()
            .await?;
        Ok(client)
    }
}

#[async_trait::async_trait]
impl EngineConnector for MsSqlConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Raw
    }

    fn not_live_verified(&self) -> Option<&'static str> {
        Some(NOT_LIVE_VERIFIED)
    }

    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>> {
        let reused = self.idle.reuse();
        let client = match reused {
            Some(c) => c,
            None => tokio::time::timeout(super::CONNECT_TIMEOUT, self.connect_new())
                .await
                .map_err(|_| AgentError::DatabaseUnavailable {
                    dataset: dataset.to_string(),
                    kind: "connect timed out",
                })?
                .map_err(|e| db_err(dataset, e))?,
        };
        Ok(Box::new(Conn {
            client: self.idle.lend(client),
        }))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        let c = self.connect_new().await.map_err(|e| e.to_string())?;
        c.close().await.map_err(|e| e.to_string())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One connection; back to the idle list when a call or request finished cleanly.
pub struct Conn {
    client: Pooled<Tds>,
}

fn bind<'a>(sql: &'a Sql) -> Query<'a> {
    let mut q = Query::new(sql.text.as_str());
    for b in &sql.binds {
        match b {
            KeyPart::Int(i) => q.bind(*i),
            KeyPart::Text(s) => q.bind(s.as_str()),
        }
    }
    q
}

impl Conn {
    fn client(&mut self, dataset: &str) -> Result<&mut Tds> {
        self.client.slot().as_mut().ok_or_else(|| AgentError::Query {
            dataset: dataset.to_string(),
            kind: "connection lost",
        })
    }

    /// Every row of a statement, each as its cells.
    async fn rows(&mut self, dataset: &str, sql: &Sql) -> Result<Vec<tiberius::Row>> {
        let c = self.client(dataset)?;
        bind(sql)
            .query(c)
            .await
            .map_err(|e| db_err(dataset, e))?
            .into_first_result()
            .await
            .map_err(|e| db_err(dataset, e))
    }

    async fn simple(&mut self, dataset: &str, sql: &str) -> Result<()> {
        let c = self.client(dataset)?;
        c.simple_query(sql)
            .await
            .map_err(|e| db_err(dataset, e))?
            .into_results()
            .await
            .map_err(|e| db_err(dataset, e))?;
        Ok(())
    }
}

/// Text of a cell (catalog and aggregate results: strings and integers).
fn text_of(d: &ColumnData<'_>) -> Option<String> {
    match d {
        ColumnData::String(s) => s.as_ref().map(|s| s.to_string()),
        ColumnData::U8(v) => v.map(|v| v.to_string()),
        ColumnData::I16(v) => v.map(|v| v.to_string()),
        ColumnData::I32(v) => v.map(|v| v.to_string()),
        ColumnData::I64(v) => v.map(|v| v.to_string()),
        ColumnData::Numeric(v) => v.map(|n| numeric_text(n.value(), n.scale())),
        _ => None,
    }
}

fn int_of(d: &ColumnData<'_>) -> Option<i64> {
    text_of(d).and_then(|t| t.parse().ok())
}

/// A DECIMAL's digits at its scale, as text (`-12.50`).
pub fn numeric_text(value: i128, scale: u8) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    let s = scale as usize;
    if s == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (int, frac) = padded.split_at(padded.len() - s);
    format!("{sign}{int}.{frac}")
}

/// `YYYY-MM-DD` of a day count from 0001-01-01 (`date`, `datetime2`).
fn date_text(days_from_year_1: i64) -> String {
    let (y, m, d) = civil_from_days(days_from_civil(1, 1, 1) + days_from_year_1);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `HH:MM:SS.fffffff` of `increments` units of 10^-scale s since midnight.
fn time_text(increments: u64, scale: u8) -> String {
    let hundred_ns = increments * 10u64.pow(7u32.saturating_sub(u32::from(scale)));
    let secs = hundred_ns / 10_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:07}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        hundred_ns % 10_000_000
    )
}

/// The canonical text of one TDS value at the column's format, `None` for NULL. The
/// temporal types arrive as day counts and increments; they are written out as text
/// and parsed by the one canonical renderer every engine shares.
pub fn cell(
    c: &BoundColumn,
    d: &ColumnData<'_>,
) -> std::result::Result<Option<String>, tally_common::canonical::CanonicalError> {
    let f = &c.spec.format;
    let v = |value: Value<'_>| canonical_value(f, &value);
    let t = |s: String| canonical_from_text(f, Some(&s));
    // a timestamp without zone compared as one with zone is read in the dataset's zone
    let tz = |s: String| match &c.zone {
        Some(z) => t(format!("{s}{z}")),
        None => t(s),
    };
    match d {
        ColumnData::U8(None)
        | ColumnData::I16(None)
        | ColumnData::I32(None)
        | ColumnData::I64(None)
        | ColumnData::F32(None)
        | ColumnData::F64(None)
        | ColumnData::Bit(None)
        | ColumnData::String(None)
        | ColumnData::Guid(None)
        | ColumnData::Binary(None)
        | ColumnData::Numeric(None)
        | ColumnData::Xml(None)
        | ColumnData::DateTime(None)
        | ColumnData::SmallDateTime(None)
        | ColumnData::Time(None)
        | ColumnData::Date(None)
        | ColumnData::DateTime2(None)
        | ColumnData::DateTimeOffset(None) => Ok(None),
        ColumnData::U8(Some(i)) => v(Value::Int(i128::from(*i))),
        ColumnData::I16(Some(i)) => v(Value::Int(i128::from(*i))),
        ColumnData::I32(Some(i)) => v(Value::Int(i128::from(*i))),
        ColumnData::I64(Some(i)) => v(Value::Int(i128::from(*i))),
        // a real widens exactly to double, as on every engine
        ColumnData::F32(Some(x)) => v(Value::Float(f64::from(*x))),
        ColumnData::F64(Some(x)) => v(Value::Float(*x)),
        ColumnData::Bit(Some(b)) => v(Value::Bool(*b)),
        ColumnData::String(Some(s)) => v(Value::Text(s)),
        ColumnData::Guid(Some(g)) => t(g.to_string()),
        ColumnData::Binary(Some(b)) => v(Value::Bytes(b)),
        ColumnData::Numeric(Some(n)) => t(numeric_text(n.value(), n.scale())),
        ColumnData::Xml(Some(_)) => Err(tally_common::canonical::CanonicalError::Unsupported("xml")),
        ColumnData::DateTime(Some(dt)) => {
            // 1/300 s, rounded to the milliseconds SQL Server shows (.003, .007)
            let ms = (u64::from(dt.seconds_fragments()) * 10 + 1) / 3;
            let day = days_from_civil(1900, 1, 1) - days_from_civil(1, 1, 1) + i64::from(dt.days());
            tz(format!("{} {}", date_text(day), time_text(ms, 3)))
        }
        ColumnData::SmallDateTime(Some(dt)) => {
            let day = days_from_civil(1900, 1, 1) - days_from_civil(1, 1, 1) + i64::from(dt.days());
            tz(format!(
                "{} {}",
                date_text(day),
                time_text(u64::from(dt.seconds_fragments()) * 60, 0)
            ))
        }
        ColumnData::Date(Some(day)) => t(date_text(i64::from(day.days()))),
        ColumnData::Time(Some(tm)) => t(time_text(tm.increments(), tm.scale())),
        ColumnData::DateTime2(Some(dt)) => tz(format!(
            "{} {}",
            date_text(i64::from(dt.date().days())),
            time_text(dt.time().increments(), dt.time().scale())
        )),
        // TDS carries a datetimeoffset as its UTC date and time plus the offset
        ColumnData::DateTimeOffset(Some(dto)) => {
            let dt = dto.datetime2();
            t(format!(
                "{} {}Z",
                date_text(i64::from(dt.date().days())),
                time_text(dt.time().increments(), dt.time().scale())
            ))
        }
    }
}

#[async_trait::async_trait]
impl EngineConn for Conn {
    async fn begin(&mut self, dataset: &str) -> Result<()> {
        self.client.in_tx = true;
        self.simple(dataset, dialect::BEGIN).await
    }

    async fn commit(&mut self, dataset: &str) -> Result<()> {
        self.simple(dataset, "COMMIT").await?;
        self.client.in_tx = false;
        Ok(())
    }

    fn discard(&mut self) {
        self.client.discard();
    }

    async fn describe(&mut self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        let one = |text: &str, binds: Vec<KeyPart>| Sql {
            text: text.to_string(),
            binds,
        };
        let version = self
            .rows(dataset, &one(dialect::VERSION_SQL, vec![]))
            .await?
            .first()
            .and_then(|r| r.cells().next().and_then(|(_, d)| text_of(d)))
            .unwrap_or_default();
        let rel = relation(&MsSql, source);
        let probe = format!("SELECT * FROM {rel}");
        let rows = self
            .rows(dataset, &one(dialect::COLUMNS_SQL, vec![KeyPart::Text(probe)]))
            .await?;
        let mut columns = Vec::with_capacity(rows.len());
        for r in &rows {
            let cells: Vec<&ColumnData<'static>> = r.cells().map(|(_, d)| d).collect();
            if cells.get(3).and_then(|d| int_of(d)).is_some() {
                return Err(AgentError::Config(format!(
                    "dataset {dataset}: SQL Server cannot describe {rel} (a missing table, a query that does not \
                     compile, or no permission to read it; the agent's log has the server's message)"
                )));
            }
            let name = cells.first().and_then(|d| text_of(d)).unwrap_or_default();
            let declared = cells.get(1).and_then(|d| text_of(d)).unwrap_or_default();
            let nullable = cells.get(2).and_then(|d| int_of(d)) != Some(0);
            columns.push(dialect::classify(&declared).column(name, declared, nullable));
        }
        if columns.is_empty() {
            return Err(AgentError::Config(format!(
                "dataset {dataset}: {rel} has no columns or does not exist"
            )));
        }
        let row_estimate = match source {
            Source::Table(_) => self
                .rows(
                    dataset,
                    &one(dialect::ROW_ESTIMATE_SQL, vec![KeyPart::Text(rel.clone())]),
                )
                .await?
                .first()
                .and_then(|r| r.cells().next().and_then(|(_, d)| int_of(d)))
                .unwrap_or(0)
                .max(0) as u64,
            Source::Query(_) => 0,
        };
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate,
            engine: "mssql",
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
        let c = self.client(dataset)?;
        let mut rows = bind(sql)
            .query(c)
            .await
            .map_err(|e| db_err(dataset, e))?
            .into_row_stream();
        let mut b = RowBuilder::new(dataset, cols, key_len, &[]);
        while let Some(row) = rows.try_next().await.map_err(|e| db_err(dataset, e))? {
            let mut fields = Vec::with_capacity(cols.len());
            for ((_, d), col) in row.cells().zip(cols) {
                fields.push(cell(col, d).map_err(|e| canonical_error(dataset, &col.info.name, e))?);
            }
            // the builder refuses a row of other than the requested width
            obey(f(b.canonical_row_of(&fields)?)?).await?;
        }
        Ok(())
    }

    async fn count(&mut self, dataset: &str, sql: &Sql) -> Result<u64> {
        let rows = self.rows(dataset, sql).await?;
        let n = rows
            .first()
            .and_then(|r| r.cells().next().and_then(|(_, d)| int_of(d)));
        super::counted(dataset, n)
    }

    async fn aggregate(
        &mut self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let rows = self.rows(dataset, sql).await?;
        rows.iter()
            .map(|r| {
                let cells: Vec<&ColumnData<'static>> = r.cells().map(|(_, d)| d).collect();
                agg_row(
                    dataset,
                    key_classes,
                    |i| cells.get(i).and_then(|d| int_of(d)),
                    |i| Ok(cells.get(i).and_then(|d| text_of(d))),
                )
            })
            .collect()
    }

    async fn query_text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>> {
        let rows = self
            .rows(
                dataset,
                &Sql {
                    text: sql.to_string(),
                    binds: vec![],
                },
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.cells().next().and_then(|(_, d)| text_of(d))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::canonical::FieldFormat;
    use tally_common::segment::ColumnSpec;
    use tiberius::numeric::Numeric;
    use tiberius::time::{self as tds, DateTime, DateTime2, DateTimeOffset, SmallDateTime};

    fn col(class: TypeClass, scale: u32) -> BoundColumn {
        BoundColumn {
            info: crate::schema::TypeEntry::of(class).scale(Some(scale)).column(
                "c".into(),
                String::new(),
                true,
            ),
            spec: ColumnSpec {
                name: "c".into(),
                format: FieldFormat::new(class).with_scale(scale),
            },
            zone: None,
        }
    }

    fn canon(class: TypeClass, scale: u32, d: ColumnData<'_>) -> Option<String> {
        cell(&col(class, scale), &d).unwrap()
    }

    // values as tiberius decodes them from the wire (day counts, increments, i128
    // digits): each renders to the canonical text of DESIGN §3
    #[test]
    fn driver_values_render_canonically() {
        use TypeClass::*;
        assert_eq!(canon(Integer, 0, ColumnData::I64(Some(-42))), Some("-42".into()));
        assert_eq!(canon(Integer, 0, ColumnData::U8(Some(255))), Some("255".into()));
        assert_eq!(canon(Integer, 0, ColumnData::I64(None)), None);
        assert_eq!(canon(Boolean, 0, ColumnData::Bit(Some(true))), Some("1".into()));
        assert_eq!(
            canon(
                Decimal,
                2,
                ColumnData::Numeric(Some(Numeric::new_with_scale(-125_050, 3)))
            ),
            Some("-125.05".into())
        );
        assert_eq!(
            canon(
                Decimal,
                4,
                ColumnData::Numeric(Some(Numeric::new_with_scale(5, 2)))
            ),
            Some("0.0500".into())
        );
        assert_eq!(
            canon(Float, 6, ColumnData::F32(Some(0.1))),
            Some("0.100000".into())
        );
        assert_eq!(
            canon(Text, 0, ColumnData::String(Some("héllo".into()))),
            Some("héllo".into())
        );
        assert_eq!(
            canon(Binary, 0, ColumnData::Binary(Some(vec![0, 0xAB].into()))),
            Some("00ab".into())
        );
        let g = tiberius::Uuid::parse_str("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").unwrap();
        assert_eq!(
            canon(Uuid, 0, ColumnData::Guid(Some(g))),
            Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into())
        );
        // 2024-03-15 is day 738,959 from 0001-01-01
        let day = (days_from_civil(2024, 3, 15) - days_from_civil(1, 1, 1)) as u32;
        assert_eq!(
            canon(Date, 0, ColumnData::Date(Some(tds::Date::new(day)))),
            Some("2024-03-15".into())
        );
        assert_eq!(
            canon(Date, 0, ColumnData::Date(Some(tds::Date::new(0)))),
            Some("0001-01-01".into())
        );
        // 14:30:00.1234567 at scale 7, cut (never rounded) to 3 digits
        let t = tds::Time::new(((14 * 3600 + 30 * 60) as u64) * 10_000_000 + 1_234_567, 7);
        assert_eq!(
            canon(
                Timestamp,
                3,
                ColumnData::DateTime2(Some(DateTime2::new(tds::Date::new(day), t)))
            ),
            Some("2024-03-15T14:30:00.123".into())
        );
        // scale 2 increments: 0.57 s
        let t2 = tds::Time::new(((23 * 3600 + 59 * 60 + 59) as u64) * 100 + 57, 2);
        assert_eq!(
            canon(Time, 6, ColumnData::Time(Some(t2))),
            Some("23:59:59.570000".into())
        );
        // a datetimeoffset's wire form is UTC: the offset does not move it
        let dto = DateTimeOffset::new(DateTime2::new(tds::Date::new(day), t), 120);
        assert_eq!(
            canon(TimestampTz, 6, ColumnData::DateTimeOffset(Some(dto))),
            Some("2024-03-15T14:30:00.123456Z".into())
        );
        // datetime: days from 1900-01-01 and 1/300 s; 2 fragments show as .007
        let dt = DateTime::new(0, 300 * 3600 + 2);
        assert_eq!(
            canon(Timestamp, 3, ColumnData::DateTime(Some(dt))),
            Some("1900-01-01T01:00:00.007".into())
        );
        let before = DateTime::new(-1, 0);
        assert_eq!(
            canon(Timestamp, 0, ColumnData::DateTime(Some(before))),
            Some("1899-12-31T00:00:00".into())
        );
        let small = SmallDateTime::new(1, 61);
        assert_eq!(
            canon(Timestamp, 0, ColumnData::SmallDateTime(Some(small))),
            Some("1900-01-02T01:01:00".into())
        );
    }

    #[test]
    fn a_zoneless_timestamp_compared_with_zone_is_read_in_the_datasets_zone() {
        let mut c = col(TypeClass::TimestampTz, 0);
        c.info.class = TypeClass::Timestamp;
        c.zone = Some("+02:00".into());
        let day = (days_from_civil(2024, 3, 15) - days_from_civil(1, 1, 1)) as u32;
        let t = tds::Time::new((14 * 3600) as u64 * 10_000_000, 7);
        let d = ColumnData::DateTime2(Some(DateTime2::new(tds::Date::new(day), t)));
        assert_eq!(cell(&c, &d).unwrap(), Some("2024-03-15T12:00:00Z".into()));
    }

    #[test]
    fn values_the_class_cannot_hold_are_refused() {
        assert!(cell(&col(TypeClass::Integer, 0), &ColumnData::String(Some("x".into()))).is_err());
        assert!(cell(&col(TypeClass::Date, 0), &ColumnData::I32(Some(1))).is_err());
    }

    #[test]
    fn numeric_text_places_the_point() {
        assert_eq!(numeric_text(0, 2), "0.00");
        assert_eq!(numeric_text(-5, 3), "-0.005");
        assert_eq!(numeric_text(123, 0), "123");
        assert_eq!(numeric_text(i128::MAX, 0), i128::MAX.to_string());
    }

    #[test]
    fn urls_are_parsed_or_refused_with_the_reason() {
        let c = parse_url("mssql://sa:p%40ss@db.internal:14330/shop?encrypt=required").unwrap();
        assert_eq!(c.get_addr(), "db.internal:14330");
        for (url, why) in [
            ("mssql://db.internal/shop", "no user"),
            ("mssql://sa@db.internal/shop?encrypt=maybe", "encrypt"),
            ("mssql://sa@db.internal/shop?colour=blue", "unknown option"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
