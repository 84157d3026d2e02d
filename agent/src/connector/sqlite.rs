//! SQLite through sqlx: raw values decoded by storage class and rendered in Rust.

use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{AssertSqlSafe, Column, Row, Statement, TypeInfo, ValueRef};
use tally_common::canonical::{Value, canonical_value};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::sqlx_conn::{self, SpanlessRows, SqlxConn};
use super::{CONNECT_TIMEOUT, CanonRow, EngineConn, EngineConnector, RowSink, key_into, obey};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, FetchShape, Sql, relation, sqlite::Sqlite};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, ColumnInfo, DatasetInfo, canonical_error};

#[derive(Clone)]
pub struct SqliteConnector {
    pub(super) pool: SqlitePool,
    pub dialect: Sqlite,
}

/// SQLite in the agent's engine list.
pub const ENGINE: super::Engine = super::Engine {
    name: "sqlite",
    schemes: &["sqlite"],
    open: |url, limits| Ok(Box::new(SqliteConnector::open(url, limits)?)),
};

/// A request's transaction: SQLite (opened read-only) has one isolation level, and a
/// transaction's reads see one state of the file.
pub const BEGIN: &[&str] = &["BEGIN DEFERRED"];

type Conn = SqlxConn<SqliteConnector, sqlx::Sqlite>;

#[async_trait::async_trait]
impl EngineConnector for SqliteConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    /// Rows are decoded from their storage classes in the agent.
    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Raw
    }

    fn supports_pushdown(&self) -> bool {
        false
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

sqlx_conn::sqlx_engine_conn!(SqliteConnector, sqlx::Sqlite);

fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    binds: &'q [KeyPart],
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    for b in binds {
        q = match b {
            KeyPart::Int(i) => q.bind(*i),
            KeyPart::Text(s) => q.bind(s.as_str()),
        };
    }
    q
}

impl SqliteConnector {
    pub fn open(url: &str, limits: &ConnectionsConfig) -> Result<SqliteConnector> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(|_| {
                AgentError::Config("invalid sqlite URL (expected sqlite:///path/to/file.db)".into())
            })?
            .read_only(true)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(limits.max_connections)
            .idle_timeout(limits.idle_timeout())
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts);
        Ok(SqliteConnector {
            pool,
            dialect: Sqlite,
        })
    }

    pub async fn describe(
        &self,
        conn: &mut SqliteConnection,
        dataset: &str,
        source: &Source,
    ) -> Result<DatasetInfo> {
        let db = |e| AgentError::from_db(dataset, e);
        let mut columns = Vec::new();
        match source {
            Source::Table(parts) => {
                let (schema, table) = match parts.as_slice() {
                    [t] => ("main", t.as_str()),
                    [s, t] => (s.as_str(), t.as_str()),
                    _ => return Err(AgentError::Config("bad table name".into())),
                };
                let sql = format!(
                    "PRAGMA {}.table_info({})",
                    self.dialect_quote(schema),
                    self.dialect_quote(table)
                );
                let rows = sqlx::query(AssertSqlSafe(sql))
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
                for r in rows {
                    let name: String = r.try_get("name").map_err(db)?;
                    let declared: String = r.try_get("type").map_err(db)?;
                    let notnull: i64 = r.try_get("notnull").map_err(db)?;
                    let pk: i64 = r.try_get("pk").map_err(db)?;
                    columns.push(column_info(name, declared, notnull == 0 && pk == 0));
                }
                if columns.is_empty() {
                    return Err(AgentError::Config(format!(
                        "dataset {dataset}: table {} not found",
                        parts.join(".")
                    )));
                }
            }
            Source::Query(_) => {
                let sql = format!("SELECT * FROM {} LIMIT 0", relation(&self.dialect, source));
                let described =
                    sqlx::Executor::prepare(&mut *conn, sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(sql)))
                        .await
                        .map_err(db)?;
                // the driver names only the types it maps itself (a DECIMAL(12,4) or a
                // UUID comes back as NULL, a CHAR(5) as TEXT): a column of a table is
                // classified by the type its table declares, as a table dataset's is
                let origins: Vec<(String, sqlx::ColumnOrigin)> = described
                    .columns()
                    .iter()
                    .map(|c| (c.name().to_string(), c.origin()))
                    .collect();
                for (name, origin) in origins {
                    let declared = match origin.table_column() {
                        Some(t) => declared_type(&mut *conn, &t.table, &t.name).await.map_err(db)?,
                        None => None,
                    };
                    columns.push(match declared {
                        Some(d) => column_info(name, d, true),
                        // SQLite declares no type for an expression (a CAST included)
                        // and its values may hold any storage class: never guessed
                        None => ColumnInfo {
                            declared_type: NO_DECLARED_TYPE.into(),
                            ..column_info(name, String::new(), true)
                        },
                    });
                }
            }
        }
        // max(rowid) is an index lookup, never a scan; queries have no estimate
        let row_estimate = match source {
            Source::Table(_) => {
                let sql = format!(
                    "SELECT COALESCE(MAX(rowid), 0) FROM {}",
                    relation(&self.dialect, source)
                );
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap_or(0)
                    .max(0) as u64
            }
            Source::Query(_) => 0,
        };
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate,
            engine: "sqlite",
            engine_version: version,
        })
    }

    fn dialect_quote(&self, s: &str) -> String {
        use crate::dialect::Dialect;
        self.dialect.quote(s)
    }

    /// Raw values are decoded by storage class: no field is re-read (`_reread`).
    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        conn: &mut SqliteConnection,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        _reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let mut rows = SpanlessRows::new(|| q.fetch(&mut *conn));
        while let Some(row) = rows.next().await.map_err(|e| AgentError::from_db(dataset, e))? {
            obey(f(&decode_row(dataset, &row, cols, key_len)?)?).await?;
        }
        Ok(())
    }

    /// SQLite hashes nothing in SQL (`supports_pushdown` is false).
    pub async fn aggregate(
        &self,
        _conn: &mut SqliteConnection,
        _dataset: &str,
        _sql: &Sql,
        _key_classes: &[TypeClass],
    ) -> Result<Vec<super::AggRow>> {
        Err(AgentError::Unsupported(
            "sqlite has no pushed-down aggregate".into(),
        ))
    }

    pub async fn count(&self, conn: &mut SqliteConnection, dataset: &str, sql: &Sql) -> Result<u64> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let row = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        let n: i64 = row.try_get(0).map_err(|e| AgentError::from_db(dataset, e))?;
        Ok(n.max(0) as u64)
    }

    pub async fn query_text(
        &self,
        conn: &mut SqliteConnection,
        dataset: &str,
        sql: &str,
    ) -> Result<Option<String>> {
        sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.to_string()))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))
    }
}

