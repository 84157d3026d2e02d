//! Bucketed aggregates of a dataset: pushed down to the engine where it can, hashed
//! in the agent otherwise, and split by period.

use tally_common::checksum::{AnyAggregate, Hasher};
use tally_common::period::period_label;
use tally_common::segment::{EvenCuts, KeyPart, KeyTuple, Period, Segment, Split, bucket_hash};
use tally_common::types::TypeClass;

use crate::connector::Session;
use crate::dialect::{self, ChildRule, check_bounds};
use crate::error::{AgentError, Result};
use crate::hash_pipe::HashPipe;

use super::{AggregateOut, Bound, BucketOut, Dataset, Path};

impl Dataset {
    pub async fn aggregate(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        parents: &[(Segment, Split)],
        force_in_process: bool,
    ) -> Result<AggregateOut> {
        let key = b.key_infos();
        for (seg, split) in parents {
            let mut probe = seg.clone();
            match split {
                Split::Cuts(c) => {
                    probe.lower = c.first().cloned().or(probe.lower);
                    probe.upper = c.last().cloned().or(probe.upper);
                }
                // its cuts are one integer: refused on any other key
                Split::Even(e) => {
                    probe.lower = Some(vec![KeyPart::Int(e.first())]);
                    probe.upper = Some(vec![KeyPart::Int(e.last())]);
                }
                _ => {}
            }
            check_bounds(&probe, &key).map_err(AgentError::InvalidArgument)?;
            if let Split::Quantile(_) | Split::Cuts(_) | Split::Even(_) = split
                && let Some(c) = key
                    .iter()
                    .find(|c| !matches!(c.class, TypeClass::Integer | TypeClass::Text))
            {
                return Err(AgentError::InvalidArgument(format!(
                    "key column {} is {}; quantile bisection needs integer or text keys (use strategy hash)",
                    c.name, c.class
                )));
            }
        }
        // one run, one window: every parent carries the same (its signed scope names it)
        if let Some((first, _)) = parents.first()
            && parents.iter().any(|(seg, _)| seg.window != first.window)
        {
            return Err(AgentError::InvalidArgument(
                "the segments of one request carry different windows".into(),
            ));
        }
        let periods = parents
            .iter()
            .filter(|(_, s)| matches!(s, Split::Period { .. }))
            .count();
        if periods > 0 && parents.len() > 1 {
            return Err(AgentError::InvalidArgument(
                "a period split must be the only segment of its request".into(),
            ));
        }
        for (seg, split) in parents {
            let asked = match split {
                Split::Period { column, granularity } => Some(Period {
                    column: column.clone(),
                    granularity: *granularity,
                    label: String::new(),
                }),
                _ => None,
            };
            for p in seg.period.iter().chain(asked.as_ref()) {
                self.period_index(b, p)?;
            }
            if let Some(w) = &seg.window {
                dialect::window_bound(&b.cols, w).map_err(AgentError::InvalidArgument)?;
            }
        }
        if let [(seg, Split::Period { column, granularity })] = parents {
            let p = Period {
                column: column.clone(),
                granularity: *granularity,
                label: String::new(),
            };
            return self.aggregate_periods(s, b, h, seg, &p, force_in_process).await;
        }
        match self.choose_path(b, force_in_process) {
            Path::Pushdown => self.aggregate_pushdown(s, b, h, parents).await,
            // both paths render every value identically (DESIGN §3), so a value the
            // agent cannot render is refused, never retried in SQL
            Path::InProcess => self.aggregate_in_process(s, b, h, parents).await,
        }
    }

    /// Where a period's column is among the request's columns (it must be, with a
    /// date or timestamp class, so both paths can compute its label).
    pub(super) fn period_index(&self, b: &Bound, p: &Period) -> Result<usize> {
        let i = b
            .cols
            .iter()
            .position(|c| c.info.name.eq_ignore_ascii_case(&p.column))
            .ok_or_else(|| {
                AgentError::InvalidArgument(format!(
                    "the period column {} is not among the compared columns",
                    p.column
                ))
            })?;
        match b.cols[i].spec.format.class {
            TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz => Ok(i),
            c => Err(AgentError::InvalidArgument(format!(
                "the period column {} is {c}, not a date or timestamp",
                p.column
            ))),
        }
    }

