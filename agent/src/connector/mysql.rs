//! MySQL and MariaDB through sqlx. Canonical text and checksums are computed by the
//! server; sessions run in UTC with utf8mb4.

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Column, Executor, Row, Statement, TypeInfo};
use tally_common::canonical::{DateTimeFields, FieldFormat, push_digits, push_integer};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::sqlx_conn::{self, SpanlessRows, SqlxConn};
use super::{AggRow, CONNECT_TIMEOUT, EngineConn, EngineConnector, RowBuilder, RowSink, agg_row, obey};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, Sql, mysql::MySql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo, TypeEntry};

#[derive(Clone)]
pub struct MySqlConnector {
    pub(super) pool: MySqlPool,
    pub dialect: MySql,
}

/// MySQL and MariaDB in the agent's engine list.
pub const ENGINE: super::Engine = super::Engine {
    name: "mysql",
    schemes: &["mysql", "mariadb"],
    open: |url, limits| Ok(Box::new(MySqlConnector::open(url, limits)?)),
};

/// A request's transaction. MySQL/MariaDB take the isolation level in a statement of
/// its own, for the next transaction only, and `WITH CONSISTENT SNAPSHOT` starts the
/// snapshot at once.
pub const BEGIN: &[&str] = &[
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
];

type Conn = SqlxConn<MySqlConnector, sqlx::MySql>;

#[async_trait::async_trait]
impl EngineConnector for MySqlConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>> {
        Ok(Box::new(Conn::acquire(self.clone(), &self.pool, dataset).await?))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        sqlx_conn::ping(&self.pool).await
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

sqlx_conn::sqlx_engine_conn!(MySqlConnector, sqlx::MySql);

type MyQuery<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

fn bind_all<'q>(mut q: MyQuery<'q>, binds: &'q [KeyPart]) -> MyQuery<'q> {
    for b in binds {
        q = match b {
            KeyPart::Int(i) => q.bind(*i),
            KeyPart::Text(s) => q.bind(s.as_str()),
        };
    }
    q
}

/// Text of a column whatever its character set (binary strings included).
fn get_text(row: &MySqlRow, i: usize) -> std::result::Result<Option<String>, sqlx::Error> {
    match row.try_get::<Option<String>, _>(i) {
        Ok(v) => Ok(v),
        Err(_) => {
            let b: Option<Vec<u8>> = row.try_get(i)?;
            b.map(|b| String::from_utf8(b).map_err(|e| sqlx::Error::Decode(Box::new(e))))
                .transpose()
        }
    }
}

/// [`get_text`] borrowed from the row (the fetch path: no allocation per value).
fn get_str(row: &MySqlRow, i: usize) -> std::result::Result<Option<&str>, sqlx::Error> {
    match row.try_get::<Option<&str>, _>(i) {
        Ok(v) => Ok(v),
        Err(_) => {
            let b: Option<&[u8]> = row.try_get(i)?;
            b.map(|b| std::str::from_utf8(b).map_err(|e| sqlx::Error::Decode(Box::new(e))))
                .transpose()
        }
    }
}

/// How a fetch reads one field, from the type the server sends it as. Row fetches are
/// prepared statements, so their rows come in the binary protocol: integers as 1, 2, 4
/// or 8 little-endian bytes (decoded by sqlx, which checks the format), `DATE` and
/// `DATETIME` as a length byte and their fields, `DECIMAL` as the server's text, texts
/// as their bytes. The dialect selects integer, decimal, date and datetime columns
/// bare for this (`text_expr`): the agent renders them to the text `CAST(x AS CHAR)`
/// would give, and [`RowBuilder`] makes that canonical like every engine text; a plain
/// date or datetime (years 1–9999, a time of day) goes straight to the canonical form
/// that text has ([`DateTimeFields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Text,
    /// A text whose bytes sqlx reads as text or bytes (checked once, on the first row):
    /// read as the row holds them and checked UTF-8 here, as sqlx's decode would,
    /// without its type check per value.
    Utf8,
    Int {
        unsigned: bool,
    },
    Decimal,
    Date,
    /// `fsp`: the column's fractional-second digits, where its declaration says.
    DateTime {
        fsp: Option<u32>,
    },
}

