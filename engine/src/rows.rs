//! The rows phase without I/O (DESIGN §5): classifying the (key hash, row hash) pairs
//! of each differing range, the reveal plan that asks each side only for what it must
//! show, and the differences built from what the agents revealed. The runtime feeds it
//! agent answers; the run engine (`rows_phase/`) owns it as state.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use tally_common::segment::{KeyTuple, Segment, bucket_hash};
use tally_common::wire::{MAX_REVEAL_ROWS_PER_CALL, RowDigest};

use crate::resolve::ResolvedColumn;
use crate::result::{DiffCounts, DiffKind, Difference, KeyCopies, ValuePair};

/// One differing row: the range (leaf) it was found in, how it differs, its key hash,
/// and, when either side holds the key more than once, how many rows each holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Finding {
    pub leaf: usize,
    pub kind: DiffKind,
    pub key_hash: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<KeyCopies>,
}

/// Accumulates findings range by range, in range order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Classifier {
    counts: DiffCounts,
    dup_source: u64,
    dup_target: u64,
    found: Vec<Finding>,
}

/// What the rows phase found, before any reveal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classified {
    pub counts: DiffCounts,
    /// Keys seen twice within one range, per side: reported, never folded.
    pub duplicates: (u64, u64),
    /// In range order, at most the sample limit.
    pub findings: Vec<Finding>,
    /// More findings than the sample limit.
    pub truncated: bool,
}

/// key hash → the row hashes of one side's range under that key (sorted: more than
/// one when the key is repeated), counting keys seen twice.
fn index(digests: &[RowDigest], dups: &mut u64) -> HashMap<u64, Vec<u64>> {
    let mut m: HashMap<u64, Vec<u64>> = HashMap::with_capacity(digests.len());
    for d in digests {
        let rows = m.entry(d.key_hash).or_default();
        if !rows.is_empty() {
            *dups += 1;
        }
        rows.push(d.row_hash);
    }
    for rows in m.values_mut().filter(|r| r.len() > 1) {
        rows.sort_unstable();
    }
    m
}

impl Classifier {
    /// Classifies range `leaf` from both sides' digests: a key only on the source is
    /// missing in the target, only on the target extra, on both changed unless both
    /// sides hold the same rows of it. A key repeated on either side is never folded
    /// into one row: unless both sides hold exactly the same copies, it is changed
    /// (a copy more on one side, or one copy that differs), with its copies counted.
    /// Within a range, findings are ordered by kind, then key hash.
    pub fn add_range(&mut self, leaf: usize, source: &[RowDigest], target: &[RowDigest]) {
        let s = index(source, &mut self.dup_source);
        let t = index(target, &mut self.dup_target);
        let mut here: Vec<(DiffKind, u64, Option<KeyCopies>)> = Vec::new();
        for (k, rows) in &s {
            match t.get(k) {
                None => here.push((DiffKind::MissingInTarget, *k, KeyCopies::of(rows.len(), 0))),
                Some(theirs) if theirs != rows => {
                    here.push((DiffKind::Changed, *k, KeyCopies::of(rows.len(), theirs.len())))
                }
                _ => {}
            }
        }
        here.extend(
            t.iter()
                .filter(|(k, _)| !s.contains_key(k))
                .map(|(k, rows)| (DiffKind::ExtraInTarget, *k, KeyCopies::of(0, rows.len()))),
        );
        here.sort();
        for (kind, key_hash, copies) in here {
            match kind {
                DiffKind::MissingInTarget => self.counts.missing_in_target += 1,
                DiffKind::ExtraInTarget => self.counts.extra_in_target += 1,
                DiffKind::Changed => self.counts.changed += 1,
            }
            self.found.push(Finding {
                leaf,
                kind,
                key_hash,
                copies,
            });
        }
    }

    /// The ranges holding at least one finding, in order.
    pub fn ranges_with_findings(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.found.iter().map(|f| f.leaf).collect();
        v.dedup();
        v
    }

    /// Whether anything differs.
    pub fn has_findings(&self) -> bool {
        !self.found.is_empty()
    }

