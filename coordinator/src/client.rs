//! A connection to one agent over mutual TLS, with retries of transient failures.
//! The coordinator presents its client certificate and trusts only the configured CA.
//! Requests and answers are the domain types of `tally_common::wire`; the proto
//! messages stop here, and an answer that does not convert is a `MalformedAnswer`.

use std::sync::Arc;
use std::time::Duration;

use tally_common::wire::measures::{MeasuresRequest, MeasuresResponse};
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Describe, DescribeRequest, InvestigationSqlRequest,
    InvestigationSqlResponse, PositionResponse, ReadPositionRequest, RevealRequest, RevealResponse,
    RowDigest, RowDigestBatch, RowDigestsRequest, WaitPositionRequest, WireError,
};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_client::AgentClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::config::ClientTls;
use tally_engine::error::RunError;

/// Attempts per call for transient failures (UNAVAILABLE and transport errors).
const ATTEMPTS: u32 = 3;

#[derive(Debug, Clone)]
pub struct Agent {
    pub name: String,
    pub endpoint: String,
    client: AgentClient<Channel>,
    /// Names the cause when a call fails at the TLS handshake (`None` when the material
    /// does not make a rustls config: the channel then fails on its own terms).
    probe: Option<Arc<HandshakeProbe>>,
}

/// A TLS handshake of its own with the agent (`tls_refusal::probe`), made only after a
/// call failed in transport: tonic surfaces a refused client certificate as
/// "transport error" or "operation was canceled".
struct HandshakeProbe {
    config: Arc<rustls::ClientConfig>,
    host: String,
    port: u16,
    not_after: Option<String>,
}

impl std::fmt::Debug for HandshakeProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeProbe")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// Each step of the probe (connect, handshake, the agent's first answer) waits this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl HandshakeProbe {
    fn new(endpoint: &str, tls: &TlsMaterial) -> Option<HandshakeProbe> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let uri: tonic::codegen::http::Uri = endpoint.parse().ok()?;
        let host = uri
            .host()?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&tls.ca) {
            roots.add(c.ok()?).ok()?;
        }
        let chain = CertificateDer::pem_slice_iter(&tls.cert)
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let key = PrivateKeyDer::from_pem_slice(&tls.key).ok()?;
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .ok()?
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .ok()?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Some(HandshakeProbe {
            config: Arc::new(config),
            host,
            port,
            not_after: tally_common::pki::pem_not_after(&tls.cert),
        })
    }

    /// The handshake's cause of failure, or `None` when it goes through (or the agent
    /// cannot be reached at all: not a TLS matter).
    async fn cause(&self) -> Option<String> {
        let sides = crate::tls_refusal::Sides {
            peer: "the agent",
            ours: "the coordinator's certificate (tls.cert)",
            our_ca: "the coordinator's tls.ca",
            our_not_after: self.not_after.clone(),
        };
        crate::tls_refusal::probe(self.config.clone(), &self.host, self.port, &sides, PROBE_TIMEOUT).await
    }
}

/// PEM material for the coordinator's side of mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl TlsMaterial {
    pub fn load(t: &ClientTls) -> Result<TlsMaterial, RunError> {
        TlsMaterial::read("tls", &t.ca, &t.cert, &t.key)
    }

    /// Reads the three files; errors name `{key}.ca` (`.cert`, `.key`) and the file.
    pub fn read(
        key: &str,
        ca: &std::path::Path,
        cert: &std::path::Path,
        private: &std::path::Path,
    ) -> Result<TlsMaterial, RunError> {
        let read = |p: &std::path::Path, k: &str| {
            std::fs::read(p).map_err(|e| RunError::Config(format!("{key}.{k}: {}: {e}", p.display())))
        };
        Ok(TlsMaterial {
            ca: read(ca, "ca")?,
            cert: read(cert, "cert")?,
            key: read(private, "key")?,
        })
    }
}

/// A lazy mutual-TLS channel to `https://host:port`: presents `tls.cert`, trusts only
/// `tls.ca`, and expects the server's certificate to name `host`. The agents' client and
/// the Raft peers' (raft/network.rs) both use it.
pub fn mtls_channel(endpoint: &str, tls: &TlsMaterial) -> Result<Channel, String> {
    let host = endpoint
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
        .unwrap_or_default();
    let tls_cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca))
        .identity(Identity::from_pem(&tls.cert, &tls.key))
        .domain_name(host);
    Ok(Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| e.to_string())?
        .tls_config(tls_cfg)
        .map_err(|e| format!("tls: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        // a silent peer (cut link, frozen host) is noticed within about 80 s; a
        // 20 s timeout was measured to cut calls to an agent that was hashing a 1M-row
        // level on a starved two-core machine (tests/tests/cluster.rs)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(60))
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(Duration::from_secs(10)))
        .connect_lazy())
}

