//! `tally serve`: the coordinator as a long-running service. An HTTPS API starts runs
//! and returns their results; every finished run is kept in the hash-chained run store
//! (store.rs) under `data_dir`, and every request that changes state, or tries to, in
//! the hash-chained audit trail in the run log (audit.rs).
//!
//! ```text
//! GET  /healthz               open      liveness and readiness
//! GET  /v1/runs               viewer    every run: running ones, then the stored ones, newest first
//! GET  /v1/runs/{id}          viewer    202 while running, with the levels done so far
//!                                       (`levels`: counts only), then the stored document
//!                                       (spec and result); below operator without keys,
//!                                       values, leaf bounds or investigation SQL (redact.rs)
//! POST /v1/runs               operator  body: a spec (YAML or JSON) → 202 {"id": …}
//! POST /v1/runs/{id}/cancel   operator  stops a running run: it is stored with verdict error,
//!                                       code cancelled
//! GET  /v1/audit              auditor   the run store's index (a group: every run's chain) and the audit trail
//! GET, PUT, DELETE /v1/schedules[/{name}]  scheduled runs (schedules.rs beside this file)
//! ```
//!
//! With `cluster` in the config the service is one replica of a Raft group (cluster.rs
//! beside this file): runs are recorded in the replicated run log, finished documents
//! in their `finished` event, only the leader drives runs and followers forward writes.
//!
//! The roles are DESIGN §12's, each including the ones before it: viewer < operator <
//! auditor < admin. Callers log in with a client certificate named in `api.clients`
//! (verified against `api.tls.ca`) or `Authorization: Bearer <token>` with the token's
//! SHA-256 in `api.tokens` (api_auth.rs): no credentials is 401, too small a role 403
//! naming the role needed. The API speaks HTTPS with its own certificate (`api.tls`,
//! api_tls.rs); plain HTTP only on a loopback address with `--insecure-loopback`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{ConnectInfo, Extension, Path as UrlPath, Query, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::json;
use tally_common::config_file::parse_yaml;
use tokio::sync::{Mutex, Semaphore, oneshot};

use crate::api_auth::{Actor, Credentials};
use crate::api_tls::{Peer, PlainListener, TlsListener};
use crate::audit::{AuditLog, Event};
use crate::client::{Agent, TlsMaterial};
use crate::config::{CoordinatorConfig, Role};
use crate::redact::document_for_viewer;
use crate::runlog::{RunLog, SqliteRunLog};

mod cluster;
mod schedules;
use crate::runtime::{RunOptions, RunRecord, cancelled_result, run};
use crate::store::RunStore;
use tally_engine::spec::Spec;

/// Runs executing at once; more wait their turn.
const CONCURRENT_RUNS: usize = 4;

/// How `tally serve` was started.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeOptions {
    /// Plain HTTP, allowed only without `api.tls` and on a loopback address.
    pub insecure_loopback: bool,
}

struct Running {
    name: String,
    started: String,
    /// Taken by the first cancel request; the run task waits on the other end.
    cancel: Option<oneshot::Sender<String>>,
    /// The run's task, aborted when this replica stops being the leader.
    task: Option<tokio::task::AbortHandle>,
    /// The schedule whose tick this run is.
    schedule: Option<String>,
}

struct ServeState {
    agents: BTreeMap<String, Agent>,
    store: RunStore,
    /// Every run's events (DESIGN §9): a run the service did not finish is resumed
    /// from them when it starts again (single node: SQLite; a group: Raft).
    runlog: Arc<dyn RunLog>,
    /// This replica's Raft node, with `cluster`.
    node: Option<crate::raft::Node>,
    audit: AuditLog,
    credentials: Credentials,
    running: Mutex<BTreeMap<String, Running>>,
    permits: Semaphore,
    counter: AtomicU64,
    /// Signs each finished run's statement and checkpoint (DESIGN §12): the key of the
    /// coordinator's client certificate.
    signer: crate::evidence::Signer,
    /// One checkpoint of the log at a time (after a run, or the minute's).
    checkpointing: Mutex<()>,
}

/// How long an audit event may take to commit: a leader cut off from its majority
/// refuses the call rather than wait for the partition to heal.
const AUDIT_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// What a request to be audited tried: (method, path), the action, the run it names.
#[derive(Debug, Clone, Copy)]
struct Attempt<'a> {
    req: (&'a Method, &'a str),
    action: &'a str,
    run: Option<&'a str>,
}

/// An authenticated request's caller, put into the request by [`authenticate`].
#[derive(Debug, Clone)]
struct Caller {
    actor: Actor,
    remote: SocketAddr,
}

