//! Three replicas in one process over the real peer endpoint (gRPC, mutual TLS with
//! peer certificates on 127.0.0.1): election, the replicated run log, refusals of
//! followers and of certificates that name no member, and a new leader after the old
//! one stops; a fourth replica joins through `Admin` and a stopped one is removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tally_common::pki::{AgentLeaf, Ca, ExtendedKeyUsagePurpose, Role, init_peer_certs};
use tally_coordinator::client::TlsMaterial;
use tally_coordinator::cluster_config::ClusterConfig;
use tally_coordinator::raft::network::{PeerConn, PeerError, Rpc};
use tally_coordinator::raft::peer::{
    AdminRequest, AdminResponse, ForwardRequest, ForwardResponse, Forwarded,
};
use tally_coordinator::raft::{Node, RaftRunLog};
use tally_coordinator::runlog::{RunLog, RunLogError};
use tokio::sync::oneshot;

struct NoForward;

#[tonic::async_trait]
impl Forwarded for NoForward {
    async fn forwarded(&self, _: ForwardRequest) -> ForwardResponse {
        ForwardResponse {
            status: 501,
            body: Value::Null,
        }
    }
}

struct Replica {
    node: Node,
    log: RaftRunLog,
    stop: Option<oneshot::Sender<()>>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cluster_cfg(dir: &Path, id: u64, port: u16, members: &[String], snapshot_logs: u64) -> ClusterConfig {
    let certs = dir.join("certs");
    let yaml = format!(
        "node_id: {id}\nlisten: 127.0.0.1:{port}\nadvertise: 'localhost:{port}'\n\
         tls: {{ cert: {0}/peer-r{id}.pem, key: {0}/peer-r{id}-key.pem, ca: {0}/peer-ca.pem }}\n\
         initial_members: [{1}]\nsnapshot_logs: {snapshot_logs}\n",
        certs.display(),
        members
            .iter()
            .map(|m| format!("'{m}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let c: ClusterConfig = tally_common::config_file::parse_yaml(Path::new("cluster.yaml"), &yaml).unwrap();
    c.validate(Path::new("cluster.yaml")).unwrap();
    c
}

async fn start(dir: &Path, id: u64, port: u16, members: &[String]) -> Replica {
    start_with(dir, id, port, members, 10).await
}

async fn start_with(dir: &Path, id: u64, port: u16, members: &[String], snapshot_logs: u64) -> Replica {
    let cfg = cluster_cfg(dir, id, port, members, snapshot_logs);
    let data: PathBuf = dir.join(format!("r{id}"));
    let node = tally_coordinator::raft::node::start(&cfg, Path::new("cluster.yaml"), &data)
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    node.serve_peers(Arc::new(NoForward), async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let log = RaftRunLog::new(node.raft.clone(), node.reader.clone());
    Replica {
        node,
        log,
        stop: Some(stop),
    }
}

async fn leader(replicas: &[&Replica], within: Duration) -> usize {
    let until = Instant::now() + within;
    loop {
        if let Some(i) = replicas.iter().position(|r| r.node.is_leader()) {
            return i;
        }
        assert!(Instant::now() < until, "no leader elected within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ev(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

async fn wait_events(log: &RaftRunLog, run: &str, n: usize) -> Vec<Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let events = log.load(run).await.unwrap();
        if events.len() >= n {
            return events;
        }
        assert!(
            Instant::now() < until,
            "{run}: {} of {n} events replicated",
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_replicate_the_run_log_refuse_strangers_elect_a_new_leader_and_take_a_joining_one() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let peers: Vec<AgentLeaf> = (1..=4).map(|i| AgentLeaf::new(format!("r{i}"))).collect();
    init_peer_certs(&dir.path().join("certs"), &peers).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let members: Vec<String> = ports.iter().map(|p| format!("localhost:{p}")).collect();
    let mut replicas = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        replicas.push(start(dir.path(), i as u64 + 1, *port, &members).await);
    }
    let l = leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;

    // the leader appends; every replica loads the same verified chain
    let a = replicas[l]
        .log
        .append("run-1", ev(json!({"event": "started", "name": "x"})))
        .await
        .unwrap();
    assert_eq!(a.seq, 1);
    let b = replicas[l]
        .log
        .append("run-1", ev(json!({"event": "level", "level": 1})))
        .await
        .unwrap();
    assert_eq!(b.seq, 2);
    let on_leader = replicas[l].log.load("run-1").await.unwrap();
    for r in &replicas {
        assert_eq!(wait_events(&r.log, "run-1", 2).await, on_leader);
        let heads = r.log.runs().await.unwrap();
        assert_eq!(heads.len(), 1);
        assert_eq!((heads[0].events, heads[0].head.as_str()), (2, b.head.as_str()));
    }

    // a follower's append is refused and names the leader
    let f = (l + 1) % 3;
    let e = replicas[f]
        .log
        .append("run-1", ev(json!({"event": "level", "level": 2})))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RunLogError::NotLeader { leader: Some(a) } if *a == members[l]),
        "{e}"
    );

    // a peer-CA certificate that names no member is refused; one of another CA fails TLS
    let certs = dir.path().join("certs");
    let read = |f: &str| std::fs::read_to_string(certs.join(f)).unwrap();
    let peer_ca = Ca::from_pem(&read("peer-ca.pem"), &read("peer-ca-key.pem")).unwrap();
    let usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let stranger = peer_ca
        .issue_with_usages("stranger", Role::Client, &[], usages.clone())
        .unwrap();
    let material = |cert: String, key: String| TlsMaterial {
        ca: read("peer-ca.pem").into_bytes(),
        cert: cert.into_bytes(),
        key: key.into_bytes(),
    };
    let conn = PeerConn::new(&members[l], &material(stranger.cert, stranger.key)).unwrap();
    let e = conn
        .call::<_, AdminResponse>(Rpc::Admin, &AdminRequest::Status, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            PeerError::Status {
                code: tonic::Code::PermissionDenied,
                ..
            }
        ),
        "{e}"
    );
    let other = Ca::generate("other")
        .unwrap()
        .issue_with_usages("r1", Role::Server, &[], usages)
        .unwrap();
    let conn = PeerConn::new(&members[l], &material(other.cert, other.key)).unwrap();
    assert!(
        conn.call::<_, AdminResponse>(Rpc::Admin, &AdminRequest::Status, Duration::from_secs(10))
            .await
            .is_err()
    );
    // a member's certificate may ask
    let conn = PeerConn::new(
        &members[l],
        &material(read("peer-r2.pem"), read("peer-r2-key.pem")),
    )
    .unwrap();
    let status = conn
        .call::<_, AdminResponse>(Rpc::Admin, &AdminRequest::Status, Duration::from_secs(10))
        .await
        .unwrap();
    let AdminResponse::Status(s) = status else {
        panic!("{status:?}")
    };
    assert_eq!(s.leader, Some(l as u64 + 1));
    assert_eq!(s.members.len(), 3);
    assert!(s.members.iter().all(|m| m.voter && m.matched.is_some()), "{s:?}");

    // the leader stops: the other two elect one, which continues the run's chain
    let mut old = replicas.remove(l);
    let _ = old.stop.take().unwrap().send(());
    old.node.raft.shutdown().await.unwrap();
    let t0 = Instant::now();
    let l2 = leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
    eprintln!("new leader after {:?}", t0.elapsed());
    let c = replicas[l2]
        .log
        .append("run-1", ev(json!({"event": "level", "level": 2})))
        .await
        .unwrap();
    assert_eq!(c.seq, 3);
    // more entries than the snapshot threshold: the state survives snapshots and purges
    for i in 0..25 {
        replicas[l2]
            .log
            .append(&format!("run-{}", i + 2), ev(json!({"event": "started"})))
            .await
            .unwrap();
    }
    let other = 1 - l2;
    let events = wait_events(&replicas[other].log, "run-1", 3).await;
    assert_eq!(events[2]["level"], 2);
    assert_eq!(events[2]["seq"], 3);
    let until = Instant::now() + Duration::from_secs(10);
    while replicas[other].log.runs().await.unwrap().len() < 26 {
        assert!(Instant::now() < until, "the follower did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // a fourth replica, in no group yet, joins through the leader (as a learner that
    // catches up from a snapshot, then a voter), and the stopped one is removed
    let port4 = free_port();
    replicas.push(start(dir.path(), 4, port4, &[]).await);
    let ask =
        |addr: &str| PeerConn::new(addr, &material(read("peer-r4.pem"), read("peer-r4-key.pem"))).unwrap();
    let leader_addr = format!("localhost:{}", ports[replicas[l2].node.id as usize - 1]);
    let answer = ask(&leader_addr)
        .call::<_, AdminResponse>(
            Rpc::Admin,
            &AdminRequest::Join {
                id: 4,
                addr: format!("localhost:{port4}"),
            },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(matches!(answer, AdminResponse::Done { .. }), "{answer:?}");
    assert_eq!(wait_events(&replicas[2].log, "run-1", 3).await, events);
    assert_eq!(replicas[2].log.runs().await.unwrap().len(), 26);
    // a follower asked to change membership names the leader
    let follower_addr = format!("localhost:{}", ports[replicas[other].node.id as usize - 1]);
    let gone = old.node.id;
    let answer = ask(&follower_addr)
        .call::<_, AdminResponse>(
            Rpc::Admin,
            &AdminRequest::Remove { id: gone },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        matches!(&answer, AdminResponse::NotLeader { leader: Some(a) } if *a == leader_addr),
        "{answer:?}"
    );
    let answer = ask(&leader_addr)
        .call::<_, AdminResponse>(
            Rpc::Admin,
            &AdminRequest::Remove { id: gone },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(matches!(answer, AdminResponse::Done { .. }), "{answer:?}");
    let AdminResponse::Status(s) = ask(&leader_addr)
        .call::<_, AdminResponse>(Rpc::Admin, &AdminRequest::Status, Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("no status")
    };
    let mut ids: Vec<u64> = s.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
    ids.sort();
    let mut want: Vec<u64> = [1, 2, 3, 4].into_iter().filter(|i| *i != gone).collect();
    want.sort();
    assert_eq!(ids, want, "{s:?}");

    for r in &mut replicas {
        let _ = r.stop.take().unwrap().send(());
        r.node.raft.shutdown().await.unwrap();
    }
}

// --- review of the catch-up settings (max_payload_entries 32): openraft 0.9 gives a
// whole AppendEntries call the heartbeat interval (250 ms), whatever its size ---

/// Three replicas that snapshot only every 10 000 entries (so a follower behind is sent
/// entries, not a snapshot), and the leader's index.
async fn three_without_snapshots(dir: &Path) -> (Vec<Replica>, Vec<String>, usize) {
    let peers: Vec<AgentLeaf> = (1..=3).map(|i| AgentLeaf::new(format!("r{i}"))).collect();
    init_peer_certs(&dir.join("certs"), &peers).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let members: Vec<String> = ports.iter().map(|p| format!("localhost:{p}")).collect();
    let mut replicas = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        replicas.push(start_with(dir, i as u64 + 1, *port, &members, 10_000).await);
    }
    let l = leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
    (replicas, members, l)
}

/// A `digests` event of a range of `rows` rows (32 hex digits a row, as the engine
/// records it).
fn digests_event(rows: usize) -> Map<String, Value> {
    let digests = "0123456789abcdef".repeat(rows * 2);
    ev(json!({"event": "digests", "range": 0, "side": "source", "digests": digests}))
}

async fn stop_all(replicas: &mut [Replica]) {
    for r in replicas {
        let _ = r.stop.take().unwrap().send(());
        r.node.raft.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_stopped_through_a_rows_phase_catches_up_from_the_entries() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, members, l) = three_without_snapshots(dir.path()).await;
    let f = (l + 1) % 3;
    let mut gone = replicas.remove(f);
    let _ = gone.stop.take().unwrap().send(());
    gone.node.raft.shutdown().await.unwrap();
    let gone_id = gone.node.id;
    drop(gone);
    let l = leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
    // one run's rows phase at the default threshold: 40 ranges of 16384 rows
    for i in 0..40 {
        replicas[l]
            .log
            .append(&format!("run-{i}"), digests_event(16_384))
            .await
            .unwrap();
    }
    let port = members[gone_id as usize - 1]
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    replicas.push(start_with(dir.path(), gone_id, port, &members, 10_000).await);
    let back = replicas.last().unwrap();
    let t0 = Instant::now();
    let mut have = 0;
    while t0.elapsed() < Duration::from_secs(90) {
        have = back.log.runs().await.unwrap().len();
        if have == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_all(&mut replicas).await;
    assert_eq!(
        have, 40,
        "the restarted follower holds {have} of 40 runs after 90 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "finding: one 4 MB event (a 131072-row range's digests; or a detailed reveal of 1000 wide rows \
            a side) never commits: no follower can take it within openraft's 250 ms AppendEntries timeout, so \
            every later write waits behind it, or the followers, hearing nothing while it is retried, elect \
            another leader and the append fails (NotLeader); a resumed run asks the same answer again"]
async fn a_four_megabyte_event_commits_in_a_group_of_three() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, _, l) = three_without_snapshots(dir.path()).await;
    let t0 = Instant::now();
    let appended = tokio::time::timeout(
        Duration::from_secs(60),
        replicas[l].log.append("big", digests_event(131_072)),
    )
    .await;
    let took = t0.elapsed();
    stop_all(&mut replicas).await;
    assert!(
        matches!(appended, Ok(Ok(_))),
        "a 4 MB event: {appended:?} after {took:?}"
    );
}
