//! Engine fixtures of the live conformance suite (agent/tests/conformance.rs).
//!
//! A fixture holds everything the suite knows about one engine: the column type and
//! the literal of each canonical vector value, the vectors the engine cannot store
//! (with the reason), the types and literals of the suite's own tables, how to make a
//! fresh database (or schema) and the agent's URL for it, and how to run setup SQL
//! (DDL and inserts) against it. The suite itself names no engine: it runs over
//! [`available`].
//!
//! Adding an engine is a fixture file here and one line in [`all`]. A fixture that
//! cannot run on this machine (no server, no URL) says why in
//! [`EngineFixture::unavailable`]; [`available`] then prints a `NOT RUN` line for it
//! instead of skipping it silently.

use std::io::Write;
use std::path::Path;
use std::sync::Once;

use async_trait::async_trait;
use tally_agent::config::Source;
use tally_agent::connector::Connector;
use tally_common::vectors::{RowVector, VectorField};

#[cfg(feature = "duckdb")]
pub mod duckdb;
pub mod mariadb;
pub mod mssql;
pub mod oracle;
pub mod postgres;
#[cfg(feature = "spark")]
pub mod spark;
pub mod sqlite;

/// Engines the suite knows of but has no fixture for yet: (what, the variable that
/// would point the suite at a live server).
const WITHOUT_FIXTURE: &[(&str, &str)] = &[];

/// Every fixture this build has, whether or not it can run here.
pub fn all() -> Vec<Box<dyn EngineFixture>> {
    let mut v: Vec<Box<dyn EngineFixture>> = vec![
        Box::new(postgres::Postgres),
        Box::new(mariadb::MariaDb),
        Box::new(sqlite::Sqlite),
    ];
    #[cfg(feature = "duckdb")]
    v.push(Box::new(duckdb::DuckDb));
    #[cfg(feature = "spark")]
    {
        v.push(Box::new(spark::Spark::Local));
        v.push(Box::new(spark::Spark::databricks_from_env()));
    }
    v.push(Box::new(mssql::MsSql::from_env()));
    v.push(Box::new(oracle::Oracle::from_env()));
    v
}

/// The fixtures that can run on this machine, in the order of [`all`] (the first is
/// the reference of cross-engine comparisons). The first call prints one `NOT RUN`
/// line to stderr for every engine that cannot run (and every engine without a
/// fixture), past the test harness's capture: never a silent skip.
pub fn available() -> Vec<Box<dyn EngineFixture>> {
    static REPORTED: Once = Once::new();
    // TALLY_TEST_ENGINES=spark,postgres narrows a local run; the rest say NOT RUN
    let only = std::env::var("TALLY_TEST_ENGINES").ok();
    let excluded = |f: &dyn EngineFixture| {
        only.as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n.trim() == f.name()))
            .then(|| "TALLY_TEST_ENGINES leaves it out".to_string())
    };
    let (run, not_run): (Vec<_>, Vec<_>) = all()
        .into_iter()
        .partition(|f| f.unavailable().is_none() && excluded(f.as_ref()).is_none());
    REPORTED.call_once(|| {
        let mut lines: Vec<String> = not_run
            .iter()
            .map(|f| {
                format!(
                    "NOT RUN: live {} conformance ({})",
                    f.title(),
                    f.unavailable()
                        .or_else(|| excluded(f.as_ref()))
                        .unwrap_or_default()
                )
            })
            .collect();
        for (what, var) in WITHOUT_FIXTURE {
            lines.push(match std::env::var_os(var) {
                None => format!("NOT RUN: live {what} conformance ({var} is not set)"),
                Some(_) => format!(
                    "NOT RUN: live {what} conformance ({var} is set, but there is no {what} fixture yet)"
                ),
            });
        }
        // straight to the process's stderr: eprintln! in a passing test is captured
        let mut err = std::io::stderr().lock();
        for l in lines {
            let _ = writeln!(err, "{l}");
        }
    });
    run
}

/// What the conformance suite needs of one engine.
#[async_trait]
pub trait EngineFixture: Send + Sync {
    /// Short name, in test messages (`postgres`).
    fn name(&self) -> &'static str;

    /// The engine's name for people, in `NOT RUN` lines (`SQL Server`).
    fn title(&self) -> &'static str;

    /// How many vectors this engine may leave out as values it cannot store: 24, unless
    /// the engine lacks whole types (say which in the override).
    fn max_unstorable(&self) -> usize {
        24
    }

