//! The client side of the peer endpoint (`tally.raft.v1.Peer`): openraft's network
//! over gRPC with mutual TLS. Each replica presents its peer certificate
//! (`cluster.tls`) and trusts only the peer CA; the server side is peer.rs.
//!
//! Raft messages travel as openraft's own serde JSON, and so do its errors: a remote
//! `RaftError` comes back as the `Err` of a JSON `Result` and becomes
//! `RPCError::RemoteError`; a transport failure is `Unreachable` (openraft backs off)
//! and a call past openraft's time budget a `Timeout`.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RPCTypes, RaftNetwork, RaftNetworkFactory};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tally_proto::raft::v1::Json;
use tally_proto::raft::v1::peer_client::PeerClient;
use tonic::transport::Channel;

use super::types::{NodeId, Replica, TypeConfig};
use crate::client::{TlsMaterial, mtls_channel};

/// Largest message a peer accepts or sends: a snapshot chunk or a batch of entries.
pub const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// About the most entry bytes one AppendEntries carries. openraft 0.9 gives a whole call
/// (the follower's fsync'd write included) the heartbeat interval, 250 ms, and batches by
/// count only: 32 entries of a rows phase's digests (512 KB each) never made it.
const BATCH_BYTES: usize = 1024 * 1024;

/// How many of `entries` go in one call: as many as fit in [`BATCH_BYTES`], at least one.
fn batch_len(entries: &[openraft::Entry<TypeConfig>]) -> usize {
    let mut bytes = 0;
    for (i, e) in entries.iter().enumerate() {
        let n = match &e.payload {
            openraft::EntryPayload::Normal(c) => serde_json::to_vec(c).map_or(0, |v| v.len()),
            _ => 64,
        };
        if i > 0 && bytes + n > BATCH_BYTES {
            return i;
        }
        bytes += n;
    }
    entries.len()
}

/// A connection to one replica's peer endpoint, for Raft and for the other calls
/// (forwarded writes, `tally cluster`).
#[derive(Debug, Clone)]
pub struct PeerConn {
    pub addr: String,
    client: PeerClient<Channel>,
}

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {addr}: {message}")]
    Transport { addr: String, message: String },
    #[error("peer {addr}: {code:?}: {message}")]
    Status {
        addr: String,
        code: tonic::Code,
        message: String,
    },
    #[error("peer {addr}: the answer does not parse: {message}")]
    Malformed { addr: String, message: String },
}

impl PeerError {
    fn unreachable(&self) -> bool {
        match self {
            PeerError::Transport { .. } => true,
            PeerError::Status { code, .. } => *code == tonic::Code::Unavailable,
            PeerError::Malformed { .. } => false,
        }
    }
}

/// The RPCs of `tally.raft.v1.Peer`.
#[derive(Debug, Clone, Copy)]
pub enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
    Forward,
    Admin,
}

impl PeerConn {
    /// A lazy connection to `addr` (`host:port`): nothing connects before the first call.
    pub fn new(addr: &str, tls: &TlsMaterial) -> Result<PeerConn, PeerError> {
        let channel =
            mtls_channel(&format!("https://{addr}"), tls).map_err(|message| PeerError::Transport {
                addr: addr.to_string(),
                message,
            })?;
        Ok(PeerConn {
            addr: addr.to_string(),
            client: PeerClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        })
    }

    /// Sends `req` as JSON and parses the answer as `Resp`.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let json = serde_json::to_vec(req).map_err(|e| PeerError::Malformed {
            addr: self.addr.clone(),
            message: e.to_string(),
        })?;
        let mut request = tonic::Request::new(Json { json });
        request.set_timeout(timeout);
        let mut c = self.client.clone();
        let answer = match rpc {
            Rpc::AppendEntries => c.append_entries(request).await,
            Rpc::Vote => c.vote(request).await,
            Rpc::InstallSnapshot => c.install_snapshot(request).await,
            Rpc::Forward => c.forward(request).await,
            Rpc::Admin => c.admin(request).await,
        };
        let answer = answer.map_err(|s| {
            // tonic reports a failed connection as UNAVAILABLE with the transport's cause
            if s.code() == tonic::Code::Unavailable
                || s.code() == tonic::Code::Unknown && s.message().contains("transport")
            {
                PeerError::Transport {
                    addr: self.addr.clone(),
                    message: s.message().to_string(),
                }
            } else {
                PeerError::Status {
                    addr: self.addr.clone(),
                    code: s.code(),
                    message: s.message().to_string(),
                }
            }
        })?;
        serde_json::from_slice(&answer.into_inner().json).map_err(|e| PeerError::Malformed {
            addr: self.addr.clone(),
            message: e.to_string(),
        })
    }
}

/// openraft's factory of peer connections.
#[derive(Debug, Clone)]
pub struct PeerNetwork {
    tls: Arc<TlsMaterial>,
    reach: Arc<Reachability>,
}

impl PeerNetwork {
    pub fn new(tls: Arc<TlsMaterial>) -> PeerNetwork {
        PeerNetwork {
            tls,
            reach: Arc::default(),
        }
    }
}

