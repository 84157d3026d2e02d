//! Times, through the agent's own code and without gRPC, the row read of a whole table
//! (canonical text from SQL against the engine's cheap text) and one full-table level
//! of 64 even cuts (hashed in SQL against hashed in the agent, sealed and unsealed), on a table shaped like
//! the benchmark's (bench/README.md):
//!   cargo run --release -p tally-agent --example scanbench -- URL TABLE
use std::time::Instant;

use tally_agent::config::{Hashing, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_agent::dialect::{self, FetchShape};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::segment::{ColumnSpec, KeyPart, Segment, Split};
use tally_common::types::TypeClass;

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (url, table) = (&a[1], &a[2]);
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
    for shape in [
        FetchShape::Canonical,
        FetchShape::Text,
        FetchShape::Canonical,
        FetchShape::Text,
    ] {
        let sql = dialect::fetch_rows(
            ds.connector.dialect(),
            &ds.source,
            &b.cols,
            &key,
            &Segment::whole(),
            shape,
            false,
        );
        let t = Instant::now();
        let mut n = 0;
        ds.connector
            .scan("t", &sql, shape, &b.cols, 1, &mut |_r| {
                n += 1;
                Ok(())
            })
            .await
            .unwrap();
        println!("scan {shape:?} {:.3}s rows {n}", t.elapsed().as_secs_f64());
    }
    let mut ds = ds;
    // sealed (the default) against unsealed, with a fixed test key
    let keys = tally_common::seal::RunKeys {
        k_row: [1; 32],
        k_key: [2; 32],
    };
    let hashers = [
        Hasher::unsealed(HashMethod::Sha256_64),
        Hasher::sealed(HashMethod::SealedSha256_64, &keys),
    ];
    for hashing in [
        Hashing::Pushdown,
        Hashing::InProcess,
        Hashing::Pushdown,
        Hashing::InProcess,
    ] {
        for h in &hashers {
            ds.config.hashing = hashing;
            let t = Instant::now();
            let out = ds
                .aggregate(&mut ds.session().await.unwrap(), &b, h, &parents, false)
                .await
                .unwrap();
            let sum: u64 = out.buckets.iter().map(|b| b.agg.sum()).fold(0, u64::wrapping_add);
            println!(
                "{:?} {} {:.3}s rows {} sum {sum:x}",
                out.path,
                h.method(),
                t.elapsed().as_secs_f64(),
                out.rows_scanned
            );
        }
    }
}
