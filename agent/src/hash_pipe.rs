//! Reading and hashing pipelined. An in-process level's scan reads each row, renders
//! its canonical row string and finds its child; hashing the row string (SHA-256,
//! keyed when sealed) is the rest of a row's cost. [`HashPipe`] collects row strings
//! with their children in batches and hands each full batch to a hashing thread, so
//! the reading thread goes on reading while another core hashes.
//!
//! The reader never waits for the hasher: when the hasher still has
//! [`IN_FLIGHT`] batches queued, the reader hashes the batch itself. Each side sums
//! into its own aggregates, and [`HashPipe::finish`] merges them (COUNT, wrapping SUM
//! and XOR are the same in any order and any split of the rows). A hashing thread that
//! ends without its sums is an error, never a partial result. Scans shorter than one
//! batch never start a thread.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use tally_common::checksum::{AnyAggregate, Hasher};

use crate::error::{AgentError, Result};

/// A batch is handed over when it holds this many bytes of row strings…
const BATCH_BYTES: usize = 64 * 1024;
/// …or this many rows.
pub const BATCH_ROWS: usize = 1024;
/// Batches queued for the hashing thread before the reader hashes one itself.
pub const IN_FLIGHT: usize = 4;

/// Whether a dataset's scans hash on a second thread: `hash_thread:` in its
/// configuration, or by default where the host has more than one core.
pub fn enabled(configured: Option<bool>) -> bool {
    configured.unwrap_or_else(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// Row strings one after another, each with its child and where it ends.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    rows: Vec<(usize, usize)>,
}

impl Batch {
    fn full(&self) -> bool {
        self.rows.len() >= BATCH_ROWS || self.bytes.len() >= BATCH_BYTES
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.rows.clear();
    }

    fn hash_into(&self, h: &Hasher, aggs: &mut [AnyAggregate]) {
        let mut start = 0;
        for &(child, end) in &self.rows {
            aggs[child].add_checksum(h.row(&self.bytes[start..end]));
            start = end;
        }
    }
}

struct Worker {
    to: SyncSender<Batch>,
    /// Hashed batches coming back, to be filled again.
    spare: Receiver<Batch>,
    /// The thread's sums and how many rows it hashed.
    handle: JoinHandle<(Vec<AnyAggregate>, u64)>,
}

/// Row checksums summed into `children` aggregates, hashed on a second thread where
/// [`enabled`] (else as each row comes).
pub struct HashPipe {
    hasher: Hasher,
    /// The reader's own sums: rows hashed inline.
    aggs: Vec<AnyAggregate>,
    batch: Batch,
    worker: Option<Worker>,
    threaded: bool,
    xor: bool,
}

impl HashPipe {
    pub fn new(hasher: &Hasher, children: usize, xor: bool, threaded: bool) -> HashPipe {
        HashPipe {
            hasher: hasher.clone(),
            aggs: vec![AnyAggregate::empty(hasher.method(), xor); children],
            batch: Batch::default(),
            worker: None,
            threaded,
            xor,
        }
    }

    /// Adds a row (its canonical row string) to child `child`'s aggregate.
    pub fn add(&mut self, child: usize, row: &[u8]) {
        // a row as long as a batch is hashed here: its hashing outweighs the hand-over,
        // and batches (and the spares kept for reuse) stay small whatever the rows
        if !self.threaded || row.len() >= BATCH_BYTES {
            self.aggs[child].add_checksum(self.hasher.row(row));
            return;
        }
        self.batch.bytes.extend_from_slice(row);
        self.batch.rows.push((child, self.batch.bytes.len()));
        if self.batch.full() {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        if self.worker.is_none() {
            self.worker = self.spawn();
        }
        let Some(w) = &self.worker else {
            // no thread could be started: hash here, this batch and every row after it
            self.threaded = false;
            self.batch.hash_into(&self.hasher, &mut self.aggs);
            self.batch.clear();
            return;
        };
        let next = w.spare.try_recv().unwrap_or_default();
        match w.to.try_send(std::mem::replace(&mut self.batch, next)) {
            Ok(()) => {}
            // the hasher is behind (or has ended, which `finish` reports): hash here
            Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => {
                b.hash_into(&self.hasher, &mut self.aggs);
                let mut b = b;
                b.clear();
                self.batch = b;
            }
        }
    }

    fn spawn(&self) -> Option<Worker> {
        let (to, from_reader) = sync_channel::<Batch>(IN_FLIGHT);
        let (back, spare) = sync_channel::<Batch>(IN_FLIGHT + 1);
        let h = self.hasher.clone();
        let mut aggs = vec![AnyAggregate::empty(self.hasher.method(), self.xor); self.aggs.len()];
        let handle = std::thread::Builder::new()
            .name("tally-hash".into())
            .spawn(move || {
                let mut rows = 0u64;
                while let Ok(mut b) = from_reader.recv() {
                    b.hash_into(&h, &mut aggs);
                    rows += b.rows.len() as u64;
                    b.clear();
                    let _ = back.try_send(b);
                }
                (aggs, rows)
            })
            .ok()?;
        Some(Worker { to, spare, handle })
    }

    /// Every row's checksum summed, per child.
    pub fn finish(self) -> Result<Vec<AnyAggregate>> {
        Ok(self.finish_counted()?.0)
    }

    /// [`HashPipe::finish`], with how many rows the hashing thread hashed.
    pub fn finish_counted(mut self) -> Result<(Vec<AnyAggregate>, u64)> {
        // the last, partial batch: hashed here rather than waited for
        self.batch.hash_into(&self.hasher, &mut self.aggs);
        let Some(w) = self.worker.take() else {
            return Ok((self.aggs, 0));
        };
        drop(w.to);
        let (theirs, rows) = w.handle.join().map_err(|_| {
            AgentError::Internal("the hashing thread ended without its sums; the scan is not counted".into())
        })?;
        let merged = self
            .aggs
            .into_iter()
            .zip(theirs)
            .map(|(a, b)| {
                a.merge(b)
                    .map_err(|e| AgentError::Internal(format!("merging the hashing thread's sums: {e}")))
            })
            .collect::<Result<_>>()?;
        Ok((merged, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::checksum::HashMethod;
    use tally_common::seal::RunKeys;

    #[test]
    fn hash_thread_is_on_or_off_as_set_and_by_cores_when_absent() {
        assert!(!enabled(Some(false)) && enabled(Some(true)));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(enabled(None), cores > 1);
    }

    fn rows(n: usize) -> Vec<(usize, Vec<u8>)> {
        (0..n)
            .map(|i| {
                // rows of varied length, some longer than a batch
                let len = if i % 997 == 996 { BATCH_BYTES + 7 } else { i % 300 };
                (i * 7 % 13, (0..len).map(|j| (i + j) as u8).collect())
            })
            .collect()
    }

    /// Whether the rows batched (those shorter than a batch) fill one batch.
    fn fills_a_batch(rows: &[(usize, Vec<u8>)]) -> bool {
        let (mut n, mut bytes) = (0, 0);
        for (_, r) in rows.iter().filter(|r| r.1.len() < BATCH_BYTES) {
            n += 1;
            bytes += r.len();
            if n >= BATCH_ROWS || bytes >= BATCH_BYTES {
                return true;
            }
        }
        false
    }

    fn inline_sums(h: &Hasher, rows: &[(usize, Vec<u8>)]) -> Vec<AnyAggregate> {
        let mut aggs = vec![AnyAggregate::empty(h.method(), true); 13];
        for (c, r) in rows {
            aggs[*c].add_checksum(h.row(r));
        }
        aggs
    }

    #[test]
    fn pipelined_sums_equal_the_row_by_row_sums_sealed_and_unsealed() {
        let keys = RunKeys {
            k_row: [7; 32],
            k_key: [9; 32],
        };
        for h in [
            Hasher::unsealed(HashMethod::Sha256_64),
            Hasher::sealed(HashMethod::Sha256_64, &keys),
        ] {
            for n in [0, 1, BATCH_ROWS - 1, BATCH_ROWS, BATCH_ROWS + 1, 50_000] {
                let rows = rows(n);
                let want = inline_sums(&h, &rows);
                for threaded in [false, true] {
                    let mut p = HashPipe::new(&h, 13, true, threaded);
                    for (c, r) in &rows {
                        p.add(*c, r);
                    }
                    let (sums, by_thread) = p.finish_counted().unwrap();
                    assert_eq!(sums, want, "{n} rows, threaded {threaded}");
                    // the first full batch always finds the queue empty: a scan that
                    // fills a batch hashes on the thread, a shorter one never starts it
                    assert_eq!(
                        by_thread > 0,
                        threaded && fills_a_batch(&rows),
                        "{n} rows, threaded {threaded}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_batch_of_short_rows_fills_at_its_row_limit() {
        let h = Hasher::unsealed(HashMethod::Sha256_64);
        for n in [BATCH_ROWS - 1, BATCH_ROWS] {
            let rows: Vec<(usize, Vec<u8>)> = (0..n).map(|i| (i % 13, vec![i as u8; 5])).collect();
            let mut p = HashPipe::new(&h, 13, true, true);
            for (c, r) in &rows {
                p.add(*c, r);
            }
            let (sums, by_thread) = p.finish_counted().unwrap();
            assert_eq!(sums, inline_sums(&h, &rows));
            // the row limit, not the bytes (5 × 1024 < 64 KiB), hands the batch over
            let want = if n == BATCH_ROWS { BATCH_ROWS as u64 } else { 0 };
            assert_eq!(by_thread, want, "{n} rows");
        }
    }

    #[test]
    fn a_hashing_thread_that_fails_fails_the_scan() {
        // one full batch, all of it for a child that does not exist: it goes to the
        // thread (the queue is empty), which panics on it
        let h = Hasher::unsealed(HashMethod::Sha256_64);
        let mut p = HashPipe::new(&h, 13, true, true);
        for i in 0..BATCH_ROWS {
            p.add(13, &[i as u8]);
        }
        let e = p.finish().unwrap_err();
        assert!(matches!(e, AgentError::Internal(_)), "{e}");
    }

    #[test]
    fn a_row_in_the_wrong_child_changes_the_sums() {
        // the test above would pass if children were ignored; this one would not
        let h = Hasher::unsealed(HashMethod::Sha256_64);
        let rows = rows(5000);
        let want = inline_sums(&h, &rows);
        let mut p = HashPipe::new(&h, 13, true, true);
        for (i, (c, r)) in rows.iter().enumerate() {
            p.add(if i == 4321 { (c + 1) % 13 } else { *c }, r);
        }
        assert_ne!(p.finish().unwrap(), want);
    }
}
