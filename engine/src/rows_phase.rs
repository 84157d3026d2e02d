//! The engine's rows phase (DESIGN §5 step 5): row digests of each merged leaf range,
//! classified in range order as they arrive (a few ranges in flight), then reveals of
//! the differing rows only, range by range, and the differences. The classification
//! and reveal logic itself is [`crate::rows`]; this is its bookkeeping.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use tally_common::PrivacyLevel;
use tally_common::segment::{KeyTuple, Period, Segment, bucket_hash};
use tally_common::wire::{
    MAX_KEY_SQL_KEYS, RevealRequest, RevealResponse, RevealedRow, RowDigest, RowDigestsRequest,
};

use super::drill::LEAVES_IN_FLIGHT;
use super::{Command, Engine, Out, Side, Step};
use crate::planner::rows_batches;
use crate::result::{DiffCounts, DiffKind, Difference, DuplicateKeys, KeySqlOut, Withheld};
use crate::rows::{self, Classified, Classifier, RevealWork};

/// What a result names when an agent cut a reveal short without naming its budget (an
/// agent from before `withheld_by`).
const REVEAL_BUDGETS: &str = "max_reveal_rows or max_reveal_rows_per_hour";

/// After an early stop, rows are still classified when the differing segments hold at
/// most this many rows (per side).
const ROWS_PHASE_AFTER_STOP: u64 = 1_000_000;

type Pair<T> = (Option<T>, Option<T>);

/// The most rows the rows phase reads as one range of merged leaves (the agents' own
/// `max_digest_rows` bounds it too): the coordinator holds a range's digests from both
/// sides until it is classified, 16 bytes a row.
const RANGE_ROWS: u64 = 100_000;

/// One row per key hash, the last: an agent before one row per key revealed every row of
/// a repeated key, and the differences read the last one (a map built in order), so
/// dropping the others changes no result (and `trim_reveals` compares the row shown).
fn keep_last_per_key(rows: &mut Vec<RevealedRow>) {
    let last: HashMap<u64, usize> = rows.iter().enumerate().map(|(i, r)| (r.key_hash, i)).collect();
    let mut i = 0;
    rows.retain(|r| {
        let keep = last[&r.key_hash] == i;
        i += 1;
        keep
    });
}

