//! The agent as its callers see it: a real gRPC server with mutual TLS, called by a
//! client built here (not the coordinator: these are the requests a compromised or
//! buggy coordinator could send). Checks the TLS boundary, policy enforcement, error
//! codes without driver text, the release log, and a database that fails mid-call.

use std::path::{Path, PathBuf};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use tally_agent::config::AgentConfig;
use tally_agent::release_log::verify_chain;
use tally_common::canonical::row_string;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::checksum::{key_hash, sha256_64};
use tally_common::config_file::parse_yaml;
use tally_common::pki::{Ca, Pem, Role};
use tally_common::seal::{
    Party, PeerVerifier, SignedZoneKey, TlsSigner, ZoneSecret, certificates_from_pem, derive_run_keys,
    sign_zone_key,
};
use tally_common::segment::bucket_hash;
use tally_common::segment::{KeyPart, Segment, Split};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_client::AgentClient;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

struct Fixture {
    dir: tempfile::TempDir,
    ca: &'static Ca,
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Fixture {
    fn log(&self) -> PathBuf {
        self.dir.path().join("logs/release.jsonl")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn sqlite_table(path: &Path) {
    use sqlx::Connection;
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    let mut sql = String::from(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, secret TEXT);\n\
         CREATE TABLE big (id INTEGER PRIMARY KEY, name TEXT, secret TEXT);\n\
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100000) \
         INSERT INTO big SELECT i, 'name ' || i, 'secret ' || i FROM c;\n",
    );
    for i in 1..=200 {
        sql.push_str(&format!(
            "INSERT INTO t VALUES ({i}, 'name {i}', 'secret {i}');\n"
        ));
    }
    // an event time (a listed time column) and a date of birth (not listed)
    sql.push_str("CREATE TABLE ev (id INTEGER PRIMARY KEY, at DATE, born DATE);\n");
    for i in 1..=60 {
        sql.push_str(&format!(
            "INSERT INTO ev VALUES ({i}, '2024-0{}-01', '{}-01-{:02}');\n",
            1 + i % 3,
            1900 + i,
            1 + i % 28
        ));
    }
    // sales by region: amount (a decimal) and qty
    sql.push_str(
        "CREATE TABLE sales (id INTEGER PRIMARY KEY, region TEXT, amount DECIMAL(12,2), qty INTEGER);\n",
    );
    for i in 1..=30 {
        sql.push_str(&format!(
            "INSERT INTO sales VALUES ({i}, '{}', {}.{:02}, {});\n",
            ["EU", "US", "eu"][i % 3],
            i * 10,
            i % 100,
            i % 7
        ));
    }
    // an empty string, a NULL and a text (`empty_string_is_null` datasets)
    sql.push_str("CREATE TABLE es (id INTEGER PRIMARY KEY, v TEXT);\nINSERT INTO es VALUES (1, ''), (2, NULL), (3, 'x');\n");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
}

/// An agent on 127.0.0.1 with a few SQLite datasets (and any extra dataset YAML).
async fn start(extra_datasets: &str) -> Fixture {
    start_with(extra_datasets, ", allowed_clients: [coordinator]", None).await
}

/// [`start`] with `tls_extra` appended to the `tls:` map (`""`: the defaults) and the
/// server certificate `server` (an agent leaf named dc1 unless given).
async fn start_with(extra_datasets: &str, tls_extra: &str, server: Option<fn(&Ca) -> Pem>) -> Fixture {
    tally_agent::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca();
    let server = match server {
        Some(f) => f(ca),
        None => ca.issue("dc1", Role::Server, &[]).unwrap(),
    };
    write(dir.path(), "ca.pem", &ca.pem.cert);
    write(dir.path(), "dc1.pem", &server.cert);
    write(dir.path(), "dc1-key.pem", &server.key);
    write(dir.path(), "dc1-zone.key", &DC1_ZONE.to_pem());
    let db = dir.path().join("t.db");
    sqlite_table(&db).await;
    let url = format!("sqlite://{}", db.display());
    // `{LITE}` in extra datasets is this fixture's SQLite database
    let extra_datasets = extra_datasets.replace("{LITE}", &url);
    let text = format!(
        "listen: 127.0.0.1:0\n\
         tls: {{ ca: ca.pem, cert: dc1.pem, key: dc1-key.pem, zone_key: dc1-zone.key{tls_extra} }}\n\
         release_log: logs/release.jsonl\n\
         datasets:\n\
         \x20 closed: {{ url: '{url}', table: t, key: [id] }}\n\
         \x20 keys: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, mask_columns: [secret] }} }}\n\
         \x20 detailed: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: detailed, mask_columns: [secret] }} }}\n\
         \x20 hidden: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, expose_key_bounds: false }} }}\n\
         \x20 floor: {{ url: '{url}', table: t, key: [id], policy: {{ min_segment_rows: 50 }} }}\n\
         \x20 big: {{ url: '{url}', table: big, key: [id], policy: {{ max_level: with_keys }} }}\n\
         \x20 events: {{ url: '{url}', table: ev, key: [id], policy: {{ max_level: with_keys, time_columns: [at] }} }}\n\
         \x20 capped: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, max_digest_rows: 100 }} }}\n\
         \x20 rationed: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, max_reveal_rows: 5, max_reveal_rows_per_hour: 8 }} }}\n\
         \x20 paired: {{ url: '{url}', table: t, key: [id], policy: {{ peers: [vpc2] }} }}\n\
         \x20 paired_one: {{ url: '{url}', table: t, key: [id], policy: {{ peers: [vpc2/orders_replica] }} }}\n\
         \x20 unsealed: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, allow_unsealed: true }} }}\n\
         {extra_datasets}"
    );
    let path = write(dir.path(), "agent.yaml", &text);
    let cfg = AgentConfig::load(&path).unwrap();
    let bound = tally_agent::server::bind(&cfg, &path).await.unwrap();
    let endpoint = format!("https://localhost:{}", bound.addr.port());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.serve(async {
        let _ = rx.await;
    }));
    Fixture {
        dir,
        ca,
        endpoint,
        stop: Some(tx),
    }
}

async fn client_with(
    f: &Fixture,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<AgentClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Endpoint::from_shared(f.endpoint.clone())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(AgentClient::new(ch))
}

async fn client_named(f: &Fixture, name: &str) -> AgentClient<Channel> {
    let leaf = f.ca.issue(name, Role::Client, &[]).unwrap();
    client_with(f, &f.ca.pem.cert, Some((&leaf.cert, &leaf.key)))
        .await
        .unwrap()
}

fn cols() -> Vec<pb::ColumnRef> {
    let c = |n: &str, class: pb::TypeClass| pb::ColumnRef {
        name: n.into(),
        type_class: class as i32,
        scale: 0,
        fixed_char: false,
        exact: false,
    };
    vec![
        c("id", pb::TypeClass::Integer),
        c("name", pb::TypeClass::Text),
        c("secret", pb::TypeClass::Text),
    ]
}

/// One CA for every fixture of this binary: the peer agent's certificate below must
/// chain to the CA the agent under test trusts.
fn test_ca() -> &'static Ca {
    static CA: OnceLock<Ca> = OnceLock::new();
    CA.get_or_init(|| Ca::generate("test-ca").unwrap())
}

/// The zone keys of the agent under test (dc1) and of its peer (vpc2): fixed, so a
/// test can compute what the peer zone would (the coordinator cannot).
static DC1_ZONE: LazyLock<ZoneSecret> = LazyLock::new(|| ZoneSecret::from_bytes([0xd1; 32]));
static VPC2_ZONE: LazyLock<ZoneSecret> = LazyLock::new(|| ZoneSecret::from_bytes([0x52; 32]));

/// A run nonce for the tests.
const NONCE: [u8; 16] = [7; 16];

/// vpc2's zone key signed with a vpc2 agent certificate of the test CA.
fn peer_zone_key(name: &str, secret: &ZoneSecret) -> pb::ZoneKey {
    tally_agent::install_crypto_provider();
    let leaf = test_ca().issue(name, Role::Server, &[]).unwrap();
    let signer = TlsSigner::from_pem(leaf.key.as_bytes()).unwrap();
    let certs = certificates_from_pem(leaf.cert.as_bytes()).unwrap();
    sign_zone_key(name, secret, &signer, certs).unwrap().to_pb()
}

/// The seal of a run between dc1 and vpc2.
fn seal() -> pb::Seal {
    seal_with(&NONCE)
}

/// The peer's dataset in the tests' runs.
const PEER_DATASET: &str = "orders_replica";

/// The seal of another run (another nonce) between dc1 and vpc2.
fn seal_with(nonce: &[u8]) -> pb::Seal {
    static PEER: OnceLock<pb::ZoneKey> = OnceLock::new();
    pb::Seal {
        nonce: nonce.to_vec(),
        peer: Some(PEER.get_or_init(|| peer_zone_key("vpc2", &VPC2_ZONE)).clone()),
        peer_dataset: PEER_DATASET.into(),
    }
}

/// The hasher the peer zone (vpc2) derives for a run with dc1's `dataset`: what both
/// agents compute and the coordinator cannot.
fn peer_hasher(dataset: &str) -> Hasher {
    let me = Party {
        agent: "vpc2",
        dataset: PEER_DATASET,
    };
    let dc1 = Party {
        agent: "dc1",
        dataset,
    };
    let keys = derive_run_keys(&VPC2_ZONE, me, dc1, &DC1_ZONE.public(), &NONCE).unwrap();
    Hasher::sealed(HashMethod::SealedSha256_64, &keys)
}

fn agg(dataset: &str, seg: Segment, split: Split) -> pb::AggregateRequest {
    pb::AggregateRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        method: pb::HashMethod::SealedSha25664 as i32,
        segments: vec![pb::SegmentSplit {
            segment: Some(pb::Segment::from(&seg)),
            split: Some(split.to_pb()),
        }],
        in_process: false,
        seal: Some(seal()),
        run_id: "test-run".into(),
        side: "target".into(),
    }
}

fn digests(dataset: &str) -> pb::RowDigestsRequest {
    pb::RowDigestsRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        method: pb::HashMethod::SealedSha25664 as i32,
        segment: Some(pb::Segment::default()),
        level: pb::PrivacyLevel::WithKeys as i32,
        seal: Some(seal()),
        run_id: "test-run".into(),
        side: String::new(),
    }
}

