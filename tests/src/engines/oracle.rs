//! Oracle Database 12.2 and later, at `TALLY_TEST_ORACLE_URL`
//! (`oracle://user:password@host:1521/service_name`, the agent's URL form); not run
//! where the variable is not set. NOT LIVE-VERIFIED: no Oracle server (nor client
//! library) exists where this was written; it compiles, and its pure parts are
//! unit-tested below.
//!
//! Each database of the suite is a fresh set of tables in the URL user's own schema,
//! every name starting with a prefix of its own (`tly<pid>x<time>_<n>_`, see
//! [`Database::with_table_prefix`]): the user needs CREATE SESSION, CREATE TABLE and a
//! quota, nothing more. The tables are dropped (PURGE) when the suite lets go of the
//! database. The agent reads through its own connector
//! (`tally_agent::connector::oracle`, which needs Oracle Instant Client on
//! `LD_LIBRARY_PATH`); the tables are written through a connection of the fixture's,
//! from the same URL, with the agent's session settings. The database character set
//! must be AL32UTF8 (the agent refuses others).
//!
//! The suite's own setup SQL is portable SQL that Oracle before 23ai does not take as
//! is: the writer rewrites it statement by statement ([`statements`]): `BIGINT` in
//! `CREATE TABLE` becomes `NUMBER(19)`, a multi-row `INSERT … VALUES (…), (…)` becomes a
//! PL/SQL block of single-row inserts, and the session's `NLS_TIMESTAMP_FORMAT` reads
//! the suite's `'2024-01-01 00:00:00.5'` timestamp literals.
//!
//! Column types: NUMBER(20,0) for integers (the unsigned 64-bit maximum needs 20
//! digits), NUMBER(38,s) for decimals and a plain NUMBER for exact ones, BINARY_DOUBLE
//! for floats (it has NaN and infinities), NUMBER(1) for booleans (Oracle before 23ai
//! has no BOOLEAN column; the agent compares an integer column as a boolean, as it does
//! MySQL's TINYINT(1), and NUMBER(1) keeps an integer-as-boolean `2` by value),
//! NVARCHAR2(2000) for text and JSON (no JSON type before 21c; the agent compares text
//! as JSON, made canonical in-process, as on SQL Server), NCHAR(20) for fixed text,
//! TIMESTAMP(9) [WITH TIME ZONE] for timestamps, RAW(2000) for binary. Dates, times and
//! UUIDs have no Oracle type the agent compares as such: [`EngineFixture::cannot_store`]
//! names them.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use oracle::Connection;
use tally_agent::connector::Connector;
use tally_agent::dialect::oracle::{CHARSET_SQL, SESSION_SETTINGS};
use tally_common::vectors::{RowVector, VectorField};

use super::{Database, EngineFixture, Setup, field, has, quote};

/// The variable that points the suite at an Oracle database.
pub const URL_VAR: &str = "TALLY_TEST_ORACLE_URL";

/// Session settings of the writer beside the agent's: the suite writes timestamps as
/// plain string literals (`'2024-01-01 00:00:00'`, `'… 11:59:59.999999'`).
const WRITE_SETTINGS: [&str; 3] = [
    "ALTER SESSION SET NLS_TIMESTAMP_FORMAT = 'YYYY-MM-DD HH24:MI:SS.FF'",
    "ALTER SESSION SET NLS_TIMESTAMP_TZ_FORMAT = 'YYYY-MM-DD HH24:MI:SS.FF TZH:TZM'",
    "ALTER SESSION SET NLS_DATE_FORMAT = 'YYYY-MM-DD HH24:MI:SS'",
];

#[derive(Debug, Clone)]
pub struct Oracle {
    /// `TALLY_TEST_ORACLE_URL`; `None` when it is not set.
    url: Option<String>,
}

impl Oracle {
    pub fn from_env() -> Oracle {
        Oracle {
            url: std::env::var(URL_VAR).ok().filter(|u| !u.trim().is_empty()),
        }
    }
}

/// Where the writer connects: what the agent's `parse_url` reads from the URL (its
/// fields are private to the agent, so the small parse is repeated here).
#[derive(Clone)]
struct Target {
    user: String,
    password: String,
    /// Easy Connect: `//host:port/service`.
    connect_string: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the password
        write!(f, "{}@{}", self.user, self.connect_string)
    }
}

