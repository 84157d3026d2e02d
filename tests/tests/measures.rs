//! Comparison mode measures (issue 14): PostgreSQL (source) against MariaDB (target),
//! each behind its own agent over mutual TLS. A broken backfill got most amounts of one
//! region's load on one day wrong, two thirds of the table, spread over every key range:
//! a checksum drill finds most segments differing and stops with advice, while measures
//! names the one group in two levels (one query per side each).

use tally_e2e::db;
use tally_e2e::zones::{Deployment, RunOutput};

const N: i64 = 20_000;
const BROKEN_REGION: &str = "EU";
const BROKEN_DAY: &str = "2026-11-02";

/// Region of a row, by a hash of its id: most rows are `EU`; `eu` (lower case) is a
/// region of its own, which a case-insensitive collation would merge with `EU` if the
/// database grouped it.
fn region(id: i64) -> &'static str {
    match (id * 2_654_435_761) % 100 {
        0..80 => "EU",
        80..90 => "AMER",
        90..97 => "APAC",
        _ => "eu",
    }
}

/// Day of a row: nine in ten EU rows were loaded on the backfill's day.
fn day(id: i64) -> String {
    let d = if region(id) == "EU" {
        if (id * 40_503) % 10 < 9 { 2 } else { 3 }
    } else {
        1 + id % 3
    };
    format!("2026-11-{d:02}")
}

/// The backfill got nine in ten of its rows wrong: about two thirds of the table,
/// spread over every key range.
fn broken(id: i64) -> bool {
    region(id) == BROKEN_REGION && day(id) == BROKEN_DAY && id % 10 != 0 && amount_set(id)
}

/// One row in 13 has no amount (NULL: the backfill left those alone).
fn amount_set(id: i64) -> bool {
    id % 13 != 0
}

fn orders_sql(mariadb: bool, backfill_broken: bool) -> String {
    let (ts, text) = if mariadb {
        ("DATETIME(6)", "VARCHAR(10) CHARACTER SET utf8mb4")
    } else {
        ("timestamp(6)", "varchar(10)")
    };
    let mut sql = format!(
        "DROP TABLE IF EXISTS orders;\nCREATE TABLE orders (id BIGINT PRIMARY KEY, region {text} NOT NULL, \
         created_at {ts} NOT NULL, amount DECIMAL(12,2), qty INT NOT NULL, note {text});\n"
    );
    for chunk in (1..=N).collect::<Vec<_>>().chunks(2000) {
        let vals: Vec<String> = chunk
            .iter()
            .map(|&id| {
                let cents = (id * 7919) % 100_000 + if backfill_broken && broken(id) { 1_000 } else { 0 };
                let amount = if !amount_set(id) {
                    "NULL".to_string()
                } else {
                    format!("{}.{:02}", cents / 100, cents % 100)
                };
                format!(
                    "({id}, '{}', '{} {:02}:{:02}:00.{:06}', {amount}, {}, 'n{}')",
                    region(id),
                    day(id),
                    id % 24,
                    id % 60,
                    id % 1_000_000,
                    id % 9,
                    id % 5
                )
            })
            .collect();
        sql.push_str(&format!("INSERT INTO orders VALUES {};\n", vals.join(", ")));
    }
    sql
}

/// Both agents list `region` for groups, `created_at` for periods, and `amount` (not
/// `qty`) as a measure released in clear.
fn deploy(db_name: &str) -> Deployment {
    let pg = db::postgres();
    let my = db::mariadb();
    let pg_url = pg.create_database(db_name);
    let my_url = my.create_database(db_name);
    pg.exec(Some(db_name), &orders_sql(false, false));
    pg.exec(Some(db_name), "ANALYZE orders;");
    my.exec(Some(db_name), &orders_sql(true, true));
    let policy = "{ max_level: with_keys, time_columns: [created_at], group_columns: [region], measures: [amount], \
                  max_reveal_rows: 100000, max_reveal_rows_per_hour: 100000 }";
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent(
        "dc1",
        "orders",
        &format!("{{ url: '{pg_url}', table: orders, key: [id], policy: {policy} }}"),
    );
    d.start_agent(
        "vpc2",
        "orders",
        &format!("{{ url: '{my_url}', table: orders, key: [id], policy: {policy} }}"),
    );
    d
}

fn spec(extra: &str) -> String {
    format!(
        "name: backfill\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: vpc2, dataset: orders }}\n{extra}"
    )
}

const MEASURES: &str =
    "mode: measures\ngroup_by: [region, { column: created_at, granularity: day }]\nmeasures: [amount, qty]\n";

fn queries(out: &RunOutput) -> u64 {
    out.json["source"]["queries"].as_u64().unwrap() + out.json["target"]["queries"].as_u64().unwrap()
}

