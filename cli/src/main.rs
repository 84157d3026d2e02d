//! `tally`: the coordinator's command line.

mod demo;
mod evidence_cmd;
mod remote;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tally_common::pki;
use tally_coordinator::client::{Agent, TlsMaterial};
use tally_coordinator::config::CoordinatorConfig;
use tally_coordinator::runtime::{RunOptions, run};
use tally_engine::result::RunResult;
use tally_engine::spec::Spec;

#[derive(Parser, Debug)]
#[command(
    name = "tally",
    version,
    about = "Tally: reconcile datasets across networks without moving rows"
)]
struct Cli {
    /// Log lines as text for people, or one JSON object per line for a log store
    /// (`tally serve`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "TALLY_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `tally serve`'s log filter when `RUST_LOG` is not set.
const SERVE_LOGS: &str = "info,sqlx=error,openraft=off,h2=warn,hyper=warn,tower=warn,tonic=warn";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one reconciliation against remote agents, here or on `tally serve` with
    /// --server (exit 0 match, 1 differ, 2 error).
    Run {
        /// The reconciliation spec (YAML).
        spec: PathBuf,
        /// The coordinator config: TLS identity and agent endpoints.
        #[arg(short = 'c', long = "config", default_value = "coordinator.yaml")]
        config: PathBuf,
        /// Print one JSON object (the stable schema of docs/results.md).
        #[arg(long)]
        json: bool,
        /// Progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
        /// Record the run in DIR/runlog.sqlite (every level before the next), so an
        /// interrupted run can be resumed with --resume.
        #[arg(long = "data-dir", value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Resume the interrupted run RUN_ID recorded under --data-dir: the committed
        /// levels are not asked again.
        #[arg(long, value_name = "RUN_ID", requires = "data_dir")]
        resume: Option<String>,
        /// Run on `tally serve` at URL (https://HOST:PORT) instead of here: the spec is
        /// submitted, its levels followed, its result printed as a local run prints it.
        /// A group's replicas as URL,URL,…: the run is followed through a leader change.
        /// Ctrl-C cancels the run on the server.
        #[arg(long, value_name = "URL[,URL…]", conflicts_with_all = ["config", "data_dir", "resume"])]
        server: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// The coordinator service: an HTTPS API (`api` in the config) that starts runs and
    /// keeps their results in a hash-chained run store under `data_dir`.
    Serve {
        #[arg(short = 'c', long = "config", default_value = "coordinator.yaml")]
        config: PathBuf,
        /// Serve plain HTTP: only without `api.tls` and only on a loopback `listen`
        /// address (local trials).
        #[arg(long)]
        insecure_loopback: bool,
    },
    /// Certificates for trials: a development CA, the coordinator's client certificate
    /// (ClientAuth only), one server certificate per agent and one for the
    /// coordinator's HTTPS API (ServerAuth only).
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
    /// A `tally serve` group: talks to a replica's peer endpoint with the peer
    /// certificate of the config's `cluster.tls` (exit 0 ok, 1 failed, 2 usage).
    Cluster {
        #[arg(
            short = 'c',
            long = "config",
            default_value = "coordinator.yaml",
            global = true
        )]
        config: PathBuf,
        /// The replica to ask, host:port of its peer endpoint (default: cluster.advertise).
        #[arg(long, global = true, value_name = "HOST:PORT")]
        endpoint: Option<String>,
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// A complete reconciliation on this machine with no setup.
    Demo {
        /// Orders per dataset.
        #[arg(long, default_value_t = 200_000)]
        rows: i64,
        #[arg(long)]
        json: bool,
        /// Keep the datasets, certificates and configs in this directory.
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// Lists the runs of `tally serve`, newest first, a page at a time (GET /v1/runs;
    /// exit 0 listed, 2 error).
    Runs {
        #[arg(long, value_name = "URL")]
        server: String,
        /// Runs per page (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only runs with this verdict: match, differ, error, or running.
        #[arg(long)]
        verdict: Option<String>,
        /// Only runs of this spec name.
        #[arg(long)]
        name: Option<String>,
        /// The page after this run (the cursor a page ends with).
        #[arg(long)]
        cursor: Option<String>,
        /// Print the page as the API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Scheduled runs on `tally serve`: a cron expression (UTC) and a spec; changing
    /// them needs the admin role (exit 0 ok, 2 error).
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// Write a finished run's evidence bundle (docs/evidence.md): its result, the
    /// coordinator's signed statement, every agent-signed answer, its run-log lines with
    /// the signed checkpoint, and the certificates (exit 0 written, 2 error).
    Evidence {
        /// The run's id.
        run_id: String,
        /// Where to write the bundle (JSON).
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: PathBuf,
        /// Read the run from this data directory (`tally run --data-dir`, or a
        /// single-node `tally serve`'s data_dir).
        #[arg(
            long = "data-dir",
            value_name = "DIR",
            required_unless_present = "server",
            conflicts_with = "server"
        )]
        data_dir: Option<PathBuf>,
        /// Fetch it from `tally serve` at URL (the auditor role).
        #[arg(long, value_name = "URL")]
        server: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// The run log as an auditor checks it over time: export it, fetch its latest
    /// signed checkpoint, and verify that an export extends an older checkpoint
    /// (exit 0 ok / valid, 1 invalid, 2 usage or error).
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Check an evidence bundle offline against the CA: every check of docs/evidence.md,
    /// each printed, the first that fails named (exit 0 valid, 1 invalid, 2 usage).
    Verify {
        /// The bundle (from `tally evidence`).
        bundle: PathBuf,
        /// The CA certificate(s) (PEM) the coordinator's and agents' certificates chain to.
        #[arg(long, value_name = "FILE")]
        ca: PathBuf,
        /// Print one JSON object: {valid, checks: [{check, ok, detail}]}.
        #[arg(long)]
        json: bool,
        /// Also check the bundle against an export of the whole log (`tally audit
        /// export`): the log verifies, and the bundle's events are its run's lines there.
        #[arg(long, value_name = "EXPORT")]
        log: Option<PathBuf>,
        /// With --log: an older signed checkpoint the log must extend.
        #[arg(long, value_name = "CHECKPOINT", requires = "log")]
        since: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ScheduleCommand {
    /// Creates (or replaces) schedule NAME: a run of SPEC at each tick of --cron.
    Put {
        name: String,
        /// Five fields (minute hour day-of-month month day-of-week) or six (seconds
        /// first), UTC; or @daily, @hourly, ... (docs/operations.md).
        #[arg(long)]
        cron: String,
        /// The reconciliation spec (YAML).
        spec: PathBuf,
        #[arg(long, value_name = "URL")]
        server: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Lists the schedules, each with its next tick.
    List {
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "URL")]
        server: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Removes schedule NAME (its runs stay).
    Delete {
        name: String,
        #[arg(long, value_name = "URL")]
        server: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

/// How `tally run --server` trusts and logs in to the API.
#[derive(clap::Args, Debug)]
struct RemoteArgs {
    /// The CA of the API's server certificate (api-ca.pem from `tally certs init`).
    #[arg(long, value_name = "FILE", requires = "server")]
    ca: Option<PathBuf>,
    /// A file holding the bearer token (else the environment variable TALLY_TOKEN).
    #[arg(long = "token-file", value_name = "FILE", requires = "server")]
    token_file: Option<PathBuf>,
    /// A client certificate from the API's CA (PEM), with --key.
    #[arg(long, value_name = "FILE", requires_all = ["server", "key"])]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Write every line of the run log (each run's chain, the ledger of run heads and
    /// the signed checkpoints) to FILE, one per line.
    Export {
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: PathBuf,
        #[arg(
            long = "data-dir",
            value_name = "DIR",
            required_unless_present = "server",
            conflicts_with = "server"
        )]
        data_dir: Option<PathBuf>,
        /// `tally serve` at URL (the auditor role).
        #[arg(long, value_name = "URL")]
        server: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write the log's latest signed checkpoint to FILE: keep it, and check later
    /// exports against it with `tally audit verify --since FILE`.
    Checkpoint {
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: PathBuf,
        #[arg(
            long = "data-dir",
            value_name = "DIR",
            required_unless_present = "server",
            conflicts_with = "server"
        )]
        data_dir: Option<PathBuf>,
        #[arg(long, value_name = "URL")]
        server: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Check an export offline: every chain links, every run head the ledger pinned is
    /// in it, every checkpoint is the coordinator's; with --since, that it extends that
    /// older checkpoint (no run recorded before it was rewritten).
    Verify {
        /// The export (from `tally audit export`).
        export: PathBuf,
        /// The CA the coordinator's certificate chains to.
        #[arg(long, value_name = "FILE")]
        ca: PathBuf,
        /// An older signed checkpoint (from `tally audit checkpoint`).
        #[arg(long, value_name = "CHECKPOINT")]
        since: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Initializes a group on a replica whose log is empty: this replica alone, or
    /// `--members` in order (member i gets id i+1).
    Init {
        #[arg(long, value_delimiter = ',')]
        members: Vec<String>,
    },
    /// Adds replica ID (peer endpoint ADDR) as a learner, then as a voter (on the leader).
    Join {
        #[arg(long)]
        id: u64,
        #[arg(long, value_name = "HOST:PORT")]
        addr: String,
    },
    /// Removes replica ID from the group (on the leader).
    Remove {
        #[arg(long)]
        id: u64,
    },
    /// Leader, term, members and each member's matched log index.
    Status {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum CertsCommand {
    /// Write ca.pem, coordinator.pem, NAME.pem and NAME-zone.key per agent, and
    /// coordinator-api.pem from its own api-ca.pem (existing files are kept).
    Init {
        #[arg(long)]
        out: PathBuf,
        /// An agent, `NAME` or `NAME=SAN1,SAN2` (repeatable): its certificate is valid
        /// for NAME, localhost, 127.0.0.1 and its own SANs (DNS names or IPs).
        #[arg(long = "agent", required = true)]
        agents: Vec<String>,
        /// Refused: it put every name on every agent's certificate. Use
        /// `--agent NAME=SAN1,SAN2`.
        #[arg(long = "san", hide = true)]
        sans: Vec<String>,
        /// A name (DNS or IP) of `tally serve`'s HTTPS API (repeatable), besides
        /// localhost and 127.0.0.1: on coordinator-api.pem, ServerAuth only, issued by
        /// api-ca.pem (never by the agents' CA, whose server certificates agents accept as
        /// sealed-run peers).
        #[arg(long = "api-san")]
        api_sans: Vec<String>,
        /// A replica of a `tally serve` group, `NAME` or `NAME=SAN1,SAN2` (repeatable):
        /// peer-NAME.pem (ServerAuth and ClientAuth, for `cluster.tls`) from its own
        /// peer-ca.pem; name it by the host its peers reach it at.
        #[arg(long = "peer")]
        peers: Vec<String>,
    },
}

fn certs_init(
    out: &std::path::Path,
    agents: &[String],
    sans: &[String],
    api_sans: &[String],
    peers: &[String],
) -> Result<Vec<pki::FileOutcome>, String> {
    if !sans.is_empty() {
        return Err(
            "--san is no longer accepted: it put every name on every agent's certificate, so one \
             agent could impersonate another; give each agent its own names with --agent NAME=SAN1,SAN2"
                .into(),
        );
    }
    let agents = agents
        .iter()
        .map(|a| pki::AgentLeaf::parse(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut files = pki::init_dir(out, &agents).map_err(|e| e.to_string())?;
    files.push(pki::init_api_cert(out, api_sans).map_err(|e| e.to_string())?);
    if !peers.is_empty() {
        let peers = peers
            .iter()
            .map(|a| {
                pki::AgentLeaf::parse(a)
                    .map_err(|_| format!("invalid --peer {a:?}: expected NAME or NAME=SAN1,SAN2"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        files.extend(pki::init_peer_certs(out, &peers).map_err(|e| e.to_string())?);
    }
    Ok(files)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                if matches!(cli.command, Command::Serve { .. }) {
                    // a service logs its lifecycle at INFO and keeps WARN and ERROR for
                    // what a person should look at: openraft's own lines (an ERROR per
                    // replication retry while a member is down) are off; the cluster
                    // logs a member going and coming back once each
                    SERVE_LOGS.into()
                } else {
                    "warn,sqlx=error".into()
                }
            }),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        // colour codes only where a person reads a terminal, never in a log file or a pipe
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    tally_agent::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match cli.command {
        Command::Run {
            spec,
            json,
            progress,
            server: Some(server),
            remote,
            ..
        } => rt.block_on(remote::cmd_run_server(spec, &server, remote, json, progress)),
        Command::Run {
            spec,
            config,
            json,
            progress,
            data_dir,
            resume,
            server: None,
            ..
        } => rt.block_on(cmd_run(spec, config, json, progress, data_dir, resume)),
        Command::Serve {
            config,
            insecure_loopback,
        } => rt.block_on(async move {
            let cfg = match CoordinatorConfig::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tally serve: {e}");
                    return ExitCode::from(2);
                }
            };
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let shutdown = async move {
                #[cfg(unix)]
                {
                    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                    tokio::select! { _ = shutdown => {}, _ = term.recv() => {} }
                }
                #[cfg(not(unix))]
                shutdown.await;
            };
            let ready = |addr, scheme| eprintln!("tally serve: listening on {scheme}://{addr}");
            let opts = tally_coordinator::serve::ServeOptions { insecure_loopback };
            match tally_coordinator::serve::serve(&cfg, &config, opts, shutdown, ready).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tally serve: {e}");
                    ExitCode::from(2)
                }
            }
        }),
        Command::Certs {
            command:
                CertsCommand::Init {
                    out,
                    agents,
                    sans,
                    api_sans,
                    peers,
                },
        } => match certs_init(&out, &agents, &sans, &api_sans, &peers) {
            Ok(files) => {
                for f in files {
                    match f {
                        pki::FileOutcome::Written(p) => println!("wrote {}", p.display()),
                        pki::FileOutcome::Kept(p) => println!("kept  {}", p.display()),
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tally certs init: {e}");
                ExitCode::from(2)
            }
        },
        Command::Cluster {
            config,
            endpoint,
            command,
        } => rt.block_on(cmd_cluster(config, endpoint, command)),
        Command::Schedule { command } => rt.block_on(remote::cmd_schedule(command)),
        Command::Runs {
            server,
            limit,
            verdict,
            name,
            cursor,
            json,
            remote,
        } => rt.block_on(remote::cmd_runs(
            &server,
            remote,
            remote::RunsPage {
                limit,
                verdict,
                name,
                cursor,
            },
            json,
        )),
        Command::Evidence {
            run_id,
            out,
            data_dir,
            server,
            remote,
        } => {
            let from = match (data_dir, server) {
                (Some(d), _) => evidence_cmd::Source::DataDir(d),
                (None, Some(s)) => evidence_cmd::Source::Server(s, remote),
                (None, None) => unreachable!("clap requires one"),
            };
            rt.block_on(evidence_cmd::cmd_evidence(run_id, out, from))
        }
        Command::Verify {
            bundle,
            ca,
            json,
            log,
            since,
        } => evidence_cmd::cmd_verify(&bundle, &ca, json, log.as_deref(), since.as_deref()),
        Command::Audit { command } => rt.block_on(evidence_cmd::cmd_audit(command)),
        Command::Demo { rows, json, keep } => rt.block_on(async move {
            let run = demo::demo(demo::DemoOptions { rows, json, keep });
            tokio::select! {
                r = run => match r {
                    Ok((result, _)) => print_result(&result, json),
                    Err(e) => {
                        eprintln!("tally demo: {e:#}");
                        ExitCode::from(2)
                    }
                },
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("tally demo: cancelled");
                    ExitCode::from(2)
                }
            }
        }),
    }
}

/// A run's result on stdout, the summary or `--json`; its exit code (0 match, 1
/// differ, 2 error). The same for a local run and one on `tally serve`.
fn print_result(result: &RunResult, json: bool) -> ExitCode {
    if json {
        println!("{}", result.to_json())
    } else {
        print!("{}", result.render())
    }
    ExitCode::from(result.exit_code())
}

async fn cmd_cluster(config: PathBuf, endpoint: Option<String>, command: ClusterCommand) -> ExitCode {
    use tally_coordinator::cluster_cli::{self, ClusterCliError};
    use tally_coordinator::raft::peer::{AdminRequest, AdminResponse};
    let run = async {
        let cfg = CoordinatorConfig::load(&config).map_err(|e| ClusterCliError::Usage(e.to_string()))?;
        let (tls, addr) = cluster_cli::target(&cfg, endpoint)?;
        let req = match command {
            ClusterCommand::Status { json } => {
                let s = cluster_cli::status(&tls, &addr).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
                } else {
                    print!("{}", cluster_cli::render(&s));
                }
                return Ok(());
            }
            ClusterCommand::Init { members } => AdminRequest::Init { members },
            ClusterCommand::Join { id, addr } => AdminRequest::Join { id, addr },
            ClusterCommand::Remove { id } => AdminRequest::Remove { id },
        };
        match cluster_cli::admin(&tls, &addr, req).await? {
            AdminResponse::Done { message } => {
                println!("{message}");
                Ok(())
            }
            other => Err(ClusterCliError::Failed(format!("unexpected answer {other:?}"))),
        }
    };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally cluster: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn cmd_run(
    spec: PathBuf,
    config: PathBuf,
    json: bool,
    progress: bool,
    data_dir: Option<PathBuf>,
    resume: Option<String>,
) -> ExitCode {
    let fail = |m: String| {
        eprintln!("tally run: {m}");
        ExitCode::from(2)
    };
    let cfg = match CoordinatorConfig::load(&config) {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    let spec = match Spec::load(&spec) {
        Ok(s) => s,
        Err(e) => return fail(e.to_string()),
    };
    let tls = match TlsMaterial::load(&cfg.tls) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", config.display())),
    };
    let agent = |side: &str, name: &str| -> Result<Agent, String> {
        let a = cfg.agents.get(name).ok_or_else(|| {
            format!(
                "{side}.agent {name:?} is not in {} (agents: {})",
                config.display(),
                cfg.agents.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        Agent::new(name, &a.endpoint, &tls).map_err(|e| e.to_string())
    };
    let (source, target) = match (
        agent("source", &spec.source.agent),
        agent("target", &spec.target.agent),
    ) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let record = match &data_dir {
        None => None,
        Some(dir) => match record_run(dir, &spec, resume.as_deref()).await {
            Ok(r) => Some(r),
            Err(e) => return fail(e),
        },
    };
    let opts = RunOptions {
        progress: progress.then_some(true),
        record: record.clone(),
    };
    let signer = tally_coordinator::evidence::Signer::load(&cfg.tls);
    tokio::select! {
        result = run(&spec, &source, &target, &opts) => {
            if let Some(r) = &record {
                use tally_coordinator::lifecycle;
                let closed = r
                    .log
                    .append(&r.run_id, lifecycle::finished_event(&result, &[]))
                    .await
                    .map_err(|e| format!("cannot close the run's record: {e}"))
                    .and_then(|_| {
                        signer.as_ref().map_err(|e| {
                            format!("cannot sign the run's evidence: {}: tls: {e}", config.display())
                        })
                    });
                match closed {
                    Err(e) => eprintln!("tally run: {e}"),
                    Ok(s) => match lifecycle::seal(r.log.as_ref(), &r.run_id, &result, s).await {
                        Ok(()) => eprintln!(
                            "tally run: signed the run's evidence; write its bundle with: tally evidence {} --data-dir {} -o {}.evidence.json",
                            r.run_id,
                            data_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
                            r.run_id
                        ),
                        Err(e) => eprintln!("tally run: cannot sign the run's evidence: {e}"),
                    },
                }
            }
            print_result(&result, json)
        }
        _ = tokio::signal::ctrl_c() => {
            // dropping the run cancels its in-flight calls; agents abandon the queries
            eprintln!("tally run: cancelled");
            ExitCode::from(2)
        }
    }
}

/// The run's record under `dir`: a new run (its id printed on stderr), or the
/// interrupted run `resume`, whose spec must be the one given.
async fn record_run(
    dir: &std::path::Path,
    spec: &Spec,
    resume: Option<&str>,
) -> Result<tally_coordinator::runtime::RunRecord, String> {
    use tally_coordinator::runlog::{RunLog, SqliteRunLog};
    std::fs::create_dir_all(dir).map_err(|e| format!("--data-dir {}: {e}", dir.display()))?;
    let log = std::sync::Arc::new(
        SqliteRunLog::open(&dir.join("runlog.sqlite"))
            .await
            .map_err(|e| format!("--data-dir {}: {e}", dir.display()))?,
    );
    let spec_json = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    let (run_id, events) = match resume {
        Some(id) => {
            let events = log.load(id).await.map_err(|e| e.to_string())?;
            let Some(start) = events.iter().find(|e| e["event"] == "started") else {
                return Err(format!("--resume {id}: no such run in {}", dir.display()));
            };
            if events.iter().any(|e| e["event"] == "finished") {
                return Err(format!("--resume {id}: the run finished already"));
            }
            if start["spec"] != spec_json {
                return Err(format!(
                    "--resume {id}: the spec differs from the one the run started with; resume with that spec"
                ));
            }
            eprintln!(
                "tally run: resuming run {id} ({} levels committed)",
                events.iter().filter(|e| e["event"] == "level").count()
            );
            (id.to_string(), events)
        }
        None => {
            let id = tally_coordinator::lifecycle::run_id(&std::process::id().to_string());
            tally_coordinator::lifecycle::start(log.as_ref(), &id, spec).await?;
            eprintln!(
                "tally run: recording run {id} in {}; if it is interrupted, resume it with --data-dir {} --resume {id}",
                dir.display(),
                dir.display()
            );
            (id, Vec::new())
        }
    };
    Ok(tally_coordinator::runtime::RunRecord {
        log,
        run_id,
        resume: events,
    })
}
