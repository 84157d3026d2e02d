//! The benchmark of bench/README.md: the same table in PostgreSQL (source) and MariaDB
//! (target), K planted differences of each kind, and in one run, interleaved, median of
//! `--repeat`: the bare COUNT(*)+SUM(checksum) scan on each side (the floor), `tally run`
//! at count_only and at with_keys over real agents with mutual TLS, and reladiff.
//!
//! usage: tally-bench [--rows N]... [--k K]... [--layout dense|gapped]... [--repeat R] [--reladiff PATH]
//! [--markdown FILE] [--degenerate ROWS] [--target mariadb|spark]
//!
//! Defaults: 1M rows, K = 0, 10, 1000, both layouts, median of 3, the degenerate drill
//! on 5,000 rows (`--degenerate 0` leaves it out).
//!
//! `--layout gapped` puts the second half of the keys 10^15 further up: two islands of
//! keys with nothing between them (issue 16).
//!
//! `--target spark` (built with the `spark` feature) measures PostgreSQL against a
//! Parquet table of a local Spark Connect server instead (issue 35; `spark.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

use tally_e2e::db::{self, Server};
use tally_e2e::zones::Deployment;

#[cfg(feature = "spark")]
#[path = "tally-bench/spark.rs"]
mod spark;

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
    /// Rows of the degenerate case (every row differs), or none.
    degenerate: Option<u64>,
    /// The agent's scanbench example: one side's level read alone, without the other.
    scanbench: Option<String>,
    /// The target engine: MariaDB (the default) or Spark (`--target spark`).
    spark: bool,
}

fn args() -> Args {
    let mut a = Args {
        rows: vec![],
        ks: vec![],
        layouts: vec![],
        repeat: 3,
        reladiff: None,
        markdown: None,
        degenerate: None,
        scanbench: None,
        spark: false,
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
            "--degenerate" => a.degenerate = Some(v.parse().expect("--degenerate ROWS")),
            "--scanbench" => a.scanbench = Some(v),
            "--target" => {
                a.spark = match v.as_str() {
                    "mariadb" => false,
                    "spark" => true,
                    _ => panic!("--target mariadb|spark"),
                }
            }
            _ => panic!("unknown argument {k}"),
        }
    }
    if a.rows.is_empty() {
        a.rows = vec![1_000_000];
    }
    if a.ks.is_empty() {
        a.ks = if a.spark { vec![0, 10] } else { vec![0, 10, 1000] };
    }
    if a.layouts.is_empty() {
        a.layouts = if a.spark {
            vec![Layout::Dense]
        } else {
            vec![Layout::Dense, Layout::Gapped]
        };
    }
    // the degenerate drill is measured unless `--degenerate 0`
    a.degenerate = match a.degenerate {
        None => Some(5000),
        Some(0) => None,
        n => n,
    };
    a
}

