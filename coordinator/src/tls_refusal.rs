//! The cause of a failed TLS handshake in words the operator can act on, by class:
//! `unknown CA`, `expired`, `wrong usage`, `no client certificate` (what the agent's
//! log names for the same refusal), or the certificate of the other side that this
//! side refused. Used for the coordinator's calls to agents (client.rs) and the CLI's calls to the
//! API (api_client.rs).

use rustls::{AlertDescription as A, CertificateError as C, Error};

/// Who is who in a handshake's message.
#[derive(Debug, Clone)]
pub struct Sides<'a> {
    /// The other side, e.g. `the agent`.
    pub peer: &'a str,
    /// This side's certificate, e.g. `the coordinator's certificate (tls.cert)`.
    pub ours: &'a str,
    /// The CA file this side trusts, e.g. `tls.ca`.
    pub our_ca: &'a str,
    /// This side's certificate's notAfter, for an expired one.
    pub our_not_after: Option<String>,
}

fn rfc3339(t: rustls::pki_types::UnixTime) -> String {
    time::OffsetDateTime::from_unix_timestamp(t.as_secs() as i64)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{} s after the epoch", t.as_secs()))
}

/// The cause of `e`, a rustls error of this side's handshake: an alert the peer sent
/// (it refused this side's certificate) or this side's refusal of the peer's.
pub fn cause(e: &Error, s: &Sides) -> String {
    let Sides {
        peer, ours, our_ca, ..
    } = s;
    match e {
        Error::AlertReceived(A::UnknownCA) => {
            format!("unknown CA: {peer} does not trust {ours}: it is not signed by a CA in {peer}'s tls.ca")
        }
        Error::AlertReceived(A::CertificateExpired) => format!(
            "expired: {peer} refused {ours} as expired or not yet valid{}",
            s.our_not_after
                .as_ref()
                .map(|t| format!(" (notAfter {t})"))
                .unwrap_or_default()
        ),
        Error::AlertReceived(A::UnsupportedCertificate) => format!(
            "wrong usage: {peer} refused {ours}: it is not a client certificate (it needs the ClientAuth extended key usage)"
        ),
        Error::AlertReceived(A::CertificateRequired) => {
            format!("no client certificate: {peer} requires one")
        }
        Error::AlertReceived(a) => format!("{peer} refused the handshake (alert {a:?})"),
        Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => format!(
                "unknown CA: {peer}'s certificate is not signed by a CA in {our_ca}, so this side does not trust it"
            ),
            C::Expired => format!("expired: {peer}'s certificate is expired"),
            C::ExpiredContext { not_after, .. } => format!(
                "expired: {peer}'s certificate expired (notAfter {})",
                rfc3339(*not_after)
            ),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("expired: {peer}'s certificate is not valid yet")
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => format!(
                "{peer}'s certificate is not valid for the endpoint's host name (its SANs must name it): {e}"
            ),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => format!(
                "wrong usage: {peer}'s certificate is not a server certificate (it needs the ServerAuth extended key usage)"
            ),
            _ => format!("{peer}'s certificate was refused: {e}"),
        },
        _ => format!("TLS handshake failed: {e}"),
    }
}

/// The rustls error inside an I/O error of a TLS stream, if it is one.
pub fn rustls_error(e: &std::io::Error) -> Option<&Error> {
    e.get_ref().and_then(|i| i.downcast_ref::<Error>())
}

/// The first rustls error in `e`'s chain of sources (directly or inside an I/O error).
pub fn find_rustls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e Error> {
    let mut at = Some(e);
    while let Some(x) = at {
        if let Some(r) = x.downcast_ref::<Error>() {
            return Some(r);
        }
        if let Some(r) = x.downcast_ref::<std::io::Error>().and_then(rustls_error) {
            return Some(r);
        }
        at = x.source();
    }
    None
}

/// The longest the probe waits for its TCP connection.
const PROBE_CONNECT: std::time::Duration = std::time::Duration::from_secs(2);

/// One TLS handshake of this side's own with `host:port` after a connection failed
/// without saying why: tonic and hyper often lose the peer's alert (with TLS 1.3 a
/// client certificate is refused after the client's part of the handshake, while a
/// request is already under way). Reads the peer's refusal or this side's, and names
/// its cause; `None` when the handshake goes through or the peer cannot be reached
/// (not a TLS matter). Each step waits `wait` at most.
pub async fn probe(
    config: std::sync::Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    sides: &Sides<'_>,
    wait: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let named = |e: std::io::Error| rustls_error(&e).map(|r| cause(r, sides));
    // a peer that refuses a handshake answers a connect at once: a cut link is not
    // waited for long
    let tcp = tokio::time::timeout(
        wait.min(PROBE_CONNECT),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .ok()?
    .ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let connect = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
    let mut tls = match tokio::time::timeout(wait, connect).await.ok()? {
        Ok(tls) => tls,
        Err(e) => return named(e),
    };
    // with TLS 1.3 the peer checks this side's certificate after this side's part of
    // the handshake: its refusal is the first thing read
    let mut first = [0u8; 64];
    match tokio::time::timeout(wait, tls.read(&mut first)).await.ok()? {
        Err(e) => named(e),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_names_its_own_cause() {
        let s = Sides {
            peer: "the agent",
            ours: "the coordinator's certificate (tls.cert)",
            our_ca: "tls.ca",
            our_not_after: Some("2026-01-01T00:00:00Z".into()),
        };
        let unknown = cause(&Error::AlertReceived(A::UnknownCA), &s);
        assert!(
            unknown.starts_with("unknown CA: the agent does not trust"),
            "{unknown}"
        );
        assert!(!unknown.contains("expired"), "{unknown}");
        let expired = cause(&Error::AlertReceived(A::CertificateExpired), &s);
        assert!(
            expired.starts_with("expired:") && expired.contains("notAfter 2026-01-01T00:00:00Z"),
            "{expired}"
        );
        assert!(!expired.contains("CA"), "{expired}");
        let usage = cause(&Error::AlertReceived(A::UnsupportedCertificate), &s);
        assert!(
            usage.starts_with("wrong usage:") && usage.contains("ClientAuth"),
            "{usage}"
        );
        // this side refusing the agent's certificate names the agent's, not ours
        let theirs = cause(&Error::InvalidCertificate(C::UnknownIssuer), &s);
        assert!(
            theirs.starts_with("unknown CA: the agent's certificate") && theirs.contains("tls.ca"),
            "{theirs}"
        );
        let theirs = cause(&Error::InvalidCertificate(C::Expired), &s);
        assert!(theirs.starts_with("expired: the agent's certificate"), "{theirs}");
    }
}
