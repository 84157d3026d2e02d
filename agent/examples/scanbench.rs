//! Times, through the agent's own code and without gRPC, the row read of a whole table
//! (canonical text from SQL against the engine's cheap text) and one full-table level
//! of 64 even cuts (hashed in SQL against hashed in the agent, sealed and unsealed), on a table shaped like
//! the benchmark's (bench/README.md):
//!   cargo run --release -p tally-agent --example scanbench -- URL TABLE [REPS]
//! Each line gives the wall time and the CPU time this process spent (the agent's
//! share: reading, decoding, hashing). With REPS, only the sealed in-process level is
//! timed, REPS times. `SCANBENCH_HASH_THREAD=0` or `1` turns the level's second
//! hashing thread off or on (default: on where the host has more than one core).
use std::time::Instant;

use tracing::Instrument;

use tally_agent::config::{Hashing, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_agent::dialect::{self, FetchShape};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::segment::{ColumnSpec, KeyPart, Segment, Split};
use tally_common::types::TypeClass;

/// CPU seconds (user and system) this process has used, from /proc/self/stat.
fn cpu() -> f64 {
    cpu_of("/proc/self/stat")
}

/// CPU seconds of the main thread alone (the reader; a level's second hashing thread
/// is not in it), from /proc/self/task/PID/stat.
fn main_thread_cpu() -> f64 {
    cpu_of(&format!("/proc/self/task/{}/stat", std::process::id()))
}

fn cpu_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // fields 14 and 15 (utime, stime) in clock ticks; `after` starts at field 3
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (url, table) = (&a[1], &a[2]);
    let reps: Option<usize> = a.get(3).and_then(|r| r.parse().ok());
    let ds = Dataset::new(
        "t".into(),
        tally_common::config_file::parse_yaml(
            std::path::Path::new("x"),
            &format!("{{ url: '{url}', table: {table}, key: [id] }}"),
        )
        .unwrap(),
        Source::Table(vec![table.clone()]),
        Connector::open(url).unwrap(),
    );
    let c = |n: &str, class: TypeClass, scale: u32| ColumnSpec {
        name: n.into(),
        format: FieldFormat::new(class).with_scale(scale),
    };
    let cols = vec![
        c("id", TypeClass::Integer, 0),
        c("name", TypeClass::Text, 0),
        c("amount", TypeClass::Decimal, 2),
        c("created_at", TypeClass::Timestamp, 6),
        c("note", TypeClass::Text, 0),
    ];
    let b = ds.bind(&mut ds.session().await.unwrap(), cols, 1).await.unwrap();
    let cuts: Vec<Vec<KeyPart>> = (1..64).map(|i| vec![KeyPart::Int(i * 3_000_000 / 64)]).collect();
    let parents = vec![(Segment::whole(), Split::Cuts(cuts))];
    let key = b.key_infos();
    let shapes = match reps {
        Some(_) => vec![],
        None => vec![
            FetchShape::Canonical,
            FetchShape::Text,
            FetchShape::Canonical,
            FetchShape::Text,
        ],
    };
    for shape in shapes {
        let sql = dialect::fetch_rows(
            ds.connector.dialect(),
            &ds.source,
            &b.cols,
            &key,
            &Segment::whole(),
            shape,
            false,
        );
        let (t, c) = (Instant::now(), cpu());
        let mut n = 0;
        ds.connector
            .scan("t", &sql, shape, &b.cols, 1, &mut |_r| {
                n += 1;
                Ok(())
            })
            .await
            .unwrap();
        println!(
            "scan {shape:?} {:.3}s cpu {:.2}s rows {n}",
            t.elapsed().as_secs_f64(),
            cpu() - c
        );
    }
    let mut ds = ds;
    // SCANBENCH_HASH_THREAD=0/1 overrides the default (on where the host has 2+ cores)
    if let Ok(v) = std::env::var("SCANBENCH_HASH_THREAD") {
        ds.hash_thread = v == "1";
    }
    eprintln!("hash thread: {}", ds.hash_thread);
    // sealed (the default) against unsealed, with a fixed test key
    let keys = tally_common::seal::RunKeys {
        k_row: [1; 32],
        k_key: [2; 32],
    };
    let hashers = [
        Hasher::unsealed(HashMethod::Sha256_64),
        Hasher::sealed(HashMethod::SealedSha256_64, &keys),
    ];
    let runs = match reps {
        Some(n) => vec![(Hashing::InProcess, &hashers[1..]); n],
        None => [
            Hashing::Pushdown,
            Hashing::InProcess,
            Hashing::Pushdown,
            Hashing::InProcess,
        ]
        .into_iter()
        .map(|h| (h, &hashers[..]))
        .collect(),
    };
    // SCANBENCH_SPAN=1: the agent's logging (its subscriber and filter) and each level
    // inside a request span, as `tally-agent` serves it
    let span = std::env::var("SCANBENCH_SPAN").is_ok_and(|v| v == "1");
    if span {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,sqlx=warn"))
            .with_writer(std::io::stderr)
            .init();
    }
    eprintln!("request span: {span}");
    for (hashing, hashers) in runs {
        for h in hashers {
            ds.config.hashing = hashing;
            let (t, c, m) = (Instant::now(), cpu(), main_thread_cpu());
            let mut session = ds.session().await.unwrap();
            let level = ds.aggregate(&mut session, &b, h, &parents, false);
            let out = if span {
                level
                    .instrument(tracing::info_span!("aggregate", dataset = "t"))
                    .await
            } else {
                level.await
            }
            .unwrap();
            let sum: u64 = out.buckets.iter().map(|b| b.agg.sum()).fold(0, u64::wrapping_add);
            println!(
                "{:?} {} {:.3}s cpu {:.2}s (reader {:.2}s) rows {} sum {sum:x}",
                out.path,
                h.method(),
                t.elapsed().as_secs_f64(),
                cpu() - c,
                main_thread_cpu() - m,
                out.rows_scanned
            );
        }
    }
}