    /// Drops the findings whose key (by range and key hash) is in `agree`, or is in
    /// neither side's re-read (`seen`) of a range where `absent_agrees` (no window or
    /// period: both sides agree the row does not exist, a delete replicated), and
    /// returns their counts: a confirm round's rows that agree now.
    pub fn drop_agreeing(
        &mut self,
        agree: &HashSet<(usize, u64)>,
        seen: &HashSet<(usize, u64)>,
        absent_agrees: impl Fn(usize) -> bool,
    ) -> DiffCounts {
        let mut gone = DiffCounts::default();
        self.found.retain(|f| {
            let k = (f.leaf, f.key_hash);
            let keep = !(agree.contains(&k) || (!seen.contains(&k) && absent_agrees(f.leaf)));
            if !keep {
                match f.kind {
                    DiffKind::MissingInTarget => gone.missing_in_target += 1,
                    DiffKind::ExtraInTarget => gone.extra_in_target += 1,
                    DiffKind::Changed => gone.changed += 1,
                }
            }
            keep
        });
        self.counts.missing_in_target -= gone.missing_in_target;
        self.counts.extra_in_target -= gone.extra_in_target;
        self.counts.changed -= gone.changed;
        gone
    }

    /// The keys both digest lists of one range hold exactly once, with the same row
    /// hash: rows that agree. A key repeated on either side (which row is compared is
    /// not fixed) is not agreement: such a difference is kept, never dropped as in
    /// flight.
    pub fn agreeing_keys(source: &[RowDigest], target: &[RowDigest]) -> HashSet<u64> {
        let (mut ds, mut dt) = (0, 0);
        let once = |d: &[RowDigest], dups: &mut u64| {
            let mut seen: HashMap<u64, Option<u64>> = HashMap::with_capacity(d.len());
            for x in d {
                seen.entry(x.key_hash)
                    .and_modify(|v| {
                        *v = None;
                        *dups += 1;
                    })
                    .or_insert(Some(x.row_hash));
            }
            seen
        };
        let (s, t) = (once(source, &mut ds), once(target, &mut dt));
        s.iter()
            .filter_map(|(k, h)| match (h, t.get(k)) {
                (Some(a), Some(Some(b))) if a == b => Some(*k),
                _ => None,
            })
            .collect()
    }

    /// Ends the classification: a key missing in one range and extra in another (its
    /// row moved between periods, the time column differing) is one changed row, found
    /// where the source has it; then at most `sample_limit` findings are kept.
    pub fn finish(self, sample_limit: usize) -> Classified {
        let Classifier {
            mut counts,
            dup_source,
            dup_target,
            mut found,
        } = self;
        let extra_at: HashMap<u64, (usize, Option<KeyCopies>)> = found
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == DiffKind::ExtraInTarget)
            .map(|(n, f)| (f.key_hash, (n, f.copies)))
            .collect();
        let mut merged = HashSet::new();
        for f in found.iter_mut() {
            if f.kind == DiffKind::MissingInTarget
                && let Some(&(n, theirs)) = extra_at.get(&f.key_hash)
            {
                f.kind = DiffKind::Changed;
                let count = |c: Option<KeyCopies>, source: bool| {
                    c.map_or(1, |c| if source { c.source } else { c.target }) as usize
                };
                f.copies = KeyCopies::of(count(f.copies, true), count(theirs, false));
                merged.insert(n);
                counts.missing_in_target -= 1;
                counts.extra_in_target -= 1;
                counts.changed += 1;
            }
        }
        let mut findings: Vec<Finding> = found
            .into_iter()
            .enumerate()
            .filter(|(n, _)| !merged.contains(n))
            .map(|(_, f)| f)
            .collect();
        let truncated = findings.len() > sample_limit;
        findings.truncate(sample_limit);
        Classified {
            counts,
            duplicates: (dup_source, dup_target),
            findings,
            truncated,
        }
    }
}

/// The key hashes (each once, in finding order) of the missing and extra findings in
/// ranges where `bounded` (a period's range, under `strategy: time`): the range saw
/// the key in one period only, so whether the other side holds it, or the same side
/// holds more copies, is known only by looking the key up in every period (F14).
pub fn keys_to_look_up(findings: &[Finding], bounded: impl Fn(usize) -> bool) -> Vec<u64> {
    let mut seen = HashSet::new();
    findings
        .iter()
        .filter(|f| f.kind != DiffKind::Changed && bounded(f.leaf))
        .map(|f| f.key_hash)
        .filter(|h| seen.insert(*h))
        .collect()
}

/// The segment that looks key hash `key_hash`, found in `range`, up in every period:
/// the range's key bounds (the key lies within them whatever its period, and they
/// bound the scan), its bucket hash, the run's window, and no period.
pub fn lookup_segment(range: &Segment, key_hash: u64) -> Segment {
    let b = bucket_hash(key_hash);
    Segment {
        lower: range.lower.clone(),
        upper: range.upper.clone(),
        hash: Some((b, b + 1)),
        period: None,
        window: range.window.clone(),
    }
}