    /// Whether the engine stores `''` as NULL (Oracle): a planted "NULL vs empty text"
    /// difference is then planted as NULL vs a non-empty text.
    fn empty_string_is_null(&self) -> bool {
        false
    }

    /// Why this engine cannot run here (no server, no URL); `None` when it can.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// A vector the engine cannot store as written, with the reason.
    fn cannot_store(&self, v: &RowVector) -> Option<&'static str>;

    /// The column type holding a vector field.
    fn sql_type(&self, f: &VectorField) -> String;

    /// The SQL literal of a vector field's value (`NULL` for none).
    fn literal(&self, f: &VectorField) -> String;

    /// A text literal for a column of [`Self::short_text_type`], [`Self::text_type`] or
    /// [`Self::hashed_text_type`].
    fn text_literal(&self, s: &str) -> String {
        quote(s)
    }

    /// A literal for a column of [`Self::boolean_type`].
    fn bool_literal(&self, b: bool) -> String {
        if b { "TRUE" } else { "FALSE" }.into()
    }

    /// Text of up to 40 characters, any Unicode.
    fn short_text_type(&self) -> &'static str;

    /// Text of any length.
    fn text_type(&self) -> &'static str {
        "TEXT"
    }

    /// Text of any length whose value the dialect's `row_hash_expr` hashes as the
    /// UTF-8 bytes of the text (the suite's aggregate table).
    fn hashed_text_type(&self) -> &'static str {
        self.text_type()
    }

    /// A timestamp without time zone that keeps microseconds.
    fn timestamp_type(&self) -> &'static str;

    /// A boolean column.
    fn boolean_type(&self) -> &'static str;

    /// An expression the engine computes, as text (what `query_text` reads).
    fn as_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS CHAR)")
    }

    /// The engine's XOR aggregate over 64-bit integers; `None` when it has none (the
    /// pushed-down aggregate answers SUM only).
    fn xor_function(&self) -> Option<&'static str> {
        Some("BIT_XOR")
    }

    /// Whether the engine renders row strings and checksums in SQL; `false` when the
    /// agent reads its values and hashes them (SQLite: it has no hash functions).
    fn hashes_in_sql(&self) -> bool {
        true
    }

    /// Whether `hashing: auto` pushes the aggregate down (DuckDB); otherwise the agent
    /// reads the rows and hashes them in-process.
    fn auto_pushes_down(&self) -> bool {
        false
    }

    /// Whether a second connector opened on the database's URL sees its tables
    /// (`false` for an in-memory database, whose tables only its own connector sees).
    fn url_reopens(&self) -> bool {
        true
    }

    /// An empty database (or schema) called `name` for this test process, made afresh,
    /// and the agent's connector on it. `dir` is a temporary directory for engines
    /// that keep a database in a file.
    async fn create(&self, name: &str, dir: &Path) -> Database;
}

/// Runs setup SQL against one fixture database.
#[async_trait]
pub trait Setup: Send + Sync {
    /// Runs DDL and DML: statements, each ending in `;` and a newline. `connector` is
    /// the database's own connector (an in-memory database is reached through it).
    async fn exec(&self, connector: &Connector, sql: &str);
}

/// A fresh database of one fixture: its URL, the agent's connector on it, and how to
/// name its tables and write to it. Dropping it removes what the fixture made where
/// the database outlives the test process (SQL Server's schema).
pub struct Database {
    /// The agent's URL of the database.
    pub url: String,
    /// The agent's connector on it.
    pub connector: Connector,
    /// The schema its tables live in, when not the connection's default.
    schema: Option<String>,
    /// What every table name starts with (empty but for fixtures whose tables share a
    /// schema with other runs: Oracle's).
    prefix: String,
    setup: Box<dyn Setup>,
}

impl Database {
    pub fn new(url: String, connector: Connector, schema: Option<String>, setup: Box<dyn Setup>) -> Database {
        Database {
            url,
            connector,
            schema,
            prefix: String::new(),
            setup,
        }
    }

    /// The same database with every table name (in setup SQL and in the agent's
    /// source) starting with `prefix`: a fresh set of tables in a schema that other
    /// runs share.
    pub fn with_table_prefix(mut self, prefix: impl Into<String>) -> Database {
        self.prefix = prefix.into();
        self
    }

    /// Runs setup SQL (DDL and DML) against the database; panics with the engine's
    /// message on error.
    pub async fn exec(&self, sql: &str) {
        self.setup.exec(&self.connector, sql).await;
    }

