//! Live data (issue 14): reconciliations of real replicas while a writer keeps changing
//! the source. A MariaDB GTID replica of a MariaDB primary (kept 3 s behind with
//! `MASTER_DELAY`), and a PostgreSQL logical-replication subscriber of a publisher,
//! each started by the test from the binaries on the machine, each side behind its own
//! `tally-agent`, mutual TLS. Every test plants persistent differences on the replica
//! (two changed rows, a missing one, an extra one) and asserts that exactly those are
//! reported; a control run without the feature under test shows the writes in flight
//! do show up as false differences, so the feature is what removes them.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tally_e2e::db::Server;
use tally_e2e::proc::ChildGuard;
use tally_e2e::replication::{MariaDbPair, PgLogicalPair};
use tally_e2e::zones::{Deployment, RunOutput, differences, parse_run};

/// Rows 1..=N at the start.
const N: i64 = 20_000;
/// Planted on the replica: changed, missing, extra. The writers never touch them.
const CHANGED: [i64; 2] = [101, 9_001];
const MISSING: i64 = 4_322;
const EXTRA: i64 = 500_000;
/// Rows the writers insert start here.
const NEW: i64 = 1_000_000;

fn planted() -> BTreeSet<(String, i64)> {
    let mut p: BTreeSet<(String, i64)> = CHANGED.iter().map(|k| ("changed".to_string(), *k)).collect();
    p.insert(("missing_in_target".into(), MISSING));
    p.insert(("extra_in_target".into(), EXTRA));
    p
}

fn planted_list() -> String {
    let mut ids: Vec<String> = CHANGED.iter().map(i64::to_string).collect();
    ids.push(MISSING.to_string());
    ids.join(", ")
}

/// The replica delay of the shared MariaDB pair: every change is applied this long
/// after the primary committed it.
const DELAY_SECS: u32 = 3;

fn mariadb_pair() -> &'static MariaDbPair {
    static P: OnceLock<MariaDbPair> = OnceLock::new();
    P.get_or_init(|| MariaDbPair::start(DELAY_SECS))
}

/// `events` with N old rows (`at` in January 2026), as SQL for `mariadb` or PostgreSQL.
fn schema(mariadb: bool) -> String {
    let ts = if mariadb { "DATETIME(6)" } else { "timestamp(6)" };
    format!(
        "CREATE TABLE events (id BIGINT PRIMARY KEY, v VARCHAR(40) NOT NULL, n INT NOT NULL, at {ts} NOT NULL);\n"
    )
}

fn rows_sql(mariadb: bool) -> String {
    let mut sql = String::new();
    for chunk in (1..=N).collect::<Vec<_>>().chunks(2000) {
        let vals: Vec<String> = chunk
            .iter()
            .map(|id| {
                let at = if mariadb {
                    format!("'2026-01-01 00:00:00' + INTERVAL {id} SECOND")
                } else {
                    format!("timestamp '2026-01-01 00:00:00' + interval '{id} seconds'")
                };
                format!("({id}, 'row {}', {}, {at})", id % 97, id % 13)
            })
            .collect();
        sql.push_str(&format!("INSERT INTO events VALUES {};\n", vals.join(", ")));
    }
    sql
}

/// The persistent differences, written on the replica itself.
fn plant_sql() -> String {
    format!(
        "UPDATE events SET v = 'planted' WHERE id IN ({}, {});\nDELETE FROM events WHERE id = {MISSING};\n\
         INSERT INTO events VALUES ({EXTRA}, 'extra', 0, '2026-01-02 00:00:00');\n",
        CHANGED[0], CHANGED[1]
    )
}

/// A writer's loop body for iteration `i`: a new row; with `touch`, also an update of
/// an odd-keyed row and (every fifth time) a delete of an even-keyed one. The updated
/// and deleted keys run through a permutation, so no row is written twice while a test
/// lasts (a row that kept changing would differ at every read, in flight or not).
fn writer_statements(touch: bool, now: &str) -> Vec<String> {
    let mut s = vec![format!("INSERT INTO events VALUES ({NEW} + i, 'new', 0, {now})")];
    if touch {
        let planted = planted_list();
        s.push(format!(
            "UPDATE events SET n = n + 1, v = 'updated', at = {now} WHERE id = 2 * MOD(i * 7919, {half}) + 1 \
             AND id NOT IN ({planted})",
            half = N / 2
        ));
        s.push(format!(
            "DELETE FROM events WHERE MOD(i, 5) = 0 AND id = 2 * MOD(i * 7919 + 17, {half}) + 2 AND id NOT IN ({planted})",
            half = N / 2
        ));
    }
    s
}

