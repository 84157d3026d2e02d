//! One reconciliation against two agents: [`run`], the entry point the CLI and the
//! service call, and the runtime around the [`Engine`] (the pure state machine of
//! `tally-engine`). The runtime executes the engine's commands against two
//! [`AgentApi`]s (the calls of one step concurrently), measures and draws what the
//! engine may not (elapsed times, the run nonce, the `max_seconds` gate), and for each
//! answer FIRST appends the event to the run log, THEN steps the engine. A run given
//! its recorded events is rebuilt by replaying them; only the calls still outstanding
//! are made.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

use tally_engine::error::RunError;
use tally_engine::result::{ErrorOut, RunResult};
use tally_engine::spec::Spec;
use tally_engine::{Command, Engine, Event, Side, empty_result};

use crate::client::AgentApi;
use crate::runlog::RunLog;

type Answer<'a> = Pin<Box<dyn Future<Output = Event> + Send + 'a>>;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Progress lines on stderr (default: when stderr is a terminal).
    pub progress: Option<bool>,
    /// Where the run records its events, and what it resumes from.
    pub record: Option<RunRecord>,
}

/// A run's record in the run log (DESIGN §9): the run appends every answer it gets
/// (`engine::Event`) before it takes the next step, and a `level` event after each
/// drill level. A run given its earlier events resumes by replaying them: recorded
/// answers (levels, row digests, reveals, investigation SQL) are not asked again, an
/// unanswered call is. Events of other kinds (`started`, `finished`) are skipped.
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

/// The result of a run stopped before it finished: verdict `error`, code `cancelled`.
pub fn cancelled_result(spec: &Spec, message: String) -> RunResult {
    let mut res = empty_result(spec);
    res.error = Some(ErrorOut {
        code: RunError::Cancelled.code().to_string(),
        message,
    });
    res
}

struct Runtime<'a> {
    source: &'a dyn AgentApi,
    target: &'a dyn AgentApi,
    record: Option<&'a RunRecord>,
    /// The run id every Aggregate and RowDigests call carries (the record's, or a fresh
    /// one for a run without a record), which the agents sign into their answers.
    run_id: String,
    started: Instant,
    progress: bool,
}

/// A run id for a run without a record: unique enough to tell its signed answers from
/// another run's.
fn adhoc_run_id() -> String {
    let nonce = tally_common::seal::run_nonce();
    crate::lifecycle::run_id(&format!("adhoc-{}", hex::encode(&nonce[..6])))
}

/// An answer whose signed envelope is missing or does not say what the answer says:
/// the run stops (it could not be evidenced, and the answer is not the agent's word).
fn unsigned(agent: &str, rpc: &str, message: String) -> RunError {
    RunError::MalformedAnswer {
        agent: agent.to_string(),
        rpc: rpc.to_string(),
        message: format!("its signed envelope {message}"),
    }
}

/// An agent that cannot read or wait for a position (no watermark, a builtin that does
/// not fit its server, a missing privilege) answers FAILED_PRECONDITION: the run's
/// error is then the watermark's, with the agent's words.
fn watermark_refusal(e: RunError) -> RunError {
    match e {
        RunError::Agent {
            agent,
            rpc,
            code,
            message,
        } if code == "FailedPrecondition" => {
            RunError::Watermark(format!("agent {agent} refused {rpc}: {message}"))
        }
        other => other,
    }
}

