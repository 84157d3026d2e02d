//! Evidence bundles (DESIGN §12, docs/evidence.md) from a real PostgreSQL → MariaDB
//! run: the bundle `tally evidence` writes verifies with `tally verify`; every part,
//! changed by one byte or swapped for another run's, makes `tally verify` exit 1
//! naming that part; and a coordinator that forges what it holds (it can re-chain its
//! log and re-sign its own statement) cannot forge what the agents signed.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tally_common::chain::{GENESIS, line_hash};
use tally_common::dsse::{AGENT_RESULT, CHECKPOINT, Envelope, IN_TOTO};
use tally_common::pki::{Ca, Role};
use tally_common::seal::TlsSigner;
use tally_e2e::bins;

use super::{OPEN, deploy, plant, spec};

/// `tally run --data-dir DIR --json SPEC`; the run id it recorded.
fn recorded_run(d: &tally_e2e::zones::Deployment, data: &Path, spec: &str) -> String {
    let spec_path = d.path().join("evidence-spec.yaml");
    std::fs::write(&spec_path, spec).unwrap();
    let out = Command::new(bins::tally())
        .arg("run")
        .arg(&spec_path)
        .arg("-c")
        .arg(d.coordinator_config())
        .arg("--json")
        .arg("--data-dir")
        .arg(data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "the planted run differs: {stderr}");
    assert!(stderr.contains("signed the run's evidence"), "{stderr}");
    stderr
        .split("recording run ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id on stderr: {stderr}"))
        .to_string()
}

fn export(data: &Path, run: &str, out: &Path) {
    let o = Command::new(bins::tally())
        .args(["evidence", run, "--data-dir"])
        .arg(data)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `tally verify FILE --ca CA`: exit code and stdout.
fn verify(bundle: &Path, ca: &Path) -> (i32, String) {
    tally_e2e::evidence::verify(bundle, ca)
}

fn b64d(s: &Value) -> Vec<u8> {
    STANDARD.decode(s.as_str().unwrap()).unwrap()
}

fn b64e(b: &[u8]) -> Value {
    json!(STANDARD.encode(b))
}

/// Flips the lowest bit of the byte at `at` of a base64 field's decoded bytes.
fn flip(field: &mut Value, at: usize) {
    let mut bytes = b64d(field);
    let at = at.min(bytes.len() - 1);
    bytes[at] ^= 1;
    *field = b64e(&bytes);
}

fn payload(env: &Value) -> Value {
    serde_json::from_slice(&b64d(&env["payload"])).unwrap()
}

fn signer(certs: &Path, name: &str) -> TlsSigner {
    TlsSigner::from_pem(&std::fs::read(certs.join(format!("{name}-key.pem"))).unwrap()).unwrap()
}

fn sign(payload_type: &str, payload: &Value, keyid: &str, key: &TlsSigner) -> Value {
    let bytes = serde_json::to_vec(payload).unwrap();
    serde_json::to_value(Envelope::sign(payload_type, &bytes, keyid, key).unwrap()).unwrap()
}

/// What a coordinator that forges its own record can do: edit the run's events (as
/// JSON), then re-chain them, list their envelopes again and re-sign the statement
/// and the checkpoint with its own key, so that everything it signs is consistent.
fn reseal(bundle: &Value, certs: &Path, edit: impl FnOnce(&mut Vec<Value>, &mut Value)) -> Value {
    let mut b = bundle.clone();
    let mut events: Vec<Value> = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| serde_json::from_slice(&b64d(e)).unwrap())
        .collect();
    let mut statement = payload(&b["statement"]);
    edit(&mut events, &mut statement);
    let mut prev = GENESIS.to_string();
    let mut lines = Vec::new();
    for (i, e) in events.iter_mut().enumerate() {
        e["seq"] = json!(i + 1);
        e["prev"] = json!(prev);
        let line = serde_json::to_string(e).unwrap();
        prev = line_hash(&line);
        lines.push(b64e(line.as_bytes()));
    }
    b["events"] = json!(lines);
    b["agent_results"] = json!(
        events
            .iter()
            .filter_map(|e| match e["event"].as_str() {
                Some("aggregated") | Some("measured") | Some("rechecked") =>
                    Some(e["response"]["envelope"].clone()),
                Some("digests") => Some(e["envelope"].clone()),
                _ => None,
            })
            .filter(|e| !e.is_null())
            .collect::<Vec<_>>()
    );
    statement["predicate"]["events_head"] = json!(prev);
    let coordinator = signer(certs, "coordinator");
    b["statement"] = sign(IN_TOTO, &statement, "coordinator", &coordinator);
    let mut cp = payload(&b["checkpoint"]);
    cp["head"] = json!(prev);
    cp["seq"] = json!(events.len());
    b["checkpoint"] = sign(CHECKPOINT, &cp, "coordinator", &coordinator);
    b
}

/// Re-signs every answer of `agent` in `events` with `key` (keyid unchanged).
fn resign_answers(events: &mut [Value], agent: &str, key: &TlsSigner) {
    for e in events.iter_mut() {
        let slot = match e["event"].as_str() {
            Some("aggregated") => &mut e["response"]["envelope"],
            Some("digests") => &mut e["envelope"],
            _ => continue,
        };
        let p = payload(slot);
        if p["agent"] == agent {
            *slot = sign(AGENT_RESULT, &p, agent, key);
        }
    }
}

/// What a forging coordinator can do to the raw text of its log: edit the event lines
/// as text (so a line may say what no JSON value can, two members of one name), then
/// re-chain them and re-sign the statement and checkpoint over the new head.
fn rechain_raw(bundle: &Value, certs: &Path, edit: impl FnOnce(&mut Vec<String>)) -> Value {
    let mut b = bundle.clone();
    let mut lines: Vec<String> = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| String::from_utf8(b64d(e)).unwrap())
        .collect();
    edit(&mut lines);
    let mut prev = GENESIS.to_string();
    for l in lines.iter_mut() {
        // found as text: an edited line need not parse (that is what some cases test)
        let at = l.find("\"prev\":\"").expect("a prev member") + "\"prev\":\"".len();
        let old = format!("\"prev\":\"{}\"", &l[at..at + 64]);
        assert!(l.contains(&old), "{l}");
        *l = l.replacen(&old, &format!("\"prev\":\"{prev}\""), 1);
        prev = line_hash(l);
    }
    b["events"] = json!(lines.iter().map(|l| b64e(l.as_bytes())).collect::<Vec<_>>());
    let coordinator = signer(certs, "coordinator");
    let mut statement = payload(&b["statement"]);
    statement["predicate"]["events_head"] = json!(prev);
    b["statement"] = sign(IN_TOTO, &statement, "coordinator", &coordinator);
    let mut cp = payload(&b["checkpoint"]);
    cp["head"] = json!(prev);
    cp["seq"] = json!(lines.len());
    b["checkpoint"] = sign(CHECKPOINT, &cp, "coordinator", &coordinator);
    b
}