impl Agent {
    /// Prepares a lazy channel: nothing connects until the first call.
    pub fn new(name: &str, endpoint: &str, tls: &TlsMaterial) -> Result<Agent, RunError> {
        let channel = mtls_channel(endpoint, tls)
            .map_err(|e| RunError::Config(format!("agents.{name}.endpoint: {e}")))?;
        Ok(Agent {
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            client: AgentClient::new(channel).max_decoding_message_size(256 * 1024 * 1024),
            probe: HandshakeProbe::new(endpoint, tls).map(Arc::new),
        })
    }

    fn error(&self, rpc: &str, s: Status) -> RunError {
        run_error(&self.name, &self.endpoint, rpc, s)
    }

    /// A call's last error; one that failed in transport is checked for a refused TLS
    /// handshake, whose cause the run's error then names.
    async fn final_error(&self, rpc: &str, s: Status) -> RunError {
        if failed_in_transport(&s)
            && let Some(probe) = &self.probe
            && let Some(cause) = probe.cause().await
        {
            tracing::warn!(agent = %self.name, rpc, status = %s, "the TLS handshake with the agent failed: {cause}");
            return RunError::Unreachable {
                agent: self.name.clone(),
                endpoint: self.endpoint.clone(),
                rpc: rpc.into(),
                message: format!("TLS handshake refused: {cause}"),
            };
        }
        self.error(rpc, s)
    }

