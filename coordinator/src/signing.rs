//! What the evidence and the ledger both sign and report, below both of them: the
//! coordinator's signing identity, the checkpoint it signs of a chain's head, and one
//! check of a verifier (`tally verify` of a bundle, or of the log's ledger).

use serde::{Deserialize, Serialize};
use tally_common::dsse::Envelope;
use tally_common::seal::{TlsSigner, certificates_from_pem, dns_names};

use crate::config::ClientTls;

/// The coordinator's signing identity: the key of its TLS client certificate, as the
/// certificate's first DNS name.
pub struct Signer {
    pub name: String,
    signer: TlsSigner,
    pub certificate_pem: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Signer {
    pub fn load(tls: &ClientTls) -> Result<Signer, String> {
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let cert = read(&tls.cert)?;
        let chain = certificates_from_pem(&cert).map_err(|e| format!("{}: {e}", tls.cert.display()))?;
        let name = dns_names(&chain[0]).into_iter().next().ok_or_else(|| {
            format!(
                "{} has no DNS name to sign evidence as (verifiers match names, never common names)",
                tls.cert.display()
            )
        })?;
        let signer =
            TlsSigner::from_pem(&read(&tls.key)?).map_err(|e| format!("{}: {e}", tls.key.display()))?;
        Ok(Signer {
            name,
            signer,
            certificate_pem: String::from_utf8(cert)
                .map_err(|_| format!("{}: not PEM text", tls.cert.display()))?,
        })
    }

    pub fn sign(&self, payload_type: &str, payload: &[u8]) -> Result<Envelope, String> {
        Envelope::sign(payload_type, payload, &self.name, &self.signer).map_err(|e| e.to_string())
    }
}

/// A signed head of a chain (payloadType [`tally_common::dsse::CHECKPOINT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub seq: u64,
    pub head: String,
    pub time: String,
}

/// One check of a verifier (`evidence::verify`, `ledger::verify`): what was checked and
/// what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub outcome: Result<String, String>,
}

/// Whether every check passed.
pub fn valid(checks: &[Check]) -> bool {
    !checks.is_empty() && checks.iter().all(|c| c.outcome.is_ok())
}
