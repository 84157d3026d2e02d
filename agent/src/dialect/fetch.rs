//! Row fetches, counts and investigation SQL of a segment.

use tally_common::segment::Segment;

use crate::config::Source;
use crate::schema::{BoundColumn, ColumnInfo};

use super::filter::{Binder, order_by, period_condition, range_conditions, where_clause, window_condition};
use super::{Dialect, Sql, canonical, relation};

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

pub(super) fn fetch_rows_with(
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
    select_rows(d, source, cols, key, &conds, &note)
}

/// `SELECT` the columns of `source` under `conds`, in key order: the text both kinds
/// of investigation SQL end with, after their `note`.
fn select_rows(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    conds: &[String],
    note: &str,
) -> String {
    format!(
        "{note}SELECT {} FROM {}{} ORDER BY {};",
        cols.iter()
            .map(|c| d.quote(&c.info.name))
            .collect::<Vec<_>>()
            .join(", "),
        relation(d, source),
        where_clause(conds),
        order_by(d, key)
    )
}

/// Ready-to-run SQL a person can paste to see exactly the rows of the given keys (each
/// tuple the key columns' values as the agent reveals them), within the run's window:
/// the segment's key range, hash range and period are not repeated (the keys name the
/// rows). Keys are written as literals in the form key predicates compare with
/// ([`Dialect::key_literal`]): this text is for humans, never executed by the agent.
/// A composite key is a row-value `IN` where the engine takes one
/// ([`Dialect::row_value_in`]), an `OR` of `AND`s otherwise. A key column compared by
/// canonical text (a date key, an integer keyed against a decimal) is compared by its
/// canonical expression, where the engine renders it; where it does not, that column
/// is left out of the condition and a comment says so (the SQL then selects more rows).
pub fn key_sql(
    d: &dyn Dialect,
    source: &Source,
    cols: &[BoundColumn],
    key: &[&ColumnInfo],
    seg: &Segment,
    keys: &[tally_common::segment::KeyTuple],
) -> String {
    use tally_common::segment::KeyPart;
    use tally_common::types::TypeClass;
    let mut note = String::new();
    // per key column: its expression and how one value of it is written, or None
    // where this engine cannot compare it
    let parts: Vec<Option<(String, bool)>> = cols
        .iter()
        .take(key.len())
        .map(|c| {
            let direct = matches!(c.info.class, TypeClass::Integer | TypeClass::Text)
                && c.spec.format.class == c.info.class;
            if direct {
                return Some((d.key_expr(&c.info), true));
            }
            match canonical(d, c) {
                Some(e) => Some((d.bytewise(&e), false)),
                None => {
                    note.push_str(&format!(
                        "-- key column {} is compared on canonical text, which this engine's SQL does not render: \
                         these are every row whose other key columns match\n",
                        c.info.name
                    ));
                    None
                }
            }
        })
        .collect();
    let literal = |v: &KeyPart, j: usize, direct: bool| -> String {
        if direct {
            d.key_literal(v, key[j])
        } else {
            let text = match v {
                KeyPart::Int(i) => KeyPart::Text(i.to_string()),
                t => t.clone(),
            };
            d.bytewise(&d.literal(&text))
        }
    };
    let used: Vec<usize> = (0..parts.len()).filter(|&j| parts[j].is_some()).collect();
    let mut conds = Vec::new();
    if !used.is_empty() {
        let exprs: Vec<&str> = used
            .iter()
            .map(|&j| parts[j].as_ref().expect("used").0.as_str())
            .collect();
        let tuple = |t: &tally_common::segment::KeyTuple| -> Vec<String> {
            used.iter()
                .map(|&j| literal(&t[j], j, parts[j].as_ref().expect("used").1))
                .collect()
        };
        let mut seen = std::collections::HashSet::new();
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(tuple)
            .filter(|r| seen.insert(r.clone()))
            .collect();
        conds.push(if used.len() == 1 {
            let vals: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
            format!("{} IN ({})", exprs[0], vals.join(", "))
        } else if d.row_value_in() {
            let vals: Vec<String> = rows.iter().map(|r| format!("({})", r.join(", "))).collect();
            format!("({}) IN ({})", exprs.join(", "), vals.join(", "))
        } else {
            let ands: Vec<String> = rows
                .iter()
                .map(|r| {
                    let eqs: Vec<String> = exprs.iter().zip(r).map(|(e, v)| format!("{e} = {v}")).collect();
                    format!("({})", eqs.join(" AND "))
                })
                .collect();
            format!("({})", ands.join(" OR "))
        });
    }
    let mut b = Binder {
        inline: true,
        ..Binder::new(d)
    };
    if let Some(w) = &seg.window {
        match window_condition(&mut b, seg, cols) {
            Some(c) => conds.push(c),
            None => note.push_str(&format!(
                "-- the run's window ({} <= {}) is compared on canonical text, which this engine's SQL does not render: \
                 these are the keys' rows outside it too\n",
                w.column, w.upper
            )),
        }
    }
    select_rows(d, source, cols, key, &conds, &note)
}
