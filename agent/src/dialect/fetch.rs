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
