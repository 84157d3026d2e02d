//! The coordinator config (DESIGN §11). It knows agents by name and endpoint and holds
//! its own TLS identity; there is no key that could hold a database URL or password,
//! and unknown keys are errors.

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
    /// `tally serve` only: the run store.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    pub tls: ClientTls,
    pub agents: BTreeMap<String, AgentRef>,
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
}
