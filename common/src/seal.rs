//! Sealed checksums (DESIGN §4.1): the two agents of a run derive a run key the
//! coordinator cannot compute, and key every row, key and bucket hash with it.
//!
//! - Each agent has a static X25519 **zone key** ([`ZoneSecret`]), a PKCS#8 PEM file
//!   beside its TLS key (`openssl genpkey -algorithm X25519` writes the same form).
//! - Describe returns its public half signed with the agent's TLS key
//!   ([`SignedZoneKey`]) over `"tally-zone-key/1\n" || agent || "\n" || public key`.
//! - A sealed request carries the run nonce and the **peer's** signed zone key; the
//!   agent checks the peer ([`PeerVerifier`]) and derives [`RunKeys`] statelessly:
//!   `run_key = HKDF-SHA256(ikm = X25519(own, peer), salt = nonce, info =
//!   "tally-run-key/1\n" || lower agent || "\n" || its dataset || "\n" || higher agent ||
//!   "\n" || its dataset)` (the parties ordered by agent name, then dataset), `k_row =
//!   HKDF-Expand(run_key, "row", 32)`, `k_key = HKDF-Expand(run_key, "key", 32)`.

use std::path::Path;
use std::sync::Arc;

use ring::hkdf;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, TrustAnchor, UnixTime};
use rustls::sign::SigningKey;
use rustls::{SignatureScheme, sign::Signer};
use x509_parser::prelude::FromDer;

use crate::segment::{WireError, wire_err};

/// Bytes of a run nonce.
pub const NONCE_LEN: usize = 16;

/// The domain-separation prefix of a zone-key signature.
pub const ZONE_KEY_CONTEXT: &str = "tally-zone-key/1\n";
/// The HKDF info prefix of a run key.
pub const RUN_KEY_CONTEXT: &str = "tally-run-key/1\n";

/// DER prefix of a PKCS#8 X25519 private key (RFC 8410): SEQUENCE, version 0,
/// AlgorithmIdentifier 1.3.101.110, OCTET STRING { OCTET STRING (32 bytes) }.
const PKCS8_X25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04, 0x20,
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("{0}")]
    ZoneKey(String),
    /// The peer's zone key or certificate was refused; the message names why.
    #[error("{0}")]
    Peer(String),
    #[error("signing failed: {0}")]
    Sign(String),
}

/// An agent's static X25519 secret. Never printed.
#[derive(Clone)]
pub struct ZoneSecret([u8; 32]);

impl std::fmt::Debug for ZoneSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZoneSecret(..)")
    }
}

impl ZoneSecret {
    /// A fresh secret from the system's random source.
    pub fn generate() -> Result<ZoneSecret, SealError> {
        let mut k = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
            .map_err(|_| SealError::ZoneKey("the system random source failed".into()))?;
        Ok(ZoneSecret(k))
    }

    pub fn from_bytes(k: [u8; 32]) -> ZoneSecret {
        ZoneSecret(k)
    }

    /// The public half, X25519(k, 9).
    pub fn public(&self) -> [u8; 32] {
        x25519_dalek::x25519(self.0, x25519_dalek::X25519_BASEPOINT_BYTES)
    }

    /// PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as OpenSSL writes X25519 keys.
    pub fn to_pem(&self) -> String {
        let mut der = PKCS8_X25519_PREFIX.to_vec();
        der.extend_from_slice(&self.0);
        pem::encode(&pem::Pem::new("PRIVATE KEY", der))
    }

    pub fn from_pem(text: &[u8]) -> Result<ZoneSecret, SealError> {
        let bad = |why: &str| {
            SealError::ZoneKey(format!(
                "not an X25519 private key ({why}); `tally certs init` writes one, as does \
                 `openssl genpkey -algorithm X25519`"
            ))
        };
        let der = PrivateKeyDer::from_pem_slice(text).map_err(|_| bad("no PEM private key"))?;
        let PrivateKeyDer::Pkcs8(p) = der else {
            return Err(bad("not PKCS#8"));
        };
        let bytes = p.secret_pkcs8_der();
        match bytes.strip_prefix(&PKCS8_X25519_PREFIX[..]) {
            Some(k) if k.len() == 32 => Ok(ZoneSecret(k.try_into().expect("32 bytes"))),
            _ => Err(bad("another algorithm")),
        }
    }