fn now() -> String {
    crate::lifecycle::now_rfc3339()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Binds and serves until `shutdown` resolves. Reports the bound address and scheme
/// (`https` or `http`) via `ready`.
pub async fn serve(
    cfg: &CoordinatorConfig,
    config_path: &Path,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr, &'static str),
) -> Result<(), String> {
    cfg.validate_serve(config_path, opts.insecure_loopback)
        .map_err(|e| e.to_string())?;
    let (Some(listen), Some(data_dir)) = (cfg.listen, cfg.data_dir.as_ref()) else {
        unreachable!("validate_serve checks listen and data_dir");
    };
    let tls_server = match &cfg.api.tls {
        Some(t) => {
            Some(crate::api_tls::server_config(t).map_err(|e| format!("{}: {e}", config_path.display()))?)
        }
        None => None,
    };
    let store = RunStore::open(data_dir).map_err(|e| format!("data_dir: {e}"))?;
    let node = match &cfg.cluster {
        Some(c) => Some(crate::raft::node::start(c, config_path, data_dir).await?),
        None => None,
    };
    let runlog: Arc<dyn RunLog> = match &node {
        Some(n) => Arc::new(crate::raft::RaftRunLog::new(n.raft.clone(), n.reader.clone())),
        None => Arc::new(
            SqliteRunLog::open(&data_dir.join("runlog.sqlite"))
                .await
                .map_err(|e| format!("data_dir: {e}"))?,
        ),
    };
    let audit = match &node {
        // the group's trail is replicated; an audit.jsonl of an earlier version holds
        // this replica's own events from before, and is left as it is
        Some(_) => {
            if data_dir.join("audit.jsonl").exists() {
                tracing::info!(
                    "audit: audit.jsonl holds this replica's events from before the trail was replicated; it is kept as it is and no longer written"
                );
            }
            AuditLog::new(runlog.clone())
        }
        None => AuditLog::open_single(runlog.clone(), data_dir)
            .await
            .map_err(|e| format!("data_dir: {e}"))?,
    };
    let tls = TlsMaterial::load(&cfg.tls).map_err(|e| format!("{}: {e}", config_path.display()))?;
    let signer = crate::evidence::Signer::load(&cfg.tls)
        .map_err(|e| format!("{}: tls: {e}", config_path.display()))?;
    let mut agents = BTreeMap::new();
    for (name, a) in &cfg.agents {
        agents.insert(
            name.clone(),
            Agent::new(name, &a.endpoint, &tls).map_err(|e| e.to_string())?,
        );
    }
    let state = Arc::new(ServeState {
        agents,
        store,
        runlog,
        node,
        audit,
        credentials: Credentials::from_config(&cfg.api),
        running: Mutex::new(BTreeMap::new()),
        permits: Semaphore::new(CONCURRENT_RUNS),
        counter: AtomicU64::new(0),
        signer,
        checkpointing: Mutex::new(()),
    });
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    match &state.node {
        Some(node) => {
            let peers = node
                .serve_peers(Arc::new(cluster::ForwardTo(state.clone())), shutdown.clone())
                .await?;
            tracing::info!(%peers, id = node.id, advertise = %node.advertise, "cluster: peer endpoint listening");
            // runs are resumed by the leader only, when it becomes leader
            cluster::watch_leadership(state.clone());
        }
        None => resume_unfinished(&state).await?,
    }
    schedules::start(state.clone());
    start_checkpoints(state.clone());
    let need = |role: Role| middleware::from_fn_with_state((state.clone(), role), require);
    let api = Router::new()
        .route("/v1/runs", get(list_runs).layer(need(Role::Viewer)))
        .route("/v1/runs", post(start_run).layer(need(Role::Operator)))
        .route("/v1/runs/{id}", get(get_run).layer(need(Role::Viewer)))
        .route(
            "/v1/runs/{id}/cancel",
            post(cancel_run).layer(need(Role::Operator)),
        )
        .route(
            "/v1/runs/{id}/evidence",
            get(run_evidence).layer(need(Role::Auditor)),
        )
        .route("/v1/audit", get(audit_log).layer(need(Role::Auditor)))
        .route("/v1/log", get(export_log).layer(need(Role::Auditor)))
        .route(
            "/v1/checkpoint",
            get(latest_checkpoint).layer(need(Role::Auditor)),
        )
        .route("/v1/schedules", get(schedules::list).layer(need(Role::Viewer)))
        .route(
            "/v1/schedules/{name}",
            put(schedules::put)
                .delete(schedules::delete)
                .layer(need(Role::Admin)),
        )
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state.clone());
    let app = Router::new().route("/healthz", get(|| async { "ok" })).merge(api);
    let app = app.into_make_service_with_connect_info::<Peer>();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listen {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    match tls_server {
        Some(tls) => {
            let listener = TlsListener::new(listener, tls).map_err(|e| e.to_string())?;
            ready(local, "https");
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| e.to_string())
        }
        None => {
            tracing::warn!(%local, "api: plain HTTP on a loopback address (--insecure-loopback)");
            ready(local, "http");
            axum::serve(PlainListener(listener), app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| e.to_string())
        }
    }
}

