//! Refused TLS handshakes between the coordinator and an agent, with the real `tally`
//! and `tally-agent` binaries and certificates made here: the agent logs each refusal
//! with its reason, and the run's error names the same cause.

use std::time::Duration;

use tally_common::pki::{Ca, Pem, Role};
use tally_e2e::zones::Deployment;

/// Two agents over one SQLite table (nothing to reconcile: the handshake is the test).
fn deployment() -> Deployment {
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    let db = d.path().join("t.db");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection;
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'b');",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    });
    let dataset = format!("{{ url: 'sqlite://{}', table: t, key: [id] }}", db.display());
    d.start_agent("dc1", "t", &dataset);
    d.start_agent("vpc2", "t", &dataset);
    d
}

const SPEC: &str = "name: tls\nsource: { agent: dc1, dataset: t }\ntarget: { agent: vpc2, dataset: t }\n";

fn present(d: &Deployment, leaf: &Pem) {
    std::fs::write(d.path().join("certs/coordinator.pem"), &leaf.cert).unwrap();
    std::fs::write(d.path().join("certs/coordinator-key.pem"), &leaf.key).unwrap();
}

/// The agent's log lines about refused handshakes.
fn refusals(d: &Deployment, agent: &str) -> Vec<String> {
    std::fs::read_to_string(d.path().join(format!("{agent}.log")))
        .unwrap()
        .lines()
        .filter(|l| l.contains("TLS handshake refused"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_refused_client_certificate_is_logged_with_its_reason_and_the_run_names_it() {
    let d = deployment();
    let genuine = (
        std::fs::read_to_string(d.path().join("certs/coordinator.pem")).unwrap(),
        std::fs::read_to_string(d.path().join("certs/coordinator-key.pem")).unwrap(),
    );
    let ca = Ca::from_pem(
        &std::fs::read_to_string(d.path().join("certs/ca.pem")).unwrap(),
        &std::fs::read_to_string(d.path().join("certs/ca-key.pem")).unwrap(),
    )
    .unwrap();
    // the genuine coordinator certificate: the run goes through, nothing refused
    let r = d.run(SPEC);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(refusals(&d, "dc1").is_empty());

    let now = time::OffsetDateTime::now_utc();
    let other_ca = Ca::generate("other-ca").unwrap();
    let cases = [
        (
            "unknown CA",
            other_ca.issue("coordinator", Role::Client, &[]).unwrap(),
            "TLS handshake refused: unknown CA: the agent does not trust the coordinator's certificate",
        ),
        (
            "expired",
            ca.issue_valid(
                "coordinator",
                Role::Client,
                now - time::Duration::days(30),
                now - time::Duration::days(1),
            )
            .unwrap(),
            "TLS handshake refused: expired: the agent refused the coordinator's certificate (tls.cert) as expired",
        ),
        (
            "wrong usage",
            ca.issue("coordinator", Role::Server, &[]).unwrap(),
            "TLS handshake refused: wrong usage: the agent refused the coordinator's certificate",
        ),
    ];
    for (class, leaf, said) in cases {
        present(&d, &leaf);
        let before = refusals(&d, "dc1").len();
        let r = d.run(SPEC);
        assert_eq!(r.code, 2, "{class}: {}\n{}", r.stdout, r.stderr);
        assert_eq!(
            r.json["error"]["code"], "agent_unreachable",
            "{class}: {}",
            r.stdout
        );
        let message = r.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(said), "{class}: {message}");
        // never another class's cause
        for other in CLASSES.iter().filter(|c| **c != class) {
            assert!(!message.contains(&format!("{other}:")), "{class}: {message}");
        }
        if class == "expired" {
            let not_after = tally_common::pki::pem_not_after(leaf.cert.as_bytes()).unwrap();
            assert!(message.contains(&format!("notAfter {not_after}")), "{message}");
        }
        // the agent's log line: WARN, the remote address and the class
        std::thread::sleep(Duration::from_millis(200));
        let lines = refusals(&d, "dc1");
        let new = &lines[before..];
        assert!(!new.is_empty(), "{class}: dc1 logged no refusal");
        for l in new {
            assert!(
                l.contains("WARN")
                    && l.contains("remote=127.0.0.1:")
                    && l.contains(&format!("reason={class}")),
                "{class}: {l}"
            );
        }
    }
    // a certificate of the agents' CA whose name is not in allowed_clients: through the
    // handshake, and refused by name (the agent reads the verified certificate per call)
    present(&d, &ca.issue("intruder", Role::Client, &[]).unwrap());
    let before = refusals(&d, "dc1").len();
    let r = d.run(SPEC);
    assert_eq!(r.json["error"]["code"], "policy_refused", "{}", r.stdout);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"intruder\" is not in this agent's tls.allowed_clients"),
        "{message}"
    );
    assert_eq!(refusals(&d, "dc1").len(), before);

    // the coordinator trusting another CA: it refuses the agent's certificate, says so,
    // and the agent logs that its own certificate was refused
    present(
        &d,
        &Pem {
            cert: genuine.0,
            key: genuine.1,
        },
    );
    std::fs::write(d.path().join("certs/ca.pem"), &other_ca.pem.cert).unwrap();
    let before = refusals(&d, "dc1").len();
    let r = d.run(SPEC);
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, r.stderr);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("TLS handshake refused: unknown CA: the agent's certificate is not signed by a CA in the coordinator's tls.ca"),
        "{message}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let lines = refusals(&d, "dc1");
    assert!(
        lines[before..]
            .iter()
            .any(|l| l.contains("reason=other: the client refused this agent's certificate")),
        "{lines:?}"
    );
}

/// The agent's classes of refusal, which the run's error starts its cause with.
const CLASSES: [&str; 4] = ["unknown CA", "expired", "wrong usage", "no client certificate"];
