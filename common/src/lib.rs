//! Shared ground of Tally: the canonical form of values (DESIGN §3), the checksum
//! arithmetic (§4), domain types with their wire conversions, and the test-vector
//! format. Used by both the agent and the coordinator; depends only on `tally-proto`
//! and never on a database driver, a network stack or either binary crate.

pub mod canonical;
pub mod chain;
pub mod checksum;
pub mod civil;
pub mod config_file;
pub mod dsse;
pub mod evidence;
pub mod jcs;
pub mod measures;
pub mod period;
pub mod pki;
pub mod position;
pub mod request_json;
pub mod seal;
pub mod segment;
pub mod shortest;
pub mod types;
pub mod vectors;
pub mod wire;

pub use canonical::{FieldFormat, Value};
pub use checksum::{AnyAggregate, HashMethod};
pub use types::{PrivacyLevel, TypeClass};
