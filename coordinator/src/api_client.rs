//! The client of `tally serve`'s API for `tally run SPEC --server URL`: submits a spec,
//! follows the run's levels by polling `GET /v1/runs/{id}`, and reads back its result,
//! which the command prints exactly as a local run prints its own.
//!
//! HTTPS trusts only the CA given (`--ca`, the API's `api-ca.pem`), never the system's
//! roots; the caller logs in with a bearer token, a client certificate from the API's
//! CA, or both. Plain `http://` is accepted for a loopback host only (a server started
//! with `--insecure-loopback`). One request per connection: polls are seconds apart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, header};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use tally_engine::result::{LevelOut, RunResult};

/// A connection that is not up by then is reported unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Each step of the handshake made to name a refusal's cause (`tls_refusal::probe`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// An answer that takes longer than this is a failed request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Between two polls of a running run.
const POLL_EVERY: Duration = Duration::from_millis(300);
/// How long a run is followed through a server that cannot be reached (a restarted
/// service resumes its runs from the run log).
const REACH_GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("--server {0}: {1}")]
    Url(String, String),
    #[error("{0}")]
    Credentials(String),
    #[error("{server}: cannot connect: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("{server}: the server's certificate is not trusted by --ca {ca}: {reason}")]
    Untrusted {
        server: String,
        ca: String,
        reason: String,
    },
    #[error("{server}: the TLS handshake failed: {reason}")]
    Handshake { server: String, reason: String },
    #[error("{server}: {reason}")]
    Protocol { server: String, reason: String },
    /// A write the server refused before carrying it out (503 with `Retry-After` and
    /// `"not_started": true`: its group has no leader now): safe to send again.
    #[error("{server}: {message}")]
    NotTaken { server: String, message: String },
    /// The server answered with an error: its status and its message.
    #[error("{server}: {status}: {message}")]
    Refused {
        server: String,
        status: u16,
        message: String,
    },
}

/// How the client reaches and logs in to the API.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// The API's CA (PEM); required for https.
    pub ca: Option<PathBuf>,
    /// A bearer token.
    pub token: Option<String>,
    /// A client certificate and its key (PEM), from the API's CA.
    pub cert: Option<(PathBuf, PathBuf)>,
}

/// The API of one `tally serve`.
#[derive(Debug, Clone)]
pub struct ApiClient {
    server: String,
    host: String,
    port: u16,
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
    token: Option<String>,
    /// The notAfter of `--cert`, for a refusal of it as expired.
    cert_not_after: Option<String>,
}

/// Who is who when the API refuses the CLI's handshake.
fn sides(cert_not_after: Option<String>) -> crate::tls_refusal::Sides<'static> {
    crate::tls_refusal::Sides {
        peer: "the server",
        ours: "--cert",
        our_ca: "--ca",
        our_not_after: cert_not_after,
    }
}

/// A server's answer.
struct Answer {
    status: u16,
    body: Value,
    /// It said when to try again (`Retry-After`).
    retry_after: bool,
}

/// What a poll of a run found.
#[derive(Debug)]
pub enum RunState {
    /// Still running; the levels committed so far.
    Running(Vec<LevelOut>),
    /// Finished: its stored result.
    Done(Box<RunResult>),
}

