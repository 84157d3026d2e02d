//! Scheduled runs: cron expressions (UTC, crate::cron) in the run log's store (a single
//! node: its SQLite file; a group: the replicated state), and the scheduler that starts
//! them.
//!
//! ```text
//! GET    /v1/schedules          viewer  every schedule, with its next tick
//! PUT    /v1/schedules/{name}   admin   body {cron, spec} (YAML or JSON) → 201 created, 200 replaced
//! DELETE /v1/schedules/{name}   admin   → 200, 404 when there is none
//! ```
//!
//! **Exactly once.** A tick's run has an id made of the tick's time and the schedule's
//! name (`{tick_ms:x}-s-{name}`), and it is started with `RunLog::start`, which refuses
//! an id that has events already. In a group only the leader schedules, and the state
//! machine orders every start: of two leaders racing on one tick (a deposed one that
//! has not noticed yet), one start commits and the other is refused. Then the run is a
//! run like any other: recorded, resumed by a new leader, finished once. A start the
//! store did not take (refused, or not committed within 10 s) is tried again each
//! second while the tick is still the latest due; one that committed without this
//! replica hearing of it comes back as a conflict, and a run of it that nobody here
//! drives is resumed.
//!
//! **Missed ticks.** When no replica could start a tick (the service was down, no
//! leader), the latest missed tick is started once when the scheduler is back; older
//! ones are skipped. A tick whose previous run of the same schedule is still running is
//! skipped too (logged), so a slow run does not pile up behind itself. No tick before
//! the schedule was put starts a run.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tally_common::config_file::parse_yaml;

use super::{Attempt, Caller, ServeState, cluster, error, spawn_run};
use crate::api_auth::Actor;
use crate::config::Role;
use crate::cron::Cron;
use crate::runlog::{RunLogError, Schedule};
use tally_engine::spec::Spec;

/// What a PUT carries.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleBody {
    cron: String,
    spec: Spec,
}

/// A schedule's name: it goes into run ids and URLs.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "schedule name {name:?}: use 1 to 48 of a-z, 0-9, '-' and '_', starting with a letter or digit"
        ))
    }
}

/// The run id of schedule `name`'s tick at `tick` (Unix seconds): hex milliseconds first,
/// like every run id, so ids sort by start.
pub(super) fn tick_run_id(name: &str, tick: i64) -> String {
    crate::lifecycle::run_id_at(tick.max(0) * 1000, &format!("s-{name}"))
}

fn rfc3339(t: i64) -> String {
    crate::lifecycle::rfc3339_of_unix(t)
}

fn now_secs() -> i64 {
    crate::lifecycle::unix_secs()
}

pub(super) async fn list(State(state): State<Arc<ServeState>>) -> Response {
    let schedules = match state.runlog.schedules().await {
        Ok(s) => s,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let now = now_secs();
    let list: Vec<serde_json::Value> = schedules
        .iter()
        .map(|(name, s)| {
            let cron = s.cron.parse::<Cron>().ok();
            let next = cron.as_ref().and_then(|c| c.next_after(now.max(s.created - 1)));
            let last = cron.as_ref().and_then(|c| c.latest_at_or_before(now, s.created));
            json!({
                "name": name,
                "cron": s.cron,
                "spec": s.spec,
                "created": rfc3339(s.created),
                "by": s.by,
                "next": next.map(rfc3339),
                "last_tick_run": last.map(|t| tick_run_id(name, t)),
            })
        })
        .collect();
    Json(json!({ "schedules": list })).into_response()
}

pub(super) async fn put(
    State(state): State<Arc<ServeState>>,
    Extension(caller): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
    body: String,
) -> Response {
    if let Some(answer) =
        cluster::forward_if_follower(&state, &caller, "put_schedule", Some(&name), &body).await
    {
        return answer;
    }
    let path = format!("/v1/schedules/{name}");
    let attempt = Attempt {
        req: (&Method::PUT, path.as_str()),
        action: "put_schedule",
        run: None,
    };
    let refuse = |msg: String| state.refuse(&caller, attempt, StatusCode::BAD_REQUEST, msg);
    if let Err(e) = check_name(&name) {
        return refuse(e).await;
    }
    let body: ScheduleBody = match parse_yaml(Path::new("request body"), &body) {
        Ok(b) => b,
        Err(e) => return refuse(e.to_string()).await,
    };
    let cron: Cron = match body.cron.parse() {
        Ok(c) => c,
        Err(e) => return refuse(format!("cron: {e}")).await,
    };
    if let Err(e) = body.spec.validate(Path::new("request body: spec")) {
        return refuse(e.to_string()).await;
    }
    for (side, agent) in [
        ("source", &body.spec.source.agent),
        ("target", &body.spec.target.agent),
    ] {
        if !state.agents.contains_key(agent) {
            let known = state.agents.keys().cloned().collect::<Vec<_>>().join(", ");
            return refuse(format!(
                "spec.{side}.agent {agent:?} is not configured (agents: {known})"
            ))
            .await;
        }
    }
    let existed = match state.runlog.schedules().await {
        Ok(s) => s.contains_key(&name),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let created = now_secs();
    let schedule = Schedule {
        cron: cron.to_string(),
        spec: serde_json::to_value(&body.spec).unwrap_or_default(),
        created,
        by: caller.actor.name.clone(),
    };
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    if let Err(e) = state
        .record(
            Some(&caller),
            caller.remote,
            attempt,
            status,
            Some(format!("cron {:?}, spec {:?}", schedule.cron, body.spec.name)),
        )
        .await
    {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the schedule was not stored: cannot write the audit log: {e}"),
        );
    }
    if let Err(e) = state.runlog.put_schedule(&name, schedule).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the schedule was not stored: {e}"),
        );
    }
    let next = cron.next_after(created - 1);
    (
        status,
        Json(json!({ "name": name, "cron": cron.to_string(), "next": next.map(rfc3339) })),
    )
        .into_response()
}

