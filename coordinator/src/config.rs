//! The coordinator config (DESIGN §11). It knows agents by name and endpoint and holds
//! its own TLS identity; there is no key that could hold a database URL or password,
//! and unknown keys are errors. `api` configures `tally serve`'s HTTPS API (DESIGN
//! §12): its server certificate and who may call it in which role; bearer tokens are
//! held only as SHA-256 hashes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tally_common::config_file::{ConfigError, load_yaml, relative_to};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// `tally serve` only.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// `tally serve` only: the run log (and an earlier version's run store).
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    pub tls: ClientTls,
    pub agents: BTreeMap<String, AgentRef>,
    /// `tally serve` only: the HTTPS API.
    #[serde(default)]
    pub api: ApiConfig,
    /// `tally serve` only: this replica's place in a Raft group (cluster_config.rs);
    /// without it `tally serve` is a single node.
    #[serde(default)]
    pub cluster: Option<crate::cluster_config::ClusterConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// The API's own server certificate; required unless `--insecure-loopback`.
    #[serde(default)]
    pub tls: Option<ApiTls>,
    /// Client certificates (verified against `tls.ca`) by DNS SAN, and their roles.
    #[serde(default)]
    pub clients: Vec<ApiClient>,
    /// Bearer tokens by name: only the SHA-256 of each token, in hex.
    #[serde(default)]
    pub tokens: Vec<ApiToken>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA of client certificates; without it the API asks for none.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiClient {
    /// A DNS name of the client's certificate (its common name when it has none).
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// Who holds the token: the actor of its audit events.
    pub name: String,
    /// `printf %s "$TOKEN" | sha256sum`: 64 hex digits.
    pub sha256: String,
    pub role: Role,
}

/// The API roles of DESIGN §12, each including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs and results without keys or values.
    Viewer,
    /// + start and cancel runs, results with keys.
    Operator,
    /// + the audit log.
    Auditor,
    /// Everything.
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Auditor => "auditor",
            Role::Admin => "admin",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRef {
    pub endpoint: String,
}

