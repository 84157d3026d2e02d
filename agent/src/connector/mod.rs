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

use std::sync::Arc;
use std::time::Duration;

use tally_common::canonical::canonical_from_text;
use tally_common::segment::{KeyPart, KeyTuple};
use tally_common::types::TypeClass;

use sqlx::pool::PoolConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
    slots: Arc<Semaphore>,
    acquire_timeout: Duration,
}

/// One connection taken from a driver's pool, with the slot that allowed it.
enum Conn {
    Postgres(PoolConnection<sqlx::Postgres>),
    MySql(PoolConnection<sqlx::MySql>),
    Sqlite(PoolConnection<sqlx::Sqlite>),
    #[cfg(feature = "duckdb")]
    DuckDb(Option<::duckdb::Connection>),
}

/// A connection and its slot, for one call or one request. A lease that was not
/// [`Lease::finish`]ed (an error, a cancelled call) closes its connection instead of
/// returning it: a pool never hands out a connection inside someone's transaction,
/// or with half a result (a COPY stopped early) still on the wire.
struct Lease {
    conn: Conn,
    _slot: OwnedSemaphorePermit,
    /// A transaction is open on the connection.
    in_tx: bool,
    /// [`Lease::finish`] ran: the connection may go back to the pool.
    done: bool,
}

