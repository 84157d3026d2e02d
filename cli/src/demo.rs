//! `tally demo`: a whole reconciliation with no setup. Two embedded datasets (DuckDB
//! with the `duckdb` feature, SQLite otherwise: a source and a copy with planted
//! differences), two agents started in this process on
//! loopback with fresh certificates and mutual TLS, and a real run at with_keys.
//!
//! This module is the one place the `tally` binary links the agent crate.

use std::path::Path;

use anyhow::Context;
use tally_agent::config::AgentConfig;
use tally_agent::sample_data::Planted;
#[cfg(not(feature = "duckdb"))]
use tally_agent::sample_data::write_orders;
use tally_common::pki;
use tally_coordinator::client::{Agent, TlsMaterial};
use tally_coordinator::config::ClientTls;
use tally_coordinator::evidence;
use tally_coordinator::lifecycle;
use tally_coordinator::runlog::SqliteRunLog;
use tally_coordinator::runtime::{RunOptions, RunRecord, run};
use tally_engine::result::RunResult;
use tally_engine::spec::Spec;

pub struct DemoOptions {
    pub rows: i64,
    pub json: bool,
    pub keep: Option<std::path::PathBuf>,
}

/// The embedded engine the demo's datasets live in.
const ENGINE: &str = if cfg!(feature = "duckdb") {
    "duckdb"
} else {
    "sqlite"
};

/// An agent's config; `peer` is the other agent, the one sealed-run peer its dataset
/// accepts (`policy.peers`).
fn agent_yaml(name: &str, peer: &str, db: &Path, release_log: &Path) -> String {
    format!(
        "listen: 127.0.0.1:0\n\
         tls: {{ ca: ca.pem, cert: {name}.pem, key: {name}-key.pem, zone_key: {name}-zone.key, allowed_clients: [coordinator] }}\n\
         release_log: {}\n\
         datasets:\n  orders:\n    url: '{ENGINE}://{}'\n    table: orders\n    key: [id]\n    policy: {{ max_level: with_keys, peers: ['{peer}/orders'] }}\n",
        release_log.display(),
        db.display()
    )
}

#[cfg(not(feature = "duckdb"))]
async fn write_datasets(dir: &Path, rows: i64) -> anyhow::Result<Planted> {
    write_orders(&dir.join("dc1.sqlite"), rows, false)
        .await
        .context("writing the source dataset")?;
    write_orders(&dir.join("vpc2.sqlite"), rows, true)
        .await
        .context("writing the target dataset")
}

#[cfg(feature = "duckdb")]
async fn write_datasets(dir: &Path, rows: i64) -> anyhow::Result<Planted> {
    use tally_agent::sample_data::write_orders_duckdb;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        write_orders_duckdb(&dir.join("dc1.duckdb"), rows, false).context("writing the source dataset")?;
        write_orders_duckdb(&dir.join("vpc2.duckdb"), rows, true).context("writing the target dataset")
    })
    .await?
}

async fn start_agent(dir: &Path, name: &str) -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>)> {
    let path = dir.join(format!("{name}.yaml"));
    let peer = if name == "dc1" { "vpc2" } else { "dc1" };
    let text = agent_yaml(
        name,
        peer,
        &dir.join(format!("{name}.{ENGINE}")),
        &dir.join(format!("{name}-release.jsonl")),
    );
    std::fs::write(&path, &text)?;
    // loaded as tally-agent loads it: paths relative to the file
    let cfg = AgentConfig::load(&path)?;
    let bound = tally_agent::server::bind(&cfg, &path).await?;
    let endpoint = format!("https://localhost:{}", bound.addr.port());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        if let Err(e) = bound
            .serve(async {
                let _ = rx.await;
            })
            .await
        {
            eprintln!("demo agent stopped: {e}");
        }
    });
    Ok((endpoint, tx))
}

