//! `cluster` in the coordinator config: `tally serve` as one replica of a Raft group
//! (DESIGN §9). Without it `tally serve` is a single node.
//!
//! ```yaml
//! cluster:
//!   node_id: 1                     # optional: else the hostname's StatefulSet ordinal + 1
//!   listen: 0.0.0.0:7443           # the Raft endpoint (mutual TLS)
//!   advertise: "{hostname}.tally-coordinator-peers:7443"
//!   tls: { cert: peer.pem, key: peer.key, ca: peer-ca.pem }
//!   initial_members: ["a-0.peers:7443", "a-1.peers:7443", "a-2.peers:7443"]
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tally_common::config_file::{ConfigError, relative_to};

/// Raft log entries between two snapshots when `snapshot_logs` is not set.
pub const DEFAULT_SNAPSHOT_LOGS: u64 = 5000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This replica's Raft id; when absent, the hostname's StatefulSet ordinal + 1.
    #[serde(default)]
    pub node_id: Option<u64>,
    /// The Raft endpoint (peers, forwarded writes, `tally cluster`).
    pub listen: SocketAddr,
    /// `host:port` peers reach this replica at; `{hostname}` is replaced by the host name.
    pub advertise: String,
    pub tls: PeerTls,
    /// Member i has node_id i+1; node 1 initializes the group when its log is empty.
    #[serde(default)]
    pub initial_members: Vec<String>,
    /// Applied log entries after which a replica takes a snapshot (and purges its log).
    #[serde(default)]
    pub snapshot_logs: Option<u64>,
}

/// Peer certificates: ServerAuth and ClientAuth, issued by the peer CA (never the
/// agents' CA: agents accept its ServerAuth certificates as sealed-run peers).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The host of `host:port` (brackets of an IPv6 literal removed), or `None`.
pub fn host_of(addr: &str) -> Option<&str> {
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && !host.contains(char::is_whitespace)).then_some(host)
}

/// This machine's host name: `$HOSTNAME`, else the kernel's.
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The StatefulSet ordinal of `host` (`x-2` → 2).
fn ordinal(host: &str) -> Option<u64> {
    host.rsplit_once('-')?.1.parse().ok()
}

impl ClusterConfig {
    pub(crate) fn resolve_paths(&mut self, config: &Path) {
        self.tls.cert = relative_to(config, &self.tls.cert);
        self.tls.key = relative_to(config, &self.tls.key);
        self.tls.ca = relative_to(config, &self.tls.ca);
    }

    /// The node id: `node_id`, else the ordinal of `host` + 1.
    pub fn node_id_for(&self, file: &Path, host: Option<&str>) -> Result<u64, ConfigError> {
        if let Some(id) = self.node_id {
            return Ok(id);
        }
        host.and_then(ordinal).map(|o| o + 1).ok_or_else(|| {
            ConfigError::invalid(
                file,
                "cluster.node_id",
                format!(
                    "is not set and the host name ({}) ends in no StatefulSet ordinal (like x-2): set cluster.node_id",
                    host.unwrap_or("unknown")
                ),
            )
        })
    }

    /// `advertise` with `{hostname}` replaced.
    pub fn advertise_for(&self, host: Option<&str>) -> String {
        self.advertise.replace("{hostname}", host.unwrap_or("localhost"))
    }

    pub fn snapshot_logs(&self) -> u64 {
        self.snapshot_logs.unwrap_or(DEFAULT_SNAPSHOT_LOGS)
    }

    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        if self.node_id == Some(0) {
            return Err(ConfigError::invalid(
                file,
                "cluster.node_id",
                "must be 1 or more (member i of initial_members is node i+1)",
            ));
        }
        if host_of(&self.advertise_for(Some("h"))).is_none() {
            return Err(ConfigError::invalid(
                file,
                "cluster.advertise",
                format!("expected host:port, got {:?}", self.advertise),
            ));
        }
        for (i, m) in self.initial_members.iter().enumerate() {
            if host_of(m).is_none() {
                return Err(ConfigError::invalid(
                    file,
                    format!("cluster.initial_members[{i}]"),
                    format!("expected host:port, got {m:?}"),
                ));
            }
            if self.initial_members[..i].contains(m) {
                return Err(ConfigError::invalid(
                    file,
                    format!("cluster.initial_members[{i}]"),
                    format!("{m:?} is listed twice"),
                ));
            }
        }
        if self.snapshot_logs == Some(0) {
            return Err(ConfigError::invalid(
                file,
                "cluster.snapshot_logs",
                "must be 1 or more",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    fn cluster(yaml: &str) -> Result<ClusterConfig, String> {
        let p = Path::new("coordinator.yaml");
        let c: ClusterConfig = parse_yaml(p, yaml).map_err(|e| e.to_string())?;
        c.validate(p).map_err(|e| e.to_string())?;
        Ok(c)
    }

    const OK: &str = "listen: 0.0.0.0:7443\nadvertise: '{hostname}.peers:7443'\n\
                      tls: { cert: peer.pem, key: peer.key, ca: peer-ca.pem }\n";

    #[test]
    fn the_node_id_comes_from_the_key_or_the_ordinal_and_the_error_names_the_key() {
        let p = Path::new("coordinator.yaml");
        let c = cluster(OK).unwrap();
        assert_eq!(c.node_id_for(p, Some("tally-coordinator-2")).unwrap(), 3);
        assert_eq!(c.advertise_for(Some("x-0")), "x-0.peers:7443");
        let e = c.node_id_for(p, Some("laptop")).unwrap_err().to_string();
        assert!(e.contains("`cluster.node_id`") && e.contains("laptop"), "{e}");
        let c = cluster(&format!("{OK}node_id: 5\n")).unwrap();
        assert_eq!(c.node_id_for(p, Some("laptop")).unwrap(), 5);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (format!("{OK}node_id: 0\n"), "`cluster.node_id`"),
            (
                OK.replace("'{hostname}.peers:7443'", "nohost"),
                "`cluster.advertise`",
            ),
            (
                format!("{OK}initial_members: ['a:1', 'b']\n"),
                "`cluster.initial_members[1]`",
            ),
            (
                format!("{OK}initial_members: ['a:1', 'a:1']\n"),
                "`cluster.initial_members[1]`",
            ),
            (format!("{OK}peers: []\n"), "unknown"),
            (OK.replace("ca: peer-ca.pem", "ca: x, password: y"), "unknown"),
        ];
        for (yaml, key) in cases {
            let e = cluster(&yaml).unwrap_err();
            assert!(
                e.starts_with("coordinator.yaml") && e.contains(key),
                "{yaml}: {e}"
            );
        }
    }

    #[test]
    fn host_of_takes_host_port_only() {
        assert_eq!(host_of("a-0.peers:7443"), Some("a-0.peers"));
        assert_eq!(host_of("[::1]:7443"), Some("::1"));
        assert_eq!(host_of("a-0.peers"), None);
        assert_eq!(host_of(":7443"), None);
    }
}