pub(super) async fn delete(
    State(state): State<Arc<ServeState>>,
    Extension(caller): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    if let Some(answer) =
        cluster::forward_if_follower(&state, &caller, "delete_schedule", Some(&name), "").await
    {
        return answer;
    }
    let path = format!("/v1/schedules/{name}");
    let attempt = Attempt {
        req: (&Method::DELETE, path.as_str()),
        action: "delete_schedule",
        run: None,
    };
    match state.runlog.schedules().await {
        Ok(s) if !s.contains_key(&name) => {
            return state
                .refuse(
                    &caller,
                    attempt,
                    StatusCode::NOT_FOUND,
                    format!("no schedule {name}"),
                )
                .await;
        }
        Ok(_) => {}
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
    if let Err(e) = state
        .record(Some(&caller), caller.remote, attempt, StatusCode::OK, None)
        .await
    {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the schedule was not removed: cannot write the audit log: {e}"),
        );
    }
    match state.runlog.delete_schedule(&name).await {
        Ok(_) => Json(json!({ "name": name, "deleted": true })).into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the schedule was not removed: {e}"),
        ),
    }
}

/// Starts the scheduler of this service: once a second it starts each schedule's due
/// tick, on a single node always, in a group only while this replica leads.
pub(super) fn start(state: Arc<ServeState>) {
    tokio::spawn(async move {
        // ticks this process started or saw started, by schedule: asked of the store once
        let mut seen: BTreeMap<String, i64> = BTreeMap::new();
        loop {
            // a little after each whole second
            let ms = time::OffsetDateTime::now_utc().millisecond() as u64;
            tokio::time::sleep(Duration::from_millis(1000 - ms.min(999) + 20)).await;
            if state.node.is_some() && cluster::leading_term(&state).is_none() {
                seen.clear();
                continue;
            }
            if let Err(e) = tick(&state, &mut seen).await {
                tracing::error!(error = %e, "scheduler: cannot read the schedules");
            }
        }
    });
}

async fn tick(state: &Arc<ServeState>, seen: &mut BTreeMap<String, i64>) -> Result<(), RunLogError> {
    let schedules = state.runlog.schedules().await?;
    seen.retain(|name, _| schedules.contains_key(name));
    let now = now_secs();
    for (name, s) in &schedules {
        let cron: Cron = match s.cron.parse() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(schedule = %name, error = %e, "scheduler: a stored schedule does not parse");
                continue;
            }
        };
        let Some(due) = cron.latest_at_or_before(now, s.created) else {
            continue;
        };
        if seen.get(name).is_some_and(|t| *t >= due) {
            continue;
        }
        // a tick is done with once it is decided (started here, started by another
        // leader, or skipped for a reason a retry cannot change); a start the store
        // could not take (a leader's first write refused, a commit that timed out) is
        // tried again next second while the tick is still the latest due
        if start_tick(state, name, s, due).await {
            seen.insert(name.clone(), due);
        }
    }
    Ok(())
}

