//! The engine's rows phase (DESIGN §5 step 5): row digests of each merged leaf range,
//! classified in range order as they arrive (a few ranges in flight), then reveals of
//! the differing rows only, range by range, and the differences. The classification
//! and reveal logic itself is [`crate::rows`]; this is its bookkeeping.
//!
//! This file holds the phase's state, the digests and their classification, the
//! period lookups (F14) and the phase's end; the confirm rounds between classifying and
//! revealing are [`confirm`], the reveals [`reveal`], and the per-key investigation SQL
//! that follows the phase [`key_sql`].

mod confirm;
mod key_sql;
mod reveal;

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use tally_common::PrivacyLevel;
use tally_common::segment::{KeyTuple, Period, Segment};
use tally_common::wire::{RevealResponse, RowDigest, RowDigestsRequest};

use super::drill::LEAVES_IN_FLIGHT;
use super::{Command, Engine, Out, Side, Step};
use crate::planner::rows_batches;
use crate::result::{DiffCounts, DiffKind, Difference, DuplicateKeys, Withheld};
use crate::rows::{self, Classified, Classifier, RevealWork};
use confirm::Confirming;
pub(super) use key_sql::KeySqlPhase;

/// After an early stop, rows are still classified when the differing segments hold at
/// most this many rows (per side).
const ROWS_PHASE_AFTER_STOP: u64 = 1_000_000;

/// What a result names when an agent cut a reveal short without naming its budget (an
/// agent from before `withheld_by`).
const REVEAL_BUDGETS: &str = "max_reveal_rows or max_reveal_rows_per_hour";

type Pair<T> = (Option<T>, Option<T>);

/// The most rows the rows phase reads as one range of merged leaves (the agents' own
/// `max_digest_rows` bounds it too): the coordinator holds a range's digests from both
/// sides until it is classified, 16 bytes a row.
const RANGE_ROWS: u64 = 100_000;

fn put<T>(slot: &mut Pair<T>, side: Side, v: T) {
    match side {
        Side::Source => slot.0 = Some(v),
        Side::Target => slot.1 = Some(v),
    }
}

/// Both sides' answers for `at`, taken out once both have arrived (left in place until
/// then).
fn take_both<T>(pairs: &mut BTreeMap<usize, Pair<T>>, at: usize) -> Option<(T, T)> {
    if !matches!(pairs.get(&at), Some((Some(_), Some(_)))) {
        return None;
    }
    let (Some(source), Some(target)) = pairs.remove(&at)? else {
        unreachable!("both present")
    };
    Some((source, target))
}

/// The items to ask for next, `asked` on, while fewer than [`LEAVES_IN_FLIGHT`] wait
/// (those before `done` have arrived; there are `len`): empty when the window is full.
/// Its end is the new count asked.
fn next_asks(asked: usize, done: usize, len: usize) -> Range<usize> {
    asked..len.min(done + LEAVES_IN_FLIGHT).max(asked)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RowsPhase {
    ranges: Vec<Segment>,
    /// Ranges asked for their digests; ranges before `classified` are classified.
    asked: usize,
    classified: usize,
    digests: BTreeMap<usize, Pair<Vec<RowDigest>>>,
    classifier: Classifier,
    /// After the last range: the findings and the reveals they need.
    found: Option<Classified>,
    work: Vec<RevealWork>,
    /// Work items asked for their reveals; items before `revealed` are done.
    reveals_asked: usize,
    revealed: usize,
    reveals: BTreeMap<usize, Pair<RevealResponse>>,
    differences: Vec<Difference>,
    /// Per side, the reveal budgets that withheld keys (as the agent named them) and
    /// how many asked keys they withheld; a side whose budget is spent is not asked
    /// again.
    #[serde(default)]
    withheld: Vec<(Side, Option<String>, u64)>,
    /// Confirm rounds done, the one in progress, and what vanished in them.
    #[serde(default)]
    rounds_done: u32,
    #[serde(default)]
    confirming: Option<Confirming>,
    #[serde(default)]
    in_flight: DiffCounts,
    /// After classifying, the keys a period's range found missing or extra, looked up
    /// in every period (F14): their ranges follow the drill's in `ranges`.
    #[serde(default)]
    lookup: Option<Lookup>,
    /// Each listed difference's range, key hash, kind and key, in `differences`' order:
    /// which leaf's per-key SQL names it.
    #[serde(default)]
    keyed: Vec<(usize, u64, DiffKind, KeyTuple)>,
}

/// The lookups of keys found missing or extra in a period's range: key `keys[j]` is
/// range `from + j` (its bucket hash, no period), its digests asked like a range's.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Lookup {
    from: usize,
    keys: Vec<u64>,
    asked: usize,
    done: usize,
    /// The reveals are planned (every lookup folded in).
    planned: bool,
    /// The range each key was found in (in a period), by `keys`' order.
    #[serde(default)]
    origins: Vec<usize>,
}

