//! `tally-engine`, the run engine (DESIGN §9): one reconciliation as a pure,
//! serialisable state machine, with what it is made of: the spec ([`spec`]), schema
//! resolution ([`resolve`]), the bisection planner ([`planner`]), the rows phase's
//! comparison ([`rows`]), fidelity ([`fidelity`]), the result ([`result`]) and the
//! run's errors ([`error`]). It depends on `tally-common` and serde only: no I/O, no
//! network, no database driver, which Cargo enforces.
//!
//! The machine: `step(event) -> commands`: it owns the describe and resolve results, the
//! seals, the drill ([`Planner`]), the gates (except the wall clock, which the runtime
//! enforces), investigation SQL, the rows phase and the [`RunResult`]. It does no I/O,
//! reads no clock and draws no randomness: the coordinator's runtime executes its
//! commands and feeds the answers back as [`Event`]s, appending each to the run log
//! first, so a run resumes by replaying its events ([`Engine::replay`]).

mod confirm_leaves;
pub mod drill;
pub mod error;
pub mod events;
pub mod fidelity;
pub mod measures;
pub mod planner;
pub mod resolve;
pub mod result;
pub mod rows;
mod rows_phase;
pub mod spec;
#[cfg(test)]
mod tests;
mod watermark;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tally_common::checksum::run_false_match_bound;
use tally_common::wire::{Describe, Seal};

use crate::error::RunError;
use crate::planner::Planner;
use crate::resolve::Resolved;
use crate::result::{ErrorOut, RunResult, SideStats, Verdict};
use crate::spec::Spec;

pub use events::{Call, Command, Event, Side};

/// Event kinds of a run's log that others write (`tally serve` and `tally run` open
/// and close the record; `level` is for progress readers; `resumed` marks where a
/// process, or a new leader, took the run over): replay skips them.
const NOT_MINE: [&str; 5] = ["started", "finished", "level", "evidence", "resumed"];

/// A sealed run's seals: the run nonce with the peer's signed zone key, one per side
/// (the source's names the target, the target's the source).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Seals {
    source: Seal,
    target: Seal,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Engine {
    spec: Spec,
    /// The agents' names in the coordinator config (policy checks name them).
    agents: (String, String),
    res: RunResult,
    started: bool,
    finished: bool,
    described: Option<(Describe, Describe)>,
    resolved: Option<Resolved>,
    seals: Option<Seals>,
    /// The run's window, fixed once (DESIGN §5): every level-1 segment carries it.
    #[serde(default)]
    window: Option<tally_common::segment::Window>,
    planner: Option<Planner>,
    /// The drill's leaves and totals are in `res` (done once, after the drill or when
    /// it stops).
    leaves_reported: bool,
    level: Option<drill::LevelInFlight>,
    segments_compared: u64,
    sql: Option<drill::SqlPhase>,
    rows: Option<rows_phase::RowsPhase>,
    /// After the rows phase: investigation SQL of the differing keys, leaf by leaf.
    #[serde(default)]
    key_sql: Option<rows_phase::KeySqlPhase>,
    /// Mode measures: the group hierarchy level by level.
    #[serde(default)]
    measures: Option<measures::MeasuresPhase>,
    /// Confirm rounds at count_only: the leaves re-checked by their aggregates.
    #[serde(default)]
    leaf_confirm: Option<confirm_leaves::LeafConfirm>,
    /// Calls asked and not yet answered.
    outstanding: Vec<Command>,
}

/// A result with nothing done yet (verdict `error` until the run says otherwise).
pub fn empty_result(spec: &Spec) -> RunResult {
    RunResult {
        name: spec.name.clone(),
        verdict: Verdict::Error,
        fidelity: None,
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
        window: None,
        positions: Vec::new(),
        groups: None,
        tolerated_groups: None,
        levels: Vec::new(),
        leaves: Vec::new(),
        differences: None,
        in_flight: None,
        in_flight_leaves: None,
        duplicate_keys: None,
        difference_counts: None,
        truncated: false,
        withheld: Vec::new(),
        warnings: Vec::new(),
        advice: None,
        error: None,
        elapsed_ms: 0,
    }
}

/// The commands a step collects.
type Out = Vec<Command>;

impl Engine {
    /// A run of `spec` between the agents named `source_agent` and `target_agent`.
    pub fn new(spec: Spec, source_agent: &str, target_agent: &str) -> Engine {
        Engine {
            res: empty_result(&spec),
            spec,
            agents: (source_agent.to_string(), target_agent.to_string()),
            started: false,
            finished: false,
            described: None,
            resolved: None,
            seals: None,
            window: None,
            planner: None,
            leaves_reported: false,
            level: None,
            segments_compared: 0,
            sql: None,
            rows: None,
            key_sql: None,
            measures: None,
            leaf_confirm: None,
            outstanding: Vec::new(),
        }
    }