fn failed(e: &RunError) -> Event {
    Event::Failed {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

/// Milliseconds since a resumed run started (its `started` event's time; `None` when it
/// has none): the `max_seconds` gate and the result's `elapsed_ms` count from the run's
/// start, across restarts and leader changes.
fn ms_since_start(resume: &[Value]) -> Option<u64> {
    let started = resume
        .iter()
        .find(|e| e["event"] == "started")
        .and_then(|e| e["started"].as_str())
        .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())?;
    Some(
        (time::OffsetDateTime::now_utc() - started)
            .whole_milliseconds()
            .max(0) as u64,
    )
}

/// Runs `spec` between two agents (resuming from `opts.record`'s events, if any);
/// never fails: errors become verdict `error`.
pub async fn run(spec: &Spec, source: &dyn AgentApi, target: &dyn AgentApi, opts: &RunOptions) -> RunResult {
    let rt = Runtime {
        source,
        target,
        record: opts.record.as_ref(),
        run_id: opts
            .record
            .as_ref()
            .map_or_else(adhoc_run_id, |r| r.run_id.clone()),
        started: Instant::now(),
        progress: opts.progress.unwrap_or_else(|| std::io::stderr().is_terminal()),
    };
    let mut engine = Engine::new(spec.clone(), source.name(), target.name());
    let mut first = engine.start();
    if let Some(r) = rt.record
        && !r.resume.is_empty()
    {
        let replayed = engine.replay(&r.resume);
        // a level whose last answer was recorded just before the stop has no `level`
        // event yet: progress readers get it now
        let logged = r.resume.iter().filter(|e| e["event"] == "level").count();
        let missing: Vec<Command> = engine
            .levels()
            .iter()
            .skip(logged)
            .map(|l| Command::LevelDone { level_out: l.clone() })
            .collect();
        first = match replayed {
            Err(e) => engine.abort(e),
            Ok(()) => match engine.result() {
                Some(done) => vec![Command::Finish {
                    result: Box::new(done.clone()),
                }],
                None => {
                    rt.say(&format!(
                        "resumed after level {} from the run log: recorded answers are not asked again",
                        engine.levels_done()
                    ));
                    engine.pending()
                }
            },
        };
        first.splice(0..0, missing);
        // where this process (a restarted `tally run`, a new leader) took the run over:
        // each one's part of the time is between two of these
        if engine.result().is_none()
            && let Err(e) = rt
                .append(json!({"event": "resumed", "after_ms": ms_since_start(&r.resume)}))
                .await
        {
            first = engine.abort(e);
        }
    }
    let since_start = || rt.record.and_then(|r| ms_since_start(&r.resume));
    let spent = since_start().map_or(0, |ms| ms / 1000);
    let mut result = match spec.gates.max_seconds {
        None => rt.drive(&mut engine, first).await,
        Some(s) => match tokio::time::timeout(
            Duration::from_secs(s.saturating_sub(spent)),
            rt.drive(&mut engine, first),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => {
                // the calls in flight were dropped with the drive; the gate is an event too
                let e = RunError::Gate {
                    gate: "max_seconds",
                    message: format!("the run took longer than {s} s"),
                };
                let last = rt.answer(&mut engine, failed(&e)).await;
                rt.drive(&mut engine, last).await
            }
        },
    };
    // the whole run's time, from its start (a resumed run's too), not this part's
    result.elapsed_ms = (rt.started.elapsed().as_millis() as u64).max(since_start().unwrap_or(0));
    result
}

impl Runtime<'_> {
    fn say(&self, msg: &str) {
        if self.progress {
            eprintln!("[{:>7.2}s] {msg}", self.started.elapsed().as_secs_f64());
        }
    }

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

    /// Records `event`, then steps the engine on it.
    async fn answer(&self, engine: &mut Engine, event: Event) -> Vec<Command> {
        // what the run does not use is neither recorded nor kept
        let event = engine.trim(event);
        let recorded = match serde_json::to_value(&event) {
            Ok(v) => self.append(v).await,
            Err(e) => Err(RunError::Internal(format!("event {}: {e}", event.kind()))),
        };
        match recorded {
            Ok(()) => engine.step(event),
            Err(e) => engine.abort(e),
        }
    }

    /// Executes commands until the engine finishes.
    async fn drive(&self, engine: &mut Engine, first: Vec<Command>) -> RunResult {
        let mut queue: VecDeque<Command> = first.into();
        let mut calls: FuturesUnordered<Answer<'_>> = FuturesUnordered::new();
        // one side's reveal of a range's page waiting for the other side's
        let mut held: BTreeMap<(usize, u32), Event> = BTreeMap::new();
        loop {
            while let Some(c) = queue.pop_front() {
                match c {
                    Command::Progress { line } => self.say(&line),
                    Command::LevelDone { level_out } => {
                        // for progress readers of the log; replay skips it
                        if let Err(e) = self
                            .append(json!({"event": "level", "level_out": level_out}))
                            .await
                        {
                            queue.extend(engine.abort(e));
                        }
                    }
                    Command::Finish { result } => return *result,
                    call => calls.push(self.call(call)),
                }
            }
            let next = match calls.next().await {
                Some(event) if engine.reveal_partner_pending(&event) => match event {
                    Event::Revealed {
                        range,
                        page,
                        side,
                        response,
                    } => match held.remove(&(range, page)) {
                        Some(Event::Revealed { response: other, .. }) => {
                            let (source, target) = match side {
                                Side::Source => (response, other),
                                Side::Target => (other, response),
                            };
                            self.answer(
                                engine,
                                Event::RevealedBoth {
                                    range,
                                    page,
                                    source,
                                    target,
                                },
                            )
                            .await
                        }
                        _ => {
                            held.insert(
                                (range, page),
                                Event::Revealed {
                                    range,
                                    page,
                                    side,
                                    response,
                                },
                            );
                            continue;
                        }
                    },
                    other => self.answer(engine, other).await,
                },
                Some(event) => self.answer(engine, event).await,
                None => engine.abort(RunError::Internal(
                    "engine: nothing in flight and no result".into(),
                )),
            };
            if next.is_empty()
                && calls.is_empty()
                && let Some(done) = engine.result()
            {
                return done.clone();
            }
            queue.extend(next);
        }
    }

    /// An Aggregate call of this run, its answer checked to be signed for what it says.
    async fn signed_aggregate(
        &self,
        side: Side,
        mut request: tally_common::wire::AggregateRequest,
    ) -> Result<(tally_common::wire::AggregateResponse, Box<serde_json::Value>), RunError> {
        request.run_id = self.run_id.clone();
        request.side = Some(side);
        let asked = Box::new(tally_common::request_json::aggregate(
            &tally_proto::v1::AggregateRequest::from(request.clone()),
        ));
        let agent = self.agent(side);
        let dataset = request.dataset.clone();
        let response = agent.aggregate(request).await?;
        crate::evidence::check_aggregate(&self.run_id, side, &dataset, &response, &asked)
            .map_err(|m| unsigned(agent.name(), "Aggregate", m))?;
        Ok((response, asked))
    }

    fn agent(&self, side: Side) -> &dyn AgentApi {
        match side {
            Side::Source => self.source,
            Side::Target => self.target,
        }
    }

    /// One call; its answer (or failure) as the event the engine steps on.
    fn call(&self, c: Command) -> Answer<'_> {
        Box::pin(async move {
            let t0 = Instant::now();
            let answer = match c {
                Command::Describe { source, target } => {
                    let (s, t) = tokio::join!(self.source.describe(&source), self.target.describe(&target));
                    s.and_then(|s| {
                        t.map(|t| Event::Described {
                            source: Box::new(s),
                            target: Box::new(t),
                        })
                    })
                }
                Command::DrawNonce => Ok(Event::NonceDrawn {
                    nonce: tally_common::seal::run_nonce(),
                }),
                Command::ReadClock => Ok(Event::ClockRead {
                    unix_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64),
                }),
                Command::Aggregate { level, side, request } => self
                    .signed_aggregate(side, request)
                    .await
                    .map(|(response, asked)| Event::Aggregated {
                        level,
                        side,
                        response,
                        elapsed_ms: t0.elapsed().as_millis() as u64,
                        request: Some(asked),
                    }),
                Command::Wait { round, ms } => {
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                    Ok(Event::Waited { round })
                }
                Command::ReadPosition { round, mut request } => {
                    request.run_id = self.run_id.clone();
                    self.source
                        .read_position(request)
                        .await
                        .map_err(watermark_refusal)
                        .map(|r| Event::PositionRead {
                            round,
                            position: r.position,
                        })
                }
                Command::WaitPosition { round, mut request } => {
                    request.run_id = self.run_id.clone();
                    self.target
                        .wait_position(request)
                        .await
                        .map_err(watermark_refusal)
                        .map(|response| Event::PositionApplied {
                            round,
                            response,
                            elapsed_ms: t0.elapsed().as_millis() as u64,
                        })
                }
                Command::RowDigests {
                    round,
                    range,
                    side,
                    mut request,
                } => {
                    request.run_id = self.run_id.clone();
                    request.side = Some(side);
                    let asked = Box::new(tally_common::request_json::row_digests(
                        &tally_proto::v1::RowDigestsRequest::from(request.clone()),
                    ));
                    let agent = self.agent(side);
                    let dataset = request.dataset.clone();
                    agent
                        .row_digests(request)
                        .await
                        .and_then(|d| {
                            crate::evidence::check_digests(&self.run_id, side, &dataset, &d, &asked)
                                .map_err(|m| unsigned(agent.name(), "RowDigests", m))?;
                            Ok(d)
                        })
                        .map(|d| Event::Digests {
                            round,
                            range,
                            side,
                            digests: d.digests,
                            envelope: d.envelope,
                            request: Some(asked),
                        })
                }
                Command::Reveal {
                    range,
                    page,
                    side,
                    request,
                    rows,
                } => tally_engine::events::reveal_answer(
                    range,
                    page,
                    side,
                    self.agent(side).reveal(request, rows).await,
                ),
                Command::Recheck { round, side, request } => {
                    self.signed_aggregate(side, request)
                        .await
                        .map(|(response, asked)| Event::Rechecked {
                            round,
                            side,
                            response,
                            request: Some(asked),
                        })
                }
                Command::Measures {
                    level,
                    side,
                    mut request,
                } => {
                    request.run_id = self.run_id.clone();
                    request.side = Some(side);
                    let asked = Box::new(tally_common::request_json::measures(
                        &tally_proto::v1::MeasuresRequest::from(request.clone()),
                    ));
                    let agent = self.agent(side);
                    let dataset = request.dataset.clone();
                    agent
                        .measures(request)
                        .await
                        .and_then(|response| {
                            crate::evidence::check_measures(&self.run_id, side, &dataset, &response, &asked)
                                .map_err(|m| unsigned(agent.name(), "Measures", m))?;
                            Ok(response)
                        })
                        .map(|response| Event::Measured {
                            level,
                            side,
                            response,
                            elapsed_ms: t0.elapsed().as_millis() as u64,
                            request: Some(asked),
                        })
                }
                Command::InvestigationSql { leaf, side, request } => self
                    .agent(side)
                    .investigation_sql(request)
                    .await
                    .map(|r| Event::InvestigationSql {
                        leaf,
                        side,
                        sql: r.sql,
                    }),
                Command::KeySql { first, side, request } => {
                    // per-key SQL is shown beside results already found: an agent that
                    // cannot give it (a policy that reveals no keys, a failure, an agent
                    // that predates batches and answers none) is said in its place, and
                    // the run keeps its verdict and differences
                    let agent = self.agent(side);
                    let n = request.items.len();
                    let sqls = match agent.investigation_sql(request).await {
                        Ok(r) if r.sqls.len() == n => r.sqls,
                        // an agent that predates batches answers none
                        Ok(r) if r.sqls.is_empty() => vec![
                            format!(
                                "-- agent {} gave no SQL for these keys: it answered 0 of {n} (an agent older than per-key SQL in batches)",
                                agent.name()
                            );
                            n
                        ],
                        Ok(r) => vec![
                            format!(
                                "-- agent {} gave no SQL for these keys: it answered {} for {n} (not one per item)",
                                agent.name(),
                                r.sqls.len()
                            );
                            n
                        ],
                        Err(e) => vec![
                            format!(
                                "-- agent {} gave no SQL for these keys ({}): {}",
                                agent.name(),
                                e.code(),
                                e.to_string().replace('\n', " ")
                            );
                            n
                        ],
                    };
                    Ok(Event::KeySql { first, side, sqls })
                }
                Command::LevelDone { .. } | Command::Progress { .. } | Command::Finish { .. } => {
                    Err(RunError::Internal("runtime: not a call".into()))
                }
            };
            answer.unwrap_or_else(|e| failed(&e))
        })
    }
}
