//! `tally run SPEC --server URL`: the run happens on `tally serve`; this process
//! submits the spec, prints each level as it is committed (the progress lines of a
//! local run) and the result as a local run prints it, with the same exit codes.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use hyper::Method;
use tally_coordinator::api_client::{ApiClient, ApiGroup, ClientOptions};
use tally_engine::result::LevelOut;
use tally_engine::spec::Spec;

use crate::{RemoteArgs, ScheduleCommand, print_result};

/// The exit code of a run cancelled with Ctrl-C (128 + SIGINT, as shells report it).
const CANCELLED: u8 = 130;

fn token(args: &RemoteArgs) -> Result<Option<String>, String> {
    let token = match &args.token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("--token-file {}: {e}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var("TALLY_TOKEN").ok().map(|t| t.trim().to_string()),
    };
    match token {
        Some(t) if t.is_empty() => Err(match &args.token_file {
            Some(f) => format!("--token-file {}: the file is empty", f.display()),
            None => "TALLY_TOKEN is set but empty".into(),
        }),
        t => Ok(t),
    }
}

/// The line a local run prints for a level (the runtime), from what the service recorded.
fn level_line(started: Instant, l: &LevelOut) -> String {
    let inconsistent = if l.inconsistent > 0 {
        format!(", {} inconsistent parents", l.inconsistent)
    } else {
        String::new()
    };
    format!(
        "[{:>7.2}s] level {}: {} segments, {} differing{inconsistent} ({} ms)",
        started.elapsed().as_secs_f64(),
        l.level,
        l.segments,
        l.differing,
        l.elapsed_ms
    )
}

pub(crate) fn client(server: &str, args: RemoteArgs) -> Result<ApiClient, String> {
    let token = token(&args)?;
    let opts = ClientOptions {
        ca: args.ca,
        token,
        cert: args.cert.zip(args.key),
    };
    ApiClient::new(server, opts).map_err(|e| e.to_string())
}

