//! Development PKI for `tally certs init`, tests and the demo: a CA, server
//! certificates for agents and client certificates for the coordinator. Production
//! deployments bring their own PKI (cert-manager, Vault, …); see docs/operations.md.

use std::path::{Path, PathBuf};

pub use rcgen::ExtendedKeyUsagePurpose;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid certificate name {0:?}: use letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("invalid --agent {0:?}: expected NAME or NAME=SAN1,SAN2 (DNS names or IP addresses)")]
    BadAgent(String),
}

/// A PEM certificate and its PEM private key.
#[derive(Debug, Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A certificate authority able to issue leaves.
pub struct Ca {
    pub pem: Pem,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// What a leaf certificate is for (DESIGN §2): each role's extended key usage is the
/// only one it carries, so an agent's certificate cannot call another agent and the
/// coordinator's cannot serve as an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An agent's gRPC server: ServerAuth only.
    Server,
    /// The coordinator (or any caller) authenticating to agents: ClientAuth only.
    Client,
}

/// One agent of `tally certs init`: its name and the extra names (DNS or IP) its
/// server certificate is valid for, from `--agent NAME=SAN1,SAN2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLeaf {
    pub name: String,
    pub sans: Vec<String>,
}

impl AgentLeaf {
    pub fn new(name: impl Into<String>) -> AgentLeaf {
        AgentLeaf {
            name: name.into(),
            sans: Vec::new(),
        }
    }

    /// Parses `NAME` or `NAME=SAN1,SAN2`.
    pub fn parse(arg: &str) -> Result<AgentLeaf, PkiError> {
        let bad = || PkiError::BadAgent(arg.to_string());
        let (name, sans) = match arg.split_once('=') {
            None => (arg, Vec::new()),
            Some((name, list)) => {
                let sans: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                if sans
                    .iter()
                    .any(|s| s.is_empty() || s.contains(char::is_whitespace))
                {
                    return Err(bad());
                }
                (name, sans)
            }
        };
        check_name(name).map_err(|_| bad())?;
        Ok(AgentLeaf {
            name: name.to_string(),
            sans,
        })
    }
}

fn check_name(name: &str) -> Result<(), PkiError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(PkiError::BadName(name.to_string()));
    }
    Ok(())
}

