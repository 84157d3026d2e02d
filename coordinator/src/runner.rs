//! The runner: drives one reconciliation against two agents. It resolves the
//! schemas, asks the planner for each level and sends one aggregate per side per
//! level (both sides at once where the strategy allows), then, at with_keys and
//! detailed, classifies the rows of each leaf and asks for the differing keys.

use std::io::IsTerminal;
use std::time::Instant;

use futures::StreamExt;
use tally_common::checksum::{AnyAggregate, run_false_match_bound};
use tally_common::period::Granularity;
use tally_common::segment::{ColumnSpec, Segment, Split};
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Describe, InvestigationSqlRequest, RevealRequest, RevealResponse,
    RowDigestsRequest, Seal,
};
use tally_common::{PrivacyLevel, TypeClass};

use std::sync::Arc;

use serde_json::{Value, json};

use crate::client::AgentApi;
use crate::error::RunError;
use crate::planner::{
    BucketResult, Leaf, LevelPlan, PlanParams, Planner, Stop, first_level_factor, rows_batches,
};
use crate::resolve::{Resolved, check_policies, resolve};
use crate::result::*;
use crate::rows;
use crate::runlog::RunLog;
use crate::spec::{Mode, Spec, Strategy};

/// The union of both sides' integer key ranges, where both agents report one.
fn int_range(s: &Describe, t: &Describe) -> Option<(i64, i64)> {
    let (s, t) = (s.int_key_range()?, t.int_key_range()?);
    Some((s.0.min(t.0), s.1.max(t.1)))
}

/// After an early stop, rows are still classified when the differing segments hold at
/// most this many rows (per side).
const ROWS_PHASE_AFTER_STOP: u64 = 1_000_000;

/// Ranges whose digests (and then reveals) are fetched at once in the rows phase: 8
/// measured faster than 4 or 16 at 1M rows (docs/performance.md).
const LEAVES_IN_FLIGHT: usize = 8;

/// Investigation SQL is fetched for at most this many leaves.
const MAX_LEAVES_WITH_SQL: usize = 100;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Progress lines on stderr (default: when stderr is a terminal).
    pub progress: Option<bool>,
    /// Where the run records its events, and what it resumes from.
    pub record: Option<RunRecord>,
}

/// A run's record in the run log (DESIGN §9): the run appends `resolved` (the run
/// nonce, so a resumed run keeps its seals) and one `level` event per level, each with
/// the drill's whole state, before it asks for the next level. A run given its earlier
/// events resumes: the committed levels are not asked again, an unfinished level is.
/// (The rows phase and investigation SQL still run again in full: the run engine will
/// record those too.)
#[derive(Clone)]
pub struct RunRecord {
    pub log: Arc<dyn RunLog>,
    pub run_id: String,
    /// The run's events so far, as loaded (empty for a new run).
    pub resume: Vec<Value>,
}

impl std::fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRecord")
            .field("run_id", &self.run_id)
            .field("resume", &self.resume.len())
            .finish_non_exhaustive()
    }
}

/// The events of kind `kind` among `events`.
fn events_of<'e>(events: &'e [Value], kind: &str) -> impl Iterator<Item = &'e Value> + use<'e> {
    let kind = kind.to_string();
    events.iter().filter(move |e| e["event"] == kind.as_str())
}

struct Run<'a> {
    spec: &'a Spec,
    record: Option<&'a RunRecord>,
    source: &'a dyn AgentApi,
    target: &'a dyn AgentApi,
    started: Instant,
    progress: bool,
    resolved: Option<Resolved>,
    /// A sealed run's seals: the run nonce with the peer's signed zone key, one per
    /// side (the source's names the target, the target's the source).
    seals: Option<Seals>,
    res: RunResult,
    segments_compared: u64,
}

#[derive(Debug, Clone)]
struct Seals {
    source: Seal,
    target: Seal,
}

/// Which side a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Source,
    Target,
}

fn agg_out(a: &AnyAggregate) -> AggOut {
    AggOut {
        count: a.count(),
        checksum: format!("{:016x}", a.sum()),
        xor: a.xor().map(|x| format!("{x:016x}")),
    }
}