impl Lease {
    async fn finish(mut self, dataset: &str) -> Result<()> {
        if !self.in_tx {
            self.done = true;
            return Ok(());
        }
        // read-only: COMMIT and ROLLBACK end it alike; COMMIT reports a lost connection
        let r = match &mut self.conn {
            Conn::Postgres(c) => sqlx::raw_sql("COMMIT").execute(&mut **c).await.map(drop),
            Conn::MySql(c) => sqlx::raw_sql("COMMIT").execute(&mut **c).await.map(drop),
            Conn::Sqlite(c) => sqlx::raw_sql("COMMIT").execute(&mut **c).await.map(drop),
            #[cfg(feature = "duckdb")]
            Conn::DuckDb(c) => {
                return duckdb::end(c, dataset).inspect(|_| self.done = true);
            }
        };
        r.map_err(|e| AgentError::from_db(dataset, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match &mut self.conn {
            Conn::Postgres(c) => c.close_on_drop(),
            Conn::MySql(c) => c.close_on_drop(),
            Conn::Sqlite(c) => c.close_on_drop(),
            #[cfg(feature = "duckdb")]
            Conn::DuckDb(c) => drop(c.take()),
        }
    }
}

/// The statement that opens a request's transaction on each engine: read-only and
/// REPEATABLE READ, so every statement of the request reads one snapshot (DESIGN §5).
/// MySQL/MariaDB take the isolation level in a statement of its own, for the next
/// transaction only, and `WITH CONSISTENT SNAPSHOT` starts the snapshot at once.
/// SQLite (opened read-only) has one isolation level: a transaction's reads see
/// one state of the file. DuckDB transactions are snapshots.
pub const BEGIN_POSTGRES: &str = "BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY";
pub const BEGIN_MYSQL: [&str; 2] = [
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
];
pub const BEGIN_SQLITE: &str = "BEGIN DEFERRED";

/// One request's reads: a connection held from the first statement to the last,
/// inside one read-only REPEATABLE READ transaction, so a level's buckets, a range's
/// count and its digests all come from the same snapshot of this side. End it with
/// [`Session::finish`]; a dropped session rolls back by closing its connection.
pub struct Session {
    connector: Arc<Connector>,
    lease: Lease,
    dataset: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({})", self.dataset)
    }
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
            slots: Arc::new(Semaphore::new(limits.max_connections as usize)),
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
    async fn slot(&self, dataset: &str) -> Result<OwnedSemaphorePermit> {
        match tokio::time::timeout(self.acquire_timeout, Arc::clone(&self.slots).acquire_owned()).await {
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

    /// A slot, then a connection of the pool; with `begin`, inside a new read-only
    /// REPEATABLE READ transaction.
    async fn lease(&self, dataset: &str, begin: bool) -> Result<Lease> {
        let slot = self.slot(dataset).await?;
        let db = |e| AgentError::from_db(dataset, e);
        let conn = match &self.driver {
            Driver::Postgres(c) => Conn::Postgres(c.pool.acquire().await.map_err(db)?),
            Driver::MySql(c) => Conn::MySql(c.pool.acquire().await.map_err(db)?),
            Driver::Sqlite(c) => Conn::Sqlite(c.pool.acquire().await.map_err(db)?),
            #[cfg(feature = "duckdb")]
            Driver::DuckDb(c) => Conn::DuckDb(Some(c.connection(dataset)?)),
        };
        let mut lease = Lease {
            conn,
            _slot: slot,
            in_tx: begin,
            done: false,
        };
        if begin {
            match &mut lease.conn {
                Conn::Postgres(c) => {
                    sqlx::raw_sql(BEGIN_POSTGRES)
                        .execute(&mut **c)
                        .await
                        .map_err(db)?;
                }
                Conn::MySql(c) => {
                    for s in BEGIN_MYSQL {
                        sqlx::raw_sql(s).execute(&mut **c).await.map_err(db)?;
                    }
                }
                Conn::Sqlite(c) => {
                    sqlx::raw_sql(BEGIN_SQLITE).execute(&mut **c).await.map_err(db)?;
                }
                #[cfg(feature = "duckdb")]
                Conn::DuckDb(c) => duckdb::begin(c, dataset)?,
            }
        }
        Ok(lease)
    }

    /// Opens one request's [`Session`]: its slot, its connection, its transaction.
    pub async fn session(self: &Arc<Self>, dataset: &str) -> Result<Session> {
        let lease = self.lease(dataset, true).await?;
        Ok(Session {
            connector: Arc::clone(self),
            lease,
            dataset: dataset.to_string(),
        })
    }

    /// Opens one connection outside the pool and closes it again, for `tally-agent
    /// check`. The error is the driver's own text (the pool's retries would hide it
    /// behind a timeout): print it inside the zone, never put it in an [`AgentError`],
    /// whose text reaches the coordinator.
    pub async fn ping(&self) -> std::result::Result<(), String> {
        let attempt = async {
            match &self.driver {
                Driver::Postgres(c) => connect_once(&c.pool).await.map_err(|e| e.to_string()),
                Driver::MySql(c) => connect_once(&c.pool).await.map_err(|e| e.to_string()),
                Driver::Sqlite(c) => connect_once(&c.pool).await.map_err(|e| e.to_string()),
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

    async fn describe_on(
        &self,
        l: &mut Lease,
        dataset: &str,
        source: &Source,
        key: &[String],
    ) -> Result<DatasetInfo> {
        let mut info = match (&self.driver, &mut l.conn) {
            (Driver::Postgres(c), Conn::Postgres(conn)) => c.describe(conn, dataset, source).await?,
            (Driver::MySql(c), Conn::MySql(conn)) => c.describe(conn, dataset, source).await?,
            (Driver::Sqlite(c), Conn::Sqlite(conn)) => c.describe(conn, dataset, source).await?,
            #[cfg(feature = "duckdb")]
            (Driver::DuckDb(c), Conn::DuckDb(conn)) => c.describe(conn, dataset, source).await?,
            _ => unreachable!("a lease is taken from its own driver"),
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

    #[allow(clippy::too_many_arguments)]
    async fn scan_on(
        &self,
        l: &mut Lease,
        dataset: &str,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let reread = reread(self.dialect(), shape, cols);
        match (&self.driver, &mut l.conn) {
            (Driver::Postgres(c), Conn::Postgres(conn)) => {
                c.scan(conn, dataset, sql, cols, key_len, &reread, f).await
            }
            (Driver::MySql(c), Conn::MySql(conn)) => {
                c.scan(conn, dataset, sql, cols, key_len, &reread, f).await
            }
            (Driver::Sqlite(c), Conn::Sqlite(conn)) => c.scan(conn, dataset, sql, cols, key_len, f).await,
            #[cfg(feature = "duckdb")]
            (Driver::DuckDb(c), Conn::DuckDb(conn)) => {
                c.scan(conn, dataset, sql, cols, key_len, &reread, f).await
            }
            _ => unreachable!("a lease is taken from its own driver"),
        }
    }

    async fn count_on(&self, l: &mut Lease, dataset: &str, sql: &Sql) -> Result<u64> {
        match (&self.driver, &mut l.conn) {
            (Driver::Postgres(c), Conn::Postgres(conn)) => c.count(conn, dataset, sql).await,
            (Driver::MySql(c), Conn::MySql(conn)) => c.count(conn, dataset, sql).await,
            (Driver::Sqlite(c), Conn::Sqlite(conn)) => c.count(conn, dataset, sql).await,
            #[cfg(feature = "duckdb")]
            (Driver::DuckDb(c), Conn::DuckDb(conn)) => c.count(conn, dataset, sql).await,
            _ => unreachable!("a lease is taken from its own driver"),
        }
    }

    async fn aggregate_on(
        &self,
        l: &mut Lease,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        match (&self.driver, &mut l.conn) {
            (Driver::Postgres(c), Conn::Postgres(conn)) => c.aggregate(conn, dataset, sql, key_classes).await,
            (Driver::MySql(c), Conn::MySql(conn)) => c.aggregate(conn, dataset, sql, key_classes).await,
            (Driver::Sqlite(_), _) => Err(AgentError::Unsupported(
                "sqlite has no pushed-down aggregate".into(),
            )),
            #[cfg(feature = "duckdb")]
            (Driver::DuckDb(c), Conn::DuckDb(conn)) => c.aggregate(conn, dataset, sql, key_classes).await,
            _ => unreachable!("a lease is taken from its own driver"),
        }
    }

    async fn query_text_on(&self, l: &mut Lease, dataset: &str, sql: &str) -> Result<Option<String>> {
        match (&self.driver, &mut l.conn) {
            (Driver::Postgres(c), Conn::Postgres(conn)) => c.query_text(conn, dataset, sql).await,
            (Driver::MySql(c), Conn::MySql(conn)) => c.query_text(conn, dataset, sql).await,
            (Driver::Sqlite(c), Conn::Sqlite(conn)) => c.query_text(conn, dataset, sql).await,
            #[cfg(feature = "duckdb")]
            (Driver::DuckDb(c), Conn::DuckDb(conn)) => c.query_text(conn, dataset, sql).await,
            _ => unreachable!("a lease is taken from its own driver"),
        }
    }

    /// One call on a connection of its own, outside any request's transaction (tests
    /// and `check`; requests use a [`Session`]).
    pub async fn describe(&self, dataset: &str, source: &Source, key: &[String]) -> Result<DatasetInfo> {
        let mut l = self.lease(dataset, false).await?;
        let r = self.describe_on(&mut l, dataset, source, key).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// [`Session::scan`] on a connection of its own (tests).
    pub async fn scan(
        &self,
        dataset: &str,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let mut l = self.lease(dataset, false).await?;
        let r = self.scan_on(&mut l, dataset, sql, shape, cols, key_len, f).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// [`Session::count`] on a connection of its own (tests).
    pub async fn count(&self, dataset: &str, sql: &Sql) -> Result<u64> {
        let mut l = self.lease(dataset, false).await?;
        let r = self.count_on(&mut l, dataset, sql).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// [`Session::aggregate`] on a connection of its own (tests).
    pub async fn aggregate(
        &self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let mut l = self.lease(dataset, false).await?;
        let r = self.aggregate_on(&mut l, dataset, sql, key_classes).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// A single text value from a query (for tests and `check`).
    pub async fn query_text(&self, dataset: &str, sql: &str) -> Result<Option<String>> {
        let mut l = self.lease(dataset, false).await?;
        let r = self.query_text_on(&mut l, dataset, sql).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
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

impl Session {
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    pub async fn describe(&mut self, source: &Source, key: &[String]) -> Result<DatasetInfo> {
        self.connector
            .describe_on(&mut self.lease, &self.dataset, source, key)
            .await
    }

    /// Runs a row fetch rendered with `shape` and hands each row, in canonical form, to `f`.
    pub async fn scan(
        &mut self,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        f: &mut (dyn FnMut(CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        self.connector
            .scan_on(&mut self.lease, &self.dataset, sql, shape, cols, key_len, f)
            .await
    }

    pub async fn count(&mut self, sql: &Sql) -> Result<u64> {
        self.connector.count_on(&mut self.lease, &self.dataset, sql).await
    }

    /// Runs a bucketed aggregate rendered by [`crate::dialect::aggregate`].
    pub async fn aggregate(&mut self, sql: &Sql, key_classes: &[TypeClass]) -> Result<Vec<AggRow>> {
        self.connector
            .aggregate_on(&mut self.lease, &self.dataset, sql, key_classes)
            .await
    }

    pub async fn query_text(&mut self, sql: &str) -> Result<Option<String>> {
        self.connector
            .query_text_on(&mut self.lease, &self.dataset, sql)
            .await
    }

    /// Ends the transaction and returns the connection to the pool.
    pub async fn finish(self) -> Result<()> {
        let Session { lease, dataset, .. } = self;
        lease.finish(&dataset).await
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
