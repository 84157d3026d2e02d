//! Connectors execute what dialects render. One [`Driver`] variant per engine; each
//! engine's driver code lives in its own file. A connector turns a row into canonical
//! fields ([`CanonRow`]) so everything above it is engine-independent.
//!
//! One connector per database URL: the agent shares it (`Arc`) between every dataset
//! on that URL, so the URL's connection cap holds whatever the number of datasets.

#[cfg(feature = "duckdb")]
pub mod duckdb;
pub mod mysql;
pub mod postgres;
pub mod sqlite;

use std::time::Duration;

use tally_common::canonical::canonical_from_text;
use tally_common::segment::{KeyPart, KeyTuple};
use tally_common::types::TypeClass;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, FetchShape, Sql};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo, canonical_error};

/// How long opening a database connection may take before the call reports the
/// database unavailable. Waiting for a busy pool's free connection is apart from it
/// (`connections.acquire_timeout_secs`): a slot is taken before the pool is asked, so
/// the pool's own acquire timeout only ever times a connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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

/// One engine's driver and its pool.
pub enum Driver {
    Postgres(postgres::PgConnector),
    MySql(mysql::MySqlConnector),
    Sqlite(sqlite::SqliteConnector),
    #[cfg(feature = "duckdb")]
    DuckDb(duckdb::DuckDbConnector),
}

/// A database URL's driver, with one slot per connection its pool may hold. Every
/// database call takes a slot first and holds it to the end, so calls beyond the cap
/// queue here (up to `acquire_timeout`) and the pool below is never short of one.
pub struct Connector {
    driver: Driver,
    slots: Semaphore,
    acquire_timeout: Duration,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connector({})", self.dialect().name())
    }
}

impl Connector {
    /// [`Connector::open_with`] the default `connections` limits.
    pub fn open(url: &str) -> Result<Connector> {
        Connector::open_with(url, &ConnectionsConfig::default())
    }

    /// Creates the connection pool without connecting: a database that is down makes
    /// calls fail with `UNAVAILABLE`, it does not stop the agent.
    pub fn open_with(url: &str, limits: &ConnectionsConfig) -> Result<Connector> {
        let driver = match EngineKind::from_url(url)? {
            EngineKind::Postgres => Driver::Postgres(postgres::PgConnector::open(url, limits)?),
            EngineKind::MySql => Driver::MySql(mysql::MySqlConnector::open(url, limits)?),
            EngineKind::Sqlite => Driver::Sqlite(sqlite::SqliteConnector::open(url, limits)?),
            #[cfg(feature = "duckdb")]
            EngineKind::DuckDb => Driver::DuckDb(duckdb::DuckDbConnector::open(url)?),
            #[cfg(not(feature = "duckdb"))]
            EngineKind::DuckDb => unreachable!("from_url refuses duckdb without the feature"),
        };
        Ok(Connector {
            driver,
            slots: Semaphore::new(limits.max_connections as usize),
            acquire_timeout: limits.acquire_timeout(),
        })
    }