fn put<T>(slot: &mut Pair<T>, side: Side, v: T) {
    match side {
        Side::Source => slot.0 = Some(v),
        Side::Target => slot.1 = Some(v),
    }
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

/// Investigation SQL of the differing keys (with_keys and detailed): for each leaf
/// that has investigation SQL and each kind of difference in it, both sides' SQL of
/// exactly those keys, a few in flight at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct KeySqlPhase {
    items: Vec<(usize, DiffKind, Vec<KeyTuple>)>,
    asked: usize,
    done: usize,
    partial: BTreeMap<usize, Pair<String>>,
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

/// One confirm round: after its wait, the digests of every range that holds a finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Confirming {
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

    /// Takes in one side's answer to work item `n`; an answer cut short counts the
    /// asked keys it withheld, under the budget its agent named.
    fn take_reveal(&mut self, n: usize, side: Side, r: RevealResponse) {
        if r.truncated {
            let w = &self.work[n];
            let asked: HashSet<u64> = match side {
                Side::Source => &w.from_source,
                Side::Target => &w.from_target,
            }
            .iter()
            .copied()
            .collect();
            let shown: HashSet<u64> = r
                .rows
                .iter()
                .map(|x| x.key_hash)
                .filter(|h| asked.contains(h))
                .collect();
            let kept = (asked.len() - shown.len()) as u64;
            match self
                .withheld
                .iter_mut()
                .find(|(s, b, _)| *s == side && *b == r.withheld_by)
            {
                Some(w) => w.2 += kept,
                None => self.withheld.push((side, r.withheld_by.clone(), kept)),
            }
        }
        put(self.reveals.entry(n).or_default(), side, r);
    }

    /// The reveal budget of `side` its agent said withheld rows: spent for this run
    /// (or the hour), so the side is not asked again.
    fn spent(&self, side: Side) -> Option<String> {
        self.withheld
            .iter()
            .find_map(|(s, b, _)| if *s == side { b.clone() } else { None })
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

    /// The reveal work of page `page` of range `range`.
    fn work_of(&self, (range, page): (usize, u32)) -> Option<&RevealWork> {
        self.rows
            .as_ref()?
            .work
            .iter()
            .find(|w| w.leaf == range && w.page == page)
    }

    /// The key hashes of the changed rows of a range's page (none outside the reveals).
    fn changed_in(&self, at: (usize, u32)) -> HashSet<u64> {
        let (Some(work), Some(found)) = (
            self.work_of(at),
            self.rows.as_ref().and_then(|r| r.found.as_ref()),
        ) else {
            return HashSet::new();
        };
        work.findings
            .iter()
            .filter_map(|&n| found.findings.get(n))
            .filter(|f| f.kind == crate::result::DiffKind::Changed)
            .map(|f| f.key_hash)
            .collect()
    }

    /// See [`Engine::trim`].
    pub(super) fn trim_reveal(&self, at: (usize, u32), side: Side, mut r: RevealResponse) -> RevealResponse {
        let Some(work) = self.work_of(at) else {
            return r;
        };
        let asked = match side {
            Side::Source => &work.from_source,
            Side::Target => &work.from_target,
        };
        let detailed = self.detailed();
        let changed = self.changed_in(at);
        r.rows.retain(|row| asked.contains(&row.key_hash));
        keep_last_per_key(&mut r.rows);
        for row in &mut r.rows {
            if !(detailed && changed.contains(&row.key_hash)) {
                row.values.clear();
            }
        }
        r
    }

    /// Both sides' (trimmed) reveals of a range's page: what the result shows of them and
    /// nothing more. Of a changed row both show, a column whose canonical values are
    /// equal is kept by neither (the result names only the columns that differ, and
    /// equal values compare equal as absent on both sides too). A changed row only the
    /// source revealed (the target's budget ran out, or its row is in another period's
    /// range) is listed without values, so it keeps none; one only the target revealed
    /// is not listed at all (a changed row is listed from the source's), so it is not
    /// kept.
    pub(super) fn trim_reveals(
        &self,
        at: (usize, u32),
        mut source: RevealResponse,
        mut target: RevealResponse,
    ) -> (RevealResponse, RevealResponse) {
        let Some(key_len) = self.resolved.as_ref().map(|r| r.key_len) else {
            return (source, target);
        };
        let changed = self.changed_in(at);
        let from_source: HashSet<u64> = source.rows.iter().map(|r| r.key_hash).collect();
        target
            .rows
            .retain(|r| !changed.contains(&r.key_hash) || from_source.contains(&r.key_hash));
        let mut by_hash: HashMap<u64, &mut Vec<Option<String>>> = target
            .rows
            .iter_mut()
            .map(|r| (r.key_hash, &mut r.values))
            .collect();
        for row in &mut source.rows {
            let Some(other) = by_hash.get_mut(&row.key_hash) else {
                row.values.clear();
                continue;
            };
            for j in key_len..row.values.len().min(other.len()) {
                if row.values[j].is_some() && row.values[j] == other[j] {
                    row.values[j] = None;
                    other[j] = None;
                }
            }
        }
        (source, target)
    }

    pub(super) fn on_revealed(
        &mut self,
        out: &mut Out,
        (range, page): (usize, u32),
        side: Side,
        r: RevealResponse,
    ) -> Step {
        let rows = self.rows();
        let n = rows
            .work
            .iter()
            .position(|w| w.leaf == range && w.page == page)
            .expect("a reveal was asked for this page");
        rows.take_reveal(n, side, r);
        self.advance_rows(out)
    }

    /// Takes in what has arrived, in range order, and asks for what the window allows.
    fn advance_rows(&mut self, out: &mut Out) -> Step {
        let total = self.rows().drilled();
        // classify every range, in order, whose two sides have arrived
        loop {
            let rows = self.rows();
            let i = rows.classified;
            if i >= total || !matches!(rows.digests.get(&i), Some((Some(_), Some(_)))) {
                break;
            }
            let (Some(s), Some(t)) = rows.digests.remove(&i).expect("present") else {
                unreachable!("both present")
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
            if !matches!(rows.digests.get(&range), Some((Some(_), Some(_)))) {
                break;
            }
            let (Some(s), Some(t)) = rows.digests.remove(&range).expect("present") else {
                unreachable!("both present")
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

    /// Digests of the next lookups while fewer than [`LEAVES_IN_FLIGHT`] wait.
    fn ask_lookups(&mut self, out: &mut Out) {
        let rows = self.rows.as_ref().expect("rows phase");
        let l = rows.lookup.as_ref().expect("looking up");
        let (from, to) = (l.asked, l.keys.len().min(l.done + LEAVES_IN_FLIGHT));
        let first = l.from;
        for j in from..to.max(from) {
            self.ask_range_digests(out, first + j, 0);
        }
        let l = self.rows().lookup.as_mut().expect("looking up");
        l.asked = l.asked.max(to);
    }

    /// The wait before confirm round `round` is over: with a watermark, the sides'
    /// positions are aligned again before the round reads anything.
    pub(super) fn on_waited(&mut self, out: &mut Out, round: u32) -> Step {
        if !self.positions_synced(round) {
            self.sync_positions(out, round);
            return Ok(());
        }
        self.on_confirm_synced(out, round)
    }

    /// Confirm round `round` may read: its wait (and watermark) is done.
    pub(super) fn on_confirm_synced(&mut self, out: &mut Out, round: u32) -> Step {
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

    pub(super) fn on_confirm_digests(
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
    fn confirm_rows(&mut self, out: &mut Out) -> bool {
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
            let arrived: Vec<usize> = c
                .digests
                .iter()
                .filter(|(_, p)| matches!(p, (Some(_), Some(_))))
                .map(|(r, _)| *r)
                .collect();
            for range in arrived {
                let (Some(s), Some(t)) = c.digests.remove(&range).expect("present") else {
                    unreachable!("both present")
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
        let (from, to) = (c.asked, c.ranges.len().min(c.done + LEAVES_IN_FLIGHT));
        let (round, ranges) = (c.round, c.ranges[from..to.max(from)].to_vec());
        for range in ranges {
            self.ask_range_digests(out, range, round);
        }
        let c = self.rows().confirming.as_mut().expect("in a round");
        c.asked = c.asked.max(to);
    }

    /// Digests of the next ranges while fewer than [`LEAVES_IN_FLIGHT`] wait to be
    /// classified (the ranges are classified in order).
    fn ask_digests(&mut self, out: &mut Out) {
        let rows = self.rows.as_ref().expect("rows phase");
        let (from, to) = (rows.asked, rows.drilled().min(rows.classified + LEAVES_IN_FLIGHT));
        for range in from..to.max(from) {
            self.ask_range_digests(out, range, 0);
        }
        let rows = self.rows();
        rows.asked = rows.asked.max(to);
    }

    /// Differences of every work item, in order, whose reveals have arrived.
    fn take_reveals(&mut self) {
        let detailed = self.detailed();
        let r = self.resolved.clone().expect("resolved");
        let rows = self.rows();
        while matches!(rows.reveals.get(&rows.revealed), Some((Some(_), Some(_)))) {
            let n = rows.revealed;
            let (Some(s), Some(t)) = rows.reveals.remove(&n).expect("present") else {
                unreachable!("both present")
            };
            let by_hash = |resp: RevealResponse| -> rows::Revealed {
                resp.rows
                    .into_iter()
                    .map(|row| (row.key_hash, (row.key, row.values)))
                    .collect()
            };
            let found = rows.found.as_ref().expect("classified");
            let mine: Vec<rows::Finding> = rows.work[n].findings.iter().map(|&i| found.findings[i]).collect();
            let (s, t) = (by_hash(s), by_hash(t));
            // as `differences` lists them: a missing or changed key as the source
            // revealed it, an extra one as the target did
            for f in &mine {
                let side = if f.kind == DiffKind::ExtraInTarget { &t } else { &s };
                if let Some((key, _)) = side.get(&f.key_hash) {
                    rows.keyed.push((f.leaf, f.key_hash, f.kind, key.clone()));
                }
            }
            let diffs = rows::differences(&mine, &s, &t, &r.columns, r.key_len, detailed);
            rows.differences.extend(diffs);
            rows.revealed += 1;
        }
    }

    /// Reveals of the next work items (pages) while fewer than [`LEAVES_IN_FLIGHT`] are
    /// open: a side with nothing to show is not asked, nor one whose reveal budget is
    /// spent (its agent said so: it would refuse).
    fn ask_reveals(&mut self, out: &mut Out) {
        let key_len = self.resolved.as_ref().expect("resolved").key_len;
        let detailed = self.detailed();
        let rows = self.rows.as_ref().expect("rows phase");
        let (from, to) = (
            rows.reveals_asked,
            rows.work.len().min(rows.revealed + LEAVES_IN_FLIGHT),
        );
        let mut nothing_to_ask = Vec::new();
        for n in from..to.max(from) {
            let rows = self.rows.as_ref().expect("rows phase");
            let w = rows.work[n].clone();
            let segment = rows.ranges[w.leaf].clone();
            for (side, hashes) in [(Side::Source, w.from_source), (Side::Target, w.from_target)] {
                if hashes.is_empty() {
                    nothing_to_ask.push((n, side, None));
                    continue;
                }
                if let Some(budget) = self.rows.as_ref().and_then(|r| r.spent(side)) {
                    nothing_to_ask.push((n, side, Some(budget)));
                    continue;
                }
                let request = RevealRequest {
                    seal: self.seal(side),
                    dataset: self.dataset(side),
                    columns: self.columns(side),
                    key_len,
                    segment: segment.clone(),
                    limit: hashes.len() as u32,
                    key_hashes: hashes,
                    level: self.spec.reporting.level,
                    consent_acknowledged: self.spec.reporting.consent_acknowledged,
                };
                let range = w.leaf;
                self.ask(
                    out,
                    Command::Reveal {
                        range,
                        page: w.page,
                        side,
                        request,
                        rows: detailed,
                    },
                );
            }
        }
        let rows = self.rows();
        rows.reveals_asked = rows.reveals_asked.max(to);
        for (n, side, spent) in nothing_to_ask {
            let r = RevealResponse {
                truncated: spent.is_some(),
                withheld_by: spent,
                ..RevealResponse::default()
            };
            rows.take_reveal(n, side, r);
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

    /// After the rows phase: the per-key SQL of each leaf with investigation SQL, one
    /// per kind of difference found in it (at most [`MAX_KEY_SQL_KEYS`] keys each); the
    /// run finishes when every one has arrived (at once when there is none).
    fn begin_key_sql(
        &mut self,
        out: &mut Out,
        periods: &[Option<Period>],
        keyed: Vec<(usize, u64, DiffKind, KeyTuple)>,
    ) {
        let leaves = &self.planner.as_ref().expect("drilled").leaves;
        // each key in one leaf: the first with SQL whose bounds hold it, in the period
        // its range read (a key looked up in every period: the one it was found in)
        let mut by_leaf: BTreeMap<(usize, DiffKind), Vec<KeyTuple>> = BTreeMap::new();
        for (range, key_hash, kind, key) in &keyed {
            let period = periods.get(*range).cloned().flatten();
            let leaf = leaves.iter().enumerate().position(|(i, leaf)| {
                let seg = &leaf.segment;
                self.res.leaves.get(i).is_some_and(|l| l.sql.is_some())
                    && seg.contains(key, bucket_hash(*key_hash))
                    && (seg.period.is_none() || period.is_none() || seg.period == period)
            });
            if let Some(leaf) = leaf {
                let keys = by_leaf.entry((leaf, *kind)).or_default();
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
        }
        let mut items: Vec<(usize, DiffKind, Vec<KeyTuple>)> = Vec::new();
        let mut cut = 0usize;
        for ((leaf, kind), mut keys) in by_leaf {
            if keys.len() > MAX_KEY_SQL_KEYS {
                cut += 1;
                keys.truncate(MAX_KEY_SQL_KEYS);
            }
            items.push((leaf, kind, keys));
        }
        if cut > 0 {
            self.res.warnings.push(format!(
                "per-key investigation SQL names the first {MAX_KEY_SQL_KEYS} keys of a kind of difference in a \
                 leaf; {cut} leaf kinds hold more"
            ));
        }
        if items.is_empty() {
            out.extend(self.finish());
            return;
        }
        self.key_sql = Some(KeySqlPhase {
            items,
            asked: 0,
            done: 0,
            partial: BTreeMap::new(),
        });
        self.ask_key_sql(out);
    }

    /// Asks for the next per-key SQL while fewer than [`LEAVES_IN_FLIGHT`] wait.
    fn ask_key_sql(&mut self, out: &mut Out) {
        let p = self.key_sql.as_ref().expect("key sql phase");
        let (from, to) = (p.asked, p.items.len().min(p.done + LEAVES_IN_FLIGHT));
        let asks: Vec<(usize, DiffKind, Vec<KeyTuple>)> = p.items[from..to.max(from)].to_vec();
        for (leaf, kind, keys) in asks {
            let segment = self.planner.as_ref().expect("drilled").leaves[leaf]
                .segment
                .clone();
            for side in [Side::Source, Side::Target] {
                let request = self.sql_request(side, &segment, keys.clone());
                self.ask(
                    out,
                    Command::KeySql {
                        leaf,
                        kind,
                        side,
                        request,
                    },
                );
            }
        }
        let p = self.key_sql.as_mut().expect("key sql phase");
        p.asked = p.asked.max(to);
    }

    pub(super) fn on_key_sql(
        &mut self,
        out: &mut Out,
        leaf: usize,
        kind: DiffKind,
        side: Side,
        sql: String,
    ) -> Step {
        let p = self.key_sql.as_mut().expect("key sql asked");
        let n = p
            .items
            .iter()
            .position(|(l, k, _)| *l == leaf && *k == kind)
            .expect("asked for this leaf and kind");
        let slot = p.partial.entry(n).or_default();
        put(slot, side, sql);
        if let (Some(_), Some(_)) = slot {
            let (Some(source), Some(target)) = p.partial.remove(&n).expect("present") else {
                unreachable!("both present")
            };
            p.done += 1;
            let keys = p.items[n].2.len();
            let shown = &mut self.res.leaves[leaf].key_sql;
            shown.push(KeySqlOut {
                kind,
                keys,
                source,
                target,
            });
            shown.sort_by_key(|k| k.kind);
            if p.done == p.items.len() {
                out.extend(self.finish());
                return Ok(());
            }
            self.ask_key_sql(out);
        }
        Ok(())
    }
}