/// `oracle://user:password@host:port/service` as the agent reads it: refused where the
/// agent refuses it (its own message), then taken apart the same way.
fn target(url: &str) -> Result<Target, String> {
    tally_agent::connector::oracle::parse_url(url).map_err(|e| e.to_string())?;
    let u = url::Url::parse(url).map_err(|e| e.to_string())?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| "user, password or service is not UTF-8".to_string())
    };
    Ok(Target {
        user: decode(u.username())?,
        password: decode(u.password().unwrap_or(""))?,
        connect_string: format!(
            "//{}:{}/{}",
            u.host_str().unwrap_or_default(),
            u.port().unwrap_or(1521),
            decode(u.path().trim_start_matches('/'))?
        ),
    })
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

/// A timestamptz of year 1 whose instant in UTC falls in 1 BC (`0001-01-01
/// 00:30:00+01:00`): the dialect renders a zoned value from its UTC instant and marks
/// every BC instant as a difference.
fn utc_before_year_one(f: &VectorField) -> bool {
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
    local.starts_with("0001-01-01") && h * 60 + m < off
}

/// A timestamp's local part as the writer's masks read it: `YYYY-MM-DD HH24:MI:SS.FF`,
/// always with a fraction.
fn local_timestamp(v: &str) -> String {
    let v = v.replacen('T', " ", 1);
    if v.get(19..).is_some_and(|rest| rest.starts_with('.')) {
        v
    } else {
        format!("{v}.0")
    }
}

/// Text as its UTF-8 bytes in hex, decoded by the database (AL32UTF8): every character
/// arrives whatever the client's character set, as the dialect writes text literals.
/// `''` is NULL in Oracle, and so is this literal of the empty string.
fn utf8_literal(s: &str) -> String {
    format!(
        "UTL_I18N.RAW_TO_CHAR(HEXTORAW('{}'), 'AL32UTF8')",
        hex::encode_upper(s)
    )
}

/// Significant digits of a decimal's text (leading zeros and a fraction's trailing zeros
/// are not), exponent aside.
fn significant_digits(v: &str) -> usize {
    let mantissa = v.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let trimmed = digits.trim_start_matches('0');
    if mantissa.contains('.') {
        trimmed.trim_end_matches('0').len()
    } else {
        trimmed.len()
    }
}

/// The scale of a (non-exact) decimal vector's NUMBER(38,s).
fn decimal_scale(f: &VectorField) -> usize {
    f.scale.or(f.precision).unwrap_or(0) as usize
}

/// A decimal that NUMBER(38,s) (or, exact, NUMBER) does not hold as written: more than
/// 38 significant digits, or more integer digits than NUMBER(38,s) leaves.
fn decimal_too_wide(f: &VectorField) -> bool {
    let Some(v) = f
        .value
        .as_deref()
        .filter(|_| f.class == "decimal" && !field::token(f))
    else {
        return false;
    };
    if f.exact {
        return significant_digits(v) > 38;
    }
    let integer_digits = v
        .chars()
        .take_while(|c| *c != '.' && *c != 'e' && *c != 'E')
        .filter(char::is_ascii_digit)
        .collect::<String>();
    integer_digits.trim_start_matches('0').len() > 38 - decimal_scale(f).min(38)
}

