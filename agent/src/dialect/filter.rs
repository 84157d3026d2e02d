//! The conditions a statement reads a segment with: key ranges (bound values or
//! literals), periods and windows, and the key order.

use tally_common::segment::{KeyPart, KeyTuple, Segment, Window};
use tally_common::types::TypeClass;

use crate::schema::{BoundColumn, ColumnInfo};

use super::{Dialect, canonical, period_label_expr};

/// Accumulates bind values and hands out their placeholders.
/// With `inline`, values become SQL literals instead (for investigation SQL, which
/// people read and run; the agent never executes inlined values).
pub(super) struct Binder<'a> {
    pub(super) d: &'a dyn Dialect,
    pub(super) binds: Vec<KeyPart>,
    pub(super) inline: bool,
}

impl<'a> Binder<'a> {
    pub(super) fn new(d: &'a dyn Dialect) -> Self {
        Binder {
            d,
            binds: Vec::new(),
            inline: false,
        }
    }

    pub(super) fn bind(&mut self, v: KeyPart, col: &ColumnInfo) -> String {
        if self.inline {
            return self.d.key_literal(&v, col);
        }
        self.binds.push(v);
        self.d.key_param(self.binds.len(), col)
    }

    pub(super) fn text(&mut self, v: &str) -> String {
        let v = KeyPart::Text(v.to_string());
        if self.inline {
            return self.d.literal(&v);
        }
        self.binds.push(v);
        self.d.placeholder(self.binds.len())
    }

    pub(super) fn tuple(&mut self, t: &KeyTuple, key: &[&ColumnInfo]) -> String {
        let parts: Vec<String> = t.iter().zip(key).map(|(v, c)| self.bind(v.clone(), c)).collect();
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("({})", parts.join(", "))
        }
    }
}

pub(super) fn key_tuple_expr(d: &dyn Dialect, key: &[&ColumnInfo]) -> String {
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
pub(super) fn key_cmp(b: &mut Binder<'_>, key: &[&ColumnInfo], t: &KeyTuple, lower: bool) -> String {
    let op = if lower { ">=" } else { "<" };
    if key.len() == 1 || b.d.row_values() {
        let k = key_tuple_expr(b.d, key);
        let p = b.tuple(t, key);
        return format!("{k} {op} {p}");
    }
    pub(super) fn expand(b: &mut Binder<'_>, key: &[&ColumnInfo], t: &[KeyPart], op: &str) -> String {
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
pub(super) fn range_conditions(b: &mut Binder<'_>, seg: &Segment, key: &[&ColumnInfo]) -> Vec<String> {
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
pub(super) fn period_condition(b: &mut Binder<'_>, seg: &Segment, cols: &[BoundColumn]) -> Option<String> {
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
pub(super) fn window_condition(b: &mut Binder<'_>, seg: &Segment, cols: &[BoundColumn]) -> Option<String> {
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

pub(super) fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

pub(super) fn order_by(d: &dyn Dialect, key: &[&ColumnInfo]) -> String {
    key.iter().map(|c| d.key_expr(c)).collect::<Vec<_>>().join(", ")
}
