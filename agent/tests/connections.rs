//! Connection pools as an operator meets them: one pool per database URL, shared by
//! every dataset on it and capped by `connections.max_connections`, so an agent with
//! hundreds of datasets on one server stays under the server's own client limit; and
//! calls beyond the cap wait for a connection instead of failing. Each engine runs on a
//! server of this test's own with a low `max_connections`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tally_agent::config::AgentConfig;
use tally_agent::connector::Connector;
use tally_agent::release_log::ReleaseLog;
use tally_agent::server::open_datasets;
use tally_agent::service::AgentService;
use tally_common::segment::Split;
use tally_e2e::db::{self, Server};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent;
use tonic::Request;

/// What the servers admit: far fewer clients than datasets.
const SERVER_MAX_CONNECTIONS: u32 = 20;
const DATASETS: usize = 200;
/// The agent's cap per URL in these tests (below the default, so the key is seen to work).
const CAP: u64 = 5;

fn postgres() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| db::start_postgres_with_max_connections(SERVER_MAX_CONNECTIONS))
}

fn mariadb() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| db::start_mariadb_with_max_connections(SERVER_MAX_CONNECTIONS))
}

/// An agent config (loaded through the file, as the binary does) with `datasets` lines.
fn config(dir: &Path, connections: &str, datasets: &str) -> (AgentConfig, std::path::PathBuf) {
    let path = dir.join("agent.yaml");
    let text = format!(
        "listen: 127.0.0.1:0\n\
         tls: {{ ca: ca.pem, cert: a.pem, key: a-key.pem }}\n\
         {connections}\n\
         datasets:\n{datasets}"
    );
    std::fs::write(&path, text).unwrap();
    (AgentConfig::load(&path).unwrap(), path)
}

/// The agent's service as `tally-agent` builds it: `server::open_datasets`.
fn service(cfg: &AgentConfig, path: &Path) -> Arc<AgentService> {
    Arc::new(AgentService {
        datasets: open_datasets(cfg, path).unwrap(),
        log: Arc::new(ReleaseLog::open(None).unwrap()),
        reveals: Default::default(),
        zone: None,
        identity: Arc::new(identity()),
        waits: Arc::new(tokio::sync::Semaphore::new(tally_agent::service::MAX_WAITS)),
    })
}

/// A signing identity from a CA of the test's own.
fn identity() -> tally_agent::sealing::Identity {
    let ca = tally_common::pki::Ca::generate("connections test").unwrap();
    let pem = ca.issue("a", tally_common::pki::Role::Server, &[]).unwrap();
    tally_agent::sealing::Identity::from_pem("a", &pem.cert, &pem.key).unwrap()
}

fn aggregate_whole(dataset: &str) -> pb::AggregateRequest {
    let int = |n: &str| pb::ColumnRef {
        name: n.into(),
        type_class: pb::TypeClass::Integer as i32,
        scale: 0,
        fixed_char: false,
        exact: false,
    };
    pb::AggregateRequest {
        dataset: dataset.into(),
        columns: vec![int("id"), int("v")],
        key_len: 1,
        method: pb::HashMethod::Sha25664 as i32,
        segments: vec![pb::SegmentSplit {
            segment: Some(pb::Segment::default()),
            split: Some(Split::Whole.to_pb()),
        }],
        in_process: false,
        seal: None,
        run_id: "connections".into(),
        side: String::new(),
    }
}

/// Samples `count_sql` (one integer) every few milliseconds until `done`; the peak.
fn sample_peak(sampler: Connector, count_sql: String, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let peak = AtomicU64::new(0);
        while !done.load(Ordering::Relaxed) {
            let n: u64 = sampler
                .query_text("sampler", &count_sql)
                .await
                .unwrap()
                .unwrap()
                .parse()
                .unwrap();
            peak.fetch_max(n, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak.into_inner()
    })
}

