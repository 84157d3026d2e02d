//! Throw-away database servers for live tests.
//!
//! PostgreSQL: `initdb` + `pg_ctl` from `pg_config --bindir` (run as the `postgres`
//! user when the tests run as root), trust auth, listening on 127.0.0.1 only.
//! MariaDB: `mariadb-install-db` + `mariadbd`, root without password, 127.0.0.1 only.
//! Each server lives in a fresh temp directory; a detached reaper stops it and
//! removes the directory when the test process exits, however it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::proc::free_port;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    MariaDb,
}

#[derive(Debug)]
pub struct Server {
    pub kind: Kind,
    pub host: String,
    pub port: u16,
    /// URL of the server without a database (admin user).
    base_url: String,
    /// The network namespace it runs in, if not this process's.
    pub ns: Option<String>,
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Starts a detached process that runs `cleanup` once this test process is gone.
// detached on purpose: it must outlive this process, so nobody here waits for it
#[allow(clippy::zombie_processes)]
pub fn reaper(cleanup: &str) {
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 1; done; {cleanup}",
        std::process::id()
    );
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setsid (util-linux) is needed to clean up test servers");
}

fn temp_dir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn pg_bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("PostgreSQL server binaries not found: install them (apt install postgresql) or set TALLY_TEST_PG_URL")
    })
}

/// A command, run inside network namespace `ns` when given.
pub fn in_ns(ns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn start_postgres() -> Server {
    if let Ok(url) = std::env::var("TALLY_TEST_PG_URL") {
        return Server::from_url(Kind::Postgres, &url);
    }
    start_postgres_in(None)
}

/// A PostgreSQL listening on 127.0.0.1 of network namespace `ns` (of this one when
/// `None`), removed when the test process exits.
pub fn start_postgres_in(ns: Option<&str>) -> Server {
    start_postgres_with(ns, 100, &[])
}

/// A PostgreSQL of this test's own with extra server settings (`-c name=value`
/// each), for replication tests.
pub fn start_postgres_configured(settings: &[&str]) -> Server {
    start_postgres_with(None, 100, settings)
}

/// A PostgreSQL of this test's own (never `TALLY_TEST_PG_URL`'s) that admits at most
/// `max_connections` clients, for tests of connection limits.
pub fn start_postgres_with_max_connections(max_connections: u32) -> Server {
    start_postgres_with(None, max_connections, &[])
}

fn start_postgres_with(ns: Option<&str>, max_connections: u32, settings: &[&str]) -> Server {
    let bin = pg_bindir();
    let dir = temp_dir("tally-pg");
    let data = dir.join("data");
    // a fresh namespace has every port free
    let port = if ns.is_some() { 5432 } else { free_port() };
    let root = is_root();
    let as_pg = |exe: &str| -> Command {
        let mut c = if root {
            let mut c = in_ns(ns, "runuser");
            c.args(["-u", "postgres", "--"]).arg(bin.join(exe));
            c
        } else {
            in_ns(ns, bin.join(exe))
        };
        c.stdin(Stdio::null());
        c
    };
    if root {
        run(
            Command::new("chown").args(["-R", "postgres"]).arg(&dir),
            "chown test dir",
        );
    }
    run(
        as_pg("initdb").args(["-D"]).arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]),
        "initdb",
    );
    reaper(&format!(
        "{}{} {} -D {} stop -m immediate; rm -rf {}",
        ns.map(|n| format!("ip netns exec {n} ")).unwrap_or_default(),
        if root { "runuser -u postgres --" } else { "" },
        bin.join("pg_ctl").display(),
        data.display(),
        dir.display()
    ));
    let opts = format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
         -c max_connections={max_connections} -c shared_buffers=256MB{}",
        dir.display(),
        settings.iter().map(|s| format!(" -c {s}")).collect::<String>()
    );
    run(
        as_pg("pg_ctl")
            .args(["-D"])
            .arg(&data)
            .args(["-l"])
            .arg(dir.join("log"))
            .args(["-o", &opts, "-w", "-t", "60", "start"]),
        "pg_ctl start",
    );
    let s = Server {
        kind: Kind::Postgres,
        host: "127.0.0.1".into(),
        port,
        base_url: format!("postgres://postgres@127.0.0.1:{port}"),
        ns: ns.map(str::to_string),
    };
    s.wait_ready(&dir);
    s
}

fn start_mariadb() -> Server {
    if let Ok(url) = std::env::var("TALLY_TEST_MYSQL_URL") {
        return Server::from_url(Kind::MariaDb, &url);
    }
    start_mariadb_in(None)
}