/// Re-signs, with `key`, the answer payload of the first event of `events` that
/// `pick` selects, after `edit` (what an agent holding that key could sign).
fn resign_one(
    events: &mut [Value],
    pick: impl Fn(&Value) -> bool,
    key: &TlsSigner,
    edit: impl FnOnce(&mut Value),
) {
    let e = events.iter_mut().find(|e| pick(e)).expect("an answer to re-sign");
    let slot = match e["event"].as_str() {
        Some("aggregated") => &mut e["response"]["envelope"],
        _ => &mut e["envelope"],
    };
    let mut p = payload(slot);
    edit(&mut p);
    let agent = p["agent"].as_str().unwrap().to_string();
    *slot = sign(AGENT_RESULT, &p, &agent, key);
}

/// Swaps the values of `a` and `b` in a JSON object (absent stays absent).
fn swap_fields(v: &mut Value, a: &str, b: &str) {
    let o = v.as_object_mut().unwrap();
    let (x, y) = (o.remove(a), o.remove(b));
    if let Some(y) = y {
        o.insert(a.to_string(), y);
    }
    if let Some(x) = x {
        o.insert(b.to_string(), x);
    }
}

/// `bundle` with its result replaced by `result` (re-digested in the statement) and
/// its record edited by `edit`, all re-signed by the coordinator.
fn with_result(
    bundle: &Value,
    certs: &Path,
    result: &Value,
    edit: impl FnOnce(&mut Vec<Value>, &mut Value),
) -> Value {
    let bytes = serde_json::to_vec(result).unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    let mut t = reseal(bundle, certs, |ev, st| {
        edit(ev, st);
        st["subject"][0]["digest"]["sha256"] = json!(digest);
    });
    t["result"] = b64e(&bytes);
    t
}

/// The other valid ECDSA signature of the same message: DER `(r, s)` → `(r, n − s)`,
/// for P-256 and P-384 keys (the curve told by the length of `r`).
fn malleate(der: &[u8]) -> Vec<u8> {
    fn int(b: &[u8]) -> (&[u8], &[u8]) {
        assert_eq!(b[0], 0x02, "a DER INTEGER");
        let n = b[1] as usize;
        (&b[2..2 + n], &b[2 + n..])
    }
    fn enc(v: &[u8]) -> Vec<u8> {
        let mut v: Vec<u8> = v.iter().copied().skip_while(|b| *b == 0).collect();
        if v[0] & 0x80 != 0 {
            v.insert(0, 0);
        }
        let mut out = vec![0x02, v.len() as u8];
        out.extend(v);
        out
    }
    assert_eq!(der[0], 0x30, "a DER SEQUENCE");
    let (r, rest) = int(&der[2..]);
    let (s, _) = int(rest);
    let order: Vec<u8> = hex::decode(if r.len() <= 33 {
        "ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551"
    } else {
        "ffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973"
    })
    .unwrap();
    // n − s, big-endian, s left-padded to n's width
    let mut s_wide = vec![0u8; order.len()];
    let s = &s[s.len().saturating_sub(order.len())..];
    s_wide[order.len() - s.len()..].copy_from_slice(s);
    let mut diff = vec![0u8; order.len()];
    let mut borrow = 0i16;
    for k in (0..order.len()).rev() {
        let mut d = i16::from(order[k]) - i16::from(s_wide[k]) - borrow;
        borrow = i16::from(d < 0);
        if d < 0 {
            d += 256;
        }
        diff[k] = d as u8;
    }
    let body: Vec<u8> = [enc(r), enc(&diff)].concat();
    let mut out = vec![0x30, body.len() as u8];
    out.extend(body);
    out
}

fn write(dir: &Path, name: &str, b: &Value) -> PathBuf {
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, serde_json::to_vec_pretty(b).unwrap()).unwrap();
    p
}

/// The first level-1 aggregate event's index (source side) in a bundle's events.
fn level_one_source(events: &[Value]) -> usize {
    events
        .iter()
        .position(|e| e["event"] == "aggregated" && e["level"] == 1 && e["side"] == "source")
        .expect("a level-1 source aggregate")
}

