//! `tally serve` as one replica of a group (`cluster` in the config, DESIGN §9).
//!
//! Only the leader drives runs. A watcher follows this replica's Raft metrics: when it
//! becomes leader of a term, it first waits until it has applied everything committed
//! before (`ensure_linearizable`), then resumes every unfinished run from its committed
//! events; when it stops being leader it aborts the run tasks it drove (their appends
//! would be refused anyway: Raft refuses a follower's writes, the state machine a stale
//! sequence number). Followers answer reads from their applied state and forward
//! writes to the leader over the peer channel, with the caller they authenticated; the
//! leader takes a write only once a majority has confirmed that it still leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use openraft::ServerState;

use super::{Caller, ServeState, error, resume_unfinished};
use crate::api_auth::Actor;
use crate::raft::network::{PeerConn, Rpc};
use crate::raft::peer::{ForwardRequest, ForwardResponse, Forwarded};

/// How long a follower waits for the leader's answer to a forwarded write.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the leadership watcher of this replica.
pub(super) fn watch_leadership(state: Arc<ServeState>) {
    let Some(node) = state.node.clone() else { return };
    tokio::spawn(async move {
        let mut metrics = node.raft.metrics();
        let mut leading: Option<u64> = None;
        let mut fatal_logged = false;
        loop {
            let (leader_now, term, fatal) = {
                let m = metrics.borrow_and_update();
                (
                    m.state == ServerState::Leader && m.current_leader == Some(node.id),
                    m.current_term,
                    m.running_state.as_ref().err().map(ToString::to_string),
                )
            };
            // openraft's own log lines are off by default (docs/operations.md): a Raft
            // core that stopped on an error is said here, once
            if let Some(why) = fatal
                && !fatal_logged
            {
                tracing::error!(error = %why, "cluster: this replica's Raft stopped; restart it");
                fatal_logged = true;
            }
            if leading.is_some() && (!leader_now || leading != Some(term)) {
                let dropped = drop_runs(&state).await;
                tracing::info!(dropped, "cluster: no longer the leader; stopped driving runs");
                leading = None;
            }
            if leader_now && leading.is_none() {
                let t0 = Instant::now();
                match node.raft.ensure_linearizable().await {
                    Ok(_) => {
                        leading = Some(term);
                        tracing::info!(term, "cluster: this replica is the leader");
                        if let Err(e) = resume_unfinished(&state).await {
                            tracing::error!(error = %e, "cluster: cannot resume the unfinished runs");
                        }
                        tracing::info!(
                            term,
                            ms = t0.elapsed().as_millis() as u64,
                            "cluster: leader resumed the unfinished runs"
                        );
                    }
                    // deposed again before it could read: the next change tells
                    Err(e) => tracing::info!(error = %e, "cluster: leadership not confirmed"),
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Aborts every run task of this replica; returns how many.
async fn drop_runs(state: &ServeState) -> usize {
    let mut running = state.running.lock().await;
    let n = running.len();
    for (_, r) in std::mem::take(&mut *running) {
        if let Some(task) = r.task {
            task.abort();
        }
    }
    n
}

/// Whether this replica may drive runs of `term`: it is the leader of that term.
pub(super) fn still_leading(state: &ServeState, term: Option<u64>) -> bool {
    match (&state.node, term) {
        (None, _) => true,
        (Some(node), Some(t)) => {
            let m = node.raft.metrics().borrow().clone();
            m.state == ServerState::Leader && m.current_term == t
        }
        (Some(_), None) => false,
    }
}

/// The current term when this replica leads (for a run task to check at its end).
pub(super) fn leading_term(state: &ServeState) -> Option<u64> {
    let node = state.node.as_ref()?;
    let m = node.raft.metrics().borrow().clone();
    (m.state == ServerState::Leader).then_some(m.current_term)
}

/// How long a leader tries to confirm that a majority still follows it before it
/// refuses a write.
const CONFIRM_WITHIN: Duration = Duration::from_secs(3);
/// The pause between two tries (each is one round of heartbeats, at most 250 ms).
const CONFIRM_RETRY: Duration = Duration::from_millis(200);

/// Whether a replica that believes it leads is followed by a majority.
enum Leading {
    Confirmed,
    /// A higher term was seen: this replica no longer leads.
    Deposed,
    /// No majority answered within [`CONFIRM_WITHIN`]; why.
    Unconfirmed(String),
}

/// Asks a majority whether this replica still leads (one round of heartbeats, tried
/// again within [`CONFIRM_WITHIN`]). openraft 0.9 never deposes a leader that lost its
/// majority: cut off from the group, it still names itself leader, and a write it took
/// would wait for a commit until the partition heals.
async fn confirm_leading(node: &crate::raft::Node) -> Leading {
    use openraft::error::{CheckIsLeaderError, RaftError};
    let until = Instant::now() + CONFIRM_WITHIN;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let why = match tokio::time::timeout(left, node.raft.get_read_log_id()).await {
            Ok(Ok(_)) => return Leading::Confirmed,
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                return Leading::Deposed;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no majority answered within {CONFIRM_WITHIN:?}"),
        };
        if Instant::now() + CONFIRM_RETRY >= until {
            return Leading::Unconfirmed(why);
        }
        tokio::time::sleep(CONFIRM_RETRY).await;
    }
}

/// On a follower, sends the write to the leader and returns its answer; on a leader a
/// majority still follows (or a single node), `None`: handle it here; on a leader cut
/// off from its majority, 503 within [`CONFIRM_WITHIN`], never a write that waits for
/// the partition to heal.
pub(super) async fn forward_if_follower(
    state: &ServeState,
    caller: &Caller,
    action: &str,
    run: Option<&str>,
    body: &str,
) -> Option<Response> {
    let node = state.node.as_ref()?;
    if node.is_leader() {
        match confirm_leading(node).await {
            Leading::Confirmed => return None,
            // deposed meanwhile: forward to the new leader, when one is known
            Leading::Deposed => {}
            Leading::Unconfirmed(why) => {
                tracing::info!(error = %why, "cluster: a write refused: leadership not confirmed by a majority");
                return Some(not_taken(format!(
                    "this replica cannot confirm with a majority of the group that it still leads \
                     ({why}): it takes no writes now; try another replica"
                )));
            }
        }
    }
    // never itself: a leader deposed a moment ago may still name itself
    let Some((leader, addr)) = node.leader_addr().filter(|(l, _)| *l != node.id) else {
        return Some(not_taken(
            "the group has no leader now (an election is under way): try again".into(),
        ));
    };
    Some(match to_leader(node, &addr, caller, action, run, body).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(leader, error = %e, "cluster: cannot forward a write to the leader");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot reach the leader (replica {leader}): {e}; try again"),
            )
        }
    })
}

/// 503 with `Retry-After: 1` and `"not_started": true` for a call that was certainly not
/// carried out (no leader known, or a leader that could not confirm it leads, refused
/// it before doing anything): a client may send it again. `tally run --server` resends
/// a run only on both (a proxy's 503 with `Retry-After` is not enough). A write whose
/// forward to the leader failed gets neither: the leader may have carried it out.
fn not_taken(message: String) -> Response {
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({ "error": message, "not_started": true })),
    )
        .into_response();
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    r
}

