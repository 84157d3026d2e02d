//! Whole-system tests: the real `tally-agent` and `tally` binaries as separate
//! processes, PostgreSQL (source) against MariaDB (target), each database behind its
//! own agent, mutual TLS with certificates from `tally certs init`.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_e2e::db;
use tally_e2e::zones::{Deployment, differences, parse_run};

/// Evidence bundles and `tally verify`: in tests/tests/e2e/evidence.rs.
#[path = "e2e/evidence.rs"]
mod evidence;
/// `tally run --server`: in tests/tests/e2e/remote.rs.
#[path = "e2e/remote.rs"]
mod remote;
/// Scheduled runs on a single `tally serve`: in tests/tests/e2e/schedules.rs.
#[path = "e2e/schedules.rs"]
mod schedules;

const N: i64 = 20_000;

/// Keys 1..: gaps at multiples of 7.
fn keys() -> Vec<i64> {
    (1..).filter(|k| k % 7 != 0).take(N as usize).collect()
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// One row's literal values; `bump` changes its amount by a cent.
fn row(id: i64, bump: bool) -> String {
    let names = [
        "Zoë Müller",
        "Łukasz",
        "山田",
        "O'Brien",
        "ñandú",
        "plain",
        "Ärger",
        "zz",
    ];
    let cents = (id * 7919) % 1_000_000 + i64::from(bump);
    let note = if id % 5 == 0 {
        "NULL".into()
    } else {
        quote(&format!("note {}", id % 31))
    };
    format!(
        "({id}, {}, {}.{:02}, '2024-{:02}-{:02} {:02}:{:02}:{:02}.{:06}', {note})",
        quote(names[(id % 8) as usize]),
        cents / 100,
        cents % 100,
        1 + id % 12,
        1 + id % 28,
        id % 24,
        id % 60,
        (id * 13) % 60,
        (id * 104_729) % 1_000_000
    )
}

#[derive(Debug, Default, Clone)]
struct Plant {
    changed: Vec<i64>,
    missing: Vec<i64>,
    extra: Vec<i64>,
}

fn plant() -> Plant {
    let k = keys();
    Plant {
        changed: vec![k[100], k[9_000], k[19_990]],
        missing: vec![k[4_321], k[15_000]],
        extra: vec![7 * 700, k[k.len() - 1] + 5],
    }
}

fn orders_sql(mariadb: bool, p: Option<&Plant>) -> String {
    let ts = if mariadb { "DATETIME(6)" } else { "timestamp(6)" };
    let text = if mariadb {
        "VARCHAR(40) CHARACTER SET utf8mb4"
    } else {
        "varchar(40)"
    };
    let mut sql = format!(
        "DROP TABLE IF EXISTS orders;\nCREATE TABLE orders (id BIGINT PRIMARY KEY, customer {text} NOT NULL, \
         amount DECIMAL(12,2) NOT NULL, created_at {ts} NOT NULL, note TEXT);\n"
    );
    let mut ids = keys();
    if let Some(p) = p {
        ids.retain(|k| !p.missing.contains(k));
        ids.extend(&p.extra);
        ids.sort();
    }
    for chunk in ids.chunks(1000) {
        let vals: Vec<String> = chunk
            .iter()
            .map(|&id| row(id, p.is_some_and(|p| p.changed.contains(&id))))
            .collect();
        sql.push_str(&format!("INSERT INTO orders VALUES {};\n", vals.join(", ")));
    }
    sql
}

/// PostgreSQL `dc1` holding the source, MariaDB `vpc2` holding the target.
fn deploy(db_name: &str, target: Option<&Plant>, src_policy: &str, tgt_policy: &str) -> Deployment {
    deploy_on(db::postgres(), db_name, target, src_policy, tgt_policy)
}

/// [`deploy`] with the source on PostgreSQL server `pg`.
fn deploy_on(
    pg: &db::Server,
    db_name: &str,
    target: Option<&Plant>,
    src_policy: &str,
    tgt_policy: &str,
) -> Deployment {
    let my = db::mariadb();
    let pg_url = pg.create_database(db_name);
    let my_url = my.create_database(db_name);
    pg.exec(Some(db_name), &orders_sql(false, None));
    pg.exec(Some(db_name), "ANALYZE orders;");
    my.exec(Some(db_name), &orders_sql(true, target));
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent(
        "dc1",
        "orders",
        &format!("{{ url: '{pg_url}', table: orders, key: [id], policy: {src_policy} }}"),
    );
    d.start_agent(
        "vpc2",
        "orders",
        &format!("{{ url: '{my_url}', table: orders, key: [id], policy: {tgt_policy} }}"),
    );
    d
}

fn spec(strategy: &str, level: &str) -> String {
    let time = if strategy == "time" {
        ", time_column: created_at, time_granularity: month"
    } else {
        ""
    };
    format!(
        "name: e2e\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: vpc2, dataset: orders }}\n\
         bisection: {{ strategy: {strategy}, factor: 16, threshold: 500{time} }}\nreporting: {{ level: {level} }}\n"
    )
}

fn expected(p: &Plant) -> BTreeSet<(String, i64)> {
    let mut e = BTreeSet::new();
    e.extend(p.changed.iter().map(|k| ("changed".to_string(), *k)));
    e.extend(p.missing.iter().map(|k| ("missing_in_target".to_string(), *k)));
    e.extend(p.extra.iter().map(|k| ("extra_in_target".to_string(), *k)));
    e
}

/// with_keys, and period splits on the spec's time column (strategy time).
const OPEN: &str = "{ max_level: with_keys, time_columns: [created_at] }";

#[test]
fn identical_data_matches_with_one_query_per_side() {
    let d = deploy("e2e_same", None, OPEN, OPEN);
    let out = d.run(&spec("quantile", "with_keys"));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let j = &out.json;
    assert_eq!(j["verdict"], "match");
    assert_eq!(j["source"]["count"], N);
    assert_eq!(j["target"]["count"], N);
    assert_eq!(j["source"]["queries"], 1);
    assert_eq!(j["target"]["queries"], 1);
    // both agents hash in-process by default (PostgreSQL and MariaDB)
    assert_eq!(j["source"]["path"], "in_process");
    assert_eq!(j["target"]["path"], "in_process");
    // sealed by default: every hash keyed with a run key only the two agents hold
    assert_eq!(j["hash_method"], "sealed_sha256_64");
    // level 1's factor follows the row estimate: 20k rows in segments of threshold/16
    // (31 rows) need 1024 cuts (even cuts of the key range; empty ones are dropped)
    let segments = j["levels"][0]["segments"].as_u64().unwrap();
    assert!((512..=1024).contains(&segments), "{segments} level-1 segments");
    assert!(j["leaves"].as_array().unwrap().is_empty());
}

/// The policy plus `hashing: pushdown` (the rest of the dataset's flow mapping):
/// the engines hash in SQL instead of the agents.
const OPEN_SQL_HASHING: &str = "{ max_level: with_keys, time_columns: [created_at] }, hashing: pushdown";

#[test]
fn planted_differences_are_found_exactly_with_every_strategy() {
    let p = plant();
    let d = deploy("e2e_diff", Some(&p), OPEN, OPEN);
    check_every_strategy(&d, &p, "in_process", "e2e_diff");
}

#[test]
fn hashing_in_sql_finds_the_same_differences() {
    let p = plant();
    let d = deploy("e2e_diff_sql", Some(&p), OPEN_SQL_HASHING, OPEN_SQL_HASHING);
    check_every_strategy(&d, &p, "pushdown", "e2e_diff_sql");
}

fn check_every_strategy(d: &Deployment, p: &Plant, path: &str, db_name: &str) {
    for strategy in ["quantile", "hash", "time"] {
        let out = d.run(&spec(strategy, "with_keys"));
        assert_eq!(out.code, 1, "{strategy}: {}\n{}", out.stdout, out.stderr);
        let j = &out.json;
        assert_eq!(j["verdict"], "differ");
        assert_eq!(j["strategy"], strategy);
        assert_eq!(j["source"]["path"], path, "{strategy}");
        assert_eq!(j["target"]["path"], path, "{strategy}");
        assert_eq!(differences(j), expected(p), "{strategy}");
        assert_eq!(j["difference_counts"]["changed"], 3);
        assert_eq!(j["target"]["count"], N - 2 + 2);
        let leaves = j["leaves"].as_array().unwrap();
        assert!(
            !leaves.is_empty() && leaves.len() <= 7,
            "{strategy}: {} leaves",
            leaves.len()
        );
        for l in leaves {
            let sql = l["sql"]["source"].as_str().unwrap();
            let select = sql.lines().find(|s| s.starts_with("SELECT")).unwrap_or_default();
            assert!(select.contains("\"orders\""), "{sql}");
            assert!(l["sql"]["target"].as_str().unwrap().contains("`orders`"));
            if strategy == "hash" {
                // a sealed run's hash range cannot be written without the run key: the
                // SQL says so and holds no hash expression (no key material leaves)
                assert!(
                    sql.starts_with("-- hash range") && !select.contains("sha256"),
                    "{sql}"
                );
                assert!(
                    l["bounds"].get("lower").is_none() && l["bounds"].get("upper").is_none(),
                    "hash leaves carry no key bounds: {l}"
                );
            }
            if strategy == "time" {
                assert_eq!(l["bounds"]["period"]["granularity"], "month", "{l}");
            }
        }
        if strategy == "time" {
            assert_eq!(j["levels"][0]["segments"], 12, "one segment per month");
        }
        check_key_sql(j, p, db_name, strategy);
        let levels = j["levels"].as_array().unwrap().len() as u64;
        assert_eq!(
            j["source"]["queries"].as_u64().unwrap(),
            levels,
            "one aggregate per side per level"
        );
    }
}

/// Each leaf's per-key SQL of each kind, run on each side's database, selects exactly
/// the planted keys of that kind in the leaf that the side holds: a changed key on
/// both sides, a missing one on the source only, an extra one on the target only.
fn check_key_sql(j: &Value, p: &Plant, db_name: &str, strategy: &str) {
    // the first field of each row (psql -A separates with '|', mariadb -B with tabs)
    let ids = |out: String| -> BTreeSet<i64> {
        out.lines()
            .filter_map(|l| l.split(['|', '\t']).next()?.trim().parse().ok())
            .collect()
    };
    let mut found: std::collections::BTreeMap<String, BTreeSet<i64>> = Default::default();
    for l in j["leaves"].as_array().unwrap() {
        for k in l["key_sql"].as_array().into_iter().flatten() {
            let kind = k["kind"].as_str().unwrap().to_string();
            let (src_sql, tgt_sql) = (k["source"].as_str().unwrap(), k["target"].as_str().unwrap());
            assert!(
                src_sql.contains("\"orders\"") && tgt_sql.contains("`orders`"),
                "{k}"
            );
            let src = ids(db::postgres().exec(Some(db_name), src_sql));
            let tgt = ids(db::mariadb().exec(Some(db_name), tgt_sql));
            let (holds, other) = match kind.as_str() {
                "changed" => {
                    assert_eq!(src, tgt, "{strategy}: a changed key is on both sides: {k}");
                    (src, BTreeSet::new())
                }
                "missing_in_target" => (src, tgt),
                "extra_in_target" => (tgt, src),
                _ => panic!("{strategy}: kind {kind}"),
            };
            assert!(
                other.is_empty(),
                "{strategy}: {kind}: the other side holds {other:?}: {k}"
            );
            assert_eq!(holds.len() as u64, k["keys"].as_u64().unwrap(), "{strategy}: {k}");
            // the leaf's keys are within its bounds
            if let (Some(lo), Some(hi)) = (l["bounds"]["lower"][0].as_i64(), l["bounds"]["upper"][0].as_i64())
            {
                assert!(
                    holds.iter().all(|k| (lo..hi).contains(k)),
                    "{strategy}: {holds:?} in {l}"
                );
            }
            let all = found.entry(kind).or_default();
            assert!(all.is_disjoint(&holds), "{strategy}: a key in two leaves");
            all.extend(holds);
        }
    }
    let set = |v: &[i64]| v.iter().copied().collect::<BTreeSet<i64>>();
    assert_eq!(found.get("changed"), Some(&set(&p.changed)), "{strategy}");
    assert_eq!(
        found.get("missing_in_target"),
        Some(&set(&p.missing)),
        "{strategy}"
    );
    assert_eq!(found.get("extra_in_target"), Some(&set(&p.extra)), "{strategy}");
}

#[test]
fn count_only_reports_leaves_without_keys() {
    let p = plant();
    let d = deploy(
        "e2e_count_only",
        Some(&p),
        "{ max_level: count_only }",
        "{ max_level: count_only }",
    );
    let out = d.run(&spec("hash", "count_only"));
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(out.json.get("differences").is_none());
    assert!(!out.json["leaves"].as_array().unwrap().is_empty());
    // no planted key appears anywhere in what the coordinator printed
    for k in p.changed.iter().chain(&p.missing).chain(&p.extra) {
        assert!(
            !out.stdout.contains(&format!("[{k}]")) && !out.stdout.contains(&format!(" {k},")),
            "key {k} leaked"
        );
    }
    // and the agents released no keys
    for a in &d.agents {
        let log = std::fs::read_to_string(&a.release_log).unwrap();
        assert!(
            !log.contains("RevealKeys") && !log.contains("RowDigests"),
            "{}: {log}",
            a.name
        );
    }
}

#[test]
fn a_count_only_agent_refuses_a_with_keys_run() {
    let d = deploy("e2e_refuse", Some(&plant()), OPEN, "{ max_level: count_only }");
    let out = d.run(&spec("quantile", "with_keys"));
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["verdict"], "error");
    assert_eq!(out.json["error"]["code"], "policy_refused");
    let msg = out.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("max_level") && msg.contains("vpc2"), "{msg}");
}

