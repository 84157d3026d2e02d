//! Connectors execute what dialects render. One [`EngineConnector`] per engine; each
//! engine's driver code lives in its own file. A connector turns a row into canonical
//! fields ([`CanonRow`]) so everything above it is engine-independent.
//!
//! One connector per database URL: the agent shares it (`Arc`) between every dataset
//! on that URL, so the URL's connection cap holds whatever the number of datasets.

#[cfg(feature = "duckdb")]
pub mod duckdb;
#[cfg(feature = "mssql")]
pub mod mssql;
pub mod mysql;
pub mod mysql_query_columns;
#[cfg(feature = "oracle")]
pub mod oracle;
pub mod postgres;
pub mod sqlite;
pub mod sqlx_conn;
pub mod throttle;

use std::sync::Arc;
use std::time::Duration;

use tally_common::canonical::{CanonicalError, Value, canonical_from_text_in, canonical_value};
use tally_common::segment::{KeyPart, KeyTuple};
use tally_common::types::TypeClass;

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

/// One row in canonical form: its key, and the canonical row string (every requested
/// column's `LEN:text`, or `~` for NULL, key columns first) with each field's end in it,
/// so the row string and the key string (its prefix) are read without building them.
/// A fetch builds every row in one reused `CanonRow` ([`RowBuilder`]) and lends it to
/// its sink: a sink that keeps a row clones it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CanonRow {
    pub key: KeyTuple,
    line: String,
    ends: Vec<usize>,
}

impl CanonRow {
    /// A row of owned canonical fields (tests, and readers that hand rows over whole).
    pub fn new(key: KeyTuple, fields: &[Option<String>]) -> CanonRow {
        let mut row = CanonRow {
            key,
            ..CanonRow::default()
        };
        for f in fields {
            row.push_field(f.as_deref());
        }
        row
    }

    fn clear(&mut self) {
        self.line.clear();
        self.ends.clear();
    }

    /// Appends one field's canonical text.
    fn push_field(&mut self, canonical: Option<&str>) {
        tally_common::canonical::push_field(&mut self.line, canonical);
        self.ends.push(self.line.len());
    }

    /// The number of fields.
    pub fn width(&self) -> usize {
        self.ends.len()
    }

    /// The canonical text of field `i`, `None` for NULL.
    pub fn field(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let enc = &self.line[start..self.ends[i]];
        // `~` or `LEN:text`: the length's digits hold no ':'
        let colon = enc.bytes().position(|b| b == b':')?;
        Some(&enc[colon + 1..])
    }

    /// Every field's canonical text in order.
    pub fn fields(&self) -> impl ExactSizeIterator<Item = Option<&str>> + '_ {
        (0..self.width()).map(|i| self.field(i))
    }

    /// Owned copies of the fields.
    pub fn to_fields(&self) -> Vec<Option<String>> {
        self.fields().map(|f| f.map(str::to_string)).collect()
    }

    /// The row string of every field ([`tally_common::canonical::row_string`]).
    pub fn row_string(&self) -> &str {
        &self.line
    }

    /// The row string of the first `key_len` fields (the key columns).
    pub fn key_string(&self, key_len: usize) -> &str {
        match key_len {
            0 => "",
            n => &self.line[..self.ends[n - 1]],
        }
    }
}

/// What a row sink asks of the reader after a row: read on, or pause reading first
/// (a throttle, [`crate::connector::throttle`]). A paused reader stops taking rows from the
/// engine; its statement stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    Pause(Duration),
}

/// Where a row fetch hands its rows.
pub type RowSink<'a> = dyn FnMut(&CanonRow) -> Result<Flow> + Send + 'a;