impl ServeState {
    /// Appends an audit event; a request answered `status` by `caller` (absent when it
    /// did not log in). In a group the event is written by the leader: a follower
    /// hands it over, and a call it cannot audit is not done.
    async fn record(
        &self,
        caller: Option<&Caller>,
        remote: SocketAddr,
        what: Attempt<'_>,
        status: StatusCode,
        reason: Option<String>,
    ) -> Result<(), String> {
        let Attempt { req, action, run } = what;
        let event = Event {
            actor: caller.map(|c| c.actor.name.clone()),
            via: caller.map(|c| c.actor.via.to_string()),
            role: caller.map(|c| c.actor.role.name().to_string()),
            remote: remote.to_string(),
            method: req.0.to_string(),
            path: req.1.to_string(),
            action: action.to_string(),
            run: run.map(str::to_string),
            status: status.as_u16(),
            reason,
            replica: self.node.as_ref().map(|n| n.id),
            time: Some(now()),
        };
        self.audit_event(event).await
    }

    /// Writes `event` to the trail: on the leader (or a single node) through the run
    /// log, within [`AUDIT_WITHIN`]; a refusal answered by a follower is handed to the
    /// leader. An accepted call is audited only where it is carried out, so a replica
    /// that is not (or no longer) the leader records no "accepted" for a change it
    /// will not make: the call is then refused.
    async fn audit_event(&self, event: Event) -> Result<(), String> {
        let refusal = event.status >= 400;
        let follower = self.node.as_ref().is_some_and(|n| !n.is_leader());
        let outcome = if follower {
            Err(crate::runlog::RunLogError::NotLeader { leader: None })
        } else if !refusal {
            // an accepted call reaches here only once a majority confirmed this leader
            // (forward_if_follower): no deadline, which could leave an event committed
            // after its call was refused
            self.audit.record(event.clone()).await.map(|_| ())
        } else {
            // a refusal skips that confirmation (a failed login): a leader cut off from
            // its majority would wait for the heal
            match tokio::time::timeout(AUDIT_WITHIN, self.audit.record(event.clone())).await {
                Ok(r) => r.map(|_| ()),
                Err(_) => {
                    let e = format!("no majority committed it within {AUDIT_WITHIN:?}");
                    tracing::warn!(error = %e, "api: cannot write the audit trail");
                    return Err(e);
                }
            }
        };
        match outcome {
            Ok(()) => Ok(()),
            Err(crate::runlog::RunLogError::NotLeader { .. }) if refusal => {
                cluster::forward_audit(self, event).await.inspect_err(
                    |e| tracing::warn!(error = %e, "api: a refusal's audit event was not recorded"),
                )
            }
            Err(crate::runlog::RunLogError::NotLeader { .. }) => {
                let e = "this replica no longer leads the group".to_string();
                tracing::warn!(error = %e, "api: cannot write the audit trail");
                Err(e)
            }
            Err(e) => {
                // the store itself: every audited call fails until someone looks
                tracing::error!(error = %e, "api: cannot write the audit trail");
                Err(e.to_string())
            }
        }
    }

    /// A refused state change: recorded, then answered.
    async fn refuse(&self, caller: &Caller, what: Attempt<'_>, status: StatusCode, msg: String) -> Response {
        let _ = self
            .record(Some(caller), caller.remote, what, status, Some(msg.clone()))
            .await;
        error(status, msg)
    }
}

/// Resolves the caller from its client certificate or bearer token; 401 (403 for a
/// certificate without a role) otherwise. Refused writes (any method but GET and HEAD)
/// are audit events.
async fn authenticate(
    State(state): State<Arc<ServeState>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    mut req: Request,
    next: Next,
) -> Response {
    // a header that is not text is no token
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or_default());
    match state
        .credentials
        .authenticate(peer.cert_names.as_deref(), authorization)
    {
        Ok(actor) => {
            req.extensions_mut().insert(Caller {
                actor,
                remote: peer.addr,
            });
            next.run(req).await
        }
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
            if req.method() != Method::GET && req.method() != Method::HEAD {
                let _ = state
                    .record(
                        None,
                        peer.addr,
                        Attempt {
                            req: (req.method(), req.uri().path()),
                            action: "request",
                            run: None,
                        },
                        status,
                        Some(e.to_string()),
                    )
                    .await;
            }
            tracing::info!(remote = %peer.addr, error = %e, "api: not logged in");
            error(status, e.to_string())
        }
    }
}

/// A route's role: 403 naming the role needed when the caller's is lower.
async fn require(
    State((state, needed)): State<(Arc<ServeState>, Role)>,
    Extension(caller): Extension<Caller>,
    req: Request,
    next: Next,
) -> Response {
    if caller.actor.role >= needed {
        return next.run(req).await;
    }
    let msg = format!(
        "this needs the role {} (or above); {} has {}",
        needed.name(),
        caller.actor.name,
        caller.actor.role.name()
    );
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return state
            .refuse(
                &caller,
                Attempt {
                    req: (req.method(), req.uri().path()),
                    action: "request",
                    run: None,
                },
                StatusCode::FORBIDDEN,
                msg,
            )
            .await;
    }
    error(StatusCode::FORBIDDEN, msg)
}

