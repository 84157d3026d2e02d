//! Spark, end to end: a PostgreSQL table reconciled with a Spark table on a real local
//! Spark Connect server (tests/src/spark.rs) through real agents and `tally run`,
//! sealed (the default), to exact keys, with the run's evidence verified by both
//! verifiers. Each side generates the same rows in its own SQL; Spark's copy carries
//! three planted differences.
#![cfg(feature = "spark")]

use std::collections::BTreeSet;
use std::process::Command;

use tally_agent::connector::spark::SparkConnector;
use tally_e2e::zones::{Deployment, differences};
use tally_e2e::{bins, db};

const N: i64 = 3000;

/// Leading zeros in a text code, cents, microsecond instants, NULLs.
const PG: &str =
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, code TEXT NOT NULL, amount NUMERIC(12,2) NOT NULL,
   placed TIMESTAMPTZ NOT NULL, note TEXT);
 INSERT INTO orders SELECT g, lpad(g::text, 6, '0'), ((g * 7919) % 100000) / 100.0,
   TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * INTERVAL '61.123457 seconds',
   CASE WHEN g % 10 = 0 THEN NULL ELSE 'n' || g END
 FROM generate_series(1::bigint, 3000) g;";

/// The same rows in Spark (1704067200 s is 2024-01-01T00:00:00Z), with id 7 changed,
/// id 42 left out and id 3001 added.
const SPARK: &str = "DROP TABLE IF EXISTS orders_e2e;
CREATE TABLE orders_e2e USING parquet AS
 SELECT id, lpad(CAST(id AS STRING), 6, '0') AS code,
   CAST(((id * 7919) % 100000) / 100.0 + CASE WHEN id = 7 THEN 0.01 ELSE 0 END AS DECIMAL(12,2)) AS amount,
   timestamp_micros(1704067200000000 + id * 61123457) AS placed,
   CASE WHEN id % 10 = 0 THEN NULL ELSE concat('n', CAST(id AS STRING)) END AS note
 FROM range(1, 3002) WHERE id <> 42;
";

fn planted() -> BTreeSet<(String, i64)> {
    [
        ("changed".to_string(), 7),
        ("missing_in_target".to_string(), 42),
        ("extra_in_target".to_string(), N + 1),
    ]
    .into()
}

#[test]
fn a_spark_table_reconciles_with_postgresql_to_exact_keys_with_evidence() {
    let pg = db::postgres();
    let pg_url = pg.create_database("spark_e2e");
    pg.exec(Some("spark_e2e"), PG);
    let spark = tally_e2e::spark::server();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let s = SparkConnector::open(&spark.url).unwrap();
            s.execute_batch("setup", SPARK).await.unwrap();
        });

    let mut d = Deployment::new(&["dc1", "lake"]);
    let policy = "policy: { max_level: with_keys }";
    d.start_agent(
        "dc1",
        "orders",
        &format!("{{ url: '{pg_url}', table: orders, key: [id], {policy} }}"),
    );
    d.start_agent(
        "lake",
        "orders",
        &format!(
            "{{ url: '{}', table: orders_e2e, key: [id], {policy} }}",
            spark.url
        ),
    );
    let spec = "name: spark\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: lake, dataset: orders }\n\
                reporting: { level: with_keys }\n";
    let out = d.run(spec);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(differences(&out.json), planted(), "{}", out.stdout);
    assert_eq!(out.json["source"]["count"], N);
    assert_eq!(out.json["target"]["count"], N);
    let engine = out.json["target"]["engine"].as_str().unwrap_or_default();
    assert!(engine.starts_with("spark"), "{engine}");

    // recorded, and its evidence verified by both verifiers
    let dir = d.path().to_path_buf();
    let spec_path = dir.join("spark.yaml");
    std::fs::write(&spec_path, spec).unwrap();
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
    let bundle = dir.join("spark.evidence.json");
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