#[async_trait]
impl EngineFixture for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn title(&self) -> &'static str {
        "Oracle"
    }

    fn unavailable(&self) -> Option<String> {
        self.url.is_none().then(|| format!("{URL_VAR} is not set"))
    }

    /// Oracle has no DATE-only, TIME or UUID type (18 vectors), no empty string (5 with
    /// the empty RAW), no infinities, NaN numbers, zero dates or years past 9999, and its
    /// SQL marks BC instants as differences on purpose (docs/engines.md): 32 in all.
    fn max_unstorable(&self) -> usize {
        32
    }

    fn empty_string_is_null(&self) -> bool {
        true
    }

    fn cannot_store(&self, v: &RowVector) -> Option<&'static str> {
        if has(v, |f| f.class == "time") {
            Some(
                "Oracle has no TIME type (INTERVAL DAY TO SECOND is a duration, which the agent does not compare)",
            )
        } else if has(v, |f| f.class == "uuid") {
            Some(
                "Oracle has no UUID type: SYS_GUID() values are RAW(16), which the agent compares as binary, \
                 and text is not compared as uuid",
            )
        } else if has(v, |f| f.class == "date") {
            Some(
                "Oracle's DATE carries a time of day: the agent reads it as a timestamp at precision 0, which is \
                 not compared as class date, and Oracle has no other date type",
            )
        } else if has(v, |f| f.class == "text" && field::is(f, "")) {
            Some("'' is NULL in Oracle: an empty string cannot be stored")
        } else if has(v, |f| f.class == "binary" && f.char) {
            Some(
                "Oracle has no fixed-length BINARY(n): RAW keeps the bytes as written, and the agent removes \
                 zero padding of BINARY(n) columns only",
            )
        } else if has(v, |f| f.class == "binary" && field::is(f, "")) {
            Some("an empty RAW is NULL in Oracle")
        } else if has(v, field::zero_in_date) {
            Some("has no zero dates (a MySQL value)")
        } else if has(v, |f| {
            field::dated(f) && f.value.as_deref().is_some_and(|s| s.contains("infinity"))
        }) {
            Some("TIMESTAMP has no infinities")
        } else if has(v, |f| {
            field::beyond_iso(f) && field::year(f).is_some_and(|y| y > 9999)
        }) {
            Some("TIMESTAMP holds years up to 9999")
        } else if has(v, field::beyond_iso) {
            Some(
                "a BC timestamp: Oracle stores it, but the dialect's SQL marks every BC instant as a difference, \
                 never a match",
            )
        } else if has(v, utc_before_year_one) {
            Some(
                "TIMESTAMP WITH TIME ZONE is rendered from its UTC instant, here in 1 BC, which the dialect's SQL \
                 marks as a difference",
            )
        } else if has(v, |f| field::fraction_beyond(f, 9)) {
            Some("TIMESTAMP keeps 9 fractional digits")
        } else if has(v, |f| f.class == "decimal" && field::token(f)) {
            Some("NUMBER has no NaN or infinities")
        } else if has(v, decimal_too_wide) {
            Some("NUMBER keeps 38 significant digits (NUMBER(38,s) leaves 38-s before the point)")
        } else if has(v, |f| {
            f.class == "integer"
                && f.value
                    .as_deref()
                    .is_some_and(|s| s.trim_start_matches('-').len() > 20)
        }) {
            Some("NUMBER(20,0) holds 20 digits")
        } else if has(v, |f| {
            field::int_bool(f)
                && f.value
                    .as_deref()
                    .and_then(|s| s.parse::<i64>().ok())
                    .is_some_and(|i| !(-9..=9).contains(&i))
        }) {
            Some("NUMBER(1), the boolean column, holds -9 to 9")
        } else {
            None
        }
    }

    fn sql_type(&self, f: &VectorField) -> String {
        match f.class.as_str() {
            // one type for every integer: the unsigned 64-bit maximum needs 20 digits
            "integer" => "NUMBER(20,0)".into(),
            // an undeclared NUMBER: the agent reads its scale from the data (exact)
            "decimal" if f.exact => "NUMBER".into(),
            "decimal" => format!("NUMBER(38,{})", decimal_scale(f)),
            "float" => "BINARY_DOUBLE".into(),
            // no BOOLEAN column before 23ai: an integer compared as a boolean
            "boolean" => "NUMBER(1)".into(),
            "text" if f.char => "NCHAR(20)".into(),
            "text" => "NVARCHAR2(2000)".into(),
            // no JSON type before 21c: text, which the agent compares as JSON (made
            // canonical, RFC 8785, in-process)
            "json" => "NVARCHAR2(2000)".into(),
            // every date vector is refused above (DATE reads as a timestamp)
            "date" => "DATE".into(),
            "timestamp" => "TIMESTAMP(9)".into(),
            "timestamptz" => "TIMESTAMP(9) WITH TIME ZONE".into(),
            "binary" => "RAW(2000)".into(),
            c => panic!("no oracle type for {c} (cannot_store refuses its vectors)"),
        }
    }

    fn literal(&self, f: &VectorField) -> String {
        let Some(v) = f.value.as_deref() else {
            return "NULL".into();
        };
        match f.class.as_str() {
            // a NUMBER literal, exact as written (with an exponent too: no suffix d/f)
            "integer" | "decimal" => v.to_string(),
            "float" => match v {
                "NaN" => "BINARY_DOUBLE_NAN".into(),
                "Infinity" => "BINARY_DOUBLE_INFINITY".into(),
                "-Infinity" => "-BINARY_DOUBLE_INFINITY".into(),
                // the session's NLS_NUMERIC_CHARACTERS is '.,' (the agent's settings)
                _ => format!("TO_BINARY_DOUBLE({})", quote(v)),
            },
            "boolean" if v.parse::<i64>().is_ok() => v.to_string(),
            "boolean" => self.bool_literal(v == "true"),
            "binary" => format!("HEXTORAW({})", quote(v)),
            "timestamp" => format!(
                "TO_TIMESTAMP({}, 'YYYY-MM-DD HH24:MI:SS.FF9')",
                quote(&local_timestamp(v))
            ),
            "timestamptz" => match split_offset(v) {
                Some((local, off)) => format!(
                    "TO_TIMESTAMP_TZ({}, 'YYYY-MM-DD HH24:MI:SS.FF9 TZH:TZM')",
                    quote(&format!("{} {off}", local_timestamp(local)))
                ),
                None => format!(
                    "TO_TIMESTAMP({}, 'YYYY-MM-DD HH24:MI:SS.FF9')",
                    quote(&local_timestamp(v))
                ),
            },
            "date" => format!("TO_DATE({}, 'YYYY-MM-DD')", quote(v)),
            _ => self.text_literal(v),
        }
    }

    fn text_literal(&self, s: &str) -> String {
        utf8_literal(s)
    }

    fn bool_literal(&self, b: bool) -> String {
        if b { "1" } else { "0" }.into()
    }

    fn short_text_type(&self) -> &'static str {
        "NVARCHAR2(40)"
    }

    fn text_type(&self) -> &'static str {
        "NVARCHAR2(2000)"
    }

    fn hashed_text_type(&self) -> &'static str {
        // the database character set is AL32UTF8: a VARCHAR2's bytes are the UTF-8
        // that the dialect's UTL_I18N.STRING_TO_RAW hands STANDARD_HASH
        "VARCHAR2(4000 BYTE)"
    }

    fn timestamp_type(&self) -> &'static str {
        "TIMESTAMP(6)"
    }

    fn boolean_type(&self) -> &'static str {
        "NUMBER(1)"
    }

    fn as_text(&self, expr: &str) -> String {
        // CAST(.. AS CHAR) is CHAR(1) in Oracle; TO_CHAR of a NUMBER is its TM9 text
        format!("TO_CHAR({expr})")
    }

    fn xor_function(&self) -> Option<&'static str> {
        // no 64-bit XOR aggregate before 21c: SUM only (the dialect says so too)
        None
    }

    async fn create(&self, _name: &str, _dir: &Path) -> Database {
        static N: AtomicU64 = AtomicU64::new(0);
        let url = self.url.clone().unwrap_or_else(|| panic!("{URL_VAR} is not set"));
        let target = target(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"));
        // the process and the time tell this run's tables from another machine's
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() & 0xf_ffff);
        let prefix = format!(
            "tly{:x}x{stamp:x}_{}_",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let conn = {
            let target = target.clone();
            tokio::task::spawn_blocking(move || -> Result<Connection, String> {
                let c = connect(&target)?;
                let charset: String = c
                    .query_row_as(CHARSET_SQL, &[])
                    .map_err(|e| format!("reading the database character set: {e}"))?;
                if charset != "AL32UTF8" {
                    return Err(format!(
                        "the database character set is {charset}: the agent compares AL32UTF8 databases only"
                    ));
                }
                Ok(c)
            })
            .await
            .unwrap_or_else(|e| panic!("Oracle: the connecting thread failed: {e}"))
            .unwrap_or_else(|e| panic!("Oracle: {e}"))
        };
        let writer = Writer {
            target,
            prefix: prefix.clone(),
            conn: Arc::new(Mutex::new(Some(conn))),
        };
        Database::new(
            url.clone(),
            Connector::open(&url).unwrap_or_else(|e| panic!("Oracle: the agent refuses {URL_VAR}: {e}")),
            None,
            Box::new(writer),
        )
        .with_table_prefix(prefix)
    }
}