fn reveal(dataset: &str, hashes: Vec<u64>, consent: bool) -> pb::RevealRequest {
    pb::RevealRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        segment: Some(pb::Segment::default()),
        limit: 10,
        key_hashes: hashes,
        level: pb::PrivacyLevel::Detailed as i32,
        consent_acknowledged: consent,
        seal: Some(seal()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_rejects_strangers() {
    let f = start("").await;
    // no client certificate: the handshake fails (or the first call does)
    if let Ok(mut c) = client_with(&f, &f.ca.pem.cert, None).await {
        let e = c
            .describe(pb::DescribeRequest {
                dataset: "closed".into(),
            })
            .await
            .unwrap_err();
        assert_ne!(e.code(), Code::Ok);
    }
    // a certificate from another CA
    let other = Ca::generate("other-ca").unwrap();
    let leaf = other.issue("coordinator", Role::Client, &[]).unwrap();
    if let Ok(mut c) = client_with(&f, &f.ca.pem.cert, Some((&leaf.cert, &leaf.key))).await {
        assert!(
            c.describe(pb::DescribeRequest {
                dataset: "closed".into()
            })
            .await
            .is_err()
        );
    }
    // trusting the wrong CA: the client refuses the agent
    let good = f.ca.issue("coordinator", Role::Client, &[]).unwrap();
    assert!(
        client_with(&f, &other.pem.cert, Some((&good.cert, &good.key)))
            .await
            .is_err()
    );
    // the right CA but a name outside allowed_clients
    let mut intruder = client_named(&f, "intruder").await;
    let e = intruder
        .describe(pb::DescribeRequest {
            dataset: "closed".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("allowed_clients"), "{}", e.message());
    // and the coordinator gets in
    let mut c = client_named(&f, "coordinator").await;
    let d = c
        .describe(pb::DescribeRequest {
            dataset: "closed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.key, vec!["id".to_string()]);
    assert_eq!(d.engine, "sqlite");
    assert_eq!(d.max_level, pb::PrivacyLevel::CountOnly as i32);
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_holds_whatever_the_coordinator_asks() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let denied = |r: Result<_, tonic::Status>, key: &str| {
        let e = r.expect_err("must be refused");
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains(key), "{}", e.message());
    };
    // count_only: aggregates yes, anything row-level no
    c.aggregate(agg("closed", Segment::whole(), Split::Quantile(4)))
        .await
        .unwrap();
    denied(c.row_digests(digests("closed")).await.map(|_| ()), "max_level");
    denied(
        c.reveal_keys(reveal("closed", vec![1], false)).await.map(|_| ()),
        "max_level",
    );
    // with_keys: keys yes, values no
    c.row_digests(digests("keys")).await.unwrap();
    denied(
        c.reveal_rows(reveal("keys", vec![1], true)).await.map(|_| ()),
        "max_level",
    );
    // expose_key_bounds: false allows hash splits only, and no key reveals
    c.aggregate(agg("hidden", Segment::whole(), Split::Hash(8)))
        .await
        .unwrap();
    denied(
        c.aggregate(agg("hidden", Segment::whole(), Split::Quantile(8)))
            .await
            .map(|_| ()),
        "expose_key_bounds",
    );
    let bounded = Segment {
        lower: Some(vec![KeyPart::Int(5)]),
        ..Segment::default()
    };
    denied(
        c.aggregate(agg("hidden", bounded, Split::Hash(2)))
            .await
            .map(|_| ()),
        "expose_key_bounds",
    );
    denied(
        c.reveal_keys(reveal("hidden", vec![1], false)).await.map(|_| ()),
        "expose_key_bounds",
    );
    // min_segment_rows: 200 rows in 8 hash buckets leave some below 50
    denied(
        c.aggregate(agg("floor", Segment::whole(), Split::Hash(8)))
            .await
            .map(|_| ()),
        "min_segment_rows",
    );
    c.aggregate(agg("floor", Segment::whole(), Split::Whole))
        .await
        .unwrap();
    // detailed needs the spec's consent too, and masked columns never come back
    let mut stream = c.row_digests(digests("detailed")).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap().digests[0].key_hash;
    let e = c
        .reveal_rows(reveal("detailed", vec![first], false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let rows = c
        .reveal_rows(reveal("detailed", vec![first], true))
        .await
        .unwrap()
        .into_inner()
        .rows;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].values[1].text.as_deref().unwrap().starts_with("name "));
    assert_eq!(rows[0].values[2].text, None, "masked column revealed");
    // every call is in the release log, chained
    let (records, _) = verify_chain(&f.log()).unwrap();
    assert!(records >= 14, "{records}");
    let log = std::fs::read_to_string(f.log()).unwrap();
    assert!(log.contains("\"denied:max_level\"") && log.contains("\"denied:expose_key_bounds\""));
    assert!(log.contains("\"client\":\"coordinator\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_name_the_field() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let e = c
        .describe(pb::DescribeRequest {
            dataset: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let mut r = agg("closed", Segment::whole(), Split::Whole);
    r.columns[1].name = "no_such_column".into();
    let e = c.aggregate(r).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("no_such_column"), "{}", e.message());
    let mut r = agg("closed", Segment::whole(), Split::Whole);
    r.segments[0].segment = Some(pb::Segment {
        hash_lo: Some(9),
        hash_hi: Some(2),
        ..Default::default()
    });
    let e = c.aggregate(r).await.unwrap_err();
    assert!(e.message().contains("segments[0]"), "{}", e.message());
    let r = agg(
        "closed",
        Segment {
            lower: Some(vec![KeyPart::Text("x".into())]),
            ..Segment::default()
        },
        Split::Whole,
    );
    let e = c.aggregate(r).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// An even split answers the buckets of its cut list (pushed down and in process); one
/// whose even form says other cuts than its list is refused, naming the field, so no
/// agent answers a split other than the list's.
#[tokio::test(flavor = "multi_thread")]
async fn an_even_split_answers_its_cut_list_and_one_that_disagrees_with_it_is_refused() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let e = tally_common::segment::EvenCuts::new(-40, 60, 4).unwrap();
    for in_process in [false, true] {
        let ask = |split: Split| pb::AggregateRequest {
            in_process,
            ..agg("closed", Segment::whole(), split)
        };
        let even = c.aggregate(ask(Split::Even(e))).await.unwrap().into_inner();
        let listed = c
            .aggregate(ask(Split::Cuts(e.cuts())))
            .await
            .unwrap()
            .into_inner();
        let buckets = |r: &pb::AggregateResponse| {
            r.buckets
                .iter()
                .map(|b| (b.child, b.segment.clone(), b.count, b.sum, b.xor))
                .collect::<Vec<_>>()
        };
        assert_eq!(buckets(&even), buckets(&listed), "in process: {in_process}");
        // ids 1..=200 around cuts -40, 20, 80, 140
        let counts: Vec<u64> = even.buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![0, 19, 60, 60, 61], "in process: {in_process}");
        let mut moved = ask(Split::Even(e));
        if let Some(pb::segment_split::Split::Cuts(k)) = &mut moved.segments[0].split {
            k.even.as_mut().unwrap().width = 61;
        }
        let refused = c.aggregate(moved).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("segments[0].split.even")
                && refused
                    .message()
                    .contains("the two forms of one split must agree"),
            "{}",
            refused.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_fails_mid_call_gives_unavailable_and_the_agent_keeps_serving() {
    let pg = tally_e2e::db::postgres();
    let url = pg.create_database("agent_restart");
    pg.exec(
        Some("agent_restart"),
        "CREATE TABLE slow AS SELECT g AS id, g AS v FROM generate_series(1, 40) g;",
    );
    // a dataset whose scan takes ~4 s, so the test can cut its connection mid-query
    let slow = format!(
        "\x20 slow: {{ url: '{url}', query: 'SELECT id, v FROM slow, LATERAL (SELECT pg_sleep(0.1 * sign(slow.id))) z', key: [id] }}\n\
         \x20 down: {{ url: 'postgres://postgres@127.0.0.1:9/nothing', table: t, key: [id] }}\n"
    );
    let f = start(&slow).await;
    let mut c = client_named(&f, "coordinator").await;
    // a database that is not there: UNAVAILABLE, without the driver's text
    let e = c
        .describe(pb::DescribeRequest {
            dataset: "down".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    // the class of the failure, never the driver's own words (addresses, OS errors)
    assert!(
        e.message() == "database of dataset down unavailable (connection refused)",
        "{}",
        e.message()
    );
    // terminate the agent's backend while its aggregate runs
    let int = |n: &str| pb::ColumnRef {
        name: n.into(),
        type_class: pb::TypeClass::Integer as i32,
        scale: 0,
        fixed_char: false,
        exact: false,
    };
    let req = pb::AggregateRequest {
        dataset: "slow".into(),
        columns: vec![int("id"), int("v")],
        key_len: 1,
        method: pb::HashMethod::SealedSha25664 as i32,
        segments: vec![pb::SegmentSplit {
            segment: Some(pb::Segment::default()),
            split: Some(Split::Whole.to_pb()),
        }],
        in_process: false,
        seal: Some(seal()),
        run_id: "test-run".into(),
        side: String::new(),
    };
    let mut c2 = c.clone();
    let r2 = req.clone();
    let call = tokio::spawn(async move { c2.aggregate(r2).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = pg.exec(
        Some("agent_restart"),
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'tally-agent' AND state = 'active';",
    );
    let activity = pg.exec(
        Some("agent_restart"),
        "SELECT application_name, state, left(query, 60) FROM pg_stat_activity;",
    );
    assert_eq!(killed.trim(), "1", "one agent query was running: {activity}");
    let e = call.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(
        !e.message().contains("terminat"),
        "driver text leaked: {}",
        e.message()
    );
    // the agent is still serving, and the next call reconnects
    let ok = c.aggregate(req).await.unwrap().into_inner();
    assert_eq!(ok.buckets[0].count, 40);
    // PostgreSQL aggregates are computed in the agent by default: the backend killed
    // above was streaming rows through COPY
    assert_eq!(ok.path, "in_process");
    c.describe(pb::DescribeRequest {
        dataset: "closed".into(),
    })
    .await
    .unwrap();
}

#[test]
fn the_shipped_example_config_parses() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/agent.yaml");
    let cfg: AgentConfig = parse_yaml(&p, &std::fs::read_to_string(&p).unwrap()).unwrap();
    cfg.validate(&p).unwrap();
}

/// Whether a call with this client succeeds: a refusal may come at the handshake or
/// at the first call (TLS 1.3 checks the client certificate after the client's
/// handshake has finished).
async fn admitted(f: &Fixture, leaf: &Pem) -> Result<(), String> {
    let mut c = client_with(f, &f.ca.pem.cert, Some((&leaf.cert, &leaf.key))).await?;
    c.describe(pb::DescribeRequest {
        dataset: "closed".into(),
    })
    .await
    .map(|_| ())
    .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_certificate_cannot_call_another_agent() {
    let f = start_with("", "", None).await;
    // another agent's leaf of the same CA: ServerAuth only
    let vpc2 = f.ca.issue("vpc2", Role::Server, &[]).unwrap();
    let e = admitted(&f, &vpc2).await.unwrap_err();
    assert!(
        !e.starts_with("PermissionDenied"),
        "refused by the handshake, not by name: {e}"
    );
    // even one named like the coordinator: the extended key usage is what refuses it
    let named = f.ca.issue("coordinator", Role::Server, &[]).unwrap();
    let e = admitted(&f, &named).await.unwrap_err();
    assert!(!e.starts_with("PermissionDenied"), "{e}");
    // the coordinator's own certificate is admitted
    admitted(&f, &f.ca.issue("coordinator", Role::Client, &[]).unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_clients_default_to_the_coordinator_and_any_opens_the_agent() {
    // no allowed_clients in the config: [coordinator]
    let f = start_with("", "", None).await;
    let other = f.ca.issue("other", Role::Client, &[]).unwrap();
    let e = admitted(&f, &other).await.unwrap_err();
    assert!(
        e.starts_with("PermissionDenied") && e.contains("allowed_clients"),
        "{e}"
    );
    // names are the DNS SANs: one of them naming the coordinator admits the client
    let sans =
        f.ca.issue("other", Role::Client, &["coordinator".into()])
            .unwrap();
    admitted(&f, &sans).await.unwrap();
    drop(f);
    let f = start_with("", ", allowed_clients: any", None).await;
    let other = f.ca.issue("other", Role::Client, &[]).unwrap();
    admitted(&f, &other).await.unwrap();
    // any is any client of the CA: a certificate of another CA is still refused
    let stranger = Ca::generate("other-ca")
        .unwrap()
        .issue("other", Role::Client, &[])
        .unwrap();
    assert!(admitted(&f, &stranger).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_certificate_cannot_serve_as_an_agent() {
    // an agent configured with the coordinator's ClientAuth-only certificate: a client
    // that checks ServerAuth (tonic's rustls, as the coordinator does) refuses it
    let f = start_with(
        "",
        "",
        Some(|ca: &Ca| {
            ca.issue("coordinator", Role::Client, &["localhost".into()])
                .unwrap()
        }),
    )
    .await;
    let leaf = f.ca.issue("coordinator", Role::Client, &[]).unwrap();
    let e = admitted(&f, &leaf).await.unwrap_err();
    assert!(
        e.to_lowercase().contains("usage") || e.contains("Eku") || e.contains("InvalidCertificate"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_response_carries_the_release_log_head() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let d = c
        .describe(pb::DescribeRequest {
            dataset: "closed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.release_log_head, verify_chain(&f.log()).unwrap().1);
    let a = c
        .aggregate(agg("closed", Segment::whole(), Split::Quantile(4)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.release_log_head, verify_chain(&f.log()).unwrap().1);
    let line = last_line(&f);
    assert_eq!(line["rpc"], "Aggregate");
    assert_eq!(line["outcome"], "ok");
    assert_eq!(line["request"]["splits"], serde_json::json!({"quantile": 1}));
    assert_eq!(line["request"]["columns"][1]["class"], "text");
    assert_eq!(line["released"]["buckets"], 4);
    assert_eq!(line["released"]["total_count"], "200");
    assert_eq!(line["request_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(line["released"]["buckets_sha256"].as_str().unwrap().len(), 64);
    // the same request gives the same digest; another segment another
    c.aggregate(agg("closed", Segment::whole(), Split::Quantile(4)))
        .await
        .unwrap();
    assert_eq!(last_line(&f)["request_sha256"], line["request_sha256"]);
    let bounded = Segment {
        lower: Some(vec![KeyPart::Int(7)]),
        ..Segment::default()
    };
    c.aggregate(agg("closed", bounded, Split::Quantile(4)))
        .await
        .unwrap();
    let l = last_line(&f);
    assert_ne!(l["request_sha256"], line["request_sha256"]);
    assert_eq!(l["request"]["key_bounds"], true);
    assert!(
        !l.to_string().contains("\"int\""),
        "key values are digested, not logged: {l}"
    );
    // a row-digest stream: every batch carries the head of its `started` line, a last
    // empty batch the head of the line that closed it
    let mut stream = c.row_digests(digests("keys")).await.unwrap().into_inner();
    let (mut n, mut heads) = (0, Vec::new());
    while let Some(b) = stream.message().await.unwrap() {
        n += b.digests.len();
        heads.push((b.digests.is_empty(), b.release_log_head));
    }
    assert_eq!(n, 200);
    let (last_empty, last_head) = heads.pop().unwrap();
    assert!(last_empty);
    assert_eq!(last_head, verify_chain(&f.log()).unwrap().1);
    let lines = lines(&f);
    let (opened, closed) = (&lines[lines.len() - 2], &lines[lines.len() - 1]);
    assert_eq!(
        (opened["rpc"].as_str(), opened["outcome"].as_str()),
        (Some("RowDigests"), Some("started"))
    );
    assert_eq!(closed["outcome"], "ok");
    assert_eq!(closed["released"]["digests"], 200);
    assert_eq!(closed["request_sha256"], opened["request_sha256"]);
    let reveal = c
        .reveal_keys(reveal("keys", vec![1, 2], false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reveal.release_log_head, verify_chain(&f.log()).unwrap().1);
    assert_eq!(last_line(&f)["released"]["rows"], 0);
}

/// A full stream waits for its client without holding a runtime thread: here the one
/// thread serves the agent and the client alike (a blocking wait would never return).
#[tokio::test(flavor = "current_thread")]
async fn a_digest_stream_waits_for_a_slow_client_on_one_thread() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let mut stream = c.row_digests(digests("big")).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    // the agent fills the stream's buffer meanwhile, then waits
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut n = first.digests.len();
    let mut last = first;
    while let Some(b) = stream.message().await.unwrap() {
        n += b.digests.len();
        last = b;
    }
    assert!(last.digests.is_empty() && !last.envelope.is_empty());
    let l = last_line(&f);
    assert_eq!(
        (l["rpc"].as_str(), l["outcome"].as_str()),
        (Some("RowDigests"), Some("ok")),
        "{l}"
    );
    assert_eq!(l["released"]["digests"].as_u64(), Some(n as u64), "{l}");
    assert!(n > 4 * 4096, "more digests than the stream buffers: {n}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_digest_stream_is_logged_as_cancelled() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let mut stream = c.row_digests(digests("big")).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(!first.digests.is_empty());
    drop(stream);
    for _ in 0..100 {
        let l = last_line(&f);
        if l["rpc"] == "RowDigests" && l["outcome"] != "started" {
            assert_eq!(l["outcome"], "cancelled", "{l}");
            let sent = l["released"]["digests"].as_u64().unwrap();
            assert!(sent > 0 && sent < 100_000, "{l}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the stream's end was never logged: {}", last_line(&f));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_log_that_cannot_be_written_refuses_every_call() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    c.aggregate(agg("closed", Segment::whole(), Split::Whole))
        .await
        .unwrap();
    let before = verify_chain(&f.log()).unwrap();
    // the log's directory goes away under the running agent (root ignores chmod)
    std::fs::remove_dir_all(f.dir.path().join("logs")).unwrap();
    let unavailable = |r: Result<(), tonic::Status>| {
        let e = r.expect_err("must fail closed");
        assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
        assert!(e.message().contains("release log"), "{}", e.message());
    };
    unavailable(
        c.aggregate(agg("closed", Segment::whole(), Split::Quantile(4)))
            .await
            .map(|_| ()),
    );
    unavailable(
        c.describe(pb::DescribeRequest {
            dataset: "closed".into(),
        })
        .await
        .map(|_| ()),
    );
    // no digest leaves before its stream is recorded
    unavailable(c.row_digests(digests("keys")).await.map(|_| ()));
    unavailable(c.reveal_keys(reveal("keys", vec![1], false)).await.map(|_| ()));
    // a file replaced by a directory: the same
    std::fs::create_dir_all(f.log()).unwrap();
    unavailable(
        c.aggregate(agg("closed", Segment::whole(), Split::Whole))
            .await
            .map(|_| ()),
    );
    // no refused call advanced the chain: once the file is back, the next line
    // follows the last one written before the directory went away
    std::fs::remove_dir(f.log()).unwrap();
    std::fs::write(f.log(), "").unwrap();
    c.aggregate(agg("closed", Segment::whole(), Split::Whole))
        .await
        .unwrap();
    let l = last_line(&f);
    assert_eq!(l["prev"], before.1.as_str());
    assert_eq!(l["seq"], before.0 + 1);
}

fn lines(f: &Fixture) -> Vec<serde_json::Value> {
    std::fs::read_to_string(f.log())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn last_line(f: &Fixture) -> serde_json::Value {
    lines(f).pop().unwrap()
}

// ---- agent-enforced limits (DESIGN §2): each test is the attack, run as a
// ---- compromised coordinator would

fn agg_many(dataset: &str, parents: Vec<(Segment, Split)>) -> pb::AggregateRequest {
    pb::AggregateRequest {
        segments: parents
            .iter()
            .map(|(seg, split)| pb::SegmentSplit {
                segment: Some(pb::Segment::from(seg)),
                split: Some(split.to_pb()),
            })
            .collect(),
        ..agg(dataset, Segment::whole(), Split::Whole)
    }
}

fn keys(lower: Option<i64>, upper: Option<i64>) -> Segment {
    Segment {
        lower: lower.map(|l| vec![KeyPart::Int(l)]),
        upper: upper.map(|u| vec![KeyPart::Int(u)]),
        ..Segment::default()
    }
}

fn hashed(seg: Segment, lo: u64, hi: u64) -> Segment {
    Segment {
        hash: Some((lo, hi)),
        ..seg
    }
}

fn no_digits(e: &tonic::Status) {
    assert!(
        !e.message().chars().any(|c| c.is_ascii_digit()),
        "a refusal states a count: {}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nested_or_overlapping_parents_in_one_request_are_refused() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    const H: u64 = 1 << 60;
    let refused = |parents: Vec<(Segment, Split)>| agg_many("closed", parents);
    // the differencing attack: [1,k) for k = 6..=10 gives each row's checksum by
    // subtraction
    let nested: Vec<(Segment, Split)> = (6..=10).map(|k| (keys(Some(1), Some(k)), Split::Whole)).collect();
    let attacks = vec![
        ("nested key ranges", nested),
        (
            "a parent containing another",
            vec![
                (Segment::whole(), Split::Whole),
                (keys(Some(5), Some(6)), Split::Whole),
            ],
        ),
        (
            "overlapping key ranges",
            vec![
                (keys(Some(1), Some(50)), Split::Whole),
                (keys(Some(40), None), Split::Whole),
            ],
        ),
        (
            "overlapping hash ranges for one key range",
            vec![
                (hashed(Segment::whole(), 0, H / 2), Split::Whole),
                (hashed(Segment::whole(), H / 2 - 1, H), Split::Whole),
            ],
        ),
        (
            "a hash range inside the whole range",
            vec![
                (Segment::whole(), Split::Hash(2)),
                (hashed(Segment::whole(), 7, 8), Split::Whole),
            ],
        ),
        (
            "the same parent twice",
            vec![
                (keys(Some(1), Some(9)), Split::Whole),
                (keys(Some(1), Some(9)), Split::Whole),
            ],
        ),
        (
            "overlapping key ranges told apart only by hash",
            vec![
                (hashed(keys(Some(1), Some(50)), 0, H / 2), Split::Whole),
                (hashed(keys(Some(2), Some(50)), H / 2, H), Split::Whole),
            ],
        ),
    ];
    for (what, parents) in attacks {
        let e = c.aggregate(refused(parents)).await.expect_err(what);
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {}", e.message());
        assert!(
            e.message().contains("segments[") && e.message().contains("disjoint"),
            "{what}: {}",
            e.message()
        );
    }
    // what the drill sends is served: disjoint key ranges, disjoint hash ranges
    let a = c
        .aggregate(agg_many(
            "closed",
            vec![
                (keys(None, Some(100)), Split::Quantile(2)),
                (keys(Some(100), Some(150)), Split::Whole),
                (keys(Some(150), None), Split::Hash(2)),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.buckets.iter().map(|b| b.count).sum::<u64>(), 200);
    let a = c
        .aggregate(agg_many(
            "closed",
            vec![
                (hashed(Segment::whole(), 0, H / 2), Split::Hash(4)),
                (hashed(Segment::whole(), H / 2, H), Split::Hash(4)),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.buckets.iter().map(|b| b.count).sum::<u64>(), 200);
}

fn event_cols() -> Vec<pb::ColumnRef> {
    let c = |n: &str, class: pb::TypeClass| pb::ColumnRef {
        name: n.into(),
        type_class: class as i32,
        scale: 0,
        fixed_char: false,
        exact: false,
    };
    vec![
        c("id", pb::TypeClass::Integer),
        c("at", pb::TypeClass::Date),
        c("born", pb::TypeClass::Date),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn period_splits_are_served_only_on_listed_time_columns() {
    use tally_common::period::Granularity;
    use tally_common::segment::Period;
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let events = |seg: Segment, split: Split| pb::AggregateRequest {
        columns: event_cols(),
        ..agg("events", seg, split)
    };
    let by_day = |column: &str| Split::Period {
        column: column.into(),
        granularity: Granularity::Day,
    };
    let denied = |e: tonic::Status| {
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains("time_columns"), "{}", e.message());
    };
    // the attack: a per-day histogram of dates of birth, or one row's birthday under
    // a narrow hash range
    denied(
        c.aggregate(events(Segment::whole(), by_day("born")))
            .await
            .unwrap_err(),
    );
    denied(
        c.aggregate(events(hashed(Segment::whole(), 0, 1 << 40), by_day("BORN")))
            .await
            .unwrap_err(),
    );
    // or a period filter on it: a guessed birthday, confirmed by a count
    let guessed = Segment {
        period: Some(Period {
            column: "born".into(),
            granularity: Granularity::Day,
            label: "1941-01-02".into(),
        }),
        ..Segment::default()
    };
    denied(
        c.aggregate(events(guessed.clone(), Split::Whole))
            .await
            .unwrap_err(),
    );
    let mut d = digests("events");
    d.columns = event_cols();
    d.segment = Some(pb::Segment::from(&guessed));
    denied(c.row_digests(d).await.map(|_| ()).unwrap_err());
    let mut r = reveal("events", vec![1], false);
    r.columns = event_cols();
    r.segment = Some(pb::Segment::from(&guessed));
    denied(c.reveal_keys(r).await.unwrap_err());
    // the listed event time is served, by label
    let a = c
        .aggregate(events(Segment::whole(), by_day("at")))
        .await
        .unwrap()
        .into_inner();
    let labels: Vec<String> = a
        .buckets
        .iter()
        .map(|b| b.segment.clone().unwrap().period.unwrap().label)
        .collect();
    assert_eq!(labels, ["2024-01-01", "2024-02-01", "2024-03-01"]);
    assert_eq!(a.buckets.iter().map(|b| b.count).sum::<u64>(), 60);
}

/// A window filters by a column's values: windows of moving bounds on an unlisted
/// column (a date of birth) would count rows born before each date, so every RPC
/// refuses them; a window on a listed column is served, and its answer is signed with
/// the window in its scope.
#[tokio::test(flavor = "multi_thread")]
async fn windows_are_served_only_on_listed_time_columns() {
    use tally_common::segment::Window;
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let events = |seg: Segment| pb::AggregateRequest {
        columns: event_cols(),
        ..agg("events", seg, Split::Whole)
    };
    let window = |column: &str, upper: &str| Segment {
        window: Some(Window {
            column: column.into(),
            upper: upper.into(),
        }),
        ..Segment::default()
    };
    let denied = |e: tonic::Status| {
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(
            e.message().contains("time_columns") && e.message().contains("window"),
            "{}",
            e.message()
        );
    };
    let born = window("born", "1941-01-02");
    denied(c.aggregate(events(born.clone())).await.unwrap_err());
    let mut d = digests("events");
    d.columns = event_cols();
    d.segment = Some(pb::Segment::from(&born));
    denied(c.row_digests(d).await.map(|_| ()).unwrap_err());
    let mut r = reveal("events", vec![1], false);
    r.columns = event_cols();
    r.segment = Some(pb::Segment::from(&born));
    denied(c.reveal_keys(r).await.unwrap_err());
    // the listed event time is served: January and February, not March
    let a = c
        .aggregate(events(window("at", "2024-02-29")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.buckets.iter().map(|b| b.count).sum::<u64>(), 40);
    let env: tally_common::dsse::Envelope = serde_json::from_str(&a.envelope).unwrap();
    let signed = tally_common::evidence::AgentResult::open(&env).unwrap();
    assert!(
        signed.scope.whole,
        "a window's level 1 is still the whole dataset"
    );
    assert_eq!(signed.scope.window, window("at", "2024-02-29").window);
    // the side the coordinator asked for is signed: a bundle cannot swap the sides
    assert_eq!(signed.scope.side, Some(tally_common::wire::Side::Target));
    let mut other = events(window("at", "2024-02-29"));
    other.side = "left".into();
    let e = c.aggregate(other).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("side"), "{}", e.message());
    // the release log records the window's column and bound
    let l = last_line(&f);
    assert_eq!(l["request"]["window"]["column"], "at", "{l}");
    // one request, one window: parents with two windows are refused
    let mut two = events(Segment {
        upper: Some(vec![KeyPart::Int(30)]),
        ..window("at", "2024-01-31")
    });
    two.segments.push(pb::SegmentSplit {
        segment: Some(pb::Segment::from(&Segment {
            lower: Some(vec![KeyPart::Int(30)]),
            ..window("at", "2024-03-31")
        })),
        split: Some(Split::Whole.to_pb()),
    });
    let e = c.aggregate(two).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("different windows"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread")]
async fn row_digests_above_max_digest_rows_are_refused_before_any_digest() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    // the attack: every key hash of the dataset in one stream, open to a dictionary
    let e = c.row_digests(digests("capped")).await.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("max_digest_rows"), "{}", e.message());
    no_digits(&e);
    let l = last_line(&f);
    assert_eq!(l["outcome"], "denied:max_digest_rows", "{l}");
    assert!(
        !lines(&f)
            .iter()
            .any(|l| l["rpc"] == "RowDigests" && l["outcome"] == "started"),
        "a refused stream was started"
    );
    // one row above the limit is too many; the limit itself is served
    for (upper, ok) in [(102, false), (101, true)] {
        let mut d = digests("capped");
        d.segment = Some(pb::Segment::from(&keys(Some(1), Some(upper))));
        match c.row_digests(d).await {
            Err(e) => {
                assert!(!ok, "{}", e.message());
                assert!(e.message().contains("max_digest_rows"));
            }
            Ok(s) => {
                assert!(ok, "101 rows were streamed");
                let mut s = s.into_inner();
                let mut n = 0;
                while let Some(b) = s.message().await.unwrap() {
                    n += b.digests.len();
                }
                assert_eq!(n, 100);
            }
        }
    }
}

/// Every key hash of a dataset under `seal`.
async fn all_key_hashes(c: &mut AgentClient<Channel>, dataset: &str, seal: pb::Seal) -> Vec<u64> {
    let mut s = c
        .row_digests(pb::RowDigestsRequest {
            seal: Some(seal),
            ..digests(dataset)
        })
        .await
        .unwrap()
        .into_inner();
    let mut hashes = Vec::new();
    while let Some(b) = s.message().await.unwrap() {
        hashes.extend(b.digests.iter().map(|d| d.key_hash));
    }
    hashes
}

#[tokio::test(flavor = "multi_thread")]
async fn reveals_beyond_max_reveal_rows_per_run_and_per_hour_are_refused_across_calls() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let hashes = all_key_hashes(&mut c, "rationed", seal()).await;
    assert_eq!(hashes.len(), 200);
    // a hash that matches nothing releases nothing and spends nothing
    let r = c
        .reveal_keys(reveal("rationed", vec![12345], false))
        .await
        .unwrap()
        .into_inner();
    assert!(r.rows.is_empty());
    // the attack: many small calls of one run, each under the per-call cap (the run's
    // budget: 5 rows)
    let mut released = 0;
    let mut refused = None;
    for chunk in hashes.chunks(2).take(10) {
        match c.reveal_keys(reveal("rationed", chunk.to_vec(), false)).await {
            Ok(r) => released += r.into_inner().rows.len(),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert_eq!(released, 5, "the run's budget is 5 rows");
    let e = refused.expect("calls beyond the budget are refused");
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("max_reveal_rows"), "{}", e.message());
    no_digits(&e);
    assert_eq!(last_line(&f)["outcome"], "denied:max_reveal_rows");
    // a new run (a new nonce: new key hashes) has a budget of its own, within the
    // hour's 8 rows: 3 more, then the hour's budget refuses
    let nonce2 = [9u8; 16];
    let hashes2 = all_key_hashes(&mut c, "rationed", seal_with(&nonce2)).await;
    assert!(
        hashes2.iter().all(|h| !hashes.contains(h)),
        "another run keys its hashes anew"
    );
    let r = c
        .reveal_keys(pb::RevealRequest {
            seal: Some(seal_with(&nonce2)),
            ..reveal("rationed", hashes2[..5].to_vec(), false)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.rows.len(), 3, "the hour's budget of 8 leaves 3");
    assert!(r.truncated);
    assert_eq!(
        r.withheld_by, "max_reveal_rows_per_hour",
        "a cut-short answer names its budget"
    );
    let e = c
        .reveal_keys(pb::RevealRequest {
            seal: Some(seal_with(&[10u8; 16])),
            ..reveal("rationed", hashes2[5..7].to_vec(), false)
        })
        .await
        .unwrap_err();
    assert!(
        e.message().contains("max_reveal_rows_per_hour"),
        "{}",
        e.message()
    );
    no_digits(&e);
    // the budget is per dataset: another one still answers
    let first = all_key_hashes(&mut c, "keys", seal()).await[0];
    let r = c
        .reveal_keys(reveal("keys", vec![first], false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.rows.len(), 1);
}

// ---- the hostile coordinator (DESIGN §2, §4.1) ---------------------------------------------
//
// Each attack is written as a compromised coordinator would run it, with everything a
// coordinator holds: its client certificate, the agents' Describe answers (and so the
// peer's signed zone key) and any request it likes. Against a sealed dataset it learns
// nothing; against the same table with `allow_unsealed: true` the same attack succeeds,
// which shows each test can fail.

/// PostgreSQL and MariaDB copies of the fixture's table `t` (id, name, secret), as
/// datasets `pg_*` and `my_*` beside the SQLite ones: sealed, unsealed-allowed, and the
/// same two with `expose_key_bounds: false`.
fn engine_datasets(db: &str) -> String {
    let mut rows = String::new();
    for i in 1..=200 {
        rows.push_str(&format!("({i}, 'name {i}', 'secret {i}'),"));
    }
    rows.pop();
    let create = |q: &str| {
        format!(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, name {q}, secret {q});\nINSERT INTO t VALUES {rows};\n"
        )
    };
    let pg = tally_e2e::db::postgres();
    let pg_url = pg.create_database(db);
    pg.exec(Some(db), &create("TEXT"));
    let my = tally_e2e::db::mariadb();
    let my_url = my.create_database(db);
    my.exec(Some(db), &create("VARCHAR(64)"));
    let mut out = String::new();
    for (e, url) in [("pg", pg_url), ("my", my_url)] {
        for (name, policy) in [
            ("sealed", "max_level: with_keys"),
            ("open", "max_level: with_keys, allow_unsealed: true"),
            ("hidden", "max_level: with_keys, expose_key_bounds: false"),
            (
                "hidden_open",
                "max_level: with_keys, expose_key_bounds: false, allow_unsealed: true",
            ),
        ] {
            out.push_str(&format!(
                "\x20 {e}_{name}: {{ url: '{url}', table: t, key: [id], policy: {{ {policy} }} }}\n"
            ));
        }
    }
    let sqlite = |name: &str, policy: &str| {
        format!("\x20 lite_{name}: {{ url: '{{LITE}}', table: t, key: [id], policy: {{ {policy} }} }}\n")
    };
    out.push_str(&sqlite("sealed", "max_level: with_keys"));
    out.push_str(&sqlite("open", "max_level: with_keys, allow_unsealed: true"));
    out.push_str(&sqlite(
        "hidden",
        "max_level: with_keys, expose_key_bounds: false",
    ));
    out.push_str(&sqlite(
        "hidden_open",
        "max_level: with_keys, expose_key_bounds: false, allow_unsealed: true",
    ));
    out
}

/// The fixture with [`engine_datasets`] in databases named `db`.
async fn start_hostile(db: &str) -> Fixture {
    start(&engine_datasets(db)).await
}

fn id_secret() -> Vec<pb::ColumnRef> {
    let mut c = cols();
    c.remove(1);
    c
}

/// One aggregate of `dataset` over [lo, hi) with [id, secret], sealed or not.
async fn sum_of(
    c: &mut AgentClient<Channel>,
    dataset: &str,
    lo: i64,
    hi: i64,
    sealed: bool,
) -> Result<(u64, u64), tonic::Status> {
    let (method, seal) = if sealed {
        (pb::HashMethod::SealedSha25664, Some(seal()))
    } else {
        (pb::HashMethod::Sha25664, None)
    };
    let r = c
        .aggregate(pb::AggregateRequest {
            columns: id_secret(),
            method: method as i32,
            seal,
            ..agg(dataset, keys(Some(lo), Some(hi)), Split::Whole)
        })
        .await?
        .into_inner();
    Ok((r.buckets[0].count, r.buckets[0].sum))
}

/// The attacker's dictionary: every `secret n` for n below 10 000, as the row string
/// of [id, secret] for key `id`, hashed the way an unsealed agent hashes.
fn brute_force(id: i64, sum: u64) -> Option<u32> {
    (0..10_000).find(|n| {
        let rs = row_string([
            Some(id.to_string().as_str()),
            Some(format!("secret {n}").as_str()),
        ]);
        sha256_64(rs.as_bytes()) == sum
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_single_row_and_differencing_checksums_cannot_be_brute_forced_when_sealed() {
    let f = start_hostile("hostile_sums").await;
    let mut c = client_named(&f, "coordinator").await;
    for e in ["lite", "pg", "my"] {
        let (sealed, open) = (format!("{e}_sealed"), format!("{e}_open"));
        // a one-row key range: its SUM is that row's checksum
        let (n, single) = sum_of(&mut c, &sealed, 42, 43, true).await.unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            brute_force(42, single),
            None,
            "{e}: a sealed checksum gave the value away"
        );
        // differencing: [1, 43) minus [1, 42), two requests, is row 42's checksum too
        let (_, a) = sum_of(&mut c, &sealed, 1, 43, true).await.unwrap();
        let (_, b) = sum_of(&mut c, &sealed, 1, 42, true).await.unwrap();
        assert_eq!(a.wrapping_sub(b), single);
        assert_eq!(brute_force(42, a.wrapping_sub(b)), None, "{e}: differencing");
        // what the sum is for: the peer zone, holding the run key, computes the same
        let rs = row_string([Some("42"), Some("secret 42")]);
        assert_eq!(
            peer_hasher(&sealed).row(rs.as_bytes()),
            single,
            "{e}: the peer agrees"
        );
        // the same table unsealed: the attack works, so this test can fail
        let (_, plain) = sum_of(&mut c, &open, 42, 43, false).await.unwrap();
        assert_eq!(brute_force(42, plain), Some(42), "{e}: the unsealed control");
        let (_, a) = sum_of(&mut c, &open, 1, 43, false).await.unwrap();
        let (_, b) = sum_of(&mut c, &open, 1, 42, false).await.unwrap();
        assert_eq!(
            brute_force(42, a.wrapping_sub(b)),
            Some(42),
            "{e}: unsealed differencing"
        );
        // and a sealed dataset refuses unsealed checksums outright
        let err = sum_of(&mut c, &sealed, 42, 43, false).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{e}: {}", err.message());
        assert!(err.message().contains("allow_unsealed"), "{}", err.message());
    }
    // the masked column `secret` of dataset keys is sealed like any other
    let (_, masked) = sum_of(&mut c, "keys", 42, 43, true).await.unwrap();
    assert_eq!(brute_force(42, masked), None);
}

/// The count in the hash bucket a guessed key would fall in, unsealed.
async fn guess_count(c: &mut AgentClient<Channel>, dataset: &str, guess: i64, sealed: bool) -> u64 {
    let bh = bucket_hash(key_hash(
        row_string([Some(guess.to_string().as_str())]).as_bytes(),
    ));
    let (method, seal) = if sealed {
        (pb::HashMethod::SealedSha25664, Some(seal()))
    } else {
        (pb::HashMethod::Sha25664, None)
    };
    let r = c
        .aggregate(pb::AggregateRequest {
            method: method as i32,
            seal,
            ..agg(dataset, hashed(Segment::whole(), bh, bh + 1), Split::Whole)
        })
        .await
        .unwrap()
        .into_inner();
    r.buckets[0].count
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_keys_stay_in_the_zone_without_key_bounds_when_sealed() {
    let f = start_hostile("hostile_keys").await;
    let mut c = client_named(&f, "coordinator").await;
    let dictionary: Vec<u64> = (1..=1000)
        .map(|i| key_hash(row_string([Some(i.to_string().as_str())]).as_bytes()))
        .collect();
    for e in ["lite", "pg", "my"] {
        let (hidden, open) = (format!("{e}_hidden"), format!("{e}_hidden_open"));
        // membership oracle: a width-1 hash range around a guessed key's bucket
        assert_eq!(
            guess_count(&mut c, &open, 42, false).await,
            1,
            "{e}: unsealed control"
        );
        assert_eq!(
            guess_count(&mut c, &open, 4242, false).await,
            0,
            "{e}: unsealed control"
        );
        assert_eq!(
            guess_count(&mut c, &hidden, 42, true).await,
            0,
            "{e}: a present key was confirmed"
        );
        assert_eq!(guess_count(&mut c, &hidden, 4242, true).await, 0, "{e}");
        // dictionary: every key hash of the dataset against the hashes of guessed keys
        let unsealed_hashes = {
            let mut s = c
                .row_digests(pb::RowDigestsRequest {
                    method: pb::HashMethod::Sha25664 as i32,
                    seal: None,
                    ..digests(&open)
                })
                .await
                .unwrap()
                .into_inner();
            let mut h = Vec::new();
            while let Some(b) = s.message().await.unwrap() {
                h.extend(b.digests.iter().map(|d| d.key_hash));
            }
            h
        };
        let found = |hashes: &[u64]| hashes.iter().filter(|h| dictionary.contains(h)).count();
        assert_eq!(found(&unsealed_hashes), 200, "{e}: unsealed control");
        let sealed_hashes = all_key_hashes(&mut c, &hidden, seal()).await;
        assert_eq!(sealed_hashes.len(), 200);
        assert_eq!(found(&sealed_hashes), 0, "{e}: a sealed key hash matched a guess");
        // key values themselves stay in: reveals and key bounds are refused
        let err = c
            .reveal_keys(reveal(&hidden, sealed_hashes[..1].to_vec(), false))
            .await
            .unwrap_err();
        assert!(err.message().contains("expose_key_bounds"), "{}", err.message());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_the_key_hashes_of_one_dataset_do_not_open_another() {
    // `keys` releases key bounds and digests; `hidden` (the same table) releases no key.
    // The attack: map key 42 to its sealed key hash through `keys`, then probe that
    // bucket in `hidden` under the same seal, or match the two datasets' key hashes.
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let mut s = c
        .row_digests(pb::RowDigestsRequest {
            segment: Some(pb::Segment::from(&keys(Some(42), Some(43)))),
            ..digests("keys")
        })
        .await
        .unwrap()
        .into_inner();
    let kh = s.message().await.unwrap().unwrap().digests[0].key_hash;
    drop(s);
    let bh = bucket_hash(kh);
    let probe = |dataset: &str| agg(dataset, hashed(Segment::whole(), bh, bh + 1), Split::Whole);
    // the control: in `keys` itself the bucket holds the row
    let count = |r: pb::AggregateResponse| r.buckets[0].count;
    assert_eq!(count(c.aggregate(probe("keys")).await.unwrap().into_inner()), 1);
    assert_eq!(count(c.aggregate(probe("hidden")).await.unwrap().into_inner()), 0);
    let in_keys = all_key_hashes(&mut c, "keys", seal()).await;
    let in_hidden = all_key_hashes(&mut c, "hidden", seal()).await;
    assert_eq!((in_keys.len(), in_hidden.len()), (200, 200));
    assert!(in_keys.contains(&kh));
    assert!(
        in_hidden.iter().all(|h| !in_keys.contains(h)),
        "a key hash of one dataset matched another's"
    );
    // the same dataset under the same seal keeps its hashes (the drill depends on it)
    assert_eq!(all_key_hashes(&mut c, "hidden", seal()).await, in_hidden);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_a_forged_or_misnamed_peer_is_refused_before_any_scan() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let with_peer = |peer: pb::ZoneKey| pb::AggregateRequest {
        seal: Some(pb::Seal {
            peer: Some(peer),
            ..seal()
        }),
        ..agg("closed", Segment::whole(), Split::Whole)
    };
    let refused = |e: tonic::Status, why: &str| {
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains(why), "want {why:?}: {}", e.message());
    };
    // the coordinator's own zone key, signed with its ClientAuth certificate
    let mine = ZoneSecret::from_bytes([0xcc; 32]);
    let coord = test_ca().issue("vpc2", Role::Client, &[]).unwrap();
    let forged = sign_zone_key(
        "vpc2",
        &mine,
        &TlsSigner::from_pem(coord.key.as_bytes()).unwrap(),
        certificates_from_pem(coord.cert.as_bytes()).unwrap(),
    )
    .unwrap()
    .to_pb();
    refused(
        c.aggregate(with_peer(forged)).await.unwrap_err(),
        "not an agent certificate",
    );
    // an agent certificate of another CA
    let other = Ca::generate("other-ca").unwrap();
    let leaf = other.issue("vpc2", Role::Server, &[]).unwrap();
    let foreign = sign_zone_key(
        "vpc2",
        &mine,
        &TlsSigner::from_pem(leaf.key.as_bytes()).unwrap(),
        certificates_from_pem(leaf.cert.as_bytes()).unwrap(),
    )
    .unwrap()
    .to_pb();
    refused(
        c.aggregate(with_peer(foreign)).await.unwrap_err(),
        "not an agent certificate",
    );
    // the real peer's zone key with the coordinator's public key swapped in
    let mut swapped = seal().peer.unwrap();
    swapped.public_key = mine.public().to_vec();
    refused(c.aggregate(with_peer(swapped)).await.unwrap_err(), "signature");
    // signed for a name its certificate does not carry
    let mut renamed = peer_zone_key("vpc2", &VPC2_ZONE);
    renamed.agent = "vpc3".into();
    refused(
        c.aggregate(with_peer(renamed)).await.unwrap_err(),
        "not valid for the name",
    );
    // this agent as its own peer
    let me = c
        .describe(pb::DescribeRequest {
            dataset: "closed".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .zone_key
        .expect("a sealing agent offers its zone key");
    assert_eq!(me.agent, "dc1");
    // paired with itself (two of its datasets) the agent answers, under keys of that
    // pair: its sums are not those of the run with vpc2
    let self_pair = c.aggregate(with_peer(me)).await.unwrap().into_inner();
    let with_vpc2 = c
        .aggregate(agg("closed", Segment::whole(), Split::Whole))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(self_pair.buckets[0].sum, with_vpc2.buckets[0].sum);
    assert_eq!(self_pair.buckets[0].count, with_vpc2.buckets[0].count);
    // any other agent certificate of the CA where the dataset names its peers
    let api = peer_zone_key("coordinator-api", &mine);
    c.aggregate(with_peer(api.clone())).await.unwrap();
    let e = c
        .aggregate(pb::AggregateRequest {
            dataset: "paired".into(),
            ..with_peer(api)
        })
        .await
        .unwrap_err();
    refused(e, "peers");
    c.aggregate(pb::AggregateRequest {
        dataset: "paired".into(),
        ..agg("closed", Segment::whole(), Split::Whole)
    })
    .await
    .unwrap();
    // `peers: [vpc2/orders_replica]` names one dataset of the peer only
    let other_dataset = c
        .aggregate(pb::AggregateRequest {
            dataset: "paired_one".into(),
            seal: Some(pb::Seal {
                peer_dataset: "accounts".into(),
                ..seal()
            }),
            ..agg("closed", Segment::whole(), Split::Whole)
        })
        .await
        .unwrap_err();
    refused(other_dataset, "peers");
    c.aggregate(pb::AggregateRequest {
        dataset: "paired_one".into(),
        ..agg("closed", Segment::whole(), Split::Whole)
    })
    .await
    .unwrap();
    // malformed seals name the field
    let e = c
        .aggregate(pb::AggregateRequest {
            seal: Some(pb::Seal {
                nonce: vec![1; 8],
                ..seal()
            }),
            ..agg("closed", Segment::whole(), Split::Whole)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("seal.nonce"), "{}", e.message());
    let e = c
        .aggregate(pb::AggregateRequest {
            seal: Some(pb::Seal {
                peer_dataset: "a\nb".into(),
                ..seal()
            }),
            ..agg("closed", Segment::whole(), Split::Whole)
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("seal.peer_dataset"), "{}", e.message());
    let e = c
        .aggregate(pb::AggregateRequest {
            seal: None,
            ..agg("closed", Segment::whole(), Split::Whole)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("seal"), "{}", e.message());
    let e = c
        .aggregate(pb::AggregateRequest {
            method: pb::HashMethod::Sha25664 as i32,
            ..agg("unsealed", Segment::whole(), Split::Whole)
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("unsealed method"), "{}", e.message());
    // every refusal is in the release log, released nothing
    let refusals: Vec<serde_json::Value> = lines(&f)
        .into_iter()
        .filter(|l| l["rpc"] == "Aggregate" && l["outcome"] != "ok")
        .collect();
    assert_eq!(refusals.len(), 10, "{refusals:?}");
    assert!(refusals.iter().all(|l| l["released"] == serde_json::json!({})));
    let outcomes: Vec<&str> = refusals.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == "denied:seal").count(),
        4,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&"denied:peers"), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_offers_sealed_methods_with_a_signed_zone_key_and_unsealed_only_where_allowed() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let d = |name: &str| pb::DescribeRequest { dataset: name.into() };
    let closed = c.describe(d("closed")).await.unwrap().into_inner();
    assert_eq!(
        closed.hash_methods,
        vec![
            pb::HashMethod::SealedSha25664 as i32,
            pb::HashMethod::SealedMd548 as i32
        ]
    );
    let zk = closed.zone_key.expect("zone key");
    assert_eq!(zk.public_key, DC1_ZONE.public().to_vec());
    // the peer checks it as the agent checks its peer: chain, name, signature
    let verifier = PeerVerifier::from_ca_pem(test_ca().pem.cert.as_bytes()).unwrap();
    verifier
        .verify(&SignedZoneKey::from_pb(zk, "zone_key").unwrap())
        .unwrap();
    let open = c.describe(d("unsealed")).await.unwrap().into_inner();
    assert_eq!(open.hash_methods.len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_floor_refusal_states_no_count() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    // a membership oracle: a one-row range is below the floor of 50, and the old
    // message said how many rows it held
    for upper in [2, 3, 13, 50] {
        let e = c
            .aggregate(agg("floor", keys(Some(1), Some(upper)), Split::Whole))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains("min_segment_rows"), "{}", e.message());
        no_digits(&e);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_scanned_never_states_a_count_below_min_segment_rows() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    // the attack: a narrow hash range leaves every bucket empty (so the floor lets it
    // through) while rows_scanned would count the rows of the key range
    let mut seen = Vec::new();
    for in_process in [false, true] {
        for upper in [2, 11, 31, 121] {
            for seg in [
                keys(Some(1), Some(upper)),
                hashed(keys(Some(1), Some(upper)), 0, 1),
            ] {
                let mut req = agg("floor", seg, Split::Whole);
                req.in_process = in_process;
                if let Ok(a) = c.aggregate(req).await {
                    seen.push(a.into_inner().rows_scanned);
                }
            }
        }
        let mut req = agg("floor", Segment::whole(), Split::Whole);
        req.in_process = in_process;
        let a = c.aggregate(req).await.unwrap().into_inner();
        assert_eq!(a.rows_scanned, 200);
    }
    assert!(seen.len() >= 4, "{seen:?}");
    for n in &seen {
        assert!(
            *n == 0 || *n >= 50,
            "rows_scanned {n} is below the floor: {seen:?}"
        );
        assert_eq!(n % 50, 0, "rows_scanned is rounded to the floor: {seen:?}");
    }
    assert!(seen.contains(&150), "121 rows scan as 150: {seen:?}");
}

fn sales_request(dataset: &str, group_by: &str, measures: &[&str]) -> pb::MeasuresRequest {
    let c = |n: &str, class: pb::TypeClass, scale: u32| pb::ColumnRef {
        name: n.into(),
        type_class: class as i32,
        scale,
        fixed_char: false,
        exact: false,
    };
    pb::MeasuresRequest {
        dataset: dataset.into(),
        columns: vec![
            c("id", pb::TypeClass::Integer, 0),
            c("region", pb::TypeClass::Text, 0),
            c("amount", pb::TypeClass::Decimal, 2),
            c("qty", pb::TypeClass::Integer, 0),
        ],
        key_len: 1,
        group_by: vec![pb::GroupBy {
            column: group_by.into(),
            granularity: String::new(),
        }],
        measures: measures.iter().map(|m| m.to_string()).collect(),
        parents: Vec::new(),
        window: None,
        method: pb::HashMethod::SealedSha25664 as i32,
        seal: Some(seal()),
        run_id: "test-run".into(),
        side: "source".into(),
    }
}

/// Mode measures, asked as a compromised coordinator would: values leave in clear only
/// for the policy's `measures`, labels only for its `group_columns`, never for a key
/// column when key bounds stay in the zone, never unsealed, and an error never carries
/// a value.
#[tokio::test(flavor = "multi_thread")]
async fn measures_release_only_what_the_policy_lists() {
    let f = start(
        "  sales: { url: '{LITE}', table: sales, key: [id], policy: { group_columns: [region, id], measures: [amount] } }\n\
         \x20 sales_hidden: { url: '{LITE}', table: sales, key: [id], policy: { expose_key_bounds: false, group_columns: [region, id], measures: [amount, id] } }\n",
    )
    .await;
    let mut c = client_named(&f, "coordinator").await;
    let r = c
        .measures(sales_request("sales", "region", &["amount", "qty"]))
        .await
        .unwrap()
        .into_inner();
    // EU, US and eu: three groups, bytewise (a case-insensitive collation would merge two)
    let labels: Vec<_> = r
        .groups
        .iter()
        .map(|g| g.labels[0].text.clone().unwrap())
        .collect();
    assert_eq!(labels, vec!["EU", "US", "eu"]);
    let eu = &r.groups[0];
    assert_eq!(eu.count, 10);
    // EU holds ids 3, 6, ..., 30: amounts i * 10 + i / 100
    let sum: i64 = (1..=30).filter(|i| i % 3 == 0).map(|i| i * 1000 + i % 100).sum();
    let amount = &eu.measures[0];
    assert!(amount.clear, "amount is listed in the policy's measures");
    assert_eq!(
        amount.sum.as_deref(),
        Some(
            format!("{}.{:02}", sum / 100, sum % 100)
                .trim_end_matches('0')
                .trim_end_matches('.')
        )
    );
    assert_eq!(amount.non_null, 10);
    let qty = &eu.measures[1];
    assert!(!qty.clear && qty.sum.is_none() && qty.min.is_none() && qty.max.is_none() && qty.non_null == 0);
    assert_ne!(qty.digest, 0);
    let l = last_line(&f);
    assert_eq!(l["rpc"], "Measures");
    assert_eq!(l["released"]["clear"], serde_json::json!([true, false]), "{l}");
    assert_eq!(l["request"]["group_by"][0]["column"], "region", "{l}");
    // the signed answer names what was asked
    let env: tally_common::dsse::Envelope = serde_json::from_str(&r.envelope).unwrap();
    let signed = tally_common::evidence::AgentResult::open(&env).unwrap();
    assert_eq!(signed.scope.group_by, Some(vec!["region".to_string()]));
    assert_eq!(signed.scope.side, Some(tally_common::wire::Side::Source));
    assert_eq!(
        signed.scope.measures,
        Some(vec!["amount".to_string(), "qty".to_string()])
    );
    assert!(signed.scope.whole);

    let denied = |e: tonic::Status, key: &str| {
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains(key), "{key}: {}", e.message());
    };
    // a column the policy does not list cannot label groups
    denied(
        c.measures(sales_request("sales", "qty", &["amount"]))
            .await
            .unwrap_err(),
        "group_columns",
    );
    // nor can a key column where key bounds stay in the zone, as a label or a measure
    denied(
        c.measures(sales_request("sales_hidden", "id", &[]))
            .await
            .unwrap_err(),
        "expose_key_bounds",
    );
    denied(
        c.measures(sales_request("sales_hidden", "region", &["id"]))
            .await
            .unwrap_err(),
        "expose_key_bounds",
    );
    // unsealed: refused (the digests of unlisted measures would be brute-forceable)
    let mut unsealed = sales_request("sales", "region", &["qty"]);
    unsealed.seal = None;
    denied(c.measures(unsealed).await.unwrap_err(), "sealed");
    // a scale too fine to sum exactly is refused before any row is read, so no error
    // can depend on (or carry) a value
    let mut fine = sales_request("sales", "region", &["amount"]);
    fine.columns[2].scale = 31;
    let e = c.measures(fine).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("scale 31"), "{}", e.message());
    // the groups of the level above: only those are split further
    let mut two = sales_request("sales", "region", &["amount"]);
    two.group_by.push(pb::GroupBy {
        column: "id".into(),
        granularity: String::new(),
    });
    two.parents = vec![pb::GroupLabels {
        labels: vec![pb::OptionalText {
            text: Some("US".into()),
        }],
    }];
    let r = c.measures(two).await.unwrap().into_inner();
    assert_eq!(r.groups.len(), 10);
    assert!(
        r.groups
            .iter()
            .all(|g| g.labels[0].text.as_deref() == Some("US") && g.count == 1)
    );
    let env: tally_common::dsse::Envelope = serde_json::from_str(&r.envelope).unwrap();
    assert!(
        !tally_common::evidence::AgentResult::open(&env)
            .unwrap()
            .scope
            .whole
    );
}

/// The key histogram is key values: it leaves the agent only where the policy exposes
/// key bounds, like the key's minimum and maximum (issue 16).
#[tokio::test]
async fn the_key_histogram_leaves_only_with_key_bounds() {
    let pg = tally_e2e::db::postgres();
    let url = pg.create_database("service_histogram");
    pg.exec(
        Some("service_histogram"),
        "CREATE TABLE islands (id bigint PRIMARY KEY, v text);\n\
         INSERT INTO islands SELECT g + CASE WHEN g > 500 THEN 1000000000000000 ELSE 0 END, 'x' FROM generate_series(1, 1000) g;\n\
         ANALYZE islands;",
    );
    let f = start(&format!(
        "\x20 pg_open: {{ url: '{url}', table: islands, key: [id] }}\n\
         \x20 pg_hidden: {{ url: '{url}', table: islands, key: [id], policy: {{ expose_key_bounds: false }} }}\n"
    ))
    .await;
    let mut c = client_named(&f, "coordinator").await;
    let d = |name: &str| pb::DescribeRequest { dataset: name.into() };
    let open = c.describe(d("pg_open")).await.unwrap().into_inner();
    assert!(open.key_histogram.len() >= 10, "{:?}", open.key_histogram);
    assert!(open.key_min.is_some());
    let hidden = c.describe(d("pg_hidden")).await.unwrap().into_inner();
    assert!(hidden.key_histogram.is_empty(), "{:?}", hidden.key_histogram);
    assert!(hidden.key_min.is_none());
}

// ---- the hostile coordinator against the reveal budgets (DESIGN §2) -----------------------
//
// `budget` releases the key values of table `t` (200 rows, every one of them "differing"
// as far as a coordinator can claim) within `max_reveal_rows: 50` per run and
// `max_reveal_rows_per_hour: 120`. Each attack asks for more, with a coordinator's
// certificate, and counts exactly what came out. A RevealRequest carries no run id: the
// run is its seal's nonce, the one thing a coordinator can vary to look like a new run.

const BUDGETS: &str = "\x20 budget: { url: '{LITE}', table: t, key: [id], policy: { max_level: detailed, max_reveal_rows: 50, max_reveal_rows_per_hour: 120 } }\n\
     \x20 budget_open: { url: '{LITE}', table: t, key: [id], policy: { max_level: with_keys, max_reveal_rows: 50, max_reveal_rows_per_hour: 120, allow_unsealed: true } }\n";

/// A page of a reveal: these key hashes of run `nonce`, as many rows as hashes.
fn page(hashes: &[u64], nonce: &[u8]) -> pb::RevealRequest {
    pb::RevealRequest {
        limit: hashes.len() as u32,
        level: pb::PrivacyLevel::WithKeys as i32,
        seal: Some(seal_with(nonce)),
        ..reveal("budget", hashes.to_vec(), false)
    }
}

/// The rows of an answer, each one asked for and released once.
fn rows_of(r: &pb::RevealResponse, asked: &[u64]) -> usize {
    let mut seen = std::collections::HashSet::new();
    for row in &r.rows {
        assert!(asked.contains(&row.key_hash), "a row that was not asked for");
        assert!(seen.insert(row.key_hash), "a row released twice in one answer");
    }
    r.rows.len()
}

/// An answer with every row it asked for.
fn whole_page(r: &pb::RevealResponse, rows: usize) {
    assert_eq!(r.rows.len(), rows);
    assert!(!r.truncated, "a whole page is not truncated");
    assert_eq!(r.withheld_by, "", "nothing was withheld");
}

/// An answer a budget cut short at `rows`, naming the budget.
fn cut_short(r: &pb::RevealResponse, rows: usize, budget: &str) {
    assert_eq!(r.rows.len(), rows, "rows released by the page {budget} cut");
    assert!(r.truncated, "a cut-short answer says it is truncated");
    assert_eq!(r.withheld_by, budget, "a cut-short answer names its budget");
}

/// A call refused by a spent budget, naming it and no count.
fn spent(e: &tonic::Status, budget: &str) {
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains(budget), "want {budget}: {}", e.message());
    if budget == "max_reveal_rows" {
        assert!(!e.message().contains("per_hour"), "{}", e.message());
    }
    no_digits(e);
}

/// The rows the release log says the reveals of `dataset` released.
fn logged_reveal_rows(f: &Fixture, dataset: &str) -> u64 {
    lines(f)
        .iter()
        .filter(|l| l["dataset"] == dataset && l["rpc"].as_str().is_some_and(|r| r.starts_with("Reveal")))
        .map(|l| l["released"]["rows"].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_paging_through_a_large_differing_set_stops_at_the_run_budget() {
    let f = start(BUDGETS).await;
    let mut c = client_named(&f, "coordinator").await;
    let hashes = all_key_hashes(&mut c, "budget", seal()).await;
    assert_eq!(hashes.len(), 200);
    // the attack: all 200 rows of one run, in pages of 30 as a rows phase would ask
    let mut answers = Vec::new();
    for chunk in hashes.chunks(30) {
        answers.push((chunk, c.reveal_keys(page(chunk, &NONCE)).await));
    }
    assert_eq!(answers.len(), 7);
    let mut released = 0;
    for (i, (asked, a)) in answers.iter().enumerate() {
        match (i, a) {
            (0, Ok(r)) => whole_page(r.get_ref(), 30),
            (1, Ok(r)) => cut_short(r.get_ref(), 20, "max_reveal_rows"),
            (_, Err(e)) => spent(e, "max_reveal_rows"),
            (i, a) => panic!("page {i}: {a:?}"),
        }
        if let Ok(r) = a {
            released += rows_of(r.get_ref(), asked);
        }
    }
    assert_eq!(released, 50, "the run's budget is 50 rows");
    // one page as large as the whole set, in the same run: nothing more
    let mut all = page(&hashes, &NONCE);
    all.limit = u32::MAX;
    spent(&c.reveal_keys(all).await.unwrap_err(), "max_reveal_rows");
    // the same nonce with another peer dataset: other key hashes, the same run
    let other_peer = pb::Seal {
        peer_dataset: "accounts".into(),
        ..seal()
    };
    let hashes2 = all_key_hashes(&mut c, "budget", other_peer.clone()).await;
    assert!(hashes2.iter().all(|h| !hashes.contains(h)));
    let e = c
        .reveal_keys(pb::RevealRequest {
            seal: Some(other_peer),
            ..page(&hashes2[..10], &NONCE)
        })
        .await
        .unwrap_err();
    spent(&e, "max_reveal_rows");
    assert_eq!(logged_reveal_rows(&f, "budget"), 50, "the release log agrees");
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_single_row_reveals_add_up_to_the_run_budget_and_no_more() {
    let f = start(BUDGETS).await;
    let mut c = client_named(&f, "coordinator").await;
    let hashes = all_key_hashes(&mut c, "budget", seal()).await;
    // the attack: the same request split into one call per row
    let mut released = 0;
    for h in &hashes[..49] {
        let r = c.reveal_keys(page(&[*h], &NONCE)).await.unwrap().into_inner();
        whole_page(&r, 1);
        released += rows_of(&r, &[*h]);
    }
    // five rows asked, one left
    let r = c
        .reveal_keys(page(&hashes[49..54], &NONCE))
        .await
        .unwrap()
        .into_inner();
    cut_short(&r, 1, "max_reveal_rows");
    released += rows_of(&r, &hashes[49..54]);
    for h in &hashes[54..] {
        spent(
            &c.reveal_keys(page(&[*h], &NONCE)).await.unwrap_err(),
            "max_reveal_rows",
        );
    }
    assert_eq!(released, 50);
    assert_eq!(logged_reveal_rows(&f, "budget"), 50);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_asking_again_for_released_rows_spends_the_budget_again() {
    let f = start(BUDGETS).await;
    let mut c = client_named(&f, "coordinator").await;
    let hashes = all_key_hashes(&mut c, "budget", seal()).await;
    let first = &hashes[..30];
    let r = c.reveal_keys(page(first, &NONCE)).await.unwrap().into_inner();
    whole_page(&r, 30);
    // the same page again, as row values this time (the two reveal RPCs share one
    // budget): a re-release is a release, so 20 rows are left
    let again = c
        .reveal_rows(pb::RevealRequest {
            level: pb::PrivacyLevel::Detailed as i32,
            consent_acknowledged: true,
            ..page(first, &NONCE)
        })
        .await
        .unwrap()
        .into_inner();
    cut_short(&again, 20, "max_reveal_rows");
    assert_eq!(rows_of(&again, first), 20);
    assert!(again.rows.iter().all(|r| r.values.len() == 3));
    // and a third time, as keys: spent
    spent(
        &c.reveal_keys(page(first, &NONCE)).await.unwrap_err(),
        "max_reveal_rows",
    );
    assert_eq!(logged_reveal_rows(&f, "budget"), 50);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_a_fresh_run_per_call_or_no_seal_meets_the_hourly_budget() {
    let f = start(BUDGETS).await;
    let mut c = client_named(&f, "coordinator").await;
    // the attack: a new run (a fresh nonce, its key hashes from RowDigests) per call,
    // 60 rows asked each time
    let mut got = Vec::new();
    for i in 1..=5u8 {
        let nonce = [i; 16];
        let hashes = all_key_hashes(&mut c, "budget", seal_with(&nonce)).await;
        got.push((
            hashes[..60].to_vec(),
            c.reveal_keys(page(&hashes[..60], &nonce)).await,
        ));
    }
    let mut released = 0;
    for (i, (asked, a)) in got.iter().enumerate() {
        match (i, a) {
            // each run's own budget cuts at 50, until the hour's 120 cuts the third
            (0 | 1, Ok(r)) => cut_short(r.get_ref(), 50, "max_reveal_rows"),
            (2, Ok(r)) => cut_short(r.get_ref(), 20, "max_reveal_rows_per_hour"),
            (3 | 4, Err(e)) => spent(e, "max_reveal_rows_per_hour"),
            (i, a) => panic!("run {i}: {a:?}"),
        }
        if let Ok(r) = a {
            released += rows_of(r.get_ref(), asked);
        }
    }
    assert_eq!(released, 120, "the hour's budget is 120 rows");
    // without a seal there is no run at all (where the dataset allows unsealed calls):
    // the call's budget is max_reveal_rows, the hour's holds across calls
    let plain: Vec<u64> = (1..=200i64)
        .map(|id| key_hash(row_string([Some(id.to_string().as_str())]).as_bytes()))
        .collect();
    let open = |hashes: &[u64]| pb::RevealRequest {
        dataset: "budget_open".into(),
        seal: None,
        ..page(hashes, &NONCE)
    };
    let mut released = 0;
    for (i, chunk) in plain.chunks(60).enumerate() {
        match (i, c.reveal_keys(open(chunk)).await) {
            (0 | 1, Ok(r)) => {
                cut_short(r.get_ref(), 50, "max_reveal_rows");
                released += rows_of(r.get_ref(), chunk);
            }
            (2, Ok(r)) => {
                cut_short(r.get_ref(), 20, "max_reveal_rows_per_hour");
                released += rows_of(r.get_ref(), chunk);
            }
            (3, Err(e)) => spent(&e, "max_reveal_rows_per_hour"),
            (i, a) => panic!("unsealed call {i}: {a:?}"),
        }
    }
    assert_eq!(released, 120);
    assert_eq!(logged_reveal_rows(&f, "budget"), 120);
    assert_eq!(logged_reveal_rows(&f, "budget_open"), 120);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_concurrent_reveals_cannot_race_past_the_budgets() {
    let f = start(BUDGETS).await;
    let mut c = client_named(&f, "coordinator").await;
    let hashes = all_key_hashes(&mut c, "budget", seal()).await;
    // the attack: every page of one run at once, each racing the others for the budget
    let calls: Vec<_> = hashes
        .chunks(30)
        .map(|chunk| {
            let (mut c, asked) = (c.clone(), chunk.to_vec());
            tokio::spawn(async move {
                let a = c.reveal_keys(page(&asked, &NONCE)).await;
                (asked, a.map(tonic::Response::into_inner))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    let (mut sizes, mut released) = (Vec::new(), 0);
    for (asked, a) in &answers {
        match a {
            Ok(r) => {
                released += rows_of(r, asked);
                sizes.push(r.rows.len());
                if r.rows.len() < asked.len() {
                    cut_short(r, r.rows.len(), "max_reveal_rows");
                }
            }
            Err(e) => spent(e, "max_reveal_rows"),
        }
    }
    sizes.sort();
    assert_eq!(released, 50, "concurrent calls released {sizes:?}");
    assert_eq!(sizes, vec![20, 30], "one whole page, one cut short");
    // and fresh runs (nonces other than NONCE) at once against the hour's 70 rows left: the first to reserve
    // gets its run's 50, the next the hour's last 20, the rest nothing
    let mut runs = Vec::new();
    for i in 11..=18u8 {
        let nonce = [i; 16];
        let h = all_key_hashes(&mut c, "budget", seal_with(&nonce)).await;
        runs.push((nonce, h[..60].to_vec()));
    }
    let calls: Vec<_> = runs
        .into_iter()
        .map(|(nonce, asked)| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let a = c.reveal_keys(page(&asked, &nonce)).await;
                (asked, a.map(tonic::Response::into_inner))
            })
        })
        .collect();
    let (mut sizes, mut released) = (Vec::new(), 0);
    for call in calls {
        let (asked, a) = call.await.unwrap();
        match a {
            Ok(r) => {
                released += rows_of(&r, &asked);
                sizes.push(r.rows.len());
                let budget = if r.rows.len() == 50 {
                    "max_reveal_rows"
                } else {
                    "max_reveal_rows_per_hour"
                };
                cut_short(&r, r.rows.len(), budget);
            }
            Err(e) => spent(&e, "max_reveal_rows_per_hour"),
        }
    }
    sizes.sort();
    assert_eq!(released, 70, "concurrent runs released {sizes:?}");
    assert_eq!(sizes, vec![20, 50]);
    assert_eq!(logged_reveal_rows(&f, "budget"), 120);
}

// ---- the hostile coordinator against `empty_string_is_null` --------------------------------
//
// Table `es` holds (1, ''), (2, NULL), (3, 'x') on SQLite, PostgreSQL and MariaDB.
// `{e}_es` sets `empty_string_is_null: true`, `{e}_es_kept` does not. The setting is the
// agent's: the coordinator can neither make Describe drop or claim it nor, with any
// request, have row 1 compared other than as (1, NULL).

/// Table `es` on PostgreSQL and MariaDB (databases named `db`) and SQLite, as datasets
/// with and without `empty_string_is_null`; PostgreSQL and MariaDB push down by default,
/// so a request's `in_process` picks the path.
fn empty_string_datasets(db: &str) -> String {
    let create = |q: &str| {
        format!(
            "CREATE TABLE es (id BIGINT PRIMARY KEY, v {q});\nINSERT INTO es VALUES (1, ''), (2, NULL), (3, 'x');\n"
        )
    };
    let pg = tally_e2e::db::postgres();
    let pg_url = pg.create_database(db);
    pg.exec(Some(db), &create("TEXT"));
    let my = tally_e2e::db::mariadb();
    let my_url = my.create_database(db);
    my.exec(Some(db), &create("VARCHAR(64)"));
    let mut out = String::new();
    for (e, url) in [("lite", "{LITE}".to_string()), ("pg", pg_url), ("my", my_url)] {
        let hashing = if e == "lite" { "auto" } else { "pushdown" };
        for (name, setting) in [("es", true), ("es_kept", false)] {
            out.push_str(&format!(
                "\x20 {e}_{name}: {{ url: '{url}', table: es, key: [id], hashing: {hashing}, empty_string_is_null: {setting}, policy: {{ max_level: with_keys }} }}\n"
            ));
        }
    }
    out
}

/// Columns [id, v], v compared as `class`.
fn es_cols(class: pb::TypeClass, fixed_char: bool) -> Vec<pb::ColumnRef> {
    let c = |n: &str, class: pb::TypeClass, fixed_char: bool| pb::ColumnRef {
        name: n.into(),
        type_class: class as i32,
        scale: 0,
        fixed_char,
        exact: false,
    };
    vec![c("id", pb::TypeClass::Integer, false), c("v", class, fixed_char)]
}

/// Row `id`'s checksum in `dataset` as the request asks for it: the sum of the one-row
/// key range, and the row hash of its digest.
async fn es_row(
    c: &mut AgentClient<Channel>,
    dataset: &str,
    id: i64,
    columns: Vec<pb::ColumnRef>,
    in_process: bool,
) -> Result<(u64, u64), tonic::Status> {
    let seg = keys(Some(id), Some(id + 1));
    let a = c
        .aggregate(pb::AggregateRequest {
            columns: columns.clone(),
            in_process,
            ..agg(dataset, seg.clone(), Split::Whole)
        })
        .await?
        .into_inner();
    assert_eq!(a.buckets[0].count, 1);
    let mut s = c
        .row_digests(pb::RowDigestsRequest {
            columns,
            segment: Some(pb::Segment::from(&seg)),
            ..digests(dataset)
        })
        .await?
        .into_inner();
    let mut rows = Vec::new();
    while let Some(b) = s.message().await? {
        rows.extend(b.digests.iter().map(|d| d.row_hash));
    }
    assert_eq!(rows.len(), 1);
    Ok((a.buckets[0].sum, rows[0]))
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_a_request_cannot_turn_empty_string_is_null_off() {
    let f = start(&empty_string_datasets("hostile_empty")).await;
    let mut c = client_named(&f, "coordinator").await;
    for e in ["lite", "pg", "my"] {
        let (es, kept) = (format!("{e}_es"), format!("{e}_es_kept"));
        // Describe states the agent's setting: the request names a dataset, nothing more
        let d = |name: &str| pb::DescribeRequest { dataset: name.into() };
        let on = c.describe(d(&es)).await.unwrap().into_inner();
        assert!(on.empty_string_is_null, "{e}: the setting is claimed");
        assert!(
            on.engine_warnings
                .iter()
                .any(|w| w.contains("empty_string_is_null: true")),
            "{e}: {:?}",
            on.engine_warnings
        );
        let off = c.describe(d(&kept)).await.unwrap().into_inner();
        assert!(!off.empty_string_is_null, "{e}: the setting is not claimed");
        // what the peer zone computes for (1, NULL) and (1, '')
        let as_null = |ds: &str| peer_hasher(ds).row(row_string([Some("1"), None]).as_bytes());
        let as_empty = |ds: &str| peer_hasher(ds).row(row_string([Some("1"), Some("")]).as_bytes());
        let null_row = |ds: &str| peer_hasher(ds).row(row_string([Some("2"), None]).as_bytes());
        // every way a coordinator can ask for the text column: '' is NULL on `es`
        for in_process in [false, true] {
            for fixed_char in [false, true] {
                let cols = es_cols(pb::TypeClass::Text, fixed_char);
                let what = format!("{e} in_process={in_process} fixed_char={fixed_char}");
                let (sum, digest) = es_row(&mut c, &es, 1, cols.clone(), in_process).await.unwrap();
                assert_eq!((sum, digest), (as_null(&es), as_null(&es)), "{what}: '' is NULL");
                let (sum, _) = es_row(&mut c, &es, 2, cols.clone(), in_process).await.unwrap();
                assert_eq!(sum, null_row(&es), "{what}: NULL stays NULL");
                // the control: without the setting '' is ''
                let (sum, digest) = es_row(&mut c, &kept, 1, cols, in_process).await.unwrap();
                assert_eq!(
                    (sum, digest),
                    (as_empty(&kept), as_empty(&kept)),
                    "{what}: control"
                );
            }
            // the text column asked as binary or JSON (cross-class renderings the
            // setting does not cover): refused on `es`, whatever the row
            for class in [pb::TypeClass::Binary, pb::TypeClass::Json] {
                for id in [1, 3] {
                    let what = format!("{e} in_process={in_process} v as {class:?}, row {id}");
                    let err = match es_row(&mut c, &es, id, es_cols(class, false), in_process).await {
                        Ok((sum, _)) => panic!(
                            "{what}: answered, and '' is not NULL there: {}",
                            id == 1 && sum != as_null(&es)
                        ),
                        Err(err) => err,
                    };
                    assert_eq!(err.code(), Code::InvalidArgument, "{what}: {}", err.message());
                    assert!(
                        err.message().contains("empty_string_is_null"),
                        "{e}: {}",
                        err.message()
                    );
                }
            }
            // the control: on `es_kept` the binary rendering of '' is not NULL's
            let (sum, _) = es_row(
                &mut c,
                &kept,
                1,
                es_cols(pb::TypeClass::Binary, false),
                in_process,
            )
            .await
            .unwrap();
            assert_ne!(sum, as_null(&kept), "{e}: binary control");
        }
    }
}

// ---- investigation SQL of keys

/// The first column (an integer id) of every row `sql` selects from the fixture's
/// SQLite database.
async fn ids_selected(f: &Fixture, sql: &str) -> Vec<i64> {
    use sqlx::{Connection, Row};
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(f.dir.path().join("t.db"));
    let mut db = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_all(&mut db)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<i64, _>(0))
        .collect()
}

fn key_sql_request(dataset: &str, keys: &[i64]) -> pb::InvestigationSqlRequest {
    pb::InvestigationSqlRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        keys: keys
            .iter()
            .map(|&k| pb::KeyTuple {
                parts: vec![pb::KeyValue {
                    value: Some(pb::key_value::Value::Int(k)),
                }],
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn investigation_sql_of_keys_is_refused_where_the_policy_reveals_no_keys() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    // count_only: the range's SQL yes, SQL naming keys no (it would carry them)
    c.investigation_sql(key_sql_request("closed", &[]))
        .await
        .expect("range SQL at count_only");
    let e = c
        .investigation_sql(key_sql_request("closed", &[3, 7]))
        .await
        .expect_err("keys at count_only");
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("max_level"), "{}", e.message());
    // with_keys: the SQL selects exactly those keys' rows
    let sql = c
        .investigation_sql(key_sql_request("keys", &[3, 7, 3]))
        .await
        .expect("keys at with_keys")
        .into_inner()
        .sql;
    assert!(sql.contains("IN (3, 7)"), "{sql}");
    let line = last_line(&f);
    assert_eq!(
        line["request"]["keys"], 3,
        "the log counts the tuples asked: {line}"
    );
    assert_eq!(ids_selected(&f, &sql).await, vec![3, 7]);
    // a tuple of another length than the key is refused, naming it
    let mut bad = key_sql_request("keys", &[3]);
    bad.keys[0].parts.push(pb::KeyValue {
        value: Some(pb::key_value::Value::Int(1)),
    });
    let e = c.investigation_sql(bad).await.expect_err("a two-part tuple");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("keys[0]"), "{}", e.message());
}

/// Per-key SQL of many leaves in one call: one answer per item, in order, each naming
/// exactly its keys within its segment; refused where keys are not revealed, and the
/// release log counts the items and their keys.
#[tokio::test]
async fn per_key_sql_of_many_items_answers_each_in_order_under_the_same_policy() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let tuple = |k: i64| pb::KeyTuple {
        parts: vec![pb::KeyValue {
            value: Some(pb::key_value::Value::Int(k)),
        }],
    };
    let upper = |k: i64| pb::Segment {
        upper: Some(tuple(k)),
        ..Default::default()
    };
    let batch = |dataset: &str| pb::InvestigationSqlRequest {
        items: vec![
            pb::KeySqlItem {
                segment: Some(upper(5)),
                keys: vec![tuple(3), tuple(4)],
            },
            pb::KeySqlItem {
                segment: None,
                keys: vec![tuple(7)],
            },
        ],
        ..key_sql_request(dataset, &[])
    };
    let e = c
        .investigation_sql(batch("closed"))
        .await
        .expect_err("items at count_only");
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    let answer = c
        .investigation_sql(batch("keys"))
        .await
        .expect("items at with_keys")
        .into_inner();
    assert!(answer.sql.is_empty(), "{}", answer.sql);
    assert_eq!(answer.sqls.len(), 2, "{:?}", answer.sqls);
    assert!(answer.sqls[0].contains("IN (3, 4)"), "{}", answer.sqls[0]);
    assert!(
        answer.sqls[1].contains("IN (7)") || answer.sqls[1].contains("= 7"),
        "{}",
        answer.sqls[1]
    );
    let line = last_line(&f);
    assert_eq!(
        (line["request"]["items"].clone(), line["request"]["keys"].clone()),
        (serde_json::json!(2), serde_json::json!(3)),
        "the log counts the items and their keys: {line}"
    );
    for (sql, want) in answer.sqls.iter().zip([vec![3i64, 4], vec![7]]) {
        assert_eq!(ids_selected(&f, sql).await, want, "{sql}");
    }
    // keys and items together are refused, naming the field
    let mut both = batch("keys");
    both.keys = vec![tuple(1)];
    let e = c.investigation_sql(both).await.expect_err("keys and items");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("items"), "{}", e.message());
}

/// A hostile coordinator hides a segment the policy refuses inside a batch, behind a
/// harmless first segment: each item is checked as a request of its own would be (a
/// period on a column the policy does not list as a time column), and nothing is
/// answered or released for the batch.
#[tokio::test]
async fn hostile_a_refused_segment_inside_a_batch_of_per_key_sql_is_refused() {
    let f = start("").await;
    let mut c = client_named(&f, "coordinator").await;
    let tuple = |k: i64| pb::KeyTuple {
        parts: vec![pb::KeyValue {
            value: Some(pb::key_value::Value::Int(k)),
        }],
    };
    let period = pb::Segment {
        period: Some(pb::Period {
            column: "v".into(),
            granularity: "day".into(),
            label: "2024-01-01".into(),
        }),
        ..Default::default()
    };
    // alone, that segment is refused
    let alone = pb::InvestigationSqlRequest {
        segment: Some(period.clone()),
        ..key_sql_request("keys", &[3])
    };
    let e = c.investigation_sql(alone).await.expect_err("a period alone");
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    // and as the second item of a batch whose request segment is the whole table
    let hidden = pb::InvestigationSqlRequest {
        items: vec![
            pb::KeySqlItem {
                segment: None,
                keys: vec![tuple(3)],
            },
            pb::KeySqlItem {
                segment: Some(period),
                keys: vec![tuple(7)],
            },
        ],
        ..key_sql_request("keys", &[])
    };
    let e = c
        .investigation_sql(hidden)
        .await
        .expect_err("a period inside a batch");
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("time_columns"), "{}", e.message());
    let line = last_line(&f);
    assert_ne!(line["outcome"], "ok", "nothing released: {line}");
}
