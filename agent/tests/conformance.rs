//! The live conformance suite, written once and run against every engine this machine
//! can run. The suite names no engine: each engine is an engine fixture
//! (`tally_e2e::engines`, one file per engine under tests/src/engines/) that knows the
//! engine's column type and literal for every vector value, the vectors it cannot
//! store and why, the types and literals of the suite's own tables, how to make a
//! fresh database (or schema) and the agent's URL for it, and how to run setup SQL
//! against it. `engines::available()` lists the fixtures that can run here:
//! PostgreSQL and MariaDB started by the test harness, SQLite embedded, DuckDB
//! embedded when built with it, SQL Server where `TALLY_TEST_MSSQL_URL` points at one.
//! An engine that cannot run here gets one `NOT RUN: live … conformance (…)` line on
//! stderr, never a silent skip. Adding an engine is a fixture file and one line in
//! `engines::all()`; nothing here changes.
//!
//! 1. Every vector of tests/vectors/canonical.json is loaded into a real table of the
//!    matching column types, and the engine's own SQL (engines that hash in SQL) or the
//!    agent's decoding of the engine's values (SQLite) reproduces the row string and
//!    both checksums bit for bit. A value an engine cannot store is listed by its
//!    fixture with the reason (at most 24 per engine, or the fixture's stated bound
//!    where the engine lacks whole types, as Oracle lacks date, time and uuid; checked
//!    for every fixture even where it cannot run: MariaDB and DuckDB have no BC years,
//!    infinities or NaN decimals); every other vector must reproduce.
//! 2. The engines' SUM and XOR arithmetic reproduces every aggregate vector (SUM alone
//!    where an engine has no 64-bit XOR aggregate).
//! 3. One logical table loaded into every engine gives identical buckets for every
//!    split (quantile, hash, explicit cuts), pushed down and in-process alike.

use std::collections::BTreeMap;
use std::future::Future;

use tally_agent::config::{Hashing, Source};
use tally_agent::connector::{Connector, Flow};
use tally_agent::dataset::{AggregateOut, Bound, Dataset};
use tally_agent::dialect;
use tally_agent::error::AgentError;
use tally_agent::schema::{BoundColumn, ColumnInfo};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{AnyAggregate, HashMethod, Hasher, md5_48, sha256_64, wrap_decimal_sum};
use tally_common::period::Granularity;
use tally_common::seal::RunKeys;
use tally_common::segment::{ColumnSpec, KeyPart, Period, Segment, Split};
use tally_common::types::TypeClass;
use tally_common::vectors::{RowVector, VectorFile};
use tally_e2e::engines::{self, Database, EngineFixture};

/// Runs `check` on every engine that can run here, each in a task of its own (as
/// separate tests would), and fails naming every engine that failed.
async fn on_every_engine<Fut>(check: impl Fn(Box<dyn EngineFixture>) -> Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = engines::available()
        .into_iter()
        .map(|f| (f.name(), tokio::spawn(check(f))))
        .collect();
    let mut failed = Vec::new();
    for (name, task) in tasks {
        if let Err(e) = task.await {
            let why = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            failed.push(format!("{name}: {why}"));
        }
    }
    assert!(failed.is_empty(), "failed on:\n{}", failed.join("\n"));
}

fn columns_for(v: &RowVector) -> Vec<ColumnSpec> {
    v.fields
        .iter()
        .enumerate()
        .map(|(i, f)| ColumnSpec {
            name: format!("c{i}"),
            format: f.format(),
        })
        .collect()
}

fn create_and_insert(e: &dyn EngineFixture, table: &str, v: &RowVector) -> String {
    let cols: Vec<String> = v
        .fields
        .iter()
        .enumerate()
        .map(|(i, f)| format!("c{i} {}", e.sql_type(f)))
        .collect();
    let vals: Vec<String> = v.fields.iter().map(|f| e.literal(f)).collect();
    format!(
        "CREATE TABLE {table} ({});\nINSERT INTO {table} VALUES ({});\n",
        cols.join(", "),
        vals.join(", ")
    )
}

async fn bound(l: &Database, table: &str, cols: Vec<ColumnSpec>) -> Vec<BoundColumn> {
    let info = l.connector.describe("t", &l.source(table), &[]).await.unwrap();
    info.bind("t", cols, 0, "+00:00").unwrap()
}