    /// The first commands (both describes); nothing after the first call.
    pub fn start(&mut self) -> Vec<Command> {
        if self.started {
            return Vec::new();
        }
        self.started = true;
        let mut out = Vec::new();
        self.ask(
            &mut out,
            Command::Describe {
                source: self.spec.source.dataset.clone(),
                target: self.spec.target.dataset.clone(),
            },
        );
        out
    }

    /// The calls asked and not answered yet: after a replay, what the runtime must still
    /// do (an answer the log did not commit is asked again).
    pub fn pending(&self) -> Vec<Command> {
        self.outstanding.clone()
    }

    /// The result, once the run is over.
    pub fn result(&self) -> Option<&RunResult> {
        self.finished.then_some(&self.res)
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Drill levels completed so far.
    pub fn levels_done(&self) -> usize {
        self.res.levels.len()
    }

    /// An answer reduced to what the run uses, before it is recorded: a reveal keeps
    /// only the rows asked of that side, one per key, and values only for changed rows
    /// at detailed (the result never shows a missing or extra row's values); both
    /// sides' reveals of a range keep only what the result shows of them
    /// ([`Engine::trim_reveals`]). Pure: a replayed answer is already trimmed, and
    /// trimming it again changes nothing; the result is the one the untrimmed answer
    /// gives.
    pub fn trim(&self, event: Event) -> Event {
        match event {
            Event::Revealed {
                range,
                page,
                side,
                response,
            } => Event::Revealed {
                range,
                page,
                side,
                response: self.trim_reveal((range, page), side, response),
            },
            Event::RevealedBoth {
                range,
                page,
                source,
                target,
            } => {
                let (source, target) = self.trim_reveals(
                    (range, page),
                    self.trim_reveal((range, page), Side::Source, source),
                    self.trim_reveal((range, page), Side::Target, target),
                );
                Event::RevealedBoth {
                    range,
                    page,
                    source,
                    target,
                }
            }
            other => other,
        }
    }

    /// The levels completed so far.
    pub fn levels(&self) -> &[crate::result::LevelOut] {
        &self.res.levels
    }

    /// Whether `event` answers a call the engine asked (and has not had answered).
    pub fn check(&self, event: &Event) -> Result<(), String> {
        if !self.started {
            return Err("the run has not started".into());
        }
        if self.finished {
            return Err("the run is over".into());
        }
        for call in event.calls() {
            if !self.outstanding.iter().any(|c| c.call() == Some(call)) {
                return Err(format!("{call} was not asked"));
            }
        }
        Ok(())
    }

    /// Whether `event` is one side's reveal of a range whose other side is asked and not
    /// answered yet: the runtime then waits for both and records them as one
    /// `revealed_both` (see [`Event::RevealedBoth`]).
    pub fn reveal_partner_pending(&self, event: &Event) -> bool {
        match event {
            Event::Revealed {
                range, page, side, ..
            } => {
                let partner = Call::Reveal(*range, *page, side.other());
                self.outstanding.iter().any(|c| c.call() == Some(partner))
            }
            _ => false,
        }
    }

    /// Steps on one answer. An answer out of place ends the run (internal error).
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        if let Err(why) = self.check(&event) {
            return self.abort(RunError::Internal(format!(
                "engine: event {} out of place: {why}",
                event.kind()
            )));
        }
        for call in event.calls() {
            self.outstanding.retain(|c| c.call() != Some(call));
        }
        let mut out = Vec::new();
        let outcome = match event {
            Event::Described { source, target } => self.on_described(&mut out, *source, *target),
            Event::NonceDrawn { nonce } => self.on_nonce(&mut out, nonce),
            Event::ClockRead { unix_ms } => self.on_clock(&mut out, unix_ms),
            Event::PositionRead { round, position } => self.on_position_read(&mut out, round, position),
            Event::PositionApplied {
                round,
                response,
                elapsed_ms,
            } => self.on_position_applied(&mut out, round, response, elapsed_ms),
            Event::Aggregated {
                level,
                side,
                response,
                elapsed_ms,
                ..
            } => self.on_aggregated(&mut out, level, side, response, elapsed_ms),
            Event::InvestigationSql { leaf, side, sql } => self.on_sql(&mut out, leaf, side, sql),
            Event::KeySql { first, side, sqls } => self.on_key_sql(&mut out, first, side, sqls),
            Event::Measured {
                level,
                side,
                response,
                elapsed_ms,
                ..
            } => self.on_measured(&mut out, level, side, response, elapsed_ms),
            Event::Rechecked {
                round,
                side,
                response,
                ..
            } => self.on_rechecked(&mut out, round, side, response),
            Event::Digests {
                round: 0,
                range,
                side,
                digests,
                ..
            } => self.on_digests(&mut out, range, side, digests),
            Event::Digests {
                round,
                range,
                side,
                digests,
                ..
            } => self.on_confirm_digests(&mut out, round, range, side, digests),
            Event::Waited { round } => self.on_waited(&mut out, round),
            Event::Revealed {
                range,
                page,
                side,
                response,
            } => self.on_revealed(&mut out, (range, page), side, response),
            Event::RevealedBoth {
                range,
                page,
                source,
                target,
            } => self
                .on_revealed(&mut out, (range, page), Side::Source, source)
                .and_then(|()| self.on_revealed(&mut out, (range, page), Side::Target, target)),
            Event::Failed { code, message } => Err(ErrorOut { code, message }),
        };
        if let Err(e) = outcome {
            // calls asked before the failure are not made
            out.retain(|c| c.call().is_none());
            out.extend(self.fail(e));
        }
        out
    }