/// What a query's column without a declared type reports as its type (its class is
/// `other`, so a run naming it is refused with this text).
pub const NO_DECLARED_TYPE: &str =
    "no declared type: an expression of a SQLite query (select a table column, or exclude it)";

/// The type `table` (`schema.table` outside `main`, as the driver names a column's
/// origin) declares for `column`; `None` where it is not found.
async fn declared_type(
    conn: &mut SqliteConnection,
    table: &str,
    column: &str,
) -> std::result::Result<Option<String>, sqlx::Error> {
    let sql = "SELECT type FROM pragma_table_info(?1, ?2) WHERE name = ?3";
    let mut tries = vec![(table, "main")];
    if let Some((schema, t)) = table.split_once('.') {
        tries.push((t, schema));
    }
    for (t, schema) in tries {
        let found: Option<String> = sqlx::query_scalar(sql)
            .bind(t)
            .bind(schema)
            .bind(column)
            .fetch_optional(&mut *conn)
            .await?;
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

fn column_info(name: String, declared: String, nullable: bool) -> ColumnInfo {
    // SQLite keeps whatever fraction was written; render at the requested precision
    crate::dialect::sqlite::classify(&declared).column(name, declared, nullable)
}

fn decode_row(dataset: &str, row: &SqliteRow, cols: &[BoundColumn], key_len: usize) -> Result<CanonRow> {
    let db = |e| AgentError::from_db(dataset, e);
    let mut fields = Vec::with_capacity(cols.len());
    for (i, c) in cols.iter().enumerate() {
        let raw = row.try_get_raw(i).map_err(db)?;
        let storage = if raw.is_null() {
            "NULL".to_string()
        } else {
            raw.type_info().name().to_ascii_uppercase()
        };
        let text = match storage.as_str() {
            "NULL" => None,
            "INTEGER" => {
                let v: i64 = row.try_get(i).map_err(db)?;
                canonical_value(&c.spec.format, &Value::Int(i128::from(v)))
                    .map_err(|e| canonical_error(dataset, &c.info.name, e))?
            }
            "REAL" => {
                let v: f64 = row.try_get(i).map_err(db)?;
                canonical_value(&c.spec.format, &Value::Float(v))
                    .map_err(|e| canonical_error(dataset, &c.info.name, e))?
            }
            "BLOB" => {
                let v: Vec<u8> = row.try_get(i).map_err(db)?;
                canonical_value(&c.spec.format, &Value::Bytes(&v))
                    .map_err(|e| canonical_error(dataset, &c.info.name, e))?
            }
            _ => {
                let v: String = row.try_get(i).map_err(db)?;
                // a timestamp without zone compared as one with zone is read in the
                // dataset's time_zone, as on every other engine (a text that already
                // carries an offset is then refused, never read twice)
                let zoned = c.zone.as_ref().map(|z| format!("{v}{z}"));
                canonical_value(&c.spec.format, &Value::Text(zoned.as_deref().unwrap_or(&v)))
                    .map_err(|e| canonical_error(dataset, &c.info.name, e))?
            }
        };
        fields.push(text);
    }
    // key parts by the one rule of every engine (issue 31 F17: an INTEGER-stored key
    // was an integer part here whatever it was compared as, so an integer keyed against
    // another engine's decimal, whose parts are the decimal's text, paired no row)
    let mut out = CanonRow::new(Vec::with_capacity(key_len), &fields);
    let mut key = Vec::with_capacity(key_len);
    key_into(&out, cols, key_len, &mut key)?;
    out.key = key;
    Ok(out)
}
