//! Dialects render SQL; they never execute it. Each engine's SQL lives in one file
//! of this module; what they share (predicates over key tuples, the shape of the row
//! fetch and of the bucketed aggregate) is rendered here from the engine's pieces.
//!
//! Identifiers always pass through [`Dialect::quote`]; segment bounds are bind
//! parameters, never spliced into SQL text, except where SQL is for people to read and
//! run (investigation SQL) or takes no parameters (PostgreSQL `COPY`): there every value
//! goes through [`Dialect::literal`], the one literal renderer of each engine.

#[cfg(feature = "clickhouse")]
pub mod clickhouse;
#[cfg(feature = "duckdb")]
pub mod duckdb;
pub mod mssql;
pub mod mysql;
pub mod oracle;
pub mod postgres;
#[cfg(feature = "spark")]
pub mod spark;
pub mod sqlite;

mod aggregate;
mod fetch;
mod filter;

pub use aggregate::{ChildRule, aggregate, aggregate_periods};
pub use fetch::{
    FetchShape, count_rows, fetch_rows, fetch_rows_inline, investigation_sql, key_sql, row_string_expr,
};
pub use filter::{WindowBound, check_bounds, window_bound};

use tally_common::checksum::HashMethod;
use tally_common::period::Granularity;
use tally_common::segment::{KeyPart, Period};
use tally_common::types::TypeClass;

use crate::config::Source;
use crate::schema::{BoundColumn, ColumnInfo};
use crate::watermark::WatermarkRead;

/// SQL text with its bind values, in placeholder order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sql {
    pub text: String,
    pub binds: Vec<KeyPart>,
}

