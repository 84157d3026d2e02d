//! `tally serve`: the coordinator as a long-running service. An HTTPS API starts runs
//! and returns their results. Every run is recorded in the run log (runlog.rs: a single
//! node's SQLite file under `data_dir`, a group's replicated state), one hash chain per
//! run closed by a `finished` event that carries the run's document, and every request
//! that changes state, or tries to, in the audit trail, a chain of the same log
//! (audit.rs). Runs start, end and resume in runs.rs beside this file; reads are in
//! reads.rs.
//!
//! ```text
//! GET  /healthz               open      liveness and readiness
//! GET  /v1/runs               viewer    a page of runs, running and finished, newest first
//! GET  /v1/runs/{id}          viewer    202 while running, with the levels done so far
//!                                       (`levels`: counts only), then the stored document
//!                                       (spec and result); below operator without keys,
//!                                       values, leaf bounds or investigation SQL (redact.rs)
//! POST /v1/runs               operator  body: a spec (YAML or JSON) → 202 {"id": …}
//! POST /v1/runs/{id}/cancel   operator  stops a running run: it is stored with verdict error,
//!                                       code cancelled
//! GET  /v1/audit              auditor   every run's chain (its event count and head) and the audit trail
//! GET, PUT, DELETE /v1/schedules[/{name}]  scheduled runs (schedules.rs beside this file)
//! ```
//!
//! With `cluster` in the config the service is one replica of a Raft group (cluster.rs
//! beside this file): the run log is replicated, only the leader drives runs and
//! followers forward writes.
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
mod reads;
mod runs;
mod schedules;
use crate::runtime::{RunOptions, RunRecord, cancelled_result, run};
use crate::store::LegacyRunStore;
pub use reads::{DEFAULT_PAGE, MAX_PAGE, RunsQuery, newest_first, page};
use reads::{audit_log, export_log, get_run, latest_checkpoint, list_runs, run_evidence};
use runs::{cancel_run, resume_unfinished, spawn_run, start_checkpoints, start_run};
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
    /// The run store of an earlier single-node version, read only (store.rs): the
    /// documents of the runs it closed before finished runs moved into the run log.
    legacy: Option<LegacyRunStore>,
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
    std::fs::create_dir_all(data_dir).map_err(|e| format!("data_dir: {}: {e}", data_dir.display()))?;
    let legacy = LegacyRunStore::open(data_dir).map_err(|e| format!("data_dir: {e}"))?;
    if let Some(l) = &legacy {
        tracing::info!(
            runs = l.entries().len(),
            "data_dir: runs.jsonl holds the runs an earlier version stored there; they are read from it, and new runs are kept in the run log only"
        );
    }
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
        legacy,
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

/// A single node's state for unit tests: agents `dc1` and `vpc2` where nothing listens
/// (port 1: each run fails its describe, after its retries), certificates made in `d`.
#[cfg(test)]
fn test_state(
    d: &Path,
    runlog: Arc<crate::runlog::MemoryRunLog>,
    legacy: Option<LegacyRunStore>,
) -> Arc<ServeState> {
    tally_common::pki::init_dir(d, &[tally_common::pki::AgentLeaf::new("dc1")]).unwrap();
    let tls = TlsMaterial::read(
        "tls",
        &d.join("ca.pem"),
        &d.join("coordinator.pem"),
        &d.join("coordinator-key.pem"),
    )
    .unwrap();
    let agent = |name: &str| Agent::new(name, "https://127.0.0.1:1", &tls).unwrap();
    Arc::new(ServeState {
        agents: [
            ("dc1".to_string(), agent("dc1")),
            ("vpc2".to_string(), agent("vpc2")),
        ]
        .into(),
        legacy,
        runlog: runlog.clone(),
        node: None,
        audit: AuditLog::new(runlog),
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
    })
}
