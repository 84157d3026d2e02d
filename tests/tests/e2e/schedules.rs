//! Scheduled runs on a single `tally serve` with real agents: an admin puts a cron
//! schedule, the service starts each tick's run once with the schedule's spec, the
//! schedule survives a restart, a tick missed while the service was down is started
//! once (only the latest), bad input is refused naming what is wrong, and a deleted
//! schedule starts nothing more.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_e2e::https::request;
use tally_e2e::proc::{ChildGuard, free_port, wait_for_port};

use super::{ADMIN_TOKEN, OPEN, OPERATOR_TOKEN, deploy, differences, expected, plant, sha256_hex};

fn scheduled_runs(port: u16) -> BTreeSet<String> {
    let (code, list) = request(port, None, "GET", "/v1/runs", Some(OPERATOR_TOKEN), "").unwrap();
    assert_eq!(code, 200, "{list}");
    list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .filter(|id| id.ends_with("-s-every3"))
        .map(str::to_string)
        .collect()
}

fn tick_of(id: &str) -> i64 {
    i64::from_str_radix(id.split('-').next().unwrap(), 16).unwrap() / 1000
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn wait_done(port: u16, id: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
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
            return body;
        }
        assert!(code == 202, "{code}: {body}");
        assert!(Instant::now() < until, "run {id} did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_schedule_starts_each_tick_once_survives_a_restart_and_stops_when_deleted() {
    let p = plant();
    let d = deploy("e2e_schedules", Some(&p), OPEN, OPEN);
    let port = free_port();
    let text = std::fs::read_to_string(d.coordinator_config()).unwrap();
    let cfg = d.path().join("serve.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\ndata_dir: store\n{text}api:\n  tokens:\n    \
             - {{ name: ops, sha256: {}, role: operator }}\n    - {{ name: root, sha256: {}, role: admin }}\n",
            sha256_hex(OPERATOR_TOKEN),
            sha256_hex(ADMIN_TOKEN)
        ),
    )
    .unwrap();
    let start = || {
        let mut c = std::process::Command::new(tally_e2e::bins::tally());
        c.args(["serve", "--insecure-loopback", "-c"]).arg(&cfg);
        let g = ChildGuard::spawn("serve", &mut c).unwrap();
        assert!(
            wait_for_port(port, Duration::from_secs(20)),
            "tally serve did not listen"
        );
        g
    };
    let mut serve = start();
    let spec = "name: scheduled\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                reporting: { level: with_keys }\n";
    let body = |cron: &str| {
        let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
        format!("cron: '{cron}'\nspec:\n{indented}")
    };
    let put = |token: &str, name: &str, b: &str| {
        request(
            port,
            None,
            "PUT",
            &format!("/v1/schedules/{name}"),
            Some(token),
            b,
        )
        .unwrap()
    };

    // refusals name what is wrong; an operator may not schedule
    let (code, e) = put(OPERATOR_TOKEN, "every3", &body("*/3 * * * * *"));
    assert_eq!(code, 403, "{e}");
    assert!(e["error"].as_str().unwrap().contains("admin"), "{e}");
    let (code, e) = put(ADMIN_TOKEN, "every3", &body("*/3 * * * 13 *"));
    assert_eq!(code, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("month field"), "{e}");
    let (code, e) = put(ADMIN_TOKEN, "Every3", &body("*/3 * * * * *"));
    assert_eq!(code, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("schedule name"), "{e}");
    let (code, e) = put(
        ADMIN_TOKEN,
        "every3",
        &body("*/3 * * * * *").replace("agent: vpc2", "agent: nowhere"),
    );
    assert_eq!(code, 400, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("\"nowhere\" is not configured"),
        "{e}"
    );
    let (code, e) = put(ADMIN_TOKEN, "every3", "cron: '* * * * *'\nspec: {}\nextra: 1\n");
    assert_eq!(code, 400, "{e}");
    assert!(scheduled_runs(port).is_empty());

    // every 3 seconds
    let put_at = now();
    let (code, b) = put(ADMIN_TOKEN, "every3", &body("*/3 * * * * *"));
    assert_eq!(code, 201, "{b}");
    assert!(b["next"].is_string(), "{b}");
    let (code, list) = request(port, None, "GET", "/v1/schedules", Some(OPERATOR_TOKEN), "").unwrap();
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["schedules"][0]["name"], "every3", "{list}");
    assert_eq!(list["schedules"][0]["by"], "root", "{list}");

    // the same through `tally schedule`: the role is the server's to check, a spec error
    // is caught before anything is sent, a missing schedule is an error
    let server = format!("http://127.0.0.1:{port}");
    let spec_file = d.path().join("scheduled.yaml");
    std::fs::write(&spec_file, spec).unwrap();
    let cli = |token: &str, args: &[&str]| {
        let out = std::process::Command::new(tally_e2e::bins::tally())
            .arg("schedule")
            .args(args)
            .args(["--server", &server])
            .env("TALLY_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let spec_arg = spec_file.to_str().unwrap();
    let (code, _, err) = cli(OPERATOR_TOKEN, &["put", "daily", "--cron", "@daily", spec_arg]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("403") && err.contains("admin"), "{err}");
    let (code, out, err) = cli(ADMIN_TOKEN, &["put", "daily", "--cron", "@daily", spec_arg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("schedule daily created: @daily (UTC), next tick "),
        "{out}"
    );
    let (code, out, err) = cli(OPERATOR_TOKEN, &["list", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listed["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["daily", "every3"], "{out}");
    let bad = d.path().join("bad.yaml");
    std::fs::write(
        &bad,
        spec.replace("reporting: { level: with_keys }", "reporting: { level: loud }"),
    )
    .unwrap();
    let (code, _, err) = cli(
        ADMIN_TOKEN,
        &["put", "bad", "--cron", "@daily", bad.to_str().unwrap()],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("reporting.level"), "{err}");
    let (code, out, err) = cli(ADMIN_TOKEN, &["delete", "daily"]);
    assert_eq!((code, out.trim()), (Some(0), "schedule daily deleted"), "{err}");
    let (code, _, err) = cli(ADMIN_TOKEN, &["delete", "daily"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("404") && err.contains("no schedule daily"), "{err}");
    // two ticks' runs, each with the planted differences, each tick once
    let until = Instant::now() + Duration::from_secs(30);
    while scheduled_runs(port).len() < 2 {
        assert!(Instant::now() < until, "no two scheduled runs within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let first: BTreeSet<String> = scheduled_runs(port);
    for id in &first {
        let t = tick_of(id);
        assert_eq!(t % 3, 0, "{id} is not a tick of */3");
        assert!(t >= put_at, "{id}: a tick before the schedule was put");
        let doc = wait_done(port, id);
        assert_eq!(differences(&doc["result"]), expected(&p), "{id}");
    }

    // down for ~10 s: three or four ticks missed; after the restart the latest of them
    // is started once, then the schedule goes on
    serve.kill();
    let down = now();
    std::thread::sleep(Duration::from_secs(10));
    let _serve = start();
    let up = now();
    let until = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let runs = scheduled_runs(port);
        if runs.iter().any(|id| tick_of(id) > up) {
            break runs;
        }
        assert!(
            Instant::now() < until,
            "the schedule did not go on after the restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let missed: Vec<&String> = after
        .iter()
        .filter(|id| tick_of(id) > down && tick_of(id) < up)
        .collect();
    assert!(
        missed.len() <= 1,
        "missed ticks each started: {missed:?} (down {down}, up {up})"
    );
    let all_ticks: Vec<i64> = after.iter().map(|id| tick_of(id)).collect();
    let distinct: BTreeSet<i64> = all_ticks.iter().copied().collect();
    assert_eq!(all_ticks.len(), distinct.len(), "a tick started twice: {after:?}");

    // deleted: nothing more starts
    let (code, b) = request(
        port,
        None,
        "DELETE",
        "/v1/schedules/every3",
        Some(ADMIN_TOKEN),
        "",
    )
    .unwrap();
    assert_eq!(code, 200, "{b}");
    let (code, _) = request(
        port,
        None,
        "DELETE",
        "/v1/schedules/every3",
        Some(ADMIN_TOKEN),
        "",
    )
    .unwrap();
    assert_eq!(code, 404);
    let settled = scheduled_runs(port);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        scheduled_runs(port),
        settled,
        "a run started after the schedule was deleted"
    );
    for id in &settled {
        wait_done(port, id);
    }
    // the audit log names the scheduler's starts and the admin's changes
    let (code, audit) = request(port, None, "GET", "/v1/audit", Some(ADMIN_TOKEN), "").unwrap();
    assert_eq!(code, 200, "{audit}");
    let entries = audit["events"]["entries"].as_array().unwrap();
    let actions = |a: &str| entries.iter().filter(|e| e["action"] == a).count();
    // four refused and two stored (the operators' tries are refused before they are puts)
    assert_eq!(actions("put_schedule"), 6, "{audit}");
    assert!(actions("request") >= 2, "{audit}");
    // the CLI's delete and its repeat, the API's and its repeat
    assert_eq!(actions("delete_schedule"), 4, "{audit}");
    assert_eq!(actions("scheduled_run"), settled.len(), "{audit}");
}
