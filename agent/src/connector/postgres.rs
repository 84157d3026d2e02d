//! PostgreSQL through sqlx. Canonical text and checksums are computed by the server.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Column, Executor, Row, Statement, TypeInfo};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::{AggRow, CONNECT_TIMEOUT, CanonRow, agg_row, canonical_row};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Sql, postgres::Postgres, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, ColumnInfo, DatasetInfo, classify_declared};

pub struct PgConnector {
    pool: PgPool,
    /// Cleared by `describe` on servers before PostgreSQL 14, which have no `bit_xor`.
    has_bit_xor: AtomicBool,
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind_all<'q>(mut q: PgQuery<'q>, binds: &'q [KeyPart]) -> PgQuery<'q> {
    for b in binds {
        q = match b {
            KeyPart::Int(i) => q.bind(*i),
            KeyPart::Text(s) => q.bind(s.as_str()),
        };
    }
    q
}

/// An integer column of any width, or its text.
fn get_i64(row: &PgRow, i: usize) -> Option<i64> {
    row.try_get::<Option<i64>, _>(i)
        .ok()
        .flatten()
        .or_else(|| row.try_get::<Option<i32>, _>(i).ok().flatten().map(i64::from))
        .or_else(|| row.try_get::<Option<i16>, _>(i).ok().flatten().map(i64::from))
        .or_else(|| {
            row.try_get::<Option<String>, _>(i)
                .ok()
                .flatten()
                .and_then(|s| s.parse().ok())
        })
}

impl PgConnector {
    /// The dialect of the server as last described (every request describes first).
    pub fn dialect(&self) -> &'static Postgres {
        static WITH_XOR: Postgres = Postgres { has_bit_xor: true };
        static SUM_ONLY: Postgres = Postgres { has_bit_xor: false };
        if self.has_bit_xor.load(Ordering::Relaxed) {
            &WITH_XOR
        } else {
            &SUM_ONLY
        }
    }

    /// Connects once outside the pool (see [`super::Connector::ping`]).
    pub async fn ping(&self) -> std::result::Result<(), sqlx::Error> {
        super::connect_once(&self.pool).await
    }

    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<PgConnector> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|_| {
                AgentError::Config("invalid postgres URL (expected postgres://user@host:port/db)".into())
            })?
            .application_name("tally-agent")
            .options([
                ("extra_float_digits", "1"),
                ("DateStyle", "ISO"),
                // COPY statements carry key bounds as literals: backslashes stay literal
                ("standard_conforming_strings", "on"),
                ("TimeZone", "UTC"),
                ("client_encoding", "UTF8"),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(limits.max_connections)
            .idle_timeout(limits.idle_timeout())
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts);
        Ok(PgConnector {
            pool,
            has_bit_xor: AtomicBool::new(true),
        })
    }

    pub async fn describe(&self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        let db = |e| AgentError::from_db(dataset, e);
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&self.pool)
            .await
            .map_err(db)?;
        let encoding: String = sqlx::query_scalar("SHOW server_encoding")
            .fetch_one(&self.pool)
            .await
            .map_err(db)?;
        if encoding != "UTF8" {
            return Err(AgentError::Unsupported(format!(
                "dataset {dataset}: server_encoding is {encoding}; only UTF8 databases hash identically"
            )));
        }
        let mut columns = Vec::new();
        let mut row_estimate = 0;
        match source {
            Source::Table(parts) => {
                let rel = relation(self.dialect(), source);
                let rows = sqlx::query(
                    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull \
                     FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped \
                     ORDER BY a.attnum",
                )
                .bind(&rel)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| match &e {
                    sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => {
                        AgentError::Config(format!("dataset {dataset}: table {} not found", parts.join(".")))
                    }
                    _ => AgentError::from_db(dataset, e),
                })?;
                for r in rows {
                    let (name, declared, nullable): (String, String, bool) = (
                        r.try_get(0).map_err(db)?,
                        r.try_get(1).map_err(db)?,
                        r.try_get(2).map_err(db)?,
                    );
                    columns.push(column_info(name, declared, nullable));
                }
                let est: f32 = sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = $1::regclass")
                    .bind(&rel)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db)?;
                row_estimate = est.max(0.0) as u64;
            }
            Source::Query(_) => {
                let sql = format!("SELECT * FROM {} LIMIT 0", relation(self.dialect(), source));
                let described = (&self.pool)
                    .prepare(sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                    .await
                    .map_err(db)?;
                for c in described.columns() {
                    columns.push(column_info(
                        c.name().to_string(),
                        c.type_info().name().to_ascii_lowercase(),
                        true,
                    ));
                }
            }
        }
        let major: u32 = version
            .split(['.', ' '])
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        self.has_bit_xor.store(major >= 14, Ordering::Relaxed);
        if major < 14 {
            tracing::info!(
                dataset,
                version,
                "no bit_xor before PostgreSQL 14: comparing SUM only"
            );
        }
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate,
            engine: "postgres",
            engine_version: version,
        })
    }

    pub async fn scan(
        &self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        if sql.binds.is_empty() {
            return self.scan_copy(dataset, &sql.text, cols, key_len, reread, f).await;
        }
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let mut rows = q.fetch(&self.pool);
        while let Some(row) = rows
            .try_next()
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?
        {
            let fields = (0..cols.len())
                .map(|i| row.try_get::<Option<String>, _>(i))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| AgentError::from_db(dataset, e))?;
            f(canonical_row(dataset, fields, cols, key_len, reread)?)?;
        }
        Ok(())
    }

    /// Streams a bind-free SELECT through `COPY (...) TO STDOUT` in text format: one
    /// protocol message per row and no per-column decoding in the driver, about twice
    /// as fast as a row fetch (docs/performance.md).
    async fn scan_copy(
        &self,
        dataset: &str,
        select: &str,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let db = |e| AgentError::from_db(dataset, e);
        let mut conn = self.pool.acquire().await.map_err(db)?;
        let result = async {
            let mut stream = conn
                .copy_out_raw(&format!("COPY ({select}) TO STDOUT"))
                .await
                .map_err(db)?;
            let mut pending: Vec<u8> = Vec::new();
            while let Some(chunk) = stream.try_next().await.map_err(db)? {
                pending.extend_from_slice(&chunk);
                let mut start = 0;
                while let Some(n) = pending[start..].iter().position(|&b| b == b'\n') {
                    let fields = copy_fields(dataset, &pending[start..start + n], cols.len())?;
                    f(canonical_row(dataset, fields, cols, key_len, reread)?)?;
                    start += n + 1;
                }
                pending.drain(..start);
            }
            if pending.is_empty() {
                Ok(())
            } else {
                Err(copy_error(dataset))
            }
        }
        .await;
        if result.is_err() {
            // a COPY stopped early leaves the rest of its rows on the connection
            let _ = conn.close().await;
        }
        result
    }

    pub async fn count(&self, dataset: &str, sql: &Sql) -> Result<u64> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let row = q
            .fetch_one(&self.pool)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        Ok(get_i64(&row, 0).unwrap_or(0).max(0) as u64)
    }

    pub async fn aggregate(
        &self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let rows = q
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        rows.iter()
            .map(|r| {
                let text = |i| {
                    r.try_get::<Option<String>, _>(i)
                        .map_err(|e| AgentError::from_db(dataset, e))
                };
                agg_row(dataset, key_classes, |i| get_i64(r, i), text)
            })
            .collect()
    }

    pub async fn query_text(&self, dataset: &str, sql: &str) -> Result<Option<String>> {
        sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.to_string()))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))
    }
}

