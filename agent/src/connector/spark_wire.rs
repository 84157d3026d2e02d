//! What the Spark connector reads off the wire: its URL (`spark://`, `databricks://`,
//! with the token kept out of it), a gRPC status with Spark's `ErrorInfo` as an agent
//! error carrying the SQL state, and Arrow IPC streams as text cells.

use std::io::Cursor;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use tonic::{Code, Status};

use crate::error::{AgentError, Result};

/// Where a Spark Connect server is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// TLS, with a CA file (`ca=`) or the system's roots.
    pub tls: bool,
    pub ca: Option<String>,
    /// Databricks: the cluster the session runs on (`x-databricks-cluster-id`).
    pub cluster_id: Option<String>,
    /// Where the bearer token is read from: an environment variable or a file.
    pub token_from: Option<TokenSource>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Env(String),
    File(String),
}

/// The environment variable a `databricks://` URL reads its token from by default.
pub const DEFAULT_TOKEN_ENV: &str = "DATABRICKS_TOKEN";

const TOKEN_ADVICE: &str = "a token never goes in the URL: put it in an environment variable \
     (token_env=VAR in the URL, DATABRICKS_TOKEN by default) or a file (token_file=/path)";

/// Parses `spark://host[:port]` (plain gRPC, port 15002 by default) or
/// `databricks://workspace-host?cluster_id=…[&token_env=VAR|&token_file=PATH][&ca=PATH]`
/// (TLS on 443). A URL that carries a token or a password is refused.
pub fn parse_url(url: &str) -> Result<Target> {
    let bad = |m: String| AgentError::Config(format!("spark URL: {m}"));
    let lower = url.to_ascii_lowercase();
    // Spark Connect's own URL form puts the token after `;token=`
    if lower.contains("token=") && !lower.contains("token_env=") && !lower.contains("token_file=")
        || lower.contains(";token")
    {
        return Err(bad(TOKEN_ADVICE.into()));
    }
    let u = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad(format!("no user or password in the URL; {TOKEN_ADVICE}")));
    }
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("no host".into()))?
        .to_string();
    if !matches!(u.path(), "" | "/") {
        return Err(bad(format!("unexpected path {:?}", u.path())));
    }
    let databricks = match u.scheme() {
        "spark" => false,
        "databricks" => true,
        s => return Err(bad(format!("unknown scheme {s:?}"))),
    };
    let mut t = Target {
        host,
        port: u.port().unwrap_or(if databricks { 443 } else { 15002 }),
        tls: databricks,
        ca: None,
        cluster_id: None,
        token_from: None,
    };
    for (k, v) in u.query_pairs() {
        match (k.as_ref(), databricks) {
            ("cluster_id", true) => t.cluster_id = Some(v.into_owned()),
            ("token_env", true) => t.token_from = Some(TokenSource::Env(v.into_owned())),
            ("token_file", true) => t.token_from = Some(TokenSource::File(v.into_owned())),
            ("ca", _) => {
                t.tls = true;
                t.ca = Some(v.into_owned());
            }
            ("token", _) => return Err(bad(TOKEN_ADVICE.into())),
            (k, _) => return Err(bad(format!("unknown parameter {k:?}"))),
        }
    }
    if databricks {
        if t.cluster_id.as_deref().is_none_or(str::is_empty) {
            return Err(bad("databricks:// needs ?cluster_id=…".into()));
        }
        t.token_from
            .get_or_insert_with(|| TokenSource::Env(DEFAULT_TOKEN_ENV.into()));
    }
    Ok(t)
}

/// Reads the bearer token from where the URL says, once, when the connector opens.
pub fn read_token(from: &TokenSource) -> Result<String> {
    let token = match from {
        TokenSource::Env(var) => std::env::var(var).map_err(|_| {
            AgentError::Config(format!(
                "databricks token: environment variable {var} is not set (export it, or name another with token_env=)"
            ))
        })?,
        TokenSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| AgentError::Config(format!("databricks token: cannot read {path}: {e}")))?,
    };
    let token = token.trim().to_string();
    if token.is_empty() || token.contains(['\n', '\r']) {
        return Err(AgentError::Config(
            "databricks token: empty or not one line".into(),
        ));
    }
    Ok(token)
}

/// `google.rpc.Status`, as a gRPC status's details carry it.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<RpcAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RpcAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.ErrorInfo`: Spark puts `errorClass` and `sqlState` in its metadata.
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: std::collections::HashMap<String, String>,
}