/// A MariaDB listening on 127.0.0.1 of network namespace `ns` (of this one when
/// `None`), removed when the test process exits.
pub fn start_mariadb_in(ns: Option<&str>) -> Server {
    start_mariadb_with(ns, 200, &[])
}

/// A MariaDB of this test's own with extra server options (`--server-id=1`,
/// `--log-bin=binlog`, ...), for replication tests; without `--log-bin` among them
/// it writes no binary log.
pub fn start_mariadb_configured(options: &[&str]) -> Server {
    start_mariadb_with(None, 200, options)
}

/// A MariaDB of this test's own (never `TALLY_TEST_MYSQL_URL`'s) that admits at most
/// `max_connections` clients, for tests of connection limits.
pub fn start_mariadb_with_max_connections(max_connections: u32) -> Server {
    start_mariadb_with(None, max_connections, &[])
}

// mariadbd outlives the handle on purpose: the reaper stops it when this process ends
#[allow(clippy::zombie_processes)]
fn start_mariadb_with(ns: Option<&str>, max_connections: u32, options: &[&str]) -> Server {
    let (install, server) = (
        Path::new("/usr/bin/mariadb-install-db"),
        Path::new("/usr/sbin/mariadbd"),
    );
    assert!(
        install.exists() && server.exists(),
        "MariaDB server binaries not found: install them (apt install mariadb-server) or set TALLY_TEST_MYSQL_URL"
    );
    let dir = temp_dir("tally-mariadb");
    let data = dir.join("data");
    let port = if ns.is_some() { 3306 } else { free_port() };
    let sock = dir.join("sock");
    run(
        Command::new(install)
            .args([
                "--no-defaults",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ])
            .arg(format!("--datadir={}", data.display())),
        "mariadb-install-db",
    );
    let child = in_ns(ns, server)
        .args([
            "--no-defaults",
            "--user=root",
            "--bind-address=127.0.0.1",
            "--innodb-buffer-pool-size=512M",
        ])
        .args((!options.iter().any(|o| o.starts_with("--log-bin"))).then_some("--skip-log-bin"))
        .args(options)
        .args([
            "--innodb-flush-log-at-trx-commit=0",
            "--innodb-doublewrite=0",
            "--character-set-server=utf8mb4",
        ])
        .arg("--collation-server=utf8mb4_general_ci")
        .arg(format!("--max-connections={max_connections}"))
        .arg(format!("--port={port}"))
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", sock.display()))
        .arg(format!("--pid-file={}", dir.join("pid").display()))
        .arg(format!("--log-error={}", dir.join("log").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting mariadbd");
    reaper(&format!(
        "kill -9 {} 2>/dev/null; pkill -9 -f '{}' 2>/dev/null; sleep 1; rm -rf {}",
        child.id(),
        data.display(),
        dir.display()
    ));
    let s = Server {
        kind: Kind::MariaDb,
        host: "127.0.0.1".into(),
        port,
        base_url: format!("mysql://root@127.0.0.1:{port}"),
        ns: ns.map(str::to_string),
    };
    s.wait_ready(&dir);
    s
}

/// The test process's PostgreSQL.
pub fn postgres() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(start_postgres)
}

/// The test process's MariaDB.
pub fn mariadb() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(start_mariadb)
}

impl Server {
    fn from_url(kind: Kind, url: &str) -> Server {
        let rest = url.split("://").nth(1).unwrap_or("");
        let hostport = rest
            .rsplit('@')
            .next()
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("");
        let (host, port) = hostport
            .rsplit_once(':')
            .unwrap_or((hostport, if kind == Kind::Postgres { "5432" } else { "3306" }));
        Server {
            kind,
            host: host.to_string(),
            port: port.parse().expect("port in test URL"),
            base_url: url
                .trim_end_matches('/')
                .rsplit_once('/')
                .filter(|(a, _)| a.contains("://") && a.matches('/').count() > 2)
                .map_or(url.to_string(), |(a, _)| a.to_string()),
            ns: None,
        }
    }

