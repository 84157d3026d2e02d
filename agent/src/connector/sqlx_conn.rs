//! What the sqlx engines (PostgreSQL, MySQL/MariaDB, SQLite) share: a pooled
//! connection held for one call or one request, the statements that open and end its
//! transaction, closing it when it must not go back to the pool, and a connect outside
//! the pool for `check`. Each engine's file adds only its catalog queries and its row
//! decoding.

use sqlx::pool::PoolConnection;
use sqlx::{Database, Executor, Pool};

use crate::error::{AgentError, Result};

/// One pooled connection of a sqlx engine `E`.
pub struct SqlxConn<E, DB: Database> {
    pub engine: E,
    pub conn: PoolConnection<DB>,
}

impl<E, DB> SqlxConn<E, DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// A connection of `pool` (its own acquire timeout times only the connect: a slot
    /// was taken before, see [`super::Connector`]).
    pub async fn acquire(engine: E, pool: &Pool<DB>, dataset: &str) -> Result<Self> {
        let conn = pool
            .acquire()
            .await
            .map_err(|e| AgentError::from_db(dataset, e))?;
        Ok(SqlxConn { engine, conn })
    }

    /// Runs fixed statements (a transaction's BEGIN or COMMIT) in order.
    pub async fn run(&mut self, dataset: &str, statements: &[&'static str]) -> Result<()> {
        for s in statements {
            sqlx::raw_sql(*s)
                .execute(&mut *self.conn)
                .await
                .map_err(|e| AgentError::from_db(dataset, e))?;
        }
        Ok(())
    }

    /// Closes the connection when it is dropped instead of returning it to the pool.
    pub fn discard(&mut self) {
        self.conn.close_on_drop();
    }
}

/// Ends a read-only transaction: COMMIT and ROLLBACK end it alike; COMMIT reports a
/// lost connection.
pub const COMMIT: &[&str] = &["COMMIT"];

/// One connection with `pool`'s options but outside it, closed again: the driver's own
/// error where the pool would retry until its timeout.
pub async fn ping<DB: Database>(pool: &Pool<DB>) -> std::result::Result<(), String> {
    use sqlx::{ConnectOptions, Connection};
    async { pool.connect_options().connect().await?.close().await }
        .await
        .map_err(|e: sqlx::Error| e.to_string())
}

/// The [`super::EngineConn`] of a sqlx engine: `SqlxConn<$engine, $db>`, delegating to
/// the connector's inherent `describe`, `scan`, `count`, `aggregate` and `query_text`
/// over its connection, with the engine file's `BEGIN` statements.
macro_rules! sqlx_engine_conn {
    ($engine:ty, $db:ty) => {
        #[async_trait::async_trait]
        impl $crate::connector::EngineConn for $crate::connector::sqlx_conn::SqlxConn<$engine, $db> {
            async fn begin(&mut self, dataset: &str) -> $crate::error::Result<()> {
                self.run(dataset, BEGIN).await
            }

            async fn commit(&mut self, dataset: &str) -> $crate::error::Result<()> {
                self.run(dataset, $crate::connector::sqlx_conn::COMMIT)
                    .await
            }

            fn discard(&mut self) {
                $crate::connector::sqlx_conn::SqlxConn::discard(self)
            }

            async fn describe(
                &mut self,
                dataset: &str,
                source: &$crate::config::Source,
            ) -> $crate::error::Result<$crate::schema::DatasetInfo> {
                self.engine.describe(&mut self.conn, dataset, source).await
            }

            async fn scan(
                &mut self,
                dataset: &str,
                sql: &$crate::dialect::Sql,
                cols: &[$crate::schema::BoundColumn],
                key_len: usize,
                reread: &[bool],
                f: &mut $crate::connector::RowSink<'_>,
            ) -> $crate::error::Result<()> {
                self.engine
                    .scan(&mut self.conn, dataset, sql, cols, key_len, reread, f)
                    .await
            }

            async fn count(
                &mut self,
                dataset: &str,
                sql: &$crate::dialect::Sql,
            ) -> $crate::error::Result<u64> {
                self.engine.count(&mut self.conn, dataset, sql).await
            }

            async fn aggregate(
                &mut self,
                dataset: &str,
                sql: &$crate::dialect::Sql,
                key_classes: &[tally_common::types::TypeClass],
            ) -> $crate::error::Result<Vec<$crate::connector::AggRow>> {
                self.engine
                    .aggregate(&mut self.conn, dataset, sql, key_classes)
                    .await
            }

            async fn query_text(
                &mut self,
                dataset: &str,
                sql: &str,
            ) -> $crate::error::Result<Option<String>> {
                self.engine.query_text(&mut self.conn, dataset, sql).await
            }
        }
    };
}
pub(crate) use sqlx_engine_conn;

