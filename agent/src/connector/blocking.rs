//! Blocking drivers (DuckDB, Oracle) on the async agent: each call runs on
//! `spawn_blocking` with its connection moved in and back out ([`run`]), and a row read
//! crosses back to the async side through a bounded channel ([`scan`]), where the rows
//! are built and handed to the sink, which may pause the reader (a throttle) or stop it.

use tokio::sync::mpsc;

use super::{RowBuilder, RowSink, obey};
use crate::error::{AgentError, Result};
use crate::schema::BoundColumn;

/// One row's fields as a blocking driver read them.
pub type Fields = Vec<Option<String>>;

/// Rows read ahead of the sink at most: a reader waits for room beyond it.
const ROWS_AHEAD: usize = 1024;

/// The connection of a call, taken out for a blocking thread.
pub fn take<C>(conn: &mut Option<C>, dataset: &str) -> Result<C> {
    conn.take().ok_or_else(|| AgentError::Query {
        dataset: dataset.to_string(),
        kind: "connection lost",
    })
}

/// Runs `f` with the connection on a blocking thread; the connection comes back with
/// the answer (lost, and the session with it, if `f` panics).
pub async fn run<C: Send + 'static, T: Send + 'static>(
    conn: &mut Option<C>,
    dataset: &str,
    f: impl FnOnce(&C) -> Result<T> + Send + 'static,
) -> Result<T> {
    let c = take(conn, dataset)?;
    let (c, r) = tokio::task::spawn_blocking(move || {
        let r = f(&c);
        (c, r)
    })
    .await
    .map_err(|_| AgentError::Query {
        dataset: dataset.to_string(),
        kind: "worker panicked",
    })?;
    *conn = Some(c);
    r
}

/// Where a blocking reader hands its rows.
pub struct RowSender(mpsc::Sender<Result<Fields>>);

impl RowSender {
    /// Hands one row to the async side, waiting while it is [`ROWS_AHEAD`] rows
    /// behind; `false` when it stopped taking rows (the reader stops reading).
    pub fn send(&self, fields: Fields) -> bool {
        self.0.blocking_send(Ok(fields)).is_ok()
    }
}

/// A row read by a blocking driver: `read` runs with the connection on a blocking
/// thread and sends each row's fields (its error, if it returns one, ends the rows);
/// each row is built here with `reread` ([`RowBuilder::row_of`]) and lent to `f`. When
/// `f` fails, the reader's next send tells it to stop, and the connection comes back
/// once it has.
pub async fn scan<C: Send + 'static>(
    conn: &mut Option<C>,
    dataset: &str,
    cols: &[BoundColumn],
    key_len: usize,
    reread: &[bool],
    f: &mut RowSink<'_>,
    read: impl FnOnce(&C, &RowSender) -> Result<()> + Send + 'static,
) -> Result<()> {
    let (tx, mut rx) = mpsc::channel::<Result<Fields>>(ROWS_AHEAD);
    let reader = run(conn, dataset, move |c| {
        let rows = RowSender(tx);
        if let Err(e) = read(c, &rows) {
            let _ = rows.0.blocking_send(Err(e));
        }
        Ok(())
    });
    // the receiver is the consumer's: when it stops (an error of `f`), dropping it ends
    // the reader's sends, so the join below cannot wait on a full channel
    let consume = async move {
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        while let Some(fields) = rx.recv().await {
            // the builder refuses a row of other than the requested width
            obey(f(b.row_of(fields?)?)?).await?;
        }
        Ok(())
    };
    let (read, consumed) = tokio::join!(reader, consume);
    consumed.and(read)
}
