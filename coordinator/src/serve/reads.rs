//! The service's reads: runs (a page of them, one run), the audit chains, evidence
//! bundles, the run log's export and its latest checkpoint. Every answer comes from the
//! run log (a single node's SQLite file, a group's replicated state), so a run reads
//! the same on every replica; a follower asks the leader for a run it has not applied.

use super::*;

/// `GET /v1/log` (auditor): every line of the run log, the ledger and the signed
/// checkpoints included, for `tally audit verify`.
pub(super) async fn export_log(State(state): State<Arc<ServeState>>) -> Response {
    match crate::ledger::export(state.runlog.as_ref()).await {
        Ok(lines) => Json(json!({ "lines": lines })).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `GET /v1/checkpoint` (auditor): the latest signed checkpoint of the log.
pub(super) async fn latest_checkpoint(State(state): State<Arc<ServeState>>) -> Response {
    match crate::ledger::latest(state.runlog.as_ref()).await {
        Ok(Some(cp)) => Json(cp).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "no checkpoint yet: one is signed after the first run",
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `GET /v1/runs/{id}/evidence` (auditor): the run's evidence bundle (DESIGN §12).
pub(super) async fn run_evidence(
    State(state): State<Arc<ServeState>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
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

pub(super) async fn list_runs(
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
    match runs_page(&state, &q, limit).await {
        Ok(runs) => Json(page(runs, limit)).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

pub(super) async fn get_run(
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
            Ok(events) => levels_of(&events),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        return (
            StatusCode::ACCEPTED,
            Json(json!({ "id": id, "name": name, "state": "running", "started": started, "levels": levels })),
        )
            .into_response();
    }
    match logged_run(&state, &id).await {
        Ok(Some(Logged::Done(doc))) if caller.actor.role >= Role::Operator => Json(doc).into_response(),
        Ok(Some(Logged::Done(doc))) => Json(document_for_viewer(&doc)).into_response(),
        Ok(Some(Logged::Running {
            name,
            started,
            levels,
        })) => (
            StatusCode::ACCEPTED,
            Json(json!({ "id": id, "name": name, "state": "running", "started": started, "levels": levels })),
        )
            .into_response(),
        // a follower may not have applied the run's start yet: the leader answers (404
        // only when the group does not know the run), never a false 404 here
        Ok(None) => match cluster::forward_read(&state, &caller, "get_run", &id).await {
            Some(answer) => answer,
            None => error(StatusCode::NOT_FOUND, format!("no run {id}")),
        },
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The chains, verified as they are read: what was run (each run's own chain in the run
/// log; with a data directory of an earlier version, also its run store's index,
/// `legacy_runs`) and the audit trail (who changed what, from where, on which
/// replica), the same on every replica of a group.
pub(super) async fn audit_log(State(state): State<Arc<ServeState>>) -> Response {
    let (events, events_seq, events_head) = match state.audit.events().await {
        Ok(e) => e,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let events = json!({ "seq": events_seq, "head": events_head, "entries": events });
    // every run's own chain (its event count and head)
    let heads = match state.runlog.runs().await {
        Ok(h) => h,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let runs: Vec<serde_json::Value> = heads
        .iter()
        .filter(|h| !crate::ledger::is_internal(&h.run_id))
        .map(|h| json!({ "id": h.run_id, "events": h.events, "head": h.head }))
        .collect();
    let log = if state.node.is_some() {
        "replicated"
    } else {
        "local"
    };
    let mut answer = json!({ "runs": { "log": log, "entries": runs }, "events": events });
    if let Some(l) = &state.legacy {
        // an earlier version's run store: its index chain and head, as it verified
        let (seq, head) = l.head();
        answer["legacy_runs"] = json!({ "seq": seq, "head": head, "entries": l.entries() });
    }
    Json(answer).into_response()
}

/// A run as the run log holds it.
pub(super) enum Logged {
    /// A running run with the levels committed so far (their `level_out`).
    Running {
        name: String,
        started: String,
        levels: Vec<serde_json::Value>,
    },
    Done(serde_json::Value),
}

/// The progress of a run: each committed level's `level_out` (counts only, no keys:
/// viewers see them).
pub(super) fn levels_of(events: &[serde_json::Value]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter(|e| e["event"] == "level")
        .map(|e| e["level_out"].clone())
        .collect()
}

/// A run from this replica's applied log: its document once finished (the finished
/// event's, or for a run an earlier version closed, that version's run store's).
pub(super) async fn logged_run(state: &ServeState, id: &str) -> Result<Option<Logged>, String> {
    let events = state.runlog.load(id).await.map_err(|e| e.to_string())?;
    if let Some(done) = events.iter().rev().find(|e| e["event"] == "finished") {
        let doc = match done.get("document") {
            Some(doc) => doc.clone(),
            None => state
                .legacy
                .as_ref()
                .and_then(|l| l.document(id))
                .ok_or_else(|| format!("run {id} is finished but its document is in no store"))?,
        };
        return Ok(Some(Logged::Done(doc)));
    }
    if events.is_empty()
        && let Some(doc) = state.legacy.as_ref().and_then(|l| l.document(id))
    {
        // stored by an earlier version that kept no run log for it
        return Ok(Some(Logged::Done(doc)));
    }
    Ok(events
        .iter()
        .find(|e| e["event"] == "started")
        .map(|s| Logged::Running {
            name: s["name"].as_str().unwrap_or_default().to_string(),
            started: s["started"].as_str().unwrap_or_default().to_string(),
            levels: levels_of(&events),
        }))
}

/// The runs of a page (newest first, `limit + 1` at most, so the caller knows whether
/// another page follows): only the records of the runs it lists, and of those a filter
/// skips, are read, whatever the history's length.
pub(super) async fn runs_page(
    state: &ServeState,
    q: &RunsQuery,
    limit: usize,
) -> Result<Vec<serde_json::Value>, String> {
    let heads = state.runlog.runs().await.map_err(|e| e.to_string())?;
    let mut ids: Vec<(String, Option<u64>)> = heads
        .into_iter()
        .filter(|h| !crate::ledger::is_internal(&h.run_id))
        .map(|h| (h.run_id, Some(h.events)))
        .collect();
    if let Some(l) = &state.legacy {
        let logged: std::collections::HashSet<String> = ids.iter().map(|(id, _)| id.clone()).collect();
        ids.extend(
            l.entries()
                .iter()
                .filter(|e| !logged.contains(&e.id))
                .map(|e| (e.id.clone(), None)),
        );
    }
    ids.retain(|(id, _)| q.after_cursor(id));
    ids.sort_by(|a, b| newest_first(&a.0, &b.0));
    let mut out = Vec::new();
    for (id, events) in &ids {
        if out.len() > limit {
            break;
        }
        let run = match logged_run(state, id).await? {
            Some(Logged::Running { name, started, .. }) => {
                json!({ "id": id, "name": name, "state": "running", "started": started })
            }
            Some(Logged::Done(doc)) => json!({
                "id": id,
                "name": doc["spec"]["name"],
                "state": "done",
                "verdict": doc["result"]["verdict"],
                "finished": doc["finished"],
                "seq": events,
            }),
            None => continue,
        };
        if q.wants(&run) {
            out.push(run);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A data directory of an earlier version: the runs its run store closed are listed
    /// and read beside the run log's, a run closed there without a document in its
    /// finished event takes it from that store, and a run of the log is listed once.
    #[tokio::test]
    async fn runs_of_an_earlier_run_store_are_read_beside_the_run_log() {
        use crate::runlog::{MemoryRunLog, RunLog};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // the earlier version kept r1 (only there) and r2 (also in its run log, closed
        // with a finished event that carried no document)
        crate::store::write_for_test(d, &[("aaaa-1", "match"), ("aaaa-2", "differ")]);
        let runlog = Arc::new(MemoryRunLog::default());
        let started = json!({"event": "started", "name": "orders", "started": "t0", "spec": {}});
        runlog
            .start("aaaa-2", super::super::runs::object(started.clone()))
            .await
            .unwrap();
        runlog
            .append(
                "aaaa-2",
                super::super::runs::object(json!({"event": "finished", "verdict": "differ"})),
            )
            .await
            .unwrap();
        // a run of this version: its document in the finished event
        runlog
            .start("bbbb-0", super::super::runs::object(started))
            .await
            .unwrap();
        let doc = json!({"id": "bbbb-0", "finished": "t1", "spec": {"name": "orders"}, "result": {"verdict": "match"}});
        runlog
            .append(
                "bbbb-0",
                super::super::runs::object(json!({"event": "finished", "verdict": "match", "document": doc})),
            )
            .await
            .unwrap();
        let legacy = crate::store::LegacyRunStore::open(d).unwrap();
        let state = super::super::test_state(d, runlog, legacy);
        let q = RunsQuery::default();
        let listed = runs_page(&state, &q, 10).await.unwrap();
        let seen: Vec<(&str, &str)> = listed
            .iter()
            .map(|r| (r["id"].as_str().unwrap(), r["verdict"].as_str().unwrap()))
            .collect();
        assert_eq!(
            seen,
            [("bbbb-0", "match"), ("aaaa-2", "differ"), ("aaaa-1", "match")]
        );
        for (id, verdict) in seen {
            let Some(Logged::Done(doc)) = logged_run(&state, id).await.unwrap() else {
                panic!("{id} is not done")
            };
            assert_eq!(doc["result"]["verdict"], verdict, "{id}");
        }
        assert!(logged_run(&state, "cccc-0").await.unwrap().is_none());
    }
}
