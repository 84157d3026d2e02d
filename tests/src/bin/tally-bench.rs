//! The benchmark of bench/README.md: the same table in PostgreSQL (source) and MariaDB
//! (target), K planted differences of each kind, and in one run, interleaved, median of
//! `--repeat`: the bare COUNT(*)+SUM(checksum) scan on each side (the floor), `tally run`
//! at count_only and at with_keys over real agents with mutual TLS, and reladiff.
//!
//! usage: tally-bench [--rows N]... [--k K]... [--layout dense|gapped]... [--repeat R] [--reladiff PATH]
//! [--markdown FILE]
//!
//! `--layout gapped` puts the second half of the keys 10^15 further up: two islands of
//! keys with nothing between them (issue 16).

use std::process::Command;
use std::time::{Duration, Instant};

use tally_e2e::db::{self, Server};
use tally_e2e::zones::Deployment;

/// Where the keys lie: `g * 3 + g % 2` for row g, dense or in two islands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    Dense,
    Gapped,
}

/// How far the second island starts above the first.
const ISLAND: u64 = 1_000_000_000_000_000;

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Dense => "dense",
            Layout::Gapped => "gapped",
        }
    }

    /// The key of row `g` of `n`, as SQL over the column `col` (the same in both engines).
    fn key_sql(self, col: &str, n: u64) -> String {
        match self {
            Layout::Dense => format!("{col} * 3 + {col} % 2"),
            Layout::Gapped => format!(
                "{col} * 3 + {col} % 2 + CASE WHEN {col} > {} THEN {ISLAND} ELSE 0 END",
                n / 2
            ),
        }
    }

    /// The key of row `g` of `n`.
    fn key(self, g: u64, n: u64) -> u64 {
        let k = g * 3 + g % 2;
        match self {
            Layout::Gapped if g > n / 2 => k + ISLAND,
            _ => k,
        }
    }
}

struct Args {
    rows: Vec<u64>,
    ks: Vec<u64>,
    layouts: Vec<Layout>,
    repeat: usize,
    reladiff: Option<String>,
    markdown: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        rows: vec![],
        ks: vec![],
        layouts: vec![],
        repeat: 3,
        reladiff: None,
        markdown: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--rows" => a.rows.push(v.parse().expect("--rows N")),
            "--k" => a.ks.push(v.parse().expect("--k K")),
            "--layout" => a.layouts.push(match v.as_str() {
                "dense" => Layout::Dense,
                "gapped" => Layout::Gapped,
                _ => panic!("--layout dense|gapped"),
            }),
            "--repeat" => a.repeat = v.parse().expect("--repeat R"),
            "--reladiff" => a.reladiff = Some(v),
            "--markdown" => a.markdown = Some(v),
            _ => panic!("unknown argument {k}"),
        }
    }
    if a.rows.is_empty() {
        a.rows = vec![1_000_000];
    }
    if a.ks.is_empty() {
        a.ks = vec![0, 10, 1000];
    }
    if a.layouts.is_empty() {
        a.layouts = vec![Layout::Dense];
    }
    a
}

/// Row `g` of the table, the same expression in both engines: a bigint key with gaps,
/// non-ASCII text, numeric(12,2), a timestamp with microseconds, a nullable text.
fn load(pg: &Server, my: &Server, n: u64, layout: Layout) {
    let t = Instant::now();
    let (pk, mk) = (layout.key_sql("g", n), layout.key_sql("seq", n));
    pg.exec(
        Some("bench"),
        &format!(
            "DROP TABLE IF EXISTS t;\n\
             CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL, amount NUMERIC(12,2) NOT NULL, \
             created_at TIMESTAMP(6) NOT NULL, note TEXT);\n\
             INSERT INTO t SELECT {pk}, 'Zoë-' || (g % 1000), ((g * 7919) % 10000000) / 100.0, \
             TIMESTAMP '2024-01-01' + (g * 37) * INTERVAL '1 microsecond' * 1000, \
             CASE WHEN g % 5 = 0 THEN NULL ELSE 'n' || (g % 97) END FROM generate_series(1::bigint, {n}) g;\n\
             VACUUM ANALYZE t;\n"
        ),
    );
    my.exec(
        Some("bench"),
        &format!(
            "DROP TABLE IF EXISTS t;\n\
             CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR(40) CHARACTER SET utf8mb4 NOT NULL, amount DECIMAL(12,2) NOT NULL, \
             created_at DATETIME(6) NOT NULL, note TEXT);\n\
             INSERT INTO t SELECT {mk}, CONCAT('Zoë-', seq % 1000), ((seq * 7919) % 10000000) / 100, \
             TIMESTAMP('2024-01-01') + INTERVAL (seq * 37 * 1000) MICROSECOND, \
             CASE WHEN seq % 5 = 0 THEN NULL ELSE CONCAT('n', seq % 97) END FROM seq_1_to_{n};\n\
             ANALYZE TABLE t;\n"
        ),
    );
    eprintln!(
        "loaded {n} {} rows into both in {:.1}s",
        layout.name(),
        t.elapsed().as_secs_f64()
    );
}