#[test]
fn strategy_time_on_a_column_an_agent_does_not_list_is_refused_plainly() {
    let d = deploy("e2e_no_time", Some(&plant()), OPEN, "{ max_level: with_keys }");
    let out = d.run(&spec("time", "with_keys"));
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["error"]["code"], "policy_refused");
    let msg = out.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("time_columns") && msg.contains("vpc2") && msg.contains("created_at"),
        "{msg}"
    );
    // refused from Describe: no aggregate reached either agent
    for a in &d.agents {
        let log = std::fs::read_to_string(&a.release_log).unwrap();
        assert!(!log.contains("\"Aggregate\""), "{}: {log}", a.name);
    }
}

#[test]
fn an_agent_killed_mid_run_gives_a_clear_error() {
    // the kill races the run: on a loaded machine the run may end before the kill lands
    // (exit 0 or 1, nothing to check); the scenario is then tried again, a few times
    let mut attempt = 0;
    let out = loop {
        attempt += 1;
        let mut d = deploy(&format!("e2e_kill{attempt}"), Some(&plant()), OPEN, OPEN);
        let mut child = d.spawn_run(&spec("quantile", "with_keys"));
        // wait until the run has resolved the schemas, then kill the target's agent
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            let line = lines.next().expect("run ended before resolving").unwrap();
            if line.contains("resolved") {
                break;
            }
        }
        d.agent("vpc2").guard.kill();
        let started = Instant::now();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let out = child.wait_with_output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(60), "no hang");
        let mut out = parse_run(out);
        out.stderr = rest.join("\n");
        if matches!(out.code, 0 | 1) && attempt < 3 {
            eprintln!("attempt {attempt}: the run ended before the kill landed; again");
            continue;
        }
        break out;
    };
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["error"]["code"], "agent_unreachable", "{}", out.stdout);
    assert!(out.json["error"]["message"].as_str().unwrap().contains("vpc2"));
}