async fn start_run(
    State(state): State<Arc<ServeState>>,
    Extension(caller): Extension<Caller>,
    body: String,
) -> Response {
    if let Some(answer) = cluster::forward_if_follower(&state, &caller, "start_run", None, &body).await {
        return answer;
    }
    let req = (&Method::POST, "/v1/runs");
    let refuse = |msg: String| {
        state.refuse(
            &caller,
            Attempt {
                req,
                action: "start_run",
                run: None,
            },
            StatusCode::BAD_REQUEST,
            msg,
        )
    };
    let spec: Spec = match parse_yaml(Path::new("request body"), &body) {
        Ok(s) => s,
        Err(e) => return refuse(e.to_string()).await,
    };
    if let Err(e) = spec.validate(Path::new("request body")) {
        return refuse(e.to_string()).await;
    }
    for (side, agent) in [("source", &spec.source.agent), ("target", &spec.target.agent)] {
        if !state.agents.contains_key(agent) {
            let known = state.agents.keys().cloned().collect::<Vec<_>>().join(", ");
            return refuse(format!(
                "{side}.agent {agent:?} is not configured (agents: {known})"
            ))
            .await;
        }
    }
    let n = state.counter.fetch_add(1, Ordering::Relaxed);
    // in a group, two leaders one after the other must not both name a run `…-0`
    let id = crate::lifecycle::run_id(&match &state.node {
        Some(node) => format!("{}-{n}", node.id),
        None => n.to_string(),
    });
    // no audit event, no run
    if let Err(e) = state
        .record(
            Some(&caller),
            caller.remote,
            Attempt {
                req,
                action: "start_run",
                run: Some(&id),
            },
            StatusCode::ACCEPTED,
            Some(format!("spec {:?}", spec.name)),
        )
        .await
    {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the run was not started: cannot write the audit log: {e}"),
        );
    }
    let started = now();
    // the run's record starts before the run: a run the service stops during is
    // resumed from it when the service starts again
    let event = crate::lifecycle::started_event(&spec, &started, &[]);
    if let Err(e) = state.runlog.start(&id, event).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the run was not started: cannot write the run log: {e}"),
        );
    }
    spawn_run(state.clone(), id.clone(), spec, started, Vec::new(), None).await;
    (
        StatusCode::ACCEPTED,
        Json(json!({ "id": id, "state": "running" })),
    )
        .into_response()
}

fn object(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// Runs `spec` as run `id` in the background, recording it in the run log (resuming
/// from `resume`, its earlier events), then stores the result and closes the record.
async fn spawn_run(
    st: Arc<ServeState>,
    id: String,
    spec: Spec,
    started: String,
    resume: Vec<serde_json::Value>,
    schedule: Option<String>,
) {
    let (spec_name, started_at) = (spec.name.clone(), started.clone());
    let (cancel, cancelled) = oneshot::channel::<String>();
    // the term this replica leads (a group only): the run is closed only in it
    let term = cluster::leading_term(&st);
    let mut running = st.running.lock().await;
    // one task per run: a new leader's resume and the scheduler (or a start) that
    // committed the run's first event just before it may both spawn it
    if running.contains_key(&id) {
        tracing::info!(run = %id, "the run is driven already");
        return;
    }
    let run_id = id.clone();
    let task_state = st.clone();
    let task = tokio::spawn(async move {
        let st = task_state;
        let (source, target) = (&st.agents[&spec.source.agent], &st.agents[&spec.target.agent]);
        let opts = RunOptions {
            progress: Some(false),
            record: Some(RunRecord {
                log: st.runlog.clone(),
                run_id: run_id.clone(),
                resume,
            }),
        };
        // dropping the run future on cancel drops its in-flight calls; agents abandon
        // the queries
        let result = tokio::select! {
            r = async {
                let _permit = st.permits.acquire().await;
                run(&spec, source, target, &opts).await
            } => r,
            Ok(who) = cancelled => cancelled_result(&spec, format!("cancelled by {who}")),
        };
        let verdict = serde_json::to_value(&result.verdict).unwrap_or_default();
        let verdict = verdict.as_str().unwrap_or("error").to_string();
        let doc =
            json!({ "id": run_id, "started": started, "finished": now(), "spec": spec, "result": result });
        if !cluster::still_leading(&st, term) {
            // deposed while it ran (its appends were refused): the new leader resumes it
            tracing::info!(run = %run_id, "no longer the leader: the run is left to the new one");
            return;
        }
        // a single node keeps the document in its run store; a group in the finished
        // event, which every replica holds
        let stored = match &st.node {
            Some(_) => Ok(()),
            None => st.store.append(&run_id, &spec.name, &verdict, &doc).map(|_| ()),
        };
        match stored {
            Ok(()) => {
                let event = match &st.node {
                    Some(_) => {
                        json!({"event": "finished", "verdict": verdict, "name": spec.name, "document": doc})
                    }
                    None => json!({"event": "finished", "verdict": verdict}),
                };
                // a cancelled run's last append, dropped in flight, may still commit ahead
                // of this one (Raft goes on with a write its caller stopped waiting for):
                // the next number is then taken, and this one is tried again after it
                let mut closed = false;
                for attempt in 1..=5 {
                    match st.runlog.append(&run_id, object(event.clone())).await {
                        Err(crate::runlog::RunLogError::Conflict { .. }) if attempt < 5 => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            tracing::error!(run = %run_id, error = %e, "cannot close the run's record");
                            break;
                        }
                        Ok(_) => {
                            closed = true;
                            break;
                        }
                    }
                }
                if closed {
                    seal(&st, &run_id, &result).await;
                }
            }
            Err(e) => tracing::error!(run = %run_id, error = %e, "cannot store the run"),
        }
        st.running.lock().await.remove(&run_id);
    });
    running.insert(
        id,
        Running {
            name: spec_name,
            started: started_at,
            cancel: Some(cancel),
            task: Some(task.abort_handle()),
            schedule,
        },
    );
}

