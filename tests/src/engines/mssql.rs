//! SQL Server 2019 and later, at `TALLY_TEST_MSSQL_URL`
//! (`mssql://user:password@host:port/database?encrypt=required&trust_server_certificate=true`);
//! not run where the variable is not set.
//!
//! Each database of the suite is a fresh schema in that database
//! (`tally_<name>_<pid>_<n>`), dropped with its tables when the suite lets go of it.
//! The agent reads through its own connector (`tally_agent::connector::mssql`); the
//! tables are written through a TDS client of the fixture's, configured from the same
//! URL by the agent's `parse_url`. The agent reads under SNAPSHOT isolation: the
//! fixture turns `ALLOW_SNAPSHOT_ISOLATION` on for the database when it is off.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tally_agent::connector::Connector;
use tally_agent::connector::mssql::parse_url;
use tally_agent::dialect::mssql::SESSION_SETTINGS;
use tally_common::vectors::{RowVector, VectorField};
use tiberius::{Client, Config};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::{Database, EngineFixture, Setup, field, fraction_digits, has, quote};

/// The variable that points the suite at a SQL Server.
pub const URL_VAR: &str = "TALLY_TEST_MSSQL_URL";

#[derive(Debug, Clone)]
pub struct MsSql {
    /// `TALLY_TEST_MSSQL_URL`; `None` when it is not set.
    url: Option<String>,
}

impl MsSql {
    pub fn from_env() -> MsSql {
        MsSql {
            url: std::env::var(URL_VAR).ok().filter(|u| !u.trim().is_empty()),
        }
    }
}

/// A timestamptz value split into its local part and its offset as `+hh:mm` (`Z` is
/// `+00:00`); `None` when it carries no offset.
fn split_offset(v: &str) -> Option<(&str, String)> {
    if let Some(local) = v.strip_suffix('Z') {
        return Some((local, "+00:00".into()));
    }
    let at = v.get(11..)?.rfind(['+', '-'])? + 11;
    let off = &v[at..];
    Some((
        &v[..at],
        if off.len() == 3 {
            format!("{off}:00")
        } else {
            off.to_string()
        },
    ))
}

/// Minutes east of UTC of an offset `+hh:mm`.
fn offset_minutes(off: &str) -> Option<i64> {
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let (h, m) = off.get(1..)?.split_once(':')?;
    Some(sign * (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?))
}

/// A timestamptz whose instant in UTC leaves years 0001-9999 (datetimeoffset keeps
/// the UTC instant in that range): `0001-01-01 00:30:00+01:00` is 0000-12-31 in UTC.
fn utc_beyond_iso(f: &VectorField) -> bool {
    let Some(v) = f.value.as_deref().filter(|_| f.class == "timestamptz") else {
        return false;
    };
    let Some((local, off)) = split_offset(v) else {
        return false;
    };
    let (Some(off), Some(h), Some(m)) = (
        offset_minutes(&off),
        local.get(11..13).and_then(|h| h.parse::<i64>().ok()),
        local.get(14..16).and_then(|m| m.parse::<i64>().ok()),
    ) else {
        return false;
    };
    let minute = h * 60 + m;
    (local.starts_with("0001-01-01") && minute < off)
        || (local.starts_with("9999-12-31") && minute - off >= 24 * 60)
}

/// Digits before the point (or the exponent) of a decimal value.
fn integer_digits(v: &str) -> usize {
    v.chars()
        .take_while(|c| *c != '.' && *c != 'e' && *c != 'E')
        .filter(char::is_ascii_digit)
        .count()
}

/// The scale of the decimal(38,s) that holds exact decimals.
const EXACT_SCALE: usize = 20;

/// A decimal that decimal(38,s) does not hold as written: a literal of more than 38
/// digits, more integer digits than the type leaves, or (exact values, normalised on
/// reading) more fractional digits than [`EXACT_SCALE`].
fn decimal_too_wide(f: &VectorField) -> bool {
    let Some(v) = f
        .value
        .as_deref()
        .filter(|_| f.class == "decimal" && !field::token(f))
    else {
        return false;
    };
    let scale = if f.exact {
        EXACT_SCALE
    } else {
        f.scale.or(f.precision).unwrap_or(0) as usize
    };
    let digits = v
        .chars()
        .take_while(|c| *c != 'e' && *c != 'E')
        .filter(char::is_ascii_digit)
        .count();
    digits > 38 || integer_digits(v) > 38 - scale.min(38) || (f.exact && fraction_digits(v) > EXACT_SCALE)
}

