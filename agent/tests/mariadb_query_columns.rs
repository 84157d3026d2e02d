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

async fn describe(ds: &Dataset) -> tally_agent::schema::DatasetInfo {
    let mut s = ds.session().await.unwrap();
    let info = ds.describe(&mut s).await.unwrap();
    s.finish().await.unwrap();
    info
}

/// What the agent compares a column as: its class, how it is read, and whether it is
/// padded.
fn classes(info: &tally_agent::schema::DatasetInfo) -> Vec<(String, String)> {
    info.columns
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                format!("{} {:?} fixed={}", c.class, c.native, c.fixed_char),
            )
        })
        .collect()
}

/// A query's columns are described by the protocol's column definitions, which sqlx
/// names by their flags alone: a `_bin` collation sets the BINARY flag, so a text
/// column read as `varbinary` (compared as hex, and refused as a key against a text
/// key); a `TINYINT(1)` read as `BOOLEAN`, which had no class; a `BIT(5)` as a
/// `BIT(1)`, a boolean (issue 31 F12). Binary is the definition's character set (63),
/// and the display width tells `TINYINT(1)` and `BIT(n)`: the same table as a `table:`
/// and as a `query:` dataset gives the same classes, and the same checksums.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_datasets_columns_classify_as_the_same_tables_columns() {
    use tally_common::canonical::FieldFormat;
    use tally_common::checksum::{HashMethod, Hasher};
    use tally_common::segment::{ColumnSpec, Segment, Split};

    let my = db::mariadb();
    let url = my.create_database("query_classes");
    my.exec(
        Some("query_classes"),
        "CREATE TABLE c (id BIGINT PRIMARY KEY, \
         k0 VARCHAR(80) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, \
         ch CHAR(5) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, \
         tx TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, \
         l1 VARCHAR(10) CHARACTER SET latin1 COLLATE latin1_bin, \
         plain VARCHAR(10) CHARACTER SET utf8mb4, \
         vb VARBINARY(10), bn BINARY(4), bl BLOB, \
         b BOOLEAN, tb TINYINT(1) UNSIGNED, t4 TINYINT, \
         b1 BIT(1), b5 BIT(5), b12 BIT(12), \
         z INT(5) ZEROFILL, dz DECIMAL(8,2) ZEROFILL, y YEAR, \
         e ENUM('x','y'), s SET('p','q')); \
         INSERT INTO c VALUES (1, 'Zoë', 'ab', 'x', 'é', 'p', 0x00ff, 0x01, 0xdead, TRUE, 1, 7, b'1', b'10101', \
         b'101010101010', 42, 3.5, 2024, 'y', 'p,q'), \
         (2, 'zz ', 'c', '', 'e', 'q', '', 0x0203, NULL, FALSE, 0, -7, b'0', b'00001', b'000000000001', 7, 0.25, 1999, 'x', '');",
    );
    let table = dataset(&url, Source::Table(vec!["c".into()]));
    let declared = describe(&table).await;
    let names: Vec<String> = declared.columns.iter().map(|c| c.name.clone()).collect();
    let want = classes(&declared);
    let column = |n: &str| want.iter().find(|c| c.0 == n).unwrap().1.clone();
    // what the table's declarations say, spelled out
    assert_eq!(column("k0"), "text Plain fixed=false");
    assert_eq!(column("ch"), "text Plain fixed=true");
    assert_eq!(column("b"), "boolean Plain fixed=false");
    assert_eq!(column("b5"), "binary Bit(5) fixed=false");
    assert_eq!(column("z"), "integer ZeroFill fixed=false");
    for q in [
        "SELECT * FROM c".to_string(),
        format!("SELECT {} FROM c", names.join(", ")),
        format!("SELECT {} FROM (SELECT * FROM c) inner_c", names.join(", ")),
    ] {
        let query = dataset(&url, Source::Query(q.clone()));
        assert_eq!(classes(&describe(&query).await), want, "{q}");
    }
    // and the values read alike: every column compared, both paths, both forms
    let specs = || {
        declared
            .columns
            .iter()
            .map(|c| ColumnSpec {
                name: c.name.clone(),
                format: FieldFormat::new(c.class).with_scale(c.scale.unwrap_or(0)),
            })
            .collect::<Vec<_>>()
    };
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let mut sums = Vec::new();
    for source in [
        Source::Table(vec!["c".into()]),
        Source::Query("SELECT * FROM c".into()),
    ] {
        for in_process in [false, true] {
            let mut ds = dataset(&url, source.clone());
            if !in_process {
                ds.config.hashing = tally_agent::config::Hashing::Pushdown;
            }
            let mut s = ds.session().await.unwrap();
            let b = ds.bind(&mut s, specs(), 1).await.unwrap();
            let out = ds
                .aggregate(&mut s, &b, &h, &[(Segment::whole(), Split::Whole)], in_process)
                .await
                .unwrap();
            s.finish().await.unwrap();
            sums.push((
                out.path.name(),
                out.buckets[0].agg.count(),
                out.buckets[0].agg.sum(),
            ));
        }
    }
    assert!(sums.iter().all(|s| s.1 == 2 && s.2 == sums[0].2), "{sums:?}");
}