fn pem_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, ApiError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ApiError::Credentials(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ApiError::Credentials(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl ApiClient {
    /// A client for `server` (`https://host:port`, or `http://` on loopback).
    pub fn new(server: &str, opts: ClientOptions) -> Result<ApiClient, ApiError> {
        let bad = |m: &str| ApiError::Url(server.to_string(), m.to_string());
        let (https, rest) = if let Some(r) = server.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = server.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("must start with https://"));
        };
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') {
            return Err(bad("must be https://HOST:PORT without a path"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p.parse::<u16>().map_err(|_| bad("the port is not a number"))?,
            ),
            _ => (authority.to_string(), if https { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let tls = if https {
            let ca = opts.ca.as_ref().ok_or_else(|| {
                ApiError::Credentials(
                    "--ca FILE is required with an https:// server: the CA of the API's certificate (api-ca.pem)"
                        .into(),
                )
            })?;
            let mut roots = rustls::RootCertStore::empty();
            for c in pem_certs(ca, "--ca")? {
                roots
                    .add(c)
                    .map_err(|e| ApiError::Credentials(format!("--ca {}: {e}", ca.display())))?;
            }
            let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiError::Credentials(e.to_string()))?
            .with_root_certificates(roots);
            let cfg = match &opts.cert {
                None => builder.with_no_client_auth(),
                Some((cert, key)) => {
                    let chain = pem_certs(cert, "--cert")?;
                    let key = PrivateKeyDer::from_pem_file(key)
                        .map_err(|e| ApiError::Credentials(format!("--key {}: {e}", key.display())))?;
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(|e| ApiError::Credentials(format!("--cert/--key: {e}")))?
                }
            };
            Some((Arc::new(cfg), ca.display().to_string()))
        } else {
            if !is_loopback(&host) {
                return Err(bad(
                    "plain http:// only to a loopback address (tally serve --insecure-loopback); use https://",
                ));
            }
            if opts.cert.is_some() {
                return Err(bad("--cert needs an https:// server"));
            }
            None
        };
        let cert_not_after = opts
            .cert
            .as_ref()
            .and_then(|(c, _)| std::fs::read(c).ok())
            .and_then(|pem| tally_common::pki::pem_not_after(&pem));
        Ok(ApiClient {
            server: format!("{}://{authority}", if https { "https" } else { "http" }),
            host,
            port,
            tls,
            token: opts.token,
            cert_not_after,
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    fn unreachable(&self, reason: impl std::fmt::Display) -> ApiError {
        ApiError::Unreachable {
            server: self.server.clone(),
            reason: reason.to_string(),
        }
    }

    /// One request; the status and the body (JSON, or the text as a JSON string).
    pub async fn request(&self, method: Method, path: &str, body: &str) -> Result<(u16, Value), ApiError> {
        self.send(method, path, body).await.map(|a| (a.status, a.body))
    }

    async fn send(&self, method: Method, path: &str, body: &str) -> Result<Answer, ApiError> {
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| self.unreachable("timed out"))?
        .map_err(|e| self.unreachable(e))?;
        let Some((cfg, ca)) = &self.tls else {
            return self.exchange(tcp, method, path, body).await;
        };
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| ApiError::Url(self.server.clone(), format!("host: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(cfg.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| self.handshake_error(e, ca))?;
        match self.exchange(tls, method, path, body).await {
            // the connection failed without saying why: a client certificate refused
            // after the handshake (TLS 1.3) often shows only as "operation was canceled"
            Err(ApiError::Protocol { server, reason }) => {
                let sides = sides(self.cert_not_after.clone());
                match crate::tls_refusal::probe(cfg.clone(), &self.host, self.port, &sides, PROBE_TIMEOUT)
                    .await
                {
                    Some(refusal) => Err(ApiError::Handshake {
                        server,
                        reason: refusal,
                    }),
                    None => Err(ApiError::Protocol { server, reason }),
                }
            }
            other => other,
        }
    }

    fn handshake_error(&self, e: std::io::Error, ca: &str) -> ApiError {
        let reason = e.to_string();
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)) => {
                ApiError::Untrusted {
                    server: self.server.clone(),
                    ca: ca.to_string(),
                    reason,
                }
            }
            Some(r @ (rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_))) => {
                ApiError::Handshake {
                    server: self.server.clone(),
                    reason: crate::tls_refusal::cause(r, &sides(self.cert_not_after.clone())),
                }
            }
            Some(_) => ApiError::Handshake {
                server: self.server.clone(),
                reason,
            },
            None => self.unreachable(reason),
        }
    }

    async fn exchange<S>(&self, io: S, method: Method, path: &str, body: &str) -> Result<Answer, ApiError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let proto = |e: &dyn std::fmt::Display| ApiError::Protocol {
            server: self.server.clone(),
            reason: e.to_string(),
        };
        let run = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| proto(&e))?;
            // drives the connection; ends when the answer is read and the connection closes
            let (conn_err_tx, conn_err) = tokio::sync::oneshot::channel::<(String, Option<String>)>();
            let not_after = self.cert_not_after.clone();
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    let refusal = crate::tls_refusal::find_rustls_error(&e)
                        .map(|r| crate::tls_refusal::cause(r, &sides(not_after)));
                    let _ = conn_err_tx.send((format!("{e} ({e:?})"), refusal));
                }
            });
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, format!("{}:{}", self.host, self.port))
                .header(header::CONTENT_TYPE, "application/yaml");
            if let Some(t) = &self.token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = req
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|e| proto(&e))?;
            let resp = match sender.send_request(req).await {
                Ok(r) => r,
                Err(e) => {
                    // the connection's own error says more than "canceled"
                    let why = tokio::time::timeout(Duration::from_secs(1), conn_err)
                        .await
                        .ok()
                        .and_then(Result::ok);
                    return Err(match why {
                        // TLS 1.3 refuses a client certificate after the handshake
                        Some((_, Some(refusal))) => ApiError::Handshake {
                            server: self.server.clone(),
                            reason: refusal,
                        },
                        Some((w, None)) => proto(&format!("{e}: {w}")),
                        None => proto(&e),
                    });
                }
            };
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key(header::RETRY_AFTER);
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| proto(&e))?
                .to_bytes();
            let text = String::from_utf8_lossy(&bytes);
            let value = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.into_owned()));
            Ok(Answer {
                status,
                body: value,
                retry_after,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, run)
            .await
            .map_err(|_| proto(&"no answer within 60 s"))?
    }

    /// An error answer as an error: the server's own message.
    fn refused(&self, status: u16, body: &Value) -> ApiError {
        let message = body["error"]
            .as_str()
            .map(str::to_string)
            .or_else(|| body.as_str().map(str::to_string))
            .unwrap_or_else(|| body.to_string());
        let status_text = match status {
            400 => "400 bad request".to_string(),
            401 => "401 not logged in (give --token-file, TALLY_TOKEN or --cert/--key)".to_string(),
            403 => "403 forbidden".to_string(),
            404 => "404 not found".to_string(),
            s => s.to_string(),
        };
        ApiError::Refused {
            server: self.server.clone(),
            status,
            message: format!("{status_text}: {message}"),
        }
    }

    /// Starts a run of the spec text `spec` (YAML or JSON): its id. A 503 with
    /// `Retry-After` and `"not_started": true` (a replica of a group without a leader,
    /// which certainly did not start it) is [`ApiError::NotTaken`].
    pub async fn start(&self, spec: &str) -> Result<String, ApiError> {
        let Answer {
            status,
            body,
            retry_after,
        } = self.send(Method::POST, "/v1/runs", spec).await?;
        // Tally's own mark beside the standard header: a proxy's 503 is not enough
        if status == 503 && retry_after && body["not_started"] == Value::Bool(true) {
            let ApiError::Refused { server, message, .. } = self.refused(status, &body) else {
                unreachable!("refused() is a refusal")
            };
            return Err(ApiError::NotTaken { server, message });
        }
        if status != 202 {
            return Err(self.refused(status, &body));
        }
        body["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::Protocol {
                server: self.server.clone(),
                reason: format!("no run id in the answer: {body}"),
            })
    }

    /// The run's state: running with its levels so far, or finished with its result.
    pub async fn poll(&self, id: &str) -> Result<RunState, ApiError> {
        let (status, body) = self.request(Method::GET, &format!("/v1/runs/{id}"), "").await?;
        let malformed = |e: serde_json::Error| ApiError::Protocol {
            server: self.server.clone(),
            reason: format!("run {id}: the answer does not read: {e}"),
        };
        match status {
            202 => {
                let levels = match body.get("levels") {
                    Some(l) => serde_json::from_value(l.clone()).map_err(malformed)?,
                    None => Vec::new(),
                };
                Ok(RunState::Running(levels))
            }
            200 => Ok(RunState::Done(Box::new(
                serde_json::from_value(body["result"].clone()).map_err(malformed)?,
            ))),
            s => Err(self.refused(s, &body)),
        }
    }

    /// Asks the server to cancel run `id`.
    pub async fn cancel(&self, id: &str) -> Result<(), ApiError> {
        let (status, body) = self
            .request(Method::POST, &format!("/v1/runs/{id}/cancel"), "")
            .await?;
        match status {
            202 => Ok(()),
            s => Err(self.refused(s, &body)),
        }
    }
}

