//! Dialects render SQL; they never execute it. Each engine's SQL lives in one file
//! of this module; what they share (predicates over key tuples, the shape of the row
//! fetch and of the bucketed aggregate) is rendered here from the engine's pieces.
//!
//! Identifiers always pass through [`Dialect::quote`]; segment bounds are bind
//! parameters, never spliced into SQL text, except where SQL is for people to read and
//! run (investigation SQL) or takes no parameters (PostgreSQL `COPY`): there every value
//! goes through [`Dialect::literal`], the one literal renderer of each engine.

#[cfg(feature = "duckdb")]
pub mod duckdb;
pub mod mssql;
pub mod mysql;
pub mod oracle;
pub mod postgres;
pub mod sqlite;

use tally_common::checksum::{HashMethod, Hasher};
use tally_common::period::Granularity;
use tally_common::segment::{KeyPart, KeyTuple, Period, Segment, Window};
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
    /// `len` characters of a text expression from 1-based `start`.
    fn substr(&self, e: &str, start: usize, len: usize) -> String {
        format!("substr({e}, {start}, {len})")
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
        Source::Table(parts) => parts
            .iter()
            .map(|p| d.table_part(p))
            .collect::<Vec<_>>()
            .join("."),
        // no `AS`: Oracle refuses it before a table alias, every engine takes this form
        Source::Query(q) => format!("({q}) {}", d.quote("tally_src")),
    }
}

/// Accumulates bind values and hands out their placeholders.
/// With `inline`, values become SQL literals instead (for investigation SQL, which
/// people read and run; the agent never executes inlined values).
struct Binder<'a> {
    d: &'a dyn Dialect,
    binds: Vec<KeyPart>,
    inline: bool,
}

impl<'a> Binder<'a> {
    fn new(d: &'a dyn Dialect) -> Self {
        Binder {
            d,
            binds: Vec::new(),
            inline: false,
        }
    }

    fn bind(&mut self, v: KeyPart, col: &ColumnInfo) -> String {
        if self.inline {
            return self.d.key_literal(&v, col);
        }
        self.binds.push(v);
        self.d.key_param(self.binds.len(), col)
    }

    fn text(&mut self, v: &str) -> String {
        let v = KeyPart::Text(v.to_string());
        if self.inline {
            return self.d.literal(&v);
        }
        self.binds.push(v);
        self.d.placeholder(self.binds.len())
    }

    fn tuple(&mut self, t: &KeyTuple, key: &[&ColumnInfo]) -> String {
        let parts: Vec<String> = t.iter().zip(key).map(|(v, c)| self.bind(v.clone(), c)).collect();
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("({})", parts.join(", "))
        }
    }
}

fn key_tuple_expr(d: &dyn Dialect, key: &[&ColumnInfo]) -> String {
    let parts: Vec<String> = key.iter().map(|c| d.key_expr(c)).collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("({})", parts.join(", "))
    }
}