impl Ca {
    pub fn generate(common_name: &str) -> Result<Ca, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Tally development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(825);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            pem: Pem {
                cert: cert.pem(),
                key: key.serialize_pem(),
            },
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads an existing CA (as written by [`Ca::generate`]) to issue more leaves.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(Ca {
            pem: Pem {
                cert: cert_pem.to_string(),
                key: key_pem.to_string(),
            },
            issuer: Issuer::from_ca_cert_pem(cert_pem, key)?,
        })
    }

    /// Issues a leaf named `name` (common name and DNS SAN) with `extra_sans` (DNS
    /// names or IPs). Servers also get `localhost` and `127.0.0.1`.
    pub fn issue(&self, name: &str, role: Role, extra_sans: &[String]) -> Result<Pem, PkiError> {
        let usages = match role {
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        self.issue_with_usages(name, role, extra_sans, usages)
    }

    /// [`Ca::issue`] with any extended key usages (none, or both): the certificates
    /// other PKIs issue, for tests of what agents refuse.
    pub fn issue_with_usages(
        &self,
        name: &str,
        role: Role,
        extra_sans: &[String],
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<Pem, PkiError> {
        let now = time::OffsetDateTime::now_utc();
        let validity = (now - time::Duration::hours(1), now + time::Duration::days(397));
        self.leaf(name, role, extra_sans, usages, validity)
    }

    /// [`Ca::issue`] valid from `not_before` to `not_after`: an expired (or not yet
    /// valid) certificate, for tests of what agents refuse.
    pub fn issue_valid(
        &self,
        name: &str,
        role: Role,
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Result<Pem, PkiError> {
        let usages = match role {
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        self.leaf(name, role, &[], usages, (not_before, not_after))
    }

    fn leaf(
        &self,
        name: &str,
        role: Role,
        extra_sans: &[String],
        usages: Vec<ExtendedKeyUsagePurpose>,
        (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
    ) -> Result<Pem, PkiError> {
        check_name(name)?;
        let mut sans = vec![name.to_string()];
        if role == Role::Server {
            sans.push("localhost".into());
            sans.push("127.0.0.1".into());
        }
        for s in extra_sans {
            if !sans.contains(s) {
                sans.push(s.clone());
            }
        }
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(s.as_str().try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// What `certs init` did with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    Written(PathBuf),
    Kept(PathBuf),
}

fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, contents).map_err(io)?;
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    let _ = private;
    Ok(())
}

/// Writes the layout of DESIGN §11 into `out`: `ca.pem`, `ca-key.pem`,
/// `coordinator.pem`, `coordinator-key.pem` (ClientAuth), and `NAME.pem`, `NAME-key.pem`
/// per agent (ServerAuth, valid for its name, localhost, 127.0.0.1 and its own SANs
/// only), with `NAME-zone.key`, the agent's X25519 zone key for sealed checksums
/// (DESIGN §4.1). An existing CA is reused and existing leaves and zone keys are kept,
/// so agents can be added later.
pub fn init_dir(out: &Path, agents: &[AgentLeaf]) -> Result<Vec<FileOutcome>, PkiError> {
    let io = |source| PkiError::Io {
        path: out.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(out).map_err(io)?;
    let mut outcomes = Vec::new();
    let (ca_cert, ca_key) = (out.join("ca.pem"), out.join("ca-key.pem"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| PkiError::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        outcomes.push(FileOutcome::Kept(ca_cert.clone()));
        Ca::from_pem(&read(&ca_cert)?, &read(&ca_key)?)?
    } else {
        let ca = Ca::generate("tally-dev-ca")?;
        write_new(&ca_cert, &ca.pem.cert, false)?;
        write_new(&ca_key, &ca.pem.key, true)?;
        outcomes.push(FileOutcome::Written(ca_cert));
        ca
    };
    let mut leaves: Vec<(&str, Role, &[String])> = vec![("coordinator", Role::Client, &[])];
    leaves.extend(
        agents
            .iter()
            .map(|a| (a.name.as_str(), Role::Server, a.sans.as_slice())),
    );
    for (name, role, sans) in leaves {
        check_name(name)?;
        let (cert, key) = (
            out.join(format!("{name}.pem")),
            out.join(format!("{name}-key.pem")),
        );
        if cert.exists() && key.exists() {
            outcomes.push(FileOutcome::Kept(cert));
            continue;
        }
        let pem = ca.issue(name, role, sans)?;
        write_new(&cert, &pem.cert, false)?;
        write_new(&key, &pem.key, true)?;
        outcomes.push(FileOutcome::Written(cert));
    }
    for a in agents {
        let zone = out.join(format!("{}-zone.key", a.name));
        if zone.exists() {
            outcomes.push(FileOutcome::Kept(zone));
            continue;
        }
        let secret = crate::seal::ZoneSecret::generate().map_err(|e| PkiError::Io {
            path: zone.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        write_new(&zone, &secret.to_pem(), true)?;
        outcomes.push(FileOutcome::Written(zone));
    }
    Ok(outcomes)
}

/// The notAfter of the first certificate of a PEM file, RFC 3339 (`None` when it does
/// not parse): what a message about an expired certificate shows.
pub fn pem_not_after(pem: &[u8]) -> Option<String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, cert) = X509Certificate::from_der(&block.contents).ok()?;
    let t = time::OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()?;
    t.format(&time::format_description::well_known::Rfc3339).ok()
}

/// The names a certificate is known by: its DNS SANs, or its common name when it has
/// no subject alternative name at all (RFC 6125: the CN is ignored where SANs name the
/// subject, also when they are IP addresses or e-mail addresses only). The agent
/// matches `allowed_clients` and the coordinator's API matches `api.clients` with it.
pub fn cert_names(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    match cert.subject_alternative_name() {
        Ok(Some(san)) => {
            for n in &san.value.general_names {
                if let GeneralName::DNSName(d) = n {
                    names.push(d.to_string());
                }
            }
            return names;
        }
        Ok(None) => {}
        // an unreadable SAN extension names nothing
        Err(_) => return names,
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            names.push(s.to_string());
        }
    }
    names
}

/// The coordinator API's own server certificate in `out` (DESIGN §2): ServerAuth only,
/// valid for `localhost`, `127.0.0.1` and `sans`, issued by a CA of its own,
/// `api-ca.pem` (written beside the agents' CA, reused when present). Not by the agents'
/// CA: an agent accepts any ServerAuth certificate of its CA as a sealed-run peer, and
/// the coordinator must never hold one. Written as `coordinator-api.pem` and
/// `coordinator-api-key.pem`; an existing pair is kept. API clients verify the server
/// with `api-ca.pem`.
pub fn init_api_cert(out: &Path, sans: &[String]) -> Result<FileOutcome, PkiError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|source| PkiError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    let (cert, key) = (
        out.join("coordinator-api.pem"),
        out.join("coordinator-api-key.pem"),
    );
    if cert.exists() && key.exists() {
        return Ok(FileOutcome::Kept(cert));
    }
    let (ca_cert, ca_key) = (out.join("api-ca.pem"), out.join("api-ca-key.pem"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        Ca::from_pem(&read(&ca_cert)?, &read(&ca_key)?)?
    } else {
        let ca = Ca::generate("tally-dev-api-ca")?;
        write_new(&ca_cert, &ca.pem.cert, false)?;
        write_new(&ca_key, &ca.pem.key, true)?;
        ca
    };
    let pem = ca.issue("coordinator-api", Role::Server, sans)?;
    write_new(&cert, &pem.cert, false)?;
    write_new(&key, &pem.key, true)?;
    Ok(FileOutcome::Written(cert))
}

/// Peer certificates of a `tally serve` group (`cluster.tls`), one per replica:
/// `peer-NAME.pem` and `peer-NAME-key.pem`, with ServerAuth and ClientAuth (each replica
/// serves its peers and calls them), valid for NAME, localhost, 127.0.0.1 and its own SANs,
/// issued by a CA of their own, `peer-ca.pem` (reused when present): not the agents' CA,
/// whose ServerAuth certificates agents accept as sealed-run peers, nor the API's.
/// Existing pairs are kept.
pub fn init_peer_certs(out: &Path, peers: &[AgentLeaf]) -> Result<Vec<FileOutcome>, PkiError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|source| PkiError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    std::fs::create_dir_all(out).map_err(|source| PkiError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let mut outcomes = Vec::new();
    let (ca_cert, ca_key) = (out.join("peer-ca.pem"), out.join("peer-ca-key.pem"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        outcomes.push(FileOutcome::Kept(ca_cert.clone()));
        Ca::from_pem(&read(&ca_cert)?, &read(&ca_key)?)?
    } else {
        let ca = Ca::generate("tally-dev-peer-ca")?;
        write_new(&ca_cert, &ca.pem.cert, false)?;
        write_new(&ca_key, &ca.pem.key, true)?;
        outcomes.push(FileOutcome::Written(ca_cert));
        ca
    };
    for p in peers {
        check_name(&p.name)?;
        let (cert, key) = (
            out.join(format!("peer-{}.pem", p.name)),
            out.join(format!("peer-{}-key.pem", p.name)),
        );
        if cert.exists() && key.exists() {
            outcomes.push(FileOutcome::Kept(cert));
            continue;
        }
        let usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let pem = ca.issue_with_usages(&p.name, Role::Server, &p.sans, usages)?;
        write_new(&cert, &pem.cert, false)?;
        write_new(&key, &pem.key, true)?;
        outcomes.push(FileOutcome::Written(cert));
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_dir_writes_the_documented_layout_and_reuses_the_ca() {
        let dir = std::env::temp_dir().join(format!("tally-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        init_dir(&dir, &[AgentLeaf::new("dc1")]).unwrap();
        for f in [
            "ca.pem",
            "ca-key.pem",
            "coordinator.pem",
            "coordinator-key.pem",
            "dc1.pem",
            "dc1-key.pem",
            "dc1-zone.key",
        ] {
            assert!(dir.join(f).exists(), "{f}");
        }
        let ca_before = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let out = init_dir(
            &dir,
            &[AgentLeaf::new("dc1"), AgentLeaf::parse("vpc2=10.0.0.5").unwrap()],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca_before);
        assert!(out.contains(&FileOutcome::Written(dir.join("vpc2.pem"))));
        assert!(out.contains(&FileOutcome::Kept(dir.join("dc1.pem"))));
        assert!(out.contains(&FileOutcome::Kept(dir.join("dc1-zone.key"))));
        assert!(out.contains(&FileOutcome::Written(dir.join("vpc2-zone.key"))));
        let zone = std::fs::read(dir.join("vpc2-zone.key")).unwrap();
        crate::seal::ZoneSecret::from_pem(&zone).unwrap();
        assert!(init_dir(&dir, &[AgentLeaf::new("bad name")]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn leaf(pem: &str) -> x509_parser::pem::Pem {
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap().1
    }

    /// (DNS and IP SANs, ServerAuth, ClientAuth) of a PEM certificate.
    fn usage(pem: &str) -> (Vec<String>, bool, bool) {
        use x509_parser::prelude::GeneralName;
        let p = leaf(pem);
        let cert = p.parse_x509().unwrap();
        let sans = cert
            .subject_alternative_name()
            .unwrap()
            .map(|s| {
                s.value
                    .general_names
                    .iter()
                    .map(|n| match n {
                        GeneralName::DNSName(d) => d.to_string(),
                        GeneralName::IPAddress(ip) => format!("ip:{ip:?}"),
                        other => format!("{other:?}"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        (sans, eku.server_auth, eku.client_auth)
    }

    #[test]
    fn agent_leaves_serve_only_and_carry_only_their_own_sans() {
        let dir = tempfile::tempdir().unwrap();
        let agents = [
            AgentLeaf::parse("a=agent-a.internal,10.0.0.5").unwrap(),
            AgentLeaf::parse("b=agent-b.internal").unwrap(),
        ];
        init_dir(dir.path(), &agents).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        let (a, a_server, a_client) = usage(&read("a.pem"));
        assert!(a_server && !a_client, "agent leaves are ServerAuth only");
        assert!(a.contains(&"a".to_string()) && a.contains(&"localhost".to_string()));
        assert!(a.contains(&"agent-a.internal".to_string()));
        assert!(
            a.iter()
                .any(|s| s.starts_with("ip:") && s.contains("10, 0, 0, 5")),
            "{a:?}"
        );
        assert!(!a.iter().any(|s| s.contains("agent-b")), "{a:?}");
        let (b, _, _) = usage(&read("b.pem"));
        assert!(
            !b.iter()
                .any(|s| s.contains("agent-a") || s.contains("10, 0, 0, 5")),
            "{b:?}"
        );
        let (c, c_server, c_client) = usage(&read("coordinator.pem"));
        assert!(c_client && !c_server, "the coordinator is ClientAuth only");
        assert_eq!(c, vec!["coordinator".to_string()]);
    }

    #[test]
    fn agent_arguments_parse() {
        assert_eq!(AgentLeaf::parse("dc1").unwrap(), AgentLeaf::new("dc1"));
        assert_eq!(
            AgentLeaf::parse("dc1=h.example,10.0.0.5").unwrap().sans,
            vec!["h.example".to_string(), "10.0.0.5".to_string()]
        );
        for bad in ["", "=h", "dc1=", "dc1=a,,b", "bad name=h", "dc1=a b"] {
            assert!(AgentLeaf::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_api_certificate_serves_only_and_carries_the_api_sans() {
        let dir = tempfile::tempdir().unwrap();
        init_dir(dir.path(), &[AgentLeaf::new("dc1")]).unwrap();
        let sans = ["tally.example".to_string(), "10.0.0.9".to_string()];
        let out = init_api_cert(dir.path(), &sans).unwrap();
        assert_eq!(out, FileOutcome::Written(dir.path().join("coordinator-api.pem")));
        assert!(dir.path().join("coordinator-api-key.pem").exists());
        let (names, server, client) =
            usage(&std::fs::read_to_string(dir.path().join("coordinator-api.pem")).unwrap());
        assert!(server && !client, "the API certificate is ServerAuth only");
        for n in ["localhost", "tally.example"] {
            assert!(names.contains(&n.to_string()), "{names:?}");
        }
        assert!(
            names.iter().any(|s| s.contains("127, 0, 0, 1"))
                && names.iter().any(|s| s.contains("10, 0, 0, 9"))
        );
        assert_eq!(
            init_api_cert(dir.path(), &[]).unwrap(),
            FileOutcome::Kept(dir.path().join("coordinator-api.pem"))
        );
        // issued by its own CA, never the agents': agents accept any ServerAuth
        // certificate of their CA as a sealed-run peer
        let api = std::fs::read_to_string(dir.path().join("coordinator-api.pem")).unwrap();
        let issuer = |pem: &str| leaf(pem).parse_x509().unwrap().issuer().to_string();
        let agents_ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
        let api_ca = std::fs::read_to_string(dir.path().join("api-ca.pem")).unwrap();
        assert_eq!(
            issuer(&api),
            leaf(&api_ca).parse_x509().unwrap().subject().to_string()
        );
        assert_ne!(
            issuer(&api),
            leaf(&agents_ca).parse_x509().unwrap().subject().to_string()
        );
        let verifier = crate::seal::PeerVerifier::from_ca_pem(agents_ca.as_bytes()).unwrap();
        let signer = crate::seal::TlsSigner::from_pem(
            std::fs::read(dir.path().join("coordinator-api-key.pem"))
                .unwrap()
                .as_slice(),
        )
        .unwrap();
        let zk = crate::seal::sign_zone_key(
            "coordinator-api",
            &crate::seal::ZoneSecret::from_bytes([3; 32]),
            &signer,
            crate::seal::certificates_from_pem(api.as_bytes()).unwrap(),
        )
        .unwrap();
        assert!(
            verifier.verify(&zk).is_err(),
            "the API certificate passed as an agent peer"
        );
    }
}
