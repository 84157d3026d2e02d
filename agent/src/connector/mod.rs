//! Connectors execute what dialects render. One variant per engine; each engine's
//! driver code lives in its own file. A connector turns a row into canonical fields
//! ([`CanonRow`]) so everything above it is engine-independent.

#[cfg(feature = "duckdb")]
pub mod duckdb;
pub mod mysql;
pub mod postgres;
pub mod sqlite;

use std::time::Duration;

use tally_common::canonical::canonical_from_text;
use tally_common::segment::{KeyPart, KeyTuple};
use tally_common::types::TypeClass;

use crate::config::Source;
use crate::dialect::{Dialect, FetchShape, Sql};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo, canonical_error};

/// How long to wait for a database connection before reporting it unavailable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections an agent opens to one server database at most: a run keeps up to 8
/// busy per side in its rows phase, so two runs at once do not queue.
pub const MAX_CONNECTIONS: u32 = 16;

/// One row in canonical form: its key and the canonical text of every requested
/// column (key columns first), `None` for NULL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonRow {
    pub key: KeyTuple,
    pub fields: Vec<Option<String>>,
}

impl CanonRow {
    pub fn row_string(&self) -> String {
        tally_common::canonical::row_string(self.fields.iter().map(Option::as_deref))
    }

    pub fn key_string(&self, key_len: usize) -> String {
        tally_common::canonical::row_string(self.fields[..key_len].iter().map(Option::as_deref))
    }
}

/// One (parent, child) result row of a pushed-down aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggRow {
    pub parent: usize,
    pub child: usize,
    pub count: u64,
    pub sum: u64,
    pub xor: Option<u64>,
    /// The first key of the child (quantile parents only).
    pub first_key: Option<KeyTuple>,
}

/// Which engine a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Postgres,
    MySql,
    Sqlite,
    DuckDb,
}

impl EngineKind {
    pub fn from_url(url: &str) -> Result<EngineKind> {
        let scheme = url.split(':').next().unwrap_or("");
        Ok(match scheme {
            "postgres" | "postgresql" => EngineKind::Postgres,
            "mysql" | "mariadb" => EngineKind::MySql,
            "sqlite" => EngineKind::Sqlite,
            "duckdb" if cfg!(feature = "duckdb") => EngineKind::DuckDb,
            "duckdb" => {
                return Err(AgentError::Config(
                    "duckdb:// datasets need an agent built with the `duckdb` cargo feature".into(),
                ));
            }
            "mssql" | "sqlserver" | "oracle" => {
                return Err(AgentError::Config(format!(
                    "{scheme}:// is not supported by this agent build yet"
                )));
            }
            _ => {
                return Err(AgentError::Config(format!(
                    "unknown database URL scheme {scheme:?}"
                )));
            }
        })
    }
}

pub enum Connector {
    Postgres(postgres::PgConnector),
    MySql(mysql::MySqlConnector),
    Sqlite(sqlite::SqliteConnector),
    #[cfg(feature = "duckdb")]
    DuckDb(duckdb::DuckDbConnector),
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connector({})", self.dialect().name())
    }
}

impl Connector {
    /// Creates the connection pool without connecting: a database that is down makes
    /// calls fail with `UNAVAILABLE`, it does not stop the agent.
    pub fn open(url: &str) -> Result<Connector> {
        Ok(match EngineKind::from_url(url)? {
            EngineKind::Postgres => Connector::Postgres(postgres::PgConnector::open(url)?),
            EngineKind::MySql => Connector::MySql(mysql::MySqlConnector::open(url)?),
            EngineKind::Sqlite => Connector::Sqlite(sqlite::SqliteConnector::open(url)?),
            #[cfg(feature = "duckdb")]
            EngineKind::DuckDb => Connector::DuckDb(duckdb::DuckDbConnector::open(url)?),
            #[cfg(not(feature = "duckdb"))]
            EngineKind::DuckDb => unreachable!("from_url refuses duckdb without the feature"),
        })
    }

    /// The dialect of a request: what the engine computes can depend on its version
    /// (PostgreSQL's `bit_xor` from 14), read from the request's own describe.
    pub fn dialect_for(&self, info: &DatasetInfo) -> &dyn Dialect {
        match self {
            Connector::Postgres(_) => crate::dialect::postgres::for_version(&info.engine_version),
            _ => self.dialect(),
        }
    }

