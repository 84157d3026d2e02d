//! Keys and the rows phase through real agents over mTLS, PostgreSQL source and
//! MariaDB target, sealed runs (issue 31): each test names the class it holds down.

use std::collections::BTreeSet;

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
