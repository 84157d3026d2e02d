//! Cross-zone reconciliation with real network separation (network namespaces): zone A
//! holds PostgreSQL and its agent, zone B MariaDB and its agent, the hub holds the
//! coordinator, with routes only hub↔agents. Checks that the run works across zones,
//! that the hub cannot reach either database, that a count_only run moves only a small
//! and flat number of bytes as the table grows, and that cutting a zone's link gives a
//! clear error, not a hang.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tally_e2e::bins;
use tally_e2e::db::{self, Server};
use tally_e2e::netns::Topology;
use tally_e2e::proc::ChildGuard;
use tally_e2e::zones::parse_run;

fn load(pg: &Server, my: &Server, table: &str, n: u64) {
    pg.exec(
        Some("shop"),
        &format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, v TEXT NOT NULL, amount NUMERIC(10,2) NOT NULL);\n\
             INSERT INTO {table} SELECT g, 'v' || g, ((g * 7919) % 100000) / 100.0 FROM generate_series(1::bigint, {n}) g;\n\
             ANALYZE {table};\n"
        ),
    );
    my.exec(
        Some("shop"),
        &format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, v VARCHAR(20) NOT NULL, amount DECIMAL(10,2) NOT NULL);\n\
             INSERT INTO {table} SELECT seq, CONCAT('v', seq), ((seq * 7919) % 100000) / 100 FROM seq_1_to_{n};\n\
             UPDATE {table} SET amount = amount + 1 WHERE id IN (7, {}, {});\nANALYZE TABLE {table};\n",
            n / 2,
            n - 3
        ),
    );
}

fn start_agent(dir: &std::path::Path, ns: &str, name: &str, addr: &str, url: &str) -> ChildGuard {
    let cfg = format!(
        "listen: {addr}:7401\n\
         tls: {{ ca: certs/ca.pem, cert: certs/{name}.pem, key: certs/{name}-key.pem, zone_key: certs/{name}-zone.key, allowed_clients: [coordinator] }}\n\
         datasets:\n  small: {{ url: '{url}', table: small, key: [id] }}\n  big: {{ url: '{url}', table: big, key: [id] }}\n"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, cfg).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    ChildGuard::spawn(
        name,
        Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(bins::tally_agent())
            .arg("-c")
            .arg(&path)
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    )
    .unwrap()
}

fn run_in_hub(topo: &Topology, dir: &std::path::Path, dataset: &str) -> Command {
    let spec = dir.join(format!("{dataset}.yaml"));
    std::fs::write(
        &spec,
        format!(
            "name: {dataset}\nsource: {{ agent: a, dataset: {dataset} }}\ntarget: {{ agent: b, dataset: {dataset} }}\n\
             reporting: {{ level: count_only }}\n"
        ),
    )
    .unwrap();
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &topo.hub])
        .arg(bins::tally())
        .arg("run")
        .arg(&spec)
        .arg("-c")
        .arg(dir.join("coordinator.yaml"))
        .args(["--json", "--progress"]);
    c
}

