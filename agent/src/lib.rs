//! The Tally agent: deployed in one network zone beside one database, it holds that
//! database's credentials and answers the coordinator with counts and checksum sums,
//! releasing keys or values only where its own per-dataset policy allows. It is the
//! privacy boundary of its zone.
//!
//! Depends on `tally-proto` and `tally-common`; never on the coordinator. It is the
//! only crate that links database drivers.

pub mod config;
pub mod connector;
pub mod dataset;
pub mod dialect;
pub mod error;
pub mod files;
pub mod hash_pipe;
pub mod measures;
pub mod policy;
pub mod release;
pub mod release_log;
pub mod reveal_budget;
pub mod sample_data;
pub mod schema;
pub mod sealing;
pub mod server;
pub mod service;
pub mod tls;
pub mod watermark;

/// rustls needs one process-wide crypto provider; both binaries install ring's.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
