//! A DuckDB `TIMESTAMP` compared as an instant is read in its dataset's `time_zone` on
//! both paths (issue 31 F13: DuckDB rendered it as if it were UTC, so a row equal to a
//! timestamptz holding the same instant was reported changed): in the row checksums,
//! as the time strategy's period column, as a window's column and as a measures
//! group_by, also where the instant's UTC year leaves 0001-9999.
#![cfg(feature = "duckdb")]

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::{Bound, Dataset};
use tally_agent::measures::{Plan, compute};
use tally_common::canonical::{FieldFormat, row_string};
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::period::Granularity;
use tally_common::segment::{ColumnSpec, Segment, Split, Window};
use tally_common::types::TypeClass;
use tally_common::wire::measures::{GroupBy, MeasuresRequest};

/// `(k0, c2 TIMESTAMP, n)` and the canonical text of `c2` read in +14:00.
const ROWS: &[(i64, Option<&str>, Option<&str>)] = &[
    // the generator's finding
    (
        2497,
        Some("2023-07-22 03:56:26.291218"),
        Some("2023-07-21T13:56:26.291218Z"),
    ),
    (
        1,
        Some("0001-01-01 10:00:00"),
        Some("0000-12-31T20:00:00.000000Z"),
    ),
    (
        2,
        Some("2024-01-01 05:00:00"),
        Some("2023-12-31T15:00:00.000000Z"),
    ),
    (
        3,
        Some("10000-01-01 12:00:00"),
        Some("9999-12-31T22:00:00.000000Z"),
    ),
    (4, None, None),
];

const ZONE: &str = "+14:00";

fn database(dir: &Path) -> String {
    let path = dir.join("zoned.duckdb");
    let c = duckdb::Connection::open(&path).unwrap();
    let values: Vec<String> = ROWS
        .iter()
        .map(|(k, local, _)| match local {
            Some(t) => format!("({k}, TIMESTAMP '{t}', 1)"),
            None => format!("({k}, NULL, 1)"),
        })
        .collect();
    c.execute_batch(&format!(
        "CREATE TABLE t (k0 BIGINT PRIMARY KEY, c2 TIMESTAMP, n BIGINT); INSERT INTO t VALUES {};",
        values.join(", ")
    ))
    .unwrap();
    format!("duckdb://{}", path.display())
}

fn dataset(url: &str, hashing: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [k0], hashing: {hashing}, time_zone: '{ZONE}' }}"),
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
    let spec = |name: &str, format| ColumnSpec {
        name: name.into(),
        format,
    };
    vec![
        spec("k0", FieldFormat::new(TypeClass::Integer)),
        spec("c2", FieldFormat::new(TypeClass::TimestampTz).with_scale(6)),
        spec("n", FieldFormat::new(TypeClass::Integer)),
    ]
}

/// Count and checksum sum the reference gives the rows `keep` selects.
fn reference(h: &Hasher, keep: impl Fn(Option<&str>) -> bool) -> (u64, u64) {
    ROWS.iter()
        .filter(|(_, _, utc)| keep(*utc))
        .fold((0, 0), |(n, sum), (k, _, utc)| {
            let row = row_string([Some(k.to_string().as_str()), *utc, Some("1")]);
            (n + 1, sum.wrapping_add(h.row(row.as_bytes())))
        })
}

async fn aggregate(
    ds: &Dataset,
    b: &Bound,
    h: &Hasher,
    seg: Segment,
    split: Split,
) -> Vec<(String, u64, u64)> {
    let mut s = ds.session().await.unwrap();
    let out = ds.aggregate(&mut s, b, h, &[(seg, split)], false).await.unwrap();
    s.finish().await.unwrap();
    let mut got: Vec<(String, u64, u64)> = out
        .buckets
        .iter()
        .map(|b| {
            let label = b
                .segment
                .period
                .as_ref()
                .map_or(String::new(), |p| p.label.clone());
            (label, b.agg.count(), b.agg.sum())
        })
        .collect();
    got.sort();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_timestamps_in_a_zone_are_their_utc_instant_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let url = database(dir.path());
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let (n, sum) = reference(&h, |_| true);
    let bound = "2023-07-21T23:59:59Z";
    let (wn, wsum) = reference(&h, |utc| utc.is_some_and(|t| t <= "2023-07-21T23:59:59.000000Z"));
    assert_eq!(wn, 2, "the window holds the rows of 0000 and of 2023-07-21 UTC");
    for hashing in ["pushdown", "in_process"] {
        let ds = dataset(&url, hashing);
        let mut s = ds.session().await.unwrap();
        let b = ds.bind(&mut s, columns(), 1).await.unwrap();
        s.finish().await.unwrap();

        let whole = aggregate(&ds, &b, &h, Segment::whole(), Split::Whole).await;
        assert_eq!(
            whole,
            vec![(String::new(), n, sum)],
            "{hashing}: the rows' checksums"
        );

        let window = Segment {
            window: Some(Window {
                column: "c2".into(),
                upper: bound.into(),
            }),
            ..Segment::whole()
        };
        let windowed = aggregate(&ds, &b, &h, window, Split::Whole).await;
        assert_eq!(
            windowed,
            vec![(String::new(), wn, wsum)],
            "{hashing}: c2 <= {bound}"
        );

        let years = aggregate(
            &ds,
            &b,
            &h,
            Segment::whole(),
            Split::Period {
                column: "c2".into(),
                granularity: Granularity::Year,
            },
        )
        .await;
        let labels: Vec<(&str, u64)> = years.iter().map(|(l, n, _)| (l.as_str(), *n)).collect();
        assert_eq!(
            labels,
            vec![("", 1), ("0000", 1), ("2023", 2), ("9999", 1)],
            "{hashing}: the UTC years"
        );

        let r = MeasuresRequest {
            dataset: "t".into(),
            columns: columns(),
            key_len: 1,
            group_by: vec![GroupBy {
                column: "c2".into(),
                granularity: Some(Granularity::Day),
            }],
            measures: vec!["n".into()],
            parents: Vec::new(),
            window: None,
            method: HashMethod::Sha256_64,
            seal: None,
            run_id: "f13".into(),
            side: None,
        };
        let plan = Plan::new("t", &b, &r, |_| true, false).unwrap();
        let mut s = ds.session().await.unwrap();
        let (groups, rows) = compute(&ds, &mut s, &b, &h, &r, &plan).await.unwrap();
        s.finish().await.unwrap();
        assert_eq!(rows, ROWS.len() as u64);
        let days: Vec<(Option<&str>, u64)> =
            groups.iter().map(|g| (g.labels[0].as_deref(), g.count)).collect();
        assert_eq!(
            days,
            vec![
                (None, 1),
                (Some("0000-12-31"), 1),
                (Some("2023-07-21"), 1),
                (Some("2023-12-31"), 1),
                (Some("9999-12-31"), 1)
            ],
            "{hashing}: measures grouped by the UTC day"
        );
    }
}
