//! The bisection planner: pure, no I/O. It proposes the next level's requests,
//! takes both sides' buckets, and decides which segments match, which descend and
//! which become leaves. The coordinator's runtime does the calls.
//!
//! A level costs one aggregate per side whatever the factor: every differing parent
//! of the level travels in the same request. The first level doubles as the quick
//! check: its buckets partition the whole dataset, so identical data ends there.
//!
//! The drill fails closed (DESIGN §5 step 3): on each side, the children of a parent
//! must add up to the parent (count, SUM mod 2^64, XOR where present), and a parent
//! that differed must have a differing child. Otherwise rows changed between levels
//! or a predicate lost them, and the parent itself becomes a leaf flagged
//! inconsistent; its children are not used, so nothing is silently forgotten.

use std::collections::BTreeMap;

use tally_common::checksum::AnyAggregate;
use tally_common::period::Granularity;
use tally_common::segment::{KeyTuple, Segment, Split};

use crate::spec::Strategy;

/// More than this share of a level's segments differing stops the drill: the data
/// differs nearly everywhere and further levels cannot narrow it down. Level 1 is
/// exempt: a few scattered differences can touch most of its few, large segments, and
/// only the next level tells the two cases apart.
const EARLY_STOP_SHARE: f64 = 0.5;
/// …and only once a level has at least this many differing segments.
const EARLY_STOP_MIN: usize = 16;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PlanParams {
    pub strategy: Strategy,
    pub factor: u32,
    pub threshold: u64,
    pub depth: u32,
    /// Compare counts only (mode `count`).
    pub counts_only: bool,
    pub max_leaves: Option<u64>,
    /// Strategy time: the column and granularity of level 1.
    pub time: Option<(String, Granularity)>,
    /// A single integer key's smallest and largest value on either side: key ranges
    /// are then cut evenly by the coordinator, and both sides are asked at once.
    pub int_range: Option<(i64, i64)>,
    /// The key's histogram bounds from the engines' statistics (both sides, ascending):
    /// level 1 cuts by them where they show the keys clustered.
    #[serde(default)]
    pub key_histogram: Vec<i64>,
    /// The factor of level 1, at least `factor`: chosen from the row estimate so that
    /// level-1 segments are already below the threshold where possible, and small
    /// differences go straight to leaves after one scan.
    pub first_factor: u32,
    /// The run's window: level 1's segment carries it, and every child inherits it.
    pub window: Option<tally_common::segment::Window>,
}

/// Level-1 segments aim at this fraction of the threshold: a scan costs the same
/// whatever the number of buckets, and small leaves keep the rows phase of a few
/// scattered differences small (adjacent differing leaves are read together, up to the
/// threshold: [`rows_batches`]).
pub const FIRST_LEVEL_FRACTION: u64 = 16;

/// The level-1 factor for a table of `rows` rows: enough segments to bring each to
/// `threshold / 16` rows, a power of two, between `factor` and 1024.
pub fn first_level_factor(rows: u64, threshold: u64, factor: u32) -> u32 {
    let target = (threshold / FIRST_LEVEL_FRACTION).max(1);
    let needed = rows.div_ceil(target).max(1).next_power_of_two();
    needed.clamp(u64::from(factor), 1024) as u32
}

/// The segments the rows phase reads: the leaves, with runs of adjacent key-range
/// leaves, and runs of adjacent hash leaves (contiguous hash ranges of the same key
/// range), merged while their rows stay within `budget`: one read instead of many
/// small ones when differences are dense. A hash range is read by scanning its whole
/// key range whatever its width, so a degenerate drill (every bucket differs) reads a
/// few wide ranges instead of one scan per leaf. Each batch lists the leaves it covers.
pub fn rows_batches(leaves: &[Leaf], budget: u64) -> Vec<(Segment, Vec<usize>)> {
    let rows = |l: &Leaf| l.source.count().max(l.target.count());
    let plain = |s: &Segment| s.hash.is_none() && s.period.is_none();
    // hash leaves in hash order (a deeper level's leaves come after level 1's, and
    // would split its contiguous runs); key-range leaves keep theirs
    let mut order: Vec<usize> = (0..leaves.len()).collect();
    order.sort_by_key(|&i| leaves[i].segment.hash.map(|(lo, _)| lo));
    let mut out: Vec<(Segment, Vec<usize>, u64)> = Vec::new();
    for i in order {
        let leaf = &leaves[i];
        let n = rows(leaf);
        if let Some((seg, members, total)) = out.last_mut() {
            if plain(seg)
                && plain(&leaf.segment)
                && seg.upper.is_some()
                && seg.upper == leaf.segment.lower
                && *total + n <= budget
            {
                seg.upper = leaf.segment.upper.clone();
                members.push(i);
                *total += n;
                continue;
            }
            if let (Some((lo, hi)), Some((next_lo, next_hi))) = (seg.hash, leaf.segment.hash)
                && hi == next_lo
                && seg.scans_like(&leaf.segment)
                && *total + n <= budget
            {
                seg.hash = Some((lo, next_hi));
                members.push(i);
                *total += n;
                continue;
            }
        }
        out.push((leaf.segment.clone(), vec![i], n));
    }
    out.into_iter().map(|(s, m, _)| (s, m)).collect()
}

/// One child bucket as an agent returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketResult {
    pub parent: usize,
    pub child: usize,
    pub segment: Segment,
    pub agg: AnyAggregate,
}

/// What to ask at one level.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LevelPlan {
    pub level: u32,
    pub parents: Vec<Segment>,
    /// The kind of split of this level.
    pub split: Split,
    /// Per parent, the split the source is asked for (the target too, unless
    /// `target_follows_source`).
    pub splits: Vec<Split>,
    /// Quantile levels: the target is asked for the source's cut points, after the source answered.
    pub target_follows_source: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leaf {
    pub level: u32,
    pub segment: Segment,
    pub source: AnyAggregate,
    pub target: AnyAggregate,
    /// Why the drill could not go on below this segment although it differed: its
    /// children did not add up to it on a side, or none of them differed. `None` for a
    /// leaf where the drill stopped normally.
    pub inconsistent: Option<String>,
}