/// Does what a sink asked: every engine's read loop awaits it after each row.
pub async fn obey(flow: Flow) {
    if let Flow::Pause(d) = flow {
        tokio::time::sleep(d).await;
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

/// One engine's driver: what it can do and how to open a connection to it. Each
/// engine implements it in its own file and lists itself in [`ENGINES`]; nothing
/// shared matches on engines.
#[async_trait::async_trait]
pub trait EngineConnector: Send + Sync + 'static {
    /// The dialect for quoting and catalog SQL, independent of a server version.
    fn dialect(&self) -> &dyn Dialect;
    /// The dialect of a request: what the engine computes can depend on its version
    /// (PostgreSQL's `bit_xor` from 14), read from the request's own describe.
    fn dialect_for(&self, _info: &DatasetInfo) -> &dyn Dialect {
        self.dialect()
    }
    /// What the fetch of a row selects on this engine: the cheapest form the
    /// connector can turn into canonical text.
    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Text
    }
    /// Whether reading rows and hashing them in the agent beats the engine's own SQL
    /// hashing (measured: docs/performance.md).
    fn prefers_in_process(&self) -> bool {
        true
    }
    /// Whether row fetches without bind values stream through a statement that takes
    /// no parameters (PostgreSQL `COPY ... TO STDOUT`): fetch SQL is then rendered
    /// with literal key bounds.
    fn copies_out(&self) -> bool {
        false
    }
    /// Whether the engine runs the bucketed aggregate (SQL hashing) at all.
    fn supports_pushdown(&self) -> bool {
        true
    }
    /// A warning every `check` and every run involving this engine carries: its SQL
    /// has not been run against a live server by this project's tests.
    fn not_live_verified(&self) -> Option<&'static str> {
        None
    }
    /// What every run involving this engine should know of it (Oracle's `''` is NULL).
    fn notes(&self) -> &'static [&'static str] {
        &[]
    }
    /// A connection of its own (from the engine's pool, if it has one), outside any
    /// transaction.
    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>>;
    /// Opens one connection outside any pool and closes it again, for `tally-agent
    /// check`. The error is the driver's own text: print it inside the zone, never put
    /// it in an [`AgentError`], whose text reaches the coordinator.
    async fn ping(&self) -> std::result::Result<(), String>;
    /// The concrete connector (tests reach engine-specific helpers through it).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// One connection of an engine, for one call or one request.
#[async_trait::async_trait]
pub trait EngineConn: Send {
    /// Opens a read-only REPEATABLE READ transaction (DESIGN §5), or the engine's
    /// nearest snapshot equivalent.
    async fn begin(&mut self, dataset: &str) -> Result<()>;
    /// Ends the transaction (read-only: COMMIT and ROLLBACK end it alike; COMMIT
    /// reports a lost connection).
    async fn commit(&mut self, dataset: &str) -> Result<()>;
    /// The connection must not be reused (an error, a cancelled call): close it.
    fn discard(&mut self);
    /// Columns, types (through the engine's type table), row estimate and version.
    async fn describe(&mut self, dataset: &str, source: &Source) -> Result<DatasetInfo>;
    /// Runs a row fetch and hands each row, in canonical form, to `f`, doing what it
    /// answers ([`obey`]); fields marked in `reread` arrive as the engine's own text
    /// (see [`reread`]).
    #[allow(clippy::too_many_arguments)]
    async fn scan(
        &mut self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()>;
    async fn count(&mut self, dataset: &str, sql: &Sql) -> Result<u64>;
    /// Runs a bucketed aggregate rendered by [`crate::dialect::aggregate`].
    async fn aggregate(
        &mut self,
        _dataset: &str,
        _sql: &Sql,
        _key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        Err(AgentError::Unsupported(
            "this engine has no pushed-down aggregate".into(),
        ))
    }
    /// A single text value from a query.
    async fn query_text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>>;
}

/// An engine this agent build knows: the URL schemes that name it and how to open
/// its connector (the pool is created lazily: nothing connects here).
pub struct Engine {
    pub name: &'static str,
    pub schemes: &'static [&'static str],
    pub open: fn(&str, &ConnectionsConfig) -> Result<Box<dyn EngineConnector>>,
}

/// Every engine of this build. Adding an engine is a dialect file, a connector file
/// with its `ENGINE`, and a line here.
pub static ENGINES: &[Engine] = &[
    postgres::ENGINE,
    mysql::ENGINE,
    sqlite::ENGINE,
    #[cfg(feature = "duckdb")]
    duckdb::ENGINE,
    #[cfg(feature = "mssql")]
    mssql::ENGINE,
    #[cfg(feature = "oracle")]
    oracle::ENGINE,
];