    /// One bucket per period present, in label order (NULL times first, label "").
    async fn aggregate_periods(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        period: &Period,
        force_in_process: bool,
    ) -> Result<AggregateOut> {
        let (method, xor) = (h.method(), h.method().has_xor());
        let child = |label: String| Segment {
            period: Some(Period {
                label,
                ..period.clone()
            }),
            ..seg.clone()
        };
        let d = self.connector.dialect_for(&b.info);
        let sql = || dialect::aggregate_periods(d, &self.source, &b.cols, &b.key_infos(), h, seg, period);
        let pushed = match self.choose_path(b, force_in_process) {
            Path::Pushdown => sql(),
            Path::InProcess => None,
        };
        let mut in_process = None;
        if pushed.is_none() {
            in_process = Some(self.periods_in_process(s, b, h, seg, period, xor).await?);
        }
        let (mut found, path, scanned): (Vec<(String, AnyAggregate)>, Path, u64) = match pushed {
            Some(sql) => {
                let rows = s.aggregate(&sql, &[TypeClass::Text]).await?;
                let xor_real = xor && d.xor_aggregate("h").is_some();
                let n = rows.iter().map(|r| r.count).sum();
                let found = rows
                    .into_iter()
                    .map(|r| {
                        let label = match r.first_key.as_deref() {
                            Some([KeyPart::Text(l)]) => l.clone(),
                            _ => String::new(),
                        };
                        (
                            label,
                            AnyAggregate::new(method, r.count, r.sum, if xor_real { r.xor } else { None }),
                        )
                    })
                    .collect();
                (found, Path::Pushdown, n)
            }
            None => {
                let (found, n) = in_process.expect("computed in-process when not pushed down");
                (found, Path::InProcess, n)
            }
        };
        const MAX_PERIODS: usize = 100_000;
        if found.len() > MAX_PERIODS {
            return Err(AgentError::InvalidArgument(format!(
                "{} periods in one level (at most {MAX_PERIODS}): use a coarser time_granularity",
                found.len()
            )));
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(AggregateOut {
            buckets: found
                .into_iter()
                .enumerate()
                .map(|(i, (label, agg))| BucketOut {
                    parent: 0,
                    child: i,
                    segment: child(label),
                    agg,
                })
                .collect(),
            path,
            rows_scanned: scanned,
        })
    }

    /// One aggregate per period label present, computed from the rows here.
    async fn periods_in_process(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        period: &Period,
        xor: bool,
    ) -> Result<(Vec<(String, AnyAggregate)>, u64)> {
        let i = self.period_index(b, period)?;
        let method = h.method();
        let mut map: std::collections::BTreeMap<String, AnyAggregate> = Default::default();
        let n = self
            .scan_segment(s, b, h, seg, false, false, &mut |row, _| {
                let label = period_label(row.field(i), period.granularity).unwrap_or_default();
                map.entry(label)
                    .or_insert_with(|| AnyAggregate::empty(method, xor))
                    .add_checksum(h.row(row.row_string().as_bytes()));
                Ok(())
            })
            .await?;
        Ok((map.into_iter().collect(), n))
    }

    async fn aggregate_pushdown(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        parents: &[(Segment, Split)],
    ) -> Result<AggregateOut> {
        let d = self.connector.dialect_for(&b.info);
        let key = b.key_infos();
        let rules: Vec<(Segment, ChildRule)> = parents
            .iter()
            .map(|(seg, split)| (seg.clone(), child_rule(seg, split)))
            .collect();
        let sql = dialect::aggregate(d, &self.source, &b.cols, &key, h, &rules)
            .ok_or_else(|| AgentError::Unsupported("engine cannot push this aggregate down".into()))?;
        let rows = s.aggregate(&sql, &b.key_classes()).await?;
        let method = h.method();
        let xor_real = method.has_xor() && d.xor_aggregate("h").is_some();
        let mut buckets = Vec::new();
        let mut scanned = 0;
        for (p, (seg, split)) in parents.iter().enumerate() {
            let mine: Vec<_> = rows.iter().filter(|r| r.parent == p).collect();
            scanned += mine.iter().map(|r| r.count).sum::<u64>();
            let children = match split {
                Split::Whole => vec![seg.clone()],
                Split::Hash(n) => seg.hash_children(*n),
                Split::Cuts(c) => seg.cut_children(c),
                Split::Even(e) => seg.cut_children(&e.cuts()),
                Split::Quantile(_) => {
                    let cuts: Vec<KeyTuple> =
                        mine.iter().skip(1).filter_map(|r| r.first_key.clone()).collect();
                    seg.cut_children(&cuts)
                }
                Split::Period { .. } => unreachable!("period splits are aggregated alone"),
            };
            for (i, child) in children.into_iter().enumerate() {
                // quantile rows are numbered by NTILE; the others by child index
                let row = match split {
                    Split::Quantile(_) => mine.get(i).copied(),
                    _ => mine.iter().find(|r| r.child == i).copied(),
                };
                let agg = match row {
                    Some(r) => AnyAggregate::new(method, r.count, r.sum, if xor_real { r.xor } else { None }),
                    None => AnyAggregate::empty(method, xor_real),
                };
                buckets.push(BucketOut {
                    parent: p,
                    child: i,
                    segment: child,
                    agg,
                });
            }
        }
        Ok(AggregateOut {
            buckets,
            path: Path::Pushdown,
            rows_scanned: scanned,
        })
    }

    async fn aggregate_in_process(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        parents: &[(Segment, Split)],
    ) -> Result<AggregateOut> {
        let (method, xor) = (h.method(), h.method().has_xor());
        if let Some(out) = self.hash_parents_in_one_scan(s, b, h, parents).await? {
            return Ok(out);
        }
        let mut buckets = Vec::new();
        let mut scanned = 0;
        for (p, (seg, split)) in parents.iter().enumerate() {
            let (children, aggs) = match split {
                Split::Quantile(n) => {
                    let counted = match (&seg.hash, &seg.period) {
                        (None, None) => dialect::count_rows(
                            self.connector.dialect_for(&b.info),
                            &self.source,
                            &b.key_infos(),
                            &b.cols,
                            seg,
                        ),
                        _ => None,
                    };
                    let total = match counted {
                        Some(sql) => s.count(&sql).await?,
                        None => {
                            let mut n = 0u64;
                            scanned += self
                                .scan_segment(s, b, h, seg, false, false, &mut |_, _| {
                                    n += 1;
                                    Ok(())
                                })
                                .await?;
                            n
                        }
                    };
                    let n = u64::from(*n).max(1);
                    let mut cuts: Vec<KeyTuple> = Vec::new();
                    let mut aggs: Vec<AnyAggregate> = vec![AnyAggregate::empty(method, xor)];
                    let mut i = 0u64;
                    scanned += self
                        .scan_segment(s, b, h, seg, true, false, &mut |row, _| {
                            let child = ntile(i, total, n).min(aggs.len() as u64) as usize;
                            if child == aggs.len() {
                                cuts.push(row.key.clone());
                                aggs.push(AnyAggregate::empty(method, xor));
                            }
                            aggs[child].add_checksum(h.row(row.row_string().as_bytes()));
                            i += 1;
                            Ok(())
                        })
                        .await?;
                    (seg.cut_children(&cuts), aggs)
                }
                _ => {
                    let children = match split {
                        Split::Hash(n) => seg.hash_children(*n),
                        Split::Cuts(c) => seg.cut_children(c),
                        Split::Even(e) => seg.cut_children(&e.cuts()),
                        _ => vec![seg.clone()],
                    };
                    // row strings hashed on a second thread where the host has one
                    let mut pipe = HashPipe::new(h, children.len(), xor, self.hash_thread);
                    let mut cuts = match split {
                        Split::Cuts(c) => Some(CutFinder::new(c)),
                        Split::Even(e) => Some(CutFinder::even(*e)),
                        _ => None,
                    };
                    scanned += self
                        .scan_segment(
                            s,
                            b,
                            h,
                            seg,
                            false,
                            matches!(split, Split::Hash(_)),
                            &mut |row, kh| {
                                let child = match (split, &mut cuts) {
                                    (Split::Hash(n), _) => seg.hash_child_of(*n, bucket_hash(kh)),
                                    (_, Some(cuts)) => cuts.child(&row.key),
                                    _ => 0,
                                };
                                pipe.add(child, row.row_string().as_bytes());
                                Ok(())
                            },
                        )
                        .await?;
                    (children, pipe.finish()?)
                }
            };
            for (i, (segment, agg)) in children.into_iter().zip(aggs).enumerate() {
                buckets.push(BucketOut {
                    parent: p,
                    child: i,
                    segment,
                    agg,
                });
            }
        }
        Ok(AggregateOut {
            buckets,
            path: Path::InProcess,
            rows_scanned: scanned,
        })
    }

    /// Hash splits of several parents that differ only in their hash ranges (a hash
    /// drill's level 2 and deeper): each parent alone would scan the same rows, so the
    /// rows are read once and each goes to the parent whose hash range holds it.
    /// `None` when the parents are not such a set (one parent, other splits, other key
    /// ranges, or hash ranges that overlap: a row must count in every parent that
    /// holds it, as separate scans would count it).
    async fn hash_parents_in_one_scan(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        parents: &[(Segment, Split)],
    ) -> Result<Option<AggregateOut>> {
        let Some((first, _)) = parents.first() else {
            return Ok(None);
        };
        if parents.len() < 2
            || !parents.iter().all(|(seg, split)| {
                matches!(split, Split::Hash(_)) && seg.hash.is_some() && seg.scans_like(first)
            })
        {
            return Ok(None);
        }
        // parents by the start of their hash range; disjoint, or not this path
        let mut order: Vec<(u64, u64, usize)> = parents
            .iter()
            .enumerate()
            .map(|(i, (seg, _))| {
                let (lo, hi) = seg.hash.expect("checked above");
                (lo, hi, i)
            })
            .collect();
        order.sort_unstable();
        if order.windows(2).any(|w| w[0].1 > w[1].0) {
            return Ok(None);
        }
        let (method, xor) = (h.method(), h.method().has_xor());
        let children: Vec<Vec<Segment>> = parents
            .iter()
            .map(|(seg, split)| match split {
                Split::Hash(n) => seg.hash_children(*n),
                _ => unreachable!("checked above"),
            })
            .collect();
        let mut aggs: Vec<Vec<AnyAggregate>> = children
            .iter()
            .map(|c| vec![AnyAggregate::empty(method, xor); c.len()])
            .collect();
        // the rows of every parent: the common key range, period and window
        let all = Segment {
            hash: None,
            ..first.clone()
        };
        let scanned = self
            .scan_segment(s, b, h, &all, false, true, &mut |row, kh| {
                let bh = bucket_hash(kh);
                // the last parent starting at or below the row's bucket hash
                let i = order.partition_point(|&(lo, _, _)| lo <= bh);
                if i == 0 {
                    return Ok(());
                }
                let (_, hi, p) = order[i - 1];
                if bh >= hi {
                    return Ok(());
                }
                let Split::Hash(n) = parents[p].1 else {
                    unreachable!("checked above")
                };
                let child = parents[p].0.hash_child_of(n, bh);
                aggs[p][child].add_checksum(h.row(row.row_string().as_bytes()));
                Ok(())
            })
            .await?;
        let mut buckets = Vec::new();
        for (p, (segs, aggs)) in children.into_iter().zip(aggs).enumerate() {
            for (i, (segment, agg)) in segs.into_iter().zip(aggs).enumerate() {
                buckets.push(BucketOut {
                    parent: p,
                    child: i,
                    segment,
                    agg,
                });
            }
        }
        Ok(Some(AggregateOut {
            buckets,
            path: Path::InProcess,
            rows_scanned: scanned,
        }))
    }
}

/// How a pushed-down aggregate forms a parent's children: as its split says. A cut
/// list is compared cut by cut, however its points are spaced (an even split says so:
/// [`Split::Even`]).
fn child_rule(seg: &Segment, split: &Split) -> ChildRule {
    match split {
        Split::Whole => ChildRule::Whole,
        Split::Hash(n) => {
            let (lo, width) = seg.hash_split(*n);
            ChildRule::Hash { lo, width }
        }
        Split::Cuts(c) => ChildRule::Cuts(c.clone()),
        Split::Even(e) => even_rule(e),
        Split::Quantile(n) => ChildRule::Quantile(*n),
        Split::Period { .. } => unreachable!("period splits are aggregated alone"),
    }
}

/// An even split becomes one division per row, where `(k - lo)` cannot overflow in
/// SQL (keys and width within ±2^62) and there is more than one cut (one cut is one
/// comparison); its cut points are compared otherwise.
fn even_rule(e: &EvenCuts) -> ChildRule {
    let bound = 1i64 << 62;
    let bound = bound as u64;
    if e.count() < 2
        || e.first().unsigned_abs() > bound
        || e.last().unsigned_abs() > bound
        || e.width().unsigned_abs() > bound
    {
        return ChildRule::Cuts(e.cuts());
    }
    ChildRule::IntRange {
        first: e.first(),
        last: e.last(),
        lo: e.first() - e.width(),
        width: e.width(),
        children: e.count() as usize + 1,
    }
}

/// Which child of a cut split a key falls in: the number of cuts at or below it. Cuts
/// of one integer key part are compared as integers (once per row read in the agent);
/// an even split's child is one division.
struct CutFinder<'a> {
    cuts: &'a [KeyTuple],
    ints: Option<Vec<i64>>,
    even: Option<EvenCuts>,
    /// The last integer key's child: rows mostly arrive in key order, so the next row
    /// is most often in it or the one after.
    last: usize,
}

