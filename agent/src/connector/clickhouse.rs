//! ClickHouse over its HTTP interface (behind the `clickhouse` cargo feature):
//! `clickhouse://user@host:8123/database`, plain HTTP inside the zone (TLS is not
//! taken yet: `secure=` is refused rather than ignored). The password never rides in
//! the URL: it comes from the environment variable `password_env=` names
//! (`CLICKHOUSE_PASSWORD` by default, none when unset) or the file `password_file=`
//! names, and travels in the `X-ClickHouse-Key` header only.
//!
//! Each statement is one POST on a connection of its own: the SQL in the body, bind
//! values as typed query parameters (`param_p1=…`, escaped as ClickHouse's
//! TabSeparated reads them), the dialect's settings and `wait_end_of_query=1`, so a
//! statement that fails after its first rows still answers with an error status and
//! never with a short result. Results are TabSeparated: each line must hold the
//! columns asked for, `\N` is NULL, the escapes are undone; a last line without its
//! newline is an error. Errors carry ClickHouse's error code as a kind; the server's
//! text (which can quote a value) is logged inside the zone only.
//!
//! The server's version is read before the first describe: one older than the
//! dialect's floor ([`crate::dialect::clickhouse::MIN_VERSION`]) is refused with the
//! version named. ClickHouse has no transactions: a request's statements each read the
//! table as it then is. `final=true` in the URL reads every table of its datasets
//! through `FINAL` (a ReplacingMergeTree's unmerged versions would otherwise count
//! twice); it is never inferred.

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;
use tokio::sync::OnceCell;

use super::{AggRow, CONNECT_TIMEOUT, EngineConn, EngineConnector, Flow, RowBuilder, RowSink, agg_row, obey};
use crate::config::Source;
use crate::dialect::clickhouse::{self, ClickHouse, MIN_VERSION, SETTINGS, VERSION_SQL};
use crate::dialect::{Dialect, FetchShape, Sql, relation};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

const DEFAULT_PASSWORD_ENV: &str = "CLICKHOUSE_PASSWORD";
const PASSWORD_ADVICE: &str = "a password never goes in the URL: put it in an environment variable \
     (password_env=VAR in the URL, CLICKHOUSE_PASSWORD by default) or a file (password_file=/path)";

/// Where a connector's server is and how it signs in.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub password_from: PasswordSource,
    pub final_read: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PasswordSource {
    /// This variable, or no password when it is unset (the default variable only).
    Env {
        var: String,
        required: bool,
    },
    File(String),
}

/// Parses `clickhouse://[user@]host[:port][/database][?password_env=VAR|password_file=PATH][&final=true]`.
pub fn parse_url(url: &str) -> Result<Target> {
    let bad = |m: String| AgentError::Config(format!("clickhouse URL: {m}"));
    let u = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if u.scheme() != "clickhouse" {
        return Err(bad(format!("unknown scheme {:?}", u.scheme())));
    }
    if u.password().is_some() {
        return Err(bad(PASSWORD_ADVICE.into()));
    }
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("no host".into()))?
        .to_string();
    let database = u.path().trim_start_matches('/');
    if database.contains('/') {
        return Err(bad(format!("unexpected path {:?}: give /database", u.path())));
    }
    let mut t = Target {
        host,
        port: u.port().unwrap_or(8123),
        database: if database.is_empty() {
            "default".into()
        } else {
            percent_encoding::percent_decode_str(database)
                .decode_utf8()
                .map_err(|e| bad(e.to_string()))?
                .into_owned()
        },
        user: if u.username().is_empty() {
            "default".into()
        } else {
            percent_encoding::percent_decode_str(u.username())
                .decode_utf8()
                .map_err(|e| bad(e.to_string()))?
                .into_owned()
        },
        password_from: PasswordSource::Env {
            var: DEFAULT_PASSWORD_ENV.into(),
            required: false,
        },
        final_read: false,
    };
    for (k, v) in u.query_pairs() {
        match k.as_ref() {
            "password_env" => {
                t.password_from = PasswordSource::Env {
                    var: v.into_owned(),
                    required: true,
                }
            }
            "password_file" => t.password_from = PasswordSource::File(v.into_owned()),
            "final" if v == "true" || v == "false" => t.final_read = v == "true",
            "password" => return Err(bad(PASSWORD_ADVICE.into())),
            "secure" | "ca" => {
                return Err(bad(format!(
                    "{k}: TLS to ClickHouse is not supported yet; reach the server over plain HTTP inside the agent's zone"
                )));
            }
            k => {
                return Err(bad(format!(
                    "unknown parameter {k:?} (password_env, password_file, final)"
                )));
            }
        }
    }
    Ok(t)
}

