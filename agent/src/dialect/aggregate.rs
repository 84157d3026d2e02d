//! Pushed-down bucketed aggregates of a level's parents, and of periods.

use tally_common::checksum::Hasher;
use tally_common::segment::{KeyPart, KeyTuple, Period, Segment};

use crate::config::Source;
use crate::schema::{BoundColumn, ColumnInfo};

use super::filter::{
    Binder, key_cmp, key_tuple_expr, order_by, period_condition, range_conditions, where_clause,
    window_condition,
};
use super::{Dialect, Sql, period_label_expr, relation, row_string_expr};

/// One parent of a pushed-down aggregate: its segment and how its children are formed.
#[derive(Debug, Clone)]
pub enum ChildRule {
    Whole,
    /// An even split of a single integer key (`Split::Even`, as the coordinator said it):
    /// child = clamp((k - lo) / width), one division per row instead of a comparison
    /// per cut.
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
/// Columns of the result: p, b, n, s, x (or NULL), then one column per key part, named
/// `tally_p`, `tally_b`, …: ClickHouse lets a SELECT's alias stand for a table column
/// of the same name inside that SELECT, so a plain `b` would replace a table's own
/// column `b` in the row hash (a false pass, found in review); no alias is a bare
/// word a table is likely to use.
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
            ChildRule::Quantile(n) => format!("{} - 1", d.ntile(*n, &order_by(d, key))),
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
            "SELECT {i} AS tally_p, {child} AS tally_b, {h} AS tally_h, {} FROM {}{}{}",
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
                format!("MAX(CASE WHEN tally_f = 1 THEN {k} END)")
            } else {
                "NULL".into()
            }
        })
        .collect();
    let inner = if quantile {
        let ord: Vec<String> = key.iter().map(|c| d.key_expr(c)).collect();
        format!(
            "SELECT tally_p, tally_b, tally_h, {}, CASE WHEN {} = tally_b THEN 0 ELSE 1 END AS tally_f FROM ({union}) u",
            kq_inner.join(", "),
            d.lag(
                "tally_b",
                &format!("PARTITION BY tally_p ORDER BY {}", ord.join(", "))
            )
        )
    } else {
        format!("SELECT tally_p, tally_b, tally_h FROM ({union}) u")
    };
    let xor = d.xor_aggregate("tally_h").unwrap_or_else(|| "NULL".into());
    let text = format!(
        "SELECT tally_p, tally_b, {} AS tally_n, {} AS tally_s, {xor} AS tally_x, {} FROM ({inner}) z \
         GROUP BY tally_p, tally_b ORDER BY tally_p, tally_b",
        d.count_all(),
        d.sum_text("tally_h"),
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
    let xor = d.xor_aggregate("tally_h").unwrap_or_else(|| "NULL".into());
    let text = format!(
        "SELECT 0 AS tally_p, 0 AS tally_b, {} AS tally_n, {} AS tally_s, {xor} AS tally_x, tally_lbl \
         FROM (SELECT {label} AS tally_lbl, {h} AS tally_h FROM {}{}{}) z GROUP BY tally_lbl ORDER BY tally_lbl",
        d.count_all(),
        d.sum_text("tally_h"),
        relation(d, source),
        where_clause(&conds),
        d.fence()
    );
    Some(Sql { text, binds: b.binds })
}
