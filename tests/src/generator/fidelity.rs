//! The fidelity a run must state (canonical-form.md §10), from the case and its run
//! configuration alone: every key and compared column below what a side stores, with
//! each reason's code. Nothing of Tally's is used: each side's class, scale and padding
//! follow from the column's declared types (docs/engines.md), and the rules from §10.

use std::collections::{BTreeMap, BTreeSet};

use super::case::Case;
use super::run::{Form, RunConfig};
use super::values::{Class, Engine};

/// How one side describes a column: its class, a decimal's declared scale (None:
/// undeclared), and whether it pads (`CHAR(n)`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Side {
    class: &'static str,
    scale: Option<u8>,
    fixed: bool,
}

fn side(case: &Case, col: usize, s: usize, form: Form) -> Side {
    let c = &case.columns[col];
    let engine = [case.source, case.target][s];
    // a query's decimals have no declared scale, but SQLite's keep their table's type
    // and DuckDB's and Spark's their result type's (docs/engines.md)
    let dec = |scale: u8| Side {
        class: "decimal",
        scale: (form == Form::Table || matches!(engine, Engine::Lite | Engine::Duck | Engine::Spark))
            .then_some(scale),
        fixed: false,
    };
    let of = |class| Side {
        class,
        scale: None,
        fixed: false,
    };
    match c.class {
        Class::Int { .. } => of("integer"),
        Class::Dec { scale } => dec(scale),
        Class::Double => of("float"),
        Class::Text => of("text"),
        // Spark's `DESCRIBE QUERY` names a CHAR(n) column `string` (its values still
        // read padded): fixed in a table only
        Class::CharText => Side {
            fixed: c.alt[s] && !(engine == Engine::Spark && form == Form::Query),
            ..of("text")
        },
        // MariaDB's JSON is a checked LONGTEXT, which reads as text in a query; Spark
        // keeps JSON and UUIDs as STRING
        Class::Json | Class::Uuid if engine == Engine::Spark => of("text"),
        Class::Json if engine == Engine::My && form == Form::Query => of("text"),
        Class::Json => of("json"),
        Class::Bool => of("boolean"),
        Class::Date => of("date"),
        Class::Ts => of("timestamp"),
        Class::Bytes => of("binary"),
        // and its UUID as CHAR(36) text, fixed (against a UUID elsewhere: a refusal;
        // against Spark's STRING: padding)
        Class::Uuid if engine == Engine::My && form == Form::Query => Side {
            fixed: true,
            ..of("text")
        },
        Class::Uuid => of("uuid"),
        Class::Instant if c.alt[s] => of("timestamptz"),
        Class::Instant => of("timestamp"),
        Class::IntDec { scale } if c.alt[s] => dec(scale),
        Class::IntDec { .. } => of("integer"),
        Class::DecDbl { .. } if c.alt[s] => of("float"),
        Class::DecDbl { scale } => dec(scale),
    }
}

/// The class side `s` describes column `col` as in a dataset of this form.
pub fn described(case: &Case, col: usize, s: usize, form: Form) -> &'static str {
    side(case, col, s, form).class
}

/// Whether side `s` describes column `col` as a padded `CHAR(n)`.
pub fn described_fixed(case: &Case, col: usize, s: usize, form: Form) -> bool {
    side(case, col, s, form).fixed
}

/// The columns a run must name in its fidelity, each with its reason codes (empty:
/// the run is `full`).
pub fn expected(case: &Case, cfg: &RunConfig) -> BTreeMap<String, BTreeSet<&'static str>> {
    let mut out = BTreeMap::new();
    for col in 0..case.columns.len() {
        if col >= case.nkeys && case.exclude.contains(&col) {
            continue;
        }
        let (s, t) = (side(case, col, 0, cfg.form), side(case, col, 1, cfg.form));
        let classes = [s.class, t.class];
        let over = case.overrides.iter().find(|(c, _)| *c == col).map(|&(_, n)| n);
        let mut why = BTreeSet::new();
        // the resolved class: a pair across classes renders as the second of §8's pair
        let across = |a: &str, b: &str| classes == [a, b] || classes == [b, a];
        let class = if s.class == t.class {
            s.class
        } else if across("integer", "decimal") || across("decimal", "float") {
            "decimal"
        } else if across("json", "text") {
            "json"
        } else if across("timestamp", "timestamptz") {
            "timestamptz"
        } else {
            unreachable!("no generated pair {classes:?}")
        };
        if s.class != t.class && !across("integer", "decimal") {
            why.insert("cross_class");
        }
        // an integer keyed against a decimal: rows are paired by the decimal's text
        if col < case.nkeys && across("integer", "decimal") {
            why.insert("key_cast");
        }
        let decimals: Vec<Option<u8>> = [s, t]
            .iter()
            .filter(|x| x.class == "decimal")
            .map(|x| x.scale)
            .collect();
        // compared exactly where a decimal side's scale is undeclared, unless overridden
        let exact = class == "decimal" && over.is_none() && decimals.contains(&None);
        let scale = over.unwrap_or_else(|| decimals.iter().flatten().copied().max().unwrap_or(0));
        if classes.contains(&"float") && !exact {
            why.insert("float_scale");
        }
        if class == "decimal" && !exact && decimals.iter().any(|d| d.is_none_or(|d| d > scale)) {
            why.insert("decimal_scale");
        }
        // every generated timestamp declares 6 digits or leaves them undeclared (6)
        if matches!(class, "timestamp" | "timestamptz") && over.is_some_and(|p| p < 6) {
            why.insert("time_precision");
        }
        if class == "text" && case.empty_is_null.contains(&true) {
            why.insert("empty_string_as_null");
        }
        if (s.fixed || t.fixed) && !(s.fixed && t.fixed) {
            why.insert("padding");
        }
        if !why.is_empty() {
            out.insert(case.columns[col].name.clone(), why);
        }
    }
    out
}
