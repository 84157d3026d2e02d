//! `tally cluster init|join|remove|status`: talks to a replica's peer endpoint with a
//! peer certificate (`cluster.tls` of the config given), like etcdctl with client
//! certificates. Membership changes go to the leader: a follower's answer names it and
//! the command asks it there once.

use std::time::Duration;

use crate::client::TlsMaterial;
use crate::config::CoordinatorConfig;
use crate::raft::network::{PeerConn, Rpc};
use crate::raft::peer::{AdminRequest, AdminResponse, ClusterStatus};

const TIMEOUT: Duration = Duration::from_secs(150);

/// Why a cluster command failed: usage (exit 2) or the call (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ClusterCliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

impl ClusterCliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClusterCliError::Usage(_) => 2,
            ClusterCliError::Failed(_) => 1,
        }
    }
}

/// The peer TLS material and the address to ask (`--endpoint`, else `cluster.advertise`).
pub fn target(
    cfg: &CoordinatorConfig,
    addr: Option<String>,
) -> Result<(TlsMaterial, String), ClusterCliError> {
    let c = cfg.cluster.as_ref().ok_or_else(|| {
        ClusterCliError::Usage("the config has no `cluster` section (cluster.tls is needed)".into())
    })?;
    let tls = TlsMaterial::read("cluster.tls", &c.tls.ca, &c.tls.cert, &c.tls.key)
        .map_err(|e| ClusterCliError::Usage(e.to_string()))?;
    let addr = addr.unwrap_or_else(|| c.advertise_for(crate::cluster_config::hostname().as_deref()));
    if crate::cluster_config::host_of(&addr).is_none() {
        return Err(ClusterCliError::Usage(format!(
            "--endpoint {addr:?}: expected host:port"
        )));
    }
    Ok((tls, addr))
}

/// Sends `req` to `addr`, and once more to the leader when `addr` is not the leader.
pub async fn admin(
    tls: &TlsMaterial,
    addr: &str,
    req: AdminRequest,
) -> Result<AdminResponse, ClusterCliError> {
    let mut addr = addr.to_string();
    for _ in 0..2 {
        let conn = PeerConn::new(&addr, tls).map_err(|e| ClusterCliError::Failed(e.to_string()))?;
        let answer: AdminResponse = conn
            .call(Rpc::Admin, &req, TIMEOUT)
            .await
            .map_err(|e| ClusterCliError::Failed(e.to_string()))?;
        match answer {
            AdminResponse::NotLeader { leader: Some(l) } if l != addr => addr = l,
            AdminResponse::NotLeader { leader } => {
                return Err(ClusterCliError::Failed(format!(
                    "{addr} is not the leader and knows none{}",
                    leader.map(|l| format!(" (it names {l})")).unwrap_or_default()
                )));
            }
            AdminResponse::Failed { error } => {
                return Err(ClusterCliError::Failed(format!("{addr}: {error}")));
            }
            other => return Ok(other),
        }
    }
    Err(ClusterCliError::Failed(
        "the leader moved while asking: try again".into(),
    ))
}

/// Status, from the leader when there is one (only it knows each member's matched index).
pub async fn status(tls: &TlsMaterial, addr: &str) -> Result<ClusterStatus, ClusterCliError> {
    let here = match admin(tls, addr, AdminRequest::Status).await? {
        AdminResponse::Status(s) => s,
        other => return Err(ClusterCliError::Failed(format!("unexpected answer {other:?}"))),
    };
    let leader_addr = here
        .leader
        .and_then(|l| here.members.iter().find(|m| m.id == l))
        .map(|m| m.addr.clone());
    match leader_addr {
        Some(l) if here.leader != Some(here.id) => match admin(tls, &l, AdminRequest::Status).await {
            Ok(AdminResponse::Status(s)) => Ok(s),
            _ => Ok(here),
        },
        _ => Ok(here),
    }
}

/// `tally cluster status` as text.
pub fn render(s: &ClusterStatus) -> String {
    let mut out = format!(
        "leader: {}\nterm: {}\nasked: replica {} ({})\nmembers:\n",
        s.leader.map_or_else(|| "none".to_string(), |l| l.to_string()),
        s.term,
        s.id,
        s.state
    );
    for m in &s.members {
        out.push_str(&format!(
            "  {} {} {}{} matched {}\n",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" },
            if s.leader == Some(m.id) { " (leader)" } else { "" },
            m.matched.map_or_else(|| "-".to_string(), |i| i.to_string()),
        ));
    }
    out
}