#[test]
fn a_real_runs_bundle_verifies_and_every_tampered_part_is_named() {
    let p = plant();
    let d = deploy("e2e_evidence", Some(&p), OPEN, OPEN);
    let data = d.path().join("evidence-data");
    let certs = d.path().join("certs");
    let ca = certs.join("ca.pem");
    let run_a = recorded_run(&d, &data, &spec("quantile", "with_keys"));
    // the log's checkpoint after the first run; the second run's log extends it
    let audit = |args: &[&str]| {
        let o = Command::new(bins::tally())
            .arg("audit")
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let s = |p: &Path| p.display().to_string();
    let cp_a = d.path().join("cp-a.json");
    let (code, out) = audit(&["checkpoint", "--data-dir", &s(&data), "-o", &s(&cp_a)]);
    assert_eq!(code, 0, "{out}");
    // several levels (a level-2 answer is forged into level 1 below)
    let deep = "name: e2e-deep\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                bisection: { strategy: quantile, factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n\
                window: { column: created_at, as_of: '2024-06-30 23:59:59.999999' }\n";
    let run_b = recorded_run(&d, &data, deep);
    let log = d.path().join("log.jsonl");
    let (code, out) = audit(&["export", "--data-dir", &s(&data), "-o", &s(&log)]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = audit(&["verify", &s(&log), "--ca", &s(&ca), "--since", &s(&cp_a)]);
    assert_eq!(code, 0, "{out}");
    // run a's verdict rewritten and its chain re-linked: the ledger's pin of run a fails
    let mut prev = GENESIS.to_string();
    let forged: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if v["run"] != run_a.as_str() {
                return l.to_string();
            }
            if v["event"] == "finished" {
                v["verdict"] = json!("match");
            }
            v["prev"] = json!(prev);
            let line = serde_json::to_string(&v).unwrap();
            prev = line_hash(&line);
            line
        })
        .collect();
    let forged_log = d.path().join("forged.jsonl");
    std::fs::write(&forged_log, forged.join("\n")).unwrap();
    let (code, out) = audit(&["verify", &s(&forged_log), "--ca", &s(&ca), "--since", &s(&cp_a)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  ledger line 1"), "{out}");
    let (file_a, file_b) = (d.path().join("a.json"), d.path().join("b.json"));
    let t0 = std::time::Instant::now();
    export(&data, &run_a, &file_a);
    export(&data, &run_b, &file_b);
    eprintln!("exported two bundles in {:?}", t0.elapsed());

    let (code, out) = verify(&file_a, &ca);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": valid ("), "{out}");
    for check in [
        "certificates[0] (coordinator \"coordinator\")",
        "certificates[1] (agent \"dc1\")",
        "certificates[2] (agent \"vpc2\")",
        "statement signature",
        "result digest",
        "event chain",
        "checkpoint:",
        "level-1 totals",
        "verdict: differ",
    ] {
        assert!(out.contains(&format!("ok    {check}")), "{check}: {out}");
    }
    assert_eq!(verify(&file_b, &ca).0, 0);

    let a: Value = serde_json::from_slice(&std::fs::read(&file_a).unwrap()).unwrap();
    let b: Value = serde_json::from_slice(&std::fs::read(&file_b).unwrap()).unwrap();
    // the statement speaks of this run and says what the result says
    let st = payload(&a["statement"]);
    assert_eq!(st["predicate"]["run_id"], run_a.as_str());
    assert_eq!(st["predicate"]["verdict"], "differ");
    assert_eq!(st["predicate"]["source"]["agent"], "dc1");
    assert_eq!(st["predicate"]["target"]["agent"], "vpc2");
    assert_eq!(st["predicate"]["source"]["count"], super::N);
    let result: Value = serde_json::from_slice(&b64d(&a["result"])).unwrap();
    assert_eq!(result["verdict"], "differ");
    let n_events = a["events"].as_array().unwrap().len();
    let events: Vec<Value> = a["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| serde_json::from_slice(&b64d(e)).unwrap())
        .collect();
    let first_answer = events.iter().position(|e| e["event"] == "aggregated").unwrap();

    // (name, the bundle, what `tally verify` must name as the first failing check)
    type Case = (&'static str, Value, &'static str);
    let mut cases: Vec<Case> = Vec::new();
    let mut case = |name, f: &dyn Fn(&mut Value), expect| {
        let mut t = a.clone();
        f(&mut t);
        cases.push((name, t, expect));
    };
    case("a result byte", &|t| flip(&mut t["result"], 40), "result digest");
    case(
        "another run's result",
        &|t| t["result"] = b["result"].clone(),
        "result digest",
    );
    case(
        "a statement payload byte",
        &|t| flip(&mut t["statement"]["payload"], 60),
        "statement signature",
    );
    case(
        "the statement signature",
        &|t| flip(&mut t["statement"]["signatures"][0]["sig"], 20),
        "statement signature",
    );
    case(
        "another run's statement",
        &|t| t["statement"] = b["statement"].clone(),
        "result digest",
    );
    case(
        "an event line byte",
        &|t| flip(&mut t["events"][first_answer], 30),
        "event chain",
    );
    case(
        "a removed event line",
        &|t| {
            t["events"].as_array_mut().unwrap().remove(2);
        },
        "event chain",
    );
    case(
        "the last event line",
        &|t| {
            t["events"].as_array_mut().unwrap().pop();
        },
        "event chain",
    );
    case(
        "another run's event line",
        &|t| t["events"][0] = b["events"][0].clone(),
        "event chain",
    );
    case(
        "the checkpoint signature",
        &|t| flip(&mut t["checkpoint"]["signatures"][0]["sig"], 20),
        "checkpoint",
    );
    case(
        "another run's checkpoint",
        &|t| t["checkpoint"] = b["checkpoint"].clone(),
        "checkpoint",
    );
    case(
        "an agent envelope's signature",
        &|t| flip(&mut t["agent_results"][0]["signatures"][0]["sig"], 20),
        "agent_results[0]",
    );
    case(
        "an agent envelope's bucket sum",
        &|t| {
            let env = &mut t["agent_results"][0];
            let mut p = payload(env);
            let sum = p["buckets"][0]["sum"].as_str().unwrap().to_string();
            let bumped = format!("{:016x}", u64::from_str_radix(&sum, 16).unwrap().wrapping_add(1));
            p["buckets"][0]["sum"] = json!(bumped);
            env["payload"] = b64e(&serde_json::to_vec(&p).unwrap());
        },
        "agent_results[0]",
    );
    case(
        "another run's agent envelope",
        &|t| t["agent_results"][0] = b["agent_results"][0].clone(),
        "agent_results[0]",
    );
    case(
        "a missing agent envelope",
        &|t| {
            t["agent_results"].as_array_mut().unwrap().pop();
        },
        "agent_results[",
    );
    case(
        "an agent certificate byte",
        &|t| {
            let pem = t["certificates"][1]["pem"].as_str().unwrap().to_string();
            let at = pem.find('\n').unwrap() + 80;
            let mut bytes = pem.into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            t["certificates"][1]["pem"] = json!(String::from_utf8(bytes).unwrap());
        },
        "certificates[1]",
    );
    case(
        "the coordinator certificate swapped for an agent's",
        &|t| {
            t["certificates"][0]["pem"] = t["certificates"][1]["pem"].clone();
        },
        "certificates[0]",
    );
    case(
        "the format",
        &|t| t["format"] = json!("tally-evidence/0"),
        "bundle format",
    );

    // what a forging coordinator can re-sign: its own statement, its own chain
    let forger = |f: &dyn Fn(&mut Vec<Value>, &mut Value)| reseal(&a, &certs, f);
    let control = forger(&|_, _| {});
    cases.push(("(control) a re-chained, re-signed, unchanged record", control, ""));
    cases.push((
        "a level-1 bucket count changed in the event",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            let c = ev[i]["response"]["buckets"][0]["count"].as_u64().unwrap();
            ev[i]["response"]["buckets"][0]["count"] = json!(c + 1);
        }),
        "agent_results[",
    ));
    cases.push((
        "a level-1 bucket count changed in the event and in its envelope",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            let c = ev[i]["response"]["buckets"][0]["count"].as_u64().unwrap();
            ev[i]["response"]["buckets"][0]["count"] = json!(c + 1);
            let env = &mut ev[i]["response"]["envelope"];
            let mut p = payload(env);
            p["buckets"][0]["count"] = json!(c + 1);
            env["payload"] = b64e(&serde_json::to_vec(&p).unwrap());
        }),
        "agent_results[",
    ));
    cases.push((
        "totals stated for the source that its agent did not sign",
        forger(&|_, st| {
            let c = st["predicate"]["source"]["count"].as_u64().unwrap();
            st["predicate"]["source"]["count"] = json!(c + 1);
        }),
        "level-1 totals",
    ));
    cases.push((
        "a match claimed for data that differs",
        {
            let mut forged_result = result.clone();
            forged_result["verdict"] = json!("match");
            forged_result["leaves"] = json!([]);
            forged_result.as_object_mut().unwrap().remove("difference_counts");
            let bytes = serde_json::to_vec(&forged_result).unwrap();
            let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            let mut t = forger(&|_, st| {
                st["predicate"]["verdict"] = json!("match");
                st["predicate"]["leaves"] = json!(0);
                st["predicate"]["difference_counts"] = Value::Null;
                st["subject"][0]["digest"]["sha256"] = json!(digest);
            });
            t["result"] = b64e(&bytes);
            t
        },
        "verdict",
    ));
    // run b has a window: its result with the window struck out claims the whole table
    let result_b: Value = serde_json::from_slice(&b64d(&b["result"])).unwrap();
    assert_eq!(result_b["window"]["column"], "created_at");
    cases.push((
        "a window struck from a windowed run's result",
        {
            let mut forged_result = result_b.clone();
            forged_result.as_object_mut().unwrap().remove("window");
            let bytes = serde_json::to_vec(&forged_result).unwrap();
            let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            let mut t = reseal(&b, &certs, |_, st| {
                st["subject"][0]["digest"]["sha256"] = json!(digest);
            });
            t["result"] = b64e(&bytes);
            t
        },
        "level-1 totals",
    ));
    // the same, with the window also struck from the recorded spec: the agents' signed
    // window is then one the spec never asked for (an empty window could make a match)
    cases.push((
        "a window the agents read struck from the spec and the result",
        {
            let mut forged_result = result_b.clone();
            forged_result.as_object_mut().unwrap().remove("window");
            let bytes = serde_json::to_vec(&forged_result).unwrap();
            let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            let mut t = reseal(&b, &certs, |ev, st| {
                let started = ev.iter_mut().find(|e| e["event"] == "started").unwrap();
                started["spec"].as_object_mut().unwrap().remove("window");
                // as the coordinator digests a spec: SHA-256 of its RFC 8785 JSON
                let jcs = tally_common::jcs::canonical_json(&started["spec"].to_string()).unwrap();
                st["predicate"]["spec_sha256"] = json!(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                    jcs.as_bytes()
                )));
                st["subject"][0]["digest"]["sha256"] = json!(digest);
            });
            t["result"] = b64e(&bytes);
            t
        },
        "level-1 totals",
    ));
    // agents' answers signed by a certificate of another CA, with the same names
    let other = Ca::generate("a forger's CA").unwrap();
    let fake_dc1 = other.issue("dc1", Role::Server, &[]).unwrap();
    let fake_key = TlsSigner::from_pem(fake_dc1.key.as_bytes()).unwrap();
    let mut from_other_ca = forger(&|ev, _| resign_answers(ev, "dc1", &fake_key));
    from_other_ca["certificates"][1]["pem"] = json!(fake_dc1.cert);
    cases.push((
        "dc1's answers signed by another CA's dc1",
        from_other_ca.clone(),
        "certificates[1]",
    ));
    // ... and left with the real certificate
    let mut with_real_cert = from_other_ca;
    with_real_cert["certificates"][1] = a["certificates"][1].clone();
    cases.push((
        "dc1's answers signed by another CA's key",
        with_real_cert,
        "agent_results[",
    ));
    // dc1's answers signed with the other agent's (valid) key
    let vpc2_key = signer(&certs, "vpc2");
    cases.push((
        "dc1's answers signed by vpc2's certificate",
        forger(&|ev, _| resign_answers(ev, "dc1", &vpc2_key)),
        "agent_results[",
    ));
    // dc1's answers relabelled as vpc2's and signed by it: the source side then has
    // two agents
    cases.push((
        "a source answer relabelled as the target agent's",
        forger(&|ev, _| {
            for e in ev
                .iter_mut()
                .filter(|e| e["event"] == "digests" && e["side"] == "source")
                .take(1)
            {
                let mut p = payload(&e["envelope"]);
                p["agent"] = json!("vpc2");
                e["envelope"] = sign(AGENT_RESULT, &p, "vpc2", &vpc2_key);
            }
        }),
        "agent_results[",
    ));

    // one agent's answer counted for both sides: the source's level-1 answer copied as
    // the target's (the target's dropped)
    cases.push((
        "the source's level-1 answer reused as the target's",
        forger(&|ev, st| {
            ev.retain(|e| !(e["event"] == "aggregated" && e["level"] == 1 && e["side"] == "target"));
            let i = level_one_source(ev);
            let mut copy = ev[i].clone();
            copy["side"] = json!("target");
            ev.insert(i + 1, copy);
            st["predicate"]["target"] = st["predicate"]["source"].clone();
        }),
        "agent_results[",
    ));
    cases.push((
        "a second copy of the source's level-1 answer",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            let copy = ev[i].clone();
            ev.insert(i + 1, copy);
        }),
        "agent_results[",
    ));
    // the spec says one dataset, the agents signed another
    cases.push((
        "answers of another dataset than the spec's",
        forger(&|ev, st| {
            ev[0]["spec"]["target"]["dataset"] = json!("orders_copy");
            let text = tally_common::jcs::canonical_json(&ev[0]["spec"].to_string()).unwrap();
            st["predicate"]["spec_sha256"] = json!(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                text.as_bytes()
            )));
        }),
        "sides",
    ));
    // a deeper level (its answer signed as not the whole dataset) stated as level 1
    {
        let b_events: Vec<Value> = b["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| serde_json::from_slice(&b64d(e)).unwrap())
            .collect();
        assert!(
            b_events
                .iter()
                .any(|e| e["event"] == "aggregated" && e["level"] == 2 && e["side"] == "source"),
            "run b has a second level"
        );
        cases.push((
            "a level-2 answer presented as level 1",
            reseal(&b, &certs, |ev, _| {
                ev.retain(|e| !(e["event"] == "aggregated" && e["level"] == 1 && e["side"] == "source"));
                let i = ev
                    .iter()
                    .position(|e| e["event"] == "aggregated" && e["level"] == 2 && e["side"] == "source")
                    .unwrap();
                ev[i]["level"] = json!(1);
            }),
            "level-1 totals",
        ));
    }
    // an answer signed (by the real agent) long before the run: a replayed old answer
    let dc1_key = signer(&certs, "dc1");
    cases.push((
        "an answer signed outside the run's time",
        forger(&|ev, _| {
            let i = ev
                .iter()
                .position(|e| e["event"] == "digests" && e["side"] == "source")
                .unwrap();
            let mut p = payload(&ev[i]["envelope"]);
            p["time"] = json!("2020-01-01T00:00:00Z");
            ev[i]["envelope"] = sign(AGENT_RESULT, &p, "dc1", &dc1_key);
        }),
        "agent_results[",
    ));
    // the malleated signature is valid: the forgery below is refused for the copy alone
    cases.push((
        "(control) an answer under its malleated signature, listed once",
        forger(&|ev, _| {
            let i = ev
                .iter()
                .position(|e| e["event"] == "digests" && e["side"] == "source")
                .unwrap();
            let sig = &mut ev[i]["envelope"]["signatures"][0]["sig"];
            *sig = b64e(&malleate(&b64d(sig)));
        }),
        "",
    ));
    // D1 (issue 32): one agent-signed answer listed for a second event under a second,
    // equally valid signature: ECDSA's (r, n − s), which anyone computes from (r, s)
    cases.push((
        "an answer listed again under its malleated signature",
        forger(&|ev, _| {
            let i = ev
                .iter()
                .position(|e| e["event"] == "digests" && e["side"] == "source")
                .unwrap();
            let mut copy = ev[i].clone();
            let sig = &mut copy["envelope"]["signatures"][0]["sig"];
            *sig = b64e(&malleate(&b64d(sig)));
            assert_ne!(copy["envelope"], ev[i]["envelope"]);
            ev.insert(i + 1, copy);
        }),
        "agent_results[",
    ));
    // an answer whose event lost its envelope
    cases.push((
        "an unsigned answer",
        forger(&|ev, _| {
            let i = ev.iter().position(|e| e["event"] == "digests").unwrap();
            ev[i].as_object_mut().unwrap().remove("envelope");
        }),
        "agent_results[",
    ));

    // E5 (issue 32): both sides' datasets are named `orders`; a coordinator swaps source
    // and target throughout its record, statement and result (missing rows become
    // extra rows). Only what an agent signs binds a side: each signed its side.
    {
        let mut swapped = result.clone();
        swap_fields(&mut swapped, "source", "target");
        if let Some(dc) = swapped.get_mut("difference_counts").filter(|v| v.is_object()) {
            swap_fields(dc, "missing_in_target", "extra_in_target");
        }
        cases.push((
            "E5: source and target swapped throughout",
            with_result(&a, &certs, &swapped, |ev, st| {
                for e in ev.iter_mut() {
                    match e["side"].as_str() {
                        Some("source") => e["side"] = json!("target"),
                        Some("target") => e["side"] = json!("source"),
                        _ => {}
                    }
                    if e["event"] == "started" {
                        swap_fields(&mut e["spec"], "source", "target");
                    }
                    if e["event"] == "described" {
                        swap_fields(e, "source", "target");
                    }
                }
                let started = ev.iter().find(|e| e["event"] == "started").unwrap();
                st["predicate"]["spec_sha256"] = json!(spec_digest(&started["spec"]));
                let p = &mut st["predicate"];
                swap_fields(p, "source", "target");
                if p.get("agents").is_some_and(|v| v.is_object()) {
                    swap_fields(&mut p["agents"], "source", "target");
                }
                if let Some(dc) = p.get_mut("difference_counts").filter(|v| v.is_object()) {
                    swap_fields(dc, "missing_in_target", "extra_in_target");
                }
            }),
            "agent_results[",
        ));
    }
    assert_eq!(st["predicate"]["agents"]["source"]["agent"], "dc1");
    assert_eq!(st["predicate"]["agents"]["target"]["agent"], "vpc2");
    cases.push((
        "E5: the statement names the target's agent as the source's",
        forger(&|_, st| {
            st["predicate"]["agents"]["source"] = st["predicate"]["agents"]["target"].clone();
        }),
        "agent_results[",
    ));
    // an agent that signs no side (one from before sides were signed): fail closed
    let (dc1_key_, vpc2_key_) = (signer(&certs, "dc1"), signer(&certs, "vpc2"));
    cases.push((
        "E5: answers whose agents signed no side",
        forger(&|ev, _| {
            for e in ev.iter_mut() {
                let slot = match e["event"].as_str() {
                    Some("aggregated") => &mut e["response"]["envelope"],
                    Some("digests") => &mut e["envelope"],
                    _ => continue,
                };
                let mut p = payload(slot);
                p["scope"].as_object_mut().unwrap().remove("side");
                let key = if p["agent"] == "dc1" {
                    &dc1_key_
                } else {
                    &vpc2_key_
                };
                let agent = p["agent"].as_str().unwrap().to_string();
                *slot = sign(AGENT_RESULT, &p, &agent, key);
            }
        }),
        "agent_results[",
    ));
    // E15 (issue 32): a result field outside the statement, changed
    {
        let mut other = result.clone();
        other["source"]["agent"] = json!("vpc2");
        cases.push((
            "E15: the result's source agent changed",
            with_result(&a, &certs, &other, |_, _| {}),
            "result fields",
        ));
        let mut other = result.clone();
        other["target"]["dataset"] = json!("orders_copy");
        cases.push((
            "E15: the result's target dataset changed",
            with_result(&a, &certs, &other, |_, _| {}),
            "result fields",
        ));
        let mut other = result.clone();
        other["name"] = json!("another-spec");
        cases.push((
            "E15: the result's name changed",
            with_result(&a, &certs, &other, |_, _| {}),
            "result fields",
        ));
        let mut other = result.clone();
        let leaf = &mut other["leaves"][0]["source"];
        leaf["count"] = json!(leaf["count"].as_u64().unwrap() + 1);
        cases.push((
            "E15: a leaf's source count changed",
            with_result(&a, &certs, &other, |_, _| {}),
            "result fields",
        ));
    }
    // leniencies (issue 32): each refused, naming the check
    let digests_of = |agent: &'static str| {
        move |e: &Value| e["event"] == "digests" && payload(&e["envelope"])["agent"] == agent
    };
    for (name, time) in [
        ("an agent's time with a fraction of a second", ".5Z"),
        ("an agent's time at +00:00", "+00:00"),
    ] {
        cases.push((
            name,
            forger(&|ev, _| {
                resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                    let t = p["time"].as_str().unwrap().trim_end_matches('Z').to_string();
                    p["time"] = json!(format!("{t}{time}"));
                })
            }),
            "agent_results[",
        ));
    }
    {
        let mut t = forger(&|_, _| {});
        let mut cp = payload(&t["checkpoint"]);
        let time = cp["time"].as_str().unwrap().trim_end_matches('Z').to_string();
        cp["time"] = json!(format!("{time}+00:00"));
        t["checkpoint"] = sign(CHECKPOINT, &cp, "coordinator", &signer(&certs, "coordinator"));
        cases.push(("the checkpoint's time at +00:00", t, "checkpoint time"));
    }
    cases.push((
        "the statement's finished time with a fraction",
        forger(&|_, st| {
            let t = st["predicate"]["finished"]
                .as_str()
                .unwrap()
                .trim_end_matches('Z')
                .to_string();
            st["predicate"]["finished"] = json!(format!("{t}.25Z"));
        }),
        "statement",
    ));
    cases.push((
        "the run's started time at +00:00",
        forger(&|ev, st| {
            let t = st["predicate"]["started"]
                .as_str()
                .unwrap()
                .trim_end_matches('Z')
                .to_string();
            let t = format!("{t}+00:00");
            ev.iter_mut().find(|e| e["event"] == "started").unwrap()["started"] = json!(t);
            st["predicate"]["started"] = json!(t);
        }),
        "statement",
    ));
    assert!(
        st["predicate"]["hash_method"]
            .as_str()
            .unwrap()
            .starts_with("sealed_"),
        "run a is sealed"
    );
    cases.push((
        "a sealed method with no seal on either side",
        forger(&|ev, _| {
            for e in ev.iter_mut() {
                let slot = match e["event"].as_str() {
                    Some("aggregated") => &mut e["response"]["envelope"],
                    Some("digests") => &mut e["envelope"],
                    _ => continue,
                };
                let mut p = payload(slot);
                p["scope"]["seal"] = Value::Null;
                let key = if p["agent"] == "dc1" {
                    &dc1_key_
                } else {
                    &vpc2_key_
                };
                let agent = p["agent"].as_str().unwrap().to_string();
                *slot = sign(AGENT_RESULT, &p, &agent, key);
            }
        }),
        "agent_results[",
    ));
    cases.push((
        "two started events",
        forger(&|ev, _| {
            let copy = ev[0].clone();
            ev.insert(1, copy);
        }),
        "spec",
    ));
    {
        let ca_key = Ca::from_pem(
            &std::fs::read_to_string(certs.join("ca.pem")).unwrap(),
            &std::fs::read_to_string(certs.join("ca-key.pem")).unwrap(),
        )
        .unwrap();
        let any = ca_key
            .issue_with_usages(
                "dc1",
                Role::Server,
                &[],
                vec![
                    tally_common::pki::ExtendedKeyUsagePurpose::ServerAuth,
                    tally_common::pki::ExtendedKeyUsagePurpose::Any,
                ],
            )
            .unwrap();
        let any_key = TlsSigner::from_pem(any.key.as_bytes()).unwrap();
        let mut t = forger(&|ev, _| resign_answers(ev, "dc1", &any_key));
        t["certificates"][1]["pem"] = json!(any.cert);
        cases.push((
            "an agent certificate that also carries anyExtendedKeyUsage",
            t,
            "certificates[1]",
        ));
    }
    for (name, field) in [
        ("request_sha256 in capitals", "request_sha256"),
        ("release_log_head in capitals", "release_log_head"),
    ] {
        cases.push((
            name,
            forger(&|ev, _| {
                resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                    p[field] = json!(p[field].as_str().unwrap().to_uppercase());
                })
            }),
            "agent_results[",
        ));
    }
    cases.push((
        "request_sha256 of 63 digits",
        forger(&|ev, _| {
            resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                p["request_sha256"] = json!(p["request_sha256"].as_str().unwrap()[1..].to_string());
            })
        }),
        "agent_results[",
    ));
    cases.push((
        "a key_len longer than the columns",
        forger(&|ev, _| {
            resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                let n = p["scope"]["columns"].as_array().unwrap().len();
                p["scope"]["key_len"] = json!(n + 1);
            })
        }),
        "agent_results[",
    ));
    cases.push((
        "a key_len of 0",
        forger(&|ev, _| {
            resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                p["scope"]["key_len"] = json!(0)
            })
        }),
        "agent_results[",
    ));

    // the requests (issue 32): each signed answer's request is in the record, hashes
    // to the request_sha256 its agent signed and says what the agent signed it covered
    cases.push((
        "a request's dataset changed in the record",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            ev[i]["request"]["dataset"] = json!("customers");
        }),
        "agent_results[",
    ));
    cases.push((
        "a request struck from the record",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            ev[i].as_object_mut().unwrap().remove("request");
        }),
        "agent_results[",
    ));
    cases.push((
        "the two sides' level-1 requests swapped",
        forger(&|ev, _| {
            let i = level_one_source(ev);
            let j = ev
                .iter()
                .position(|e| e["event"] == "aggregated" && e["level"] == 1 && e["side"] == "target")
                .expect("a level-1 target answer");
            let (x, y) = (ev[i]["request"].clone(), ev[j]["request"].clone());
            ev[i]["request"] = y;
            ev[j]["request"] = x;
        }),
        "agent_results[",
    ));
    cases.push((
        "an agent-signed scope that is not what its request asked (key_len)",
        forger(&|ev, _| {
            resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                let n = p["scope"]["columns"].as_array().unwrap().len();
                p["scope"]["key_len"] = json!(n);
            })
        }),
        "agent_results[",
    ));
    // the forms the columns were asked in are the record's: an agent that signs a
    // request comparing a decimal below its declared scale cannot back a full-fidelity
    // statement (the review's false pass)
    cases.push((
        "a request at a lower decimal scale than the sides declare, signed by its agent",
        forger(&|ev, _| {
            let i = ev
                .iter()
                .position(|e| digests_of("dc1")(e))
                .expect("a dc1 digests event");
            let cols = ev[i]["request"]["columns"].as_array_mut().unwrap();
            let c = cols
                .iter_mut()
                .find(|c| c["class"] == "decimal")
                .expect("a decimal column");
            c["scale"] = json!(0);
            let digest = spec_digest(&ev[i]["request"]);
            resign_one(ev, digests_of("dc1"), &dc1_key_, |p| {
                p["request_sha256"] = json!(digest)
            });
        }),
        "agent_results[",
    ));
    // strict JSON (issue 32): two members of one name are refused wherever read; a
    // reader keeping the first and one keeping the last would read two records
    cases.push((
        "(control) the raw log re-chained and re-signed unchanged",
        rechain_raw(&a, &certs, |_| {}),
        "",
    ));
    cases.push((
        "an event line with two members named side",
        rechain_raw(&a, &certs, |lines| {
            let i = lines
                .iter()
                .position(|l| l.contains("\"event\":\"aggregated\"") && l.contains("\"side\":\"source\""))
                .unwrap();
            lines[i] = lines[i].replacen('{', "{\"side\":\"target\",", 1);
        }),
        "event chain",
    ));
    cases.push((
        "a statement payload with two members named verdict",
        {
            let mut t = a.clone();
            let text = String::from_utf8(b64d(&a["statement"]["payload"])).unwrap();
            let text = text.replacen("\"predicate\":{", "\"predicate\":{\"verdict\":\"match\",", 1);
            let env = Envelope::sign(
                IN_TOTO,
                text.as_bytes(),
                "coordinator",
                &signer(&certs, "coordinator"),
            )
            .unwrap();
            t["statement"] = serde_json::to_value(env).unwrap();
            t
        },
        "statement",
    ));
    cases.push((
        "an event line holding a line break (valid JSON whitespace)",
        rechain_raw(&a, &certs, |lines| {
            lines[1] = lines[1].replacen(',', ",\n", 1);
        }),
        "event chain",
    ));
    cases.push((
        "a statement that leaves out the source's totals (not null: absent)",
        forger(&|_, st| {
            st["predicate"].as_object_mut().unwrap().remove("source");
        }),
        "statement",
    ));
    cases.push((
        "a statement that names no agent per side",
        forger(&|_, st| {
            st["predicate"].as_object_mut().unwrap().remove("agents");
        }),
        "agent_results[",
    ));
    cases.push((
        "(control) an envelope member in a level event is not an answer and is ignored",
        forger(&|ev, _| {
            let i = ev
                .iter()
                .position(|e| e["event"] == "level")
                .expect("a level event");
            let j = level_one_source(ev);
            ev[i]["envelope"] = ev[j]["response"]["envelope"].clone();
        }),
        "",
    ));
    cases.push((
        "a lone surrogate in a member no check reads",
        rechain_raw(&a, &certs, |lines| {
            lines[1] = lines[1].replacen('{', "{\"note\":\"\\ud800\",", 1);
        }),
        "event chain",
    ));
    cases.push((
        "a statement whose fidelity is null",
        forger(&|_, st| st["predicate"]["fidelity"] = Value::Null),
        "statement",
    ));
    cases.push((
        "a full fidelity with an empty columns member",
        forger(&|_, st| st["predicate"]["fidelity"] = json!({"level": "full", "columns": []})),
        "statement",
    ));
    cases.push((
        "an event's digests in capitals",
        forger(&|ev, _| {
            let e = ev
                .iter_mut()
                .find(|e| e["event"] == "digests" && e["digests"].as_str().is_some_and(|d| !d.is_empty()))
                .expect("a digests event with rows");
            let upper = e["digests"].as_str().unwrap().to_uppercase();
            e["digests"] = json!(upper);
        }),
        "agent_results[",
    ));

    let dir = d.path().join("tampered");
    std::fs::create_dir_all(&dir).unwrap();
    // every case is checked, and every one that goes wrong is named at the end
    let mut wrong = Vec::new();
    for (i, (name, bundle, expect)) in cases.iter().enumerate() {
        let f = write(&dir, &format!("case{i}"), bundle);
        let (code, out) = verify(&f, &ca);
        if expect.is_empty() {
            if code != 0 {
                wrong.push(format!(
                    "{name}: the forging tool itself must produce a valid bundle: {out}"
                ));
            }
            continue;
        }
        if code != 1 {
            wrong.push(format!("{name}: expected invalid, got exit {code}: {out}"));
            continue;
        }
        let failed = out.lines().find(|l| l.starts_with("FAIL  ")).unwrap_or("");
        if !failed["FAIL  ".len().min(failed.len())..].starts_with(expect)
            || !out.contains(&format!("INVALID: {}", expect.trim_end_matches([':', '['])))
        {
            wrong.push(format!(
                "{name}: expected the first failure to be {expect:?}, got {failed:?}\n{out}"
            ));
        } else {
            eprintln!("refused as expected: {name}: {failed}");
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n\n")
    );
    assert!(n_events > 5);

    // the bundle is the run the signed log holds: checked against the export, which
    // extends the checkpoint taken after run a; a self-consistent re-chained bundle of
    // run a is not the run the log holds, and a rewritten log fails on its own
    let with_log = |bundle: &Path, log: &Path| {
        let o = Command::new(bins::tally())
            .arg("verify")
            .arg(bundle)
            .arg("--ca")
            .arg(&ca)
            .arg("--log")
            .arg(log)
            .arg("--since")
            .arg(&cp_a)
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = with_log(&file_a, &log);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok    log: --since") && out.contains("ok    bundle in the log"),
        "{out}"
    );
    let (code, out) = with_log(&file_a, &forged_log);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  log: ledger line 1"), "{out}");
    // (an unsigned field changed: the record re-chained and re-signed verifies alone)
    let rechained = reseal(&a, &certs, |ev, _| {
        let i = level_one_source(ev);
        ev[i]["elapsed_ms"] = json!(ev[i]["elapsed_ms"].as_u64().unwrap() + 1);
    });
    let rechained = write(&dir, "rechained", &rechained);
    assert_eq!(verify(&rechained, &ca).0, 0, "valid on its own");
    let (code, out) = with_log(&rechained, &log);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  bundle in the log"), "{out}");

    // usage: a missing file or CA is exit 2; a file that is not a bundle is invalid (1)
    assert_eq!(verify(&d.path().join("nothing.json"), &ca).0, 2);
    assert_eq!(verify(&file_a, &d.path().join("no-ca.pem")).0, 2);
    let junk = d.path().join("junk.json");
    std::fs::write(&junk, "{\"format\": 1}").unwrap();
    assert_eq!(verify(&junk, &ca).0, 1);
    // a bundle checked against another CA is invalid at its first certificate
    let other_ca = d.path().join("other-ca.pem");
    std::fs::write(&other_ca, &other.pem.cert).unwrap();
    let (code, out) = verify(&file_a, &other_ca);
    assert_eq!(code, 1);
    assert!(out.contains("FAIL  certificates[0]"), "{out}");
    // an unknown run and a run dir without a log are usage errors, named
    let o = Command::new(bins::tally())
        .args(["evidence", "nope", "--data-dir"])
        .arg(&data)
        .arg("-o")
        .arg(d.path().join("x.json"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no run nope"));
}

/// The worked example of docs/evidence.md verifies with the built binary, and says so
/// for each check the page lists.
#[test]
fn the_documented_example_bundle_verifies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bundle = root.join("docs/examples/evidence.json");
    let ca = root.join("docs/examples/evidence-ca.pem");
    let (code, out) = verify(&bundle, &ca);
    assert_eq!(code, 0, "{out}");
    for check in [
        "bundle format",
        "checkpoint time",
        "certificates[0]",
        "statement signature",
        "statement:",
        "result digest",
        "result:",
        "event chain",
        "checkpoint:",
        "spec",
        "agent_results[0]",
        "agent_results:",
        "level-1 totals",
        "verdict",
    ] {
        assert!(out.contains(&format!("ok    {check}")), "{check}: {out}");
    }
    // and its JSON report
    let o = Command::new(bins::tally())
        .arg("verify")
        .arg(&bundle)
        .arg("--ca")
        .arg(&ca)
        .arg("--json")
        .output()
        .unwrap();
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["valid"], true);
    assert!(j["checks"].as_array().unwrap().iter().all(|c| c["ok"] == true));
}

