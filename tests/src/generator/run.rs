//! Runs generated cases through real agents: loads every case's tables into its two
//! engines, starts two agents per engine over mutual TLS (one for sources, one for
//! targets, each serving every dataset of its engine), runs `tally run --json` for
//! each of a case's run configurations, and compares the verdict, keys and kinds with
//! the case's ground truth.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::case::Case;
use super::values::{Bind, Engine, bind, literal, spark_projection};
use crate::db;
use crate::zones::{Deployment, parse_run};

/// How the agents hash a run's datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hashing {
    Auto,
    Pushdown,
}

/// How a dataset is defined in the agent's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    Table,
    Query,
}

/// A bisection strategy (time with its granularity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    Quantile,
    Hash,
    /// the default: quantile, or hash where the keys cannot be cut by quantiles
    Auto,
    Time(&'static str),
}

pub const GRANULARITIES: &[&str] = &["hour", "day", "week", "month", "quarter", "year"];

impl Strategy {
    pub fn label(self) -> String {
        match self {
            Strategy::Quantile => "quantile".into(),
            Strategy::Hash => "hash".into(),
            Strategy::Auto => "auto".into(),
            Strategy::Time(g) => format!("time/{g}"),
        }
    }
}

/// One `tally run` of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunConfig {
    pub hashing: Hashing,
    pub strategy: Strategy,
    pub form: Form,
    /// segments per level and the drill threshold
    pub factor: u32,
    pub threshold: u32,
}

impl RunConfig {
    pub fn label(&self) -> String {
        format!(
            "{} {} {} factor {} threshold {}",
            match self.hashing {
                Hashing::Auto => "auto",
                Hashing::Pushdown => "pushdown",
            },
            self.strategy.label(),
            match self.form {
                Form::Table => "table",
                Form::Query => "query",
            },
            self.factor,
            self.threshold
        )
    }
}

/// What went wrong in one run.
#[derive(Debug, Clone)]
pub struct Failure {
    pub case: usize,
    pub config: RunConfig,
    /// false pass, false fail, wrong keys, error
    pub class: &'static str,
    pub detail: String,
}

/// The datasets' names and the table of each side of case `i`.
fn table(i: usize, side: usize) -> String {
    format!("g{i}_{}", ["s", "t"][side])
}

fn dataset(i: usize, side: usize, c: &RunConfig, engine: Engine) -> String {
    let h = match (c.hashing, engine.pushes_down()) {
        (Hashing::Pushdown, true) => "push",
        _ => "auto",
    };
    let f = match c.form {
        Form::Table => "tbl",
        Form::Query => "qry",
    };
    format!("{}_{h}_{f}", table(i, side))
}

fn agent(engine: Engine, side: usize) -> String {
    format!("{}{}", engine.short(), ["a", "b"][side])
}

/// The SQL that makes one side of a case (the engine's own DDL and literals).
pub fn side_sql(case: &Case, i: usize, side: usize, qualify: &str) -> String {
    let engine = [case.source, case.target][side];
    let t = format!("{qualify}{}", table(i, side));
    let cols: Vec<String> = case
        .columns
        .iter()
        .map(|c| format!("{} {}", c.name, c.types[side]))
        .collect();
    let spark = engine == Engine::Spark;
    let using = if spark { " USING parquet" } else { "" };
    let mut sql = format!("CREATE TABLE {t} ({}){using};\n", cols.join(", "));
    let rows = &case.sides()[side];
    for chunk in rows.chunks(200) {
        let tuples: Vec<String> = chunk
            .iter()
            .map(|row| {
                let vals: Vec<String> = row
                    .iter()
                    .zip(&case.columns)
                    .enumerate()
                    .map(|(n, (cell, col))| literal(engine, col.class, cell, case.side_form(side, n)))
                    .collect();
                format!("({})", vals.join(", "))
            })
            .collect();
        if spark {
            // an inline table takes constants only: texts arrive as bytes and are
            // decoded in the projection
            let names: Vec<&str> = case.columns.iter().map(|c| c.name.as_str()).collect();
            let proj: Vec<String> = case
                .columns
                .iter()
                .map(|c| spark_projection(c.class, &c.name))
                .collect();
            sql.push_str(&format!(
                "INSERT INTO {t} SELECT {} FROM VALUES {} AS v({});\n",
                proj.join(", "),
                tuples.join(",\n  "),
                names.join(", ")
            ));
        } else {
            sql.push_str(&format!("INSERT INTO {t} VALUES {};\n", tuples.join(",\n  ")));
        }
    }
    sql
}