impl Wire {
    /// From sqlx's name of the result column's type (`BIGINT UNSIGNED`, `DATETIME`, …).
    fn of(type_name: &str, col: Option<&BoundColumn>) -> Wire {
        let (base, unsigned) = match type_name.strip_suffix(" UNSIGNED") {
            Some(base) => (base, true),
            None => (type_name, false),
        };
        match base {
            "TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" => Wire::Int { unsigned },
            // TINYINT(1), named BOOLEAN without its UNSIGNED flag: the declaration has it
            // (MariaDB calls it Boolean and never selects it bare; MySQL 8 may declare
            // a TINYINT(1) UNSIGNED as `tinyint unsigned`)
            "BOOLEAN" => Wire::Int {
                unsigned: col.is_some_and(|c| c.info.declared_type.to_ascii_lowercase().contains("unsigned")),
            },
            "DECIMAL" => Wire::Decimal,
            "DATE" => Wire::Date,
            "DATETIME" => Wire::DateTime {
                fsp: col.and_then(|c| c.info.scale),
            },
            _ => Wire::Text,
        }
    }

    /// The fields of a date's or datetime's binary value: `[length] year(2) month day
    /// [hour minute second [microseconds(4)]]`; length 0 is the zero date, 4 a midnight.
    fn fields(self, raw: &[u8]) -> std::result::Result<DateTimeFields, String> {
        let lengths: &[usize] = match self {
            Wire::Date => &[0, 4],
            Wire::DateTime { .. } => &[0, 4, 7, 11],
            Wire::Text | Wire::Utf8 | Wire::Decimal | Wire::Int { .. } => return Err("not a date".into()),
        };
        let (&len, fields) = raw.split_first().ok_or("an empty date")?;
        let len = len as usize;
        if !lengths.contains(&len) || fields.len() != len {
            return Err(format!("a date of {} bytes with length byte {len}", fields.len()));
        }
        let byte = |i: usize| fields.get(i).copied().unwrap_or(0);
        Ok(DateTimeFields {
            year: u16::from_le_bytes([byte(0), byte(1)]),
            month: byte(2),
            day: byte(3),
            hour: byte(4),
            minute: byte(5),
            second: byte(6),
            micros: u32::from_le_bytes([byte(7), byte(8), byte(9), byte(10)]),
        })
    }

    /// Appends a date's or datetime's text, as `CAST(x AS CHAR)` writes it, to `out`.
    fn render(self, f: &DateTimeFields, out: &mut String) {
        push_digits(out, u64::from(f.year), 4);
        for (sep, v) in [('-', f.month), ('-', f.day)] {
            out.push(sep);
            push_digits(out, u64::from(v), 2);
        }
        if let Wire::DateTime { fsp } = self {
            for (sep, v) in [(' ', f.hour), (':', f.minute), (':', f.second)] {
                out.push(sep);
                push_digits(out, u64::from(v), 2);
            }
            let micros = u64::from(f.micros);
            match fsp {
                // the column's own digits, as the cast writes them
                Some(p @ 1..=6) if micros % 10u64.pow(6 - p) == 0 => {
                    out.push('.');
                    push_digits(out, micros / 10u64.pow(6 - p), p as usize);
                }
                _ if micros == 0 => {}
                // a value finer than the declaration says: every digit it has
                _ => {
                    out.push('.');
                    push_digits(out, micros, 6);
                }
            }
        }
    }

    /// Appends the canonical form of a date's or datetime's fields where they are a
    /// plain date and time of day and the column is compared as a date or timestamp;
    /// `false` otherwise (the caller renders the text and makes that canonical).
    fn push_canonical(self, f: &DateTimeFields, format: &FieldFormat, out: &mut String) -> bool {
        match (self, format.class) {
            (Wire::Date, TypeClass::Date) => f.push_canonical_date(out),
            (Wire::DateTime { .. }, TypeClass::Timestamp) => f.push_canonical_timestamp(out, format.scale),
            _ => false,
        }
    }
}

