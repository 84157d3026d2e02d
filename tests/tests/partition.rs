//! A network partition of a `tally serve` group (DESIGN §9, issue 12). Three replicas,
//! each in a network namespace of its own on one Linux bridge (tally_e2e::netns::Lan),
//! and two real agents over SQLite in the bridge's namespace. Mid-run the leader is cut
//! off from the other two replicas (blackhole routes both ways) while it still reaches
//! the agents:
//!
//! - the majority elects a new leader, which finishes the run with exactly the planted
//!   differences, and takes a new run;
//! - the minority (the old leader) refuses a new run within a bounded time, appends no
//!   run of its own, and asks the agents at most the level it had in flight;
//! - healed, the old leader follows the new one and every replica holds one history:
//!   the same Raft log entry for entry, the same runs, each once, the same documents.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_e2e::netns::{Lan, Topology};
use tally_e2e::proc::ChildGuard;
use tally_e2e::zones::differences;
use tally_e2e::{bins, raft_db};

/// Rows per side.
const N: i64 = 100_000;
const TOKEN: &str = "operator-token-012345678";
/// Ports inside the namespaces (each namespace has all of its own).
const API_PORT: u16 = 7500;
const PEER_PORT: u16 = 7600;
const AGENTS: [(&str, u16); 2] = [("dc1", 7401), ("vpc2", 7402)];
/// How long the minority may take to refuse a write.
const REFUSAL_BOUND: Duration = Duration::from_secs(10);
/// How long the release logs must stay still to show the minority drives nothing.
const QUIET: Duration = Duration::from_secs(4);

fn spec(name: &str) -> String {
    format!(
        "name: {name}\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: vpc2, dataset: orders }}\n\
         bisection: {{ strategy: quantile, factor: 2, threshold: 2 }}\nreporting: {{ level: with_keys }}\n"
    )
}

