//! The agent's throttle (issue 16) on live PostgreSQL and MariaDB: `max_rows_per_second`
//! paces the rows a dataset's reads take, over every request at once, and `max_load`
//! holds reads back while a load generator keeps the server busy, pausing a read mid-way
//! and failing it (`UNAVAILABLE`) once it has waited `max_pause_secs`. Every throttled
//! result equals the unthrottled one.
//!
//! The load is real: connections of another database user running `pg_sleep` / `SLEEP`
//! are active statements to the engine, which is what the probe reads; the same
//! statements by the agent's own user are not load. The tests run one at a time (the
//! load of one would be another's).

use std::path::Path;
use std::time::{Duration, Instant};

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::{AggregateOut, Dataset};
use tally_agent::error::AgentError;
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::segment::{ColumnSpec, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::db;

const ROWS: u64 = 12_000;

/// One test at a time: a test's load generator is load to every other test's probe.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn dataset(url: &str, throttle: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [id]{throttle} }}"),
    )
    .unwrap();
    let probing = config.throttle.as_ref().is_some_and(|t| t.max_load.is_some());
    Dataset::new(
        "t".into(),
        config,
        Source::Table(vec!["t".into()]),
        Connector::open_probing(url, &Default::default(), probing).unwrap(),
    )
}

fn columns() -> Vec<ColumnSpec> {
    vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "v".into(),
            format: FieldFormat::new(TypeClass::Text),
        },
    ]
}

/// One level of 8 hash buckets over the whole table.
async fn level(ds: &Dataset) -> Result<AggregateOut, AgentError> {
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let mut s = ds.session().await?;
    let b = ds.bind(&mut s, columns(), 1).await?;
    let out = ds
        .aggregate(&mut s, &b, &h, &[(Segment::whole(), Split::Hash(8))], false)
        .await?;
    s.finish().await?;
    Ok(out)
}

fn setup_pg(name: &str) -> String {
    let pg = db::postgres();
    let url = pg.create_database(name);
    pg.exec(
        Some(name),
        &format!(
            "DROP TABLE IF EXISTS t; CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT);\n\
             INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g;"
        ),
    );
    url
}

fn setup_my(name: &str) -> String {
    let my = db::mariadb();
    let url = my.create_database(name);
    my.exec(
        Some(name),
        &format!(
            "DROP TABLE IF EXISTS t; CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT);\n\
             INSERT INTO t SELECT seq, CONCAT('row ', seq) FROM seq_1_to_{ROWS};"
        ),
    );
    url
}

/// The URL of the load generator's own database user (`loader`), created here: the
/// throttle leaves the agent's own user's sessions out of the load.
fn loader_url(url: &str) -> String {
    if url.starts_with("postgres") {
        db::postgres().exec(
            None,
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'loader') THEN CREATE ROLE loader LOGIN; END IF; END $$;",
        );
        url.replacen("postgres@", "loader@", 1)
    } else {
        db::mariadb().exec(
            None,
            "CREATE USER IF NOT EXISTS 'loader'@'%'; CREATE USER IF NOT EXISTS 'loader'@'localhost'; \
             CREATE USER IF NOT EXISTS 'loader'@'127.0.0.1';",
        );
        // no database: the loader has no privilege on any
        let server = url.rsplit_once('/').expect("a URL with a database").0;
        format!("{}/", server.replacen("root@", "loader@", 1))
    }
}

/// `n` connections of another database user than the agent's each running one sleeping
/// statement of `secs`, started now; the handle ends when they have. None of them can
/// end before the instant returned plus `secs`: the server is busy at least until then.
async fn load(url: &str, n: usize, secs: f64) -> (tokio::task::JoinHandle<()>, Instant) {
    load_as(url, &loader_url(url), n, secs).await
}

/// [`load`] by the user of `as_url`.
async fn load_as(url: &str, as_url: &str, n: usize, secs: f64) -> (tokio::task::JoinHandle<()>, Instant) {
    use sqlx::Connection;
    let busy_until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..n {
        let url = as_url.to_string();
        tasks.push(tokio::spawn(async move {
            if url.starts_with("postgres") {
                let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SELECT pg_sleep({secs})")))
                    .execute(&mut c)
                    .await
                    .unwrap();
            } else {
                let mut c = sqlx::MySqlConnection::connect(&url.replacen("mariadb://", "mysql://", 1))
                    .await
                    .unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SELECT SLEEP({secs})")))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }));
    }
    // the statements have started once the server shows them
    let probe = if url.starts_with("postgres") {
        "SELECT count(*)::text FROM pg_stat_activity WHERE query LIKE 'SELECT pg\\_sleep%' AND state = 'active'"
    } else {
        "SELECT CAST(COUNT(*) AS CHAR) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP%'"
    };
    let watcher = Connector::open(url).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen: usize = watcher
            .query_text("t", probe)
            .await
            .unwrap()
            .unwrap()
            .parse()
            .unwrap();
        if seen >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the load generator's statements did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = tokio::spawn(async move {
        for t in tasks {
            t.await.unwrap();
        }
    });
    (all, busy_until)
}

fn same(a: &AggregateOut, b: &AggregateOut) {
    assert_eq!(a.buckets, b.buckets);
    assert_eq!(a.rows_scanned, ROWS);
}

async fn rate_paces_reads(url: &str) {
    let _one = SERIAL.lock().await;
    let plain = level(&dataset(url, "")).await.unwrap();
    // 12,000 rows at 6,000 rows/s: at least 2 s less the first free check
    let ds = dataset(url, ", throttle: { max_rows_per_second: 6000 }");
    let t = Instant::now();
    let paced = level(&ds).await.unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "{url}: 12,000 rows at 6,000/s took {took:?}"
    );
    same(&plain, &paced);
    assert_eq!(
        paced.path.name(),
        "in_process",
        "a throttled dataset reads in the agent"
    );

    // two requests at once share the dataset's budget: 24,000 rows, at least 3.9 s
    let t = Instant::now();
    let (a, b) = tokio::join!(level(&ds), level(&ds));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(3900),
        "{url}: two requests took {took:?}"
    );
    same(&plain, &a.unwrap());
    same(&plain, &b.unwrap());
}

