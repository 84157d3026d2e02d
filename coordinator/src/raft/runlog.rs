//! [`RaftRunLog`]: the run log (runlog.rs) of a `tally serve` group. An append is a
//! `Command::AppendRunEvent` written through Raft on the leader, returning only once a
//! majority has it and the leader applied it; loads and lists read this replica's
//! applied state machine, so every replica answers them.
//!
//! Each event is stored as its chain line (a JSON string): the very line
//! `SqliteRunLog` would store, so chains verify alike whichever back-end kept them.
//! The command carries the run's next sequence number: an append of a deposed leader
//! that raced the new one is refused by the state machine (`SeqConflict`), and one made
//! after it lost the leadership by Raft (`ForwardToLeader`).

use std::collections::BTreeMap;

use openraft::Raft;
use openraft::error::{ClientWriteError, RaftError};
use serde_json::{Map, Value};
use tally_common::chain::{GENESIS, line_hash};

use super::state_machine::StateReader;
use super::types::{Command, Response, TypeConfig};
use crate::runlog::{Appended, RunHead, RunLog, RunLogError, Schedule, next_line};

#[derive(Clone)]
pub struct RaftRunLog {
    raft: Raft<TypeConfig>,
    reader: StateReader,
}

impl RaftRunLog {
    pub fn new(raft: Raft<TypeConfig>, reader: StateReader) -> RaftRunLog {
        RaftRunLog { raft, reader }
    }
}

fn store_err(e: impl std::fmt::Display) -> RunLogError {
    RunLogError::Store(e.to_string())
}

fn line_of(run: &str, v: &Value) -> Result<String, RunLogError> {
    v.as_str().map(str::to_string).ok_or_else(|| RunLogError::Broken {
        run: run.to_string(),
        what: "a stored event is not a chain line".into(),
    })
}

impl RaftRunLog {
    /// Writes a command through Raft on the leader.
    async fn write(&self, command: Command) -> Result<Response, RunLogError> {
        match self.raft.client_write(command).await {
            Ok(r) => Ok(r.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(RunLogError::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            }),
            Err(e) => Err(store_err(e)),
        }
    }

    async fn write_event(
        &self,
        run: &str,
        event: Map<String, Value>,
        new: bool,
    ) -> Result<Appended, RunLogError> {
        // the count and the last line only: a long chain (the audit trail) is not read
        // whole for each append
        let tail = self.reader.run_tail(run).await.map_err(store_err)?;
        let (count, head) = match tail {
            Some((n, v)) if !new => (n, line_hash(&line_of(run, &v)?)),
            Some(_) => {
                return Err(RunLogError::Conflict {
                    run: run.to_string(),
                    seq: 1,
                });
            }
            None => (0, GENESIS.to_string()),
        };
        // a start is the run's event 0 whatever this replica has applied: the state
        // machine refuses it if another leader's start of the same run committed first
        let (seq, line) = next_line(run, count, &head, event)?;
        let head = line_hash(&line);
        let command = Command::AppendRunEvent {
            run_id: run.to_string(),
            seq: count,
            event: Value::String(line),
        };
        match self.write(command).await? {
            Response::EventAppended { .. } => Ok(Appended { seq, head }),
            Response::SeqConflict { .. } => Err(RunLogError::Conflict {
                run: run.to_string(),
                seq,
            }),
            other => Err(store_err(format!("unexpected answer {other:?}"))),
        }
    }
}

#[tonic::async_trait]
impl RunLog for RaftRunLog {
    async fn append(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write_event(run, event, false).await
    }

    async fn start(&self, run: &str, event: Map<String, Value>) -> Result<Appended, RunLogError> {
        self.write_event(run, event, true).await
    }

    async fn schedules(&self) -> Result<BTreeMap<String, Schedule>, RunLogError> {
        self.reader.schedules().await.map_err(store_err)
    }

    async fn put_schedule(&self, name: &str, schedule: Schedule) -> Result<(), RunLogError> {
        let name = name.to_string();
        match self.write(Command::PutSchedule { name, schedule }).await? {
            Response::SchedulePut => Ok(()),
            other => Err(store_err(format!("unexpected answer {other:?}"))),
        }
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, RunLogError> {
        let name = name.to_string();
        match self.write(Command::DeleteSchedule { name }).await? {
            Response::ScheduleDeleted { existed } => Ok(existed),
            other => Err(store_err(format!("unexpected answer {other:?}"))),
        }
    }

    async fn lines(&self, run: &str) -> Result<Vec<String>, RunLogError> {
        let events = self.reader.run_events(run).await.map_err(store_err)?;
        events.iter().map(|v| line_of(run, v)).collect()
    }

    async fn runs(&self) -> Result<Vec<RunHead>, RunLogError> {
        let heads = self.reader.run_heads().await.map_err(store_err)?;
        heads
            .into_iter()
            .map(|(run_id, events, last)| {
                let head = line_hash(&line_of(&run_id, &last)?);
                Ok(RunHead { run_id, events, head })
            })
            .collect()
    }
}
