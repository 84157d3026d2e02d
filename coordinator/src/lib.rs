//! The Tally coordinator: plans bisection levels, sends one aggregate per side per
//! level to the agents over mutual TLS, compares the sums and reports where two
//! datasets differ. It never holds a database credential, and sees row keys or
//! values only where both the spec and the agents' policies allow.
//!
//! The run itself is `tally-engine`'s pure state machine; this crate is everything
//! around it that does I/O: the runtime that drives it against two agents
//! ([`runtime`]), the agents' gRPC client, the run log and store, evidence, the
//! service (`tally serve`, its Raft group and API) and the API's client.
//!
//! Depends on `tally-proto`, `tally-common` and `tally-engine`; never on the agent, and it links no
//! database driver but SQLite's (its run log). Cargo enforces it: the agent is a
//! dependency of the `tally` binary's package (`cli/`), where `tally demo` starts two
//! agents on loopback, and of the tests crate, whose in-process agent drives the
//! runtime in tests.

pub mod api_auth;
pub mod api_client;
pub mod api_tls;
pub mod audit;
pub mod chain;
pub mod client;
pub mod cluster_cli;
pub mod cluster_config;
pub mod config;
pub mod cron;
pub mod evidence;
pub mod ledger;
pub mod lifecycle;
pub mod raft;
pub mod redact;
pub mod runlog;
pub mod runtime;
pub mod serve;
pub mod signing;
pub mod store;
pub mod tls_refusal;