impl<'a> CutFinder<'a> {
    fn new(cuts: &'a [KeyTuple]) -> Self {
        let ints = cuts
            .iter()
            .map(|c| match c.as_slice() {
                [KeyPart::Int(i)] => Some(*i),
                _ => None,
            })
            .collect();
        CutFinder {
            cuts,
            ints,
            even: None,
            last: 0,
        }
    }

    fn even(e: EvenCuts) -> Self {
        CutFinder {
            cuts: &[],
            ints: None,
            even: Some(e),
            last: 0,
        }
    }

    fn child(&mut self, key: &KeyTuple) -> usize {
        if let Some(e) = &self.even {
            return match key.as_slice() {
                [KeyPart::Int(k)] => e.child_of(*k),
                // an integer key reads as integers; anything else by its cut points
                _ => e.cuts().partition_point(|cut| cut <= key),
            };
        }
        match (&self.ints, key.as_slice()) {
            (Some(ints), [KeyPart::Int(k)]) => {
                // child c holds k when the cut below it is at or below k and its own
                // cut above k: exactly the c the search finds, cuts being sorted
                let holds = |c: usize| (c == 0 || ints[c - 1] <= *k) && (c == ints.len() || *k < ints[c]);
                let c = if holds(self.last) {
                    self.last
                } else if self.last < ints.len() && holds(self.last + 1) {
                    self.last + 1
                } else {
                    ints.partition_point(|cut| cut <= k)
                };
                self.last = c;
                c
            }
            _ => self.cuts.partition_point(|cut| cut <= key),
        }
    }
}