/// The source's PostgreSQL restarted mid-run (issue 34 item 8: every connection the
/// agent holds is cut, and the server refuses new ones for a moment): the run ends
/// with its exact result when the agent's retries outlast the restart, or with a clear
/// `database_unavailable` naming the agent, never another error or a wrong result.
#[test]
fn a_database_restarted_mid_run_ends_exact_or_as_database_unavailable() {
    let pg = db::start_postgres_configured(&[]);
    let p = plant();
    let mut outcomes = Vec::new();
    for attempt in 1..=3 {
        let d = deploy_on(&pg, &format!("e2e_pgrestart{attempt}"), Some(&p), OPEN, OPEN);
        let mut child = d.spawn_run(&spec("quantile", "with_keys"));
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            let line = lines.next().expect("run ended before resolving").unwrap();
            if line.contains("resolved") {
                break;
            }
        }
        pg.restart_immediately();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let mut out = parse_run(child.wait_with_output().unwrap());
        out.stderr = rest.join("\n");
        match out.code {
            1 => assert_eq!(
                differences(&out.json),
                expected(&p),
                "attempt {attempt}\n{}",
                out.stderr
            ),
            2 => {
                assert_eq!(
                    out.json["error"]["code"], "database_unavailable",
                    "attempt {attempt}: {}",
                    out.stdout
                );
                assert!(
                    out.json["error"]["message"].as_str().unwrap().contains("dc1"),
                    "{}",
                    out.stdout
                );
            }
            c => panic!("attempt {attempt}: exit {c}\n{}\n{}", out.stdout, out.stderr),
        }
        // the agent's log says why, in the driver's words (inside the zone only)
        eprintln!("attempt {attempt}: exit {} {}", out.code, out.json["error"]);
        outcomes.push(out.code);
        // the next run, on the restarted server, is exact
        let again = d.run(&spec("quantile", "with_keys"));
        assert_eq!(
            again.code, 1,
            "after the restart: {}\n{}",
            again.stdout, again.stderr
        );
        assert_eq!(differences(&again.json), expected(&p));
    }
    eprintln!("outcomes over three restarts: {outcomes:?}");
}

#[test]
fn composite_and_collation_trap_keys() {
    let pg = db::postgres();
    let my = db::mariadb();
    let words = [
        "apple", "Banana", "cherry", "Ärger", "zebra", "Éclair", "éclat", "Zoë", "ñu", "日本", "a b", "A-c",
        // a quote: PostgreSQL's COPY reads carry key bounds as literals
        "O'Brien",
    ];
    let mut rows = Vec::new();
    for i in 0..3000 {
        let region = ["EU", "eu-west", "Asia", "ÅLAND"][i % 4];
        rows.push((
            region.to_string(),
            format!("{}-{}", words[i % words.len()], i),
            i as i64 % 1000,
        ));
    }
    let sql = |mariadb: bool, changed: bool| {
        let text = if mariadb {
            "VARCHAR(60) CHARACTER SET utf8mb4"
        } else {
            "varchar(60)"
        };
        let mut s = format!(
            "DROP TABLE IF EXISTS items;\nCREATE TABLE items (region {text} NOT NULL, code {text} NOT NULL, qty INTEGER, PRIMARY KEY (region, code));\n"
        );
        let vals: Vec<String> = rows
            .iter()
            .map(|(r, c, q)| {
                let q = if changed && c == "Éclair-5" { q + 1 } else { *q };
                format!("({}, {}, {q})", quote(r), quote(c))
            })
            .collect();
        for chunk in vals.chunks(500) {
            s.push_str(&format!("INSERT INTO items VALUES {};\n", chunk.join(", ")));
        }
        s
    };
    let pg_url = pg.create_database("e2e_keys");
    let my_url = my.create_database("e2e_keys");
    pg.exec(Some("e2e_keys"), &sql(false, false));
    my.exec(Some("e2e_keys"), &sql(true, true));
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent(
        "dc1",
        "items",
        &format!("{{ url: '{pg_url}', table: items, key: [region, code], policy: {OPEN} }}"),
    );
    d.start_agent(
        "vpc2",
        "items",
        &format!("{{ url: '{my_url}', table: items, key: [region, code], policy: {OPEN} }}"),
    );
    let spec = "name: keys\nsource: { agent: dc1, dataset: items }\ntarget: { agent: vpc2, dataset: items }\n\
                bisection: { factor: 8, threshold: 2 }\nreporting: { level: with_keys }\n";
    let out = d.run(spec);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let diffs = out.json["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{}", out.stdout);
    assert_eq!(diffs[0]["kind"], "changed");
    assert_eq!(diffs[0]["key"], serde_json::json!(["eu-west", "Éclair-5"]));
    // more than one level: the drill bisected text ranges that both engines ordered the same way
    assert!(
        out.json["levels"].as_array().unwrap().len() >= 2,
        "{}",
        out.stdout
    );
}

#[test]
fn detailed_reports_the_differing_columns_and_values_but_never_masked_ones() {
    let p = plant();
    let detailed = "{ max_level: detailed, mask_columns: [note] }";
    let d = deploy("e2e_detailed", Some(&p), detailed, detailed);
    let spec = "name: detailed\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                bisection: { factor: 16, threshold: 500 }\nreporting: { level: detailed, consent_acknowledged: true }\n";
    let out = d.run(spec);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let diffs = out.json["differences"].as_array().unwrap();
    let changed: Vec<&Value> = diffs.iter().filter(|d| d["kind"] == "changed").collect();
    assert_eq!(changed.len(), 3);
    for c in changed {
        assert_eq!(c["columns"], serde_json::json!(["amount"]), "{c}");
        let v = &c["values"]["amount"];
        let (s, t): (f64, f64) = (
            v["source"].as_str().unwrap().parse().unwrap(),
            v["target"].as_str().unwrap().parse().unwrap(),
        );
        assert!((t - s - 0.01).abs() < 1e-9, "{v}");
        assert!(c["values"].get("note").is_none());
    }
    assert!(!out.stdout.contains("note "), "a masked value was revealed");
}

#[test]
fn gates_stop_the_run_with_a_clear_verdict() {
    let d = deploy("e2e_gates", Some(&plant()), OPEN, OPEN);
    let base = "name: gated\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                bisection: { factor: 16, threshold: 10 }\n";
    let out = d.run(&format!("{base}gates: {{ max_queries: 1 }}\n"));
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert_eq!(out.json["error"]["code"], "gate_tripped");
    assert!(
        out.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_queries")
    );
    // what was found before the gate is still reported
    assert_eq!(out.json["levels"].as_array().unwrap().len(), 1);
    let out = d.run(&format!("{base}gates: {{ max_rows_scanned: 1000 }}\n"));
    assert_eq!(out.code, 2);
    assert!(
        out.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_rows_scanned"),
        "{}",
        out.stdout
    );
    assert!(
        out.json["levels"].as_array().unwrap().is_empty(),
        "refused before scanning"
    );
}

#[test]
fn schema_drift_is_reported_before_any_scan() {
    let pg = db::postgres();
    let my = db::mariadb();
    let pg_url = pg.create_database("e2e_drift");
    let my_url = my.create_database("e2e_drift");
    pg.exec(
        Some("e2e_drift"),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, amount NUMERIC(10,2), at TIMESTAMP);",
    );
    my.exec(
        Some("e2e_drift"),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, amount DECIMAL(10,2), at DATE);",
    );
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent("dc1", "t", &format!("{{ url: '{pg_url}', table: t, key: [id] }}"));
    d.start_agent(
        "vpc2",
        "t",
        &format!("{{ url: '{my_url}', table: t, key: [id] }}"),
    );
    let out = d.run("name: drift\nsource: { agent: dc1, dataset: t }\ntarget: { agent: vpc2, dataset: t }\n");
    assert_eq!(out.code, 2);
    assert_eq!(out.json["error"]["code"], "schema_drift");
    assert!(
        out.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("column at is timestamp"),
        "{}",
        out.stdout
    );
    assert_eq!(out.json["source"]["queries"], 0);
}