async fn load_holds_reads_back(url: &str) {
    let _one = SERIAL.lock().await;
    let plain = level(&dataset(url, "")).await.unwrap();
    let throttled = ", throttle: { max_load: 1, probe_interval_ms: 100 }";

    // the control: with no load, the throttled read starts at once
    let ds = dataset(url, throttled);
    let t = Instant::now();
    same(&plain, &level(&ds).await.unwrap());
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "{url}: an idle server held the read back {:?}",
        t.elapsed()
    );

    // the agent's own database user's statements are its reads, not load to yield to
    // (a paused read shows as running): they hold nothing back
    let (own, own_until) = load_as(url, url, 3, 3.0).await;
    same(&plain, &level(&ds).await.unwrap());
    assert!(
        Instant::now() < own_until,
        "{url}: the agent's own user's sessions held the read back"
    );
    own.await.unwrap();

    // 3 busy statements of another user for 3 s: the read starts only once they end
    let (busy, busy_until) = load(url, 3, 3.0).await;
    let out = level(&ds).await.unwrap();
    let ended = Instant::now();
    assert!(
        ended >= busy_until,
        "{url}: the read ended {:?} before the load could",
        busy_until - ended
    );
    same(&plain, &out);
    busy.await.unwrap();

    // a read under way pauses when the load comes and goes on when it leaves: 12,000
    // rows at 4,000/s take 3 s alone; a 3 s load from 1 s in holds back the 8,000
    // rows still to read (2 s of budget) until it ends
    let ds = dataset(
        url,
        ", throttle: { max_rows_per_second: 4000, max_load: 1, probe_interval_ms: 100 }",
    );
    let read = tokio::spawn(async move { level(&ds).await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!read.is_finished());
    let (busy, busy_until) = load(url, 3, 3.0).await;
    let out = read.await.unwrap();
    let ended = Instant::now();
    assert!(
        ended >= busy_until + Duration::from_millis(1000),
        "{url}: the read did not pause for the load (ended {:?} after it)",
        ended.saturating_duration_since(busy_until)
    );
    same(&plain, &out.unwrap());
    busy.await.unwrap();
}

async fn a_long_load_stops_the_read(url: &str) {
    let _one = SERIAL.lock().await;
    let ds = dataset(
        url,
        ", throttle: { max_load: 1, probe_interval_ms: 100, max_pause_secs: 1 }",
    );
    let (busy, busy_until) = load(url, 3, 5.0).await;
    let t = Instant::now();
    let e = level(&ds).await.unwrap_err();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "{url}: gave up after {took:?}"
    );
    assert!(
        matches!(&e, AgentError::DatabaseUnavailable { kind, .. } if kind.contains("max_load")),
        "{url}: {e}"
    );
    assert!(e.to_string().contains("max_pause_secs"), "{e}");
    assert!(
        Instant::now() < busy_until,
        "{url}: the read waited for the load to end ({took:?})"
    );
    busy.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_max_rows_per_second_paces_reads_over_every_request() {
    rate_paces_reads(&setup_pg("pg_rate")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_max_rows_per_second_paces_reads_over_every_request() {
    rate_paces_reads(&setup_my("my_rate")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_max_load_holds_reads_back_while_the_server_is_busy() {
    load_holds_reads_back(&setup_pg("pg_load")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_max_load_holds_reads_back_while_the_server_is_busy() {
    load_holds_reads_back(&setup_my("my_load")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_load_past_max_pause_stops_the_read() {
    a_long_load_stops_the_read(&setup_pg("pg_pause")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_load_past_max_pause_stops_the_read() {
    a_long_load_stops_the_read(&setup_my("my_pause")).await;
}

/// A user who cannot see other sessions cannot measure the load: the read is refused
/// rather than run as if the server were idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_probe_blind_to_other_sessions_refuses_the_read() {
    let _one = SERIAL.lock().await;
    let url = setup_pg("pg_blind");
    let pg = db::postgres();
    pg.exec(
        Some("pg_blind"),
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'blind') THEN CREATE ROLE blind LOGIN; END IF; END $$;\n\
         GRANT SELECT ON t TO blind;",
    );
    let blind = url.replacen("postgres@", "blind@", 1);
    assert_ne!(blind, url, "the URL names its user: {url}");
    let ds = dataset(&blind, ", throttle: { max_load: 4, probe_interval_ms: 100 }");
    let e = level(&ds).await.unwrap_err();
    assert!(e.to_string().contains("pg_monitor"), "{e}");
    // the same user with the role reads
    pg.exec(None, "GRANT pg_monitor TO blind;");
    let ok = level(&dataset(
        &blind,
        ", throttle: { max_load: 4, probe_interval_ms: 100 }",
    ))
    .await;
    pg.exec(None, "REVOKE pg_monitor FROM blind;");
    assert_eq!(ok.unwrap().rows_scanned, ROWS);
}
