//! Comparison mode `measures` (DESIGN §5): one level of a group_by hierarchy, computed
//! in the agent from one scan of the rows (in the request's window, in the groups of
//! the level above it asks for): per group, COUNT(*) and, per measure column, SUM, MIN
//! and MAX of its canonical values ([`tally_common::measures`]). Grouping by canonical
//! text, compared bytewise, puts a row in the same group on every engine, whatever
//! the database's collation; summing canonical text is exact and independent of the
//! order rows arrive in.
//!
//! What leaves: the groups' labels (the service checks the policy allows each
//! group_by column), their counts, each measure's values only where the policy lists
//! the column in `measures`, and always a digest keyed with the run's k_row, so the
//! coordinator learns whether the sides agree without learning the values.

use std::collections::{BTreeMap, HashSet};

use tally_common::TypeClass;
use tally_common::checksum::Hasher;
use tally_common::measures::MeasureAcc;
use tally_common::period::{Granularity, period_label};
use tally_common::segment::Segment;
use tally_common::wire::measures::{Labels, MeasureGroup, MeasureOut, MeasuresRequest, digest_input};

use crate::connector::Session;
use crate::dataset::{Bound, Dataset};
use crate::error::{AgentError, Result};

/// Groups one answer may hold: a level this fine should be split by a coarser one
/// first (a group_by level above it).
pub const MAX_GROUPS: usize = 100_000;

/// A request's columns found among the bound ones: each group_by level's column index
/// and granularity, each measure's column index and whether it goes out in clear.
#[derive(Debug)]
pub struct Plan {
    pub groups: Vec<(usize, Option<Granularity>)>,
    pub measures: Vec<(usize, bool)>,
}

impl Plan {
    /// `clear(column)`: whether the policy releases that measure's values;
    /// `key_private`: the policy keeps key values in the zone (`expose_key_bounds:
    /// false`), so no key column may label groups or be a measure (its MIN and MAX are
    /// key bounds).
    pub fn new(
        dataset: &str,
        b: &Bound,
        r: &MeasuresRequest,
        clear: impl Fn(&str) -> bool,
        key_private: bool,
    ) -> Result<Plan> {
        let key_col = |i: usize| {
            if key_private && i < b.key_len {
                return Err(AgentError::Policy {
                    dataset: dataset.to_string(),
                    key: "expose_key_bounds",
                    message: format!(
                        "key column {} may not label groups or be measured: key values stay in this zone",
                        b.cols[i].info.name
                    ),
                });
            }
            Ok(())
        };
        let find = |name: &str, what: &str| {
            b.cols
                .iter()
                .position(|c| c.spec.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    AgentError::InvalidArgument(format!("{what} {name:?} is not among the request's columns"))
                })
        };
        let mut groups = Vec::with_capacity(r.group_by.len());
        for g in &r.group_by {
            let i = find(&g.column, "group_by column")?;
            key_col(i)?;
            let class = b.cols[i].spec.format.class;
            if g.granularity.is_some()
                && !matches!(
                    class,
                    TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz
                )
            {
                return Err(AgentError::InvalidArgument(format!(
                    "dataset {dataset} column {} is compared as {class}: a period needs a date or timestamp",
                    g.column
                )));
            }
            groups.push((i, g.granularity));
        }
        let mut measures = Vec::with_capacity(r.measures.len());
        for m in &r.measures {
            let i = find(m, "measure")?;
            key_col(i)?;
            let f = b.cols[i].spec.format;
            if !matches!(
                f.class,
                TypeClass::Integer | TypeClass::Decimal | TypeClass::Float
            ) {
                return Err(AgentError::InvalidArgument(format!(
                    "dataset {dataset} column {m} is compared as {}: measures are integers, decimals or floats",
                    f.class
                )));
            }
            // refused before any row is read: a value too fine for exact sums must not
            // turn into an error that depends on the data
            if f.scale > tally_common::measures::MAX_SCALE {
                return Err(AgentError::InvalidArgument(format!(
                    "measure {m}: scale {} is above the {} fractional digits measures are summed at",
                    f.scale,
                    tally_common::measures::MAX_SCALE
                )));
            }
            measures.push((i, clear(&b.cols[i].info.name)));
        }
        Ok(Plan { groups, measures })
    }
}

/// The groups of one level, in label order, and the rows read.
pub async fn compute(
    ds: &Dataset,
    s: &mut Session,
    b: &Bound,
    h: &Hasher,
    r: &MeasuresRequest,
    plan: &Plan,
) -> Result<(Vec<MeasureGroup>, u64)> {
    let depth = plan.groups.len();
    let parents: HashSet<&[Option<String>]> = r.parents.iter().map(Vec::as_slice).collect();
    let seg = Segment {
        window: r.window.clone(),
        ..Default::default()
    };
    let mut acc: BTreeMap<Labels, (u64, Vec<MeasureAcc>)> = BTreeMap::new();
    let rows = ds
        .scan_segment(s, b, h, &seg, false, false, &mut |row, _| {
            let labels: Labels = plan
                .groups
                .iter()
                .map(|(i, g)| match g {
                    None => row.field(*i).map(str::to_string),
                    Some(g) => period_label(row.field(*i), *g),
                })
                .collect();
            if depth > 1 && !parents.contains(&labels[..depth - 1]) {
                return Ok(());
            }
            let n = acc.len();
            let entry = match acc.get_mut(&labels) {
                Some(e) => e,
                None if n >= MAX_GROUPS => {
                    return Err(AgentError::InvalidArgument(format!(
                        "more than {MAX_GROUPS} groups at this level: group by a coarser column first"
                    )));
                }
                None => acc
                    .entry(labels)
                    .or_insert_with(|| (0, vec![MeasureAcc::default(); plan.measures.len()])),
            };
            entry.0 += 1;
            for ((i, _), m) in plan.measures.iter().zip(entry.1.iter_mut()) {
                m.add(row.field(*i)).map_err(|e| AgentError::Canonical {
                    dataset: ds.name.clone(),
                    column: b.cols[*i].info.name.clone(),
                    message: format!("measure: {e}"),
                })?;
            }
            Ok(())
        })
        .await?;
    let groups = acc
        .into_iter()
        .map(|(labels, (count, accs))| {
            let measures = accs
                .iter()
                .zip(&plan.measures)
                .enumerate()
                .map(|(j, (a, (i, clear)))| {
                    let values = a.values();
                    let f = b.cols[*i].spec.format;
                    let form = format!("{}:{}", f.class, f.scale);
                    let digest = h.row(digest_input(j, &form, &labels, &values).as_bytes());
                    MeasureOut {
                        clear: clear.then_some(values),
                        digest,
                    }
                })
                .collect();
            MeasureGroup {
                labels,
                count,
                measures,
            }
        })
        .collect();
    Ok((groups, rows))
}
