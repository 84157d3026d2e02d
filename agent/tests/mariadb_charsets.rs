//! The in-process path reads MariaDB text columns as they are, relying on the server to
//! send every text in the session's character set (utf8mb4), where canonical SQL (the
//! pushed-down path) converts with `CONVERT(... USING utf8mb4)`. On a real MariaDB, text
//! columns in latin1, utf8mb3 and utf8mb4, CHAR with trailing spaces and an ENUM,
//! holding text beyond ASCII, aggregate identically on both paths; one changed
//! character changes both (the control). A connection whose results are not sent in
//! utf8mb4 (a proxy that dropped `SET NAMES`) is refused, not read.

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

fn dataset(url: &str, table: &str, hashing: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: {table}, key: [id], hashing: {hashing} }}"),
    )
    .unwrap();
    Dataset::new(
        table.into(),
        config,
        Source::Table(vec![table.into()]),
        Connector::open(url).unwrap(),
    )
}

async fn aggregate(url: &str, table: &str, in_process: bool) -> AggregateOut {
    let hashing = if in_process { "in_process" } else { "pushdown" };
    let ds = dataset(url, table, hashing);
    let spec = |name: &str, f: FieldFormat| ColumnSpec {
        name: name.into(),
        format: f,
    };
    let text = || FieldFormat::new(TypeClass::Text);
    let columns = vec![
        spec("id", FieldFormat::new(TypeClass::Integer)),
        spec("l1", text()),
        spec("u3", text()),
        spec("u4", text()),
        spec("c", text().fixed_char(true)),
        spec("e", text()),
    ];
    let mut s = ds.session().await.unwrap();
    let b = ds.bind(&mut s, columns, 1).await.unwrap();
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let out = ds
        .aggregate(&mut s, &b, &h, &[(Segment::whole(), Split::Whole)], false)
        .await
        .unwrap();
    s.finish().await.unwrap();
    assert_eq!(out.path.name(), hashing);
    out
}

const TABLE: &str = "(id BIGINT PRIMARY KEY, l1 VARCHAR(20) CHARACTER SET latin1, \
                     u3 VARCHAR(20) CHARACTER SET utf8mb3, u4 TEXT CHARACTER SET utf8mb4, \
                     c CHAR(6) CHARACTER SET latin1, e ENUM('Zoë', 'straße', 'x') CHARACTER SET latin1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_texts_in_any_character_set_read_as_canonical_sql_renders_them() {
    let my = db::mariadb();
    let url = my.create_database("charsets");
    let rows = "(1, 'Zoë', 'naïve ✓', 'emoji 😀 ok', 'ß  ', 'Zoë'), (2, 'x:y~', '', 'a\tb', '', 'straße'), \
                (3, NULL, NULL, NULL, NULL, NULL), (4, 'Ærø', 'Ελλάδα', '中文', 'é', 'x')";
    my.exec(
        Some("charsets"),
        &format!(
            "CREATE TABLE a {TABLE}; INSERT INTO a VALUES {rows}; \
             CREATE TABLE b {TABLE}; INSERT INTO b VALUES {}; UPDATE b SET l1 = 'Zoe' WHERE id = 1;",
            rows
        ),
    );
    let pushed = aggregate(&url, "a", false).await;
    let read = aggregate(&url, "a", true).await;
    assert_eq!(pushed.buckets, read.buckets, "the two paths disagree on a text");
    assert_eq!(pushed.buckets[0].agg.count(), 4);
    // the control: one character apart, on both paths
    assert_ne!(aggregate(&url, "b", false).await.buckets, pushed.buckets);
    assert_ne!(aggregate(&url, "b", true).await.buckets, read.buckets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_not_sending_utf8mb4_is_refused() {
    let my = db::mariadb();
    let url = my.create_database("charset_refused");
    my.exec(
        Some("charset_refused"),
        &format!("CREATE TABLE a {TABLE}; INSERT INTO a VALUES (1, 'Zoë', NULL, NULL, NULL, NULL);"),
    );
    let ds = dataset(&url, "a", "in_process");
    let mut s = ds.session().await.unwrap();
    ds.describe(&mut s).await.expect("utf8mb4 as the agent set it");
    // as a proxy that does not keep the connection's SET NAMES would leave it (the
    // statement runs; it returns no row, which query_text reports)
    let _ = s.query_text("SET character_set_results = latin1").await;
    let err = ds
        .describe(&mut s)
        .await
        .expect_err("latin1 results are refused")
        .to_string();
    assert!(
        err.contains("character_set_results is latin1, not utf8mb4"),
        "{err}"
    );
}
