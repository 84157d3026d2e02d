//! Mutual TLS for the agent's gRPC server: client certificates are required and must
//! chain to the configured CA with the ClientAuth extended key usage (rustls/webpki
//! check both during the handshake, so another agent's ServerAuth-only certificate
//! cannot call); the allow-list of client names (`[coordinator]` unless configured) is
//! checked per call from the verified certificate. The agent runs the handshakes itself
//! ([`Incoming`]) so that each refusal is logged with its reason.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::{Request, Status};

use crate::config::{AllowedClients, TlsConfig};
use crate::error::AgentError;

fn read(path: &Path, what: &str) -> Result<Vec<u8>, AgentError> {
    std::fs::read(path).map_err(|e| AgentError::Config(format!("tls.{what}: {}: {e}", path.display())))
}

/// The agent's rustls server config (ring): its certificate and key, and a client
/// certificate required, verified against `tls.ca`; HTTP/2 offered by ALPN.
pub fn server_config(cfg: &TlsConfig) -> Result<Arc<ServerConfig>, AgentError> {
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        AgentError::Config(format!("tls.{what}: {}: {e}", path.display()))
    };
    let certs = CertificateDer::pem_slice_iter(&read(&cfg.cert, "cert")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("cert", &cfg.cert, &e))?;
    if certs.is_empty() {
        return Err(bad("cert", &cfg.cert, &"no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&cfg.key, "key")?).map_err(|e| bad("key", &cfg.key, &e))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&read(&cfg.ca, "ca")?) {
        let c = c.map_err(|e| bad("ca", &cfg.ca, &e))?;
        roots.add(c).map_err(|e| bad("ca", &cfg.ca, &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| bad("ca", &cfg.ca, &e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AgentError::Config(format!("tls: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| AgentError::Config(format!("tls: the certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A handshake that takes longer is dropped, so a slow client cannot hold a slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once (accepting waits beyond it), and from one address
/// (beyond it new connections from that address are closed at accept).
const MAX_HANDSHAKES: usize = 64;
const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// Why the agent refused a client in the TLS handshake, by class: what its log names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The client certificate does not chain to `tls.ca`.
    UnknownCa,
    /// The client certificate is expired (or not yet valid); its notAfter (notBefore)
    /// when rustls gives it.
    Expired(Option<String>),
    /// The client certificate is not for client authentication (no ClientAuth usage).
    WrongUsage,
    /// The client presented no certificate.
    NoClientCertificate,
    /// Any other TLS error, as rustls words it.
    Other(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::UnknownCa => f.write_str("unknown CA"),
            Refusal::Expired(None) => f.write_str("expired"),
            Refusal::Expired(Some(when)) => write!(f, "expired ({when})"),
            Refusal::WrongUsage => f.write_str("wrong usage"),
            Refusal::NoClientCertificate => f.write_str("no client certificate"),
            Refusal::Other(e) => write!(f, "other: {e}"),
        }
    }
}

fn rfc3339(t: UnixTime) -> String {
    time::OffsetDateTime::from_unix_timestamp(t.as_secs() as i64)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{} s after the epoch", t.as_secs()))
}

impl Refusal {
    /// The class of a rustls handshake error.
    pub fn of(e: &rustls::Error) -> Refusal {
        use CertificateError as C;
        match e {
            rustls::Error::NoCertificatesPresented => Refusal::NoClientCertificate,
            rustls::Error::InvalidCertificate(c) => match c {
                C::UnknownIssuer => Refusal::UnknownCa,
                C::Expired | C::NotValidYet => Refusal::Expired(None),
                C::ExpiredContext { not_after, .. } => {
                    Refusal::Expired(Some(format!("notAfter {}", rfc3339(*not_after))))
                }
                C::NotValidYetContext { not_before, .. } => {
                    Refusal::Expired(Some(format!("not valid yet: notBefore {}", rfc3339(*not_before))))
                }
                C::InvalidPurpose | C::InvalidPurposeContext { .. } => Refusal::WrongUsage,
                _ => Refusal::Other(e.to_string()),
            },
            rustls::Error::AlertReceived(_) => {
                Refusal::Other(format!("the client refused this agent's certificate: {e}"))
            }
            _ => Refusal::Other(e.to_string()),
        }
    }
}

/// Handshakes in progress: one budget for all, one per remote address.
#[derive(Debug, Clone)]
struct Budgets {
    all: Arc<Semaphore>,
    per_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A handshake's share of the budgets, given back when it ends.
#[derive(Debug)]
struct Slot {
    _all: tokio::sync::OwnedSemaphorePermit,
    ip: IpAddr,
    per_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl Budgets {
    fn new() -> Budgets {
        Budgets {
            all: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
            per_address: Default::default(),
        }
    }

    /// Waits for a handshake slot; `None` when `ip` already has its share in progress.
    async fn take(&self, ip: IpAddr) -> Option<Slot> {
        {
            let m = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
            if m.get(&ip).is_some_and(|n| *n >= MAX_HANDSHAKES_PER_ADDRESS) {
                return None;
            }
        }
        let all = self.all.clone().acquire_owned().await.ok()?;
        let mut m = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(Slot {
            _all: all,
            ip,
            per_address: self.per_address.clone(),
        })
    }
}

/// The agent's TLS connections for tonic: TCP connections are accepted and their
/// handshakes run concurrently, each in its own task; a refused one is logged with its
/// class ([`Refusal`]) and the remote address, and finished ones are handed on. tonic
/// reads the verified client certificate from each stream (`Request::peer_certs`).
#[derive(Debug)]
pub struct Incoming {
    ready: mpsc::Receiver<TlsStream<TcpStream>>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Incoming {
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Incoming {
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let budgets = Budgets::new();
        let accept_task = tokio::spawn(async move {
            loop {
                let (tcp, addr) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = budgets.take(addr.ip()).await else {
                    tracing::warn!(remote = %addr, "connection closed: too many TLS handshakes in progress from its address");
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                    drop(slot);
                    match done {
                        Ok(Ok(tls)) => {
                            let _ = tx.send(tls).await;
                        }
                        Ok(Err(e)) => log_failure(addr, &e),
                        Err(_) => tracing::info!(remote = %addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Incoming { ready, accept_task }
    }
}

/// One line per failed handshake: a refusal by rustls at WARN with its class; a
/// connection closed before it said anything (a TCP probe) at DEBUG; other I/O
/// failures at INFO.
fn log_failure(addr: SocketAddr, e: &std::io::Error) {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => {
            let reason = Refusal::of(tls);
            tracing::warn!(remote = %addr, reason = %reason, "TLS handshake refused")
        }
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(remote = %addr, "connection closed before the TLS handshake")
        }
        None => tracing::info!(remote = %addr, error = %e, "TLS handshake failed"),
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = Result<TlsStream<TcpStream>, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // the accept task holds the sender for as long as this lives
        self.ready.poll_recv(cx).map(|s| s.map(Ok))
    }
}

pub use tally_common::pki::cert_names;

/// The caller's name for logs: the first name of its verified client certificate.
pub fn client_name<T>(req: &Request<T>) -> String {
    req.peer_certs()
        .and_then(|certs| certs.first().map(|c| cert_names(c.as_ref())))
        .and_then(|n| n.into_iter().next())
        .unwrap_or_else(|| "unknown".into())
}

/// Builds the interceptor that enforces `tls.allowed_clients`.
pub fn allow_list(allowed: AllowedClients) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let allowed = match &allowed {
            AllowedClients::Any => return Ok(req),
            AllowedClients::Names(n) => n,
        };
        let names = req
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| cert_names(c.as_ref())))
            .unwrap_or_default();
        if names.iter().any(|n| allowed.contains(n)) {
            Ok(req)
        } else {
            let who = names
                .first()
                .cloned()
                .unwrap_or_else(|| "a client without a certificate".into());
            tracing::warn!(client = %who, "client not in tls.allowed_clients");
            Err(Status::permission_denied(format!(
                "client certificate {who:?} is not in this agent's tls.allowed_clients"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Refusal, cert_names};

    #[test]
    fn a_refusal_is_named_by_its_class() {
        use rustls::pki_types::UnixTime;
        use rustls::{CertificateError as C, Error as E};
        let class = |e: E| Refusal::of(&e).to_string();
        assert_eq!(class(E::InvalidCertificate(C::UnknownIssuer)), "unknown CA");
        assert_eq!(class(E::InvalidCertificate(C::Expired)), "expired");
        assert_eq!(
            class(E::InvalidCertificate(C::ExpiredContext {
                time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_800_000_000)),
                not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_700_000_000)),
            })),
            "expired (notAfter 2023-11-14T22:13:20Z)"
        );
        assert!(class(E::InvalidCertificate(C::NotValidYet)).starts_with("expired"));
        assert_eq!(class(E::InvalidCertificate(C::InvalidPurpose)), "wrong usage");
        assert_eq!(class(E::NoCertificatesPresented), "no client certificate");
        assert_eq!(
            class(E::InvalidCertificate(C::BadSignature)),
            "other: invalid peer certificate: BadSignature"
        );
    }

    fn der(cn: &str, sans: &[&str]) -> Vec<u8> {
        let mut p =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_common_name_counts_only_without_any_san() {
        assert_eq!(
            cert_names(&der("coordinator", &["other"])),
            vec!["other".to_string()]
        );
        assert_eq!(
            cert_names(&der("coordinator", &[])),
            vec!["coordinator".to_string()]
        );
        // SANs that name no DNS name still name the subject: the CN does not count
        assert!(cert_names(&der("coordinator", &["127.0.0.1"])).is_empty());
    }
}