/// Signs a finished run's evidence into its record (see [`crate::evidence::seal_run`]);
/// a failure is logged (the run's result stands; its bundle is refused until a restart
/// seals it).
async fn seal(st: &ServeState, run_id: &str, result: &tally_engine::result::RunResult) {
    if let Err(e) = crate::evidence::seal_run(st.runlog.as_ref(), run_id, result, &st.signer).await {
        tracing::error!(run = %run_id, error = %e, "cannot sign the run's evidence");
    }
    checkpoint(st).await;
}

/// Pins the runs that moved in the log's ledger and signs its head (crate::ledger).
async fn checkpoint(st: &ServeState) {
    let _one = st.checkpointing.lock().await;
    if let Err(e) = crate::ledger::checkpoint(st.runlog.as_ref(), &st.signer).await {
        tracing::warn!(error = %e, "cannot checkpoint the run log");
    }
}

/// How often the log is checkpointed while runs move.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Every minute, on the leader (or a single node), a checkpoint of what moved.
fn start_checkpoints(st: Arc<ServeState>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(CHECKPOINT_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            if st.node.is_some() && cluster::leading_term(&st).is_none() {
                continue;
            }
            checkpoint(&st).await;
        }
    });
}

/// `GET /v1/log` (auditor): every line of the run log, the ledger and the signed
/// checkpoints included, for `tally audit verify`.
async fn export_log(State(state): State<Arc<ServeState>>) -> Response {
    match crate::ledger::export(state.runlog.as_ref()).await {
        Ok(lines) => Json(json!({ "lines": lines })).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `GET /v1/checkpoint` (auditor): the latest signed checkpoint of the log.
async fn latest_checkpoint(State(state): State<Arc<ServeState>>) -> Response {
    match crate::ledger::latest(state.runlog.as_ref()).await {
        Ok(Some(cp)) => Json(cp).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "no checkpoint yet: one is signed after the first run",
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The result of a finished run from its record: the finished event's document (a
/// group) or the run store's (a single node).
fn recorded_result(
    st: &ServeState,
    run_id: &str,
    events: &[serde_json::Value],
) -> Option<tally_engine::result::RunResult> {
    let doc = events
        .iter()
        .rev()
        .find(|e| e["event"] == "finished")
        .and_then(|e| e.get("document").cloned())
        .or_else(|| st.store.document(run_id))?;
    serde_json::from_value(doc["result"].clone()).ok()
}

/// Resumes every run the run log holds unfinished: started, without a `finished`
/// event, and not in the run store (a run stored before its record was closed is
/// closed now).
async fn resume_unfinished(state: &Arc<ServeState>) -> Result<(), String> {
    let runs = state.runlog.runs().await.map_err(|e| e.to_string())?;
    let stored = state.store.entries().map_err(|e| e.to_string())?;
    for r in runs {
        if crate::ledger::is_internal(&r.run_id) || state.running.lock().await.contains_key(&r.run_id) {
            continue;
        }
        let events = state.runlog.load(&r.run_id).await.map_err(|e| e.to_string())?;
        if events.iter().any(|e| e["event"] == "finished") {
            // stopped between closing the record and signing it
            if !events.iter().any(|e| e["event"] == "evidence")
                && let Some(result) = recorded_result(state, &r.run_id, &events)
            {
                seal(state, &r.run_id, &result).await;
            }
            continue;
        }
        if let Some(entry) = stored.iter().find(|e| e.id == r.run_id) {
            let event = json!({"event": "finished", "verdict": entry.verdict});
            state
                .runlog
                .append(&r.run_id, object(event))
                .await
                .map_err(|e| e.to_string())?;
            continue;
        }
        let Some(start) = events.iter().find(|e| e["event"] == "started") else {
            continue;
        };
        let spec: Spec = match serde_json::from_value(start["spec"].clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(run = %r.run_id, error = %e, "an unfinished run's spec does not load; not resumed");
                continue;
            }
        };
        if [&spec.source.agent, &spec.target.agent]
            .iter()
            .any(|a| !state.agents.contains_key(*a))
        {
            tracing::error!(run = %r.run_id, "an unfinished run names an agent no longer configured; not resumed");
            continue;
        }
        let levels = events.iter().filter(|e| e["event"] == "level").count();
        tracing::info!(run = %r.run_id, levels, "resuming a run the service did not finish");
        let started = start["started"].as_str().unwrap_or_default().to_string();
        let schedule = start["schedule"].as_str().map(str::to_string);
        spawn_run(state.clone(), r.run_id.clone(), spec, started, events, schedule).await;
    }
    Ok(())
}

/// `GET /v1/runs/{id}/evidence` (auditor): the run's evidence bundle (DESIGN §12).
async fn run_evidence(State(state): State<Arc<ServeState>>, UrlPath(id): UrlPath<String>) -> Response {
    use crate::evidence::BundleError;
    if !tally_common::evidence::valid_run_id(&id) || crate::ledger::is_internal(&id) {
        return error(StatusCode::NOT_FOUND, format!("no run {id}"));
    }
    match crate::evidence::bundle(state.runlog.as_ref(), &id).await {
        Ok(b) => Json(b).into_response(),
        Err(e @ BundleError::NoRun(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ BundleError::NotSealed(_)) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /v1/runs?limit=&cursor=&verdict=&name=`: a page of runs, newest first.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    /// Runs per page: 1 to [`MAX_PAGE`], [`DEFAULT_PAGE`] unless given.
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before: this page holds the runs older than it.
    pub cursor: Option<String>,
    /// `match`, `differ`, `error`, or `running` for the runs not finished.
    pub verdict: Option<String>,
    /// Only runs of this spec name.
    pub name: Option<String>,
}

pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1000;

impl RunsQuery {
    /// The page size, or why the query is refused (naming the parameter).
    pub fn check(&self) -> Result<usize, String> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(format!("limit={limit}: give 1 to {MAX_PAGE} runs per page"));
        }
        if let Some(v) = &self.verdict
            && !["match", "differ", "error", "running"].contains(&v.as_str())
        {
            return Err(format!("verdict={v}: use match, differ, error or running"));
        }
        Ok(limit)
    }

    /// Whether a listed run (`{"id", "name", "state", "verdict"?}`) is on this query's
    /// pages at all (the cursor aside).
    pub fn wants(&self, run: &serde_json::Value) -> bool {
        let verdict_ok = match self.verdict.as_deref() {
            None => true,
            Some("running") => run["state"] == "running",
            Some(v) => run["state"] == "done" && run["verdict"] == v,
        };
        verdict_ok && self.name.as_deref().is_none_or(|n| run["name"] == n)
    }

    /// Whether run `id` comes after the cursor (is older than the cursor's run).
    pub fn after_cursor(&self, id: &str) -> bool {
        self.cursor
            .as_deref()
            .is_none_or(|c| newest_first(c, id) == std::cmp::Ordering::Less)
    }
}

/// Newest first: a run id starts with its start in hex milliseconds, so a longer id
/// prefix is a later start; ties go by the id's text, descending.
pub fn newest_first(a: &str, b: &str) -> std::cmp::Ordering {
    let start = |id: &str| {
        let hex = id.split('-').next().unwrap_or_default();
        (hex.len(), hex.to_string(), id.to_string())
    };
    start(b).cmp(&start(a))
}

/// One page of `runs` (newest first, every one already wanted): at most `limit` of
/// them, and the cursor of the next page when there are more.
pub fn page(runs: Vec<serde_json::Value>, limit: usize) -> serde_json::Value {
    let more = runs.len() > limit;
    let runs: Vec<serde_json::Value> = runs.into_iter().take(limit).collect();
    let next = if more {
        runs.last().map(|r| r["id"].clone())
    } else {
        None
    };
    json!({ "runs": runs, "next_cursor": next })
}

async fn list_runs(
    State(state): State<Arc<ServeState>>,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{}: the query takes limit, cursor, verdict and name (GET /v1/runs?limit=100&verdict=differ)",
                    e.body_text()
                ),
            );
        }
    };
    let limit = match q.check() {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if state.node.is_some() {
        return match cluster::list_runs(&state, &q, limit).await {
            Ok(runs) => Json(page(runs, limit)).into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        };
    }
    let mut runs: Vec<serde_json::Value> = state
        .running
        .lock()
        .await
        .iter()
        .map(|(id, r)| json!({ "id": id, "name": r.name, "state": "running", "started": r.started }))
        .collect();
    match state.store.entries() {
        Ok(entries) => runs.extend(entries.into_iter().map(|e| {
            json!({ "id": e.id, "name": e.name, "state": "done", "verdict": e.verdict, "finished": e.finished, "seq": e.seq })
        })),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
    // a run just finished can be both still running and in the store: listed once, done
    let done: std::collections::HashSet<String> = runs
        .iter()
        .filter(|r| r["state"] == "done")
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect();
    runs.retain(|r| r["state"] == "done" || !done.contains(r["id"].as_str().unwrap_or_default()));
    runs.retain(|r| q.wants(r) && q.after_cursor(r["id"].as_str().unwrap_or_default()));
    runs.sort_by(|a, b| {
        newest_first(
            a["id"].as_str().unwrap_or_default(),
            b["id"].as_str().unwrap_or_default(),
        )
    });
    runs.truncate(limit + 1);
    Json(page(runs, limit)).into_response()
}

async fn get_run(
    State(state): State<Arc<ServeState>>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    // the log's own chains (the ledger, the audit trail) are no runs, and are not read
    if crate::ledger::is_internal(&id) {
        return error(StatusCode::NOT_FOUND, format!("no run {id}"));
    }
    let running = state
        .running
        .lock()
        .await
        .get(&id)
        .map(|r| (r.name.clone(), r.started.clone()));
    if let Some((name, started)) = running {
        // progress: the levels committed so far (counts only, no keys: viewers see them)
        let levels = match state.runlog.load(&id).await {
            Ok(events) => cluster::levels_of(&events),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        return (
            StatusCode::ACCEPTED,
            Json(json!({ "id": id, "name": name, "state": "running", "started": started, "levels": levels })),
        )
            .into_response();
    }
    if state.node.is_some() {
        return match cluster::logged_run(&state, &id).await {
            Ok(Some(cluster::Logged::Done(doc))) if caller.actor.role >= Role::Operator => {
                Json(doc).into_response()
            }
            Ok(Some(cluster::Logged::Done(doc))) => Json(document_for_viewer(&doc)).into_response(),
            Ok(Some(cluster::Logged::Running { name, started, levels })) => (
                StatusCode::ACCEPTED,
                Json(json!({ "id": id, "name": name, "state": "running", "started": started, "levels": levels })),
            )
                .into_response(),
            // a follower may not have applied the run's start yet: the leader answers
            // (404 only when the group does not know the run), never a false 404 here
            Ok(None) => match cluster::forward_read(&state, &caller, "get_run", &id).await {
                Some(answer) => answer,
                None => error(StatusCode::NOT_FOUND, format!("no run {id}")),
            },
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        };
    }
    match state.store.document(&id) {
        Some(doc) if caller.actor.role >= Role::Operator => Json(doc).into_response(),
        Some(doc) => Json(document_for_viewer(&doc)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no run {id}")),
    }
}

async fn cancel_run(
    State(state): State<Arc<ServeState>>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if let Some(answer) = cluster::forward_if_follower(&state, &caller, "cancel_run", Some(&id), "").await {
        return answer;
    }
    let path = format!("/v1/runs/{id}/cancel");
    let req = (&Method::POST, path.as_str());
    let mut running = state.running.lock().await;
    let Some(r) = running.get_mut(&id) else {
        let finished = match &state.node {
            Some(_) => matches!(
                cluster::logged_run(&state, &id).await,
                Ok(Some(cluster::Logged::Done(_)))
            ),
            None => state.store.document(&id).is_some(),
        };
        let (status, msg) = if finished {
            (StatusCode::CONFLICT, format!("run {id} has finished"))
        } else {
            (StatusCode::NOT_FOUND, format!("no run {id}"))
        };
        return state
            .refuse(
                &caller,
                Attempt {
                    req,
                    action: "cancel_run",
                    run: Some(&id),
                },
                status,
                msg,
            )
            .await;
    };
    if r.cancel.is_none() {
        let msg = format!("run {id} is being cancelled already");
        return state
            .refuse(
                &caller,
                Attempt {
                    req,
                    action: "cancel_run",
                    run: Some(&id),
                },
                StatusCode::CONFLICT,
                msg,
            )
            .await;
    }
    if let Err(e) = state
        .record(
            Some(&caller),
            caller.remote,
            Attempt {
                req,
                action: "cancel_run",
                run: Some(&id),
            },
            StatusCode::ACCEPTED,
            None,
        )
        .await
    {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the run was not cancelled: cannot write the audit log: {e}"),
        );
    }
    if let Some(tx) = r.cancel.take() {
        let _ = tx.send(caller.actor.name.clone());
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({ "id": id, "state": "cancelling" })),
    )
        .into_response()
}

/// Both chains, verified as they are read: what was run (the run store's index; in a
/// group each run's own chain in the replicated log) and the audit trail (who changed
/// what, from where, on which replica), the same on every replica of a group.
async fn audit_log(State(state): State<Arc<ServeState>>) -> Response {
    let (events, events_seq, events_head) = match state.audit.events().await {
        Ok(e) => e,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let events = json!({ "seq": events_seq, "head": events_head, "entries": events });
    if state.node.is_some() {
        // a group keeps runs in the replicated run log, not in a local store: each run's
        // own chain (its event count and head)
        let heads = match state.runlog.runs().await {
            Ok(h) => h,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        let runs: Vec<serde_json::Value> = heads
            .iter()
            .filter(|h| !crate::ledger::is_internal(&h.run_id))
            .map(|h| json!({ "id": h.run_id, "events": h.events, "head": h.head }))
            .collect();
        return Json(json!({
            "runs": { "log": "replicated", "entries": runs },
            "events": events,
        }))
        .into_response();
    }
    let runs = match state.store.entries() {
        Ok(r) => r,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let (runs_seq, runs_head) = state.store.head();
    Json(json!({
        "runs": { "seq": runs_seq, "head": runs_head, "entries": runs },
        "events": events,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::MemoryRunLog;
    use std::time::{Duration, Instant};

    /// Pages of a history newest first, each `limit` long, the cursor leading from one
    /// to the next without a run twice or a run lost, filters applied before paging.
    #[test]
    fn runs_are_paged_newest_first_by_cursor_and_filtered() {
        // ids as lifecycle::run_id mints them: hex milliseconds (one more digit later on)
        let ids = ["ffff-1", "10000-0", "10001-3", "10001-7", "fffe-0"];
        let all: Vec<serde_json::Value> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                json!({"id": id, "name": if i % 2 == 0 { "a" } else { "b" }, "state": "done",
                       "verdict": if i == 2 { "match" } else { "differ" }})
            })
            .collect();
        let list = |q: &RunsQuery| {
            let mut runs: Vec<serde_json::Value> = all
                .iter()
                .filter(|r| q.wants(r) && q.after_cursor(r["id"].as_str().unwrap()))
                .cloned()
                .collect();
            runs.sort_by(|a, b| newest_first(a["id"].as_str().unwrap(), b["id"].as_str().unwrap()));
            page(runs, q.check().unwrap())
        };
        let mut q = RunsQuery {
            limit: Some(2),
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let p = list(&q);
            let runs = p["runs"].as_array().unwrap();
            assert!(runs.len() <= 2);
            seen.extend(runs.iter().map(|r| r["id"].as_str().unwrap().to_string()));
            match p["next_cursor"].as_str() {
                Some(c) => q.cursor = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(seen, ["10001-7", "10001-3", "10000-0", "ffff-1", "fffe-0"]);
        let differ_b = RunsQuery {
            verdict: Some("differ".into()),
            name: Some("b".into()),
            ..Default::default()
        };
        let p = list(&differ_b);
        let ids: Vec<&str> = p["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["10001-7", "10000-0"]);
        assert_eq!(p["next_cursor"], serde_json::Value::Null);
        for bad in [
            RunsQuery {
                limit: Some(0),
                ..Default::default()
            },
            RunsQuery {
                limit: Some(MAX_PAGE + 1),
                ..Default::default()
            },
            RunsQuery {
                verdict: Some("maybe".into()),
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_run_spawned_twice_is_driven_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        tally_common::pki::init_dir(d, &[tally_common::pki::AgentLeaf::new("dc1")]).unwrap();
        let tls = TlsMaterial::read(
            "tls",
            &d.join("ca.pem"),
            &d.join("coordinator.pem"),
            &d.join("coordinator-key.pem"),
        )
        .unwrap();
        // nothing listens on port 1: each run fails its describe (after its retries)
        let agent = |name: &str| Agent::new(name, "https://127.0.0.1:1", &tls).unwrap();
        let runlog = Arc::new(MemoryRunLog::default());
        let state = Arc::new(ServeState {
            agents: [
                ("dc1".to_string(), agent("dc1")),
                ("vpc2".to_string(), agent("vpc2")),
            ]
            .into(),
            store: RunStore::open(d).unwrap(),
            runlog: runlog.clone(),
            node: None,
            audit: AuditLog::new(runlog.clone()),
            credentials: Credentials::from_config(&Default::default()),
            running: Mutex::new(BTreeMap::new()),
            permits: Semaphore::new(CONCURRENT_RUNS),
            counter: AtomicU64::new(0),
            signer: crate::evidence::Signer::load(&crate::config::ClientTls {
                ca: d.join("ca.pem"),
                cert: d.join("coordinator.pem"),
                key: d.join("coordinator-key.pem"),
            })
            .unwrap(),
            checkpointing: Mutex::new(()),
        });
        let spec: Spec = parse_yaml(
            Path::new("spec.yaml"),
            "name: twice\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n",
        )
        .unwrap();
        // the scheduler committed the tick's start; a new leader's resume found it
        // unfinished and not running yet, and both spawn it
        let event = json!({"event": "started", "name": "twice", "started": now(), "spec": spec});
        runlog.start("r1", object(event)).await.unwrap();
        let hold = state.permits.acquire_many(CONCURRENT_RUNS as u32).await.unwrap();
        spawn_run(state.clone(), "r1".into(), spec.clone(), now(), Vec::new(), None).await;
        let events = runlog.load("r1").await.unwrap();
        spawn_run(state.clone(), "r1".into(), spec, now(), events, None).await;
        drop(hold);
        let until = Instant::now() + Duration::from_secs(60);
        while state.running.lock().await.contains_key("r1") {
            assert!(Instant::now() < until, "the run did not end");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // a second task would end within moments of the first
        tokio::time::sleep(Duration::from_secs(2)).await;
        let kinds: Vec<String> = runlog
            .load("r1")
            .await
            .unwrap()
            .iter()
            .map(|e| e["event"].as_str().unwrap_or_default().to_string())
            .collect();
        // one record: closed once, its evidence signed once
        assert_eq!(kinds, ["started", "failed", "finished", "evidence"]);
        let stored = state.store.entries().unwrap();
        assert_eq!(stored.iter().filter(|e| e.id == "r1").count(), 1, "stored twice");
    }
}