/// `tally schedule put|list|delete`.
pub async fn cmd_schedule(command: ScheduleCommand) -> ExitCode {
    let fail = |m: String| {
        eprintln!("tally schedule: {m}");
        ExitCode::from(2)
    };
    let answer = |client: &ApiClient, status: u16, body: &serde_json::Value, ok: &[u16]| {
        if ok.contains(&status) {
            Ok(())
        } else {
            let msg = body["error"]
                .as_str()
                .map_or_else(|| body.to_string(), str::to_string);
            Err(format!("{}: {status}: {msg}", client.server()))
        }
    };
    let result = match command {
        ScheduleCommand::Put {
            name,
            cron,
            spec,
            server,
            remote,
        } => {
            async {
                // checked here first: a spec error names its file and key
                let spec = Spec::load(&spec).map_err(|e| e.to_string())?;
                let client = client(&server, remote)?;
                let body = serde_json::json!({ "cron": cron, "spec": spec }).to_string();
                let (status, b) = client
                    .request(Method::PUT, &format!("/v1/schedules/{name}"), &body)
                    .await
                    .map_err(|e| e.to_string())?;
                answer(&client, status, &b, &[200, 201])?;
                let what = if status == 201 { "created" } else { "replaced" };
                println!(
                    "schedule {name} {what}: {} (UTC), next tick {}",
                    b["cron"].as_str().unwrap_or_default(),
                    b["next"].as_str().unwrap_or("none")
                );
                Ok::<(), String>(())
            }
            .await
        }
        ScheduleCommand::List { json, server, remote } => {
            async {
                let client = client(&server, remote)?;
                let (status, b) = client
                    .request(Method::GET, "/v1/schedules", "")
                    .await
                    .map_err(|e| e.to_string())?;
                answer(&client, status, &b, &[200])?;
                if json {
                    println!("{b}");
                    return Ok(());
                }
                let list = b["schedules"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    println!("no schedules");
                }
                for s in list {
                    println!(
                        "{}  {:<20} next {}  spec {}  (by {}, {})",
                        s["name"].as_str().unwrap_or_default(),
                        s["cron"].as_str().unwrap_or_default(),
                        s["next"].as_str().unwrap_or("none"),
                        s["spec"]["name"].as_str().unwrap_or_default(),
                        s["by"].as_str().unwrap_or_default(),
                        s["created"].as_str().unwrap_or_default(),
                    );
                }
                Ok::<(), String>(())
            }
            .await
        }
        ScheduleCommand::Delete { name, server, remote } => {
            async {
                let client = client(&server, remote)?;
                let (status, b) = client
                    .request(Method::DELETE, &format!("/v1/schedules/{name}"), "")
                    .await
                    .map_err(|e| e.to_string())?;
                answer(&client, status, &b, &[200])?;
                println!("schedule {name} deleted");
                Ok::<(), String>(())
            }
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// What `tally runs` asks for.
pub struct RunsPage {
    pub limit: usize,
    pub verdict: Option<String>,
    pub name: Option<String>,
    pub cursor: Option<String>,
}

/// A query parameter's value, percent-encoded (RFC 3986 unreserved characters kept).
fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `tally runs --server URL`: one page of runs, newest first, and how to ask for the next.
pub async fn cmd_runs(server: &str, args: RemoteArgs, q: RunsPage, json: bool) -> ExitCode {
    let result = async {
        let client = client(server, args)?;
        let mut path = format!("/v1/runs?limit={}", q.limit);
        for (k, v) in [("verdict", &q.verdict), ("name", &q.name), ("cursor", &q.cursor)] {
            if let Some(v) = v {
                path.push_str(&format!("&{k}={}", query_value(v)));
            }
        }
        let (status, b) = client
            .request(Method::GET, &path, "")
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            let msg = b["error"].as_str().map_or_else(|| b.to_string(), str::to_string);
            return Err(format!("{}: {status}: {msg}", client.server()));
        }
        if json {
            println!("{b}");
            return Ok(());
        }
        let runs = b["runs"].as_array().cloned().unwrap_or_default();
        if runs.is_empty() {
            println!("no runs");
        }
        for r in &runs {
            let state = match r["state"].as_str() {
                Some("running") => "running".to_string(),
                _ => r["verdict"].as_str().unwrap_or("?").to_string(),
            };
            let when = r["finished"]
                .as_str()
                .or(r["started"].as_str())
                .unwrap_or_default();
            println!(
                "{}  {:<7}  {}  {when}",
                r["id"].as_str().unwrap_or_default(),
                state,
                r["name"].as_str().unwrap_or_default()
            );
        }
        if let Some(next) = b["next_cursor"].as_str() {
            let mut again = format!("tally runs --server {server} --limit {}", q.limit);
            for (flag, v) in [("--verdict", &q.verdict), ("--name", &q.name)] {
                if let Some(v) = v {
                    again.push_str(&format!(" {flag} {v}"));
                }
            }
            println!("more (with your --ca and login flags): {again} --cursor {next}");
        }
        Ok::<(), String>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally runs: {e}");
            ExitCode::from(2)
        }
    }
}

pub async fn cmd_run_server(
    spec: PathBuf,
    server: &str,
    args: RemoteArgs,
    json: bool,
    progress: bool,
) -> ExitCode {
    let fail = |m: String| {
        eprintln!("tally run: {m}");
        ExitCode::from(2)
    };
    let text = match std::fs::read_to_string(&spec) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", spec.display())),
    };
    let token = match token(&args) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let opts = ClientOptions {
        ca: args.ca,
        token,
        cert: args.cert.zip(args.key),
    };
    let client = match ApiGroup::new(server, opts) {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    let progress = progress || std::io::stderr().is_terminal();
    let started = Instant::now();
    let id = match client.start(&text).await {
        Ok(id) => id,
        Err(e) => return fail(e.to_string()),
    };
    eprintln!("tally run: run {id} started on {}", client.server());
    let follow = client.follow(&id, |l| {
        if progress {
            eprintln!("{}", level_line(started, l));
        }
    });
    tokio::select! {
        r = follow => match r {
            Ok(result) => print_result(&result, json),
            Err(e) => fail(format!("run {id}: {e}")),
        },
        _ = tokio::signal::ctrl_c() => {
            match client.cancel(&id).await {
                Ok(()) => eprintln!("tally run: cancelled: run {id} on {} was cancelled", client.server()),
                Err(e) => eprintln!("tally run: cancelled here, but run {id} may go on: the cancel request failed: {e}"),
            }
            ExitCode::from(CANCELLED)
        }
    }
}