/// A sqlx row stream that holds no tracing span. sqlx wraps each row stream in the span
/// current when the stream is made, and its inner stream in the one current at the
/// first poll, and enters and leaves that span on every poll: for a row fetch, twice
/// per row. Under the agent's request span and log filter that cost a MariaDB scan
/// about 13 % of its CPU (scanbench with `SCANBENCH_SPAN=1`, docs/performance.md).
/// The stream is therefore made, and its first row taken, under [`quiet`], so both
/// wrappers hold no span; the agent's own events (errors, throttle pauses) are logged
/// outside those two calls, under the request's span as before. What sqlx itself logs
/// inside them is not written: the statement line (and slow-statement warning) of a
/// fetch that ends before its first row, and a notice before a COPY's first line.
/// PostgreSQL's `COPY ... TO STDOUT` stream ([`SpanlessRows::made_by`]) sends one
/// message per row too: its span cost the PostgreSQL agent about 7 % of its CPU.
pub struct SpanlessRows<S> {
    rows: S,
    started: bool,
}

/// A dispatcher that records nothing, registered once. It must be a registered
/// dispatcher, not `Dispatch::none()`: with a single registered dispatcher, tracing
/// decides whether a log line is wanted by asking the current thread's dispatcher the
/// first time the line fires, and caches the answer for the process, so a line first
/// reached under `Dispatch::none()` would stay off for good (tokio-rs/tracing#2874).
/// With this one registered as well, that decision is taken over all dispatchers.
fn quiet() -> &'static tracing::Dispatch {
    static QUIET: std::sync::LazyLock<tracing::Dispatch> =
        std::sync::LazyLock::new(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    &QUIET
}

impl<S: futures::TryStream + Unpin> SpanlessRows<S> {
    pub fn new(make: impl FnOnce() -> S) -> Self {
        SpanlessRows {
            rows: tracing::dispatcher::with_default(quiet(), make),
            started: false,
        }
    }

    /// [`SpanlessRows::new`] for a stream that an async call makes (PostgreSQL's
    /// `COPY ... TO STDOUT`, whose stream sends one message per row).
    pub async fn made_by<E>(
        make: impl std::future::Future<Output = std::result::Result<S, E>>,
    ) -> std::result::Result<Self, E> {
        use tracing::instrument::WithSubscriber;
        Ok(SpanlessRows {
            rows: make.with_subscriber(quiet().clone()).await?,
            started: false,
        })
    }

    pub async fn next(&mut self) -> std::result::Result<Option<S::Ok>, S::Error> {
        use futures::TryStreamExt;
        use tracing::instrument::WithSubscriber;
        if self.started {
            return self.rows.try_next().await;
        }
        self.started = true;
        self.rows.try_next().with_subscriber(quiet().clone()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;
    use tracing::Subscriber;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata};

    use super::SpanlessRows;

    /// Counts the events it is given, and says it wants every callsite.
    struct Counting(Arc<AtomicUsize>);

    impl Subscriber for Counting {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[tokio::test]
    async fn every_row_arrives_once_and_a_line_first_reached_inside_still_logs_after() {
        let seen = Arc::new(AtomicUsize::new(0));
        let _global = tracing::dispatcher::set_default(&tracing::Dispatch::new(Counting(seen.clone())));
        // one log line, first reached inside the quiet scope (while the stream is made
        // and polled for its first row), then again outside it
        let line = || tracing::warn!(target: "spanless_test", "a line");
        let mut rows = SpanlessRows::new(|| {
            line();
            futures::stream::iter((0..5).map(Ok::<i32, ()>))
                .inspect(move |_| line())
                .boxed()
        });
        let mut got = Vec::new();
        while let Some(r) = rows.next().await.unwrap() {
            got.push(r);
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4], "no row skipped or repeated");
        // made and first row: 2 lines unwritten; rows 1..4: 4 lines written
        assert_eq!(seen.load(Ordering::SeqCst), 4);
        line();
        assert_eq!(
            seen.load(Ordering::SeqCst),
            5,
            "the line was not switched off for good"
        );
    }
}
