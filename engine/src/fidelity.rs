//! How faithfully a run compared each column (issue 31, "honest passes"): a column the
//! resolve phase renders below what a side stores (a float at a scale, a time cut to a
//! precision, two classes folded into one, `''` taken as NULL, padding dropped, a key
//! through a cast) makes the run's fidelity `reduced`, and the result, its human
//! summary and the evidence statement name each such column and why. The rules are
//! docs/canonical-form.md §10; this file decides them from the resolution alone.

use serde::{Deserialize, Serialize};
use tally_common::TypeClass;
use tally_common::canonical::{DEFAULT_TIME_PRECISION, FieldFormat};
use tally_common::wire::{Column, Describe};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Every column compared at what both sides store.
    Full,
    /// Some column compared below it: a `match` holds at that fidelity only.
    Reduced,
}

/// Why one column's comparison is below what a side stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// A key matched across an integer and a decimal through the decimal's text.
    KeyCast,
    /// Two type classes rendered as one.
    CrossClass,
    /// A float rounded to a finite scale.
    FloatScale,
    /// A decimal rounded below a side's declared (or undeclared, unbounded) scale.
    DecimalScale,
    /// Fractional seconds cut below a side's declared precision.
    TimePrecision,
    /// A side's empty texts are NULL (`empty_string_is_null`).
    EmptyStringAsNull,
    /// `CHAR(n)`/`BINARY(n)` padding removed from a side that does not pad.
    Padding,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    pub code: Code,
    /// Reads after the column's name: `amount float at scale 6`.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnFidelity {
    /// The source's name of the column.
    pub column: String,
    pub reasons: Vec<Reason>,
}

/// A run's fidelity: `full`, or `reduced` with every column below it, in column order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fidelity {
    pub level: Level,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<ColumnFidelity>,
}

impl Fidelity {
    /// `reduced` exactly when some column has a reason.
    pub fn of(columns: Vec<ColumnFidelity>) -> Fidelity {
        let columns: Vec<ColumnFidelity> = columns.into_iter().filter(|c| !c.reasons.is_empty()).collect();
        Fidelity {
            level: if columns.is_empty() {
                Level::Full
            } else {
                Level::Reduced
            },
            columns,
        }
    }

    pub fn is_reduced(&self) -> bool {
        self.level == Level::Reduced
    }

    /// Whether `level` and `columns` agree (a statement read from elsewhere).
    pub fn consistent(&self) -> bool {
        self.is_reduced() != self.columns.is_empty() && self.columns.iter().all(|c| !c.reasons.is_empty())
    }

    /// `amount float at scale 6, created_at cut to precision 3 (timestamp(6) / datetime(6))`.
    pub fn summary(&self) -> String {
        self.columns
            .iter()
            .map(|c| {
                let why: Vec<&str> = c.reasons.iter().map(|r| r.text.as_str()).collect();
                format!("{} {}", c.column, why.join(" and "))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether a dataset renders its empty texts as NULL. An agent before the typed field
/// says so in its engine warnings only; that counts too, so such a pass is never plain.
pub fn empties_are_null(d: &Describe) -> bool {
    d.empty_string_is_null
        || d.engine_warnings
            .iter()
            .any(|w| w.contains("empty_string_is_null: true"))
}

/// What deciding one column's fidelity needs: both sides' descriptions of it and how
/// the resolve phase renders it.
pub struct ColumnInput<'a> {
    pub is_key: bool,
    pub source: &'a Column,
    pub target: &'a Column,
    pub format: FieldFormat,
    /// The zones each side reads its zone-less timestamps in ("" = UTC).
    pub zones: (&'a str, &'a str),
    /// Each side's `empty_string_is_null`.
    pub empty_is_null: (bool, bool),
}

const SIDES: [&str; 2] = ["source", "target"];

/// Every reason the column is compared below what a side stores (none: full).
pub fn reasons(i: &ColumnInput<'_>) -> Vec<Reason> {
    use TypeClass::*;
    let (s, t, f) = (i.source, i.target, i.format);
    let (a, b) = (s.class, t.class);
    let across = |x: TypeClass, y: TypeClass| (a, b) == (x, y) || (a, b) == (y, x);
    let side_of = |c: TypeClass| usize::from(a != c);
    let sides = [s, t];
    let types = format!("({} / {})", s.declared_type, t.declared_type);
    let mut out = Vec::new();
    let mut say = |code, text: String| out.push(Reason { code, text });
    if a != b {
        if across(Integer, Decimal) {
            // every integer is a decimal of scale 0: compared, nothing is lost; as a
            // key, rows are paired by the decimal's text, not by the integer
            if i.is_key {
                say(Code::KeyCast, format!("keyed through a cast to decimal {types}"));
            }
        } else {
            let text = if across(Boolean, Integer) {
                format!("integer compared as boolean {types}")
            } else if across(Json, Text) {
                format!("text parsed as json {types}")
            } else if across(Timestamp, TimestampTz) {
                let local = side_of(Timestamp);
                let zone = [i.zones.0, i.zones.1][local];
                let zone = if zone.is_empty() { "UTC" } else { zone };
                format!(
                    "the {}'s timestamp read in {zone} as timestamptz {types}",
                    SIDES[local]
                )
            } else if across(Decimal, Float) {
                format!("float compared as decimal {types}")
            } else if across(Text, Binary) {
                format!("text compared as binary by its UTF-8 bytes {types}")
            } else {
                format!("{a} compared as {} {types}", f.class)
            };
            say(Code::CrossClass, text);
        }
    }
    let float_side = a == Float || b == Float;
    if float_side && matches!(f.class, Float | Decimal) && !f.exact {
        say(Code::FloatScale, format!("float at scale {}", f.scale));
    }
    if f.class == Decimal && !f.exact {
        // an undeclared scale is unbounded; an integer declares 0
        let below = sides
            .iter()
            .any(|c| c.class == Decimal && c.scale.is_none_or(|d| d > f.scale));
        if below {
            say(
                Code::DecimalScale,
                format!("decimal at scale {} {types}", f.scale),
            );
        }
    }
    if matches!(f.class, Timestamp | TimestampTz | Time) {
        // an undeclared precision counts as 6, the finest PostgreSQL and MySQL store
        let below = sides
            .iter()
            .any(|c| c.scale.unwrap_or(DEFAULT_TIME_PRECISION) > f.scale);
        if below {
            say(
                Code::TimePrecision,
                format!("cut to precision {} {types}", f.scale),
            );
        }
    }
    if f.class == Text {
        let on = match i.empty_is_null {
            (true, true) => Some("both sides"),
            (true, false) => Some("the source"),
            (false, true) => Some("the target"),
            (false, false) => None,
        };
        if let Some(on) = on {
            say(
                Code::EmptyStringAsNull,
                format!("'' taken as NULL on {on} (empty_string_is_null)"),
            );
        }
    }
    // padding both sides have is the type's own; dropped from a side without it, it
    // hides that side's trailing spaces (0x00 bytes)
    if f.fixed_char && !(s.fixed_char && t.fixed_char && a == b) {
        let what = if f.class == Binary {
            "trailing 0x00 bytes"
        } else {
            "trailing spaces"
        };
        say(Code::Padding, format!("{what} ignored {types}"));
    }
    out
}
