//! A two-zone deployment on one machine: certificates from `tally certs init`, one
//! `tally-agent` process per database, a coordinator config, and `tally run`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bins;
use crate::proc::{ChildGuard, free_port, wait_for_port};

/// An agent process serving one dataset.
#[derive(Debug)]
pub struct AgentProc {
    pub name: String,
    pub port: u16,
    pub guard: ChildGuard,
    pub release_log: PathBuf,
}

/// Where a test deployment lives.
#[derive(Debug)]
pub struct Deployment {
    pub dir: tempfile::TempDir,
    pub agents: Vec<AgentProc>,
    /// Environment variables every agent of this deployment starts with (credentials
    /// an agent takes from its environment, such as S3's).
    pub agent_env: Vec<(String, String)>,
}

/// What `tally run --json` printed, and how it exited.
#[derive(Debug)]
pub struct RunOutput {
    pub code: i32,
    pub json: serde_json::Value,
    pub stdout: String,
    pub stderr: String,
}

impl Deployment {
    /// Makes certificates for the named agents with the real `tally certs init`.
    pub fn new(agent_names: &[&str]) -> Deployment {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(bins::tally());
        cmd.args(["certs", "init", "--out"]).arg(dir.path().join("certs"));
        for a in agent_names {
            cmd.args(["--agent", a]);
        }
        let out = cmd.output().expect("tally certs init");
        assert!(
            out.status.success(),
            "tally certs init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Deployment {
            dir,
            agents: Vec::new(),
            agent_env: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `tally-agent` with one dataset; `dataset_yaml` is the body of the
    /// dataset entry (url, table, key, policy), indented by the caller's choice.
    pub fn start_agent(&mut self, name: &str, dataset: &str, dataset_yaml: &str) -> u16 {
        self.start_agent_datasets(name, &[(dataset.to_string(), dataset_yaml.to_string())])
    }

    /// Starts `tally-agent` serving every `(dataset, body)` pair, bodies as in
    /// [`Deployment::start_agent`].
    pub fn start_agent_datasets(&mut self, name: &str, datasets: &[(String, String)]) -> u16 {
        let port = free_port();
        let log = self.path().join(format!("{name}-release.jsonl"));
        let mut cfg = format!(
            "listen: 127.0.0.1:{port}\n\
             tls: {{ ca: certs/ca.pem, cert: certs/{name}.pem, key: certs/{name}-key.pem, zone_key: certs/{name}-zone.key, allowed_clients: [coordinator] }}\n\
             release_log: {}\n\
             datasets:\n",
            log.display()
        );
        for (dataset, dataset_yaml) in datasets {
            cfg.push_str(&format!("  {dataset}: {dataset_yaml}\n"));
        }
        let path = self.path().join(format!("{name}.yaml"));
        std::fs::write(&path, cfg).expect("agent config");
        let stderr = std::fs::File::create(self.path().join(format!("{name}.log"))).expect("agent log");
        let guard = ChildGuard::spawn(
            name,
            Command::new(bins::tally_agent())
                .envs(self.agent_env.iter().map(|(k, v)| (k, v)))
                .arg("-c")
                .arg(&path)
                .stdout(stderr.try_clone().unwrap())
                .stderr(stderr),
        )
        .expect("starting tally-agent");
        assert!(
            wait_for_port(port, Duration::from_secs(20)),
            "agent {name} did not listen; see {name}.log"
        );
        self.agents.push(AgentProc {
            name: name.into(),
            port,
            guard,
            release_log: log,
        });
        port
    }

    /// Starts agent `name` again (after its process was killed) with the same config
    /// and port: a restart, as a supervisor would do it.
    pub fn restart_agent(&mut self, name: &str) {
        let path = self.path().join(format!("{name}.yaml"));
        let log_path = self.path().join(format!("{name}.log"));
        let env = self.agent_env.clone();
        let a = self.agent(name);
        a.guard.kill();
        let stderr = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log_path)
            .expect("agent log");
        a.guard = ChildGuard::spawn(
            name,
            Command::new(bins::tally_agent())
                .envs(env)
                .arg("-c")
                .arg(&path)
                .stdout(stderr.try_clone().unwrap())
                .stderr(stderr),
        )
        .expect("starting tally-agent");
        assert!(
            wait_for_port(a.port, Duration::from_secs(20)),
            "agent {name} did not listen again; see {name}.log"
        );
    }

    pub fn agent(&mut self, name: &str) -> &mut AgentProc {
        self.agents.iter_mut().find(|a| a.name == name).expect("agent")
    }

    /// Writes coordinator.yaml naming every started agent.
    pub fn coordinator_config(&self) -> PathBuf {
        let mut cfg = String::from(
            "tls: { ca: certs/ca.pem, cert: certs/coordinator.pem, key: certs/coordinator-key.pem }\nagents:\n",
        );
        for a in &self.agents {
            cfg.push_str(&format!(
                "  {}: {{ endpoint: \"https://localhost:{}\" }}\n",
                a.name, a.port
            ));
        }
        let p = self.path().join("coordinator.yaml");
        std::fs::write(&p, cfg).expect("coordinator config");
        p
    }

    /// Writes a spec and starts `tally run --json` on it (for tests that act mid-run).
    pub fn spawn_run(&self, spec: &str) -> std::process::Child {
        let spec_path = self.path().join("spec.yaml");
        std::fs::write(&spec_path, spec).expect("spec");
        Command::new(bins::tally())
            .arg("run")
            .arg(&spec_path)
            .arg("-c")
            .arg(self.coordinator_config())
            .args(["--json", "--progress"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tally run")
    }

    /// Runs `tally run --json` to completion.
    pub fn run(&self, spec: &str) -> RunOutput {
        let out = self.spawn_run(spec).wait_with_output().expect("tally run");
        parse_run(out)
    }
}

/// A run result's differences as (kind, first key column as an integer).
pub fn differences(j: &serde_json::Value) -> std::collections::BTreeSet<(String, i64)> {
    j["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["key"][0].as_i64().unwrap(),
            )
        })
        .collect()
}

pub fn parse_run(out: std::process::Output) -> RunOutput {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("tally run printed no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}"));
    RunOutput {
        code: out.status.code().unwrap_or(-1),
        json,
        stdout,
        stderr,
    }
}