    /// The dialect for quoting and catalog SQL, independent of a server version.
    pub fn dialect(&self) -> &dyn Dialect {
        match self {
            Connector::Postgres(c) => c.dialect(),
            Connector::MySql(c) => &c.dialect,
            Connector::Sqlite(c) => &c.dialect,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => &c.dialect,
        }
    }

    /// What the fetch of a row selects on this engine: the cheapest form the
    /// connector can turn into canonical text.
    pub fn fetch_shape(&self) -> FetchShape {
        match self {
            Connector::Sqlite(_) => FetchShape::Raw,
            Connector::Postgres(_) | Connector::MySql(_) => FetchShape::Text,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(_) => FetchShape::Canonical,
        }
    }

    pub async fn describe(&self, dataset: &str, source: &Source, key: &[String]) -> Result<DatasetInfo> {
        let mut info = match self {
            Connector::Postgres(c) => c.describe(dataset, source).await?,
            Connector::MySql(c) => c.describe(dataset, source).await?,
            Connector::Sqlite(c) => c.describe(dataset, source).await?,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => c.describe(dataset, source).await?,
        };
        let mut resolved = Vec::with_capacity(key.len());
        for k in key {
            let col = info.column(k).ok_or_else(|| {
                AgentError::Config(format!("dataset {dataset}: key column {k} does not exist"))
            })?;
            resolved.push(col.name.clone());
        }
        info.key = resolved;
        Ok(info)
    }

