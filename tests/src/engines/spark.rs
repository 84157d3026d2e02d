//! Spark SQL through a local Spark Connect server ([`crate::spark::server`]): each
//! suite database is a Spark database (schema) of the server's in-memory catalog, its
//! tables Parquet files in the server's temp warehouse.
//!
//! The same fixture runs against a Databricks cluster where `TALLY_TEST_DATABRICKS_URL`
//! names one (`databricks://HOST?cluster_id=…`, the token in `DATABRICKS_TOKEN` or the
//! variable `token_env=` names): each suite database is a schema of the workspace's
//! default catalog, its tables the workspace's default format (Delta), left in place
//! after the run. Without the variable the suite says NOT RUN; no workspace is
//! reachable from this machine, so that path has never run here.

use std::path::Path;

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_agent::connector::spark::SparkConnector;
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has};

/// The variable naming a Databricks cluster for the gated live run.
pub const DATABRICKS_URL_VAR: &str = "TALLY_TEST_DATABRICKS_URL";

#[derive(Debug, Clone)]
pub enum Spark {
    /// The test process's own Spark Connect server.
    Local,
    /// A Databricks cluster, from [`DATABRICKS_URL_VAR`] (`None`: not set).
    Databricks(Option<String>),
}

impl Spark {
    pub fn databricks_from_env() -> Spark {
        Spark::Databricks(std::env::var(DATABRICKS_URL_VAR).ok().filter(|u| !u.is_empty()))
    }

    fn url(&self) -> String {
        match self {
            Spark::Local => crate::spark::server().url.clone(),
            Spark::Databricks(url) => url.clone().expect("available only with a URL"),
        }
    }
}

/// A text literal: Spark reads backslash escapes inside quotes, so a backslash and a
/// quote are escaped (an inline table takes only constants, so no `decode(unhex(..))`).
fn text(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[async_trait]
impl EngineFixture for Spark {
    fn name(&self) -> &'static str {
        match self {
            Spark::Local => "spark",
            Spark::Databricks(_) => "databricks",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Spark::Local => "Spark",
            Spark::Databricks(_) => "Databricks",
        }
    }

    fn unavailable(&self) -> Option<String> {
        match self {
            Spark::Databricks(None) => Some(format!(
                "{DATABRICKS_URL_VAR} is not set (databricks://HOST?cluster_id=…, the token in DATABRICKS_TOKEN); no workspace here"
            )),
            _ => None,
        }
    }

    fn max_unstorable(&self) -> usize {
        40
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| field::fraction_beyond(f, 6)) {
            Some("stores 6 fractional digits")
        } else if has(v, field::int_bool) {
            Some("BOOLEAN holds only true and false")
        } else if has(v, field::beyond_iso) {
            Some("DATE and TIMESTAMP literals parse years 0001-9999 only")
        } else if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("DECIMAL has no NaN or infinities")
        } else if has(v, field::zero_in_date) {
            Some("has no zero dates (a MySQL value)")
        } else if has(v, |f| f.class == "time") {
            Some("TIME (Spark 4.1+) is not a class the agent reads yet")
        } else if has(v, |f| f.class == "uuid") {
            Some("has no UUID type (a STRING)")
        } else if has(v, |f| f.class == "json") {
            Some("has no JSON type")
        } else if has(v, |f| f.class == "binary" && f.char) {
            Some("has no fixed-length BINARY")
        } else if has(v, |f| {
            field::decimal_wider_than(f, 38) || field::exact_fraction_beyond(f, 20)
        }) {
            Some("DECIMAL is at most 38 digits wide")
        } else if has(v, |f| {
            f.class == "timestamptz" && f.value.as_deref().is_some_and(|v| v.starts_with("0001-01-01"))
        }) {
            Some("the instant falls in 1 BC in UTC, before TIMESTAMP's range")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            "integer" if field::u64_max(f) => "DECIMAL(20,0)".into(),
            "integer" => "BIGINT".into(),
            "decimal" if f.exact => "DECIMAL(38,20)".into(),
            "decimal" => format!("DECIMAL(38,{s})"),
            "float" => "DOUBLE".into(),
            "boolean" => "BOOLEAN".into(),
            "text" if f.char => "CHAR(20)".into(),
            "text" => "STRING".into(),
            "date" => "DATE".into(),
            "timestamp" => "TIMESTAMP_NTZ".into(),
            "timestamptz" => "TIMESTAMP".into(),
            "binary" => "BINARY".into(),
            c => panic!("no spark type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            "integer" => format!("CAST({} AS {})", text(v), self.sql_type(f)),
            "binary" => format!("unhex('{v}')"),
            "boolean" => v.to_uppercase(),
            "text" => text(v),
            _ => format!("CAST({} AS {})", text(v), self.sql_type(f)),
        }
    }

    fn text_literal(&self, s: &str) -> String {
        text(s)
    }

    fn short_text_type(&self) -> &'static str {
        "STRING"
    }

    fn text_type(&self) -> &'static str {
        "STRING"
    }

    fn timestamp_type(&self) -> &'static str {
        "TIMESTAMP_NTZ"
    }

    fn boolean_type(&self) -> &'static str {
        "BOOLEAN"
    }

    /// A plain `SUM(h)` of 64-bit checksums overflows into an error under ANSI: the
    /// suite's sums are taken as the dialect's `sum_text` takes them, in DECIMAL(38, 0).
    fn as_text(&self, expr: &str) -> String {
        let expr = expr.replace("SUM(h)", "SUM(CAST(h AS DECIMAL(38, 0)))");
        format!("CAST({expr} AS STRING)")
    }

    fn xor_function(&self) -> Option<&'static str> {
        Some("bit_xor")
    }

    fn auto_pushes_down(&self) -> bool {
        true
    }

    async fn create(&self, name: &str, _dir: &Path) -> Database {
        let url = self.url();
        let setup = OwnSession::open(&url).await;
        setup
            .exec_sql(&format!("CREATE DATABASE IF NOT EXISTS {name};\n"))
            .await;
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            Some(name.to_string()),
            Box::new(setup),
        )
    }
}

