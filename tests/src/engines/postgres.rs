//! PostgreSQL, the test harness's server ([`crate::db::postgres`]).

use std::path::Path;

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has, quote};
use crate::db;

#[derive(Debug, Clone, Copy)]
pub struct Postgres;

#[async_trait]
impl EngineFixture for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn title(&self) -> &'static str {
        "PostgreSQL"
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| field::fraction_beyond(f, 6)) {
            Some("stores 6 fractional digits and rounds the 7th on input")
        } else if has(v, field::zero_in_date) {
            Some("has no zero dates (a MySQL value)")
        } else if has(v, field::duration) {
            Some("time is a time of day, at most 24:00:00")
        } else if has(v, field::int_bool) {
            Some("boolean holds only true and false")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            "integer" if field::u64_max(f) => "numeric(20,0)".into(),
            "integer" => "bigint".into(),
            "decimal" if f.exact || f.value.as_deref().is_some_and(|v| v.contains("Infinity")) => {
                "numeric".into()
            }
            "decimal" => format!("numeric(60,{s})"),
            "float" => "double precision".into(),
            "boolean" => "boolean".into(),
            "text" if f.char => "char(20)".into(),
            "text" => "text".into(),
            "date" => "date".into(),
            "timestamp" => "timestamp(6)".into(),
            "timestamptz" => "timestamptz(6)".into(),
            "time" => "time(6)".into(),
            "uuid" => "uuid".into(),
            "binary" => "bytea".into(),
            "json" => "jsonb".into(),
            c => panic!("no postgres type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            "integer" => v.to_string(),
            "decimal" => quote(v),
            "float" => format!("{}::float8", quote(v)),
            "boolean" => v.to_uppercase(),
            "binary" => format!("decode({}, 'hex')", quote(v)),
            _ => quote(v),
        }
    }

    fn short_text_type(&self) -> &'static str {
        "varchar(40)"
    }

    fn timestamp_type(&self) -> &'static str {
        "timestamp(6)"
    }

    fn boolean_type(&self) -> &'static str {
        "boolean"
    }

    fn as_text(&self, expr: &str) -> String {
        format!("({expr})::text")
    }

    fn xor_function(&self) -> Option<&'static str> {
        Some("bit_xor")
    }

    async fn create(&self, name: &str, _dir: &Path) -> Database {
        let url = db::postgres().create_database(name);
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            None,
            Box::new(Psql { db: name.to_string() }),
        )
    }
}

/// Setup SQL through `psql`.
struct Psql {
    db: String,
}

#[async_trait]
impl Setup for Psql {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        db::postgres().exec(Some(&self.db), sql);
    }
}
