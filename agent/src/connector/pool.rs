//! A database URL's [`Connector`]: its engine, one slot per connection its pool may
//! hold, and the [`Session`] a request reads one snapshot through.

use std::sync::Arc;
use std::time::Duration;

use tally_common::types::TypeClass;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{ConnectionsConfig, Source};
use crate::dialect::{Dialect, FetchShape, Sql};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

use super::{
    AggRow, CONNECT_TIMEOUT, CanonRow, EngineConn, EngineConnector, Flow, connect_failure_class,
    engine_for_url, reread,
};

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
        f: &mut (dyn FnMut(&CanonRow) -> Result<Flow> + Send),
    ) -> Result<()> {
        let reread = reread(self.dialect(), shape, cols);
        let mut pacer = match throttle {
            Some(t) => Some(self.pacer(t, dataset).await?),
            None => None,
        };
        l.conn
            .scan(dataset, sql, cols, key_len, &reread, &mut |row| {
                let asked = f(row)?;
                match &mut pacer {
                    Some(p) => Ok(asked.then(p.after_row()?)),
                    None => Ok(asked),
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
            .scan_on(&mut l, dataset, sql, shape, cols, key_len, None, &mut |row| {
                f(row).map(|()| Flow::Go)
            })
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
    /// A row fetch in this request's transaction, paced by `throttle` if given, and
    /// waiting for what `f` answers ([`Flow`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &mut self,
        sql: &Sql,
        shape: FetchShape,
        cols: &[BoundColumn],
        key_len: usize,
        throttle: Option<&crate::connector::throttle::Throttle>,
        f: &mut (dyn FnMut(&CanonRow) -> Result<Flow> + Send),
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

/// Connections of an engine whose driver has no pool of its own (SQL Server, Oracle):
/// a connection that finished a call or request cleanly goes back here, for the next,
/// and at most `connections.max_connections` wait here.
#[cfg(any(feature = "mssql", feature = "oracle"))]
pub struct IdlePool<C> {
    idle: Arc<std::sync::Mutex<Vec<C>>>,
    max: usize,
}

#[cfg(any(feature = "mssql", feature = "oracle"))]
impl<C> Clone for IdlePool<C> {
    fn clone(&self) -> Self {
        IdlePool {
            idle: Arc::clone(&self.idle),
            max: self.max,
        }
    }
}

#[cfg(any(feature = "mssql", feature = "oracle"))]
impl<C> IdlePool<C> {
    pub fn new(limits: &ConnectionsConfig) -> Self {
        IdlePool {
            idle: Arc::new(std::sync::Mutex::new(Vec::new())),
            max: limits.max_connections as usize,
        }
    }

    /// An idle connection, if one waits.
    pub fn reuse(&self) -> Option<C> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Lends `conn` (reused or new) to one call or request.
    pub fn lend(&self, conn: C) -> Pooled<C> {
        Pooled {
            pool: self.clone(),
            conn: Some(conn),
            in_tx: false,
        }
    }
}

/// A connection lent by an [`IdlePool`]: back to it when dropped, unless it was
/// discarded or is inside a transaction (a pool never hands out a connection inside
/// someone's transaction).
#[cfg(any(feature = "mssql", feature = "oracle"))]
pub struct Pooled<C> {
    pool: IdlePool<C>,
    conn: Option<C>,
    /// Set from `begin` until `commit` succeeds.
    pub in_tx: bool,
}

#[cfg(any(feature = "mssql", feature = "oracle"))]
impl<C> Pooled<C> {
    /// The connection; `None` once discarded (or while a blocking call holds it).
    pub fn slot(&mut self) -> &mut Option<C> {
        &mut self.conn
    }

    /// Closes the connection instead of returning it.
    pub fn discard(&mut self) {
        self.conn = None;
    }
}

#[cfg(any(feature = "mssql", feature = "oracle"))]
impl<C> Drop for Pooled<C> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take().filter(|_| !self.in_tx) {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < self.pool.max {
                idle.push(c);
            }
        }
    }
}
