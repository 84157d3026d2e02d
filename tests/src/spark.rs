//! A throw-away Spark Connect server for live tests: one per test process, started
//! from the pyspark venv `.ci/run` installs (`TALLY_SPARK_HOME`, by default
//! `$HOME/.cache/tally-spark/4.3.0`) in the foreground (`spark-submit` execs the JVM, so
//! the child is the server), on 127.0.0.1 and a free port, with its warehouse, local
//! and log directories in a fresh temp directory. A detached reaper kills it and
//! removes the directory when the test process exits, however it exits.
//! `TALLY_TEST_SPARK_URL` points the tests at an existing server instead.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::db::reaper;
use crate::proc::{free_port, wait_for_port};

/// The pyspark version `.ci/run` installs.
pub const SPARK_VERSION: &str = "4.3.0";

#[derive(Debug)]
pub struct SparkServer {
    /// The agent's URL of the server (`spark://127.0.0.1:PORT`).
    pub url: String,
    /// How long the server took to accept connections (zero for an existing one).
    pub startup: Duration,
}

/// The venv holding pyspark: `TALLY_SPARK_HOME`, or `.ci/run`'s default.
pub fn venv() -> PathBuf {
    match std::env::var_os("TALLY_SPARK_HOME") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/tally-spark")
            .join(SPARK_VERSION),
    }
}

/// The pyspark package directory of the venv (its jars and `bin/spark-submit`).
fn spark_home(venv: &std::path::Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/pyspark"))
        .find(|p| p.join("bin/spark-submit").exists() && p.join("jars").is_dir())
}

/// The test process's Spark Connect server.
pub fn server() -> &'static SparkServer {
    static S: OnceLock<SparkServer> = OnceLock::new();
    S.get_or_init(start)
}

// the JVM outlives the handle on purpose: the reaper stops it when this process ends
#[allow(clippy::zombie_processes)]
fn start() -> SparkServer {
    if let Ok(url) = std::env::var("TALLY_TEST_SPARK_URL") {
        return SparkServer {
            url,
            startup: Duration::ZERO,
        };
    }
    let v = venv();
    let home = spark_home(&v).unwrap_or_else(|| {
        panic!(
            "no pyspark {SPARK_VERSION} in {} (set TALLY_SPARK_HOME): .ci/run installs it \
             (python3 -m venv {0} && {0}/bin/pip install 'pyspark[connect]=={SPARK_VERSION}'); \
             it needs a JDK 17 (apt install openjdk-17-jre-headless)",
            v.display()
        )
    });
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("tally-spark-{}-{port}", std::process::id()));
    for d in ["local", "logs", "conf", "warehouse", "derby"] {
        std::fs::create_dir_all(dir.join(d)).expect("spark temp dir");
    }
    let log = std::fs::File::create(dir.join("server.log")).expect("spark log file");
    let started = Instant::now();
    let child = Command::new(home.join("bin/spark-submit"))
        .env("SPARK_HOME", &home)
        .env("SPARK_LOCAL_IP", "127.0.0.1")
        .env("SPARK_LOCAL_DIRS", dir.join("local"))
        .env("SPARK_LOG_DIR", dir.join("logs"))
        .env("SPARK_CONF_DIR", dir.join("conf"))
        .env("PYSPARK_PYTHON", v.join("bin/python"))
        .args([
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "tally-spark-connect",
            "--master",
            "local[2]",
            "--driver-memory",
            "512m",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
        ])
        .arg(format!("spark.connect.grpc.binding.port={port}"))
        .args([
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            // the agent sets both per session; the server's defaults are the other way
            // round on purpose, so a session that did not set them would be caught
            "--conf",
            "spark.sql.session.timeZone=America/New_York",
            "--conf",
            "spark.sql.ansi.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            // result streams cut after 16 KB and Arrow batches of at most 500 rows: a
            // result of more than a few batches is read across ReattachExecute calls,
            // as a Databricks or Spark server does after two minutes or 1 GB
            "--conf",
            "spark.connect.execute.reattachable.senderMaxStreamSize=16k",
            "--conf",
            "spark.sql.execution.arrow.maxRecordsPerBatch=500",
            "--conf",
        ])
        .arg(format!(
            "spark.sql.warehouse.dir={}",
            dir.join("warehouse").display()
        ))
        .arg("--conf")
        .arg(format!(
            "spark.driver.extraJavaOptions=-Dderby.system.home={} -Duser.timezone=America/New_York",
            dir.join("derby").display()
        ))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting spark-submit from {}: {e}", home.display()));
    reaper(&format!(
        "kill -9 {} 2>/dev/null; sleep 1; rm -rf {}",
        child.id(),
        dir.display()
    ));
    if !wait_for_port(port, Duration::from_secs(120)) {
        let tail = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        let tail: String = tail
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!("the Spark Connect server did not listen on 127.0.0.1:{port} within 120 s:\n{tail}");
    }
    let startup = started.elapsed();
    eprintln!("spark connect {SPARK_VERSION} up on 127.0.0.1:{port} in {startup:.1?}");
    SparkServer {
        url: format!("spark://127.0.0.1:{port}"),
        startup,
    }
}
