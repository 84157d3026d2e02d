//! Honest passes (issue 31, step 4): PostgreSQL → MariaDB over real agents, a table
//! whose rows agree only as the run compares them (a double at scale 6, an instant
//! against a zone-less DATETIME, jsonb against LONGTEXT, `''` taken as NULL on the
//! target, a timestamp cut to precision 3 by `overrides`). The run is a `match`, and
//! its JSON, its human summary and its signed evidence statement say the fidelity was
//! reduced and name each column and why; `tally verify` checks the statement's
//! fidelity against the recorded spec and descriptions.

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tally_e2e::bins;
use tally_e2e::db;
use tally_e2e::zones::Deployment;

const PG: &str = "DROP TABLE IF EXISTS fid;
CREATE TABLE fid (id BIGINT PRIMARY KEY, price DOUBLE PRECISION, placed TIMESTAMPTZ, doc JSONB,
                  note VARCHAR(20), at TIMESTAMP(6), qty INTEGER);
INSERT INTO fid VALUES
 (1, 1.0000001, '2024-03-15 14:30:00+00', '{\"a\": 1, \"b\": [1, 2]}', NULL, '2024-01-01 10:00:00.123456', 5),
 (2, 0.1, '1969-07-20 20:17:40+00', '[]', 'x', '2024-01-01 10:00:00', 6),
 (3, -2.5, NULL, NULL, NULL, NULL, NULL);";

// each row equal to PostgreSQL's only at the run's fidelity (`doc` is MariaDB's JSON, a
// checked LONGTEXT: a plain LONGTEXT would be text parsed as JSON, which this side's
// empty_string_is_null refuses, canonical-form.md §7)
const MY: &str = "DROP TABLE IF EXISTS fid;
CREATE TABLE fid (id BIGINT PRIMARY KEY, price DOUBLE, placed DATETIME(6), doc JSON,
                  note VARCHAR(20) CHARACTER SET utf8mb4, at DATETIME(6), qty INT);
INSERT INTO fid VALUES
 (1, 1.0000002, '2024-03-15 14:30:00', '{ \"b\": [1, 2], \"a\": 1 }', '', '2024-01-01 10:00:00.123999', 5),
 (2, 0.1, '1969-07-20 20:17:40', '[ ]', 'x', '2024-01-01 10:00:00.000999', 6),
 (3, -2.5, NULL, NULL, '', NULL, NULL);";

const SPEC: &str = "name: honest\nsource: { agent: dc1, dataset: fid }\ntarget: { agent: vpc2, dataset: fid }\n\
                    reporting: { level: with_keys }\noverrides: { at: { precision: 3 } }\n";

fn deploy() -> Deployment {
    let pg = db::postgres();
    let my = db::mariadb();
    let pg_url = pg.create_database("fidelity");
    let my_url = my.create_database("fidelity");
    pg.exec(Some("fidelity"), PG);
    my.exec(Some("fidelity"), MY);
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent(
        "dc1",
        "fid",
        &format!("{{ url: '{pg_url}', table: fid, key: [id], policy: {{ max_level: with_keys }} }}"),
    );
    d.start_agent(
        "vpc2",
        "fid",
        &format!(
            "{{ url: '{my_url}', table: fid, key: [id], policy: {{ max_level: with_keys }}, empty_string_is_null: true }}"
        ),
    );
    d
}

fn tally(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(bins::tally())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("tally")
}

/// The columns below full fidelity, and each one's reason codes, from a fidelity object.
fn reduced(f: &Value) -> Vec<(String, Vec<String>)> {
    assert_eq!(f["level"], "reduced", "{f}");
    f["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| {
            (
                c["column"].as_str().unwrap().to_string(),
                c["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["code"].as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn a_match_at_reduced_fidelity_says_so_in_its_json_its_summary_and_its_evidence() {
    let d = deploy();
    let want: Vec<(String, Vec<String>)> = [
        ("price", vec!["float_scale"]),
        ("placed", vec!["cross_class"]),
        ("note", vec!["empty_string_as_null"]),
        ("at", vec!["time_precision"]),
    ]
    .into_iter()
    .map(|(c, r)| (c.to_string(), r.into_iter().map(String::from).collect()))
    .collect();

    // --json
    let out = d.run(SPEC);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let j = &out.json;
    assert_eq!(j["verdict"], "match");
    assert_eq!(reduced(&j["fidelity"]), want);
    let at = &j["fidelity"]["columns"][3]["reasons"][0];
    assert_eq!(
        at["text"], "cut to precision 3 (timestamp(6) without time zone / datetime(6))",
        "{}",
        j["fidelity"]
    );
    // qty, a plain integer pair, and the key are at full fidelity: not listed
    assert!(!out.stdout.contains("\"column\": \"qty\""), "{}", out.stdout);

    // the human summary, recorded so that its evidence can be exported
    let spec = d.path().join("honest.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    let cfg = d.coordinator_config();
    let data = d.path().join("data");
    let s = |p: &Path| p.display().to_string();
    let o = tally(
        &["run", &s(&spec), "-c", &s(&cfg), "--data-dir", &s(&data)],
        d.path(),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first
            == "honest: MATCH (fidelity reduced: price float at scale 6, placed the target's timestamp read in UTC \
                as timestamptz (timestamp with time zone / datetime(6)), \
                note '' taken as NULL on the target (empty_string_is_null), at cut to precision 3 (timestamp(6) \
                without time zone / datetime(6)))",
        "{stdout}"
    );
    let run_id = stderr
        .split("recording run ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id on stderr: {stderr}"))
        .to_string();

    // the evidence: the statement states the result's fidelity, and verify checks it
    let bundle = d.path().join("bundle.json");
    let o = tally(
        &["evidence", &run_id, "--data-dir", &s(&data), "-o", &s(&bundle)],
        d.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b: Value = serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let statement: Value = serde_json::from_slice(
        &STANDARD
            .decode(b["statement"]["payload"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let result: Value =
        serde_json::from_slice(&STANDARD.decode(b["result"].as_str().unwrap()).unwrap()).unwrap();
    // the target agent said its setting in its description, a typed field
    let described: Value = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| serde_json::from_slice::<Value>(&STANDARD.decode(e.as_str().unwrap()).unwrap()).unwrap())
        .find(|e| e["event"] == "described")
        .expect("a described event");
    assert_eq!(described["target"]["empty_string_is_null"], true);
    assert!(described["source"].get("empty_string_is_null").is_none());
    let p = &statement["predicate"];
    assert_eq!(p["verdict"], "match");
    assert_eq!(reduced(&p["fidelity"]), want);
    assert_eq!(p["fidelity"], result["fidelity"]);
    let ca = d.path().join("certs/ca.pem");
    let (code, verified) = tally_e2e::evidence::verify(&bundle, &ca);
    assert_eq!(code, 0, "{verified}");
    assert!(
        verified.contains("ok    verdict: match at reduced fidelity (price float at scale 6, "),
        "{verified}"
    );
    assert!(
        verified.contains("ok    fidelity: reduced: price float at scale 6, "),
        "{verified}"
    );
    // the same run's fidelity, stated in its JSON report too
    let o = tally(&["verify", &s(&bundle), "--ca", &s(&ca), "--json"], d.path());
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["valid"], json!(true));
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["check"] == "fidelity" && c["ok"] == true),
        "{report}"
    );
}