/// Classifies key hash `key_hash` again from both sides' digests of its lookup range
/// `leaf` (every row of the key, whatever its period), by the rule of
/// [`Classifier::add_range`]: every finding of the key becomes one, found in `leaf`,
/// with the copies each side holds. A key both sides now hold alike, or neither does
/// (rows in flight since), keeps its findings as they were: never dropped.
pub fn reclassify(
    found: &mut Classified,
    key_hash: u64,
    leaf: usize,
    source: &[RowDigest],
    target: &[RowDigest],
) {
    let rows = |d: &[RowDigest]| {
        let mut v: Vec<u64> = d
            .iter()
            .filter(|x| x.key_hash == key_hash)
            .map(|x| x.row_hash)
            .collect();
        v.sort_unstable();
        v
    };
    let (s, t) = (rows(source), rows(target));
    let kind = match (s.is_empty(), t.is_empty()) {
        (true, true) => return,
        (false, true) => DiffKind::MissingInTarget,
        (true, false) => DiffKind::ExtraInTarget,
        _ if s == t => return,
        _ => DiffKind::Changed,
    };
    let Some(first) = found.findings.iter().position(|f| f.key_hash == key_hash) else {
        return;
    };
    let (mut dup_s, mut dup_t) = (0u64, 0u64);
    for f in found.findings.iter().filter(|f| f.key_hash == key_hash) {
        match f.kind {
            DiffKind::MissingInTarget => found.counts.missing_in_target -= 1,
            DiffKind::ExtraInTarget => found.counts.extra_in_target -= 1,
            DiffKind::Changed => found.counts.changed -= 1,
        }
        if let Some(c) = f.copies {
            dup_s += u64::from(c.source.saturating_sub(1));
            dup_t += u64::from(c.target.saturating_sub(1));
        }
    }
    match kind {
        DiffKind::MissingInTarget => found.counts.missing_in_target += 1,
        DiffKind::ExtraInTarget => found.counts.extra_in_target += 1,
        DiffKind::Changed => found.counts.changed += 1,
    }
    found.duplicates.0 = found.duplicates.0.saturating_sub(dup_s) + (s.len() as u64).saturating_sub(1);
    found.duplicates.1 = found.duplicates.1.saturating_sub(dup_t) + (t.len() as u64).saturating_sub(1);
    found.findings[first] = Finding {
        leaf,
        kind,
        key_hash,
        copies: KeyCopies::of(s.len(), t.len()),
    };
    let mut i = 0;
    found.findings.retain(|f| {
        let keep = i == first || f.key_hash != key_hash;
        i += 1;
        keep
    });
}

/// What one page of a range's reveals asks of each side: at most
/// [`MAX_REVEAL_ROWS_PER_CALL`] key hashes a side, one reveal call each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevealWork {
    pub leaf: usize,
    /// The page of the range, from 0.
    #[serde(default)]
    pub page: u32,
    /// Indexes into the findings this page holds.
    pub findings: Vec<usize>,
    /// Key hashes the source reveals: its missing and changed rows.
    pub from_source: Vec<u64>,
    /// Key hashes the target reveals: its extra rows, and at detailed the changed ones
    /// too (their values on both sides).
    pub from_target: Vec<u64>,
}

/// The reveals of the ranges that hold findings, in range order, each range in pages
/// of at most `MAX_REVEAL_ROWS_PER_CALL` findings (so at most that many key hashes a
/// side: an agent releases no more in one call).
pub fn reveal_plan(findings: &[Finding], ranges: usize, detailed: bool) -> Vec<RevealWork> {
    let mut by_range: Vec<Vec<usize>> = vec![Vec::new(); ranges];
    for (n, f) in findings.iter().enumerate() {
        if let Some(mine) = by_range.get_mut(f.leaf) {
            mine.push(n);
        }
    }
    let mut plan = Vec::new();
    for (leaf, mine) in by_range.into_iter().enumerate() {
        for (page, chunk) in mine.chunks(MAX_REVEAL_ROWS_PER_CALL).enumerate() {
            let pick = |keep: &dyn Fn(DiffKind) -> bool| -> Vec<u64> {
                chunk
                    .iter()
                    .map(|&n| findings[n])
                    .filter(|f| keep(f.kind))
                    .map(|f| f.key_hash)
                    .collect()
            };
            plan.push(RevealWork {
                leaf,
                page: page as u32,
                from_source: pick(&|k| k != DiffKind::ExtraInTarget),
                from_target: pick(&|k| k == DiffKind::ExtraInTarget || (detailed && k == DiffKind::Changed)),
                findings: chunk.to_vec(),
            });
        }
    }
    plan
}