/// What an engine's SQL looks like, and what it can compute.
pub trait Dialect: Sync {
    fn name(&self) -> &'static str;
    /// Quotes an identifier.
    fn quote(&self, ident: &str) -> String;
    /// The placeholder of the `n`-th bind value (1-based).
    fn placeholder(&self, n: usize) -> String;
    /// A value as a SQL literal: integers as digits, text as its UTF-8 bytes in hex,
    /// decoded by the engine. The hex form holds no quote, backslash or comment marker,
    /// so no value can end its literal, whatever the session's settings
    /// (`sql_mode`, `standard_conforming_strings`) or the client it is pasted into.
    fn literal(&self, v: &KeyPart) -> String;
    /// A key column as it appears in predicates and ORDER BY: text keys under a
    /// bytewise collation.
    fn key_expr(&self, col: &ColumnInfo) -> String;
    /// A placeholder typed for a key column, where the engine needs a cast.
    fn key_param(&self, n: usize, _col: &ColumnInfo) -> String {
        self.placeholder(n)
    }
    /// A key value written as a literal (investigation SQL, `COPY`), in the form key
    /// predicates compare with [`Dialect::key_expr`].
    fn key_literal(&self, v: &KeyPart, _col: &ColumnInfo) -> String {
        self.literal(v)
    }
    /// A part of a configured table name (`schema.table`): quoted as written, or as
    /// the engine folds unquoted names (Oracle: upper case).
    fn table_part(&self, part: &str) -> String {
        self.quote(part)
    }
    /// Words after a configured table's name where rows are read (ClickHouse's
    /// `FINAL`, where the dataset declares it); never after a query.
    fn table_suffix(&self) -> &'static str {
        ""
    }
    /// What a raw-shape fetch selects for a column: the column, or a cast the driver
    /// decodes exactly.
    fn raw_expr(&self, col: &BoundColumn) -> String {
        self.quote(&col.info.name)
    }
    /// Whether a canonical text expression is the empty string, compared bytewise
    /// (under a PAD SPACE collation `' ' = ''` would hold).
    fn is_empty_text(&self, e: &str) -> String {
        format!("{} = {}", self.bytewise(e), self.bytewise("''"))
    }
    /// The canonical text of a column (DESIGN §3), or `None` when this engine cannot
    /// render it faithfully (the agent then computes it in-process).
    fn canonical_expr(&self, col: &BoundColumn) -> Option<String>;
    /// A cheaper text of a column than [`Dialect::canonical_expr`] (the engine's own
    /// output form) that [`tally_common::canonical::canonical_from_text`] renders to the
    /// exact canonical text in the agent; `None` where the canonical expression is
    /// already cheap or the engine's text is not safe to re-read.
    fn text_expr(&self, _col: &BoundColumn) -> Option<String> {
        None
    }
    /// [`Dialect::text_expr`] in a fetch whose rows the engine writes out as its own
    /// text anyway (PostgreSQL's `COPY ... TO STDOUT`, [`fetch_rows_inline`]): where
    /// that text is the same, the bare column, which spares the engine a cast per
    /// value. `Some` exactly where `text_expr` is (the agent re-reads those fields).
    fn copy_text_expr(&self, col: &BoundColumn) -> Option<String> {
        self.text_expr(col)
    }
    /// `<octet length>:<text>` or `~`, from a canonical text expression.
    fn field_expr(&self, canonical: &str) -> String;
    /// Concatenation of field expressions into the row string.
    fn concat(&self, parts: &[String]) -> String;
    /// The row checksum of a row-string expression as a signed 64-bit integer, if the
    /// engine has the hash function. `key` (a sealed method's k_row) is prefixed to
    /// the row string's UTF-8 bytes, as a hex literal: the SQL runs inside the zone and
    /// never leaves it.
    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String>;
    /// The bucket hash (top 60 bits of the key hash) of a key row-string expression,
    /// keyed with k_key in a sealed run.
    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String>;
    /// Whether the engine has a 64-bit XOR aggregate.
    fn xor_aggregate(&self, h: &str) -> Option<String>;
    /// SUM rendered so the exact result arrives as text.
    fn sum_text(&self, h: &str) -> String;
    /// The statement that reads a dataset's replication position as one text value
    /// (DESIGN §5, watermarks): a built-in of this engine, or the zone's own query as a
    /// scalar subquery (no row reads as NULL, two rows are an error); `None` for a
    /// built-in of another engine.
    fn watermark_sql(&self, read: &WatermarkRead) -> Option<String> {
        match read {
            WatermarkRead::Query(q) => Some(format!("SELECT CAST(({q}) AS TEXT)")),
            _ => None,
        }
    }
    /// Integer division.
    fn int_div(&self, a: &str, b: &str) -> String;
    /// The remainder of an integer division of non-negative integers.
    fn int_mod(&self, a: &str, b: &str) -> String {
        format!("(({a}) % ({b}))")
    }
    /// A text of decimal digits as an integer.
    fn text_int(&self, e: &str) -> String {
        format!("CAST({e} AS INTEGER)")
    }
    /// An integer expression as text.
    fn int_text(&self, e: &str) -> String;
    /// A text expression compared bytewise (by UTF-8 bytes), whatever the column's or
    /// the database's collation: window bounds compare canonical texts this way.
    fn bytewise(&self, e: &str) -> String {
        e.to_string()
    }
    /// Appended to a subquery so the engine computes its columns once instead of
    /// substituting their expressions into every use (PostgreSQL: `OFFSET 0`).
    fn fence(&self) -> &'static str {
        ""
    }
    /// Whether the engine compares row values (`(a, b) >= (x, y)`); where it does not
    /// (SQL Server, Oracle) or mishandles them (DuckDB), composite key bounds are
    /// expanded lexicographically.
    fn row_values(&self) -> bool {
        true
    }
    /// Whether the engine takes a row-value `IN` list (`(a, b) IN ((1, 'x'), (2, 'y'))`)
    /// in investigation SQL of keys; where it does not (SQLite wants a subquery), a
    /// composite key list is an `OR` of `AND`s.
    fn row_value_in(&self) -> bool {
        false
    }
    /// `len` characters of a text expression from 1-based `start`.
    fn substr(&self, e: &str, start: usize, len: usize) -> String {
        format!("substr({e}, {start}, {len})")
    }
    /// The value of `e` in the previous row of a window (`over`: its PARTITION BY and
    /// ORDER BY), NULL in the first row.
    fn lag(&self, e: &str, over: &str) -> String {
        format!("LAG({e}) OVER ({over})")
    }
    /// The 1-based tile of each row when the rows, ordered by `order`, are split into
    /// `n` tiles as evenly as they go, the first ones one row larger (`NTILE`).
    fn ntile(&self, n: u32, order: &str) -> String {
        format!("NTILE({n}) OVER (ORDER BY {order})")
    }
    /// The row count of a group, as a 64-bit integer.
    fn count_all(&self) -> &'static str {
        "COUNT(*)"
    }
    /// The statement that reads a table's single integer key's histogram bounds from
    /// the engine's statistics as one text value (`{1,500,...}`), where the engine keeps
    /// such statistics; `None` where it does not.
    fn key_histogram_sql(&self, _table: &[String], _key: &ColumnInfo) -> Option<String> {
        None
    }
    /// Statements that each read, as one text value, how many statements the server
    /// runs besides the probe itself (`throttle.max_load`), first choice first; a
    /// negative value means the probe's user cannot see other sessions. Empty where
    /// the engine has no load probe.
    fn load_probe_sql(&self) -> &'static [&'static str] {
        &[]
    }
    /// Statements this engine's connector runs as written (session settings, the
    /// transaction, catalog queries), titled, for the golden SQL files and their parse
    /// checks.
    fn fixed_statements(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
}