/// Which members could be reached lately, so that a member going down is one WARN
/// line and its return one INFO line, however often openraft retries it in between
/// (its own per-retry lines are off by default: docs/operations.md). A member is down
/// after [`DOWN_AFTER`] calls in a row failed to reach it (refused, or no answer in
/// time: a partition or a hung process as well as a stopped one), up at the first
/// answer.
#[derive(Debug, Default)]
pub struct Reachability {
    /// Per member: calls in a row that did not reach it, and whether it is down.
    state: std::sync::Mutex<std::collections::BTreeMap<NodeId, (u32, bool)>>,
}

/// Failed calls in a row that make a member down (a single slow answer under load is not).
pub const DOWN_AFTER: u32 = 3;

impl Reachability {
    /// Records a call's outcome; `Some(true)` when the member just went down,
    /// `Some(false)` when it just came back, `None` when nothing changed.
    pub fn record(&self, target: NodeId, reached: bool) -> Option<bool> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (misses, down) = state.entry(target).or_default();
        if reached {
            *misses = 0;
            return std::mem::replace(down, false).then_some(false);
        }
        *misses = misses.saturating_add(1);
        if *misses >= DOWN_AFTER && !*down {
            *down = true;
            return Some(true);
        }
        None
    }
}

/// openraft's connection to one member.
#[derive(Debug)]
pub struct PeerTarget {
    target: NodeId,
    node: Replica,
    conn: Result<PeerConn, String>,
    reach: Arc<Reachability>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerTarget;

    async fn new_client(&mut self, target: NodeId, node: &Replica) -> PeerTarget {
        PeerTarget {
            target,
            node: node.clone(),
            conn: PeerConn::new(&node.addr, &self.tls).map_err(|e| e.to_string()),
            reach: self.reach.clone(),
        }
    }
}

type Rpcs<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, Replica, RaftError<NodeId, E>>>;

impl PeerTarget {
    async fn send<Req, Resp, E>(
        &self,
        rpc: Rpc,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Rpcs<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let conn = match &self.conn {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
                    e.clone(),
                ))));
            }
        };
        let ttl = option.hard_ttl();
        // answered within openraft's budget or not at all: openraft drops a call past it,
        // so the outcome is taken here, a little before
        let budget = ttl.mul_f64(0.9);
        let answer: Result<Result<Resp, RaftError<NodeId, E>>, PeerError> =
            match tokio::time::timeout(budget, conn.call(rpc, req, ttl)).await {
                Ok(a) => a,
                Err(_) => Err(PeerError::Status {
                    addr: self.node.addr.clone(),
                    code: tonic::Code::DeadlineExceeded,
                    message: format!("no answer within {} ms", budget.as_millis()),
                }),
            };
        let reached = match &answer {
            Ok(_) => Some(true),
            Err(PeerError::Status {
                code: tonic::Code::DeadlineExceeded,
                ..
            }) => Some(false),
            Err(e) if e.unreachable() => Some(false),
            Err(_) => None,
        };
        match reached.and_then(|r| self.reach.record(self.target, r)) {
            Some(true) => {
                let why = answer.as_ref().err().map(ToString::to_string).unwrap_or_default();
                tracing::warn!(peer = self.target, addr = %self.node.addr, error = %why, "cluster: a member is unreachable");
            }
            Some(false) => {
                tracing::info!(peer = self.target, addr = %self.node.addr, "cluster: a member is reachable again");
            }
            None => {}
        }
        match answer {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))),
            Err(PeerError::Status {
                code: tonic::Code::DeadlineExceeded,
                ..
            }) => Err(RPCError::Timeout(Timeout {
                action,
                id: self.target,
                target: self.target,
                timeout: ttl,
            })),
            Err(e) if e.unreachable() => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerTarget {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpcs<AppendEntriesResponse<NodeId>> {
        // openraft 0.9 gives the whole call the heartbeat interval: a batch is cut to
        // about BATCH_BYTES (at least one entry) and the rest goes in the next call
        let keep = batch_len(&rpc.entries);
        let cut = keep < rpc.entries.len();
        rpc.entries.truncate(keep);
        let last = rpc.entries.last().map(|e| e.log_id);
        let answer = self
            .send(Rpc::AppendEntries, RPCTypes::AppendEntries, &rpc, &option)
            .await?;
        Ok(match answer {
            AppendEntriesResponse::Success if cut => AppendEntriesResponse::PartialSuccess(last),
            other => other,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpcs<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.send(Rpc::InstallSnapshot, RPCTypes::InstallSnapshot, &rpc, &option)
            .await
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> Rpcs<VoteResponse<NodeId>> {
        self.send(Rpc::Vote, RPCTypes::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_down_after_calls_in_a_row_fail_and_up_at_its_first_answer() {
        let r = Reachability::default();
        assert_eq!(r.record(2, false), None);
        assert_eq!(r.record(2, true), None, "one miss is no outage");
        for _ in 1..DOWN_AFTER {
            assert_eq!(r.record(2, false), None);
        }
        assert_eq!(r.record(2, false), Some(true), "down once");
        for _ in 0..100 {
            assert_eq!(r.record(2, false), None, "and said once");
        }
        assert_eq!(r.record(3, true), None, "another member is its own");
        assert_eq!(r.record(2, true), Some(false), "back once");
        assert_eq!(r.record(2, true), None);
    }
}
