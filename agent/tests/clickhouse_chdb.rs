//! ClickHouse's SQL on a real ClickHouse engine: the embedded one of PyPI's
//! `chdb-core` (26.9), which `.ci/run` installs into a venv outside the clone
//! (`TALLY_CHDB_PYTHON`, by default `~/.cache/tally-chdb/26.9.0/bin/python`). There is
//! no ClickHouse connector yet: the tests render each statement with the agent's
//! dialect, run it through `tests/chdb/run.py`, and hold the answers to the reference.
//!
//! 1. Every vector of tests/vectors/canonical.json ClickHouse can store is loaded into
//!    a table of ClickHouse types (every column `Nullable`, its type named back by
//!    `system.columns` and classified by the dialect's own type table), and the
//!    dialect's row string, both checksums and both sealed checksums reproduce the
//!    vector byte for byte; the row fetch (`FetchShape::Text`, re-read by the
//!    reference as the connector will) does too, for every vector, including those
//!    with doubles and JSON, which only the agent renders.
//! 2. The dialect's SUM (wrapping in `Int64`/`UInt64`) and `groupBitXor` reproduce
//!    every aggregate vector.
//! 3. (`segment_statements_on_chdb`) the bucketed aggregates of every split, the
//!    period aggregate, counts, key bounds, row fetches and investigation SQL run on
//!    one table and agree with the same rows computed by the reference in Rust.

#![cfg(feature = "clickhouse")]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tally_agent::config::Source;
use tally_agent::connector::reread;
use tally_agent::dialect::clickhouse::{self, ClickHouse};
use tally_agent::dialect::{self, Dialect, FetchShape, Sql};
use tally_agent::schema::{BoundColumn, renders_as};
use tally_common::canonical::{canonical_from_text, row_string};
use tally_common::checksum::{HashMethod, wrap_decimal_sum};
use tally_common::segment::{ColumnSpec, KeyPart, Segment};
use tally_common::types::TypeClass;
use tally_common::vectors::{RowVector, VectorField, VectorFile};

#[path = "chdb/segments.rs"]
mod segments;

pub const CHDB_VERSION: &str = "26.9.0";

/// The venv's python with `chdb-core`; panics (never skips) where it is missing.
pub fn python() -> PathBuf {
    let p = match std::env::var_os("TALLY_CHDB_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(format!(".cache/tally-chdb/{CHDB_VERSION}/bin/python")),
    };
    assert!(
        p.exists(),
        "no chdb-core {CHDB_VERSION} at {} (set TALLY_CHDB_PYTHON): .ci/run installs it \
         (python3 -m venv DIR && DIR/bin/pip install chdb-core=={CHDB_VERSION})",
        p.display()
    );
    p
}

/// One statement and its bind values (`{p1:..}`, `{p2:..}`, ... in order).
#[derive(Clone)]
pub struct Query {
    pub sql: String,
    pub params: Vec<String>,
}

