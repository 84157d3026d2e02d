//! `tally evidence RUN_ID -o FILE` and `tally verify FILE --ca CA` (DESIGN §12,
//! docs/evidence.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hyper::Method;
use tally_coordinator::evidence::{self, Bundle};
use tally_coordinator::runlog::SqliteRunLog;

use crate::{AuditCommand, RemoteArgs};

/// Where `tally evidence` reads a run from.
pub enum Source {
    /// A `tally run --data-dir` (or single-node `tally serve`) data directory.
    DataDir(PathBuf),
    /// `tally serve` at this URL (the auditor role).
    Server(String, RemoteArgs),
}

async fn fetch(run_id: &str, from: Source) -> Result<Bundle, String> {
    match from {
        Source::DataDir(dir) => {
            let log = open_dir(&dir).await?;
            evidence::bundle(&log, run_id).await.map_err(|e| e.to_string())
        }
        Source::Server(url, args) => {
            let body = get(&url, args, &format!("/v1/runs/{run_id}/evidence")).await?;
            serde_json::from_value(body).map_err(|e| format!("{url}: the answer is not a bundle: {e}"))
        }
    }
}

/// `tally evidence`: writes the bundle (exit 0), or says why not (exit 2).
pub async fn cmd_evidence(run_id: String, out: PathBuf, from: Source) -> ExitCode {
    let started = std::time::Instant::now();
    let bundle = match fetch(&run_id, from).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tally evidence: {e}");
            return ExitCode::from(2);
        }
    };
    let text = serde_json::to_vec_pretty(&bundle).expect("bundles serialize");
    if let Err(e) = write_new(&out, &text) {
        eprintln!("tally evidence: {}: {e}", out.display());
        return ExitCode::from(2);
    }
    eprintln!(
        "tally evidence: wrote {} ({} bytes: the result, the signed statement, {} agent-signed answers, {} events, the checkpoint, {} certificates) in {:.2} s; check it with: tally verify {} --ca CA.pem",
        out.display(),
        text.len(),
        bundle.agent_results.len(),
        bundle.events.len(),
        bundle.certificates.len(),
        started.elapsed().as_secs_f64(),
        out.display()
    );
    ExitCode::SUCCESS
}

