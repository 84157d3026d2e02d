//! `ReadPosition` and `WaitPosition`: a dataset's replication position.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::run_id_from;
use crate::position::{Position, PositionKind};
use crate::segment::{WireError, wire_err};

/// `ReadPosition`: the dataset whose replication position to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadPositionRequest {
    pub dataset: String,
    pub run_id: String,
}

impl TryFrom<pb::ReadPositionRequest> for ReadPositionRequest {
    type Error = WireError;
    fn try_from(r: pb::ReadPositionRequest) -> Result<ReadPositionRequest, WireError> {
        Ok(ReadPositionRequest {
            run_id: run_id_from(r.run_id)?,
            dataset: r.dataset,
        })
    }
}

impl From<ReadPositionRequest> for pb::ReadPositionRequest {
    fn from(r: ReadPositionRequest) -> Self {
        pb::ReadPositionRequest {
            dataset: r.dataset,
            run_id: r.run_id,
        }
    }
}

fn position_from(p: Option<pb::Position>, field: &str) -> Result<Position, WireError> {
    let p = p.ok_or_else(|| wire_err(field, "missing"))?;
    let kind = PositionKind::from_name(&p.kind)
        .ok_or_else(|| wire_err(format!("{field}.kind"), "expected lsn, gtid or integer"))?;
    Position::parse(kind, &p.value).map_err(|m| wire_err(format!("{field}.value"), m))
}

fn position_to(p: Position) -> pb::Position {
    pb::Position {
        kind: p.kind.name().to_string(),
        value: p.value,
    }
}

/// `WaitPosition`: wait until the dataset has applied `position` (a source's), at most
/// `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitPositionRequest {
    pub dataset: String,
    pub position: Position,
    pub timeout_ms: u64,
    pub run_id: String,
}

impl TryFrom<pb::WaitPositionRequest> for WaitPositionRequest {
    type Error = WireError;
    fn try_from(r: pb::WaitPositionRequest) -> Result<WaitPositionRequest, WireError> {
        Ok(WaitPositionRequest {
            position: position_from(r.position, "position")?,
            run_id: run_id_from(r.run_id)?,
            timeout_ms: r.timeout_ms,
            dataset: r.dataset,
        })
    }
}

impl From<WaitPositionRequest> for pb::WaitPositionRequest {
    fn from(r: WaitPositionRequest) -> Self {
        pb::WaitPositionRequest {
            dataset: r.dataset,
            position: Some(position_to(r.position)),
            timeout_ms: r.timeout_ms,
            run_id: r.run_id,
        }
    }
}

/// A position read (`ReadPosition`) or last read while waiting (`WaitPosition`, with
/// whether it reached the one asked for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionResponse {
    pub position: Position,
    pub reached: bool,
    pub release_log_head: String,
}

impl TryFrom<pb::PositionResponse> for PositionResponse {
    type Error = WireError;
    fn try_from(r: pb::PositionResponse) -> Result<PositionResponse, WireError> {
        Ok(PositionResponse {
            position: position_from(r.position, "position")?,
            reached: r.reached,
            release_log_head: r.release_log_head,
        })
    }
}

impl From<PositionResponse> for pb::PositionResponse {
    fn from(r: PositionResponse) -> Self {
        pb::PositionResponse {
            position: Some(position_to(r.position)),
            reached: r.reached,
            release_log_head: r.release_log_head,
        }
    }
}
