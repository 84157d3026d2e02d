//! Building an agent from its config and serving it over mutual TLS.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tally_proto::v1::agent_server::AgentServer;
use tokio::net::TcpListener;
use tonic::transport::Server;

use crate::config::AgentConfig;
use crate::connector::Connector;
use crate::dataset::Dataset;
use crate::error::AgentError;
use crate::release_log::ReleaseLog;
use crate::service::AgentService;
use crate::tls;

/// Opens one connection pool per database URL (lazily: nothing connects yet) and the
/// datasets over them. Datasets whose URLs resolve to the same string share a pool, so
/// `connections.max_connections` caps the agent's connections to that URL however many
/// datasets use it; the same database under two spellings of its URL gets two pools.
pub fn open_datasets(
    cfg: &AgentConfig,
    config_path: &Path,
) -> Result<BTreeMap<String, Arc<Dataset>>, AgentError> {
    let mut pools: HashMap<String, Arc<Connector>> = HashMap::new();
    let mut out = BTreeMap::new();
    let mut urls = Vec::new();
    for (name, d) in &cfg.datasets {
        let url = d
            .resolve_url(config_path, name)
            .map_err(|e| AgentError::Config(e.to_string()))?;
        urls.push(url);
    }
    // a URL with a `max_load` dataset keeps a connection for its load probe
    let probed: std::collections::HashSet<&String> = cfg
        .datasets
        .values()
        .zip(&urls)
        .filter(|(d, _)| d.throttle.as_ref().is_some_and(|t| t.max_load.is_some()))
        .map(|(_, u)| u)
        .collect();
    for ((name, d), url) in cfg.datasets.iter().zip(&urls) {
        let connector = match pools.entry(url.clone()) {
            Entry::Occupied(e) => Arc::clone(e.get()),
            Entry::Vacant(e) => {
                let c = Connector::open_probing(e.key(), &cfg.connections, probed.contains(url))
                    .map_err(|err| AgentError::Config(format!("datasets.{name}.url: {err}")))?;
                Arc::clone(e.insert(Arc::new(c)))
            }
        };
        if let Some(w) = &d.watermark {
            w.check_engine(name, connector.dialect().name())?;
        }
        if d.throttle.as_ref().is_some_and(|t| t.max_load.is_some()) && connector.probe().is_none() {
            return Err(AgentError::Config(format!(
                "datasets.{name}.throttle.max_load: the {} engine has no load probe here (PostgreSQL and MySQL/MariaDB have); remove max_load or use max_rows_per_second",
                connector.dialect().name()
            )));
        }
        out.insert(
            name.clone(),
            Arc::new(Dataset::new(name.clone(), d.clone(), d.source(), connector)),
        );
    }
    Ok(out)
}

/// A bound, not yet serving, agent.
pub struct Bound {
    pub addr: SocketAddr,
    listener: TcpListener,
    service: AgentService,
    tls: Arc<rustls::ServerConfig>,
    allowed: crate::config::AllowedClients,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The agent's service as `tally-agent` builds it from its config (datasets, release
/// log, zone key), without a listener: what [`bind`] serves, and what tests call in
/// this process.
pub fn service(cfg: &AgentConfig, config_path: &Path) -> Result<AgentService, AgentError> {
    let datasets = open_datasets(cfg, config_path)?;
    let log = ReleaseLog::open(cfg.release_log.as_deref())
        .map_err(|e| AgentError::Config(format!("release_log: {e}")))?;
    let zone = crate::sealing::Zone::load(&cfg.tls)?.map(Arc::new);
    if let Some(z) = &zone {
        tracing::info!(name = %z.name, "zone key loaded: checksums are sealed");
        let open: Vec<&str> = cfg
            .datasets
            .iter()
            .filter(|(_, d)| d.policy.peers.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        if !open.is_empty() {
            tracing::warn!(
                datasets = %open.join(", "),
                "these datasets accept any agent certificate of tls.peer_ca as a sealed-run peer; \
                 set policy.peers unless that CA issues agent certificates only"
            );
        }
    }
    Ok(AgentService {
        datasets,
        log: Arc::new(log),
        reveals: Default::default(),
        zone,
        identity: Arc::new(crate::sealing::Identity::load(&cfg.tls)?),
        waits: Arc::new(tokio::sync::Semaphore::new(crate::service::MAX_WAITS)),
    })
}

/// Binds the listener (port 0 picks a free port) and prepares the service.
pub async fn bind(cfg: &AgentConfig, config_path: &Path) -> Result<Bound, AgentError> {
    let tls = tls::server_config(&cfg.tls)?;
    let service = service(cfg, config_path)?;
    if cfg.tls.allowed_clients == crate::config::AllowedClients::Any {
        tracing::warn!(
            "tls.allowed_clients is any: every client certificate of the CA may call this agent; list the coordinator's name to close it"
        );
    }
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| AgentError::Config(format!("listen {}: {e}", cfg.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| AgentError::Config(e.to_string()))?;
    Ok(Bound {
        addr,
        listener,
        service,
        tls,
        allowed: cfg.tls.allowed_clients.clone(),
    })
}

impl Bound {
    /// Serves until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), AgentError> {
        let svc = AgentServer::with_interceptor(self.service, tls::allow_list(self.allowed));
        // the handshakes are the agent's own (tls::Incoming), so a refused client is
        // logged with its reason; tonic serves the established streams
        Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(tls::Incoming::new(self.listener, self.tls), shutdown)
            .await
            .map_err(|e| AgentError::Config(format!("server: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    fn config(dataset: &str) -> AgentConfig {
        let p = Path::new("agent.yaml");
        let c: AgentConfig = parse_yaml(
            p,
            &format!(
                "listen: 127.0.0.1:7401\ntls: {{ ca: ca.pem, cert: a.pem, key: a-key.pem, zone_key: a-zone.key }}\n\
                 datasets:\n  o: {{ {dataset} }}\n"
            ),
        )
        .unwrap();
        c.validate(p).unwrap();
        c
    }

    #[tokio::test]
    async fn a_throttle_with_max_load_is_refused_where_its_engine_has_no_probe() {
        // SQLite has no server load to probe: refused when the agent opens it
        let c = config("url: 'sqlite://x.db', table: t, key: [id], throttle: { max_load: 4 }");
        let e = open_datasets(&c, Path::new("agent.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("datasets.o.throttle.max_load") && e.contains("sqlite"),
            "{e}"
        );
        // its row budget is fine
        let c = config("url: 'sqlite://x.db', table: t, key: [id], throttle: { max_rows_per_second: 5 }");
        assert!(open_datasets(&c, Path::new("agent.yaml")).is_ok());
    }
}