/// Reads the password from where the URL says, once, when the connector opens.
fn read_password(from: &PasswordSource) -> Result<Option<String>> {
    let p = match from {
        PasswordSource::Env { var, required } => match std::env::var(var) {
            Ok(p) => p,
            Err(_) if !required => return Ok(None),
            Err(_) => {
                return Err(AgentError::Config(format!(
                    "clickhouse password: environment variable {var} is not set (export it, or name another with password_env=)"
                )));
            }
        },
        PasswordSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| AgentError::Config(format!("clickhouse password: cannot read {path}: {e}")))?,
    };
    let p = p.trim_end_matches(['\n', '\r']).to_string();
    if p.contains(['\n', '\r']) {
        return Err(AgentError::Config("clickhouse password: not one line".into()));
    }
    Ok(Some(p))
}

/// A value as ClickHouse reads a query parameter: TabSeparated's escaping.
pub fn escape_param(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// One TabSeparated field: `\N` is NULL, the escapes undone. Not UTF-8 is an error
/// (a value the canonical form holds is text).
pub fn unescape_field(dataset: &str, f: &[u8]) -> Result<Option<String>> {
    if f == b"\\N" {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(f.len());
    let mut i = 0;
    while i < f.len() {
        if f[i] == b'\\' && i + 1 < f.len() {
            out.push(match f[i + 1] {
                b'b' => 0x08,
                b'f' => 0x0c,
                b'r' => b'\r',
                b'n' => b'\n',
                b't' => b'\t',
                b'0' => 0,
                b'a' => 0x07,
                b'v' => 0x0b,
                c => c,
            });
            i += 2;
        } else {
            out.push(f[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map(Some).map_err(|_| AgentError::Query {
        dataset: dataset.into(),
        kind: "clickhouse sent a value that is not UTF-8",
    })
}

/// Splits one TabSeparated line into its fields.
fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| *b == b'\t')
}

fn shape(dataset: &str) -> AgentError {
    AgentError::Query {
        dataset: dataset.into(),
        kind: "unexpected row shape",
    }
}

/// `major.minor` of a version text such as `26.9.2.1`.
fn version_of(text: &str) -> Option<(u32, u32)> {
    let mut it = text.trim().split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// A ClickHouse error (its code, from the status's header or the body's `Code: N`)
/// as the coordinator may see it: a kind, never the server's text.
fn error_of(dataset: &str, status: u16, code: Option<u32>, text: &str) -> AgentError {
    tracing::warn!(dataset, status, code, error = %text.trim(), "clickhouse statement failed");
    let kind = match (status, code) {
        // the code first: ACCESS_DENIED (a missing grant) also answers 403
        (_, Some(192 | 193 | 194 | 516)) | (401 | 403, None) => {
            return AgentError::DatabaseUnavailable {
                dataset: dataset.into(),
                kind: "authentication failed",
            };
        }
        (_, Some(497)) => "access denied (a grant is missing)",
        (_, Some(164)) => "the user is readonly=1, which refuses the statement's settings: use readonly=2",
        (200, None) => "clickhouse result not framed (neither chunked nor of a known length)",
        (_, Some(60)) => "table not found",
        (_, Some(81)) => "database not found",
        (_, Some(16 | 47)) => "unknown column",
        (_, Some(62)) => "syntax error",
        (_, Some(115)) => "unknown setting (server too old?)",
        (_, Some(159)) => "timed out",
        (_, Some(241)) => "memory limit exceeded",
        (_, Some(456 | 457)) => "query parameter missing or not of its type",
        _ => "database error",
    };
    AgentError::Query {
        dataset: dataset.into(),
        kind,
    }
}

/// The `X-ClickHouse-Exception-Code` of a response's headers or trailers.
fn exception_code(h: &hyper::HeaderMap) -> Option<u32> {
    h.get("x-clickhouse-exception-code")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The code in a ClickHouse error body (`Code: 60. DB::Exception: …`).
fn code_in(text: &str) -> Option<u32> {
    let rest = text.split("Code: ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[derive(Clone)]
pub struct ClickHouseConnector {
    target: Target,
    password: Option<String>,
    dialect: ClickHouse,
    version: std::sync::Arc<OnceCell<String>>,
}

impl ClickHouseConnector {
    pub fn open(url: &str) -> Result<ClickHouseConnector> {
        let target = parse_url(url)?;
        let password = read_password(&target.password_from)?;
        Ok(ClickHouseConnector {
            dialect: ClickHouse {
                final_read: target.final_read,
            },
            target,
            password,
            version: std::sync::Arc::new(OnceCell::new()),
        })
    }

    /// Sends one statement; calls `line` with each line of the result (without its
    /// newline) and does what it answers. `settings`: the dialect's, or none (the version probe, which must run
    /// on any server).
    async fn run(
        &self,
        dataset: &str,
        sql: &str,
        params: &[(String, String)],
        settings: bool,
        line: &mut (dyn FnMut(&[u8]) -> Result<Flow> + Send),
    ) -> Result<()> {
        let unavailable = |kind| AgentError::DatabaseUnavailable {
            dataset: dataset.into(),
            kind,
        };
        let addr = format!("{}:{}", self.target.host, self.target.port);
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&addr))
            .await
            .map_err(|_| unavailable("connection timed out"))?
            .map_err(|e| {
                tracing::warn!(dataset, error = %e, "clickhouse: cannot connect");
                unavailable("connection refused")
            })?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|_| unavailable("http handshake failed"))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let query = {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            q.append_pair("database", &self.target.database);
            // not settings: taken by every server and every user, readonly ones too. The
            // format is pinned (a profile's default could be TSVRaw, unescaped), and a
            // statement that fails after its first rows answers with an error status
            q.append_pair("default_format", "TabSeparated");
            q.append_pair("wait_end_of_query", "1");
            if settings {
                for (k, v) in SETTINGS {
                    q.append_pair(k, v);
                }
            }
            for (k, v) in params {
                q.append_pair(&format!("param_{k}"), &escape_param(v));
            }
            q.finish()
        };
        let mut req = Request::post(format!("/?{query}"))
            .header("host", &addr)
            .header("x-clickhouse-user", &self.target.user);
        if let Some(p) = &self.password {
            let mut v = hyper::header::HeaderValue::from_str(p)
                .map_err(|_| AgentError::Config("clickhouse password: not a header value".into()))?;
            v.set_sensitive(true);
            req = req.header("x-clickhouse-key", v);
        }
        let req = req
            .body(Full::new(Bytes::from(sql.to_string())))
            .map_err(|_| unavailable("bad request"))?;
        let r = async {
            let resp = sender
                .send_request(req)
                .await
                .map_err(|_| unavailable("connection lost"))?;
            let status = resp.status().as_u16();
            let header_code = exception_code(resp.headers());
            // a body that ends only when the connection closes (neither chunked nor of a
            // known length: a proxy) cannot tell a cut from its end
            let framed = resp.headers().contains_key(hyper::header::CONTENT_LENGTH)
                || resp
                    .headers()
                    .get(hyper::header::TRANSFER_ENCODING)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
            let mut body: Incoming = resp.into_body();
            // an exception code is an error whatever the status (some servers answer a
            // stalled request 200 with the code and an empty body)
            if status != 200 || header_code.is_some() || !framed {
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes);
                return Err(error_of(
                    dataset,
                    status,
                    header_code.or_else(|| code_in(&text)),
                    &text,
                ));
            }
            let mut buf: Vec<u8> = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| unavailable("connection lost"))?;
                let data = match frame.into_data() {
                    Ok(d) => d,
                    Err(frame) => {
                        // trailers: an exception code there ends the result as an error
                        if let Some(code) = frame.trailers_ref().and_then(exception_code) {
                            return Err(error_of(
                                dataset,
                                status,
                                Some(code),
                                "(exception in the trailers)",
                            ));
                        }
                        continue;
                    }
                };
                buf.extend_from_slice(&data);
                // the lines of one network read, then what their sink asked (a
                // throttle's pause, a slow consumer) before the next read
                let mut start = 0;
                let mut flow = Flow::Go;
                while let Some(n) = memchr::memchr(b'\n', &buf[start..]) {
                    flow = flow.then(line(&buf[start..start + n])?);
                    start += n + 1;
                }
                buf.drain(..start);
                obey(flow).await?;
            }
            if !buf.is_empty() {
                return Err(AgentError::Query {
                    dataset: dataset.into(),
                    kind: "clickhouse result ended inside a line",
                });
            }
            Ok(())
        }
        .await;
        driver.abort();
        r
    }

    /// Every row of a statement as text fields, with named parameters, with or
    /// without the dialect's settings.
    async fn collect(
        &self,
        dataset: &str,
        sql: &str,
        params: &[(String, String)],
        settings: bool,
    ) -> Result<Vec<Vec<Option<String>>>> {
        let mut out = Vec::new();
        self.run(dataset, sql, params, settings, &mut |l| {
            out.push(
                fields(l)
                    .map(|f| unescape_field(dataset, f))
                    .collect::<Result<_>>()?,
            );
            Ok(Flow::Go)
        })
        .await?;
        Ok(out)
    }

    /// Every row of a statement as text fields.
    pub async fn rows(
        &self,
        dataset: &str,
        sql: &str,
        binds: &[KeyPart],
    ) -> Result<Vec<Vec<Option<String>>>> {
        self.collect(dataset, sql, &params(binds), true).await
    }

    /// Every row of a statement sent without the dialect's settings (tests, and a
    /// server whose version is not known yet).
    pub async fn rows_without_settings(&self, dataset: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        self.collect(dataset, sql, &[], false).await
    }

    /// Runs statements (tests and sample data): each ends in `;` and a newline.
    pub async fn execute_batch(&self, dataset: &str, sql: &str) -> Result<()> {
        for stmt in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            self.run(dataset, stmt.trim_end_matches(';'), &[], false, &mut |_| {
                Ok(Flow::Go)
            })
            .await?;
        }
        Ok(())
    }

    async fn first(&self, dataset: &str, sql: &str, binds: &[KeyPart]) -> Result<Option<String>> {
        Ok(self
            .rows(dataset, sql, binds)
            .await?
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
            .flatten())
    }

    /// The server's version, read once; refused below the dialect's floor.
    pub async fn checked_version(&self, dataset: &str) -> Result<String> {
        let v = self
            .version
            .get_or_try_init(|| async {
                let rows = self.collect(dataset, VERSION_SQL, &[], false).await?;
                let v = rows
                    .into_iter()
                    .next()
                    .and_then(|r| r.into_iter().next())
                    .flatten();
                v.ok_or(AgentError::Query {
                    dataset: dataset.into(),
                    kind: "clickhouse answered no version",
                })
            })
            .await?
            .clone();
        match version_of(&v) {
            Some(mm) if mm >= MIN_VERSION => Ok(v),
            _ => Err(AgentError::Unsupported(format!(
                "dataset {dataset}: ClickHouse {v} is older than {}.{}, the oldest release the agent reads \
                 (it renders decimals with toDecimalString); upgrade the server",
                MIN_VERSION.0, MIN_VERSION.1
            ))),
        }
    }

    async fn describe(&self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        let version = self.checked_version(dataset).await?;
        let rows = match source {
            Source::Table(parts) => {
                let (db, table) = match parts.as_slice() {
                    [t] => (self.target.database.clone(), t.clone()),
                    [d, t] => (d.clone(), t.clone()),
                    _ => {
                        return Err(AgentError::Config(format!(
                            "dataset {dataset}: a ClickHouse table is table or database.table"
                        )));
                    }
                };
                let params = [("db".to_string(), db), ("table".to_string(), table)];
                let out = self
                    .collect(dataset, clickhouse::COLUMNS_SQL, &params, true)
                    .await?;
                if out.is_empty() {
                    return Err(AgentError::Query {
                        dataset: dataset.into(),
                        kind: "table not found",
                    });
                }
                out
            }
            Source::Query(_) => {
                let sql = format!(
                    "DESCRIBE TABLE (SELECT * FROM {})",
                    relation(&self.dialect, source)
                );
                self.rows(dataset, &sql, &[]).await?
            }
        };
        if rows.iter().any(|r| r.len() < 2) {
            return Err(shape(dataset));
        }
        let columns = rows
            .into_iter()
            .map(|r| {
                let name = r.first().cloned().flatten().unwrap_or_default();
                let declared = r.get(1).cloned().flatten().unwrap_or_default();
                clickhouse::classify(&declared).column(name, declared, true)
            })
            .collect();
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate: 0,
            engine: "clickhouse",
            engine_version: version,
        })
    }

    async fn scan(
        &self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        // the sink's answers are obeyed after each network read (`run`)
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        self.run(dataset, &sql.text, &params(&sql.binds), true, &mut |l| {
            b.start();
            let mut n = 0;
            for field in fields(l) {
                b.push(unescape_field(dataset, field)?.as_deref())?;
                n += 1;
            }
            if n != cols.len() {
                return Err(AgentError::Query {
                    dataset: dataset.into(),
                    kind: "unexpected row shape",
                });
            }
            f(b.finish()?)
        })
        .await
    }

    /// Runs `SELECT 1` (see [`super::Connector::ping`]).
    pub async fn ping(&self) -> std::result::Result<(), String> {
        self.checked_version("check").await.map_err(|e| e.to_string())?;
        self.first("check", "SELECT 1", &[])
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// Bind values as named query parameters `p1`, `p2`, … (the dialect's placeholders).
fn params(binds: &[KeyPart]) -> Vec<(String, String)> {
    binds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let v = match b {
                KeyPart::Int(n) => n.to_string(),
                KeyPart::Text(t) => t.clone(),
            };
            (format!("p{}", i + 1), v)
        })
        .collect()
}

