//! The API's listeners for axum: HTTPS with the coordinator's own server certificate
//! (`api.tls`, rustls with ring), asking for a client certificate when `api.tls.ca` is
//! set (optional, so a token still works without one), or plain HTTP where `tally
//! serve --insecure-loopback` allows it. Each connection carries a [`Peer`]: its
//! address and the names of its verified client certificate.

use std::future::Future as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::ApiTls;

/// A handshake that takes longer is dropped, so slow clients cannot hold the listener.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections the API holds at once, and from one address: beyond them new ones are
/// closed at accept, so one client cannot take every socket.
const MAX_CONNECTIONS: usize = 1024;
const MAX_CONNECTIONS_PER_ADDRESS: usize = 32;
/// A connection that moves no byte either way for this long is closed (an idle
/// keep-alive, or a client that stopped sending its request).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The connection budgets: one global, one per remote address.
#[derive(Debug, Clone)]
struct Budgets {
    all: Arc<tokio::sync::Semaphore>,
    per_address: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// What a connection holds of the budgets; given back when it closes.
#[derive(Debug)]
struct Slot {
    _all: tokio::sync::OwnedSemaphorePermit,
    ip: std::net::IpAddr,
    per_address: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
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
            all: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            per_address: Default::default(),
        }
    }

    /// A slot for a connection from `ip`, or `None` when a budget is spent.
    fn take(&self, ip: std::net::IpAddr) -> Option<Slot> {
        let all = self.all.clone().try_acquire_owned().ok()?;
        let mut m = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_CONNECTIONS_PER_ADDRESS {
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

/// A served connection: its budget slot, and the idle deadline.
pub struct Guarded<S> {
    inner: S,
    _slot: Slot,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guarded")
    }
}

impl<S> Guarded<S> {
    fn new(inner: S, slot: Slot) -> Guarded<S> {
        Guarded {
            inner,
            _slot: slot,
            idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        }
    }

    fn progressed(&mut self) {
        self.idle
            .as_mut()
            .reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
    }

    /// While the stream waits, the idle deadline may end the connection.
    fn idle_expired(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        self.idle.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "api: connection idle")
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            std::task::Poll::Pending if self.idle_expired(cx) => std::task::Poll::Ready(Err(timed_out())),
            std::task::Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.progressed();
                std::task::Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            std::task::Poll::Pending if self.idle_expired(cx) => std::task::Poll::Ready(Err(timed_out())),
            std::task::Poll::Ready(Ok(n)) => {
                self.progressed();
                std::task::Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The names of the client certificate rustls verified against `api.tls.ca`
    /// (`pki::cert_names`); `None` without one.
    pub cert_names: Option<Vec<String>>,
}

/// The rustls server config of `api.tls`.
pub fn server_config(tls: &ApiTls) -> Result<Arc<rustls::ServerConfig>, String> {
    let read = |p: &std::path::Path, key: &str| {
        std::fs::read(p).map_err(|e| format!("api.tls.{key}: {}: {e}", p.display()))
    };
    let certs = CertificateDer::pem_slice_iter(&read(&tls.cert, "cert")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("api.tls.cert: {}: {e}", tls.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("api.tls.cert: {}: no certificate", tls.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&tls.key, "key")?)
        .map_err(|e| format!("api.tls.key: {}: {e}", tls.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("api.tls: {e}"))?;
    let builder = match &tls.ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&read(ca, "ca")?) {
                let c = c.map_err(|e| format!("api.tls.ca: {}: {e}", ca.display()))?;
                roots
                    .add(c)
                    .map_err(|e| format!("api.tls.ca: {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("api.tls.ca: {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("api.tls: the certificate and key do not fit: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// HTTPS: TCP connections are accepted and their handshakes run concurrently, each in
/// its own task; finished ones are handed to axum.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Guarded<TlsStream<TcpStream>>, Peer)>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, cfg: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(cfg);
        let budgets = Budgets::new();
        let accept_task = tokio::spawn(async move {
            loop {
                let (tcp, addr) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "api: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = budgets.take(addr.ip()) else {
                    tracing::warn!(remote = %addr, "api: connection refused: too many open connections");
                    drop(tcp);
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let cert_names = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| tally_common::pki::cert_names(c.as_ref()));
                            let _ = tx
                                .send((Guarded::new(tls, slot), Peer { addr, cert_names }))
                                .await;
                        }
                        Ok(Err(e)) => tracing::info!(remote = %addr, error = %e, "api: TLS handshake failed"),
                        Err(_) => tracing::info!(remote = %addr, "api: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            ready,
            accept_task,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl Listener for TlsListener {
    type Io = Guarded<TlsStream<TcpStream>>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(x) => x,
            // the accept task holds the sender for as long as the listener lives
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Ok(Peer {
            addr: self.local,
            cert_names: None,
        })
    }
}

/// Plain HTTP (`--insecure-loopback` only).
#[derive(Debug)]
pub struct PlainListener(pub TcpListener);

impl Listener for PlainListener {
    type Io = TcpStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.0).await;
        (
            io,
            Peer {
                addr,
                cert_names: None,
            },
        )
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Ok(Peer {
            addr: self.0.local_addr()?,
            cert_names: None,
        })
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

impl Connected<IncomingStream<'_, PlainListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, PlainListener>) -> Self {
        stream.remote_addr().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_connection_and_closed_ones_are_given_back() {
        let b = Budgets::new();
        let (a, c): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let held: Vec<Slot> = (0..MAX_CONNECTIONS_PER_ADDRESS)
            .map(|_| b.take(a).unwrap())
            .collect();
        assert!(b.take(a).is_none(), "the address's budget is spent");
        assert!(b.take(c).is_some(), "another address still connects");
        drop(held);
        assert!(b.take(a).is_some(), "closed connections give their slots back");
        assert!(b.per_address.lock().unwrap().len() <= 1);
    }
}