#[async_trait]
impl EngineFixture for MsSql {
    fn name(&self) -> &'static str {
        "mssql"
    }

    fn title(&self) -> &'static str {
        "SQL Server"
    }

    fn unavailable(&self) -> Option<String> {
        self.url.is_none().then(|| format!("{URL_VAR} is not set"))
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| {
            field::fraction_beyond(f, 7)
                || (f.class == "time" && f.value.as_deref().is_some_and(|s| fraction_digits(s) > 7))
        }) {
            Some("datetime2, datetimeoffset and time keep 7 fractional digits")
        } else if has(v, field::zero_in_date) {
            Some("has no zero dates (a MySQL value)")
        } else if has(v, field::beyond_iso) {
            Some("date, datetime2 and datetimeoffset hold years 0001-9999 only")
        } else if has(v, utc_beyond_iso) {
            Some("datetimeoffset keeps its instant in UTC, which must fall in years 0001-9999")
        } else if has(v, |f| {
            field::duration(f)
                || (f.class == "time" && f.value.as_deref().is_some_and(|s| s.starts_with("24")))
        }) {
            Some("time is a time of day, below 24:00:00")
        } else if has(v, field::int_bool) {
            Some("bit holds only 0 and 1 (it stores any other integer as 1)")
        } else if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("decimal has no NaN or infinities")
        } else if has(v, field::nonfinite) {
            Some("float has no NaN or infinities")
        } else if has(v, decimal_too_wide) {
            Some("decimal is at most 38 digits wide (exact values are kept as decimal(38,20))")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        let s = f.scale.or(f.precision).unwrap_or(0);
        match f.class.as_str() {
            // as on PostgreSQL: the unsigned 64-bit maximum in a whole decimal
            "integer" if field::u64_max(f) => "decimal(20,0)".into(),
            "integer" => "bigint".into(),
            "decimal" if f.exact => format!("decimal(38,{EXACT_SCALE})"),
            "decimal" => format!("decimal(38,{s})"),
            "float" => "float".into(),
            "boolean" => "bit".into(),
            "text" if f.char => "nchar(20)".into(),
            "text" => "nvarchar(max)".into(),
            "date" => "date".into(),
            "timestamp" => "datetime2(7)".into(),
            "timestamptz" => "datetimeoffset(7)".into(),
            "time" => "time(7)".into(),
            "uuid" => "uniqueidentifier".into(),
            "binary" if f.char => "binary(4)".into(),
            "binary" => "varbinary(max)".into(),
            // SQL Server 2019 has no JSON type: documents are kept as NVARCHAR text
            // (what its JSON functions read), compared as JSON by the agent, which
            // renders the text canonical (RFC 8785) in-process
            "json" => "nvarchar(max)".into(),
            c => panic!("no mssql type for {c}"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            // a numeric literal: decimal(p,s) exactly as written (an exponent makes it
            // a float, exact for the values the vectors hold)
            "integer" | "decimal" => v.to_string(),
            "float" => format!("CAST({} AS FLOAT)", quote(v)),
            "boolean" if v.parse::<i64>().is_ok() => v.to_string(),
            "boolean" => self.bool_literal(v == "true"),
            "binary" => format!("0x{v}"),
            // ISO 8601 with the offset as +hh:mm (SQL Server reads no +hh alone)
            "timestamptz" => match split_offset(v) {
                Some((local, off)) => quote(&format!("{}{off}", local.replacen(' ', "T", 1))),
                None => quote(v),
            },
            "text" | "json" => self.text_literal(v),
            _ => quote(v),
        }
    }

    fn text_literal(&self, s: &str) -> String {
        // NVARCHAR: every character whatever the database's code page
        format!("N{}", quote(s))
    }

    fn bool_literal(&self, b: bool) -> String {
        if b { "1" } else { "0" }.into()
    }

    fn short_text_type(&self) -> &'static str {
        "NVARCHAR(40)"
    }

    fn text_type(&self) -> &'static str {
        "NVARCHAR(MAX)"
    }

    fn hashed_text_type(&self) -> &'static str {
        // the dialect hashes a VARCHAR's bytes: UTF-8 under its _UTF8 collation
        // (tally_agent::dialect::mssql::UTF8)
        "VARCHAR(MAX) COLLATE Latin1_General_100_BIN2_UTF8"
    }

    fn timestamp_type(&self) -> &'static str {
        "DATETIME2(6)"
    }

    fn boolean_type(&self) -> &'static str {
        "BIT"
    }

    fn as_text(&self, expr: &str) -> String {
        // CHAR without a length is CHAR(30); NVARCHAR reads a UTF-8 VARCHAR correctly
        format!("CAST({expr} AS NVARCHAR(MAX))")
    }

    fn xor_function(&self) -> Option<&'static str> {
        // no 64-bit XOR aggregate: SUM only (the dialect says so too)
        None
    }

    async fn create(&self, name: &str, _dir: &Path) -> Database {
        static N: AtomicU64 = AtomicU64::new(0);
        let url = self.url.clone().unwrap_or_else(|| panic!("{URL_VAR} is not set"));
        let config = parse_url(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"));
        let tag: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
        let schema = format!(
            "tally_{tag}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut client = connect(&config).await;
        run(
            &mut client,
            "IF EXISTS (SELECT 1 FROM sys.databases WHERE database_id = DB_ID() AND snapshot_isolation_state = 0) \
             ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON",
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "SQL Server: the agent reads under SNAPSHOT isolation and the database does not allow it \
                 (ALTER DATABASE <db> SET ALLOW_SNAPSHOT_ISOLATION ON): {e}"
            )
        });
        // CREATE SCHEMA must be alone in its batch
        run(&mut client, &format!("CREATE SCHEMA [{schema}]"))
            .await
            .unwrap_or_else(|e| panic!("SQL Server: CREATE SCHEMA [{schema}]: {e}"));
        let setup = Tds {
            config,
            schema: schema.clone(),
            client: tokio::sync::Mutex::new(Some(client)),
        };
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap(),
            Some(schema),
            Box::new(setup),
        )
    }
}

