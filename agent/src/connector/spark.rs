//! Spark SQL over Spark Connect (behind the `spark` cargo feature): `spark://host:port`
//! (plain gRPC, a local or development server) and `databricks://workspace-host?cluster_id=…`
//! (TLS, a bearer token from an environment variable or a file, never the URL).
//!
//! One Spark session per connector (a UUIDv4 the client chooses); its settings are set
//! through the Config RPC and read back before the first statement: the session zone
//! UTC and ANSI mode on, or the connector refuses to run anything. Every call names the
//! server-side session it configured (`client_observed_server_side_session_id`), so a
//! server that lost it (restarted, or expired it after an idle hour) refuses the call
//! instead of running it in a session with the server's defaults; an answer from
//! another server-side session is refused too. Either way the session is renewed (a
//! new id, configured and read back again) and a statement that delivered nothing yet
//! is sent once more. A server that names no server-side session (Spark 3.5) is
//! configured and read back before every statement.
//!
//! Every statement is an `ExecutePlan` of a SQL relation with positional binds,
//! **reattachable**, so the server ends a complete result with `result_complete`: a
//! stream that ends without it (the server cuts streams after two minutes or 1 GB) or
//! breaks off is continued with `ReattachExecute` after the last response read, and a
//! result is complete only at `result_complete`, never a short result. Each Arrow batch
//! must hold the rows its message says, at the offset the rows so far reach. Then
//! `ReleaseExecute`. Spark has no transactions: a request's statements each read the
//! table's current state (docs/engines.md).

use std::sync::Arc;

use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;
use tally_proto::spark::connect as sc;
use tokio::sync::{Mutex, OnceCell};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::spark_wire::{self, Target, Unconfigured, batches, cell, parse_url, read_token, status_error};
use super::{AggRow, CONNECT_TIMEOUT, EngineConn, EngineConnector, RowBuilder, RowSink, agg_row, obey};
use crate::config::Source;
use crate::dialect::{Dialect, FetchShape, Sql, relation, spark::Spark};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, DatasetInfo};

type Client = sc::spark_connect_service_client::SparkConnectServiceClient<Channel>;

/// What every session must run with, set and read back through the Config RPC.
pub const SESSION_CONF: &[(&str, &str)] = &[
    ("spark.sql.session.timeZone", "UTC"),
    ("spark.sql.ansi.enabled", "true"),
];

const CLIENT_TYPE: &str = concat!("tally-agent/", env!("CARGO_PKG_VERSION"));

/// Arrow batches of 4 MB and more arrive in one message.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// How long a statement may go without a response across reattaches (each stream
/// waits up to the server's stream duration, two minutes by default, for a statement
/// still computing), and how many reattaches in a row may bring nothing (a server that
/// ends each stream at once).
const MAX_IDLE: std::time::Duration = std::time::Duration::from_secs(3600);
const MAX_IDLE_REATTACHES: u32 = 1000;

/// The error of a call refused for its session (expired, closed, or a server that
/// restarted): the session is renewed and nothing ran, so the statement may be sent
/// again.
const SESSION_RENEWED: &str = "spark session expired or lost on the server (renewed)";

fn renewed(e: &AgentError) -> bool {
    matches!(e, AgentError::DatabaseUnavailable { kind, .. } if *kind == SESSION_RENEWED)
}

#[derive(Clone)]
pub struct SparkConnector {
    target: Target,
    token: Option<String>,
    channel: Arc<OnceCell<Channel>>,
    /// The session id, and the server's id of it once configured: a different one in
    /// an answer means the server restarted and lost the session's settings.
    session: Arc<Mutex<Session>>,
    /// Result streams continued with `ReattachExecute`, all told.
    reattaches: Arc<std::sync::atomic::AtomicU64>,
    pub dialect: Spark,
}

struct Session {
    id: String,
    server_side: Option<String>,
}

impl Session {
    /// A new session id, to be configured before its first statement.
    fn renew(&mut self, dataset: &str, why: &str) {
        let old = std::mem::replace(&mut self.id, uuid_v4());
        tracing::info!(dataset, old, new = %self.id, why, "spark session renewed");
        self.server_side = None;
    }
}

