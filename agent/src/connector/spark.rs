//! Spark SQL over Spark Connect (behind the `spark` cargo feature): `spark://host:port`
//! (plain gRPC, a local or development server) and `databricks://workspace-host?cluster_id=…`
//! (TLS, a bearer token from an environment variable or a file, never the URL).
//!
//! One Spark session per connector (a UUIDv4 the client chooses); its settings are set
//! through the Config RPC and read back before the first statement: the session zone
//! UTC and ANSI mode on, or the connector refuses to run anything. Every statement is
//! an `ExecutePlan` of a SQL relation with positional binds, **reattachable**, so the
//! server ends a complete result with `result_complete`: a stream that ends without it
//! is an error, never a short result. Then `ReleaseExecute`. Results are Arrow IPC
//! streams, read one batch at a time. Spark has no transactions: a request's
//! statements each read the table's current state (docs/engines.md).

use std::sync::Arc;

use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;
use tally_proto::spark::connect as sc;
use tokio::sync::{Mutex, OnceCell};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::spark_wire::{Target, batches, cell, parse_url, read_token, status_error};
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

#[derive(Clone)]
pub struct SparkConnector {
    target: Target,
    token: Option<String>,
    channel: Arc<OnceCell<Channel>>,
    /// The session id, and the server's id of it once configured: a different one in
    /// an answer means the server restarted and lost the session's settings.
    session: Arc<Mutex<Session>>,
    pub dialect: Spark,
}

struct Session {
    id: String,
    server_side: Option<String>,
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
            r.metadata_mut().insert(
                "authorization",
                format!("Bearer {tok}").parse().map_err(|_| bad())?,
            );
        }
        if let Some(c) = &self.target.cluster_id {
            r.metadata_mut()
                .insert("x-databricks-cluster-id", c.parse().map_err(|_| bad())?);
        }
        Ok(r)
    }

    /// The session id, after setting and reading back [`SESSION_CONF`] once per server
    /// session.
    async fn session_id(&self, dataset: &str) -> Result<String> {
        let mut s = self.session.lock().await;
        if s.server_side.is_some() {
            return Ok(s.id.clone());
        }
        let mut client = self.client(dataset).await?;
        use sc::config_request::{Get, Operation, Set, operation::OpType};
        let call = |op: OpType| sc::ConfigRequest {
            session_id: s.id.clone(),
            user_context: user(),
            operation: Some(Operation { op_type: Some(op) }),
            client_type: Some(CLIENT_TYPE.into()),
        };
        let pairs = SESSION_CONF
            .iter()
            .map(|(k, v)| sc::KeyValue {
                key: (*k).into(),
                value: Some((*v).into()),
            })
            .collect();
        client
            .config(self.request(call(OpType::Set(Set { pairs })))?)
            .await
            .map_err(|e| status_error(dataset, &e))?;
        let keys = SESSION_CONF.iter().map(|(k, _)| (*k).into()).collect();
        let got = client
            .config(self.request(call(OpType::Get(Get { keys })))?)
            .await
            .map_err(|e| status_error(dataset, &e))?
            .into_inner();
        for (k, want) in SESSION_CONF {
            let v = got
                .pairs
                .iter()
                .find(|p| p.key == *k)
                .and_then(|p| p.value.as_deref());
            if !v.is_some_and(|v| v.eq_ignore_ascii_case(want)) {
                tracing::warn!(dataset, key = k, value = ?v, "spark session setting did not hold");
                return Err(AgentError::Query {
                    dataset: dataset.into(),
                    kind: "spark session refused its settings (time zone UTC, ANSI mode)",
                });
            }
        }
        s.server_side = Some(got.server_side_session_id);
        Ok(s.id.clone())
    }

    /// Starts one statement, reattachable.
    async fn execute(&self, dataset: &str, sql: &str, binds: &[KeyPart]) -> Result<Execution> {
        use sc::execute_plan_request::{RequestOption, request_option};
        let session_id = self.session_id(dataset).await?;
        let operation_id = uuid_v4();
        let req = sc::ExecutePlanRequest {
            session_id,
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
        let stream = self
            .client(dataset)
            .await?
            .execute_plan(self.request(req)?)
            .await
            .map_err(|e| status_error(dataset, &e))?
            .into_inner();
        Ok(Execution {
            stream,
            operation_id,
            complete: false,
        })
    }

    /// The next Arrow batches of a statement; `None` once the server said the result
    /// is complete and the stream ended.
    async fn next(&self, dataset: &str, ex: &mut Execution) -> Result<Option<Vec<arrow_array::RecordBatch>>> {
        use sc::execute_plan_response::ResponseType;
        loop {
            let msg = ex.stream.message().await.map_err(|e| status_error(dataset, &e))?;
            let Some(resp) = msg else {
                if ex.complete {
                    return Ok(None);
                }
                // fail closed: never a short result
                return Err(AgentError::Query {
                    dataset: dataset.into(),
                    kind: "spark result stream ended without result_complete",
                });
            };
            self.check_server_session(dataset, &resp.server_side_session_id)
                .await?;
            match resp.response_type {
                Some(ResponseType::ArrowBatch(b)) => {
                    if ex.complete {
                        return Err(AgentError::Query {
                            dataset: dataset.into(),
                            kind: "spark sent rows after result_complete",
                        });
                    }
                    return batches(dataset, &b.data).map(Some);
                }
                Some(ResponseType::ResultComplete(_)) => ex.complete = true,
                _ => {}
            }
        }
    }

    /// An answer from another server session than the configured one: the server
    /// restarted and the settings are gone; the next call configures afresh.
    async fn check_server_session(&self, dataset: &str, got: &str) -> Result<()> {
        let mut s = self.session.lock().await;
        match &s.server_side {
            Some(known) if !got.is_empty() && known != got => {
                s.server_side = None;
                Err(AgentError::DatabaseUnavailable {
                    dataset: dataset.into(),
                    kind: "spark session lost (server restarted)",
                })
            }
            _ => Ok(()),
        }
    }

    /// Lets the server drop a statement's buffered result (after its end, or when the
    /// reader stopped early).
    async fn release(&self, dataset: &str, ex: &Execution) {
        let session_id = self.session.lock().await.id.clone();
        let req = sc::ReleaseExecuteRequest {
            session_id,
            user_context: user(),
            operation_id: ex.operation_id.clone(),
            client_type: Some(CLIENT_TYPE.into()),
            release: Some(sc::release_execute_request::Release::ReleaseAll(
                sc::release_execute_request::ReleaseAll {},
            )),
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
            self.rows(dataset, stmt.trim_end_matches(';'), &[]).await?;
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
        Ok(self
            .engine
            .first(dataset, &sql.text, &sql.binds)
            .await?
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
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