/// A revealed row: its key and (at detailed) its canonical values, by column position.
pub type Revealed = HashMap<u64, (KeyTuple, Vec<Option<String>>)>;

/// The differences of one range from what each side revealed. A finding whose row a
/// side did not reveal (its policy's budget ran out) is left out. At detailed, a
/// changed row names the columns whose values differ, never a masked column's values;
/// a changed row that differs only in masked columns says `(masked column)`.
pub fn differences(
    findings: &[Finding],
    source: &Revealed,
    target: &Revealed,
    columns: &[ResolvedColumn],
    key_len: usize,
    detailed: bool,
) -> Vec<Difference> {
    let mut diffs = Vec::new();
    for f in findings {
        let side = if f.kind == DiffKind::ExtraInTarget {
            target
        } else {
            source
        };
        let Some((key, _)) = side.get(&f.key_hash) else {
            continue;
        };
        let mut d = Difference {
            kind: f.kind,
            key: key.clone(),
            columns: None,
            values: None,
            duplicates: f.copies,
        };
        if detailed
            && f.kind == DiffKind::Changed
            && let (Some((_, sv)), Some((_, tv))) = (source.get(&f.key_hash), target.get(&f.key_hash))
        {
            let mut cols = Vec::new();
            let mut values = BTreeMap::new();
            for (j, c) in columns.iter().enumerate().skip(key_len) {
                if c.masked {
                    continue;
                }
                let (a, b) = (sv.get(j).cloned().flatten(), tv.get(j).cloned().flatten());
                if a != b {
                    cols.push(c.source_name.clone());
                    values.insert(c.source_name.clone(), ValuePair { source: a, target: b });
                }
            }
            // a repeated key may differ by a copy only: the values shown are one row a side
            if cols.is_empty() && f.copies.is_none() && columns.iter().any(|c| c.masked) {
                cols.push("(masked column)".into());
            }
            d.columns = Some(cols);
            d.values = Some(values);
        }
        diffs.push(d);
    }
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::FieldFormat;
    use tally_common::TypeClass;
    use tally_common::segment::KeyPart;

    fn d(key_hash: u64, row_hash: u64) -> RowDigest {
        RowDigest { key_hash, row_hash }
    }

    fn f(leaf: usize, kind: DiffKind, key_hash: u64) -> Finding {
        Finding {
            leaf,
            kind,
            key_hash,
            copies: None,
        }
    }

    #[test]
    fn a_range_classifies_missing_extra_and_changed_rows_and_counts_duplicates() {
        let mut c = Classifier::default();
        // source: 1, 2, 3 (3 twice); target: 2 (other row hash), 3 (the same two
        // rows), 4
        c.add_range(
            0,
            &[d(1, 10), d(2, 20), d(3, 30), d(3, 30)],
            &[d(2, 21), d(3, 30), d(4, 40), d(3, 30)],
        );
        c.add_range(1, &[d(7, 70)], &[d(7, 70)]);
        let out = c.finish(100);
        assert_eq!(
            out.findings,
            vec![
                f(0, DiffKind::MissingInTarget, 1),
                f(0, DiffKind::ExtraInTarget, 4),
                f(0, DiffKind::Changed, 2),
            ]
        );
        assert_eq!(
            out.counts,
            DiffCounts {
                missing_in_target: 1,
                extra_in_target: 1,
                changed: 1
            }
        );
        assert_eq!(out.duplicates, (1, 1));
        assert!(!out.truncated);
    }

    #[test]
    fn a_repeated_key_is_listed_with_its_copies_unless_both_sides_hold_the_same_rows() {
        let copies = |s, t| Some(KeyCopies { source: s, target: t });
        let changed = |key_hash, c| Finding {
            copies: c,
            ..f(0, DiffKind::Changed, key_hash)
        };
        // key 5: one row on the source, the same row twice on the target
        // key 6: one row on the source, on the target that row and a changed copy, in
        // either order (the last row of a key must not stand for all of them)
        // key 7: the same two rows on both sides; key 8: twice on the target only
        for copy_first in [false, true] {
            let six = if copy_first {
                [d(6, 61), d(6, 60)]
            } else {
                [d(6, 60), d(6, 61)]
            };
            let mut c = Classifier::default();
            c.add_range(
                0,
                &[d(5, 50), d(6, 60), d(7, 70), d(7, 71)],
                &[
                    d(5, 50),
                    d(5, 50),
                    six[0],
                    six[1],
                    d(7, 71),
                    d(7, 70),
                    d(8, 80),
                    d(8, 80),
                ],
            );
            let out = c.finish(100);
            assert_eq!(
                out.findings,
                vec![
                    Finding {
                        copies: copies(0, 2),
                        ..f(0, DiffKind::ExtraInTarget, 8)
                    },
                    changed(5, copies(1, 2)),
                    changed(6, copies(1, 2)),
                ],
                "copy first: {copy_first}"
            );
            assert_eq!(out.duplicates, (1, 4));
        }
        // a repeated key that moved between ranges keeps the copies of both sides
        let mut c = Classifier::default();
        c.add_range(0, &[d(9, 90), d(9, 90)], &[]);
        c.add_range(1, &[], &[d(9, 91)]);
        assert_eq!(c.finish(100).findings, vec![changed(9, copies(2, 1))]);
        // the difference names the key and says how many rows each side holds
        let key = vec![KeyPart::Int(5)];
        let mut source: Revealed = HashMap::new();
        source.insert(5, (key.clone(), vec![]));
        let out = differences(
            &[changed(5, copies(1, 2))],
            &source,
            &HashMap::new(),
            &[col("id", false)],
            1,
            false,
        );
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].key.clone(), out[0].duplicates), (key, copies(1, 2)));
    }

    #[test]
    fn a_row_that_moved_between_ranges_is_one_changed_row_where_the_source_has_it() {
        let mut c = Classifier::default();
        c.add_range(0, &[d(5, 50), d(6, 60)], &[d(6, 60)]);
        c.add_range(1, &[], &[d(5, 51), d(8, 80)]);
        let out = c.finish(100);
        assert_eq!(
            out.findings,
            vec![f(0, DiffKind::Changed, 5), f(1, DiffKind::ExtraInTarget, 8)]
        );
        assert_eq!(
            out.counts,
            DiffCounts {
                missing_in_target: 0,
                extra_in_target: 1,
                changed: 1
            }
        );
    }

    #[test]
    fn a_key_looked_up_in_every_period_becomes_one_finding_by_all_its_rows() {
        // key 5: on the source in period 0, on the target in periods 1 and 2 (the
        // merge pairs one); key 8: on the target only, in periods 1 and 2; key 9:
        // extra in period 1 and held alike by both sides when looked up (in flight)
        let mut c = Classifier::default();
        c.add_range(0, &[d(5, 50)], &[]);
        c.add_range(1, &[], &[d(5, 51), d(8, 80), d(9, 90)]);
        c.add_range(2, &[], &[d(5, 52), d(8, 81)]);
        let mut out = c.finish(100);
        assert_eq!(keys_to_look_up(&out.findings, |_| true), vec![5, 8, 9]);
        reclassify(&mut out, 5, 3, &[d(5, 50), d(7, 70)], &[d(5, 51), d(5, 52)]);
        reclassify(&mut out, 8, 4, &[], &[d(8, 80), d(8, 81)]);
        reclassify(&mut out, 9, 5, &[d(9, 90)], &[d(9, 90)]);
        let copies = |s, t| KeyCopies::of(s, t);
        assert_eq!(
            out.findings,
            vec![
                Finding {
                    copies: copies(1, 2),
                    ..f(3, DiffKind::Changed, 5)
                },
                Finding {
                    copies: copies(0, 2),
                    ..f(4, DiffKind::ExtraInTarget, 8)
                },
                f(1, DiffKind::ExtraInTarget, 9),
            ]
        );
        assert_eq!(
            out.counts,
            DiffCounts {
                missing_in_target: 0,
                extra_in_target: 2,
                changed: 1
            }
        );
        assert_eq!(out.duplicates, (0, 2));
    }

    #[test]
    fn findings_beyond_the_sample_limit_are_cut_after_merging_and_counted_in_full() {
        let mut c = Classifier::default();
        c.add_range(0, &[d(1, 1), d(2, 2), d(3, 3)], &[]);
        c.add_range(1, &[], &[d(9, 9)]);
        let out = c.finish(2);
        assert!(out.truncated);
        assert_eq!(out.findings.len(), 2);
        assert_eq!(out.counts.missing_in_target + out.counts.extra_in_target, 4);
        assert!(!Classifier::default().finish(0).truncated);
    }

    #[test]
    fn the_reveal_plan_asks_each_side_only_for_its_rows() {
        let findings = [
            f(0, DiffKind::MissingInTarget, 1),
            f(0, DiffKind::ExtraInTarget, 4),
            f(0, DiffKind::Changed, 2),
            f(2, DiffKind::ExtraInTarget, 9),
        ];
        let plan = reveal_plan(&findings, 3, false);
        assert_eq!(plan.len(), 2, "range 1 holds nothing: no reveal");
        assert_eq!(plan[0].findings, vec![0, 1, 2]);
        assert_eq!(plan[0].from_source, vec![1, 2]);
        assert_eq!(plan[0].from_target, vec![4]);
        assert_eq!((plan[1].leaf, plan[1].from_source.len()), (2, 0));
        // detailed: a changed row's values come from both sides
        let plan = reveal_plan(&findings, 3, true);
        assert_eq!(plan[0].from_target, vec![4, 2]);
    }

    #[test]
    fn a_range_with_more_findings_than_one_reveal_call_releases_is_revealed_in_pages() {
        let n = MAX_REVEAL_ROWS_PER_CALL * 2 + 500;
        let findings: Vec<Finding> = (0..n as u64)
            .map(|k| f(1, DiffKind::Changed, k))
            .chain([f(2, DiffKind::MissingInTarget, 1 << 40)])
            .collect();
        let plan = reveal_plan(&findings, 3, true);
        let pages: Vec<(usize, u32, usize, usize)> = plan
            .iter()
            .map(|w| (w.leaf, w.page, w.from_source.len(), w.from_target.len()))
            .collect();
        let full = MAX_REVEAL_ROWS_PER_CALL;
        assert_eq!(
            pages,
            vec![
                (1, 0, full, full),
                (1, 1, full, full),
                (1, 2, 500, 500),
                (2, 0, 1, 0)
            ]
        );
        // every finding is in exactly one page, in order
        let all: Vec<usize> = plan.iter().flat_map(|w| w.findings.clone()).collect();
        assert_eq!(all, (0..=n).collect::<Vec<_>>());
    }

    fn col(name: &str, masked: bool) -> ResolvedColumn {
        ResolvedColumn {
            source_name: name.into(),
            target_name: name.into(),
            format: FieldFormat::new(TypeClass::Text),
            masked,
        }
    }

    #[test]
    fn differences_name_differing_columns_and_never_masked_values() {
        let cols = [col("id", false), col("name", false), col("salary", true)];
        let key = |i: i64| vec![KeyPart::Int(i)];
        let v = |s: &[Option<&str>]| s.iter().map(|x| x.map(str::to_string)).collect::<Vec<_>>();
        let mut source: Revealed = HashMap::new();
        let mut target: Revealed = HashMap::new();
        source.insert(2, (key(2), v(&[Some("2"), Some("ann"), Some("100")])));
        target.insert(2, (key(2), v(&[Some("2"), Some("anne"), Some("200")])));
        source.insert(3, (key(3), v(&[Some("3"), Some("bo"), Some("1")])));
        target.insert(3, (key(3), v(&[Some("3"), Some("bo"), Some("2")])));
        target.insert(4, (key(4), vec![]));
        let findings = [
            f(0, DiffKind::Changed, 2),
            f(0, DiffKind::Changed, 3),
            f(0, DiffKind::ExtraInTarget, 4),
            // not revealed (a budget ran out): left out
            f(0, DiffKind::MissingInTarget, 5),
        ];
        let out = differences(&findings, &source, &target, &cols, 1, true);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].columns.as_deref(), Some(&["name".to_string()][..]));
        let values = out[0].values.as_ref().unwrap();
        assert_eq!(values["name"].target.as_deref(), Some("anne"));
        assert!(!values.contains_key("salary"), "a masked value was revealed");
        assert_eq!(
            out[1].columns.as_deref(),
            Some(&["(masked column)".to_string()][..])
        );
        assert!(out[1].values.as_ref().unwrap().is_empty());
        assert_eq!(
            (out[2].kind, out[2].key.clone()),
            (DiffKind::ExtraInTarget, key(4))
        );
        assert!(out[2].columns.is_none());
        // with_keys: keys only
        let out = differences(&findings, &source, &target, &cols, 1, false);
        assert!(out.iter().all(|d| d.columns.is_none() && d.values.is_none()));
    }
}