/// A MariaDB writer: a stored procedure looping about every 10 ms, each statement its
/// own transaction.
fn mariadb_writer(primary: &Server, db: &str, touch: bool) -> ChildGuard {
    let body: String = writer_statements(touch, "UTC_TIMESTAMP(6)")
        .iter()
        .map(|s| format!("    {s};\n"))
        .collect();
    primary.exec(
        Some(db),
        &format!(
            "DROP PROCEDURE IF EXISTS writer;\nDELIMITER //\nCREATE PROCEDURE writer()\nBEGIN\n  DECLARE i BIGINT DEFAULT 0;\n  \
             WHILE i < 6000 DO\n{body}    SET i = i + 1;\n    DO SLEEP(0.01);\n  END WHILE;\nEND //\nDELIMITER ;\n"
        ),
    );
    primary.spawn_sql(Some(db), "CALL writer();\n")
}

/// A PostgreSQL writer: a DO block committing each iteration, about every 10 ms.
fn postgres_writer(publisher: &Server, db: &str) -> ChildGuard {
    let body: String = writer_statements(true, "clock_timestamp()::timestamp")
        .iter()
        .map(|s| format!("    {};\n", s.replace("MOD(", "mod(")))
        .collect();
    publisher.spawn_sql(
        Some(db),
        &format!(
            "DO $$\nDECLARE i bigint := 0;\nBEGIN\n  WHILE i < 6000 LOOP\n{body}    COMMIT;\n    PERFORM pg_sleep(0.01);\n    \
             i := i + 1;\n  END LOOP;\nEND $$;\n"
        ),
    )
}

/// Agents `dc1` (source) and `vpc2` (target) over one `events` table each, with the
/// given watermark builtins.
fn deploy(source_url: &str, target_url: &str, source_wm: &str, target_wm: &str) -> Deployment {
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    let policy = "{ max_level: with_keys, time_columns: [at], max_reveal_rows: 100000, max_reveal_rows_per_hour: 1000000 }";
    for (agent, url, wm) in [("dc1", source_url, source_wm), ("vpc2", target_url, target_wm)] {
        d.start_agent(
            agent,
            "events",
            &format!("{{ url: '{url}', table: events, key: [id], policy: {policy}, watermark: {wm} }}"),
        );
    }
    d
}

fn spec(extra: &str) -> String {
    format!(
        "name: live\nsource: {{ agent: dc1, dataset: events }}\ntarget: {{ agent: vpc2, dataset: events }}\n\
         bisection: {{ factor: 16, threshold: 2000 }}\nreporting: {{ level: with_keys, sample_limit: 100000 }}\n{extra}"
    )
}

/// Runs `spec`, handing each progress line to `on_line` as it comes.
fn run_watching(d: &Deployment, spec: &str, mut on_line: impl FnMut(&str) + Send) -> RunOutput {
    let mut child = d.spawn_run(spec);
    let stderr = child.stderr.take().expect("stderr");
    let stdout = child.stdout.take().expect("stdout");
    let out = std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.expect("stderr line");
                on_line(&line);
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::BufReader::new(stdout), &mut text).expect("stdout");
        let status = child.wait().expect("tally run");
        (status, text, reader.join().expect("reader"))
    });
    parse_run(std::process::Output {
        status: out.0,
        stdout: out.1.into_bytes(),
        stderr: out.2.into_bytes(),
    })
}

fn in_flight_total(j: &serde_json::Value) -> u64 {
    ["missing_in_target", "extra_in_target", "changed"]
        .iter()
        .map(|k| j["in_flight"][k].as_u64().unwrap_or(0))
        .sum()
}

/// Creates `db` on the primary (it replicates), loads the rows, waits for the replica,
/// plants the differences there; the agents read the pair with its GTID watermarks.
fn mariadb_setup(db: &str) -> Deployment {
    let pair = mariadb_pair();
    let url = pair.primary.create_database(db);
    pair.primary
        .exec(Some(db), &format!("{}{}", schema(true), rows_sql(true)));
    pair.wait_caught_up();
    pair.replica.exec(Some(db), &plant_sql());
    deploy(
        &url,
        &pair.replica.url(db),
        "{ builtin: gtid_binlog_pos }",
        "{ builtin: gtid_slave_pos }",
    )
}