type Conn = Client<Compat<TcpStream>>;

/// A connection as the agent makes one, with the agent's session settings.
async fn connect(config: &Config) -> Conn {
    async fn connect(config: &Config) -> Result<Conn, tiberius::error::Error> {
        let tcp = TcpStream::connect(config.get_addr()).await?;
        tcp.set_nodelay(true)?;
        let mut client = Client::connect(config.clone(), tcp.compat_write()).await?;
        run(&mut client, SESSION_SETTINGS).await?;
        Ok(client)
    }
    connect(config)
        .await
        .unwrap_or_else(|e| panic!("SQL Server at {}: cannot connect: {e}", config.get_addr()))
}

/// Runs a batch, reading every result.
async fn run(c: &mut Conn, sql: &str) -> Result<(), tiberius::error::Error> {
    c.simple_query(sql).await?.into_results().await?;
    Ok(())
}

/// Drops every table of `schema`, then the schema.
fn drop_schema_sql(schema: &str) -> String {
    format!(
        "DECLARE @drop NVARCHAR(MAX) = (SELECT STRING_AGG(CONVERT(NVARCHAR(MAX), N'DROP TABLE ' + QUOTENAME(s.name) + N'.' \
         + QUOTENAME(t.name)), N'; ') FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id \
         WHERE s.name = N'{schema}');\n\
         IF @drop IS NOT NULL EXEC sp_executesql @drop;\n\
         IF SCHEMA_ID(N'{schema}') IS NOT NULL EXEC(N'DROP SCHEMA [{schema}]');"
    )
}

/// Setup SQL through the fixture's own TDS connection; the schema is dropped with it.
struct Tds {
    config: Config,
    schema: String,
    client: tokio::sync::Mutex<Option<Conn>>,
}

#[async_trait]
impl Setup for Tds {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        let mut guard = self.client.lock().await;
        if guard.is_none() {
            *guard = Some(connect(&self.config).await);
        }
        let result = run(guard.as_mut().expect("connected above"), sql).await;
        if let Err(e) = result {
            // a failed batch may leave the connection in a transaction: not reused
            *guard = None;
            let shown: String = sql.chars().take(2000).collect();
            panic!("SQL Server SQL failed: {e}\n{shown}");
        }
    }
}

impl Drop for Tds {
    fn drop(&mut self) {
        // the test's runtime may be shutting down or be the one running this drop: a
        // runtime of its own, on a thread of its own
        let (config, schema) = (self.config.clone(), self.schema.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let tcp = TcpStream::connect(config.get_addr())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut c = Client::connect(config.clone(), tcp.compat_write())
                    .await
                    .map_err(|e| e.to_string())?;
                run(&mut c, &drop_schema_sql(&schema))
                    .await
                    .map_err(|e| e.to_string())?;
                c.close().await.map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SQL Server: schema {} was not dropped: {dropped:?}",
                self.schema
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_utc_ranges() {
        assert_eq!(
            split_offset("2024-03-16 16:30:00+02"),
            Some(("2024-03-16 16:30:00", "+02:00".to_string()))
        );
        assert_eq!(
            split_offset("2024-03-15T14:30:00.1Z"),
            Some(("2024-03-15T14:30:00.1", "+00:00".to_string()))
        );
        assert_eq!(offset_minutes("-05:30"), Some(-330));
        let tz = |v: &str| VectorField {
            class: "timestamptz".into(),
            value: Some(v.into()),
            scale: None,
            precision: Some(6),
            char: false,
            exact: false,
        };
        assert!(utc_beyond_iso(&tz("0001-01-01 00:30:00+01:00")));
        assert!(!utc_beyond_iso(&tz("0001-01-01 01:30:00+01:00")));
        assert!(utc_beyond_iso(&tz("9999-12-31T23:30:00-01:00")));
        assert!(!utc_beyond_iso(&tz("2024-03-15T16:30:00.1+02:00")));
    }
}