#[test]
fn agent_check_reports_each_dataset() {
    let pg = db::postgres();
    let url = pg.create_database("e2e_check");
    pg.exec(
        Some("e2e_check"),
        "CREATE TABLE t (id BIGINT PRIMARY KEY, doc JSONB, amount NUMERIC(12,2), span INTERVAL);",
    );
    let d = Deployment::new(&["dc1"]);
    let cfg = format!(
        "listen: 127.0.0.1:0\ntls: {{ ca: certs/ca.pem, cert: certs/dc1.pem, key: certs/dc1-key.pem, zone_key: certs/dc1-zone.key }}\n\
         datasets:\n  good: {{ url: '{url}', table: t, key: [id], watermark: {{ builtin: pg_wal_lsn }} }}\n  \
         standby: {{ url: '{url}', table: t, key: [id], watermark: {{ builtin: pg_replay_lsn }} }}\n  \
         bad: {{ url: 'postgres://postgres@127.0.0.1:9/x', table: t, key: [id] }}\n"
    );
    let path = d.path().join("check.yaml");
    std::fs::write(&path, cfg).unwrap();
    let out = std::process::Command::new(tally_e2e::bins::tally_agent())
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("dataset good: postgres"), "{stdout}");
    assert!(
        stdout.contains("amount") && stdout.contains("decimal") && stdout.contains("numeric(12,2)"),
        "{stdout}"
    );
    let line = |col: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(col))
            .unwrap_or("")
            .to_string()
    };
    assert!(
        line("doc").contains("json") && !line("doc").contains("not comparable"),
        "jsonb compares as JSON: {stdout}"
    );
    assert!(
        line("span").contains("not comparable"),
        "interval is flagged: {stdout}"
    );
    assert!(
        stdout.contains("hashing: in_process: the agent reads rows"),
        "PostgreSQL hashes in the agent by default: {stdout}"
    );
    assert!(
        stdout.contains("dataset bad: cannot connect:") && stdout.contains("Connection refused"),
        "{stdout}"
    );
    // each watermark is read once: a primary's position, and a clear word where the
    // builtin does not fit the server
    assert!(
        line("watermark: builtin pg_wal_lsn reads lsn ").contains('/'),
        "{stdout}"
    );
    assert!(
        stdout.contains("watermark: watermark of dataset standby: pg_last_wal_replay_lsn() is NULL: the server has never been a standby"),
        "{stdout}"
    );
    // a config error names the key and exits 2
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\ntls: { ca: a, cert: b, key: c }\ndatasets:\n  x: { table: t, key: [id] }\n",
    )
    .unwrap();
    let out = std::process::Command::new(tally_e2e::bins::tally_agent())
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("datasets.x.url"));
}

#[test]
fn tally_demo_finds_exactly_what_it_planted() {
    let out = std::process::Command::new(tally_e2e::bins::tally())
        .args(["demo", "--json", "--rows", "30000"])
        .output()
        .expect("tally demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // a newcomer's first output: no warning about their setup, no colour codes in a pipe
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("WARN") && !stderr.contains('\u{1b}'), "{stderr}");
    let j: Value = serde_json::from_str(&stdout).unwrap();
    let counts = &j["difference_counts"];
    assert_eq!(
        (
            counts["changed"].as_u64(),
            counts["missing_in_target"].as_u64(),
            counts["extra_in_target"].as_u64()
        ),
        (Some(3), Some(2), Some(2))
    );
    assert_eq!(j["source"]["count"], 30000);
    assert_eq!(j["source"]["queries"], 1);
    let engine = j["source"]["engine"].as_str().unwrap();
    assert!(
        engine.starts_with(if cfg!(feature = "duckdb") {
            "duckdb"
        } else {
            "sqlite"
        }),
        "{engine}"
    );
}

/// `--log-format json`, for a service whose logs go to a log store: every log line is
/// one JSON object (level, timestamp, fields), never a colour code; the agent takes the
/// same flag.
#[test]
fn log_lines_are_json_objects_under_log_format_json() {
    let out = std::process::Command::new(tally_e2e::bins::tally())
        .args(["demo", "--json", "--rows", "2000", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .output()
        .expect("tally demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let logs: Vec<&str> = stderr.lines().filter(|l| l.contains("\"level\"")).collect();
    assert!(logs.len() >= 2, "the demo's agents log at info: {stderr}");
    for line in logs {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string() && v["fields"].is_object(),
            "{line}"
        );
    }
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
    let out = std::process::Command::new(tally_e2e::bins::tally_agent())
        .args([
            "check",
            "--offline",
            "--log-format",
            "json",
            "-c",
            "no-such-agent.yaml",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no-such-agent.yaml"),
        "the flag is taken: {stderr}"
    );
}

/// An agent whose database refuses it: the run ends within the agent's connect timeout
/// with `database_unavailable` naming the agent, the dataset and why (the class; the
/// driver's text stays in the zone's log), not `agent_unreachable` after retries of an
/// agent that answered (issue 34 item 5).
#[test]
fn a_database_that_refuses_its_agent_is_named_not_an_unreachable_agent() {
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    let closed = format!("postgres://postgres@127.0.0.1:{}/x", tally_e2e::proc::free_port());
    for agent in ["dc1", "vpc2"] {
        d.start_agent(
            agent,
            "orders",
            &format!("{{ url: '{closed}', table: orders, key: [id] }}"),
        );
    }
    let spec = d.path().join("refused.yaml");
    std::fs::write(
        &spec,
        "name: refused\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n",
    )
    .unwrap();
    let t0 = Instant::now();
    let out = std::process::Command::new(tally_e2e::bins::tally())
        .arg("run")
        .arg(&spec)
        .arg("-c")
        .arg(d.coordinator_config())
        .arg("--json")
        .output()
        .unwrap();
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    let j: Value = serde_json::from_str(&stdout).unwrap();
    let (code, message) = (
        &j["error"]["code"],
        j["error"]["message"].as_str().unwrap_or_default(),
    );
    assert_eq!(code, "database_unavailable", "{j}");
    assert!(
        message.contains("database of dataset orders unavailable (connection refused)")
            && (message.contains("agent dc1") || message.contains("agent vpc2")),
        "{message}"
    );
    assert!(took < Duration::from_secs(12), "reported in {took:?}");
    // the driver's own words are in the agent's log, in its zone
    let logs = ["dc1", "vpc2"]
        .map(|a| std::fs::read_to_string(d.path().join(format!("{a}.log"))).unwrap_or_default())
        .join("\n");
    assert!(logs.to_lowercase().contains("connection refused"), "{logs}");
}

#[test]
fn duplicate_keys_are_reported_not_folded() {
    let pg = db::postgres();
    let my = db::mariadb();
    let pg_url = pg.create_database("e2e_dups");
    let my_url = my.create_database("e2e_dups");
    let rows: Vec<String> = (1..=2000).map(|i| format!("({i}, 'v{i}')")).collect();
    let load = format!(
        "CREATE TABLE t (id BIGINT NOT NULL, v VARCHAR(20));\nINSERT INTO t VALUES {};\n",
        rows.join(", ")
    );
    pg.exec(Some("e2e_dups"), &load);
    my.exec(
        Some("e2e_dups"),
        &format!("{load}INSERT INTO t VALUES (777, 'again');\n"),
    );
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent(
        "dc1",
        "t",
        &format!("{{ url: '{pg_url}', table: t, key: [id], policy: {OPEN} }}"),
    );
    d.start_agent(
        "vpc2",
        "t",
        &format!("{{ url: '{my_url}', table: t, key: [id], policy: {OPEN} }}"),
    );
    let out = d.run("name: dups\nsource: { agent: dc1, dataset: t }\ntarget: { agent: vpc2, dataset: t }\nreporting: { level: with_keys }\n");
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["duplicate_keys"]["target"], 1, "{}", out.stdout);
    assert_eq!(out.json["duplicate_keys"]["source"], 0);
    assert_eq!(out.json["target"]["count"], 2001);
}