pub async fn demo(opts: DemoOptions) -> anyhow::Result<(RunResult, Planted)> {
    let tmp = tempfile::tempdir()?;
    let dir = match &opts.keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let say = |m: &str| {
        if !opts.json {
            eprintln!("{m}")
        }
    };
    say(&format!(
        "tally demo: writing two {ENGINE} datasets of {} orders in {}",
        opts.rows,
        dir.display()
    ));
    let planted = write_datasets(&dir, opts.rows).await?;
    pki::init_dir(&dir, &[pki::AgentLeaf::new("dc1"), pki::AgentLeaf::new("vpc2")])?;
    let (ep1, stop1) = start_agent(&dir, "dc1").await?;
    let (ep2, stop2) = start_agent(&dir, "vpc2").await?;
    say(&format!(
        "started agent dc1 at {ep1} and agent vpc2 at {ep2} (mutual TLS, certificates and zone keys from a fresh CA)"
    ));
    let tls = TlsMaterial::load(&ClientTls {
        ca: dir.join("ca.pem"),
        cert: dir.join("coordinator.pem"),
        key: dir.join("coordinator-key.pem"),
    })?;
    let spec_text = "name: demo-orders\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n\
                     bisection: { strategy: quantile, factor: 32, threshold: 16384 }\n\
                     reporting: { level: with_keys, sample_limit: 100 }\n";
    let spec_path = dir.join("spec.yaml");
    std::fs::write(&spec_path, spec_text)?;
    let spec = Spec::load(&spec_path)?;
    // recorded as `tally run --data-dir` records a run, so the evidence is signed the
    // same way (and `tally evidence RUN --data-dir DIR` works on a kept demo)
    let log = std::sync::Arc::new(SqliteRunLog::open(&dir.join("runlog.sqlite")).await?);
    let run_id = lifecycle::run_id("demo");
    lifecycle::start(log.as_ref(), &run_id, &spec)
        .await
        .map_err(anyhow::Error::msg)?;
    let result = run(
        &spec,
        &Agent::new("dc1", &ep1, &tls)?,
        &Agent::new("vpc2", &ep2, &tls)?,
        &RunOptions {
            progress: Some(!opts.json),
            record: Some(RunRecord {
                log: log.clone(),
                run_id: run_id.clone(),
                resume: Vec::new(),
            }),
        },
    )
    .await;
    let _ = stop1.send(());
    let _ = stop2.send(());
    let signer = evidence::Signer::load(&ClientTls {
        ca: dir.join("ca.pem"),
        cert: dir.join("coordinator.pem"),
        key: dir.join("coordinator-key.pem"),
    })
    .map_err(anyhow::Error::msg)?;
    lifecycle::finish(log.as_ref(), &run_id, &result, &signer)
        .await
        .map_err(anyhow::Error::msg)?;
    let bundle = evidence::bundle(log.as_ref(), &run_id).await?;
    let bundle_path = dir.join("evidence.json");
    let text = serde_json::to_vec_pretty(&bundle)?;
    std::fs::write(&bundle_path, &text)?;
    let checks = evidence::verify(&text, &std::fs::read(dir.join("ca.pem"))?);
    if !evidence::valid(&checks) {
        let failed = checks.iter().find(|c| c.outcome.is_err());
        anyhow::bail!(
            "the demo's own evidence bundle {} does not verify: {failed:?}",
            bundle_path.display()
        );
    }
    if !opts.json {
        let release_lines = |n: &str| {
            std::fs::read_to_string(dir.join(format!("{n}-release.jsonl")))
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        eprintln!(
            "\nplanted in the copy: changed {:?}, missing {:?}, extra {:?}",
            planted.changed, planted.missing_in_target, planted.extra_in_target
        );
        eprintln!(
            "what crossed the wire: {} aggregate queries per side, each answered with counts and 64-bit sums per \
             segment, sealed: every hash keyed with a run key the two agents derived from their zone keys, which \
             the coordinator cannot compute, so it cannot test guesses against them; each side's smallest and largest key, so the coordinator could cut the key range evenly; \
             for the differing segments only, (key hash, row hash) pairs; then the key values of the {} \
             differing rows, which both agents' policy (max_level: with_keys) allowed. No other row value left \
             either agent. Each agent logged what it released in its own hash-chained log ({} and {} records).\n",
            result.source.queries,
            result.differences.as_ref().map_or(0, Vec::len),
            release_lines("dc1"),
            release_lines("vpc2")
        );
        let kept = match &opts.keep {
            Some(_) => format!(
                "check it again with: tally verify {} --ca {}",
                bundle_path.display(),
                dir.join("ca.pem").display()
            ),
            None => "it is removed with the demo's files; keep them with --keep DIR".to_string(),
        };
        eprintln!(
            "evidence: wrote {} ({} bytes; run {run_id}): the result, the coordinator's signed statement, {} answers \
             each signed by the agent that gave it, the run's {} hash-chained events and the signed checkpoint. \
             Verified offline against the demo CA: {} checks passed; {kept}.\n",
            bundle_path.display(),
            text.len(),
            bundle.agent_results.len(),
            bundle.events.len(),
            checks.len(),
        );
    }
    Ok((result, planted))
}