    /// How setup SQL and the suite's own queries name table `t`: after the fixture's
    /// prefix, as is or qualified by the fixture's schema.
    pub fn table(&self, t: &str) -> String {
        let t = format!("{}{t}", self.prefix);
        match &self.schema {
            None => t,
            Some(s) => format!("{s}.{t}"),
        }
    }

    /// The agent's source for table `t`.
    pub fn source(&self, t: &str) -> Source {
        let t = format!("{}{t}", self.prefix);
        Source::Table(match &self.schema {
            None => vec![t],
            Some(s) => vec![s.clone(), t],
        })
    }
}

/// A standard SQL string literal.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// How many digits follow the decimal point of a vector value.
pub fn fraction_digits(v: &str) -> usize {
    v.split('.')
        .nth(1)
        .map_or(0, |f| f.chars().take_while(char::is_ascii_digit).count())
}

/// Whether any field of `v` satisfies `pred`.
pub fn has(v: &RowVector, pred: impl Fn(&VectorField) -> bool) -> bool {
    v.fields.iter().any(pred)
}

/// Predicates over vector fields that several engines' `cannot_store` share.
pub mod field {
    use tally_common::vectors::VectorField;

    use super::fraction_digits;

    /// The field's value is `s`.
    pub fn is(f: &VectorField, s: &str) -> bool {
        f.value.as_deref() == Some(s)
    }

    /// A NaN or infinity token.
    pub fn token(f: &VectorField) -> bool {
        ["NaN", "Infinity", "-Infinity"].iter().any(|s| is(f, s))
    }

    /// A float NaN or infinity.
    pub fn nonfinite(f: &VectorField) -> bool {
        f.class == "float" && token(f)
    }

    /// A timestamp with more than `n` fractional digits.
    pub fn fraction_beyond(f: &VectorField, n: usize) -> bool {
        f.class.starts_with("timestamp") && f.value.as_deref().is_some_and(|s| fraction_digits(s) > n)
    }

    /// A date, timestamp or timestamptz.
    pub fn dated(f: &VectorField) -> bool {
        matches!(f.class.as_str(), "date" | "timestamp" | "timestamptz")
    }

    /// The (astronomical) year of a dated value; `i64::MAX` for infinities.
    pub fn year(f: &VectorField) -> Option<i64> {
        f.value.as_deref().and_then(|v| {
            if v.contains("infinity") {
                return Some(i64::MAX);
            }
            let y: i64 = v.split('-').next()?.trim_start_matches('+').parse().ok()?;
            Some(if v.ends_with(" BC") { 1 - y } else { y })
        })
    }

    /// BC, year 10000 and later, infinity.
    pub fn beyond_iso(f: &VectorField) -> bool {
        dated(f) && year(f).is_some_and(|y| !(1..=9999).contains(&y))
    }

    /// A MySQL zero date (month or day 00).
    pub fn zero_in_date(f: &VectorField) -> bool {
        dated(f)
            && f.value
                .as_deref()
                .is_some_and(|v| v.get(5..7) == Some("00") || v.get(8..10) == Some("00"))
    }

    /// A time that is a duration rather than a time of day (negative, or past 24 h).
    pub fn duration(f: &VectorField) -> bool {
        f.class == "time"
            && f.value.as_deref().is_some_and(|v| {
                v.starts_with('-') || v.split(':').next().is_some_and(|h| h.len() > 2 || h > "24")
            })
    }

    /// A boolean written as an integer (`2`, `1`, `0`: MySQL's TINYINT(1)).
    pub fn int_bool(f: &VectorField) -> bool {
        f.class == "boolean" && f.value.as_deref().is_some_and(|v| v.parse::<i64>().is_ok())
    }

    /// An exact decimal with more than `n` fractional digits.
    pub fn exact_fraction_beyond(f: &VectorField, n: usize) -> bool {
        f.exact && f.value.as_deref().is_some_and(|v| fraction_digits(v) > n)
    }

    /// A decimal wider than `digits` digits at its declared scale.
    pub fn decimal_wider_than(f: &VectorField, digits: usize) -> bool {
        f.class == "decimal"
            && f.value.as_deref().is_some_and(|s| {
                s.chars().filter(char::is_ascii_digit).count() + f.scale.unwrap_or(0) as usize > digits + 1
            })
    }

    /// The unsigned 64-bit maximum, which no signed BIGINT holds.
    pub fn u64_max(f: &VectorField) -> bool {
        f.class == "integer" && is(f, "18446744073709551615")
    }
}