    pub fn load(path: &Path) -> Result<ZoneSecret, SealError> {
        let text = std::fs::read(path).map_err(|e| SealError::ZoneKey(format!("{}: {e}", path.display())))?;
        ZoneSecret::from_pem(&text).map_err(|e| SealError::ZoneKey(format!("{}: {e}", path.display())))
    }

    /// X25519(own, peer), refusing the all-zero result of a low-order point.
    fn shared(&self, peer_public: &[u8; 32]) -> Result<[u8; 32], SealError> {
        let s = x25519_dalek::x25519(self.0, *peer_public);
        if s == [0u8; 32] {
            return Err(SealError::Peer("the peer's zone key is a low-order point".into()));
        }
        Ok(s)
    }
}

/// A fresh run nonce.
pub fn run_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut n)
        .expect("the system random source");
    n
}

/// The bytes a zone-key signature covers.
pub fn zone_key_message(agent: &str, public_key: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(ZONE_KEY_CONTEXT.len() + agent.len() + 33);
    m.extend_from_slice(ZONE_KEY_CONTEXT.as_bytes());
    m.extend_from_slice(agent.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(public_key);
    m
}

/// An agent's public zone key, signed with its TLS key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SignedZoneKey {
    pub agent: String,
    pub public_key: [u8; 32],
    pub signature: Vec<u8>,
    /// DER: the agent's certificate first, then intermediates.
    pub certificates: Vec<Vec<u8>>,
}

impl SignedZoneKey {
    pub fn to_pb(&self) -> tally_proto::v1::ZoneKey {
        tally_proto::v1::ZoneKey {
            agent: self.agent.clone(),
            public_key: self.public_key.to_vec(),
            signature: self.signature.clone(),
            certificates: self.certificates.clone(),
        }
    }

    /// From the wire, naming the field that is malformed.
    pub fn from_pb(z: tally_proto::v1::ZoneKey, field: &str) -> Result<SignedZoneKey, WireError> {
        let public_key: [u8; 32] = z
            .public_key
            .as_slice()
            .try_into()
            .map_err(|_| wire_err(format!("{field}.public_key"), "32 bytes expected"))?;
        if z.agent.is_empty() {
            return Err(wire_err(format!("{field}.agent"), "empty"));
        }
        if z.certificates.is_empty() {
            return Err(wire_err(
                format!("{field}.certificates"),
                "the peer's certificate is missing",
            ));
        }
        if z.signature.is_empty() {
            return Err(wire_err(format!("{field}.signature"), "empty"));
        }
        Ok(SignedZoneKey {
            agent: z.agent,
            public_key,
            signature: z.signature,
            certificates: z.certificates,
        })
    }
}

/// Signatures with the private key of a TLS certificate (ECDSA P-256/P-384 with
/// SHA-256/384, Ed25519, or RSA-PSS with SHA-256), through rustls's ring provider.
pub struct TlsSigner {
    key: Arc<dyn SigningKey>,
}

impl std::fmt::Debug for TlsSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsSigner(..)")
    }
}

const SCHEMES: [SignatureScheme; 4] = [
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ED25519,
    SignatureScheme::RSA_PSS_SHA256,
];

