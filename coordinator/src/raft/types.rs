//! The coordinator's Raft type configuration and its replicated commands.
//!
//! The replicated state is what a new leader needs to take over: each run's event log
//! (the run engine's events, appended one by one before the engine takes its next step)
//! and the scheduled runs. Everything else (results, the audit log) is derived from it.
//!
//! Unlike config, these types accept unknown fields: during a rolling upgrade a replica of
//! the previous release must still read entries that the next release wrote with a new
//! optional field, or it would stop on a storage error.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

/// A replica's id within the group: stable for the life of its `data_dir`.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The Raft types of the coordinator group.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = Replica,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// What the group knows about a member: where its peers reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// `host:port` of the replica's Raft endpoint.
    pub addr: String,
}

impl fmt::Display for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
    }
}

/// A write to the replicated state. Applying a command depends only on the state and the
/// command, so every replica that applies the same log holds the same state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Appends one event of the run engine to a run's log. `seq` must be the run's next
    /// sequence number (0 for a new run): a leader that was deposed while it drove the run
    /// cannot add to it behind the new leader's back, its stale append is refused.
    AppendRunEvent {
        run_id: String,
        seq: u64,
        event: serde_json::Value,
    },
    /// Creates or replaces a scheduled run.
    PutSchedule { name: String, schedule: Schedule },
    /// Removes a scheduled run.
    DeleteSchedule { name: String },
}

/// A scheduled run as the replicated state holds it (the single-node run log's type).
pub use crate::runlog::Schedule;

/// The answer of the state machine to one applied entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    /// A blank or membership entry: nothing to answer.
    None,
    /// The event was appended at `seq`.
    EventAppended { seq: u64 },
    /// The event was refused: the run's next sequence number is `expected`.
    SeqConflict { expected: u64 },
    /// The schedule was stored.
    SchedulePut,
    /// The schedule was removed (`existed` is false when there was none of that name).
    ScheduleDeleted { existed: bool },
}

/// The whole replicated state, as a snapshot carries it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateImage {
    /// Each run's events in sequence order, by run id.
    pub runs: BTreeMap<String, Vec<serde_json::Value>>,
    pub schedules: BTreeMap<String, Schedule>,
}