/// A UUIDv4 (Spark checks the format of client-chosen session ids).
fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("system random");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn literal(b: &KeyPart) -> sc::expression::Literal {
    use sc::expression::literal::LiteralType;
    sc::expression::Literal {
        literal_type: Some(match b {
            KeyPart::Int(i) => LiteralType::Long(*i),
            KeyPart::Text(s) => LiteralType::String(s.clone()),
        }),
    }
}

fn user() -> Option<sc::UserContext> {
    Some(sc::UserContext {
        user_id: "tally".into(),
        user_name: "tally".into(),
    })
}

/// The rows of one statement, batch by batch, until the server marks it complete.
struct Execution {
    stream: tonic::Streaming<sc::ExecutePlanResponse>,
    operation_id: String,
    complete: bool,
    /// The session the statement was sent in, and its server-side id.
    session_id: String,
    server_side: String,
    /// Where a reattach continues.
    last_response_id: Option<String>,
    /// Rows read so far (each batch's `start_offset` must be this).
    rows: i64,
    /// Reattaches since the last response, and when that response came.
    idle_reattaches: u32,
    last_response: std::time::Instant,
    /// A response came without an id: the stream cannot be continued after it.
    unidentified: bool,
}

impl SparkConnector {
    pub fn open(url: &str) -> Result<SparkConnector> {
        let target = parse_url(url)?;
        let token = target.token_from.as_ref().map(read_token).transpose()?;
        Ok(SparkConnector {
            target,
            token,
            channel: Arc::new(OnceCell::new()),
            session: Arc::new(Mutex::new(Session {
                id: uuid_v4(),
                server_side: None,
            })),
            reattaches: Arc::default(),
            dialect: Spark,
        })
    }