fn copy_error(dataset: &str) -> AgentError {
    AgentError::Query {
        dataset: dataset.to_string(),
        kind: "malformed COPY row",
    }
}

/// The fields of one line of COPY text format: tab-separated, `\N` for NULL, and
/// backslash escapes for backslash and control characters.
fn copy_fields(dataset: &str, line: &[u8], n: usize) -> Result<Vec<Option<String>>> {
    let mut out = Vec::with_capacity(n);
    for raw in line.split(|&b| b == b'\t') {
        if raw == b"\\N" {
            out.push(None);
            continue;
        }
        let bytes = if raw.contains(&b'\\') {
            let mut v = Vec::with_capacity(raw.len());
            let mut it = raw.iter().copied();
            while let Some(b) = it.next() {
                if b != b'\\' {
                    v.push(b);
                    continue;
                }
                v.push(match it.next().ok_or_else(|| copy_error(dataset))? {
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'v' => 0x0b,
                    // COPY writes only the escapes above; any other escaped byte is itself
                    other => other,
                });
            }
            v
        } else {
            raw.to_vec()
        };
        out.push(Some(String::from_utf8(bytes).map_err(|_| copy_error(dataset))?));
    }
    if out.len() != n {
        return Err(copy_error(dataset));
    }
    Ok(out)
}

fn column_info(name: String, declared: String, nullable: bool) -> ColumnInfo {
    let (class, scale, fixed_char) = classify_declared(&declared);
    let scale = match class {
        // PostgreSQL's default fractional precision is microseconds
        TypeClass::Timestamp | TypeClass::TimestampTz | TypeClass::Time => Some(scale.unwrap_or(6)),
        TypeClass::Decimal if !declared.contains('(') => None,
        _ => scale,
    };
    ColumnInfo {
        name,
        class,
        declared_type: declared,
        nullable,
        scale,
        fixed_char,
    }
}

#[cfg(test)]
mod tests {
    use super::copy_fields;

    #[test]
    fn copy_text_fields_unescape_and_keep_null_apart_from_its_text() {
        // a NULL, the two-character text \N, a tab, a newline, a backslash, UTF-8
        let line = b"\\N\t\\\\N\ta\\tb\tx\\ny\tc:\\\\d\tZo\xc3\xab";
        let got = copy_fields("t", line, 6).unwrap();
        let want: Vec<Option<String>> = vec![
            None,
            Some("\\N".into()),
            Some("a\tb".into()),
            Some("x\ny".into()),
            Some("c:\\d".into()),
            Some("Zoë".into()),
        ];
        assert_eq!(got, want);
        assert!(copy_fields("t", b"1\t2", 3).is_err(), "a short row is an error");
        assert!(
            copy_fields("t", b"a\\", 1).is_err(),
            "a dangling escape is an error"
        );
    }
}
