//! The agent's throttle: how fast a dataset's rows may be read, and when reading
//! pauses because the database is busy (issue 16, "load on production").
//!
//! - `max_rows_per_second` paces the rows the agent reads from the dataset, across every
//!   request reading it at once (one shared budget per dataset).
//! - `max_load` pauses reads while the database runs more than that many statements of
//!   other database users than the agent's: PostgreSQL's active client backends,
//!   MariaDB/MySQL's `Threads_running` (as Percona's `--max-load` does). The agent's own
//!   user's sessions (its reads, and any other agent's with the same user) are left out,
//!   so paused reads never hold each other back. One monitor per database URL probes it
//!   on a connection of its own while throttled reads run; a load not read within three
//!   probe intervals counts as too high (fail closed).
//!
//! A paused read keeps its statement open (its snapshot and its connection): the
//! engine stops sending once the agent stops reading. A read that stays paused longer
//! than `max_pause_secs` fails (`UNAVAILABLE`), naming the load it saw: the run can be
//! resumed later, and nothing is compared on a half-read range.
//!
//! A throttled dataset is read in the agent (hashing in SQL cannot be paced
//! mid-statement), so `hashing: pushdown` with a throttle is refused at startup.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{EngineConn, EngineConnector, Flow};
pub use crate::config::ThrottleConfig;
use crate::error::{AgentError, Result};

/// One dataset's throttle: its configuration and its shared row budget.
#[derive(Debug)]
pub struct Throttle {
    pub config: ThrottleConfig,
    /// When the dataset's row budget is next free (`max_rows_per_second`).
    next_free: Mutex<Instant>,
}

/// Rows between two looks at the budget and the load.
const CHECK_EVERY: u64 = 64;

impl Throttle {
    pub fn new(config: ThrottleConfig) -> Throttle {
        Throttle {
            config,
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// Reserves `rows` of the dataset's budget: how long to wait before reading on.
    fn reserve(&self, rows: u64) -> Duration {
        let Some(rate) = self.config.max_rows_per_second else {
            return Duration::ZERO;
        };
        let cost = Duration::from_secs_f64(rows as f64 / rate as f64);
        let now = Instant::now();
        let mut next = self.next_free.lock().unwrap_or_else(|p| p.into_inner());
        let start = (*next).max(now);
        *next = start + cost;
        start - now
    }
}

/// The load a monitor last read: statements running besides this agent's reads, or
/// why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Load {
    Unknown,
    Others(i64),
    Failed(&'static str),
}

/// A load and when it was read.
type Seen = (Instant, Load);

/// One database URL's load monitor: a task probing the load on a connection of its
/// own while at least one throttled read with `max_load` runs, idle otherwise.
pub struct LoadMonitor {
    state: Mutex<MonitorState>,
    /// The last load read, and when.
    load: watch::Sender<Seen>,
}

struct MonitorState {
    readers: usize,
    running: bool,
    interval: Duration,
}

impl Default for LoadMonitor {
    fn default() -> Self {
        LoadMonitor {
            state: Mutex::new(MonitorState {
                readers: 0,
                running: false,
                interval: Duration::from_secs(1),
            }),
            load: watch::channel((Instant::now(), Load::Unknown)).0,
        }
    }
}

impl std::fmt::Debug for LoadMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadMonitor({:?})", self.load.borrow().1)
    }
}

/// The probe a monitor runs: the engine and its probe statements (the first that runs
/// is kept).
#[derive(Clone)]
pub struct Probe {
    pub engine: Arc<dyn EngineConnector>,
    pub statements: &'static [&'static str],
}

impl LoadMonitor {
    /// Registers a throttled read; starts the probing task if none runs.
    fn enter(self: &Arc<Self>, probe: &Probe, dataset: &str, interval: Duration) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.readers += 1;
        if !st.running {
            st.interval = interval;
            st.running = true;
            self.load.send_replace((Instant::now(), Load::Unknown));
            let (me, probe, dataset) = (Arc::clone(self), probe.clone(), dataset.to_string());
            tokio::spawn(async move { me.run(probe, dataset).await });
        }
    }

    fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.readers = st.readers.saturating_sub(1);
    }

    async fn run(self: Arc<Self>, probe: Probe, dataset: String) {
        let mut conn = None;
        let mut chosen: Option<&'static str> = None;
        loop {
            let interval = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.readers == 0 {
                    st.running = false;
                    st.interval = Duration::from_secs(1);
                    return;
                }
                st.interval
            };
            let load = probe_once(&probe, &dataset, &mut conn, &mut chosen).await;
            self.load.send_replace((Instant::now(), load));
            tokio::time::sleep(interval).await;
        }
    }
}