/// The SHA-256 of a spec's RFC 8785 JSON, as a statement states it.
fn spec_digest(spec: &Value) -> String {
    let text = tally_common::jcs::canonical_json(&spec.to_string()).unwrap();
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()))
}

/// A mode measures run's bundle verifies; a coordinator that re-chains and re-signs
/// its own record cannot claim a match for groups that differ, nor present the
/// agents' answers as answers to another spec (another group_by, another mode).
#[test]
fn a_measures_runs_bundle_verifies_and_its_forgeries_fail() {
    let p = plant();
    let d = deploy("e2e_evidence_measures", Some(&p), OPEN, OPEN);
    let data = d.path().join("evidence-data");
    let certs = d.path().join("certs");
    let ca = certs.join("ca.pem");
    let run = recorded_run(
        &d,
        &data,
        "name: e2e-measures\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
         mode: measures\ngroup_by: [{ column: created_at, granularity: month }]\nmeasures: [amount]\n",
    );
    let path = d.path().join("measures.json");
    export(&data, &run, &path);
    let (code, out) = verify(&path, &ca);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("differ"), "{out}");
    let bundle: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let result: Value = serde_json::from_slice(&b64d(&bundle["result"])).unwrap();
    let respec = |edit: &dyn Fn(&mut Value)| {
        reseal(&bundle, &certs, |ev, st| {
            let started = ev.iter_mut().find(|e| e["event"] == "started").unwrap();
            edit(&mut started["spec"]);
            st["predicate"]["spec_sha256"] = json!(spec_digest(&started["spec"]));
        })
    };
    let claimed_match = {
        let mut forged_result = result.clone();
        forged_result["verdict"] = json!("match");
        forged_result["groups"] = json!([]);
        let bytes = serde_json::to_vec(&forged_result).unwrap();
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let mut t = reseal(&bundle, &certs, |_, st| {
            st["predicate"]["verdict"] = json!("match");
            st["subject"][0]["digest"]["sha256"] = json!(digest);
        });
        t["result"] = b64e(&bytes);
        t
    };
    let cases = [
        (
            "(control) re-chained, re-signed, unchanged",
            reseal(&bundle, &certs, |_, _| {}),
            "",
        ),
        ("a match claimed for groups that differ", claimed_match, "verdict"),
        (
            "the spec's group_by changed after the run",
            respec(&|s| s["group_by"] = json!([{"column": "created_at", "granularity": "year"}])),
            "level-1 totals",
        ),
        (
            "the spec's measures changed after the run",
            respec(&|s| s["measures"] = json!([])),
            // the answers asked a measure column the changed spec does not compare
            "agent_results[",
        ),
        (
            "a checksum run claimed from measures answers",
            respec(&|s| {
                let o = s.as_object_mut().unwrap();
                for k in ["mode", "group_by", "measures"] {
                    o.remove(k);
                }
            }),
            "level-1 totals",
        ),
    ];
    for (name, forged, expect) in cases {
        let f = write(d.path(), "forged-measures", &forged);
        let (code, out) = verify(&f, &ca);
        if expect.is_empty() {
            assert_eq!(code, 0, "{name}: {out}");
        } else {
            assert_eq!(code, 1, "{name}: {out}");
            assert!(out.contains(&format!("INVALID: {expect}")), "{name}: {out}");
        }
    }
}
