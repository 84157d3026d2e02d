//! Errors of a run, each with a stable code for `--json` and the exit status 2.

#[derive(Debug, Clone, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Config(String),
    #[error("schema drift: {0}")]
    SchemaDrift(String),
    /// Requested columns whose type has no canonical form: never skipped, never hashed loosely.
    #[error("{0}")]
    NoCanonicalForm(String),
    #[error("agent {agent} refused {rpc}: {message}")]
    PolicyRefused {
        agent: String,
        rpc: String,
        message: String,
    },
    #[error("agent {agent} ({endpoint}) unreachable during {rpc}: {message}")]
    Unreachable {
        agent: String,
        endpoint: String,
        rpc: String,
        message: String,
    },
    /// The agent is up; its database refused it or did not answer (the agent waited
    /// its connect timeout; the class, not the driver's text, is in the message).
    #[error("agent {agent}: {message} (during {rpc})")]
    DatabaseUnavailable {
        agent: String,
        rpc: String,
        message: String,
    },
    #[error("agent {agent} failed {rpc}: {message}")]
    Agent {
        agent: String,
        rpc: String,
        code: String,
        message: String,
    },
    /// An agent's answer that does not parse as the protocol says (a field named).
    #[error("agent {agent} sent a malformed {rpc} answer: {message}")]
    MalformedAnswer {
        agent: String,
        rpc: String,
        message: String,
    },
    #[error("gate {gate} tripped: {message}")]
    Gate { gate: &'static str, message: String },
    /// A target did not apply its source's replication position in time (a window's
    /// `watermark: wait`), or a side has no watermark to read.
    #[error("watermark: {0}")]
    Watermark(String),
    #[error("cancelled")]
    Cancelled,
    #[error("{0}")]
    Internal(String),
}

/// An agent's UNAVAILABLE that is its database's, not its own (`database of dataset D
/// unavailable (KIND)`, the agent's wording): the agent answered.
pub fn is_database_unavailable(message: &str) -> bool {
    message.starts_with("database of dataset ")
}

impl RunError {
    /// An agent's answer that failed its domain conversion, naming the agent and field.
    pub fn malformed(agent: &str, rpc: &str, e: tally_common::segment::WireError) -> RunError {
        RunError::MalformedAnswer {
            agent: agent.to_string(),
            rpc: rpc.to_string(),
            message: e.to_string(),
        }
    }

    /// The stable code of `error.code` in `--json`.
    pub fn code(&self) -> &'static str {
        match self {
            RunError::Config(_) => "config",
            RunError::SchemaDrift(_) => "schema_drift",
            RunError::NoCanonicalForm(_) => "no_canonical_form",
            RunError::PolicyRefused { .. } => "policy_refused",
            RunError::Unreachable { .. } => "agent_unreachable",
            RunError::DatabaseUnavailable { .. } => "database_unavailable",
            RunError::Agent { .. } | RunError::MalformedAnswer { .. } => "agent_error",
            RunError::Gate { .. } => "gate_tripped",
            RunError::Watermark(_) => "watermark",
            RunError::Cancelled => "cancelled",
            RunError::Internal(_) => "internal",
        }
    }
}