/// A field's bytes as the row holds them, `None` only for SQL NULL. sqlx reports a
/// MySQL zero date (`0000-00-00`) as NULL; it is a value, which canonical SQL renders
/// as such, and reading it as NULL would make a zero date and a NULL compare equal.
fn raw_value(row: &MySqlRow, i: usize) -> std::result::Result<Option<&[u8]>, sqlx::Error> {
    let value = row.try_get_raw(i)?;
    // a NULL has no bytes at all (as_bytes fails); a zero date has its length byte 0
    Ok(<&[u8] as sqlx::Decode<'_, sqlx::MySql>>::decode(value).ok())
}

/// A query's column as the driver describes it: a type name without its modifiers
/// (`DECIMAL`, never `DECIMAL(12,4)`; `DATETIME`, never `DATETIME(6)`), so its scale or
/// fractional-second precision is unknown, never 0: decimals compare exact and times
/// at the undeclared precision (issue 31 F2: scale 0 let the other side's scale round
/// `1.2345` and `1.2346` alike).
fn undeclared(mut entry: TypeEntry) -> TypeEntry {
    if matches!(
        entry.class,
        TypeClass::Decimal | TypeClass::Timestamp | TypeClass::TimestampTz | TypeClass::Time
    ) {
        entry.scale = None;
    }
    entry
}

fn get_i64(row: &MySqlRow, i: usize) -> Option<i64> {
    row.try_get::<Option<i64>, _>(i)
        .ok()
        .flatten()
        .or_else(|| {
            row.try_get::<Option<u64>, _>(i)
                .ok()
                .flatten()
                .and_then(|v| i64::try_from(v).ok())
        })
        .or_else(|| row.try_get::<Option<i32>, _>(i).ok().flatten().map(i64::from))
        .or_else(|| get_text(row, i).ok().flatten().and_then(|s| s.parse().ok()))
}

impl MySqlConnector {
    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<MySqlConnector> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let opts = MySqlConnectOptions::from_str(&url)
            .map_err(|_| AgentError::Config("invalid mysql URL (expected mysql://user@host:port/db)".into()))?
            .charset("utf8mb4")
            .timezone(Some("+00:00".to_string()));
        let pool = MySqlPoolOptions::new()
            .max_connections(limits.max_connections)
            .idle_timeout(limits.idle_timeout())
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts);
        Ok(MySqlConnector { pool, dialect: MySql })
    }

    pub async fn describe(
        &self,
        conn: &mut MySqlConnection,
        dataset: &str,
        source: &Source,
    ) -> Result<DatasetInfo> {
        let db = |e| AgentError::from_db(dataset, e);
        let row = sqlx::query("SELECT VERSION(), @@character_set_results")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        let version = get_text(&row, 0).map_err(db)?.unwrap_or_default();
        // row fetches read text columns as the server sends them (dialect/mysql.rs
        // text_expr): only in utf8mb4 is that the text itself. A proxy that dropped the
        // connection's SET NAMES would hand over latin1 bytes, some of them valid UTF-8
        // of another text: refuse rather than read them
        let results = get_text(&row, 1).map_err(db)?;
        if results.as_deref() != Some("utf8mb4") {
            return Err(AgentError::Config(format!(
                "dataset {dataset}: the connection's character_set_results is {}, not utf8mb4 \
                 (the agent sets it on connect; a proxy between the agent and the server must \
                 keep SET NAMES utf8mb4)",
                results.as_deref().unwrap_or("NULL")
            )));
        }
        let mut columns = Vec::new();
        let mut row_estimate = 0;
        match source {
            Source::Table(parts) => {
                let (schema, table) = match parts.as_slice() {
                    [t] => (None, t.clone()),
                    [s, t] => (Some(s.clone()), t.clone()),
                    _ => return Err(AgentError::Config("bad table name".into())),
                };
                let rows = sqlx::query(
                    "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(IS_NULLABLE AS CHAR), \
                     CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                )
                .bind(schema.as_deref())
                .bind(&table)
                .fetch_all(&mut *conn)
                .await
                .map_err(db)?;
                let mut found = Vec::with_capacity(rows.len());
                for r in rows {
                    let name = get_text(&r, 0).map_err(db)?.unwrap_or_default();
                    let declared = get_text(&r, 1).map_err(db)?.unwrap_or_default();
                    let nullable = get_text(&r, 2).map_err(db)?.as_deref() == Some("YES");
                    let data_type = get_text(&r, 3).map_err(db)?.unwrap_or_default();
                    found.push((name, declared, nullable, data_type));
                }
                // MariaDB's JSON is LONGTEXT with a column-level json_valid check (MySQL 8
                // has a JSON type, and its CHECK_CONSTRAINTS has no TABLE_NAME)
                let mut json_checked = std::collections::HashSet::new();
                let mariadb = version.to_ascii_lowercase().contains("mariadb");
                if mariadb && found.iter().any(|c| c.3.eq_ignore_ascii_case("longtext")) {
                    let checks = sqlx::query(
                        "SELECT CAST(CHECK_CLAUSE AS CHAR) FROM information_schema.CHECK_CONSTRAINTS \
                         WHERE CONSTRAINT_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
                    )
                    .bind(schema.as_deref())
                    .bind(&table)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
                    for r in checks {
                        if let Some(clause) = get_text(&r, 0).map_err(db)? {
                            json_checked.insert(clause);
                        }
                    }
                }
                for (name, declared, nullable, data_type) in found {
                    let json = json_checked.contains(&format!("json_valid(`{}`)", name.replace('`', "``")));
                    let entry = crate::dialect::mysql::classify(&data_type, &declared, json);
                    columns.push(entry.column(name, declared, nullable));
                }
                if columns.is_empty() {
                    return Err(AgentError::Config(format!(
                        "dataset {dataset}: table {} not found",
                        parts.join(".")
                    )));
                }
                let est = sqlx::query(
                    "SELECT CAST(COALESCE(TABLE_ROWS, 0) AS SIGNED) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
                )
                .bind(schema.as_deref())
                .bind(&table)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
                row_estimate = est.and_then(|r| get_i64(&r, 0)).unwrap_or(0).max(0) as u64;
            }
            Source::Query(_) => {
                let sql = format!("SELECT * FROM {} LIMIT 0", relation(&self.dialect, source));
                let described = conn
                    .prepare(sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                    .await
                    .map_err(db)?;
                for c in described.columns() {
                    let (data_type, t) = super::mysql_query_columns::column_type(c.name(), c.type_info())
                        .map_err(|e| AgentError::Config(format!("dataset {dataset}: {e}")))?;
                    let entry = undeclared(crate::dialect::mysql::classify(&data_type, &t, false));
                    columns.push(entry.column(c.name().to_string(), t, true));
                }
            }
        }
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate,
            engine: if version.to_ascii_lowercase().contains("mariadb") {
                "mariadb"
            } else {
                "mysql"
            },
            engine_version: version,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        conn: &mut MySqlConnection,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        let db = |e| AgentError::from_db(dataset, e);
        // a prepared statement (sqlx::query always prepares): rows arrive in the binary
        // protocol, which is what `Wire` reads
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let mut rows = SpanlessRows::new(|| q.fetch(&mut *conn));
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        let mut wires: Vec<Wire> = Vec::new();
        let mut text = String::with_capacity(32);
        while let Some(row) = rows.next().await.map_err(db)? {
            if wires.is_empty() {
                wires = row
                    .columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let ty = c.type_info();
                        match Wire::of(ty.name(), cols.get(i)) {
                            Wire::Text
                                if <&str as sqlx::Type<sqlx::MySql>>::compatible(ty)
                                    || <&[u8] as sqlx::Type<sqlx::MySql>>::compatible(ty) =>
                            {
                                Wire::Utf8
                            }
                            wire => wire,
                        }
                    })
                    .collect();
            }
            b.start();
            for (i, col) in cols.iter().enumerate() {
                // `canonical`: the value was rendered in canonical form here already
                let (value, canonical) = match wires.get(i).copied().unwrap_or(Wire::Text) {
                    Wire::Text => (get_str(&row, i).map_err(db)?, false),
                    Wire::Utf8 => match raw_value(&row, i).map_err(db)? {
                        None => (None, false),
                        Some(raw) => (
                            Some(std::str::from_utf8(raw).map_err(|e| db(sqlx::Error::Decode(Box::new(e))))?),
                            false,
                        ),
                    },
                    // the server's own text of the decimal (checked UTF-8 by the decode)
                    Wire::Decimal => (row.try_get_unchecked::<Option<&str>, _>(i).map_err(db)?, false),
                    // sqlx's decode reads the value in its own format and width
                    Wire::Int { unsigned } => {
                        text.clear();
                        let present = if unsigned {
                            let v = row.try_get_unchecked::<Option<u64>, _>(i).map_err(db)?;
                            v.map(|v| push_digits(&mut text, v, 1))
                        } else {
                            let v = row.try_get_unchecked::<Option<i64>, _>(i).map_err(db)?;
                            v.map(|v| push_integer(&mut text, v))
                        };
                        (present.map(|()| text.as_str()), false)
                    }
                    wire => match raw_value(&row, i).map_err(db)? {
                        None => (None, false),
                        Some(raw) => {
                            let fields = wire.fields(raw).map_err(|reason| {
                                db(sqlx::Error::Decode(
                                    format!("column {}: {reason}", col.info.name).into(),
                                ))
                            })?;
                            text.clear();
                            // a plain date or datetime straight to its canonical form;
                            // the rest as the cast's text, made canonical like any text
                            let direct = reread.get(i).copied().unwrap_or(false)
                                && wire.push_canonical(&fields, &col.spec.format, &mut text);
                            if !direct {
                                wire.render(&fields, &mut text);
                                // a DATETIME compared as an instant: in its dataset's
                                // zone, which the reference converts to UTC for every
                                // year (no SQL does: see dialect/mysql.rs)
                                if let (Wire::DateTime { .. }, Some(zone)) = (wire, &col.zone) {
                                    text.push_str(zone);
                                }
                            }
                            (Some(text.as_str()), direct)
                        }
                    },
                };
                if canonical {
                    b.push_canonical(value)?;
                } else {
                    b.push(value)?;
                }
            }
            obey(f(b.finish()?)?).await?;
        }
        Ok(())
    }

    pub async fn count(&self, conn: &mut MySqlConnection, dataset: &str, sql: &Sql) -> Result<u64> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let row = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        super::counted(dataset, get_i64(&row, 0))
    }

    pub async fn aggregate(
        &self,
        conn: &mut MySqlConnection,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let rows = q
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        let db = |e| AgentError::from_db(dataset, e);
        rows.iter()
            .map(|r| {
                agg_row(
                    dataset,
                    key_classes,
                    |i| get_i64(r, i),
                    |i| get_text(r, i).map_err(db),
                )
            })
            .collect()
    }

    pub async fn query_text(
        &self,
        conn: &mut MySqlConnection,
        dataset: &str,
        sql: &str,
    ) -> Result<Option<String>> {
        let row = sqlx::query(AssertSqlSafe(sql.to_string()))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        get_text(&row, 0).map_err(|e| AgentError::from_db(dataset, e))
    }
}