/// The 0-based NTILE bucket of the `i`-th of `total` ordered rows in `n` buckets, as
/// SQL's NTILE numbers them: the first `total % n` buckets hold one row more. Rows past
/// `total` (written since it was counted) stay in the last bucket.
fn ntile(i: u64, total: u64, n: u64) -> u64 {
    let (q, r) = (total / n, total % n);
    let big = r * (q + 1);
    let b = if i < big {
        i / (q + 1)
    } else {
        // q == 0: fewer rows than buckets, and this row came after the count
        (i - big).checked_div(q).map_or(n - 1, |j| r + j)
    };
    b.min(n - 1)
}

#[cfg(test)]
mod tests {
    use super::{ChildRule, CutFinder, child_rule, ntile};
    use tally_common::segment::{EvenCuts, KeyPart, KeyTuple, Segment, Split};

    /// The agent buckets an even split as it is told, by one division, and a cut list
    /// by its cuts however evenly they are spaced: it guesses nothing.
    #[test]
    fn an_even_split_is_bucketed_by_division_and_a_cut_list_by_its_cuts() {
        let seg = Segment::whole();
        let e = EvenCuts::new(1000, 500, 4).unwrap();
        let ChildRule::IntRange {
            first,
            last,
            lo,
            width,
            children,
        } = child_rule(&seg, &Split::Even(e))
        else {
            panic!("an even split is one division per row")
        };
        assert_eq!((first, last, lo, width, children), (1000, 2500, 500, 500, 5));
        assert!(
            matches!(child_rule(&seg, &Split::Cuts(e.cuts())), ChildRule::Cuts(c) if c == e.cuts()),
            "the same points as a list are compared, not re-detected"
        );
        // one cut: one comparison; keys past 2^62: (k - lo) could overflow in SQL
        for e in [
            EvenCuts::new(7, 3, 1).unwrap(),
            EvenCuts::new(-(1 << 62) - 1, 10, 3).unwrap(),
            EvenCuts::new((1 << 62) - 5, 10, 2).unwrap(),
            EvenCuts::new(i64::MIN, 1, 2).unwrap(),
        ] {
            assert!(
                matches!(child_rule(&seg, &Split::Even(e)), ChildRule::Cuts(c) if c == e.cuts()),
                "{e:?}"
            );
        }
    }

