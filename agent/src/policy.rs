//! Enforcement of a dataset's policy (DESIGN §2). Every check names the policy key it
//! applies, so a refusal tells the operator exactly which line of agent.yaml to change.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use tally_common::PrivacyLevel;
use tally_common::segment::{KeyTuple, Segment, Split};

use crate::config::Policy;
use crate::error::AgentError;

/// The most rows one reveal call releases, whatever the request's limit.
pub const MAX_REVEAL_ROWS: usize = tally_common::wire::MAX_REVEAL_ROWS_PER_CALL;

pub(crate) fn deny(dataset: &str, key: &'static str, message: impl Into<String>) -> AgentError {
    AgentError::Policy {
        dataset: dataset.to_string(),
        key,
        message: message.into(),
    }
}

/// Before a Measures call: the request is sealed (measures not released in clear go
/// out as digests keyed with the run key, which must not be brute-forced), each
/// group_by column may label groups (`group_columns`, or `time_columns` for a period),
/// none is masked, and a window uses a time column.
pub fn check_measures(
    p: &Policy,
    dataset: &str,
    r: &tally_common::wire::measures::MeasuresRequest,
) -> Result<(), AgentError> {
    if !r.method.is_sealed() || r.seal.is_none() {
        return Err(AgentError::Seal(format!(
            "dataset {dataset}: measures are compared by digests keyed with the run key; the request must be sealed"
        )));
    }
    for g in &r.group_by {
        if p.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(&g.column)) {
            return Err(deny(
                dataset,
                "mask_columns",
                format!("column {} is masked: its values cannot label groups", g.column),
            ));
        }
        match g.granularity {
            Some(_) if !p.allows_time_column(&g.column) => {
                return Err(deny(
                    dataset,
                    "time_columns",
                    format!(
                        "column {} is not listed in time_columns; periods may group only by those",
                        g.column
                    ),
                ));
            }
            None if !p.allows_group_column(&g.column) => {
                return Err(deny(
                    dataset,
                    "group_columns",
                    format!(
                        "column {} is not listed in group_columns; its values may not label groups",
                        g.column
                    ),
                ));
            }
            _ => {}
        }
    }
    let seg = Segment {
        window: r.window.clone(),
        ..Default::default()
    };
    check_window(p, dataset, &seg)
}

/// Before an aggregate: may these segments and splits be computed at all?
pub fn check_aggregate(p: &Policy, dataset: &str, parents: &[(Segment, Split)]) -> Result<(), AgentError> {
    for (seg, split) in parents {
        check_periods(p, dataset, seg)?;
        if let Split::Period { column, .. } = split
            && !p.allows_time_column(column)
        {
            return Err(not_a_time_column(dataset));
        }
    }
    if !p.expose_key_bounds {
        for (seg, split) in parents {
            if seg.has_key_bounds() || carries_keys(split) {
                return Err(deny(
                    dataset,
                    "expose_key_bounds",
                    "key values may not leave this zone; use bisection strategy hash",
                ));
            }
        }
    }
    Ok(())
}

/// Whether a split names key values (cut points) or answers with them (a quantile's
/// first keys): every new kind of split must say.
fn carries_keys(split: &Split) -> bool {
    match split {
        Split::Quantile(_) | Split::Cuts(_) | Split::Even(_) => true,
        Split::Whole | Split::Hash(_) | Split::Period { .. } => false,
    }
}

fn not_a_time_column(dataset: &str) -> AgentError {
    deny(
        dataset,
        "time_columns",
        "period splits and filters are served only on the columns this policy lists",
    )
}

/// A segment's period filter, if any, must be on a listed time column: its label is a
/// value of that column.
pub fn check_periods(p: &Policy, dataset: &str, seg: &Segment) -> Result<(), AgentError> {
    match &seg.period {
        Some(per) if !p.allows_time_column(&per.column) => Err(not_a_time_column(dataset)),
        _ => check_window(p, dataset, seg),
    }
}

