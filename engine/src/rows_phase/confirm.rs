//! Confirm rounds at `with_keys` and above (DESIGN §5 step 6), between classifying the
//! rows and revealing any: each round waits (and aligns the watermark, when the window
//! has one), reads again the digests of every range that holds a finding, and drops the
//! findings whose row both sides now show, equal: those rows were in flight.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};
use tally_common::wire::RowDigest;

use super::{Pair, next_asks, put, take_both};
use crate::{Command, Engine, Out, Side, Step};

/// One confirm round: after its wait, the digests of every range that holds a finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Confirming {
    round: u32,
    waited: bool,
    /// Rows-phase ranges to read again, in order; `asked` of them asked, `done` folded in.
    ranges: Vec<usize>,
    asked: usize,
    done: usize,
    digests: BTreeMap<usize, Pair<Vec<RowDigest>>>,
    /// (range, key hash) of every row both sides show, equal, in this round.
    agree: BTreeSet<(usize, u64)>,
    /// (range, key hash) of every row either side shows in this round.
    #[serde(default)]
    seen: BTreeSet<(usize, u64)>,
}

impl Engine {
    /// The wait before confirm round `round` is over: with a watermark, the sides'
    /// positions are aligned again before the round reads anything.
    pub(crate) fn on_waited(&mut self, out: &mut Out, round: u32) -> Step {
        if !self.positions_synced(round) {
            self.sync_positions(out, round);
            return Ok(());
        }
        self.on_confirm_synced(out, round)
    }

    /// Confirm round `round` may read: its wait (and watermark) is done.
    pub(crate) fn on_confirm_synced(&mut self, out: &mut Out, round: u32) -> Step {
        if self.leaf_confirm.is_some() {
            return self.on_leaf_round_ready(out, round);
        }
        if let Some(c) = self.rows().confirming.as_mut()
            && c.round == round
        {
            c.waited = true;
        }
        self.advance_rows(out)
    }

    pub(crate) fn on_confirm_digests(
        &mut self,
        out: &mut Out,
        round: u32,
        range: usize,
        side: Side,
        d: Vec<RowDigest>,
    ) -> Step {
        if let Some(c) = self.rows().confirming.as_mut()
            && c.round == round
        {
            put(c.digests.entry(range).or_default(), side, d);
        }
        self.advance_rows(out)
    }

    /// Confirm rounds (DESIGN §5 step 6), between classifying the rows and revealing
    /// any: each round waits, reads again every range that holds a finding, and drops
    /// only the findings whose row both sides now show once, equal (in flight); any
    /// other finding is kept. True once every
    /// round is done (or none is due), false while one waits for an answer.
    pub(super) fn confirm_rows(&mut self, out: &mut Out) -> bool {
        let Some(spec) = self.spec.confirm.clone() else {
            return true;
        };
        loop {
            let rows = self.rows();
            let Some(c) = rows.confirming.as_mut() else {
                if rows.rounds_done >= spec.rounds || !rows.classifier.has_findings() {
                    return true;
                }
                let round = rows.rounds_done + 1;
                let ranges = rows.classifier.ranges_with_findings();
                let n = ranges.len();
                rows.confirming = Some(Confirming {
                    round,
                    waited: false,
                    ranges,
                    asked: 0,
                    done: 0,
                    digests: BTreeMap::new(),
                    agree: BTreeSet::new(),
                    seen: BTreeSet::new(),
                });
                let ms = crate::spec::parse_duration(&spec.after).expect("validated") * 1000;
                self.say(
                    out,
                    format!(
                        "confirm round {round}/{}: waiting {} before reading the {n} differing ranges again",
                        spec.rounds, spec.after
                    ),
                );
                self.ask(out, Command::Wait { round, ms });
                return false;
            };
            if !c.waited {
                return false;
            }
            let answered: Vec<usize> = c.digests.keys().copied().collect();
            for range in answered {
                let Some((s, t)) = take_both(&mut c.digests, range) else {
                    continue;
                };
                for k in crate::rows::Classifier::agreeing_keys(&s, &t) {
                    c.agree.insert((range, k));
                }
                c.seen.extend(s.iter().chain(&t).map(|d| (range, d.key_hash)));
                c.done += 1;
            }
            if c.done < c.ranges.len() {
                self.ask_confirm_digests(out);
                return false;
            }
            let c = rows.confirming.take().expect("in a round");
            let agree: HashSet<(usize, u64)> = c.agree.into_iter().collect();
            let seen: HashSet<(usize, u64)> = c.seen.into_iter().collect();
            // a row gone from both sides of a plain key or hash range was deleted on
            // both; under a window or in a period it may only have left it
            let ranges = &rows.ranges;
            let gone = rows.classifier.drop_agreeing(&agree, &seen, |r| {
                ranges
                    .get(r)
                    .is_some_and(|s| s.window.is_none() && s.period.is_none())
            });
            rows.in_flight.missing_in_target += gone.missing_in_target;
            rows.in_flight.extra_in_target += gone.extra_in_target;
            rows.in_flight.changed += gone.changed;
            rows.rounds_done += 1;
            let n = gone.missing_in_target + gone.extra_in_target + gone.changed;
            self.say(
                out,
                format!(
                    "confirm round {}/{}: {n} differing rows agree now (in flight)",
                    c.round, spec.rounds
                ),
            );
        }
    }

    /// A confirm round's digests, a few ranges in flight at once.
    fn ask_confirm_digests(&mut self, out: &mut Out) {
        let c = self
            .rows
            .as_ref()
            .expect("rows phase")
            .confirming
            .as_ref()
            .expect("in a round");
        let asks = next_asks(c.asked, c.done, c.ranges.len());
        let (round, ranges) = (c.round, c.ranges[asks.clone()].to_vec());
        for range in ranges {
            self.ask_range_digests(out, range, round);
        }
        self.rows().confirming.as_mut().expect("in a round").asked = asks.end;
    }
}