/// Spark's error class and SQL state of a status, from its `ErrorInfo` detail.
pub fn error_info(status: &Status) -> (Option<String>, Option<String>) {
    use prost::Message;
    let Ok(s) = RpcStatus::decode(status.details()) else {
        return (None, None);
    };
    for d in s.details {
        if d.type_url.ends_with("google.rpc.ErrorInfo")
            && let Ok(info) = ErrorInfo::decode(d.value.as_slice())
        {
            return (
                info.metadata.get("errorClass").cloned(),
                info.metadata.get("sqlState").cloned(),
            );
        }
    }
    (None, None)
}

/// Why a session could not be configured.
pub enum Unconfigured {
    /// a call failed: the server's status
    Call(tonic::Status),
    /// before any call (the channel, the request's metadata)
    Agent(AgentError),
    /// a setting did not hold, or the session changed between setting and reading
    NotHeld,
}

impl Unconfigured {
    pub fn into_error(self, dataset: &str) -> AgentError {
        match self {
            Unconfigured::Call(st) => status_error(dataset, &st),
            Unconfigured::Agent(e) => e,
            Unconfigured::NotHeld => AgentError::Query {
                dataset: dataset.into(),
                kind: "spark session refused its settings (time zone UTC, ANSI mode)",
            },
        }
    }
}

/// A call refused for its session: the server closed it, expired it (idle an hour by
/// default), does not know it, or holds another server-side session under its id (it
/// restarted). The session must be renewed; the call itself did not run.
pub fn session_gone(status: &Status) -> bool {
    error_info(status).0.is_some_and(|class| {
        matches!(
            class.as_str(),
            "INVALID_HANDLE.SESSION_CLOSED"
                | "INVALID_HANDLE.SESSION_NOT_FOUND"
                | "INVALID_HANDLE.SESSION_CHANGED"
        )
    })
}

/// A result stream that broke off in transport (an HTTP/2 reset, a connection or a
/// proxy gone): no error of Spark's, which carries its class in `ErrorInfo`.
pub fn broken_off(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Internal | Code::Unknown | Code::Cancelled
    ) && error_info(status) == (None, None)
}

/// The agent's words for a SQL state: the state itself, never the server's message
/// (it can quote row values).
fn sql_state_kind(state: &str) -> &'static str {
    match state {
        "22003" => "spark error: SQLSTATE 22003 (numeric value out of range)",
        "22012" => "spark error: SQLSTATE 22012 (division by zero)",
        "22018" => "spark error: SQLSTATE 22018 (invalid character value for cast)",
        "42P01" => "spark error: SQLSTATE 42P01 (table or view not found)",
        "42703" => "spark error: SQLSTATE 42703 (column not found)",
        "42601" => "spark error: SQLSTATE 42601 (syntax error)",
        "42883" => "spark error: SQLSTATE 42883 (routine not found)",
        "0A000" => "spark error: SQLSTATE 0A000 (feature not supported)",
        s if s.starts_with("22") => "spark error: SQLSTATE class 22 (data exception)",
        s if s.starts_with("42") => "spark error: SQLSTATE class 42 (syntax error or access rule violation)",
        s if s.starts_with("08") => "spark error: SQLSTATE class 08 (connection exception)",
        s if s.starts_with("XX") => "spark error: SQLSTATE class XX (internal error)",
        _ => "spark error",
    }
}

/// A failed call as the agent's error: unreachable servers as unavailable, Spark's
/// errors by their SQL state. The server's text stays in the agent's log.
pub fn status_error(dataset: &str, status: &Status) -> AgentError {
    let (class, state) = error_info(status);
    tracing::warn!(
        dataset,
        code = ?status.code(),
        error_class = class.as_deref().unwrap_or(""),
        sql_state = state.as_deref().unwrap_or(""),
        error = %status.message(),
        "spark call failed"
    );
    match (status.code(), state) {
        (_, Some(s)) => AgentError::Query {
            dataset: dataset.into(),
            kind: sql_state_kind(&s),
        },
        (Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled, None) => {
            AgentError::DatabaseUnavailable {
                dataset: dataset.into(),
                kind: "connection lost",
            }
        }
        (Code::Unauthenticated | Code::PermissionDenied, None) => AgentError::DatabaseUnavailable {
            dataset: dataset.into(),
            kind: "authentication failed",
        },
        _ => AgentError::Query {
            dataset: dataset.into(),
            kind: "spark error",
        },
    }
}

fn arrow_err(dataset: &str, what: &'static str) -> AgentError {
    AgentError::Query {
        dataset: dataset.into(),
        kind: what,
    }
}