/// The canonical text of a column as this engine renders it, with a dataset's
/// `empty_string_is_null` applied as the reference applies it. The test is bytewise:
/// under a PAD SPACE collation (MySQL's) `' ' = ''` holds, and `NULLIF` would turn a
/// space into NULL.
pub fn canonical(d: &dyn Dialect, col: &BoundColumn) -> Option<String> {
    let e = d.canonical_expr(col)?;
    Some(
        if col.spec.format.empty_is_null && col.spec.format.class == TypeClass::Text {
            format!("CASE WHEN {} THEN NULL ELSE {e} END", d.is_empty_text(&e))
        } else {
            e
        },
    )
}

/// `SELECT MIN(k), MAX(k)` of a single-column key, each as text.
pub fn key_min_max(d: &dyn Dialect, source: &Source, key: &ColumnInfo) -> (String, String) {
    let k = d.quote(&key.name);
    let rel = relation(d, source);
    (
        format!("SELECT {} FROM {rel}", d.int_text(&format!("MIN({k})"))),
        format!("SELECT {} FROM {rel}", d.int_text(&format!("MAX({k})"))),
    )
}

/// The period label of a canonical time text, in SQL: the steps of
/// [`tally_common::period::period_label`], the one definition, on every engine (held
/// equal to it live by `agent/tests/period_labels.rs`). No engine's calendar is used:
/// their years, zero dates and BC eras differ, and a cast would fail on some.
pub fn period_expr(d: &dyn Dialect, canonical: &str, g: Granularity) -> Option<String> {
    let c = canonical;
    let cut = |n: usize| d.substr(c, 1, n);
    let m = d.substr(c, 6, 2);
    let plain = match g {
        Granularity::Week => week_expr(d, c),
        Granularity::Quarter => d.concat(&[
            cut(5),
            format!(
                "CASE WHEN {m} IN ('01', '02', '03') THEN '01' WHEN {m} IN ('04', '05', '06') THEN '04' \
                 WHEN {m} IN ('07', '08', '09') THEN '07' WHEN {m} IN ('10', '11', '12') THEN '10' ELSE {m} END"
            ),
        ]),
        _ => cut(g.prefix_len()),
    };
    // infinities and signed years are periods of their own
    Some(format!(
        "CASE WHEN {} IN ('0', '1', '2', '3', '4', '5', '6', '7', '8', '9') THEN {plain} ELSE {c} END",
        d.substr(c, 1, 1)
    ))
}

