//! A DuckDB `TIMESTAMP_NS` keeps all nine fractional digits, and its digits past the
//! compared precision are cut, never rounded, on both paths (issue 31 F15: the pushed-down
//! text cast it to `TIMESTAMP`, which drops the nanoseconds and rounds toward 1970, so
//! `1969-12-31 23:59:59.999999999` became `1970-01-01T00:00:00.000000` and two values a
//! nanosecond apart compared equal at precision 9).
#![cfg(feature = "duckdb")]

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_common::canonical::{FieldFormat, row_string};
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::segment::{ColumnSpec, Segment, Split};
use tally_common::types::TypeClass;

/// A row's key, its `c TIMESTAMP_NS` and the canonical text of `c` at precision 9 and at 6.
type Row = (
    i64,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

const ROWS: &[Row] = &[
    (
        1,
        Some("1969-12-31 23:59:59.999999999"),
        Some("1969-12-31T23:59:59.999999999"),
        Some("1969-12-31T23:59:59.999999"),
    ),
    (
        2,
        Some("2023-01-01 00:00:00.000000001"),
        Some("2023-01-01T00:00:00.000000001"),
        Some("2023-01-01T00:00:00.000000"),
    ),
    (
        3,
        Some("1900-06-15 12:00:00.123456789"),
        Some("1900-06-15T12:00:00.123456789"),
        Some("1900-06-15T12:00:00.123456"),
    ),
    (
        4,
        Some("2024-02-29 23:59:59.5"),
        Some("2024-02-29T23:59:59.500000000"),
        Some("2024-02-29T23:59:59.500000"),
    ),
    (5, None, None, None),
];

fn database(dir: &Path) -> String {
    let path = dir.join("ns.duckdb");
    let c = duckdb::Connection::open(&path).unwrap();
    let values: Vec<String> = ROWS
        .iter()
        .map(|(k, t, _, _)| match t {
            Some(t) => format!("({k}, CAST('{t}' AS TIMESTAMP_NS))"),
            None => format!("({k}, NULL)"),
        })
        .collect();
    c.execute_batch(&format!(
        "CREATE TABLE t (k0 BIGINT PRIMARY KEY, c TIMESTAMP_NS); INSERT INTO t VALUES {};",
        values.join(", ")
    ))
    .unwrap();
    // the table holds the nanoseconds this test compares
    let ns: i64 = c
        .query_row("SELECT epoch_ns(c) FROM t WHERE k0 = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        ns, -1,
        "1969-12-31 23:59:59.999999999 is one nanosecond before 1970"
    );
    format!("duckdb://{}", path.display())
}

fn dataset(url: &str, hashing: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [k0], hashing: {hashing} }}"),
    )
    .unwrap();
    Dataset::new(
        "t".into(),
        config,
        Source::Table(vec!["t".into()]),
        Connector::open(url).unwrap(),
    )
}

fn columns(scale: u32) -> Vec<ColumnSpec> {
    vec![
        ColumnSpec {
            name: "k0".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "c".into(),
            format: FieldFormat::new(TypeClass::Timestamp).with_scale(scale),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_timestamp_ns_keeps_its_nanoseconds_and_cuts_them_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let url = database(dir.path());
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    for scale in [9, 6] {
        // the reference: each row's canonical text at this precision, hashed
        let mut rows: Vec<(i64, u64)> = ROWS
            .iter()
            .map(|(k, _, at9, at6)| {
                let c = if scale == 9 { *at9 } else { *at6 };
                (
                    *k,
                    h.row(row_string([Some(k.to_string().as_str()), c]).as_bytes()),
                )
            })
            .collect();
        rows.sort();
        let sum = rows.iter().fold(0u64, |s, (_, r)| s.wrapping_add(*r));
        for hashing in ["pushdown", "in_process"] {
            let ds = dataset(&url, hashing);
            let mut s = ds.session().await.unwrap();
            let b = ds.bind(&mut s, columns(scale), 1).await.unwrap();
            let out = ds
                .aggregate(&mut s, &b, &h, &[(Segment::whole(), Split::Whole)], false)
                .await
                .unwrap();
            s.finish().await.unwrap();
            let got: Vec<(u64, u64)> = out.buckets.iter().map(|b| (b.agg.count(), b.agg.sum())).collect();
            assert_eq!(
                got,
                vec![(ROWS.len() as u64, sum)],
                "{hashing} at precision {scale}: the rows' checksums"
            );
        }
    }
}
