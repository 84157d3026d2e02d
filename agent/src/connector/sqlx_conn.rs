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
