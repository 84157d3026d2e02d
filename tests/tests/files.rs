//! File datasets, live: a PostgreSQL table reconciled against the same rows as Parquet
//! files (a glob over two parts) and as a CSV file, on local disk and on an
//! S3-compatible store the test starts itself (moto, tests/src/s3.rs), through real
//! agents and `tally run`, sealed (the default), to exact keys, with the run's evidence
//! verified. The file side's rows come from PostgreSQL's own CSV export, read back by
//! DuckDB with declared types, then changed in three planted places.
#![cfg(feature = "duckdb")]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use tally_agent::connector::duckdb::DuckDbConnector;
use tally_e2e::zones::{Deployment, differences};
use tally_e2e::{bins, db, s3};

const N: i64 = 3000;

/// The table on PostgreSQL: leading zeros in a text code (a CSV type guess would make
/// them a number), cents, microsecond instants, NULLs and empty strings (which a CSV
/// reader that takes `""` for NULL would turn into NULLs).
const PG: &str =
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, code TEXT NOT NULL, amount NUMERIC(12,2) NOT NULL,
   placed TIMESTAMPTZ NOT NULL, note TEXT);
 INSERT INTO orders SELECT g, lpad(g::text, 6, '0'), ((g * 7919) % 100000) / 100.0,
   TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * INTERVAL '61.123457 seconds',
   CASE WHEN g % 10 = 0 THEN NULL WHEN g % 10 = 5 THEN '' ELSE 'n' || g END
 FROM generate_series(1::bigint, 3000) g;";

const COLUMNS: &str = "{'id': 'BIGINT', 'code': 'VARCHAR', 'amount': 'DECIMAL(12,2)', 'placed': 'TIMESTAMPTZ', 'note': 'VARCHAR'}";

/// What every run must find: one changed row, one missing, one extra.
fn planted() -> BTreeSet<(String, i64)> {
    [
        ("changed".to_string(), 7),
        ("missing_in_target".to_string(), 42),
        ("extra_in_target".to_string(), N + 1),
    ]
    .into()
}

/// Writes the lake: `parts/part-1.parquet`, `parts/part-2.parquet` and `orders.csv`,
/// PostgreSQL's rows with the planted differences.
fn write_lake(pg: &db::Server, dir: &Path) {
    let csv = pg.exec(
        Some("files"),
        "COPY (SELECT * FROM orders ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)",
    );
    let export = dir.join("export.csv");
    std::fs::write(&export, csv).unwrap();
    std::fs::create_dir_all(dir.join("parts")).unwrap();
    std::fs::create_dir_all(dir.join("mixed")).unwrap();
    // a CSV whose BIGINT column holds 1.5 in one row: DuckDB's own CSV types would
    // read it as 2
    std::fs::write(
        dir.join("rounded.csv"),
        "id,code,amount,placed,note\n1,000001,79.19,2024-01-01 00:01:01.123457+00,n1\n1.5,000002,158.38,2024-01-01 00:02:02.246914+00,n2\n",
    )
    .unwrap();
    let p = |name: &str| dir.join(name).display().to_string().replace('\'', "''");
    let sql = format!(
        "CREATE TABLE o AS SELECT * FROM read_csv('{export}', header = true, columns = {COLUMNS}, auto_detect = false, allow_quoted_nulls = false);
         UPDATE o SET amount = amount + 0.01 WHERE id = 7;
         DELETE FROM o WHERE id = 42;
         INSERT INTO o VALUES ({extra}, '003001', 1.00, TIMESTAMPTZ '2024-06-01 00:00:00+00', 'extra');
         COPY (SELECT * FROM o WHERE id <= 1500 ORDER BY id) TO '{part1}' (FORMAT parquet);
         COPY (SELECT * FROM o WHERE id > 1500 ORDER BY id) TO '{part2}' (FORMAT parquet);
         COPY (SELECT * FROM o ORDER BY id) TO '{csv}' (FORMAT csv, HEADER);
         COPY (SELECT id, note, amount, placed, code FROM o ORDER BY id) TO '{swapped}' (FORMAT csv, HEADER);
         COPY (SELECT * FROM o ORDER BY id) TO '{headerless}' (FORMAT csv, HEADER false);
         COPY (SELECT id, code, amount FROM o WHERE id <= 10) TO '{mixed1}' (FORMAT parquet);
         COPY (SELECT id, CAST(code AS INTEGER) AS code, amount FROM o WHERE id > 10 AND id <= 20) TO '{mixed2}' (FORMAT parquet);",
        export = p("export.csv"),
        extra = N + 1,
        part1 = p("parts/part-1.parquet"),
        part2 = p("parts/part-2.parquet"),
        csv = p("orders.csv"),
        swapped = p("swapped.csv"),
        headerless = p("headerless.csv"),
        mixed1 = p("mixed/a.parquet"),
        mixed2 = p("mixed/b.parquet"),
    );
    let duck = DuckDbConnector::open("duckdb://").unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(duck.execute_batch("lake", &sql))
        .unwrap();
}

