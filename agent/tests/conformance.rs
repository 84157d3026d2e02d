//! The live conformance suite, written once and run against every engine this machine
//! can run: PostgreSQL and MariaDB started by the test harness, SQLite embedded.
//!
//! 1. Every vector of tests/vectors/canonical.json is loaded into a real table of the
//!    matching column types, and the engine's own SQL (pushdown engines) or the agent's
//!    decoding of the engine's values (SQLite) reproduces the row string and both
//!    checksums bit for bit. A value an engine cannot store is listed per engine below
//!    with the reason (at most 24 per engine: MariaDB and DuckDB have no BC years,
//!    infinities or NaN decimals); every other vector must reproduce.
//! 2. The engines' SUM and XOR arithmetic reproduces every aggregate vector.
//! 3. One logical table loaded into every engine gives identical buckets for every
//!    split (quantile, hash, explicit cuts), pushed down and in-process alike.

use std::collections::BTreeMap;

use tally_agent::config::{Hashing, Source};
use tally_agent::connector::Connector;
use tally_agent::dataset::{AggregateOut, Bound, Dataset};
use tally_agent::dialect;
use tally_agent::error::AgentError;
use tally_agent::schema::{BoundColumn, ColumnInfo};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{AnyAggregate, HashMethod, Hasher, md5_48, sha256_64, wrap_decimal_sum};
use tally_common::period::Granularity;
use tally_common::seal::RunKeys;
use tally_common::segment::{ColumnSpec, KeyPart, Period, Segment, Split};
use tally_common::types::TypeClass;
use tally_common::vectors::{RowVector, VectorField, VectorFile};
use tally_e2e::db;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Postgres,
    MariaDb,
    Sqlite,
    #[cfg_attr(not(feature = "duckdb"), allow(dead_code))]
    DuckDb,
}

/// Every engine this build can run.
fn engines() -> Vec<Engine> {
    let mut v = vec![Engine::Postgres, Engine::MariaDb, Engine::Sqlite];
    if cfg!(feature = "duckdb") {
        v.push(Engine::DuckDb);
    }
    v
}

fn fraction_digits(v: &str) -> usize {
    v.split('.')
        .nth(1)
        .map_or(0, |f| f.chars().take_while(char::is_ascii_digit).count())
}

/// Vectors an engine cannot store as written, with the reason.
fn cannot_store(e: Engine, v: &RowVector) -> Option<&'static str> {
    let has = |pred: &dyn Fn(&VectorField) -> bool| v.fields.iter().any(pred);
    let val = |f: &VectorField, s: &str| f.value.as_deref() == Some(s);
    let nonfinite =
        |f: &VectorField| f.class == "float" && ["NaN", "Infinity", "-Infinity"].iter().any(|s| val(f, s));
    let seventh_digit = |f: &VectorField| {
        f.class.starts_with("timestamp") && f.value.as_deref().is_some_and(|s| fraction_digits(s) > 6)
    };
    let token = |f: &VectorField| ["NaN", "Infinity", "-Infinity"].iter().any(|s| val(f, s));
    let dated = |f: &VectorField| matches!(f.class.as_str(), "date" | "timestamp" | "timestamptz");
    let year = |f: &VectorField| {
        f.value.as_deref().and_then(|v| {
            if v.contains("infinity") {
                return Some(i64::MAX);
            }
            let y: i64 = v.split('-').next()?.trim_start_matches('+').parse().ok()?;
            Some(if v.ends_with(" BC") { 1 - y } else { y })
        })
    };
    // BC, year 10000 and later, infinity
    let beyond_iso = |f: &VectorField| dated(f) && year(f).is_some_and(|y| !(1..=9999).contains(&y));
    let zero_in_date = |f: &VectorField| {
        dated(f)
            && f.value
                .as_deref()
                .is_some_and(|v| v.get(5..7) == Some("00") || v.get(8..10) == Some("00"))
    };
    let duration = |f: &VectorField| {
        f.class == "time"
            && f.value.as_deref().is_some_and(|v| {
                v.starts_with('-') || v.split(':').next().is_some_and(|h| h.len() > 2 || h > "24")
            })
    };
    let int_bool = |f: &VectorField| {
        f.class == "boolean" && f.value.as_deref().is_some_and(|v| v.parse::<i64>().is_ok())
    };
    let wide_exact = |f: &VectorField| f.exact && f.value.as_deref().is_some_and(|v| fraction_digits(v) > 30);
    match e {
        Engine::Postgres | Engine::MariaDb | Engine::DuckDb if has(&seventh_digit) => {
            Some("stores 6 fractional digits and rounds the 7th on input")
        }
        Engine::Postgres if has(&zero_in_date) => Some("has no zero dates (a MySQL value)"),
        Engine::Postgres if has(&duration) => Some("time is a time of day, at most 24:00:00"),
        Engine::Postgres | Engine::DuckDb if has(&int_bool) => Some("boolean holds only true and false"),
        Engine::MariaDb | Engine::DuckDb if has(&beyond_iso) => {
            Some("DATE and DATETIME hold years 0000-9999 only")
        }
        Engine::MariaDb | Engine::Sqlite | Engine::DuckDb if has(&|f| f.class == "decimal" && token(f)) => {
            Some("DECIMAL has no NaN or infinities")
        }
        Engine::MariaDb if has(&wide_exact) => Some("DECIMAL keeps at most 30 fractional digits"),
        Engine::DuckDb if has(&zero_in_date) => Some("has no zero dates (a MySQL value)"),
        Engine::DuckDb if has(&|f| f.exact && f.value.as_deref().is_some_and(|v| v.contains(['e', 'E']))) => {
            Some("reads an exponent literal as a double before the DECIMAL cast")
        }
        Engine::DuckDb
            if has(&|f| {
                f.class == "timestamptz" && f.value.as_deref().is_some_and(|v| v.starts_with("0001-01-01"))
            }) =>
        {
            Some("the instant falls in 1 BC in UTC, which DuckDB renders in its own form (not canonical yet)")
        }
        Engine::DuckDb if has(&duration) => Some("TIME is a time of day"),
        Engine::MariaDb if has(&nonfinite) => Some("DOUBLE has no NaN or infinities"),
        Engine::MariaDb
            if has(&|f| f.class == "timestamptz" && f.value.as_deref().is_some_and(|s| s < "1970")) =>
        {
            Some("TIMESTAMP starts at 1970-01-01 UTC")
        }
        Engine::Sqlite if has(&|f| f.class == "float" && val(f, "NaN")) => Some("REAL stores NaN as NULL"),
        Engine::DuckDb
            if has(&|f| {
                f.class == "decimal"
                    && f.value.as_deref().is_some_and(|s| {
                        s.chars().filter(char::is_ascii_digit).count() + f.scale.unwrap_or(0) as usize
                            > 38 + 1
                    })
            }) =>
        {
            Some("DECIMAL is at most 38 digits wide")
        }
        Engine::Sqlite
            if has(&|f| f.class == "decimal" && f.value.as_deref().is_some_and(|s| s.len() > 17)) =>
        {
            Some("NUMERIC affinity keeps a double's 15-17 significant digits")
        }
        Engine::Sqlite if has(&|f| f.class == "integer" && val(f, "18446744073709551615")) => {
            Some("INTEGER is 64-bit signed")
        }
        _ => None,
    }
}

