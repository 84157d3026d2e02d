//! The API's listeners for axum: HTTPS with the coordinator's own server certificate
//! (`api.tls`, rustls with ring), asking for a client certificate when `api.tls.ca` is
//! set (optional, so a token still works without one), or plain HTTP where `tally
//! serve --insecure-loopback` allows it. Each connection carries a [`Peer`]: its
//! address and the names of its verified client certificate.

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
    ready: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, cfg: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(cfg);
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
                            let _ = tx.send((tls, Peer { addr, cert_names })).await;
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
    type Io = TlsStream<TcpStream>;
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