    /// Runs a row fetch rendered with `shape` and hands each row, in canonical form, to `f`.
    pub async fn scan(
        &self,
        dataset: &str,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let reread = reread(self.dialect(), shape, cols);
        match self {
            Connector::Postgres(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
            Connector::MySql(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
            Connector::Sqlite(c) => c.scan(dataset, sql, cols, key_len, f).await,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
        }
    }

    pub async fn count(&self, dataset: &str, sql: &Sql) -> Result<u64> {
        match self {
            Connector::Postgres(c) => c.count(dataset, sql).await,
            Connector::MySql(c) => c.count(dataset, sql).await,
            Connector::Sqlite(c) => c.count(dataset, sql).await,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => c.count(dataset, sql).await,
        }
    }

    /// Runs a bucketed aggregate rendered by [`crate::dialect::aggregate`].
    pub async fn aggregate(
        &self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        match self {
            Connector::Postgres(c) => c.aggregate(dataset, sql, key_classes).await,
            Connector::MySql(c) => c.aggregate(dataset, sql, key_classes).await,
            Connector::Sqlite(_) => Err(AgentError::Unsupported(
                "sqlite has no pushed-down aggregate".into(),
            )),
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => c.aggregate(dataset, sql, key_classes).await,
        }
    }

    /// A single text value from a query (for tests and `check`).
    pub async fn query_text(&self, dataset: &str, sql: &str) -> Result<Option<String>> {
        match self {
            Connector::Postgres(c) => c.query_text(dataset, sql).await,
            Connector::MySql(c) => c.query_text(dataset, sql).await,
            Connector::Sqlite(c) => c.query_text(dataset, sql).await,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(c) => c.query_text(dataset, sql).await,
        }
    }

    /// Whether reading rows and hashing them in the agent beats the engine's own SQL
    /// hashing (measured: docs/performance.md). DuckDB's vectorised, multi-threaded
    /// SQL hashing does not lose to a row-at-a-time read.
    pub fn prefers_in_process(&self) -> bool {
        match self {
            Connector::Postgres(_) | Connector::MySql(_) | Connector::Sqlite(_) => true,
            #[cfg(feature = "duckdb")]
            Connector::DuckDb(_) => false,
        }
    }

    /// Whether row fetches stream through `COPY ... TO STDOUT` (PostgreSQL), which takes
    /// no bind parameters: fetch SQL is then rendered with literal key bounds.
    pub fn copies_out(&self) -> bool {
        matches!(self, Connector::Postgres(_))
    }

    pub fn supports_pushdown(&self) -> bool {
        !matches!(self, Connector::Sqlite(_))
    }
}

/// Which fields of a fetch arrive as the engine's own text, still to be made canonical
/// in the agent: the cheap texts of a text-shape fetch, and every column SQL cannot
/// render canonically (JSON, a float as a decimal), whatever the shape. This is the
/// one rule [`crate::dialect::fetch_rows`] selects by.
pub fn reread(d: &dyn Dialect, shape: FetchShape, cols: &[BoundColumn]) -> Vec<bool> {
    cols.iter()
        .map(|c| match shape {
            FetchShape::Raw => false,
            FetchShape::Text => d.text_expr(c).is_some() || d.canonical_expr(c).is_none(),
            FetchShape::Canonical => d.canonical_expr(c).is_none(),
        })
        .collect()
}

/// A row from the texts of a canonical- or text-shape fetch: fields marked in `reread`
/// hold the engine's own text and are rendered to canonical form here.
pub fn canonical_row(
    dataset: &str,
    mut fields: Vec<Option<String>>,
    cols: &[BoundColumn],
    key_len: usize,
    reread: &[bool],
) -> Result<CanonRow> {
    for ((field, c), again) in fields.iter_mut().zip(cols).zip(reread) {
        if *again && field.is_some() {
            *field = canonical_from_text(&c.spec.format, field.as_deref())
                .map_err(|e| canonical_error(dataset, &c.info.name, e))?;
        }
    }
    let key = key_from_canonical(&fields, cols, key_len)?;
    Ok(CanonRow { key, fields })
}

/// Key parts from canonical key texts (canonical-shape fetches).
pub fn key_from_canonical(
    fields: &[Option<String>],
    cols: &[BoundColumn],
    key_len: usize,
) -> Result<KeyTuple> {
    fields[..key_len]
        .iter()
        .zip(cols)
        .map(|(v, c)| match (c.info.class, v) {
            (_, None) => Err(AgentError::InvalidArgument(format!(
                "key column {} holds NULL",
                c.info.name
            ))),
            (TypeClass::Integer, Some(t)) => t.parse::<i64>().map(KeyPart::Int).map_err(|_| {
                AgentError::InvalidArgument(format!("key column {} is not a 64-bit integer", c.info.name))
            }),
            (_, Some(t)) => Ok(KeyPart::Text(t.clone())),
        })
        .collect()
}

/// One result row of [`crate::dialect::aggregate`] (p, b, n, s, x, first key parts…), read
/// through the driver's accessors: `int` for integer columns, `text` for text ones.
pub fn agg_row(
    dataset: &str,
    key_classes: &[TypeClass],
    int: impl Fn(usize) -> Option<i64>,
    text: impl Fn(usize) -> Result<Option<String>>,
) -> Result<AggRow> {
    let bad = || AgentError::Query {
        dataset: dataset.to_string(),
        kind: "unexpected aggregate row",
    };
    let mut first = Vec::new();
    for (j, class) in key_classes.iter().enumerate() {
        let part = match class {
            TypeClass::Integer => int(5 + j).map(KeyPart::Int),
            _ => text(5 + j).ok().flatten().map(KeyPart::Text),
        };
        match part {
            Some(p) => first.push(p),
            None => break,
        }
    }
    Ok(AggRow {
        parent: int(0).ok_or_else(bad)? as usize,
        child: int(1).ok_or_else(bad)?.max(0) as usize,
        count: int(2).ok_or_else(bad)? as u64,
        sum: parse_sum(dataset, text(3)?)?,
        xor: text(4)?.map(|t| parse_sum(dataset, Some(t))).transpose()?,
        first_key: (first.len() == key_classes.len() && !first.is_empty()).then_some(first),
    })
}

/// Parses the text of an exact SUM or a 64-bit XOR into its u64 bits.
pub fn parse_sum(dataset: &str, s: Option<String>) -> Result<u64> {
    match s {
        None => Ok(0), // SUM over no rows is NULL
        Some(t) => tally_common::checksum::wrap_decimal_sum(&t).ok_or_else(|| AgentError::Query {
            dataset: dataset.to_string(),
            kind: "unparseable checksum sum",
        }),
    }
}
