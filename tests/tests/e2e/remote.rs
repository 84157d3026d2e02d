//! `tally run SPEC --server URL` against a real `tally serve` (HTTPS, the API's own CA,
//! bearer tokens) and real agents: the same result and exit code as a local run, one
//! progress line per level, clear refusals, and Ctrl-C cancelling the run on the server.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{
    OPEN, OPERATOR_TOKEN, VIEWER_TOKEN, client_cert, deploy, differences, expected, plant, sha256_hex,
};

/// A run's printed result without what differs between two runs of one spec: timings
/// (`(N ms)` and `elapsed: N ms` in the text, every `elapsed_ms` in JSON) and, in JSON,
/// the leaves' sealed checksums (each run has its own run key).
fn comparable(stdout: &str) -> String {
    if let Ok(mut v) = serde_json::from_str::<Value>(stdout) {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    for k in ["elapsed_ms", "checksum", "xor"] {
                        m.remove(k);
                    }
                    m.values_mut().for_each(strip);
                }
                Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        strip(&mut v);
        return v.to_string();
    }
    stdout
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("elapsed:") {
                "  elapsed: _".to_string()
            } else if l.ends_with(" ms)") && l.contains(" (") {
                format!("{} (_ ms)", &l[..l.rfind(" (").unwrap()])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const DEEP: &str = "name: deep\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                    bisection: { strategy: quantile, factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n";

struct Serve {
    _guard: tally_e2e::proc::ChildGuard,
    url: String,
    dir: PathBuf,
}

impl Serve {
    /// `tally run SPEC --server URL --ca api-ca.pem` plus `args`.
    fn run(&self, spec: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(tally_e2e::bins::tally());
        c.arg("run")
            .arg(spec)
            .args(["--server", &self.url, "--ca"])
            .arg(self.dir.join("certs/api-ca.pem"))
            .args(args)
            .env_remove("TALLY_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }
}

/// `tally serve` over HTTPS on the deployment's agents, with a viewer and an operator
/// token, each also written to a file (`viewer.token`, `operator.token`).
fn serve(d: &tally_e2e::zones::Deployment) -> Serve {
    let port = tally_e2e::proc::free_port();
    let text = std::fs::read_to_string(d.coordinator_config()).unwrap();
    let cfg = d.path().join("remote-serve.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\ndata_dir: remote-store\n{text}api:\n  \
             tls: {{ cert: certs/coordinator-api.pem, key: certs/coordinator-api-key.pem, ca: certs/api-ca.pem }}\n  \
             clients: [{{ name: carol, role: operator }}]\n  \
             tokens:\n    - {{ name: dash, sha256: {}, role: viewer }}\n    - {{ name: ci, sha256: {}, role: operator }}\n",
            sha256_hex(VIEWER_TOKEN),
            sha256_hex(OPERATOR_TOKEN)
        ),
    )
    .unwrap();
    std::fs::write(d.path().join("viewer.token"), format!("{VIEWER_TOKEN}\n")).unwrap();
    std::fs::write(d.path().join("operator.token"), format!("{OPERATOR_TOKEN}\n")).unwrap();
    let log = std::fs::File::create(d.path().join("remote-serve.log")).unwrap();
    let mut c = Command::new(tally_e2e::bins::tally());
    c.args(["serve", "-c"])
        .arg(&cfg)
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let guard = tally_e2e::proc::ChildGuard::spawn("serve", &mut c).unwrap();
    assert!(
        tally_e2e::proc::wait_for_port(port, Duration::from_secs(60)),
        "tally serve did not listen"
    );
    Serve {
        _guard: guard,
        url: format!("https://127.0.0.1:{port}"),
        dir: d.path().to_path_buf(),
    }
}

fn output(mut c: Command) -> (i32, String, String) {
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tally_run_on_a_server_prints_what_a_local_run_prints_and_refuses_clearly() {
    let p = plant();
    let d = deploy("e2e_remote", Some(&p), OPEN, OPEN);
    let s = serve(&d);
    // a drill of several levels: 1024 ways first, then halves down to 2 rows
    let spec_path = d.path().join("remote-spec.yaml");
    std::fs::write(&spec_path, DEEP).unwrap();
    let operator = d.path().join("operator.token");
    let local = |json: bool| {
        let mut c = Command::new(tally_e2e::bins::tally());
        c.arg("run").arg(&spec_path).arg("-c").arg(d.coordinator_config());
        if json {
            c.arg("--json");
        }
        output(c)
    };
    for json in [false, true] {
        let (code, stdout, stderr) = local(json);
        assert_eq!(code, 1, "the data differ: {stdout}\n{stderr}");
        let mut c = s.run(&spec_path, &["--progress", "--token-file"]);
        c.arg(&operator);
        if json {
            c.arg("--json");
        }
        let (rcode, rstdout, rstderr) = output(c);
        assert_eq!(rcode, 1, "{rstdout}\n{rstderr}");
        assert_eq!(comparable(&rstdout), comparable(&stdout), "stderr: {rstderr}");
        if json {
            let j: Value = serde_json::from_str(&rstdout).unwrap();
            assert_eq!(differences(&j), expected(&p));
            // one progress line per level, in order, in a local run's shape
            let lines: Vec<&str> = rstderr.lines().filter(|l| l.contains("] level ")).collect();
            let levels = j["levels"].as_array().unwrap();
            assert!(levels.len() >= 3, "{j}");
            assert_eq!(lines.len(), levels.len(), "{rstderr}");
            for (line, l) in lines.iter().zip(levels) {
                let want = format!(
                    "level {}: {} segments, {} differing",
                    l["level"], l["segments"], l["differing"]
                );
                assert!(line.contains(&want), "{line} is not {want}");
            }
        } else {
            assert!(
                rstdout.contains("differences: 2 missing in target, 2 extra in target, 3 changed"),
                "{rstdout}"
            );
        }
    }

    // the runs, a page at a time (GET /v1/runs?limit=&cursor=&verdict=&name=): a viewer
    // may list them; two pages of one, each naming the next, then none
    let viewer = d.path().join("viewer.token");
    let runs = |args: &[&str]| {
        let mut c = Command::new(tally_e2e::bins::tally());
        c.args(["runs", "--server", &s.url, "--ca"])
            .arg(d.path().join("certs/api-ca.pem"))
            .arg("--token-file")
            .arg(&viewer)
            .args(args)
            .env_remove("TALLY_TOKEN");
        output(c)
    };
    let (mut ids, mut cursor) = (Vec::new(), None::<String>);
    for page in 0.. {
        let mut args = vec!["--limit", "1"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let (code, stdout, stderr) = runs(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(lines[0].contains("  differ   deep  "), "{stdout}");
        ids.push(lines[0].split_whitespace().next().unwrap().to_string());
        match lines.get(1) {
            Some(more) => {
                assert!(
                    more.starts_with("more (with your --ca and login flags): tally runs --server ")
                        && more.contains(" --limit 1 "),
                    "{stdout}"
                );
                cursor = Some(more.split(" --cursor ").nth(1).unwrap().to_string());
            }
            None => break,
        }
        assert!(page < 2, "more pages than runs: {ids:?}");
    }
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(
        ids[0] > ids[1] || ids[0].len() > ids[1].len(),
        "newest first: {ids:?}"
    );
    let (code, stdout, _) = runs(&["--verdict", "match"]);
    assert_eq!((code, stdout.trim()), (0, "no runs"));
    let (code, stdout, _) = runs(&["--name", "deep", "--json"]);
    assert_eq!(code, 0);
    let page: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(page["runs"].as_array().unwrap().len(), 2, "{page}");
    assert_eq!(page["next_cursor"], Value::Null);
    let (code, _, stderr) = runs(&["--verdict", "maybe"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("verdict=maybe"), "{stderr}");

    // the token from the environment; a viewer may not start runs: the role is named
    let mut c = s.run(&spec_path, &[]);
    c.env("TALLY_TOKEN", VIEWER_TOKEN);
    let (code, stdout, stderr) = output(c);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("403") && stderr.contains("the role operator"),
        "{stderr}"
    );
    // no credentials at all
    let (code, _, stderr) = output(s.run(&spec_path, &[]));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("401") && stderr.contains("--token-file"),
        "{stderr}"
    );
    // a bad spec: the server's message, naming the key
    let bad = d.path().join("bad-spec.yaml");
    std::fs::write(
        &bad,
        "name: bad\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
         bisection: { strategy: quantile, factor: sixteen }\n",
    )
    .unwrap();
    let mut c = s.run(&bad, &["--token-file"]);
    c.arg(&operator);
    let (code, stdout, stderr) = output(c);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("400") && stderr.contains("bisection.factor"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
    // a client certificate from the API's CA logs in as well (the spec is what is refused)
    let (cert, key) = client_cert(d.path(), "carol", None);
    let mut c = s.run(&bad, &["--cert"]);
    c.arg(&cert).arg("--key").arg(&key);
    let (code, _, stderr) = output(c);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("400") && stderr.contains("bisection.factor"),
        "{stderr}"
    );
    // client certificates the server refuses in the handshake: the CLI names the cause
    // of each, never one for the other
    let read = |f: &str| std::fs::read_to_string(d.path().join("certs").join(f)).unwrap();
    let api_ca = tally_common::pki::Ca::from_pem(&read("api-ca.pem"), &read("api-ca-key.pem")).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let expired = api_ca
        .issue_valid(
            "carol",
            tally_common::pki::Role::Client,
            now - time::Duration::days(30),
            now - time::Duration::days(1),
        )
        .unwrap();
    let not_after = tally_common::pki::pem_not_after(expired.cert.as_bytes()).unwrap();
    let stranger = tally_common::pki::Ca::generate("other-ca")
        .unwrap()
        .issue("carol", tally_common::pki::Role::Client, &[])
        .unwrap();
    for (pem, said, not) in [
        (
            expired,
            format!("expired: the server refused --cert as expired or not yet valid (notAfter {not_after})"),
            "unknown CA",
        ),
        (
            stranger,
            "unknown CA: the server does not trust --cert".to_string(),
            "expired",
        ),
    ] {
        let (cert, key) = (d.path().join("refused.pem"), d.path().join("refused-key.pem"));
        std::fs::write(&cert, &pem.cert).unwrap();
        std::fs::write(&key, &pem.key).unwrap();
        let mut c = s.run(&spec_path, &["--cert"]);
        c.arg(&cert).arg("--key").arg(&key);
        let (code, _, stderr) = output(c);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&said) && !stderr.contains(not), "{stderr}");
    }
    // a server certificate the given CA did not issue (the agents' CA)
    let mut c = Command::new(tally_e2e::bins::tally());
    c.arg("run")
        .arg(&spec_path)
        .args(["--server", &s.url, "--ca"])
        .arg(d.path().join("certs/ca.pem"))
        .arg("--token-file")
        .arg(&operator);
    let (code, _, stderr) = output(c);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("not trusted by --ca") && stderr.contains("ca.pem"),
        "{stderr}"
    );
    // nothing listening
    let mut c = Command::new(tally_e2e::bins::tally());
    let nowhere = format!("https://127.0.0.1:{}", tally_e2e::proc::free_port());
    c.arg("run")
        .arg(&spec_path)
        .args(["--server", &nowhere, "--ca"])
        .arg(d.path().join("certs/api-ca.pem"))
        .arg("--token-file")
        .arg(&operator);
    let (code, _, stderr) = output(c);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot connect"), "{stderr}");
    // --server runs nothing locally: a local config, data dir or resume is a usage error
    for extra in [["-c", "coordinator.yaml"], ["--data-dir", "x"]] {
        let (code, _, stderr) = output(s.run(&spec_path, &extra));
        assert_eq!(code, 2);
        assert!(stderr.contains("cannot be used with"), "{stderr}");
    }
}

#[test]
fn ctrl_c_on_tally_run_with_a_server_cancels_the_run_there() {
    let p = plant();
    let d = deploy("e2e_remote_cancel", Some(&p), OPEN, OPEN);
    let s = serve(&d);
    // a deep drill: many levels, time to interrupt it
    let spec_path = d.path().join("deep-spec.yaml");
    std::fs::write(&spec_path, DEEP).unwrap();
    let mut c = s.run(&spec_path, &["--progress", "--token-file"]);
    c.arg(d.path().join("operator.token"));
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let id = loop {
        let line = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no level within 60 s: {seen:?}"));
        seen.push(line.clone());
        if line.contains("] level ") {
            break seen
                .iter()
                .find_map(|l| l.strip_prefix("tally run: run "))
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("no run id: {seen:?}"))
                .to_string();
        }
    };
    // that level line came from the API's progress while running (the run is cancelled
    // below, so it had not finished and no result listed its levels)
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    let rest: Vec<String> = rx.iter().collect();
    assert_eq!(status.code(), Some(130), "{seen:?} {rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains(&format!("run {id} on")) && l.contains("was cancelled")),
        "{rest:?}"
    );
    // the server stores the run as cancelled
    let port: u16 = s.url.rsplit(':').next().unwrap().parse().unwrap();
    let tls = tally_e2e::https::client_config(&d.path().join("certs/api-ca.pem"), None);
    let until = Instant::now() + Duration::from_secs(30);
    let doc = loop {
        let (code, doc) = tally_e2e::https::request(
            port,
            Some(&tls),
            "GET",
            &format!("/v1/runs/{id}"),
            Some(OPERATOR_TOKEN),
            "",
        )
        .unwrap();
        if code == 200 {
            break doc;
        }
        assert!(
            Instant::now() < until,
            "the cancelled run was not stored: {code} {doc}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(doc["result"]["verdict"], "error", "{doc}");
    assert_eq!(doc["result"]["error"]["code"], "cancelled", "{doc}");
}