impl TlsSigner {
    pub fn from_pem(key_pem: &[u8]) -> Result<TlsSigner, SealError> {
        let der = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| SealError::Sign(format!("no PEM private key: {e}")))?;
        let key = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| SealError::Sign(format!("unsupported key: {e}")))?;
        Ok(TlsSigner { key })
    }

    fn signer(&self) -> Result<Box<dyn Signer>, SealError> {
        self.key
            .choose_scheme(&SCHEMES)
            .ok_or_else(|| SealError::Sign("the key is not ECDSA P-256/P-384, Ed25519 or RSA".into()))
    }

    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SealError> {
        self.signer()?
            .sign(message)
            .map_err(|e| SealError::Sign(e.to_string()))
    }
}

/// Signs `secret`'s public half for `agent` with the agent's TLS key.
pub fn sign_zone_key(
    agent: &str,
    secret: &ZoneSecret,
    signer: &TlsSigner,
    certificates: Vec<Vec<u8>>,
) -> Result<SignedZoneKey, SealError> {
    let public_key = secret.public();
    Ok(SignedZoneKey {
        agent: agent.to_string(),
        signature: signer.sign(&zone_key_message(agent, &public_key))?,
        public_key,
        certificates,
    })
}

/// The DNS names (SANs) of a DER certificate: the names a zone key may be signed for
/// (a peer checks the name against them, never against the common name).
pub fn dns_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::prelude::X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::prelude::GeneralName::DNSName(d) = n {
                names.push(d.to_string());
            }
        }
    }
    names
}

/// DER certificates of a PEM file's text.
pub fn certificates_from_pem(text: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(text)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate".into());
    }
    Ok(certs)
}

/// Checks a peer's signed zone key: the certificate chains to the trusted CA with the
/// ServerAuth usage (an agent's), is valid for the name the key is signed for, and
/// the signature over the public key is that certificate's.
#[derive(Debug, Clone)]
pub struct PeerVerifier {
    anchors: Vec<TrustAnchor<'static>>,
}

const VERIFY_ALGS: [&dyn rustls::pki_types::SignatureVerificationAlgorithm; 4] = [
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::ED25519,
    webpki::ring::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
];

impl PeerVerifier {
    pub fn from_ca_pem(text: &[u8]) -> Result<PeerVerifier, String> {
        let mut anchors = Vec::new();
        for der in certificates_from_pem(text)? {
            let der = CertificateDer::from(der);
            let a =
                webpki::anchor_from_trusted_cert(&der).map_err(|e| format!("not a CA certificate: {e}"))?;
            anchors.push(a.to_owned());
        }
        Ok(PeerVerifier { anchors })
    }

    pub fn verify(&self, zk: &SignedZoneKey) -> Result<(), SealError> {
        self.verify_at(zk, UnixTime::now())
    }

    pub fn verify_at(&self, zk: &SignedZoneKey, now: UnixTime) -> Result<(), SealError> {
        let peer = |m: String| SealError::Peer(m);
        let leaf = CertificateDer::from(zk.certificates[0].as_slice());
        let intermediates: Vec<CertificateDer<'_>> = zk.certificates[1..]
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let ee = webpki::EndEntityCert::try_from(&leaf)
            .map_err(|e| peer(format!("the peer's certificate does not parse: {e}")))?;
        ee.verify_for_usage(
            &VERIFY_ALGS,
            &self.anchors,
            &intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| {
            peer(format!(
                "the peer's certificate is not an agent certificate of this agent's CA \
                 (chain to tls.peer_ca with ServerAuth): {e}"
            ))
        })?;
        // webpki accepts a leaf without the extended-key-usage extension for any usage;
        // a peer must show it is an agent: ServerAuth present, ClientAuth absent
        let (_, parsed) = x509_parser::prelude::X509Certificate::from_der(&zk.certificates[0])
            .map_err(|e| peer(format!("the peer's certificate does not parse: {e}")))?;
        match parsed.extended_key_usage() {
            Ok(Some(e)) if e.value.server_auth && !e.value.client_auth => {}
            _ => {
                return Err(peer(
                    "the peer's certificate is not an agent certificate: it must carry the ServerAuth \
                     extended key usage and not ClientAuth"
                        .into(),
                ));
            }
        }
        let name = ServerName::try_from(zk.agent.as_str())
            .map_err(|_| peer(format!("the peer name {:?} is not a DNS name", zk.agent)))?;
        ee.verify_is_valid_for_subject_name(&name).map_err(|_| {
            peer(format!(
                "the peer's certificate is not valid for the name {:?} its zone key is signed for",
                zk.agent
            ))
        })?;
        let msg = zone_key_message(&zk.agent, &zk.public_key);
        let ok = VERIFY_ALGS
            .iter()
            .any(|alg| ee.verify_signature(*alg, &msg, &zk.signature).is_ok());
        if !ok {
            return Err(peer(format!(
                "the signature over {:?}'s zone key is not its certificate's",
                zk.agent
            )));
        }
        Ok(())
    }
}

