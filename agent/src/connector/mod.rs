//! Connectors execute what dialects render. One [`EngineConnector`] per engine; each
//! engine's driver code lives in its own file. A connector turns a row into canonical
//! fields ([`CanonRow`]) so everything above it is engine-independent.
//!
//! One connector per database URL: the agent shares it (`Arc`) between every dataset
//! on that URL, so the URL's connection cap holds whatever the number of datasets.

#[cfg(any(feature = "duckdb", feature = "oracle"))]
pub mod blocking;
#[cfg(feature = "clickhouse")]
pub mod clickhouse;
#[cfg(feature = "duckdb")]
pub mod duckdb;
#[cfg(feature = "mssql")]
pub mod mssql;
pub mod mysql;
pub mod mysql_query_columns;
#[cfg(feature = "oracle")]
pub mod oracle;
mod pool;
pub mod postgres;
mod rows;
#[cfg(feature = "spark")]
pub mod spark;
#[cfg(feature = "spark")]
pub mod spark_wire;
pub mod sqlite;
pub mod sqlx_conn;
pub mod throttle;
mod traits;

pub use pool::{Connector, Session};
#[cfg(any(feature = "mssql", feature = "oracle"))]
pub use pool::{IdlePool, Pooled};
pub(crate) use rows::key_into;
pub use rows::{CanonRow, RowBuilder, agg_row, parse_sum, reread};
pub use traits::{AggRow, EngineConn, EngineConnector, Flow, RowSink, obey};

use std::time::Duration;

use crate::config::ConnectionsConfig;
use crate::error::{AgentError, Result};

/// How long opening a database connection may take before the call reports the
/// database unavailable. Waiting for a busy pool's free connection is apart from it
/// (`connections.acquire_timeout_secs`): a slot is taken before the pool is asked, so
/// the pool's own acquire timeout only ever times a connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An engine this agent build knows: the URL schemes that name it and how to open
/// its connector (the pool is created lazily: nothing connects here).
pub struct Engine {
    pub name: &'static str,
    pub schemes: &'static [&'static str],
    pub open: fn(&str, &ConnectionsConfig) -> Result<Box<dyn EngineConnector>>,
}

/// Every engine of this build. Adding an engine is a dialect file, a connector file
/// with its `ENGINE`, and a line here.
pub static ENGINES: &[Engine] = &[
    postgres::ENGINE,
    mysql::ENGINE,
    sqlite::ENGINE,
    #[cfg(feature = "duckdb")]
    duckdb::ENGINE,
    #[cfg(feature = "mssql")]
    mssql::ENGINE,
    #[cfg(feature = "oracle")]
    oracle::ENGINE,
    #[cfg(feature = "spark")]
    spark::ENGINE,
    #[cfg(feature = "clickhouse")]
    clickhouse::ENGINE,
];

/// The engine a URL names, or an error naming the scheme and what to do.
pub fn engine_for_url(url: &str) -> Result<&'static Engine> {
    let scheme = url.split(':').next().unwrap_or("");
    if let Some(e) = ENGINES.iter().find(|e| e.schemes.contains(&scheme)) {
        return Ok(e);
    }
    // an engine this build leaves out names the cargo feature that brings it in
    let feature = match scheme {
        "duckdb" => Some("duckdb"),
        "mssql" | "sqlserver" => Some("mssql"),
        "oracle" => Some("oracle"),
        "spark" | "databricks" => Some("spark"),
        "clickhouse" => Some("clickhouse"),
        _ => None,
    };
    Err(AgentError::Config(match feature {
        Some(f) => format!(
            "{scheme}:// datasets need an agent built with the `{f}` cargo feature \
             (cargo build --release -p tally-agent --features tally-agent/{f}; docs/engines.md)"
        ),
        _ => {
            let known: Vec<&str> = ENGINES.iter().flat_map(|e| e.schemes.iter().copied()).collect();
            format!(
                "unknown database URL scheme {scheme:?} (this agent knows {})",
                known.join(", ")
            )
        }
    }))
}

