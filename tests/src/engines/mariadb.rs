//! MariaDB, the test harness's server ([`crate::db::mariadb`]).

use std::path::Path;

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has, quote};
use crate::db;

#[derive(Debug, Clone, Copy)]
pub struct MariaDb;

#[async_trait]
impl EngineFixture for MariaDb {
    fn name(&self) -> &'static str {
        "mariadb"
    }

    fn title(&self) -> &'static str {
        "MariaDB"
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| field::fraction_beyond(f, 6)) {
            Some("stores 6 fractional digits and rounds the 7th on input")
        } else if has(v, field::beyond_iso) {
            Some("DATE and DATETIME hold years 0000-9999 only")
        } else if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("DECIMAL has no NaN or infinities")
        } else if has(v, |f| field::exact_fraction_beyond(f, 30)) {
            Some("DECIMAL keeps at most 30 fractional digits")
        } else if has(v, field::nonfinite) {
            Some("DOUBLE has no NaN or infinities")
        } else if has(v, |f| {
            f.class == "timestamptz" && f.value.as_deref().is_some_and(|s| s < "1970")
        }) {
            Some("TIMESTAMP starts at 1970-01-01 UTC")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            "integer" if field::u64_max(f) => "BIGINT UNSIGNED".into(),
            "integer" => "BIGINT".into(),
            "decimal" if f.exact => "DECIMAL(65,30)".into(),
            "decimal" => format!("DECIMAL(65,{s})"),
            "float" => "DOUBLE".into(),
            "boolean" => "TINYINT(1)".into(),
            "text" if f.char => "CHAR(20)".into(),
            "text" => "TEXT".into(),
            "date" => "DATE".into(),
            "timestamp" => "DATETIME(6)".into(),
            "timestamptz" => "TIMESTAMP(6) NULL".into(),
            "time" => "TIME(6)".into(),
            "uuid" => "UUID".into(),
            "binary" if f.char => "BINARY(4)".into(),
            "binary" => "VARBINARY(200)".into(),
            "json" => "JSON".into(),
            c => panic!("no mariadb type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            "integer" | "decimal" | "float" => v.to_string(),
            "boolean" if v.parse::<i64>().is_ok() => v.to_string(),
            "boolean" => v.to_uppercase(),
            "binary" => format!("X{}", quote(v)),
            "timestamptz" => {
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
            "timestamp" => quote(&v.replace('T', " ")),
            _ => self.text_literal(v),
        }
    }

    fn text_literal(&self, s: &str) -> String {
        // MariaDB's default sql_mode reads backslash escapes in string literals
        quote(&s.replace('\\', "\\\\"))
    }

    fn short_text_type(&self) -> &'static str {
        "VARCHAR(40) CHARACTER SET utf8mb4"
    }

    fn hashed_text_type(&self) -> &'static str {
        "TEXT CHARACTER SET utf8mb4"
    }

    fn timestamp_type(&self) -> &'static str {
        "DATETIME(6)"
    }

    fn boolean_type(&self) -> &'static str {
        "TINYINT(1)"
    }

    async fn create(&self, name: &str, _dir: &Path) -> Database {
        let url = db::mariadb().create_database(name);
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            None,
            Box::new(Mysql { db: name.to_string() }),
        )
    }
}

/// Setup SQL through the `mariadb` client, in UTC.
struct Mysql {
    db: String,
}

#[async_trait]
impl Setup for Mysql {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        db::mariadb().exec(Some(&self.db), &format!("SET time_zone = '+00:00';\n{sql}"));
    }
}