/// A differing segment waiting for the next level, with both sides' aggregates from
/// the level that produced it (absent for level 1's parent, the whole dataset).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Parent {
    level: u32,
    segment: Segment,
    aggs: Option<(AnyAggregate, AnyAggregate)>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LevelStats {
    pub level: u32,
    pub segments: usize,
    pub differing: usize,
    /// Rows covered by this level, source side.
    pub source_rows: u64,
    pub target_rows: u64,
    /// Parents of this level whose children did not account for them (each became an
    /// inconsistent leaf).
    pub inconsistent: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Stop {
    /// Most segments of a level differ.
    MostSegmentsDiffer {
        level: u32,
        differing: usize,
        segments: usize,
    },
    /// More leaves than `gates.max_leaves`.
    MaxLeaves { leaves: u64, limit: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{side} answered parent {parent} with {got} buckets, expected {expected}")]
    BucketCount {
        side: &'static str,
        parent: usize,
        got: usize,
        expected: usize,
    },
    #[error("source and target disagree on the bounds of bucket {child} of parent {parent}")]
    BoundsMismatch { parent: usize, child: usize },
    #[error("{side} answered parent {parent} with period {label:?} twice")]
    DuplicatePeriod {
        side: &'static str,
        parent: usize,
        label: String,
    },
    /// An answer that does not fit its request: buckets for a parent not asked, a
    /// parent without buckets, children missing, repeated or with other bounds than
    /// the split asked for. Nothing of such a level is used (fail closed: a level
    /// answered with no buckets at all would otherwise compare nothing and match).
    #[error("{side}'s answer does not fit the request: {what}")]
    Answer { side: &'static str, what: String },
    #[error(transparent)]
    Method(#[from] tally_common::checksum::MethodMismatch),
}

/// Checks one side's buckets against the splits it was asked for: every bucket names
/// an asked parent; each parent's children are numbered 0..n once each; their bounds
/// are exactly the split's children (hash parts, cut ranges, the parent itself; for a
/// quantile split, ranges that tile the parent without gap or overlap; for a period
/// split, the parent in one period of the asked column and granularity).
fn check_answer(
    side: &'static str,
    parents: &[Segment],
    splits: &[Split],
    buckets: &[BucketResult],
) -> Result<(), PlanError> {
    let bad = |what: String| PlanError::Answer { side, what };
    if let Some(b) = buckets.iter().find(|b| b.parent >= parents.len()) {
        return Err(bad(format!(
            "a bucket names parent {} of {} asked",
            b.parent,
            parents.len()
        )));
    }
    for (p, (parent, split)) in parents.iter().zip(splits).enumerate() {
        let mut children: Vec<&BucketResult> = buckets.iter().filter(|b| b.parent == p).collect();
        children.sort_by_key(|b| b.child);
        if children.iter().enumerate().any(|(i, b)| b.child != i) {
            return Err(bad(format!(
                "parent {p}'s children are not numbered 0..{} once each",
                children.len()
            )));
        }
        let got: Vec<Segment> = children.iter().map(|b| b.segment.clone()).collect();
        let expected = match split {
            Split::Whole => vec![parent.clone()],
            Split::Hash(n) => parent.hash_children(*n),
            Split::Cuts(cuts) => parent.cut_children(cuts),
            Split::Even(e) => parent.cut_children(&e.cuts()),
            Split::Quantile(n) => {
                if got.is_empty() || got.len() > *n as usize {
                    return Err(bad(format!(
                        "parent {p} was answered with {} children, a quantile split asks for 1 to {n}",
                        got.len()
                    )));
                }
                let cuts: Vec<KeyTuple> = got[1..].iter().filter_map(|s| s.lower.clone()).collect();
                parent.cut_children(&cuts)
            }
            Split::Period { column, granularity } => {
                let in_period = |s: &Segment| {
                    s.period
                        .as_ref()
                        .is_some_and(|x| &x.column == column && x.granularity == *granularity)
                        && Segment {
                            period: None,
                            ..s.clone()
                        } == Segment {
                            period: None,
                            ..parent.clone()
                        }
                };
                if let Some(i) = got.iter().position(|s| !in_period(s)) {
                    return Err(bad(format!(
                        "child {i} of parent {p} is not the parent in one {} period of {column}",
                        granularity.name()
                    )));
                }
                continue;
            }
        };
        if got.len() != expected.len() {
            return Err(bad(format!(
                "parent {p} was answered with {} children, the split asked for {}",
                got.len(),
                expected.len()
            )));
        }
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            return Err(bad(format!(
                "child {i} of parent {p} covers {}, the split asked for {}",
                got[i].describe(),
                expected[i].describe()
            )));
        }
    }
    Ok(())
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Planner {
    params: PlanParams,
    level: u32,
    pending: Vec<Parent>,
    pub leaves: Vec<Leaf>,
    pub levels: Vec<LevelStats>,
    pub stop: Option<Stop>,
    /// Total rows per side, known after level 1.
    pub totals: Option<(u64, u64)>,
    /// Level 1's even cuts left most of the key range empty: the keys are clustered
    /// (islands, a deleted range, sharded id spaces), so even cuts of a parent would
    /// put its rows in a few children again. Deeper levels then cut by quantiles of
    /// the source's keys, each parent into as many children as its rows need.
    #[serde(default)]
    pub gapped: bool,
}

/// Level 1 counts as gapped when at least this many even segments were cut and at
/// most a quarter of them hold a row.
const GAPPED_MIN_SEGMENTS: usize = 16;

impl Planner {
    pub fn new(params: PlanParams) -> Planner {
        let window = params.window.clone();
        Planner {
            params,
            level: 0,
            pending: vec![Parent {
                level: 0,
                segment: Segment {
                    window,
                    ..Segment::whole()
                },
                aggs: None,
            }],
            leaves: Vec::new(),
            levels: Vec::new(),
            stop: None,
            totals: None,
            gapped: false,
        }
    }

    /// The next level to run, or `None` when the drill is over.
    pub fn next_level(&self) -> Option<LevelPlan> {
        if self.pending.is_empty() || self.stop.is_some() {
            return None;
        }
        let f = if self.level == 0 {
            self.params.first_factor.max(self.params.factor)
        } else {
            self.params.factor
        };
        let (split, follows) = match (self.params.strategy, &self.params.time) {
            (Strategy::Hash, _) => (Split::Hash(f), false),
            // level 1 of the time strategy: calendar periods, both sides at once
            (Strategy::Time, Some((column, granularity))) if self.level == 0 => (
                Split::Period {
                    column: column.clone(),
                    granularity: *granularity,
                },
                false,
            ),
            _ => (Split::Quantile(f), true),
        };
        let mut splits: Vec<Split> = self.pending.iter().map(|_| split.clone()).collect();
        let mut follows = follows;
        if self.gapped && self.level >= 1 && matches!(split, Split::Quantile(_)) {
            // clustered keys: cuts that follow the data, sized by each parent's rows
            // so its children land near level 1's size in one level
            let target = (self.params.threshold / FIRST_LEVEL_FRACTION).max(1);
            let splits = self
                .pending
                .iter()
                .map(|p| {
                    let rows = p.aggs.map_or(0, |(s, t)| s.count().max(t.count()));
                    let n = rows.div_ceil(target).max(1).next_power_of_two();
                    Split::Quantile(n.clamp(u64::from(f), 1024) as u32)
                })
                .collect();
            return Some(LevelPlan {
                level: self.level + 1,
                parents: self.pending.iter().map(|p| p.segment.clone()).collect(),
                split,
                splits,
                target_follows_source: true,
            });
        }
        // clustered keys whose statistics show where the rows are: level 1 cuts by them,
        // both sides at once
        if let (0, Split::Quantile(_), Some(range)) = (self.level, &split, self.params.int_range)
            && let Some(cuts) = histogram_cuts(&self.params.key_histogram, range, f)
        {
            return Some(LevelPlan {
                level: 1,
                parents: self.pending.iter().map(|p| p.segment.clone()).collect(),
                split,
                splits: self.pending.iter().map(|_| cuts.clone()).collect(),
                target_follows_source: false,
            });
        }
        // a single integer key with a known range: even cuts, no need to wait for the source
        if let (Split::Quantile(_), Some(range)) = (&split, self.params.int_range) {
            let even: Option<Vec<Split>> = self
                .pending
                .iter()
                .map(|p| even_cuts(&p.segment, range, f))
                .collect();
            if let Some(even) = even {
                splits = even;
                follows = false;
            }
        }
        Some(LevelPlan {
            level: self.level + 1,
            parents: self.pending.iter().map(|p| p.segment.clone()).collect(),
            split,
            splits,
            target_follows_source: follows,
        })
    }

    /// For a quantile level: the target's splits, from the cut points the source chose.
    pub fn target_splits(plan: &LevelPlan, source: &[BucketResult]) -> Vec<Split> {
        (0..plan.parents.len())
            .map(|p| {
                let mut children: Vec<&BucketResult> = source.iter().filter(|b| b.parent == p).collect();
                children.sort_by_key(|b| b.child);
                let cuts: Vec<KeyTuple> = children
                    .iter()
                    .skip(1)
                    .filter_map(|b| b.segment.lower.clone())
                    .collect();
                Split::Cuts(cuts)
            })
            .collect()
    }

    fn differs(&self, a: &AnyAggregate, b: &AnyAggregate) -> Result<bool, PlanError> {
        if self.params.counts_only {
            return Ok(a.count() != b.count());
        }
        Ok(!a.matches(b)?)
    }

    fn can_split(&self, seg: &Segment, source: &AnyAggregate, target: &AnyAggregate) -> bool {
        match self.params.strategy {
            // even cuts need more than one key value in the range
            Strategy::Quantile | Strategy::Auto | Strategy::Time if self.params.int_range.is_some() => {
                source.count().max(target.count()) >= 2
                    && self
                        .params
                        .int_range
                        .is_some_and(|r| even_cuts(seg, r, 2).is_some())
            }
            // the source picks the cut points, so it needs rows to cut between
            Strategy::Quantile | Strategy::Auto | Strategy::Time => source.count() >= 2,
            Strategy::Hash => {
                seg.hash.is_none_or(|(lo, hi)| hi.saturating_sub(lo) > 1)
                    && source.count().max(target.count()) >= 2
            }
        }
    }

    /// Takes both sides' answers to `plan`; returns the level's statistics.
    pub fn observe(
        &mut self,
        plan: &LevelPlan,
        source: &[BucketResult],
        target: &[BucketResult],
    ) -> Result<LevelStats, PlanError> {
        check_answer("source", &plan.parents, &plan.splits, source)?;
        let target_splits = if plan.target_follows_source {
            Self::target_splits(plan, source)
        } else {
            plan.splits.clone()
        };
        check_answer("target", &plan.parents, &target_splits, target)?;
        let mut next = Vec::new();
        let mut new_leaves = Vec::new();
        let mut segments = 0;
        let mut differing = Vec::new();
        let mut differing_total = 0;
        let (mut src_rows, mut tgt_rows) = (0, 0);
        let pairs = Self::pair(plan, source, target)?;
        // per parent: whether any child differs
        let mut child_differs = vec![false; plan.parents.len()];
        for (a, b) in &pairs {
            segments += 1;
            src_rows += a.agg.count();
            tgt_rows += b.agg.count();
            if self.differs(&a.agg, &b.agg)? {
                differing_total += 1;
                if let Some(d) = child_differs.get_mut(a.parent) {
                    *d = true;
                }
                differing.push((a.parent, a.segment.clone(), a.agg, b.agg));
            }
        }
        // fail closed: a parent its children do not account for becomes a leaf itself
        let mut inconsistent = vec![false; plan.parents.len()];
        for (p, parent) in self.pending.iter().enumerate().take(plan.parents.len()) {
            let Some((ps, pt)) = &parent.aggs else { continue };
            let mut reasons = Vec::new();
            for (side, parent_agg, buckets) in [("source", ps, source), ("target", pt, target)] {
                let children: Vec<&BucketResult> = buckets.iter().filter(|b| b.parent == p).collect();
                reasons.extend(unaccounted(side, parent_agg, &children)?);
            }
            if !child_differs[p] {
                reasons.push("no child differs although the parent did".to_string());
            }
            if !reasons.is_empty() {
                inconsistent[p] = true;
                new_leaves.push(Leaf {
                    level: parent.level,
                    segment: parent.segment.clone(),
                    source: *ps,
                    target: *pt,
                    inconsistent: Some(reasons.join("; ")),
                });
            }
        }
        let differing: Vec<(Segment, AnyAggregate, AnyAggregate)> = differing
            .into_iter()
            .filter(|(p, ..)| !inconsistent.get(*p).copied().unwrap_or(false))
            .map(|(_, seg, a, b)| (seg, a, b))
            .collect();
        let stats = LevelStats {
            level: plan.level,
            segments,
            differing: differing_total,
            source_rows: src_rows,
            target_rows: tgt_rows,
            inconsistent: new_leaves.len(),
        };
        if plan.level == 1 {
            self.totals = Some((src_rows, tgt_rows));
            // even cuts that found the rows in a quarter of the key range or less
            let even = !plan.target_follows_source && self.params.int_range.is_some();
            let holding = pairs
                .iter()
                .filter(|(a, b)| a.agg.count().max(b.agg.count()) > 0)
                .count();
            self.gapped = even
                && matches!(plan.split, Split::Quantile(_))
                && segments >= GAPPED_MIN_SEGMENTS
                && holding * 4 <= segments;
        }
        let degenerate = plan.level >= 2
            && stats.differing >= EARLY_STOP_MIN
            && stats.differing as f64 > segments as f64 * EARLY_STOP_SHARE;
        for (seg, a, b) in differing {
            let big = a.count().max(b.count()) >= self.params.threshold;
            if !degenerate && big && plan.level < self.params.depth && self.can_split(&seg, &a, &b) {
                next.push(Leaf {
                    level: plan.level,
                    segment: seg,
                    source: a,
                    target: b,
                    inconsistent: None,
                });
            } else {
                new_leaves.push(Leaf {
                    level: plan.level,
                    segment: seg,
                    source: a,
                    target: b,
                    inconsistent: None,
                });
            }
        }
        if degenerate {
            self.stop = Some(Stop::MostSegmentsDiffer {
                level: plan.level,
                differing: stats.differing,
                segments,
            });
        }
        self.leaves.extend(new_leaves);
        self.level = plan.level;
        self.levels.push(stats.clone());
        if let Some(limit) = self.params.max_leaves {
            let n = (self.leaves.len() + next.len()) as u64;
            if n > limit && self.stop.is_none() {
                self.stop = Some(Stop::MaxLeaves { leaves: n, limit });
            }
        }
        if self.stop.is_some() {
            // what would have descended is reported as it stands, unsplit
            self.leaves.extend(next);
            self.pending = Vec::new();
        } else {
            self.pending = next
                .into_iter()
                .map(|l| Parent {
                    level: l.level,
                    segment: l.segment,
                    aggs: Some((l.source, l.target)),
                })
                .collect();
        }
        Ok(stats)
    }

    /// Pairs both sides' buckets. Key and hash splits give both sides the same
    /// children, in order; period splits give each side the periods it has, so
    /// they are matched by label and a period on one side only meets an empty one.
    fn pair(
        plan: &LevelPlan,
        source: &[BucketResult],
        target: &[BucketResult],
    ) -> Result<Vec<(BucketResult, BucketResult)>, PlanError> {
        let mut out = Vec::new();
        for p in 0..plan.parents.len() {
            let mut s: Vec<&BucketResult> = source.iter().filter(|b| b.parent == p).collect();
            let mut t: Vec<&BucketResult> = target.iter().filter(|b| b.parent == p).collect();
            s.sort_by_key(|b| b.child);
            t.sort_by_key(|b| b.child);
            if matches!(plan.split, Split::Period { .. }) {
                let label = |b: &BucketResult| {
                    b.segment
                        .period
                        .as_ref()
                        .map(|x| x.label.clone())
                        .unwrap_or_default()
                };
                let mut by_label: BTreeMap<String, (Option<&BucketResult>, Option<&BucketResult>)> =
                    BTreeMap::new();
                // a period answered twice would otherwise hide one of its buckets
                for b in &s {
                    let slot = &mut by_label.entry(label(b)).or_default().0;
                    if slot.replace(b).is_some() {
                        return Err(PlanError::DuplicatePeriod {
                            side: "source",
                            parent: p,
                            label: label(b),
                        });
                    }
                }
                for b in &t {
                    let slot = &mut by_label.entry(label(b)).or_default().1;
                    if slot.replace(b).is_some() {
                        return Err(PlanError::DuplicatePeriod {
                            side: "target",
                            parent: p,
                            label: label(b),
                        });
                    }
                }
                let empty = |other: &BucketResult| BucketResult {
                    agg: AnyAggregate::new(other.agg.method(), 0, 0, other.agg.xor().map(|_| 0)),
                    ..other.clone()
                };
                for (_, (a, b)) in by_label {
                    match (a, b) {
                        (Some(a), Some(b)) => out.push(((*a).clone(), (*b).clone())),
                        (Some(a), None) => out.push(((*a).clone(), empty(a))),
                        (None, Some(b)) => out.push((empty(b), (*b).clone())),
                        (None, None) => {}
                    }
                }
                continue;
            }
            if s.len() != t.len() {
                return Err(PlanError::BucketCount {
                    side: "target",
                    parent: p,
                    got: t.len(),
                    expected: s.len(),
                });
            }
            for (a, b) in s.into_iter().zip(t) {
                if a.segment != b.segment {
                    return Err(PlanError::BoundsMismatch {
                        parent: p,
                        child: a.child,
                    });
                }
                out.push((a.clone(), b.clone()));
            }
        }
        Ok(out)
    }
}

/// Why one side's children do not add up to their parent: count, SUM (mod 2^64) and,
/// where the parent and every child carry it, XOR. Empty when they do.
fn unaccounted(
    side: &str,
    parent: &AnyAggregate,
    children: &[&BucketResult],
) -> Result<Vec<String>, PlanError> {
    let mut total = AnyAggregate::empty(parent.method(), parent.xor().is_some());
    for c in children {
        total = total.merge(c.agg)?;
    }
    let mut out = Vec::new();
    if total.count() != parent.count() {
        out.push(format!(
            "{side} children add up to {} rows, the parent had {}",
            total.count(),
            parent.count()
        ));
    }
    if total.sum() != parent.sum() {
        out.push(format!(
            "{side} children's checksums add up to {:016x}, the parent's was {:016x}",
            total.sum(),
            parent.sum()
        ));
    }
    if let (Some(x), Some(px)) = (total.xor(), parent.xor())
        && x != px
    {
        out.push(format!(
            "{side} children's XOR is {x:016x}, the parent's was {px:016x}"
        ));
    }
    Ok(out)
}

/// Level-1 cuts from an equi-depth histogram of the key (`bounds`, ascending), where
/// it shows the keys clustered: one histogram bucket (a share of the rows) spans at
/// least half of `[min, max]`, so even cuts would leave most segments empty. Each
/// bucket is cut evenly into `factor / buckets` pieces (at least one): segments follow
/// the rows. `None` where the keys are not clustered or the histogram is too small.
pub fn histogram_cuts(bounds: &[i64], (min, max): (i64, i64), factor: u32) -> Option<Split> {
    use tally_common::segment::KeyPart;
    let span = i128::from(max) - i128::from(min);
    let widest = bounds
        .windows(2)
        .map(|w| i128::from(w[1]) - i128::from(w[0]))
        .max()?;
    if bounds.len() < 5 || span <= 0 || widest * 2 < span {
        return None;
    }
    let buckets = (bounds.len() - 1) as u64;
    let pieces = (u64::from(factor) / buckets).max(1) as i128;
    let mut cuts: Vec<i64> = Vec::new();
    for w in bounds.windows(2) {
        let (lo, hi) = (i128::from(w[0]), i128::from(w[1]));
        for i in 0..pieces {
            let c = lo + (hi - lo) * i / pieces;
            if c > i128::from(min) && c <= i128::from(max) && cuts.last().is_none_or(|l| i128::from(*l) < c) {
                cuts.push(c as i64);
            }
        }
    }
    // the last bound is a key: cut after it too, so it does not share the open tail
    if let Some(&last) = bounds.last()
        && last < max
        && cuts.last().is_none_or(|l| *l < last)
    {
        cuts.push(last);
    }
    (!cuts.is_empty()).then(|| Split::Cuts(cuts.into_iter().map(|c| vec![KeyPart::Int(c)]).collect()))
}

/// Up to `factor` even parts of a segment's integer key range: its own bounds, or the
/// key's smallest and largest value where it is open. `None` when it cannot be cut.
fn even_cuts(seg: &Segment, (min, max): (i64, i64), factor: u32) -> Option<Split> {
    use tally_common::segment::{EvenCuts, KeyPart};
    let int = |t: &Option<KeyTuple>| match t.as_deref() {
        None => Some(None),
        Some([KeyPart::Int(i)]) => Some(Some(*i)),
        _ => None,
    };
    let lo = int(&seg.lower)?.unwrap_or(min);
    let hi = int(&seg.upper)?.unwrap_or(max.checked_add(1)?);
    let span = hi.checked_sub(lo)?;
    if span < 2 {
        return None;
    }
    let width = (span as u64).div_ceil(u64::from(factor.max(2))) as i64;
    let count = (1..i64::from(factor))
        .map_while(|i| lo.checked_add(i.checked_mul(width)?))
        .take_while(|c| *c < hi)
        .count();
    // said as even, so the agent buckets by one division without looking at the list
    EvenCuts::new(lo.checked_add(width)?, width, u32::try_from(count).ok()?).map(Split::Even)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::checksum::HashMethod;
    use tally_common::segment::KeyPart;

    fn params(strategy: Strategy) -> PlanParams {
        PlanParams {
            strategy,
            factor: 4,
            threshold: 10,
            depth: 8,
            counts_only: false,
            max_leaves: None,
            time: None,
            int_range: None,
            key_histogram: Vec::new(),
            first_factor: 4,
            window: None,
        }
    }

    fn agg(count: u64, sum: u64) -> AnyAggregate {
        AnyAggregate::new(HashMethod::Sha256_64, count, sum, Some(sum))
    }

    /// The fake's "time" of key k: its hundred.
    fn fake_label(k: i64) -> String {
        format!("{:04}", k / 100)
    }

    fn in_seg(seg: &Segment, k: i64) -> bool {
        seg.contains(&vec![KeyPart::Int(k)], (k as u64) % 64)
            && seg.period.as_ref().is_none_or(|p| p.label == fake_label(k))
    }

    /// A fake dataset of integer keys 0..n with a per-key checksum: answers a level
    /// the way an agent would (quantile cuts on the source, cuts or hash on the target).
    struct Fake {
        rows: Vec<(i64, u64)>,
    }

    impl Fake {
        fn answer(&self, parents: &[Segment], splits: &[Split]) -> Vec<BucketResult> {
            let mut out = Vec::new();
            for (p, (seg, split)) in parents.iter().zip(splits).enumerate() {
                let rows: Vec<&(i64, u64)> = self.rows.iter().filter(|(k, _)| in_seg(seg, *k)).collect();
                let children = match split {
                    Split::Quantile(n) => {
                        let chunk = (rows.len() as u64).div_ceil(u64::from(*n)).max(1) as usize;
                        let cuts: Vec<KeyTuple> = rows
                            .iter()
                            .step_by(chunk)
                            .skip(1)
                            .map(|(k, _)| vec![KeyPart::Int(*k)])
                            .collect();
                        seg.cut_children(&cuts)
                    }
                    Split::Cuts(c) => seg.cut_children(c),
                    Split::Even(e) => seg.cut_children(&e.cuts()),
                    Split::Hash(n) => seg.hash_children(*n),
                    Split::Whole => vec![seg.clone()],
                    Split::Period { column, granularity } => {
                        let labels: std::collections::BTreeSet<String> =
                            rows.iter().map(|(k, _)| fake_label(*k)).collect();
                        labels
                            .into_iter()
                            .map(|label| Segment {
                                period: Some(tally_common::segment::Period {
                                    column: column.clone(),
                                    granularity: *granularity,
                                    label,
                                }),
                                ..seg.clone()
                            })
                            .collect()
                    }
                };
                for (c, child) in children.into_iter().enumerate() {
                    let mut a = AnyAggregate::empty(HashMethod::Sha256_64, true);
                    for (k, h) in &rows {
                        if in_seg(&child, *k) {
                            a.add_checksum(*h);
                        }
                    }
                    out.push(BucketResult {
                        parent: p,
                        child: c,
                        segment: child,
                        agg: a,
                    });
                }
            }
            out
        }
    }

    /// Anything that answers a level like an agent.
    trait Answers {
        fn answer(&self, parents: &[Segment], splits: &[Split]) -> Vec<BucketResult>;
    }

    impl Answers for Fake {
        fn answer(&self, parents: &[Segment], splits: &[Split]) -> Vec<BucketResult> {
            Fake::answer(self, parents, splits)
        }
    }

    /// A dataset that answers level 1 from `first` and every later level from `later`:
    /// rows that changed between levels, or a child predicate that loses rows.
    struct Shifting {
        first: Fake,
        later: Fake,
    }

    impl Answers for Shifting {
        fn answer(&self, parents: &[Segment], splits: &[Split]) -> Vec<BucketResult> {
            if parents.iter().all(|p| *p == Segment::whole()) {
                self.first.answer(parents, splits)
            } else {
                self.later.answer(parents, splits)
            }
        }
    }

    fn run(p: PlanParams, src: &impl Answers, tgt: &impl Answers) -> (Planner, usize) {
        run_with(p, src, tgt, |_| {})
    }

    /// [`run`], with `after` given the planner after every level.
    fn run_with(
        p: PlanParams,
        src: &impl Answers,
        tgt: &impl Answers,
        mut after: impl FnMut(&mut Planner),
    ) -> (Planner, usize) {
        let mut planner = Planner::new(p);
        let mut queries = 0;
        while let Some(plan) = planner.next_level() {
            let s = src.answer(&plan.parents, &plan.splits);
            let tsplits = if plan.target_follows_source {
                Planner::target_splits(&plan, &s)
            } else {
                plan.splits.clone()
            };
            let t = tgt.answer(&plan.parents, &tsplits);
            planner.observe(&plan, &s, &t).unwrap();
            after(&mut planner);
            queries += 1;
        }
        (planner, queries)
    }

    fn data(n: i64) -> Vec<(i64, u64)> {
        (0..n)
            .map(|k| (k, (k as u64).wrapping_mul(0x9E3779B97F4A7C15)))
            .collect()
    }

    /// A planner serialised after every level (as the run log will hold it) and
    /// restored from the bytes drills on to exactly the leaves of an uninterrupted run.
    #[test]
    fn a_planner_restored_between_levels_reaches_the_same_leaves() {
        let src = Fake { rows: data(2000) };
        let mut t = data(2000);
        t[123].1 ^= 1;
        t.remove(1700);
        t.push((9000, 7));
        let tgt = Fake { rows: t };
        for strategy in [Strategy::Quantile, Strategy::Hash] {
            let (whole, _) = run(params(strategy), &src, &tgt);
            let (planner, restored) = run_with(params(strategy), &src, &tgt, |planner| {
                let bytes = serde_json::to_vec(&*planner).unwrap();
                *planner = serde_json::from_slice(&bytes).unwrap();
            });
            assert!(restored >= 2, "{strategy:?}: the drill went past level 1");
            assert_eq!(planner.leaves, whole.leaves, "{strategy:?}");
            assert_eq!(planner.levels, whole.levels, "{strategy:?}");
            assert!(!planner.leaves.is_empty());
        }
    }

    #[test]
    fn identical_data_ends_after_the_first_level() {
        let f = Fake { rows: data(1000) };
        let (p, q) = run(params(Strategy::Quantile), &f, &f);
        assert_eq!(q, 1);
        assert!(p.leaves.is_empty());
        assert_eq!(p.levels[0].segments, 4);
        assert_eq!(p.totals, Some((1000, 1000)));
    }

    #[test]
    fn quantile_drill_isolates_each_difference_in_a_small_leaf() {
        let src = Fake { rows: data(1000) };
        let mut t = data(1000);
        t[123].1 ^= 1; // changed
        t.remove(700); // missing in target
        t.push((5000, 7)); // extra in target, beyond the source's last key
        let tgt = Fake { rows: t };
        let (p, _) = run(params(Strategy::Quantile), &src, &tgt);
        let covers = |k: i64| {
            p.leaves
                .iter()
                .any(|l| l.segment.contains(&vec![KeyPart::Int(k)], 0))
        };
        assert!(covers(123) && covers(700) && covers(5000), "{:?}", p.leaves);
        assert!(
            p.leaves
                .iter()
                .all(|l| l.source.count().max(l.target.count()) < 10 || l.source.count() < 2)
        );
        assert!(!covers(400), "a matching range must not be a leaf");
        // one query per side per level
        assert_eq!(p.levels.len(), p.levels.last().unwrap().level as usize);
    }

    #[test]
    fn time_drill_compares_periods_then_quantiles_inside_the_differing_ones() {
        let src = Fake { rows: data(1000) };
        let mut t = data(1000);
        t[150].1 ^= 1; // period 0001
        t.push((1250, 9)); // a period the source does not have
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Time);
        pp.time = Some(("at".into(), Granularity::Day));
        let (p, _) = run(pp, &src, &tgt);
        assert_eq!(
            p.levels[0].segments, 11,
            "10 shared periods and one on the target only"
        );
        assert_eq!(p.levels[0].differing, 2);
        let covers = |k: i64| p.leaves.iter().any(|l| in_seg(&l.segment, k));
        assert!(covers(150) && covers(1250));
        assert!(p.leaves.iter().all(|l| l.segment.period.is_some()));
        // inside period 0001 the drill went on by quantiles
        assert!(
            p.leaves.iter().any(|l| l.segment.has_key_bounds()),
            "{:?}",
            p.leaves
        );
    }

    #[test]
    fn integer_key_ranges_are_cut_evenly_and_both_sides_asked_at_once() {
        let src = Fake { rows: data(5000) };
        let mut t = data(5000);
        t[1234].1 ^= 0xff;
        t.push((7000, 1)); // beyond the source's range
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Quantile);
        pp.int_range = Some((0, 7000));
        let mut planner = Planner::new(pp);
        let plan = planner.next_level().unwrap();
        assert!(!plan.target_follows_source);
        // said as an even split (first cut, width, count), so the agent need not guess
        assert!(
            matches!(&plan.splits[0], Split::Even(e) if e.count() == 3 && e.first() == 1751 && e.width() == 1751),
            "{:?}",
            plan.splits
        );
        let s = src.answer(&plan.parents, &plan.splits);
        let t2 = tgt.answer(&plan.parents, &plan.splits);
        planner.observe(&plan, &s, &t2).unwrap();
        let mut pp = params(Strategy::Quantile);
        pp.int_range = Some((0, 7000));
        let (p, _) = run(pp, &src, &tgt);
        let covers = |k: i64| {
            p.leaves
                .iter()
                .any(|l| l.segment.contains(&vec![KeyPart::Int(k)], 0))
        };
        assert!(covers(1234) && covers(7000));
        assert!(
            p.leaves
                .iter()
                .all(|l| l.source.count().max(l.target.count()) < 10),
            "{:?}",
            p.leaves
        );
        assert_eq!(
            even_cuts(&Segment::whole(), (5, 5), 4),
            None,
            "one key value cannot be cut"
        );
    }

    /// Even cuts are stated as even (first cut, width, count) and are exactly the cut
    /// points the planner listed before it said so: `lo + i·width` for `i` in
    /// `1..factor`, below the range's end, none past an `i64`.
    #[test]
    fn even_cuts_are_said_as_even_and_are_the_points_of_the_list() {
        let listed = |lo: i64, hi: i64, factor: u32| -> Vec<KeyTuple> {
            let width = ((hi - lo) as u64).div_ceil(u64::from(factor.max(2))) as i64;
            (1..i64::from(factor))
                .map_while(|i| lo.checked_add(i.checked_mul(width)?))
                .take_while(|c| *c < hi)
                .map(|c| vec![KeyPart::Int(c)])
                .collect()
        };
        let bounded = |lo: i64, hi: i64| Segment {
            lower: Some(vec![KeyPart::Int(lo)]),
            upper: Some(vec![KeyPart::Int(hi)]),
            ..Segment::default()
        };
        let ranges = [
            (0, 7000),
            (-50, 50),
            (10, 12),
            (0, 1023),
            (i64::MIN / 2, i64::MAX / 2),
            (5, 1_000_000_007),
        ];
        for (lo, hi) in ranges {
            for factor in [2, 3, 4, 32, 1024] {
                let Some(Split::Even(e)) = even_cuts(&bounded(lo, hi), (lo, hi - 1), factor) else {
                    panic!("[{lo}, {hi}) by {factor}: not an even split")
                };
                assert_eq!(e.cuts(), listed(lo, hi, factor), "[{lo}, {hi}) by {factor}");
                // an open segment is cut over the key's range: the same points
                let open = even_cuts(&Segment::whole(), (lo, hi - 1), factor);
                assert_eq!(open, Some(Split::Even(e)));
            }
        }
        assert_eq!(even_cuts(&bounded(4, 5), (0, 10), 4), None, "one key value");
        let text = Segment {
            lower: Some(vec![KeyPart::Text("a".into())]),
            ..Segment::default()
        };
        assert_eq!(even_cuts(&text, (0, 10), 4), None, "not an integer bound");
    }

    /// Two islands of keys far apart (issue 16): level 1's even cuts put every row in
    /// two of its segments; level 2 then cuts each by quantiles into as many children
    /// as its rows need, so the drill ends after two levels with small leaves, where
    /// even cuts repeated level after level would split the empty key range again.
    #[test]
    fn clustered_integer_keys_are_cut_by_quantiles_after_level_one() {
        let island =
            |from: i64| (from..from + 2000).map(|k| (k, (k as u64).wrapping_mul(0x9E3779B97F4A7C15)));
        let rows: Vec<(i64, u64)> = island(0).chain(island(1_000_000_000)).collect();
        let src = Fake { rows: rows.clone() };
        let mut t = rows;
        t[17].1 ^= 1;
        t[2500].1 ^= 1;
        t.remove(3999);
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Quantile);
        pp.threshold = 64;
        pp.first_factor = 64;
        pp.int_range = Some((0, 1_000_001_999));
        let (p, _) = run(pp.clone(), &src, &tgt);
        assert!(p.gapped);
        assert_eq!(p.levels.len(), 2, "{:?}", p.levels);
        // level 2: the two islands, each asked for 2000 / (64 / 16) -> 512 quantiles
        // (the source answers 500 children of 4 rows each)
        assert!((1000..=1024).contains(&p.levels[1].segments), "{:?}", p.levels);
        for k in [17, 1_000_000_500, 1_000_001_999] {
            assert!(
                p.leaves
                    .iter()
                    .any(|l| l.segment.contains(&vec![KeyPart::Int(k)], 0)),
                "{k}: {:?}",
                p.leaves
            );
        }
        assert!(
            p.leaves
                .iter()
                .all(|l| l.source.count().max(l.target.count()) < 64),
            "{:?}",
            p.leaves
        );
        // dense keys stay on even cuts, both sides asked at once
        let dense = Fake { rows: data(4000) };
        let mut pd = pp;
        pd.int_range = Some((0, 3999));
        let mut planner = Planner::new(pd);
        let plan = planner.next_level().unwrap();
        let s = dense.answer(&plan.parents, &plan.splits);
        let mut changed = data(4000);
        changed[100].1 ^= 1;
        let t = Fake { rows: changed }.answer(&plan.parents, &plan.splits);
        planner.observe(&plan, &s, &t).unwrap();
        assert!(!planner.gapped);
    }

    /// Where the engines' statistics show the islands (issue 16), level 1 itself cuts
    /// by them: the drill ends after one level, both sides asked at once, as on dense
    /// keys; a histogram of dense keys leaves level 1 on even cuts.
    #[test]
    fn a_histogram_of_clustered_keys_cuts_level_one_where_the_rows_are() {
        let island =
            |from: i64| (from..from + 2000).map(|k| (k, (k as u64).wrapping_mul(0x9E3779B97F4A7C15)));
        let rows: Vec<(i64, u64)> = island(0).chain(island(1_000_000_000)).collect();
        // an equi-depth histogram as pg_stats keeps it: every 40th key, and the last
        let mut bounds: Vec<i64> = rows.iter().step_by(40).map(|(k, _)| *k).collect();
        bounds.push(rows.last().unwrap().0);
        let src = Fake { rows: rows.clone() };
        let mut t = rows;
        t[17].1 ^= 1;
        t[2500].1 ^= 1;
        t.remove(3999);
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Quantile);
        pp.threshold = 64;
        pp.first_factor = 1024;
        pp.int_range = Some((0, 1_000_001_999));
        pp.key_histogram = bounds.clone();
        let planner = Planner::new(pp.clone());
        let plan = planner.next_level().unwrap();
        assert!(!plan.target_follows_source);
        assert!(
            matches!(&plan.splits[0], Split::Cuts(c) if c.len() > 500),
            "{:?}",
            plan.splits[0]
        );
        let (p, _) = run(pp, &src, &tgt);
        assert_eq!(p.levels.len(), 1, "{:?}", p.levels);
        assert!(!p.gapped);
        for k in [17, 1_000_000_500, 1_000_001_999] {
            assert!(
                p.leaves
                    .iter()
                    .any(|l| l.segment.contains(&vec![KeyPart::Int(k)], 0)),
                "{k}: {:?}",
                p.leaves
            );
        }
        assert!(
            p.leaves
                .iter()
                .all(|l| l.source.count().max(l.target.count()) < 64)
        );
        // dense keys: no bucket spans half the range, so even cuts stay
        let dense: Vec<i64> = (0..=100).map(|i| i * 40).collect();
        assert!(histogram_cuts(&dense, (0, 4000), 1024).is_none());
        // too few bounds to trust
        assert!(histogram_cuts(&[0, 10, 1_000_000], (0, 1_000_000), 64).is_none());
        // cuts are strictly ascending inside (min, max]
        let Some(Split::Cuts(c)) = histogram_cuts(&bounds, (0, 1_000_001_999), 1024) else {
            panic!("clustered")
        };
        let ks: Vec<i64> = c
            .iter()
            .map(|t| match t[0] {
                KeyPart::Int(i) => i,
                _ => unreachable!(),
            })
            .collect();
        assert!(ks.windows(2).all(|w| w[0] < w[1]) && ks[0] > 0 && *ks.last().unwrap() <= 1_000_001_999);
    }

    #[test]
    fn the_first_level_factor_follows_the_row_estimate() {
        assert_eq!(first_level_factor(1_000, 16_384, 32), 32);
        assert_eq!(first_level_factor(100_000, 16_384, 32), 128);
        assert_eq!(first_level_factor(1_000_000, 16_384, 32), 1024);
        assert_eq!(first_level_factor(10_000_000, 16_384, 32), 1024);
        assert_eq!(first_level_factor(1_000_000_000, 16_384, 32), 1024);
        assert_eq!(first_level_factor(0, 16_384, 8), 8);
    }

    #[test]
    fn adjacent_leaves_are_read_together_up_to_the_budget() {
        let agg = |n: u64| AnyAggregate::new(HashMethod::Sha256_64, n, 0, Some(0));
        let k = |i: i64| Some(vec![KeyPart::Int(i)]);
        let leaf = |lo: i64, hi: i64, n: u64| Leaf {
            level: 1,
            segment: Segment {
                lower: k(lo),
                upper: k(hi),
                ..Segment::default()
            },
            source: agg(n),
            target: agg(n),
            inconsistent: None,
        };
        let hashed = Leaf {
            segment: Segment {
                hash: Some((0, 8)),
                ..Segment::default()
            },
            ..leaf(0, 0, 1)
        };
        let leaves = vec![
            leaf(0, 10, 4),
            leaf(10, 20, 4),
            leaf(20, 30, 4), // would make 12 > 10: a new batch
            leaf(40, 50, 1), // not adjacent
            hashed,
        ];
        let b = rows_batches(&leaves, 10);
        let shape: Vec<(Option<KeyTuple>, Option<KeyTuple>, Vec<usize>)> = b
            .iter()
            .map(|(s, m)| (s.lower.clone(), s.upper.clone(), m.clone()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (k(0), k(20), vec![0, 1]),
                (k(20), k(30), vec![2]),
                (k(40), k(50), vec![3]),
                (None, None, vec![4]),
            ]
        );
        assert_eq!(b[3].0.hash, Some((0, 8)), "a lone hash leaf stays as it is");
    }

    #[test]
    fn contiguous_hash_leaves_are_read_together_up_to_the_budget() {
        let agg = |n: u64| AnyAggregate::new(HashMethod::Sha256_64, n, 0, Some(0));
        let k = |i: i64| Some(vec![KeyPart::Int(i)]);
        let leaf = |segment: Segment, n: u64| Leaf {
            level: 2,
            segment,
            source: agg(n),
            target: agg(n + 1),
            inconsistent: None,
        };
        let h = |lo: u64, hi: u64, n: u64| {
            leaf(
                Segment {
                    hash: Some((lo, hi)),
                    ..Segment::default()
                },
                n - 1,
            )
        };
        let other_range = leaf(
            Segment {
                hash: Some((40, 50)),
                lower: k(7),
                ..Segment::default()
            },
            1,
        );
        let leaves = vec![
            h(0, 10, 30),
            h(10, 20, 30),
            h(20, 30, 30), // 90 rows: within 100
            h(30, 40, 30), // 120 > 100: a new batch
            h(50, 60, 1),  // not contiguous (40..50 matched)
            other_range,   // between them in hash order, another key range: its own scan
        ];
        let b = rows_batches(&leaves, 100);
        type Shape = Vec<(Option<(u64, u64)>, Vec<usize>)>;
        let shape: Shape = b.iter().map(|(s, m)| (s.hash, m.clone())).collect();
        assert_eq!(
            shape,
            vec![
                (Some((0, 30)), vec![0, 1, 2]),
                (Some((30, 40)), vec![3]),
                (Some((40, 50)), vec![5]),
                (Some((50, 60)), vec![4]),
            ]
        );
        assert_eq!(b[2].0.lower, k(7));
        // a deeper level's leaves come after level 1's: read in hash order all the same
        let mut late = leaves[..3].to_vec();
        late.rotate_left(1);
        let b = rows_batches(&late, 100);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].0.hash, Some((0, 30)));
        assert_eq!(
            rows_batches(&leaves, 10).len(),
            6,
            "a budget below each leaf merges none"
        );
    }

    #[test]
    fn hash_drill_never_uses_key_bounds() {
        let src = Fake { rows: data(1000) };
        let mut t = data(1000);
        t[10].1 ^= 1;
        let tgt = Fake { rows: t };
        let (p, _) = run(params(Strategy::Hash), &src, &tgt);
        assert_eq!(p.leaves.len(), 1);
        assert!(p.leaves.iter().all(|l| !l.segment.has_key_bounds()));
        assert!(p.leaves[0].segment.contains(&vec![KeyPart::Int(10)], 10));
    }

    #[test]
    fn most_segments_differing_stops_early() {
        let src = Fake { rows: data(2000) };
        let tgt = Fake {
            rows: data(2000)
                .into_iter()
                .map(|(k, h)| (k, h.rotate_left(7) ^ 0x5555))
                .collect(),
        };
        let mut pp = params(Strategy::Quantile);
        pp.factor = 32;
        let (p, q) = run(pp, &src, &tgt);
        assert_eq!(
            q, 2,
            "level 1 never stops: scattered differences also touch most of its segments"
        );
        assert!(
            matches!(p.stop, Some(Stop::MostSegmentsDiffer { level: 2, .. })),
            "{:?}",
            p.stop
        );
        assert!(p.leaves.iter().all(|l| l.level == 2));
        assert_eq!(p.leaves.iter().map(|l| l.source.count()).sum::<u64>(), 2000);
    }

    #[test]
    fn scattered_differences_touching_every_level_1_segment_still_drill() {
        let src = Fake { rows: data(32_000) };
        let mut t = data(32_000);
        for i in (500..32_000).step_by(1000) {
            t[i].1 ^= 1; // one difference in each of the 32 level-1 segments
        }
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Quantile);
        pp.factor = 32;
        pp.threshold = 100;
        let (p, _) = run(pp, &src, &tgt);
        assert!(p.stop.is_none(), "{:?}", p.stop);
        assert_eq!(p.leaves.len(), 32);
        assert!(p.leaves.iter().all(|l| l.source.count() < 100));
    }

    #[test]
    fn counts_only_ignores_checksums() {
        let src = Fake { rows: data(100) };
        let tgt = Fake {
            rows: data(100).into_iter().map(|(k, h)| (k, h ^ 1)).collect(),
        };
        let mut pp = params(Strategy::Quantile);
        pp.counts_only = true;
        let (p, _) = run(pp, &src, &tgt);
        assert!(p.leaves.is_empty());
    }

    #[test]
    fn depth_and_max_leaves_bound_the_drill() {
        let src = Fake { rows: data(5000) };
        let mut t = data(5000);
        for i in (0..5000).step_by(500) {
            t[i].1 ^= 1;
        }
        let tgt = Fake { rows: t };
        let mut pp = params(Strategy::Quantile);
        pp.depth = 1;
        let (p, q) = run(pp.clone(), &src, &tgt);
        assert_eq!(q, 1);
        assert!(p.leaves.iter().all(|l| l.level == 1));
        pp.depth = 8;
        pp.max_leaves = Some(3);
        let (p, _) = run(pp, &src, &tgt);
        assert!(matches!(p.stop, Some(Stop::MaxLeaves { limit: 3, .. })));
    }

    fn without(rows: Vec<(i64, u64)>, lost: &[i64]) -> Vec<(i64, u64)> {
        rows.into_iter().filter(|(k, _)| !lost.contains(k)).collect()
    }

    /// Every row of both datasets lies in a leaf or in a segment that matched: the
    /// leaves of an inconsistent drill still cover `k`.
    fn covered(p: &Planner, k: i64) -> bool {
        p.leaves.iter().any(|l| in_seg(&l.segment, k))
    }

    #[test]
    fn a_differing_parent_whose_children_all_match_becomes_an_inconsistent_leaf() {
        // row 123 differs; at level 2 both agents' child predicates lose it, so every
        // child matches although the parent differed
        let src = Shifting {
            first: Fake { rows: data(1000) },
            later: Fake {
                rows: without(data(1000), &[123]),
            },
        };
        let mut t = data(1000);
        t[123].1 ^= 1;
        let tgt = Shifting {
            first: Fake { rows: t.clone() },
            later: Fake {
                rows: without(t, &[123]),
            },
        };
        let (p, q) = run(params(Strategy::Quantile), &src, &tgt);
        assert_eq!(q, 2, "the drill ends at level 2: nothing is left to descend");
        assert_eq!(p.leaves.len(), 1, "{:?}", p.leaves);
        let leaf = &p.leaves[0];
        let reason = leaf.inconsistent.as_deref().expect("flagged inconsistent");
        assert!(
            reason.contains("source children add up to 249 rows, the parent had 250"),
            "{reason}"
        );
        assert!(
            reason.contains("target children add up to 249 rows, the parent had 250"),
            "{reason}"
        );
        assert!(
            reason.contains("no child differs although the parent did"),
            "{reason}"
        );
        // the parent's bounds and both of its level-1 aggregates
        assert_eq!(leaf.level, 1);
        assert_eq!(leaf.source.count(), 250);
        assert_eq!(leaf.target.count(), 250);
        assert!(!leaf.source.matches(&leaf.target).unwrap());
        assert!(covered(&p, 123), "the differing row is not forgotten");
        assert_eq!(p.levels[1].inconsistent, 1);
        assert_eq!(p.levels[1].differing, 0);
    }

    #[test]
    fn children_that_do_not_add_up_are_not_used() {
        // row 123 changed; the target's level-2 predicate loses row 124 as well, so a
        // child differs but the target's children miss a row of their parent
        let src = Fake { rows: data(1000) };
        let mut t = data(1000);
        t[123].1 ^= 1;
        let tgt = Shifting {
            first: Fake { rows: t.clone() },
            later: Fake {
                rows: without(t, &[124]),
            },
        };
        let (p, _) = run(params(Strategy::Quantile), &src, &tgt);
        assert_eq!(p.leaves.len(), 1, "{:?}", p.leaves);
        let reason = p.leaves[0].inconsistent.as_deref().expect("flagged inconsistent");
        assert!(
            reason.contains("target children add up to 249 rows, the parent had 250"),
            "{reason}"
        );
        assert!(!reason.contains("source children"), "{reason}");
        assert!(!reason.contains("no child differs"), "{reason}");
        // the children (where 124 looked missing) did not descend: the parent stands
        assert_eq!(p.leaves[0].level, 1);
        assert!(covered(&p, 123) && covered(&p, 124));
        assert_eq!(p.levels.len(), 2);
    }

    #[test]
    fn rows_changed_between_levels_are_caught_by_the_checksums() {
        // the target's row 300 differs at level 1 and has caught up by level 2: counts
        // add up, the checksums do not
        let src = Fake { rows: data(1000) };
        let mut t = data(1000);
        t[300].1 ^= 0xff00;
        let tgt = Shifting {
            first: Fake { rows: t },
            later: Fake { rows: data(1000) },
        };
        let (p, _) = run(params(Strategy::Hash), &src, &tgt);
        assert_eq!(p.leaves.len(), 1, "{:?}", p.leaves);
        let reason = p.leaves[0].inconsistent.as_deref().expect("flagged inconsistent");
        assert!(
            reason.starts_with("target children's checksums add up to"),
            "{reason}"
        );
        assert!(reason.contains("target children's XOR is"), "{reason}");
        assert!(reason.contains("no child differs"), "{reason}");
        assert!(!reason.contains("rows"), "counts add up: {reason}");
        assert!(p.leaves[0].segment.contains(&vec![KeyPart::Int(300)], 300 % 64));
    }

    #[test]
    fn a_parent_answered_with_no_children_is_not_forgotten() {
        let mut planner = Planner::new(params(Strategy::Hash));
        let src = Fake { rows: data(100) };
        let mut t = data(100);
        t[5].1 ^= 1;
        let tgt = Fake { rows: t };
        let plan = planner.next_level().unwrap();
        let (s, t) = (
            src.answer(&plan.parents, &plan.splits),
            tgt.answer(&plan.parents, &plan.splits),
        );
        planner.observe(&plan, &s, &t).unwrap();
        let plan = planner.next_level().expect("one parent descends");
        assert_eq!(plan.parents.len(), 1);
        // both agents answer the level with no bucket for the parent: refused, the
        // level is not used (the run ends in error, never in a match)
        let e = planner.observe(&plan, &[], &[]).unwrap_err();
        assert!(
            matches!(&e, PlanError::Answer { side: "source", what } if what.contains("0 children")),
            "{e}"
        );
    }

    #[test]
    fn an_answer_that_does_not_fit_its_request_is_refused_at_any_level() {
        let src = Fake { rows: data(100) };
        for strategy in [Strategy::Hash, Strategy::Quantile] {
            let mut planner = Planner::new(params(strategy));
            let plan = planner.next_level().unwrap();
            let good = src.answer(&plan.parents, &plan.splits);
            let refused = |planner: &Planner, s: &[BucketResult], t: &[BucketResult]| {
                let mut p = planner.clone();
                p.observe(&plan, s, t).unwrap_err().to_string()
            };
            // level 1 has no parent aggregate to check children against: an empty
            // answer on both sides would compare nothing and match
            assert!(refused(&planner, &[], &[]).contains("0 children"), "{strategy:?}");
            // a bucket for a parent not asked
            let mut other = good.clone();
            for b in &mut other {
                b.parent = 1;
            }
            assert!(refused(&planner, &other, &other).contains("names parent 1 of 1"));
            // a child twice, a child missing
            let mut twice = good.clone();
            twice.push(good[0].clone());
            assert!(refused(&planner, &good, &twice).contains("once each"));
            let missing = good[1..].to_vec();
            assert!(refused(&planner, &missing, &missing).contains("once each"));
            // bounds other than the split's (a quantile split must tile the parent)
            let mut moved = good.clone();
            let last = moved.len() - 1;
            moved[last].segment.upper = Some(vec![KeyPart::Int(50)]);
            assert!(
                refused(&planner, &moved, &moved).contains("split asked for"),
                "{strategy:?}"
            );
            planner.observe(&plan, &good, &good).unwrap();
        }
    }

    #[test]
    fn a_consistent_drill_flags_nothing() {
        let src = Fake { rows: data(5000) };
        let mut t = data(5000);
        t[123].1 ^= 1;
        t.remove(2700);
        t.push((9000, 3));
        let tgt = Fake { rows: t };
        let mut int = params(Strategy::Quantile);
        int.int_range = Some((0, 9000));
        let mut time = params(Strategy::Time);
        time.time = Some(("at".into(), Granularity::Day));
        for pp in [params(Strategy::Quantile), params(Strategy::Hash), int, time] {
            let (p, q) = run(pp.clone(), &src, &tgt);
            assert!(q > 2, "{:?}: the drill went deep", pp.strategy);
            assert!(
                p.leaves.iter().all(|l| l.inconsistent.is_none()),
                "{:?}: {:?}",
                pp.strategy,
                p.leaves
            );
            assert!(p.levels.iter().all(|l| l.inconsistent == 0));
            assert!(covered(&p, 123) && covered(&p, 2700) && covered(&p, 9000));
        }
    }

    #[test]
    fn a_period_answered_twice_is_refused() {
        let mut pp = params(Strategy::Time);
        pp.time = Some(("at".into(), Granularity::Day));
        let mut planner = Planner::new(pp);
        let plan = planner.next_level().unwrap();
        let src = Fake { rows: data(300) };
        let s = src.answer(&plan.parents, &plan.splits);
        let mut twice = s.clone();
        // the same period again under a new child number
        twice.push(BucketResult {
            child: s.len(),
            ..s[0].clone()
        });
        assert!(matches!(
            planner.observe(&plan, &s, &twice),
            Err(PlanError::DuplicatePeriod { side: "target", .. })
        ));
    }

    #[test]
    fn bucket_bounds_must_agree() {
        let mut planner = Planner::new(params(Strategy::Hash));
        let plan = planner.next_level().unwrap();
        let Split::Hash(n) = plan.splits[0] else {
            panic!("a hash level")
        };
        let a: Vec<BucketResult> = Segment::whole()
            .hash_children(n)
            .into_iter()
            .enumerate()
            .map(|(child, segment)| BucketResult {
                parent: 0,
                child,
                segment,
                agg: agg(1, 1),
            })
            .collect();
        let mut b = a.clone();
        b[0].segment.hash = Some((0, 1));
        let e = planner.observe(&plan, &a, &b).unwrap_err();
        assert!(
            matches!(&e, PlanError::Answer { side: "target", what } if what.contains("child 0 of parent 0")),
            "{e}"
        );
    }
}