/// Bearer tokens of the serve test: the config holds only their SHA-256.
const VIEWER_TOKEN: &str = "viewer-token-0123456789";
const OPERATOR_TOKEN: &str = "operator-token-012345678";
const ADMIN_TOKEN: &str = "admin-token-0123456789ab";

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// Issues a ClientAuth certificate `name` from the CA in `certs/` (or from `ca`).
fn client_cert(
    dir: &std::path::Path,
    name: &str,
    ca: Option<&tally_common::pki::Ca>,
) -> (std::path::PathBuf, std::path::PathBuf) {
    use tally_common::pki::{Ca, Role};
    let read = |f: &str| std::fs::read_to_string(dir.join("certs").join(f)).unwrap();
    let own;
    let ca = match ca {
        Some(c) => c,
        None => {
            // API client certificates come from the API's CA, never the agents': an
            // agent with `allowed_clients: any` would accept one from its own CA
            own = Ca::from_pem(&read("api-ca.pem"), &read("api-ca-key.pem")).unwrap();
            &own
        }
    };
    let pem = ca.issue(name, Role::Client, &[]).unwrap();
    let (cert, key) = (
        dir.join(format!("{name}-client.pem")),
        dir.join(format!("{name}-client-key.pem")),
    );
    std::fs::write(&cert, pem.cert).unwrap();
    std::fs::write(&key, pem.key).unwrap();
    (cert, key)
}

