//! Wire types of `tally.agent.v1` and `tally.raft.v1`, generated from `proto/`. These types stop at the
//! service edge: agent and coordinator convert them to domain types (with
//! validation) before use. This crate depends on nothing of Tally's own.

#![allow(clippy::derive_partial_eq_without_eq, missing_docs)]

pub mod agent {
    pub mod v1 {
        tonic::include_proto!("tally.agent.v1");
    }
}

/// The replicas of a `tally serve` group among themselves (Raft, forwarded writes,
/// `tally cluster`).
pub mod raft {
    pub mod v1 {
        tonic::include_proto!("tally.raft.v1");
    }
}

pub use agent::v1;

/// The subset of Spark Connect (package `spark.connect`, Apache Spark's own field
/// numbers) the agent's Spark engine speaks; built with the `spark` feature.
#[cfg(feature = "spark")]
pub mod spark {
    pub mod connect {
        tonic::include_proto!("spark.connect");
    }
}