/// Setup SQL through a Spark session of its own (not the agent's): the suite's DDL
/// without `PRIMARY KEY` (Parquet tables take no constraints), and inserts under the
/// LEGACY store assignment, which casts the suite's text literals into timestamp
/// columns as other engines do (ANSI assignment refuses STRING into TIMESTAMP).
struct OwnSession {
    spark: SparkConnector,
}

impl OwnSession {
    async fn open(url: &str) -> OwnSession {
        let spark = SparkConnector::open(url).unwrap();
        let s = OwnSession { spark };
        s.exec_sql("SET spark.sql.storeAssignmentPolicy=LEGACY;\n").await;
        s
    }

    async fn exec_sql(&self, sql: &str) {
        let sql = sql.replace(" PRIMARY KEY", "");
        for stmt in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            let stmts = self.rewrite(stmt).await;
            self.spark
                .execute_batch("setup", &stmts)
                .await
                .unwrap_or_else(|e| panic!("spark setup failed: {e}\n{stmts}"))
        }
    }

    /// Parquet tables take no UPDATE or DELETE: `UPDATE t SET c = e WHERE w` and
    /// `DELETE FROM t WHERE w` become a copy of the table with the change, written back
    /// over it (a table cannot be overwritten from itself).
    async fn rewrite(&self, stmt: &str) -> String {
        let (table, select) = if let Some(rest) = stmt.strip_prefix("UPDATE ") {
            let (table, rest) = rest.split_once(" SET ").expect("UPDATE t SET");
            let (assign, cond) = rest.split_once(" WHERE ").expect("UPDATE with WHERE");
            let (col, value) = assign.split_once(" = ").expect("one assignment");
            let cols: Vec<String> = self
                .spark
                .rows("setup", &format!("DESCRIBE TABLE {table}"), &[])
                .await
                .unwrap()
                .into_iter()
                .filter_map(|r| r.into_iter().next().flatten())
                .take_while(|n| !n.is_empty() && !n.starts_with('#'))
                .map(|c| {
                    if c == col.trim() {
                        format!("CASE WHEN {cond} THEN {value} ELSE {c} END AS {c}")
                    } else {
                        c
                    }
                })
                .collect();
            (table, format!("SELECT {} FROM {table}", cols.join(", ")))
        } else if let Some(rest) = stmt.strip_prefix("DELETE FROM ") {
            let (table, cond) = rest.split_once(" WHERE ").expect("DELETE with WHERE");
            (
                table,
                format!("SELECT * FROM {table} WHERE NOT COALESCE({cond}, FALSE)"),
            )
        } else {
            return format!("{stmt};\n");
        };
        let tmp = format!("{table}_tally_copy");
        format!(
            "DROP TABLE IF EXISTS {tmp};\nCREATE TABLE {tmp} AS {select};\n\
             INSERT OVERWRITE TABLE {table} SELECT * FROM {tmp};\nDROP TABLE {tmp};\n"
        )
    }
}

#[async_trait]
impl Setup for OwnSession {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        self.exec_sql(sql).await
    }
}
