//! Investigation SQL is pasted by people into the engine's own client, under whatever
//! session settings they have. A key value chosen by an attacker (it arrives from the
//! other zone's rows, through the coordinator) must stay a value: these tests render the
//! SQL of a segment bounded by a hostile key and run it through the real `mariadb` and
//! `psql` clients under every setting that changes how string literals are read.

use std::path::Path;

use tally_agent::config::{DatasetConfig, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_common::canonical::FieldFormat;
use tally_common::config_file::parse_yaml;
use tally_common::segment::{ColumnSpec, KeyPart, Segment};
use tally_common::types::TypeClass;
use tally_e2e::db;

/// The payload of issue 11: under MySQL's default sql_mode `\'` ends nothing, so a
/// literal that only doubles quotes closes early and runs the rest.
const CLASSIC: &str = "x\\' ; DROP TABLE victim; -- ";

/// The classic payload, then a newline, more quotes and comment markers, a dollar quote
/// and an astral character (and, where the engine stores it, a NUL).
fn hostile(nul: bool) -> String {
    let mut k = format!("{CLASSIC}\n'); DROP TABLE victim; /* \\\\' $$ \" ` ");
    if nul {
        k.push('\0');
    }
    k.push_str(" 𝄞");
    k
}

/// The quoting investigation SQL used before `Dialect::literal`: quotes doubled.
fn naive(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

fn dataset(url: &str) -> Dataset {
    let config: DatasetConfig = parse_yaml(
        Path::new("agent.yaml"),
        &format!("{{ url: '{url}', table: t, key: [k] }}"),
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
    vec![
        ColumnSpec {
            name: "k".into(),
            format: FieldFormat::new(TypeClass::Text),
        },
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
    ]
}

/// The investigation SQL of the segment holding exactly `key`: `[key, key + U+0001)`
/// (nothing sorts between the two but `key` followed by NULs, which no row has).
async fn investigation_of(url: &str, key: &str) -> String {
    let ds = dataset(url);
    let b = ds
        .bind(&mut ds.session().await.unwrap(), columns(), 1)
        .await
        .unwrap();
    let seg = Segment {
        lower: Some(vec![KeyPart::Text(key.to_string())]),
        upper: Some(vec![KeyPart::Text(format!("{key}\u{1}"))]),
        ..Segment::default()
    };
    let sql = ds.investigation_sql(&b, &seg, false);
    // the value never appears as text, only as hex
    assert!(!sql.contains("DROP TABLE"), "{sql}");
    sql
}

/// The row ids the client printed: exactly the hostile row.
fn assert_only_hostile_row(out: &str, setting: &str) {
    assert_eq!(out.matches("4242").count(), 1, "{setting}: {out:?}");
    for decoy in ["1001", "1002", "1003"] {
        assert!(!out.contains(decoy), "{setting}: decoy {decoy} selected: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn investigation_sql_is_inert_in_the_mariadb_client_under_any_sql_mode() {
    let my = db::mariadb();
    let url = my.create_database("investigation_hostile");
    let key = hostile(true);
    let hex = |s: &str| format!("X'{}'", hex::encode(s));
    my.exec(
        Some("investigation_hostile"),
        &format!(
            "CREATE TABLE t (k VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, id INT);\n\
             CREATE TABLE victim (x INT);\n\
             INSERT INTO t VALUES ({}, 4242), ({}, 1001), ({}, 1002), ({}, 1003);",
            hex(&key),
            hex(&key[..key.len() - " 𝄞".len()]),
            hex(&format!("{key}a")),
            hex("x"),
        ),
    );
    let sql = investigation_of(&url, &key).await;
    assert!(sql.contains("CONVERT(X'"), "{sql}");
    for mode in [
        "''",
        "'NO_BACKSLASH_ESCAPES'",
        "'ANSI_QUOTES,NO_BACKSLASH_ESCAPES'",
    ] {
        let out = my.exec(
            Some("investigation_hostile"),
            &format!("SET SESSION sql_mode = {mode};\n{sql}\n"),
        );
        assert_only_hostile_row(&out, mode);
        let tables = my.exec(Some("investigation_hostile"), "SHOW TABLES LIKE 'victim';");
        assert_eq!(
            tables.trim(),
            "victim",
            "sql_mode {mode}: the victim table is gone"
        );
    }
    // the test can fail: the old quoting drops the table under the default sql_mode
    my.exec(
        Some("investigation_hostile"),
        &format!(
            "SET SESSION sql_mode = '';\nSELECT id FROM t WHERE k = {};\n",
            naive(CLASSIC)
        ),
    );
    let tables = my.exec(Some("investigation_hostile"), "SHOW TABLES LIKE 'victim';");
    assert_eq!(
        tables.trim(),
        "",
        "the naive literal was expected to drop the table"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn investigation_sql_is_inert_in_psql_under_any_standard_conforming_strings() {
    let pg = db::postgres();
    let url = pg.create_database("investigation_hostile");
    // PostgreSQL text holds no NUL
    let key = hostile(false);
    let lit = |s: &str| format!("convert_from(decode('{}', 'hex'), 'UTF8')", hex::encode(s));
    pg.exec(
        Some("investigation_hostile"),
        &format!(
            "CREATE TABLE t (k text PRIMARY KEY, id int);\n\
             CREATE TABLE victim (x int);\n\
             INSERT INTO t VALUES ({}, 4242), ({}, 1001), ({}, 1002), ({}, 1003);",
            lit(&key),
            lit(&key[..key.len() - " 𝄞".len()]),
            lit(&format!("{key}a")),
            lit("x"),
        ),
    );
    let sql = investigation_of(&url, &key).await;
    assert!(sql.contains("convert_from(decode('"), "{sql}");
    for scs in ["on", "off"] {
        let out = pg.exec(
            Some("investigation_hostile"),
            &format!("SET standard_conforming_strings = {scs};\n{sql}\n"),
        );
        assert_only_hostile_row(&out, scs);
        let tables = pg.exec(
            Some("investigation_hostile"),
            "SELECT count(*) FROM pg_tables WHERE tablename = 'victim';",
        );
        assert_eq!(
            tables.trim(),
            "1",
            "standard_conforming_strings {scs}: the victim table is gone"
        );
    }
    // the test can fail: with standard_conforming_strings off, \' is a quote
    pg.exec(
        Some("investigation_hostile"),
        &format!(
            "SET standard_conforming_strings = off;\nSELECT id FROM t WHERE k = {};\n",
            naive(CLASSIC)
        ),
    );
    let tables = pg.exec(
        Some("investigation_hostile"),
        "SELECT count(*) FROM pg_tables WHERE tablename = 'victim';",
    );
    assert_eq!(
        tables.trim(),
        "0",
        "the naive literal was expected to drop the table"
    );
}

/// A SQLite `query:` dataset: its investigation SQL shows the query only with
/// `share_query: true`.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_is_shown_in_investigation_sql_only_where_the_policy_shares_it() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::raw_sql("CREATE TABLE salaries (k TEXT PRIMARY KEY, id INTEGER, secret_bonus INTEGER)")
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let url = format!("sqlite://{}", path.display());
    let query = "SELECT k, id FROM salaries WHERE secret_bonus > 100000";
    for (share, shown) in [
        ("", false),
        (", policy: { share_query: false }", false),
        (", policy: { share_query: true }", true),
    ] {
        let config: DatasetConfig = parse_yaml(
            Path::new("agent.yaml"),
            &format!("{{ url: '{url}', query: '{query}', key: [k]{share} }}"),
        )
        .unwrap();
        assert_eq!(config.policy.share_query, shown);
        let ds = Dataset::new(
            "orders".into(),
            config.clone(),
            config.source(),
            Connector::open(&url).unwrap(),
        );
        let b = ds
            .bind(&mut ds.session().await.unwrap(), columns(), 1)
            .await
            .unwrap();
        let sql = ds.investigation_sql(&b, &Segment::whole(), false);
        if shown {
            assert!(sql.contains(query), "{sql}");
        } else {
            assert!(
                !sql.contains("salaries") && !sql.contains("secret_bonus"),
                "{sql}"
            );
            assert!(
                sql.contains("/* dataset orders: query not shared by its agent's policy */"),
                "{sql}"
            );
        }
    }
}
