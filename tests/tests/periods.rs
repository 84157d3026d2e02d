//! Whole-system: `strategy: time` over times beyond the ISO calendar (PostgreSQL
//! infinities, BC and expanded years), real agents over mutual TLS. One side hashes in
//! SQL and the other in-process, so every period label is computed by both (F3/F4 of
//! issue 31: a label computed differently in SQL and in the agent put rows in no
//! period, or failed the run).

use std::collections::BTreeSet;

use tally_e2e::db;
use tally_e2e::zones::{Deployment, differences};

/// 400 rows: ordinary times across year ends, and every 10th row beyond the calendar.
fn events_sql(changed: &[i64]) -> String {
    let odd = [
        "infinity",
        "-infinity",
        "0010-06-01 12:00:00 BC",
        "0001-01-01 00:00:00 BC",
        "10000-01-01 00:00:00",
    ];
    let mut sql =
        "DROP TABLE IF EXISTS events;\nCREATE TABLE events (id BIGINT PRIMARY KEY, at TIMESTAMP, v INT);\n"
            .to_string();
    let vals: Vec<String> = (1..=400i64)
        .map(|id| {
            let at = if id % 10 == 0 {
                odd[(id / 10) as usize % odd.len()].to_string()
            } else {
                format!("2020-12-{:02} {:02}:00:00", 20 + id % 12, id % 24)
            };
            let v = if changed.contains(&id) { id + 1 } else { id };
            format!("({id}, '{at}', {v})")
        })
        .collect();
    sql.push_str(&format!("INSERT INTO events VALUES {};\n", vals.join(", ")));
    sql
}

#[test]
fn time_periods_beyond_the_calendar_find_exactly_the_changed_rows() {
    let pg = db::postgres();
    let src = pg.create_database("periods_src");
    let tgt = pg.create_database("periods_tgt");
    // an infinity, a BC, an expanded-year and an ordinary row changed
    let changed = [10, 30, 50, 7];
    pg.exec(Some("periods_src"), &events_sql(&[]));
    pg.exec(Some("periods_tgt"), &events_sql(&changed));
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    let policy = "{ max_level: with_keys, time_columns: [at] }";
    d.start_agent(
        "dc1",
        "events",
        &format!("{{ url: '{src}', table: events, key: [id], policy: {policy}, hashing: pushdown }}"),
    );
    d.start_agent(
        "vpc2",
        "events",
        &format!("{{ url: '{tgt}', table: events, key: [id], policy: {policy}, hashing: in_process }}"),
    );
    let want: BTreeSet<(String, i64)> = changed.iter().map(|k| ("changed".to_string(), *k)).collect();
    for g in ["week", "quarter", "year"] {
        let spec = format!(
            "name: periods\nsource: {{ agent: dc1, dataset: events }}\ntarget: {{ agent: vpc2, dataset: events }}\n\
             bisection: {{ strategy: time, factor: 4, threshold: 20, time_column: at, time_granularity: {g} }}\n\
             reporting: {{ level: with_keys }}\n"
        );
        let out = d.run(&spec);
        assert_eq!(out.code, 1, "{g}: {}\n{}", out.stdout, out.stderr);
        let j = &out.json;
        assert_eq!(j["verdict"], "differ", "{g}");
        assert_eq!(differences(j), want, "{g}: {j}");
    }
}

/// F14 of issue 31: under `strategy: time` a key the source holds once (period A) and
/// the target twice (the same row in period A, a copy with another time in period B)
/// is `changed` with `duplicates: {source: 1, target: 2}`, never `extra_in_target`:
/// the source holds the key. Period A's segments match, so only period B reveals the
/// key; its classification must look at the key in every period.
#[test]
fn a_key_repeated_on_the_target_in_another_period_is_changed_with_its_copies() {
    let pg = db::postgres();
    let src = pg.create_database("periodkeys_src");
    let tgt = pg.create_database("periodkeys_tgt");
    let table = |copy: bool| {
        let mut sql = "DROP TABLE IF EXISTS events;\nCREATE TABLE events (id BIGINT, at TIMESTAMP, v INT);\n"
            .to_string();
        let vals: Vec<String> = (1..=2000i64)
            .map(|id| {
                format!(
                    "({id}, '2021-01-01 00:00:00'::timestamp + {} * interval '1 hour', {id})",
                    id * 5
                )
            })
            .collect();
        sql.push_str(&format!("INSERT INTO events VALUES {};\n", vals.join(", ")));
        if copy {
            // key 1423 again, 40 days later (another day, week and month)
            sql.push_str(
                "INSERT INTO events SELECT id, at + interval '40 days', v FROM events WHERE id = 1423;\n",
            );
        }
        sql
    };
    pg.exec(Some("periodkeys_src"), &table(false));
    pg.exec(Some("periodkeys_tgt"), &table(true));
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    let policy = "{ max_level: with_keys, time_columns: [at] }";
    d.start_agent(
        "dc1",
        "events",
        &format!("{{ url: '{src}', table: events, key: [id], policy: {policy}, hashing: pushdown }}"),
    );
    d.start_agent(
        "vpc2",
        "events",
        &format!("{{ url: '{tgt}', table: events, key: [id], policy: {policy}, hashing: auto }}"),
    );
    for g in ["day", "week", "month"] {
        let spec = format!(
            "name: periodkeys\nsource: {{ agent: dc1, dataset: events }}\ntarget: {{ agent: vpc2, dataset: events }}\n\
             bisection: {{ strategy: time, factor: 4, threshold: 20, time_column: at, time_granularity: {g} }}\n\
             reporting: {{ level: with_keys }}\n"
        );
        let out = d.run(&spec);
        assert_eq!(out.code, 1, "{g}: {}\n{}", out.stdout, out.stderr);
        let j = &out.json;
        assert_eq!(j["verdict"], "differ", "{g}");
        let want: BTreeSet<(String, i64)> = [("changed".to_string(), 1423)].into();
        assert_eq!(differences(j), want, "{g}: {j}");
        let diff = &j["differences"][0];
        assert_eq!(diff["duplicates"]["source"], 1, "{g}: {j}");
        assert_eq!(diff["duplicates"]["target"], 2, "{g}: {j}");
        assert_eq!(j["difference_counts"]["changed"], 1, "{g}: {j}");
        assert_eq!(j["difference_counts"]["extra_in_target"], 0, "{g}: {j}");
    }
}