/// Where the batch's databases are.
struct Databases {
    pg: Option<String>,
    my: Option<String>,
    lite: std::path::PathBuf,
    duck: std::path::PathBuf,
    /// the Spark Connect URL and the batch's database (schema) on it
    spark: Option<(String, String)>,
}

fn load(cases: &[(usize, &Case)], name: &str, dir: &Path) -> Databases {
    let engines: BTreeSet<Engine> = cases.iter().flat_map(|(_, c)| [c.source, c.target]).collect();
    let mut dbs = Databases {
        pg: None,
        my: None,
        lite: dir.join(format!("{name}.sqlite")),
        duck: dir.join(format!("{name}.duckdb")),
        spark: None,
    };
    let per_engine = |e: Engine| -> Vec<(usize, usize, &Case)> {
        cases
            .iter()
            .flat_map(|(i, c)| {
                [(*i, 0usize, *c), (*i, 1, *c)]
                    .into_iter()
                    .filter(move |(_, s, c)| [c.source, c.target][*s] == e)
            })
            .collect()
    };
    if engines.contains(&Engine::Pg) {
        let pg = db::postgres();
        dbs.pg = Some(pg.create_database(name));
        let mut sql = String::from("SET TIME ZONE 'UTC';\n");
        for (i, s, c) in per_engine(Engine::Pg) {
            sql.push_str(&side_sql(c, i, s, ""));
            sql.push_str(&format!("ANALYZE {};\n", table(i, s)));
        }
        load_sql(pg, name, "postgres", &sql);
    }
    if engines.contains(&Engine::My) {
        let my = db::mariadb();
        dbs.my = Some(my.create_database(name));
        let mut sql = String::from("SET time_zone = '+00:00';\n");
        for (i, s, c) in per_engine(Engine::My) {
            sql.push_str(&side_sql(c, i, s, ""));
        }
        load_sql(my, name, "mariadb", &sql);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if engines.contains(&Engine::Lite) {
        rt.block_on(load_sqlite(&dbs.lite, &per_engine(Engine::Lite)));
    }
    if engines.contains(&Engine::Duck) {
        #[cfg(feature = "duckdb")]
        rt.block_on(load_duckdb(&dbs.duck, &per_engine(Engine::Duck)));
        #[cfg(not(feature = "duckdb"))]
        panic!("a DuckDB case in a build without the duckdb feature");
    }
    if engines.contains(&Engine::Spark) {
        #[cfg(feature = "spark")]
        {
            let url = crate::spark::server().url.clone();
            rt.block_on(load_spark(&url, name, &per_engine(Engine::Spark)));
            dbs.spark = Some((url, name.to_string()));
        }
        #[cfg(not(feature = "spark"))]
        panic!("a Spark case in a build without the spark feature");
    }
    dbs
}

/// Spark through a session of its own: a fresh database (schema) for the batch, each
/// side's Parquet table and inserts in it. A failed statement's script is kept in the
/// temp directory, as [`load_sql`] does.
#[cfg(feature = "spark")]
async fn load_spark(url: &str, name: &str, sides: &[(usize, usize, &Case)]) {
    use tally_agent::connector::spark::SparkConnector;
    let mut sql = format!("DROP DATABASE IF EXISTS {name} CASCADE;\nCREATE DATABASE {name};\n");
    for (i, side, case) in sides {
        sql.push_str(&side_sql(case, *i, *side, &format!("{name}.")));
    }
    let s = SparkConnector::open(url).expect("spark url");
    if let Err(e) = s.execute_batch("gen", &sql).await {
        let path = std::env::temp_dir().join(format!("tally-gen-{name}-spark.sql"));
        let _ = std::fs::write(&path, &sql);
        panic!("loading spark failed: {e}\nthe script is {}", path.display());
    }
}

/// Runs a load script; a failed one is kept in the temp directory (the SQL client's
/// error names a line of it) and the panic names the file.
fn load_sql(server: &db::Server, name: &str, engine: &str, sql: &str) {
    if let Err(e) = server.try_exec(Some(name), sql) {
        let path = std::env::temp_dir().join(format!("tally-gen-{name}-{engine}.sql"));
        let _ = std::fs::write(&path, sql);
        panic!("loading {engine} failed: {e}\nthe script is {}", path.display());
    }
}

/// SQLite through its driver with bound values: a double is stored as its bits, not
/// parsed from text by SQLite's own conversion.
async fn load_sqlite(path: &Path, sides: &[(usize, usize, &Case)]) {
    use sqlx::Connection;
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&opts)
        .await
        .expect("sqlite file");
    for (i, side, case) in sides {
        let t = table(*i, *side);
        let cols: Vec<String> = case
            .columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.types[*side]))
            .collect();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {t} ({})",
            cols.join(", ")
        )))
        .execute(&mut conn)
        .await
        .expect("sqlite table");
        let marks = vec!["?"; case.columns.len()].join(", ");
        let insert = format!("INSERT INTO {t} VALUES ({marks})");
        for row in &case.sides()[*side] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(insert.clone()));
            for (n, (cell, col)) in row.iter().zip(&case.columns).enumerate() {
                q = match bind(col.class, cell, case.side_form(*side, n)) {
                    Bind::Null => q.bind(None::<i64>),
                    Bind::Int(v) => q.bind(v),
                    Bind::Real(v) => q.bind(v),
                    Bind::Text(v) => q.bind(v),
                    Bind::Blob(v) => q.bind(v),
                };
            }
            q.execute(&mut conn).await.expect("sqlite row");
        }
    }
    conn.close().await.expect("sqlite close");
}

