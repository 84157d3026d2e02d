//! Period labels (`strategy: time`, the periods of `mode: measures`) have one
//! definition, `tally_common::period::period_label`, over the canonical text of the
//! time column. The agent computes it in-process (a period level read by the agent) and
//! each engine's SQL computes it (pushed-down levels, and the period filter of every
//! deeper level and of the rows phase). Where the two disagree a row is counted in one
//! period and fetched in another, or in none: wrong keys. So on every live engine, for
//! every edge value it stores (infinities, BC and expanded years, MySQL zero dates and
//! months, weeks across month and year ends, year 0000), at every granularity:
//!
//! 1. the engine's SQL label of each row is the reference's label of its canonical text;
//! 2. a period level gives the same buckets pushed down and in-process, the buckets the
//!    reference labels give;
//! 3. each of those periods, read back as a segment (the rows phase), holds exactly the
//!    rows its bucket counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_agent::config::{Hashing, Source};
use tally_agent::connector::{Connector, Flow};
use tally_agent::dataset::{Bound, Dataset};
use tally_agent::dialect;
use tally_agent::schema::ColumnInfo;
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::period::{Granularity, period_label};
use tally_common::segment::{ColumnSpec, Period, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::engines::{self, Database, EngineFixture, quote};

const GRANULARITIES: [Granularity; 6] = [
    Granularity::Hour,
    Granularity::Day,
    Granularity::Week,
    Granularity::Month,
    Granularity::Quarter,
    Granularity::Year,
];

/// Timestamps every engine stores: month, year and leap-day edges of weeks.
const COMMON: &[&str] = &[
    "2024-03-15 14:30:00",
    "2020-12-31 23:59:59",
    "2021-01-03 00:00:00",
    "2021-01-04 00:00:00",
    "2024-02-29 12:00:00",
    "2024-03-01 00:00:00",
    "2023-03-01 00:00:00",
    "2024-12-30 00:00:00",
    "2026-01-01 08:00:00",
    "1999-06-30 00:00:00",
    "0001-01-01 00:00:00",
    "0001-01-07 00:00:00",
    "9999-12-31 23:59:59",
];

/// The edge values beyond the common ones that each engine stores, as its literals.
fn edges(engine: &str) -> &'static [&'static str] {
    match engine {
        "postgres" => &[
            "infinity",
            "-infinity",
            "0010-06-01 00:00:00 BC",
            "0001-01-01 00:00:00 BC",
            "0001-02-29 10:00:00 BC",
            "0001-03-01 00:00:00 BC",
            "0001-12-31 00:00:00 BC",
            "10000-01-01 00:00:00",
            "12345-06-07 00:00:00",
        ],
        "mariadb" => &[
            "0000-00-00 00:00:00",
            "2024-00-15 10:00:00",
            "2024-05-00 00:00:00",
            "2024-00-00 00:00:00",
            "0000-01-01 00:00:00",
            "0000-01-02 00:00:00",
            "0000-03-01 00:00:00",
        ],
        _ => &[],
    }
}

fn columns() -> Vec<ColumnSpec> {
    vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "t".into(),
            format: FieldFormat::new(TypeClass::Timestamp),
        },
        ColumnSpec {
            name: "d".into(),
            format: FieldFormat::new(TypeClass::Date),
        },
    ]
}

/// The table `tl` with one row per value (`t` the timestamp, `d` its date) and a
/// row of NULLs; returns the number of rows.
async fn load(e: &dyn EngineFixture, l: &Database) -> usize {
    let values: Vec<&str> = COMMON.iter().chain(edges(e.name())).copied().collect();
    let table = l.table("tl");
    let mut sql = String::new();
    if e.name() == "mariadb" {
        // zero dates and zero months are stored as written
        sql.push_str("SET SESSION sql_mode = '';\n");
    }
    sql.push_str(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, t {}, d DATE);\n",
        e.timestamp_type()
    ));
    for (i, v) in values.iter().enumerate() {
        let date = match v.split_once(' ') {
            Some((d, rest)) if rest.ends_with(" BC") => format!("{d} BC"),
            Some((d, _)) => d.to_string(),
            None => v.to_string(),
        };
        sql.push_str(&format!(
            "INSERT INTO {table} VALUES ({i}, {}, {});\n",
            quote(v),
            quote(&date)
        ));
    }
    sql.push_str(&format!(
        "INSERT INTO {table} VALUES ({}, NULL, NULL);\n",
        values.len()
    ));
    l.exec(&sql).await;
    values.len() + 1
}

fn dataset(source: Source, connector: Arc<Connector>, hashing: &str) -> Dataset {
    let Source::Table(parts) = &source else {
        panic!("a table")
    };
    let table = parts.last().expect("a table name");
    Dataset::new(
        "tl".into(),
        tally_common::config_file::parse_yaml(
            std::path::Path::new("x"),
            &format!("{{ url: 'sqlite://x', table: {table}, key: [id], hashing: {hashing} }}"),
        )
        .unwrap(),
        source,
        connector,
    )
}

/// Each row's canonical texts as the agent reads them: id → (t, d).
async fn canonical_rows(
    conn: &Connector,
    source: &Source,
    b: &Bound,
) -> BTreeMap<i64, (Option<String>, Option<String>)> {
    let key: Vec<&ColumnInfo> = vec![&b.cols[0].info];
    let shape = conn.fetch_shape();
    let sql = dialect::fetch_rows_inline(
        conn.dialect(),
        source,
        &b.cols,
        &key,
        &Segment::whole(),
        shape,
        false,
    );
    let mut rows = BTreeMap::new();
    conn.scan("tl", &sql, shape, &b.cols, 1, &mut |r| {
        let id: i64 = r.field(0).unwrap().parse().unwrap();
        rows.insert(
            id,
            (r.field(1).map(str::to_string), r.field(2).map(str::to_string)),
        );
        Ok(())
    })
    .await
    .unwrap();
    rows
}