/// An append-only pipeline (new rows only) into a replica that is 3 s behind: a window
/// on `at` with a 1 s lag still sees rows the replica has not applied, reported as
/// missing; with `watermark: wait` the target first applies everything the source had
/// when the bound was read, and exactly the planted differences are reported.
#[test]
fn a_delayed_mariadb_replica_being_appended_to_is_reconciled_exactly_under_a_watermark_and_a_window() {
    let db = "live_append";
    let d = mariadb_setup(db);
    let _writer = mariadb_writer(&mariadb_pair().primary, db, false);
    // the control needs rows written more than the lag (1 s) and less than the delay
    // (3 s) before the bound is read: 1.5 s of writing left a band of half a second,
    // which a loaded machine's slow start of the writer could leave empty
    std::thread::sleep(Duration::from_millis(3500));

    let control = d.run(&spec("window: { column: at, lag: 1s }\n"));
    assert_eq!(control.code, 1, "{}\n{}", control.stdout, control.stderr);
    let found = differences(&control.json);
    eprintln!("control (no watermark): {} differences", found.len());
    assert!(found.is_superset(&planted()), "{found:?}");
    assert!(
        found.iter().any(|(k, id)| k == "missing_in_target" && *id >= NEW),
        "without a watermark, rows written within the replica's delay show as missing: {found:?}"
    );

    let out = d.run(&spec(
        "window: { column: at, lag: 1s, watermark: wait, timeout: 60s }\n",
    ));
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(differences(&out.json), planted(), "{}", out.stderr);
    eprintln!("watermark: positions {}", out.json["positions"]);
    let p = &out.json["positions"][0];
    assert_eq!(p["round"], 0);
    assert_eq!(p["source"]["kind"], "gtid");
    let (source, target) = (
        p["source"]["value"].as_str().unwrap(),
        p["target"]["value"].as_str().unwrap(),
    );
    let seq = |g: &str| g.rsplit('-').next().unwrap().parse::<u64>().unwrap();
    assert!(seq(target) >= seq(source), "{p}");
    // the replica really was behind: the target agent waited for it
    assert!(p["waited_ms"].as_u64().unwrap() >= 1000, "{p}");
    assert!(out.stderr.contains("watermark: source at gtid"), "{}", out.stderr);
    // both agents recorded the positions they released
    for a in &d.agents {
        let log = std::fs::read_to_string(&a.release_log).unwrap();
        let rpc = if a.name == "dc1" {
            "ReadPosition"
        } else {
            "WaitPosition"
        };
        assert!(log.contains(&format!("\"rpc\":\"{rpc}\"")), "{}: {log}", a.name);
    }
}