impl Query {
    pub fn plain(sql: impl Into<String>) -> Query {
        Query {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    pub fn bound(sql: &Sql) -> Query {
        Query {
            sql: sql.text.clone(),
            params: sql
                .binds
                .iter()
                .map(|b| match b {
                    KeyPart::Int(i) => i.to_string(),
                    KeyPart::Text(t) => t.clone(),
                })
                .collect(),
        }
    }
}

pub type Rows = Vec<Vec<Option<String>>>;

/// Runs `setup`, then each query, in one chdb session under the dialect's settings;
/// the engine's version and each query's rows (values as text) or error.
pub fn run(setup: &[String], queries: &[Query]) -> (String, Vec<Result<Rows, String>>) {
    run_under(&[], setup, queries)
}

/// [`run`] in a session whose settings `profile` set first, as a user's settings
/// profile does before the dialect's settings arrive with each statement.
pub fn run_under(
    profile: &[(&str, &str)],
    setup: &[String],
    queries: &[Query],
) -> (String, Vec<Result<Rows, String>>) {
    let queries: Vec<Value> = queries
        .iter()
        .map(|q| {
            let params: serde_json::Map<String, Value> = q
                .params
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("p{}", i + 1), Value::String(v.clone())))
                .collect();
            json!({"sql": q.sql, "params": params})
        })
        .collect();
    let settings: Vec<(&str, &str)> = profile.iter().chain(clickhouse::SETTINGS).copied().collect();
    let req = json!({"settings": settings, "setup": setup, "queries": queries});
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chdb/run.py");
    let mut child = Command::new(python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the chdb python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "chdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("chdb's answer is JSON");
    let text = |c: &Value| match c {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    let results = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r.get("error") {
            Some(e) => Err(e.as_str().unwrap_or_default().to_string()),
            None => Ok(r["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| row.as_array().unwrap().iter().map(text).collect())
                .collect()),
        })
        .collect();
    (
        format!(
            "ClickHouse {} (chdb-core {})",
            v["version"].as_str().unwrap_or("?"),
            v["chdb"].as_str().unwrap_or("?")
        ),
        results,
    )
}

/// A line on the process's stderr, past the test harness's capture.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The year of a dated vector value written `YYYY-…`; `None` for signed years, BC,
/// infinities.
fn plain_year(v: &str) -> Option<i64> {
    let b = v.as_bytes();
    (b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && !v.ends_with(" BC"))
        .then(|| v[..4].parse().unwrap())
}

fn fraction_digits(v: &str) -> u32 {
    v.split('.')
        .nth(1)
        .map_or(0, |f| f.chars().take_while(char::is_ascii_digit).count() as u32)
}

fn unhex_literal(s: &str) -> String {
    format!("unhex('{}')", hex::encode(s))
}

/// The ClickHouse column type and the literal of one vector field, or why ClickHouse
/// cannot store it.
fn column(f: &VectorField) -> Result<(String, String), &'static str> {
    let v = f.value.as_deref();
    let s = f.scale.or(f.precision).unwrap_or(0);
    let dated = matches!(f.class.as_str(), "date" | "timestamp" | "timestamptz");
    if let (true, Some(v)) = (dated, v) {
        match plain_year(v) {
            Some(y) if (1900..=2299).contains(&y) => {}
            _ => return Err("Date32 and DateTime64 hold years 1900-2299 only"),
        }
        if v.get(5..7) == Some("00") || v.get(8..10) == Some("00") {
            return Err("has no zero dates (a MySQL value)");
        }
    }
    let cast = |t: &str| v.map_or("NULL".into(), |v| format!("CAST('{v}' AS {t})"));
    Ok(match f.class.as_str() {
        "integer" => {
            let t = match v.map(str::parse::<i64>) {
                Some(Err(_)) => "UInt64",
                _ => "Int64",
            };
            (t.into(), cast(t))
        }
        "decimal" if v.is_some_and(|v| ["NaN", "Infinity", "-Infinity"].contains(&v)) => {
            return Err("Decimal has no NaN or infinities");
        }
        // at the value's own digits (a cast into fewer truncates toward zero), rendered
        // at the vector's scale: the dialect's rounding is what is checked
        "decimal" => {
            let d = v.map_or(s, |v| s.max(fraction_digits(v)));
            let t = format!("Decimal(76, {})", if f.exact { 40 } else { d });
            (t.clone(), cast(&t))
        }
        "float" => ("Float64".into(), cast("Float64")),
        "boolean" if v.is_none_or(|v| v == "true" || v == "false") => {
            ("Bool".into(), v.unwrap_or("NULL").to_string())
        }
        // an integer compared as a boolean (MySQL TINYINT(1)): an integer column
        "boolean" => ("Int64".into(), cast("Int64")),
        "text" | "json" => ("String".into(), v.map_or("NULL".into(), unhex_literal)),
        "date" => (
            "Date32".into(),
            v.map_or("NULL".into(), |v| format!("toDate32('{v}')")),
        ),
        "timestamp" | "timestamptz" => {
            let p = v.map_or(s, |v| s.max(fraction_digits(v))).min(9);
            (
                format!("DateTime64({p}, 'UTC')"),
                v.map_or("NULL".into(), |v| {
                    format!("parseDateTime64BestEffort('{v}', {p}, 'UTC')")
                }),
            )
        }
        "uuid" => (
            "UUID".into(),
            v.map_or("NULL".into(), |v| format!("toUUID('{v}')")),
        ),
        "binary" if f.char => {
            let n = v.map_or(1, |v| (v.len() / 2).max(1));
            (
                format!("FixedString({n})"),
                v.map_or("NULL".into(), |v| format!("toFixedString(unhex('{v}'), {n})")),
            )
        }
        // a String compared as binary by its bytes (text/binary, §8)
        "binary" => (
            "String".into(),
            v.map_or("NULL".into(), |v| format!("unhex('{v}')")),
        ),
        "time" => return Err("Time and Time64 are not classes the agent reads from ClickHouse (other)"),
        c => panic!("no ClickHouse type for {c}"),
    })
}

/// The table of a vector: its setup SQL, or why ClickHouse cannot store it.
fn vector_setup(v: &RowVector) -> Result<Vec<String>, &'static str> {
    let cols: Vec<(String, String)> = v.fields.iter().map(column).collect::<Result<_, _>>()?;
    let t = format!("v_{}", v.id);
    let defs: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, (ty, _))| format!("c{i} Nullable({ty})"))
        .collect();
    let lits: Vec<&str> = cols.iter().map(|(_, l)| l.as_str()).collect();
    Ok(vec![
        format!("CREATE TABLE {t} ({}) ENGINE = Memory", defs.join(", ")),
        format!("INSERT INTO {t} SELECT {}", lits.join(", ")),
    ])
}