/// The engine a URL names, or an error naming the scheme and what to do.
pub fn engine_for_url(url: &str) -> Result<&'static Engine> {
    let scheme = url.split(':').next().unwrap_or("");
    if let Some(e) = ENGINES.iter().find(|e| e.schemes.contains(&scheme)) {
        return Ok(e);
    }
    // an engine this build leaves out names the cargo feature that brings it in
    let feature = match scheme {
        "duckdb" => Some("duckdb"),
        "mssql" | "sqlserver" => Some("mssql"),
        "oracle" => Some("oracle"),
        _ => None,
    };
    Err(AgentError::Config(match feature {
        Some(f) => format!(
            "{scheme}:// datasets need an agent built with the `{f}` cargo feature \
             (cargo build --release -p tally-agent --features tally-agent/{f}; docs/engines.md)"
        ),
        _ => {
            let known: Vec<&str> = ENGINES.iter().flat_map(|e| e.schemes.iter().copied()).collect();
            format!(
                "unknown database URL scheme {scheme:?} (this agent knows {})",
                known.join(", ")
            )
        }
    }))
}

/// The class of a driver's connect failure, from its text (every driver words them
/// its own way): what the coordinator is told, without the text.
pub fn connect_failure_class(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| t.contains(w));
    if any(&["refused"]) {
        "connection refused"
    } else if any(&[
        "password",
        "authentication",
        "access denied",
        "28p01",
        "28000",
        "login failed",
    ]) {
        "authentication failed"
    } else if any(&["tls", "ssl", "certificate"]) {
        "tls"
    } else if any(&[
        "resolve",
        "lookup",
        "name or service not known",
        "nodename",
        "no such host",
    ]) {
        "host not found"
    } else if any(&["timed out", "timeout", "no answer within"]) {
        "connection timed out"
    } else {
        "cannot connect"
    }
}

/// A database URL's engine, with one slot per connection its pool may hold. Every
/// database call takes a slot first and holds it to the end, so calls beyond the cap
/// queue here (up to `acquire_timeout`) and the pool below is never short of one.
pub struct Connector {
    engine: Arc<dyn EngineConnector>,
    slots: Arc<Semaphore>,
    acquire_timeout: Duration,
    /// The URL's load monitor, for datasets with `throttle.max_load`.
    monitor: Arc<crate::connector::throttle::LoadMonitor>,
}

/// A connection and its slot, for one call or one request. A lease that was not
/// [`Lease::finish`]ed (an error, a cancelled call) closes its connection instead of
/// returning it: a pool never hands out a connection inside someone's transaction,
/// or with half a result (a COPY stopped early) still on the wire.
struct Lease {
    conn: Box<dyn EngineConn>,
    _slot: OwnedSemaphorePermit,
    /// A transaction is open on the connection.
    in_tx: bool,
    /// [`Lease::finish`] ran: the connection may go back to the pool.
    done: bool,
}

