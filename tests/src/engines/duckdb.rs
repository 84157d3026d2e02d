//! DuckDB, embedded and in memory: the connector's own connection holds the tables
//! (a second connector on `duckdb://` opens another, empty, database).

use std::path::Path;

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_agent::connector::duckdb::DuckDbConnector;
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has, quote};

#[derive(Debug, Clone, Copy)]
pub struct DuckDb;

#[async_trait]
impl EngineFixture for DuckDb {
    fn name(&self) -> &'static str {
        "duckdb"
    }

    fn title(&self) -> &'static str {
        "DuckDB"
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| field::fraction_beyond(f, 6)) {
            Some("stores 6 fractional digits and rounds the 7th on input")
        } else if has(v, field::int_bool) {
            Some("boolean holds only true and false")
        } else if has(v, field::beyond_iso) {
            Some("DATE and DATETIME hold years 0000-9999 only")
        } else if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("DECIMAL has no NaN or infinities")
        } else if has(v, field::zero_in_date) {
            Some("has no zero dates (a MySQL value)")
        } else if has(v, |f| {
            f.exact && f.value.as_deref().is_some_and(|v| v.contains(['e', 'E']))
        }) {
            Some("reads an exponent literal as a double before the DECIMAL cast")
        } else if has(v, |f| {
            f.class == "timestamptz" && f.value.as_deref().is_some_and(|v| v.starts_with("0001-01-01"))
        }) {
            Some("the instant falls in 1 BC in UTC, which DuckDB renders in its own form (not canonical yet)")
        } else if has(v, field::duration) {
            Some("TIME is a time of day")
        } else if has(v, |f| field::decimal_wider_than(f, 38)) {
            Some("DECIMAL is at most 38 digits wide")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            "integer" if field::u64_max(f) => "UBIGINT".into(),
            "integer" => "BIGINT".into(),
            "decimal" if f.exact => "DECIMAL(38,20)".into(),
            "decimal" => format!("DECIMAL(38,{s})"),
            "float" => "DOUBLE".into(),
            "boolean" => "BOOLEAN".into(),
            "text" => "VARCHAR".into(),
            "date" => "DATE".into(),
            "timestamp" => "TIMESTAMP".into(),
            "timestamptz" => "TIMESTAMPTZ".into(),
            "time" => "TIME".into(),
            "uuid" => "UUID".into(),
            "binary" => "BLOB".into(),
            "json" => "JSON".into(),
            c => panic!("no duckdb type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            "integer" | "decimal" => v.to_string(),
            "float" => format!("CAST({} AS DOUBLE)", quote(v)),
            "binary" => format!("from_hex({})", quote(v)),
            "boolean" => v.to_uppercase(),
            _ => quote(v),
        }
    }

    fn short_text_type(&self) -> &'static str {
        "VARCHAR"
    }

    fn timestamp_type(&self) -> &'static str {
        "TIMESTAMP"
    }

    fn boolean_type(&self) -> &'static str {
        "BOOLEAN"
    }

    fn as_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS VARCHAR)")
    }

    fn auto_pushes_down(&self) -> bool {
        true
    }

    fn url_reopens(&self) -> bool {
        false
    }

    async fn create(&self, _name: &str, _dir: &Path) -> Database {
        // in memory: the connector's own connection loads the tables
        let url = "duckdb://".to_string();
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            None,
            Box::new(OwnConnection),
        )
    }
}

/// Setup SQL through the connector's own connection.
struct OwnConnection;

#[async_trait]
impl Setup for OwnConnection {
    async fn exec(&self, connector: &Connector, sql: &str) {
        connector
            .engine()
            .as_any()
            .downcast_ref::<DuckDbConnector>()
            .expect("a duckdb connector")
            .execute_batch("t", sql)
            .await
            .unwrap()
    }
}