/// Sends a call to the leader at `addr` on the caller's behalf; its answer as this
/// replica's response.
async fn to_leader(
    node: &crate::raft::Node,
    addr: &str,
    caller: &Caller,
    action: &str,
    run: Option<&str>,
    body: &str,
) -> Result<Response, crate::raft::network::PeerError> {
    let req = ForwardRequest {
        action: action.to_string(),
        run: run.map(str::to_string),
        body: body.to_string(),
        actor: caller.actor.name.clone(),
        via: caller.actor.via.to_string(),
        role: caller.actor.role,
        remote: caller.remote.to_string(),
    };
    let r: ForwardResponse = PeerConn::new(addr, &node.tls)?
        .call(Rpc::Forward, &req, FORWARD_TIMEOUT)
        .await?;
    Ok((
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY),
        Json(r.body),
    )
        .into_response())
}

/// On a follower, hands an audit event to the leader, which writes it to the
/// replicated trail: done once the leader has it committed; an error when the group has
/// no leader or the leader cannot be reached (a call that must be audited is then not
/// done).
pub(super) async fn forward_audit(state: &ServeState, event: crate::audit::Event) -> Result<(), String> {
    let Some(node) = state.node.as_ref() else {
        return Err("not in a group".into());
    };
    let Some((leader, addr)) = node.leader_addr().filter(|(l, _)| *l != node.id) else {
        return Err("the group has no leader now (an election is under way)".into());
    };
    let req = ForwardRequest {
        action: "audit".to_string(),
        run: None,
        body: serde_json::to_string(&event).map_err(|e| e.to_string())?,
        actor: format!("replica {}", node.id),
        via: "replica".to_string(),
        role: crate::config::Role::Viewer,
        remote: String::new(),
    };
    let r: ForwardResponse = PeerConn::new(&addr, &node.tls)
        .map_err(|e| e.to_string())?
        .call(Rpc::Forward, &req, FORWARD_TIMEOUT)
        .await
        .map_err(|e| format!("cannot reach the leader (replica {leader}): {e}"))?;
    match r.status {
        200 => Ok(()),
        s => Err(format!(
            "the leader (replica {leader}) did not record it ({s}): {}",
            r.body
        )),
    }
}