/// Writes `text` to `path` through a temporary file beside it, so a reader never sees
/// half a bundle.
fn write_new(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp-evidence");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// `tally verify`: prints each check; exit 0 valid, 1 invalid, 2 usage.
pub fn cmd_verify(
    bundle: &Path,
    ca: &Path,
    json: bool,
    log: Option<&Path>,
    since: Option<&Path>,
) -> ExitCode {
    let read = |p: &Path, what: &str| std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display()));
    let (text, ca_pem) = match (read(bundle, "bundle"), read(ca, "--ca")) {
        (Ok(t), Ok(c)) => (t, c),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("tally verify: {e}");
            return ExitCode::from(2);
        }
    };
    let export = match log.map(|p| read(p, "--log")).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("tally verify: {e}");
            return ExitCode::from(2);
        }
    };
    let since = match since.map(|p| {
        read(p, "--since").and_then(|t| {
            serde_json::from_slice::<tally_coordinator::ledger::SignedCheckpoint>(&t).map_err(|e| {
                format!(
                    "--since {}: not a checkpoint (from tally audit checkpoint): {e}",
                    p.display()
                )
            })
        })
    }) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            eprintln!("tally verify: {e}");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let checks = match &export {
        None => evidence::verify(&text, &ca_pem),
        Some(export) => {
            evidence::verify_with_log(&text, &ca_pem, &String::from_utf8_lossy(export), since.as_ref())
        }
    };
    let ok = evidence::valid(&checks);
    if json {
        let list: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| match &c.outcome {
                Ok(d) => serde_json::json!({"check": c.name, "ok": true, "detail": d}),
                Err(d) => serde_json::json!({"check": c.name, "ok": false, "detail": d}),
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"valid": ok, "checks": list}))
                .unwrap_or_default()
        );
    } else {
        for c in &checks {
            match &c.outcome {
                Ok(d) => println!("ok    {}: {d}", c.name),
                Err(d) => println!("FAIL  {}: {d}", c.name),
            }
        }
        if ok {
            println!(
                "{}: valid ({} checks, {:.0} ms)",
                bundle.display(),
                checks.len(),
                started.elapsed().as_secs_f64() * 1000.0
            );
        } else {
            let first = checks
                .iter()
                .find(|c| c.outcome.is_err())
                .map_or("?", |c| c.name.as_str());
            println!("{}: INVALID: {first} failed", bundle.display());
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

fn source(data_dir: Option<PathBuf>, server: Option<String>, remote: RemoteArgs) -> Source {
    match (data_dir, server) {
        (Some(d), _) => Source::DataDir(d),
        (None, Some(s)) => Source::Server(s, remote),
        (None, None) => unreachable!("clap requires one"),
    }
}

async fn open_dir(dir: &Path) -> Result<SqliteRunLog, String> {
    let path = dir.join("runlog.sqlite");
    if !path.exists() {
        return Err(format!(
            "--data-dir {}: no runlog.sqlite (the directory of `tally run --data-dir` or of a single-node `tally serve`)",
            dir.display()
        ));
    }
    SqliteRunLog::open(&path)
        .await
        .map_err(|e| format!("--data-dir {}: {e}", dir.display()))
}

async fn get(url: &str, args: RemoteArgs, path: &str) -> Result<serde_json::Value, String> {
    let client = crate::remote::client(url, args)?;
    let (status, body) = client
        .request(Method::GET, path, "")
        .await
        .map_err(|e| e.to_string())?;
    if status != 200 {
        let msg = body["error"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_string);
        return Err(format!("{url}: {status}: {msg}"));
    }
    Ok(body)
}

/// `tally audit export|checkpoint|verify`.
pub async fn cmd_audit(command: AuditCommand) -> ExitCode {
    let fail = |m: String| {
        eprintln!("tally audit: {m}");
        ExitCode::from(2)
    };
    match command {
        AuditCommand::Export {
            out,
            data_dir,
            server,
            remote,
        } => {
            let lines = match source(data_dir, server, remote) {
                Source::DataDir(d) => match open_dir(&d).await {
                    Ok(log) => tally_coordinator::ledger::export(&log).await,
                    Err(e) => Err(e),
                },
                Source::Server(url, args) => get(&url, args, "/v1/log").await.and_then(|b| {
                    serde_json::from_value::<Vec<String>>(b["lines"].clone())
                        .map_err(|e| format!("{url}: not a log export: {e}"))
                }),
            };
            let lines = match lines {
                Ok(l) => l,
                Err(e) => return fail(e),
            };
            let mut text = lines.join("\n");
            text.push('\n');
            if let Err(e) = write_new(&out, text.as_bytes()) {
                return fail(format!("{}: {e}", out.display()));
            }
            eprintln!("tally audit: wrote {} ({} lines)", out.display(), lines.len());
            ExitCode::SUCCESS
        }
        AuditCommand::Checkpoint {
            out,
            data_dir,
            server,
            remote,
        } => {
            let cp = match source(data_dir, server, remote) {
                Source::DataDir(d) => match open_dir(&d).await {
                    Ok(log) => tally_coordinator::ledger::latest(&log).await.and_then(|c| {
                        c.ok_or_else(|| "no checkpoint yet: one is signed after the first run".into())
                    }),
                    Err(e) => Err(e),
                },
                Source::Server(url, args) => get(&url, args, "/v1/checkpoint").await.and_then(|b| {
                    serde_json::from_value::<tally_coordinator::ledger::SignedCheckpoint>(b)
                        .map_err(|e| format!("{url}: not a checkpoint: {e}"))
                }),
            };
            let cp = match cp {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let text = serde_json::to_vec_pretty(&cp).expect("checkpoints serialize");
            if let Err(e) = write_new(&out, &text) {
                return fail(format!("{}: {e}", out.display()));
            }
            eprintln!("tally audit: wrote {}", out.display());
            ExitCode::SUCCESS
        }
        AuditCommand::Verify { export, ca, since } => {
            let read =
                |p: &Path, what: &str| std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display()));
            let (text, ca_pem) = match (read(&export, "export"), read(&ca, "--ca")) {
                (Ok(t), Ok(c)) => (t, c),
                (Err(e), _) | (_, Err(e)) => return fail(e),
            };
            let Ok(text) = String::from_utf8(text) else {
                return fail(format!("export {}: not UTF-8 text", export.display()));
            };
            let since = match since {
                None => None,
                Some(p) => match read(&p, "--since").and_then(|t| {
                    serde_json::from_slice::<tally_coordinator::ledger::SignedCheckpoint>(&t).map_err(|e| {
                        format!(
                            "--since {}: not a checkpoint (from tally audit checkpoint): {e}",
                            p.display()
                        )
                    })
                }) {
                    Ok(c) => Some(c),
                    Err(e) => return fail(e),
                },
            };
            let checks = tally_coordinator::ledger::verify(&text, &ca_pem, since.as_ref());
            for c in &checks {
                match &c.outcome {
                    Ok(d) => println!("ok    {}: {d}", c.name),
                    Err(d) => println!("FAIL  {}: {d}", c.name),
                }
            }
            if evidence::valid(&checks) {
                println!("{}: valid", export.display());
                ExitCode::SUCCESS
            } else {
                let first = checks
                    .iter()
                    .find(|c| c.outcome.is_err())
                    .map_or("?", |c| c.name.as_str());
                println!("{}: INVALID: {first} failed", export.display());
                ExitCode::from(1)
            }
        }
    }
}