fn sql_type(e: Engine, f: &VectorField) -> String {
    let s = f.scale.or(f.precision).unwrap_or(0);
    let big = f.value.as_deref() == Some("18446744073709551615");
    match (e, f.class.as_str()) {
        (Engine::Postgres, "integer") if big => "numeric(20,0)".into(),
        (Engine::Postgres, "integer") => "bigint".into(),
        (Engine::Postgres, "decimal")
            if f.exact || f.value.as_deref().is_some_and(|v| v.contains("Infinity")) =>
        {
            "numeric".into()
        }
        (Engine::Postgres, "decimal") => format!("numeric(60,{s})"),
        (Engine::Postgres, "float") => "double precision".into(),
        (Engine::Postgres, "boolean") => "boolean".into(),
        (Engine::Postgres, "text") if f.char => "char(20)".into(),
        (Engine::Postgres, "text") => "text".into(),
        (Engine::Postgres, "date") => "date".into(),
        (Engine::Postgres, "timestamp") => "timestamp(6)".into(),
        (Engine::Postgres, "timestamptz") => "timestamptz(6)".into(),
        (Engine::Postgres, "time") => "time(6)".into(),
        (Engine::Postgres, "uuid") => "uuid".into(),
        (Engine::Postgres, "binary") => "bytea".into(),
        (Engine::Postgres, "json") => "jsonb".into(),
        (Engine::MariaDb, "integer") if big => "BIGINT UNSIGNED".into(),
        (Engine::MariaDb, "integer") => "BIGINT".into(),
        (Engine::MariaDb, "decimal") if f.exact => "DECIMAL(65,30)".into(),
        (Engine::MariaDb, "decimal") => format!("DECIMAL(65,{s})"),
        (Engine::MariaDb, "float") => "DOUBLE".into(),
        (Engine::MariaDb, "boolean") => "TINYINT(1)".into(),
        (Engine::MariaDb, "text") if f.char => "CHAR(20)".into(),
        (Engine::MariaDb, "text") => "TEXT".into(),
        (Engine::MariaDb, "date") => "DATE".into(),
        (Engine::MariaDb, "timestamp") => "DATETIME(6)".into(),
        (Engine::MariaDb, "timestamptz") => "TIMESTAMP(6) NULL".into(),
        (Engine::MariaDb, "time") => "TIME(6)".into(),
        (Engine::MariaDb, "uuid") => "UUID".into(),
        (Engine::MariaDb, "binary") if f.char => "BINARY(4)".into(),
        (Engine::MariaDb, "binary") => "VARBINARY(200)".into(),
        (Engine::MariaDb, "json") => "JSON".into(),
        (Engine::Sqlite, "integer") => "INTEGER".into(),
        (Engine::Sqlite, "decimal") if f.exact => "NUMERIC".into(),
        (Engine::Sqlite, "decimal") => format!("DECIMAL(60,{s})"),
        (Engine::Sqlite, "float") => "REAL".into(),
        (Engine::Sqlite, "boolean") => "BOOLEAN".into(),
        (Engine::Sqlite, "text") if f.char => "CHAR(20)".into(),
        (Engine::Sqlite, "text") => "TEXT".into(),
        (Engine::Sqlite, "date") => "DATE".into(),
        (Engine::Sqlite, "timestamp") => "TIMESTAMP".into(),
        (Engine::Sqlite, "timestamptz") => "TIMESTAMPTZ".into(),
        (Engine::Sqlite, "time") => "TIME".into(),
        (Engine::Sqlite, "uuid") => "UUID".into(),
        (Engine::Sqlite, "binary") => "BLOB".into(),
        (Engine::Sqlite, "json") => "JSON".into(),
        (Engine::DuckDb, "integer") if big => "UBIGINT".into(),
        (Engine::DuckDb, "integer") => "BIGINT".into(),
        (Engine::DuckDb, "decimal") if f.exact => "DECIMAL(38,20)".into(),
        (Engine::DuckDb, "decimal") => format!("DECIMAL(38,{s})"),
        (Engine::DuckDb, "float") => "DOUBLE".into(),
        (Engine::DuckDb, "boolean") => "BOOLEAN".into(),
        (Engine::DuckDb, "text") => "VARCHAR".into(),
        (Engine::DuckDb, "date") => "DATE".into(),
        (Engine::DuckDb, "timestamp") => "TIMESTAMP".into(),
        (Engine::DuckDb, "timestamptz") => "TIMESTAMPTZ".into(),
        (Engine::DuckDb, "time") => "TIME".into(),
        (Engine::DuckDb, "uuid") => "UUID".into(),
        (Engine::DuckDb, "binary") => "BLOB".into(),
        (Engine::DuckDb, "json") => "JSON".into(),
        (e, c) => panic!("no {e:?} type for {c}"),
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn literal(e: Engine, f: &VectorField) -> String {
    let Some(v) = f.value.as_deref() else {
        return "NULL".into();
    };
    match (e, f.class.as_str()) {
        (_, "integer") => v.to_string(),
        // SQLite: a decimal that a double cannot hold exactly stays text
        (Engine::Sqlite, "decimal") => quote(v),
        (Engine::Postgres, "decimal") => quote(v),
        (_, "decimal") => v.to_string(),
        (Engine::Postgres, "float") => format!("{}::float8", quote(v)),
        (Engine::DuckDb, "float") => format!("CAST({} AS DOUBLE)", quote(v)),
        (Engine::DuckDb, "binary") => format!("from_hex({})", quote(v)),
        (Engine::Sqlite, "float") => match v {
            "Infinity" => "9e999".into(),
            "-Infinity" => "-9e999".into(),
            _ => v.to_string(),
        },
        (_, "float") => v.to_string(),
        (Engine::Sqlite | Engine::MariaDb, "boolean") if v.parse::<i64>().is_ok() => v.to_string(),
        (Engine::Sqlite, "boolean") => if v == "true" { "1" } else { "0" }.into(),
        (_, "boolean") => v.to_uppercase(),
        (Engine::Postgres, "binary") => format!("decode({}, 'hex')", quote(v)),
        (_, "binary") => format!("X{}", quote(v)),
        (Engine::MariaDb, "timestamptz") => {
            // MariaDB literals carry no offset: convert to UTC (the session zone)
            let (local, off) = match v.strip_suffix('Z') {
                Some(l) => (l.to_string(), "+00:00".to_string()),
                None => {
                    let at = v[11..].rfind(['+', '-']).map(|i| i + 11).unwrap();
                    let off = &v[at..];
                    let off = if off.len() == 3 {
                        format!("{off}:00")
                    } else {
                        off.to_string()
                    };
                    (v[..at].to_string(), off)
                }
            };
            format!(
                "CONVERT_TZ({}, {}, '+00:00')",
                quote(&local.replace('T', " ")),
                quote(&off)
            )
        }
        (Engine::MariaDb, "timestamp") => quote(&v.replace('T', " ")),
        // MariaDB's default sql_mode reads backslash escapes in string literals
        (Engine::MariaDb, _) => quote(&v.replace('\\', "\\\\")),
        _ => quote(v),
    }
}

fn columns_for(v: &RowVector) -> Vec<ColumnSpec> {
    v.fields
        .iter()
        .enumerate()
        .map(|(i, f)| ColumnSpec {
            name: format!("c{i}"),
            format: f.format(),
        })
        .collect()
}

fn create_and_insert(e: Engine, table: &str, v: &RowVector) -> String {
    let cols: Vec<String> = v
        .fields
        .iter()
        .enumerate()
        .map(|(i, f)| format!("c{i} {}", sql_type(e, f)))
        .collect();
    let vals: Vec<String> = v.fields.iter().map(|f| literal(e, f)).collect();
    format!(
        "CREATE TABLE {table} ({});\nINSERT INTO {table} VALUES ({});\n",
        cols.join(", "),
        vals.join(", ")
    )
}

struct Live {
    engine: Engine,
    url: String,
    connector: Connector,
    db: String,
    sqlite: Option<std::path::PathBuf>,
}

impl Live {
    /// Runs DDL and DML on the engine.
    async fn exec(&self, sql: &str) {
        match self.engine {
            Engine::Postgres => {
                db::postgres().exec(Some(&self.db), sql);
            }
            Engine::MariaDb => {
                db::mariadb().exec(Some(&self.db), &format!("SET time_zone = '+00:00';\n{sql}"));
            }
            Engine::Sqlite => {
                use sqlx::Connection;
                let path = self.sqlite.clone().unwrap();
                let opts = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true);
                let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut c)
                    .await
                    .unwrap();
                c.close().await.unwrap();
            }
            Engine::DuckDb =>
            {
                #[cfg(feature = "duckdb")]
                self.connector
                    .engine()
                    .as_any()
                    .downcast_ref::<tally_agent::connector::duckdb::DuckDbConnector>()
                    .expect("a duckdb connector")
                    .execute_batch("t", sql)
                    .await
                    .unwrap()
            }
        }
    }
}

