//! PostgreSQL through sqlx. Canonical text and checksums are computed by the server.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Column, Executor, Row, Statement, TypeInfo};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::sqlx_conn::{self, SpanlessRows, SqlxConn};
use super::{AggRow, CONNECT_TIMEOUT, EngineConn, EngineConnector, RowBuilder, RowSink, agg_row, obey};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, Sql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

#[derive(Clone)]
pub struct PgConnector {
    pub(super) pool: PgPool,
}

/// PostgreSQL in the agent's engine list.
pub const ENGINE: super::Engine = super::Engine {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    open: |url, limits| Ok(Box::new(PgConnector::open(url, limits)?)),
};

/// A request's transaction: read-only and REPEATABLE READ, one snapshot for every
/// statement of the request (DESIGN §5).
pub const BEGIN: &[&str] = &["BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"];

type Conn = SqlxConn<PgConnector, sqlx::Postgres>;

#[async_trait::async_trait]
impl EngineConnector for PgConnector {
    fn dialect(&self) -> &dyn Dialect {
        crate::dialect::postgres::for_version("14")
    }

    fn dialect_for(&self, info: &DatasetInfo) -> &dyn Dialect {
        crate::dialect::postgres::for_version(&info.engine_version)
    }

    fn copies_out(&self) -> bool {
        true
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

sqlx_conn::sqlx_engine_conn!(PgConnector, sqlx::Postgres);

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

/// The settings every agent session runs with: the output texts the agent re-reads
/// (shortest round-trip floats, ISO dates, UTC) depend on them.
pub const SESSION_SETTINGS: [(&str, &str); 5] = [
    ("extra_float_digits", "1"),
    ("DateStyle", "ISO"),
    // COPY statements carry key bounds as literals: backslashes stay literal
    ("standard_conforming_strings", "on"),
    ("TimeZone", "UTC"),
    ("client_encoding", "UTF8"),
];

impl PgConnector {
    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<PgConnector> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|_| {
                AgentError::Config("invalid postgres URL (expected postgres://user@host:port/db)".into())
            })?
            .application_name("tally-agent")
            .options(SESSION_SETTINGS);
        let pool = PgPoolOptions::new()
            .max_connections(limits.max_connections)
            .idle_timeout(limits.idle_timeout())
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts);
        Ok(PgConnector { pool })
    }

    pub async fn describe(
        &self,
        conn: &mut PgConnection,
        dataset: &str,
        source: &Source,
    ) -> Result<DatasetInfo> {
        let db = |e| AgentError::from_db(dataset, e);
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        let encoding: String = sqlx::query_scalar("SHOW server_encoding")
            .fetch_one(&mut *conn)
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
                let rel = relation(crate::dialect::postgres::for_version("14"), source);
                // the type's kind, and for a domain its base type: the type table
                // classifies by these, never by a substring of the name
                let rows = sqlx::query(
                    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, \
                     t.typtype::text, format_type(t.typbasetype, t.typtypmod), bt.typtype::text \
                     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
                     LEFT JOIN pg_type bt ON bt.oid = t.typbasetype \
                     WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped \
                     ORDER BY a.attnum",
                )
                .bind(&rel)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| match &e {
                    sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => {
                        AgentError::Config(format!("dataset {dataset}: table {} not found", parts.join(".")))
                    }
                    _ => AgentError::from_db(dataset, e),
                })?;
                for r in rows {
                    let (name, declared, nullable, typtype): (String, String, bool, String) = (
                        r.try_get(0).map_err(db)?,
                        r.try_get(1).map_err(db)?,
                        r.try_get(2).map_err(db)?,
                        r.try_get(3).map_err(db)?,
                    );
                    let base: Option<String> = r.try_get(4).map_err(db)?;
                    let base_typtype: Option<String> = r.try_get(5).map_err(db)?;
                    let domain = base.as_deref().zip(base_typtype.as_deref());
                    let entry = crate::dialect::postgres::classify(&declared, &typtype, domain);
                    columns.push(entry.column(name, declared, nullable));
                }
                let est: f32 = sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = $1::regclass")
                    .bind(&rel)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db)?;
                row_estimate = est.max(0.0) as u64;
            }
            Source::Query(_) => {
                let sql = format!(
                    "SELECT * FROM {} LIMIT 0",
                    relation(crate::dialect::postgres::for_version("14"), source)
                );
                let described = conn
                    .prepare(sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                    .await
                    .map_err(db)?;
                // a query's columns carry no type modifiers: decimals compare exactly
                for c in described.columns() {
                    let declared = c.type_info().name().to_ascii_lowercase();
                    let entry = crate::dialect::postgres::classify(&declared, "", None);
                    columns.push(entry.column(c.name().to_string(), declared, true));
                }
            }
        }
        if !crate::dialect::postgres::for_version(&version).has_bit_xor {
            tracing::debug!(
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

    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        conn: &mut PgConnection,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        if sql.binds.is_empty() {
            return self
                .scan_copy(conn, dataset, &sql.text, cols, key_len, reread, f)
                .await;
        }
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let mut rows = SpanlessRows::new(|| q.fetch(&mut *conn));
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        while let Some(row) = rows.next().await.map_err(|e| AgentError::from_db(dataset, e))? {
            b.start();
            for i in 0..cols.len() {
                let v = row
                    .try_get::<Option<&str>, _>(i)
                    .map_err(|e| AgentError::from_db(dataset, e))?;
                b.push(v)?;
            }
            obey(f(b.finish()?)?).await?;
        }
        Ok(())
    }

    /// Streams a bind-free SELECT through `COPY (...) TO STDOUT` in text format: one
    /// protocol message per row and no per-column decoding in the driver, about twice
    /// as fast as a row fetch (docs/performance.md). A COPY stopped early leaves the
    /// rest of its rows on the connection: its lease then closes it (never returns it
    /// to the pool), also when the call is cancelled and this future dropped.
    #[allow(clippy::too_many_arguments)]
    async fn scan_copy(
        &self,
        conn: &mut PgConnection,
        dataset: &str,
        select: &str,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        let db = |e| AgentError::from_db(dataset, e);
        // made under no tracing span: the stream yields one message per row
        let mut rows = SpanlessRows::made_by(conn.copy_out_raw(&format!("COPY ({select}) TO STDOUT")))
            .await
            .map_err(db)?;
        let mut lines = CopyLines::default();
        let mut scratch = Vec::new();
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        while let Some(chunk) = rows.next().await.map_err(db)? {
            lines.feed(chunk);
            while let Some(line) = lines.next_line() {
                b.start();
                copy_fields(dataset, line, cols.len(), &mut scratch, &mut |v| b.push(v))?;
                obey(f(b.finish()?)?).await?;
            }
        }
        if lines.pending.is_empty() {
            Ok(())
        } else {
            Err(copy_error(dataset))
        }
    }

    pub async fn count(&self, conn: &mut PgConnection, dataset: &str, sql: &Sql) -> Result<u64> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let row = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        super::counted(dataset, get_i64(&row, 0))
    }

    pub async fn aggregate(
        &self,
        conn: &mut PgConnection,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let rows = q
            .fetch_all(&mut *conn)
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

    pub async fn query_text(
        &self,
        conn: &mut PgConnection,
        dataset: &str,
        sql: &str,
    ) -> Result<Option<String>> {
        sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.to_string()))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))
    }
}