    /// Runs `call` with retries of transient failures and backoff.
    async fn retry<T, F, Fut>(&self, rpc: &str, mut call: F) -> Result<T, RunError>
    where
        F: FnMut(AgentClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=ATTEMPTS {
            match call(self.client.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if is_transient(&s) && attempt < ATTEMPTS => {
                    tracing::warn!(agent = %self.name, rpc, attempt, code = ?s.code(), "transient failure, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                }
                Err(s) => return Err(self.final_error(rpc, s).await),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// An answer that does not convert to its domain type names the agent and field.
    fn valid<T>(&self, rpc: &str, answer: Result<T, WireError>) -> Result<T, RunError> {
        answer.map_err(|e| RunError::malformed(&self.name, rpc, e))
    }

    pub async fn describe(&self, dataset: &str) -> Result<Describe, RunError> {
        let req = pb::DescribeRequest::from(DescribeRequest {
            dataset: dataset.to_string(),
        });
        let d = self
            .retry("Describe", |mut c| {
                let r = req.clone();
                async move { c.describe(r).await }
            })
            .await?;
        self.valid("Describe", Describe::try_from(d))
    }

    pub async fn aggregate(&self, req: AggregateRequest) -> Result<AggregateResponse, RunError> {
        let req = pb::AggregateRequest::from(req);
        let a = self
            .retry("Aggregate", |mut c| {
                let r = req.clone();
                async move { c.aggregate(r).await }
            })
            .await?;
        self.valid("Aggregate", AggregateResponse::try_from(a))
    }

    /// All digests of a segment, collected (a leaf is bounded by the threshold).
    pub async fn row_digests(&self, req: RowDigestsRequest) -> Result<Digests, RunError> {
        let req = pb::RowDigestsRequest::from(req);
        let mut stream = self
            .retry("RowDigests", |mut c| {
                let r = req.clone();
                async move { c.row_digests(r).await }
            })
            .await?;
        let mut out = Digests::default();
        while let Some(batch) = stream.message().await.map_err(|s| self.error("RowDigests", s))? {
            out.add(self.valid("RowDigests", RowDigestBatch::try_from(batch))?);
        }
        Ok(out)
    }

    pub async fn reveal(&self, req: RevealRequest, rows: bool) -> Result<RevealResponse, RunError> {
        let rpc = if rows { "RevealRows" } else { "RevealKeys" };
        let req = pb::RevealRequest::from(req);
        let r = self
            .retry(rpc, |mut c| {
                let r = req.clone();
                async move {
                    if rows {
                        c.reveal_rows(r).await
                    } else {
                        c.reveal_keys(r).await
                    }
                }
            })
            .await?;
        self.valid(rpc, RevealResponse::try_from(r))
    }

    pub async fn measures(&self, req: MeasuresRequest) -> Result<MeasuresResponse, RunError> {
        let req = pb::MeasuresRequest::from(req);
        let r = self
            .retry("Measures", |mut c| {
                let r = req.clone();
                async move { c.measures(r).await }
            })
            .await?;
        self.valid("Measures", MeasuresResponse::try_from(r))
    }

    pub async fn read_position(&self, req: ReadPositionRequest) -> Result<PositionResponse, RunError> {
        let req = pb::ReadPositionRequest::from(req);
        let r = self
            .retry("ReadPosition", |mut c| {
                let r = req.clone();
                async move { c.read_position(r).await }
            })
            .await?;
        self.valid("ReadPosition", PositionResponse::try_from(r))
    }

    /// Waits as long as the request's timeout says (the agent answers then, reached or
    /// not); a retry after a dropped connection waits only for what is left of it.
    pub async fn wait_position(&self, req: WaitPositionRequest) -> Result<PositionResponse, RunError> {
        let deadline = std::time::Instant::now() + Duration::from_millis(req.timeout_ms);
        let req = pb::WaitPositionRequest::from(req);
        let r = self
            .retry("WaitPosition", |mut c| {
                let mut r = req.clone();
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                r.timeout_ms = left.as_millis() as u64;
                async move { c.wait_position(r).await }
            })
            .await?;
        self.valid("WaitPosition", PositionResponse::try_from(r))
    }

    pub async fn investigation_sql(
        &self,
        req: InvestigationSqlRequest,
    ) -> Result<InvestigationSqlResponse, RunError> {
        let req = pb::InvestigationSqlRequest::from(req);
        self.retry("InvestigationSql", |mut c| {
            let r = req.clone();
            async move { c.investigation_sql(r).await }
        })
        .await
        .map(InvestigationSqlResponse::from)
    }
}

/// An agent's gRPC status as the run's error, by its code (and, for UNAVAILABLE,
/// whether it is the agent's database rather than the agent).
pub fn run_error(agent: &str, endpoint: &str, rpc: &str, s: Status) -> RunError {
    let message = s.message().to_string();
    match s.code() {
        Code::PermissionDenied => RunError::PolicyRefused {
            agent: agent.into(),
            rpc: rpc.into(),
            message,
        },
        Code::Unavailable if tally_engine::error::is_database_unavailable(&message) => {
            RunError::DatabaseUnavailable {
                agent: agent.into(),
                rpc: rpc.into(),
                message,
            }
        }
        Code::Unavailable | Code::DeadlineExceeded => RunError::Unreachable {
            agent: agent.into(),
            endpoint: endpoint.into(),
            rpc: rpc.into(),
            message,
        },
        Code::Unknown if message.contains("transport") || message.is_empty() => RunError::Unreachable {
            agent: agent.into(),
            endpoint: endpoint.into(),
            rpc: rpc.into(),
            message,
        },
        c => RunError::Agent {
            agent: agent.into(),
            rpc: rpc.into(),
            code: format!("{c:?}"),
            message,
        },
    }
}

/// A failure of the connection rather than an answer of the agent: where a refused
/// TLS handshake shows (tonic: Unknown "transport error", Unavailable, or Cancelled
/// when the connection closed under a request).
fn failed_in_transport(s: &Status) -> bool {
    // a link that went silent (a keep-alive or a connect that timed out) is no refusal,
    // and a handshake made to check would only wait out its own timeout
    let mut chain = format!("{} {:?}", s.message(), s.code());
    let mut at = std::error::Error::source(s);
    while let Some(e) = at {
        chain.push_str(&format!(" {e} {e:?}"));
        at = e.source();
    }
    let chain = chain.to_lowercase();
    if ["timed out", "timedout", "keep-alive", "keepalive"]
        .iter()
        .any(|k| chain.contains(k))
    {
        return false;
    }
    match s.code() {
        Code::Unknown => s.message().contains("transport") || s.message().is_empty(),
        Code::Unavailable => !tally_engine::error::is_database_unavailable(s.message()),
        Code::Cancelled => true,
        _ => false,
    }
}

fn is_transient(s: &Status) -> bool {
    // a database that refused the agent (or its login, TLS or host name failed) is
    // reported at once, not asked again three times over; one that was slow to answer,
    // or whose connections were all busy, may be a moment's load and is asked again
    let settled = tally_engine::error::is_database_unavailable(s.message())
        && !["(connection timed out)", "(all connections busy)"]
            .iter()
            .any(|k| s.message().contains(k));
    (matches!(s.code(), Code::Unavailable | Code::ResourceExhausted | Code::Aborted) && !settled)
        // tonic reports a failed connection as Unknown with a transport source
        || (s.code() == Code::Unknown && s.message().contains("transport"))
}

/// A RowDigests stream, collected: every digest in stream order and the envelope the
/// agent signed over them on its last batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Digests {
    pub digests: Vec<RowDigest>,
    pub envelope: Option<tally_common::dsse::Envelope>,
}

impl Digests {
    /// Adds one batch; an envelope is taken from the last batch only (one that comes
    /// with digests after it does not cover them, and is dropped).
    pub fn add(&mut self, batch: RowDigestBatch) {
        if !batch.digests.is_empty() {
            self.envelope = None;
        }
        self.digests.extend(batch.digests);
        if batch.envelope.is_some() {
            self.envelope = batch.envelope;
        }
    }
}

/// What the runtime needs of an agent: the five calls of `tally.agent.v1` on domain
/// types. [`Agent`] speaks gRPC over mutual TLS; `in_process::InProcessAgent` calls an
/// agent service in this process (tests, without TLS or processes).
#[tonic::async_trait]
pub trait AgentApi: Send + Sync {
    /// The agent's name in the coordinator config (for errors and policy checks).
    fn name(&self) -> &str;
    async fn describe(&self, dataset: &str) -> Result<Describe, RunError>;
    async fn aggregate(&self, req: AggregateRequest) -> Result<AggregateResponse, RunError>;
    /// All digests of a segment, collected.
    async fn row_digests(&self, req: RowDigestsRequest) -> Result<Digests, RunError>;
    /// RevealRows when `rows`, else RevealKeys.
    async fn reveal(&self, req: RevealRequest, rows: bool) -> Result<RevealResponse, RunError>;
    /// Investigation SQL: a segment's (`sql`), or per-key SQL of each of the request's
    /// `items` (`sqls`).
    async fn investigation_sql(
        &self,
        req: InvestigationSqlRequest,
    ) -> Result<InvestigationSqlResponse, RunError>;
    /// Mode measures: one level's groups.
    async fn measures(&self, req: MeasuresRequest) -> Result<MeasuresResponse, RunError>;
    /// The dataset's replication position (its agent's configured watermark).
    async fn read_position(&self, req: ReadPositionRequest) -> Result<PositionResponse, RunError>;
    /// Waits until the dataset has applied a position, up to the request's timeout.
    async fn wait_position(&self, req: WaitPositionRequest) -> Result<PositionResponse, RunError>;
}

#[tonic::async_trait]
impl AgentApi for Agent {
    fn name(&self) -> &str {
        &self.name
    }
    async fn describe(&self, dataset: &str) -> Result<Describe, RunError> {
        Agent::describe(self, dataset).await
    }
    async fn aggregate(&self, req: AggregateRequest) -> Result<AggregateResponse, RunError> {
        Agent::aggregate(self, req).await
    }
    async fn row_digests(&self, req: RowDigestsRequest) -> Result<Digests, RunError> {
        Agent::row_digests(self, req).await
    }
    async fn reveal(&self, req: RevealRequest, rows: bool) -> Result<RevealResponse, RunError> {
        Agent::reveal(self, req, rows).await
    }
    async fn investigation_sql(
        &self,
        req: InvestigationSqlRequest,
    ) -> Result<InvestigationSqlResponse, RunError> {
        Agent::investigation_sql(self, req).await
    }
    async fn measures(&self, req: MeasuresRequest) -> Result<MeasuresResponse, RunError> {
        Agent::measures(self, req).await
    }
    async fn read_position(&self, req: ReadPositionRequest) -> Result<PositionResponse, RunError> {
        Agent::read_position(self, req).await
    }
    async fn wait_position(&self, req: WaitPositionRequest) -> Result<PositionResponse, RunError> {
        Agent::wait_position(self, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_refusal_is_not_asked_again_a_slow_database_is() {
        let db = |kind: &str| Status::unavailable(format!("database of dataset orders unavailable ({kind})"));
        for settled in [
            "connection refused",
            "authentication failed",
            "tls",
            "host not found",
        ] {
            assert!(!is_transient(&db(settled)), "{settled}");
        }
        for passing in ["connection timed out", "all connections busy"] {
            assert!(is_transient(&db(passing)), "{passing}");
        }
        assert!(is_transient(&Status::unavailable("tcp connect error")));
        let e = run_error("dc1", "https://a:1", "Aggregate", db("connection refused"));
        assert_eq!(e.code(), "database_unavailable");
        assert!(e.to_string().contains("agent dc1"), "{e}");
    }

    #[test]
    fn only_a_connection_that_failed_without_timing_out_is_checked_for_a_tls_refusal() {
        assert!(failed_in_transport(&Status::unknown("transport error")));
        assert!(failed_in_transport(&Status::cancelled("operation was canceled")));
        assert!(failed_in_transport(&Status::unavailable("tcp connect error")));
        assert!(!failed_in_transport(&Status::unavailable("keep-alive timed out")));
        assert!(!failed_in_transport(&Status::deadline_exceeded("late")));
        assert!(!failed_in_transport(&Status::unavailable(
            "database of dataset orders unavailable (connection refused)"
        )));
        assert!(!failed_in_transport(&Status::permission_denied("policy")));
    }
}