fn live(engine: Engine, dbname: &str, dir: &std::path::Path) -> Live {
    let (url, sqlite) = match engine {
        Engine::Postgres => (db::postgres().create_database(dbname), None),
        Engine::MariaDb => (db::mariadb().create_database(dbname), None),
        Engine::Sqlite => {
            let path = dir.join(format!("{dbname}.db"));
            std::fs::File::create(&path).unwrap();
            (format!("sqlite://{}", path.display()), Some(path))
        }
        // in memory: the connector's own connection loads the tables
        Engine::DuckDb => ("duckdb://".to_string(), None),
    };
    Live {
        engine,
        connector: Connector::open(&url).unwrap(),
        url,
        db: dbname.to_string(),
        sqlite,
    }
}

async fn bound(l: &Live, table: &str, cols: Vec<ColumnSpec>) -> Vec<BoundColumn> {
    let info = l
        .connector
        .describe("t", &Source::Table(vec![table.into()]), &[])
        .await
        .unwrap();
    info.bind("t", cols, 0, "+00:00").unwrap()
}

fn as_text(e: Engine, expr: &str) -> String {
    match e {
        Engine::Postgres => format!("({expr})::text"),
        Engine::DuckDb => format!("CAST({expr} AS VARCHAR)"),
        _ => format!("CAST({expr} AS CHAR)"),
    }
}