/// A window filters by a column's values: counts under windows of moving bounds would
/// tell the coordinator when each row was written (or its sequence number), so a
/// window column must be one the policy lists in `time_columns`, as for periods.
pub fn check_window(p: &Policy, dataset: &str, seg: &Segment) -> Result<(), AgentError> {
    match &seg.window {
        Some(w) if !p.allows_time_column(&w.column) => Err(AgentError::Policy {
            dataset: dataset.to_string(),
            key: "time_columns",
            message: format!(
                "column {} is not listed in time_columns; a window may filter only by those",
                w.column
            ),
        }),
        _ => Ok(()),
    }
}

/// The parents of one aggregate must be pairwise disjoint: overlapping or nested
/// parents give a row's checksum by subtraction within a single reply. A coordinator
/// following the protocol never sends them, so this is a malformed request
/// (INVALID_ARGUMENT naming both fields), not a policy choice.
///
/// Two parents are disjoint when their periods are labels of the same column and
/// granularity that differ, or their key ranges are disjoint, or (for the same key
/// range) their hash ranges are. Parents with different key ranges that overlap are
/// refused whatever their hash ranges: the drill never sends those. O(n log n).
pub fn check_disjoint(parents: &[(Segment, Split)]) -> Result<(), AgentError> {
    let overlap = |i: usize, j: usize| {
        let (a, b) = (i.min(j), i.max(j));
        AgentError::InvalidArgument(format!(
            "segments[{b}]: overlaps segments[{a}]; the parents of one request must be disjoint"
        ))
    };
    // periods of one column and granularity with distinct labels never share a row;
    // anything else (no period, or mixed columns) is one class
    let mut classes: BTreeMap<Option<(String, String)>, Vec<usize>> = BTreeMap::new();
    let mut kinds = std::collections::BTreeSet::new();
    for (seg, _) in parents {
        kinds.insert(
            seg.period
                .as_ref()
                .map(|p| (p.column.to_ascii_lowercase(), p.granularity.name())),
        );
    }
    for (i, (seg, _)) in parents.iter().enumerate() {
        let class = match (&seg.period, kinds.len()) {
            (Some(p), 1) => Some((p.column.to_ascii_lowercase(), p.label.clone())),
            _ => None,
        };
        classes.entry(class).or_default().push(i);
    }
    for members in classes.values() {
        // group by exact key range; distinct key ranges must be disjoint
        let mut ranges: BTreeMap<(Lower<'_>, Upper<'_>), Vec<usize>> = BTreeMap::new();
        for &i in members {
            let s = &parents[i].0;
            ranges
                .entry((Lower(s.lower.as_ref()), Upper(s.upper.as_ref())))
                .or_default()
                .push(i);
        }
        let mut prev: Option<(&Upper<'_>, usize)> = None;
        for ((lower, upper), same) in &ranges {
            // ranges are sorted by lower bound: each must start at or after the end
            // of the one before (an empty range holds no rows and overlaps nothing)
            let empty = matches!((lower.0, upper.0), (Some(l), Some(u)) if l >= u);
            if !empty {
                if let Some((pu, pi)) = prev
                    && !starts_at_or_after(lower, pu)
                {
                    return Err(overlap(pi, same[0]));
                }
                prev = Some((upper, same[0]));
            }
            // one key range: its hash ranges must be disjoint (no hash range is all of it)
            let mut hashes: Vec<(u64, u64, usize)> = same
                .iter()
                .map(|&i| {
                    let (lo, hi) = parents[i].0.hash.unwrap_or((0, u64::MAX));
                    (lo, hi, i)
                })
                .collect();
            hashes.sort_unstable();
            for w in hashes.windows(2) {
                if w[1].0 < w[0].1 {
                    return Err(overlap(w[0].2, w[1].2));
                }
            }
        }
    }
    Ok(())
}

/// A lower key bound; absent is below every key.
#[derive(PartialEq, Eq)]
struct Lower<'a>(Option<&'a KeyTuple>);
/// An upper key bound; absent is above every key.
#[derive(PartialEq, Eq)]
struct Upper<'a>(Option<&'a KeyTuple>);