    async fn client(&self, dataset: &str) -> Result<Client> {
        let t = &self.target;
        let channel = self
            .channel
            .get_or_try_init(|| async {
                let scheme = if t.tls { "https" } else { "http" };
                let unavailable = |kind| AgentError::DatabaseUnavailable {
                    dataset: dataset.into(),
                    kind,
                };
                let mut e = Endpoint::from_shared(format!("{scheme}://{}:{}", t.host, t.port))
                    .map_err(|_| unavailable("bad address"))?
                    .connect_timeout(CONNECT_TIMEOUT);
                if t.tls {
                    let mut tls = ClientTlsConfig::new().domain_name(t.host.clone());
                    tls = match &t.ca {
                        Some(path) => {
                            let pem = std::fs::read(path).map_err(|_| unavailable("cannot read ca file"))?;
                            tls.ca_certificate(Certificate::from_pem(pem))
                        }
                        None => tls.with_native_roots(),
                    };
                    e = e.tls_config(tls).map_err(|_| unavailable("tls"))?;
                }
                Ok::<_, AgentError>(e.connect_lazy())
            })
            .await?;
        Ok(Client::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    /// A request with the session's metadata (Databricks: token and cluster).
    fn request<T>(&self, msg: T) -> Result<tonic::Request<T>> {
        let mut r = tonic::Request::new(msg);
        let bad = || AgentError::Config("databricks token or cluster id is not valid header text".into());
        if let Some(tok) = &self.token {
            let mut v: tonic::metadata::MetadataValue<_> =
                format!("Bearer {tok}").parse().map_err(|_| bad())?;
            // kept out of Debug output and marked for HPACK never-index
            v.set_sensitive(true);
            r.metadata_mut().insert("authorization", v);
        }
        if let Some(c) = &self.target.cluster_id {
            r.metadata_mut()
                .insert("x-databricks-cluster-id", c.parse().map_err(|_| bad())?);
        }
        Ok(r)
    }

    /// The session's id, and the server-side session it was configured in (none before
    /// its first statement and after a renewal): for diagnostics.
    pub async fn session(&self) -> (String, Option<String>) {
        let s = self.session.lock().await;
        (s.id.clone(), s.server_side.clone())
    }

    /// How many result streams were continued with `ReattachExecute` since the
    /// connector opened: for diagnostics.
    pub fn reattaches(&self) -> u64 {
        self.reattaches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The session id and its server-side id, after setting and reading back
    /// [`SESSION_CONF`] once per server-side session; before every statement on a
    /// server that names no server-side session (Spark 3.5), which cannot say that it
    /// restarted and lost the settings. A session id the server refuses (it closed or
    /// expired it) is renewed once.
    async fn session_id(&self, dataset: &str) -> Result<(String, String)> {
        let mut s = self.session.lock().await;
        if let Some(server_side) = s.server_side.as_ref().filter(|id| !id.is_empty()) {
            return Ok((s.id.clone(), server_side.clone()));
        }
        match self.configure(dataset, &s.id).await {
            Err(Unconfigured::Call(status)) if spark_wire::session_gone(&status) => {
                s.renew(dataset, &spark_wire::error_info(&status).0.unwrap_or_default());
                self.configure(dataset, &s.id)
                    .await
                    .map_err(|e| e.into_error(dataset))
            }
            r => r.map_err(|e| e.into_error(dataset)),
        }
        .map(|server_side| {
            s.server_side = Some(server_side.clone());
            (s.id.clone(), server_side)
        })
    }

    /// Sets and reads back [`SESSION_CONF`] in session `id`: the server-side session id.
    async fn configure(&self, dataset: &str, id: &str) -> std::result::Result<String, Unconfigured> {
        let mut client = self.client(dataset).await.map_err(Unconfigured::Agent)?;
        use sc::config_request::{Get, Operation, Set, operation::OpType};
        let call = |op: OpType| sc::ConfigRequest {
            session_id: id.to_string(),
            user_context: user(),
            operation: Some(Operation { op_type: Some(op) }),
            client_type: Some(CLIENT_TYPE.into()),
            client_observed_server_side_session_id: None,
        };
        let request = |op| self.request(call(op)).map_err(Unconfigured::Agent);
        let pairs = SESSION_CONF
            .iter()
            .map(|(k, v)| sc::KeyValue {
                key: (*k).into(),
                value: Some((*v).into()),
            })
            .collect();
        let set = client
            .config(request(OpType::Set(Set { pairs }))?)
            .await
            .map_err(Unconfigured::Call)?
            .into_inner();
        let keys = SESSION_CONF.iter().map(|(k, _)| (*k).into()).collect();
        let got = client
            .config(request(OpType::Get(Get { keys }))?)
            .await
            .map_err(Unconfigured::Call)?
            .into_inner();
        // the settings were set and read in one server-side session
        if set.server_side_session_id != got.server_side_session_id {
            tracing::warn!(
                dataset,
                "spark session changed between setting and reading its settings"
            );
            return Err(Unconfigured::NotHeld);
        }
        for (k, want) in SESSION_CONF {
            let v = got
                .pairs
                .iter()
                .find(|p| p.key == *k)
                .and_then(|p| p.value.as_deref());
            if !v.is_some_and(|v| v.eq_ignore_ascii_case(want)) {
                tracing::warn!(dataset, key = k, value = ?v, "spark session setting did not hold");
                return Err(Unconfigured::NotHeld);
            }
        }
        Ok(got.server_side_session_id)
    }

    /// A failed call in session `session_id` as the agent's error; a call refused for
    /// its session renews it (once: not a session renewed meanwhile) and is
    /// [`SESSION_RENEWED`].
    async fn failed(&self, dataset: &str, session_id: &str, status: &tonic::Status) -> AgentError {
        if spark_wire::session_gone(status) {
            let why = spark_wire::error_info(status).0.unwrap_or_default();
            tracing::warn!(dataset, error_class = why, "spark refused the session");
            let mut s = self.session.lock().await;
            if s.id == session_id {
                s.renew(dataset, &why);
            }
            return AgentError::DatabaseUnavailable {
                dataset: dataset.into(),
                kind: SESSION_RENEWED,
            };
        }
        status_error(dataset, status)
    }

    /// Starts one statement, reattachable.
    async fn execute(&self, dataset: &str, sql: &str, binds: &[KeyPart]) -> Result<Execution> {
        use sc::execute_plan_request::{RequestOption, request_option};
        let (session_id, server_side) = self.session_id(dataset).await?;
        let operation_id = uuid_v4();
        let req = sc::ExecutePlanRequest {
            session_id: session_id.clone(),
            client_observed_server_side_session_id: Some(server_side.clone()).filter(|id| !id.is_empty()),
            user_context: user(),
            plan: Some(sc::Plan {
                op_type: Some(sc::plan::OpType::Root(sc::Relation {
                    rel_type: Some(sc::relation::RelType::Sql(sc::Sql {
                        query: sql.to_string(),
                        pos_args: binds.iter().map(literal).collect(),
                    })),
                })),
            }),
            client_type: Some(CLIENT_TYPE.into()),
            request_options: vec![RequestOption {
                request_option: Some(request_option::RequestOption::ReattachOptions(
                    sc::ReattachOptions { reattachable: true },
                )),
            }],
            operation_id: Some(operation_id.clone()),
            tags: Vec::new(),
        };
        let stream = match self.client(dataset).await?.execute_plan(self.request(req)?).await {
            Ok(s) => s.into_inner(),
            Err(e) => return Err(self.failed(dataset, &session_id, &e).await),
        };
        Ok(Execution {
            stream,
            operation_id,
            complete: false,
            session_id,
            server_side,
            last_response_id: None,
            rows: 0,
            idle_reattaches: 0,
            last_response: std::time::Instant::now(),
            unidentified: false,
        })
    }

    /// Continues a statement whose stream ended before `result_complete` or broke
    /// off: the responses after the last one read, on a new stream.
    async fn reattach(&self, dataset: &str, ex: &mut Execution) -> Result<()> {
        ex.idle_reattaches += 1;
        if ex.idle_reattaches > MAX_IDLE_REATTACHES || ex.last_response.elapsed() > MAX_IDLE {
            return Err(AgentError::Query {
                dataset: dataset.into(),
                kind: "spark result stream ended without result_complete",
            });
        }
        // after a response without an id a reattach would replay from the start
        if ex.unidentified {
            return Err(AgentError::Query {
                dataset: dataset.into(),
                kind: "spark result stream broke off after a response without an id: not continued",
            });
        }
        tracing::debug!(dataset, operation = ex.operation_id, after = ?ex.last_response_id, "spark reattach");
        self.reattaches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let req = sc::ReattachExecuteRequest {
            session_id: ex.session_id.clone(),
            user_context: user(),
            operation_id: ex.operation_id.clone(),
            client_type: Some(CLIENT_TYPE.into()),
            last_response_id: ex.last_response_id.clone(),
            client_observed_server_side_session_id: Some(ex.server_side.clone()).filter(|id| !id.is_empty()),
        };
        ex.stream = match self
            .client(dataset)
            .await?
            .reattach_execute(self.request(req)?)
            .await
        {
            Ok(s) => s.into_inner(),
            Err(e) => return Err(self.failed(dataset, &ex.session_id, &e).await),
        };
        Ok(())
    }

    /// The next Arrow batches of a statement; `None` once the server said the result
    /// is complete and the stream ended.
    async fn next(&self, dataset: &str, ex: &mut Execution) -> Result<Option<Vec<arrow_array::RecordBatch>>> {
        use sc::execute_plan_response::ResponseType;
        loop {
            let msg = match ex.stream.message().await {
                Ok(m) => m,
                // a stream broken off in transport (not an error of Spark's, which
                // carries its class): continue it where it stopped
                Err(e) if !ex.complete && spark_wire::broken_off(&e) => {
                    tracing::info!(dataset, code = ?e.code(), error = %e.message(), "spark result stream broke off");
                    self.reattach(dataset, ex).await?;
                    continue;
                }
                Err(e) => return Err(self.failed(dataset, &ex.session_id, &e).await),
            };
            let Some(resp) = msg else {
                if ex.complete {
                    return Ok(None);
                }
                // the server cut the stream (after a time or a size): never a short
                // result, the rest comes on a new stream
                self.reattach(dataset, ex).await?;
                continue;
            };
            self.check_server_session(dataset, ex, &resp.server_side_session_id)
                .await?;
            ex.idle_reattaches = 0;
            ex.last_response = std::time::Instant::now();
            if resp.response_id.is_empty() {
                ex.unidentified = true;
            } else {
                ex.last_response_id = Some(resp.response_id.clone());
            }
            match resp.response_type {
                Some(ResponseType::ArrowBatch(b)) => {
                    if ex.complete {
                        return Err(AgentError::Query {
                            dataset: dataset.into(),
                            kind: "spark sent rows after result_complete",
                        });
                    }
                    let got = batches(dataset, &b.data)?;
                    let n: i64 = got.iter().map(|b| b.num_rows() as i64).sum();
                    // each batch where the rows so far end and as long as it says: a
                    // batch lost or sent twice across a reattach is an error
                    if n != b.row_count || b.start_offset.is_some_and(|o| o != ex.rows) {
                        tracing::warn!(
                            dataset,
                            rows = n,
                            row_count = b.row_count,
                            start_offset = ?b.start_offset,
                            expected_offset = ex.rows,
                            "spark arrow batch does not line up"
                        );
                        return Err(AgentError::Query {
                            dataset: dataset.into(),
                            kind: "spark result batches do not line up (rows lost or repeated)",
                        });
                    }
                    ex.rows += n;
                    return Ok(Some(got));
                }
                Some(ResponseType::ResultComplete(_)) => ex.complete = true,
                _ => {}
            }
        }
    }

    /// An answer from another server-side session than the one the statement was
    /// sent to (a server that ignores `client_observed_server_side_session_id`): the
    /// server restarted or made the session anew without its settings; renewed.
    async fn check_server_session(&self, dataset: &str, ex: &Execution, got: &str) -> Result<()> {
        if got.is_empty() || got == ex.server_side {
            return Ok(());
        }
        let mut s = self.session.lock().await;
        // only once for a session: a statement of the renewed one may be under way
        if s.server_side.as_deref() == Some(ex.server_side.as_str()) {
            s.renew(dataset, "an answer from another server-side session");
        }
        Err(AgentError::DatabaseUnavailable {
            dataset: dataset.into(),
            kind: SESSION_RENEWED,
        })
    }

    /// Lets the server drop a statement's buffered result (after its end, or when the
    /// reader stopped early).
    async fn release(&self, dataset: &str, ex: &Execution) {
        let req = sc::ReleaseExecuteRequest {
            session_id: ex.session_id.clone(),
            user_context: user(),
            operation_id: ex.operation_id.clone(),
            client_type: Some(CLIENT_TYPE.into()),
            release: Some(sc::release_execute_request::Release::ReleaseAll(
                sc::release_execute_request::ReleaseAll {},
            )),
            client_observed_server_side_session_id: Some(ex.server_side.clone()).filter(|id| !id.is_empty()),
        };
        let r = match (self.client(dataset).await, self.request(req)) {
            (Ok(mut c), Ok(req)) => c.release_execute(req).await.map(drop),
            _ => Ok(()),
        };
        if let Err(e) = r {
            tracing::debug!(dataset, error = %e.message(), "spark release_execute failed");
        }
    }

    /// Every row of a statement, each as its cells' text (small results only:
    /// describe, counts, aggregates, single values).
    pub async fn rows(
        &self,
        dataset: &str,
        sql: &str,
        binds: &[KeyPart],
    ) -> Result<Vec<Vec<Option<String>>>> {
        match self.rows_once(dataset, sql, binds).await {
            // refused for its session, which is renewed: a read, sent again (statements
            // that write go through execute_batch, never sent twice)
            Err(e) if renewed(&e) => self.rows_once(dataset, sql, binds).await,
            r => r,
        }
    }

    async fn rows_once(
        &self,
        dataset: &str,
        sql: &str,
        binds: &[KeyPart],
    ) -> Result<Vec<Vec<Option<String>>>> {
        let mut ex = self.execute(dataset, sql, binds).await?;
        let mut out = Vec::new();
        let r = async {
            while let Some(bs) = self.next(dataset, &mut ex).await? {
                for b in bs {
                    for row in 0..b.num_rows() {
                        out.push(
                            b.columns()
                                .iter()
                                .map(|c| cell(dataset, c, row))
                                .collect::<Result<Vec<_>>>()?,
                        );
                    }
                }
            }
            Ok::<_, AgentError>(())
        }
        .await;
        self.release(dataset, &ex).await;
        r.map(|()| out)
    }

    /// Runs statements (tests and sample data): each ends in `;` and a newline.
    pub async fn execute_batch(&self, dataset: &str, sql: &str) -> Result<()> {
        for stmt in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            self.rows_once(dataset, stmt.trim_end_matches(';'), &[]).await?;
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

    async fn describe(&self, dataset: &str, source: &Source) -> Result<DatasetInfo> {
        let sql = match source {
            Source::Table(_) => format!("DESCRIBE TABLE {}", relation(&self.dialect, source)),
            Source::Query(_) => format!("DESCRIBE QUERY SELECT * FROM {}", relation(&self.dialect, source)),
        };
        let mut columns = Vec::new();
        for r in self.rows(dataset, &sql, &[]).await? {
            let name = r.first().cloned().flatten().unwrap_or_default();
            // partition and detail sections follow the columns after a blank or `#` row
            if name.is_empty() || name.starts_with('#') {
                break;
            }
            let declared = r.get(1).cloned().flatten().unwrap_or_default();
            let entry = crate::dialect::spark::classify(&declared);
            columns.push(entry.column(name, declared, true));
        }
        let version = self
            .first(dataset, crate::dialect::spark::VERSION_SQL, &[])
            .await?
            .unwrap_or_default();
        Ok(DatasetInfo {
            columns,
            key: Vec::new(),
            row_estimate: 0,
            engine: "spark",
            engine_version: version,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn scan(
        &self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
    ) -> Result<()> {
        let mut delivered = false;
        match self
            .scan_once(dataset, sql, cols, key_len, reread, f, &mut delivered)
            .await
        {
            // refused for its session, which is renewed, before any row reached the sink
            Err(e) if renewed(&e) && !delivered => {
                self.scan_once(dataset, sql, cols, key_len, reread, f, &mut delivered)
                    .await
            }
            r => r,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn scan_once(
        &self,
        dataset: &str,
        sql: &Sql,
        cols: &[BoundColumn],
        key_len: usize,
        reread: &[bool],
        f: &mut RowSink<'_>,
        delivered: &mut bool,
    ) -> Result<()> {
        let mut ex = self.execute(dataset, &sql.text, &sql.binds).await?;
        let mut b = RowBuilder::new(dataset, cols, key_len, reread);
        let r = async {
            while let Some(batches) = self.next(dataset, &mut ex).await? {
                for batch in batches {
                    if batch.num_columns() != cols.len() {
                        return Err(AgentError::Query {
                            dataset: dataset.into(),
                            kind: "unexpected row shape",
                        });
                    }
                    for row in 0..batch.num_rows() {
                        b.start();
                        for c in batch.columns() {
                            b.push(cell(dataset, c, row)?.as_deref())?;
                        }
                        *delivered = true;
                        obey(f(b.finish()?)?).await?;
                    }
                }
            }
            Ok(())
        }
        .await;
        self.release(dataset, &ex).await;
        r
    }

    /// Opens a session and runs `SELECT 1` (see [`super::Connector::ping`]).
    pub async fn ping(&self) -> std::result::Result<(), String> {
        self.first("check", "SELECT 1", &[])
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// Spark in the agent's engine list (the `spark` cargo feature).
pub const ENGINE: super::Engine = super::Engine {
    name: "spark",
    schemes: &["spark", "databricks"],
    open: |url, _limits| Ok(Box::new(SparkConnector::open(url)?)),
};

/// One call's or one request's handle on the connector's session.
pub struct Conn {
    engine: SparkConnector,
}

#[async_trait::async_trait]
impl EngineConnector for SparkConnector {
    fn dialect(&self) -> &dyn Dialect {
        &self.dialect
    }

    /// Canonical text in SQL; doubles arrive as Arrow doubles.
    fn fetch_shape(&self) -> FetchShape {
        FetchShape::Canonical
    }

    /// A distributed engine: hashing in SQL beats moving every row to the agent.
    fn prefers_in_process(&self) -> bool {
        false
    }

    async fn connect(&self, dataset: &str) -> Result<Box<dyn EngineConn>> {
        self.session_id(dataset).await?;
        Ok(Box::new(Conn { engine: self.clone() }))
    }

    async fn ping(&self) -> std::result::Result<(), String> {
        SparkConnector::ping(self).await
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[async_trait::async_trait]
impl EngineConn for Conn {
    /// Spark has no transactions: each statement reads the table as it is.
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
                let t = |i: usize| r.get(i).cloned().flatten();
                agg_row(
                    dataset,
                    key_classes,
                    |i| t(i).and_then(|s| s.parse().ok()),
                    |i| Ok(t(i)),
                )
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
    fn session_ids_are_uuid_v4() {
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(id, uuid_v4());
    }
}