    /// The dialect of a request: what the engine computes can depend on its version
    /// (PostgreSQL's `bit_xor` from 14), read from the request's own describe.
    pub fn dialect_for(&self, info: &DatasetInfo) -> &dyn Dialect {
        match &self.driver {
            Driver::Postgres(_) => crate::dialect::postgres::for_version(&info.engine_version),
            _ => self.dialect(),
        }
    }

    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// Waits for a free connection slot of this URL.
    async fn slot(&self, dataset: &str) -> Result<SemaphorePermit<'_>> {
        match tokio::time::timeout(self.acquire_timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(AgentError::DatabaseUnavailable {
                dataset: dataset.to_string(),
                kind: "pool closed",
            }),
            Err(_) => {
                tracing::warn!(
                    dataset,
                    waited_secs = self.acquire_timeout.as_secs(),
                    "every connection to the database stayed busy"
                );
                Err(AgentError::DatabaseUnavailable {
                    dataset: dataset.to_string(),
                    kind: "all connections busy",
                })
            }
        }
    }

    /// Opens one connection outside the pool and closes it again, for `tally-agent
    /// check`. The error is the driver's own text (the pool's retries would hide it
    /// behind a timeout): print it inside the zone, never put it in an [`AgentError`],
    /// whose text reaches the coordinator.
    pub async fn ping(&self) -> std::result::Result<(), String> {
        let attempt = async {
            match &self.driver {
                Driver::Postgres(c) => c.ping().await.map_err(|e| e.to_string()),
                Driver::MySql(c) => c.ping().await.map_err(|e| e.to_string()),
                Driver::Sqlite(c) => c.ping().await.map_err(|e| e.to_string()),
                #[cfg(feature = "duckdb")]
                Driver::DuckDb(c) => c.ping().await,
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {} s (a firewall dropping packets, or a wrong host)",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })
    }

    /// The dialect for quoting and catalog SQL, independent of a server version.
    pub fn dialect(&self) -> &dyn Dialect {
        match &self.driver {
            Driver::Postgres(c) => c.dialect(),
            Driver::MySql(c) => &c.dialect,
            Driver::Sqlite(c) => &c.dialect,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => &c.dialect,
        }
    }

    /// What the fetch of a row selects on this engine: the cheapest form the
    /// connector can turn into canonical text.
    pub fn fetch_shape(&self) -> FetchShape {
        match &self.driver {
            Driver::Sqlite(_) => FetchShape::Raw,
            Driver::Postgres(_) | Driver::MySql(_) => FetchShape::Text,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(_) => FetchShape::Canonical,
        }
    }

    pub async fn describe(&self, dataset: &str, source: &Source, key: &[String]) -> Result<DatasetInfo> {
        let _slot = self.slot(dataset).await?;
        let mut info = match &self.driver {
            Driver::Postgres(c) => c.describe(dataset, source).await?,
            Driver::MySql(c) => c.describe(dataset, source).await?,
            Driver::Sqlite(c) => c.describe(dataset, source).await?,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => c.describe(dataset, source).await?,
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
        let _slot = self.slot(dataset).await?;
        match &self.driver {
            Driver::Postgres(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
            Driver::MySql(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
            Driver::Sqlite(c) => c.scan(dataset, sql, cols, key_len, f).await,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => c.scan(dataset, sql, cols, key_len, &reread, f).await,
        }
    }

    pub async fn count(&self, dataset: &str, sql: &Sql) -> Result<u64> {
        let _slot = self.slot(dataset).await?;
        match &self.driver {
            Driver::Postgres(c) => c.count(dataset, sql).await,
            Driver::MySql(c) => c.count(dataset, sql).await,
            Driver::Sqlite(c) => c.count(dataset, sql).await,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => c.count(dataset, sql).await,
        }
    }

    /// Runs a bucketed aggregate rendered by [`crate::dialect::aggregate`].
    pub async fn aggregate(
        &self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let _slot = self.slot(dataset).await?;
        match &self.driver {
            Driver::Postgres(c) => c.aggregate(dataset, sql, key_classes).await,
            Driver::MySql(c) => c.aggregate(dataset, sql, key_classes).await,
            Driver::Sqlite(_) => Err(AgentError::Unsupported(
                "sqlite has no pushed-down aggregate".into(),
            )),
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => c.aggregate(dataset, sql, key_classes).await,
        }
    }

    /// A single text value from a query (for tests and `check`).
    pub async fn query_text(&self, dataset: &str, sql: &str) -> Result<Option<String>> {
        let _slot = self.slot(dataset).await?;
        match &self.driver {
            Driver::Postgres(c) => c.query_text(dataset, sql).await,
            Driver::MySql(c) => c.query_text(dataset, sql).await,
            Driver::Sqlite(c) => c.query_text(dataset, sql).await,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => c.query_text(dataset, sql).await,
        }
    }

    /// Whether reading rows and hashing them in the agent beats the engine's own SQL
    /// hashing (measured: docs/performance.md). DuckDB's vectorised, multi-threaded
    /// SQL hashing does not lose to a row-at-a-time read.
    pub fn prefers_in_process(&self) -> bool {
        match &self.driver {
            Driver::Postgres(_) | Driver::MySql(_) | Driver::Sqlite(_) => true,
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(_) => false,
        }
    }

    /// Whether row fetches stream through `COPY ... TO STDOUT` (PostgreSQL), which takes
    /// no bind parameters: fetch SQL is then rendered with literal key bounds.
    pub fn copies_out(&self) -> bool {
        matches!(self.driver, Driver::Postgres(_))
    }

    pub fn supports_pushdown(&self) -> bool {
        !matches!(self.driver, Driver::Sqlite(_))
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

/// One connection with `pool`'s options but outside it, closed again: the driver's own
/// error where the pool would retry until its timeout.
async fn connect_once<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> std::result::Result<(), sqlx::Error> {
    use sqlx::{ConnectOptions, Connection};
    pool.connect_options().connect().await?.close().await
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