/// Checks that the segment's bounds match the key's shape and classes.
pub fn check_bounds(seg: &Segment, key: &[&ColumnInfo]) -> Result<(), String> {
    for t in [&seg.lower, &seg.upper].into_iter().flatten() {
        if t.len() != key.len() {
            return Err(format!(
                "a bound has {} part(s), the key has {}",
                t.len(),
                key.len()
            ));
        }
        for (v, c) in t.iter().zip(key) {
            match (v, c.class) {
                (KeyPart::Int(_), TypeClass::Integer) | (KeyPart::Text(_), TypeClass::Text) => {}
                _ => {
                    return Err(format!(
                        "key column {} is {}; range bounds work on integer and text keys (use strategy hash)",
                        c.name, c.class
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `key >= t` or `key < t` in tuple order: a row-value comparison where the engine
/// has them, else expanded lexicographically, `k1 > v1 OR (k1 = v1 AND (...))`, with
/// each bound value bound once per use so positional placeholders stay in text order.
fn key_cmp(b: &mut Binder<'_>, key: &[&ColumnInfo], t: &KeyTuple, lower: bool) -> String {
    let op = if lower { ">=" } else { "<" };
    if key.len() == 1 || b.d.row_values() {
        let k = key_tuple_expr(b.d, key);
        let p = b.tuple(t, key);
        return format!("{k} {op} {p}");
    }
    fn expand(b: &mut Binder<'_>, key: &[&ColumnInfo], t: &[KeyPart], op: &str) -> String {
        let k = b.d.key_expr(key[0]);
        if key.len() == 1 {
            let p = b.bind(t[0].clone(), key[0]);
            return format!("{k} {op} {p}");
        }
        let strict = if op == ">=" { ">" } else { "<" };
        let p1 = b.bind(t[0].clone(), key[0]);
        let p2 = b.bind(t[0].clone(), key[0]);
        let rest = expand(b, &key[1..], &t[1..], op);
        format!("({k} {strict} {p1} OR ({k} = {p2} AND {rest}))")
    }
    expand(b, key, t, op)
}

/// `WHERE` conditions of a segment's key range (not its hash range).
fn range_conditions(b: &mut Binder<'_>, seg: &Segment, key: &[&ColumnInfo]) -> Vec<String> {
    let mut conds = Vec::new();
    if let Some(l) = &seg.lower {
        conds.push(key_cmp(b, key, l, true));
    }
    if let Some(u) = &seg.upper {
        conds.push(key_cmp(b, key, u, false));
    }
    conds
}

/// The condition of a segment's period, where the engine renders it (otherwise the
/// agent checks the period in-process).
fn period_condition(b: &mut Binder<'_>, seg: &Segment, cols: &[BoundColumn]) -> Option<String> {
    let p = seg.period.as_ref()?;
    let e = period_label_expr(b.d, cols, p)?;
    Some(if p.label.is_empty() {
        format!("{e} IS NULL")
    } else {
        format!("{e} = {}", b.text(&p.label))
    })
}

/// The bound of a run's window, as the agent compares it: an integer by value, any
/// other class by the canonical text of the bound at the column's resolved format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowBound {
    Int(i64),
    Text(String),
}

/// The window column of a request (it must be among the request's columns) and its
/// bound; an error names what is wrong with either.
pub fn window_bound(cols: &[BoundColumn], w: &Window) -> Result<(usize, WindowBound), String> {
    let i = cols
        .iter()
        .position(|c| c.info.name.eq_ignore_ascii_case(&w.column))
        .ok_or_else(|| format!("the window column {} is not among the compared columns", w.column))?;
    let f = &cols[i].spec.format;
    let bound = match f.class {
        TypeClass::Integer => WindowBound::Int(w.upper.parse().map_err(|_| {
            format!(
                "window.upper {:?} is not a 64-bit integer (column {} is an integer)",
                w.upper, w.column
            )
        })?),
        TypeClass::Date | TypeClass::Timestamp | TypeClass::TimestampTz => {
            match tally_common::canonical::canonical_from_text(f, Some(&w.upper)) {
                Ok(Some(t)) if !t.contains("infinity") => WindowBound::Text(t),
                Ok(_) => return Err(format!("window.upper {:?} is not a finite {}", w.upper, f.class)),
                Err(e) => return Err(format!("window.upper {:?} is not a {}: {e}", w.upper, f.class)),
            }
        }
        c => {
            return Err(format!(
                "the window column {} is compared as {c}; a window needs an integer, date or timestamp column",
                w.column
            ));
        }
    };
    Ok((i, bound))
}

impl WindowBound {
    /// Whether a row whose window column has this canonical text is in the window:
    /// NULL never is (as `NULL <= x` is not true in SQL).
    pub fn keeps(&self, field: Option<&str>) -> bool {
        match (self, field) {
            (_, None) => false,
            // an unsigned 64-bit value is above every i64 bound
            (WindowBound::Int(n), Some(v)) => v.parse::<i128>().is_ok_and(|v| v <= i128::from(*n)),
            (WindowBound::Text(t), Some(v)) => v.as_bytes() <= t.as_bytes(),
        }
    }
}

/// The condition of a segment's window, where the engine renders the column's
/// canonical text (otherwise the agent filters in-process, and pushdown is off).
fn window_condition(b: &mut Binder<'_>, seg: &Segment, cols: &[BoundColumn]) -> Option<String> {
    let w = seg.window.as_ref()?;
    let (i, bound) = window_bound(cols, w).ok()?;
    let c = &cols[i];
    Some(match bound {
        WindowBound::Int(n) => {
            let p = b.bind(KeyPart::Int(n), &c.info);
            format!("{} <= {p}", b.d.quote(&c.info.name))
        }
        WindowBound::Text(t) => {
            let e = canonical(b.d, c)?;
            let p = b.text(&t);
            format!("{} <= {}", b.d.bytewise(&e), b.d.bytewise(&p))
        }
    })
}

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

fn order_by(d: &dyn Dialect, key: &[&ColumnInfo]) -> String {
    key.iter().map(|c| d.key_expr(c)).collect::<Vec<_>>().join(", ")
}

/// The row string expression of the given columns, if every column renders.
pub fn row_string_expr(d: &dyn Dialect, cols: &[BoundColumn]) -> Option<String> {
    let fields = cols
        .iter()
        .map(|c| canonical(d, c).map(|e| d.field_expr(&e)))
        .collect::<Option<Vec<_>>>()?;
    Some(d.concat(&fields))
}

/// What a row fetch selects for each column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchShape {
    /// The raw column; the connector decodes typed values and renders them in Rust.
    Raw,
    /// The engine's canonical text of the column.
    Canonical,
    /// The engine's cheap text ([`Dialect::text_expr`]) where it has one, rendered to
    /// canonical form by the connector; the canonical text otherwise.
    Text,
}

/// Rows of a segment's key range (hash filtering, if any, happens in the caller):
/// the columns in request order (key columns first), optionally ordered by key.
pub fn fetch_rows(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    seg: &Segment,
    shape: FetchShape,
    ordered: bool,
) -> Sql {
    fetch_rows_with(Binder::new(d), source, cols, key, seg, shape, ordered)
}

/// [`fetch_rows`] with its key bounds written as literals (no binds), for statements
/// that take no parameters and write their rows as the engine's text, such as
/// PostgreSQL's `COPY (query) TO STDOUT` ([`Dialect::copy_text_expr`]).
pub fn fetch_rows_inline(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    seg: &Segment,
    shape: FetchShape,
    ordered: bool,
) -> Sql {
    let b = Binder {
        inline: true,
        ..Binder::new(d)
    };
    fetch_rows_with(b, source, cols, key, seg, shape, ordered)
}

fn fetch_rows_with(
    mut b: Binder<'_>,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    seg: &Segment,
    shape: FetchShape,
    ordered: bool,
) -> Sql {
    let d = b.d;
    // aliased, so ORDER BY names the table's columns, not these expressions
    let select: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let e = match shape {
                FetchShape::Raw => d.raw_expr(c),
                FetchShape::Canonical => canonical(d, c)
                    .or_else(|| d.text_expr(c))
                    .unwrap_or_else(|| d.quote(&c.info.name)),
                FetchShape::Text => if b.inline {
                    d.copy_text_expr(c)
                } else {
                    d.text_expr(c)
                }
                .or_else(|| canonical(d, c))
                .unwrap_or_else(|| d.quote(&c.info.name)),
            };
            format!("{e} AS {}", d.quote(&format!("tally_f{i}")))
        })
        .collect();
    let mut conds = range_conditions(&mut b, seg, key);
    conds.extend(period_condition(&mut b, seg, cols));
    // where SQL cannot render it, the agent filters (it always checks again)
    conds.extend(window_condition(&mut b, seg, cols));
    let mut text = format!(
        "SELECT {} FROM {}{}",
        select.join(", "),
        relation(d, source),
        where_clause(&conds)
    );
    if ordered {
        text.push_str(&format!(" ORDER BY {}", order_by(d, key)));
    }
    Sql { text, binds: b.binds }
}

/// `SELECT COUNT(*)` of a segment's key range and window; `None` where the engine
/// cannot render the window (the rows are then counted by a scan).
pub fn count_rows(
    d: &dyn Dialect,
    source: &Source,
    key: &[&ColumnInfo],
    cols: &[BoundColumn],
    seg: &Segment,
) -> Option<Sql> {
    let mut b = Binder::new(d);
    let mut conds = range_conditions(&mut b, seg, key);
    if seg.window.is_some() {
        conds.push(window_condition(&mut b, seg, cols)?);
    }
    Some(Sql {
        text: format!(
            "SELECT {} FROM {}{}",
            d.count_all(),
            relation(d, source),
            where_clause(&conds)
        ),
        binds: b.binds,
    })
}

/// Ready-to-run SQL a person can paste to see a segment's rows (bounds inlined as
/// literals: this text is for humans, never executed by the agent).
pub fn investigation_sql(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    seg: &Segment,
    sealed: bool,
) -> String {
    let mut b = Binder {
        inline: true,
        ..Binder::new(d)
    };
    let mut conds = range_conditions(&mut b, seg, key);
    let mut note = String::new();
    if let Some((lo, hi)) = seg.hash {
        if sealed {
            note = format!(
                "-- hash range [{lo}, {hi}) of a sealed run: it needs the run key, which never leaves the agents; \
                 these are every row of the key range\n"
            );
        } else if let Some(bh) = cols
            .get(..key.len())
            .and_then(|kc| row_string_expr(d, kc))
            .and_then(|k| d.bucket_hash_expr(&k, None))
        {
            conds.push(format!("{bh} >= {lo} AND {bh} < {hi}"));
        }
    }
    conds.extend(period_condition(&mut b, seg, cols));
    if let Some(w) = &seg.window {
        match window_condition(&mut b, seg, cols) {
            Some(c) => conds.push(c),
            None => note.push_str(&format!(
                "-- the run's window ({} <= {}) is compared on canonical text, which this engine's SQL does not render: \
                 these are every row of the range\n",
                w.column, w.upper
            )),
        }
    }
    let mut text = format!(
        "{note}SELECT {} FROM {}{} ORDER BY {}",
        cols.iter()
            .map(|c| d.quote(&c.info.name))
            .collect::<Vec<_>>()
            .join(", "),
        relation(d, source),
        where_clause(&conds),
        order_by(d, key)
    );
    text.push(';');
    text
}

/// One parent of a pushed-down aggregate: its segment and how its children are formed.
#[derive(Debug, Clone)]
pub enum ChildRule {
    Whole,
    /// Evenly spaced cut points on a single integer key: child = clamp((k - lo) / width),
    /// one division per row instead of a comparison per cut.
    IntRange {
        first: i64,
        last: i64,
        lo: i64,
        width: i64,
        children: usize,
    },
    Hash {
        lo: u64,
        width: u64,
    },
    Cuts(Vec<KeyTuple>),
    Quantile(u32),
}

/// The bucketed aggregate, one query for every parent: per (parent, child) the
/// count, the SUM of row checksums as exact text, the XOR where the engine has it,
/// and for quantile parents the first key of each child.
/// Columns of the result: p, b, n, s, x (or NULL), then one column per key part.
pub fn aggregate(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    hasher: &Hasher,
    parents: &[(Segment, ChildRule)],
) -> Option<Sql> {
    let row = row_string_expr(d, cols)?;
    let h = d.row_hash_expr(&row, hasher.method(), hasher.row_key())?;
    let needs_bh = parents
        .iter()
        .any(|(s, r)| s.hash.is_some() || matches!(r, ChildRule::Hash { .. }));
    let bh = if needs_bh {
        Some(d.bucket_hash_expr(&row_string_expr(d, &cols[..key.len()])?, hasher.key_key())?)
    } else {
        None
    };
    let mut b = Binder::new(d);
    let kq: Vec<String> = key.iter().map(|c| d.quote(&c.name)).collect();
    // the key columns as the arms select them: as the driver decodes them exactly
    // (SQL Server's VARCHAR as NVARCHAR), under their own names
    let ks: Vec<String> = cols[..key.len()]
        .iter()
        .zip(&kq)
        .map(|(c, q)| match d.raw_expr(c) {
            r if &r == q => r,
            r => format!("{r} AS {q}"),
        })
        .collect();
    let kx = key_tuple_expr(d, key);
    let mut arms = Vec::new();
    for (i, (seg, rule)) in parents.iter().enumerate() {
        // binds in text order: `?` placeholders are positional
        let child = match rule {
            ChildRule::Whole => "0".to_string(),
            ChildRule::Hash { lo, width } => d.int_div(
                &format!("({} - {lo})", bh.as_ref().expect("hash rule has bh")),
                &width.to_string(),
            ),
            ChildRule::IntRange {
                first,
                last,
                lo,
                width,
                children,
            } => {
                let k = &kx;
                let (c1, cm) = (
                    b.bind(KeyPart::Int(*first), key[0]),
                    b.bind(KeyPart::Int(*last), key[0]),
                );
                let (l, w) = (
                    b.bind(KeyPart::Int(*lo), key[0]),
                    b.bind(KeyPart::Int(*width), key[0]),
                );
                format!(
                    "CASE WHEN {k} < {c1} THEN 0 WHEN {k} >= {cm} THEN {} ELSE {} END",
                    children - 1,
                    d.int_div(&format!("({k} - {l})"), &w)
                )
            }
            ChildRule::Cuts(cuts) if cuts.is_empty() => "0".to_string(),
            ChildRule::Cuts(cuts) => {
                let whens: Vec<String> = cuts
                    .iter()
                    .enumerate()
                    .map(|(j, c)| format!("WHEN {} THEN {j}", key_cmp(&mut b, key, c, false)))
                    .collect();
                format!("CASE {} ELSE {} END", whens.join(" "), cuts.len())
            }
            ChildRule::Quantile(n) => format!("NTILE({n}) OVER (ORDER BY {}) - 1", order_by(d, key)),
        };
        let mut conds = range_conditions(&mut b, seg, key);
        if let (Some((lo, hi)), Some(bh)) = (seg.hash, &bh) {
            conds.push(format!("{bh} >= {lo} AND {bh} < {hi}"));
        }
        if seg.period.is_some() {
            conds.push(period_condition(&mut b, seg, cols)?);
        }
        if seg.window.is_some() {
            conds.push(window_condition(&mut b, seg, cols)?);
        }
        // fenced: the row hash feeds SUM and XOR, and must be computed once per row
        arms.push(format!(
            "SELECT {i} AS p, {child} AS b, {h} AS h, {} FROM {}{}{}",
            ks.join(", "),
            relation(d, source),
            where_clause(&conds),
            d.fence()
        ));
    }
    // first-row flags let quantile parents report each child's first key
    let quantile = parents.iter().any(|(_, r)| matches!(r, ChildRule::Quantile(_)));
    let kq_inner: Vec<String> = kq.clone();
    let union = arms
        .iter()
        .map(|a| format!("({a})"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let firsts: Vec<String> = kq_inner
        .iter()
        .map(|k| {
            if quantile {
                format!("MAX(CASE WHEN f = 1 THEN {k} END)")
            } else {
                "NULL".into()
            }
        })
        .collect();
    let inner = if quantile {
        let ord: Vec<String> = key.iter().map(|c| d.key_expr(c)).collect();
        format!(
            "SELECT p, b, h, {}, CASE WHEN LAG(b) OVER (PARTITION BY p ORDER BY {}) = b THEN 0 ELSE 1 END AS f FROM ({union}) u",
            kq_inner.join(", "),
            ord.join(", ")
        )
    } else {
        format!("SELECT p, b, h FROM ({union}) u")
    };
    let xor = d.xor_aggregate("h").unwrap_or_else(|| "NULL".into());
    let text = format!(
        "SELECT p, b, {} AS n, {} AS s, {xor} AS x, {} FROM ({inner}) z GROUP BY p, b ORDER BY p, b",
        d.count_all(),
        d.sum_text("h"),
        firsts.join(", ")
    );
    Some(Sql { text, binds: b.binds })
}

/// The time strategy's first level: one bucket per calendar period of `period.column`
/// present in the segment, labelled (NULL: rows without a time). Columns of the result:
/// p (0), b (0), n, s, x, label: the layout of [`aggregate`], with the label where a
/// quantile child's first key would be. Ordered by label.
pub fn aggregate_periods(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    hasher: &Hasher,
    seg: &Segment,
    period: &Period,
) -> Option<Sql> {
    let label = period_label_expr(d, cols, period)?;
    let h = d.row_hash_expr(&row_string_expr(d, cols)?, hasher.method(), hasher.row_key())?;
    let mut b = Binder::new(d);
    let mut conds = range_conditions(&mut b, seg, key);
    if let Some((lo, hi)) = seg.hash {
        let bh = d.bucket_hash_expr(&row_string_expr(d, &cols[..key.len()])?, hasher.key_key())?;
        conds.push(format!("{bh} >= {lo} AND {bh} < {hi}"));
    }
    if seg.period.is_some() {
        conds.push(period_condition(&mut b, seg, cols)?);
    }
    if seg.window.is_some() {
        conds.push(window_condition(&mut b, seg, cols)?);
    }
    let xor = d.xor_aggregate("h").unwrap_or_else(|| "NULL".into());
    let text = format!(
        "SELECT 0 AS p, 0 AS b, {} AS n, {} AS s, {xor} AS x, lbl FROM (SELECT {label} AS lbl, {h} AS h \
         FROM {}{}{}) z GROUP BY lbl ORDER BY lbl",
        d.count_all(),
        d.sum_text("h"),
        relation(d, source),
        where_clause(&conds),
        d.fence()
    );
    Some(Sql { text, binds: b.binds })
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