#[cfg(test)]
mod tests {
    use super::Wire;

    fn text(wire: Wire, raw: &[u8]) -> Result<String, String> {
        let mut out = String::new();
        wire.render(&wire.fields(raw)?, &mut out);
        Ok(out)
    }

    #[test]
    fn integers_render_as_the_cast_writes_them() {
        let signed = |v| {
            let mut out = String::new();
            super::push_integer(&mut out, v);
            out
        };
        assert_eq!(signed(i64::MIN), "-9223372036854775808");
        assert_eq!(signed(i64::MAX), "9223372036854775807");
        assert_eq!(signed(-128), "-128");
        assert_eq!(signed(0), "0");
        let mut out = String::new();
        super::push_digits(&mut out, u64::MAX, 1);
        assert_eq!(out, "18446744073709551615");
    }

    #[test]
    fn dates_and_datetimes_render_as_the_cast_writes_them() {
        let dt = |fsp| Wire::DateTime { fsp };
        let full = [11, 0xe8, 0x07, 3, 15, 14, 30, 5, 0x40, 0xe2, 0x01, 0x00]; // 123456 µs
        assert_eq!(text(dt(Some(6)), &full).unwrap(), "2024-03-15 14:30:05.123456");
        assert_eq!(text(dt(None), &full).unwrap(), "2024-03-15 14:30:05.123456");
        // finer than declared: every digit kept, never cut
        assert_eq!(text(dt(Some(3)), &full).unwrap(), "2024-03-15 14:30:05.123456");
        let milli = [11, 0xe8, 0x07, 3, 15, 14, 30, 5, 0x20, 0xa1, 0x07, 0x00]; // 500000 µs
        assert_eq!(text(dt(Some(3)), &milli).unwrap(), "2024-03-15 14:30:05.500");
        assert_eq!(text(dt(Some(1)), &milli).unwrap(), "2024-03-15 14:30:05.5");
        // no microseconds on the wire: the declared digits as zeros, as the cast writes
        let secs = [7, 0xe8, 0x07, 3, 15, 14, 30, 5];
        assert_eq!(text(dt(Some(6)), &secs).unwrap(), "2024-03-15 14:30:05.000000");
        assert_eq!(text(dt(Some(0)), &secs).unwrap(), "2024-03-15 14:30:05");
        assert_eq!(text(dt(None), &secs).unwrap(), "2024-03-15 14:30:05");
        assert_eq!(
            text(dt(Some(0)), &[4, 0xe8, 0x07, 1, 9]).unwrap(),
            "2024-01-09 00:00:00"
        );
        assert_eq!(text(dt(Some(2)), &[0]).unwrap(), "0000-00-00 00:00:00.00");
        assert_eq!(text(Wire::Date, &[4, 0x01, 0x00, 12, 31]).unwrap(), "0001-12-31");
        assert_eq!(text(Wire::Date, &[0]).unwrap(), "0000-00-00");
        assert!(text(Wire::Date, &[5, 1, 2, 3, 4, 5]).is_err());
        assert!(text(Wire::Date, &[4, 1, 2]).is_err());
        // a DATE never carries a time
        assert!(text(Wire::Date, &[7, 0xe8, 0x07, 3, 15, 14, 30, 5]).is_err());
        assert!(text(Wire::Int { unsigned: false }, &[1]).is_err());
        assert!(text(Wire::Date, &[]).is_err());
    }