async fn labels_on(e: Box<dyn EngineFixture>) {
    let e = &*e;
    let name = e.name();
    let dir = tempfile::tempdir().unwrap();
    let l = e.create("periods", dir.path()).await;
    let n = load(e, &l).await;
    let source = l.source("tl");
    // one connector for the datasets and the test's own queries (an in-memory
    // database is seen through its own connector only)
    let conn = Arc::new(l.connector);
    let in_process = dataset(source.clone(), conn.clone(), "in_process");
    let b = in_process
        .bind(&mut in_process.session().await.unwrap(), columns(), 1)
        .await
        .unwrap();
    let rows = canonical_rows(&conn, &source, &b).await;
    assert_eq!(rows.len(), n, "{name}: every row read");
    let d = conn.dialect();
    let rel = dialect::relation(d, &source);
    let hasher = Hasher::unsealed(HashMethod::Sha256_64);
    let mut mismatches = Vec::new();
    for (ci, column) in [(1, "t"), (2, "d")] {
        for g in GRANULARITIES {
            let reference = |id: &i64| {
                let (t, dt) = &rows[id];
                period_label(if ci == 1 { t.as_deref() } else { dt.as_deref() }, g)
            };
            // 1. the engine's SQL label of each row
            if let Some(label) =
                dialect::canonical(d, &b.cols[ci]).and_then(|c| dialect::period_expr(d, &c, g))
            {
                for id in rows.keys() {
                    let sql = format!(
                        "SELECT {} FROM {rel} WHERE {} = {id}",
                        e.as_text(&label),
                        d.quote("id")
                    );
                    let got = match conn.query_text("tl", &sql).await {
                        Ok(got) => got,
                        Err(err) => Some(format!("error {err:?}")),
                    };
                    let want = reference(id);
                    if got != want {
                        let (t, dt) = &rows[id];
                        mismatches.push(format!(
                            "{name} {column} {} of {:?}: SQL {got:?}, reference {want:?}",
                            g.name(),
                            if ci == 1 { t } else { dt }
                        ));
                    }
                }
            }
            // 2. a period level: the reference's buckets, on every path
            let mut want: BTreeMap<String, u64> = BTreeMap::new();
            for id in rows.keys() {
                *want.entry(reference(id).unwrap_or_default()).or_default() += 1;
            }
            let split = [(
                Segment::whole(),
                Split::Period {
                    column: column.into(),
                    granularity: g,
                },
            )];
            let mut paths = vec![in_process.clone_with_hashing(Hashing::InProcess)];
            if e.hashes_in_sql() {
                paths.push(in_process.clone_with_hashing(Hashing::Pushdown));
            }
            for ds in &paths {
                let out = match ds
                    .aggregate(&mut ds.session().await.unwrap(), &b, &hasher, &split, false)
                    .await
                {
                    Ok(out) => out,
                    Err(err) => {
                        mismatches.push(format!("{name} {column} {}: {err:?}", g.name()));
                        continue;
                    }
                };
                let got: BTreeMap<String, u64> = out
                    .buckets
                    .iter()
                    .map(|bk| (bk.segment.period.as_ref().unwrap().label.clone(), bk.agg.count()))
                    .collect();
                if got != want {
                    mismatches.push(format!(
                        "{name} {column} {} ({}): buckets {got:?}, reference {want:?}",
                        g.name(),
                        out.path.name()
                    ));
                }
                // 3. each period read back as a segment holds its bucket's rows
                for (label, count) in &want {
                    let seg = Segment {
                        period: Some(Period {
                            column: column.into(),
                            granularity: g,
                            label: label.clone(),
                        }),
                        ..Segment::default()
                    };
                    let mut read = 0u64;
                    let digests = ds
                        .digests(
                            &mut ds.session().await.unwrap(),
                            &b,
                            &hasher,
                            &seg,
                            100,
                            &mut |batch| {
                                read += batch.len() as u64;
                                Ok(Flow::Go)
                            },
                        )
                        .await;
                    if let Err(err) = digests {
                        mismatches.push(format!(
                            "{name} {column} {} period {label:?} ({}): {err:?}",
                            g.name(),
                            out.path.name()
                        ));
                    } else if read != *count {
                        mismatches.push(format!(
                            "{name} {column} {} period {label:?} ({}): {read} rows read, {count} counted",
                            g.name(),
                            out.path.name()
                        ));
                    }
                }
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    eprintln!("{name}: {n} rows, every label as the reference's");
}

trait WithHashing {
    fn clone_with_hashing(&self, h: Hashing) -> Dataset;
}

impl WithHashing for Dataset {
    fn clone_with_hashing(&self, h: Hashing) -> Dataset {
        let mut config = self.config.clone();
        config.hashing = h;
        Dataset::new(
            self.name.clone(),
            config,
            self.source.clone(),
            self.connector.clone(),
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_engine_labels_periods_as_the_reference() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let mut failed = Vec::new();
    for e in engines::available() {
        let name = e.name();
        if let Err(err) = tokio::spawn(labels_on(e)).await {
            let why = match err.try_into_panic() {
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
