//! Reveal budgets (DESIGN §2): the rows RevealKeys and RevealRows release per dataset,
//! across calls: `max_reveal_rows` per run (keyed by the run nonce of a sealed run)
//! and `max_reveal_rows_per_hour` in any rolling hour. The one piece of state an agent
//! keeps between calls; it can only refuse, never change what an answer contains, so
//! two replicas still answer alike whenever both answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Policy;
use crate::error::AgentError;
use crate::policy::deny;

/// The window of `max_reveal_rows_per_hour`.
pub const REVEAL_WINDOW: Duration = Duration::from_secs(3600);

/// How long a run's budget is remembered after its last reveal. A run that asks
/// again later starts from `max_reveal_rows` again, still within the hour's budget.
pub const RUN_MEMORY: Duration = Duration::from_secs(24 * 3600);

/// The reveal budgets of one agent process. Each replica behind one Service keeps its
/// own, so N replicas release at most N times the hourly budget.
#[derive(Debug, Default)]
pub struct RevealBudget {
    inner: Mutex<Spent>,
}

#[derive(Debug, Default)]
struct Spent {
    /// per dataset: (when, rows) of the past hour
    hourly: HashMap<String, VecDeque<(Instant, u64)>>,
    /// per (dataset, run nonce): rows so far and the last call
    runs: HashMap<(String, Vec<u8>), (u64, Instant)>,
}

/// Rows reserved for one reveal call; [`RevealBudget::settle`] gives back what it
/// did not release.
#[derive(Debug)]
pub struct Reservation {
    dataset: String,
    run: Option<Vec<u8>>,
    at: Instant,
    rows: u64,
    /// The budget that reserved fewer rows than wanted, if one did.
    limited_by: Option<&'static str>,
}

impl Reservation {
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The policy key of the budget that reserved fewer rows than wanted, if one did.
    pub fn limited_by(&self) -> Option<&'static str> {
        self.limited_by
    }
}

impl RevealBudget {
    /// Reserves up to `want` rows of the dataset's budgets (the run's, keyed by its
    /// nonce, and the hour's), refusing when either is spent.
    pub fn reserve(
        &self,
        p: &Policy,
        dataset: &str,
        run: Option<&[u8]>,
        want: u64,
    ) -> Result<Reservation, AgentError> {
        self.reserve_at(p, dataset, run, want, Instant::now())
    }