/// COPY output cut into lines across its messages. PostgreSQL sends one line per
/// message, but the protocol does not promise it: a message's unfinished last line is
/// kept until the rest arrives. Where nothing is kept (always, in practice) a message
/// is cut where it lies, not copied.
#[derive(Default)]
struct CopyLines<B> {
    /// What earlier messages left unfinished (and, when `carried`, the message after it).
    pending: Vec<u8>,
    /// The message being cut, when nothing was pending before it.
    chunk: B,
    carried: bool,
    /// Where the next line starts in the bytes being cut.
    pos: usize,
}

impl<B: AsRef<[u8]> + Default> CopyLines<B> {
    /// Takes the next message, after every line of the last one was taken.
    fn feed(&mut self, chunk: B) {
        self.carried = !self.pending.is_empty();
        if self.carried {
            self.pending.extend_from_slice(chunk.as_ref());
            self.chunk = B::default();
        } else {
            self.chunk = chunk;
        }
        self.pos = 0;
    }

    /// The next complete line (without its newline); at the message's end, `None`,
    /// keeping its unfinished last line for the next message.
    fn next_line(&mut self) -> Option<&[u8]> {
        let data = if self.carried {
            &self.pending[..]
        } else {
            self.chunk.as_ref()
        };
        let start = self.pos;
        match memchr::memchr(b'\n', &data[start..]) {
            Some(n) => {
                self.pos = start + n + 1;
                let data = if self.carried {
                    &self.pending[..]
                } else {
                    self.chunk.as_ref()
                };
                Some(&data[start..start + n])
            }
            None => {
                if self.carried {
                    self.pending.drain(..start);
                } else {
                    self.pending.extend_from_slice(&self.chunk.as_ref()[start..]);
                }
                self.chunk = B::default();
                (self.carried, self.pos) = (true, 0);
                None
            }
        }
    }
}

fn copy_error(dataset: &str) -> AgentError {
    AgentError::Query {
        dataset: dataset.to_string(),
        kind: "malformed COPY row",
    }
}