impl RowsPhase {
    pub(super) fn new(ranges: Vec<Segment>) -> RowsPhase {
        RowsPhase {
            ranges,
            asked: 0,
            classified: 0,
            digests: BTreeMap::new(),
            classifier: Classifier::default(),
            found: None,
            work: Vec::new(),
            reveals_asked: 0,
            revealed: 0,
            reveals: BTreeMap::new(),
            differences: Vec::new(),
            withheld: Vec::new(),
            rounds_done: 0,
            confirming: None,
            in_flight: DiffCounts::default(),
            lookup: None,
            keyed: Vec::new(),
        }
    }

    /// The ranges the drill found (the lookups' follow them).
    fn drilled(&self) -> usize {
        self.lookup.as_ref().map_or(self.ranges.len(), |l| l.from)
    }
}

impl Engine {
    fn detailed(&self) -> bool {
        self.spec.reporting.level == PrivacyLevel::Detailed
    }

    /// After the drill and its SQL: classify the leaves' rows, or finish.
    pub(super) fn begin_rows(&mut self, out: &mut Out) -> Step {
        let planner = self.planner.as_ref().expect("drilled");
        if self.spec.reporting.level < PrivacyLevel::WithKeys
            && self.spec.confirm.is_some()
            && !planner.leaves.is_empty()
        {
            return self.begin_leaf_confirm(out);
        }
        if self.spec.reporting.level < PrivacyLevel::WithKeys || planner.leaves.is_empty() {
            out.extend(self.finish());
            return Ok(());
        }
        // after an early stop the leaves are not small: classify their rows only while
        // that stays bounded
        let leaf_rows: u64 = planner
            .leaves
            .iter()
            .map(|l| l.source.count().max(l.target.count()))
            .sum();
        if planner.stop.is_some() && leaf_rows > ROWS_PHASE_AFTER_STOP {
            self.res.warnings.push(format!(
                "rows were not classified: the drill stopped early with {leaf_rows} rows in differing segments \
                 (more than {ROWS_PHASE_AFTER_STOP})"
            ));
            out.extend(self.finish());
            return Ok(());
        }
        // adjacent differing leaves are read together, as many rows as both agents'
        // policies let one digests range hold (a tenth below it: rows may arrive
        // between the level's count and the read), never fewer than the threshold
        let agents = self.described.as_ref().map_or(0, |(s, t)| {
            s.max_digest_rows.min(t.max_digest_rows).min(RANGE_ROWS) / 10 * 9
        });
        let ranges = rows_batches(&planner.leaves, self.spec.bisection.threshold.max(agents))
            .into_iter()
            .map(|(segment, _)| segment)
            .collect();
        self.rows = Some(RowsPhase::new(ranges));
        self.advance_rows(out)
    }

    fn rows(&mut self) -> &mut RowsPhase {
        self.rows.as_mut().expect("in the rows phase")
    }

    pub(super) fn on_digests(&mut self, out: &mut Out, range: usize, side: Side, d: Vec<RowDigest>) -> Step {
        put(self.rows().digests.entry(range).or_default(), side, d);
        self.advance_rows(out)
    }

