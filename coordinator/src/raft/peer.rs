//! The server side of the peer endpoint (`tally.raft.v1.Peer`, `cluster.listen`): Raft
//! messages for this replica's openraft, API writes forwarded by followers, and
//! `tally cluster`'s admin calls.
//!
//! Who may call: TLS requires a client certificate issued by the peer CA (`cluster.tls.ca`)
//! with the ClientAuth usage; then one of its DNS names must be the host of a member
//! (voter or learner), of `initial_members`, or of this replica's own `advertise`. A
//! replica that is in no group yet (no membership) accepts any peer-CA certificate: it
//! holds nothing, and a leader adding it as a learner is not a member of anything it
//! knows yet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::Raft;
use openraft::error::{ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};
use tally_common::pki::cert_names;
use tally_proto::raft::v1::Json;
use tally_proto::raft::v1::peer_server::Peer;
use tonic::{Request, Response, Status};

use super::types::{NodeId, Replica, TypeConfig};
use crate::cluster_config::host_of;

/// An API write a follower received, sent on to the leader with the caller it
/// authenticated (the leader trusts the follower's authentication: both are members).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardRequest {
    /// `start_run`, `get_run`, `cancel_run`, `put_schedule`, `delete_schedule`, or
    /// `audit`: an audit event the follower recorded (in `body`), for the trail.
    pub action: String,
    /// The run, for `cancel_run`.
    #[serde(default)]
    pub run: Option<String>,
    pub body: String,
    pub actor: String,
    pub via: String,
    pub role: crate::config::Role,
    /// The caller's address as the follower saw it.
    pub remote: String,
}

/// The leader's HTTP answer to a forwarded write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardResponse {
    pub status: u16,
    pub body: serde_json::Value,
}

/// What handles forwarded writes: `tally serve`'s API (serve.rs).
#[tonic::async_trait]
pub trait Forwarded: Send + Sync + 'static {
    async fn forwarded(&self, req: ForwardRequest) -> ForwardResponse;
}

/// `tally cluster`'s calls.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Initializes a group on a replica whose log is empty: `members` in order have ids
    /// 1, 2, …; empty means this replica alone.
    Init {
        members: Vec<String>,
    },
    /// Adds replica `id` at `addr` as a learner, then makes it a voter (on the leader).
    Join {
        id: NodeId,
        addr: String,
    },
    /// Removes replica `id` from the voters and learners (on the leader).
    Remove {
        id: NodeId,
    },
    Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum AdminResponse {
    Done {
        message: String,
    },
    /// Ask the leader (at `leader`, when known) instead.
    NotLeader {
        leader: Option<String>,
    },
    Failed {
        error: String,
    },
    Status(ClusterStatus),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub id: NodeId,
    pub state: String,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub last_applied: Option<u64>,
    pub members: Vec<MemberStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    /// The last log index the leader knows this member holds (on the leader only).
    pub matched: Option<u64>,
}

/// The peer service of one replica.
pub struct PeerService {
    pub raft: Raft<TypeConfig>,
    pub id: NodeId,
    pub advertise: String,
    pub initial_members: Vec<String>,
    pub forwarded: Arc<dyn Forwarded>,
}

fn bad_request(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("request does not parse: {e}"))
}

fn json<T: Serialize>(v: &T) -> Result<Response<Json>, Status> {
    serde_json::to_vec(v)
        .map(|json| Response::new(Json { json }))
        .map_err(|e| Status::internal(e.to_string()))
}