/// Writes the two datasets (argv: source file, target file, rows): the target has three
/// changed rows, two missing and one extra.
const LOAD: &str = r#"
import sqlite3, sys
n = int(sys.argv[3])
for path, target in ((sys.argv[1], False), (sys.argv[2], True)):
    c = sqlite3.connect(path)
    c.execute('CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount INTEGER NOT NULL)')
    c.execute("WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ?) "
              "INSERT INTO orders SELECT x, 'c' || (x % 97), (x * 7919) % 1000000 FROM g", (n,))
    if target:
        c.execute('UPDATE orders SET amount = amount + 1 WHERE id IN (?, ?, ?)', (101, n // 3, n - 10))
        c.execute('DELETE FROM orders WHERE id IN (?, ?)', (4321, n // 2 + 17))
        c.execute("INSERT INTO orders VALUES (?, 'extra', 1)", (n + 5,))
    c.commit()
"#;

/// One HTTP request to 127.0.0.1 (argv: method, path, token, timeout, port; the body on
/// stdin): prints the status (0 when there was no answer within the timeout) on the
/// first line, then the body.
const HTTP: &str = r#"
import http.client, sys
method, path, token, timeout, port = sys.argv[1:6]
body = sys.stdin.buffer.read() if method == 'POST' else None
try:
    c = http.client.HTTPConnection('127.0.0.1', int(port), timeout=float(timeout))
    c.request(method, path, body=body, headers={'Authorization': 'Bearer ' + token})
    r = c.getresponse()
    data = r.read()
    sys.stdout.write('%d\n' % r.status)
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
except Exception as e:
    sys.stdout.write('0\n%s: %s' % (type(e).__name__, e))
"#;

/// Polls the replicas' stores (argv: run, seconds, the stores in replica order) until one
/// holds a level event of the run; prints [leader, term, its store's level events], the
/// leader being the node of the highest committed vote the stores hold.
const FIRST_LEVEL: &str = r#"
import json, sqlite3, sys, time
run, within, dbs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def ask(db, q, *a):
    try:
        c = sqlite3.connect('file:' + db + '?mode=ro', uri=True)
        try:
            return c.execute(q, a).fetchone()
        finally:
            c.close()
    except sqlite3.Error:
        return None
def levels(db):
    # each event is its chain line stored as a JSON string
    r = ask(db, 'SELECT count(*) FROM sm_run_event WHERE run_id = ? AND event LIKE ?',
            run, '%\\"event\\":\\"level\\"%')
    return r[0] if r else 0
until = time.time() + within
while time.time() < until:
    if any(levels(db) > 0 for db in dbs):
        votes = []
        for db in dbs:
            r = ask(db, "SELECT value FROM raft_meta WHERE key = 'vote'")
            v = json.loads(r[0]) if r else None
            if v and v.get('committed'):
                votes.append((v['leader_id']['term'], v['leader_id']['node_id']))
        term, leader = max(votes)
        print(json.dumps([leader, term, levels(dbs[leader - 1])]))
        sys.exit(0)
    time.sleep(0.005)
sys.exit(1)
"#;

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// Python's own interpreter path (`ip netns exec` then skips any version-manager shim).
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed (the test's API client and its SQLite loader)");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// The two datasets as SQLite files, written by Python's sqlite3: the target has three
/// changed rows, two missing and one extra.
fn load(dir: &Path) -> (PathBuf, PathBuf) {
    let (src, tgt) = (dir.join("source.db"), dir.join("target.db"));
    let out = Command::new(python())
        .args(["-c", LOAD])
        .arg(&src)
        .arg(&tgt)
        .arg(N.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "writing the SQLite datasets: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (src, tgt)
}

fn expected() -> BTreeSet<(String, i64)> {
    let mut e = BTreeSet::new();
    for k in [101, N / 3, N - 10] {
        e.insert(("changed".to_string(), k));
    }
    for k in [4321, N / 2 + 17] {
        e.insert(("missing_in_target".to_string(), k));
    }
    e.insert(("extra_in_target".to_string(), N + 5));
    e
}

struct Replica {
    id: u64,
    /// Index into the Lan's hosts.
    host: usize,
    ns: String,
    addr: String,
    cfg: PathBuf,
    db: PathBuf,
    log: PathBuf,
    guard: Option<ChildGuard>,
}

impl Replica {
    fn start(&mut self) {
        let log = std::fs::File::create(&self.log).unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns])
            .arg(bins::tally())
            .args(["serve", "--insecure-loopback", "-c"])
            .arg(&self.cfg)
            .env("RUST_LOG", "warn,sqlx=error")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.guard = Some(ChildGuard::spawn(&format!("serve-{}", self.id), &mut c).unwrap());
        let until = Instant::now() + Duration::from_secs(60);
        while self.api("GET", "/healthz", "", Duration::from_secs(2)).0 != 200 {
            assert!(
                Instant::now() < until,
                "replica {} did not answer /healthz within 60 s; its log:\n{}",
                self.id,
                self.log_excerpt()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The replica's first warnings and errors and its last lines.
    fn log_excerpt(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut shown: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN") || l.contains("panicked"))
            .take(30)
            .collect();
        shown.push("…");
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        shown.extend(tail.into_iter().rev());
        shown.join("\n")
    }

    /// A request to this replica's API from inside its namespace: the status (0 for no
    /// answer within `timeout`), the body, and how long the answer took.
    fn api(&self, method: &str, path: &str, body: &str, timeout: Duration) -> (u16, Value, Duration) {
        use std::io::Write;
        let t0 = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(python())
            .args(["-c", HTTP, method, path, TOKEN])
            .arg(timeout.as_secs_f64().to_string())
            .arg(API_PORT.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec python3");
        child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let took = t0.elapsed();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (status, body) = text.split_once('\n').unwrap_or((&text, ""));
        let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()));
        (status.trim().parse().unwrap_or(0), body, took)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let (code, body, _) = self.api("GET", path, "", Duration::from_secs(30));
        (code, body)
    }

    /// `tally cluster status --json`, asked from inside the replica's namespace.
    fn status(&self) -> Option<Value> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bins::tally())
            .args(["cluster", "status", "--json", "-c"])
            .arg(&self.cfg)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "replica {}: tally cluster status: {}",
                self.id,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// The leader's id once a replica among `among` names one that is among `among`.
fn leader(replicas: &[Replica], among: &[u64], within: Duration) -> u64 {
    let until = Instant::now() + within;
    loop {
        for r in replicas.iter().filter(|r| among.contains(&r.id)) {
            if let Some(l) = r.status().and_then(|s| s["leader"].as_u64())
                && among.contains(&l)
            {
                return l;
            }
        }
        if Instant::now() >= until {
            let logs: Vec<String> = replicas
                .iter()
                .map(|r| format!("replica {}:\n{}", r.id, r.log_excerpt()))
                .collect();
            panic!(
                "no leader among {among:?} within {within:?}; the replicas' logs:\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The finished document of run `id` as replica `r` serves it.
fn wait_done(r: &Replica, id: &str, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let (code, body) = r.get(&format!("/v1/runs/{id}"));
        if code == 200 {
            return body;
        }
        assert!(
            [0, 202, 404, 503].contains(&code),
            "replica {}: {code}: {body}",
            r.id
        );
        if Instant::now() >= until {
            panic!(
                "replica {}: run {id} did not finish (last answer {code}: {body}); its log:\n{}",
                r.id,
                r.log_excerpt()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn release_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn aggregates(log: &Path) -> usize {
    release_lines(log)
        .iter()
        .filter(|l| l.contains("\"rpc\":\"Aggregate\""))
        .count()
}

/// Waits until one of the replicas' stores holds a level event of run `id`; returns the
/// leader then (the node of the highest committed vote the stores hold), its term, and
/// the level events its store holds. One Python process polls, so the answer comes
/// within milliseconds of the commit.
fn first_level(id: &str, dbs: &[&Path], within: Duration) -> (u64, u64, u64) {
    let out = Command::new(python())
        .args(["-c", FIRST_LEVEL, id])
        .arg(within.as_secs_f64().to_string())
        .args(dbs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "no level of run {id} committed within {within:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<u64> = serde_json::from_slice(&out.stdout).expect("the poller's answer");
    (v[0], v[1], v[2])
}

/// Whether a Raft log entry as stored appends a run's `started` event.
fn starts_a_run(entry: &str) -> bool {
    entry.contains("\\\"event\\\":\\\"started\\\"")
}

#[test]
fn a_partitioned_leader_takes_no_writes_drives_no_run_and_rejoins_one_history() {
    // first made, last dropped: the replicas and agents die before their namespaces go
    let lan = Lan::new(&["r1", "r2", "r3"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let t_build = Instant::now();
    bins::tally();
    eprintln!("binaries ready in {:?}", t_build.elapsed());
    let t_test = Instant::now();
    let t_load = Instant::now();
    let (src, tgt) = load(dir);
    eprintln!("wrote {N} rows per side in {:?}", t_load.elapsed());

    let hub = Lan::HUB_ADDR;
    let mut certs = Command::new(bins::tally());
    certs.args(["certs", "init", "--out"]).arg(dir.join("certs"));
    for (name, _) in AGENTS {
        certs.args(["--agent", &format!("{name}={hub}")]);
    }
    for h in &lan.hosts {
        // a peer is known by its host name: the peer endpoint admits DNS names only
        certs.args(["--peer", &h.name]);
    }
    let out = certs.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // the agents, in the bridge's namespace: every replica reaches them
    let mut agents = Vec::new();
    let mut release_logs = Vec::new();
    for ((name, port), db) in AGENTS.iter().zip([&src, &tgt]) {
        let release_log = dir.join(format!("{name}-release.jsonl"));
        let cfg = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "listen: {hub}:{port}\n\
                 tls: {{ ca: certs/ca.pem, cert: certs/{name}.pem, key: certs/{name}-key.pem, zone_key: certs/{name}-zone.key, allowed_clients: [coordinator] }}\n\
                 release_log: {}\n\
                 datasets:\n  orders: {{ url: 'sqlite://{}', table: orders, key: [id], policy: {{ max_level: with_keys }} }}\n",
                release_log.display(),
                db.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        agents.push(
            ChildGuard::spawn(
                name,
                Command::new("ip")
                    .args(["netns", "exec", &lan.hub])
                    .arg(bins::tally_agent())
                    .arg("-c")
                    .arg(&cfg)
                    .stdout(log.try_clone().unwrap())
                    .stderr(log),
            )
            .unwrap(),
        );
        release_logs.push(release_log);
        let until = Instant::now() + Duration::from_secs(30);
        while !Topology::can_connect(&lan.hosts[0].ns, hub, *port) {
            assert!(
                Instant::now() < until,
                "agent {name} not reachable at {hub}:{port}; see {name}.log"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    let members = lan
        .hosts
        .iter()
        .map(|h| format!("'{}:{PEER_PORT}'", h.name))
        .collect::<Vec<_>>()
        .join(", ");
    let agents_cfg: String = AGENTS
        .iter()
        .map(|(name, port)| format!("  {name}: {{ endpoint: \"https://{hub}:{port}\" }}\n"))
        .collect();
    let mut replicas: Vec<Replica> = lan
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let id = i as u64 + 1;
            let cfg = dir.join(format!("serve-{id}.yaml"));
            std::fs::write(
                &cfg,
                format!(
                    "listen: 127.0.0.1:{API_PORT}\ndata_dir: store-{id}\n\
                     tls: {{ ca: certs/ca.pem, cert: certs/coordinator.pem, key: certs/coordinator-key.pem }}\n\
                     agents:\n{agents_cfg}\
                     api:\n  tokens: [{{ name: ci, sha256: {}, role: operator }}]\n\
                     cluster:\n  node_id: {id}\n  listen: {addr}:{PEER_PORT}\n  advertise: '{name}:{PEER_PORT}'\n  \
                     tls: {{ cert: certs/peer-{name}.pem, key: certs/peer-{name}-key.pem, ca: certs/peer-ca.pem }}\n  \
                     initial_members: [{members}]\n",
                    sha256_hex(TOKEN),
                    addr = h.addr,
                    name = h.name
                ),
            )
            .unwrap();
            Replica {
                id,
                host: i,
                ns: h.ns.clone(),
                addr: h.addr.clone(),
                cfg,
                db: dir.join(format!("store-{id}/raft.db")),
                log: dir.join(format!("serve-{id}.log")),
                guard: None,
            }
        })
        .collect();
    let t_start = Instant::now();
    for r in &mut replicas {
        r.start();
    }
    let all = [1u64, 2, 3];
    let first = leader(&replicas, &all, Duration::from_secs(60));
    eprintln!(
        "three replicas up, replica {first} leads, after {:?}",
        t_start.elapsed()
    );

    // 1. a run on the leader; once it committed a level, the leader is cut off
    let (code, body, _) =
        replicas[first as usize - 1].api("POST", "/v1/runs", &spec("partitioned"), Duration::from_secs(30));
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let t_run = Instant::now();
    // the moment a level is committed, the leader then (the highest vote the stores
    // hold: on a starved machine leadership may have moved since the start)
    let dbs: Vec<&Path> = replicas.iter().map(|r| r.db.as_path()).collect();
    let (old, old_term, committed) = first_level(&id, &dbs, Duration::from_secs(120));
    let asked_before: Vec<usize> = release_logs.iter().map(|l| aggregates(l)).collect();
    let oi = old as usize - 1;
    let majority: Vec<u64> = all.iter().copied().filter(|i| *i != old).collect();
    for j in &majority {
        lan.cut(replicas[oi].host, replicas[*j as usize - 1].host);
    }
    let cut = Instant::now();
    // it led all along: still the leader of the same term after the cut
    let s = replicas[oi].status().expect("the cut-off replica's status");
    assert!(
        s["state"] == "Leader" && s["term"].as_u64() == Some(old_term),
        "replica {old} was not the leader of term {old_term} when it was cut off: {s}"
    );
    eprintln!(
        "replica {old} (term {old_term}) cut off from {majority:?} {:?} into the run, after {committed} committed level(s)",
        t_run.elapsed()
    );
    for j in &majority {
        let peer = &replicas[*j as usize - 1];
        assert!(
            !Topology::can_connect(&replicas[oi].ns, &peer.addr, PEER_PORT),
            "the cut-off leader still reaches replica {}",
            peer.id
        );
        assert!(
            !Topology::can_connect(&peer.ns, &replicas[oi].addr, PEER_PORT),
            "replica {} still reaches the cut-off leader",
            peer.id
        );
    }
    for (_, port) in AGENTS {
        assert!(
            Topology::can_connect(&replicas[oi].ns, hub, port),
            "the cut-off leader lost the agent at {hub}:{port}"
        );
    }

    // 2. the majority elects a leader of its own
    let new = leader(&replicas, &majority, Duration::from_secs(60));
    let elected = cut.elapsed();
    let ni = new as usize - 1;
    eprintln!("replica {new} elected by the majority {elected:?} after the cut");
    let minority_says = replicas[oi].status().expect("the minority's status");
    eprintln!(
        "the minority meanwhile: {} in term {}, naming leader {}",
        minority_says["state"], minority_says["term"], minority_says["leader"]
    );

    // 3. the minority takes no write, within a bounded time
    let (code, body, took) = replicas[oi].api(
        "POST",
        "/v1/runs",
        &spec("minority"),
        REFUSAL_BOUND + Duration::from_secs(20),
    );
    eprintln!("POST /v1/runs to the minority: {code} after {took:?}: {body}");
    assert_ne!(code, 202, "the minority accepted a run: {body}");
    assert_ne!(
        code,
        0,
        "the minority did not answer a POST within {:?}: {body}",
        REFUSAL_BOUND + Duration::from_secs(20)
    );
    assert!(
        (500..600).contains(&code) && body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "the minority's refusal is no clear error: {code}: {body}"
    );
    assert!(
        took <= REFUSAL_BOUND,
        "the minority took {took:?} to refuse a write (bound {REFUSAL_BOUND:?})"
    );

    // 2. the majority finishes the run with exactly the planted differences
    let doc = wait_done(&replicas[ni], &id, Duration::from_secs(180));
    let finished = cut.elapsed();
    eprintln!("the majority finished the run {finished:?} after the cut");
    let j = &doc["result"];
    assert_eq!(j["verdict"], "differ", "{j}");
    assert_eq!(differences(j), expected());
    let n_levels = j["levels"].as_array().unwrap().len();
    assert!(
        n_levels >= committed as usize + 2,
        "the run had {n_levels} levels and {committed} were committed at the cut: too few left to tell \
         a minority that drives on from one that stops"
    );
    // after the cut each side is asked each level not committed by then at most once by
    // the new leader, and at most the one level the old leader had in flight: had the
    // minority driven on, it would have asked the remaining levels a second time
    for ((name, _), (log, before)) in AGENTS.iter().zip(release_logs.iter().zip(&asked_before)) {
        let total = aggregates(log);
        let after = total - before;
        eprintln!("{name}: {total} Aggregate calls for {n_levels} levels, {after} after the cut");
        assert!(
            total >= n_levels && after <= n_levels - committed as usize + 1,
            "{name}: {total} aggregates for {n_levels} levels, {after} of them after the cut \
             ({committed} levels committed before it, {before} asked by then)"
        );
    }
    for r in majority.iter().map(|i| &replicas[*i as usize - 1]) {
        let doc = wait_done(r, &id, Duration::from_secs(30));
        assert_eq!(differences(&doc["result"]), expected(), "replica {}", r.id);
        let (_, list) = r.get("/v1/runs");
        let runs = list["runs"].as_array().unwrap();
        assert_eq!(
            runs.iter().filter(|x| x["id"] == id.as_str()).count(),
            1,
            "{list}"
        );
    }

    // 3. the minority drives nothing: the agents hear nothing more, and the entries only
    // its log holds (appended, never committed) start no run
    let heard: Vec<usize> = release_logs.iter().map(|l| release_lines(l).len()).collect();
    std::thread::sleep(QUIET);
    for (((name, _), log), before) in AGENTS.iter().zip(&release_logs).zip(&heard) {
        let lines = release_lines(log);
        assert_eq!(
            lines.len(),
            *before,
            "{name} was asked while only the minority had a run open: {:?}",
            &lines[*before..]
        );
    }
    let majority_log = raft_db::log(&replicas[ni].db);
    let minority_only: Vec<(u64, u64, String)> = raft_db::log(&replicas[oi].db)
        .into_iter()
        .filter(|e| !majority_log.contains(e))
        .collect();
    eprintln!(
        "the minority holds {} entries of its own (term {old_term}, never committed)",
        minority_only.len()
    );
    assert!(
        minority_only.iter().all(|(_, t, _)| *t == old_term),
        "the minority appended entries of another term than its own: {:?}",
        minority_only.iter().map(|(i, t, _)| (i, t)).collect::<Vec<_>>()
    );
    assert!(
        !minority_only.iter().any(|(_, _, e)| starts_a_run(e)),
        "the minority appended a run of its own"
    );

    // 3. the majority takes a run during the partition, through a follower
    let follower = &replicas[majority
        .iter()
        .map(|i| *i as usize - 1)
        .find(|i| *i != ni)
        .unwrap()];
    let (code, body, _) = follower.api("POST", "/v1/runs", &spec("majority"), Duration::from_secs(60));
    assert_eq!(code, 202, "a majority replica refused a run: {body}");
    let during = body["id"].as_str().unwrap().to_string();
    assert!(
        during.contains(&format!("-{new}-")),
        "the new leader named the run: {during}"
    );
    let doc = wait_done(&replicas[ni], &during, Duration::from_secs(180));
    assert_eq!(differences(&doc["result"]), expected());

    // 4. healed, the old leader follows the new one and the group converges
    for j in &majority {
        lan.mend(replicas[oi].host, replicas[*j as usize - 1].host);
    }
    let healed = Instant::now();
    let until = healed + Duration::from_secs(120);
    let converged = loop {
        let statuses: Vec<Option<Value>> = replicas.iter().map(Replica::status).collect();
        let lists: Vec<Value> = replicas.iter().map(|r| r.get("/v1/runs").1).collect();
        // (`tally cluster status` asked of a follower shows the leader's view: the old
        // leader's own is its stored vote, which names the new leader once it follows)
        let old_vote = raft_db::vote(&replicas[oi].db);
        let agreed = statuses.iter().all(|s| {
            s.as_ref().is_some_and(|s| {
                s["leader"].as_u64() == Some(new) && s["members"].as_array().is_some_and(|m| m.len() == 3)
            })
        }) && old_vote
            .is_some_and(|(term, leader, elected)| term > old_term && leader == new && elected)
            && lists.iter().all(|l| l["runs"].is_array() && *l == lists[ni]);
        if agreed {
            break healed.elapsed();
        }
        if Instant::now() >= until {
            panic!(
                "no convergence within 120 s of healing: statuses {statuses:?}\nruns {lists:?}\n\
                 the old leader's vote {old_vote:?}\n\
                 the old leader's log:\n{}",
                replicas[oi].log_excerpt()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("healed: replica {old} follows replica {new}, and all agree, {converged:?} after the mend");

    // the old leader, a follower now, forwards a write to the leader
    let (code, body, _) = replicas[oi].api("POST", "/v1/runs", &spec("healed"), Duration::from_secs(60));
    assert_eq!(code, 202, "the rejoined replica refused a run: {body}");
    let after = body["id"].as_str().unwrap().to_string();
    assert!(
        after.contains(&format!("-{new}-")),
        "the leader named the run: {after}"
    );
    let doc = wait_done(&replicas[oi], &after, Duration::from_secs(180));
    assert_eq!(differences(&doc["result"]), expected());

    // one history: the same runs, each once, and the same documents on every replica
    let runs: BTreeSet<&str> = [id.as_str(), during.as_str(), after.as_str()].into();
    let until = Instant::now() + Duration::from_secs(60);
    let lists = loop {
        let lists: Vec<Value> = replicas.iter().map(|r| r.get("/v1/runs").1).collect();
        if lists.iter().all(|l| *l == lists[0]) || Instant::now() >= until {
            break lists;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (r, l) in replicas.iter().zip(&lists) {
        assert_eq!(*l, lists[0], "replica {} lists other runs than replica 1", r.id);
        let ids: Vec<&str> = l["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), runs.len(), "replica {}: {l}", r.id);
        assert_eq!(ids.into_iter().collect::<BTreeSet<_>>(), runs, "replica {}", r.id);
        assert!(
            l["runs"].as_array().unwrap().iter().all(|x| x["state"] == "done"),
            "replica {}: {l}",
            r.id
        );
    }
    for run in &runs {
        let docs: Vec<Value> = replicas
            .iter()
            .map(|r| wait_done(r, run, Duration::from_secs(30)))
            .collect();
        for (r, d) in replicas.iter().zip(&docs) {
            assert_eq!(*d, docs[0], "replica {} serves run {run} otherwise", r.id);
        }
    }
    // and the same Raft log, entry for entry: the minority's own entries are gone
    let until = Instant::now() + Duration::from_secs(30);
    let logs = loop {
        let logs: Vec<Vec<(u64, u64, String)>> = replicas.iter().map(|r| raft_db::log(&r.db)).collect();
        if logs.iter().all(|l| *l == logs[0]) || Instant::now() >= until {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (r, l) in replicas.iter().zip(&logs) {
        let first_differ = l
            .iter()
            .zip(&logs[0])
            .find(|(a, b)| a != b)
            .map(|(a, _)| (a.0, a.1));
        assert!(
            *l == logs[0],
            "replica {}'s Raft log differs from replica 1's: {} and {} entries, first difference at {first_differ:?}",
            r.id,
            l.len(),
            logs[0].len()
        );
    }
    for (i, _, e) in &minority_only {
        assert!(
            !logs[oi].iter().any(|(_, _, x)| x == e),
            "the minority's uncommitted entry {i} survived the heal"
        );
    }
    for r in &replicas {
        let s = r.status().expect("status");
        assert_eq!(s["leader"].as_u64(), Some(new), "replica {}: {s}", r.id);
        assert_eq!(s["members"].as_array().unwrap().len(), 3, "replica {}: {s}", r.id);
    }
    eprintln!(
        "one history of {} entries on every replica; measured: election {elected:?} after the cut, \
         run finished {finished:?} after the cut, minority refused a write in {took:?}, \
         convergence {converged:?} after the heal; {:?} in all",
        logs[0].len(),
        t_test.elapsed()
    );
}

/// The leader cut off from one agent only (issue 34 item 8): each agent in a zone of
/// its own, the leader's host and the target agent's host dropping each other's
/// packets while every replica still reaches the other replicas and the source agent.
/// The run ends with a clear error naming the agent it cannot reach (exit 2,
/// `agent_unreachable`), within the client's keepalive bound, never a result; the
/// group holds the run once, closed, and the next run, once the link is mended, is
/// exact.
#[test]
fn a_leader_cut_off_from_one_agent_ends_the_run_with_a_clear_error() {
    let lan = Lan::new(&["r1", "r2", "r3", "zone-a", "zone-b"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (src, tgt) = load(dir);
    let (zone_a, zone_b) = (3usize, 4usize);
    let mut certs = Command::new(bins::tally());
    certs.args(["certs", "init", "--out"]).arg(dir.join("certs"));
    for ((name, _), h) in AGENTS.iter().zip([zone_a, zone_b]) {
        certs.args(["--agent", &format!("{name}={}", lan.hosts[h].addr)]);
    }
    for h in &lan.hosts[..3] {
        certs.args(["--peer", &h.name]);
    }
    let out = certs.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut agents = Vec::new();
    for (((name, port), db), h) in AGENTS.iter().zip([&src, &tgt]).zip([zone_a, zone_b]) {
        let addr = &lan.hosts[h].addr;
        let cfg = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "listen: {addr}:{port}\n\
                 tls: {{ ca: certs/ca.pem, cert: certs/{name}.pem, key: certs/{name}-key.pem, zone_key: certs/{name}-zone.key, allowed_clients: [coordinator] }}\n\
                 release_log: {}\n\
                 datasets:\n  orders: {{ url: 'sqlite://{}', table: orders, key: [id], policy: {{ max_level: with_keys }} }}\n",
                dir.join(format!("{name}-release.jsonl")).display(),
                db.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        agents.push(
            ChildGuard::spawn(
                name,
                Command::new("ip")
                    .args(["netns", "exec", &lan.hosts[h].ns])
                    .arg(bins::tally_agent())
                    .arg("-c")
                    .arg(&cfg)
                    .stdout(log.try_clone().unwrap())
                    .stderr(log),
            )
            .unwrap(),
        );
        let until = Instant::now() + Duration::from_secs(30);
        while !Topology::can_connect(&lan.hosts[0].ns, addr, *port) {
            assert!(
                Instant::now() < until,
                "agent {name} not reachable at {addr}:{port}; see {name}.log"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let members = lan.hosts[..3]
        .iter()
        .map(|h| format!("'{}:{PEER_PORT}'", h.name))
        .collect::<Vec<_>>()
        .join(", ");
    let agents_cfg: String = AGENTS
        .iter()
        .zip([zone_a, zone_b])
        .map(|((name, port), h)| {
            format!(
                "  {name}: {{ endpoint: \"https://{}:{port}\" }}\n",
                lan.hosts[h].addr
            )
        })
        .collect();
    let mut replicas: Vec<Replica> = lan.hosts[..3]
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let id = i as u64 + 1;
            let cfg = dir.join(format!("serve-{id}.yaml"));
            std::fs::write(
                &cfg,
                format!(
                    "listen: 127.0.0.1:{API_PORT}\ndata_dir: store-{id}\n\
                     tls: {{ ca: certs/ca.pem, cert: certs/coordinator.pem, key: certs/coordinator-key.pem }}\n\
                     agents:\n{agents_cfg}\
                     api:\n  tokens: [{{ name: ci, sha256: {}, role: operator }}]\n\
                     cluster:\n  node_id: {id}\n  listen: {addr}:{PEER_PORT}\n  advertise: '{name}:{PEER_PORT}'\n  \
                     tls: {{ cert: certs/peer-{name}.pem, key: certs/peer-{name}-key.pem, ca: certs/peer-ca.pem }}\n  \
                     initial_members: [{members}]\n",
                    sha256_hex(TOKEN),
                    addr = h.addr,
                    name = h.name
                ),
            )
            .unwrap();
            Replica {
                id,
                host: i,
                ns: h.ns.clone(),
                addr: h.addr.clone(),
                cfg,
                db: dir.join(format!("store-{id}/raft.db")),
                log: dir.join(format!("serve-{id}.log")),
                guard: None,
            }
        })
        .collect();
    for r in &mut replicas {
        r.start();
    }
    let all = [1u64, 2, 3];
    let l = leader(&replicas, &all, Duration::from_secs(60));
    let li = l as usize - 1;

    // a run on the leader; once a level is committed, its link to zone B is cut
    let (code, body, _) = replicas[li].api(
        "POST",
        "/v1/runs",
        &spec("one-agent-cut"),
        Duration::from_secs(30),
    );
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let dbs: Vec<&Path> = replicas.iter().map(|r| r.db.as_path()).collect();
    let (lead, _, committed) = first_level(&id, &dbs, Duration::from_secs(120));
    let li = lead as usize - 1;
    lan.cut(replicas[li].host, zone_b);
    let cut = Instant::now();
    assert!(!Topology::can_connect(
        &replicas[li].ns,
        &lan.hosts[zone_b].addr,
        AGENTS[1].1
    ));
    assert!(Topology::can_connect(
        &replicas[li].ns,
        &lan.hosts[zone_a].addr,
        AGENTS[0].1
    ));
    for (j, r) in replicas.iter().enumerate().filter(|(j, _)| *j != li) {
        assert!(
            Topology::can_connect(&r.ns, &lan.hosts[zone_b].addr, AGENTS[1].1),
            "replica {}",
            j + 1
        );
    }
    eprintln!("replica {lead} cut off from zone B after {committed} committed level(s)");

    // the run ends, as an error naming the agent the leader cannot reach
    let doc = wait_done(&replicas[li], &id, Duration::from_secs(240));
    let ended = cut.elapsed();
    let j = &doc["result"];
    eprintln!("the run ended {ended:?} after the cut: {}", j["error"]);
    assert_eq!(j["verdict"], "error", "{j}");
    assert_eq!(j["error"]["code"], "agent_unreachable", "{j}");
    assert!(j["error"]["message"].as_str().unwrap().contains("vpc2"), "{j}");
    for r in &replicas {
        let doc = wait_done(r, &id, Duration::from_secs(30));
        assert_eq!(
            doc["result"]["error"]["code"], "agent_unreachable",
            "replica {}",
            r.id
        );
        let (_, list) = r.get("/v1/runs");
        let runs = list["runs"].as_array().unwrap();
        assert_eq!(
            runs.iter().filter(|x| x["id"] == id.as_str()).count(),
            1,
            "{list}"
        );
    }

    // mended, the next run is exact
    lan.mend(replicas[li].host, zone_b);
    let l = leader(&replicas, &all, Duration::from_secs(60));
    let (code, body, _) =
        replicas[l as usize - 1].api("POST", "/v1/runs", &spec("mended"), Duration::from_secs(30));
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let doc = wait_done(&replicas[l as usize - 1], &id, Duration::from_secs(180));
    assert_eq!(differences(&doc["result"]), expected(), "{}", doc["result"]);
    drop(agents);
}