/// DuckDB through an in-memory database that attaches the file and writes it.
#[cfg(feature = "duckdb")]
async fn load_duckdb(path: &Path, sides: &[(usize, usize, &Case)]) {
    use tally_agent::connector::Connector;
    use tally_agent::connector::duckdb::DuckDbConnector;
    let mut sql = format!("ATTACH '{}' AS gen;\n", path.display());
    for (i, side, case) in sides {
        sql.push_str(&side_sql(case, *i, *side, "gen."));
    }
    sql.push_str("DETACH gen;\n");
    let c = Connector::open("duckdb://").expect("duckdb");
    c.engine()
        .as_any()
        .downcast_ref::<DuckDbConnector>()
        .expect("a duckdb connector")
        .execute_batch("gen", &sql)
        .await
        .unwrap_or_else(|e| panic!("duckdb load failed: {e}\n{sql}"));
}

/// Drops a batch's Spark database once its runs are done (best effort): the test
/// server's driver has 512 MB, and a long hunt makes hundreds of tables.
#[cfg(feature = "spark")]
fn drop_spark(url: &str, db: &str) {
    use tally_agent::connector::spark::SparkConnector;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let r = rt.block_on(async {
        SparkConnector::open(url)
            .expect("spark url")
            .execute_batch("gen", &format!("DROP DATABASE IF EXISTS {db} CASCADE;\n"))
            .await
    });
    if let Err(e) = r {
        eprintln!("dropping spark database {db}: {e}");
    }
}

/// The agent config body of one dataset.
fn dataset_yaml(
    dbs: &Databases,
    engine: Engine,
    case: &Case,
    i: usize,
    side: usize,
    c: &RunConfig,
) -> String {
    let url = match engine {
        Engine::Pg => dbs.pg.clone().expect("postgres loaded"),
        Engine::My => dbs.my.clone().expect("mariadb loaded"),
        Engine::Lite => format!("sqlite://{}", dbs.lite.display()),
        Engine::Duck => format!("duckdb://{}", dbs.duck.display()),
        Engine::Spark => dbs.spark.as_ref().expect("spark loaded").0.clone(),
    };
    // Spark's tables are in the batch's database
    let table = match (engine, &dbs.spark) {
        (Engine::Spark, Some((_, db))) => format!("{db}.{}", table(i, side)),
        _ => table(i, side),
    };
    let key: Vec<&str> = case.columns[..case.nkeys]
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    // the policy lists the time columns and a window's column (live-data.md, Privacy)
    let time_columns: Vec<&str> = case
        .columns
        .iter()
        .enumerate()
        .filter(|(n, c)| c.class.is_time() || case.window.as_ref().is_some_and(|w| w.col == *n))
        .map(|(_, c)| c.name.as_str())
        .collect();
    let from = match c.form {
        Form::Table => format!("table: {table}"),
        Form::Query => {
            let cols: Vec<&str> = case.columns.iter().map(|c| c.name.as_str()).collect();
            format!("query: \"SELECT {} FROM {table}\"", cols.join(", "))
        }
    };
    let hashing = match (c.hashing, engine.pushes_down()) {
        (Hashing::Pushdown, true) => "pushdown",
        _ => "auto",
    };
    format!(
        "{{ url: '{url}', {from}, key: [{}], hashing: {hashing}, time_zone: '{}', empty_string_is_null: {}, policy: {{ max_level: with_keys, time_columns: [{}], max_reveal_rows: 1000000, max_reveal_rows_per_hour: 1000000000 }} }}",
        key.join(", "),
        case.zones[side],
        case.empty_is_null[side],
        time_columns.join(", ")
    )
}