/// Plants (or, with `undo`, removes) K differences of each kind in the target.
fn plant(my: &Server, n: u64, k: u64, layout: Layout, undo: bool) {
    if k == 0 {
        return;
    }
    let step = n / (3 * k + 1);
    // the rows g planted, with their keys
    let rows = |off: u64| (0..k).map(move |i| 1 + off + i * 3 * step);
    let changed: Vec<String> = rows(0).map(|g| layout.key(g, n).to_string()).collect();
    let missing: Vec<(u64, u64)> = rows(step).map(|g| (g, layout.key(g, n))).collect();
    // key + 1 is never a key
    let extra: Vec<String> = rows(2 * step)
        .map(|g| (layout.key(g, n) + 1).to_string())
        .collect();
    let sign = if undo { "-" } else { "+" };
    let mut sql = format!(
        "UPDATE t SET amount = amount {sign} 1 WHERE id IN ({});\n",
        changed.join(",")
    );
    if undo {
        for chunk in missing.chunks(500) {
            let rows: Vec<String> = chunk
                .iter()
                .map(|(g, id)| {
                    format!(
                        "({id}, CONCAT('Zoë-', {g} % 1000), (({g} * 7919) % 10000000) / 100, TIMESTAMP('2024-01-01') + INTERVAL ({g} * 37 * 1000) MICROSECOND, CASE WHEN {g} % 5 = 0 THEN NULL ELSE CONCAT('n', {g} % 97) END)"
                    )
                })
                .collect();
            sql.push_str(&format!("INSERT INTO t VALUES {};\n", rows.join(",")));
        }
        sql.push_str(&format!("DELETE FROM t WHERE id IN ({});\n", extra.join(",")));
    } else {
        let m: Vec<String> = missing.iter().map(|(_, i)| i.to_string()).collect();
        sql.push_str(&format!("DELETE FROM t WHERE id IN ({});\n", m.join(",")));
        let rows: Vec<String> = extra
            .iter()
            .map(|id| format!("({id}, 'extra', 1.00, '2024-01-01', NULL)"))
            .collect();
        sql.push_str(&format!("INSERT INTO t VALUES {};\n", rows.join(",")));
    }
    my.exec(Some("bench"), &sql);
}

const PG_FLOOR: &str = "SELECT COUNT(*), SUM(('x' || substr(encode(sha256(convert_to(\
  COALESCE(octet_length(id::text)::text || ':' || id::text, '~') || \
  COALESCE(octet_length(name::text)::text || ':' || name::text, '~') || \
  COALESCE(octet_length(round(amount, 2)::text)::text || ':' || round(amount, 2)::text, '~') || \
  COALESCE(octet_length(to_char(created_at, 'YYYY-MM-DD\"T\"HH24:MI:SS.US'))::text || ':' || to_char(created_at, 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '~') || \
  COALESCE(octet_length(note)::text || ':' || note, '~'), 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint) FROM t;";

const MY_FLOOR: &str = "SELECT COUNT(*), SUM(CAST(CONV(LEFT(SHA2(CONCAT(\
  COALESCE(CONCAT(LENGTH(id), ':', id), '~'), \
  COALESCE(CONCAT(LENGTH(name), ':', name), '~'), \
  COALESCE(CONCAT(LENGTH(amount), ':', amount), '~'), \
  COALESCE(CONCAT(LENGTH(DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%f')), ':', DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%f')), '~'), \
  COALESCE(CONCAT(LENGTH(note), ':', note), '~')), 256), 16), 16, 10) AS UNSIGNED)) FROM t;";

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct TallyRun {
    secs: f64,
    queries: u64,
    rows_scanned: u64,
    coordinator_kib: u64,
    found: u64,
}

