//! MySQL and MariaDB through sqlx. Canonical text and checksums are computed by the
//! server; sessions run in UTC with utf8mb4.

use std::str::FromStr;

use futures::TryStreamExt;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Column, Executor, Row, Statement, TypeInfo};
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::sqlx_conn::{self, SqlxConn};
use super::{AggRow, CONNECT_TIMEOUT, EngineConn, EngineConnector, RowBuilder, RowSink, agg_row, obey};
use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, Sql, mysql::MySql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

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
                    let t = c.type_info().name().to_ascii_lowercase();
                    let data_type = t.split_whitespace().next().unwrap_or("").to_string();
                    let entry = crate::dialect::mysql::classify(&data_type, &t, false);
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
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let mut rows = q.fetch(&mut *conn);
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        while let Some(row) = rows
            .try_next()
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?
        {
            b.start();
            for i in 0..cols.len() {
                b.push(get_str(&row, i).map_err(|e| AgentError::from_db(dataset, e))?)?;
            }
            obey(f(b.finish()?)?).await;
        }
        Ok(())
    }

    pub async fn count(&self, conn: &mut MySqlConnection, dataset: &str, sql: &Sql) -> Result<u64> {
        let q = bind_all(sqlx::query(AssertSqlSafe(sql.text.as_str())), &sql.binds);
        let row = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        Ok(get_i64(&row, 0).unwrap_or(0).max(0) as u64)
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
