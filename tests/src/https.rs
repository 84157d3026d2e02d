//! A minimal HTTP/1.1 client for `tally serve`'s API, over rustls or plain TCP (the
//! tests need no HTTP client crate): one request per connection, `Connection: close`.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// What the client trusts and, optionally, presents.
pub fn client_config(ca_pem: &Path, identity: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_pem).expect("CA file") {
        roots.add(c.expect("CA certificate")).expect("CA certificate");
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
    let cfg = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .expect("client certificate")
                .collect::<Result<Vec<_>, _>>()
                .expect("client certificate");
            let key = PrivateKeyDer::from_pem_file(key).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client identity")
        }
    };
    Arc::new(cfg)
}

/// An API answer: the status and the body (JSON when it parses, else a string).
pub type Answer = (u16, serde_json::Value);

/// Sends one request to 127.0.0.1:`port`: HTTPS (server name `localhost`) with `tls`,
/// plain HTTP without. An error is a failed connection or handshake, or no HTTP answer.
pub fn request(
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> std::io::Result<Answer> {
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let text = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut resp = Vec::new();
    let read = match tls {
        Some(cfg) => {
            let name = ServerName::try_from("localhost").expect("server name");
            let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(std::io::Error::other)?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(text.as_bytes())?;
            s.flush()?;
            s.read_to_end(&mut resp)
        }
        None => {
            let mut s = tcp;
            s.write_all(text.as_bytes())?;
            s.read_to_end(&mut resp)
        }
    };
    match read {
        Ok(_) => {}
        // a peer that closes without close_notify after answering
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !resp.is_empty() => {}
        Err(e) => return Err(e),
    }
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status: u16 = resp
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {resp:?}")))?;
    let body = resp.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string())),
    ))
}