    /// Ends the run with `e` (a replay that does not load, a run log that cannot be
    /// written): what was found so far is kept.
    pub fn abort(&mut self, e: RunError) -> Vec<Command> {
        if self.finished {
            return Vec::new();
        }
        self.fail(error_out(&e))
    }

    /// Rebuilds the engine from a run's recorded events (after [`Engine::start`]):
    /// every event is stepped on, their commands discarded; [`Engine::pending`] then
    /// says what is left to ask. An event that does not load or is out of place, or a
    /// `started` event with another spec, fails the replay: never guessed around.
    pub fn replay(&mut self, events: &[Value]) -> Result<(), RunError> {
        let spec = serde_json::to_value(&self.spec).map_err(|e| RunError::Internal(e.to_string()))?;
        for (n, v) in events.iter().enumerate() {
            let kind = v.get("event").and_then(Value::as_str).unwrap_or("(none)");
            let seq = v.get("seq").and_then(Value::as_u64).unwrap_or(n as u64 + 1);
            let bad = |what: String| RunError::Internal(format!("run log: event {seq} ({kind}): {what}"));
            // a run log's events are numbered 1, 2, … (its loader checks the chain too);
            // a gap is a lost answer, never skipped over
            if let Some(recorded) = v.get("seq")
                && recorded.as_u64() != Some(n as u64 + 1)
            {
                return Err(bad(format!("is numbered {recorded}, expected {}", n + 1)));
            }
            if kind == "started"
                && let Some(started) = v.get("spec")
                && *started != spec
            {
                return Err(bad(
                    "the run started with another spec; resume it with that spec".into()
                ));
            }
            if NOT_MINE.contains(&kind) {
                continue;
            }
            let event: Event =
                serde_json::from_value(v.clone()).map_err(|e| bad(format!("does not load: {e}")))?;
            self.check(&event)
                .map_err(|why| bad(format!("out of place: {why}")))?;
            let _ = self.step(event);
        }
        Ok(())
    }

    /// Asks for `c`: a call is outstanding until answered.
    fn ask(&mut self, out: &mut Out, c: Command) {
        if c.call().is_some() {
            self.outstanding.push(c.clone());
        }
        out.push(c);
    }

    fn say(&self, out: &mut Out, line: String) {
        out.push(Command::Progress { line });
    }

    fn fail(&mut self, e: ErrorOut) -> Vec<Command> {
        // what the drill found so far is reported even when a gate or an agent stops it
        self.report_leaves();
        self.res.verdict = Verdict::Error;
        self.res.error = Some(e);
        self.finish()
    }

    fn finish(&mut self) -> Vec<Command> {
        if let Some(m) = self.resolved.as_ref().map(|r| r.method) {
            self.res.false_match_probability = m.false_match_probability();
            self.res.false_match_bound = run_false_match_bound(m, self.segments_compared);
        }
        self.finished = true;
        self.outstanding.clear();
        vec![Command::Finish {
            result: Box::new(self.res.clone()),
        }]
    }
}

fn error_out(e: &RunError) -> ErrorOut {
    ErrorOut {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

/// A step's outcome: `Err` ends the run with that error (as the result reports it).
type Step = Result<(), ErrorOut>;

impl From<RunError> for ErrorOut {
    fn from(e: RunError) -> ErrorOut {
        error_out(&e)
    }
}