    /// Takes in what has arrived, in range order, and asks for what the window allows.
    fn advance_rows(&mut self, out: &mut Out) -> Step {
        let total = self.rows().drilled();
        // classify every range, in order, whose two sides have arrived
        loop {
            let rows = self.rows();
            let i = rows.classified;
            if i >= total {
                break;
            }
            let Some((s, t)) = take_both(&mut rows.digests, i) else {
                break;
            };
            rows.classifier.add_range(i, &s, &t);
            rows.classified += 1;
            self.say(out, format!("rows of range {}/{total} classified", i + 1));
        }
        if self.rows().classified < total {
            self.ask_digests(out);
            return Ok(());
        }
        if self.rows().found.is_none() && !self.confirm_rows(out) {
            return Ok(());
        }
        if self.rows().found.is_none() {
            let sample_limit = self.spec.reporting.sample_limit as usize;
            let detailed = self.detailed();
            let rows = self.rows();
            let found = std::mem::take(&mut rows.classifier).finish(sample_limit);
            // a key a period's range found on one side only is looked up in every
            // period before it is listed (F14); nothing is asked when there is none
            let keys = rows::keys_to_look_up(&found.findings, |r| {
                rows.ranges.get(r).is_some_and(|s| s.period.is_some())
            });
            if keys.is_empty() {
                rows.work = rows::reveal_plan(&found.findings, total, detailed);
            } else {
                let mut origins = Vec::new();
                for &h in &keys {
                    let at = found
                        .findings
                        .iter()
                        .find(|f| f.key_hash == h)
                        .map(|f| f.leaf)
                        .expect("a finding of the key");
                    let segment = rows::lookup_segment(&rows.ranges[at], h);
                    rows.ranges.push(segment);
                    origins.push(at);
                }
                self.say(
                    out,
                    format!(
                        "looking up {} keys found on one side in a period, in every period",
                        keys.len()
                    ),
                );
                let rows = self.rows();
                rows.lookup = Some(Lookup {
                    from: total,
                    keys,
                    asked: 0,
                    done: 0,
                    planned: false,
                    origins,
                });
            }
            self.rows().found = Some(found);
        }
        if !self.advance_lookups(out) {
            return Ok(());
        }
        loop {
            self.take_reveals();
            let rows = self.rows();
            if rows.revealed == rows.work.len() {
                self.rows_done(out);
                return Ok(());
            }
            let asked = rows.reveals_asked;
            self.ask_reveals(out);
            if self.rows().reveals_asked == asked {
                // the window is full: wait for answers
                return Ok(());
            }
        }
    }

    /// Digests of the next ranges while fewer than [`LEAVES_IN_FLIGHT`] wait to be
    /// classified (the ranges are classified in order).
    fn ask_digests(&mut self, out: &mut Out) {
        let rows = self.rows.as_ref().expect("rows phase");
        let asks = next_asks(rows.asked, rows.classified, rows.drilled());
        for range in asks.clone() {
            self.ask_range_digests(out, range, 0);
        }
        self.rows().asked = asks.end;
    }

    /// Folds in the lookups whose digests have arrived, in order, and asks for the next
    /// ones (a few in flight); true once every lookup is folded in and the reveals are
    /// planned (or there is no lookup).
    fn advance_lookups(&mut self, out: &mut Out) -> bool {
        let detailed = self.detailed();
        let rows = self.rows();
        let Some(l) = rows.lookup.as_mut() else {
            return true;
        };
        if l.planned {
            return true;
        }
        let found = rows.found.as_mut().expect("classified");
        while l.done < l.keys.len() {
            let range = l.from + l.done;
            let Some((s, t)) = take_both(&mut rows.digests, range) else {
                break;
            };
            rows::reclassify(found, l.keys[l.done], range, &s, &t);
            l.done += 1;
        }
        if l.done < l.keys.len() {
            self.ask_lookups(out);
            return false;
        }
        l.planned = true;
        rows.work = rows::reveal_plan(&found.findings, rows.ranges.len(), detailed);
        true
    }

    /// Digests of the next lookups while fewer than [`LEAVES_IN_FLIGHT`] wait.
    fn ask_lookups(&mut self, out: &mut Out) {
        let rows = self.rows.as_ref().expect("rows phase");
        let l = rows.lookup.as_ref().expect("looking up");
        let (first, asks) = (l.from, next_asks(l.asked, l.done, l.keys.len()));
        for j in asks.clone() {
            self.ask_range_digests(out, first + j, 0);
        }
        self.rows().lookup.as_mut().expect("looking up").asked = asks.end;
    }

