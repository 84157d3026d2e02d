//! The correctness generator from the command line (tests/src/generator).
//!
//! usage: tally-gen [--long DURATION] [--seed N] [--cases-per-pair N] [--spark-cases-per-pair N]
//!                  [--engines pg,my,lite,duck,spark] [--rounds N] [--shrink N]
//!
//! `--long 1h` runs rounds with fresh seeds for an hour (`30m`, `90s` also work) and
//! prints the coverage and every failure, the first ones shrunk to SQL reproductions.
//! Without `--long` it runs `--rounds` rounds (default 1). `--engines` restricts the
//! engines (default: every live one of the build); a pair with a Spark side gets
//! `--spark-cases-per-pair` cases a round (default 1). Exit status 1 when anything
//! disagreed with its truth.

use std::time::Duration;

use tally_e2e::generator::values::Engine;
use tally_e2e::generator::{Hunt, hunt};

const USAGE: &str = "usage: tally-gen [--long DURATION] [--seed N] [--cases-per-pair N] [--spark-cases-per-pair N] [--engines pg,my,lite,duck,spark] [--rounds N] [--shrink N]";

/// `pg,my,spark`: engines of this build, each once.
fn engines(s: &str) -> Vec<Engine> {
    let live = Engine::live();
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let e = Engine::parse(name).unwrap_or_else(|| panic!("--engines: unknown engine {name:?}"));
        assert!(
            live.contains(&e),
            "--engines: {name} is not live in this build (features duckdb, spark)"
        );
        if !out.contains(&e) {
            out.push(e);
        }
    }
    assert!(!out.is_empty(), "--engines: name at least one engine");
    // the live order, so a pair's seed is the same whatever the order given
    live.into_iter().filter(|e| out.contains(e)).collect()
}

fn duration(s: &str) -> Duration {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .unwrap_or_else(|_| panic!("--long {s:?}: a number with s, m or h"));
    Duration::from_secs(match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        u => panic!("--long {s:?}: unknown unit {u:?} (s, m or h)"),
    })
}

fn main() {
    let mut h = Hunt {
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
        ..Hunt::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--long" => h.duration = Some(duration(&val())),
            "--seed" => h.seed = val().parse().expect("--seed N"),
            "--cases-per-pair" => h.cases_per_pair = val().parse().expect("--cases-per-pair N"),
            "--spark-cases-per-pair" => {
                h.spark_cases_per_pair = val().parse().expect("--spark-cases-per-pair N")
            }
            "--engines" => h.engines = engines(&val()),
            "--rounds" => h.rounds = val().parse().expect("--rounds N"),
            "--shrink" => h.shrink = val().parse().expect("--shrink N"),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => panic!("unknown argument {other:?} (see --help)"),
        }
    }
    // the binaries under test are built with TALLY_FEATURES (tests/src/bins.rs): without
    // it a DuckDB build would test agents that have no DuckDB
    if (cfg!(feature = "duckdb") || cfg!(feature = "spark")) && std::env::var_os("TALLY_FEATURES").is_none() {
        eprintln!(
            "tally-gen was built with DuckDB or Spark: set TALLY_FEATURES=tally-agent/duckdb,tally-agent/mssql,tally-agent/oracle,tally-agent/spark,tally-cli/duckdb,tally-e2e/duckdb,tally-e2e/spark (as .ci/run does)"
        );
        std::process::exit(2);
    }
    eprintln!("tally-gen: seed {}", h.seed);
    let f = hunt(&h);
    println!("coverage (seed {}):\n{}", h.seed, f.coverage.report());
    for r in &f.reproductions {
        println!("{r}");
    }
    println!("{} failures", f.failures.len());
    if !f.failures.is_empty() {
        std::process::exit(1);
    }
}