/// How long the scheduler waits for a tick's start to commit before it tries again.
const START_WITHIN: Duration = Duration::from_secs(10);

/// Starts schedule `name`'s tick `due`; false when the store could not decide whether
/// it starts (worth another try), true otherwise.
async fn start_tick(state: &Arc<ServeState>, name: &str, s: &Schedule, due: i64) -> bool {
    let id = tick_run_id(name, due);
    let busy = state
        .running
        .lock()
        .await
        .iter()
        .any(|(rid, r)| r.schedule.as_deref() == Some(name) && *rid != id);
    if busy {
        tracing::warn!(schedule = %name, tick = %rfc3339(due), "scheduler: the previous run is still running; this tick is skipped");
        return true;
    }
    let spec: Spec = match serde_json::from_value(s.spec.clone()) {
        Ok(spec) => spec,
        Err(e) => {
            tracing::error!(schedule = %name, error = %e, "scheduler: a stored schedule's spec does not load");
            return true;
        }
    };
    if [&spec.source.agent, &spec.target.agent]
        .iter()
        .any(|a| !state.agents.contains_key(*a))
    {
        tracing::error!(schedule = %name, "scheduler: the schedule names an agent no longer configured; tick skipped");
        return true;
    }
    let caller = Caller {
        actor: Actor {
            name: "scheduler".to_string(),
            role: Role::Operator,
            via: "scheduler",
        },
        remote: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let path = format!("/v1/schedules/{name}");
    let started = super::now();
    let event = crate::lifecycle::started_event(
        &spec,
        &started,
        &[("schedule", json!(name)), ("tick", json!(rfc3339(due)))],
    );
    // the store decides: a tick started before (by this replica or another leader) is
    // refused. A write that does not commit within START_WITHIN (a leader cut off from
    // its majority waits for ever) is left to the next try, which finds it committed
    // (a conflict, resumed below) or not
    let started_in_store = match tokio::time::timeout(START_WITHIN, state.runlog.start(&id, event)).await {
        Ok(r) => r,
        Err(_) => Err(RunLogError::Store(format!(
            "the start did not commit within {START_WITHIN:?}"
        ))),
    };
    match started_in_store {
        Ok(_) => {}
        Err(RunLogError::Conflict { .. }) => {
            // started by another leader, or by this one through a write whose answer was
            // lost: a run nobody here drives is resumed (the leader's own resume may have
            // looked before the start was applied)
            let driven = state.running.lock().await.contains_key(&id);
            if !driven && let Err(e) = super::resume_unfinished(state).await {
                tracing::warn!(schedule = %name, run = %id, error = %e, "scheduler: cannot resume the tick's run");
                return false;
            }
            return true;
        }
        Err(e) => {
            tracing::warn!(schedule = %name, run = %id, error = %e, "scheduler: the tick's run was not started; tried again in a second");
            return false;
        }
    }
    // after the start, which decides whether this replica starts the tick at all: a
    // leader that dies between the two leaves the run without its audit event, but the
    // run's own `started` event names the schedule and the tick
    let _ = state
        .record(
            Some(&caller),
            caller.remote,
            Attempt {
                req: (&Method::POST, path.as_str()),
                action: "scheduled_run",
                run: Some(&id),
            },
            StatusCode::ACCEPTED,
            Some(format!("tick {} of cron {:?}", rfc3339(due), s.cron)),
        )
        .await;
    tracing::info!(schedule = %name, run = %id, "scheduler: started the tick's run");
    spawn_run(
        state.clone(),
        id,
        spec,
        started,
        Vec::new(),
        Some(name.to_string()),
    )
    .await;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_names_are_safe_in_run_ids_and_urls() {
        for ok in ["nightly", "orders-eu_2", "9am"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Nightly", "-x", "a/b", "a.b", "a b", &"x".repeat(49)] {
            assert!(check_name(bad).unwrap_err().contains("schedule name"), "{bad}");
        }
        assert_eq!(tick_run_id("nightly", 1_764_000_000), "19ab697e800-s-nightly");
    }
}