/// The week of a plain canonical date (its text starts with a 4-digit year), as
/// `tally_common::period` computes it: Sakamoto's weekday with the year moved on by 400
/// years (so every operand is non-negative and truncating division is floor division),
/// the Monday in this month or the previous one; the day itself where the text is no
/// calendar date (MySQL zero months and days).
fn week_expr(d: &dyn Dialect, c: &str) -> String {
    let m = d.substr(c, 6, 2);
    let y = d.text_int(&d.substr(c, 1, 4));
    let month = d.text_int(&m);
    let day = d.text_int(&d.substr(c, 9, 2));
    let leap = format!(
        "({} = 0 AND ({} <> 0 OR {} = 0))",
        d.int_mod(&y, "4"),
        d.int_mod(&y, "100"),
        d.int_mod(&y, "400")
    );
    let feb = format!("CASE WHEN {leap} THEN 29 ELSE 28 END");
    let dim =
        format!("CASE WHEN {m} IN ('04', '06', '09', '11') THEN 30 WHEN {m} = '02' THEN {feb} ELSE 31 END");
    let valid = format!(
        "{m} IN ('01', '02', '03', '04', '05', '06', '07', '08', '09', '10', '11', '12') AND {day} >= 1 AND {day} <= {dim}"
    );
    let yp = format!("({y} + CASE WHEN {m} IN ('01', '02') THEN 399 ELSE 400 END)");
    let t = format!(
        "CASE {m} WHEN '01' THEN 0 WHEN '02' THEN 3 WHEN '03' THEN 2 WHEN '04' THEN 5 WHEN '05' THEN 0 \
         WHEN '06' THEN 3 WHEN '07' THEN 5 WHEN '08' THEN 1 WHEN '09' THEN 4 WHEN '10' THEN 6 WHEN '11' THEN 2 ELSE 4 END"
    );
    let w = d.int_mod(
        &format!(
            "{yp} + {} - {} + {} + {t} + {day} + 6",
            d.int_div(&yp, "4"),
            d.int_div(&yp, "100"),
            d.int_div(&yp, "400")
        ),
        "7",
    );
    let monday = format!("({day} - {w})");
    // two digits of a number from 0 to 99
    let two = |e: &str| d.substr(&d.int_text(&format!("100 + {e}")), 2, 2);
    let prev_year = format!(
        "CASE WHEN {y} = 0 THEN '-0001' ELSE {} END",
        d.substr(&d.int_text(&format!("9999 + {y}")), 2, 4)
    );
    let prev_days = format!("CASE WHEN {m} IN ('05', '07', '10', '12') THEN 30 ELSE 31 END");
    format!(
        "CASE WHEN NOT ({valid}) THEN {} WHEN {monday} >= 1 THEN {} WHEN {m} = '01' THEN {} \
         WHEN {m} = '03' THEN {} ELSE {} END",
        d.substr(c, 1, 10),
        d.concat(&[d.substr(c, 1, 8), two(&monday)]),
        d.concat(&[prev_year, "'-12-'".into(), two(&format!("31 + {monday}"))]),
        d.concat(&[
            d.substr(c, 1, 5),
            "'02-'".into(),
            two(&format!("{feb} + {monday}"))
        ]),
        d.concat(&[
            d.substr(c, 1, 5),
            two(&format!("{month} - 1")),
            "'-'".into(),
            two(&format!("{prev_days} + {monday}"))
        ]),
    )
}

/// The column a period names, among the request's columns.
pub fn period_column<'a>(cols: &'a [BoundColumn], p: &Period) -> Option<&'a BoundColumn> {
    cols.iter().find(|c| c.info.name.eq_ignore_ascii_case(&p.column))
}

/// The period label expression of a period's column, if this engine renders it.
fn period_label_expr(d: &dyn Dialect, cols: &[BoundColumn], p: &Period) -> Option<String> {
    let c = period_column(cols, p)?;
    period_expr(d, &canonical(d, c)?, p.granularity)
}

/// The relation rows come from.
pub fn relation(d: &dyn Dialect, source: &Source) -> String {
    match source {
        Source::Table(parts) => {
            let name = parts
                .iter()
                .map(|p| d.table_part(p))
                .collect::<Vec<_>>()
                .join(".");
            format!("{name}{}", d.table_suffix())
        }
        // no `AS`: Oracle refuses it before a table alias, every engine takes this form
        Source::Query(q) => format!("({q}) {}", d.quote("tally_src")),
    }
}

#[cfg(test)]
mod tests {
    use super::Dialect;
    use tally_common::segment::KeyPart;

    #[test]
    fn literals_carry_no_character_of_the_value() {
        let hostile = KeyPart::Text("x\\' ; DROP TABLE victim; -- \n*/ $$ \0 𝄞".into());
        let dialects: Vec<&dyn Dialect> = vec![
            &super::mysql::MySql,
            &super::postgres::Postgres { has_bit_xor: true },
            &super::sqlite::Sqlite,
            #[cfg(feature = "duckdb")]
            &super::duckdb::DuckDb,
            #[cfg(feature = "spark")]
            &super::spark::Spark,
            #[cfg(feature = "clickhouse")]
            &super::clickhouse::ClickHouse::FINAL,
        ];
        for d in dialects {
            let l = d.literal(&hostile);
            // one quoted string of hex digits; the rest is the engine's decoding
            let quoted: Vec<&str> = l.split('\'').skip(1).step_by(2).collect();
            assert!(
                quoted[0].len().is_multiple_of(2) && quoted[0].chars().all(|c| c.is_ascii_hexdigit()),
                "{}: {l}",
                d.name()
            );
            assert!(
                !l.contains('\\') && !l.contains("--") && !l.contains(';'),
                "{}: {l}",
                d.name()
            );
            assert_eq!(d.literal(&KeyPart::Int(-42)), "-42");
            assert!(
                d.literal(&KeyPart::Text(String::new())).contains("''"),
                "{}",
                d.name()
            );
        }
    }
}