#[test]
fn measures_localise_a_broken_backfill_where_the_drill_degenerates() {
    let d = deploy("measures_backfill");
    let broken_rows = (1..=N).filter(|id| broken(*id)).count();

    // the checksum drill: most segments differ, it stops and names the measures spec
    let drill = d.run(&spec("bisection: { factor: 32, threshold: 16 }\n"));
    assert_eq!(drill.code, 1, "{}\n{}", drill.stdout, drill.stderr);
    let advice = drill.json["advice"].as_str().unwrap_or_default();
    assert!(
        advice.contains("mode: measures")
            && advice.contains("group_by: [region, { column: created_at, granularity: day }]")
            && advice.contains("measures: [amount, qty]"),
        "{advice}\n{}",
        drill.stdout
    );
    // at with_keys the degenerate drill's leaves all go to the rows phase
    let rows = d.run(&spec(
        "bisection: { factor: 32, threshold: 16 }\nreporting: { level: with_keys, sample_limit: 100000 }\n",
    ));
    assert_eq!(rows.code, 1, "{}\n{}", rows.stdout, rows.stderr);
    assert_eq!(
        rows.json["difference_counts"]["changed"], broken_rows as u64,
        "{} {} {}",
        rows.json["warnings"], rows.json["levels"], rows.json["truncated"]
    );

    let out = d.run(&spec(MEASURES));
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    eprintln!(
        "broken rows {broken_rows}; queries: measures {}, degenerate drill {} (count_only, stopped), {} with its \
         rows phase (with_keys) and {} RowDigests and RevealKeys calls",
        queries(&out),
        queries(&drill),
        queries(&rows),
        rows_phase_calls(&d)
    );
    assert_eq!(queries(&out), 4, "two levels, one query per side each");
    let groups = out.json["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:#?}");
    let g = &groups[0];
    assert_eq!(g["group"][0]["value"], BROKEN_REGION);
    assert_eq!(g["group"][1]["value"], BROKEN_DAY);
    assert_eq!(g["group"][1]["granularity"], "day");
    assert_eq!(g["differing"], serde_json::json!(["amount"]));
    assert_eq!(g["source"]["count"], g["target"]["count"]);
    // amount in clear on both sides, qty (no policy lists it) only as sealed equality
    let (sa, ta) = (&g["source"]["measures"][0], &g["target"]["measures"][0]);
    assert_eq!(sa["name"], "amount");
    assert!(
        sa["values"]["sum"].is_string() && sa["values"]["sum"] != ta["values"]["sum"],
        "{g}"
    );
    assert_eq!(g["source"]["measures"][1]["sealed"], true);
    assert!(g["source"]["measures"][1].get("values").is_none());
    // level 1: four regions (`eu` apart from `EU`, bytewise on both engines), one diverges
    assert_eq!(out.json["levels"][0]["segments"], 4);
    assert_eq!(out.json["levels"][0]["differing"], 1);
    assert_eq!(out.json["levels"][1]["segments"], 2, "only EU's days are asked");
    assert_eq!(out.json["source"]["count"], N);
    // the target agent released qty's values to nobody: its release log says so
    let log = std::fs::read_to_string(&d.agents[1].release_log).unwrap();
    let line = log.lines().rfind(|l| l.contains("\"rpc\":\"Measures\"")).unwrap();
    assert!(line.contains("\"clear\":[true,false]"), "{line}");
    assert!(out.stdout.contains("\"sealed\": true"));

    // within a tolerance larger than the damage, the group agrees, reported as such
    let out = d.run(&spec(&format!("{MEASURES}tolerance: {{ amount: 200000 }}\n")));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["tolerated_groups"], 1);
    assert_eq!(out.json["groups"][0]["tolerated"], serde_json::json!(["amount"]));
    // a tolerance on qty cannot be honoured (sealed): refused before any scan
    let out = d.run(&spec(&format!("{MEASURES}tolerance: {{ qty: 1 }}\n")));
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert!(
        out.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tolerance.qty")
    );
    // grouping by a column no policy lists: refused, naming the key
    let out = d.run(&spec("mode: measures\ngroup_by: [note]\nmeasures: [amount]\n"));
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert_eq!(out.json["error"]["code"], "policy_refused");
    assert!(
        out.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("group_columns")
    );
}

/// RowDigests and RevealKeys calls both agents answered (their `ok` lines).
fn rows_phase_calls(d: &Deployment) -> usize {
    d.agents
        .iter()
        .map(|a| {
            std::fs::read_to_string(&a.release_log)
                .unwrap()
                .lines()
                .filter(|l| l.contains("\"rpc\":\"RowDigests\"") || l.contains("\"rpc\":\"RevealKeys\""))
                .filter(|l| l.contains("\"outcome\":\"ok\""))
                .count()
        })
        .sum()
}