/// The row string of the single row in `table` as the agent's own row fetch reads it
/// (the path of in-process aggregates, digests and reveals): on PostgreSQL and MySQL the
/// engine's cheap text, made canonical in the agent (through COPY on PostgreSQL).
async fn agent_row(l: &Live, table: &str, cols: &[BoundColumn]) -> String {
    let key: Vec<&ColumnInfo> = vec![];
    let shape = l.connector.fetch_shape();
    let sql = dialect::fetch_rows_inline(
        l.connector.dialect(),
        &Source::Table(vec![table.into()]),
        cols,
        &key,
        &Segment::whole(),
        shape,
        false,
    );
    let mut rows = Vec::new();
    l.connector
        .scan("t", &sql, shape, cols, 0, &mut |r| {
            rows.push(r);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    rows[0].row_string()
}

/// An expression over the single row of `table`, as text, computed by the engine.
async fn select_text(l: &Live, table: &str, expr: String) -> String {
    let sql = format!(
        "SELECT {} FROM {}",
        as_text(l.engine, &expr),
        l.connector.dialect().quote(table)
    );
    l.connector
        .query_text("t", &sql)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// The engine's row string and checksums of the single row in `table`.
async fn engine_row(l: &Live, table: &str, cols: &[BoundColumn]) -> (String, String, String) {
    let d = l.connector.dialect();
    // SQLite, and columns only the agent renders (JSON, floats on DuckDB): the fetch is the engine's path
    if l.engine == Engine::Sqlite || dialect::row_string_expr(d, cols).is_none() {
        let rs = agent_row(l, table, cols).await;
        return (
            rs.clone(),
            md5_48(rs.as_bytes()).to_string(),
            format!("{:016x}", sha256_64(rs.as_bytes())),
        );
    }
    let row = dialect::row_string_expr(d, cols).expect("checked above");
    let get = |expr: String| select_text(l, table, expr);
    let rs = get(row.clone()).await;
    let md5 = get(d.row_hash_expr(&row, HashMethod::Md5_48, None).unwrap()).await;
    let sha_signed = get(d.row_hash_expr(&row, HashMethod::Sha256_64, None).unwrap()).await;
    let sha = format!("{:016x}", wrap_decimal_sum(&sha_signed).unwrap());
    (rs, md5, sha)
}

/// The engine's sealed checksums of the single row in `table`, computed in SQL with the
/// vector file's k_row; `None` where the engine does not hash in SQL.
async fn engine_sealed(
    l: &Live,
    table: &str,
    cols: &[BoundColumn],
    keys: &RunKeys,
) -> Option<(String, String)> {
    let d = l.connector.dialect();
    let row = dialect::row_string_expr(d, cols)?;
    let get = |expr: String| select_text(l, table, expr);
    let md5 = get(d.row_hash_expr(&row, HashMethod::SealedMd5_48, Some(&keys.k_row))?).await;
    let sha = get(d.row_hash_expr(&row, HashMethod::SealedSha256_64, Some(&keys.k_row))?).await;
    Some((md5, format!("{:016x}", wrap_decimal_sum(&sha).unwrap())))
}

async fn vectors_on(engine: Engine) {
    let dir = tempfile::tempdir().unwrap();
    let l = live(engine, "vectors", dir.path());
    let file = VectorFile::load_repo();
    let mut failures = Vec::new();
    let mut stored = 0;
    let mut sealed_checked = 0;
    for v in &file.vectors {
        if cannot_store(engine, v).is_some() {
            continue;
        }
        let table = format!("v_{}", v.id);
        l.exec(&create_and_insert(engine, &table, v)).await;
        stored += 1;
        let cols = bound(&l, &table, columns_for(v)).await;
        let (rs, md5, sha) = engine_row(&l, &table, &cols).await;
        if rs != v.row_string || md5 != v.md5_48 || sha != v.sha256_64 {
            failures.push(format!(
                "{} ({}): got {rs:?} md5 {md5} sha {sha}, want {:?} md5 {} sha {}",
                v.id, v.about, v.row_string, v.md5_48, v.sha256_64
            ));
        }
        if let Some(sr) = file.sealed.rows.iter().find(|r| r.id == v.id)
            && let Some((md5, sha)) = engine_sealed(&l, &table, &cols, &file.sealed.keys()).await
            && {
                sealed_checked += 1;
                md5 != sr.sealed_md5_48 || sha != sr.sealed_sha256_64
            }
        {
            failures.push(format!(
                "{} ({}): sealed in SQL md5 {md5} sha {sha}, want md5 {} sha {}",
                v.id, v.about, sr.sealed_md5_48, sr.sealed_sha256_64
            ));
        }
        let fetched = agent_row(&l, &table, &cols).await;
        if fetched != v.row_string {
            failures.push(format!(
                "{} ({}): the agent's row fetch gives {fetched:?}, want {:?}",
                v.id, v.about, v.row_string
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{engine:?} reproduces {} of {stored} stored vectors; failures:\n{}",
        stored - failures.len(),
        failures.join("\n")
    );
    let skipped: Vec<String> = file
        .vectors
        .iter()
        .filter_map(|v| cannot_store(engine, v).map(|r| format!("{} ({r})", v.id)))
        .collect();
    assert!(
        stored >= file.vectors.len() - 24,
        "{engine:?} skips too many vectors: {skipped:?}"
    );
    // engines that hash in SQL reproduce the sealed vectors too (SQLite hashes in the agent)
    assert!(
        engine == Engine::Sqlite || sealed_checked >= 8,
        "{engine:?}: only {sealed_checked} sealed vectors checked in SQL"
    );
    eprintln!(
        "{engine:?}: {stored} vectors reproduced bit for bit ({sealed_checked} sealed in SQL); not storable: {skipped:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_reproduces_every_vector() {
    vectors_on(Engine::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_reproduces_every_vector() {
    vectors_on(Engine::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_reproduces_every_vector() {
    vectors_on(Engine::Sqlite).await;
}

/// The engines' SUM and XOR over row checksums, against every aggregate vector.
async fn aggregates_on(engine: Engine) {
    let dir = tempfile::tempdir().unwrap();
    let l = live(engine, "aggs", dir.path());
    let file = VectorFile::load_repo();
    let text = if engine == Engine::MariaDb {
        "TEXT CHARACTER SET utf8mb4"
    } else {
        "TEXT"
    };
    let mut sql = format!("CREATE TABLE agg (grp VARCHAR(10), n INTEGER, rs {text});\n");
    for a in &file.aggregates {
        for (i, id) in a.rows.iter().enumerate() {
            let rs = &file.row(id).row_string;
            let lit = if engine == Engine::MariaDb {
                quote(&rs.replace('\\', "\\\\"))
            } else {
                quote(rs)
            };
            sql.push_str(&format!("INSERT INTO agg VALUES ('{}', {i}, {lit});\n", a.id));
        }
    }
    l.exec(&sql).await;
    let d = l.connector.dialect();
    for a in &file.aggregates {
        for method in [HashMethod::Md5_48, HashMethod::Sha256_64] {
            let (sum, xor) = if engine == Engine::Sqlite {
                // SQLite has no hash functions: the agent hashes its values in-process
                let mut agg = AnyAggregate::empty(method, true);
                for id in &a.rows {
                    agg.add_checksum(method.row_checksum(file.row(id).row_string.as_bytes()));
                }
                (agg.sum(), agg.xor())
            } else {
                let h = d.row_hash_expr("rs", method, None).unwrap();
                let q = |agg: &str| {
                    format!(
                        "SELECT {} FROM (SELECT {h} AS h FROM agg WHERE grp = '{}') x",
                        as_text(engine, agg),
                        a.id
                    )
                };
                let xor_fn = if engine == Engine::Postgres {
                    "bit_xor"
                } else {
                    "BIT_XOR"
                };
                let s = l
                    .connector
                    .query_text("t", &q("COALESCE(SUM(h), 0)"))
                    .await
                    .unwrap()
                    .unwrap();
                let x = l
                    .connector
                    .query_text("t", &q(&format!("COALESCE({xor_fn}(h), 0)")))
                    .await
                    .unwrap()
                    .unwrap();
                (wrap_decimal_sum(&s).unwrap(), Some(wrap_decimal_sum(&x).unwrap()))
            };
            match method {
                HashMethod::Md5_48 => assert_eq!(
                    format!("{sum:016x}"),
                    a.md5_48_sum,
                    "{engine:?} {} ({})",
                    a.id,
                    a.about
                ),
                // the aggregate vectors are unsealed; sealed ones are pinned per row
                _ => {
                    assert_eq!(
                        format!("{sum:016x}"),
                        a.sha256_sum,
                        "{engine:?} {} ({})",
                        a.id,
                        a.about
                    );
                    assert_eq!(
                        format!("{:016x}", xor.unwrap()),
                        a.sha256_xor,
                        "{engine:?} {} xor",
                        a.id
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_aggregates_match_the_vectors() {
    aggregates_on(Engine::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_aggregates_match_the_vectors() {
    aggregates_on(Engine::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_aggregates_match_the_vectors() {
    aggregates_on(Engine::Sqlite).await;
}

#[cfg(feature = "duckdb")]
#[tokio::test(flavor = "multi_thread")]
async fn duckdb_reproduces_every_vector() {
    vectors_on(Engine::DuckDb).await;
}

#[cfg(feature = "duckdb")]
#[tokio::test(flavor = "multi_thread")]
async fn duckdb_aggregates_match_the_vectors() {
    aggregates_on(Engine::DuckDb).await;
}

// ---- one logical table, every engine, every split --------------------------------

const ROWS: i64 = 3000;

fn orders_sql(e: Engine, table: &str) -> String {
    let (text_t, ts_t, bool_t) = match e {
        Engine::Postgres => ("varchar(40)", "timestamp(6)", "boolean"),
        Engine::MariaDb => ("VARCHAR(40) CHARACTER SET utf8mb4", "DATETIME(6)", "TINYINT(1)"),
        Engine::Sqlite => ("VARCHAR(40)", "TIMESTAMP", "BOOLEAN"),
        Engine::DuckDb => ("VARCHAR", "TIMESTAMP", "BOOLEAN"),
    };
    let mut sql = format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, code {text_t} NOT NULL, amount DECIMAL(12,2), placed {ts_t}, note TEXT, ok {bool_t});\n"
    );
    let names = ["Zoë", "Øre", "ñandú", "日本", "a:b", "~", "", "Ärger", "zz", "AA"];
    for chunk in (1..=ROWS).collect::<Vec<_>>().chunks(500) {
        let vals: Vec<String> = chunk
            .iter()
            .map(|&i| {
                let id = i * 3 + (i % 5);
                let code = format!("{}-{}", names[(i % 10) as usize], i % 97);
                let amount = format!("{}.{:02}", (i * 7919) % 100000, i % 100);
                let at = format!(
                    "2024-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                    1 + i % 12,
                    1 + i % 28,
                    i % 24,
                    i % 60,
                    (i * 7) % 60,
                    (i * 104729) % 1_000_000
                );
                let note = if i % 4 == 0 {
                    "NULL".to_string()
                } else {
                    quote(&format!("n{}", i % 13))
                };
                let ok = match (e, i % 2 == 0) {
                    (Engine::Sqlite, b) => (b as i32).to_string(),
                    (_, b) => b.to_string().to_uppercase(),
                };
                format!("({id}, {}, {amount}, '{at}', {note}, {ok})", quote(&code))
            })
            .collect();
        sql.push_str(&format!("INSERT INTO {table} VALUES {};\n", vals.join(", ")));
    }
    sql
}

fn orders_columns() -> Vec<ColumnSpec> {
    let c = |n: &str, class: TypeClass, scale: u32| ColumnSpec {
        name: n.into(),
        format: FieldFormat::new(class).with_scale(scale),
    };
    vec![
        c("id", TypeClass::Integer, 0),
        c("code", TypeClass::Text, 0),
        c("amount", TypeClass::Decimal, 2),
        c("placed", TypeClass::Timestamp, 6),
        c("note", TypeClass::Text, 0),
        c("ok", TypeClass::Boolean, 0),
    ]
}

type Summary = Vec<(usize, usize, Segment, u64, u64, Option<u64>)>;

fn summary(o: &AggregateOut) -> Summary {
    o.buckets
        .iter()
        .map(|b| {
            (
                b.parent,
                b.child,
                b.segment.clone(),
                b.agg.count(),
                b.agg.sum(),
                b.agg.xor(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_table_gives_identical_buckets_on_every_engine_and_path() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let mut results: BTreeMap<String, Summary> = BTreeMap::new();
    let int = |i: i64| vec![KeyPart::Int(i)];
    let splits: Vec<(&'static str, Vec<(Segment, Split)>)> = vec![
        ("quantile", vec![(Segment::whole(), Split::Quantile(8))]),
        ("hash", vec![(Segment::whole(), Split::Hash(8))]),
        (
            "cuts+nested hash+whole",
            vec![
                (
                    Segment {
                        lower: Some(int(100)),
                        upper: Some(int(5000)),
                        hash: None,
                        period: None,
                        window: None,
                    },
                    Split::Cuts(vec![int(700), int(2500)]),
                ),
                (
                    Segment {
                        hash: Some((1 << 59, 1 << 60)),
                        ..Segment::default()
                    },
                    Split::Hash(4),
                ),
                (
                    Segment {
                        lower: Some(int(8000)),
                        ..Segment::default()
                    },
                    Split::Whole,
                ),
            ],
        ),
    ];
    let period = |g: Granularity| Split::Period {
        column: "placed".into(),
        granularity: g,
    };
    let march = Period {
        column: "placed".into(),
        granularity: Granularity::Month,
        label: "2024-03".into(),
    };
    let mut splits = splits;
    for g in [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ] {
        splits.push((g.name(), vec![(Segment::whole(), period(g))]));
    }
    splits.push((
        "quantile inside a month",
        vec![(
            Segment {
                period: Some(march),
                ..Segment::default()
            },
            Split::Quantile(4),
        )],
    ));
    for engine in engines() {
        let l = live(engine, "orders", dir.path());
        l.exec(&orders_sql(engine, "orders")).await;
        let mut ds = dataset("orders", "orders", l.connector);
        let b = ds
            .bind(&mut ds.session().await.unwrap(), orders_columns(), 1)
            .await
            .unwrap();
        for (name, parents) in &splits {
            for method in HashMethod::BY_STRENGTH {
                let method_hasher = hasher(method);
                // pushed down, the default (in-process except on DuckDB), forced in-process
                for (hashing, in_process) in [
                    (Hashing::Pushdown, false),
                    (Hashing::Auto, false),
                    (Hashing::Auto, true),
                ] {
                    ds.config.hashing = hashing;
                    let out = ds
                        .aggregate(
                            &mut ds.session().await.unwrap(),
                            &b,
                            &method_hasher,
                            parents,
                            in_process,
                        )
                        .await
                        .unwrap();
                    let total: u64 = out
                        .buckets
                        .iter()
                        .filter(|b| b.parent == 0)
                        .map(|b| b.agg.count())
                        .sum();
                    assert!(total > 0, "{engine:?} {name}: empty");
                    let agent_hashes = in_process
                        || engine == Engine::Sqlite
                        || (hashing == Hashing::Auto && engine != Engine::DuckDb);
                    let want = if agent_hashes { "in_process" } else { "pushdown" };
                    assert_eq!(out.path.name(), want, "{engine:?} {name} {hashing:?}");
                    let label = format!("{name}/{method}");
                    let s = summary(&out);
                    match results.get(&label) {
                        None => {
                            results.insert(label, s);
                        }
                        Some(expected) => assert_eq!(
                            &s, expected,
                            "{engine:?} {label} ({hashing:?}, in_process={in_process}) differs from PostgreSQL pushdown"
                        ),
                    }
                }
            }
        }
    }
    assert_eq!(results.len(), 40);
    let months = &results["month/sha256_64"];
    assert_eq!(months.len(), 12, "one bucket per month present");
    assert_eq!(months[2].2.period.as_ref().unwrap().label, "2024-03");
    eprintln!("identical buckets on {:?}", engines());
}

/// The same table with one planted difference of each kind, on every engine: the
/// buckets that differ from a clean copy are exactly the buckets holding the planted
/// rows, whichever engine holds which copy.
#[tokio::test(flavor = "multi_thread")]
async fn planted_differences_land_in_exactly_the_right_bucket() {
    let dir = tempfile::tempdir().unwrap();
    // key 3i + i%5 for i in 1..=3000; cuts every 1000 keys
    let cuts: Vec<Vec<KeyPart>> = (1..9).map(|c| vec![KeyPart::Int(c * 1000)]).collect();
    let bucket_of = |k: i64| cuts.iter().filter(|c| c[0] <= KeyPart::Int(k)).count();
    // changed value (id 1504), missing row (4500), extra row (8000, a key the table lacks),
    // NULL vs empty text (id 6008 has a note; set it NULL in one copy and '' in the other)
    let plant = |e: Engine| {
        let empty = "''".to_string();
        let ok = if e == Engine::Sqlite { "1" } else { "TRUE" };
        format!(
            "UPDATE orders SET amount = amount + 1 WHERE id = 1504;\nDELETE FROM orders WHERE id = 4500;\n\
             INSERT INTO orders VALUES (8000, 'x', 1.00, '2024-01-01 00:00:00', NULL, {ok});\n\
             UPDATE orders SET note = {empty} WHERE id = 6008;\n"
        )
    };
    let expected: std::collections::BTreeSet<usize> =
        [1504, 4500, 8000, 6008].into_iter().map(bucket_of).collect();
    assert_eq!(
        expected.len(),
        4,
        "the planted rows sit in four different buckets"
    );
    let mut clean = Vec::new();
    let mut dirty = Vec::new();
    for engine in engines() {
        for (planted, out) in [(false, &mut clean), (true, &mut dirty)] {
            let name = if planted { "dirty" } else { "clean" };
            let l = live(engine, name, dir.path());
            l.exec(&orders_sql(engine, "orders")).await;
            l.exec(&format!(
                "UPDATE orders SET note = NULL WHERE id = 6008;\n{}",
                if planted { plant(engine) } else { String::new() }
            ))
            .await;
            let ds = dataset(name, "orders", l.connector);
            let b = ds
                .bind(&mut ds.session().await.unwrap(), orders_columns(), 1)
                .await
                .unwrap();
            let o = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &Hasher::unsealed(HashMethod::Sha256_64),
                    &[(Segment::whole(), Split::Cuts(cuts.clone()))],
                    false,
                )
                .await
                .unwrap();
            out.push((engine, summary(&o)));
        }
    }
    for (ce, c) in &clean {
        for (de, d) in &dirty {
            let differing: std::collections::BTreeSet<usize> = c
                .iter()
                .zip(d)
                .filter(|(a, b)| (a.3, a.4, a.5) != (b.3, b.4, b.5))
                .map(|(a, _)| a.1)
                .collect();
            assert_eq!(differing, expected, "clean on {ce:?} against dirty on {de:?}");
        }
    }
}

/// Values that once needed SQL's text (PostgreSQL infinity and BC timestamps, a NaN
/// numeric, a timestamp past 9999) are read by the agent itself: the in-process and the
/// pushed-down aggregate agree, the rows phase reads them, and nothing is remembered
/// between requests (the same request gives the same path and answer twice).
#[tokio::test(flavor = "multi_thread")]
async fn both_paths_agree_on_values_beyond_the_iso_calendar() {
    let dir = tempfile::tempdir().unwrap();
    let l = live(Engine::Postgres, "inf", dir.path());
    l.exec(
        "CREATE TABLE ev (id BIGINT PRIMARY KEY, at TIMESTAMP, d DATE, n NUMERIC);\n\
         INSERT INTO ev VALUES (1, '2024-01-01 10:00:00.5', '2024-01-01', 1.50), (2, 'infinity', '-infinity', 'NaN'), \
         (3, '0044-03-15 12:00:00 BC', '2000-01-01 BC', '-0.00'), (4, '10000-01-01 00:00:00', '12345-06-07', 'Infinity');\n",
    )
    .await;
    let cols = || {
        vec![
            ColumnSpec {
                name: "id".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "at".into(),
                format: FieldFormat::new(TypeClass::Timestamp),
            },
            ColumnSpec {
                name: "d".into(),
                format: FieldFormat::new(TypeClass::Date),
            },
            ColumnSpec {
                name: "n".into(),
                format: FieldFormat::new(TypeClass::Decimal).exact(true),
            },
        ]
    };
    let whole = [(Segment::whole(), Split::Whole)];
    let ds = dataset("ev", "ev", l.connector);
    let b = ds
        .bind(&mut ds.session().await.unwrap(), cols(), 1)
        .await
        .unwrap();
    let forced = ds
        .aggregate(
            &mut ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            true,
        )
        .await
        .unwrap();
    assert_eq!(forced.path.name(), "in_process");
    assert_eq!(forced.buckets[0].agg.count(), 4);
    let pushed_ds = pushdown_dataset(&ds, &l.url);
    let pushed = pushed_ds
        .aggregate(
            &mut pushed_ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            false,
        )
        .await
        .unwrap();
    assert_eq!(pushed.path.name(), "pushdown");
    assert_eq!(
        forced.buckets[0].agg, pushed.buckets[0].agg,
        "the two paths render identically"
    );
    assert_eq!(digest_count(&ds, &b).await.unwrap(), 4);
    let again = ds
        .aggregate(
            &mut ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &whole,
            false,
        )
        .await
        .unwrap();
    assert_eq!(
        again.path.name(),
        "in_process",
        "auto stays in-process: no sticky fallback"
    );
    assert_eq!(again.buckets[0].agg, forced.buckets[0].agg);
}

/// The same dataset configured with `hashing: pushdown`.
fn pushdown_dataset(ds: &Dataset, url: &str) -> Dataset {
    let mut config = ds.config.clone();
    config.hashing = Hashing::Pushdown;
    Dataset::new(
        ds.name.clone(),
        config,
        ds.source.clone(),
        Connector::open(url).unwrap(),
    )
}

/// How many row digests the whole of `ds` gives.
async fn digest_count(ds: &Dataset, b: &Bound) -> Result<usize, AgentError> {
    let mut n = 0;
    ds.digests(
        &mut ds.session().await?,
        b,
        &Hasher::unsealed(HashMethod::Sha256_64),
        &Segment::whole(),
        100,
        &mut |batch| {
            n += batch.len();
            Ok(())
        },
    )
    .await?;
    Ok(n)
}

/// A dataset `name` over `table`, keyed by `id`, on `connector` (the URL in its config
/// is never opened: the connector is given).
fn dataset(name: &str, table: &str, connector: Connector) -> Dataset {
    Dataset::new(
        name.into(),
        tally_common::config_file::parse_yaml(
            std::path::Path::new("x"),
            &format!("{{ url: 'sqlite://x', table: {table}, key: [id] }}"),
        )
        .unwrap(),
        Source::Table(vec![table.into()]),
        connector,
    )
}

/// Fixed run keys for the sealed methods in these tests (what two agents would derive).
const TEST_KEYS: RunKeys = RunKeys {
    k_row: [0x5a; 32],
    k_key: [0xa5; 32],
};

fn hasher(m: HashMethod) -> Hasher {
    if m.is_sealed() {
        Hasher::sealed(m, &TEST_KEYS)
    } else {
        Hasher::unsealed(m)
    }
}

/// Windows (DESIGN §5): every engine, on every path, keeps the same rows of a window:
/// the row at the bound is in, a microsecond later is out, NULL is out; an integer
/// window compares by value. Pushed down, forced in-process, quantile-split (the
/// in-process count and scan) and digests all count the window's rows alone, and every
/// engine's checksum of them is the same.
#[tokio::test(flavor = "multi_thread")]
async fn every_engine_and_path_keeps_the_same_rows_of_a_window() {
    use tally_common::segment::Window;
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        (1, Some("2026-06-01 11:59:59.999999"), Some(10)),
        (2, Some("2026-06-01 12:00:00.000000"), Some(20)),
        (3, Some("2026-06-01 12:00:00.000001"), Some(21)),
        (4, None, None),
        (5, Some("1999-01-01 00:00:00.000000"), Some(-5)),
        (6, Some("2030-01-01 00:00:00.000000"), Some(99)),
    ];
    let values: Vec<String> = rows
        .iter()
        .map(|(id, at, n)| {
            format!(
                "({id}, {}, {})",
                at.map_or("NULL".to_string(), |a| format!("'{a}'")),
                n.map_or("NULL".to_string(), |n| n.to_string())
            )
        })
        .collect();
    let cols = || {
        vec![
            ColumnSpec {
                name: "id".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "changed_at".into(),
                format: FieldFormat::new(TypeClass::Timestamp).with_scale(6),
            },
            ColumnSpec {
                name: "n".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
        ]
    };
    let windows = [
        // the bound as the coordinator sends it (nanosecond digits), and as written
        ("changed_at", "2026-06-01T12:00:00.000000000", vec![1, 2, 5]),
        ("changed_at", "2026-06-01 12:00:00", vec![1, 2, 5]),
        ("CHANGED_AT", "2026-06-01T11:59:59.9999999", vec![1, 5]),
        ("n", "20", vec![1, 2, 5]),
        ("n", "-6", vec![]),
    ];
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    // per window: (engine, path, count, checksum)
    type Answers<'a> = Vec<(Engine, &'a str, u64, u64)>;
    let mut seen: BTreeMap<(String, String), Answers> = BTreeMap::new();
    for engine in engines() {
        let l = live(engine, "win", dir.path());
        let at_type = match engine {
            Engine::Postgres => "TIMESTAMP(6)",
            Engine::MariaDb => "DATETIME(6)",
            Engine::Sqlite => "TIMESTAMP",
            Engine::DuckDb => "TIMESTAMP",
        };
        l.exec(&format!(
            "CREATE TABLE ev (id BIGINT PRIMARY KEY, changed_at {at_type}, n BIGINT);\nINSERT INTO ev VALUES {};\n",
            values.join(", ")
        ))
        .await;
        let url = l.url.clone();
        let ds = dataset("ev", "ev", l.connector);
        let pushed_ds = pushdown_dataset(&ds, &url);
        let b = ds
            .bind(&mut ds.session().await.unwrap(), cols(), 1)
            .await
            .unwrap();
        for (column, upper, want) in &windows {
            let seg = Segment {
                window: Some(Window {
                    column: column.to_string(),
                    upper: upper.to_string(),
                }),
                ..Segment::whole()
            };
            let whole = [(seg.clone(), Split::Whole)];
            let mut answers = Vec::new();
            for (name, d, in_process) in [
                ("auto", &ds, false),
                ("in_process", &ds, true),
                ("pushdown", &pushed_ds, false),
            ] {
                // SQLite has no pushdown; DuckDB's default is pushdown (and a second
                // connector would open another, empty, in-memory database)
                if name == "pushdown" && matches!(engine, Engine::Sqlite | Engine::DuckDb) {
                    continue;
                }
                let out = d
                    .aggregate(&mut d.session().await.unwrap(), &b, &h, &whole, in_process)
                    .await
                    .unwrap();
                if name == "pushdown" || (name == "auto" && engine == Engine::DuckDb) {
                    assert_eq!(out.path.name(), "pushdown", "{engine:?}");
                }
                answers.push((name, out.buckets[0].agg.count(), out.buckets[0].agg.sum()));
            }
            // a quantile split counts the window's rows, then cuts them
            let q = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &h,
                    &[(seg.clone(), Split::Quantile(2))],
                    true,
                )
                .await
                .unwrap();
            answers.push((
                "quantile",
                q.buckets.iter().map(|b| b.agg.count()).sum(),
                q.buckets.iter().fold(0u64, |s, b| s.wrapping_add(b.agg.sum())),
            ));
            let mut digests = 0;
            ds.digests(
                &mut ds.session().await.unwrap(),
                &b,
                &h,
                &seg,
                100,
                &mut |batch| {
                    digests += batch.len() as u64;
                    Ok(())
                },
            )
            .await
            .unwrap();
            for (name, count, _) in &answers {
                assert_eq!(
                    *count,
                    want.len() as u64,
                    "{engine:?} {name}: window {column} <= {upper}"
                );
            }
            assert_eq!(
                digests,
                want.len() as u64,
                "{engine:?} digests: window {column} <= {upper}"
            );
            let first = answers[0].2;
            assert!(
                answers.iter().all(|a| a.2 == first),
                "{engine:?}: the paths disagree on the window's checksum: {answers:?}"
            );
            seen.entry((column.to_string(), upper.to_string()))
                .or_default()
                .extend(answers.iter().map(|(n, c, s)| (engine, *n, *c, *s)));
            // investigation SQL names the window where the engine renders it
            let sql = ds.investigation_sql(&b, &seg, false);
            // SQLite renders no canonical timestamp text: its SQL says so
            if engine != Engine::Sqlite || *column == "n" {
                assert!(sql.contains("<="), "{engine:?}: {sql}");
            } else {
                assert!(sql.contains("window"), "{engine:?}: {sql}");
            }
        }
        // a bound that is not a value of the column's class, a column that is not
        // compared, and a text column are refused, naming what is wrong
        for (column, upper, says) in [
            ("changed_at", "yesterday", "window.upper"),
            ("n", "1.5", "64-bit integer"),
            ("missing", "1", "not among the compared columns"),
        ] {
            let seg = Segment {
                window: Some(Window {
                    column: column.into(),
                    upper: upper.into(),
                }),
                ..Segment::whole()
            };
            let e = ds
                .aggregate(
                    &mut ds.session().await.unwrap(),
                    &b,
                    &h,
                    &[(seg, Split::Whole)],
                    false,
                )
                .await
                .unwrap_err();
            assert!(e.to_string().contains(says), "{engine:?}: {e}");
        }
    }
    for ((column, upper), answers) in &seen {
        let first = answers[0].3;
        assert!(
            answers.iter().all(|a| a.3 == first),
            "window {column} <= {upper}: the engines disagree: {answers:?}"
        );
    }
}
