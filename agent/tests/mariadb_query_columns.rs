//! A MariaDB dataset defined by a `query:` describes its columns through the driver,
//! which names their types without modifiers (`DECIMAL`, `DATETIME`): a query's scale
//! and fractional-second precision are unknown to the agent, so they must be reported
//! undeclared (compared exact, or at the undeclared precision), never as 0. At 0 the
//! other side's scale decided alone, and rounded the query's digits away: a query's
//! `DECIMAL(12,4)` 1.2345 against a `numeric(12,2)` 1.23 was a match (issue 31 F2).

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_common::config_file::parse_yaml;
use tally_e2e::db;

fn dataset(url: &str, source: Source) -> Dataset {
    let at = match &source {
        Source::Table(t) => format!("table: {}", t.join(".")),
        Source::Query(q) => format!("query: \"{q}\""),
    };
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', {at}, key: [id] }}"),
    )
    .unwrap();
    Dataset::new("d".into(), config, source, Connector::open(url).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_datasets_decimal_and_datetime_scales_are_undeclared_never_zero() {
    let my = db::mariadb();
    let url = my.create_database("query_columns");
    my.exec(
        Some("query_columns"),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, amount DECIMAL(12,4), at DATETIME(6), t3 TIME(3), \
         n DECIMAL(10,0)); INSERT INTO t VALUES (1, 1.2345, '2024-03-15 14:30:05.123456', '01:02:03.456', 7);",
    );
    let scales = |info: &tally_agent::schema::DatasetInfo| -> Vec<(String, Option<u32>)> {
        ["amount", "at", "t3", "n"]
            .into_iter()
            .map(|c| (c.to_string(), info.column(c).unwrap().scale))
            .collect()
    };
    let table = dataset(&url, Source::Table(vec!["t".into()]));
    let mut s = table.session().await.unwrap();
    let declared = scales(&table.describe(&mut s).await.unwrap());
    s.finish().await.unwrap();
    assert_eq!(
        declared,
        [
            ("amount", Some(4)),
            ("at", Some(6)),
            ("t3", Some(3)),
            ("n", Some(0))
        ]
        .map(|(c, s)| (c.to_string(), s))
    );
    for q in [
        "SELECT id, amount, at, t3, n FROM t",
        "SELECT id, CAST(amount AS DECIMAL(12,4)) AS amount, at + INTERVAL 0 SECOND AS at, t3, n FROM t",
    ] {
        let query = dataset(&url, Source::Query(q.into()));
        let mut s = query.session().await.unwrap();
        let got = scales(&query.describe(&mut s).await.unwrap());
        s.finish().await.unwrap();
        assert_eq!(
            got,
            [("amount", None), ("at", None), ("t3", None), ("n", None)].map(|(c, s)| (c.to_string(), s)),
            "{q}: a scale the driver does not report is undeclared, never 0"
        );
    }
}