#[test]
fn tally_serve_runs_specs_and_keeps_a_tamper_evident_record() {
    use tally_e2e::https::{client_config, request};
    let d = deploy("e2e_serve", Some(&plant()), OPEN, OPEN);
    let port = tally_e2e::proc::free_port();
    let cfg = d.coordinator_config();
    let text = std::fs::read_to_string(&cfg).unwrap();
    let api = format!(
        "api:\n  tls: {{ cert: certs/coordinator-api.pem, key: certs/coordinator-api-key.pem, ca: certs/api-ca.pem }}\n  \
         clients: [{{ name: alice, role: auditor }}]\n  tokens:\n    \
         - {{ name: dash, sha256: {}, role: viewer }}\n    \
         - {{ name: ci, sha256: {}, role: operator }}\n    \
         - {{ name: root, sha256: {}, role: admin }}\n",
        sha256_hex(VIEWER_TOKEN),
        sha256_hex(OPERATOR_TOKEN),
        sha256_hex(ADMIN_TOKEN)
    );
    let serve_cfg = d.path().join("serve.yaml");
    std::fs::write(
        &serve_cfg,
        format!("listen: 127.0.0.1:{port}\ndata_dir: store\n{text}{api}"),
    )
    .unwrap();
    let start = |cfg: &std::path::Path, port: u16, args: &[&str]| {
        let mut c = std::process::Command::new(tally_e2e::bins::tally());
        c.args(["serve", "-c"]).arg(cfg).args(args);
        let g = tally_e2e::proc::ChildGuard::spawn("serve", &mut c).unwrap();
        assert!(
            tally_e2e::proc::wait_for_port(port, Duration::from_secs(20)),
            "tally serve did not listen"
        );
        g
    };
    // no api.tls: refused at start, naming the key, unless plain HTTP on loopback is asked for
    let plain_port = tally_e2e::proc::free_port();
    let plain_cfg = d.path().join("plain.yaml");
    std::fs::write(
        &plain_cfg,
        format!(
            "listen: 127.0.0.1:{plain_port}\ndata_dir: plain-store\n{text}api:\n  tokens: [{{ name: dash, sha256: {}, role: viewer }}]\n",
            sha256_hex(VIEWER_TOKEN)
        ),
    )
    .unwrap();
    let out = std::process::Command::new(tally_e2e::bins::tally())
        .args(["serve", "-c"])
        .arg(&plain_cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`api.tls`") && stderr.contains("--insecure-loopback"),
        "{stderr}"
    );
    {
        let _plain = start(&plain_cfg, plain_port, &["--insecure-loopback"]);
        assert_eq!(
            request(plain_port, None, "GET", "/healthz", None, "").unwrap().0,
            200
        );
        assert_eq!(
            request(plain_port, None, "GET", "/v1/runs", None, "").unwrap().0,
            401
        );
        assert_eq!(
            request(plain_port, None, "GET", "/v1/runs", Some(VIEWER_TOKEN), "")
                .unwrap()
                .0,
            200
        );
    }

    let certs = d.path().join("certs");
    let anon = client_config(&certs.join("api-ca.pem"), None);
    let (alice_cert, alice_key) = client_cert(d.path(), "alice", None);
    let alice = client_config(&certs.join("api-ca.pem"), Some((&alice_cert, &alice_key)));
    let (bob_cert, bob_key) = client_cert(d.path(), "bob", None);
    let bob = client_config(&certs.join("api-ca.pem"), Some((&bob_cert, &bob_key)));
    let other_ca = tally_common::pki::Ca::generate("other-ca").unwrap();
    let (mallory_cert, mallory_key) = client_cert(d.path(), "alice", Some(&other_ca));
    let mallory = client_config(&certs.join("api-ca.pem"), Some((&mallory_cert, &mallory_key)));
    let http = |tls: &std::sync::Arc<_>, method: &str, path: &str, token: Option<&str>, body: &str| {
        request(port, Some(tls), method, path, token, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };

    let mut serve = start(&serve_cfg, port, &[]);
    assert_eq!(http(&anon, "GET", "/healthz", None, "").0, 200);
    // plain HTTP to the HTTPS port gets no HTTP answer
    assert!(
        request(port, None, "GET", "/healthz", None, "").is_err(),
        "plain HTTP must not be served without --insecure-loopback"
    );
    let spec = spec("quantile", "with_keys");
    let (code, body) = http(&anon, "POST", "/v1/runs", None, &spec);
    assert_eq!(code, 401, "the API needs credentials: {body}");
    assert_eq!(http(&anon, "GET", "/v1/runs", None, "").0, 401);
    // a wrong token of the same length
    let wrong = format!("{}X", &OPERATOR_TOKEN[..OPERATOR_TOKEN.len() - 1]);
    assert_eq!(wrong.len(), OPERATOR_TOKEN.len());
    assert_eq!(http(&anon, "POST", "/v1/runs", Some(&wrong), &spec).0, 401);
    let (code, body) = http(&anon, "POST", "/v1/runs", Some(VIEWER_TOKEN), &spec);
    assert_eq!(code, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("operator"), "{body}");
    let (code, body) = http(
        &anon,
        "POST",
        "/v1/runs",
        Some(OPERATOR_TOKEN),
        "name: x\nsource: { agent: nowhere, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n",
    );
    assert_eq!(code, 400);
    assert!(body["error"].as_str().unwrap().contains("nowhere"), "{body}");
    let (code, body) = http(&anon, "POST", "/v1/runs", Some(OPERATOR_TOKEN), &spec);
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(120);
    let doc = loop {
        let (code, doc) = http(&anon, "GET", &format!("/v1/runs/{id}"), Some(OPERATOR_TOKEN), "");
        if code == 200 {
            break doc;
        }
        assert_eq!(code, 202, "{doc}");
        assert!(Instant::now() < until, "run did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    // an operator sees the keys
    assert_eq!(doc["result"]["verdict"], "differ", "{doc}");
    assert_eq!(differences(&doc["result"]), expected(&plant()));
    assert_eq!(doc["spec"]["name"], "e2e");
    assert!(doc["result"]["leaves"][0].get("bounds").is_some(), "{doc}");
    // a viewer sees the verdict and the counts, but no key, bound or SQL
    let (code, seen) = http(&anon, "GET", &format!("/v1/runs/{id}"), Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{seen}");
    assert_eq!(seen["result"]["verdict"], "differ");
    assert_eq!(
        seen["result"]["difference_counts"],
        doc["result"]["difference_counts"]
    );
    assert!(seen["result"].get("differences").is_none(), "{seen}");
    let leaves = seen["result"]["leaves"].as_array().unwrap();
    assert_eq!(leaves.len(), doc["result"]["leaves"].as_array().unwrap().len());
    for leaf in leaves {
        assert!(
            leaf.get("bounds").is_none() && leaf.get("sql").is_none(),
            "{leaf}"
        );
    }
    let (_, list) = http(&anon, "GET", "/v1/runs", Some(VIEWER_TOKEN), "");
    assert_eq!(list["runs"][0]["id"], id.as_str());
    assert_eq!(list["runs"][0]["verdict"], "differ");
    // a finished run cannot be cancelled; an unknown one is not found
    assert_eq!(
        http(
            &anon,
            "POST",
            &format!("/v1/runs/{id}/cancel"),
            Some(VIEWER_TOKEN),
            ""
        )
        .0,
        403
    );
    assert_eq!(
        http(
            &anon,
            "POST",
            &format!("/v1/runs/{id}/cancel"),
            Some(OPERATOR_TOKEN),
            ""
        )
        .0,
        409
    );
    assert_eq!(
        http(&anon, "POST", "/v1/runs/nope/cancel", Some(ADMIN_TOKEN), "").0,
        404
    );

    // client certificates: alice (auditor) reads the audit log, an operator may not
    let (code, body) = http(&anon, "GET", "/v1/audit", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 403);
    assert!(body["error"].as_str().unwrap().contains("auditor"), "{body}");
    let (code, audit) = http(&alice, "GET", "/v1/audit", None, "");
    assert_eq!(code, 200, "{audit}");
    assert_eq!(audit["runs"]["entries"][0]["id"], id.as_str());
    let events = audit["events"]["entries"].as_array().unwrap();
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["action"] == "start_run" && e["outcome"] == "accepted")
        .collect();
    assert_eq!(started.len(), 1, "{audit}");
    assert_eq!(started[0]["actor"], "ci");
    assert_eq!(started[0]["run"], id.as_str());
    assert!(
        started[0]["remote"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{audit}"
    );
    assert!(
        events.iter().any(|e| e["status"] == 401 && e["actor"].is_null()),
        "{audit}"
    );
    assert!(
        events.iter().any(|e| e["status"] == 403 && e["actor"] == "dash"),
        "{audit}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["action"] == "cancel_run" && e["status"] == 409),
        "{audit}"
    );
    assert_eq!(audit["events"]["seq"].as_u64().unwrap() as usize, events.len());
    // alice is an auditor, so she sees keys as well
    let (_, by_alice) = http(&alice, "GET", &format!("/v1/runs/{id}"), None, "");
    assert_eq!(differences(&by_alice["result"]), expected(&plant()));
    // evidence is for auditors: the bundle verifies offline against the agents' CA
    let (code, body) = http(
        &anon,
        "GET",
        &format!("/v1/runs/{id}/evidence"),
        Some(OPERATOR_TOKEN),
        "",
    );
    assert_eq!(code, 403);
    assert!(body["error"].as_str().unwrap().contains("auditor"), "{body}");
    let (code, bundle) = http(&alice, "GET", &format!("/v1/runs/{id}/evidence"), None, "");
    assert_eq!(code, 200, "{bundle}");
    assert_eq!(bundle["format"], "tally-evidence/1");
    assert_eq!(http(&alice, "GET", "/v1/runs/nope/evidence", None, "").0, 404);
    assert_eq!(http(&alice, "GET", "/v1/runs/_ledger/evidence", None, "").0, 404);
    let tally = |args: &[&str]| {
        let out = std::process::Command::new(tally_e2e::bins::tally())
            .args(args)
            .current_dir(d.path())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let server = format!("https://127.0.0.1:{port}");
    // alice's files were overwritten by mallory's (same name, another CA): issue hers again
    let (alice_cert, alice_key) = client_cert(d.path(), "alice", None);
    let (alice_cert_s, alice_key_s) = (alice_cert.display().to_string(), alice_key.display().to_string());
    let remote = [
        "--ca",
        "certs/api-ca.pem",
        "--cert",
        &alice_cert_s,
        "--key",
        &alice_key_s,
    ];
    let (code, out) = tally(
        &[
            &["evidence", &id, "--server", &server, "-o", "served.json"][..],
            &remote[..],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{out}");
    // tally verify, and the docs-only verifier beside it (tests/src/evidence.rs)
    let (code, out) =
        tally_e2e::evidence::verify(&d.path().join("served.json"), &d.path().join("certs/ca.pem"));
    assert_eq!(code, 0, "{out}");
    let served: Value =
        serde_json::from_slice(&std::fs::read(d.path().join("served.json")).unwrap()).unwrap();
    assert_eq!(served, bundle, "the CLI writes the bundle the API serves");
    // the log's signed checkpoint, and an export that extends it
    let (code, out) = tally(
        &[
            &["audit", "checkpoint", "--server", &server, "-o", "cp.json"][..],
            &remote[..],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = tally(
        &[
            &["audit", "export", "--server", &server, "-o", "log.jsonl"][..],
            &remote[..],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = tally(&[
        "audit",
        "verify",
        "log.jsonl",
        "--ca",
        "certs/ca.pem",
        "--since",
        "cp.json",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok    --since"), "{out}");
    // an operator may not export the log
    assert_eq!(http(&anon, "GET", "/v1/log", Some(OPERATOR_TOKEN), "").0, 403);
    // bob's certificate is valid but has no role; his token still counts
    assert_eq!(http(&bob, "GET", "/v1/runs", None, "").0, 403);
    assert_eq!(http(&bob, "GET", "/v1/runs", Some(VIEWER_TOKEN), "").0, 200);
    // a certificate from another CA is refused in the handshake, whatever its name
    assert!(
        request(port, Some(&mallory), "GET", "/v1/runs", Some(VIEWER_TOKEN), "").is_err(),
        "a client certificate from another CA must be refused"
    );
    // the record survives a restart
    serve.kill();
    let mut serve = start(&serve_cfg, port, &[]);
    assert_eq!(
        http(&anon, "GET", &format!("/v1/runs/{id}"), Some(ADMIN_TOKEN), "").1["result"]["verdict"],
        "differ"
    );
    serve.kill();
    // and an edited record is refused: the finished event, which carries the run's
    // document, turned from differ into match in the run log's file
    let runlog = d.path().join("store").join("runlog.sqlite");
    let script = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
n = c.execute(
    "UPDATE events SET line = replace(line, '\"verdict\":\"differ\"', '\"verdict\":\"match\"') "
    "WHERE run_id = ? AND line LIKE '%\"event\":\"finished\"%'",
    (sys.argv[2],),
).rowcount
c.commit()
print(n)
"#;
    let edit = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&runlog)
        .arg(&id)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&edit.stdout).trim(), "1", "{edit:?}");
    let out = std::process::Command::new(tally_e2e::bins::tally())
        .args(["serve", "-c"])
        .arg(&serve_cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&id) && stderr.contains("the chain is broken"),
        "{stderr}"
    );
}

/// Events in a serve's run log whose line contains every one of `parts` (read with
/// Python's sqlite3, beside the writer: the log is in WAL mode).
fn events_logged(runlog: &std::path::Path, parts: &[&str]) -> u64 {
    if !runlog.exists() {
        return 0;
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n\
             lines = [r[0] for r in c.execute('SELECT line FROM events')]\n\
             print(sum(1 for l in lines if all(p in l for p in sys.argv[2:])))",
        ])
        .arg(runlog)
        .args(parts)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

/// Level events in a serve's run log.
fn levels_logged(runlog: &std::path::Path) -> u64 {
    events_logged(runlog, &["\"event\":\"level\""])
}

#[test]
fn tally_serve_killed_mid_run_resumes_it_without_asking_committed_levels_again() {
    use tally_e2e::https::request;
    let p = plant();
    let mut d = deploy("e2e_resume", Some(&p), OPEN, OPEN);
    let port = tally_e2e::proc::free_port();
    let text = std::fs::read_to_string(d.coordinator_config()).unwrap();
    let serve_cfg = d.path().join("serve.yaml");
    std::fs::write(
        &serve_cfg,
        format!(
            "listen: 127.0.0.1:{port}\ndata_dir: store\n{text}api:\n  tokens: [{{ name: ci, sha256: {}, role: operator }}]\n",
            sha256_hex(OPERATOR_TOKEN)
        ),
    )
    .unwrap();
    let start = || {
        let mut c = std::process::Command::new(tally_e2e::bins::tally());
        c.args(["serve", "--insecure-loopback", "-c"]).arg(&serve_cfg);
        let g = tally_e2e::proc::ChildGuard::spawn("serve", &mut c).unwrap();
        assert!(
            tally_e2e::proc::wait_for_port(port, Duration::from_secs(20)),
            "tally serve did not listen"
        );
        g
    };
    // a deep drill: level 1 cuts 1024 ways, then halves segments down to 2 rows
    let spec = "name: resume\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                bisection: { strategy: quantile, factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n";
    let runlog = d.path().join("store/runlog.sqlite");
    let aggregates = |d: &mut Deployment, agent: &str| {
        std::fs::read_to_string(&d.agent(agent).release_log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"rpc\":\"Aggregate\""))
            .count()
    };
    let mut serve = start();
    let (code, body) = request(port, None, "POST", "/v1/runs", Some(OPERATOR_TOKEN), spec).unwrap();
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    // kill -9 once two levels are committed
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while levels_logged(&runlog) < 2 {
        assert!(
            std::time::Instant::now() < until,
            "no level committed within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    serve.kill();
    let committed = levels_logged(&runlog);
    let asked_before = (aggregates(&mut d, "dc1"), aggregates(&mut d, "vpc2"));
    // each side's aggregates the log holds: answered, never asked again
    let recorded = |side: &str| {
        events_logged(
            &runlog,
            &["\"event\":\"aggregated\"", &format!("\"side\":\"{side}\"")],
        ) as usize
    };
    let recorded = (recorded("source"), recorded("target"));
    // a new process resumes the run from its log
    let _serve = start();
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let doc = loop {
        let (code, body) = request(
            port,
            None,
            "GET",
            &format!("/v1/runs/{id}"),
            Some(OPERATOR_TOKEN),
            "",
        )
        .unwrap();
        if code == 200 {
            break body;
        }
        assert!(code == 202 || code == 404, "{code}: {body}");
        assert!(
            std::time::Instant::now() < until,
            "the resumed run did not finish"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let j = &doc["result"];
    assert_eq!(j["verdict"], "differ", "{j}");
    assert_eq!(differences(j), expected(&p));
    let levels = j["levels"].as_array().unwrap().len();
    if committed as usize >= levels {
        // the kill came after the drill had ended: the resumed run only ran the rows phase
        assert_eq!(aggregates(&mut d, "dc1"), asked_before.0);
        return;
    }
    // every level was asked once per side, plus at most the one in flight at the kill
    // if its answer was not recorded (a recorded one is not asked again, so a side may
    // see no new call at all); asking committed levels again would add at least two
    for (agent, before, recorded) in [
        ("dc1", asked_before.0, recorded.0),
        ("vpc2", asked_before.1, recorded.1),
    ] {
        let total = aggregates(&mut d, agent);
        assert!(
            total <= levels + 1 && total >= levels.max(before) && recorded >= committed as usize,
            "{agent}: {total} aggregates for {levels} levels ({committed} levels committed before the kill, \
             {recorded} answers recorded, {before} asked by then)"
        );
    }
    assert_eq!(j["source"]["queries"].as_u64(), Some(levels as u64));
}

#[test]
fn tally_run_with_a_data_dir_resumes_after_a_kill_and_refuses_a_finished_or_other_run() {
    let p = plant();
    let d = deploy("e2e_cli_resume", Some(&p), OPEN, OPEN);
    let spec = "name: cli-resume\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                bisection: { strategy: quantile, factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n";
    let spec_path = d.path().join("cli-spec.yaml");
    std::fs::write(&spec_path, spec).unwrap();
    let data = d.path().join("cli-data");
    let tally = |extra: &[&str]| {
        let mut c = std::process::Command::new(tally_e2e::bins::tally());
        c.arg("run")
            .arg(&spec_path)
            .arg("-c")
            .arg(d.coordinator_config())
            .arg("--json")
            .arg("--data-dir")
            .arg(&data)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let mut first = tally(&[]).spawn().unwrap();
    let runlog = data.join("runlog.sqlite");
    let until = Instant::now() + Duration::from_secs(60);
    while levels_logged(&runlog) < 2 {
        assert!(Instant::now() < until, "no level committed within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap();
    let out = first.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let id = stderr
        .split("--resume ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id on stderr: {stderr}"))
        .to_string();
    let resumed = parse_run(tally(&["--resume", &id]).output().unwrap());
    assert_eq!(resumed.code, 1, "{}\n{}", resumed.stderr, resumed.stdout);
    assert!(
        resumed.stderr.contains(&format!("resuming run {id}")),
        "{}",
        resumed.stderr
    );
    assert_eq!(differences(&resumed.json), expected(&p));
    // a finished run is not resumed again; an unknown one, or another spec, is refused
    let again = tally(&["--resume", &id]).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("finished already"));
    let unknown = tally(&["--resume", "nothing"]).output().unwrap();
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no such run"));
}

/// Windows (DESIGN §5, issue 14): `window: {column, as_of | lag}` compares only the rows
/// up to the bound on both sides, with every strategy; planted differences beyond it
/// are not reported, those within are, every one. A bound below every difference
/// matches; a lag leaves the bound at the clock minus the lag, recorded in the result;
/// an agent whose policy does not list the column refuses before any scan.
#[test]
fn a_window_compares_only_the_rows_up_to_its_bound_with_every_strategy() {
    let p = plant();
    let policy = "{ max_level: with_keys, time_columns: [created_at, id] }";
    let d = deploy("e2e_window", Some(&p), policy, policy);
    // row(): created_at is in month 1 + id % 12 of 2024
    let month = |id: i64| 1 + id % 12;
    let all = expected(&p);
    let in_window: BTreeSet<_> = all.iter().filter(|(_, k)| month(*k) <= 6).cloned().collect();
    assert!(
        !in_window.is_empty() && in_window.len() < all.len(),
        "the plant straddles the bound: {all:?}"
    );
    let source_rows = keys().into_iter().filter(|k| month(*k) <= 6).count();
    for strategy in ["quantile", "hash", "time"] {
        let spec = format!(
            "{}window: {{ column: created_at, as_of: '2024-06-30 23:59:59.999999' }}\n",
            spec(strategy, "with_keys")
        );
        let out = d.run(&spec);
        assert_eq!(out.code, 1, "{strategy}: {}\n{}", out.stdout, out.stderr);
        let j = &out.json;
        assert_eq!(differences(j), in_window, "{strategy}");
        assert_eq!(j["window"]["column"], "created_at");
        assert_eq!(j["window"]["upper"], "2024-06-30T23:59:59.999999000");
        assert_eq!(
            j["source"]["count"], source_rows as u64,
            "{strategy}: rows in the window"
        );
        assert!(
            out.stderr
                .contains("window: created_at <= 2024-06-30T23:59:59.999999000"),
            "{}",
            out.stderr
        );
    }
    // an integer window below every planted difference: the window's rows match
    let first = all.iter().map(|(_, k)| *k).min().unwrap();
    let spec_id = format!(
        "{}window: {{ column: id, as_of: {} }}\n",
        spec("quantile", "with_keys"),
        first - 1
    );
    let out = d.run(&spec_id);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        out.json["source"]["count"],
        keys().into_iter().filter(|k| *k < first).count() as u64
    );
    // a lag: every row is older than the clock minus an hour, so every difference
    let out = d.run(&format!(
        "{}window: {{ column: created_at, lag: 1h }}\n",
        spec("quantile", "with_keys")
    ));
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(differences(&out.json), all);
    assert_eq!(out.json["window"]["lag"], "1h");
    let upper = out.json["window"]["upper"].as_str().unwrap();
    assert!(
        upper.starts_with("20") && upper.ends_with(|c: char| c.is_ascii_digit()),
        "{upper}"
    );
    // a column no policy lists: refused from Describe, no aggregate reaches an agent
    let before: Vec<usize> = d
        .agents
        .iter()
        .map(|a| {
            std::fs::read_to_string(&a.release_log)
                .unwrap()
                .matches("\"Aggregate\"")
                .count()
        })
        .collect();
    let out = d.run(&format!(
        "{}window: {{ column: customer, as_of: 'm' }}\n",
        spec("quantile", "with_keys")
    ));
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["error"]["code"], "policy_refused");
    let msg = out.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("time_columns") && msg.contains("customer"), "{msg}");
    for (a, n) in d.agents.iter().zip(before) {
        let log = std::fs::read_to_string(&a.release_log).unwrap();
        assert_eq!(
            log.matches("\"Aggregate\"").count(),
            n,
            "{}: no aggregate after the refusal",
            a.name
        );
    }
}

/// Runs `spec` and "replicates" `writes` to the target's MariaDB database `db_name`
/// while the run waits before its confirm round; the run's output and progress lines.
fn run_replicating(
    d: &Deployment,
    spec: &str,
    db_name: &'static str,
    writes: String,
) -> (std::process::Output, String) {
    let mut child = d.spawn_run(spec);
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut applied = false;
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if !applied && line.contains("confirm round 1/1: waiting") {
                db::mariadb().exec(Some(db_name), &writes);
                applied = true;
            }
            all.push_str(&line);
            all.push('\n');
        }
        (all, applied)
    });
    let out = child.wait_with_output().unwrap();
    let (stderr, applied) = reader.join().unwrap();
    assert!(applied, "the run never waited for a confirm round: {stderr}");
    (out, stderr)
}

/// Confirm rounds (DESIGN §5 step 6, issue 14): the source has writes its target has
/// not applied yet (five updates, an insert, a delete), besides the planted persistent
/// differences. The "replication" applies them while the run waits before its confirm
/// round: no in-flight row is reported as a difference, every planted one is, and the
/// in-flight rows are counted as such, their keys never revealed.
#[test]
fn confirm_rounds_tell_rows_in_flight_from_persistent_differences() {
    let p = plant();
    let db_name = "e2e_confirm";
    let d = deploy(db_name, Some(&p), OPEN, OPEN);
    let k = keys();
    let updated = [k[500], k[5_000], k[10_000], k[12_345], k[17_000]];
    let inserted = 7 * 900;
    let deleted = k[8_000];
    let planted: Vec<i64> = expected(&p).iter().map(|(_, k)| *k).collect();
    for id in updated.iter().chain([&inserted, &deleted]) {
        assert!(!planted.contains(id), "{id} is planted");
    }
    let writes = format!(
        "UPDATE orders SET note = 'in flight' WHERE id IN ({});\nINSERT INTO orders VALUES {};\nDELETE FROM orders WHERE id = {deleted};\n",
        updated.map(|i| i.to_string()).join(", "),
        row(inserted, false)
    );
    db::postgres().exec(Some(db_name), &writes);
    let spec = format!(
        "{}confirm: {{ after: 4s, rounds: 1 }}\n",
        spec("quantile", "with_keys")
    );
    let (out, stderr) = run_replicating(&d, &spec, db_name, writes);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(differences(&j), expected(&p), "{stderr}");
    assert_eq!(
        j["in_flight"],
        serde_json::json!({"missing_in_target": 1, "extra_in_target": 1, "changed": 5}),
        "{stderr}"
    );
    assert_eq!(j["difference_counts"]["changed"], 3);
    // the in-flight rows' keys never left the agents: each side released exactly the
    // keys of its persistent differences (source: missing and changed; target: extra)
    for (agent, want) in [(&d.agents[0], 5), (&d.agents[1], 2)] {
        let log = std::fs::read_to_string(&agent.release_log).unwrap();
        let released: u64 = log
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|l| l["rpc"] == "RevealKeys" && l["outcome"] == "ok")
            .map(|l| l["released"]["rows"].as_u64().unwrap())
            .sum();
        assert_eq!(released, want, "{}: rows revealed", agent.name);
    }
    assert!(stderr.contains("agree now (in flight)"), "{stderr}");
}

/// Confirm rounds at count_only: the same writes in flight as above, applied while the
/// run waits; the segments that held only in-flight rows agree again and leave
/// `leaves` (counted in `in_flight_leaves`), every segment holding a planted difference
/// stays, and no row or key was asked of either agent.
#[test]
fn confirm_rounds_at_count_only_drop_the_segments_that_agree_again() {
    let p = plant();
    let db_name = "e2e_confirm_counts";
    let d = deploy(db_name, Some(&p), OPEN, OPEN);
    let k = keys();
    // rows far from every planted key, so their segments hold nothing else that differs
    let updated = [k[2_500], k[6_500], k[12_000]];
    let planted: Vec<i64> = expected(&p).iter().map(|(_, k)| *k).collect();
    let writes = format!(
        "UPDATE orders SET note = 'in flight' WHERE id IN ({});\n",
        updated.map(|i| i.to_string()).join(", ")
    );
    db::postgres().exec(Some(db_name), &writes);
    let spec = format!(
        "{}confirm: {{ after: 4s, rounds: 1 }}\n",
        spec("quantile", "count_only")
    );
    let (out, stderr) = run_replicating(&d, &spec, db_name, writes);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let j: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["in_flight_leaves"], 3, "{stderr}");
    let holds = |leaf: &Value, id: i64| {
        let lo = leaf["bounds"]["lower"][0].as_i64().unwrap_or(i64::MIN);
        let hi = leaf["bounds"]["upper"][0].as_i64().unwrap_or(i64::MAX);
        lo <= id && id < hi
    };
    let leaves = j["leaves"].as_array().unwrap();
    for leaf in leaves {
        assert!(
            planted.iter().any(|id| holds(leaf, *id)),
            "a leaf without a planted key stayed: {leaf}"
        );
    }
    for id in &planted {
        assert!(leaves.iter().any(|l| holds(l, *id)), "planted {id} is in no leaf");
    }
    for id in updated {
        assert!(
            !leaves.iter().any(|l| holds(l, id)),
            "in-flight {id} stayed a leaf"
        );
    }
    for a in &d.agents {
        let log = std::fs::read_to_string(&a.release_log).unwrap();
        assert!(
            !log.contains("\"RowDigests\"") && !log.contains("\"RevealKeys\""),
            "{}",
            a.name
        );
    }
}
