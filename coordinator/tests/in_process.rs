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
    spec_with(dir, level, "factor: 8, threshold: 256")
}

fn spec_with(dir: &Path, level: &str, bisection: &str) -> Spec {
    let path = dir.join("spec.yaml");
    std::fs::write(
        &path,
        format!(
            "name: in-process\nsource: {{ agent: dc1, dataset: orders }}\ntarget: {{ agent: vpc2, dataset: orders }}\n\
             bisection: {{ strategy: quantile, {bisection} }}\nreporting: {{ level: {level}, sample_limit: 100 }}\n"
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
        record: None,
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
        record: None,
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

/// Aggregate calls in an agent's release log.
fn aggregates_logged(dir: &Path, agent: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("{agent}-release.jsonl")))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"rpc\":\"Aggregate\""))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_resumed_from_its_log_does_not_ask_committed_levels_again() {
    use std::sync::Arc;
    use tally_coordinator::runlog::{MemoryRunLog, RunLog};
    use tally_coordinator::runner::RunRecord;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, planted) = deploy(dir.path(), true).await;
    // a deep drill: level 1 cuts 1024 ways, then halves down to 4 rows
    let spec = spec_with(dir.path(), "with_keys", "factor: 2, threshold: 4");
    let log = Arc::new(MemoryRunLog::default());
    let record = |log: Arc<MemoryRunLog>, resume: Vec<serde_json::Value>| RunOptions {
        progress: Some(false),
        record: Some(RunRecord {
            log,
            run_id: "r1".into(),
            resume,
        }),
    };
    let whole = run(&spec, &a, &b, &record(log.clone(), vec![])).await;
    assert_eq!(whole.verdict, Verdict::Differ, "{:?}", whole.error);
    let levels = whole.levels.len();
    assert!(levels >= 3, "{levels} levels");
    let events = log.load("r1").await.unwrap();
    assert_eq!(events[0]["event"], "resolved");
    assert_eq!(events.iter().filter(|e| e["event"] == "level").count(), levels);
    // the coordinator stops after level 2 was committed: its log holds resolved, level
    // 1 and level 2; a new process resumes from them
    let cut = 3;
    let log2 = Arc::new(MemoryRunLog::default());
    for e in &events[..cut] {
        let mut e = e.as_object().unwrap().clone();
        e.remove("seq");
        e.remove("prev");
        log2.append("r1", e).await.unwrap();
    }
    let before = (
        aggregates_logged(dir.path(), "dc1"),
        aggregates_logged(dir.path(), "vpc2"),
    );
    let resumed = run(&spec, &a, &b, &record(log2.clone(), events[..cut].to_vec())).await;
    let after = (
        aggregates_logged(dir.path(), "dc1"),
        aggregates_logged(dir.path(), "vpc2"),
    );
    assert_eq!(resumed.verdict, Verdict::Differ, "{:?}", resumed.error);
    // levels 1 and 2 were not asked again; every later level was, once per side
    assert_eq!(after.0 - before.0, levels - 2, "source aggregates after resuming");
    assert_eq!(after.1 - before.1, levels - 2, "target aggregates after resuming");
    // the same run: same levels, leaves, queries and differences (the nonce was kept, so
    // the resumed levels' sealed sums add up to the recorded parents')
    assert_eq!(resumed.levels.len(), levels);
    assert_eq!(resumed.source.queries, whole.source.queries);
    assert!(resumed.leaves.iter().all(|l| !l.inconsistent));
    let bounds = |r: &tally_coordinator::result::RunResult| -> Vec<String> {
        r.leaves.iter().map(|l| format!("{:?}", l.bounds)).collect()
    };
    assert_eq!(bounds(&resumed), bounds(&whole));
    let changed = |r: &tally_coordinator::result::RunResult| {
        r.difference_counts
            .as_ref()
            .map(|c| (c.changed, c.missing_in_target, c.extra_in_target))
    };
    assert_eq!(changed(&resumed), changed(&whole));
    assert_eq!(
        changed(&whole),
        Some((
            planted.changed.len() as u64,
            planted.missing_in_target.len() as u64,
            planted.extra_in_target.len() as u64
        ))
    );
    // and the resumed run went on appending to the same chain
    assert_eq!(log2.load("r1").await.unwrap().len(), events.len());
}