/// The keys of one run, as both agents derive them.
#[derive(Clone, PartialEq, Eq)]
pub struct RunKeys {
    pub k_row: [u8; 32],
    pub k_key: [u8; 32],
}

impl std::fmt::Debug for RunKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunKeys(..)")
    }
}

struct Len32;
impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

fn expand(prk: &hkdf::Prk, info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    prk.expand(&[info], Len32)
        .expect("32 bytes is within HKDF-SHA256's limit")
        .fill(&mut out)
        .expect("32 bytes");
    out
}

/// One side of a run: an agent (the name its zone key is signed for) and its dataset.
/// The run key binds both, so the keys of a run between two datasets are not the keys
/// of any other pair of datasets, on these agents or on one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Party<'a> {
    pub agent: &'a str,
    pub dataset: &'a str,
}

/// The HKDF info of a run key: both parties in byte order (agent, then dataset), so
/// both sides build the same string. Agent names are DNS names and dataset names
/// letters, digits, `-`, `_`, `.`: neither holds a newline.
pub fn run_key_info(a: Party<'_>, b: Party<'_>) -> Vec<u8> {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    format!(
        "{RUN_KEY_CONTEXT}{}\n{}\n{}\n{}",
        lo.agent, lo.dataset, hi.agent, hi.dataset
    )
    .into_bytes()
}

/// The run key itself (exposed for test vectors).
pub fn run_key(
    own: &ZoneSecret,
    me: Party<'_>,
    peer: Party<'_>,
    peer_public: &[u8; 32],
    nonce: &[u8],
) -> Result<[u8; 32], SealError> {
    if nonce.len() != NONCE_LEN {
        return Err(SealError::Peer(format!(
            "the run nonce has {} bytes; {NONCE_LEN} are needed",
            nonce.len()
        )));
    }
    let ikm = own.shared(peer_public)?;
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, nonce).extract(&ikm);
    Ok(expand(&prk, &run_key_info(me, peer)))
}

/// `k_row` and `k_key` of a run (DESIGN §4.1).
pub fn derive_run_keys(
    own: &ZoneSecret,
    me: Party<'_>,
    peer: Party<'_>,
    peer_public: &[u8; 32],
    nonce: &[u8],
) -> Result<RunKeys, SealError> {
    let rk = run_key(own, me, peer, peer_public, nonce)?;
    Ok(keys_of_run_key(&rk))
}

