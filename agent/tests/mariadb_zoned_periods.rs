//! A MariaDB `DATETIME` compared as an instant is read in its dataset's `time_zone`;
//! the time strategy's periods are labels of that instant in UTC, on both paths,
//! also before 1970 and after 2038, where `CONVERT_TZ` used to leave the value
//! unconverted (issue 31 F1: a row landed in the wrong year).

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::period::Granularity;
use tally_common::segment::{ColumnSpec, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::db;

async fn year_labels(url: &str, hashing: &str) -> Vec<(String, u64)> {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [id], hashing: {hashing}, time_zone: '+05:30' }}"),
    )
    .unwrap();
    let ds = Dataset::new(
        "t".into(),
        config,
        Source::Table(vec!["t".into()]),
        Connector::open(url).unwrap(),
    );
    let mut s = ds.session().await.unwrap();
    let columns = vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "at".into(),
            format: FieldFormat::new(TypeClass::TimestampTz).with_scale(0),
        },
    ];
    let b = ds.bind(&mut s, columns, 1).await.unwrap();
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let split = Split::Period {
        column: "at".into(),
        granularity: Granularity::Year,
    };
    let out = ds
        .aggregate(&mut s, &b, &h, &[(Segment::whole(), split)], false)
        .await
        .unwrap();
    s.finish().await.unwrap();
    out.buckets
        .iter()
        .map(|b| (b.segment.period.as_ref().unwrap().label.clone(), b.agg.count()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zoned_datetimes_fall_in_the_utc_year_of_their_instant_on_both_paths() {
    let my = db::mariadb();
    let url = my.create_database("zoned_periods");
    my.exec(
        Some("zoned_periods"),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, at DATETIME); INSERT INTO t VALUES \
         (1, '1970-01-01 03:00:00'), (2, '2040-01-01 02:00:00'), (3, '2024-01-01 02:00:00'), \
         (4, '2024-06-01 12:00:00');",
    );
    // +05:30: 1969-12-31T21:30Z, 2039-12-31T20:30Z, 2023-12-31T20:30Z, 2024-06-01T06:30Z
    let want: Vec<(String, u64)> = [("1969", 1), ("2023", 1), ("2024", 1), ("2039", 1)]
        .map(|(y, n)| (y.to_string(), n))
        .to_vec();
    assert_eq!(year_labels(&url, "pushdown").await, want, "pushdown");
    assert_eq!(year_labels(&url, "in_process").await, want, "in-process");
}
