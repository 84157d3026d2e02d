//! Whole-system test support: throw-away PostgreSQL and MariaDB servers started from
//! the binaries on the machine, the `tally` and `tally-agent` binaries built from this
//! workspace, and child processes that are killed when the test lets go of them.
//!
//! Servers are started once per test process and removed when the process exits
//! (a reaper process watches the test process). `TALLY_TEST_PG_URL` and
//! `TALLY_TEST_MYSQL_URL` point the tests at existing servers instead.
//!
//! [`engines`] holds one fixture per engine for the live conformance suite
//! (agent/tests/conformance.rs).

pub mod bins;
pub mod db;
pub mod engines;
pub mod evidence;
pub mod generator;
pub mod https;
pub mod in_process;
pub mod netns;
pub mod proc;
pub mod raft_db;
pub mod replication;
pub mod s3;
pub mod spark;
pub mod zones;