/// The row string of the single row in `table` as the agent's own row fetch reads it
/// (the path of in-process aggregates, digests and reveals): on PostgreSQL and MySQL the
/// engine's cheap text, made canonical in the agent (through COPY on PostgreSQL).
async fn agent_row(l: &Database, table: &str, cols: &[BoundColumn]) -> String {
    let key: Vec<&ColumnInfo> = vec![];
    let shape = l.connector.fetch_shape();
    let sql = dialect::fetch_rows_inline(
        l.connector.dialect(),
        &l.source(table),
        cols,
        &key,
        &Segment::whole(),
        shape,
        false,
    );
    let mut rows = Vec::new();
    l.connector
        .scan("t", &sql, shape, cols, 0, &mut |r| {
            rows.push(r.clone());
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    rows[0].row_string().to_string()
}

/// An expression over the single row of `table`, as text, computed by the engine.
async fn select_text(e: &dyn EngineFixture, l: &Database, table: &str, expr: String) -> String {
    let sql = format!(
        "SELECT {} FROM {}",
        e.as_text(&expr),
        dialect::relation(l.connector.dialect(), &l.source(table))
    );
    l.connector
        .query_text("t", &sql)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// The engine's row string and checksums of the single row in `table`.
async fn engine_row(
    e: &dyn EngineFixture,
    l: &Database,
    table: &str,
    cols: &[BoundColumn],
) -> (String, String, String) {
    let d = l.connector.dialect();
    // SQLite, and columns only the agent renders (JSON, floats on DuckDB): the fetch is the engine's path
    if !e.hashes_in_sql() || dialect::row_string_expr(d, cols).is_none() {
        let rs = agent_row(l, table, cols).await;
        return (
            rs.clone(),
            md5_48(rs.as_bytes()).to_string(),
            format!("{:016x}", sha256_64(rs.as_bytes())),
        );
    }
    let row = dialect::row_string_expr(d, cols).expect("checked above");
    let get = |expr: String| select_text(e, l, table, expr);
    let rs = get(row.clone()).await;
    let md5 = get(d.row_hash_expr(&row, HashMethod::Md5_48, None).unwrap()).await;
    let sha_signed = get(d.row_hash_expr(&row, HashMethod::Sha256_64, None).unwrap()).await;
    let sha = format!("{:016x}", wrap_decimal_sum(&sha_signed).unwrap());
    (rs, md5, sha)
}

/// The engine's sealed checksums of the single row in `table`, computed in SQL with the
/// vector file's k_row; `None` where the engine does not hash in SQL.
async fn engine_sealed(
    e: &dyn EngineFixture,
    l: &Database,
    table: &str,
    cols: &[BoundColumn],
    keys: &RunKeys,
) -> Option<(String, String)> {
    let d = l.connector.dialect();
    let row = dialect::row_string_expr(d, cols)?;
    let get = |expr: String| select_text(e, l, table, expr);
    let md5 = get(d.row_hash_expr(&row, HashMethod::SealedMd5_48, Some(&keys.k_row))?).await;
    let sha = get(d.row_hash_expr(&row, HashMethod::SealedSha256_64, Some(&keys.k_row))?).await;
    Some((md5, format!("{:016x}", wrap_decimal_sum(&sha).unwrap())))
}

/// The vectors `e` cannot store, each with the reason.
fn unstorable(e: &dyn EngineFixture, file: &VectorFile) -> Vec<String> {
    file.vectors
        .iter()
        .filter_map(|v| e.cannot_store(v).map(|r| format!("{} ({r})", v.id)))
        .collect()
}

async fn vectors_on(engine: &dyn EngineFixture) {
    let name = engine.name();
    let dir = tempfile::tempdir().unwrap();
    let l = engine.create("vectors", dir.path()).await;
    let file = VectorFile::load_repo();
    let mut failures = Vec::new();
    let mut stored = 0;
    let mut sealed_checked = 0;
    for v in &file.vectors {
        if engine.cannot_store(v).is_some() {
            continue;
        }
        let table = format!("v_{}", v.id);
        l.exec(&create_and_insert(engine, &l.table(&table), v)).await;
        stored += 1;
        let cols = bound(&l, &table, columns_for(v)).await;
        let (rs, md5, sha) = engine_row(engine, &l, &table, &cols).await;
        if rs != v.row_string || md5 != v.md5_48 || sha != v.sha256_64 {
            failures.push(format!(
                "{} ({}): got {rs:?} md5 {md5} sha {sha}, want {:?} md5 {} sha {}",
                v.id, v.about, v.row_string, v.md5_48, v.sha256_64
            ));
        }
        if let Some(sr) = file.sealed.rows.iter().find(|r| r.id == v.id)
            && let Some((md5, sha)) = engine_sealed(engine, &l, &table, &cols, &file.sealed.keys()).await
            && {
                sealed_checked += 1;
                md5 != sr.sealed_md5_48 || sha != sr.sealed_sha256_64
            }
        {
            failures.push(format!(
                "{} ({}): sealed in SQL md5 {md5} sha {sha}, want md5 {} sha {}",
                v.id, v.about, sr.sealed_md5_48, sr.sealed_sha256_64
            ));
        }
        let fetched = agent_row(&l, &table, &cols).await;
        if fetched != v.row_string {
            failures.push(format!(
                "{} ({}): the agent's row fetch gives {fetched:?}, want {:?}",
                v.id, v.about, v.row_string
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} reproduces {} of {stored} stored vectors; failures:\n{}",
        stored - failures.len(),
        failures.join("\n")
    );
    let skipped = unstorable(engine, &file);
    assert!(
        stored >= file.vectors.len() - engine.max_unstorable(),
        "{name} skips too many vectors: {skipped:?}"
    );
    // engines that hash in SQL reproduce the sealed vectors too (SQLite hashes in the agent)
    assert!(
        !engine.hashes_in_sql() || sealed_checked >= 8,
        "{name}: only {sealed_checked} sealed vectors checked in SQL"
    );
    eprintln!(
        "{name}: {stored} vectors reproduced bit for bit ({sealed_checked} sealed in SQL); not storable: {skipped:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_engine_reproduces_every_vector() {
    on_every_engine(|e| async move { vectors_on(&*e).await }).await;
}

/// Every fixture, also one that cannot run here, stores all but a few vectors (24, or
/// the fixture's stated bound where the engine lacks whole types)
/// and has a column type and a literal for every value it stores.
#[test]
fn every_fixture_stores_all_but_a_few_vectors() {
    let file = VectorFile::load_repo();
    for e in engines::all() {
        let skipped = unstorable(&*e, &file);
        assert!(
            skipped.len() <= e.max_unstorable(),
            "{} skips too many vectors: {skipped:?}",
            e.name()
        );
        for v in file.vectors.iter().filter(|v| e.cannot_store(v).is_none()) {
            let sql = create_and_insert(&*e, "t", v);
            assert!(sql.starts_with("CREATE TABLE t ("), "{}: {sql}", e.name());
        }
        eprintln!(
            "{}: {} vectors not storable: {skipped:?}",
            e.name(),
            skipped.len()
        );
    }
}

/// The engines' SUM and XOR over row checksums, against every aggregate vector.
async fn aggregates_on(engine: &dyn EngineFixture) {
    let name = engine.name();
    let dir = tempfile::tempdir().unwrap();
    let l = engine.create("aggs", dir.path()).await;
    let file = VectorFile::load_repo();
    let agg = l.table("agg");
    let mut sql = format!(
        "CREATE TABLE {agg} (grp VARCHAR(10), n INTEGER, rs {});\n",
        engine.hashed_text_type()
    );
    for a in &file.aggregates {
        for (i, id) in a.rows.iter().enumerate() {
            let lit = engine.text_literal(&file.row(id).row_string);
            sql.push_str(&format!("INSERT INTO {agg} VALUES ('{}', {i}, {lit});\n", a.id));
        }
    }
    l.exec(&sql).await;
    let d = l.connector.dialect();
    for a in &file.aggregates {
        for method in [HashMethod::Md5_48, HashMethod::Sha256_64] {
            let (sum, xor) = if !engine.hashes_in_sql() {
                // SQLite has no hash functions: the agent hashes its values in-process
                let mut agg = AnyAggregate::empty(method, true);
                for id in &a.rows {
                    agg.add_checksum(method.row_checksum(file.row(id).row_string.as_bytes()));
                }
                (agg.sum(), agg.xor())
            } else {
                let h = d.row_hash_expr("rs", method, None).unwrap();
                let q = |f: &str| {
                    format!(
                        "SELECT {} FROM (SELECT {h} AS h FROM {agg} WHERE grp = '{}') x",
                        engine.as_text(f),
                        a.id
                    )
                };
                let s = l
                    .connector
                    .query_text("t", &q("COALESCE(SUM(h), 0)"))
                    .await
                    .unwrap()
                    .unwrap();
                // an engine without a 64-bit XOR aggregate answers SUM only
                let x = match engine.xor_function() {
                    Some(xor_fn) => Some(
                        l.connector
                            .query_text("t", &q(&format!("COALESCE({xor_fn}(h), 0)")))
                            .await
                            .unwrap()
                            .unwrap(),
                    ),
                    None => None,
                };
                (
                    wrap_decimal_sum(&s).unwrap(),
                    x.map(|x| wrap_decimal_sum(&x).unwrap()),
                )
            };
            match method {
                HashMethod::Md5_48 => assert_eq!(
                    format!("{sum:016x}"),
                    a.md5_48_sum,
                    "{name} {} ({})",
                    a.id,
                    a.about
                ),
                // the aggregate vectors are unsealed; sealed ones are pinned per row
                _ => {
                    assert_eq!(
                        format!("{sum:016x}"),
                        a.sha256_sum,
                        "{name} {} ({})",
                        a.id,
                        a.about
                    );
                    assert_eq!(
                        xor.is_some(),
                        !engine.hashes_in_sql() || engine.xor_function().is_some(),
                        "{name}: an XOR wherever the engine has one"
                    );
                    if let Some(xor) = xor {
                        assert_eq!(format!("{xor:016x}"), a.sha256_xor, "{name} {} xor", a.id);
                    }
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_engine_aggregates_match_the_vectors() {
    on_every_engine(|e| async move { aggregates_on(&*e).await }).await;
}

// ---- one logical table, every engine, every split --------------------------------

const ROWS: i64 = 3000;

fn orders_sql(e: &dyn EngineFixture, table: &str) -> String {
    let (text_t, ts_t, bool_t) = (e.short_text_type(), e.timestamp_type(), e.boolean_type());
    let note_t = e.text_type();
    let mut sql = format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, code {text_t} NOT NULL, amount DECIMAL(12,2), placed {ts_t}, note {note_t}, ok {bool_t});\n"
    );
    let names = ["Zoë", "Øre", "ñandú", "日本", "a:b", "~", "", "Ärger", "zz", "AA"];
    for chunk in (1..=ROWS).collect::<Vec<_>>().chunks(500) {
        let vals: Vec<String> = chunk
            .iter()
            .map(|&i| {
                let id = i * 3 + (i % 5);
                let code = format!("{}-{}", names[(i % 10) as usize], i % 97);
                let amount = format!("{}.{:02}", (i * 7919) % 100000, i % 100);
                let at = format!(
                    "2024-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                    1 + i % 12,
                    1 + i % 28,
                    i % 24,
                    i % 60,
                    (i * 7) % 60,
                    (i * 104729) % 1_000_000
                );
                let note = if i % 4 == 0 {
                    "NULL".to_string()
                } else {
                    e.text_literal(&format!("n{}", i % 13))
                };
                let ok = e.bool_literal(i % 2 == 0);
                format!(
                    "({id}, {}, {amount}, '{at}', {note}, {ok})",
                    e.text_literal(&code)
                )
            })
            .collect();
        sql.push_str(&format!("INSERT INTO {table} VALUES {};\n", vals.join(", ")));
    }
    sql
}

fn orders_columns() -> Vec<ColumnSpec> {
    let c = |n: &str, class: TypeClass, scale: u32| ColumnSpec {
        name: n.into(),
        format: FieldFormat::new(class).with_scale(scale),
    };
    vec![
        c("id", TypeClass::Integer, 0),
        c("code", TypeClass::Text, 0),
        c("amount", TypeClass::Decimal, 2),
        c("placed", TypeClass::Timestamp, 6),
        c("note", TypeClass::Text, 0),
        c("ok", TypeClass::Boolean, 0),
    ]
}

type Summary = Vec<(usize, usize, Segment, u64, u64, Option<u64>)>;

/// A summary as an engine without a 64-bit XOR aggregate answers it pushed down.
fn without_xor(s: &Summary) -> Summary {
    s.iter()
        .map(|(p, c, seg, n, sum, _)| (*p, *c, seg.clone(), *n, *sum, None))
        .collect()
}

fn summary(o: &AggregateOut) -> Summary {
    o.buckets
        .iter()
        .map(|b| {
            (
                b.parent,
                b.child,
                b.segment.clone(),
                b.agg.count(),
                b.agg.sum(),
                b.agg.xor(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_table_gives_identical_buckets_on_every_engine_and_path() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let mut results: BTreeMap<String, Summary> = BTreeMap::new();
    let int = |i: i64| vec![KeyPart::Int(i)];
    let splits: Vec<(&'static str, Vec<(Segment, Split)>)> = vec![
        ("quantile", vec![(Segment::whole(), Split::Quantile(8))]),
        ("hash", vec![(Segment::whole(), Split::Hash(8))]),
        (
            "cuts+nested hash+whole",
            vec![
                (
                    Segment {
                        lower: Some(int(100)),
                        upper: Some(int(5000)),
                        hash: None,
                        period: None,
                        window: None,
                    },
                    Split::Cuts(vec![int(700), int(2500)]),
                ),
                (
                    Segment {
                        hash: Some((1 << 59, 1 << 60)),
                        ..Segment::default()
                    },
                    Split::Hash(4),
                ),
                (
                    Segment {
                        lower: Some(int(8000)),
                        ..Segment::default()
                    },
                    Split::Whole,
                ),
            ],
        ),
    ];
    // a hash drill's deeper level: parents that differ only in their hash ranges (out
    // of order, with gaps between and after them), read by one scan in the agent
    let hash_part = |lo: u64, hi: u64, n: u32| {
        (
            Segment {
                hash: Some((lo, hi)),
                ..Segment::default()
            },
            Split::Hash(n),
        )
    };
    let q = tally_common::segment::HASH_SPACE / 4;
    let mut splits = splits;
    splits.push((
        "hash parents of one level",
        vec![
            hash_part(2 * q, 3 * q, 8),
            hash_part(0, q, 4),
            hash_part(3 * q + q / 2, 3 * q + 3 * q / 4, 2),
        ],
    ));
    let period = |g: Granularity| Split::Period {
        column: "placed".into(),
        granularity: g,
    };
    let march = Period {
        column: "placed".into(),
        granularity: Granularity::Month,
        label: "2024-03".into(),
    };
    for g in [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ] {
        splits.push((g.name(), vec![(Segment::whole(), period(g))]));
    }
    splits.push((
        "quantile inside a month",
        vec![(
            Segment {
                period: Some(march),
                ..Segment::default()
            },
            Split::Quantile(4),
        )],
    ));
    // scans longer than one batch, so the threaded variants below do hash on a thread
    assert!(ROWS as usize > tally_agent::hash_pipe::BATCH_ROWS);
    let mut ran = Vec::new();
    for engine in engines::available() {
        let engine = &*engine;
        let name = engine.name();
        ran.push(name);
        let l = engine.create("orders", dir.path()).await;
        l.exec(&orders_sql(engine, &l.table("orders"))).await;
        // without a 64-bit XOR aggregate in SQL, the pushed-down aggregate answers SUM only
        let sql_xor = l.connector.dialect().xor_aggregate("h").is_some();
        let mut ds = dataset("orders", l.source("orders"), l.connector);
        let b = ds
            .bind(&mut ds.session().await.unwrap(), orders_columns(), 1)
            .await
            .unwrap();
        for (split, parents) in &splits {
            for method in HashMethod::BY_STRENGTH {
                let method_hasher = hasher(method);
                // pushed down, the default (in-process except on DuckDB), forced
                // in-process, each in-process level hashed row by row and on a second
                // thread (this table's scans are longer than one batch: hash_pipe.rs)
                for (hashing, in_process, thread) in [
                    (Hashing::Pushdown, false, false),
                    (Hashing::Auto, false, false),
                    (Hashing::Auto, true, false),
                    (Hashing::Auto, false, true),
                    (Hashing::Auto, true, true),
                ] {
                    ds.config.hashing = hashing;
                    ds.hash_thread = thread;
                    let out = ds
                        .aggregate(
                            &mut ds.session().await.unwrap(),
                            &b,
                            &method_hasher,
                            parents,
                            in_process,
                        )
                        .await
                        .unwrap();
                    let total: u64 = out
                        .buckets
                        .iter()
                        .filter(|b| b.parent == 0)
                        .map(|b| b.agg.count())
                        .sum();
                    assert!(total > 0, "{name} {split}: empty");
                    let agent_hashes = in_process
                        || !engine.hashes_in_sql()
                        || (hashing == Hashing::Auto && !engine.auto_pushes_down());
                    let want = if agent_hashes { "in_process" } else { "pushdown" };
                    assert_eq!(out.path.name(), want, "{name} {split} {hashing:?}");
                    let label = format!("{split}/{method}");
                    let s = summary(&out);
                    let sum_only = !agent_hashes && !sql_xor;
                    if sum_only {
                        assert!(
                            s.iter().all(|b| b.5.is_none()),
                            "{name} {label}: an XOR without one in SQL"
                        );
                    }
                    match results.get(&label) {
                        None if sum_only => {}
                        None => {
                            results.insert(label, s);
                        }
                        Some(expected) => assert_eq!(
                            s,
                            if sum_only {
                                without_xor(expected)
                            } else {
                                expected.clone()
                            },
                            "{name} {label} ({hashing:?}, in_process={in_process}, hash thread {thread}) differs from {} pushdown",
                            ran[0]
                        ),
                    }
                }
            }
        }
    }
    assert_eq!(results.len(), 44);
    let months = &results["month/sha256_64"];
    assert_eq!(months.len(), 12, "one bucket per month present");
    assert_eq!(months[2].2.period.as_ref().unwrap().label, "2024-03");
    eprintln!("identical buckets on {ran:?}");
}

/// An even split (first cut, width, count: the planner's split of an integer key range)
/// gives exactly the buckets of its cut points as a list, on every engine, pushed down
/// (one division per row in SQL) and in process (one division per row in the agent):
/// alone, beside other parents, with cuts outside its parent, with one cut, and with
/// cuts past 2^62 (where the agent compares the points instead).
#[tokio::test(flavor = "multi_thread")]
async fn an_even_split_gives_the_buckets_of_its_cut_list_on_every_engine_and_path() {
    use tally_common::segment::EvenCuts;
    let dir = tempfile::tempdir().unwrap();
    let even = |first: i64, width: i64, count: u32| EvenCuts::new(first, width, count).unwrap();
    let keys = |lower: Option<i64>, upper: Option<i64>| Segment {
        lower: lower.map(|k| vec![KeyPart::Int(k)]),
        upper: upper.map(|k| vec![KeyPart::Int(k)]),
        ..Segment::default()
    };
    // keys 3i + i%5 for i in 1..=3000: 4 to 9000
    let cases: Vec<(&str, Vec<(Segment, EvenCuts)>)> = vec![
        ("alone", vec![(Segment::whole(), even(1000, 1000, 8))]),
        (
            "uneven last child",
            vec![(Segment::whole(), even(-5000, 2501, 5))],
        ),
        (
            "beside other parents",
            vec![
                (keys(Some(100), Some(5000)), even(700, 600, 6)),
                (keys(Some(5000), Some(6000)), even(4000, 300, 9)),
                (keys(Some(8000), None), even(8001, 1, 3)),
            ],
        ),
        ("one cut", vec![(Segment::whole(), even(4500, 1, 1))]),
        (
            "past 2^62",
            vec![(Segment::whole(), even(i64::MIN + 1, 1 << 62, 3))],
        ),
        (
            "to i64::MAX",
            vec![(Segment::whole(), even(i64::MAX - 20, 10, 3))],
        ),
    ];
    let mut ran = Vec::new();
    for engine in engines::available() {
        let engine = &*engine;
        ran.push(engine.name());
        let l = engine.create("even_split", dir.path()).await;
        l.exec(&orders_sql(engine, &l.table("orders"))).await;
        let mut ds = dataset("even_split", l.source("orders"), l.connector);
        let b = ds
            .bind(&mut ds.session().await.unwrap(), orders_columns(), 1)
            .await
            .unwrap();
        let h = hasher(HashMethod::SealedSha256_64);
        for (case, parents) in &cases {
            let as_even: Vec<(Segment, Split)> = parents
                .iter()
                .map(|(s, e)| (s.clone(), Split::Even(*e)))
                .collect();
            let as_list: Vec<(Segment, Split)> = parents
                .iter()
                .map(|(s, e)| (s.clone(), Split::Cuts(e.cuts())))
                .collect();
            for (hashing, in_process) in [(Hashing::Pushdown, false), (Hashing::Auto, true)] {
                ds.config.hashing = hashing;
                let mut outs = Vec::new();
                for p in [&as_even, &as_list] {
                    let out = ds
                        .aggregate(&mut ds.session().await.unwrap(), &b, &h, p, in_process)
                        .await
                        .unwrap();
                    outs.push((out.path.name(), summary(&out)));
                }
                let what = format!("{} {case} ({hashing:?}, in_process={in_process})", engine.name());
                assert_eq!(outs[0], outs[1], "{what}");
                let rows: u64 = outs[0].1.iter().map(|b| b.3).sum();
                assert!(rows > 0, "{what}: no rows");
            }
        }
    }
    eprintln!("even splits agree with their cut lists on {ran:?}");
}

/// The same table with one planted difference of each kind, on every engine: the
/// buckets that differ from a clean copy are exactly the buckets holding the planted
/// rows, whichever engine holds which copy.
#[tokio::test(flavor = "multi_thread")]
async fn planted_differences_land_in_exactly_the_right_bucket() {
    let dir = tempfile::tempdir().unwrap();
    // key 3i + i%5 for i in 1..=3000; cuts every 1000 keys
    let cuts: Vec<Vec<KeyPart>> = (1..9).map(|c| vec![KeyPart::Int(c * 1000)]).collect();
    let bucket_of = |k: i64| cuts.iter().filter(|c| c[0] <= KeyPart::Int(k)).count();
    // changed value (id 1504), missing row (4500), extra row (8000, a key the table lacks),
    // NULL vs empty text (id 6008 has a note; set it NULL in one copy and '' in the other)
    let plant = |e: &dyn EngineFixture, orders: &str| {
        // Oracle stores '' as NULL: there the difference is NULL vs a non-empty text
        let empty = if e.empty_string_is_null() { "'-'" } else { "''" }.to_string();
        let ok = e.bool_literal(true);
        format!(
            "UPDATE {orders} SET amount = amount + 1 WHERE id = 1504;\nDELETE FROM {orders} WHERE id = 4500;\n\
             INSERT INTO {orders} VALUES (8000, 'x', 1.00, '2024-01-01 00:00:00', NULL, {ok});\n\
             UPDATE {orders} SET note = {empty} WHERE id = 6008;\n"
        )
    };
    let expected: std::collections::BTreeSet<usize> =
        [1504, 4500, 8000, 6008].into_iter().map(bucket_of).collect();
    assert_eq!(
        expected.len(),
        4,
        "the planted rows sit in four different buckets"
    );
    let mut clean = Vec::new();
    let mut dirty = Vec::new();
    for engine in engines::available() {
        let engine = &*engine;
        for (planted, out) in [(false, &mut clean), (true, &mut dirty)] {
            let name = if planted { "dirty" } else { "clean" };
            let l = engine.create(name, dir.path()).await;
            let orders = l.table("orders");
            l.exec(&orders_sql(engine, &orders)).await;
            l.exec(&format!(
                "UPDATE {orders} SET note = NULL WHERE id = 6008;\n{}",
                if planted {
                    plant(engine, &orders)
                } else {
                    String::new()
                }
            ))
            .await;
            let ds = dataset(name, l.source("orders"), l.connector);
            let b = ds
                .bind(&mut ds.session().await.unwrap(), orders_columns(), 1)
                .await
                .unwrap();
            let o = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &Hasher::unsealed(HashMethod::Sha256_64),
                    &[(Segment::whole(), Split::Cuts(cuts.clone()))],
                    false,
                )
                .await
                .unwrap();
            out.push((engine.name(), summary(&o)));
        }
    }
    for (ce, c) in &clean {
        for (de, d) in &dirty {
            let differing: std::collections::BTreeSet<usize> = c
                .iter()
                .zip(d)
                .filter(|(a, b)| (a.3, a.4, a.5) != (b.3, b.4, b.5))
                .map(|(a, _)| a.1)
                .collect();
            assert_eq!(differing, expected, "clean on {ce} against dirty on {de}");
        }
    }
}

/// Values that once needed SQL's text (PostgreSQL infinity and BC timestamps, a NaN
/// numeric, a timestamp past 9999) are read by the agent itself: the in-process and the
/// pushed-down aggregate agree, the rows phase reads them, and nothing is remembered
/// between requests (the same request gives the same path and answer twice).
#[tokio::test(flavor = "multi_thread")]
async fn both_paths_agree_on_values_beyond_the_iso_calendar() {
    let dir = tempfile::tempdir().unwrap();
    // PostgreSQL alone stores these values
    let l = engines::postgres::Postgres.create("inf", dir.path()).await;
    l.exec(
        "CREATE TABLE ev (id BIGINT PRIMARY KEY, at TIMESTAMP, d DATE, n NUMERIC);\n\
         INSERT INTO ev VALUES (1, '2024-01-01 10:00:00.5', '2024-01-01', 1.50), (2, 'infinity', '-infinity', 'NaN'), \
         (3, '0044-03-15 12:00:00 BC', '2000-01-01 BC', '-0.00'), (4, '10000-01-01 00:00:00', '12345-06-07', 'Infinity');\n",
    )
    .await;
    let cols = || {
        vec![
            ColumnSpec {
                name: "id".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "at".into(),
                format: FieldFormat::new(TypeClass::Timestamp),
            },
            ColumnSpec {
                name: "d".into(),
                format: FieldFormat::new(TypeClass::Date),
            },
            ColumnSpec {
                name: "n".into(),
                format: FieldFormat::new(TypeClass::Decimal).exact(true),
            },
        ]
    };
    let whole = [(Segment::whole(), Split::Whole)];
    let ds = dataset("ev", l.source("ev"), l.connector);
    let b = ds
        .bind(&mut ds.session().await.unwrap(), cols(), 1)
        .await
        .unwrap();
    let forced = ds
        .aggregate(
            &mut ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            true,
        )
        .await
        .unwrap();
    assert_eq!(forced.path.name(), "in_process");
    assert_eq!(forced.buckets[0].agg.count(), 4);
    let pushed_ds = pushdown_dataset(&ds, &l.url);
    let pushed = pushed_ds
        .aggregate(
            &mut pushed_ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            false,
        )
        .await
        .unwrap();
    assert_eq!(pushed.path.name(), "pushdown");
    assert_eq!(
        forced.buckets[0].agg, pushed.buckets[0].agg,
        "the two paths render identically"
    );
    assert_eq!(digest_count(&ds, &b).await.unwrap(), 4);
    let again = ds
        .aggregate(
            &mut ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            false,
        )
        .await
        .unwrap();
    assert_eq!(
        again.path.name(),
        "in_process",
        "auto stays in-process: no sticky fallback"
    );
    assert_eq!(again.buckets[0].agg, forced.buckets[0].agg);
}

/// The same dataset configured with `hashing: pushdown`.
fn pushdown_dataset(ds: &Dataset, url: &str) -> Dataset {
    let mut config = ds.config.clone();
    config.hashing = Hashing::Pushdown;
    Dataset::new(
        ds.name.clone(),
        config,
        ds.source.clone(),
        Connector::open(url).unwrap(),
    )
}

/// How many row digests the whole of `ds` gives.
async fn digest_count(ds: &Dataset, b: &Bound) -> Result<usize, AgentError> {
    let mut n = 0;
    ds.digests(
        &mut ds.session().await?,
        b,
        &Hasher::unsealed(HashMethod::Sha256_64),
        &Segment::whole(),
        100,
        &mut |batch| {
            n += batch.len();
            Ok(Flow::Go)
        },
    )
    .await?;
    Ok(n)
}

/// A dataset `name` over `source` (a table), keyed by `id`, on `connector` (the URL
/// and table in its config are never opened: the connector and source are given).
fn dataset(name: &str, source: Source, connector: Connector) -> Dataset {
    keyed_dataset(name, source, connector, "id")
}

/// [`dataset`] keyed by `key` (a YAML list's items: `k0, k1`).
fn keyed_dataset(name: &str, source: Source, connector: Connector, key: &str) -> Dataset {
    let Source::Table(parts) = &source else {
        panic!("a table")
    };
    let table = parts.last().expect("a table name");
    Dataset::new(
        name.into(),
        tally_common::config_file::parse_yaml(
            std::path::Path::new("x"),
            &format!("{{ url: 'sqlite://x', table: {table}, key: [{key}] }}"),
        )
        .unwrap(),
        source,
        connector,
    )
}

/// A composite key (text, integer) on every engine and path (issue 31 F11: DuckDB
/// refused its own row-value range, `(k0, k1) >= (?, ?) AND (k0, k1) < (?, ?)`, and the
/// single integer key of the other tests never rendered one): splits of the whole
/// table and of segments bounded on both sides give the same buckets pushed down and
/// in-process, and the row digests of bounded segments (the rows phase) are the rows
/// the reference's bytewise tuple order puts in the range, on every engine alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_composite_key_splits_and_digests_alike_on_every_engine_and_path() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let variants: Vec<KeyVariant> = engines::available()
        .into_iter()
        .map(|e| (e, "pairs", "", None))
        .chain(collated_variants())
        .collect();
    composite_key_on(variants).await;
}

/// DuckDB orders by the column's collation and an ENUM by its labels' positions: the
/// key predicates compare bytes all the same.
fn collated_variants() -> Vec<KeyVariant> {
    #[cfg(feature = "duckdb")]
    {
        let duck = || Box::new(engines::duckdb::DuckDb) as Box<dyn EngineFixture>;
        vec![
            (duck(), "pairs_nocase", "", Some("VARCHAR COLLATE NOCASE")),
            (
                duck(),
                "pairs_enum",
                "CREATE TYPE label AS ENUM ('zz', '~', 'ñandú', 'b', 'aa', 'a:b', 'a', 'Zoë', 'B', 'A', 'Øre', '日本');\n",
                Some("label"),
            ),
        ]
    }
    #[cfg(not(feature = "duckdb"))]
    {
        Vec::new()
    }
}

/// An engine's table of [`composite_key_on`]: (fixture, table, setup SQL before the
/// table, the text key's type: `None` for the fixture's own).
type KeyVariant = (
    Box<dyn EngineFixture>,
    &'static str,
    &'static str,
    Option<&'static str>,
);

async fn composite_key_on(variants: Vec<KeyVariant>) {
    let dir = tempfile::tempdir().unwrap();
    // bytewise, not by any language's rules: 'A' < 'B' < 'a' < 'a:b' < 'aa' < '~' < 'Ø' < '日'
    let names = [
        "a", "B", "b", "Zoë", "Øre", "日本", "~", "a:b", "aa", "A", "zz", "ñandú",
    ];
    let rows: Vec<(String, i64, String)> = (0..240i64)
        .map(|i| {
            let k0 = names[(i % 12) as usize].to_string();
            (k0, i / 12 - 10, format!("{}.{:02}", (i * 7919) % 1000, i % 100))
        })
        .collect();
    let tuple = |k0: &str, k1: i64| vec![KeyPart::Text(k0.into()), KeyPart::Int(k1)];
    let bounded = |l: Option<(&str, i64)>, u: Option<(&str, i64)>| Segment {
        lower: l.map(|(a, b)| tuple(a, b)),
        upper: u.map(|(a, b)| tuple(a, b)),
        ..Segment::default()
    };
    let both = bounded(Some(("B", -3)), Some(("Øre", 2)));
    let splits: Vec<(&str, Vec<(Segment, Split)>)> = vec![
        ("quantile", vec![(Segment::whole(), Split::Quantile(5))]),
        (
            "cuts",
            vec![(
                Segment::whole(),
                Split::Cuts(vec![
                    tuple("B", 0),
                    tuple("a", -5),
                    tuple("Øre", 3),
                    tuple("日本", -100),
                ]),
            )],
        ),
        ("bounded quantile", vec![(both.clone(), Split::Quantile(3))]),
        (
            "bounded cuts and halves",
            vec![
                (
                    bounded(Some(("A", 0)), Some(("zz", 0))),
                    Split::Cuts(vec![tuple("a", 1), tuple("~", -2)]),
                ),
                (bounded(Some(("b", 5)), None), Split::Whole),
                (bounded(None, Some(("Zoë", -1))), Split::Quantile(2)),
            ],
        ),
    ];
    let digest_segments = [
        both.clone(),
        bounded(Some(("a:b", 4)), None),
        bounded(None, Some(("aa", -10))),
        bounded(Some(("日本", 9)), Some(("日本", 10))),
    ];
    let cols = || {
        vec![
            ColumnSpec {
                name: "k0".into(),
                format: FieldFormat::new(TypeClass::Text),
            },
            ColumnSpec {
                name: "k1".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "v".into(),
                format: FieldFormat::new(TypeClass::Decimal).with_scale(2),
            },
        ]
    };
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let mut buckets: BTreeMap<&str, (String, Summary)> = BTreeMap::new();
    let mut digests: BTreeMap<usize, (String, Vec<(u64, u64)>)> = BTreeMap::new();
    for (engine, table, setup, text_type) in &variants {
        let engine = &**engine;
        let name = format!("{} {table}", engine.name());
        let l = engine.create(table, dir.path()).await;
        let pairs = l.table(table);
        let values: Vec<String> = rows
            .iter()
            .map(|(k0, k1, v)| format!("({}, {k1}, {v})", engine.text_literal(k0)))
            .collect();
        l.exec(&format!(
            "{setup}CREATE TABLE {pairs} (k0 {} NOT NULL, k1 INTEGER NOT NULL, v DECIMAL(12,2));\nINSERT INTO {pairs} VALUES {};\n",
            text_type.unwrap_or(engine.short_text_type()),
            values.join(", ")
        ))
        .await;
        let sql_xor = l.connector.dialect().xor_aggregate("h").is_some();
        let mut ds = keyed_dataset(table, l.source(table), l.connector, "k0, k1");
        let b = ds
            .bind(&mut ds.session().await.unwrap(), cols(), 2)
            .await
            .unwrap();
        for (split, parents) in &splits {
            for (hashing, in_process) in [
                (Hashing::Pushdown, false),
                (Hashing::Auto, false),
                (Hashing::Auto, true),
            ] {
                ds.config.hashing = hashing;
                let out = ds
                    .aggregate(&mut ds.session().await.unwrap(), &b, &h, parents, in_process)
                    .await
                    .unwrap_or_else(|e| panic!("{name} {split} ({hashing:?}, in_process={in_process}): {e}"));
                let s = summary(&out);
                let sum_only = out.path.name() == "pushdown" && !sql_xor;
                match buckets.get(split) {
                    None if sum_only => {}
                    None => {
                        buckets.insert(split, (name.clone(), s));
                    }
                    Some((first, expected)) => assert_eq!(
                        s,
                        if sum_only {
                            without_xor(expected)
                        } else {
                            expected.clone()
                        },
                        "{name} {split} ({hashing:?}, in_process={in_process}) differs from {first}"
                    ),
                }
            }
        }
        for (i, seg) in digest_segments.iter().enumerate() {
            let want = rows
                .iter()
                .filter(|(k0, k1, _)| seg.in_key_range(&tuple(k0, *k1)))
                .count();
            for hashing in [Hashing::Pushdown, Hashing::Auto] {
                ds.config.hashing = hashing;
                let mut got = Vec::new();
                ds.digests(&mut ds.session().await.unwrap(), &b, &h, seg, 7, &mut |batch| {
                    got.extend(batch);
                    Ok(Flow::Go)
                })
                .await
                .unwrap_or_else(|e| panic!("{name} digests of {seg:?} ({hashing:?}): {e}"));
                got.sort_unstable();
                assert_eq!(got.len(), want, "{name} digests of {seg:?} ({hashing:?})");
                match digests.get(&i) {
                    None => {
                        digests.insert(i, (name.clone(), got));
                    }
                    Some((first, expected)) => assert_eq!(
                        &got, expected,
                        "{name} digests of {seg:?} ({hashing:?}) differ from {first}"
                    ),
                }
            }
        }
    }
    assert_eq!(buckets.len(), splits.len());
}

/// Fixed run keys for the sealed methods in these tests (what two agents would derive).
const TEST_KEYS: RunKeys = RunKeys {
    k_row: [0x5a; 32],
    k_key: [0xa5; 32],
};

fn hasher(m: HashMethod) -> Hasher {
    if m.is_sealed() {
        Hasher::sealed(m, &TEST_KEYS)
    } else {
        Hasher::unsealed(m)
    }
}

/// Windows (DESIGN §5): every engine, on every path, keeps the same rows of a window:
/// the row at the bound is in, a microsecond later is out, NULL is out; an integer
/// window compares by value. Pushed down, forced in-process, quantile-split (the
/// in-process count and scan) and digests all count the window's rows alone, and every
/// engine's checksum of them is the same.
#[tokio::test(flavor = "multi_thread")]
async fn every_engine_and_path_keeps_the_same_rows_of_a_window() {
    use tally_common::segment::Window;
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        (1, Some("2026-06-01 11:59:59.999999"), Some(10)),
        (2, Some("2026-06-01 12:00:00.000000"), Some(20)),
        (3, Some("2026-06-01 12:00:00.000001"), Some(21)),
        (4, None, None),
        (5, Some("1999-01-01 00:00:00.000000"), Some(-5)),
        (6, Some("2030-01-01 00:00:00.000000"), Some(99)),
    ];
    let values: Vec<String> = rows
        .iter()
        .map(|(id, at, n)| {
            format!(
                "({id}, {}, {})",
                at.map_or("NULL".to_string(), |a| format!("'{a}'")),
                n.map_or("NULL".to_string(), |n| n.to_string())
            )
        })
        .collect();
    let cols = || {
        vec![
            ColumnSpec {
                name: "id".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "changed_at".into(),
                format: FieldFormat::new(TypeClass::Timestamp).with_scale(6),
            },
            ColumnSpec {
                name: "n".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
        ]
    };
    let windows = [
        // the bound as the coordinator sends it (nanosecond digits), and as written
        ("changed_at", "2026-06-01T12:00:00.000000000", vec![1, 2, 5]),
        ("changed_at", "2026-06-01 12:00:00", vec![1, 2, 5]),
        ("CHANGED_AT", "2026-06-01T11:59:59.9999999", vec![1, 5]),
        ("n", "20", vec![1, 2, 5]),
        ("n", "-6", vec![]),
    ];
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    // per window: (engine, path, count, checksum)
    type Answers<'a> = Vec<(&'static str, &'a str, u64, u64)>;
    let mut seen: BTreeMap<(String, String), Answers> = BTreeMap::new();
    for engine in engines::available() {
        let engine = &*engine;
        let engine_name = engine.name();
        let l = engine.create("win", dir.path()).await;
        let (ev, at_type) = (l.table("ev"), engine.timestamp_type());
        l.exec(&format!(
            "CREATE TABLE {ev} (id BIGINT PRIMARY KEY, changed_at {at_type}, n BIGINT);\nINSERT INTO {ev} VALUES {};\n",
            values.join(", ")
        ))
        .await;
        let url = l.url.clone();
        let ds = dataset("ev", l.source("ev"), l.connector);
        let pushed_ds = pushdown_dataset(&ds, &url);
        let b = ds
            .bind(&mut ds.session().await.unwrap(), cols(), 1)
            .await
            .unwrap();
        for (column, upper, want) in &windows {
            let seg = Segment {
                window: Some(Window {
                    column: column.to_string(),
                    upper: upper.to_string(),
                }),
                ..Segment::whole()
            };
            let whole = [(seg.clone(), Split::Whole)];
            let mut answers = Vec::new();
            for (name, d, in_process) in [
                ("auto", &ds, false),
                ("in_process", &ds, true),
                ("pushdown", &pushed_ds, false),
            ] {
                // SQLite has no pushdown; DuckDB's default is pushdown (and a second
                // connector would open another, empty, in-memory database)
                if name == "pushdown" && (!engine.hashes_in_sql() || !engine.url_reopens()) {
                    continue;
                }
                let out = d
                    .aggregate(&mut d.session().await.unwrap(), &b, &h, &whole, in_process)
                    .await
                    .unwrap();
                if name == "pushdown" || (name == "auto" && engine.auto_pushes_down()) {
                    assert_eq!(out.path.name(), "pushdown", "{engine_name}");
                }
                answers.push((name, out.buckets[0].agg.count(), out.buckets[0].agg.sum()));
            }
            // a quantile split counts the window's rows, then cuts them
            let q = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &h,
                    &[(seg.clone(), Split::Quantile(2))],
                    true,
                )
                .await
                .unwrap();
            answers.push((
                "quantile",
                q.buckets.iter().map(|b| b.agg.count()).sum(),
                q.buckets.iter().fold(0u64, |s, b| s.wrapping_add(b.agg.sum())),
            ));
            let mut digests = 0;
            ds.digests(
                &mut ds.session().await.unwrap(),
                &b,
                &h,
                &seg,
                100,
                &mut |batch| {
                    digests += batch.len() as u64;
                    Ok(Flow::Go)
                },
            )
            .await
            .unwrap();
            for (name, count, _) in &answers {
                assert_eq!(
                    *count,
                    want.len() as u64,
                    "{engine_name} {name}: window {column} <= {upper}"
                );
            }
            assert_eq!(
                digests,
                want.len() as u64,
                "{engine_name} digests: window {column} <= {upper}"
            );
            let first = answers[0].2;
            assert!(
                answers.iter().all(|a| a.2 == first),
                "{engine_name}: the paths disagree on the window's checksum: {answers:?}"
            );
            seen.entry((column.to_string(), upper.to_string()))
                .or_default()
                .extend(answers.iter().map(|(n, c, s)| (engine_name, *n, *c, *s)));
            // investigation SQL names the window where the engine renders it
            let sql = ds.investigation_sql(&b, &seg, false);
            // SQLite renders no canonical timestamp text: its SQL says so
            if engine.hashes_in_sql() || *column == "n" {
                assert!(sql.contains("<="), "{engine_name}: {sql}");
            } else {
                assert!(sql.contains("window"), "{engine_name}: {sql}");
            }
        }
        // a bound that is not a value of the column's class, a column that is not
        // compared, and a text column are refused, naming what is wrong
        for (column, upper, says) in [
            ("changed_at", "yesterday", "window.upper"),
            ("n", "1.5", "64-bit integer"),
            ("missing", "1", "not among the compared columns"),
        ] {
            let seg = Segment {
                window: Some(Window {
                    column: column.into(),
                    upper: upper.into(),
                }),
                ..Segment::whole()
            };
            let e = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &h,
                    &[(seg, Split::Whole)],
                    false,
                )
                .await
                .unwrap_err();
            assert!(e.to_string().contains(says), "{engine_name}: {e}");
        }
    }
    for ((column, upper), answers) in &seen {
        let first = answers[0].3;
        assert!(
            answers.iter().all(|a| a.3 == first),
            "window {column} <= {upper}: the engines disagree: {answers:?}"
        );
    }
}