/// `DATASETS` datasets on one URL, Describe and Aggregate on all of them at once: all
/// succeed, and the server never sees more than `CAP` agent connections (`count_sql`,
/// run from `sampler_url`, counts them).
async fn many_datasets_share_one_capped_pool(url: &str, sampler_url: &str, count_sql: &str) {
    let dir = tempfile::tempdir().unwrap();
    let datasets: String = (0..DATASETS)
        .map(|i| {
            format!(
                "  d{i}: {{ url: '{url}', table: t{}, key: [id], policy: {{ allow_unsealed: true }} }}\n",
                i % 10
            )
        })
        .collect();
    let (cfg, path) = config(
        dir.path(),
        &format!("connections: {{ max_connections: {CAP} }}"),
        &datasets,
    );
    let svc = service(&cfg, &path);
    let done = Arc::new(AtomicBool::new(false));
    let peak = sample_peak(
        Connector::open(sampler_url).unwrap(),
        count_sql.to_string(),
        done.clone(),
    );
    let started = Instant::now();
    let calls: Vec<_> = (0..DATASETS)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let name = format!("d{i}");
                let d = svc
                    .describe(Request::new(pb::DescribeRequest {
                        dataset: name.clone(),
                    }))
                    .await
                    .map_err(|s| format!("describe {name}: {s:?}"))?
                    .into_inner();
                assert!(d.key_max.is_some(), "{name}: no key range");
                let a = svc
                    .aggregate(Request::new(aggregate_whole(&name)))
                    .await
                    .map_err(|s| format!("aggregate {name}: {s:?}"))?
                    .into_inner();
                Ok::<u64, String>(a.buckets[0].count)
            })
        })
        .collect();
    let mut failures = Vec::new();
    for c in calls {
        match c.await.unwrap() {
            Ok(n) => assert_eq!(n, 100),
            Err(e) => failures.push(e),
        }
    }
    done.store(true, Ordering::Relaxed);
    let peak = peak.await.unwrap();
    eprintln!(
        "{DATASETS} datasets, cap {CAP}: {} s, peak {peak} agent connections",
        started.elapsed().as_secs_f32()
    );
    assert!(
        failures.is_empty(),
        "{} calls failed, first: {}",
        failures.len(),
        failures[0]
    );
    assert!(peak <= CAP, "{peak} connections to one URL, cap {CAP}");
    assert!(peak >= 2, "the calls ran concurrently (peak {peak})");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_postgres_datasets_stay_within_the_cap() {
    let pg = postgres();
    let url = pg.create_database("pool_many");
    let mut sql = String::new();
    for t in 0..10 {
        sql.push_str(&format!(
            "CREATE TABLE t{t} AS SELECT g AS id, g * {t} AS v FROM generate_series(1, 100) g;\n"
        ));
    }
    pg.exec(Some("pool_many"), &sql);
    many_datasets_share_one_capped_pool(
        &url,
        &pg.url("postgres"),
        "SELECT count(*)::text FROM pg_stat_activity \
         WHERE application_name = 'tally-agent' AND datname = 'pool_many'",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_mariadb_datasets_stay_within_the_cap() {
    let my = mariadb();
    let url = my.create_database("pool_many");
    let mut sql = String::new();
    for t in 0..10 {
        sql.push_str(&format!(
            "CREATE TABLE t{t} (id BIGINT PRIMARY KEY, v BIGINT) \
             SELECT seq AS id, seq * {t} AS v FROM seq_1_to_100;\n"
        ));
    }
    my.exec(Some("pool_many"), &sql);
    many_datasets_share_one_capped_pool(
        &url,
        &my.url("mysql"),
        "SELECT CAST(count(*) AS CHAR) FROM information_schema.PROCESSLIST WHERE DB = 'pool_many'",
    )
    .await;
}

/// With one connection allowed, calls that each hold it for seconds queue behind one
/// another for longer than the connect timeout, and every one of them succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn calls_beyond_the_cap_wait_longer_than_the_connect_timeout() {
    let pg = postgres();
    let url = pg.create_database("pool_queue");
    pg.exec(
        Some("pool_queue"),
        "CREATE TABLE slow AS SELECT g AS id, g AS v FROM generate_series(1, 30) g;",
    );
    // each scan sleeps 0.1 s per row: 3 s holding the one connection
    let datasets: String = (0..3)
        .map(|i| {
            format!(
                "  s{i}: {{ url: '{url}', query: 'SELECT id, v FROM slow, LATERAL (SELECT pg_sleep(0.1 * sign(slow.id))) z', key: [id], policy: {{ allow_unsealed: true }} }}\n"
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, path) = config(dir.path(), "connections: { max_connections: 1 }", &datasets);
    let svc = service(&cfg, &path);
    let started = Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                svc.aggregate(Request::new(aggregate_whole(&format!("s{i}"))))
                    .await
            })
        })
        .collect();
    for c in calls {
        let r = c
            .await
            .unwrap()
            .unwrap_or_else(|s| panic!("a queued call failed: {s:?}"));
        assert_eq!(r.into_inner().buckets[0].count, 30);
    }
    let took = started.elapsed();
    // one scan at a time: the last one waited for two, 6 s, beyond CONNECT_TIMEOUT (5 s)
    assert!(
        took >= Duration::from_secs(8),
        "the cap of 1 was not held: {took:?}"
    );
}