impl Lease {
    async fn finish(mut self, dataset: &str) -> Result<()> {
        if self.in_tx {
            self.conn.commit(dataset).await?;
        }
        self.done = true;
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done {
            self.conn.discard();
        }
    }
}

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
        Connector::open_probing(url, limits, false)
    }

    /// [`Connector::open_with`]; with `probe`, the engine's pool holds one connection
    /// more than the URL's slots, for the load monitor (`throttle.max_load`), so the
    /// probe never waits behind the reads it watches.
    pub fn open_probing(url: &str, limits: &ConnectionsConfig, probe: bool) -> Result<Connector> {
        let mut pool = *limits;
        if probe {
            pool.max_connections += 1;
        }
        let engine = (engine_for_url(url)?.open)(url, &pool)?;
        Ok(Connector {
            engine: Arc::from(engine),
            slots: Arc::new(Semaphore::new(limits.max_connections as usize)),
            acquire_timeout: limits.acquire_timeout(),
            monitor: Arc::default(),
        })
    }

    /// The load probe of this URL's engine, if its dialect has one.
    pub fn probe(&self) -> Option<crate::connector::throttle::Probe> {
        let statements = self.engine.dialect().load_probe_sql();
        (!statements.is_empty()).then(|| crate::connector::throttle::Probe {
            engine: Arc::clone(&self.engine),
            statements,
        })
    }

    /// Starts a throttled read (see [`crate::connector::throttle::Pacer::start`]).
    pub async fn pacer<'a>(
        &self,
        throttle: &'a crate::connector::throttle::Throttle,
        dataset: &str,
    ) -> Result<crate::connector::throttle::Pacer<'a>> {
        crate::connector::throttle::Pacer::start(throttle, &self.monitor, self.probe().as_ref(), dataset)
            .await
    }

    /// The engine behind this URL.
    pub fn engine(&self) -> &dyn EngineConnector {
        self.engine.as_ref()
    }

    /// See [`EngineConnector::dialect_for`].
    pub fn dialect_for(&self, info: &DatasetInfo) -> &dyn Dialect {
        self.engine.dialect_for(info)
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

    /// A slot, then a connection; with `begin`, inside a new read-only REPEATABLE
    /// READ transaction.
    async fn lease(&self, dataset: &str, begin: bool) -> Result<Lease> {
        let slot = self.slot(dataset).await?;
        let conn = match self.engine.connect(dataset).await {
            Ok(c) => c,
            // a pool that timed out says nothing of why: one direct connection does
            // (its text stays in the zone's log; the answer names the class only)
            Err(AgentError::DatabaseUnavailable {
                dataset: d,
                kind: "connection timed out",
            }) => {
                let kind = match tokio::time::timeout(Duration::from_secs(2), self.engine.ping()).await {
                    Ok(Err(text)) => {
                        tracing::warn!(dataset = %d, error = %text, "cannot connect to the database");
                        connect_failure_class(&text)
                    }
                    _ => "connection timed out",
                };
                return Err(AgentError::DatabaseUnavailable { dataset: d, kind });
            }
            Err(e) => return Err(e),
        };
        let mut lease = Lease {
            conn,
            _slot: slot,
            in_tx: begin,
            done: false,
        };
        if begin {
            lease.conn.begin(dataset).await?;
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

    /// See [`EngineConnector::ping`]; bounded by [`CONNECT_TIMEOUT`].
    pub async fn ping(&self) -> std::result::Result<(), String> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.engine.ping())
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
        self.engine.dialect()
    }

    /// See [`EngineConnector::fetch_shape`].
    pub fn fetch_shape(&self) -> FetchShape {
        self.engine.fetch_shape()
    }

    async fn describe_on(
        &self,
        l: &mut Lease,
        dataset: &str,
        source: &Source,
        key: &[String],
    ) -> Result<DatasetInfo> {
        let mut info = l.conn.describe(dataset, source).await?;
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

    /// A row fetch; with a throttle, paced by it (and, with `max_load`, started only
    /// once the database's load allows).
    #[allow(clippy::too_many_arguments)]
    async fn scan_on(
        &self,
        l: &mut Lease,
        dataset: &str,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        throttle: Option<&crate::connector::throttle::Throttle>,
        f: &mut (dyn FnMut(&CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let reread = reread(self.dialect(), shape, cols);
        let mut pacer = match throttle {
            Some(t) => Some(self.pacer(t, dataset).await?),
            None => None,
        };
        l.conn
            .scan(dataset, sql, cols, key_len, &reread, &mut |row| {
                f(row)?;
                match &mut pacer {
                    Some(p) => p.after_row(),
                    None => Ok(Flow::Go),
                }
            })
            .await
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
        f: &mut (dyn FnMut(&CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        let mut l = self.lease(dataset, false).await?;
        let r = self
            .scan_on(&mut l, dataset, sql, shape, cols, key_len, None, f)
            .await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// [`Session::count`] on a connection of its own (tests).
    pub async fn count(&self, dataset: &str, sql: &Sql) -> Result<u64> {
        let mut l = self.lease(dataset, false).await?;
        let r = l.conn.count(dataset, sql).await;
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
        let r = l.conn.aggregate(dataset, sql, key_classes).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// A single text value from a query (for tests and `check`).
    pub async fn query_text(&self, dataset: &str, sql: &str) -> Result<Option<String>> {
        let mut l = self.lease(dataset, false).await?;
        let r = l.conn.query_text(dataset, sql).await;
        if r.is_ok() {
            l.finish(dataset).await?;
        }
        r
    }

    /// See [`EngineConnector::prefers_in_process`].
    pub fn prefers_in_process(&self) -> bool {
        self.engine.prefers_in_process()
    }

    /// See [`EngineConnector::copies_out`].
    pub fn copies_out(&self) -> bool {
        self.engine.copies_out()
    }

    /// See [`EngineConnector::supports_pushdown`].
    pub fn supports_pushdown(&self) -> bool {
        self.engine.supports_pushdown()
    }

    /// See [`EngineConnector::not_live_verified`].
    pub fn not_live_verified(&self) -> Option<&'static str> {
        self.engine.not_live_verified()
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
    /// A row fetch in this request's transaction, paced by `throttle` if given.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &mut self,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        throttle: Option<&crate::connector::throttle::Throttle>,
        f: &mut (dyn FnMut(&CanonRow) -> Result<()> + Send),
    ) -> Result<()> {
        self.connector
            .scan_on(
                &mut self.lease,
                &self.dataset,
                sql,
                shape,
                cols,
                key_len,
                throttle,
                f,
            )
            .await
    }

    pub async fn count(&mut self, sql: &Sql) -> Result<u64> {
        self.lease.conn.count(&self.dataset, sql).await
    }

    /// Runs a bucketed aggregate rendered by [`crate::dialect::aggregate`].
    pub async fn aggregate(&mut self, sql: &Sql, key_classes: &[TypeClass]) -> Result<Vec<AggRow>> {
        self.lease.conn.aggregate(&self.dataset, sql, key_classes).await
    }

    pub async fn query_text(&mut self, sql: &str) -> Result<Option<String>> {
        self.lease.conn.query_text(&self.dataset, sql).await
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

/// Builds each row of a fetch in one reused [`CanonRow`]: a reader starts a row, pushes
/// its fields as the driver gives them (those marked in `reread` hold the engine's own
/// text and are rendered to canonical form here), and lends the finished row to its sink.
pub struct RowBuilder<'a> {
    dataset: &'a str,
    cols: &'a [BoundColumn],
    key_len: usize,
    reread: &'a [bool],
    row: CanonRow,
    /// Where a re-read value's canonical form is rendered, reused from value to value.
    scratch: String,
}

impl<'a> RowBuilder<'a> {
    pub fn new(dataset: &'a str, cols: &'a [BoundColumn], key_len: usize, reread: &'a [bool]) -> Self {
        RowBuilder {
            dataset,
            cols,
            key_len,
            reread,
            row: CanonRow::default(),
            scratch: String::new(),
        }
    }

    /// Starts the next row.
    pub fn start(&mut self) {
        self.row.clear();
    }

    /// Appends the next field as read. A field past the requested columns is an error
    /// ([`RowBuilder::finish`] checks there were not fewer).
    pub fn push(&mut self, value: Option<&str>) -> Result<()> {
        let i = self.row.width();
        let Some(c) = self.cols.get(i) else {
            return Err(self.shape_error());
        };
        if let Some(text) = value
            && self.reread.get(i).copied().unwrap_or(false)
            && (c.info.class, c.spec.format.class) == (TypeClass::Float, TypeClass::Decimal)
        {
            // a float compared as a decimal: the double its text reads as, at its
            // shortest decimal (an engine's text need not be that: PostgreSQL's is not
            // always), never the digits as written
            let f = text.trim().parse::<f64>().map_err(|_| {
                canonical_error(
                    self.dataset,
                    &c.info.name,
                    CanonicalError::Invalid {
                        class: "float",
                        value: text.to_string(),
                        reason: "not a number",
                    },
                )
            })?;
            let v = canonical_value(&c.spec.format, &Value::Float(f))
                .map_err(|e| canonical_error(self.dataset, &c.info.name, e))?;
            self.row.push_field(v.as_deref());
        } else if value.is_some() && self.reread.get(i).copied().unwrap_or(false) {
            let v = canonical_from_text_in(&c.spec.format, value, &mut self.scratch)
                .map_err(|e| canonical_error(self.dataset, &c.info.name, e))?;
            self.row.push_field(v);
        } else {
            self.row.push_field(value);
        }
        Ok(())
    }

    /// Appends a field already in canonical form (readers that render values themselves).
    pub fn push_canonical(&mut self, value: Option<&str>) -> Result<()> {
        if self.row.width() >= self.cols.len() {
            return Err(self.shape_error());
        }
        self.row.push_field(value);
        Ok(())
    }

    /// The finished row, its key parsed from the key fields.
    pub fn finish(&mut self) -> Result<&CanonRow> {
        if self.row.width() != self.cols.len() {
            return Err(self.shape_error());
        }
        let mut key = std::mem::take(&mut self.row.key);
        key.clear();
        let parsed = key_into(&self.row, self.cols, self.key_len, &mut key);
        self.row.key = key;
        parsed?;
        Ok(&self.row)
    }

    /// A row of owned fields, as [`RowBuilder::push`] would build it field by field.
    pub fn row_of(&mut self, fields: Vec<Option<String>>) -> Result<&CanonRow> {
        self.start();
        for f in &fields {
            self.push(f.as_deref())?;
        }
        self.finish()
    }

    /// A row of owned fields already in canonical form.
    pub fn canonical_row_of(&mut self, fields: &[Option<String>]) -> Result<&CanonRow> {
        self.start();
        for f in fields {
            self.push_canonical(f.as_deref())?;
        }
        self.finish()
    }

    fn shape_error(&self) -> AgentError {
        AgentError::Query {
            dataset: self.dataset.to_string(),
            kind: "unexpected row shape",
        }
    }
}

/// Key parts from a row's canonical key texts. A key is an integer only where it is
/// compared as one: an integer column keyed against the other side's decimal (DESIGN
/// §3) is compared by its decimal text, as that side's is, and may hold what no `i64`
/// does (MySQL `BIGINT UNSIGNED` against PostgreSQL `numeric(20,0)`).
pub(crate) fn key_into(
    row: &CanonRow,
    cols: &[BoundColumn],
    key_len: usize,
    key: &mut KeyTuple,
) -> Result<()> {
    for (i, c) in cols.iter().enumerate().take(key_len) {
        let integer = c.info.class == TypeClass::Integer && c.spec.format.class == TypeClass::Integer;
        key.push(match row.field(i) {
            None => {
                return Err(AgentError::InvalidArgument(format!(
                    "key column {} holds NULL",
                    c.info.name
                )));
            }
            Some(t) if integer => KeyPart::Int(t.parse::<i64>().map_err(|_| {
                AgentError::InvalidArgument(format!("key column {} is not a 64-bit integer", c.info.name))
            })?),
            Some(t) => KeyPart::Text(t.to_string()),
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::canonical::{FieldFormat, row_string};
    use tally_common::segment::ColumnSpec;

    fn col(name: &str, class: TypeClass, scale: u32) -> BoundColumn {
        BoundColumn {
            info: crate::schema::TypeEntry::of(class).scale(Some(scale)).column(
                name.into(),
                String::new(),
                true,
            ),
            spec: ColumnSpec {
                name: name.into(),
                format: FieldFormat::new(class).with_scale(scale),
            },
            zone: None,
        }
    }

    #[test]
    fn a_reused_row_reads_back_each_row_as_built_alone() {
        let cols = [
            col("id", TypeClass::Integer, 0),
            col("k", TypeClass::Text, 0),
            col("amount", TypeClass::Decimal, 2),
            col("note", TypeClass::Text, 0),
        ];
        // the decimal arrives as the engine's own text and is rendered here
        let reread = [false, false, true, false];
        let mut b = RowBuilder::new("t", &cols, 2, &reread);
        let rows: [[Option<&str>; 4]; 3] = [
            [Some("7"), Some("a:b"), Some("1.5"), None],
            // a text that looks like an encoding, an empty text (not NULL), a longer row
            [Some("-12"), Some("~"), None, Some("")],
            [Some("3"), Some("12:x"), Some("10"), Some("Zoë ~ 3:abc")],
        ];
        let want = [
            [Some("7"), Some("a:b"), Some("1.50"), None],
            [Some("-12"), Some("~"), None, Some("")],
            [Some("3"), Some("12:x"), Some("10.00"), Some("Zoë ~ 3:abc")],
        ];
        for (r, w) in rows.iter().zip(&want) {
            b.start();
            for v in r {
                b.push(*v).unwrap();
            }
            let row = b.finish().unwrap();
            assert_eq!(row.fields().collect::<Vec<_>>(), w.to_vec());
            assert_eq!(row.row_string(), row_string(w.iter().copied()));
            assert_eq!(row.key_string(2), row_string(w[..2].iter().copied()));
            assert_eq!(row.key_string(0), "");
            let key = vec![
                KeyPart::Int(w[0].unwrap().parse().unwrap()),
                KeyPart::Text(w[1].unwrap().to_string()),
            ];
            assert_eq!(row.key, key);
            assert_eq!(*row, CanonRow::new(key, &row.to_fields()));
        }
    }

    #[test]
    fn a_row_of_the_wrong_width_or_a_bad_key_is_refused() {
        let cols = [col("id", TypeClass::Integer, 0), col("v", TypeClass::Text, 0)];
        let mut b = RowBuilder::new("t", &cols, 1, &[]);
        b.start();
        b.push(Some("1")).unwrap();
        assert!(b.finish().is_err(), "a short row");
        b.start();
        for v in [Some("1"), Some("a")] {
            b.push(v).unwrap();
        }
        assert!(b.push(Some("b")).is_err(), "a long row");
        assert!(
            b.canonical_row_of(&[None, Some("a".into())]).is_err(),
            "a NULL key"
        );
        assert!(
            b.canonical_row_of(&[Some("x".into()), Some("a".into())]).is_err(),
            "an integer key that is not one"
        );
        assert_eq!(
            b.canonical_row_of(&[Some("2".into()), None]).unwrap().key,
            vec![KeyPart::Int(2)]
        );
    }

    #[test]
    fn an_integer_key_compared_as_a_decimal_is_its_decimal_text_whatever_its_size() {
        // MySQL BIGINT UNSIGNED keyed against PostgreSQL numeric(20,0): both sides'
        // keys are the decimal's canonical text, beyond i64 too
        let mut id = col("id", TypeClass::Integer, 0);
        id.spec.format = FieldFormat::new(TypeClass::Decimal).with_scale(0);
        let cols = [id, col("v", TypeClass::Text, 0)];
        let mut b = RowBuilder::new("t", &cols, 1, &[]);
        for v in ["18446744073709551615", "77"] {
            let row = b.row_of(vec![Some(v.into()), Some("x".into())]).unwrap();
            assert_eq!(row.key, vec![KeyPart::Text(v.into())]);
        }
    }

    #[test]
    fn a_connect_failure_is_told_by_its_class_whatever_the_driver_says() {
        for (text, class) in [
            (
                "error communicating with database: Connection refused (os error 111)",
                "connection refused",
            ),
            (
                "password authentication failed for user \"tally\"",
                "authentication failed",
            ),
            (
                "error returned from database: 1045 (28000): Access denied for user",
                "authentication failed",
            ),
            (
                "error with configuration: failed to resolve host: Name or service not known",
                "host not found",
            ),
            (
                "error occurred while attempting to establish a TLS connection: invalid certificate",
                "tls",
            ),
            (
                "no answer within 5 s (a firewall dropping packets, or a wrong host)",
                "connection timed out",
            ),
            ("something else entirely", "cannot connect"),
        ] {
            assert_eq!(connect_failure_class(text), class, "{text}");
        }
    }

    /// An engine left out of this build is named with the feature that brings it in;
    /// an engine in it opens (nothing connects until a call).
    #[test]
    fn a_url_of_an_engine_left_out_names_its_cargo_feature() {
        for (url, feature, built) in [
            ("duckdb:///tmp/x.duckdb", "duckdb", cfg!(feature = "duckdb")),
            ("sqlserver://h:1433/db", "mssql", cfg!(feature = "mssql")),
            ("mssql://h:1433/db", "mssql", cfg!(feature = "mssql")),
            ("oracle://h:1521/db", "oracle", cfg!(feature = "oracle")),
        ] {
            match engine_for_url(url) {
                Ok(e) => assert!(built, "{url} opened as {} without its feature", e.name),
                Err(e) => {
                    assert!(!built, "{url}: {e}");
                    assert!(
                        e.to_string().contains(&format!("`{feature}` cargo feature")),
                        "{e}"
                    );
                }
            }
        }
        assert!(engine_for_url("postgres://h/db").is_ok());
        assert!(
            engine_for_url("nosuch://h/db")
                .err()
                .is_some_and(|e| e.to_string().contains("unknown"))
        );
    }
}