    /// Creates (or re-creates) a database and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        match self.kind {
            Kind::Postgres => {
                self.exec(None, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"));
                self.exec(None, &format!("CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"));
            }
            Kind::MariaDb => {
                self.exec(
                    None,
                    &format!(
                        "DROP DATABASE IF EXISTS `{name}`; CREATE DATABASE `{name}` CHARACTER SET utf8mb4"
                    ),
                );
            }
        }
        self.url(name)
    }

    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base_url)
    }

    /// Waits until the server accepts logins (its port opens before that).
    fn wait_ready(&self, dir: &Path) {
        for _ in 0..600 {
            if self.try_exec(None, "SELECT 1").is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{:?} on port {} does not accept logins; see {}/log",
            self.kind,
            self.port,
            dir.display()
        );
    }

    fn client(&self, db: Option<&str>) -> Command {
        self.client_with(db, &[])
    }

    /// The client with `mariadb_args` (MariaDB only) before the database name.
    fn client_with(&self, db: Option<&str>, mariadb_args: &[&str]) -> Command {
        match self.kind {
            Kind::Postgres => {
                let mut c = in_ns(self.ns.as_deref(), "psql");
                c.args([
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    &self.host,
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ]);
                c.args(["-d", db.unwrap_or("postgres")]);
                c
            }
            Kind::MariaDb => {
                let mut c = in_ns(self.ns.as_deref(), "mariadb");
                c.args([
                    "--no-defaults",
                    "-N",
                    "-B",
                    "--protocol=TCP",
                    "-h",
                    &self.host,
                    "-P",
                    &self.port.to_string(),
                    "-u",
                    "root",
                ]);
                c.arg("--default-character-set=utf8mb4");
                c.args(mariadb_args);
                if let Some(d) = db {
                    c.arg(d);
                }
                c
            }
        }
    }

    /// Runs SQL through the engine's own CLI client; the client's message on error.
    pub fn try_exec(&self, db: Option<&str>, sql: &str) -> Result<String, String> {
        use std::io::Write;
        let mut child = self
            .client(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the SQL client: {e}"))?;
        // a client that stops at an error closes its input: its own message says why
        let written = child.stdin.take().expect("stdin").write_all(sql.as_bytes());
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if let Err(e) = written
            && out.status.success()
        {
            return Err(e.to_string());
        }
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Runs SQL through the engine's own CLI client, its output thrown away (for
    /// timing reads: nothing is buffered here).
    pub fn exec_discard(&self, db: Option<&str>, sql: &str) {
        use std::io::Write;
        let mut c = self.client_with(db, &["--quick"]);
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("SQL client");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(sql.as_bytes())
            .expect("SQL to the client");
        let out = child.wait_with_output().expect("SQL client");
        assert!(
            out.status.success(),
            "{:?} SQL failed: {}",
            self.kind,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the engine's CLI client running `sql` in the background (a writer's
    /// server-side loop), killed when the guard is dropped.
    pub fn spawn_sql(&self, db: Option<&str>, sql: &str) -> crate::proc::ChildGuard {
        use std::io::Write;
        let script =
            std::env::temp_dir().join(format!("tally-sql-{}-{}.sql", std::process::id(), free_port()));
        std::fs::File::create(&script)
            .and_then(|mut f| f.write_all(sql.as_bytes()))
            .expect("writer script");
        let child = self
            .client(db)
            .stdin(std::fs::File::open(&script).expect("writer script"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the SQL client starts");
        crate::proc::ChildGuard {
            child,
            name: "sql writer".into(),
        }
    }

    /// Runs SQL (one or more statements) through the engine's own CLI client; panics
    /// with the client's message on error. Returns the output (tab-separated rows).
    /// Restarts a PostgreSQL this test started (`start_postgres_*`): an immediate
    /// stop, which cuts every session as a crash would, then a start with the same
    /// settings (`pg_ctl restart` reuses them), waiting until it accepts connections.
    pub fn restart_immediately(&self) {
        assert_eq!(self.kind, Kind::Postgres, "only PostgreSQL restarts here");
        let data_dir = self.exec(None, "SHOW data_directory;").trim().to_string();
        let pg_ctl = pg_bindir().join("pg_ctl");
        let mut c = if is_root() {
            let mut c = in_ns(self.ns.as_deref(), "runuser");
            c.args(["-u", "postgres", "--"]).arg(pg_ctl);
            c
        } else {
            in_ns(self.ns.as_deref(), pg_ctl)
        };
        c.args(["-D", &data_dir, "restart", "-m", "immediate", "-w", "-t", "60"])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        run(&mut c, "pg_ctl restart");
    }

    pub fn exec(&self, db: Option<&str>, sql: &str) -> String {
        self.try_exec(db, sql)
            .unwrap_or_else(|e| panic!("{:?} SQL failed: {e}\n{}", self.kind, &sql[..sql.len().min(2000)]))
    }
}