/// A connection as the agent makes one (its session settings), with the writer's
/// timestamp formats.
fn connect(t: &Target) -> Result<Connection, String> {
    let c = Connection::connect(&t.user, &t.password, &t.connect_string).map_err(|e| {
        format!(
            "{t:?}: cannot connect: {e} (the oracle crate needs Oracle Instant Client on LD_LIBRARY_PATH)"
        )
    })?;
    for s in SESSION_SETTINGS.iter().chain(&WRITE_SETTINGS) {
        c.execute(s, &[]).map_err(|e| format!("{s}: {e}"))?;
    }
    Ok(c)
}

/// Setup SQL as Oracle runs it: one statement per call (no trailing `;`), `BIGINT` in a
/// `CREATE TABLE` as `NUMBER(19)`, and a multi-row `INSERT … VALUES` as a PL/SQL block
/// of single-row inserts (row constructors arrive in 23ai; `INSERT ALL` stops at 1000
/// values).
fn statements(sql: &str) -> Vec<String> {
    split(sql)
        .into_iter()
        .map(|s| {
            let head = s.trim_start().get(..12).unwrap_or_default().to_ascii_uppercase();
            if head.starts_with("CREATE TABLE") {
                bigint_as_number(&s)
            } else if head.starts_with("INSERT INTO") {
                match single_row_inserts(&s) {
                    Some(rows) if rows.len() > 1 => format!("BEGIN\n{};\nEND;", rows.join(";\n")),
                    _ => s,
                }
            } else {
                s
            }
        })
        .collect()
}