/// How long one probe statement may take: a probe that hangs stops the reads it
/// guards (they see no fresh load), it does not let them run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the load once on a connection of its own (`tally-agent check`).
pub async fn read_load(probe: &Probe, dataset: &str) -> Load {
    probe_once(probe, dataset, &mut None, &mut None).await
}

/// One probe: the first of the probe's statements that runs (remembered in `chosen`),
/// on `conn` (connected here when `None`, dropped again after a failure).
async fn probe_once(
    probe: &Probe,
    dataset: &str,
    conn: &mut Option<Box<dyn EngineConn>>,
    chosen: &mut Option<&'static str>,
) -> Load {
    if conn.is_none() {
        match probe.engine.connect(dataset).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                tracing::warn!(dataset, error = %e, "max_load: the load probe could not connect");
                return Load::Failed("the load probe could not connect");
            }
        }
    }
    let c = conn.as_mut().expect("connected above");
    let candidates: Vec<&'static str> = match chosen {
        Some(s) => vec![*s],
        None => probe.statements.to_vec(),
    };
    for sql in candidates {
        let Ok(answer) = tokio::time::timeout(PROBE_TIMEOUT, c.query_text(dataset, sql)).await else {
            tracing::warn!(dataset, "max_load: the load probe did not answer in time");
            *conn = None;
            return Load::Failed("the load probe did not answer in time");
        };
        match answer {
            Ok(Some(t)) => {
                *chosen = Some(sql);
                let Ok(v) = t.trim().parse::<f64>() else {
                    return Load::Failed("the load probe returned no number");
                };
                if v < 0.0 {
                    // the probe's own verdict: it cannot see other sessions
                    return Load::Failed(
                        "the agent's database user cannot see other sessions' state: grant it pg_monitor (or pg_read_all_stats)",
                    );
                }
                return Load::Others(v as i64);
            }
            Ok(None) => return Load::Failed("the load probe returned no value"),
            Err(e) => {
                tracing::debug!(dataset, sql, error = %e, "max_load probe statement failed");
                if chosen.is_some() {
                    *conn = None;
                    tracing::warn!(dataset, error = %e, "max_load: the load probe failed");
                    return Load::Failed("the load probe failed (see the agent's log)");
                }
            }
        }
    }
    tracing::warn!(dataset, "max_load: no load probe statement ran on this database");
    *conn = None;
    Load::Failed("no load probe statement ran on this database (see the agent's log)")
}

/// One throttled read: paces rows against the dataset's budget and pauses while the
/// load is above `max_load`. Dropping it ends its share of the monitor.
pub struct Pacer<'a> {
    throttle: &'a Throttle,
    monitor: Option<(Arc<LoadMonitor>, watch::Receiver<Seen>)>,
    dataset: String,
    rows: u64,
    paused: Duration,
    pausing_since: Option<Instant>,
}

impl Drop for Pacer<'_> {
    fn drop(&mut self) {
        if let Some((m, _)) = &self.monitor {
            m.leave();
        }
    }
}

impl<'a> Pacer<'a> {
    /// Starts a throttled read: with `max_load`, waits (up to `max_pause_secs`) until
    /// the load is at or below it before the statement is sent.
    pub async fn start(
        throttle: &'a Throttle,
        monitor: &Arc<LoadMonitor>,
        probe: Option<&Probe>,
        dataset: &str,
    ) -> Result<Pacer<'a>> {
        let mut pacer = Pacer {
            throttle,
            monitor: None,
            dataset: dataset.to_string(),
            rows: 0,
            paused: Duration::ZERO,
            pausing_since: None,
        };
        let Some(max) = throttle.config.max_load else {
            return Ok(pacer);
        };
        let probe = probe.ok_or_else(|| {
            AgentError::Config(format!(
                "dataset {dataset}: max_load has no load probe on this engine"
            ))
        })?;
        monitor.enter(probe, dataset, throttle.config.probe_interval());
        let mut rx = monitor.load.subscribe();
        pacer.monitor = Some((Arc::clone(monitor), rx.clone()));
        let started = Instant::now();
        let deadline = started + throttle.config.max_pause();
        // a load read before the last interval is stale: wait for the next probe
        let fresh = started
            .checked_sub(throttle.config.probe_interval())
            .unwrap_or(started);
        let mut logged = false;
        loop {
            let (at, load) = rx.borrow_and_update().clone();
            match load {
                _ if at < fresh => {}
                Load::Failed(why) => return Err(pacer.probe_failed(why)),
                Load::Others(n) if n <= i64::from(max) => break,
                Load::Others(n) if !logged => {
                    logged = true;
                    tracing::info!(dataset, load = n, max_load = max, "database busy: the read waits");
                }
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(pacer.too_busy(&load));
            }
            // a changed load, or the deadline
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
        if logged {
            pacer.paused = started.elapsed();
            tracing::info!(
                dataset,
                waited_ms = pacer.paused.as_millis() as u64,
                "database load under max_load: the read starts"
            );
        }
        Ok(pacer)
    }