/// A result with nothing done yet (verdict `error` until the run says otherwise).
fn empty_result(spec: &Spec) -> RunResult {
    RunResult {
        name: spec.name.clone(),
        verdict: Verdict::Error,
        hash_method: String::new(),
        strategy: spec.bisection.strategy.name().to_string(),
        level: spec.reporting.level.name().to_string(),
        xor_compared: false,
        false_match_probability: 0.0,
        false_match_bound: 0.0,
        source: SideStats {
            agent: spec.source.agent.clone(),
            dataset: spec.source.dataset.clone(),
            ..Default::default()
        },
        target: SideStats {
            agent: spec.target.agent.clone(),
            dataset: spec.target.dataset.clone(),
            ..Default::default()
        },
        levels: Vec::new(),
        leaves: Vec::new(),
        differences: None,
        duplicate_keys: None,
        difference_counts: None,
        truncated: false,
        warnings: Vec::new(),
        advice: None,
        error: None,
        elapsed_ms: 0,
    }
}

/// The result of a run stopped before it finished: verdict `error`, code `cancelled`.
pub fn cancelled_result(spec: &Spec, message: String) -> RunResult {
    let mut res = empty_result(spec);
    res.error = Some(ErrorOut {
        code: RunError::Cancelled.code().to_string(),
        message,
    });
    res
}

/// Runs `spec` between two agents; never fails: errors become verdict `error`.
pub async fn run(spec: &Spec, source: &dyn AgentApi, target: &dyn AgentApi, opts: &RunOptions) -> RunResult {
    let mut r = Run {
        spec,
        record: opts.record.as_ref(),
        source,
        target,
        started: Instant::now(),
        progress: opts.progress.unwrap_or_else(|| std::io::stderr().is_terminal()),
        resolved: None,
        seals: None,
        segments_compared: 0,
        res: empty_result(spec),
    };
    let outcome = match spec.gates.max_seconds {
        Some(s) => match tokio::time::timeout(std::time::Duration::from_secs(s), r.drive()).await {
            Ok(o) => o,
            Err(_) => Err(RunError::Gate {
                gate: "max_seconds",
                message: format!("the run took longer than {s} s"),
            }),
        },
        None => r.drive().await,
    };
    if let Err(e) = outcome {
        r.res.verdict = Verdict::Error;
        r.res.error = Some(ErrorOut {
            code: e.code().to_string(),
            message: e.to_string(),
        });
    }
    if let Some(m) = r.resolved.as_ref().map(|x| x.method) {
        r.res.false_match_probability = m.false_match_probability();
        r.res.false_match_bound = run_false_match_bound(m, r.segments_compared);
    }
    r.res.elapsed_ms = r.started.elapsed().as_millis() as u64;
    r.res
}