/// `k_row = HKDF-Expand(run_key, "row", 32)`, `k_key = HKDF-Expand(run_key, "key", 32)`.
pub fn keys_of_run_key(run_key: &[u8; 32]) -> RunKeys {
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, run_key);
    RunKeys {
        k_row: expand(&prk, b"row"),
        k_key: expand(&prk, b"key"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_agents_derive_the_same_keys_and_a_third_party_cannot() {
        let (a, b, c) = (
            ZoneSecret::from_bytes([1; 32]),
            ZoneSecret::from_bytes([2; 32]),
            ZoneSecret::from_bytes([3; 32]),
        );
        let nonce = [7u8; 16];
        let p = |agent, dataset| Party { agent, dataset };
        let (dc1, vpc2) = (p("dc1", "orders"), p("vpc2", "orders"));
        let ka = derive_run_keys(&a, dc1, vpc2, &b.public(), &nonce).unwrap();
        let kb = derive_run_keys(&b, vpc2, dc1, &a.public(), &nonce).unwrap();
        assert_eq!(ka, kb);
        assert_ne!(ka.k_row, ka.k_key);
        // another nonce, another peer, other names, other datasets: other keys
        let other =
            |me, peer, public: [u8; 32], nonce: &[u8]| derive_run_keys(&a, me, peer, &public, nonce).unwrap();
        assert_ne!(other(dc1, vpc2, b.public(), &[8u8; 16]), ka);
        assert_ne!(other(dc1, vpc2, c.public(), &nonce), ka);
        assert_ne!(other(dc1, p("vpc3", "orders"), b.public(), &nonce), ka);
        assert_ne!(other(p("dc1", "accounts"), vpc2, b.public(), &nonce), ka);
        assert_ne!(other(dc1, p("vpc2", "accounts"), b.public(), &nonce), ka);
        // the dataset is bound to its agent: swapping which side holds which differs
        assert_ne!(
            run_key_info(p("dc1", "a"), p("vpc2", "b")),
            run_key_info(p("dc1", "b"), p("vpc2", "a"))
        );
        // one agent paired with itself, two datasets: both calls derive the same keys
        assert_eq!(
            other(p("dc1", "x"), p("dc1", "y"), a.public(), &nonce),
            other(p("dc1", "y"), p("dc1", "x"), a.public(), &nonce)
        );
        assert!(derive_run_keys(&a, dc1, vpc2, &b.public(), &[0u8; 15]).is_err());
        // the all-zero point gives an all-zero shared secret: refused
        assert!(derive_run_keys(&a, dc1, vpc2, &[0u8; 32], &nonce).is_err());
    }

    #[test]
    fn only_agent_certificates_of_the_ca_vouch_for_a_peer() {
        use crate::pki::{Ca, ExtendedKeyUsagePurpose as E, Role};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = Ca::generate("seal-test-ca").unwrap();
        let verifier = PeerVerifier::from_ca_pem(ca.pem.cert.as_bytes()).unwrap();
        let secret = ZoneSecret::from_bytes([4; 32]);
        let signed = |leaf: crate::pki::Pem| {
            sign_zone_key(
                "vpc2",
                &secret,
                &TlsSigner::from_pem(leaf.key.as_bytes()).unwrap(),
                certificates_from_pem(leaf.cert.as_bytes()).unwrap(),
            )
            .unwrap()
        };
        let issue = |usages: Vec<E>| ca.issue_with_usages("vpc2", Role::Server, &[], usages).unwrap();
        verifier.verify(&signed(issue(vec![E::ServerAuth]))).unwrap();
        for (what, usages) in [
            ("no extended key usage", vec![]),
            ("ClientAuth only", vec![E::ClientAuth]),
            ("both", vec![E::ServerAuth, E::ClientAuth]),
        ] {
            let e = verifier.verify(&signed(issue(usages))).unwrap_err().to_string();
            assert!(e.contains("not an agent certificate"), "{what}: {e}");
        }
    }

    #[test]
    fn zone_secrets_round_trip_through_pkcs8_pem() {
        let s = ZoneSecret::generate().unwrap();
        let pem = s.to_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(ZoneSecret::from_pem(pem.as_bytes()).unwrap().public(), s.public());
        // an ECDSA key is not a zone key
        let ec = rcgen::KeyPair::generate().unwrap().serialize_pem();
        let e = ZoneSecret::from_pem(ec.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("X25519"), "{e}");
    }

    #[test]
    fn rfc7748_x25519_vector() {
        // RFC 7748 §6.1: Alice's private key and public key
        let a: [u8; 32] = hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            hex::encode(ZoneSecret::from_bytes(a).public()),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }
}