/// ClickHouse in the agent's engine list (the `clickhouse` cargo feature).
pub const ENGINE: super::Engine = super::Engine {
    name: "clickhouse",
    schemes: &["clickhouse"],
    open: |url, _limits| Ok(Box::new(ClickHouseConnector::open(url)?)),
};

/// One call's or one request's handle on the connector.
pub struct Conn {
    engine: ClickHouseConnector,
}

#[async_trait::async_trait]
impl EngineConnector for ClickHouseConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    /// Canonical text in SQL; doubles as ClickHouse's shortest text.
    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Canonical
    }

    /// A columnar engine: hashing in SQL beats moving every row to the agent.
    fn prefers_in_process(&self) -> bool {
        false
    }

    fn not_live_verified(&self) -> Option<&'static str> {
        Some(
            "ClickHouse: the dialect's SQL is verified on the embedded engine (chdb 26.9), the connector only \
             against a server older than its floor (the refusal); no run against a 23.3+ server here",
        )
    }

    async fn connect(&self, _dataset: &str) -> Result<Box<dyn EngineConn>> {
        Ok(Box::new(Conn { engine: self.clone() }))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        ClickHouseConnector::ping(self).await
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[async_trait::async_trait]
impl EngineConn for Conn {
    /// ClickHouse has no transactions: each statement reads the table as it is.
    async fn begin(&mut self, _dataset: &str) -> Result<()> {
        Ok(())
    }

    async fn commit(&mut self, _dataset: &str) -> Result<()> {
        Ok(())
    }

    fn discard(&mut self) {}

    async fn describe(&mut self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        self.engine.describe(dataset, source).await
    }

    async fn scan(
        &mut self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        self.engine.scan(dataset, sql, cols, key_len, reread, f).await
    }

    async fn count(&mut self, dataset: &str, sql: &Sql) -> Result<u64> {
        let n = self.engine.first(dataset, &sql.text, &sql.binds).await?;
        super::counted(dataset, n.and_then(|s| s.parse().ok()))
    }

    async fn aggregate(
        &mut self,
        dataset: &str,
        sql: &Sql,
        key_classes: &[TypeClass],
    ) -> Result<Vec<AggRow>> {
        let rows = self.engine.rows(dataset, &sql.text, &sql.binds).await?;
        rows.iter()
            .map(|r| {
                // p, b, n, s, x and the key parts: a shorter line is no aggregate row
                if r.len() != 5 + key_classes.len() {
                    return Err(shape(dataset));
                }
                let text = |i: usize| Ok(r.get(i).cloned().flatten());
                let int = |i: usize| r.get(i).cloned().flatten().and_then(|t| t.parse().ok());
                agg_row(dataset, key_classes, int, text)
            })
            .collect()
    }

    async fn query_text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>> {
        self.engine.first(dataset, sql, &[]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_no_password_and_name_what_is_wrong() {
        let t = parse_url("clickhouse://reader@ch.internal:8123/sales?final=true").unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.database.as_str(),
                t.user.as_str(),
                t.final_read
            ),
            ("ch.internal", 8123, "sales", "reader", true)
        );
        let t = parse_url("clickhouse://ch.internal?password_file=/run/secrets/ch").unwrap();
        assert_eq!(
            (t.port, t.database.as_str(), t.user.as_str()),
            (8123, "default", "default")
        );
        assert_eq!(t.password_from, PasswordSource::File("/run/secrets/ch".into()));
        for (url, says) in [
            ("clickhouse://u:hunter2@h/db", "never goes in the URL"),
            ("clickhouse://h/db?password=hunter2", "never goes in the URL"),
            ("clickhouse://h/db?secure=true", "TLS"),
            ("clickhouse://h/db?nope=1", "unknown parameter"),
            ("clickhouse://h/a/b", "unexpected path"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
    }

    #[test]
    fn tab_separated_fields_and_parameters_round_trip() {
        for v in [
            "plain",
            "a\tb",
            "line\nbreak",
            "back\\slash",
            "\\N",
            "cr\r",
            "nul\0",
            "é日本",
        ] {
            let escaped = escape_param(v);
            assert!(!escaped.contains(['\t', '\n']), "{escaped:?}");
            assert_eq!(
                unescape_field("d", escaped.as_bytes()).unwrap().as_deref(),
                Some(v)
            );
        }
        assert_eq!(unescape_field("d", b"\\N").unwrap(), None);
        assert_eq!(unescape_field("d", b"\\\\N").unwrap().as_deref(), Some("\\N"));
        assert!(unescape_field("d", b"\xff").is_err());
        assert_eq!(version_of("26.9.2.1"), Some((26, 9)));
        assert_eq!(version_of("18.16.1"), Some((18, 16)));
        assert_eq!(version_of("garbage"), None);
        assert_eq!(
            code_in("Code: 60, e.displayText() = DB::Exception: Table x doesn't exist"),
            Some(60)
        );
        assert_eq!(code_in("Code: 516. DB::Exception: auth"), Some(516));
    }
}
