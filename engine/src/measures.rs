//! Comparison mode `measures` in the engine (DESIGN §5): per group of a `group_by`
//! hierarchy, both sides' COUNT and SUM/MIN/MAX of the measure columns, one `Measures`
//! call per side per level; only the groups that diverge are split at the next level.
//! The tool to localise a difference that touches most rows (a broken backfill), where
//! bisection degenerates.
//!
//! A measure is compared in clear (exactly, or within its tolerance) where both
//! agents' policies release it, and by its sealed digest (equality only) otherwise.
//! Fail closed: on each side the children of a diverging group must add up to its
//! count, and at least one of them must diverge; a parent for which either fails is
//! reported as an inconsistent group, never dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_common::TypeClass;
use tally_common::measures::{Agreement, Dec, MeasureValues, agree};
use tally_common::period::Granularity;
use tally_common::segment::ColumnSpec;
use tally_common::wire::measures::{
    GroupBy, Labels, MAX_PARENTS, MeasureGroup, MeasuresRequest, MeasuresResponse,
};

use super::{Command, Engine, Out, Side, Step};
use crate::error::RunError;
use crate::result::{GroupLabel, GroupOut, GroupSide, LevelOut, MeasureShown, Verdict};
use crate::spec::{GroupBySpec, Spec};

/// A group_by level or a measure, resolved: its name on each side.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Named {
    source: String,
    target: String,
    format: tally_common::FieldFormat,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct MeasuresPhase {
    levels: Vec<(Named, Option<Granularity>)>,
    measures: Vec<Named>,
    /// Measures both agents release in clear.
    clear: Vec<bool>,
    /// The level asked (1 is the top of the hierarchy) and the groups it splits.
    level: u32,
    parents: Vec<Labels>,
    /// Each parent's count and clear values at the level above, per side.
    parent_counts: BTreeMap<Labels, ParentTotals>,
    source: Option<(MeasuresResponse, u64)>,
    target: Option<(MeasuresResponse, u64)>,
    tolerated: Vec<GroupOut>,
    inconsistent: Vec<GroupOut>,
    tolerated_total: u64,
}

/// A diverging group as its children must account for it, per side (0 source, 1
/// target): its row count, and per measure its clear values where the side gave them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ParentTotals {
    count: [u64; 2],
    values: Vec<[Option<MeasureValues>; 2]>,
}

/// One side's added-up clear values of one measure: the non-NULL count, the specials'
/// counts and the finite sum.
type Added = (u64, [u64; 3], Option<Dec>);

/// The children of one parent, added up per side.
#[derive(Debug, Clone, Default)]
struct ChildTotals {
    count: [u64; 2],
    /// Per measure and side, or `None` once a child gave no clear values (then that
    /// measure is not checked on that side).
    values: Vec<[Option<Added>; 2]>,
    any_differs: bool,
}

impl ChildTotals {
    fn new(measures: usize) -> ChildTotals {
        ChildTotals {
            values: vec![[Some((0, [0; 3], None)), Some((0, [0; 3], None))]; measures],
            ..Default::default()
        }
    }

    fn add(&mut self, side: usize, g: &MeasureGroup) {
        self.count[side] += g.count;
        for (j, slot) in self.values.iter_mut().enumerate() {
            let acc = &mut slot[side];
            let next = match (acc.take(), g.measures.get(j).and_then(|m| m.clear.as_ref())) {
                (Some((n, sp, sum)), Some(v)) => {
                    let add = v.sum.as_deref().map(Dec::parse);
                    match (sum, add) {
                        (_, Some(None)) => None,
                        (s, None) => Some(s),
                        (None, Some(Some(d))) => Some(Some(d)),
                        (Some(s), Some(Some(d))) => s.checked_add(d).map(Some),
                    }
                    .map(|sum| {
                        (
                            n + v.non_null,
                            [sp[0] + v.nan, sp[1] + v.pos_inf, sp[2] + v.neg_inf],
                            sum,
                        )
                    })
                }
                _ => None,
            };
            *acc = next;
        }
    }

