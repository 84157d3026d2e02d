//! The engine up to the rows phase: resolve, seals, the drill level by level with its
//! gates, and investigation SQL for the leaves.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tally_common::TypeClass;
use tally_common::checksum::AnyAggregate;
use tally_common::period::Granularity;
use tally_common::seal::NONCE_LEN;
use tally_common::segment::{KeyTuple, Segment, Split};
use tally_common::wire::{AggregateRequest, AggregateResponse, Describe, InvestigationSqlRequest, Seal};

use super::{Command, Engine, Out, Seals, Side, Step};
use crate::error::RunError;
use crate::planner::{BucketResult, LevelPlan, PlanParams, Planner, Stop, first_level_factor};
use crate::resolve::{check_policies, resolve};
use crate::result::{AggOut, LeafOut, LevelOut, SqlPair, Verdict};
use crate::spec::{Mode, Strategy};

/// Investigation SQL is fetched for at most this many leaves.
pub(super) const MAX_LEAVES_WITH_SQL: usize = 100;

/// Leaves (and rows-phase ranges) whose calls are in flight at once: 8 measured faster
/// than 4 or 16 at 1M rows (docs/performance.md).
pub(super) const LEAVES_IN_FLIGHT: usize = 8;

/// Leaves whose investigation SQL is asked at once: rendering SQL reads no rows (a
/// describe per call), so the phase is bound by round trips; the agents' connection
/// slots still bound what runs on each database at once.
const SQL_IN_FLIGHT: usize = 32;

/// The level being asked: its plan and the answers so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LevelInFlight {
    plan: LevelPlan,
    source: Option<(AggregateResponse, u64)>,
    target: Option<(AggregateResponse, u64)>,
}

/// Investigation SQL of the first leaves, a few leaves in flight at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SqlPhase {
    total: usize,
    asked: usize,
    done: usize,
    partial: BTreeMap<usize, (Option<String>, Option<String>)>,
}

/// The union of both sides' integer key ranges, where both agents report one.
fn int_range(s: &Describe, t: &Describe) -> Option<(i64, i64)> {
    let (s, t) = (s.int_key_range()?, t.int_key_range()?);
    Some((s.0.min(t.0), s.1.max(t.1)))
}