/// With one connection allowed to `url`, a call on the dataset `slow` (a query
/// returning 30 rows, one every 0.1 s) is cancelled after 1 s, as when the coordinator
/// goes away and its request future is dropped; then calls on `fast` (the same 30 rows)
/// must get a clean connection and succeed.
async fn a_cancelled_call_leaves_the_pool_clean(url: &str, slow_query: &str) {
    let datasets = format!(
        "  slow: {{ url: '{url}', query: '{slow_query}', key: [id], policy: {{ allow_unsealed: true }} }}\n\
         \x20 fast: {{ url: '{url}', table: slow, key: [id], policy: {{ allow_unsealed: true }} }}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let (cfg, path) = config(dir.path(), "connections: { max_connections: 1 }", &datasets);
    let svc = service(&cfg, &path);
    let cut = tokio::time::timeout(
        Duration::from_secs(1),
        svc.aggregate(Request::new(aggregate_whole("slow"))),
    )
    .await;
    assert!(cut.is_err(), "the slow scan should still have been running");
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            svc.aggregate(Request::new(aggregate_whole("fast"))),
        )
        .await
        .expect("the next call waited for a poisoned connection")
        .unwrap_or_else(|s| panic!("the next call failed on the connection the cancelled one left: {s:?}"));
        assert_eq!(r.into_inner().buckets[0].count, 30);
    }
}

/// A call cancelled mid-COPY must not hand the half-read connection to the next call.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_cancelled_mid_copy_does_not_poison_the_pool() {
    let pg = postgres();
    let url = pg.create_database("pool_cancel");
    pg.exec(
        Some("pool_cancel"),
        "CREATE TABLE slow AS SELECT g AS id, g AS v FROM generate_series(1, 30) g;",
    );
    a_cancelled_call_leaves_the_pool_clean(
        &url,
        "SELECT id, v FROM slow, LATERAL (SELECT pg_sleep(0.1 * sign(slow.id))) z",
    )
    .await;
}

/// The same on MariaDB: a row stream dropped mid-way leaves no half-read result on
/// the pooled connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_mariadb_call_cancelled_mid_scan_does_not_poison_the_pool() {
    let my = mariadb();
    let url = my.create_database("pool_cancel");
    my.exec(
        Some("pool_cancel"),
        "CREATE TABLE slow (id BIGINT PRIMARY KEY, v BIGINT) SELECT seq AS id, seq AS v FROM seq_1_to_30;",
    );
    a_cancelled_call_leaves_the_pool_clean(&url, "SELECT id, v + SLEEP(0.1) AS v FROM slow").await;
}
