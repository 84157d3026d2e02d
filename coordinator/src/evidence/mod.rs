//! Evidence a third party can check (DESIGN §12, docs/evidence.md): the agents' signed
//! answers as they arrive, the coordinator's signed statement and checkpoint when a run
//! ends, the bundle `tally evidence` writes, and the offline checks of `tally verify`.
//!
//! What is signed is always bytes kept as they were signed (DSSE payloads, the result
//! text, the run log's lines): nothing here re-serialises a signed document to check it.
//!
//! The signer, the checkpoint and a verifier's check are the ledger's too: they live
//! below both, in [`crate::signing`], and the evidence uses the ledger, never the
//! other way.

mod answers;
mod bundle;
mod seal;
mod statement;
mod verify;

pub use answers::{check_aggregate, check_digests, check_measures, digests_hash, signed_buckets};
pub use bundle::{Bundle, BundleError, CertEntry, bundle};
pub use seal::seal_run;
pub use statement::{
    Predicate, SideAgent, SideAgents, Statement, Subject, Totals, groups_fingerprint, spec_sha256,
};
pub use verify::{verify, verify_with_log};

pub use crate::signing::{Check, Checkpoint, Signer, valid};

/// How far an agent's clock may be from the coordinator's: an answer's signed time must
/// fall between the run's start and its checkpoint, give or take this.
pub const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// The bundle's `format`.
pub const FORMAT: &str = "tally-evidence/1";
/// The in-toto Statement's `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The Statement's `predicateType`.
pub const PREDICATE_TYPE: &str = "https://tally.dev/reconciliation/v1";