    /// Whether they add up to `p` (counts always; clear values where both are known).
    fn account_for(&self, p: &ParentTotals) -> Result<(), String> {
        for side in 0..2 {
            if self.count[side] != p.count[side] {
                return Err(
                    "its children's row counts do not add up to it: rows changed between the levels".into(),
                );
            }
            for (j, (c, pv)) in self.values.iter().zip(&p.values).enumerate() {
                let (Some((n, sp, sum)), Some(v)) = (&c[side], &pv[side]) else {
                    continue;
                };
                let psum = v.sum.as_deref().and_then(Dec::parse);
                let sums_equal = match (sum, psum) {
                    (None, None) => v.sum.is_none(),
                    (Some(a), Some(b)) => a.cmp_exact(b) == Some(std::cmp::Ordering::Equal),
                    _ => false,
                };
                if *n != v.non_null || *sp != [v.nan, v.pos_inf, v.neg_inf] || !sums_equal {
                    return Err(format!(
                        "its children's values of measure {j} do not add up to it: rows changed between the levels"
                    ));
                }
            }
        }
        if !self.any_differs {
            return Err(
                "none of its children differs beyond tolerance: differences within tolerance add up across its \
                 children, or rows changed between the levels"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A spec in mode measures compares its group_by and measure columns: unless it lists
/// `columns`, only those are resolved (so a column without a canonical form elsewhere
/// in the table does not stop it).
pub fn resolve_spec(spec: &Spec) -> Spec {
    let mut s = spec.clone();
    if s.columns.is_empty() {
        for c in spec
            .group_by
            .iter()
            .map(GroupBySpec::column)
            .chain(spec.measures.iter().map(String::as_str))
        {
            if !s.columns.iter().any(|x: &String| x.eq_ignore_ascii_case(c)) {
                s.columns.push(c.to_string());
            }
        }
        s.columns
            .retain(|c| !spec.key.iter().any(|k| k.eq_ignore_ascii_case(c)));
    }
    s
}

fn labels_out(levels: &[(Named, Option<Granularity>)], labels: &Labels) -> Vec<GroupLabel> {
    levels
        .iter()
        .zip(labels)
        .map(|((n, g), v)| GroupLabel {
            column: n.source.clone(),
            granularity: g.map(|g| g.name().to_string()),
            value: v.clone(),
        })
        .collect()
}

impl Engine {
    fn measures(&mut self) -> &mut MeasuresPhase {
        self.measures.as_mut().expect("in mode measures")
    }

    /// After the seal: resolves the group_by and measure columns and asks level 1.
    pub(super) fn begin_measures(&mut self, out: &mut Out) -> Step {
        let r = self.resolved.as_ref().expect("resolved");
        if !r.method.is_sealed() {
            return Err(RunError::Config(
                "mode measures compares measures a policy does not release by sealed digests: both agents need \
                 zone keys (hash: auto or a sealed method)"
                    .into(),
            )
            .into());
        }
        let find = |name: &str, what: &str| {
            r.columns
                .iter()
                .find(|c| c.source_name.eq_ignore_ascii_case(name))
                .map(|c| Named {
                    source: c.source_name.clone(),
                    target: c.target_name.clone(),
                    format: c.format,
                })
                .ok_or_else(|| {
                    RunError::Config(format!(
                        "{what} {name} is not a column both sides have and compare ({})",
                        r.columns
                            .iter()
                            .map(|c| c.source_name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })
        };
        let mut levels = Vec::new();
        for g in &self.spec.group_by {
            let n = find(g.column(), "group_by column")?;
            if g.granularity().is_some()
                && !matches!(
                    n.format.class,
                    TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz
                )
            {
                return Err(RunError::Config(format!(
                    "group_by {}: a granularity needs a date or timestamp column; it compares as {}",
                    n.source, n.format.class
                ))
                .into());
            }
            levels.push((n, g.granularity()));
        }
        let mut measures = Vec::new();
        for m in &self.spec.measures {
            let n = find(m, "measure")?;
            if !matches!(
                n.format.class,
                TypeClass::Integer | TypeClass::Decimal | TypeClass::Float
            ) {
                return Err(RunError::Config(format!(
                    "measure {m} compares as {}; measures are integer, decimal or float columns",
                    n.format.class
                ))
                .into());
            }
            measures.push(n);
        }
        let (s, t) = self.described.as_ref().expect("described");
        let lists =
            |d: &tally_common::wire::Describe, c: &str| d.measures.iter().any(|m| m.eq_ignore_ascii_case(c));
        let clear: Vec<bool> = measures
            .iter()
            .map(|n| lists(s, &n.source) && lists(t, &n.target))
            .collect();
        for (n, c) in measures.iter().zip(&clear) {
            if !c && self.spec.tolerance_of(&n.source).is_some() {
                return Err(RunError::Config(format!(
                    "tolerance.{}: the measure is compared by sealed digest (equality only), as {} does not list it \
                     in its policy measures; list it on both agents or drop the tolerance",
                    n.source,
                    if lists(s, &n.source) { &self.agents.1 } else { &self.agents.0 }
                ))
                .into());
            }
        }
        self.say(
            out,
            format!(
                "measures: {} levels ({}), measures {} ({} in clear, the others by sealed digest)",
                levels.len(),
                levels
                    .iter()
                    .map(|(n, g)| match g {
                        Some(g) => format!("{} by {}", n.source, g.name()),
                        None => n.source.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(" > "),
                if measures.is_empty() {
                    "none (counts only)".to_string()
                } else {
                    measures
                        .iter()
                        .map(|n| n.source.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                clear.iter().filter(|c| **c).count()
            ),
        );
        self.measures = Some(MeasuresPhase {
            levels,
            measures,
            clear,
            level: 1,
            parents: Vec::new(),
            parent_counts: BTreeMap::new(),
            source: None,
            target: None,
            tolerated: Vec::new(),
            inconsistent: Vec::new(),
            tolerated_total: 0,
        });
        self.ask_measures(out)
    }

    /// The measures spec to run when a drill degenerates: group_by columns both
    /// agents' policies allow (group_columns, then a time column by day), and the
    /// numeric compared columns as measures.
    pub(super) fn measures_suggestion(&self) -> String {
        let (Some((s, t)), Some(r)) = (self.described.as_ref(), self.resolved.as_ref()) else {
            return "run the spec with mode: measures".into();
        };
        let compared = &r.columns[r.key_len..];
        let both = |pick: fn(&tally_common::wire::Describe) -> &Vec<String>| -> Vec<&crate::resolve::ResolvedColumn> {
            compared
                .iter()
                .filter(|c| {
                    pick(s).iter().any(|x| x.eq_ignore_ascii_case(&c.source_name))
                        && pick(t).iter().any(|x| x.eq_ignore_ascii_case(&c.target_name))
                })
                .collect()
        };
        let mut group_by: Vec<String> = both(|d| &d.group_columns)
            .iter()
            .take(2)
            .map(|c| c.source_name.clone())
            .collect();
        if let Some(c) = both(|d| &d.time_columns).into_iter().find(|c| {
            matches!(
                c.format.class,
                TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz
            )
        }) {
            group_by.push(format!("{{ column: {}, granularity: day }}", c.source_name));
        }
        let measures: Vec<&str> = compared
            .iter()
            .filter(|c| {
                matches!(
                    c.format.class,
                    TypeClass::Integer | TypeClass::Decimal | TypeClass::Float
                )
            })
            .take(4)
            .map(|c| c.source_name.as_str())
            .collect();
        if group_by.is_empty() {
            return format!(
                "run it with mode: measures, grouped by a column both agents list in their policy group_columns (or a \
                 date in time_columns), measures: [{}]",
                measures.join(", ")
            );
        }
        format!(
            "run `mode: measures`, `group_by: [{}]`, `measures: [{}]` (docs/measures.md), then reconcile the diverging \
             groups",
            group_by.join(", "),
            measures.join(", ")
        )
    }

    fn measures_request(&self, side: Side) -> MeasuresRequest {
        let r = self.resolved.as_ref().expect("resolved");
        let m = self.measures.as_ref().expect("in mode measures");
        let name = |n: &Named| match side {
            Side::Source => n.source.clone(),
            Side::Target => n.target.clone(),
        };
        let mut columns: Vec<ColumnSpec> = self.columns(side)[..r.key_len].to_vec();
        for n in m.levels[..m.level as usize]
            .iter()
            .map(|(n, _)| n)
            .chain(&m.measures)
        {
            if !columns.iter().any(|c| c.name.eq_ignore_ascii_case(&name(n))) {
                columns.push(ColumnSpec {
                    name: name(n),
                    format: n.format,
                });
            }
        }
        MeasuresRequest {
            dataset: self.dataset(side),
            columns,
            key_len: r.key_len,
            group_by: m.levels[..m.level as usize]
                .iter()
                .map(|(n, g)| GroupBy {
                    column: name(n),
                    granularity: *g,
                })
                .collect(),
            measures: m.measures.iter().map(name).collect(),
            parents: m.parents.clone(),
            window: self.window.clone(),
            method: r.method,
            seal: self.seal(side),
            run_id: String::new(),
            side: None,
        }
    }

    fn ask_measures(&mut self, out: &mut Out) -> Step {
        let level = self.measures().level;
        if let Some(max) = self.spec.gates.max_queries
            && self.res.source.queries.max(self.res.target.queries) + 1 > max
        {
            return Err(RunError::Gate {
                gate: "max_queries",
                message: format!(
                    "level {level} would send query {} to each side, the gate allows {max}",
                    self.res.source.queries + 1
                ),
            }
            .into());
        }
        for side in [Side::Source, Side::Target] {
            let request = self.measures_request(side);
            self.ask(out, Command::Measures { level, side, request });
        }
        Ok(())
    }

    pub(super) fn on_measured(
        &mut self,
        out: &mut Out,
        level: u32,
        side: Side,
        response: MeasuresResponse,
        elapsed_ms: u64,
    ) -> Step {
        let m = self.measures();
        if level != m.level {
            return Err(
                RunError::Internal(format!("measures of level {level} while at level {}", m.level)).into(),
            );
        }
        match side {
            Side::Source => m.source = Some((response, elapsed_ms)),
            Side::Target => m.target = Some((response, elapsed_ms)),
        }
        match side {
            Side::Source => self.res.source.queries += 1,
            Side::Target => self.res.target.queries += 1,
        }
        let m = self.measures();
        if m.source.is_none() || m.target.is_none() {
            return Ok(());
        }
        self.compare_measures(out)
    }

    /// Both sides of a level are in: compare, then descend or finish.
    fn compare_measures(&mut self, out: &mut Out) -> Step {
        let agents = self.agents.clone();
        let tolerances: Vec<_> = {
            let m = self.measures.as_ref().expect("in mode measures");
            m.measures
                .iter()
                .map(|n| self.spec.tolerance_of(&n.source))
                .collect()
        };
        let m = self.measures();
        let (s, s_ms) = m.source.take().expect("source in");
        let (t, t_ms) = m.target.take().expect("target in");
        let level = m.level;
        let depth = m.levels.len() as u32;
        let n_measures = m.measures.len();
        // every group has the level's labels and every measure, once per side
        let index = |r: &MeasuresResponse, agent: &str| -> Result<BTreeMap<Labels, MeasureGroup>, RunError> {
            let mut map = BTreeMap::new();
            for g in &r.groups {
                if g.labels.len() != level as usize || g.measures.len() != n_measures {
                    return Err(RunError::MalformedAnswer {
                        agent: agent.to_string(),
                        rpc: "Measures".into(),
                        message: format!(
                            "a group with {} labels and {} measures",
                            g.labels.len(),
                            g.measures.len()
                        ),
                    });
                }
                if level > 1 && !m.parent_counts.contains_key(&g.labels[..level as usize - 1]) {
                    return Err(RunError::MalformedAnswer {
                        agent: agent.to_string(),
                        rpc: "Measures".into(),
                        message: "a group outside the groups asked for".into(),
                    });
                }
                if map.insert(g.labels.clone(), g.clone()).is_some() {
                    return Err(RunError::MalformedAnswer {
                        agent: agent.to_string(),
                        rpc: "Measures".into(),
                        message: "a group listed twice".into(),
                    });
                }
            }
            Ok(map)
        };
        let (sm, tm) = (index(&s, &agents.0)?, index(&t, &agents.1)?);
        let mut keys: Vec<&Labels> = sm.keys().chain(tm.keys()).collect();
        keys.sort();
        keys.dedup();
        let empty = MeasureGroup {
            labels: Vec::new(),
            count: 0,
            measures: Vec::new(),
        };
        let mut diverging: Vec<GroupOut> = Vec::new();
        let mut children: BTreeMap<Labels, ChildTotals> = BTreeMap::new();
        for labels in &keys {
            let (a, b) = (
                sm.get(*labels).unwrap_or(&empty),
                tm.get(*labels).unwrap_or(&empty),
            );
            let name = |j: &usize| m.measures[*j].source.clone();
            // a group on one side only differs by its count; its measures say no more
            let (differing, tolerated): (Vec<String>, Vec<String>) =
                if sm.contains_key(*labels) && tm.contains_key(*labels) {
                    let (d, tol) = compare_group(a, b, &tolerances);
                    let mut differing: Vec<String> = (a.count != b.count)
                        .then(|| "count".to_string())
                        .into_iter()
                        .collect();
                    differing.extend(d.iter().map(name));
                    (differing, tol.iter().map(name).collect())
                } else {
                    (vec!["count".to_string()], Vec::new())
                };
            if level > 1 {
                let c = children
                    .entry(labels[..level as usize - 1].to_vec())
                    .or_insert_with(|| ChildTotals::new(n_measures));
                c.add(0, a);
                c.add(1, b);
                c.any_differs |= !differing.is_empty();
            }
            if differing.is_empty() && tolerated.is_empty() {
                continue;
            }
            // a value is shown only where both sides release it (and were compared in clear)
            let side = |g: &MeasureGroup| GroupSide {
                count: g.count,
                measures: m
                    .measures
                    .iter()
                    .enumerate()
                    .map(|(j, n)| {
                        let values = g
                            .measures
                            .get(j)
                            .and_then(|x| x.clear.clone())
                            .filter(|_| m.clear[j]);
                        MeasureShown {
                            name: n.source.clone(),
                            sealed: values.is_none(),
                            values,
                        }
                    })
                    .collect(),
            };
            let out = GroupOut {
                level,
                group: labels_out(&m.levels, labels),
                source: side(a),
                target: side(b),
                differing,
                tolerated,
                inconsistent: false,
                reason: None,
            };
            if out.differing.is_empty() {
                m.tolerated_total += 1;
                m.tolerated.push(out);
            } else {
                diverging.push(out);
            }
        }
        // fail closed: each diverging parent is accounted for by its children
        let mut inconsistent = 0;
        if level > 1 {
            let parents = std::mem::take(&mut m.parent_counts);
            for (p, totals) in parents {
                let none = ChildTotals::new(n_measures);
                if let Err(reason) = children.get(&p).unwrap_or(&none).account_for(&totals) {
                    inconsistent += 1;
                    let [ps, pt] = totals.count;
                    m.inconsistent.push(GroupOut {
                        level: level - 1,
                        group: labels_out(&m.levels, &p),
                        source: GroupSide {
                            count: ps,
                            measures: Vec::new(),
                        },
                        target: GroupSide {
                            count: pt,
                            measures: Vec::new(),
                        },
                        differing: vec!["count".into()].into_iter().filter(|_| ps != pt).collect(),
                        tolerated: Vec::new(),
                        inconsistent: true,
                        reason: Some(reason),
                    });
                }
            }
        }
        let level_out = LevelOut {
            level,
            segments: keys.len(),
            differing: diverging.len(),
            inconsistent,
            elapsed_ms: s_ms.max(t_ms),
        };
        if level == 1 {
            self.res.source.count = Some(s.groups.iter().map(|g| g.count).sum());
            self.res.target.count = Some(t.groups.iter().map(|g| g.count).sum());
        }
        self.res.source.rows_scanned = self.res.source.rows_scanned.saturating_add(s.rows_scanned);
        self.res.target.rows_scanned = self.res.target.rows_scanned.saturating_add(t.rows_scanned);
        self.segments_compared += keys.len() as u64;
        self.say(
            out,
            format!(
                "measures level {level}: {} groups, {} diverge{}",
                keys.len(),
                diverging.len(),
                if inconsistent > 0 {
                    format!(", {inconsistent} inconsistent parents")
                } else {
                    String::new()
                }
            ),
        );
        self.res.levels.push(level_out.clone());
        out.push(Command::LevelDone { level_out });
        let m = self.measures();
        if diverging.is_empty() || level == depth {
            return self.measures_done(out, diverging);
        }
        if diverging.len() > MAX_PARENTS {
            self.res.warnings.push(format!(
                "{} groups diverge at level {level}, more than the {MAX_PARENTS} one request may split: the \
                 groups of level {level} are reported",
                diverging.len()
            ));
            return self.measures_done(out, diverging);
        }
        m.parent_counts = diverging
            .iter()
            .map(|g| {
                let labels: Labels = g.group.iter().map(|l| l.value.clone()).collect();
                let clear = |r: &BTreeMap<Labels, MeasureGroup>, j: usize| {
                    r.get(&labels)
                        .and_then(|x| x.measures.get(j))
                        .and_then(|x| x.clear.clone())
                };
                let totals = ParentTotals {
                    count: [g.source.count, g.target.count],
                    values: (0..n_measures).map(|j| [clear(&sm, j), clear(&tm, j)]).collect(),
                };
                (labels, totals)
            })
            .collect();
        m.parents = m.parent_counts.keys().cloned().collect();
        m.level += 1;
        // each level reads the window again: the next one as much as this one
        if let Some(max) = self.spec.gates.max_rows_scanned {
            let next = self.res.source.rows_scanned.max(self.res.target.rows_scanned)
                + s.rows_scanned.max(t.rows_scanned);
            if next > max {
                return Err(RunError::Gate {
                    gate: "max_rows_scanned",
                    message: format!(
                        "level {} would bring the rows read to about {next} per side, the gate allows {max}",
                        level + 1
                    ),
                }
                .into());
            }
        }
        self.ask_measures(out)
    }

    fn measures_done(&mut self, out: &mut Out, diverging: Vec<GroupOut>) -> Step {
        let limit = self.spec.reporting.sample_limit as usize;
        let m = self.measures.take().expect("in mode measures");
        let differ = !diverging.is_empty() || !m.inconsistent.is_empty();
        if !differ {
            self.res.warnings.push(
                "mode measures compared per-group totals: equal counts, sums, minima and maxima do not prove equal \
                 rows (values swapped within a group, or changes that cancel out, keep them); run mode checksum to \
                 prove that"
                    .into(),
            );
        }
        let mut groups: Vec<GroupOut> = m.inconsistent;
        groups.extend(diverging);
        if m.tolerated_total > 0 {
            self.res.warnings.push(format!(
                "{} groups differ only within their measures' tolerance: they count as agreeing",
                m.tolerated_total
            ));
        }
        groups.extend(m.tolerated);
        if groups.len() > limit {
            self.res.truncated = true;
            self.res.warnings.push(format!(
                "{} groups are listed of {}: reporting.sample_limit",
                limit,
                groups.len()
            ));
            groups.truncate(limit);
        }
        self.res.groups = Some(groups);
        self.res.tolerated_groups = Some(m.tolerated_total);
        self.res.verdict = if differ { Verdict::Differ } else { Verdict::Match };
        out.extend(self.finish());
        Ok(())
    }
}

/// How the two sides of one group compare: the measures (by index) that differ beyond
/// their tolerance, and those that differ within it; the count is compared by the
/// caller. A measure is compared in clear where both answers give its values, by its
/// sealed digest otherwise. `tally verify` judges a bundle's level 1 with this too.
pub fn compare_group(
    a: &MeasureGroup,
    b: &MeasureGroup,
    tolerances: &[Option<tally_common::measures::Tolerance>],
) -> (Vec<usize>, Vec<usize>) {
    let (mut differing, mut tolerated) = (Vec::new(), Vec::new());
    for (j, tol) in tolerances.iter().enumerate() {
        let verdict = match (a.measures.get(j), b.measures.get(j)) {
            (Some(x), Some(y)) => match (&x.clear, &y.clear) {
                _ if x.digest == y.digest => Agreement::Equal,
                (Some(u), Some(v)) => values_agree(u, v, *tol),
                _ => Agreement::Differ,
            },
            // a measure missing from an answer agrees with nothing
            _ => Agreement::Differ,
        };
        match verdict {
            Agreement::Equal => {}
            Agreement::Tolerated => tolerated.push(j),
            Agreement::Differ => differing.push(j),
        }
    }
    (differing, tolerated)
}

/// Two clear values of one measure: the non-NULL count exactly, SUM, MIN and MAX each
/// exactly or within the tolerance; the worst of them.
fn values_agree(
    a: &MeasureValues,
    b: &MeasureValues,
    tol: Option<tally_common::measures::Tolerance>,
) -> Agreement {
    if a.non_null != b.non_null {
        return Agreement::Differ;
    }
    let parts = [
        agree(a.sum.as_deref(), b.sum.as_deref(), tol),
        agree(a.min.as_deref(), b.min.as_deref(), tol),
        agree(a.max.as_deref(), b.max.as_deref(), tol),
    ];
    if parts.contains(&Agreement::Differ) {
        Agreement::Differ
    } else if parts.contains(&Agreement::Tolerated) {
        Agreement::Tolerated
    } else {
        Agreement::Equal
    }
}