/// The run spec of one configuration of case `i`.
pub fn spec(case: &Case, i: usize, c: &RunConfig) -> String {
    let strategy = match c.strategy {
        Strategy::Time(g) => format!(
            "strategy: time, time_column: {}, time_granularity: {g}",
            case.time_column().expect("a time column").name
        ),
        s => format!("strategy: {}", s.label()),
    };
    let mut s = format!(
        "name: g{i}\nsource: {{ agent: {}, dataset: {} }}\ntarget: {{ agent: {}, dataset: {} }}\n\
         bisection: {{ {strategy}, factor: {}, threshold: {} }}\nreporting: {{ level: with_keys, sample_limit: 100000 }}\n",
        agent(case.source, 0),
        dataset(i, 0, c, case.source),
        agent(case.target, 1),
        dataset(i, 1, c, case.target),
        c.factor,
        c.threshold,
    );
    if !case.exclude.is_empty() {
        let names: Vec<&str> = case
            .exclude
            .iter()
            .map(|&c| case.columns[c].name.as_str())
            .collect();
        s.push_str(&format!("exclude: [{}]\n", names.join(", ")));
    }
    if !case.overrides.is_empty() {
        let items: Vec<String> = case
            .overrides
            .iter()
            .map(|&(c, n)| {
                let what = if case.columns[c].class.is_time() {
                    "precision"
                } else {
                    "scale"
                };
                format!("{}: {{ {what}: {n} }}", case.columns[c].name)
            })
            .collect();
        s.push_str(&format!("overrides: {{ {} }}\n", items.join(", ")));
    }
    if let Some(w) = &case.window {
        let as_of = match w.bound {
            super::values::V::Int(_) => w.as_of.clone(),
            _ => format!("'{}'", w.as_of),
        };
        s.push_str(&format!(
            "window: {{ column: {}, as_of: {as_of} }}\n",
            case.columns[w.col].name
        ));
    }
    s
}

/// Runs every configuration of every case; returns the failures.
pub fn run_batch(name: &str, cases: &[(usize, &Case, Vec<RunConfig>)], workers: usize) -> Vec<Failure> {
    let all: Vec<(usize, &Case)> = cases.iter().map(|(i, c, _)| (*i, *c)).collect();
    let engines: BTreeSet<Engine> = all.iter().flat_map(|(_, c)| [c.source, c.target]).collect();
    let agents: Vec<String> = engines
        .iter()
        .flat_map(|e| [agent(*e, 0), agent(*e, 1)])
        .collect();
    let names: Vec<&str> = agents.iter().map(String::as_str).collect();
    let mut d = Deployment::new(&names);
    let dbs = load(&all, name, d.path());
    for e in &engines {
        for side in 0..2 {
            let mut datasets = Vec::new();
            for (i, case, configs) in cases {
                for s in 0..2 {
                    if [case.source, case.target][s] != *e {
                        continue;
                    }
                    let mut seen = BTreeSet::new();
                    for c in configs {
                        let ds = dataset(*i, s, c, *e);
                        if seen.insert(ds.clone()) {
                            datasets.push((ds, dataset_yaml(&dbs, *e, case, *i, s, c)));
                        }
                    }
                }
            }
            d.start_agent_datasets(&agent(*e, side), &datasets);
        }
    }
    let coordinator = d.coordinator_config();
    let runs: Vec<(usize, &Case, RunConfig, usize)> = cases
        .iter()
        .flat_map(|(i, c, configs)| configs.iter().enumerate().map(move |(n, cfg)| (*i, *c, *cfg, n)))
        .collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| {
                while let Some((i, case, cfg, n)) = runs.get(next.fetch_add(1, Ordering::SeqCst)) {
                    if let Some(f) = run_one(d.path(), &coordinator, case, *i, cfg, *n) {
                        failures.lock().unwrap().push(f);
                    }
                }
            });
        }
    });
    #[cfg(feature = "spark")]
    if let Some((url, db)) = &dbs.spark {
        drop_spark(url, db);
    }
    let mut f = failures.into_inner().unwrap();
    f.sort_by_key(|f| (f.case, f.config));
    f
}

