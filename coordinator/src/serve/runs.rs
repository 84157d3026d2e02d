//! A run's life in the service: started (audited, its record begun), driven by one
//! task, cancelled, closed with a `finished` event that carries its document, sealed,
//! and resumed from its record when the service starts again or a replica becomes the
//! leader.

use super::*;

pub(super) async fn start_run(
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

pub(super) fn object(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// Runs `spec` as run `id` in the background, recording it in the run log (resuming
/// from `resume`, its earlier events), then closes the record with its result.
pub(super) async fn spawn_run(
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
        let doc =
            json!({ "id": run_id, "started": started, "finished": now(), "spec": spec, "result": result });
        if !cluster::still_leading(&st, term) {
            // deposed while it ran (its appends were refused): the new leader resumes it
            tracing::info!(run = %run_id, "no longer the leader: the run is left to the new one");
            return;
        }
        // the record is closed by the finished event, which carries the run's document:
        // the one store of finished runs, which every replica of a group holds
        let event =
            crate::lifecycle::finished_event(&result, &[("name", json!(spec.name)), ("document", doc)]);
        // a cancelled run's last append, dropped in flight, may still commit ahead of
        // this one (Raft goes on with a write its caller stopped waiting for): the next
        // number is then taken, and this one is tried again after it
        let mut closed = false;
        for attempt in 1..=5 {
            match st.runlog.append(&run_id, event.clone()).await {
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
pub(super) async fn seal(st: &ServeState, run_id: &str, result: &tally_engine::result::RunResult) {
    if let Err(e) = crate::evidence::seal_run(st.runlog.as_ref(), run_id, result, &st.signer).await {
        tracing::error!(run = %run_id, error = %e, "cannot sign the run's evidence");
    }
    checkpoint(st).await;
}

/// Pins the runs that moved in the log's ledger and signs its head (crate::ledger).
pub(super) async fn checkpoint(st: &ServeState) {
    let _one = st.checkpointing.lock().await;
    if let Err(e) = crate::ledger::checkpoint(st.runlog.as_ref(), &st.signer).await {
        tracing::warn!(error = %e, "cannot checkpoint the run log");
    }
}

/// How often the log is checkpointed while runs move.
pub(super) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Every minute, on the leader (or a single node), a checkpoint of what moved.
pub(super) fn start_checkpoints(st: Arc<ServeState>) {
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

/// The result of a finished run from its record: the finished event's document, or an
/// earlier version's run store's.
pub(super) fn recorded_result(
    st: &ServeState,
    run_id: &str,
    events: &[serde_json::Value],
) -> Option<tally_engine::result::RunResult> {
    let doc = events
        .iter()
        .rev()
        .find(|e| e["event"] == "finished")
        .and_then(|e| e.get("document").cloned())
        .or_else(|| st.legacy.as_ref()?.document(run_id))?;
    serde_json::from_value(doc["result"].clone()).ok()
}

/// Resumes every run the run log holds unfinished: started, without a `finished`
/// event, and not in an earlier version's run store (a run that version stored before
/// its record was closed is closed now).
pub(super) async fn resume_unfinished(state: &Arc<ServeState>) -> Result<(), String> {
    let runs = state.runlog.runs().await.map_err(|e| e.to_string())?;
    let stored = state.legacy.as_ref().map_or(&[][..], |l| l.entries());
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

pub(super) async fn cancel_run(
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
        let finished = matches!(
            reads::logged_run(&state, &id).await,
            Ok(Some(reads::Logged::Done(_)))
        );
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::MemoryRunLog;
    use std::time::{Duration, Instant};

    #[tokio::test(flavor = "multi_thread")]
    async fn a_run_spawned_twice_is_driven_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let runlog = Arc::new(MemoryRunLog::default());
        let state = test_state(d, runlog.clone(), None);
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
        // and its document in the finished event
        let events = runlog.load("r1").await.unwrap();
        assert_eq!(events[2]["document"]["id"], "r1");
        assert_eq!(events[2]["document"]["result"]["verdict"], "error");
    }
}
