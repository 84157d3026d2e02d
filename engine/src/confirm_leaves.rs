//! Confirm rounds at `count_only` (DESIGN §5 step 6): no row leaves the agents, so a
//! round re-checks the drill's differing leaves by their aggregates. After each
//! round's wait (and watermark, when the window has one), both sides aggregate every
//! leaf still differing, whole, in one request each; a leaf whose count, SUM and XOR
//! now agree was in flight and is dropped from `leaves` (counted in `in_flight_leaves`);
//! a leaf that differs in every round stays. As with rows, when every leaf turns out
//! in flight the verdict stays `differ`, with a warning: no moment was read at which
//! the sides were equal.

use serde::{Deserialize, Serialize};
use tally_common::checksum::AnyAggregate;
use tally_common::segment::Split;
use tally_common::wire::{AggregateRequest, AggregateResponse};

use super::{Command, Engine, Out, Side, Step};
use crate::error::RunError;
use crate::spec::Mode;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LeafConfirm {
    /// Rounds done; the round in progress is `rounds_done + 1` while `asked`.
    rounds_done: u32,
    /// The leaves (indexes into the result's) still differing, in order.
    remaining: Vec<usize>,
    /// This round's wait is over and its aggregates are asked.
    asked: bool,
    source: Option<AggregateResponse>,
    target: Option<AggregateResponse>,
    in_flight: u64,
}

impl Engine {
    /// After the drill's SQL at `count_only` with `confirm`: the first round's wait.
    pub(super) fn begin_leaf_confirm(&mut self, out: &mut Out) -> Step {
        let n = self.res.leaves.len();
        self.leaf_confirm = Some(LeafConfirm {
            rounds_done: 0,
            remaining: (0..n).collect(),
            asked: false,
            source: None,
            target: None,
            in_flight: 0,
        });
        self.next_leaf_round(out)
    }

    fn next_leaf_round(&mut self, out: &mut Out) -> Step {
        let spec = self.spec.confirm.clone().expect("confirm rounds");
        let c = self.leaf_confirm.as_mut().expect("confirming leaves");
        if c.rounds_done >= spec.rounds || c.remaining.is_empty() {
            return self.leaf_confirm_done(out);
        }
        c.asked = false;
        let round = c.rounds_done + 1;
        let n = c.remaining.len();
        let ms = crate::spec::parse_duration(&spec.after).expect("validated") * 1000;
        self.say(
            out,
            format!(
                "confirm round {round}/{}: waiting {} before aggregating the {n} differing segments again",
                spec.rounds, spec.after
            ),
        );
        self.ask(out, Command::Wait { round, ms });
        Ok(())
    }

    /// The round's wait (and watermark) is over: both sides aggregate the leaves left.
    pub(super) fn on_leaf_round_ready(&mut self, out: &mut Out, round: u32) -> Step {
        let c = self.leaf_confirm.as_mut().expect("confirming leaves");
        if round != c.rounds_done + 1 || c.asked {
            return Err(RunError::Internal(format!("confirm round {round} out of place")).into());
        }
        c.asked = true;
        let remaining = c.remaining.clone();
        if let Some(max) = self.spec.gates.max_queries
            && self.res.source.queries.max(self.res.target.queries) + 1 > max
        {
            return Err(RunError::Gate {
                gate: "max_queries",
                message: format!(
                    "confirm round {round} would send one more query to each side, the gate allows {max}"
                ),
            }
            .into());
        }
        let (key_len, method) = {
            let r = self.resolved.as_ref().expect("resolved");
            (r.key_len, r.method)
        };
        let parents: Vec<_> = remaining
            .iter()
            .map(|i| (self.res.leaves[*i].bounds.clone(), Split::Whole))
            .collect();
        for side in [Side::Source, Side::Target] {
            let request = AggregateRequest {
                dataset: self.dataset(side),
                columns: self.columns(side),
                key_len,
                method,
                parents: parents.clone(),
                in_process: false,
                seal: self.seal(side),
                run_id: String::new(),
                side: None,
            };
            self.ask(out, Command::Recheck { round, side, request });
        }
        Ok(())
    }

    pub(super) fn on_rechecked(
        &mut self,
        out: &mut Out,
        round: u32,
        side: Side,
        r: AggregateResponse,
    ) -> Step {
        match side {
            Side::Source => self.res.source.queries += 1,
            Side::Target => self.res.target.queries += 1,
        }
        let counts_only = self.spec.mode == Mode::Count;
        let (method, xor) = {
            let r = self.resolved.as_ref().expect("resolved");
            (r.method, r.xor)
        };
        let agents = self.agents.clone();
        let c = self.leaf_confirm.as_mut().expect("confirming leaves");
        match side {
            Side::Source => c.source = Some(r),
            Side::Target => c.target = Some(r),
        }
        if c.source.is_none() || c.target.is_none() {
            return Ok(());
        }
        let (Some(s), Some(t)) = (c.source.take(), c.target.take()) else {
            unreachable!("both are in")
        };
        // one bucket per leaf asked, in order, the leaf itself: anything else is not
        // the answer to this request (fail closed)
        let n = c.remaining.len();
        let whole = |resp: &AggregateResponse, agent: &str| -> Result<Vec<AnyAggregate>, RunError> {
            let fits = resp.buckets.len() == n
                && resp
                    .buckets
                    .iter()
                    .enumerate()
                    .all(|(i, b)| b.parent == i && b.child == 0);
            if !fits {
                return Err(RunError::MalformedAnswer {
                    agent: agent.to_string(),
                    rpc: "Aggregate".into(),
                    message: format!(
                        "a confirm round's answer is not one whole bucket for each of the {n} segments"
                    ),
                });
            }
            Ok(resp
                .buckets
                .iter()
                .map(|b| AnyAggregate::new(method, b.count, b.sum, if xor { b.xor } else { None }))
                .collect())
        };
        let (a, b) = (whole(&s, &agents.0)?, whole(&t, &agents.1)?);
        let mut still = Vec::with_capacity(n);
        let mut gone = 0u64;
        for ((leaf, x), y) in c.remaining.iter().zip(&a).zip(&b) {
            let equal = if counts_only {
                x.count() == y.count()
            } else {
                x.matches(y).unwrap_or(false)
            };
            if equal {
                gone += 1;
            } else {
                still.push(*leaf);
            }
        }
        c.remaining = still;
        c.in_flight += gone;
        c.rounds_done += 1;
        let rounds = self.spec.confirm.as_ref().map_or(0, |c| c.rounds);
        self.say(
            out,
            format!("confirm round {round}/{rounds}: {gone} differing segments agree now (in flight)"),
        );
        self.next_leaf_round(out)
    }

    fn leaf_confirm_done(&mut self, out: &mut Out) -> Step {
        let c = self.leaf_confirm.take().expect("confirming leaves");
        let keep: std::collections::HashSet<usize> = c.remaining.iter().copied().collect();
        let mut i = 0;
        self.res.leaves.retain(|_| {
            let k = keep.contains(&i);
            i += 1;
            k
        });
        self.res.in_flight_leaves = Some(c.in_flight);
        if c.remaining.is_empty() && c.in_flight > 0 {
            self.res.warnings.push(format!(
                "every one of the {} differing segments agreed again within the confirm rounds: the sides differed \
                 while data was in flight, and no moment was read at which they were equal",
                c.in_flight
            ));
        }
        out.extend(self.finish());
        Ok(())
    }
}
