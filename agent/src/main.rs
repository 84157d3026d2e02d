//! `tally-agent -c agent.yaml` serves; `tally-agent check -c agent.yaml` validates the
//! config, connects to every dataset and prints what it found.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tally_agent::config::AgentConfig;
use tally_agent::connector::Connector;
use tally_agent::dataset::Path;
use tally_agent::server;

#[derive(Parser, Debug)]
#[command(
    name = "tally-agent",
    version,
    about = "Tally agent: counts and checksums from inside one network zone"
)]
struct Cli {
    /// The agent config file.
    #[arg(short = 'c', long = "config", global = true, default_value = "agent.yaml")]
    config: PathBuf,
    /// Log lines as text for people, or one JSON object per line for a log store.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "TALLY_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate the config, connect to every dataset, print what was found (exit 0 or 2).
    Check {
        /// Only validate the config file (no TLS files, environment or databases needed).
        #[arg(long)]
        offline: bool,
    },
    /// Serve (the default).
    Serve,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into()),
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
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tally-agent: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match AgentConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tally-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Check { offline: true } => {
            // pools are created (lazily, never connecting) inside a runtime
            let _rt = rt.enter();
            Ok(check_offline(&cfg, &cli.config))
        }
        Command::Check { offline: false } => rt.block_on(check(&cfg, &cli.config)),
        Command::Serve => rt.block_on(serve(&cfg, &cli.config)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tally-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn serve(cfg: &AgentConfig, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let bound = server::bind(cfg, path).await?;
    tracing::info!(addr = %bound.addr, datasets = cfg.datasets.len(), "agent listening (mutual TLS)");
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
    };
    bound.serve(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Validates the config and each dataset's database URL (its engine, its options) without
/// connecting anywhere; a URL read from an unset variable is reported, not an error.
fn check_offline(cfg: &AgentConfig, path: &std::path::Path) -> ExitCode {
    let mut ok = true;
    println!(
        "{}: valid ({} dataset(s): {})",
        path.display(),
        cfg.datasets.len(),
        cfg.datasets.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    for (name, d) in &cfg.datasets {
        let url = match d.resolve_url(path, name) {
            Ok(u) => u,
            Err(e) => {
                println!("dataset {name}: URL not checked here: {e}");
                continue;
            }
        };
        match Connector::open_with(&url, &cfg.connections) {
            Ok(c) => {
                let engine = c.dialect().name();
                let watermark = d
                    .watermark
                    .as_ref()
                    .map(|w| w.check_engine(name, engine))
                    .transpose();
                match watermark {
                    Ok(_) => println!("dataset {name}: {engine} URL valid (not connected)"),
                    Err(e) => {
                        println!("dataset {name}: {e}");
                        ok = false;
                    }
                }
                if let Some(w) = c.not_live_verified() {
                    println!("  warning: {w}");
                }
            }
            Err(e) => {
                println!("dataset {name}: {e}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(2) }
}

async fn check(cfg: &AgentConfig, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let datasets = server::open_datasets(cfg, path)?;
    let mut ok = true;
    for f in [&cfg.tls.ca, &cfg.tls.cert, &cfg.tls.key] {
        if !f.exists() {
            println!("tls: {} does not exist", f.display());
            ok = false;
        }
    }
    let sealed = match tally_agent::sealing::Zone::load(&cfg.tls) {
        Ok(Some(z)) => {
            println!(
                "zone key: signed for {:?}: checksums are sealed (DESIGN §4.1)",
                z.name
            );
            true
        }
        Ok(None) => {
            println!("zone key: none (tls.zone_key unset): only datasets with allow_unsealed are served");
            false
        }
        Err(e) => {
            println!("zone key: {e}");
            ok = false;
            false
        }
    };
    // datasets on one URL share a connector: connect once per connector
    let mut reached: HashMap<*const Connector, Result<(), String>> = HashMap::new();
    let urls: HashSet<*const Connector> = datasets.values().map(|d| Arc::as_ptr(&d.connector)).collect();
    println!(
        "connections: {} database URL(s), at most {} connection(s) to each",
        urls.len(),
        cfg.connections.max_connections
    );
    for (name, ds) in &datasets {
        let reach = match reached.entry(Arc::as_ptr(&ds.connector)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(ds.connector.ping().await),
        };
        if let Err(driver_text) = reach {
            // the driver's own words: this runs inside the zone, nothing goes on the wire
            println!("dataset {name}: cannot connect: {driver_text}");
            ok = false;
            continue;
        }
        let headers = match &ds.config.file {
            Some(f) => {
                use tally_agent::dataset::{HeaderReader, check_csv_headers};
                check_csv_headers(name, f, HeaderReader::Connector(&ds.connector)).await
            }
            None => Ok(()),
        };
        if let Err(e) = headers {
            println!("dataset {name}: {e}");
            ok = false;
            continue;
        }
        match ds.connector.describe(name, &ds.source, &ds.config.key).await {
            Ok(info) => {
                let d = ds.connector.dialect_for(&info);
                println!("dataset {name}: {} {}", info.engine, info.engine_version);
                if let Some(w) = ds.connector.not_live_verified() {
                    println!("  warning: {w}");
                }
                println!("  key: {}", info.key.join(", "));
                println!("  row estimate: {}", info.row_estimate);
                let in_agent = ds.configured_path() == Path::InProcess;
                let p = &ds.config.policy;
                let methods: Vec<&str> = tally_common::HashMethod::BY_STRENGTH
                    .into_iter()
                    .filter(|m| if m.is_sealed() { sealed } else { p.allow_unsealed })
                    .map(|m| m.name())
                    .collect();
                println!(
                    "  hashing: {} ({}{})",
                    if in_agent {
                        "in_process: the agent reads rows and hashes them"
                    } else {
                        "pushdown: the engine hashes in SQL"
                    },
                    methods.join(", "),
                    if in_agent || d.xor_aggregate("h").is_some() {
                        ", XOR"
                    } else {
                        ", SUM only"
                    }
                );
                println!(
                    "  policy: max_level {}, expose_key_bounds {}, min_segment_rows {}",
                    ds.config.policy.max_level,
                    ds.config.policy.expose_key_bounds,
                    ds.config.policy.min_segment_rows
                );
                println!("  columns:");
                for c in &info.columns {
                    let note = if c.class == tally_common::TypeClass::Other {
                        "  (not comparable: no canonical form)"
                    } else {
                        ""
                    };
                    println!(
                        "    {:<24} {:<12} {}{}{}",
                        c.name,
                        c.class.name(),
                        c.declared_type,
                        if c.nullable { "" } else { " not null" },
                        note
                    );
                }
                if let Some(t) = &ds.throttle {
                    use tally_agent::connector::throttle::{Load, read_load};
                    let mut said = Vec::new();
                    if let Some(r) = t.config.max_rows_per_second {
                        said.push(format!("max_rows_per_second {r}"));
                    }
                    if let Some(max) = t.config.max_load {
                        let probe = ds
                            .connector
                            .probe()
                            .expect("checked when the datasets were opened");
                        match read_load(&probe, name).await {
                            Load::Others(n) => said.push(format!(
                                "max_load {max} ({n} statement(s) running now besides this agent's{})",
                                if n > i64::from(max) {
                                    ": reads would wait"
                                } else {
                                    ""
                                }
                            )),
                            Load::Failed(why) => {
                                said.push(format!("max_load {max}: {why}"));
                                ok = false;
                            }
                            Load::Unknown => {}
                        }
                    }
                    println!("  throttle: {}", said.join(", "));
                }
                if let Some(w) = &ds.config.watermark {
                    match tally_agent::dataset::watermark::read(ds).await {
                        Ok(p) => println!("  watermark: {} reads {p}", w.describe()),
                        Err(e) => {
                            println!("  watermark: {e}");
                            ok = false;
                        }
                    }
                }
            }
            Err(e) => {
                println!("dataset {name}: {e}");
                ok = false;
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(2) })
}