    #[test]
    fn plain_dates_and_datetimes_go_straight_to_their_canonical_form() {
        use tally_common::canonical::{FieldFormat, canonical_from_text};
        use tally_common::types::TypeClass;
        let direct = |wire: Wire, raw: &[u8], format: &FieldFormat| {
            let mut out = String::new();
            wire.push_canonical(&wire.fields(raw).unwrap(), format, &mut out)
                .then_some(out)
        };
        let ts = |p| FieldFormat::new(TypeClass::Timestamp).with_scale(p);
        let milli = [11, 0xe8, 0x07, 3, 15, 14, 30, 5, 0x20, 0xa1, 0x07, 0x00]; // 500000 µs
        for (wire, p) in [
            (Wire::DateTime { fsp: Some(3) }, 6),
            (Wire::DateTime { fsp: None }, 1),
        ] {
            let via_text = canonical_from_text(&ts(p), Some(&text(wire, &milli).unwrap())).unwrap();
            assert_eq!(direct(wire, &milli, &ts(p)), via_text);
        }
        assert_eq!(
            direct(Wire::DateTime { fsp: Some(3) }, &milli, &ts(6)).as_deref(),
            Some("2024-03-15T14:30:05.500000")
        );
        let date = [4, 0xe8, 0x07, 2, 29];
        assert_eq!(
            direct(Wire::Date, &date, &FieldFormat::new(TypeClass::Date)).as_deref(),
            Some("2024-02-29")
        );
        // zero dates, and columns compared as another class, take the text path
        assert_eq!(direct(Wire::Date, &[0], &FieldFormat::new(TypeClass::Date)), None);
        assert_eq!(direct(Wire::DateTime { fsp: Some(6) }, &[0], &ts(6)), None);
        assert_eq!(direct(Wire::Date, &date, &ts(0)), None);
        let tz = FieldFormat::new(TypeClass::TimestampTz);
        assert_eq!(direct(Wire::DateTime { fsp: None }, &milli, &tz), None);
    }

