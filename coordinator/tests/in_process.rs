//! Runs through real agent services in this process (SQLite datasets, sealed by default,
//! no TLS or processes): the runner and the rows phase end to end, as the run engine's
//! tests will drive them.

use std::path::Path;

use tally_agent::sample_data::write_orders;
use tally_common::pki;
use tally_coordinator::in_process::InProcessAgent;
use tally_coordinator::result::{DiffKind, Verdict};
use tally_coordinator::runner::{RunOptions, run};
use tally_coordinator::spec::Spec;

fn agent_yaml(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0\n\
             tls: {{ ca: ca.pem, cert: {name}.pem, key: {name}-key.pem, zone_key: {name}-zone.key }}\n\
             release_log: {name}-release.jsonl\n\
             datasets:\n  orders: {{ url: 'sqlite://{}', table: orders, key: [id], policy: {{ max_level: with_keys }} }}\n",
            dir.join(format!("{name}.sqlite")).display()
        ),
    )
    .unwrap();
    path
}

fn spec(dir: &Path, level: &str) -> Spec {
    let path = dir.join("spec.yaml");
    std::fs::write(
        &path,
        format!(
            "name: in-process\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: vpc2, dataset: orders }}\n\
             bisection: {{ strategy: quantile, factor: 8, threshold: 256 }}\nreporting: {{ level: {level}, sample_limit: 100 }}\n"
        ),
    )
    .unwrap();
    Spec::load(&path).unwrap()
}

async fn deploy(
    dir: &Path,
    plant: bool,
) -> (InProcessAgent, InProcessAgent, tally_agent::sample_data::Planted) {
    tally_agent::install_crypto_provider();
    pki::init_dir(dir, &[pki::AgentLeaf::new("dc1"), pki::AgentLeaf::new("vpc2")]).unwrap();
    write_orders(&dir.join("dc1.sqlite"), 20_000, false)
        .await
        .unwrap();
    let planted = write_orders(&dir.join("vpc2.sqlite"), 20_000, plant)
        .await
        .unwrap();
    let a = InProcessAgent::from_config("dc1", &agent_yaml(dir, "dc1")).unwrap();
    let b = InProcessAgent::from_config("vpc2", &agent_yaml(dir, "vpc2")).unwrap();
    (a, b, planted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sealed_run_through_in_process_agents_finds_exactly_the_planted_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, planted) = deploy(dir.path(), true).await;
    let opts = RunOptions {
        progress: Some(false),
    };
    let r = run(&spec(dir.path(), "with_keys"), &a, &b, &opts).await;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(r.hash_method, "sealed_sha256_64");
    // level 1 already cuts the key range into segments below the threshold
    assert!(!r.levels.is_empty() && !r.leaves.is_empty());
    let keys = |kind: DiffKind| -> Vec<i64> {
        let mut k: Vec<i64> = r
            .differences
            .iter()
            .flatten()
            .filter(|d| d.kind == kind)
            .map(|d| match d.key.as_slice() {
                [tally_common::segment::KeyPart::Int(i)] => *i,
                other => panic!("{other:?}"),
            })
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(DiffKind::Changed), planted.changed);
    assert_eq!(keys(DiffKind::MissingInTarget), planted.missing_in_target);
    assert_eq!(keys(DiffKind::ExtraInTarget), planted.extra_in_target);
    // both agents recorded every call in their own release logs
    for name in ["dc1", "vpc2"] {
        let (lines, _) =
            tally_common::chain::verify(&dir.path().join(format!("{name}-release.jsonl"))).unwrap();
        assert!(lines > r.levels.len() as u64, "{name}: {lines} release-log lines");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn identical_datasets_match_and_count_only_reveals_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _) = deploy(dir.path(), false).await;
    let opts = RunOptions {
        progress: Some(false),
    };
    let r = run(&spec(dir.path(), "with_keys"), &a, &b, &opts).await;
    assert_eq!(r.verdict, Verdict::Match, "{:?}", r.error);
    assert!(r.leaves.is_empty());
    let dir2 = tempfile::tempdir().unwrap();
    let (a, b, _) = deploy(dir2.path(), true).await;
    let r = run(&spec(dir2.path(), "count_only"), &a, &b, &opts).await;
    assert_eq!(r.verdict, Verdict::Differ);
    assert!(r.differences.is_none(), "count_only revealed rows");
}