impl Ord for Lower<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        match (self.0, o.0) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(b),
        }
    }
}
impl PartialOrd for Lower<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Upper<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        match (self.0, o.0) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(a), Some(b)) => a.cmp(b),
        }
    }
}
impl PartialOrd for Upper<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Whether `[lower, ..)` starts at or after the end of `[.., upper)`.
fn starts_at_or_after(lower: &Lower<'_>, upper: &Upper<'_>) -> bool {
    match (lower.0, upper.0) {
        (Some(l), Some(u)) => l >= u,
        _ => false,
    }
}

/// Before RowDigests: a range of more than `max_digest_rows` rows is refused (the
/// caller counts it before any digest is sent). The message states no count.
pub fn check_digest_rows(p: &Policy, dataset: &str, rows: u64) -> Result<(), AgentError> {
    if rows > p.max_digest_rows {
        return Err(deny(
            dataset,
            "max_digest_rows",
            "this range holds more rows than one digest request may release; drill further first",
        ));
    }
    Ok(())
}

/// `rows_scanned` as reported: with a floor, rounded up to a multiple of
/// `min_segment_rows`, so it never states a count below the floor (0 stays 0: an
/// empty bucket is released as such anyway).
pub fn reported_rows_scanned(p: &Policy, rows: u64) -> u64 {
    match p.min_segment_rows {
        0 => rows,
        m => rows.div_ceil(m).saturating_mul(m),
    }
}

/// After an aggregate: refuses results with a non-empty bucket below `min_segment_rows`.
pub fn check_bucket_counts(
    p: &Policy,
    dataset: &str,
    counts: impl IntoIterator<Item = u64>,
) -> Result<(), AgentError> {
    if p.min_segment_rows > 0 && counts.into_iter().any(|n| n > 0 && n < p.min_segment_rows) {
        return Err(deny(
            dataset,
            "min_segment_rows",
            "a non-empty segment is below this dataset's floor; use a smaller factor or a larger threshold",
        ));
    }
    Ok(())
}

/// Row-level requests: digests and key reveals need `with_keys`, value reveals
/// `detailed` plus the spec's consent.
pub fn check_level(p: &Policy, dataset: &str, needed: PrivacyLevel, consent: bool) -> Result<(), AgentError> {
    if p.max_level < needed {
        return Err(deny(
            dataset,
            "max_level",
            format!(
                "this dataset releases at most {}, the request needs {needed}",
                p.max_level
            ),
        ));
    }
    if needed == PrivacyLevel::Detailed && !consent {
        return Err(AgentError::InvalidArgument(
            "detailed reveals need consent_acknowledged: true in the spec".into(),
        ));
    }
    Ok(())
}

