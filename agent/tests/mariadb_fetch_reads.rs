//! How the in-process path reads MariaDB rows, against canonical SQL (the pushed-down
//! path), on a real MariaDB.
//!
//! Texts are read as sent, relying on the server to send every text in the session's
//! character set (utf8mb4), where canonical SQL converts with `CONVERT(... USING
//! utf8mb4)`: text columns in latin1, utf8mb3 and utf8mb4, CHAR with trailing spaces
//! and an ENUM, holding text beyond ASCII, aggregate identically on both paths; one
//! changed character changes both (the control). A connection whose results are not
//! sent in utf8mb4 (a proxy that dropped `SET NAMES`) is refused, not read.
//!
//! Integers, decimals, dates and datetimes are read as the binary protocol sends them
//! and rendered by the agent: every integer width at its extremes, signed and
//! unsigned, decimals (a ZEROFILL one keeps its cast), zero dates and datetimes of 0,
//! 3 and 6 fractional digits aggregate identically on both paths; one microsecond,
//! one unit apart, or a NULL where a zero date was changes both.

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

fn spec(name: &str, format: FieldFormat) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        format,
    }
}

fn text_columns() -> Vec<ColumnSpec> {
    let text = || FieldFormat::new(TypeClass::Text);
    vec![
        spec("id", FieldFormat::new(TypeClass::Integer)),
        spec("l1", text()),
        spec("u3", text()),
        spec("u4", text()),
        spec("c", text().fixed_char(true)),
        spec("e", text()),
    ]
}

async fn aggregate(url: &str, table: &str, in_process: bool) -> AggregateOut {
    aggregate_of(url, table, in_process, text_columns()).await
}

async fn aggregate_of(url: &str, table: &str, in_process: bool, columns: Vec<ColumnSpec>) -> AggregateOut {
    let hashing = if in_process { "in_process" } else { "pushdown" };
    let ds = dataset(url, table, hashing);
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

const NATIVE: &str = "(id BIGINT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, \
                      mi MEDIUMINT, mu MEDIUMINT UNSIGNED, ii INT, bu BIGINT UNSIGNED, \
                      d DECIMAL(12,2), dz DECIMAL(8,3) ZEROFILL, dd DATE, t0 DATETIME, \
                      t3 DATETIME(3), t6 DATETIME(6))";

fn native_columns() -> Vec<ColumnSpec> {
    let int = || FieldFormat::new(TypeClass::Integer);
    let mut cols: Vec<ColumnSpec> = ["id", "ti", "tu", "si", "mi", "mu", "ii", "bu"]
        .into_iter()
        .map(|c| spec(c, int()))
        .collect();
    cols.push(spec("d", FieldFormat::new(TypeClass::Decimal).with_scale(2)));
    cols.push(spec("dz", FieldFormat::new(TypeClass::Decimal).with_scale(3)));
    cols.push(spec("dd", FieldFormat::new(TypeClass::Date)));
    for (c, p) in [("t0", 0), ("t3", 3), ("t6", 6)] {
        cols.push(spec(c, FieldFormat::new(TypeClass::Timestamp).with_scale(p)));
    }
    cols
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_integers_decimals_and_datetimes_read_natively_as_canonical_sql_renders_them() {
    let my = db::mariadb();
    let url = my.create_database("natives");
    let rows = "(-9223372036854775808, -128, 255, -32768, -8388608, 16777215, -2147483648, \
                18446744073709551615, -9999999999.99, 1.5, '1000-01-01', '1000-01-01 00:00:00', \
                '1970-01-01 00:00:00.001', '9999-12-31 23:59:59.999999'), \
                (0, 0, 0, 0, 0, 0, 0, 0, 0.00, 0, '2024-02-29', '2024-02-29 12:00:00', \
                '2024-02-29 12:00:00.500', '2024-02-29 12:00:00.000000'), \
                (9223372036854775807, 127, 1, 32767, 8388607, 1, 2147483647, 9223372036854775808, \
                9999999999.99, 99999.999, '0000-00-00', '0000-00-00 00:00:00', \
                '0000-00-00 00:00:00.000', '2024-03-15 14:30:05.123456'), \
                (5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)";
    my.exec(
        Some("natives"),
        &format!(
            "SET SESSION sql_mode = ''; \
             CREATE TABLE a {NATIVE}; INSERT INTO a VALUES {rows}; \
             CREATE TABLE b {NATIVE}; INSERT INTO b SELECT * FROM a; \
             UPDATE b SET t6 = t6 + INTERVAL 1 MICROSECOND WHERE id = 0; \
             CREATE TABLE c {NATIVE}; INSERT INTO c SELECT * FROM a; \
             UPDATE c SET bu = bu - 1 WHERE id = 9223372036854775807; \
             CREATE TABLE d {NATIVE}; INSERT INTO d SELECT * FROM a; \
             UPDATE d SET dd = NULL WHERE id = 9223372036854775807; \
             CREATE TABLE e {NATIVE}; INSERT INTO e SELECT * FROM a; \
             UPDATE e SET t3 = NULL WHERE id = 9223372036854775807;"
        ),
    );
    let pushed = aggregate_of(&url, "a", false, native_columns()).await;
    let read = aggregate_of(&url, "a", true, native_columns()).await;
    assert_eq!(
        pushed.buckets, read.buckets,
        "the two paths disagree on a native value"
    );
    assert_eq!(pushed.buckets[0].agg.count(), 4);
    // the controls: one microsecond, one unit apart, a zero date and a zero datetime
    // against a NULL (sqlx reads a zero date as NULL), on both paths
    for control in ["b", "c", "d", "e"] {
        assert_ne!(
            aggregate_of(&url, control, false, native_columns()).await.buckets,
            pushed.buckets,
            "{control} pushed down"
        );
        assert_ne!(
            aggregate_of(&url, control, true, native_columns()).await.buckets,
            read.buckets,
            "{control} in process"
        );
    }
}