    #[test]
    fn an_even_finder_finds_the_child_the_cut_points_give() {
        let e = EvenCuts::new(-30, 20, 5).unwrap();
        let cuts = e.cuts();
        let mut finder = CutFinder::even(e);
        for k in (-80..120).chain([i64::MIN, i64::MAX]) {
            let key = vec![KeyPart::Int(k)];
            assert_eq!(finder.child(&key), cuts.partition_point(|c| c <= &key), "{k}");
        }
        let pair = vec![KeyPart::Int(10), KeyPart::Int(1)];
        assert_eq!(finder.child(&pair), cuts.partition_point(|c| c <= &pair));
    }

    #[test]
    fn integer_cuts_find_the_child_the_general_comparison_does() {
        let ints = [-5i64, 0, 7, 7, 1 << 40];
        let cuts: Vec<KeyTuple> = ints.iter().map(|i| vec![KeyPart::Int(*i)]).collect();
        let mut finder = CutFinder::new(&cuts);
        assert!(finder.ints.is_some());
        let keys = [i64::MIN, -6, -5, -4, 0, 6, 7, 8, 1 << 40, i64::MAX];
        // in key order (the remembered child and the next one answer), backwards and
        // in jumps (the search answers), each key twice in a row
        let order = keys.iter().chain(keys.iter().rev()).chain(keys.iter().step_by(3));
        for k in order.flat_map(|k| [*k, *k]) {
            let key = vec![KeyPart::Int(k)];
            assert_eq!(finder.child(&key), cuts.partition_point(|cut| cut <= &key), "{k}");
        }
        assert_eq!(finder.child(&vec![KeyPart::Int(7)]), 4);
        // text keys, composite keys and mixed cuts keep the general comparison
        let text: Vec<KeyTuple> = vec![vec![KeyPart::Text("m".into())]];
        assert!(CutFinder::new(&text).ints.is_none());
        assert_eq!(CutFinder::new(&text).child(&vec![KeyPart::Text("z".into())]), 1);
        let pair = vec![KeyPart::Int(7), KeyPart::Int(1)];
        assert_eq!(finder.child(&pair), cuts.partition_point(|cut| cut <= &pair));
    }

    #[test]
    fn ntile_matches_sql() {
        // 250 rows in 4 buckets: 63, 63, 62, 62
        let sizes = (0..250).fold([0u64; 4], |mut acc, i| {
            acc[ntile(i, 250, 4) as usize] += 1;
            acc
        });
        assert_eq!(sizes, [63, 63, 62, 62]);
        // fewer rows than buckets: one row each
        assert_eq!((0..3).map(|i| ntile(i, 3, 8)).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(ntile(10, 3, 8), 7);
    }
}