fn csv_columns() -> &'static str {
    "[{ name: id, type: BIGINT }, { name: code, type: VARCHAR }, { name: amount, type: 'DECIMAL(12,2)' }, \
     { name: placed, type: TIMESTAMPTZ }, { name: note, type: VARCHAR }]"
}

fn spec(dataset: &str) -> String {
    format!(
        "name: {dataset}\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: lake, dataset: {dataset} }}\n\
         reporting: {{ level: with_keys }}\n"
    )
}

#[test]
fn a_lake_on_disk_and_on_s3_reconciles_with_postgresql_to_exact_keys() {
    let pg = db::postgres();
    let pg_url = pg.create_database("files");
    pg.exec(Some("files"), PG);
    let store = s3::start();
    let mut d = Deployment::new(&["dc1", "lake"]);
    let dir = d.path().to_path_buf();
    write_lake(pg, &dir);
    store.upload(
        "lake",
        "orders",
        &[
            &dir.join("parts/part-1.parquet"),
            &dir.join("parts/part-2.parquet"),
        ],
    );
    store.upload("lake", "csv", &[&dir.join("orders.csv")]);

    let policy = "policy: { max_level: with_keys }";
    d.start_agent(
        "dc1",
        "orders",
        &format!("{{ url: '{pg_url}', table: orders, key: [id], {policy} }}"),
    );
    d.agent_env = vec![
        ("AWS_ACCESS_KEY_ID".into(), s3::KEY_ID.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), s3::SECRET.into()),
        (
            "TALLY_DUCKDB_EXTENSIONS".into(),
            s3::duckdb_extensions().display().to_string(),
        ),
    ];
    let s3_opts = format!(
        "s3: {{ endpoint: '{}', url_style: path, use_ssl: false }}",
        store.endpoint
    );
    let parts = dir.join("parts").display().to_string();
    let csv = dir.join("orders.csv").display().to_string();
    let datasets: Vec<(String, String)> = [
        ("local_parquet", format!("{{ file: {{ path: '{parts}/part-*.parquet' }}, key: [id], {policy} }}")),
        (
            "local_csv",
            format!("{{ file: {{ path: '{csv}', csv: {{ columns: {} }} }}, key: [id], {policy} }}", csv_columns()),
        ),
        (
            "s3_parquet",
            format!("{{ file: {{ path: 's3://lake/orders/*.parquet', {s3_opts} }}, key: [id], {policy} }}"),
        ),
        (
            "s3_csv",
            format!(
                "{{ file: {{ path: 's3://lake/csv/orders.csv', {s3_opts}, csv: {{ columns: {} }} }}, key: [id], {policy} }}",
                csv_columns()
            ),
        ),
        // files that cannot be read as they are written: errors, never a comparison of
        // what DuckDB would make of them
        (
            "rounded_csv",
            format!(
                "{{ file: {{ path: '{}', csv: {{ columns: {} }} }}, key: [id], {policy} }}",
                dir.join("rounded.csv").display(),
                csv_columns()
            ),
        ),
        (
            "mixed_parquet",
            format!("{{ file: {{ path: '{}/mixed/*.parquet' }}, key: [id], {policy} }}", dir.display()),
        ),
        // two text columns in another order than declared: read by position they
        // would land in each other's place
        (
            "swapped_csv",
            format!(
                "{{ file: {{ path: '{}', csv: {{ columns: {} }} }}, key: [id], {policy} }}",
                dir.join("swapped.csv").display(),
                csv_columns()
            ),
        ),
        // no header line, declared with one (the default): its first row would be
        // skipped as the header
        (
            "headerless_csv",
            format!(
                "{{ file: {{ path: '{}', csv: {{ columns: {} }} }}, key: [id], {policy} }}",
                dir.join("headerless.csv").display(),
                csv_columns()
            ),
        ),
        // a glob that matches nothing: an error, never an empty dataset that "differs"
        // (or, on an empty source, matches)
        ("s3_nothing", format!("{{ file: {{ path: 's3://lake/none/*.parquet', {s3_opts} }}, key: [id], {policy} }}")),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect();
    d.start_agent_datasets("lake", &datasets);

    for dataset in ["local_parquet", "local_csv", "s3_parquet", "s3_csv"] {
        let out = d.run(&spec(dataset));
        assert_eq!(out.code, 1, "{dataset}: {}\n{}", out.stdout, out.stderr);
        assert_eq!(differences(&out.json), planted(), "{dataset}: {}", out.stdout);
        assert_eq!(out.json["source"]["count"], N, "{dataset}");
        assert_eq!(out.json["target"]["count"], N, "{dataset}");
        let engine = out.json["target"]["engine"].as_str().unwrap_or_default();
        assert!(engine.starts_with("duckdb"), "{dataset}: {engine}");
    }
    for (dataset, why) in [
        ("s3_nothing", "No files found"),
        ("rounded_csv", "column id: a value is not written as a BIGINT"),
        ("mixed_parquet", "do not share one schema"),
        ("swapped_csv", "first line is not the declared header"),
        ("headerless_csv", "first line is not the declared header"),
    ] {
        let out = d.run(&spec(dataset));
        assert_eq!(
            out.code, 2,
            "{dataset} must not compare: {}\n{}",
            out.stdout, out.stderr
        );
        assert_ne!(out.json["verdict"], "match", "{dataset}");
        // the headerless file's first line is a row: the agent's log may hold it, the
        // coordinator never
        assert!(
            !out.stdout.contains("00:01:01.123457") && !out.stderr.contains("00:01:01.123457"),
            "{dataset}: a value of the file reached the coordinator: {}\n{}",
            out.stdout,
            out.stderr
        );
        // the reason is in the lake agent's own log (the coordinator gets its kind)
        let log = std::fs::read_to_string(dir.join("lake.log")).unwrap();
        assert!(
            log.contains(why),
            "{dataset}: the agent's log does not say {why:?}"
        );
    }
    let log = std::fs::read_to_string(dir.join("lake.log")).unwrap();
    assert!(!log.contains(s3::SECRET), "the S3 secret is in the agent's log");

    // the S3 run again, recorded, and its evidence verified by both verifiers
    let spec_path = dir.join("s3.yaml");
    std::fs::write(&spec_path, spec("s3_parquet")).unwrap();
    let data = dir.join("data");
    let o = Command::new(bins::tally())
        .arg("run")
        .arg(&spec_path)
        .arg("-c")
        .arg(d.coordinator_config())
        .arg("--data-dir")
        .arg(&data)
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let run_id = stderr
        .split("recording run ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id on stderr: {stderr}"))
        .to_string();
    let bundle = dir.join("s3.evidence.json");
    let o = Command::new(bins::tally())
        .args(["evidence", &run_id, "--data-dir"])
        .arg(&data)
        .arg("-o")
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (code, report) = tally_e2e::evidence::verify(&bundle, &dir.join("certs/ca.pem"));
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("verdict: differ"), "{report}");
}