    fn reserve_at(
        &self,
        p: &Policy,
        dataset: &str,
        run: Option<&[u8]>,
        want: u64,
        now: Instant,
    ) -> Result<Reservation, AgentError> {
        let mut spent = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Spent { hourly, runs } = &mut *spent;
        runs.retain(|_, (_, last)| now.duration_since(*last) < RUN_MEMORY);
        let q = hourly.entry(dataset.to_string()).or_default();
        while q
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= REVEAL_WINDOW)
        {
            q.pop_front();
        }
        let used: u64 = q.iter().map(|(_, n)| n).sum();
        let hour_left = p.reveal_rows_per_hour().saturating_sub(used);
        if hour_left == 0 {
            return Err(deny(
                dataset,
                "max_reveal_rows_per_hour",
                "this dataset's reveal budget for the past hour is spent; try again later",
            ));
        }
        let run_key = run.map(|n| (dataset.to_string(), n.to_vec()));
        let run_used = run_key.as_ref().and_then(|k| runs.get(k)).map_or(0, |r| r.0);
        let run_left = p.max_reveal_rows.saturating_sub(run_used);
        if run_left == 0 {
            return Err(deny(
                dataset,
                "max_reveal_rows",
                "this run's reveal budget for the dataset is spent",
            ));
        }
        let rows = want.min(hour_left).min(run_left);
        let limited_by = (rows < want).then_some(if run_left <= hour_left {
            "max_reveal_rows"
        } else {
            "max_reveal_rows_per_hour"
        });
        if rows == 0 {
            // nothing wanted: nothing recorded, so empty calls cannot grow the state
            return Ok(Reservation {
                dataset: dataset.to_string(),
                run: None,
                at: now,
                rows: 0,
                limited_by,
            });
        }
        q.push_back((now, rows));
        if let Some(k) = run_key {
            let e = runs.entry(k).or_insert((0, now));
            e.0 += rows;
            e.1 = now;
        }
        Ok(Reservation {
            dataset: dataset.to_string(),
            run: run.map(<[u8]>::to_vec),
            at: now,
            rows,
            limited_by,
        })
    }

    /// Records what a reserved call released (at most what it reserved).
    pub fn settle(&self, r: Reservation, released: u64) {
        if r.rows == 0 {
            return;
        }
        let released = released.min(r.rows);
        let mut spent = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = spent.hourly.get_mut(&r.dataset)
            && let Some(i) = q.iter().position(|(t, n)| *t == r.at && *n == r.rows)
        {
            if released == 0 {
                q.remove(i);
            } else {
                q[i].1 = released;
            }
        }
        if let Some(run) = r.run {
            let key = (r.dataset, run);
            if let Some(e) = spent.runs.get_mut(&key) {
                e.0 = e.0.saturating_sub(r.rows - released);
                if e.0 == 0 {
                    // a run that released nothing is not remembered
                    spent.runs.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hourly_budget_is_per_dataset_and_rolls_over_after_an_hour() {
        let p = Policy {
            max_reveal_rows_per_hour: Some(10),
            ..Policy::default()
        };
        let b = RevealBudget::default();
        let t0 = Instant::now();
        let r = b.reserve_at(&p, "d", None, 8, t0).unwrap();
        assert_eq!((r.rows(), r.limited_by()), (8, None));
        b.settle(r, 6);
        // 4 left: a request for 8 gets 4
        let r = b
            .reserve_at(&p, "d", None, 8, t0 + Duration::from_secs(60))
            .unwrap();
        assert_eq!((r.rows(), r.limited_by()), (4, Some("max_reveal_rows_per_hour")));
        b.settle(r, 4);
        let e = b
            .reserve_at(&p, "d", None, 1, t0 + Duration::from_secs(120))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_reveal_rows_per_hour") && !e.chars().any(|c| c.is_ascii_digit()),
            "{e}"
        );
        assert_eq!(b.reserve_at(&p, "other", None, 10, t0).unwrap().rows(), 10);
        // an hour after the first call its rows are free again, not the second call's
        let later = t0 + REVEAL_WINDOW;
        assert_eq!(b.reserve_at(&p, "d", None, 10, later).unwrap().rows(), 6);
    }

    #[test]
    fn the_hourly_budget_defaults_to_the_run_budget() {
        let p = Policy {
            max_reveal_rows: 4,
            ..Policy::default()
        };
        let b = RevealBudget::default();
        let t0 = Instant::now();
        // a fresh nonce per call does not get past the hour's budget
        let r = b.reserve_at(&p, "d", Some(&[1; 16]), 4, t0).unwrap();
        b.settle(r, 4);
        let e = b
            .reserve_at(&p, "d", Some(&[2; 16]), 4, t0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_reveal_rows_per_hour"), "{e}");
    }

    #[test]
    fn the_run_budget_holds_across_calls_of_one_run_only() {
        let p = Policy {
            max_reveal_rows: 5,
            max_reveal_rows_per_hour: Some(100),
            ..Policy::default()
        };
        let b = RevealBudget::default();
        let t0 = Instant::now();
        let (run1, run2) = ([1u8; 16], [2u8; 16]);
        let r = b.reserve_at(&p, "d", Some(&run1), 4, t0).unwrap();
        b.settle(r, 3);
        // 2 left for run 1, whatever it asks
        let r = b.reserve_at(&p, "d", Some(&run1), 100, t0).unwrap();
        assert_eq!((r.rows(), r.limited_by()), (2, Some("max_reveal_rows")));
        b.settle(r, 2);
        // calls that release nothing leave no state behind
        for i in 0..100u8 {
            let r = b.reserve_at(&p, "d", Some(&[0xee, i]), 3, t0).unwrap();
            b.settle(r, 0);
            b.reserve_at(&p, "d", Some(&[0xee, i]), 0, t0).unwrap();
        }
        assert_eq!(b.inner.lock().unwrap().runs.len(), 1);
        assert_eq!(b.inner.lock().unwrap().hourly["d"].len(), 2);
        let e = b.reserve_at(&p, "d", Some(&run1), 1, t0).unwrap_err().to_string();
        assert!(e.contains("max_reveal_rows") && !e.contains("per_hour"), "{e}");
        // another run has its own, within the hour's
        assert_eq!(b.reserve_at(&p, "d", Some(&run2), 9, t0).unwrap().rows(), 5);
    }
}