/// A replica 3 s behind a source that inserts, updates and deletes rows throughout:
/// without a watermark or confirm rounds the writes in flight are reported; with
/// `watermark: wait` and confirm rounds (each round waits for the target to apply the
/// source's position again), no in-flight row is reported and every planted one is.
#[test]
fn a_delayed_mariadb_replica_being_written_is_reconciled_exactly_with_confirm_rounds() {
    let db = "live_write";
    let d = mariadb_setup(db);
    let _writer = mariadb_writer(&mariadb_pair().primary, db, true);
    std::thread::sleep(Duration::from_millis(1500));

    let control = d.run(&spec(""));
    assert_eq!(control.code, 1, "{}\n{}", control.stdout, control.stderr);
    let found = differences(&control.json);
    eprintln!("control (no watermark, no confirm): {} differences", found.len());
    assert!(found.is_superset(&planted()), "{found:?}");
    assert!(
        found.len() > planted().len() + 10,
        "the writes in flight show: {found:?}"
    );

    let out = d.run(&spec(
        "window: { watermark: wait, timeout: 60s }\nconfirm: { after: 1s, rounds: 2 }\n",
    ));
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(differences(&out.json), planted(), "{}", out.stderr);
    eprintln!(
        "in flight {}, positions {}",
        out.json["in_flight"], out.json["positions"]
    );
    assert!(in_flight_total(&out.json) > 10, "{}", out.json["in_flight"]);
    let rounds: Vec<u64> = out.json["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["round"].as_u64().unwrap())
        .collect();
    assert_eq!(rounds, vec![0, 1, 2]);
}

/// A PostgreSQL logical subscriber of a publisher that inserts, updates and deletes
/// throughout. After the first watermark the subscription is stopped and the source
/// agent paused for a second, so the first pass reads the sides a second apart with
/// nothing applied in between; the subscription restarts while the confirm round
/// waits, and the round's watermark waits for it to catch up. No in-flight row is
/// reported, every planted one is.
#[test]
fn a_postgres_logical_subscriber_being_written_is_reconciled_exactly_with_watermarks_and_confirm_rounds() {
    let pair = PgLogicalPair::start();
    let db = "live_pg";
    // the table is created on both sides and subscribed empty; the rows replicate
    let sub = pair.replicate(db, &schema(false), &["events"]);
    pair.publisher.exec(Some(db), &rows_sql(false));
    pair.wait_caught_up(db);
    pair.subscriber.exec(Some(db), &plant_sql());
    let d = deploy(
        &pair.publisher.url(db),
        &pair.subscriber.url(db),
        "{ builtin: pg_wal_lsn }",
        &format!("{{ builtin: pg_subscription, subscription: {sub} }}"),
    );
    let _writer = postgres_writer(&pair.publisher, db);
    std::thread::sleep(Duration::from_millis(500));

    let source_pid = d.agents[0].guard.pid().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &source_pid]).status().unwrap();
        assert!(ok.success(), "kill {sig}");
    };
    let (mut paused, mut resumed) = (false, false);
    let out = run_watching(
        &d,
        &spec("window: { watermark: wait, timeout: 60s }\nconfirm: { after: 1s, rounds: 1 }\n"),
        |line| {
            if !paused && line.contains("watermark: target at") {
                paused = true;
                signal("-STOP");
                pair.set_enabled(db, false);
                std::thread::sleep(Duration::from_secs(1));
                signal("-CONT");
            }
            if !resumed && line.contains("confirm round 1/1: waiting") {
                resumed = true;
                pair.set_enabled(db, true);
            }
        },
    );
    assert!(paused && resumed, "{}", out.stderr);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(differences(&out.json), planted(), "{}", out.stderr);
    eprintln!(
        "in flight {}, positions {}",
        out.json["in_flight"], out.json["positions"]
    );
    assert!(in_flight_total(&out.json) > 10, "{}", out.json["in_flight"]);
    let positions = out.json["positions"].as_array().unwrap();
    assert_eq!(positions.len(), 2, "{positions:?}");
    for p in positions {
        assert_eq!(p["source"]["kind"], "lsn");
        assert!(p["target"]["value"].is_string(), "{p}");
    }
}

/// A watermark that cannot align anything is refused before any scan: a target whose
/// builtin reads its own write position (not what it applied), and a source without a
/// binary log (its GTID position never moves).
#[test]
fn watermarks_that_cannot_align_the_sides_are_refused_before_any_scan() {
    let pair = mariadb_pair();
    let db = "live_refused";
    let url = pair.primary.create_database(db);
    pair.primary
        .exec(Some(db), &format!("{}{}", schema(true), rows_sql(true)));
    pair.wait_caught_up();
    let replica = pair.replica.url(db);
    let spec = spec("window: { watermark: wait, timeout: 10s }\n");
    for (source, target, source_wm, target_wm, says) in [
        (
            &url,
            &replica,
            "gtid_binlog_pos",
            "gtid_binlog_pos",
            "builtin gtid_binlog_pos reads this server's own write position",
        ),
        (
            &replica,
            &url,
            "gtid_binlog_pos",
            "gtid_slave_pos",
            "the binary log is off (log_bin)",
        ),
    ] {
        let d = deploy(
            source,
            target,
            &format!("{{ builtin: {source_wm} }}"),
            &format!("{{ builtin: {target_wm} }}"),
        );
        let out = d.run(&spec);
        assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
        assert_eq!(out.json["error"]["code"], "watermark", "{}", out.stdout);
        let msg = out.json["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{msg}");
        for a in &d.agents {
            let log = std::fs::read_to_string(&a.release_log).unwrap();
            assert!(!log.contains("\"Aggregate\""), "{}: nothing scanned", a.name);
        }
    }
}