/// Whether a column's values are masked.
pub fn is_masked(p: &Policy, column: &str) -> bool {
    p.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(column))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::segment::KeyPart;

    #[test]
    fn hidden_key_bounds_allow_only_hash_splits() {
        let p = Policy {
            expose_key_bounds: false,
            ..Policy::default()
        };
        assert!(check_aggregate(&p, "d", &[(Segment::whole(), Split::Hash(32))]).is_ok());
        let e = check_aggregate(&p, "d", &[(Segment::whole(), Split::Quantile(32))]).unwrap_err();
        assert!(
            e.to_string().contains("expose_key_bounds") && e.to_string().contains("dataset d"),
            "{e}"
        );
        let bounded = Segment {
            lower: Some(vec![KeyPart::Int(1)]),
            ..Segment::default()
        };
        assert!(check_aggregate(&p, "d", &[(bounded, Split::Whole)]).is_err());
    }

    /// An even split names its cut points as surely as their list does.
    #[test]
    fn hidden_key_bounds_refuse_an_even_split_as_they_do_its_cut_list() {
        let hidden = Policy {
            expose_key_bounds: false,
            ..Policy::default()
        };
        let e = tally_common::segment::EvenCuts::new(100, 50, 3).unwrap();
        for split in [Split::Even(e), Split::Cuts(e.cuts())] {
            let refused = check_aggregate(&hidden, "d", &[(Segment::whole(), split.clone())]).unwrap_err();
            assert!(
                refused.to_string().contains("expose_key_bounds"),
                "{split:?}: {refused}"
            );
            assert!(check_aggregate(&Policy::default(), "d", &[(Segment::whole(), split)]).is_ok());
        }
    }

    fn month(label: &str, lower: i64, upper: i64) -> (Segment, Split) {
        use tally_common::period::Granularity;
        let seg = Segment {
            lower: Some(vec![KeyPart::Int(lower)]),
            upper: Some(vec![KeyPart::Int(upper)]),
            period: Some(tally_common::segment::Period {
                column: "at".into(),
                granularity: Granularity::Month,
                label: label.into(),
            }),
            ..Segment::default()
        };
        (seg, Split::Quantile(4))
    }

    #[test]
    fn parents_of_distinct_periods_may_share_key_ranges() {
        // what the time drill sends below level 1: key ranges inside differing months
        assert!(check_disjoint(&[month("2024-01", 1, 50), month("2024-02", 1, 50)]).is_ok());
        assert!(check_disjoint(&[month("2024-01", 1, 50), month("2024-01", 50, 90)]).is_ok());
        // one month, overlapping key ranges
        let e = check_disjoint(&[month("2024-01", 1, 50), month("2024-01", 40, 90)]).unwrap_err();
        assert!(e.to_string().contains("segments[1]: overlaps segments[0]"), "{e}");
        // a parent without a period covers every period
        let whole = (month("", 1, 50).0, Split::Whole);
        let mut unperiod = whole.clone();
        unperiod.0.period = None;
        assert!(check_disjoint(&[month("2024-01", 1, 50), unperiod]).is_err());
        // an empty key range holds no rows and overlaps nothing
        let empty = (
            Segment {
                lower: Some(vec![KeyPart::Int(9)]),
                upper: Some(vec![KeyPart::Int(9)]),
                ..Segment::default()
            },
            Split::Whole,
        );
        let rest = (
            Segment {
                upper: Some(vec![KeyPart::Int(100)]),
                ..Segment::default()
            },
            Split::Whole,
        );
        assert!(check_disjoint(&[rest.clone(), empty]).is_ok());
        assert!(check_disjoint(&[rest.clone(), rest]).is_err());
    }

    #[test]
    fn levels_and_floors() {
        let p = Policy::default();
        assert!(
            check_level(&p, "d", PrivacyLevel::WithKeys, false)
                .unwrap_err()
                .to_string()
                .contains("max_level")
        );
        let p = Policy {
            max_level: PrivacyLevel::Detailed,
            min_segment_rows: 10,
            ..Policy::default()
        };
        assert!(check_level(&p, "d", PrivacyLevel::Detailed, false).is_err());
        assert!(check_level(&p, "d", PrivacyLevel::Detailed, true).is_ok());
        assert!(check_bucket_counts(&p, "d", [0, 10, 50]).is_ok());
        let e = check_bucket_counts(&p, "d", [0, 9]).unwrap_err().to_string();
        assert!(e.contains("min_segment_rows"), "{e}");
        assert!(
            !e.contains('9') && !e.contains("10"),
            "a refusal states a count: {e}"
        );
        assert_eq!(reported_rows_scanned(&p, 0), 0);
        assert_eq!(reported_rows_scanned(&p, 1), 10);
        assert_eq!(reported_rows_scanned(&p, 10), 10);
        assert_eq!(reported_rows_scanned(&p, 11), 20);
        assert_eq!(reported_rows_scanned(&Policy::default(), 7), 7);
    }
}