/// The record batches of one Arrow IPC stream (one `ArrowBatch` message).
pub fn batches(dataset: &str, data: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(data), None).map_err(|e| {
        tracing::warn!(dataset, error = %e, "undecodable arrow stream");
        arrow_err(dataset, "undecodable arrow result")
    })?;
    reader
        .map(|b| {
            b.map_err(|e| {
                tracing::warn!(dataset, error = %e, "undecodable arrow batch");
                arrow_err(dataset, "undecodable arrow result")
            })
        })
        .collect()
}

/// The text of one cell: strings as they are, integers and decimals in their plain
/// digits, doubles as the shortest text that reads back as the same double (`NaN`,
/// `inf`, `-0.0`), which the agent renders canonically. Any other type is refused.
pub fn cell(dataset: &str, col: &ArrayRef, row: usize) -> Result<Option<String>> {
    if col.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match col.data_type() {
        DataType::Utf8 => col.as_string::<i32>().value(row).to_string(),
        DataType::LargeUtf8 => col.as_string::<i64>().value(row).to_string(),
        DataType::Int8 => col.as_primitive::<Int8Type>().value(row).to_string(),
        DataType::Int16 => col.as_primitive::<Int16Type>().value(row).to_string(),
        DataType::Int32 => col.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Int64 => col.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Float64 => format!("{:?}", col.as_primitive::<Float64Type>().value(row)),
        DataType::Float32 => format!("{:?}", f64::from(col.as_primitive::<Float32Type>().value(row))),
        DataType::Boolean => if col.as_boolean().value(row) { "1" } else { "0" }.to_string(),
        DataType::Decimal128(_, s) => decimal_text(col.as_primitive::<Decimal128Type>().value(row), *s),
        DataType::Date32 => {
            let (y, m, d) =
                tally_common::civil::civil_from_days(i64::from(col.as_primitive::<Date32Type>().value(row)));
            let mut out = String::new();
            tally_common::civil::push_year(&mut out, y);
            format!("{out}-{m:02}-{d:02}")
        }
        DataType::Null => return Ok(None),
        t => {
            tracing::warn!(dataset, arrow_type = %t, "unexpected arrow type");
            return Err(arrow_err(dataset, "unexpected arrow type in a result"));
        }
    }))
}

/// A decimal's unscaled value at scale `s` in plain digits (`-0.01`, `12.50`).
fn decimal_text(v: i128, s: i8) -> String {
    if s <= 0 {
        let mut t = v.to_string();
        if v != 0 {
            t.push_str(&"0".repeat(s.unsigned_abs() as usize));
        }
        return t;
    }
    let s = s as usize;
    let digits = v.unsigned_abs().to_string();
    let digits = format!("{digits:0>width$}", width = s + 1);
    let (int, frac) = digits.split_at(digits.len() - s);
    format!("{}{int}.{frac}", if v < 0 { "-" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_the_url_is_refused_and_says_where_it_goes() {
        for url in [
            "databricks://h.cloud.databricks.com?cluster_id=1&token=dapi123",
            "spark://h:15002/;token=abc",
            "databricks://user:dapi123@h.cloud.databricks.com?cluster_id=1",
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(
                e.contains("environment variable") && e.contains("token_file"),
                "{url}: {e}"
            );
            assert!(!e.contains("dapi123") && !e.contains("abc"), "{e}");
        }
    }

    #[test]
    fn spark_and_databricks_urls_parse() {
        let t = parse_url("spark://127.0.0.1:15003").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.tls), ("127.0.0.1", 15003, false));
        assert_eq!(parse_url("spark://localhost").unwrap().port, 15002);
        let t = parse_url("databricks://w.cloud.databricks.com?cluster_id=0123-abc").unwrap();
        assert_eq!((t.port, t.tls), (443, true));
        assert_eq!(t.cluster_id.as_deref(), Some("0123-abc"));
        assert_eq!(t.token_from, Some(TokenSource::Env(DEFAULT_TOKEN_ENV.into())));
        let t = parse_url("databricks://w?cluster_id=c&token_file=/run/secrets/dbx").unwrap();
        assert_eq!(t.token_from, Some(TokenSource::File("/run/secrets/dbx".into())));
        assert!(parse_url("databricks://w").is_err(), "no cluster id");
        assert!(parse_url("spark://h:1?nosuch=1").is_err());
    }

    #[test]
    fn decimals_are_plain_digits_at_their_scale() {
        assert_eq!(decimal_text(125050, 2), "1250.50");
        assert_eq!(decimal_text(-1, 2), "-0.01");
        assert_eq!(decimal_text(0, 3), "0.000");
        assert_eq!(decimal_text(-5, 0), "-5");
        assert_eq!(decimal_text(i128::MAX, 0), i128::MAX.to_string());
    }
}