/// Row `g` of the table, the same expression in both engines: a bigint key with gaps,
/// non-ASCII text, numeric(12,2), a timestamp with microseconds, a nullable text.
fn load(pg: &Server, my: &Server, n: u64, layout: Layout) {
    let t = Instant::now();
    load_pg(pg, n, layout);
    let mk = layout.key_sql("seq", n);
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

/// PostgreSQL's table `t` of [`load`].
fn load_pg(pg: &Server, n: u64, layout: Layout) {
    pg.exec(
        Some("bench"),
        &format!(
            "DROP TABLE IF EXISTS t;\n\
             CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL, amount NUMERIC(12,2) NOT NULL, \
             created_at TIMESTAMP(6) NOT NULL, note TEXT);\n\
             {} FROM generate_series(1::bigint, {n}) g;\n\
             VACUUM ANALYZE t;\n",
            pg_rows(layout, n)
        ),
    );
}

/// PostgreSQL's `INSERT` of row `g` of `n`, without its `FROM` (which names `g`).
fn pg_rows(layout: Layout, n: u64) -> String {
    let pk = layout.key_sql("g", n);
    format!(
        "INSERT INTO t SELECT {pk}, 'Zoë-' || (g % 1000), ((g * 7919) % 10000000) / 100.0, \
         TIMESTAMP '2024-01-01' + (g * 37) * INTERVAL '1 microsecond' * 1000, \
         CASE WHEN g % 5 = 0 THEN NULL ELSE 'n' || (g % 97) END"
    )
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
    levels: u64,
    /// Aggregate queries the source's agent ran (and the target's: `--target spark`).
    queries: u64,
    #[cfg_attr(not(feature = "spark"), allow(dead_code))]
    target_queries: u64,
    #[cfg_attr(not(feature = "spark"), allow(dead_code))]
    verdict: String,
    rows_scanned: u64,
    coordinator_kib: u64,
    /// The coordinator process's CPU seconds (user + system).
    coordinator_cpu: f64,
    found: u64,
}

/// `tally run` at `level`, through the agents hashing in-process (`pg`, `my`) or,
/// with `sql`, through those whose engines hash in SQL (`pgsql`, `mysql`); sealed (the
/// default) unless `unsealed` (spec `hash: sha256_64`, the cost of sealing).
fn tally(d: &Deployment, level: &str, sql: bool, unsealed: bool) -> TallyRun {
    tally_with(d, level, sql, unsealed, ("", ""))
}

/// [`tally`] with more spec lines (`bisection: {...}`), its spec file named by `tag`.
fn tally_with(d: &Deployment, level: &str, sql: bool, unsealed: bool, tagged: (&str, &str)) -> TallyRun {
    let agents = if sql { ("pgsql", "mysql") } else { ("pg", "my") };
    tally_between(d, agents, level, unsealed, tagged)
}

/// [`tally_with`] between the named source and target agents.
fn tally_between(
    d: &Deployment,
    (src, tgt): (&str, &str),
    level: &str,
    unsealed: bool,
    (tag, extra): (&str, &str),
) -> TallyRun {
    let (suffix, hash) = if unsealed {
        ("-unsealed", "hash: sha256_64\n")
    } else {
        ("", "")
    };
    let spec = d.path().join(format!("spec-{level}-{src}{suffix}{tag}.yaml"));
    std::fs::write(
        &spec,
        format!("name: bench\nsource: {{ agent: {src}, dataset: t }}\ntarget: {{ agent: {tgt}, dataset: t }}\n{hash}reporting: {{ level: {level}, sample_limit: 100000 }}\n{extra}"),
    )
    .unwrap();
    let debug = std::env::var_os("TALLY_BENCH_DEBUG").is_some();
    let t = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(tally_e2e::bins::tally())
        .arg("run")
        .arg(&spec)
        .arg("-c")
        .arg(d.path().join("coordinator.yaml"))
        .arg("--json")
        .args(debug.then_some("--progress"))
        .output()
        .unwrap();
    if debug {
        // the run's progress lines, each with the seconds since it started
        for l in String::from_utf8_lossy(&out.stderr)
            .lines()
            .take_while(|l| !l.contains("Command being timed"))
        {
            eprintln!("  {l}");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(j["verdict"] != "error", "{j}");
    if debug {
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
    let coordinator_cpu: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("User time (seconds): ")
                .or_else(|| l.strip_prefix("System time (seconds): "))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .sum();
    let c = &j["difference_counts"];
    let found = c["changed"].as_u64().unwrap_or(0)
        + c["missing_in_target"].as_u64().unwrap_or(0)
        + c["extra_in_target"].as_u64().unwrap_or(0);
    TallyRun {
        secs,
        levels: j["levels"].as_array().map_or(0, |l| l.len() as u64),
        queries: j["source"]["queries"].as_u64().unwrap_or(0),
        target_queries: j["target"]["queries"].as_u64().unwrap_or(0),
        verdict: j["verdict"].as_str().unwrap_or_default().to_string(),
        rows_scanned: j["source"]["rows_scanned"].as_u64().unwrap_or(0)
            + j["target"]["rows_scanned"].as_u64().unwrap_or(0),
        coordinator_kib: kib,
        coordinator_cpu,
        found,
    }
}

/// `n` count_only runs on the same tables started together: seconds until all end.
fn at_once(d: &Deployment, n: usize) -> f64 {
    let spec = d.path().join("spec-count_only-pg.yaml");
    let t = Instant::now();
    let children: Vec<_> = (0..n)
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

/// CPU seconds the two database servers have spent so far: PostgreSQL's postmaster,
/// the children it has reaped (every backend that ended) and those still running;
/// MariaDB's one process (all its threads). A run's cost is the difference of two
/// readings around it.
struct DbCpu {
    postmaster: u32,
    mariadbd: u32,
    ticks_per_sec: f64,
}

/// Clock ticks per second of `/proc/PID/stat`'s CPU times.
fn ticks_per_sec() -> f64 {
    let tck = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&tck.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

/// (ppid, utime + stime, cutime + cstime) of a process, in clock ticks.
fn proc_stat(pid: u32) -> Option<(u32, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((n(1)? as u32, n(11)? + n(12)?, n(13)? + n(14)?))
}

impl DbCpu {
    fn new(pg: &Server, my: &Server) -> DbCpu {
        let postmaster = pg
            .exec(
                None,
                "SELECT split_part(pg_read_file('postmaster.pid'), E'\\n', 1);",
            )
            .trim()
            .parse()
            .expect("postmaster pid");
        let pid_file = my.exec(None, "SELECT @@pid_file;");
        let mariadbd = std::fs::read_to_string(pid_file.trim())
            .expect("mariadbd pid file")
            .trim()
            .parse()
            .expect("mariadbd pid");
        DbCpu {
            postmaster,
            mariadbd,
            ticks_per_sec: ticks_per_sec(),
        }
    }

    /// (PostgreSQL, MariaDB) CPU seconds so far.
    fn read(&self) -> (f64, f64) {
        let (_, own, reaped) = proc_stat(self.postmaster).expect("postmaster is running");
        let mut pg = own + reaped;
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
                && let Some((ppid, cpu, _)) = proc_stat(pid)
                && ppid == self.postmaster
            {
                pg += cpu;
            }
        }
        let (_, my, _) = proc_stat(self.mariadbd).expect("mariadbd is running");
        (pg as f64 / self.ticks_per_sec, my as f64 / self.ticks_per_sec)
    }

    /// Runs `f`: its wall seconds and the databases' CPU seconds (both servers) over it.
    fn measure<T>(&self, f: impl FnOnce() -> T) -> (T, f64, f64) {
        let before = self.read();
        let t = Instant::now();
        let out = f();
        let secs = t.elapsed().as_secs_f64();
        let after = self.read();
        (out, secs, (after.0 - before.0) + (after.1 - before.1))
    }
}

/// CPU seconds (user + system, all threads) the named agents' processes have spent so
/// far; a run's share is the difference of two readings around it. An agent that is no
/// longer running fails the bench (its CPU would be missing from the run's).
fn agents_cpu(d: &Deployment, names: &[&str], ticks_per_sec: f64) -> f64 {
    d.agents
        .iter()
        .filter(|a| names.contains(&a.name.as_str()))
        .map(|a| {
            let (_, own, _) = proc_stat(a.guard.pid())
                .unwrap_or_else(|| panic!("agent {} (pid {}) is not running", a.name, a.guard.pid()));
            own as f64 / ticks_per_sec
        })
        .sum()
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

/// One side's sealed in-process level over the whole table, read and hashed by the
/// agent's own code (scanbench: no gRPC, no coordinator, no other side), under the
/// agent's log subscriber and request span: its wall seconds. What a run costs where
/// each agent has its database's host to itself, set against that side's raw read.
fn alone(bin: &str, url: &str) -> f64 {
    let out = Command::new(bin)
        .args([url, "t", "1"])
        .env("SCANBENCH_SPAN", "1")
        .output()
        .expect("scanbench runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scanbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `InProcess sealed_sha256_64 0.645s cpu 0.73s (reader 0.62s) rows … sum …`
    text.lines()
        .find_map(|l| l.strip_prefix("InProcess "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no level time in scanbench's output: {text}"))
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

/// Issue 16's degenerate drill: a table where every row differs (every target amount
/// changed), reconciled to exact keys with factor 16 and threshold 64, by the hash and
/// the quantile strategy, beside the raw read of both sides.
fn degenerate(d: &Deployment, pg: &Server, my: &Server, cpu: &DbCpu, n: u64, repeat: usize) -> String {
    load(pg, my, n, Layout::Dense);
    // the same runs on the table before any row differs: the run's fixed cost
    let bisection =
        |strategy: &str| format!("bisection: {{ strategy: {strategy}, factor: 16, threshold: 64 }}\n");
    let clean: Vec<f64> = (0..repeat)
        .map(|_| {
            let h = tally_with(d, "with_keys", false, false, ("-hash", &bisection("hash")));
            let q = tally_with(
                d,
                "with_keys",
                false,
                false,
                ("-quantile", &bisection("quantile")),
            );
            assert_eq!(h.found + q.found, 0);
            h.secs.max(q.secs)
        })
        .collect();
    my.exec(Some("bench"), "UPDATE t SET amount = amount + 1;");
    let mut out = String::from(
        "| rows, all differ | read both s | clean run s | hash s | levels | queries/side | found | ÷ clean | DB CPU s | quantile s | levels | queries/side | found | ÷ clean | DB CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let (mut rd, mut hs, mut qs, mut hc, mut qc) = (vec![], vec![], vec![], vec![], vec![]);
    let mut last = None;
    for _ in 0..repeat {
        rd.push(
            timed(|| pg.exec_discard(Some("bench"), "COPY t TO STDOUT;"))
                + timed(|| my.exec_discard(Some("bench"), "SELECT * FROM t;")),
        );
        let (h, _, c) = cpu.measure(|| {
            tally_with(
                d,
                "with_keys",
                false,
                false,
                (
                    "-hash",
                    "bisection: { strategy: hash, factor: 16, threshold: 64 }\n",
                ),
            )
        });
        hs.push(h.secs);
        hc.push(c);
        let (q, _, c) = cpu.measure(|| {
            tally_with(
                d,
                "with_keys",
                false,
                false,
                (
                    "-quantile",
                    "bisection: { strategy: quantile, factor: 16, threshold: 64 }\n",
                ),
            )
        });
        qs.push(q.secs);
        qc.push(c);
        assert_eq!(h.found, n, "the hash drill finds every row");
        assert_eq!(q.found, n, "the quantile drill finds every row");
        last = Some((h, q));
    }
    let (h, q) = last.expect("one repetition");
    let (read, clean) = (median(rd), median(clean));
    let (hs, qs) = (median(hs), median(qs));
    out.push_str(&format!(
        "| {n} | {read:.2} | {clean:.2} | {hs:.2} | {} | {} | {} | {:.1} | {:.2} | {qs:.2} | {} | {} | {} | {:.1} | {:.2} |\n",
        h.levels,
        h.queries,
        h.found,
        hs / clean,
        median(hc),
        q.levels,
        q.queries,
        q.found,
        qs / clean,
        median(qc),
    ));
    my.exec(Some("bench"), "UPDATE t SET amount = amount - 1;");
    eprint!("{out}");
    out
}

fn main() {
    let a = args();
    if a.spark {
        #[cfg(feature = "spark")]
        return spark::main(&a);
        #[cfg(not(feature = "spark"))]
        panic!(
            "--target spark needs tally-bench built with the spark feature (bash bench/run.sh --target spark builds it)"
        );
    }
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
    let cpu = DbCpu::new(pg, my);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let machine = format!(
        "{cores} cores, PostgreSQL {}, {}",
        pg.exec(None, "SHOW server_version;").trim(),
        my.exec(None, "SELECT VERSION();").trim()
    );
    let degenerate_table = a
        .degenerate
        .map(|n| degenerate(&d, pg, my, &cpu, n, a.repeat))
        .unwrap_or_default();
    let mut table = String::from(
        "| rows | keys | K | floor PG s | floor MariaDB s | read PG s | read MariaDB s | count_only s | ÷ floor | count_only unsealed s | 2 count_only runs at once s | 4 at once s | count_only, SQL hashing s | with_keys s | ÷ floor | with_keys unsealed s | queries/side | rows scanned | found | coordinator peak MiB | reladiff s | reladiff found | ours faster | DB CPU s: floor scans | DB CPU: count_only | ÷ floor scans | DB CPU: with_keys | DB CPU: SQL hashing | DB CPU: reladiff | agents CPU: count_only | coordinator CPU: count_only | count_only: all CPU ÷ (cores × wall) | alone: PG level s | alone: MariaDB level s | slower alone ÷ slower read |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (&n, &layout) in a.rows.iter().flat_map(|n| a.layouts.iter().map(move |l| (n, l))) {
        load(pg, my, n, layout);
        for &k in &a.ks {
            plant(my, n, k, layout, false);
            let (mut fp, mut fm, mut co, mut wk, mut rd) = (vec![], vec![], vec![], vec![], vec![]);
            let (mut rp, mut rm, mut cs, mut two, mut four) = (vec![], vec![], vec![], vec![], vec![]);
            let (mut cu, mut wu) = (vec![], vec![]);
            // database CPU seconds (both servers): the floors' scans, count_only,
            // with_keys, count_only hashing in SQL, reladiff
            let (mut cpu_f, mut cpu_c, mut cpu_w, mut cpu_s, mut cpu_r) =
                (vec![], vec![], vec![], vec![], vec![]);
            // the count_only run's CPU outside the databases: both agents, the coordinator;
            // and everything's CPU over the machine's capacity in that run's wall time
            let (mut cpu_a, mut cpu_k, mut busy) = (vec![], vec![], vec![]);
            // each side's level alone (scanbench), where asked
            let (mut alone_p, mut alone_m) = (vec![], vec![]);
            let mut last = None;
            let mut rd_found = 0;
            // interleaved: each repetition runs every measurement once
            for _ in 0..a.repeat {
                let (_, s, c1) = cpu.measure(|| pg.exec(Some("bench"), PG_FLOOR));
                fp.push(s);
                let (_, s, c2) = cpu.measure(|| my.exec(Some("bench"), MY_FLOOR));
                fm.push(s);
                cpu_f.push(c1 + c2);
                // the raw read floor: every row to the client, no hashing
                rp.push(timed(|| pg.exec_discard(Some("bench"), "COPY t TO STDOUT;")));
                rm.push(timed(|| my.exec_discard(Some("bench"), "SELECT * FROM t;")));
                if let Some(bin) = &a.scanbench {
                    alone_p.push(alone(bin, &pg.url("bench")));
                    alone_m.push(alone(bin, &my.url("bench")));
                }
                let a0 = agents_cpu(&d, &["pg", "my"], cpu.ticks_per_sec);
                let (c, _, cc) = cpu.measure(|| tally(&d, "count_only", false, false));
                let ac = agents_cpu(&d, &["pg", "my"], cpu.ticks_per_sec) - a0;
                co.push(c.secs);
                cpu_c.push(cc);
                cpu_a.push(ac);
                cpu_k.push(c.coordinator_cpu);
                busy.push((cc + ac + c.coordinator_cpu) / (cores as f64 * c.secs));
                cu.push(tally(&d, "count_only", false, true).secs);
                let (sq, _, cc) = cpu.measure(|| tally(&d, "count_only", true, false));
                cs.push(sq.secs);
                cpu_s.push(cc);
                two.push(at_once(&d, 2));
                four.push(at_once(&d, 4));
                let (w, _, cc) = cpu.measure(|| tally(&d, "with_keys", false, false));
                wk.push(w.secs);
                cpu_w.push(cc);
                let wun = tally(&d, "with_keys", false, true);
                assert_eq!(
                    wun.found, w.found,
                    "sealed and unsealed runs find the same differences"
                );
                wu.push(wun.secs);
                if let Some(bin) = &a.reladiff {
                    let ((s, f), _, cc) = cpu.measure(|| reladiff(bin, pg, my));
                    rd.push(s);
                    cpu_r.push(cc);
                    rd_found = f;
                }
                last = Some((c, w));
            }
            let (c, w) = last.unwrap();
            let floor = median(fp.clone()).max(median(fm.clone()));
            let (co, wk) = (median(co), median(wk));
            let rd_s = if rd.is_empty() { f64::NAN } else { median(rd) };
            let cpu_r = if cpu_r.is_empty() { f64::NAN } else { median(cpu_r) };
            let (cpu_f, cpu_c) = (median(cpu_f), median(cpu_c));
            let (alone_p, alone_m) = if alone_p.is_empty() {
                (f64::NAN, f64::NAN)
            } else {
                (median(alone_p), median(alone_m))
            };
            let alone_ratio = alone_p.max(alone_m) / median(rp.clone()).max(median(rm.clone()));
            let row = format!(
                "| {n} | {} | {k} | {:.2} | {:.2} | {:.2} | {:.2} | {co:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {wk:.2} | {:.2} | {:.2} | {} | {} | {} (of {}) | {:.1} | {rd_s:.2} | {rd_found} | {:.1}× | {cpu_f:.2} | {cpu_c:.2} | {:.2} | {:.2} | {:.2} | {cpu_r:.2} | {:.2} | {:.2} | {:.2} | {alone_p:.2} | {alone_m:.2} | {alone_ratio:.2} |\n",
                layout.name(),
                median(fp),
                median(fm),
                median(rp),
                median(rm),
                co / floor,
                median(cu),
                median(two),
                median(four),
                median(cs),
                wk / floor,
                median(wu),
                w.queries,
                w.rows_scanned,
                w.found,
                3 * k,
                c.coordinator_kib.max(w.coordinator_kib) as f64 / 1024.0,
                rd_s / wk,
                cpu_c / cpu_f,
                median(cpu_w),
                median(cpu_s),
                median(cpu_a),
                median(cpu_k),
                median(busy),
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
        "Machine: {machine}. Median of {} interleaved repetitions. Agent peak memory (VmHWM) over the whole run: {}.\n\n{table}\n{degenerate_table}",
        a.repeat,
        agents.join(", ")
    );
    println!("{report}");
    if let Some(path) = a.markdown {
        std::fs::write(path, report).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
}