/// Hands each field of one line of COPY text format to `push`: tab-separated, `\N` for
/// NULL, and backslash escapes for backslash and control characters (unescaped through
/// `scratch`). A line of other than `n` fields is an error.
fn copy_fields(
    dataset: &str,
    line: &[u8],
    n: usize,
    scratch: &mut Vec<u8>,
    push: &mut dyn FnMut(Option<&str>) -> Result<()>,
) -> Result<()> {
    // one UTF-8 check for the line: its fields, cut at ASCII tabs, are then UTF-8 too
    let line = std::str::from_utf8(line).map_err(|_| copy_error(dataset))?;
    let mut seen = 0;
    let mut field = |raw: &str, escaped: bool| -> Result<()> {
        seen += 1;
        if seen > n {
            return Err(copy_error(dataset));
        }
        if raw == "\\N" {
            return push(None);
        }
        if !escaped {
            return push(Some(raw));
        }
        scratch.clear();
        let mut it = raw.bytes();
        while let Some(b) = it.next() {
            if b != b'\\' {
                scratch.push(b);
                continue;
            }
            scratch.push(match it.next().ok_or_else(|| copy_error(dataset))? {
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
        push(Some(
            std::str::from_utf8(scratch).map_err(|_| copy_error(dataset))?,
        ))
    };
    // one pass over the bytes: a field ends at a tab (COPY writes a tab in a value as
    // `\t`) or the line's end, and is unescaped only if it holds a backslash (fields
    // are short: a plain loop is faster here than a vectorised search per field)
    let bytes = line.as_bytes();
    let (mut start, mut escaped) = (0, false);
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\\' {
            escaped = true;
        } else if b == b'\t' {
            field(&line[start..i], escaped)?;
            (start, escaped) = (i + 1, false);
        }
    }
    field(&line[start..], escaped)?;
    if seen != n {
        return Err(copy_error(dataset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{CopyLines, copy_fields};

    #[test]
    fn copy_text_fields_unescape_and_keep_null_apart_from_its_text() {
        // a NULL, the two-character text \N, a tab, a newline, a backslash, UTF-8
        let line = b"\\N\t\\\\N\ta\\tb\tx\\ny\tc:\\\\d\tZo\xc3\xab";
        let fields = |line: &[u8], n| {
            let mut out: Vec<Option<String>> = Vec::new();
            copy_fields("t", line, n, &mut Vec::new(), &mut |f| {
                out.push(f.map(str::to_string));
                Ok(())
            })
            .map(|()| out)
        };
        let got = fields(line, 6).unwrap();
        let want: Vec<Option<String>> = vec![
            None,
            Some("\\N".into()),
            Some("a\tb".into()),
            Some("x\ny".into()),
            Some("c:\\d".into()),
            Some("Zoë".into()),
        ];
        assert_eq!(got, want);
        assert!(fields(b"1\t2", 3).is_err(), "a short row is an error");
        assert!(fields(b"1\t2\t3", 2).is_err(), "a long row is an error");
        assert!(fields(b"a\\", 1).is_err(), "a dangling escape is an error");
        assert!(
            fields(b"1\t\xc3", 2).is_err(),
            "bytes that are not UTF-8 are an error"
        );
        assert!(fields(b"1\t\\\xff", 2).is_err(), "escaped or not");
        // empty fields at either end and between, an escaped field before plain ones
        let texts = |v: &[&str]| v.iter().map(|t| Some(t.to_string())).collect::<Vec<_>>();
        assert_eq!(fields(b"", 1).unwrap(), texts(&[""]));
        assert_eq!(fields(b"\t", 2).unwrap(), texts(&["", ""]));
        assert_eq!(fields(b"a\t\tb\t", 4).unwrap(), texts(&["a", "", "b", ""]));
        assert_eq!(
            fields(b"x\\ty\tz\t\\\\\tw", 4).unwrap(),
            texts(&["x\ty", "z", "\\", "w"])
        );
        assert!(fields(b"a\t\tb\t", 3).is_err(), "a trailing tab is a field");
    }

    /// COPY output split across messages anywhere, even inside a UTF-8 character or
    /// between a line and its newline, gives the same lines as in one message.
    #[test]
    fn copy_lines_join_lines_split_across_messages() {
        let out = "1\tZo\u{eb}\n22\t\\N\n\n333\tx\\ty\n".as_bytes();
        let lines = |chunks: &[&[u8]]| {
            // the calls scan_copy makes
            let mut lines = CopyLines::default();
            let mut got: Vec<Vec<u8>> = Vec::new();
            for chunk in chunks {
                lines.feed(chunk.to_vec());
                while let Some(line) = lines.next_line() {
                    got.push(line.to_vec());
                }
                assert!(lines.next_line().is_none(), "a message's end stays its end");
            }
            (got, lines.pending)
        };
        let (whole, rest) = lines(&[out]);
        assert_eq!(whole.len(), 4);
        assert!(rest.is_empty());
        for a in 0..=out.len() {
            for b in a..=out.len() {
                let (got, rest) = lines(&[&out[..a], &out[a..b], &out[b..]]);
                assert_eq!(got, whole, "split at {a} and {b}");
                assert!(rest.is_empty());
            }
        }
        // an unfinished last line is left over (scan_copy reports it malformed)
        let (got, rest) = lines(&[b"1\tx\n2\t", b"y"]);
        assert_eq!(got, vec![b"1\tx".to_vec()]);
        assert_eq!(rest, b"2\ty".to_vec());
    }
}
