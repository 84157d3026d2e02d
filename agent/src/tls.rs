//! Mutual TLS for the agent's gRPC server: client certificates are required and must
//! chain to the configured CA with the ClientAuth extended key usage (rustls/webpki
//! check both during the handshake, so another agent's ServerAuth-only certificate
//! cannot call); the allow-list of client names (`[coordinator]` unless configured) is
//! checked per call from the verified certificate.

use std::path::Path;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use crate::config::{AllowedClients, TlsConfig};
use crate::error::AgentError;

fn read(path: &Path, what: &str) -> Result<Vec<u8>, AgentError> {
    std::fs::read(path).map_err(|e| AgentError::Config(format!("tls.{what}: {}: {e}", path.display())))
}

pub fn server_tls(cfg: &TlsConfig) -> Result<ServerTlsConfig, AgentError> {
    let cert = read(&cfg.cert, "cert")?;
    let key = read(&cfg.key, "key")?;
    let ca = read(&cfg.ca, "ca")?;
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca))
        .client_auth_optional(false))
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
    use super::cert_names;

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
