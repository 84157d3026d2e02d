//! The agent as its callers see it: a real gRPC server with mutual TLS, called by a
//! client built here (not the coordinator: these are the requests a compromised or
//! buggy coordinator could send). Checks the TLS boundary, policy enforcement, error
//! codes without driver text, the release log, and a database that fails mid-call.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tally_agent::config::AgentConfig;
use tally_agent::release_log::verify_chain;
use tally_common::config_file::parse_yaml;
use tally_common::pki::{Ca, Role};
use tally_common::segment::{KeyPart, Segment, Split};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_client::AgentClient;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

struct Fixture {
    dir: tempfile::TempDir,
    ca: Ca,
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
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
    let mut sql = String::from("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, secret TEXT);\n");
    for i in 1..=200 {
        sql.push_str(&format!(
            "INSERT INTO t VALUES ({i}, 'name {i}', 'secret {i}');\n"
        ));
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
}

/// An agent on 127.0.0.1 with a few SQLite datasets (and any extra dataset YAML).
async fn start(extra_datasets: &str) -> Fixture {
    tally_agent::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("test-ca").unwrap();
    let server = ca.issue("dc1", Role::Server, &[]).unwrap();
    write(dir.path(), "ca.pem", &ca.pem.cert);
    write(dir.path(), "dc1.pem", &server.cert);
    write(dir.path(), "dc1-key.pem", &server.key);
    let db = dir.path().join("t.db");
    sqlite_table(&db).await;
    let url = format!("sqlite://{}", db.display());
    let text = format!(
        "listen: 127.0.0.1:0\n\
         tls: {{ ca: ca.pem, cert: dc1.pem, key: dc1-key.pem, allowed_clients: [coordinator] }}\n\
         release_log: release.jsonl\n\
         datasets:\n\
         \x20 closed: {{ url: '{url}', table: t, key: [id] }}\n\
         \x20 keys: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, mask_columns: [secret] }} }}\n\
         \x20 detailed: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: detailed, mask_columns: [secret] }} }}\n\
         \x20 hidden: {{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, expose_key_bounds: false }} }}\n\
         \x20 floor: {{ url: '{url}', table: t, key: [id], policy: {{ min_segment_rows: 50 }} }}\n\
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

fn agg(dataset: &str, seg: Segment, split: Split) -> pb::AggregateRequest {
    pb::AggregateRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        method: pb::HashMethod::Sha25664 as i32,
        segments: vec![pb::SegmentSplit {
            segment: Some(pb::Segment::from(&seg)),
            split: Some(split.to_pb()),
        }],
        in_process: false,
    }
}

fn digests(dataset: &str) -> pb::RowDigestsRequest {
    pb::RowDigestsRequest {
        dataset: dataset.into(),
        columns: cols(),
        key_len: 1,
        method: pb::HashMethod::Sha25664 as i32,
        segment: Some(pb::Segment::default()),
        level: pb::PrivacyLevel::WithKeys as i32,
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
    let (records, _) = verify_chain(&f.dir.path().join("release.jsonl")).unwrap();
    assert!(records >= 14, "{records}");
    let log = std::fs::read_to_string(f.dir.path().join("release.jsonl")).unwrap();
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
    assert!(
        e.message().contains("dataset down") && !e.message().contains("refused"),
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
        method: pb::HashMethod::Sha25664 as i32,
        segments: vec![pb::SegmentSplit {
            segment: Some(pb::Segment::default()),
            split: Some(Split::Whole.to_pb()),
        }],
        in_process: false,
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