impl Run<'_> {
    /// Appends an event to the run's record, if it has one; a run whose record cannot
    /// be written stops (nothing it did would be resumable).
    async fn append(&self, event: Value) -> Result<(), RunError> {
        let Some(r) = self.record else { return Ok(()) };
        let Value::Object(fields) = event else {
            return Err(RunError::Internal("run log events are objects".into()));
        };
        r.log
            .append(&r.run_id, fields)
            .await
            .map(|_| ())
            .map_err(|e| RunError::Internal(format!("the run log cannot be written: {e}")))
    }

    fn say(&self, msg: impl AsRef<str>) {
        if self.progress {
            eprintln!(
                "[{:>7.2}s] {}",
                self.started.elapsed().as_secs_f64(),
                msg.as_ref()
            );
        }
    }

    async fn drive(&mut self) -> Result<(), RunError> {
        let spec = self.spec;
        let (s, t) = tokio::join!(
            self.source.describe(&spec.source.dataset),
            self.target.describe(&spec.target.dataset)
        );
        let (s, t) = (s?, t?);
        self.res.source.engine = Some(format!("{} {}", s.engine, s.engine_version));
        self.res.target.engine = Some(format!("{} {}", t.engine, t.engine_version));
        check_policies(spec, [(self.source.name(), &s), (self.target.name(), &t)])?;
        let resolved = resolve(spec, &s, &t)?;
        let recorded = self
            .record
            .and_then(|r| events_of(&r.resume, "resolved").next())
            .cloned();
        if resolved.method.is_sealed() {
            // resolve checked that both sides offer a zone key for a sealed method; a
            // resumed run keeps its nonce, so its key hashes and sums stay comparable
            let nonce = match recorded.as_ref().and_then(|e| e["nonce"].as_str()) {
                Some(hex_nonce) => hex::decode(hex_nonce)
                    .ok()
                    .and_then(|n| n.try_into().ok())
                    .ok_or_else(|| {
                        RunError::Internal("run log: the recorded run nonce is malformed".into())
                    })?,
                None => tally_common::seal::run_nonce(),
            };
            let zone_key = |d: &Describe| {
                d.zone_key.clone().ok_or_else(|| {
                    RunError::Internal(format!("dataset {} has no zone key to seal with", d.dataset))
                })
            };
            self.seals = Some(Seals {
                source: Seal {
                    nonce,
                    peer: zone_key(&t)?,
                    peer_dataset: spec.target.dataset.clone(),
                },
                target: Seal {
                    nonce,
                    peer: zone_key(&s)?,
                    peer_dataset: spec.source.dataset.clone(),
                },
            });
        }
        self.res.hash_method = resolved.method.name().to_string();
        self.res.xor_compared = resolved.xor;
        self.res.warnings = resolved.warnings.clone();
        let estimate = s.row_estimate + t.row_estimate;
        self.say(format!(
            "resolved {} key + {} compared columns, {}; estimated scan {} + {} rows (catalog estimates)",
            resolved.key_len,
            resolved.columns.len() - resolved.key_len,
            resolved.method,
            s.row_estimate,
            t.row_estimate
        ));
        if let Some(max) = spec.gates.max_rows_scanned
            && estimate > max
        {
            return Err(RunError::Gate {
                gate: "max_rows_scanned",
                message: format!("the first level would read about {estimate} rows, the gate allows {max}"),
            });
        }
        if recorded.is_none() {
            let nonce = self.seals.as_ref().map(|s| hex::encode(s.source.nonce));
            self.append(json!({"event": "resolved", "hash_method": resolved.method.name(), "nonce": nonce}))
                .await?;
        }
        self.resolved = Some(resolved);
        let mut planner = Planner::new(PlanParams {
            strategy: spec.bisection.strategy,
            factor: spec.bisection.factor,
            threshold: spec.bisection.threshold,
            depth: spec.bisection.depth,
            counts_only: spec.mode == Mode::Count,
            max_leaves: spec.gates.max_leaves,
            time: self.time_split()?,
            int_range: int_range(&s, &t),
            first_factor: first_level_factor(
                s.row_estimate.max(t.row_estimate),
                spec.bisection.threshold,
                spec.bisection.factor,
            ),
        });
        if let Some(last) = self.record.and_then(|r| events_of(&r.resume, "level").last()) {
            planner = serde_json::from_value(last["planner"].clone())
                .map_err(|e| RunError::Internal(format!("run log: the recorded drill does not load: {e}")))?;
            for e in events_of(&self.record.expect("resuming").resume, "level") {
                if let Ok(l) = serde_json::from_value::<LevelOut>(e["level_out"].clone()) {
                    self.res.levels.push(l);
                }
            }
            let n = |k: &str, i: usize| last[k][i].as_u64().unwrap_or(0);
            (self.res.source.queries, self.res.target.queries) = (n("queries", 0), n("queries", 1));
            (self.res.source.rows_scanned, self.res.target.rows_scanned) =
                (n("rows_scanned", 0), n("rows_scanned", 1));
            self.segments_compared = last["segments_compared"].as_u64().unwrap_or(0);
            self.say(format!(
                "resumed after level {} from the run log: those levels are not asked again",
                self.res.levels.len()
            ));
        }
        let drill = self.drill(&mut planner).await;
        // what was found so far is reported even when a gate or an agent stops the run
        self.record_planner(&planner);
        drill?;
        match &planner.stop {
            Some(Stop::MaxLeaves { leaves, limit }) => {
                return Err(RunError::Gate {
                    gate: "max_leaves",
                    message: format!("{leaves} differing segments exceed the gate of {limit}"),
                });
            }
            Some(Stop::MostSegmentsDiffer {
                level,
                differing,
                segments,
            }) => {
                self.res.advice = Some(format!(
                    "{differing} of {segments} segments differ at level {level}: most of the data differs, so bisection \
                     cannot narrow it down. Compare per-group totals first (COUNT and SUM grouped by a date or a \
                     region, in both databases), or check the mapping, then reconcile the diverging groups."
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
        self.leaf_sql(&planner.leaves).await?;
        if spec.reporting.level >= PrivacyLevel::WithKeys && !planner.leaves.is_empty() {
            // after an early stop the leaves are not small: classify their rows only
            // while that stays bounded
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
            } else {
                let batches: Vec<Segment> = rows_batches(&planner.leaves, spec.bisection.threshold)
                    .into_iter()
                    .map(|(segment, _)| segment)
                    .collect();
                self.rows_phase(&batches).await?;
            }
        }
        Ok(())
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

    fn record_planner(&mut self, planner: &Planner) {
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

    /// The seal of a request to `side`, in a sealed run.
    fn seal(&self, side: Side) -> Option<Seal> {
        self.seals.as_ref().map(|s| match side {
            Side::Source => s.source.clone(),
            Side::Target => s.target.clone(),
        })
    }

    fn aggregate_request(
        &self,
        side: Side,
        side_cols: Vec<ColumnSpec>,
        dataset: &str,
        parents: &[Segment],
        splits: &[Split],
    ) -> AggregateRequest {
        let r = self.resolved.as_ref().expect("resolved");
        AggregateRequest {
            seal: self.seal(side),
            dataset: dataset.to_string(),
            columns: side_cols,
            key_len: r.key_len,
            method: r.method,
            parents: parents.iter().cloned().zip(splits.iter().cloned()).collect(),
            in_process: false,
        }
    }

    fn buckets(&self, resp: &AggregateResponse) -> Vec<BucketResult> {
        let r = self.resolved.as_ref().expect("resolved");
        resp.buckets
            .iter()
            .map(|b| {
                let xor = if r.xor { b.xor } else { None };
                BucketResult {
                    parent: b.parent,
                    child: b.child,
                    segment: b.segment.clone(),
                    agg: AnyAggregate::new(r.method, b.count, b.sum, xor),
                }
            })
            .collect()
    }

    fn check_query_gate(&self) -> Result<(), RunError> {
        if let Some(max) = self.spec.gates.max_queries
            && self.res.source.queries.max(self.res.target.queries) + 1 > max
        {
            return Err(RunError::Gate {
                gate: "max_queries",
                message: format!(
                    "the next level would send query {} to each side, the gate allows {max}",
                    self.res.source.queries + 1
                ),
            });
        }
        Ok(())
    }

    async fn drill(&mut self, planner: &mut Planner) -> Result<(), RunError> {
        let r = self.resolved.clone().expect("resolved");
        let (scols, tcols) = (r.source_columns(), r.target_columns());
        while let Some(plan) = planner.next_level() {
            self.check_query_gate()?;
            let level_start = Instant::now();
            let (src_resp, tgt_resp) = self.level(&plan, &scols, &tcols).await?;
            self.res.source.queries += 1;
            self.res.target.queries += 1;
            self.res.source.rows_scanned += src_resp.rows_scanned;
            self.res.target.rows_scanned += tgt_resp.rows_scanned;
            self.res.source.path = Some(src_resp.path.clone());
            self.res.target.path = Some(tgt_resp.path.clone());
            let sb = self.buckets(&src_resp);
            let tb = self.buckets(&tgt_resp);
            let stats = planner
                .observe(&plan, &sb, &tb)
                .map_err(|e| RunError::Internal(e.to_string()))?;
            self.segments_compared += stats.segments as u64;
            let ms = level_start.elapsed().as_millis() as u64;
            self.res.levels.push(LevelOut {
                level: stats.level,
                segments: stats.segments,
                differing: stats.differing,
                inconsistent: stats.inconsistent,
                elapsed_ms: ms,
            });
            self.say(format!(
                "level {}: {} segments, {} differing, {} + {} rows covered",
                stats.level, stats.segments, stats.differing, stats.source_rows, stats.target_rows
            ));
            // the level is committed to the run log before the next one is asked
            let level_out = self.res.levels.last().expect("pushed above");
            self.append(json!({
                "event": "level",
                "level_out": level_out,
                "planner": &*planner,
                "queries": [self.res.source.queries, self.res.target.queries],
                "rows_scanned": [self.res.source.rows_scanned, self.res.target.rows_scanned],
                "segments_compared": self.segments_compared,
            }))
            .await?;
            if let Some(max) = self.spec.gates.max_rows_scanned {
                let scanned = self.res.source.rows_scanned + self.res.target.rows_scanned;
                if scanned > max && planner.next_level().is_some() {
                    return Err(RunError::Gate {
                        gate: "max_rows_scanned",
                        message: format!("{scanned} rows read, the gate allows {max}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// One level: one aggregate per side. Quantile levels ask the source first (it
    /// picks the cut points); hash levels ask both sides at once.
    async fn level(
        &self,
        plan: &LevelPlan,
        scols: &[ColumnSpec],
        tcols: &[ColumnSpec],
    ) -> Result<(AggregateResponse, AggregateResponse), RunError> {
        let splits = plan.splits.clone();
        let sreq = self.aggregate_request(
            Side::Source,
            scols.to_vec(),
            &self.spec.source.dataset,
            &plan.parents,
            &splits,
        );
        if plan.target_follows_source {
            let s = self.source.aggregate(sreq).await?;
            let sb = self.buckets(&s);
            let tsplits = Planner::target_splits(plan, &sb);
            let treq = self.aggregate_request(
                Side::Target,
                tcols.to_vec(),
                &self.spec.target.dataset,
                &plan.parents,
                &tsplits,
            );
            let t = self.target.aggregate(treq).await?;
            Ok((s, t))
        } else {
            let treq = self.aggregate_request(
                Side::Target,
                tcols.to_vec(),
                &self.spec.target.dataset,
                &plan.parents,
                &splits,
            );
            let (s, t) = tokio::join!(self.source.aggregate(sreq), self.target.aggregate(treq));
            Ok((s?, t?))
        }
    }

    async fn leaf_sql(&mut self, leaves: &[Leaf]) -> Result<(), RunError> {
        let r = self.resolved.clone().expect("resolved");
        for (i, leaf) in leaves.iter().take(MAX_LEAVES_WITH_SQL).enumerate() {
            let req = |columns: Vec<ColumnSpec>, dataset: &str| InvestigationSqlRequest {
                dataset: dataset.to_string(),
                columns,
                key_len: r.key_len,
                segment: leaf.segment.clone(),
                sealed: r.method.is_sealed(),
            };
            let (s, t) = tokio::join!(
                self.source
                    .investigation_sql(req(r.source_columns(), &self.spec.source.dataset)),
                self.target
                    .investigation_sql(req(r.target_columns(), &self.spec.target.dataset))
            );
            self.res.leaves[i].sql = Some(SqlPair {
                source: s?,
                target: t?,
            });
        }
        if leaves.len() > MAX_LEAVES_WITH_SQL {
            self.res.warnings.push(format!(
                "investigation SQL shown for the first {MAX_LEAVES_WITH_SQL} leaves only"
            ));
        }
        Ok(())
    }

    /// Classifies the rows of `leaves` (adjacent ones already merged into one range)
    /// from (key hash, row hash) pairs, then asks for the keys (and at detailed, the
    /// values) of differing rows only.
    async fn rows_phase(&mut self, leaves: &[Segment]) -> Result<(), RunError> {
        let r = self.resolved.clone().expect("resolved");
        let spec = self.spec;
        let level = spec.reporting.level;
        // a few leaves in flight at once, processed in leaf order
        let (source, target) = (self.source, self.target);
        let (seal_s, seal_t) = (self.seal(Side::Source), self.seal(Side::Target));
        let fetch = |leaf: &Segment| {
            let req = |columns: Vec<ColumnSpec>, dataset: &str, seal: Option<Seal>| RowDigestsRequest {
                dataset: dataset.to_string(),
                columns,
                key_len: r.key_len,
                method: r.method,
                segment: leaf.clone(),
                level,
                seal,
            };
            let (sreq, treq) = (
                req(r.source_columns(), &spec.source.dataset, seal_s.clone()),
                req(r.target_columns(), &spec.target.dataset, seal_t.clone()),
            );
            async move { tokio::join!(source.row_digests(sreq), target.row_digests(treq)) }
        };
        let mut digests = futures::stream::iter(leaves.iter().map(fetch)).buffered(LEAVES_IN_FLIGHT);
        let mut classifier = rows::Classifier::default();
        let mut i = 0;
        while let Some((s, t)) = digests.next().await {
            classifier.add_range(i, &s?, &t?);
            self.say(format!("rows of range {}/{} classified", i + 1, leaves.len()));
            i += 1;
        }
        let classified = classifier.finish(spec.reporting.sample_limit as usize);
        self.res.truncated = classified.truncated;
        let detailed = spec.reporting.level == PrivacyLevel::Detailed;
        let findings = &classified.findings;
        let work = rows::reveal_plan(findings, leaves.len(), detailed);
        let reveal = |leaf: &Segment, side: Side, columns: Vec<ColumnSpec>, dataset: &str, hashes: &[u64]| {
            RevealRequest {
                seal: match side {
                    Side::Source => seal_s.clone(),
                    Side::Target => seal_t.clone(),
                },
                dataset: dataset.to_string(),
                columns,
                key_len: r.key_len,
                segment: leaf.clone(),
                limit: hashes.len() as u32,
                key_hashes: hashes.to_vec(),
                level,
                consent_acknowledged: spec.reporting.consent_acknowledged,
            }
        };
        // a few leaves' reveals in flight at once (each scans its leaf on both sides)
        let fetch = |w: &rows::RevealWork| {
            let leaf = &leaves[w.leaf];
            let sreq = (!w.from_source.is_empty()).then(|| {
                reveal(
                    leaf,
                    Side::Source,
                    r.source_columns(),
                    &spec.source.dataset,
                    &w.from_source,
                )
            });
            let treq = (!w.from_target.is_empty()).then(|| {
                reveal(
                    leaf,
                    Side::Target,
                    r.target_columns(),
                    &spec.target.dataset,
                    &w.from_target,
                )
            });
            async move {
                let s = async {
                    match sreq {
                        None => Ok(RevealResponse::default()),
                        Some(req) => source.reveal(req, detailed).await,
                    }
                };
                let t = async {
                    match treq {
                        None => Ok(RevealResponse::default()),
                        Some(req) => target.reveal(req, detailed).await,
                    }
                };
                tokio::join!(s, t)
            }
        };
        let mut revealed = futures::stream::iter(work.iter().map(fetch)).buffered(LEAVES_IN_FLIGHT);
        let mut diffs = Vec::new();
        let mut w = work.iter();
        while let Some((s, t)) = revealed.next().await {
            let work = w.next().expect("one reveal per work item");
            let by_hash = |resp: RevealResponse| -> rows::Revealed {
                resp.rows
                    .into_iter()
                    .map(|row| (row.key_hash, (row.key, row.values)))
                    .collect()
            };
            let (s, t) = (by_hash(s?), by_hash(t?));
            let mine: Vec<rows::Finding> = work.findings.iter().map(|&n| findings[n]).collect();
            diffs.extend(rows::differences(&mine, &s, &t, &r.columns, r.key_len, detailed));
        }
        self.res.differences = Some(diffs);
        self.res.difference_counts = Some(classified.counts.clone());
        let (dup_source, dup_target) = classified.duplicates;
        if dup_source + dup_target > 0 {
            self.res.duplicate_keys = Some(DuplicateKeys {
                source: dup_source,
                target: dup_target,
            });
            self.res.warnings.push(format!(
                "duplicate keys in the differing segments: {dup_source} on the source, {dup_target} on the target; \
                 rows sharing a key are compared as one"
            ));
        }
        Ok(())
    }
}
