//! The runner: the entry point of one reconciliation against two agents. The run
//! itself is the [`crate::engine`] (a pure state machine) driven by its runtime; this
//! module keeps the interface the CLI and the service call.

use std::sync::Arc;

use serde_json::Value;

use crate::client::AgentApi;
use crate::engine::empty_result;
use crate::error::RunError;
use crate::result::{ErrorOut, RunResult};
use crate::runlog::RunLog;
use crate::spec::Spec;

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

/// Runs `spec` between two agents; never fails: errors become verdict `error`.
pub async fn run(spec: &Spec, source: &dyn AgentApi, target: &dyn AgentApi, opts: &RunOptions) -> RunResult {
    crate::engine::runtime::run(spec, source, target, opts).await
}
