//! `tally-agent check` runs inside the zone, so it prints the driver's own reason a
//! database cannot be reached, where the coordinator only ever sees the error kind.

use std::path::Path;
use std::process::Command;

use tally_e2e::db;
use tally_e2e::proc::free_port;

/// Runs `tally-agent check` on a config with `datasets`; its exit code and stdout.
fn check(dir: &Path, datasets: &str) -> (Option<i32>, String) {
    let path = dir.join("agent.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0\n\
             tls: {{ ca: ca.pem, cert: a.pem, key: a-key.pem, zone_key: a-zone.key }}\n\
             datasets:\n{datasets}"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally-agent"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), stdout)
}

/// The line `check` printed for `dataset`.
fn line<'a>(stdout: &'a str, dataset: &str) -> &'a str {
    let head = format!("dataset {dataset}: ");
    stdout
        .lines()
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no line for {dataset}:\n{stdout}"))
}

#[test]
fn check_prints_the_drivers_reason_for_a_closed_port() {
    let dir = tempfile::tempdir().unwrap();
    // nothing listens there: bound and released at once
    let port = free_port();
    let (code, out) = check(
        dir.path(),
        &format!(
            "  pg: {{ url: 'postgres://tally@127.0.0.1:{port}/x', table: t, key: [id] }}\n\
             \x20 pg2: {{ url: 'postgres://tally@127.0.0.1:{port}/x', table: u, key: [id] }}\n\
             \x20 my: {{ url: 'mysql://tally@127.0.0.1:{port}/x', table: t, key: [id] }}\n\
             \x20 lite: {{ url: 'sqlite://{}', table: t, key: [id] }}\n",
            dir.path().join("missing.db").display()
        ),
    );
    assert_eq!(code, Some(2), "{out}");
    for ds in ["pg", "pg2", "my"] {
        let l = line(&out, ds).to_lowercase();
        assert!(
            l.contains("cannot connect") && l.contains("connection refused"),
            "{l}"
        );
    }
    let l = line(&out, "lite");
    assert!(
        l.contains("cannot connect") && l.contains("unable to open database file"),
        "{l}"
    );
}

#[test]
fn check_prints_too_many_clients_when_the_server_is_full() {
    use sqlx::Connection;
    let pg = db::start_postgres_with_max_connections(5);
    let url = pg.create_database("full");
    pg.exec(Some("full"), "CREATE TABLE t (id int PRIMARY KEY)");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // take every client slot the server has
    let held = rt.block_on(async {
        let mut held = Vec::new();
        while let Ok(c) = sqlx::PgConnection::connect(&url).await {
            held.push(c);
            assert!(held.len() < 50, "the server admits more clients than configured");
        }
        held
    });
    assert!(!held.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = check(
        dir.path(),
        &format!("  full: {{ url: '{url}', table: t, key: [id] }}\n"),
    );
    assert_eq!(code, Some(2), "{out}");
    let l = line(&out, "full");
    assert!(l.contains("too many clients already"), "{l}");
    // with a slot free again, the same config checks clean but for the TLS files
    rt.block_on(async {
        for c in held {
            c.close().await.unwrap();
        }
    });
    let (_, out) = check(
        dir.path(),
        &format!("  full: {{ url: '{url}', table: t, key: [id] }}\n"),
    );
    assert!(line(&out, "full").starts_with("dataset full: postgres "), "{out}");
}

/// `check --offline` on the example configs: each parses, each URL names an engine this
/// build has, and an engine no test here ran live says so.
#[test]
fn offline_check_accepts_the_example_configs_and_names_unverified_engines() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples");
    let run = |file: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_tally-agent"))
            .args(["check", "--offline", "-c"])
            .arg(examples.join(file))
            .env_remove("ORDERS_DB_URL")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = run("agent-mssql.yaml");
    assert_eq!(code, Some(0), "{out}");
    let l = line(&out, "orders");
    assert!(l.contains("mssql URL valid (not connected)"), "{out}");
    assert!(
        out.contains("warning: SQL Server support is not live-verified"),
        "{out}"
    );
    let (code, out) = run("agent-oracle.yaml");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        line(&out, "orders").contains("oracle URL valid (not connected)"),
        "{out}"
    );
    assert!(
        out.contains("warning: Oracle support is not live-verified"),
        "{out}"
    );
    // a URL from an unset variable is reported, not checked
    let (code, out) = run("agent.yaml");
    assert_eq!(code, Some(0), "{out}");
    assert!(line(&out, "orders").contains("URL not checked here"), "{out}");
}

/// A URL the engine's parser refuses fails the offline check, naming the dataset and why.
#[test]
fn offline_check_refuses_a_bad_url_naming_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\n\
         tls: { ca: ca.pem, cert: a.pem, key: a-key.pem, zone_key: a-zone.key }\n\
         datasets:\n  sales: { url: 'mssql://sa@db.internal/shop?encrypt=maybe', table: dbo.sales, key: [id] }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally-agent"))
        .args(["check", "--offline", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    let l = line(&stdout, "sales");
    assert!(l.contains("encrypt is required or off"), "{l}");
}

/// A throttled dataset's `max_load` probe runs once in `check`: a user that cannot see
/// other sessions fails the check with the grant to make, and with it the check prints
/// the load it read.
#[test]
fn check_reads_the_load_probe_and_names_a_missing_pg_monitor() {
    let pg = db::postgres();
    let url = pg.create_database("check_throttle");
    pg.exec(
        Some("check_throttle"),
        "CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY);\n\
         DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'watcher') THEN CREATE ROLE watcher LOGIN; END IF; END $$;\n\
         GRANT SELECT ON t TO watcher;",
    );
    let watcher = url.replacen("postgres@", "watcher@", 1);
    assert_ne!(watcher, url);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "  busy: {{ url: '{watcher}', table: t, key: [id], throttle: {{ max_rows_per_second: 5000, max_load: 8 }} }}\n"
    );
    let (code, out) = check(dir.path(), &config);
    assert_eq!(code, Some(2), "{out}");
    let throttle = out
        .lines()
        .find(|l| l.trim_start().starts_with("throttle:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        throttle.contains("max_rows_per_second 5000") && throttle.contains("pg_monitor"),
        "{throttle}"
    );
    pg.exec(None, "GRANT pg_monitor TO watcher;");
    let (_, out) = check(dir.path(), &config);
    pg.exec(None, "REVOKE pg_monitor FROM watcher;");
    let throttle = out
        .lines()
        .find(|l| l.trim_start().starts_with("throttle:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        throttle.contains("max_load 8 (") && throttle.contains("running now besides this agent's"),
        "{throttle}"
    );
}