    /// Both sides' row digests of rows-phase range `range` (the rows phase, the period
    /// lookups and the confirm rounds ask them alike; `round` 0 outside a confirm round).
    fn ask_range_digests(&mut self, out: &mut Out, range: usize, round: u32) {
        let r = self.resolved.as_ref().expect("resolved");
        let (key_len, method, level) = (r.key_len, r.method, self.spec.reporting.level);
        let segment = self.rows.as_ref().expect("rows phase").ranges[range].clone();
        for side in [Side::Source, Side::Target] {
            let request = RowDigestsRequest {
                dataset: self.dataset(side),
                columns: self.columns(side),
                key_len,
                method,
                segment: segment.clone(),
                level,
                seal: self.seal(side),
                // the runtime names the run
                run_id: String::new(),
                side: None,
            };
            self.ask(
                out,
                Command::RowDigests {
                    round,
                    range,
                    side,
                    request,
                },
            );
        }
    }

    fn rows_done(&mut self, out: &mut Out) {
        let rows = self.rows.take().expect("rows phase");
        let found = rows.found.expect("classified");
        // a listed difference needs its key revealed: the sample limit and the agents'
        // reveal budgets leave some out, and the result says which withheld how many
        // (the counts stay whole)
        let total = found.counts.missing_in_target + found.counts.extra_in_target + found.counts.changed;
        if found.truncated {
            self.res.withheld.push(Withheld {
                budget: "reporting.sample_limit".into(),
                agent: None,
                side: None,
                keys: total.saturating_sub(found.findings.len() as u64),
            });
        }
        for (side, budget, keys) in &rows.withheld {
            let agent = match side {
                Side::Source => &self.agents.0,
                Side::Target => &self.agents.1,
            };
            let budget = budget.clone().unwrap_or_else(|| REVEAL_BUDGETS.to_string());
            self.res.warnings.push(format!(
                "agent {agent} ({}) withheld {keys} of the keys asked: its reveal budget {budget} is spent; \
                 `differences` lists {} of the {total} differences `difference_counts` counts",
                side.name(),
                rows.differences.len()
            ));
            self.res.withheld.push(Withheld {
                budget,
                agent: Some(agent.clone()),
                side: Some(side.name().to_string()),
                keys: *keys,
            });
        }
        self.res.truncated = !self.res.withheld.is_empty();
        self.res.differences = Some(rows.differences);
        self.res.difference_counts = Some(found.counts);
        if self.spec.confirm.is_some() {
            let f = &rows.in_flight;
            let gone = f.missing_in_target + f.extra_in_target + f.changed;
            let left = self
                .res
                .difference_counts
                .as_ref()
                .map_or(0, |c| c.missing_in_target + c.extra_in_target + c.changed);
            if gone > 0 && left == 0 {
                self.res.warnings.push(format!(
                    "every one of the {gone} differing rows agreed again within the confirm rounds: the sides differed \
                     only by rows in flight (the verdict stays differ: no moment was read at which they were equal)"
                ));
            }
            self.res.in_flight = Some(rows.in_flight);
        }
        let (dup_source, dup_target) = found.duplicates;
        if dup_source + dup_target > 0 {
            self.res.duplicate_keys = Some(DuplicateKeys {
                source: dup_source,
                target: dup_target,
            });
            self.res.warnings.push(format!(
                "duplicate keys in the differing segments: {dup_source} on the source, {dup_target} on the target; \
                 a repeated key whose rows are not the same on both sides is listed, with the rows each side holds \
                 of it (`duplicates`)"
            ));
        }
        // the period each range reads (a lookup's: that of the range its key was
        // found in)
        let periods: Vec<Option<Period>> = (0..rows.ranges.len())
            .map(|r| {
                let origin = rows
                    .lookup
                    .as_ref()
                    .filter(|l| r >= l.from)
                    .and_then(|l| l.origins.get(r - l.from).copied())
                    .unwrap_or(r);
                rows.ranges[origin].period.clone()
            })
            .collect();
        self.begin_key_sql(out, &periods, rows.keyed);
    }
}