    fn probe_failed(&self, why: &'static str) -> AgentError {
        tracing::warn!(dataset = %self.dataset, why, "max_load: reads stop while the load cannot be read");
        AgentError::DatabaseUnavailable {
            dataset: self.dataset.clone(),
            kind: why,
        }
    }

    fn too_busy(&self, load: &Load) -> AgentError {
        tracing::warn!(
            dataset = %self.dataset,
            ?load,
            max_load = ?self.throttle.config.max_load,
            max_pause_secs = self.throttle.config.max_pause_secs,
            "database stayed busy: the read is stopped"
        );
        AgentError::DatabaseUnavailable {
            dataset: self.dataset.clone(),
            kind: "database load stayed above the dataset's throttle.max_load for throttle.max_pause_secs",
        }
    }

    /// After each row: go on, or pause reading first.
    pub fn after_row(&mut self) -> Result<Flow> {
        self.rows += 1;
        // a paused read looks again after every row it takes, so it takes one row per
        // pause until the load is back under max_load
        let check = self.rows.is_multiple_of(CHECK_EVERY);
        if !check && self.pausing_since.is_none() {
            return Ok(Flow::Go);
        }
        let mut wait = if check {
            self.throttle.reserve(CHECK_EVERY)
        } else {
            Duration::ZERO
        };
        if let (Some(max), Some((_, rx))) = (self.throttle.config.max_load, &self.monitor) {
            let (at, load) = rx.borrow().clone();
            // a load the monitor has not read lately is not known to be low: wait for it
            let stale = at.elapsed() > self.throttle.config.probe_interval() * 3 + PROBE_TIMEOUT;
            let hold = match load {
                Load::Failed(why) => return Err(self.probe_failed(why)),
                Load::Unknown => true,
                Load::Others(n) => stale || n > i64::from(max),
            };
            if hold {
                let since = *self.pausing_since.get_or_insert_with(|| {
                    tracing::info!(dataset = %self.dataset, ?load, max_load = max, "database busy: the read pauses");
                    Instant::now()
                });
                if self.paused + since.elapsed() > self.throttle.config.max_pause() {
                    return Err(self.too_busy(&load));
                }
                wait = wait.max(self.throttle.config.probe_interval() / 4);
            } else if let Some(since) = self.pausing_since.take() {
                self.paused += since.elapsed();
                tracing::info!(dataset = %self.dataset, paused_ms = since.elapsed().as_millis() as u64, "database load back under max_load: the read goes on");
            }
        }
        Ok(if wait > Duration::from_millis(1) {
            Flow::Pause(wait)
        } else {
            Flow::Go
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rate: Option<u64>, load: Option<u32>) -> ThrottleConfig {
        ThrottleConfig {
            max_rows_per_second: rate,
            max_load: load,
            probe_interval_ms: 1000,
            max_pause_secs: 600,
        }
    }

    #[test]
    fn the_budget_is_shared_and_paced() {
        let t = Throttle::new(cfg(Some(1000), None));
        // 64 rows cost 64 ms of the budget: the first reservation is free, each next
        // waits for those before it, whoever reserves
        assert_eq!(t.reserve(64), Duration::ZERO);
        let w1 = t.reserve(64);
        let w2 = t.reserve(64);
        assert!(
            w1 > Duration::from_millis(60) && w1 <= Duration::from_millis(64),
            "{w1:?}"
        );
        assert!(
            w2 > Duration::from_millis(124) && w2 <= Duration::from_millis(128),
            "{w2:?}"
        );
    }

    #[test]
    fn no_rate_no_wait() {
        let t = Throttle::new(cfg(None, Some(4)));
        assert_eq!(t.reserve(1_000_000), Duration::ZERO);
    }

    #[test]
    fn validation_names_the_key() {
        let f = std::path::Path::new("agent.yaml");
        let e = cfg(None, None)
            .validate(f, "datasets.x.throttle")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("datasets.x.throttle") && e.contains("max_rows_per_second"),
            "{e}"
        );
        let e = cfg(Some(0), None)
            .validate(f, "datasets.x.throttle")
            .unwrap_err()
            .to_string();
        assert!(e.contains("datasets.x.throttle.max_rows_per_second"), "{e}");
        let mut c = cfg(Some(10), None);
        c.probe_interval_ms = 10;
        let e = c.validate(f, "datasets.x.throttle").unwrap_err().to_string();
        assert!(e.contains("probe_interval_ms"), "{e}");
        assert!(cfg(Some(10), Some(0)).validate(f, "datasets.x.throttle").is_ok());
    }
}