/// The statements of a script: split at `;` outside quotes, trimmed, empty ones gone.
fn split(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, ';') => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `BIGINT` (a word outside quotes) as `NUMBER(19)`: Oracle has no BIGINT.
fn bigint_as_number(stmt: &str) -> String {
    let mut out = String::with_capacity(stmt.len());
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let flush = |word: &mut String, out: &mut String| {
        if word.eq_ignore_ascii_case("BIGINT") {
            out.push_str("NUMBER(19)");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in stmt.chars() {
        if quote.is_none() && (c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#')) {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            _ => {}
        }
        out.push(c);
    }
    flush(&mut word, &mut out);
    out
}

/// `INSERT INTO t VALUES (…), (…)` as one `INSERT INTO t VALUES (…)` per row; `None`
/// when the statement is not of that shape (left as written).
fn single_row_inserts(stmt: &str) -> Option<Vec<String>> {
    let at = stmt.to_ascii_uppercase().find(" VALUES")?;
    let (head, rest) = (stmt[..at].trim_end(), stmt[at + " VALUES".len()..].trim());
    if head.contains(['\'', '"']) {
        return None;
    }
    let mut rows = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None::<char>, None::<usize>);
    let mut expect_comma = false;
    for (i, c) in rest.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') if depth > 0 => quote = Some(c),
            (None, '(') => {
                if depth == 0 {
                    if expect_comma {
                        return None;
                    }
                    start = Some(i);
                }
                depth += 1;
            }
            (None, ')') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    rows.push(format!("{head} VALUES {}", &rest[start?..=i]));
                    expect_comma = true;
                }
            }
            (None, ',') if depth == 0 => {
                if !expect_comma {
                    return None;
                }
                expect_comma = false;
            }
            (None, c) if depth == 0 && !c.is_whitespace() => return None,
            _ => {}
        }
    }
    (depth == 0 && quote.is_none() && expect_comma).then_some(rows)
}

/// Drops every table of the user's schema whose name starts with `prefix` (folded to
/// upper case, as the unquoted names of the setup SQL are).
fn drop_tables_sql(prefix: &str) -> String {
    let p = prefix.to_ascii_uppercase();
    format!(
        "BEGIN\n\
         FOR t IN (SELECT table_name FROM user_tables WHERE SUBSTR(table_name, 1, {}) = '{p}') LOOP\n\
         EXECUTE IMMEDIATE 'DROP TABLE \"' || t.table_name || '\" CASCADE CONSTRAINTS PURGE';\n\
         END LOOP;\n\
         END;",
        p.len()
    )
}