impl CoordinatorConfig {
    pub fn load(path: &Path) -> Result<CoordinatorConfig, ConfigError> {
        let mut cfg: CoordinatorConfig = load_yaml(path)?;
        cfg.validate(path)?;
        cfg.tls.ca = relative_to(path, &cfg.tls.ca);
        cfg.tls.cert = relative_to(path, &cfg.tls.cert);
        cfg.tls.key = relative_to(path, &cfg.tls.key);
        cfg.data_dir = cfg.data_dir.map(|d| relative_to(path, &d));
        if let Some(t) = &mut cfg.api.tls {
            t.cert = relative_to(path, &t.cert);
            t.key = relative_to(path, &t.key);
            t.ca = t.ca.as_ref().map(|c| relative_to(path, c));
        }
        if let Some(c) = &mut cfg.cluster {
            c.resolve_paths(path);
        }
        Ok(cfg)
    }

    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        if self.agents.is_empty() {
            return Err(ConfigError::invalid(
                file,
                "agents",
                "at least one agent is needed",
            ));
        }
        for (name, a) in &self.agents {
            if !a.endpoint.starts_with("https://") {
                return Err(ConfigError::invalid(
                    file,
                    format!("agents.{name}.endpoint"),
                    "must be an https:// URL: agents speak mutual TLS only",
                ));
            }
            let rest = &a.endpoint["https://".len()..];
            if rest.is_empty() || !rest.contains(':') {
                return Err(ConfigError::invalid(
                    file,
                    format!("agents.{name}.endpoint"),
                    "expected https://host:port",
                ));
            }
        }
        if let Some(c) = &self.cluster {
            c.validate(file)?;
        }
        self.validate_api(file)
    }

    fn validate_api(&self, file: &Path) -> Result<(), ConfigError> {
        let api = &self.api;
        if !api.clients.is_empty() {
            match &api.tls {
                None => {
                    return Err(ConfigError::invalid(
                        file,
                        "api.tls",
                        "api.clients needs api.tls with a ca: client certificates are verified against it",
                    ));
                }
                Some(t) if t.ca.is_none() => {
                    return Err(ConfigError::invalid(
                        file,
                        "api.tls.ca",
                        "api.clients needs the CA that issued the client certificates",
                    ));
                }
                Some(_) => {}
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in api.clients.iter().enumerate() {
            if c.name.trim().is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    format!("api.clients[{i}].name"),
                    "a certificate name is required",
                ));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(ConfigError::invalid(
                    file,
                    format!("api.clients[{i}].name"),
                    format!("{:?} is listed twice", c.name),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, t) in api.tokens.iter().enumerate() {
            if t.name.trim().is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    format!("api.tokens[{i}].name"),
                    "a name is required: it is the actor of the token's audit events",
                ));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(ConfigError::invalid(
                    file,
                    format!("api.tokens[{i}].name"),
                    format!("{:?} is listed twice", t.name),
                ));
            }
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::invalid(
                    file,
                    format!("api.tokens[{i}].sha256"),
                    "expected the token's SHA-256 in hex (64 digits), e.g. from `printf %s \"$TOKEN\" | sha256sum`; \
                     the token itself never goes in the config",
                ));
            }
        }
        Ok(())
    }

    /// What `tally serve` needs besides [`CoordinatorConfig::validate`]: HTTPS unless
    /// `--insecure-loopback` on a loopback address, and at least one way to log in.
    pub fn validate_serve(&self, file: &Path, insecure_loopback: bool) -> Result<(), ConfigError> {
        let listen = self
            .listen
            .ok_or_else(|| ConfigError::invalid(file, "listen", "is required for tally serve"))?;
        if self.data_dir.is_none() {
            return Err(ConfigError::invalid(
                file,
                "data_dir",
                "is required for tally serve",
            ));
        }
        match (&self.api.tls, insecure_loopback) {
            (Some(_), true) => {
                return Err(ConfigError::invalid(
                    file,
                    "api.tls",
                    "is set, so the API speaks HTTPS: drop --insecure-loopback",
                ));
            }
            (None, true) if !listen.ip().is_loopback() => {
                return Err(ConfigError::invalid(
                    file,
                    "api.tls",
                    format!(
                        "is required: --insecure-loopback serves plain HTTP on a loopback address only, \
                         and listen is {listen}; set api.tls: {{ cert, key }}"
                    ),
                ));
            }
            (None, false) => {
                return Err(ConfigError::invalid(
                    file,
                    "api.tls",
                    "is required: tally serve speaks HTTPS only; set api.tls: { cert, key } \
                     (`tally certs init` writes coordinator-api.pem and coordinator-api-key.pem), \
                     or for a loopback listen address only, pass --insecure-loopback",
                ));
            }
            _ => {}
        }
        if self.api.tokens.is_empty() && self.api.clients.is_empty() {
            return Err(ConfigError::invalid(
                file,
                "api.tokens",
                "no caller could log in: add api.tokens (the SHA-256 of a bearer token, with a role) \
                 or api.clients (client certificate names, with a role)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    #[test]
    fn the_shipped_example_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/coordinator.yaml");
        let c = CoordinatorConfig::load(&p).unwrap();
        assert_eq!(c.agents.len(), 2);
        assert!(c.cluster.is_none());
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/coordinator-cluster.yaml");
        let c = CoordinatorConfig::load(&p).unwrap();
        let cluster = c.cluster.unwrap();
        assert_eq!(cluster.initial_members.len(), 3);
        assert_eq!(cluster.node_id_for(&p, Some("tally-coordinator-1")).unwrap(), 2);
        assert_eq!(
            cluster.advertise_for(Some("tally-coordinator-1")),
            "tally-coordinator-1.tally-coordinator-peers:7443"
        );
        assert!(cluster.tls.ca.ends_with("certs/peer-ca.pem") && cluster.tls.ca.is_absolute());
    }

    #[test]
    fn a_database_url_is_an_unknown_key() {
        let p = Path::new("coordinator.yaml");
        for text in [
            "tls: { ca: a, cert: b, key: c }\nagents: { dc1: { endpoint: 'https://a:1', url: 'postgres://x' } }\n",
            "tls: { ca: a, cert: b, key: c }\npassword: x\nagents: { dc1: { endpoint: 'https://a:1' } }\n",
            "tls: { ca: a, cert: b, key: c }\nagents: { dc1: { endpoint: 'https://a:1' } }\ndatabase_url: postgres://x\n",
        ] {
            let e = parse_yaml::<CoordinatorConfig>(p, text).unwrap_err().to_string();
            assert!(e.starts_with("coordinator.yaml") && e.contains("unknown"), "{e}");
        }
        let c: CoordinatorConfig = parse_yaml(
            p,
            "tls: { ca: a, cert: b, key: c }\nagents: { dc1: { endpoint: 'http://a:1' } }\n",
        )
        .unwrap();
        assert!(
            c.validate(p)
                .unwrap_err()
                .to_string()
                .contains("agents.dc1.endpoint")
        );
    }

    const BASE: &str = "tls: { ca: a, cert: b, key: c }\nagents: { dc1: { endpoint: 'https://a:1' } }\n";
    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn api_error(api: &str) -> String {
        let p = Path::new("coordinator.yaml");
        let c: CoordinatorConfig = match parse_yaml(p, &format!("{BASE}{api}")) {
            Ok(c) => c,
            Err(e) => return e.to_string(),
        };
        c.validate(p).unwrap_err().to_string()
    }

    #[test]
    fn api_errors_name_the_key() {
        let cases = [
            (
                "api: { tokens: [{ name: ci, sha256: abc, role: operator }] }",
                "`api.tokens[0].sha256`",
            ),
            (
                &format!(
                    "api: {{ tokens: [{{ name: ci, sha256: {HASH}, role: operator }}, {{ name: ci, sha256: {HASH}, role: viewer }}] }}"
                ),
                "`api.tokens[1].name`",
            ),
            (
                &format!("api: {{ tokens: [{{ name: '', sha256: {HASH}, role: viewer }}] }}"),
                "`api.tokens[0].name`",
            ),
            (
                &format!("api: {{ tokens: [{{ name: ci, sha256: {HASH}, role: root }}] }}"),
                "api.tokens[0].role",
            ),
            (
                &format!("api: {{ tokens: [{{ name: ci, token: s3cret, sha256: {HASH}, role: admin }}] }}"),
                "unknown",
            ),
            ("api: { clients: [{ name: alice, role: viewer }] }", "`api.tls`"),
            (
                "api: { tls: { cert: a, key: b }, clients: [{ name: alice, role: viewer }] }",
                "`api.tls.ca`",
            ),
            (
                "api: { tls: { cert: a, key: b, ca: c }, clients: [{ name: alice, role: viewer }, { name: alice, role: admin }] }",
                "`api.clients[1].name`",
            ),
            ("api: { tls: { cert: a, key: b, password: x } }", "unknown"),
        ];
        for (api, key) in cases {
            let e = api_error(api);
            assert!(e.starts_with("coordinator.yaml") && e.contains(key), "{api}: {e}");
        }
    }

    #[test]
    fn serve_needs_https_unless_loopback_and_insecure() {
        let p = Path::new("coordinator.yaml");
        let cfg = |listen: &str, api: &str| -> CoordinatorConfig {
            let c: CoordinatorConfig =
                parse_yaml(p, &format!("listen: '{listen}'\ndata_dir: store\n{BASE}{api}")).unwrap();
            c.validate(p).unwrap();
            c
        };
        let token = format!("api: {{ tokens: [{{ name: ci, sha256: {HASH}, role: viewer }}] }}");
        let tls = format!(
            "api: {{ tls: {{ cert: a, key: b }}, tokens: [{{ name: ci, sha256: {HASH}, role: viewer }}] }}"
        );
        let err = |c: &CoordinatorConfig, insecure| c.validate_serve(p, insecure).unwrap_err().to_string();
        let e = err(&cfg("127.0.0.1:7400", &token), false);
        assert!(
            e.contains("`api.tls`") && e.contains("HTTPS only") && e.contains("--insecure-loopback"),
            "{e}"
        );
        let e = err(&cfg("0.0.0.0:7400", &token), true);
        assert!(
            e.contains("`api.tls`") && e.contains("loopback address only"),
            "{e}"
        );
        let e = err(&cfg("[::]:7400", &token), true);
        assert!(e.contains("`api.tls`"), "{e}");
        cfg("127.0.0.1:7400", &token).validate_serve(p, true).unwrap();
        cfg("[::1]:7400", &token).validate_serve(p, true).unwrap();
        cfg("0.0.0.0:7400", &tls).validate_serve(p, false).unwrap();
        let e = err(&cfg("127.0.0.1:7400", &tls), true);
        assert!(
            e.contains("`api.tls`") && e.contains("drop --insecure-loopback"),
            "{e}"
        );
        let e = err(&cfg("0.0.0.0:7400", "api: { tls: { cert: a, key: b } }"), false);
        assert!(e.contains("`api.tokens`"), "{e}");
    }

    #[test]
    fn api_tls_paths_are_relative_to_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("coordinator.yaml");
        std::fs::write(
            &p,
            format!(
                "{BASE}api: {{ tls: {{ cert: certs/api.pem, key: certs/api-key.pem, ca: /etc/ca.pem }} }}\n"
            ),
        )
        .unwrap();
        let c = CoordinatorConfig::load(&p).unwrap();
        let t = c.api.tls.unwrap();
        assert_eq!(t.cert, dir.path().join("certs/api.pem"));
        assert_eq!(t.key, dir.path().join("certs/api-key.pem"));
        assert_eq!(t.ca, Some(PathBuf::from("/etc/ca.pem")));
    }
}
