//! Development PKI for `tally certs init`, tests and the demo: a CA, server
//! certificates for agents and client certificates for the coordinator. Production
//! deployments bring their own PKI (cert-manager, Vault, …); see docs/operations.md.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid certificate name {0:?}: use letters, digits, '-', '_' and '.'")]
    BadName(String),
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

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An agent's gRPC server (also valid as a client, for `tally-agent check` tooling).
    Server,
    /// The coordinator (or any caller) authenticating to agents.
    Client,
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

    /// Issues a leaf named `name` (common name and DNS SAN). Servers also get
    /// `localhost`, `127.0.0.1` and every entry of `extra_sans` (DNS names or IPs).
    pub fn issue(&self, name: &str, role: Role, extra_sans: &[String]) -> Result<Pem, PkiError> {
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
        params.extended_key_usages = match role {
            Role::Server => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(397);
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
/// `coordinator.pem`, `coordinator-key.pem`, and `NAME.pem`, `NAME-key.pem` per agent.
/// An existing CA is reused and existing leaves are kept, so agents can be added later.
pub fn init_dir(out: &Path, agents: &[String], extra_sans: &[String]) -> Result<Vec<FileOutcome>, PkiError> {
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
    let mut leaves: Vec<(&str, Role)> = vec![("coordinator", Role::Client)];
    leaves.extend(agents.iter().map(|a| (a.as_str(), Role::Server)));
    for (name, role) in leaves {
        check_name(name)?;
        let (cert, key) = (
            out.join(format!("{name}.pem")),
            out.join(format!("{name}-key.pem")),
        );
        if cert.exists() && key.exists() {
            outcomes.push(FileOutcome::Kept(cert));
            continue;
        }
        let pem = ca.issue(name, role, extra_sans)?;
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
        init_dir(&dir, &["dc1".into()], &[]).unwrap();
        for f in [
            "ca.pem",
            "ca-key.pem",
            "coordinator.pem",
            "coordinator-key.pem",
            "dc1.pem",
            "dc1-key.pem",
        ] {
            assert!(dir.join(f).exists(), "{f}");
        }
        let ca_before = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let out = init_dir(&dir, &["dc1".into(), "vpc2".into()], &["10.0.0.5".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca_before);
        assert!(out.contains(&FileOutcome::Written(dir.join("vpc2.pem"))));
        assert!(out.contains(&FileOutcome::Kept(dir.join("dc1.pem"))));
        assert!(init_dir(&dir, &["bad name".into()], &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
