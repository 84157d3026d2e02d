//! Keys and the rows phase through real agents over mTLS, PostgreSQL source and
//! MariaDB target, sealed runs (issue 31): each test names the class it holds down.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use tally_e2e::db;
use tally_e2e::zones::{Deployment, RunOutput};

/// `(kind, first key part as text)` of every listed difference.
fn listed(j: &Value) -> BTreeSet<(String, String)> {
    j["differences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| {
                    let k = &d["key"][0];
                    let key = k.as_str().map_or_else(|| k.to_string(), str::to_string);
                    (d["kind"].as_str().unwrap_or("?").to_string(), key)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn spec(dataset: &str, extra: &str) -> String {
    format!(
        "name: {dataset}\nsource: {{ agent: dc1, dataset: {dataset} }}\ntarget: {{ agent: vpc2, dataset: {dataset} }}\n{extra}"
    )
}

fn expect_differ(out: &RunOutput) {
    assert_eq!(
        (out.code, out.json["verdict"].as_str()),
        (1, Some("differ")),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// F7: the documented integer ↔ decimal key pair (DESIGN §3: keys compare within one
/// class, or as these pairs) under the hash strategy (decimal keys have no key ranges),
/// on both hashing paths, in both directions, with unsigned 64-bit keys beyond `i64`.
#[test]
fn an_integer_key_against_a_decimal_key_compares_under_the_hash_strategy() {
    let (pg, my) = (db::postgres(), db::mariadb());
    let (pg_url, my_url) = (pg.create_database("reveals_f7"), my.create_database("reveals_f7"));
    // (table, PostgreSQL key type, MariaDB key type, a key beyond i64 or 0)
    let pairs = [
        ("int_dec", "BIGINT", "DECIMAL(20,0)", "0"),
        ("dec_int", "NUMERIC(20,0)", "BIGINT", "0"),
        (
            "dec_u64",
            "NUMERIC(20,0)",
            "BIGINT UNSIGNED",
            "18446744073709551615",
        ),
    ];
    let (mut pg_datasets, mut my_datasets) = (Vec::new(), Vec::new());
    for (table, pg_type, my_type, big) in pairs {
        pg.exec(
            Some("reveals_f7"),
            &format!(
                "CREATE TABLE {table} (id {pg_type} PRIMARY KEY, v TEXT NOT NULL);\n\
                 INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 300) g;\n\
                 INSERT INTO {table} SELECT {big}, 'big' WHERE {big} > 0;\nANALYZE {table};\n"
            ),
        );
        my.exec(
            Some("reveals_f7"),
            &format!(
                "CREATE TABLE {table} (id {my_type} PRIMARY KEY, v TEXT NOT NULL);\n\
                 INSERT INTO {table} SELECT seq, CONCAT('v', seq) FROM seq_1_to_300;\n\
                 INSERT INTO {table} SELECT {big}, 'big' FROM seq_1_to_1 WHERE {big} > 0;\n\
                 UPDATE {table} SET v = 'changed' WHERE id = 77;\nDELETE FROM {table} WHERE id = 150;\n\
                 INSERT INTO {table} VALUES (1000, 'extra');\n"
            ),
        );
        for (hashing, mode) in [("auto", "auto"), ("push", "pushdown")] {
            let body = |url: &str| {
                format!(
                    "{{ url: '{url}', table: {table}, key: [id], hashing: {mode}, policy: {{ max_level: with_keys }} }}"
                )
            };
            pg_datasets.push((format!("{table}_{hashing}"), body(&pg_url)));
            my_datasets.push((format!("{table}_{hashing}"), body(&my_url)));
        }
    }
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent_datasets("dc1", &pg_datasets);
    d.start_agent_datasets("vpc2", &my_datasets);
    d.coordinator_config();
    let want: BTreeSet<(String, String)> = [
        ("changed", "77"),
        ("missing_in_target", "150"),
        ("extra_in_target", "1000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut failed = Vec::new();
    for (dataset, _) in &pg_datasets {
        let out = d.run(&spec(
            dataset,
            "bisection: { strategy: hash, factor: 4, threshold: 8 }\nreporting: { level: with_keys }\n",
        ));
        if (out.code, listed(&out.json)) != (1, want.clone()) {
            failed.push(format!("{dataset}: exit {} {}", out.code, out.stdout));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Two tables of 6,000 rows whose first `changed` rows differ, served by agents with
/// the given policies.
fn bulk(database: &str, changed: u32, policies: &[(&str, &str)]) -> Deployment {
    let (pg, my) = (db::postgres(), db::mariadb());
    let (pg_url, my_url) = (pg.create_database(database), my.create_database(database));
    pg.exec(
        Some(database),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT NOT NULL);\n\
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 6000) g;\nANALYZE t;\n",
    );
    my.exec(
        Some(database),
        &format!(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT NOT NULL);\n\
             INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_6000;\n\
             UPDATE t SET v = 'changed' WHERE id <= {changed};\n"
        ),
    );
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    for (agent, url) in [("dc1", &pg_url), ("vpc2", &my_url)] {
        let datasets: Vec<(String, String)> = policies
            .iter()
            .map(|(name, policy)| {
                (
                    name.to_string(),
                    format!("{{ url: '{url}', table: t, key: [id], policy: {{ max_level: with_keys, {policy} }} }}"),
                )
            })
            .collect();
        d.start_agent_datasets(agent, &datasets);
    }
    d.coordinator_config();
    d
}

const LISTED_ALL: &str = "reporting: { level: with_keys, sample_limit: 10000 }\n";

/// F8: more differing rows in one range than one reveal call releases.
#[test]
fn every_differing_key_is_listed_until_a_budget_stops_the_listing_and_the_result_names_it() {
    let d = bulk(
        "reveals_f8",
        5000,
        &[
            (
                "roomy",
                "max_reveal_rows: 10000, max_reveal_rows_per_hour: 100000",
            ),
            ("tight", "max_reveal_rows: 2500, max_reveal_rows_per_hour: 100000"),
        ],
    );
    let out = d.run(&spec("roomy", LISTED_ALL));
    expect_differ(&out);
    let j = &out.json;
    assert_eq!(j["difference_counts"]["changed"], 5000);
    assert_eq!(
        j["differences"].as_array().map(Vec::len),
        Some(5000),
        "{}",
        out.stderr
    );
    assert!(
        j.get("truncated").is_none() && j.get("withheld").is_none(),
        "{}",
        j
    );
    // each agent lets 2,500 rows out in the run: the listing stops there, and says why
    let out = d.run(&spec("tight", LISTED_ALL));
    expect_differ(&out);
    let j = &out.json;
    assert_eq!(j["differences"].as_array().map(Vec::len), Some(2500));
    assert_eq!(j["truncated"], true);
    let w = &j["withheld"];
    assert_eq!(
        (&w[0]["budget"], &w[0]["agent"], &w[0]["side"], &w[0]["keys"]),
        (
            &Value::from("max_reveal_rows"),
            &Value::from("dc1"),
            &Value::from("source"),
            &Value::from(2500)
        ),
        "{j}"
    );
}

/// A reveal budget spent before the run starts (by an earlier run in the hour).
#[test]
fn a_spent_reveal_budget_keeps_the_verdict_and_leaves_and_names_the_budget() {
    let d = bulk(
        "reveals_spent",
        30,
        &[("rationed", "max_reveal_rows: 10, max_reveal_rows_per_hour: 10")],
    );
    let first = d.run(&spec("rationed", LISTED_ALL));
    expect_differ(&first);
    assert_eq!(first.json["differences"].as_array().map(Vec::len), Some(10));
    let out = d.run(&spec("rationed", LISTED_ALL));
    expect_differ(&out);
    let j = &out.json;
    assert!(j.get("error").is_none(), "{j}");
    assert!(!j["leaves"].as_array().unwrap().is_empty());
    assert_eq!(j["difference_counts"]["changed"], 30);
    assert_eq!(j["differences"].as_array().map(Vec::len), Some(0));
    assert_eq!(j["withheld"][0]["budget"], "max_reveal_rows_per_hour", "{j}");
    assert_eq!(j["withheld"][0]["keys"], 30);
    // the human summary says it too
    let human = Command::new(tally_e2e::bins::tally())
        .arg("run")
        .arg(d.path().join("spec.yaml"))
        .arg("-c")
        .arg(d.path().join("coordinator.yaml"))
        .output()
        .expect("tally run");
    let text = String::from_utf8_lossy(&human.stdout);
    assert_eq!(human.status.code(), Some(1), "{text}");
    assert!(
        text.contains("keys withheld: 30 by agent dc1 (source) reveal budget max_reveal_rows_per_hour"),
        "{text}"
    );
}

/// F9: keys repeated on the target.
#[test]
fn a_key_repeated_on_the_target_is_named_and_a_changed_copy_never_vanishes() {
    let (pg, my) = (db::postgres(), db::mariadb());
    let (pg_url, my_url) = (pg.create_database("reveals_f9"), my.create_database("reveals_f9"));
    pg.exec(
        Some("reveals_f9"),
        "CREATE TABLE t (id BIGINT NOT NULL, v TEXT NOT NULL);\n\
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g;\nANALYZE t;\n",
    );
    // 77: the same row twice; 88: a changed copy first, then the source's row
    my.exec(
        Some("reveals_f9"),
        "CREATE TABLE t (id BIGINT NOT NULL, v TEXT NOT NULL);\n\
         INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_300 WHERE seq <> 88;\n\
         INSERT INTO t VALUES (77, 'v77'), (88, 'changed'), (88, 'v88');\n",
    );
    let body = |url: &str, hashing: &str| {
        format!(
            "{{ url: '{url}', table: t, key: [id], hashing: {hashing}, policy: {{ max_level: detailed }} }}"
        )
    };
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    for (agent, url) in [("dc1", &pg_url), ("vpc2", &my_url)] {
        d.start_agent_datasets(
            agent,
            &[
                ("t_auto".into(), body(url, "auto")),
                ("t_push".into(), body(url, "pushdown")),
            ],
        );
    }
    d.coordinator_config();
    for dataset in ["t_auto", "t_push"] {
        for level in ["with_keys", "detailed"] {
            let out = d.run(&spec(
                dataset,
                &format!(
                    "bisection: {{ factor: 4, threshold: 8 }}\nreporting: {{ level: {level}, consent_acknowledged: true }}\n"
                ),
            ));
            expect_differ(&out);
            let j = &out.json;
            let want: BTreeSet<(String, String)> = [("changed", "77"), ("changed", "88")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(listed(j), want, "{dataset} {level}: {}", out.stdout);
            for d in j["differences"].as_array().unwrap() {
                assert_eq!(
                    (&d["duplicates"]["source"], &d["duplicates"]["target"]),
                    (&Value::from(1), &Value::from(2)),
                    "{d}"
                );
            }
            assert_eq!(j["duplicate_keys"]["target"], 2);
        }
    }
}
