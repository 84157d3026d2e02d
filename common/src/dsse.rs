//! DSSE v1 envelopes (DESIGN §12): what an agent answered and what the coordinator
//! concluded, signed with the private key of the signer's own TLS certificate, so a
//! third party holding only the CA can check them offline.
//!
//! An envelope is `{"payloadType", "payload": base64, "signatures": [{"keyid", "sig":
//! base64}]}`; each signature is taken over the pre-authentication encoding
//! `"DSSEv1" SP len(type) SP type SP len(payload) SP payload` (lengths in decimal
//! ASCII), never over the JSON of the envelope, so re-serialising it changes nothing.
//! `keyid` is the signer's name (the DNS name its certificate is valid for).
//!
//! Base64 is RFC 4648 standard with padding, decoded strictly (no whitespace, no
//! non-zero trailing bits): a payload has exactly one encoding, so two different
//! envelope texts never carry the same signed bytes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};
use serde::{Deserialize, Serialize};

use crate::seal::TlsSigner;

/// The payload type of an agent's signed Aggregate or RowDigests answer.
pub const AGENT_RESULT: &str = "application/vnd.tally.agent-result.v1+json";
/// The payload type of the coordinator's in-toto Statement over a run's result.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";
/// The payload type of the coordinator's signed run-log head.
pub const CHECKPOINT: &str = "application/vnd.tally.checkpoint.v1+json";

/// The signature algorithms a verifier accepts, one per key type of DESIGN §12 (and
/// ECDSA P-384, which the signers also produce for P-384 keys).
const ALGORITHMS: [&dyn rustls::pki_types::SignatureVerificationAlgorithm; 4] = [
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::ED25519,
    webpki::ring::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DsseError {
    #[error("cannot sign: {0}")]
    Sign(String),
    #[error("payloadType is {found:?}, expected {expected:?}")]
    PayloadType { found: String, expected: String },
    #[error("{field} is not strict base64 (RFC 4648, padded)")]
    Base64 { field: &'static str },
    #[error("no signature with keyid {0:?}")]
    NoSignature(String),
    #[error("the signature of {0:?} is not that certificate's over this payload")]
    BadSignature(String),
    #[error("certificate of {name:?}: {what}")]
    Certificate { name: String, what: String },
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub keyid: String,
    pub sig: String,
}

/// A DSSE v1 envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<Signature>,
}

/// DSSE's pre-authentication encoding of `payload` of type `payload_type`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + payload.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

fn decode(field: &'static str, text: &str) -> Result<Vec<u8>, DsseError> {
    STANDARD.decode(text).map_err(|_| DsseError::Base64 { field })
}

impl Envelope {
    /// Signs `payload` as `keyid` with the key of `keyid`'s TLS certificate.
    pub fn sign(
        payload_type: &str,
        payload: &[u8],
        keyid: &str,
        signer: &TlsSigner,
    ) -> Result<Envelope, DsseError> {
        let sig = signer
            .sign(&pae(payload_type, payload))
            .map_err(|e| DsseError::Sign(e.to_string()))?;
        Ok(Envelope {
            payload_type: payload_type.to_string(),
            payload: STANDARD.encode(payload),
            signatures: vec![Signature {
                keyid: keyid.to_string(),
                sig: STANDARD.encode(sig),
            }],
        })
    }

    /// The signed bytes, unchecked: for reading an envelope already verified.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, DsseError> {
        decode("payload", &self.payload)
    }

    /// Checks that the envelope is of `payload_type` and that its signature with keyid
    /// `keyid` is `cert_der`'s key's over the payload; returns the payload. The
    /// certificate itself is checked by [`CertificateChecker`].
    pub fn verify(&self, payload_type: &str, keyid: &str, cert_der: &[u8]) -> Result<Vec<u8>, DsseError> {
        if self.payload_type != payload_type {
            return Err(DsseError::PayloadType {
                found: self.payload_type.clone(),
                expected: payload_type.to_string(),
            });
        }
        let payload = self.payload_bytes()?;
        let sig = self
            .signatures
            .iter()
            .find(|s| s.keyid == keyid)
            .ok_or_else(|| DsseError::NoSignature(keyid.to_string()))?;
        let sig = decode("sig", &sig.sig)?;
        let der = CertificateDer::from(cert_der);
        let ee = webpki::EndEntityCert::try_from(&der).map_err(|e| DsseError::Certificate {
            name: keyid.to_string(),
            what: format!("does not parse: {e}"),
        })?;
        let msg = pae(payload_type, &payload);
        if ALGORITHMS
            .iter()
            .any(|alg| ee.verify_signature(*alg, &msg, &sig).is_ok())
        {
            Ok(payload)
        } else {
            Err(DsseError::BadSignature(keyid.to_string()))
        }
    }
}

/// What a signer's certificate must be issued for (DESIGN §2: each role carries one
/// extended key usage only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// An agent's certificate: ServerAuth, not ClientAuth.
    Agent,
    /// The coordinator's certificate towards agents: ClientAuth, not ServerAuth.
    Coordinator,
}

