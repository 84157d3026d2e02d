//! One replica of the group: its openraft instance over the SQLite store, and its peer
//! endpoint (peer.rs) on `cluster.listen`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use openraft::{Raft, SnapshotPolicy};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::network::{MAX_MESSAGE, PeerNetwork};
use super::peer::{Forwarded, PeerService};
use super::state_machine::StateReader;
use super::types::{NodeId, Replica, TypeConfig};
use crate::client::TlsMaterial;
use crate::cluster_config::{ClusterConfig, hostname};

/// Raft timing (milliseconds): a leader that stops heart-beating is replaced after 1 to
/// 2 s; a shorter timeout would elect on a busy 2-core machine's scheduling hiccups.
const HEARTBEAT_MS: u64 = 250;
const ELECTION_MIN_MS: u64 = 1000;
const ELECTION_MAX_MS: u64 = 2000;
/// Entries per AppendEntries. openraft 0.9 gives a whole AppendEntries call the
/// heartbeat interval to answer (250 ms), including the follower's fsync'd write; with
/// its default of 300 entries (a run's events carry digests and reveals) a follower
/// catching up from a restart timed out on the same batch forever.
const MAX_PAYLOAD_ENTRIES: u64 = 32;
/// Time to send and install the last chunk of a snapshot (openraft's default, 200 ms,
/// is less than installing a few runs' events takes, so that too retried forever).
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 30_000;

/// A running replica.
#[derive(Clone)]
pub struct Node {
    pub raft: Raft<TypeConfig>,
    pub id: NodeId,
    /// How peers reach this replica (`cluster.advertise`, the host name filled in).
    pub advertise: String,
    pub reader: StateReader,
    pub tls: Arc<TlsMaterial>,
    pub cfg: ClusterConfig,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("advertise", &self.advertise)
            .finish_non_exhaustive()
    }
}

/// Opens the store under `data_dir` and starts openraft. The replica with id 1
/// initializes the group from `initial_members` when its log is empty.
pub async fn start(cfg: &ClusterConfig, file: &Path, data_dir: &Path) -> Result<Node, String> {
    let host = hostname();
    let id = cfg
        .node_id_for(file, host.as_deref())
        .map_err(|e| e.to_string())?;
    let advertise = cfg.advertise_for(host.as_deref());
    let tls = TlsMaterial::read("cluster.tls", &cfg.tls.ca, &cfg.tls.cert, &cfg.tls.key)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let tls = Arc::new(tls);
    let snapshot_logs = cfg.snapshot_logs();
    let config = openraft::Config {
        cluster_name: "tally".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_MIN_MS,
        election_timeout_max: ELECTION_MAX_MS,
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_logs),
        // a follower further behind than this gets the snapshot instead of the entries
        max_in_snapshot_log_to_keep: snapshot_logs.min(1000),
        ..Default::default()
    }
    .validate()
    .map_err(|e| format!("raft config: {e}"))?;
    let (log, sm) = super::open(data_dir)
        .await
        .map_err(|e| format!("data_dir: {e}"))?;
    let reader = sm.reader();
    let raft = Raft::new(id, Arc::new(config), PeerNetwork::new(tls.clone()), log, sm)
        .await
        .map_err(|e| format!("raft: {e}"))?;
    if id == 1
        && !cfg.initial_members.is_empty()
        && !raft.is_initialized().await.map_err(|e| format!("raft: {e}"))?
    {
        let members: BTreeMap<NodeId, Replica> = cfg
            .initial_members
            .iter()
            .enumerate()
            .map(|(i, addr)| (i as NodeId + 1, Replica { addr: addr.clone() }))
            .collect();
        tracing::info!(members = members.len(), "cluster: initializing the group");
        raft.initialize(members)
            .await
            .map_err(|e| format!("raft: initialize: {e}"))?;
    }
    Ok(Node {
        raft,
        id,
        advertise,
        reader,
        tls,
        cfg: cfg.clone(),
    })
}

impl Node {
    /// Binds `cluster.listen` and serves the peer endpoint until `shutdown` resolves.
    pub async fn serve_peers(
        &self,
        forwarded: Arc<dyn Forwarded>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<std::net::SocketAddr, String> {
        let listen = self.cfg.listen;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cluster.listen {listen}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.tls.cert, &self.tls.key))
            .client_ca_root(Certificate::from_pem(&self.tls.ca))
            .client_auth_optional(false);
        let service = PeerService {
            raft: self.raft.clone(),
            id: self.id,
            advertise: self.advertise.clone(),
            initial_members: self.cfg.initial_members.clone(),
            forwarded,
        };
        let svc = tally_proto::raft::v1::peer_server::PeerServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let server = Server::builder()
            .tls_config(tls)
            .map_err(|e| format!("cluster.tls: {e}"))?
            .add_service(svc);
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(async move {
            if let Err(e) = server.serve_with_incoming_shutdown(incoming, shutdown).await {
                tracing::error!(error = %e, "cluster: the peer endpoint stopped");
            }
        });
        Ok(local)
    }

    /// Whether this replica is the leader now (as far as its metrics know).
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// The leader's peer address, when one is known.
    pub fn leader_addr(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        m.membership_config
            .nodes()
            .find(|(id, _)| **id == leader)
            .map(|(id, n)| (*id, n.addr.clone()))
    }
}
