//! The agent's side of sealed checksums (DESIGN §4.1): its zone key, signed once at
//! start with its TLS key, and the per-request check of a seal that yields the run's
//! hasher. Stateless: the run key is derived again for every request.

use tally_common::checksum::{HashMethod, Hasher};
use tally_common::seal::{
    Party, PeerVerifier, SignedZoneKey, TlsSigner, ZoneSecret, certificates_from_pem, derive_run_keys,
    dns_names, sign_zone_key,
};
use tally_common::wire::Seal;

use crate::config::{Policy, TlsConfig};
use crate::error::AgentError;
use crate::policy::deny;

/// The name this agent signs as (sealed runs' zone key, signed answers): `tls.name`,
/// which must be a DNS name of its certificate, else the certificate's first DNS name.
pub fn tls_name(cfg: &TlsConfig, chain: &[Vec<u8>]) -> Result<String, AgentError> {
    let names = dns_names(&chain[0]);
    match &cfg.name {
        Some(n) if names.contains(n) => Ok(n.clone()),
        Some(n) => Err(AgentError::Config(format!(
            "tls.name: {n:?} is not a DNS name of {} ({}); a peer checks the name against the certificate",
            cfg.cert.display(),
            names.join(", ")
        ))),
        None => names.first().cloned().ok_or_else(|| {
            AgentError::Config(format!(
                "{} has no DNS name (SAN) to sign as: verifiers check the name against \
                 the certificate's DNS names, never its common name",
                cfg.cert.display()
            ))
        }),
    }
}

/// What this agent signs its Aggregate and RowDigests answers with (DESIGN §12): the
/// key of its TLS certificate, as the name [`tls_name`] gives.
pub struct Identity {
    pub name: String,
    signer: TlsSigner,
    /// The certificate file as configured (leaf first, then intermediates).
    pub certificate_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Identity {
    pub fn load(cfg: &TlsConfig) -> Result<Identity, AgentError> {
        let cert = read(&cfg.cert, "cert")?;
        let chain = certificates_from_pem(&cert)
            .map_err(|e| AgentError::Config(format!("tls.cert: {}: {e}", cfg.cert.display())))?;
        let name = tls_name(cfg, &chain)?;
        let signer = TlsSigner::from_pem(&read(&cfg.key, "key")?)
            .map_err(|e| AgentError::Config(format!("tls.key: {e}")))?;
        let certificate_pem = String::from_utf8(cert)
            .map_err(|_| AgentError::Config(format!("tls.cert: {}: not PEM text", cfg.cert.display())))?;
        Ok(Identity {
            name,
            signer,
            certificate_pem,
        })
    }

    /// An identity from PEM texts (tests and embedded agents).
    pub fn from_pem(name: &str, certificate_pem: &str, key_pem: &str) -> Result<Identity, AgentError> {
        let signer = TlsSigner::from_pem(key_pem.as_bytes())
            .map_err(|e| AgentError::Config(format!("tls.key: {e}")))?;
        Ok(Identity {
            name: name.to_string(),
            signer,
            certificate_pem: certificate_pem.to_string(),
        })
    }

    /// Signs `payload` (whose `agent` must be this agent's name).
    pub fn sign(
        &self,
        payload: &tally_common::evidence::AgentResult,
    ) -> Result<tally_common::dsse::Envelope, AgentError> {
        debug_assert_eq!(payload.agent, self.name);
        payload
            .sign(&self.signer)
            .map_err(|e| AgentError::Sign(e.to_string()))
    }
}

/// This agent's zone identity.
pub struct Zone {
    pub name: String,
    secret: ZoneSecret,
    pub signed: SignedZoneKey,
    peers: PeerVerifier,
}

impl std::fmt::Debug for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zone")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, AgentError> {
    std::fs::read(path).map_err(|e| AgentError::Config(format!("tls.{what}: {}: {e}", path.display())))
}