/// Setup SQL through the fixture's own connection (blocking: on `spawn_blocking`); the
/// database's tables are dropped with it.
struct Writer {
    target: Target,
    prefix: String,
    /// `None` once a call lost it (a worker panicked); reconnected on the next call.
    conn: Arc<Mutex<Option<Connection>>>,
}

impl Writer {
    /// Runs `stmts` in order and commits; on an error, rolls back what the failing
    /// transaction wrote (DDL is committed as it runs) and says which statement failed.
    fn run(target: &Target, conn: &Mutex<Option<Connection>>, stmts: &[String]) -> Result<(), String> {
        let mut guard = conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(connect(target)?);
        }
        let c = guard.as_ref().expect("connected above");
        for s in stmts {
            if let Err(e) = c.execute(s, &[]) {
                let _ = c.rollback();
                let shown: String = s.chars().take(2000).collect();
                return Err(format!("{e}\n{shown}"));
            }
        }
        c.commit().map_err(|e| format!("COMMIT: {e}"))
    }
}

#[async_trait]
impl Setup for Writer {
    async fn exec(&self, _connector: &Connector, sql: &str) {
        let stmts = statements(sql);
        let (target, conn) = (self.target.clone(), self.conn.clone());
        let done = tokio::task::spawn_blocking(move || Writer::run(&target, &conn, &stmts)).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("Oracle SQL failed: {e}"),
            Err(e) => panic!("Oracle: the writing thread failed: {e}"),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let sql = drop_tables_sql(&self.prefix);
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = match guard.take() {
            Some(c) => Ok(c),
            None => connect(&self.target),
        }
        .and_then(|c| {
            c.execute(&sql, &[]).map_err(|e| e.to_string())?;
            c.close().map_err(|e| e.to_string())
        });
        if let Err(e) = dropped {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "Oracle: tables {}* of {:?} were not dropped: {e}",
                self.prefix.to_ascii_uppercase(),
                self.target
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use tally_common::vectors::VectorFile;

    use super::*;

    fn fixture() -> Oracle {
        Oracle { url: None }
    }

    #[test]
    fn urls_are_taken_apart_as_the_agent_does() {
        let t = target("oracle://tally:p%40ss@db.dc3.internal:1522/ORCLPDB1").unwrap();
        assert_eq!(
            (t.user.as_str(), t.password.as_str(), t.connect_string.as_str()),
            ("tally", "p@ss", "//db.dc3.internal:1522/ORCLPDB1")
        );
        assert_eq!(target("oracle://u@h/s").unwrap().connect_string, "//h:1521/s");
        assert!(format!("{t:?}").contains("tally@//db"));
        assert!(!format!("{t:?}").contains("p@ss"));
        for bad in ["oracle://h/svc", "oracle://u@h", "oracle://u@h/s?x=1"] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn setup_sql_is_rewritten_for_oracle() {
        let sql = "CREATE TABLE t_orders (id BIGINT PRIMARY KEY, code NVARCHAR2(40) NOT NULL, n bigint);\n\
                   INSERT INTO t_orders VALUES (1, UTL_I18N.RAW_TO_CHAR(HEXTORAW('3B'), 'AL32UTF8'), 2), \
                   (2, 'a;b), (BIGINT', NULL);\n\
                   INSERT INTO t_agg VALUES ('x', 0, 'BIGINT');\n\
                   UPDATE t_orders SET code = 'x' WHERE id = 1;\n";
        let s = statements(sql);
        assert_eq!(s.len(), 4, "{s:#?}");
        assert_eq!(
            s[0],
            "CREATE TABLE t_orders (id NUMBER(19) PRIMARY KEY, code NVARCHAR2(40) NOT NULL, n NUMBER(19))"
        );
        assert_eq!(
            s[1],
            "BEGIN\nINSERT INTO t_orders VALUES (1, UTL_I18N.RAW_TO_CHAR(HEXTORAW('3B'), 'AL32UTF8'), 2);\n\
             INSERT INTO t_orders VALUES (2, 'a;b), (BIGINT', NULL);\nEND;"
        );
        assert_eq!(s[2], "INSERT INTO t_agg VALUES ('x', 0, 'BIGINT')");
        assert_eq!(s[3], "UPDATE t_orders SET code = 'x' WHERE id = 1");
        assert_eq!(single_row_inserts("INSERT INTO t VALUES (1) x"), None);
        assert_eq!(single_row_inserts("INSERT INTO t VALUES (1) (2)"), None);
        assert_eq!(single_row_inserts("INSERT INTO t SELECT 1 FROM DUAL"), None);
        assert!(drop_tables_sql("tly1x2_0_").contains("SUBSTR(table_name, 1, 9) = 'TLY1X2_0_'"));
    }

    #[test]
    fn literals_read_back_with_explicit_masks() {
        let f = |class: &str, value: &str| VectorField {
            class: class.into(),
            value: Some(value.into()),
            scale: None,
            precision: Some(6),
            char: false,
            exact: false,
        };
        let o = fixture();
        assert_eq!(
            o.literal(&f("timestamp", "2024-03-15T14:30:00.1234569")),
            "TO_TIMESTAMP('2024-03-15 14:30:00.1234569', 'YYYY-MM-DD HH24:MI:SS.FF9')"
        );
        assert_eq!(
            o.literal(&f("timestamp", "1969-07-20 20:17:40")),
            "TO_TIMESTAMP('1969-07-20 20:17:40.0', 'YYYY-MM-DD HH24:MI:SS.FF9')"
        );
        assert_eq!(
            o.literal(&f("timestamptz", "2024-03-15 16:30:00+02")),
            "TO_TIMESTAMP_TZ('2024-03-15 16:30:00.0 +02:00', 'YYYY-MM-DD HH24:MI:SS.FF9 TZH:TZM')"
        );
        assert_eq!(
            o.literal(&f("timestamptz", "2024-03-15T14:30:00.1Z")),
            "TO_TIMESTAMP_TZ('2024-03-15 14:30:00.1 +00:00', 'YYYY-MM-DD HH24:MI:SS.FF9 TZH:TZM')"
        );
        assert_eq!(o.literal(&f("float", "-Infinity")), "-BINARY_DOUBLE_INFINITY");
        assert_eq!(o.literal(&f("float", "1e-7")), "TO_BINARY_DOUBLE('1e-7')");
        assert_eq!(o.literal(&f("binary", "00FF00")), "HEXTORAW('00FF00')");
        assert_eq!(o.literal(&f("boolean", "true")), "1");
        assert_eq!(o.literal(&f("boolean", "2")), "2");
        assert_eq!(
            o.literal(&f("text", "é'")),
            "UTL_I18N.RAW_TO_CHAR(HEXTORAW('C3A927'), 'AL32UTF8')"
        );
        assert!(utc_before_year_one(&f(
            "timestamptz",
            "0001-01-01 00:30:00+01:00"
        )));
        assert!(!utc_before_year_one(&f(
            "timestamptz",
            "0001-01-01 01:30:00+01:00"
        )));
        assert_eq!(
            significant_digits("-0.0000000000000000000000000000000000000001"),
            1
        );
        assert_eq!(significant_digits("007.0100"), 3);
        assert_eq!(significant_digits("12345678901234567890123456789012345678"), 38);
    }

    /// Every vector either has a reason or a type and a literal; the refusals are the
    /// ones this file's header names.
    #[test]
    fn the_unstorable_vectors_are_the_expected_ones() {
        let file = VectorFile::load_repo();
        let o = fixture();
        let refused: Vec<&str> = file
            .vectors
            .iter()
            .filter(|v| o.cannot_store(v).is_some())
            .map(|v| v.id.as_str())
            .collect();
        for v in file.vectors.iter().filter(|v| o.cannot_store(v).is_none()) {
            for f in &v.fields {
                assert!(!o.sql_type(f).is_empty() && !o.literal(f).is_empty(), "{}", v.id);
            }
        }
        assert_eq!(
            refused,
            [
                "tv009", "tv015", "tv016", "tv053", "tv054", "tv055", "tv071", "tv072", "tv073", "tv074",
                "tv075", "tv076", "tv079", "tv083", "tv084", "tv088", "tv089", "tv090", "tv091", "tv092",
                "tv093", "tv094", "tv095", "tv096", "tv097", "tv098", "tv099", "tv100", "tv102", "tv103",
                "tv104", "tv106",
            ]
        );
    }
}
