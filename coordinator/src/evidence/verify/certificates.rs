//! The checks before any signature is read: the CA loads, the bundle is one of the
//! format, the checkpoint says when it was signed, and each party's certificate chains
//! to the CA as of then; and the certificates they leave to check signatures with.

use std::collections::BTreeMap;

use rustls::pki_types::UnixTime;
use tally_common::dsse::{CertificateChecker, Envelope, Usage};
use tally_common::seal::certificates_from_pem;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::super::FORMAT;
use super::super::bundle::{Bundle, CertEntry};
use super::{Checks, unique_members, utc_time};
use crate::signing::Checkpoint;

/// "the CA": the CA certificates load.
pub(super) fn the_ca(ca_pem: &[u8]) -> Result<(CertificateChecker, String), String> {
    CertificateChecker::from_ca_pem(ca_pem).map(|checker| (checker, "loaded".to_string()))
}

/// "bundle format": the bundle is one JSON object of `tally-evidence/1`.
pub(super) fn bundle_format(bundle_text: &[u8]) -> Result<(Bundle, String), String> {
    unique_members("the bundle", bundle_text)?;
    let b: Bundle = serde_json::from_slice(bundle_text).map_err(|e| format!("not a bundle: {e}"))?;
    if b.format != FORMAT {
        return Err(format!("format is {:?}, expected {FORMAT:?}", b.format));
    }
    Ok((b, FORMAT.to_string()))
}

/// "checkpoint time": the certificates are checked at the checkpoint's time, when the
/// coordinator says it signed (an expired certificate does not void evidence signed
/// while it was valid).
pub(super) fn checkpoint_time(b: &Bundle) -> Result<(OffsetDateTime, String), String> {
    let payload = b.checkpoint.payload_bytes().map_err(|e| e.to_string())?;
    unique_members("the checkpoint payload", &payload)?;
    let cp: Checkpoint = serde_json::from_slice(&payload).map_err(|e| format!("checkpoint payload: {e}"))?;
    let at = utc_time(&cp.time, false).map_err(|e| format!("the checkpoint's {e}"))?;
    let shown = at.format(&Rfc3339).unwrap_or_default();
    Ok((at, format!("{shown}: certificates are checked as of then")))
}

/// The leaf certificate of each party that signed, by the name it signs as and its role.
#[derive(Default)]
pub(super) struct Certs(BTreeMap<(String, &'static str), Vec<u8>>);

impl Certs {
    /// The signer and payload of an envelope of one signature, by a party of `role`
    /// whose certificate the bundle holds.
    pub(super) fn signed_by(
        &self,
        env: &Envelope,
        role: &'static str,
        payload_type: &str,
    ) -> Result<(String, Vec<u8>), String> {
        let [sig] = env.signatures.as_slice() else {
            return Err(format!("{} signatures, expected one", env.signatures.len()));
        };
        let cert = self.0.get(&(sig.keyid.clone(), role)).ok_or_else(|| {
            format!(
                "signed as {:?}, which has no {role} certificate in the bundle",
                sig.keyid
            )
        })?;
        let payload = env
            .verify(payload_type, &sig.keyid, cert)
            .map_err(|e| e.to_string())?;
        Ok((sig.keyid.clone(), payload))
    }
}

/// "certificates[i] (role name)", one check each: every certificate chains to the CA,
/// for its role and name, as of the checkpoint's time; one per name and role.
pub(super) fn certificates(
    c: &mut Checks,
    checker: &CertificateChecker,
    b: &Bundle,
    signed_at: OffsetDateTime,
) -> Option<Certs> {
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        signed_at.unix_timestamp().max(0) as u64
    ));
    let mut certs = Certs::default();
    for (i, e) in b.certificates.iter().enumerate() {
        let name = format!("certificates[{i}] ({} {:?})", e.role, e.name);
        c.check(name, certificate(checker, e, at, &mut certs))?;
    }
    Some(certs)
}

fn certificate(
    checker: &CertificateChecker,
    e: &CertEntry,
    at: UnixTime,
    certs: &mut Certs,
) -> Result<String, String> {
    let usage = match e.role.as_str() {
        "coordinator" => Usage::Coordinator,
        "agent" => Usage::Agent,
        _ => return Err(format!("role {:?} is neither coordinator nor agent", e.role)),
    };
    let chain = certificates_from_pem(e.pem.as_bytes())?;
    checker
        .check(&chain, &e.name, usage, at)
        .map_err(|e| e.to_string())?;
    let role = if usage == Usage::Agent {
        "agent"
    } else {
        "coordinator"
    };
    if certs.0.insert((e.name.clone(), role), chain[0].clone()).is_some() {
        return Err("a second certificate for the same name and role".to_string());
    }
    Ok("chains to the CA, for its role and name".to_string())
}