/// On a follower, asks the leader for what this replica does not hold yet (a run whose
/// start it has not applied): the leader's answer; 503 with `Retry-After` while the
/// group has no leader or the leader cannot be reached; `None` on the leader itself
/// (or a single node), whose own answer stands.
pub(super) async fn forward_read(
    state: &ServeState,
    caller: &Caller,
    action: &str,
    run: &str,
) -> Option<Response> {
    let node = state.node.as_ref()?;
    if node.is_leader() {
        return None;
    }
    let retry = not_taken;
    let Some((leader, addr)) = node.leader_addr().filter(|(l, _)| *l != node.id) else {
        return Some(retry(format!(
            "this replica does not hold run {run} yet and the group has no leader now (an election is under way): try again"
        )));
    };
    Some(
        match to_leader(node, &addr, caller, action, Some(run), "").await {
            Ok(r) => r,
            Err(e) => retry(format!(
                "this replica does not hold run {run} yet and cannot reach the leader (replica {leader}): {e}; try again"
            )),
        },
    )
}

/// The leader's side of forwarded writes (and of reads a follower cannot answer yet).
pub(super) struct ForwardTo(pub(super) Arc<ServeState>);

#[tonic::async_trait]
impl Forwarded for ForwardTo {
    async fn forwarded(&self, req: ForwardRequest) -> ForwardResponse {
        let state = self.0.clone();
        if state.node.as_ref().is_some_and(|n| !n.is_leader()) {
            return ForwardResponse {
                status: 503,
                body: serde_json::json!({"error": "this replica is no longer the leader: try again"}),
            };
        }
        if req.action == "audit" {
            // a follower's audit event: written to the trail here, where Raft writes
            let answer = |status: u16, body: serde_json::Value| ForwardResponse { status, body };
            let event: crate::audit::Event = match serde_json::from_str(&req.body) {
                Ok(e) => e,
                Err(e) => return answer(400, serde_json::json!({"error": format!("audit event: {e}")})),
            };
            // only refusals a follower answered itself come this way: an accepted call
            // is audited by the leader that carries it out
            if event.status < 400 {
                return answer(
                    400,
                    serde_json::json!({"error": "only a refusal's audit event is forwarded"}),
                );
            }
            return match state.audit.record(event).await {
                Ok(seq) => answer(200, serde_json::json!({"seq": seq})),
                Err(e) => answer(503, serde_json::json!({"error": e.to_string()})),
            };
        }
        let caller = Caller {
            actor: Actor {
                name: req.actor,
                role: req.role,
                via: match req.via.as_str() {
                    "token" => "token",
                    "certificate" => "certificate",
                    _ => "forwarded",
                },
            },
            remote: req
                .remote
                .parse()
                .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0))),
        };
        let resp = match (req.action.as_str(), req.run) {
            ("start_run", _) => {
                super::start_run(axum::extract::State(state), Extension(caller), req.body).await
            }
            ("get_run", Some(run)) => {
                super::get_run(
                    axum::extract::State(state),
                    Extension(caller),
                    axum::extract::Path(run),
                )
                .await
            }
            ("cancel_run", Some(run)) => {
                super::cancel_run(
                    axum::extract::State(state),
                    Extension(caller),
                    axum::extract::Path(run),
                )
                .await
            }
            ("put_schedule", Some(name)) => {
                super::schedules::put(
                    axum::extract::State(state),
                    Extension(caller),
                    axum::extract::Path(name),
                    req.body,
                )
                .await
            }
            ("delete_schedule", Some(name)) => {
                super::schedules::delete(
                    axum::extract::State(state),
                    Extension(caller),
                    axum::extract::Path(name),
                )
                .await
            }
            (other, _) => error(StatusCode::BAD_REQUEST, format!("cannot forward {other:?}")),
        };
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), 16 * 1024 * 1024)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null);
        ForwardResponse { status, body }
    }
}
