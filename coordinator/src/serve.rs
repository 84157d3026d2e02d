//! `tally serve`: the coordinator as a long-running service. A small HTTP API starts
//! runs and returns their results; every finished run is kept in the hash-chained run
//! store (store.rs) under `data_dir`.
//!
//! ```text
//! GET  /healthz          liveness and readiness
//! POST /v1/runs          body: a spec (YAML or JSON) → 202 {"id": …}
//! GET  /v1/runs          every run: running ones, then the stored ones, newest first
//! GET  /v1/runs/{id}     202 while running, then the stored document (spec and result)
//! ```
//!
//! With `TALLY_API_TOKEN` set, every call but /healthz needs
//! `Authorization: Bearer <token>`. The API speaks plain HTTP: put it behind your
//! ingress's TLS, or keep it to the cluster network.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tally_common::config_file::parse_yaml;
use tokio::sync::{Mutex, Semaphore};

use crate::client::{Agent, TlsMaterial};
use crate::config::CoordinatorConfig;
use crate::runner::{RunOptions, run};
use crate::spec::Spec;
use crate::store::RunStore;

/// Runs executing at once; more wait their turn.
const CONCURRENT_RUNS: usize = 4;

struct ServeState {
    agents: BTreeMap<String, Agent>,
    store: RunStore,
    running: Mutex<BTreeMap<String, (String, String)>>,
    permits: Semaphore,
    token: Option<String>,
    counter: AtomicU64,
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Binds and serves until `shutdown` resolves. Returns the bound address via `ready`.
pub async fn serve(
    cfg: &CoordinatorConfig,
    config_path: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let listen = cfg
        .listen
        .ok_or_else(|| format!("{}: `listen` is required for tally serve", config_path.display()))?;
    let data_dir = cfg.data_dir.as_ref().ok_or_else(|| {
        format!(
            "{}: `data_dir` is required for tally serve",
            config_path.display()
        )
    })?;
    let store = RunStore::open(data_dir).map_err(|e| format!("data_dir: {e}"))?;
    let tls = TlsMaterial::load(&cfg.tls).map_err(|e| format!("{}: {e}", config_path.display()))?;
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
        running: Mutex::new(BTreeMap::new()),
        permits: Semaphore::new(CONCURRENT_RUNS),
        token: std::env::var("TALLY_API_TOKEN").ok().filter(|t| !t.is_empty()),
        counter: AtomicU64::new(0),
    });
    let api = Router::new()
        .route("/v1/runs", get(list_runs).post(start_run))
        .route("/v1/runs/{id}", get(get_run))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state.clone());
    let app = Router::new().route("/healthz", get(|| async { "ok" })).merge(api);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listen {listen}: {e}"))?;
    ready(listener.local_addr().map_err(|e| e.to_string())?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| e.to_string())
}

async fn authorize(
    State(state): State<Arc<ServeState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if let Some(token) = &state.token {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return error(
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (TALLY_API_TOKEN)",
            );
        }
    }
    next.run(req).await
}

async fn start_run(State(state): State<Arc<ServeState>>, body: String) -> Response {
    let spec: Spec = match parse_yaml(Path::new("request body"), &body) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if let Err(e) = spec.validate(Path::new("request body")) {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    for (side, agent) in [("source", &spec.source.agent), ("target", &spec.target.agent)] {
        if !state.agents.contains_key(agent) {
            let known = state.agents.keys().cloned().collect::<Vec<_>>().join(", ");
            return error(
                StatusCode::BAD_REQUEST,
                format!("{side}.agent {agent:?} is not configured (agents: {known})"),
            );
        }
    }
    let millis = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let id = format!("{millis:x}-{}", state.counter.fetch_add(1, Ordering::Relaxed));
    let started = now();
    state
        .running
        .lock()
        .await
        .insert(id.clone(), (spec.name.clone(), started.clone()));
    let st = state.clone();
    let run_id = id.clone();
    tokio::spawn(async move {
        let _permit = st.permits.acquire().await;
        let (source, target) = (&st.agents[&spec.source.agent], &st.agents[&spec.target.agent]);
        let result = run(
            &spec,
            source,
            target,
            &RunOptions {
                progress: Some(false),
            },
        )
        .await;
        let verdict = serde_json::to_value(&result.verdict).unwrap_or_default();
        let doc =
            json!({ "id": run_id, "started": started, "finished": now(), "spec": spec, "result": result });
        if let Err(e) = st
            .store
            .append(&run_id, &spec.name, verdict.as_str().unwrap_or("error"), &doc)
        {
            tracing::error!(run = %run_id, error = %e, "cannot store the run");
        }
        st.running.lock().await.remove(&run_id);
    });
    (
        StatusCode::ACCEPTED,
        Json(json!({ "id": id, "state": "running" })),
    )
        .into_response()
}

async fn list_runs(State(state): State<Arc<ServeState>>) -> Response {
    let mut runs: Vec<serde_json::Value> = state
        .running
        .lock()
        .await
        .iter()
        .map(
            |(id, (name, started))| json!({ "id": id, "name": name, "state": "running", "started": started }),
        )
        .collect();
    match state.store.entries() {
        Ok(entries) => runs.extend(entries.into_iter().rev().map(|e| {
            json!({ "id": e.id, "name": e.name, "state": "done", "verdict": e.verdict, "finished": e.finished, "seq": e.seq })
        })),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
    Json(json!({ "runs": runs })).into_response()
}

async fn get_run(State(state): State<Arc<ServeState>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some((name, started)) = state.running.lock().await.get(&id) {
        return (
            StatusCode::ACCEPTED,
            Json(json!({ "id": id, "name": name, "state": "running", "started": started })),
        )
            .into_response();
    }
    match state.store.document(&id) {
        Some(doc) => Json(doc).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no run {id}")),
    }
}