/// The columns of a vector's table as the agent binds them: the type `system.columns`
/// names, classified by the dialect, rendered in the vector's format. A zone-less
/// timestamp vector is held in a `DateTime64(p, 'UTC')` (an instant: ClickHouse has
/// no zone-less type) and rendered as its UTC wall time, a rendering the agent never
/// asks of ClickHouse (its columns are timestamptz) but whose cut digits are the
/// timestamptz rendering's.
fn bind(v: &RowVector, types: &Rows) -> Vec<BoundColumn> {
    v.fields
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (f, t))| {
            let ty = t[1].clone().unwrap();
            let info = clickhouse::classify(&ty).column(format!("c{i}"), ty, true);
            let format = f.format();
            assert!(
                renders_as(info.class, format.class)
                    || (info.class, format.class) == (TypeClass::TimestampTz, TypeClass::Timestamp),
                "{}: c{i} is {} and cannot be compared as {}",
                v.id,
                info.class,
                format.class
            );
            BoundColumn {
                info,
                spec: ColumnSpec {
                    name: format!("c{i}"),
                    format,
                },
                zone: None,
            }
        })
        .collect()
}

#[test]
fn vectors_and_aggregates_on_chdb() {
    let d = ClickHouse::default();
    let file = VectorFile::load_repo();
    let mut setup = Vec::new();
    let mut stored = Vec::new();
    let mut skipped = Vec::new();
    for v in &file.vectors {
        match vector_setup(v) {
            Ok(s) => {
                setup.extend(s);
                stored.push(v);
            }
            Err(why) => skipped.push(format!("{} ({why})", v.id)),
        }
    }
    let describe: Vec<Query> = stored
        .iter()
        .map(|v| {
            Query::plain(format!(
                "SELECT name, type FROM system.columns WHERE database = currentDatabase() \
                 AND table = 'v_{}' ORDER BY position",
                v.id
            ))
        })
        .collect();
    let (_, types) = run(&setup, &describe);
    let bound: Vec<Vec<BoundColumn>> = stored
        .iter()
        .zip(types)
        .map(|(v, t)| bind(v, &t.unwrap()))
        .collect();

    // per vector: the row string and checksums in SQL (where SQL renders every
    // column), then the row fetch
    let keys = file.sealed.keys();
    let mut queries = Vec::new();
    for (v, cols) in stored.iter().zip(&bound) {
        let rel = dialect::relation(&d, &Source::Table(vec![format!("v_{}", v.id)]));
        let sql = dialect::row_string_expr(&d, cols).map(|rs| {
            let hashes: Vec<String> = [
                (HashMethod::Md5_48, None),
                (HashMethod::Sha256_64, None),
                (HashMethod::SealedMd5_48, Some(&keys.k_row)),
                (HashMethod::SealedSha256_64, Some(&keys.k_row)),
            ]
            .iter()
            .map(|(m, k)| format!("toString({})", d.row_hash_expr(&rs, *m, *k).unwrap()))
            .collect();
            format!("SELECT {rs}, {} FROM {rel}", hashes.join(", "))
        });
        queries.push(Query::plain(sql.unwrap_or_else(|| "SELECT NULL".into())));
        let fetch = dialect::fetch_rows(
            &d,
            &Source::Table(vec![format!("v_{}", v.id)]),
            cols,
            &[],
            &Segment::whole(),
            FetchShape::Text,
            false,
        );
        queries.push(Query::bound(&fetch));
    }
    // the aggregate vectors: SUM and XOR of each method's row checksums
    setup.push("CREATE TABLE agg (grp String, n Int32, rs String) ENGINE = Memory".into());
    for a in &file.aggregates {
        for (i, id) in a.rows.iter().enumerate() {
            setup.push(format!(
                "INSERT INTO agg SELECT '{}', {i}, {}",
                a.id,
                unhex_literal(&file.row(id).row_string)
            ));
        }
        for m in [HashMethod::Md5_48, HashMethod::Sha256_64] {
            queries.push(Query::plain(format!(
                "SELECT {}, {} FROM (SELECT {} AS h FROM agg WHERE grp = '{}')",
                d.sum_text("h"),
                d.xor_aggregate("h").unwrap(),
                d.row_hash_expr("rs", m, None).unwrap(),
                a.id
            )));
        }
    }
    let (version, results) = run(&setup, &queries);
    let mut results = results.into_iter();
    let mut next = || results.next().unwrap();
    let mut failures = Vec::new();
    let (mut in_sql, mut sealed) = (0, 0);
    for (v, cols) in stored.iter().zip(&bound) {
        let sqlrow = next();
        let fetched = next();
        let fetched = match fetched {
            Ok(f) => f,
            Err(e) => {
                failures.push(format!("{}: the fetch failed: {e}", v.id));
                continue;
            }
        };
        let flags = reread(&d, FetchShape::Text, cols);
        let fields: Vec<Option<String>> = fetched[0]
            .iter()
            .zip(cols.iter().zip(&flags))
            .map(|(x, (c, &again))| {
                if again {
                    canonical_from_text(&c.spec.format, x.as_deref()).unwrap()
                } else {
                    x.clone()
                }
            })
            .collect();
        let rs = row_string(fields.iter().map(Option::as_deref));
        if rs != v.row_string {
            failures.push(format!(
                "{} ({}): the row fetch gives {rs:?}, want {:?}",
                v.id, v.about, v.row_string
            ));
        }
        if dialect::row_string_expr(&d, cols).is_none() {
            continue; // rendered in the agent: the fetch above is its path
        }
        in_sql += 1;
        let row = match sqlrow {
            Ok(r) => r[0].clone(),
            Err(e) => {
                failures.push(format!("{} ({}): {e}", v.id, v.about));
                continue;
            }
        };
        let hex = |s: &Option<String>| format!("{:016x}", wrap_decimal_sum(s.as_deref().unwrap()).unwrap());
        let (rs, md5, sha) = (
            row[0].clone().unwrap_or_default(),
            row[1].clone().unwrap(),
            hex(&row[2]),
        );
        if rs != v.row_string || md5 != v.md5_48 || sha != v.sha256_64 {
            failures.push(format!(
                "{} ({}): got {rs:?} md5 {md5} sha {sha}, want {:?} md5 {} sha {}",
                v.id, v.about, v.row_string, v.md5_48, v.sha256_64
            ));
        }
        if let Some(sr) = file.sealed.rows.iter().find(|r| r.id == v.id) {
            sealed += 1;
            let (smd5, ssha) = (row[3].clone().unwrap(), hex(&row[4]));
            if smd5 != sr.sealed_md5_48 || ssha != sr.sealed_sha256_64 {
                failures.push(format!(
                    "{}: sealed md5 {smd5} sha {ssha}, want md5 {} sha {}",
                    v.id, sr.sealed_md5_48, sr.sealed_sha256_64
                ));
            }
        }
    }
    for a in &file.aggregates {
        for m in [HashMethod::Md5_48, HashMethod::Sha256_64] {
            let r = next().unwrap_or_else(|e| panic!("{} {m}: {e}", a.id));
            let n = |i: usize| wrap_decimal_sum(r[0][i].as_deref().unwrap_or("0")).unwrap();
            let (sum, xor) = (format!("{:016x}", n(0)), format!("{:016x}", n(1)));
            match m {
                HashMethod::Md5_48 if sum != a.md5_48_sum => {
                    failures.push(format!("{} md5 sum {sum}, want {}", a.id, a.md5_48_sum))
                }
                HashMethod::Sha256_64 if sum != a.sha256_sum || xor != a.sha256_xor => {
                    failures.push(format!(
                        "{} sha sum {sum} xor {xor}, want {} {}",
                        a.id, a.sha256_sum, a.sha256_xor
                    ))
                }
                _ => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{version}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        stored.len() >= 80 && sealed >= 8,
        "too few vectors stored: {skipped:?}"
    );
    say(&format!(
        "{version}: {} of {} vectors reproduced byte for byte by the row fetch, {in_sql} of them in SQL \
         with both checksums ({sealed} sealed), {} aggregate vectors (SUM and groupBitXor); not storable: {skipped:?}",
        stored.len(),
        file.vectors.len(),
        file.aggregates.len()
    ));
}