    proptest::proptest! {
        // the direct rendering of any binary date or datetime is the canonical form of
        // the text the cast writes for it, for every declared fsp and compared precision
        #[test]
        fn direct_canonical_dates_equal_the_casts_text_made_canonical(
            year in proptest::prop_oneof![0u16..=2, 1u16..=9999, 9999u16..=10000],
            month in 0u8..=13,
            day in 0u8..=32,
            clock in (0u8..=24, 0u8..=60, 0u8..=60),
            micros in proptest::prop_oneof![0u32..=999_999, proptest::strategy::Just(500_000u32), 999_999u32..=1_000_001],
            len in proptest::sample::select(vec![0u8, 4, 7, 11]),
            fsp in proptest::option::of(0u32..=7),
            scale in 0u32..=10,
            as_date in proptest::bool::ANY,
        ) {
            use tally_common::canonical::{FieldFormat, canonical_from_text};
            use tally_common::types::TypeClass;
            let (wire, class, len) = if as_date {
                (Wire::Date, TypeClass::Date, len.min(4))
            } else {
                (Wire::DateTime { fsp }, TypeClass::Timestamp, len)
            };
            let [y0, y1] = year.to_le_bytes();
            let mut raw = vec![len, y0, y1, month, day, clock.0, clock.1, clock.2];
            raw.extend(micros.to_le_bytes());
            raw.truncate(usize::from(len) + 1);
            let format = FieldFormat::new(class).with_scale(scale);
            let fields = wire.fields(&raw).unwrap();
            let mut direct = String::new();
            if wire.push_canonical(&fields, &format, &mut direct) {
                let mut cast = String::new();
                wire.render(&fields, &mut cast);
                let via_text = canonical_from_text(&format, Some(&cast)).map_err(|e| e.to_string());
                proptest::prop_assert_eq!(Ok(Some(direct)), via_text, "{:?}", cast);
            } else {
                proptest::prop_assert!(direct.is_empty());
            }
        }
    }

    #[test]
    fn the_wire_follows_the_result_columns_type() {
        assert_eq!(Wire::of("BIGINT UNSIGNED", None), Wire::Int { unsigned: true });
        assert_eq!(Wire::of("MEDIUMINT", None), Wire::Int { unsigned: false });
        assert_eq!(Wire::of("BOOLEAN", None), Wire::Int { unsigned: false });
        assert_eq!(Wire::of("DECIMAL", None), Wire::Decimal);
        assert_eq!(Wire::of("DATETIME", None), Wire::DateTime { fsp: None });
        for text in ["VARCHAR", "TEXT", "YEAR", "TIMESTAMP", "TIME", "BLOB"] {
            assert_eq!(Wire::of(text, None), Wire::Text, "{text}");
        }
    }
}