/// A row count as the engine answered it. A missing, unreadable or negative number is
/// an error: a count places quantile cuts, and a zero made up here would hide the
/// engine's fault behind a plan that still looks sound.
pub fn counted(dataset: &str, n: Option<i64>) -> Result<u64> {
    match n {
        Some(n) if n >= 0 => Ok(n as u64),
        _ => Err(AgentError::Query {
            dataset: dataset.to_string(),
            kind: "a row count came back without a number",
        }),
    }
}

/// The class of a driver's connect failure, from its text (every driver words them
/// its own way): what the coordinator is told, without the text.
pub fn connect_failure_class(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| t.contains(w));
    if any(&["refused"]) {
        "connection refused"
    } else if any(&[
        "password",
        "authentication",
        "access denied",
        "28p01",
        "28000",
        "login failed",
    ]) {
        "authentication failed"
    } else if any(&["tls", "ssl", "certificate"]) {
        "tls"
    } else if any(&[
        "resolve",
        "lookup",
        "name or service not known",
        "nodename",
        "no such host",
    ]) {
        "host not found"
    } else if any(&["timed out", "timeout", "no answer within"]) {
        "connection timed out"
    } else {
        "cannot connect"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_count_without_a_number_is_an_error_not_zero() {
        assert_eq!(counted("d", Some(7)).unwrap(), 7);
        assert_eq!(counted("d", Some(0)).unwrap(), 0);
        for n in [None, Some(-1)] {
            let e = counted("d", n).unwrap_err().to_string();
            assert!(e.contains("dataset d") && e.contains("without a number"), "{e}");
        }
    }

    #[test]
    fn a_connect_failure_is_told_by_its_class_whatever_the_driver_says() {
        for (text, class) in [
            (
                "error communicating with database: Connection refused (os error 111)",
                "connection refused",
            ),
            (
                "password authentication failed for user \"tally\"",
                "authentication failed",
            ),
            (
                "error returned from database: 1045 (28000): Access denied for user",
                "authentication failed",
            ),
            (
                "error with configuration: failed to resolve host: Name or service not known",
                "host not found",
            ),
            (
                "error occurred while attempting to establish a TLS connection: invalid certificate",
                "tls",
            ),
            (
                "no answer within 5 s (a firewall dropping packets, or a wrong host)",
                "connection timed out",
            ),
            ("something else entirely", "cannot connect"),
        ] {
            assert_eq!(connect_failure_class(text), class, "{text}");
        }
    }

    /// An engine left out of this build is named with the feature that brings it in;
    /// an engine in it opens (nothing connects until a call).
    #[test]
    fn a_url_of_an_engine_left_out_names_its_cargo_feature() {
        for (url, feature, built) in [
            ("duckdb:///tmp/x.duckdb", "duckdb", cfg!(feature = "duckdb")),
            ("sqlserver://h:1433/db", "mssql", cfg!(feature = "mssql")),
            ("mssql://h:1433/db", "mssql", cfg!(feature = "mssql")),
            ("oracle://h:1521/db", "oracle", cfg!(feature = "oracle")),
            ("spark://127.0.0.1:15002", "spark", cfg!(feature = "spark")),
        ] {
            match engine_for_url(url) {
                Ok(e) => assert!(built, "{url} opened as {} without its feature", e.name),
                Err(e) => {
                    assert!(!built, "{url}: {e}");
                    assert!(
                        e.to_string().contains(&format!("`{feature}` cargo feature")),
                        "{e}"
                    );
                }
            }
        }
        assert!(engine_for_url("postgres://h/db").is_ok());
        assert!(
            engine_for_url("nosuch://h/db")
                .err()
                .is_some_and(|e| e.to_string().contains("unknown"))
        );
    }
}
