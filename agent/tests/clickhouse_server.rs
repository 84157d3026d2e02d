//! The ClickHouse connector against a real server: Debian's `clickhouse-server`
//! package (18.16, installed by `.ci/run`), started here on loopback with a temp
//! directory and a user whose password comes from the environment. That server is
//! older than the dialect's floor (23.3), so what runs here is what any version must
//! do: connect, sign in (and be refused with a wrong password, without the password in
//! any error), stream a long TabSeparated result with its escapes undone, report a
//! server error by its code, and refuse the old version naming it. The dialect's SQL
//! itself runs on the embedded current engine (clickhouse_chdb.rs).
#![cfg(feature = "clickhouse")]

use std::process::{Command, Stdio};
use std::time::Duration;

use tally_agent::connector::clickhouse::ClickHouseConnector;
use tally_agent::error::AgentError;
use tally_e2e::db::reaper;
use tally_e2e::proc::{free_port, wait_for_port};

const PASSWORD: &str = "tally-ch-s3cret";

/// Starts the packaged server; its HTTP port.
// the server outlives the handle on purpose: the reaper stops it when this process ends
#[allow(clippy::zombie_processes)]
fn server() -> u16 {
    let bin = ["/usr/bin/clickhouse-server", "/usr/sbin/clickhouse-server"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!(
                "no clickhouse-server: .ci/run installs Debian's package \
                 (apt-get install --no-install-recommends clickhouse-server)"
            )
        });
    let (http, tcp) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("tally-ch-{}-{http}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    std::fs::write(
        dir.join("config.xml"),
        format!(
            "<?xml version=\"1.0\"?>\n<yandex>\n  <logger><level>warning</level><console>1</console></logger>\n  \
             <http_port>{http}</http_port>\n  <tcp_port>{tcp}</tcp_port>\n  <listen_host>127.0.0.1</listen_host>\n  \
             <path>{d}/data/</path>\n  <tmp_path>{d}/tmp/</tmp_path>\n  <user_files_path>{d}/user_files/</user_files_path>\n  \
             <format_schema_path>{d}/format_schemas/</format_schema_path>\n  <mark_cache_size>53687091</mark_cache_size>\n  \
             <users_config>users.xml</users_config>\n  <default_profile>default</default_profile>\n  \
             <default_database>default</default_database>\n  <timezone>UTC</timezone>\n</yandex>\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("users.xml"),
        format!(
            "<?xml version=\"1.0\"?>\n<yandex>\n  <profiles><default/></profiles>\n  <users>\n    <tally>\n      \
             <password>{PASSWORD}</password>\n      <networks><ip>127.0.0.1</ip></networks>\n      \
             <profile>default</profile>\n      <quota>default</quota>\n    </tally>\n  </users>\n  \
             <quotas><default/></quotas>\n</yandex>\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("server.log")).unwrap();
    let child = Command::new(bin)
        .arg(format!("--config-file={}", dir.join("config.xml").display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
    reaper(&format!(
        "kill -9 {} 2>/dev/null; sleep 1; rm -rf {d}",
        child.id()
    ));
    if !wait_for_port(http, Duration::from_secs(60)) {
        panic!(
            "clickhouse-server did not listen within 60 s: {}",
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
    }
    http
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn the_connector_signs_in_streams_reports_errors_and_refuses_a_server_below_its_floor() {
    let port = server();
    // the password from the file the URL names, never from the URL
    let pw_file = std::env::temp_dir().join(format!("tally-ch-pw-{port}"));
    std::fs::write(&pw_file, PASSWORD).unwrap();
    let var = "TALLY_TEST_CH_PASSWORD_NOT_SET";
    let url = format!(
        "clickhouse://tally@127.0.0.1:{port}/default?password_file={}",
        pw_file.display()
    );
    let ch = ClickHouseConnector::open(&url).unwrap();
    block_on(async {
        // a long result, streamed across many network reads, escapes undone
        let rows = ch
            .rows_without_settings(
                "d",
                "SELECT number, concat('t\\tn\\nb\\\\', toString(number)), NULL FROM system.numbers LIMIT 200000",
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 200_000);
        assert_eq!(
            rows[199_999],
            vec![
                Some("199999".to_string()),
                Some("t\tn\nb\\199999".to_string()),
                None
            ]
        );

        // a server error is its code's kind; the server's text stays in the zone
        let e = ch
            .rows_without_settings("d", "SELECT * FROM no_such_table")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AgentError::Query { kind, .. } if *kind == "table not found"),
            "{e:?}"
        );

        // below the floor: refused, the version named
        let e = ch.ping().await.unwrap_err();
        assert!(
            e.contains("ClickHouse 18.16") && e.contains("older than 23.3"),
            "{e}"
        );
        let e = ch.checked_version("d").await.unwrap_err().to_string();
        assert!(e.contains("18.16") && e.contains("upgrade"), "{e}");
    });

    // a wrong password: the database unavailable, and the password in no error text
    std::fs::write(&pw_file, "not-the-password").unwrap();
    let bad = ClickHouseConnector::open(&url).unwrap();
    block_on(async {
        let e = bad.rows_without_settings("d", "SELECT 1").await.unwrap_err();
        assert!(
            matches!(&e, AgentError::DatabaseUnavailable { kind, .. } if *kind == "authentication failed"),
            "{e:?}"
        );
        assert!(!format!("{e:?} {e}").contains("not-the-password"));
    });
    // a password variable that is not set is a configuration error naming it
    let e = ClickHouseConnector::open(&format!(
        "clickhouse://tally@127.0.0.1:{port}/default?password_env={var}"
    ))
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains(var), "{e}");
    let _ = std::fs::remove_file(&pw_file);
}
