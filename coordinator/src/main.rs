//! `tally`: the coordinator's command line.

mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tally_common::pki;
use tally_coordinator::client::{Agent, TlsMaterial};
use tally_coordinator::config::CoordinatorConfig;
use tally_coordinator::runner::{RunOptions, run};
use tally_coordinator::spec::Spec;

#[derive(Parser, Debug)]
#[command(
    name = "tally",
    version,
    about = "Tally: reconcile datasets across networks without moving rows"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one reconciliation against remote agents (exit 0 match, 1 differ, 2 error).
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
    },
}

fn certs_init(
    out: &std::path::Path,
    agents: &[String],
    sans: &[String],
    api_sans: &[String],
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
    Ok(files)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,sqlx=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tally_agent::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match cli.command {
        Command::Run {
            spec,
            config,
            json,
            progress,
        } => rt.block_on(cmd_run(spec, config, json, progress)),
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
                },
        } => match certs_init(&out, &agents, &sans, &api_sans) {
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
        Command::Demo { rows, json, keep } => rt.block_on(async move {
            let run = demo::demo(demo::DemoOptions { rows, json, keep });
            tokio::select! {
                r = run => match r {
                    Ok((result, _)) => {
                        if json { println!("{}", result.to_json()) } else { print!("{}", result.render()) }
                        ExitCode::from(result.exit_code())
                    }
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

async fn cmd_run(spec: PathBuf, config: PathBuf, json: bool, progress: bool) -> ExitCode {
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
    let opts = RunOptions {
        progress: progress.then_some(true),
        record: None,
    };
    tokio::select! {
        result = run(&spec, &source, &target, &opts) => {
            if json { println!("{}", result.to_json()) } else { print!("{}", result.render()) }
            ExitCode::from(result.exit_code())
        }
        _ = tokio::signal::ctrl_c() => {
            // dropping the run cancels its in-flight calls; agents abandon the queries
            eprintln!("tally run: cancelled");
            ExitCode::from(2)
        }
    }
}