impl PeerService {
    /// The hosts whose certificates may call: see the module comment.
    fn allowed_hosts(&self) -> Option<BTreeSet<String>> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let nodes: Vec<String> = m.nodes().map(|(_, n)| n.addr.clone()).collect();
        if nodes.is_empty() {
            return None;
        }
        let hosts = nodes
            .iter()
            .chain(&self.initial_members)
            .chain(std::iter::once(&self.advertise))
            .filter_map(|a| host_of(a).map(str::to_string))
            .collect();
        Some(hosts)
    }

    fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let names = req
            .peer_certs()
            .and_then(|c| c.first().map(|c| cert_names(c.as_ref())))
            .unwrap_or_default();
        let Some(allowed) = self.allowed_hosts() else {
            return Ok(());
        };
        if names.iter().any(|n| allowed.contains(n)) {
            return Ok(());
        }
        let who = names.first().cloned().unwrap_or_else(|| "no name".into());
        tracing::warn!(peer = %who, "peer: a certificate that names no member");
        Err(Status::permission_denied(format!(
            "peer certificate {who:?} names no member of this group"
        )))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, req: Request<Json>) -> Result<T, Status> {
        self.check(&req)?;
        serde_json::from_slice(&req.into_inner().json).map_err(bad_request)
    }

    /// The voters of the membership this replica knows.
    fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    fn write_failed(&self, e: RaftError<NodeId, ClientWriteError<NodeId, Replica>>) -> AdminResponse {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => AdminResponse::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            },
            e => AdminResponse::Failed { error: e.to_string() },
        }
    }

    async fn admin_op(&self, req: AdminRequest) -> AdminResponse {
        match req {
            AdminRequest::Init { members } => {
                let members: BTreeMap<NodeId, Replica> = if members.is_empty() {
                    BTreeMap::from([(
                        self.id,
                        Replica {
                            addr: self.advertise.clone(),
                        },
                    )])
                } else {
                    members
                        .into_iter()
                        .enumerate()
                        .map(|(i, addr)| (i as NodeId + 1, Replica { addr }))
                        .collect()
                };
                let n = members.len();
                match self.raft.initialize(members).await {
                    Ok(()) => AdminResponse::Done {
                        message: format!("initialized a group of {n}"),
                    },
                    Err(e) => AdminResponse::Failed { error: e.to_string() },
                }
            }
            AdminRequest::Join { id, addr } => {
                if host_of(&addr).is_none() {
                    return AdminResponse::Failed {
                        error: format!("--addr {addr:?}: expected host:port"),
                    };
                }
                if let Err(e) = self.raft.add_learner(id, Replica { addr }, true).await {
                    return self.write_failed(e);
                }
                let mut voters = self.voters();
                voters.insert(id);
                match self.raft.change_membership(voters, false).await {
                    Ok(_) => AdminResponse::Done {
                        message: format!("replica {id} is a voter"),
                    },
                    Err(e) => self.write_failed(e),
                }
            }
            AdminRequest::Remove { id } => {
                let mut voters = self.voters();
                voters.remove(&id);
                match self.raft.change_membership(voters, false).await {
                    Ok(_) => AdminResponse::Done {
                        message: format!("replica {id} was removed"),
                    },
                    Err(e) => self.write_failed(e),
                }
            }
            AdminRequest::Status => AdminResponse::Status(self.status()),
        }
    }

    fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| MemberStatus {
                id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
                matched: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned().flatten().map(|l| l.index)),
            })
            .collect();
        ClusterStatus {
            id: m.id,
            state: format!("{:?}", m.state),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            members,
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: Request<Json>) -> Result<Response<Json>, Status> {
        let rpc = self.parse(req)?;
        json(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<Json>) -> Result<Response<Json>, Status> {
        let rpc = self.parse(req)?;
        json(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Json>) -> Result<Response<Json>, Status> {
        let rpc = self.parse(req)?;
        json(&self.raft.install_snapshot(rpc).await)
    }

    async fn forward(&self, req: Request<Json>) -> Result<Response<Json>, Status> {
        let fwd: ForwardRequest = self.parse(req)?;
        json(&self.forwarded.forwarded(fwd).await)
    }

    async fn admin(&self, req: Request<Json>) -> Result<Response<Json>, Status> {
        let op: AdminRequest = self.parse(req)?;
        // a membership change waits for the learner to catch up: bounded by the caller
        let answer = tokio::time::timeout(Duration::from_secs(120), self.admin_op(op))
            .await
            .unwrap_or_else(|_| AdminResponse::Failed {
                error: "timed out after 120 s".into(),
            });
        json(&answer)
    }
}
