//! The rows phase's reveals: of each page of differing rows, the keys (and at
//! `detailed` the values of changed rows) each side is asked to show, trimmed to what the
//! result shows before the run log records them, then turned into the differences.

use std::collections::{HashMap, HashSet};

use tally_common::wire::{RevealRequest, RevealResponse, RevealedRow};

use super::{RowsPhase, next_asks, put, take_both};
use crate::result::DiffKind;
use crate::rows::{self, RevealWork};
use crate::{Command, Engine, Out, Side, Step};

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

impl RowsPhase {
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
    pub(crate) fn trim_reveal(&self, at: (usize, u32), side: Side, mut r: RevealResponse) -> RevealResponse {
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
    pub(crate) fn trim_reveals(
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

    pub(crate) fn on_revealed(
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

    /// Differences of every work item, in order, whose reveals have arrived.
    pub(super) fn take_reveals(&mut self) {
        let detailed = self.detailed();
        let r = self.resolved.clone().expect("resolved");
        let rows = self.rows();
        while let Some((s, t)) = take_both(&mut rows.reveals, rows.revealed) {
            let n = rows.revealed;
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

    /// Reveals of the next work items (pages) while fewer than
    /// [`LEAVES_IN_FLIGHT`](crate::drill::LEAVES_IN_FLIGHT) are open: a side with nothing
    /// to show is not asked, nor one whose reveal budget is spent (its agent said so: it
    /// would refuse).
    pub(super) fn ask_reveals(&mut self, out: &mut Out) {
        let key_len = self.resolved.as_ref().expect("resolved").key_len;
        let detailed = self.detailed();
        let rows = self.rows.as_ref().expect("rows phase");
        let asks = next_asks(rows.reveals_asked, rows.revealed, rows.work.len());
        let mut nothing_to_ask = Vec::new();
        for n in asks.clone() {
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
        rows.reveals_asked = asks.end;
        for (n, side, spent) in nothing_to_ask {
            let r = RevealResponse {
                truncated: spent.is_some(),
                withheld_by: spent,
                ..RevealResponse::default()
            };
            rows.take_reveal(n, side, r);
        }
    }
}
