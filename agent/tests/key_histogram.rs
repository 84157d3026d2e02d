//! The key histogram a describe carries (issue 16): PostgreSQL's statistics of a single
//! integer key, read from `pg_stats` after ANALYZE, ascending and spanning both islands
//! of a clustered key; nothing for an engine that keeps no such statistics, for a text
//! key, or for a table never analysed.

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_common::config_file::parse_yaml;
use tally_e2e::db;

fn dataset(url: &str, table: &str, key: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: {table}, key: [{key}] }}"),
    )
    .unwrap();
    Dataset::new(
        table.into(),
        config,
        Source::Table(vec![table.into()]),
        Connector::open(url).unwrap(),
    )
}

async fn histogram(url: &str, table: &str, key: &str) -> Vec<i64> {
    let ds = dataset(url, table, key);
    let mut s = ds.session().await.unwrap();
    let info = ds.describe(&mut s).await.unwrap();
    let h = ds.key_histogram(&mut s, &info).await;
    s.finish().await.unwrap();
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statistics_give_the_key_histogram_of_an_analysed_table() {
    let pg = db::postgres();
    let url = pg.create_database("key_histogram");
    pg.exec(
        Some("key_histogram"),
        "CREATE TABLE islands (id bigint PRIMARY KEY, v text);\n\
         INSERT INTO islands SELECT g + CASE WHEN g > 5000 THEN 1000000000000000 ELSE 0 END, 'x' FROM generate_series(1, 10000) g;\n\
         CREATE TABLE fresh (id bigint PRIMARY KEY);\n\
         CREATE TABLE named (code text PRIMARY KEY);\n\
         INSERT INTO named SELECT 'k' || g FROM generate_series(1, 1000) g;\n\
         ANALYZE islands; ANALYZE named;",
    );
    let h = histogram(&url, "islands", "id").await;
    assert!(h.len() >= 10, "{h:?}");
    assert!(h.windows(2).all(|w| w[0] < w[1]), "ascending: {h:?}");
    assert!(
        h.iter().any(|k| *k <= 5000) && h.iter().any(|k| *k > 1_000_000_000_000_000),
        "{h:?}"
    );
    assert!(histogram(&url, "fresh", "id").await.is_empty(), "never analysed");
    assert!(histogram(&url, "named", "code").await.is_empty(), "a text key");

    let my = db::mariadb();
    let url = my.create_database("key_histogram");
    my.exec(
        Some("key_histogram"),
        "CREATE TABLE islands (id bigint PRIMARY KEY); INSERT INTO islands VALUES (1), (2), (1000000000000000);",
    );
    assert!(
        histogram(&url, "islands", "id").await.is_empty(),
        "MariaDB keeps none by default"
    );
}