#[test]
fn reconciliation_across_separated_zones() {
    let topo = Topology::new();
    let dir = tempfile::tempdir().unwrap();
    let pg = db::start_postgres_in(Some(&topo.a.ns));
    let my = db::start_mariadb_in(Some(&topo.b.ns));
    let pg_url = pg.create_database("shop");
    let my_url = my.create_database("shop");
    load(&pg, &my, "small", 10_000);
    load(&pg, &my, "big", 1_000_000);

    let out = Command::new(bins::tally())
        .args(["certs", "init", "--out"])
        .arg(dir.path().join("certs"))
        .args([
            "--agent",
            &format!("a={}", topo.a.addr),
            "--agent",
            &format!("b={}", topo.b.addr),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let _a = start_agent(dir.path(), &topo.a.ns, "a", &topo.a.addr, &pg_url);
    let _b = start_agent(dir.path(), &topo.b.ns, "b", &topo.b.addr, &my_url);
    std::fs::write(
        dir.path().join("coordinator.yaml"),
        format!(
            "tls: {{ ca: certs/ca.pem, cert: certs/coordinator.pem, key: certs/coordinator-key.pem }}\n\
             agents:\n  a: {{ endpoint: \"https://{}:7401\" }}\n  b: {{ endpoint: \"https://{}:7401\" }}\n",
            topo.a.addr, topo.b.addr
        ),
    )
    .unwrap();
    for addr in [&topo.a.addr, &topo.b.addr] {
        let until = Instant::now() + Duration::from_secs(20);
        while !Topology::can_connect(&topo.hub, addr, 7401) {
            assert!(
                Instant::now() < until,
                "agent at {addr} not reachable from the hub"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // (b) the hub reaches the agents, never the databases; the zones do not reach each other
    assert!(
        !Topology::can_connect(&topo.hub, &topo.a.addr, 5432),
        "PostgreSQL reachable from the hub"
    );
    assert!(
        !Topology::can_connect(&topo.hub, &topo.b.addr, 3306),
        "MariaDB reachable from the hub"
    );
    assert!(
        !Topology::can_connect(&topo.a.ns, &topo.b.addr, 7401),
        "zone A reaches zone B"
    );

    // (a) and (c): the run works across zones; count_only moves few bytes, flat in size
    let mut bytes = Vec::new();
    for dataset in ["small", "big"] {
        let before = topo.link_bytes(&topo.a) + topo.link_bytes(&topo.b);
        let out = run_in_hub(&topo, dir.path(), dataset).output().unwrap();
        let after = topo.link_bytes(&topo.a) + topo.link_bytes(&topo.b);
        let r = parse_run(out);
        assert_eq!(r.code, 1, "{dataset}: {}\n{}", r.stdout, r.stderr);
        assert!(r.json.get("differences").is_none());
        let leaves = r.json["leaves"].as_array().unwrap();
        assert!(
            (1..=3).contains(&leaves.len()),
            "{dataset}: {} leaves",
            leaves.len()
        );
        bytes.push((
            dataset,
            after - before,
            r.json["levels"][0]["segments"].as_u64().unwrap(),
        ));
    }
    let ((_, small, seg_small), (_, big, seg_big)) = (bytes[0], bytes[1]);
    eprintln!(
        "bytes on the hub's links, count_only: 10k rows {small} B ({seg_small} level-1 segments), \
         1M rows {big} B ({seg_big} segments)"
    );
    // 1M rows of (id, v, amount) are ~20 MB of values; the run moved under 2.5 % of it
    assert!(big < 500_000, "1M rows moved {big} bytes");
    // bytes follow the level-1 segments (at most 1024 whatever the rows), not the rows:
    // 100× the rows cost at most ~400 B per added segment (both sides' sums and counts,
    // and each agent's signed copy of its buckets in its answer's envelope, ~113 B per
    // bucket as base64 JSON: docs/evidence.md)
    let per_segment = (big - small) / seg_big.saturating_sub(seg_small).max(1);
    assert!(
        per_segment < 400,
        "bytes grew by {per_segment} B per segment: {small} → {big}"
    );

    // (d) cutting zone B's link mid-run gives a clear error, not a hang
    let mut child = run_in_hub(&topo, dir.path(), "big")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("run ended before resolving").unwrap();
        if line.contains("resolved") {
            break;
        }
    }
    topo.cut(&topo.b);
    let started = Instant::now();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    let r = parse_run(out);
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, rest.join("\n"));
    assert_eq!(r.json["error"]["code"], "agent_unreachable", "{}", r.stdout);
    assert!(r.json["error"]["message"].as_str().unwrap().contains("agent b"));
    assert!(
        elapsed < Duration::from_secs(90),
        "took {elapsed:?} to report the cut link"
    );
    eprintln!("cut link reported after {elapsed:?}");
}
