//! SQLite, embedded: a database file in the test's temporary directory.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has, quote};

#[derive(Debug, Clone, Copy)]
pub struct Sqlite;

#[async_trait]
impl EngineFixture for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn title(&self) -> &'static str {
        "SQLite"
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("DECIMAL has no NaN or infinities")
        } else if has(v, |f| f.class == "float" && field::is(f, "NaN")) {
            Some("REAL stores NaN as NULL")
        } else if has(v, |f| {
            f.class == "decimal" && f.value.as_deref().is_some_and(|s| s.len() > 17)
        }) {
            Some("NUMERIC affinity keeps a double's 15-17 significant digits")
        } else if has(v, field::u64_max) {
            Some("INTEGER is 64-bit signed")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            "integer" => "INTEGER".into(),
            "decimal" if f.exact => "NUMERIC".into(),
            "decimal" => format!("DECIMAL(60,{s})"),
            "float" => "REAL".into(),
            "boolean" => "BOOLEAN".into(),
            "text" if f.char => "CHAR(20)".into(),
            "text" => "TEXT".into(),
            "date" => "DATE".into(),
            "timestamp" => "TIMESTAMP".into(),
            "timestamptz" => "TIMESTAMPTZ".into(),
            "time" => "TIME".into(),
            "uuid" => "UUID".into(),
            "binary" => "BLOB".into(),
            "json" => "JSON".into(),
            c => panic!("no sqlite type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            "integer" => v.to_string(),
            // a decimal that a double cannot hold exactly stays text
            "decimal" => quote(v),
            "float" => match v {
                "Infinity" => "9e999".into(),
                "-Infinity" => "-9e999".into(),
                _ => v.to_string(),
            },
            "boolean" if v.parse::<i64>().is_ok() => v.to_string(),
            "boolean" => self.bool_literal(v == "true"),
            "binary" => format!("X{}", quote(v)),
            _ => quote(v),
        }
    }

    fn bool_literal(&self, b: bool) -> String {
        if b { "1" } else { "0" }.into()
    }

    fn short_text_type(&self) -> &'static str {
        "VARCHAR(40)"
    }

    fn timestamp_type(&self) -> &'static str {
        "TIMESTAMP"
    }

    fn boolean_type(&self) -> &'static str {
        "BOOLEAN"
    }

    fn xor_function(&self) -> Option<&'static str> {
        None
    }

    fn hashes_in_sql(&self) -> bool {
        false
    }

    async fn create(&self, name: &str, dir: &Path) -> Database {
        let path = dir.join(format!("{name}.db"));
        std::fs::File::create(&path).unwrap();
        let url = format!("sqlite://{}", path.display());
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            None,
            Box::new(File { path }),
        )
    }
}

/// Setup SQL through a connection of its own to the file.
struct File {
    path: PathBuf,
}

#[async_trait]
impl Setup for File {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        use sqlx::Connection;
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true);
        let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    }
}