/// Both sides' key histogram bounds together (ascending, each once), where both
/// report an integer key range; empty otherwise.
fn key_histogram(s: &Describe, t: &Describe) -> Vec<i64> {
    if int_range(s, t).is_none() {
        return Vec::new();
    }
    let mut v: Vec<i64> = s.key_histogram.iter().chain(&t.key_histogram).copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn agg_out(a: &AnyAggregate) -> AggOut {
    AggOut {
        count: a.count(),
        checksum: format!("{:016x}", a.sum()),
        xor: a.xor().map(|x| format!("{x:016x}")),
    }
}

fn gate(gate: &'static str, message: String) -> RunError {
    RunError::Gate { gate, message }
}

impl Engine {
    pub(super) fn on_described(&mut self, out: &mut Out, s: Describe, t: Describe) -> Step {
        let spec = &self.spec;
        self.res.source.engine = Some(format!("{} {}", s.engine, s.engine_version));
        self.res.target.engine = Some(format!("{} {}", t.engine, t.engine_version));
        check_policies(spec, [(&self.agents.0, &s), (&self.agents.1, &t)])?;
        let resolved = if spec.mode == Mode::Measures {
            resolve(&super::measures::resolve_spec(spec), &s, &t)?
        } else {
            resolve(spec, &s, &t)?
        };
        self.res.hash_method = resolved.method.name().to_string();
        self.res.xor_compared = resolved.xor;
        self.res.warnings = resolved.warnings.clone();
        self.res.fidelity = resolved.fidelity.clone();
        if resolved.hash_bisection {
            self.res.strategy = Strategy::Hash.name().to_string();
        }
        // agents' numbers: an estimate near u64::MAX must trip the gate, not wrap past it
        let estimate = s.row_estimate.saturating_add(t.row_estimate);
        self.say(
            out,
            format!(
                "resolved {} key + {} compared columns, {}; estimated scan {} + {} rows (catalog estimates)",
                resolved.key_len,
                resolved.columns.len() - resolved.key_len,
                resolved.method,
                s.row_estimate,
                t.row_estimate
            ),
        );
        if let Some(max) = spec.gates.max_rows_scanned
            && estimate > max
        {
            return Err(gate(
                "max_rows_scanned",
                format!("the first level would read about {estimate} rows, the gate allows {max}"),
            )
            .into());
        }
        super::watermark::check_watermarks(&self.spec, &self.agents, &s, &t)?;
        self.resolved = Some(resolved);
        self.described = Some((s, t));
        match self.spec.column_window() {
            // the bound is the clock minus the lag: read once, recorded, fixed
            Some((_, w)) if w.lag.is_some() => {
                self.window_column()?;
                self.ask(out, Command::ReadClock);
                Ok(())
            }
            Some(_) => {
                self.fix_window(out, None)?;
                self.after_window(out)
            }
            None => self.after_window(out),
        }
    }

    pub(super) fn on_clock(&mut self, out: &mut Out, unix_ms: i64) -> Step {
        self.fix_window(out, Some(unix_ms))?;
        self.after_window(out)
    }

    /// After the window is fixed: the sides' positions aligned (a watermark), then
    /// the seal, then the drill.
    pub(super) fn after_window(&mut self, out: &mut Out) -> Step {
        if !self.positions_synced(0) {
            self.sync_positions(out, 0);
            return Ok(());
        }
        let sealed = self.resolved.as_ref().expect("resolved").method.is_sealed();
        if sealed {
            self.ask(out, Command::DrawNonce);
            Ok(())
        } else {
            self.begin_comparing(out)
        }
    }

    /// The window's column among the resolved ones (key or compared), and its class.
    fn window_column(&self) -> Result<(String, TypeClass), RunError> {
        let (column, _) = self.spec.column_window().expect("a window column");
        let r = self.resolved.as_ref().expect("resolved");
        let c = r
            .columns
            .iter()
            .find(|c| c.source_name.eq_ignore_ascii_case(column))
            .ok_or_else(|| {
                RunError::Config(format!(
                    "window.column {} is not among the compared columns ({}): a window filters by the \
                     column's canonical value, so both sides must have and compare it",
                    column,
                    r.columns
                        .iter()
                        .map(|c| c.source_name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        match c.format.class {
            TypeClass::Integer | TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz => {
                Ok((c.source_name.clone(), c.format.class))
            }
            other => Err(RunError::Config(format!(
                "window.column {column} is compared as {other}; a window needs an integer, date or timestamp column",
            ))),
        }
    }

    /// Fixes the run's window from `as_of`, or from the clock (`now_ms`) minus `lag`.
    fn fix_window(&mut self, out: &mut Out, now_ms: Option<i64>) -> Step {
        let w = self.spec.window.clone().expect("a window");
        let (column, class) = self.window_column()?;
        let (s, _) = self.described.as_ref().expect("described");
        let upper = window_upper(&w, class, now_ms, &s.time_zone)?;
        self.say(
            out,
            match &w.lag {
                Some(l) => format!("window: {column} <= {upper} (the clock minus {l}, fixed for the run)"),
                None => format!("window: {column} <= {upper}"),
            },
        );
        self.res.window = Some(crate::result::WindowOut {
            column: column.clone(),
            upper: upper.clone(),
            lag: w.lag.clone(),
        });
        self.window = Some(tally_common::segment::Window { column, upper });
        Ok(())
    }

    /// resolve checked that both sides offer a zone key for a sealed method.
    pub(super) fn on_nonce(&mut self, out: &mut Out, nonce: [u8; NONCE_LEN]) -> Step {
        let (s, t) = self.described.as_ref().expect("described before the nonce");
        let zone_key = |d: &Describe| {
            d.zone_key.clone().ok_or_else(|| {
                RunError::Internal(format!("dataset {} has no zone key to seal with", d.dataset))
            })
        };
        self.seals = Some(Seals {
            source: Seal {
                nonce,
                peer: zone_key(t)?,
                peer_dataset: self.spec.target.dataset.clone(),
            },
            target: Seal {
                nonce,
                peer: zone_key(s)?,
                peer_dataset: self.spec.source.dataset.clone(),
            },
        });
        self.begin_comparing(out)
    }

    /// The drill, or in mode measures the group hierarchy.
    fn begin_comparing(&mut self, out: &mut Out) -> Step {
        if self.spec.mode == Mode::Measures {
            self.begin_measures(out)
        } else {
            self.begin_drill(out)
        }
    }

    fn begin_drill(&mut self, out: &mut Out) -> Step {
        let (s, t) = self.described.as_ref().expect("described before the drill");
        let b = &self.spec.bisection;
        let hashed = self.resolved.as_ref().is_some_and(|r| r.hash_bisection);
        let params = PlanParams {
            strategy: if hashed { Strategy::Hash } else { b.strategy },
            factor: b.factor,
            threshold: b.threshold,
            depth: b.depth,
            counts_only: self.spec.mode == Mode::Count,
            max_leaves: self.spec.gates.max_leaves,
            time: self.time_split()?,
            int_range: int_range(s, t),
            key_histogram: key_histogram(s, t),
            first_factor: first_level_factor(s.row_estimate.max(t.row_estimate), b.threshold, b.factor),
            window: self.window.clone(),
        };
        self.planner = Some(Planner::new(params));
        self.next_level(out)
    }

    /// Strategy time: the period column (it must be compared, as a date or timestamp).
    fn time_split(&self) -> Result<Option<(String, Granularity)>, RunError> {
        let b = &self.spec.bisection;
        let (Strategy::Time, Some(column)) = (b.strategy, &b.time_column) else {
            return Ok(None);
        };
        let r = self.resolved.as_ref().expect("resolved");
        let c = r.columns[r.key_len..]
            .iter()
            .find(|c| c.source_name.eq_ignore_ascii_case(column))
            .ok_or_else(|| {
                RunError::Config(format!(
                    "bisection.time_column {column} is not among the compared columns ({})",
                    r.compared_names().join(", ")
                ))
            })?;
        if !matches!(
            c.format.class,
            TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz
        ) {
            return Err(RunError::Config(format!(
                "bisection.time_column {column} is {}, not a date or timestamp",
                c.format.class
            )));
        }
        Ok(Some((
            c.source_name.clone(),
            b.time_granularity.unwrap_or(Granularity::Day),
        )))
    }

    /// The seal of a request to `side`, in a sealed run.
    pub(super) fn seal(&self, side: Side) -> Option<Seal> {
        self.seals.as_ref().map(|s| match side {
            Side::Source => s.source.clone(),
            Side::Target => s.target.clone(),
        })
    }

    pub(super) fn dataset(&self, side: Side) -> String {
        match side {
            Side::Source => self.spec.source.dataset.clone(),
            Side::Target => self.spec.target.dataset.clone(),
        }
    }

    pub(super) fn columns(&self, side: Side) -> Vec<tally_common::segment::ColumnSpec> {
        let r = self.resolved.as_ref().expect("resolved");
        match side {
            Side::Source => r.source_columns(),
            Side::Target => r.target_columns(),
        }
    }

    fn aggregate(&mut self, out: &mut Out, side: Side, plan: &LevelPlan, splits: &[Split]) {
        let r = self.resolved.as_ref().expect("resolved");
        let request = AggregateRequest {
            seal: self.seal(side),
            dataset: self.dataset(side),
            columns: self.columns(side),
            key_len: r.key_len,
            method: r.method,
            parents: plan.parents.iter().cloned().zip(splits.iter().cloned()).collect(),
            in_process: false,
            // the runtime names the run
            run_id: String::new(),
            side: None,
        };
        let level = plan.level;
        self.ask(out, Command::Aggregate { level, side, request });
    }

    fn buckets(&self, resp: &AggregateResponse) -> Vec<BucketResult> {
        let r = self.resolved.as_ref().expect("resolved");
        resp.buckets
            .iter()
            .map(|b| BucketResult {
                parent: b.parent,
                child: b.child,
                segment: b.segment.clone(),
                agg: AnyAggregate::new(r.method, b.count, b.sum, if r.xor { b.xor } else { None }),
            })
            .collect()
    }

    /// The next level's aggregates: quantile levels ask the source first (it picks the
    /// cut points); hash levels ask both sides at once.
    fn next_level(&mut self, out: &mut Out) -> Step {
        let Some(plan) = self.planner.as_ref().expect("drilling").next_level() else {
            return self.drill_done(out);
        };
        if let Some(max) = self.spec.gates.max_queries
            && self.res.source.queries.max(self.res.target.queries) + 1 > max
        {
            return Err(gate(
                "max_queries",
                format!(
                    "the next level would send query {} to each side, the gate allows {max}",
                    self.res.source.queries + 1
                ),
            )
            .into());
        }
        self.aggregate(out, Side::Source, &plan, &plan.splits);
        if !plan.target_follows_source {
            self.aggregate(out, Side::Target, &plan, &plan.splits);
        }
        self.level = Some(LevelInFlight {
            plan,
            source: None,
            target: None,
        });
        Ok(())
    }

    pub(super) fn on_aggregated(
        &mut self,
        out: &mut Out,
        level: u32,
        side: Side,
        resp: AggregateResponse,
        elapsed_ms: u64,
    ) -> Step {
        let mut l = self
            .level
            .take()
            .expect("an aggregate answers the level in flight");
        debug_assert_eq!(l.plan.level, level);
        match side {
            Side::Source => {
                if l.plan.target_follows_source {
                    let splits = Planner::target_splits(&l.plan, &self.buckets(&resp));
                    self.aggregate(out, Side::Target, &l.plan, &splits);
                }
                l.source = Some((resp, elapsed_ms));
            }
            Side::Target => l.target = Some((resp, elapsed_ms)),
        }
        match l {
            LevelInFlight {
                plan,
                source: Some(s),
                target: Some(t),
            } => self.complete_level(out, plan, s, t),
            l => {
                self.level = Some(l);
                Ok(())
            }
        }
    }

    fn complete_level(
        &mut self,
        out: &mut Out,
        plan: LevelPlan,
        (s, s_ms): (AggregateResponse, u64),
        (t, t_ms): (AggregateResponse, u64),
    ) -> Step {
        self.res.source.queries += 1;
        self.res.target.queries += 1;
        self.res.source.rows_scanned = self.res.source.rows_scanned.saturating_add(s.rows_scanned);
        self.res.target.rows_scanned = self.res.target.rows_scanned.saturating_add(t.rows_scanned);
        self.res.source.path = Some(s.path.clone());
        self.res.target.path = Some(t.path.clone());
        let (sb, tb) = (self.buckets(&s), self.buckets(&t));
        let planner = self.planner.as_mut().expect("drilling");
        let stats = planner
            .observe(&plan, &sb, &tb)
            .map_err(|e| RunError::Internal(e.to_string()))?;
        self.segments_compared += stats.segments as u64;
        // the level's time: one side after the other, or both at once
        let elapsed_ms = if plan.target_follows_source {
            s_ms + t_ms
        } else {
            s_ms.max(t_ms)
        };
        let level_out = LevelOut {
            level: stats.level,
            segments: stats.segments,
            differing: stats.differing,
            inconsistent: stats.inconsistent,
            elapsed_ms,
        };
        self.res.levels.push(level_out.clone());
        self.say(
            out,
            format!(
                "level {}: {} segments, {} differing, {} + {} rows covered",
                stats.level, stats.segments, stats.differing, stats.source_rows, stats.target_rows
            ),
        );
        out.push(Command::LevelDone { level_out });
        if let Some(max) = self.spec.gates.max_rows_scanned {
            let scanned = self
                .res
                .source
                .rows_scanned
                .saturating_add(self.res.target.rows_scanned);
            if scanned > max && self.planner.as_ref().expect("drilling").next_level().is_some() {
                return Err(gate(
                    "max_rows_scanned",
                    format!("{scanned} rows read, the gate allows {max}"),
                )
                .into());
            }
        }
        self.next_level(out)
    }

    /// The leaves and totals into the result, once.
    pub(super) fn report_leaves(&mut self) {
        let Some(planner) = self.planner.as_ref() else {
            return;
        };
        if std::mem::replace(&mut self.leaves_reported, true) {
            return;
        }
        if let Some((s, t)) = planner.totals {
            self.res.source.count = Some(s);
            self.res.target.count = Some(t);
        }
        self.res.leaves = planner
            .leaves
            .iter()
            .map(|l| LeafOut {
                level: l.level,
                bounds: l.segment.clone(),
                source: agg_out(&l.source),
                target: agg_out(&l.target),
                inconsistent: l.inconsistent.is_some(),
                reason: l.inconsistent.clone(),
                sql: None,
                key_sql: Vec::new(),
            })
            .collect();
        let inconsistent = planner.leaves.iter().filter(|l| l.inconsistent.is_some()).count();
        if inconsistent > 0 {
            self.res.warnings.push(format!(
                "{inconsistent} differing segments could not be drilled into: their children did not account for \
                 them (data changed between levels, or an agent's predicate lost rows); they are reported as \
                 inconsistent leaves"
            ));
        }
    }

    fn drill_done(&mut self, out: &mut Out) -> Step {
        self.report_leaves();
        let planner = self.planner.as_ref().expect("drilled");
        match &planner.stop {
            Some(Stop::MaxLeaves { leaves, limit }) => {
                return Err(gate(
                    "max_leaves",
                    format!("{leaves} differing segments exceed the gate of {limit}"),
                )
                .into());
            }
            Some(Stop::MostSegmentsDiffer {
                level,
                differing,
                segments,
            }) => {
                self.res.advice = Some(format!(
                    "{differing} of {segments} segments differ at level {level}: most of the data differs, so bisection \
                     cannot narrow it down. Localise it by per-group totals first: {}",
                    self.measures_suggestion()
                ));
            }
            None => {}
        }
        // any leaf, inconsistent ones included, means differ: never match by omission
        self.res.verdict = if planner.leaves.is_empty() {
            Verdict::Match
        } else {
            Verdict::Differ
        };
        self.sql = Some(SqlPhase {
            total: planner.leaves.len().min(MAX_LEAVES_WITH_SQL),
            asked: 0,
            done: 0,
            partial: BTreeMap::new(),
        });
        self.ask_sql(out)
    }

    /// Asks for the next leaves' SQL while fewer than [`SQL_IN_FLIGHT`] are in
    /// flight; when every leaf has its SQL, goes on to the rows phase.
    fn ask_sql(&mut self, out: &mut Out) -> Step {
        let sql = self.sql.as_ref().expect("sql phase");
        if sql.done == sql.total {
            let leaves = self.planner.as_ref().map_or(0, |p| p.leaves.len());
            if leaves > MAX_LEAVES_WITH_SQL {
                self.res.warnings.push(format!(
                    "investigation SQL shown for the first {MAX_LEAVES_WITH_SQL} leaves only"
                ));
            }
            return self.begin_rows(out);
        }
        let (from, to) = (sql.asked, sql.total.min(sql.done + SQL_IN_FLIGHT));
        for leaf in from..to.max(from) {
            let segment = self.planner.as_ref().expect("drilled").leaves[leaf]
                .segment
                .clone();
            for side in [Side::Source, Side::Target] {
                let request = self.sql_request(side, &segment, Vec::new());
                self.ask(out, Command::InvestigationSql { leaf, side, request });
            }
        }
        let sql = self.sql.as_mut().expect("sql phase");
        sql.asked = sql.asked.max(to);
        Ok(())
    }

    pub(super) fn on_sql(&mut self, out: &mut Out, leaf: usize, side: Side, text: String) -> Step {
        let sql = self.sql.as_mut().expect("sql asked");
        let slot = sql.partial.entry(leaf).or_default();
        match side {
            Side::Source => slot.0 = Some(text),
            Side::Target => slot.1 = Some(text),
        }
        if let (Some(_), Some(_)) = slot {
            let (Some(source), Some(target)) = sql.partial.remove(&leaf).expect("present") else {
                unreachable!("both present")
            };
            sql.done += 1;
            self.res.leaves[leaf].sql = Some(SqlPair { source, target });
            return self.ask_sql(out);
        }
        Ok(())
    }
}

/// The offset in seconds of an agent's `time_zone` (`UTC` or `±HH:MM`; 0 otherwise).
fn zone_seconds(tz: &str) -> i64 {
    let t = tz.trim();
    let b = t.as_bytes();
    if b.len() != 6 || !matches!(b[0], b'+' | b'-') || b[3] != b':' {
        return 0;
    }
    let (Ok(h), Ok(m)) = (t[1..3].parse::<i64>(), t[4..6].parse::<i64>()) else {
        return 0;
    };
    let s = h * 3600 + m * 60;
    if b[0] == b'-' { -s } else { s }
}

/// A window's bound in the column's compared class: `as_of` checked and normalised
/// (timestamps to nanosecond digits, which each agent cuts to the column's
/// precision), or the clock minus `lag` (a naive timestamp or a date in the source
/// agent's `time_zone`, a timestamptz in UTC).
pub fn window_upper(
    w: &crate::spec::WindowSpec,
    class: TypeClass,
    now_ms: Option<i64>,
    source_zone: &str,
) -> Result<String, RunError> {
    use tally_common::canonical::{FieldFormat, MAX_TIME_PRECISION, canonical_from_text};
    let config = |m: String| RunError::Config(m);
    let column = w.column.as_deref().unwrap_or_default();
    if let Some(a) = &w.as_of {
        let text = a.text();
        if class == TypeClass::Integer {
            return text.trim().parse::<i64>().map(|n| n.to_string()).map_err(|_| {
                config(format!(
                    "window.as_of {text:?}: the column {column} is an integer",
                ))
            });
        }
        let f = FieldFormat::new(class).with_scale(MAX_TIME_PRECISION);
        return match canonical_from_text(&f, Some(text.trim())) {
            Ok(Some(t)) if !t.contains("infinity") => Ok(t),
            Ok(_) => Err(config(format!("window.as_of {text:?} is not a finite {class}"))),
            Err(e) => Err(config(format!(
                "window.as_of {text:?} is not a {class} (the column {column} compares as {class}): {e}",
            ))),
        };
    }
    let lag = w
        .lag
        .as_deref()
        .and_then(crate::spec::parse_duration)
        .expect("validated: as_of or a lag");
    if class == TypeClass::Integer {
        return Err(config(format!(
            "window.lag needs a date or timestamp column; {column} is an integer: set window.as_of",
        )));
    }
    let now_ms = now_ms.expect("the clock is read for a lag");
    let zone = if class == TypeClass::TimestampTz {
        0
    } else {
        zone_seconds(source_zone)
    };
    let ms = now_ms - (lag as i64) * 1000 + zone * 1000;
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, mo, d) = tally_common::civil::civil_from_days(days);
    let mut out = String::new();
    tally_common::civil::push_year(&mut out, y);
    out.push_str(&format!("-{mo:02}-{d:02}"));
    if class != TypeClass::Date {
        let secs = in_day / 1000;
        out.push_str(&format!(
            "T{:02}:{:02}:{:02}.{:03}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            in_day % 1000
        ));
        if class == TypeClass::TimestampTz {
            out.push('Z');
        }
    }
    Ok(out)
}

impl Engine {
    /// One side's investigation SQL request for a leaf's `segment`: its range, or with
    /// `keys` exactly those keys.
    pub(super) fn sql_request(
        &self,
        side: Side,
        segment: &Segment,
        keys: Vec<KeyTuple>,
    ) -> InvestigationSqlRequest {
        let r = self.resolved.as_ref().expect("resolved");
        InvestigationSqlRequest {
            dataset: self.dataset(side),
            columns: self.columns(side),
            key_len: r.key_len,
            segment: segment.clone(),
            sealed: r.method.is_sealed(),
            keys,
            items: Vec::new(),
        }
    }
}

#[cfg(test)]
mod window_tests {
    use super::{TypeClass, window_upper};
    use crate::spec::{AsOf, WindowSpec};

    fn w(as_of: Option<AsOf>, lag: Option<&str>) -> WindowSpec {
        WindowSpec {
            column: Some("at".into()),
            as_of,
            lag: lag.map(str::to_string),
            watermark: None,
            timeout: None,
        }
    }

    #[test]
    fn bounds_are_normalised_in_the_columns_class() {
        let text = |t: &str| Some(AsOf::Text(t.into()));
        let tz = window_upper(
            &w(text("2026-12-01T01:30:00+02:00"), None),
            TypeClass::TimestampTz,
            None,
            "UTC",
        );
        assert_eq!(tz.unwrap(), "2026-11-30T23:30:00.000000000Z");
        let naive = window_upper(
            &w(text("2026-12-01 01:30:00.5"), None),
            TypeClass::Timestamp,
            None,
            "UTC",
        );
        assert_eq!(naive.unwrap(), "2026-12-01T01:30:00.500000000");
        assert!(
            window_upper(
                &w(text("2026-12-01T01:30:00Z"), None),
                TypeClass::Timestamp,
                None,
                "UTC"
            )
            .is_err()
        );
        assert!(
            window_upper(
                &w(text("2026-12-01 01:30:00"), None),
                TypeClass::TimestampTz,
                None,
                "UTC"
            )
            .is_err()
        );
        assert_eq!(
            window_upper(&w(text("2026-12-01"), None), TypeClass::Date, None, "UTC").unwrap(),
            "2026-12-01"
        );
        assert!(window_upper(&w(text("infinity"), None), TypeClass::Timestamp, None, "UTC").is_err());
        assert_eq!(
            window_upper(&w(Some(AsOf::Int(-7)), None), TypeClass::Integer, None, "UTC").unwrap(),
            "-7"
        );
        assert!(window_upper(&w(text("1.5"), None), TypeClass::Integer, None, "UTC").is_err());
    }

    #[test]
    fn a_lag_is_the_clock_minus_it_in_the_right_zone() {
        // 2025-12-01T12:00:00.250Z
        let now = Some(1_764_590_400_250);
        let lag = |class, zone| window_upper(&w(None, Some("1h30m")), class, now, zone).unwrap();
        assert_eq!(lag(TypeClass::TimestampTz, "+05:00"), "2025-12-01T10:30:00.250Z");
        assert_eq!(lag(TypeClass::Timestamp, "UTC"), "2025-12-01T10:30:00.250");
        assert_eq!(lag(TypeClass::Timestamp, "+02:00"), "2025-12-01T12:30:00.250");
        assert_eq!(lag(TypeClass::Timestamp, "-11:00"), "2025-11-30T23:30:00.250");
        assert_eq!(lag(TypeClass::Date, "-11:00"), "2025-11-30");
        assert!(window_upper(&w(None, Some("5m")), TypeClass::Integer, now, "UTC").is_err());
    }
}
