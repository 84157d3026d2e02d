//! Agent errors and the one place they become gRPC statuses. Messages that reach the
//! coordinator never carry driver text: a driver error can quote row values. The full
//! driver error is logged here, inside the zone, under an incident id the coordinator
//! sees.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("unknown dataset {0:?}")]
    UnknownDataset(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// Refused by the dataset's policy; names the policy key.
    #[error("refused by policy {key} of dataset {dataset}: {message}")]
    Policy {
        dataset: String,
        key: &'static str,
        message: String,
    },
    /// The database could not be reached or failed mid-call.
    #[error("database of dataset {dataset} unavailable ({kind})")]
    DatabaseUnavailable { dataset: String, kind: &'static str },
    /// A query failed for a reason other than connectivity.
    #[error("query on dataset {dataset} failed ({kind})")]
    Query { dataset: String, kind: &'static str },
    /// A value the canonical form cannot render.
    #[error("dataset {dataset} column {column}: {message}")]
    Canonical {
        dataset: String,
        column: String,
        message: String,
    },
    /// A sealed request's peer or seal was refused (DESIGN §4.1); names the reason.
    #[error("sealed request refused: {0}")]
    Seal(String),
    #[error("{0}")]
    Unsupported(String),
    /// The agent is serving as many calls of this kind as it allows; a retry may find
    /// room.
    #[error("busy: {0}")]
    Busy(String),
    /// The dataset's replication position could not be read (DESIGN §5, watermarks).
    #[error("watermark of dataset {dataset}: {message}")]
    Watermark { dataset: String, message: String },
    #[error("configuration: {0}")]
    Config(String),
    /// The release log could not record the call: the agent releases nothing it has
    /// not recorded (fail closed).
    #[error("the agent's release log cannot be written; nothing was released")]
    ReleaseLog,
    /// The answer could not be signed with the agent's TLS key (DESIGN §12): it is not
    /// sent unsigned.
    #[error("cannot sign the answer: {0}")]
    Sign(String),
    /// A fault inside the agent (a worker thread that ended early): the call fails
    /// rather than answer from part of its rows.
    #[error("internal: {0}")]
    Internal(String),
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

impl AgentError {
    /// Wraps a driver error: logs the driver's text inside the zone, returns a
    /// message without it.
    pub fn from_db(dataset: &str, err: sqlx::Error) -> AgentError {
        let unavailable = matches!(
            err,
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_)
        ) || matches!(&err, sqlx::Error::Database(d) if d.code().as_deref().is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P03"));
        let kind = match &err {
            sqlx::Error::Io(_) => "connection lost",
            sqlx::Error::PoolTimedOut => "connection timed out",
            sqlx::Error::PoolClosed => "pool closed",
            sqlx::Error::Tls(_) => "tls",
            sqlx::Error::Database(_) if unavailable => "server shutting down",
            sqlx::Error::Database(_) => "database error",
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => "decode",
            sqlx::Error::Protocol(_) => "protocol",
            _ => "driver error",
        };
        tracing::warn!(dataset, kind, error = %err, "database call failed");
        if unavailable {
            AgentError::DatabaseUnavailable {
                dataset: dataset.to_string(),
                kind,
            }
        } else {
            AgentError::Query {
                dataset: dataset.to_string(),
                kind,
            }
        }
    }

    pub fn code(&self) -> Code {
        match self {
            AgentError::UnknownDataset(_) => Code::NotFound,
            AgentError::InvalidArgument(_) => Code::InvalidArgument,
            AgentError::Policy { .. } | AgentError::Seal(_) => Code::PermissionDenied,
            AgentError::DatabaseUnavailable { .. } => Code::Unavailable,
            AgentError::Query { .. } => Code::Internal,
            AgentError::Canonical { .. } => Code::FailedPrecondition,
            AgentError::Unsupported(_) => Code::Unimplemented,
            AgentError::Watermark { .. } => Code::FailedPrecondition,
            AgentError::Busy(_) => Code::ResourceExhausted,
            AgentError::Config(_) => Code::FailedPrecondition,
            AgentError::ReleaseLog => Code::Unavailable,
            AgentError::Sign(_) => Code::Internal,
            AgentError::Internal(_) => Code::Internal,
        }
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

impl From<tally_common::segment::WireError> for AgentError {
    fn from(e: tally_common::segment::WireError) -> Self {
        AgentError::InvalidArgument(e.to_string())
    }
}
