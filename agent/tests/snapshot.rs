//! Consistent reads (DESIGN §5, issue 14): every statement of one agent request reads one
//! snapshot of its database. A writer moves rows from one parent range to another while
//! requests run; a request whose parents are read by separate statements (the
//! in-process path scans each parent on its own) must still count every row exactly
//! once. A control, the same two reads as separate calls, shows the writer does tear
//! reads that are not in one transaction, so the test cannot pass for want of writes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_agent::dialect;
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::segment::{ColumnSpec, KeyPart, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::db;

const ROWS: i64 = 20_000;
/// Rows move from `id < SPLIT` to `id >= SPLIT`.
const SPLIT: i64 = 1_000_000;

fn dataset(url: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [id] }}"),
    )
    .unwrap();
    Dataset::new(
        "t".into(),
        config,
        Source::Table(vec!["t".into()]),
        Connector::open(url).unwrap(),
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

fn below() -> Segment {
    Segment {
        upper: Some(vec![KeyPart::Int(SPLIT)]),
        ..Segment::whole()
    }
}

fn above() -> Segment {
    Segment {
        lower: Some(vec![KeyPart::Int(SPLIT)]),
        ..Segment::whole()
    }
}

/// Moves rows across the split and back, one autocommitted statement each, until
/// `stop`: row i goes above the split, and after every row has, back below. The count
/// of moves so far is in `moved`.
fn start_writer(url: String, stop: Arc<AtomicBool>, moved: Arc<AtomicI64>) -> tokio::task::JoinHandle<()> {
    use sqlx::Connection;
    async fn run<C: Connection>(mut c: C, stop: &AtomicBool, moved: &AtomicI64)
    where
        for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
    {
        while !stop.load(Ordering::Relaxed) {
            let m = moved.load(Ordering::Relaxed);
            let (i, up) = (m % ROWS + 1, (m / ROWS) % 2 == 0);
            let sql = if up {
                format!("UPDATE t SET id = id + {SPLIT} WHERE id = {i}")
            } else {
                format!("UPDATE t SET id = id - {SPLIT} WHERE id = {}", i + SPLIT)
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut c)
                .await
                .unwrap();
            moved.fetch_add(1, Ordering::Relaxed);
        }
    }
    tokio::spawn(async move {
        if url.starts_with("postgres") {
            run(sqlx::PgConnection::connect(&url).await.unwrap(), &stop, &moved).await
        } else {
            let url = url.replacen("mariadb://", "mysql://", 1);
            run(sqlx::MySqlConnection::connect(&url).await.unwrap(), &stop, &moved).await
        }
    })
}

async fn check_engine(url: &str) {
    let ds = dataset(url);
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let parents = [(below(), Split::Whole), (above(), Split::Whole)];

    // the control: two counts as separate calls see the writer's moves
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicI64::new(0));
    let writer = start_writer(url.to_string(), Arc::clone(&stop), Arc::clone(&moved));
    let probe = ds
        .bind(&mut ds.session().await.unwrap(), columns(), 1)
        .await
        .unwrap();
    let key = probe.key_infos();
    let d = ds.connector.dialect_for(&probe.info);
    let (count_below, count_above) = (
        dialect::count_rows(d, &ds.source, &key, &probe.cols, &below()).unwrap(),
        dialect::count_rows(d, &ds.source, &key, &probe.cols, &above()).unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut torn = 0;
    let mut tries = 0;
    while torn == 0 && Instant::now() < deadline {
        let a = ds.connector.count("t", &count_below).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let b = ds.connector.count("t", &count_above).await.unwrap();
        tries += 1;
        if a + b != ROWS as u64 {
            torn += 1;
        }
    }
    assert!(
        torn > 0,
        "{url}: in {tries} tries no two separate reads saw a move between them: the writer did not interleave, so the test below proves nothing"
    );

    // the requests: each reads both parents, by separate statements, in one session
    let mut requests = 0;
    let mut during = 0;
    // a debug build on a loaded two-core machine takes seconds per request
    let deadline = Instant::now() + Duration::from_secs(60);
    while requests < 8 && Instant::now() < deadline {
        let before = moved.load(Ordering::Relaxed);
        let mut s = ds.session().await.unwrap();
        let b = ds.bind(&mut s, columns(), 1).await.unwrap();
        let out = ds.aggregate(&mut s, &b, &h, &parents, true).await.unwrap();
        // a pause inside the request: more moves commit before it ends
        tokio::time::sleep(Duration::from_millis(5)).await;
        let again = ds.aggregate(&mut s, &b, &h, &parents, true).await.unwrap();
        s.finish().await.unwrap();
        during += moved.load(Ordering::Relaxed) - before;
        assert_eq!(out.path.name(), "in_process");
        let total: u64 = out.buckets.iter().map(|b| b.agg.count()).sum();
        assert_eq!(
            total, ROWS as u64,
            "{url}: request {requests} counted rows that moved twice or not at all"
        );
        assert_eq!(
            out.buckets, again.buckets,
            "{url}: two reads of one session saw different data"
        );
        requests += 1;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(requests >= 3, "{url}: only {requests} requests ran");
    assert!(
        during >= requests,
        "{url}: only {during} moves committed while {requests} requests ran: they did not interleave"
    );
    eprintln!(
        "{url}: control torn after {tries} tries; {requests} requests consistent while {during} rows moved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_requests_read_one_snapshot_while_a_writer_moves_rows() {
    let pg = db::postgres();
    let url = pg.create_database("snapshot");
    pg.exec(
        Some("snapshot"),
        &format!("CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, {ROWS}) g;"),
    );
    check_engine(&url).await;

    // the session's transaction is read-only and REPEATABLE READ
    let ds = dataset(&url);
    let mut s = ds.session().await.unwrap();
    let iso = s
        .query_text("SELECT current_setting('transaction_isolation') || ' ' || current_setting('transaction_read_only')")
        .await
        .unwrap();
    assert_eq!(iso.as_deref(), Some("repeatable read on"));
    assert!(
        s.query_text("INSERT INTO t VALUES (-1, 'x') RETURNING 'written'")
            .await
            .is_err(),
        "a request's transaction refuses writes"
    );
    drop(s);
    let n = ds
        .connector
        .query_text("t", "SELECT count(*)::text FROM t WHERE id = -1")
        .await
        .unwrap();
    assert_eq!(n.as_deref(), Some("0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_requests_read_one_snapshot_while_a_writer_moves_rows() {
    let my = db::mariadb();
    let url = my.create_database("snapshot");
    my.exec(
        Some("snapshot"),
        &format!("CREATE TABLE t (id bigint PRIMARY KEY, v varchar(20) NOT NULL) ENGINE=InnoDB; INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_{ROWS};"),
    );
    check_engine(&url).await;

    // a write inside a request's transaction is refused by the server, and nothing stays
    let ds = dataset(&url);
    let mut s = ds.session().await.unwrap();
    assert!(s.query_text("INSERT INTO t VALUES (-1, 'x')").await.is_err());
    drop(s);
    let n = ds
        .connector
        .query_text("t", "SELECT CAST(COUNT(*) AS CHAR) FROM t WHERE id = -1")
        .await
        .unwrap();
    assert_eq!(n.as_deref(), Some("0"));
}