fn run_one(
    dir: &Path,
    coordinator: &Path,
    case: &Case,
    i: usize,
    cfg: &RunConfig,
    n: usize,
) -> Option<Failure> {
    let path = dir.join(format!("g{i}_{n}.yaml"));
    std::fs::write(&path, spec(case, i, cfg)).expect("spec");
    let out = Command::new(crate::bins::tally())
        .arg("run")
        .arg(&path)
        .arg("-c")
        .arg(coordinator)
        .arg("--json")
        .output()
        .expect("tally run");
    let out = parse_run(out);
    let truth = case.truth();
    let fail = |class, detail| {
        Some(Failure {
            case: i,
            config: *cfg,
            class,
            detail,
        })
    };
    let j = &out.json;
    if let Some((code, column)) = super::refusal(case, cfg) {
        let msg = j["error"]["message"].as_str().unwrap_or("");
        return (out.code != 2 || j["error"]["code"] != code || !msg.contains(&column))
            .then(|| {
                fail(
                    "no refusal",
                    format!(
                        "expected {code} naming {column}; got exit {}: {}",
                        out.code, j["error"]
                    ),
                )
            })
            .flatten();
    }
    if out.code == 2 || !j["error"].is_null() {
        // the agents' own account (their logs hold what they would not send)
        let mut logs = String::new();
        for a in [agent(case.source, 0), agent(case.target, 1)] {
            let text = std::fs::read_to_string(dir.join(format!("{a}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            for l in &lines[lines.len().saturating_sub(3)..] {
                logs.push_str(&format!("\n    {a}: {l}"));
            }
        }
        return fail("error", format!("exit {}: {}{logs}", out.code, j["error"]));
    }
    let listed = j["differences"].as_array().cloned().unwrap_or_default();
    let reported: BTreeSet<(String, String)> = listed
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap_or("?").to_string(),
                d["key"].to_string(),
            )
        })
        .collect();
    // the rows each side holds of a repeated key, as listed
    let dups: std::collections::BTreeMap<String, (usize, usize)> = listed
        .iter()
        .filter(|d| !d["duplicates"].is_null())
        .map(|d| {
            let n = |s: &str| d["duplicates"][s].as_u64().unwrap_or(0) as usize;
            (d["key"].to_string(), (n("source"), n("target")))
        })
        .collect();
    let verdict = j["verdict"].as_str().unwrap_or("?");
    let describe = |reported: &BTreeSet<(String, String)>| {
        let missed: Vec<_> = truth.diffs.difference(reported).collect();
        let invented: Vec<_> = reported.difference(&truth.diffs).collect();
        format!(
            "verdict {verdict} (exit {}); not reported: {missed:?}; wrongly reported: {invented:?}; duplicates expected {:?}, listed {dups:?}; warnings {}",
            out.code, truth.duplicates, j["warnings"]
        )
    };
    if truth.is_match() {
        if verdict != "match" || out.code != 0 || !reported.is_empty() {
            return fail("false fail", describe(&reported));
        }
    } else if verdict == "match" {
        return fail("false pass", describe(&reported));
    } else if verdict != "differ" || out.code != 1 {
        return fail("wrong verdict", describe(&reported));
    } else if reported != truth.diffs || dups != truth.duplicates {
        return fail("wrong keys", describe(&reported));
    }
    wrong_fidelity(case, cfg, j).and_then(|d| fail("wrong fidelity", d))
}

/// Whether the run's `fidelity` names exactly the columns and reason codes the case
/// makes (canonical-form.md §10): `reduced` with them, or `full` without any.
fn wrong_fidelity(case: &Case, cfg: &RunConfig, j: &serde_json::Value) -> Option<String> {
    let want = super::fidelity::expected(case, cfg);
    let got: std::collections::BTreeMap<String, BTreeSet<String>> = j["fidelity"]["columns"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let codes = c["reasons"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|r| r["code"].as_str().unwrap_or("?").to_string())
                .collect();
            (c["column"].as_str().unwrap_or("?").to_string(), codes)
        })
        .collect();
    let want_s: std::collections::BTreeMap<String, BTreeSet<String>> = want
        .iter()
        .map(|(c, w)| (c.clone(), w.iter().map(|s| s.to_string()).collect()))
        .collect();
    let level = if want.is_empty() { "full" } else { "reduced" };
    (j["fidelity"]["level"] != level || got != want_s)
        .then(|| format!("fidelity expected {level} {want_s:?}; reported {}", j["fidelity"]))
}
