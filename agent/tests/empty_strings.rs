//! `empty_string_is_null` (issue 15): Oracle stores `''` as NULL, so a dataset
//! reconciled with an Oracle one can compare its own empty strings as NULL. On a real
//! PostgreSQL and MariaDB, a table holding `''` and one holding NULL where the first has
//! `''` aggregate identically with the setting, on the pushed-down and the in-process
//! path alike; without it they differ (the control), and a non-empty text is untouched.

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::{AggregateOut, Dataset};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::config_file::parse_yaml;
use tally_common::segment::{ColumnSpec, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::db;

fn dataset(url: &str, table: &str, empty_is_null: bool, in_process: bool) -> Dataset {
    let hashing = if in_process { "in_process" } else { "pushdown" };
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!(
            "{{ url: '{url}', table: {table}, key: [id], hashing: {hashing}, empty_string_is_null: {empty_is_null} }}"
        ),
    )
    .unwrap();
    Dataset::new(
        table.into(),
        config,
        Source::Table(vec![table.into()]),
        Connector::open(url).unwrap(),
    )
}

async fn aggregate(url: &str, table: &str, empty_is_null: bool, in_process: bool) -> AggregateOut {
    let ds = dataset(url, table, empty_is_null, in_process);
    let columns = vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "v".into(),
            format: FieldFormat::new(TypeClass::Text),
        },
        ColumnSpec {
            name: "c".into(),
            format: FieldFormat::new(TypeClass::Text).fixed_char(true),
        },
    ];
    let mut s = ds.session().await.unwrap();
    let b = ds.bind(&mut s, columns, 1).await.unwrap();
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let out = ds
        .aggregate(&mut s, &b, &h, &[(Segment::whole(), Split::Whole)], false)
        .await
        .unwrap();
    s.finish().await.unwrap();
    out
}

async fn check(url: &str) {
    for in_process in [false, true] {
        let with = aggregate(url, "with_empty", true, in_process).await;
        let nulls = aggregate(url, "with_null", false, in_process).await;
        let control = aggregate(url, "with_empty", false, in_process).await;
        assert_eq!(
            with.path.name(),
            if in_process { "in_process" } else { "pushdown" }
        );
        assert_eq!(
            with.buckets, nulls.buckets,
            "{url} in_process={in_process}: '' as NULL"
        );
        assert_ne!(
            control.buckets, nulls.buckets,
            "{url} in_process={in_process}: without the setting '' is not NULL"
        );
    }
    // both paths agree with the setting on
    let pushed = aggregate(url, "with_empty", true, false).await;
    let read = aggregate(url, "with_empty", true, true).await;
    assert_eq!(pushed.buckets, read.buckets, "{url}: the two paths disagree");
}

const ROWS: &str = "(1, '', ''), (2, 'x', 'ab'), (3, NULL, NULL), (4, ' ', '  ')";
const AS_NULL: &str = "(1, NULL, NULL), (2, 'x', 'ab'), (3, NULL, NULL), (4, ' ', NULL)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_strings_compare_as_null_where_the_dataset_says_so() {
    let pg = db::postgres();
    let url = pg.create_database("empty_strings");
    pg.exec(
        Some("empty_strings"),
        &format!(
            "CREATE TABLE with_empty (id bigint PRIMARY KEY, v text, c char(4)); INSERT INTO with_empty VALUES {ROWS}; \
             CREATE TABLE with_null (id bigint PRIMARY KEY, v text, c char(4)); INSERT INTO with_null VALUES {AS_NULL};"
        ),
    );
    check(&url).await;

    let my = db::mariadb();
    let url = my.create_database("empty_strings");
    my.exec(
        Some("empty_strings"),
        &format!(
            "CREATE TABLE with_empty (id bigint PRIMARY KEY, v text, c char(4)); INSERT INTO with_empty VALUES {ROWS}; \
             CREATE TABLE with_null (id bigint PRIMARY KEY, v text, c char(4)); INSERT INTO with_null VALUES {AS_NULL};"
        ),
    );
    check(&url).await;
}