/// `tally run` at `level`, through the agents hashing in-process (`pg`, `my`) or,
/// with `sql`, through those whose engines hash in SQL (`pgsql`, `mysql`); sealed (the
/// default) unless `unsealed` (spec `hash: sha256_64`, the cost of sealing).
fn tally(d: &Deployment, level: &str, sql: bool, unsealed: bool) -> TallyRun {
    let (src, tgt) = if sql { ("pgsql", "mysql") } else { ("pg", "my") };
    let (suffix, hash) = if unsealed {
        ("-unsealed", "hash: sha256_64\n")
    } else {
        ("", "")
    };
    let spec = d.path().join(format!("spec-{level}-{src}{suffix}.yaml"));
    std::fs::write(
        &spec,
        format!("name: bench\nsource: {{ agent: {src}, dataset: t }}\ntarget: {{ agent: {tgt}, dataset: t }}\n{hash}reporting: {{ level: {level}, sample_limit: 100000 }}\n"),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(tally_e2e::bins::tally())
        .arg("run")
        .arg(&spec)
        .arg("-c")
        .arg(d.path().join("coordinator.yaml"))
        .arg("--json")
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(j["verdict"] != "error", "{j}");
    if std::env::var_os("TALLY_BENCH_DEBUG").is_some() {
        eprintln!(
            "{level} via {src}: verdict {} counts {} levels {} total {} ms",
            j["verdict"], j["difference_counts"], j["levels"], j["elapsed_ms"]
        );
    }
    let kib = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
                .map(|v| v.parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let c = &j["difference_counts"];
    let found = c["changed"].as_u64().unwrap_or(0)
        + c["missing_in_target"].as_u64().unwrap_or(0)
        + c["extra_in_target"].as_u64().unwrap_or(0);
    TallyRun {
        secs,
        queries: j["source"]["queries"].as_u64().unwrap_or(0),
        rows_scanned: j["source"]["rows_scanned"].as_u64().unwrap_or(0)
            + j["target"]["rows_scanned"].as_u64().unwrap_or(0),
        coordinator_kib: kib,
        found,
    }
}

/// Two count_only runs on the same tables started together: seconds until both end.
fn two_at_once(d: &Deployment) -> f64 {
    let spec = d.path().join("spec-count_only-pg.yaml");
    let t = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(tally_e2e::bins::tally())
                .arg("run")
                .arg(&spec)
                .arg("-c")
                .arg(d.path().join("coordinator.yaml"))
                .arg("--json")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(j["verdict"] != "error", "{j}");
    }
    t.elapsed().as_secs_f64()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

fn reladiff(bin: &str, pg: &Server, my: &Server) -> (f64, u64) {
    let t = Instant::now();
    let out = Command::new(bin)
        .arg(format!("postgresql://postgres@127.0.0.1:{}/bench", pg.port))
        .arg("t")
        .arg(format!("mysql://root@127.0.0.1:{}/bench", my.port))
        .arg("t")
        .args([
            "-k",
            "id",
            "-c",
            "name",
            "-c",
            "amount",
            "-c",
            "created_at",
            "-c",
            "note",
            "--threads",
            "2",
        ])
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "reladiff failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        secs,
        stdout
            .lines()
            .filter(|l| l.starts_with('+') || l.starts_with('-'))
            .count() as u64,
    )
}

fn main() {
    let a = args();
    let pg = db::postgres();
    let my = db::mariadb();
    pg.create_database("bench");
    my.create_database("bench");
    let mut d = Deployment::new(&["pg", "my", "pgsql", "mysql"]);
    d.start_agent(
        "pg",
        "t",
        &format!(
            "{{ url: '{}', table: t, key: [id], policy: {{ max_level: with_keys, allow_unsealed: true, max_reveal_rows: 100000, max_reveal_rows_per_hour: 10000000 }} }}",
            pg.url("bench")
        ),
    );
    d.start_agent(
        "my",
        "t",
        &format!(
            "{{ url: '{}', table: t, key: [id], policy: {{ max_level: with_keys, allow_unsealed: true, max_reveal_rows: 100000, max_reveal_rows_per_hour: 10000000 }} }}",
            my.url("bench")
        ),
    );
    // the same datasets with the engines hashing in SQL (the path before in-process
    // became the default), measured in the same run
    for (name, url) in [("pgsql", pg.url("bench")), ("mysql", my.url("bench"))] {
        d.start_agent(
            name,
            "t",
            &format!("{{ url: '{url}', table: t, key: [id], hashing: pushdown, policy: {{ max_level: with_keys }} }}"),
        );
    }
    d.coordinator_config();
    let machine = format!(
        "{} cores, PostgreSQL {}, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        pg.exec(None, "SHOW server_version;").trim(),
        my.exec(None, "SELECT VERSION();").trim()
    );
    let mut table = String::from(
        "| rows | keys | K | floor PG s | floor MariaDB s | read PG s | read MariaDB s | count_only s | ÷ floor | count_only unsealed s | 2 count_only runs at once s | count_only, SQL hashing s | with_keys s | ÷ floor | with_keys unsealed s | queries/side | rows scanned | found | coordinator peak MiB | reladiff s | reladiff found | ours faster |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (&n, &layout) in a.rows.iter().flat_map(|n| a.layouts.iter().map(move |l| (n, l))) {
        load(pg, my, n, layout);
        for &k in &a.ks {
            plant(my, n, k, layout, false);
            let (mut fp, mut fm, mut co, mut wk, mut rd) = (vec![], vec![], vec![], vec![], vec![]);
            let (mut rp, mut rm, mut cs, mut two) = (vec![], vec![], vec![], vec![]);
            let (mut cu, mut wu) = (vec![], vec![]);
            let mut last = None;
            let mut rd_found = 0;
            // interleaved: each repetition runs every measurement once
            for _ in 0..a.repeat {
                fp.push(timed(|| {
                    pg.exec(Some("bench"), PG_FLOOR);
                }));
                fm.push(timed(|| {
                    my.exec(Some("bench"), MY_FLOOR);
                }));
                // the raw read floor: every row to the client, no hashing
                rp.push(timed(|| pg.exec_discard(Some("bench"), "COPY t TO STDOUT;")));
                rm.push(timed(|| my.exec_discard(Some("bench"), "SELECT * FROM t;")));
                let c = tally(&d, "count_only", false, false);
                co.push(c.secs);
                cu.push(tally(&d, "count_only", false, true).secs);
                cs.push(tally(&d, "count_only", true, false).secs);
                two.push(two_at_once(&d));
                let w = tally(&d, "with_keys", false, false);
                wk.push(w.secs);
                let wun = tally(&d, "with_keys", false, true);
                assert_eq!(
                    wun.found, w.found,
                    "sealed and unsealed runs find the same differences"
                );
                wu.push(wun.secs);
                if let Some(bin) = &a.reladiff {
                    let (s, f) = reladiff(bin, pg, my);
                    rd.push(s);
                    rd_found = f;
                }
                last = Some((c, w));
            }
            let (c, w) = last.unwrap();
            let floor = median(fp.clone()).max(median(fm.clone()));
            let (co, wk) = (median(co), median(wk));
            let rd_s = if rd.is_empty() { f64::NAN } else { median(rd) };
            let row = format!(
                "| {n} | {} | {k} | {:.2} | {:.2} | {:.2} | {:.2} | {co:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {wk:.2} | {:.2} | {:.2} | {} | {} | {} (of {}) | {:.1} | {rd_s:.2} | {rd_found} | {:.1}× |\n",
                layout.name(),
                median(fp),
                median(fm),
                median(rp),
                median(rm),
                co / floor,
                median(cu),
                median(two),
                median(cs),
                wk / floor,
                median(wu),
                w.queries,
                w.rows_scanned,
                w.found,
                3 * k,
                c.coordinator_kib.max(w.coordinator_kib) as f64 / 1024.0,
                rd_s / wk,
            );
            eprint!("{row}");
            table.push_str(&row);
            plant(my, n, k, layout, true);
        }
    }
    let agents: Vec<String> = d
        .agents
        .iter()
        .map(|a| format!("{} {:.1} MiB", a.name, vm_hwm_kib(a.guard.pid()) as f64 / 1024.0))
        .collect();
    let report = format!(
        "Machine: {machine}. Median of {} interleaved repetitions. Agent peak memory (VmHWM) over the whole run: {}.\n\n{table}",
        a.repeat,
        agents.join(", ")
    );
    println!("{report}");
    if let Some(path) = a.markdown {
        std::fs::write(path, report).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
}
