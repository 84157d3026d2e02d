//! What an engine implements: its connector ([`EngineConnector`]) and its
//! connection ([`EngineConn`]), and how a row sink steers a read ([`Flow`]).

use std::time::Duration;

use futures::future::BoxFuture;

use tally_common::segment::KeyTuple;
use tally_common::types::TypeClass;

use crate::config::Source;
use crate::dialect::{Dialect, FetchShape, Sql};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

use super::CanonRow;

/// What a row sink asks of the reader after a row: read on, pause reading first (a
/// throttle, [`crate::connector::throttle`]), or wait for the sink's consumer. A paused
/// or waiting reader stops taking rows from the engine; its statement stays open.
pub enum Flow {
    Go,
    Pause(Duration),
    /// Wait for this before reading on: a sink whose consumer has no room yet (a slow
    /// client of a digest stream) hands over what it waits for; its error ends the read.
    Wait(BoxFuture<'static, Result<()>>),
}

impl std::fmt::Debug for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Flow::Go => write!(f, "Go"),
            Flow::Pause(d) => write!(f, "Pause({d:?})"),
            Flow::Wait(_) => write!(f, "Wait"),
        }
    }
}

impl Flow {
    /// What `self` asks, then what `next` asks.
    pub fn then(self, next: Flow) -> Flow {
        match (self, next) {
            (Flow::Go, f) | (f, Flow::Go) => f,
            (Flow::Pause(a), Flow::Pause(b)) => Flow::Pause(a + b),
            (a, b) => Flow::Wait(Box::pin(async move {
                obey(a).await?;
                obey(b).await
            })),
        }
    }
}

/// Where a row fetch hands its rows.
pub type RowSink<'a> = dyn FnMut(&CanonRow) -> Result<Flow> + Send + 'a;

/// Does what a sink asked: every engine's read loop awaits it after each row.
pub async fn obey(flow: Flow) -> Result<()> {
    match flow {
        Flow::Go => Ok(()),
        Flow::Pause(d) => {
            tokio::time::sleep(d).await;
            Ok(())
        }
        Flow::Wait(f) => f.await,
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