/// Checks that certificates chain to a trusted CA, carry the usage of their role and
/// are valid for the name they sign as.
#[derive(Debug, Clone)]
pub struct CertificateChecker {
    anchors: Vec<TrustAnchor<'static>>,
}

impl CertificateChecker {
    pub fn from_ca_pem(text: &[u8]) -> Result<CertificateChecker, String> {
        let mut anchors = Vec::new();
        for der in crate::seal::certificates_from_pem(text)? {
            let der = CertificateDer::from(der);
            let a =
                webpki::anchor_from_trusted_cert(&der).map_err(|e| format!("not a CA certificate: {e}"))?;
            anchors.push(a.to_owned());
        }
        Ok(CertificateChecker { anchors })
    }

    /// Checks `chain` (leaf first, then intermediates) at `now` for `name` in `usage`.
    pub fn check(&self, chain: &[Vec<u8>], name: &str, usage: Usage, now: UnixTime) -> Result<(), DsseError> {
        let err = |what: String| DsseError::Certificate {
            name: name.to_string(),
            what,
        };
        let Some(leaf) = chain.first() else {
            return Err(err("no certificate".into()));
        };
        let leaf_der = CertificateDer::from(leaf.as_slice());
        let intermediates: Vec<CertificateDer<'_>> = chain[1..]
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let ee =
            webpki::EndEntityCert::try_from(&leaf_der).map_err(|e| err(format!("does not parse: {e}")))?;
        let key_usage = match usage {
            Usage::Agent => webpki::KeyUsage::server_auth(),
            Usage::Coordinator => webpki::KeyUsage::client_auth(),
        };
        ee.verify_for_usage(
            &ALGORITHMS,
            &self.anchors,
            &intermediates,
            now,
            key_usage,
            None,
            None,
        )
        .map_err(|e| err(format!("does not chain to the CA for its role: {e}")))?;
        // webpki accepts a leaf without the extended-key-usage extension for any usage:
        // the role's usage must be there and the other role's absent
        let (_, parsed) = <x509_parser::prelude::X509Certificate as x509_parser::prelude::FromDer<
            '_,
            x509_parser::error::X509Error,
        >>::from_der(leaf)
        .map_err(|e| err(format!("does not parse: {e}")))?;
        let ok = match parsed.extended_key_usage() {
            // anyExtendedKeyUsage would also make an agent's certificate a client's
            Ok(Some(e)) if e.value.any => false,
            Ok(Some(e)) => match usage {
                Usage::Agent => e.value.server_auth && !e.value.client_auth,
                Usage::Coordinator => e.value.client_auth && !e.value.server_auth,
            },
            _ => false,
        };
        if !ok {
            let want = match usage {
                Usage::Agent => "an agent's (ServerAuth, not ClientAuth nor anyExtendedKeyUsage)",
                Usage::Coordinator => "a coordinator's (ClientAuth, not ServerAuth nor anyExtendedKeyUsage)",
            };
            return Err(err(format!("its extended key usage is not {want}")));
        }
        let server_name = ServerName::try_from(name).map_err(|_| err("the name is not a DNS name".into()))?;
        ee.verify_is_valid_for_subject_name(&server_name)
            .map_err(|_| err("the certificate is not valid for that name".into()))?;
        // a signer's name is one of its certificate's DNS names, byte for byte: a
        // wildcard (`*.zone.example`) would let one certificate sign as every name
        // under it, and names are who signed (docs/evidence.md)
        if !crate::seal::dns_names(leaf).iter().any(|n| n == name) {
            return Err(err(
                "the name is not one of the certificate's DNS names (a wildcard does not name a signer)"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, Role};
    use crate::seal::certificates_from_pem;

    #[test]
    fn pae_matches_the_dsse_reference_vector() {
        let got = pae("http://example.com/HelloWorld", b"hello world");
        assert_eq!(
            got,
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        // lengths are bytes, not characters
        assert_eq!(pae("t", "é".as_bytes()), b"DSSEv1 1 t 2 \xc3\xa9".to_vec());
    }

    struct Party {
        name: &'static str,
        signer: TlsSigner,
        chain: Vec<Vec<u8>>,
    }

    fn party(ca: &Ca, name: &'static str, role: Role) -> Party {
        let pem = ca.issue(name, role, &[]).unwrap();
        Party {
            name,
            signer: TlsSigner::from_pem(pem.key.as_bytes()).unwrap(),
            chain: certificates_from_pem(pem.cert.as_bytes()).unwrap(),
        }
    }

    #[test]
    fn a_signed_envelope_verifies_and_any_changed_byte_does_not() {
        let ca = Ca::generate("test ca").unwrap();
        let a = party(&ca, "agent-a", Role::Server);
        let b = party(&ca, "agent-b", Role::Server);
        let payload = br#"{"run_id":"r1","buckets":[]}"#;
        let env = Envelope::sign(AGENT_RESULT, payload, a.name, &a.signer).unwrap();
        // survives a JSON round trip unchanged
        let text = serde_json::to_string(&env).unwrap();
        assert!(
            text.starts_with(r#"{"payloadType":"application/vnd.tally.agent-result.v1+json","payload":""#)
        );
        let env: Envelope = serde_json::from_str(&text).unwrap();
        assert_eq!(
            env.verify(AGENT_RESULT, a.name, &a.chain[0]).unwrap(),
            payload.to_vec()
        );

        // another certificate, another keyid, another type
        assert_eq!(
            env.verify(AGENT_RESULT, a.name, &b.chain[0]),
            Err(DsseError::BadSignature("agent-a".into()))
        );
        assert_eq!(
            env.verify(AGENT_RESULT, b.name, &b.chain[0]),
            Err(DsseError::NoSignature("agent-b".into()))
        );
        assert!(matches!(
            env.verify(CHECKPOINT, a.name, &a.chain[0]),
            Err(DsseError::PayloadType { .. })
        ));

        // a changed payload byte
        let mut bytes = payload.to_vec();
        bytes[3] ^= 1;
        let forged = Envelope {
            payload: STANDARD.encode(&bytes),
            ..env.clone()
        };
        assert_eq!(
            forged.verify(AGENT_RESULT, a.name, &a.chain[0]),
            Err(DsseError::BadSignature("agent-a".into()))
        );
        // the same signature under another payload type: PAE binds the type
        let retyped = Envelope {
            payload_type: CHECKPOINT.into(),
            ..env.clone()
        };
        assert_eq!(
            retyped.verify(CHECKPOINT, a.name, &a.chain[0]),
            Err(DsseError::BadSignature("agent-a".into()))
        );
        // a second encoding of the same bytes is refused: "QR==" would be "A" with
        // non-zero trailing bits ("QQ==" is its one encoding)
        assert_eq!(STANDARD.decode("QQ==").unwrap(), b"A");
        let sloppy = Envelope {
            payload: "QR==".into(),
            ..env.clone()
        };
        assert_eq!(
            sloppy.verify(AGENT_RESULT, a.name, &a.chain[0]),
            Err(DsseError::Base64 { field: "payload" })
        );
        let padded = Envelope {
            payload: format!("{} ", env.payload),
            ..env
        };
        assert_eq!(
            padded.verify(AGENT_RESULT, a.name, &a.chain[0]),
            Err(DsseError::Base64 { field: "payload" })
        );
    }

    #[test]
    fn certificates_must_chain_to_the_ca_with_their_role_and_name() {
        let ca = Ca::generate("test ca").unwrap();
        let other = Ca::generate("other ca").unwrap();
        let checker = CertificateChecker::from_ca_pem(ca.pem.cert.as_bytes()).unwrap();
        let now = UnixTime::now();
        let agent = party(&ca, "agent-a", Role::Server);
        let coordinator = party(&ca, "coordinator", Role::Client);
        let stranger = party(&other, "agent-a", Role::Server);
        checker.check(&agent.chain, "agent-a", Usage::Agent, now).unwrap();
        checker
            .check(&coordinator.chain, "coordinator", Usage::Coordinator, now)
            .unwrap();
        let refused = |chain: &[Vec<u8>], name: &str, usage: Usage| {
            checker.check(chain, name, usage, now).unwrap_err().to_string()
        };
        assert!(refused(&stranger.chain, "agent-a", Usage::Agent).contains("does not chain"));
        assert!(refused(&agent.chain, "agent-b", Usage::Agent).contains("not valid for that name"));
        assert!(refused(&coordinator.chain, "coordinator", Usage::Agent).contains("does not chain"));
        assert!(refused(&agent.chain, "agent-a", Usage::Coordinator).contains("does not chain"));
        assert!(refused(&[], "agent-a", Usage::Agent).contains("no certificate"));
        // anyExtendedKeyUsage besides the role's own is refused for either role
        use crate::pki::ExtendedKeyUsagePurpose as Eku;
        for (role, eku, usage) in [
            (Role::Server, Eku::ServerAuth, Usage::Agent),
            (Role::Client, Eku::ClientAuth, Usage::Coordinator),
        ] {
            let pem = ca
                .issue_with_usages("agent-a", role, &[], vec![eku, Eku::Any])
                .unwrap();
            let chain = certificates_from_pem(pem.cert.as_bytes()).unwrap();
            assert!(refused(&chain, "agent-a", usage).contains("anyExtendedKeyUsage"));
        }
        // a wildcard certificate names no signer: TLS would accept it for dc1.zone.test,
        // and it would sign as any agent under the zone
        let pem = ca
            .issue("gateway.zone.test", Role::Server, &["*.zone.test".to_string()])
            .unwrap();
        let wild = Party {
            name: "gateway.zone.test",
            signer: TlsSigner::from_pem(pem.key.as_bytes()).unwrap(),
            chain: certificates_from_pem(pem.cert.as_bytes()).unwrap(),
        };
        assert_eq!(wild.name, "gateway.zone.test");
        checker.check(&wild.chain, wild.name, Usage::Agent, now).unwrap();
        assert!(
            refused(&wild.chain, "dc1.zone.test", Usage::Agent)
                .contains("not one of the certificate's DNS names"),
            "{}",
            refused(&wild.chain, "dc1.zone.test", Usage::Agent)
        );
    }
}