/// The replicas of one `tally serve` group (`--server URL,URL,…`), followed through a
/// leader change: a request goes to the replica that last answered, and moves on to
/// the next when that one cannot be reached.
#[derive(Debug)]
pub struct ApiGroup {
    members: Vec<ApiClient>,
    at: std::sync::atomic::AtomicUsize,
}

impl ApiGroup {
    /// A client of every comma-separated URL of `servers` (one is a group of one).
    pub fn new(servers: &str, opts: ClientOptions) -> Result<ApiGroup, ApiError> {
        let members = servers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| ApiClient::new(s, opts.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        if members.is_empty() {
            return Err(ApiError::Url(servers.to_string(), "no URL".into()));
        }
        Ok(ApiGroup {
            members,
            at: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn current(&self) -> &ApiClient {
        &self.members[self.at.load(std::sync::atomic::Ordering::Relaxed) % self.members.len()]
    }

    fn next(&self) {
        self.at.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The replica asked last.
    pub fn server(&self) -> &str {
        self.current().server()
    }

    /// Starts a run on the first replica that takes it. A replica that could not be
    /// connected to is passed over, and so is one that refused the run before starting
    /// it because its group has no leader now ([`ApiError::NotTaken`]): the replicas are
    /// asked in turn, a second apart after each round, for up to [`REACH_GRACE`] (a
    /// group just started, or electing a new leader). Any other answer from a replica
    /// that was reached is final: the run may have started there, and the spec is
    /// never sent twice.
    pub async fn start(&self, spec: &str) -> Result<String, ApiError> {
        let since = std::time::Instant::now();
        loop {
            let (mut unreachable, mut not_taken) = (None, None);
            for _ in 0..self.members.len() {
                match self.current().start(spec).await {
                    Err(e @ ApiError::Unreachable { .. }) => unreachable = Some(e),
                    Err(e @ ApiError::NotTaken { .. }) => not_taken = Some(e),
                    r => return r,
                }
                self.next();
            }
            // a group none of whose replicas can be reached is reported at once
            let Some(not_taken) = not_taken else {
                return Err(unreachable.expect("at least one member"));
            };
            if since.elapsed() > REACH_GRACE {
                return Err(not_taken);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Cancels run `id` through the first replica that can be reached.
    pub async fn cancel(&self, id: &str) -> Result<(), ApiError> {
        let mut last = None;
        for _ in 0..self.members.len() {
            match self.current().cancel(id).await {
                Err(e @ ApiError::Unreachable { .. }) => {
                    last = Some(e);
                    self.next();
                }
                r => return r,
            }
        }
        Err(last.expect("at least one member"))
    }

    /// Polls run `id`, which this client started, until it finishes, calling `level`
    /// once for each new level. The replicas are asked in turn, one per poll: a leader
    /// cut off from its group still answers "running" with its frozen levels, while the
    /// others finish the run. Through a leader change the run is out of reach for a
    /// while: a replica that cannot be reached or breaks off its answer, one that has
    /// not yet applied the run's start (404) and one without a leader (502-504) count
    /// as out of reach, and when every poll for [`REACH_GRACE`] in a row was, the last
    /// answer is the error.
    pub async fn follow(&self, id: &str, mut level: impl FnMut(&LevelOut)) -> Result<RunResult, ApiError> {
        let mut seen = 0;
        let mut out_of_reach_since: Option<std::time::Instant> = None;
        loop {
            match self.current().poll(id).await {
                Ok(RunState::Done(result)) => {
                    // the levels finished between the last poll and the end
                    result.levels.iter().skip(seen).for_each(&mut level);
                    return Ok(*result);
                }
                Ok(RunState::Running(levels)) => {
                    out_of_reach_since = None;
                    levels.iter().skip(seen).for_each(&mut level);
                    seen = seen.max(levels.len());
                }
                Err(e) if transient(&e) => {
                    let since = *out_of_reach_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > REACH_GRACE {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
            self.next();
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
}

/// What a replica answers while its group changes leader, for a run that exists.
fn transient(e: &ApiError) -> bool {
    match e {
        ApiError::Unreachable { .. } | ApiError::Protocol { .. } | ApiError::NotTaken { .. } => true,
        ApiError::Refused { status, .. } => matches!(status, 404 | 502 | 503 | 504),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_every_url_of_the_list_and_each_is_checked() {
        let g = ApiGroup::new(
            "http://127.0.0.1:7400, http://127.0.0.1:7401,",
            ClientOptions::default(),
        )
        .unwrap();
        assert_eq!(g.members.len(), 2);
        assert_eq!(g.server(), "http://127.0.0.1:7400");
        g.next();
        assert_eq!(g.server(), "http://127.0.0.1:7401");
        g.next();
        assert_eq!(g.server(), "http://127.0.0.1:7400");
        let e = ApiGroup::new("http://127.0.0.1:7400,ftp://x:1", ClientOptions::default()).unwrap_err();
        assert!(e.to_string().contains("ftp://x:1"), "{e}");
        assert!(ApiGroup::new(" , ", ClientOptions::default()).is_err());
    }

    #[tokio::test]
    async fn a_run_is_started_on_the_first_replica_that_can_be_reached() {
        // a port nothing listens on, then a server that starts the run
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_port = dead.local_addr().unwrap().port();
        drop(dead);
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live_port = live.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut sock, _) = live.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = sock.read(&mut buf).await.unwrap();
            let body = r#"{"id":"r-1"}"#;
            let answer = format!(
                "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(answer.as_bytes()).await.unwrap();
        });
        let g = ApiGroup::new(
            &format!("http://127.0.0.1:{dead_port},http://127.0.0.1:{live_port}"),
            ClientOptions::default(),
        )
        .unwrap();
        assert_eq!(g.start("name: x").await.unwrap(), "r-1");
        assert_eq!(g.server(), format!("http://127.0.0.1:{live_port}"));
    }

    /// A server that answers its connections with `answers` in turn (status line and
    /// headers, body), one request per connection; the number of requests it read.
    async fn canned(
        answers: Vec<(&'static str, &'static str)>,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = asked.clone();
        tokio::spawn(async move {
            for (head, body) in answers {
                let (mut sock, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let _ = sock.read(&mut buf).await.unwrap();
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = format!(
                    "{head}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                sock.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        (port, asked)
    }

    #[tokio::test]
    async fn a_start_refused_for_want_of_a_leader_is_sent_again_and_no_other_refusal_is() {
        // a replica of a group still electing: 503 with Retry-After, then it takes the run
        let no_leader = (
            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1",
            r#"{"error":"the group has no leader now","not_started":true}"#,
        );
        let (port, asked) = canned(vec![no_leader, ("HTTP/1.1 202 Accepted", r#"{"id":"r-2"}"#)]).await;
        let g = ApiGroup::new(&format!("http://127.0.0.1:{port}"), ClientOptions::default()).unwrap();
        assert_eq!(g.start("name: x").await.unwrap(), "r-2");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);

        // a 503 without Tally's mark (the leader could not be reached: it may have
        // started the run; or a proxy's, Retry-After or not) is final: the spec is not
        // sent again
        for head in [
            "HTTP/1.1 503 Service Unavailable",
            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1",
        ] {
            let (port, asked) = canned(vec![
                (head, r#"{"error":"cannot reach the leader"}"#),
                ("HTTP/1.1 202 Accepted", r#"{"id":"r-3"}"#),
            ])
            .await;
            let g = ApiGroup::new(&format!("http://127.0.0.1:{port}"), ClientOptions::default()).unwrap();
            let e = g.start("name: x").await.unwrap_err();
            assert!(
                matches!(e, ApiError::Refused { status: 503, .. })
                    && e.to_string().contains("cannot reach the leader"),
                "{head}: {e}"
            );
            assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "{head}");
        }
    }

    #[test]
    fn a_leader_change_is_waited_out_and_other_refusals_are_not() {
        let refused = |status| ApiError::Refused {
            server: "s".into(),
            status,
            message: String::new(),
        };
        for s in [404, 502, 503, 504] {
            assert!(transient(&refused(s)), "{s}");
        }
        for s in [400, 401, 403, 409, 500] {
            assert!(!transient(&refused(s)), "{s}");
        }
        assert!(!transient(&ApiError::Credentials("x".into())));
    }

    #[test]
    fn server_urls_are_checked_before_any_connection() {
        let no = |url: &str, opts: ClientOptions| ApiClient::new(url, opts).unwrap_err().to_string();
        assert!(no("ftp://x:1", ClientOptions::default()).contains("https://"));
        assert!(no("https://x:1/v1", ClientOptions::default()).contains("without a path"));
        assert!(no("https://x:port", ClientOptions::default()).contains("port"));
        assert!(no("https://x:1", ClientOptions::default()).contains("--ca"));
        assert!(no("http://10.1.2.3:7400", ClientOptions::default()).contains("loopback"));
        let ok = ApiClient::new("http://127.0.0.1:7400/", ClientOptions::default()).unwrap();
        assert_eq!(ok.server(), "http://127.0.0.1:7400");
        assert_eq!(ok.port, 7400);
    }
}
