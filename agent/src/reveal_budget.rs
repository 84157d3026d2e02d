//! `max_reveal_rows` (DESIGN §2): the rows RevealKeys and RevealRows release per dataset
//! in any rolling hour, across calls. The one piece of state an agent keeps between
//! calls; it can only refuse, never change what an answer contains, so two replicas
//! still answer alike whenever both answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Policy;
use crate::error::AgentError;
use crate::policy::deny;

/// The window of `max_reveal_rows`.
pub const REVEAL_WINDOW: Duration = Duration::from_secs(3600);

/// The per-dataset reveal budget of `max_reveal_rows` in any rolling hour. It lives
/// in this process: each replica behind one Service keeps its own, so N replicas
/// release at most N times the budget (run-scoped budgets come with sealed checksums'
/// run nonce). It only ever refuses more; it never changes what an answer contains.
#[derive(Debug, Default)]
pub struct RevealBudget {
    spent: Mutex<HashMap<String, VecDeque<(Instant, u64)>>>,
}

/// Rows reserved for one reveal call; [`RevealBudget::settle`] gives back what it
/// did not release.
#[derive(Debug)]
pub struct Reservation {
    dataset: String,
    at: Instant,
    rows: u64,
}

impl Reservation {
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

impl RevealBudget {
    /// Reserves up to `want` rows of the dataset's hourly budget, refusing when none is left.
    pub fn reserve(&self, p: &Policy, dataset: &str, want: u64) -> Result<Reservation, AgentError> {
        self.reserve_at(p, dataset, want, Instant::now())
    }

    fn reserve_at(
        &self,
        p: &Policy,
        dataset: &str,
        want: u64,
        now: Instant,
    ) -> Result<Reservation, AgentError> {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let q = spent.entry(dataset.to_string()).or_default();
        while q
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= REVEAL_WINDOW)
        {
            q.pop_front();
        }
        let used: u64 = q.iter().map(|(_, n)| n).sum();
        let left = p.max_reveal_rows.saturating_sub(used);
        if left == 0 {
            return Err(deny(
                dataset,
                "max_reveal_rows",
                "this dataset's reveal budget for the past hour is spent; try again later",
            ));
        }
        let rows = want.min(left);
        q.push_back((now, rows));
        Ok(Reservation {
            dataset: dataset.to_string(),
            at: now,
            rows,
        })
    }

    /// Records what a reserved call released (at most what it reserved).
    pub fn settle(&self, r: Reservation, released: u64) {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = spent.get_mut(&r.dataset)
            && let Some(e) = q.iter_mut().find(|(t, n)| *t == r.at && *n == r.rows)
        {
            e.1 = released.min(r.rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reveal_budget_is_per_dataset_and_rolls_over_after_an_hour() {
        let p = Policy {
            max_reveal_rows: 10,
            ..Policy::default()
        };
        let b = RevealBudget::default();
        let t0 = Instant::now();
        let r = b.reserve_at(&p, "d", 8, t0).unwrap();
        assert_eq!(r.rows(), 8);
        b.settle(r, 6);
        // 4 left: a request for 8 gets 4
        let r = b.reserve_at(&p, "d", 8, t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(r.rows(), 4);
        b.settle(r, 4);
        let e = b
            .reserve_at(&p, "d", 1, t0 + Duration::from_secs(120))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_reveal_rows") && !e.chars().any(|c| c.is_ascii_digit()),
            "{e}"
        );
        assert_eq!(b.reserve_at(&p, "other", 10, t0).unwrap().rows(), 10);
        // an hour after the first call its rows are free again, not the second call's
        let later = t0 + REVEAL_WINDOW;
        assert_eq!(b.reserve_at(&p, "d", 10, later).unwrap().rows(), 6);
    }
}