impl Zone {
    /// Loads `tls.zone_key` and signs its public half; `None` without a zone key.
    pub fn load(cfg: &TlsConfig) -> Result<Option<Zone>, AgentError> {
        let Some(path) = &cfg.zone_key else {
            return Ok(None);
        };
        let secret = ZoneSecret::load(path).map_err(|e| AgentError::Config(format!("tls.zone_key: {e}")))?;
        let chain = certificates_from_pem(&read(&cfg.cert, "cert")?)
            .map_err(|e| AgentError::Config(format!("tls.cert: {}: {e}", cfg.cert.display())))?;
        let name = tls_name(cfg, &chain)?;
        let signer = TlsSigner::from_pem(&read(&cfg.key, "key")?)
            .map_err(|e| AgentError::Config(format!("tls.key: {e}")))?;
        let signed = sign_zone_key(&name, &secret, &signer, chain)
            .map_err(|e| AgentError::Config(format!("tls.key: {e}")))?;
        let peer_ca = cfg.peer_ca();
        let peers = PeerVerifier::from_ca_pem(&read(peer_ca, "peer_ca")?)
            .map_err(|e| AgentError::Config(format!("tls.peer_ca: {}: {e}", peer_ca.display())))?;
        Ok(Some(Zone {
            name,
            secret,
            signed,
            peers,
        }))
    }

    /// Checks a seal's peer (its structure was checked on the wire) and derives the
    /// run's keys.
    fn keys(
        &self,
        seal: &Seal,
        policy: &Policy,
        dataset: &str,
    ) -> Result<tally_common::seal::RunKeys, AgentError> {
        let peer = &seal.peer;
        let peer_dataset = seal.peer_dataset.as_str();
        if let Some(allowed) = &policy.peers
            && !allowed
                .iter()
                .any(|p| p == &peer.agent || *p == format!("{}/{peer_dataset}", peer.agent))
        {
            return Err(deny(
                dataset,
                "peers",
                format!(
                    "dataset {peer_dataset} of agent {:?} is not a peer this dataset may be reconciled with",
                    peer.agent
                ),
            ));
        }
        self.peers
            .verify(peer)
            .map_err(|e| AgentError::Seal(e.to_string()))?;
        // the keys bind both agents and both datasets: no other pair of datasets, on
        // these agents or this one, shares them. An agent may pair with itself (two of
        // its datasets): X25519 of its own key is as private as any other.
        let me = Party {
            agent: &self.name,
            dataset,
        };
        let them = Party {
            agent: &peer.agent,
            dataset: peer_dataset,
        };
        derive_run_keys(&self.secret, me, them, &peer.public_key, &seal.nonce)
            .map_err(|e| AgentError::Seal(e.to_string()))
    }
}

/// The hasher of one request: a sealed method needs a valid seal; an unsealed one
/// needs the dataset's `allow_unsealed` and no seal (a seal with an unsealed method is
/// a confused request, refused rather than half-honoured).
pub fn hasher(
    zone: Option<&Zone>,
    method: HashMethod,
    seal: Option<&Seal>,
    policy: &Policy,
    dataset: &str,
) -> Result<Hasher, AgentError> {
    match (method.is_sealed(), seal) {
        (true, Some(seal)) => {
            let zone = zone.ok_or_else(|| {
                AgentError::Seal("this agent has no zone key (tls.zone_key), so it cannot seal".into())
            })?;
            Ok(Hasher::sealed(method, &zone.keys(seal, policy, dataset)?))
        }
        (true, None) => Err(AgentError::InvalidArgument(format!(
            "seal: {method} needs the run's seal (nonce and peer zone key)"
        ))),
        (false, Some(_)) => Err(AgentError::InvalidArgument(format!(
            "seal: given with the unsealed method {method}; ask for {}",
            method.sealed()
        ))),
        (false, None) if policy.allow_unsealed => Ok(Hasher::unsealed(method)),
        (false, None) => Err(deny(
            dataset,
            "allow_unsealed",
            format!(
                "unsealed checksums ({method}) can be brute-forced by whoever compares them; this dataset serves {} only",
                method.sealed()
            ),
        )),
    }
}

/// The hasher of a request that names no method (RevealKeys, RevealRows): the key
/// hashes it is given are sealed when a seal comes with it.
pub fn key_hasher(
    zone: Option<&Zone>,
    seal: Option<&Seal>,
    policy: &Policy,
    dataset: &str,
) -> Result<Hasher, AgentError> {
    let method = if seal.is_some() {
        HashMethod::SealedSha256_64
    } else {
        HashMethod::Sha256_64
    };
    hasher(zone, method, seal, policy, dataset)
}
