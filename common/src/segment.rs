//! Segments of a dataset, as both agent and coordinator see them, and their
//! conversions to and from `tally.agent.v1` messages.
//!
//! A segment is the rows whose key tuple lies in `[lower, upper)` (an absent bound is
//! open) and, for the hash strategy, whose bucket hash lies in `[hash_lo, hash_hi)`.
//! The bucket hash of a row is the top 60 bits of the key hash, so it fits a signed
//! 64-bit integer on every engine.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use crate::canonical::FieldFormat;
use crate::period::Granularity;
use crate::types::TypeClass;

mod even_cuts;
pub use even_cuts::EvenCuts;

/// The most cut points one split carries.
pub const MAX_CUTS: usize = 1024;

/// The bucket-hash space: `[0, HASH_SPACE)`.
pub const HASH_SPACE: u64 = 1 << 60;

/// The bucket hash of a key hash (see module docs).
pub fn bucket_hash(key_hash: u64) -> u64 {
    key_hash >> 4
}

/// One key column's value. Integer keys compare numerically; text keys bytewise,
/// which is what `COLLATE "C"`, `utf8mb4_bin` and SQLite's BINARY do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KeyPart {
    Int(i64),
    Text(String),
}

impl PartialOrd for KeyPart {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyPart {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (KeyPart::Int(a), KeyPart::Int(b)) => a.cmp(b),
            (KeyPart::Text(a), KeyPart::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (KeyPart::Int(_), KeyPart::Text(_)) => Ordering::Less,
            (KeyPart::Text(_), KeyPart::Int(_)) => Ordering::Greater,
        }
    }
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Int(i) => write!(f, "{i}"),
            KeyPart::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// A key tuple; composite keys compare as tuples.
pub type KeyTuple = Vec<KeyPart>;

pub fn format_tuple(t: &KeyTuple) -> String {
    if t.len() == 1 {
        t[0].to_string()
    } else {
        format!(
            "({})",
            t.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Segment {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lower: Option<KeyTuple>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upper: Option<KeyTuple>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<(u64, u64)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// The run's window: only rows whose window column is at most its bound. Set on
    /// level 1 and inherited by every child, so every request of the run filters alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
}

/// A run's window (DESIGN §5): rows with `column <= upper`. `upper` is a value of the
/// column's compared class (integer, date or timestamp), rendered by each agent to
/// the column's canonical text; rows compare by canonical text, bytewise (integers by
/// value), so both sides keep the same rows whatever their engines.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub column: String,
    pub upper: String,
}

/// A calendar period of a time column; an empty label is the rows whose time is NULL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Period {
    pub column: String,
    pub granularity: Granularity,
    pub label: String,
}

impl Segment {
    pub fn whole() -> Segment {
        Segment::default()
    }

    /// No key bound, hash range or period: every row of the run's window.
    pub fn is_whole(&self) -> bool {
        self.lower.is_none() && self.upper.is_none() && self.hash.is_none() && self.period.is_none()
    }

    pub fn has_key_bounds(&self) -> bool {
        self.lower.is_some() || self.upper.is_some()
    }

    /// Whether a read of `other` scans the same rows as a read of this segment: the same
    /// key bounds, period and window; only the hash range, filtered row by row, may differ.
    pub fn scans_like(&self, other: &Segment) -> bool {
        self.lower == other.lower
            && self.upper == other.upper
            && self.period == other.period
            && self.window == other.window
    }

    /// Whether a row with this key and bucket hash belongs to the segment (its period,
    /// if any, is checked by the caller, which knows the row's time).
    pub fn contains(&self, key: &KeyTuple, bucket_hash: u64) -> bool {
        self.in_key_range(key)
            && self
                .hash
                .is_none_or(|(lo, hi)| bucket_hash >= lo && bucket_hash < hi)
    }

    /// Whether a key lies in `[lower, upper)`, compared the way children are assigned:
    /// integers by value, text bytewise (NO PAD).
    pub fn in_key_range(&self, key: &KeyTuple) -> bool {
        self.lower.as_ref().is_none_or(|l| key >= l) && self.upper.as_ref().is_none_or(|u| key < u)
    }

    /// The start and width of the `n`-way split of the hash range: child `i` is
    /// `[lo + i·width, lo + (i+1)·width)`, the last one cut at the parent's end.
    pub fn hash_split(&self, n: u32) -> (u64, u64) {
        let (lo, hi) = self.hash.unwrap_or((0, HASH_SPACE));
        let n = u64::from(n.max(1)).min(hi - lo).max(1);
        (lo, (hi - lo).div_ceil(n))
    }

    /// Splits the hash range into `n` near-equal parts (the last takes the rest).
    pub fn hash_children(&self, n: u32) -> Vec<Segment> {
        let hi = self.hash.map_or(HASH_SPACE, |h| h.1);
        let (lo, width) = self.hash_split(n);
        let n = (hi - lo).div_ceil(width);
        (0..n)
            .map(|i| lo + i * width)
            .take_while(|&start| start < hi)
            .map(|start| Segment {
                hash: Some((start, (start + width).min(hi))),
                ..self.clone()
            })
            .collect()
    }

    /// The child index a bucket hash falls in under [`Segment::hash_children`].
    pub fn hash_child_of(&self, n: u32, bucket_hash: u64) -> usize {
        let (lo, width) = self.hash_split(n);
        ((bucket_hash - lo) / width) as usize
    }

    /// Children delimited by cut points: `[lower, c1)`, `[c1, c2)`, …, `[cn, upper)`.
    pub fn cut_children(&self, cuts: &[KeyTuple]) -> Vec<Segment> {
        let mut out = Vec::with_capacity(cuts.len() + 1);
        let mut lower = self.lower.clone();
        for c in cuts {
            out.push(Segment {
                lower,
                upper: Some(c.clone()),
                ..self.clone()
            });
            lower = Some(c.clone());
        }
        out.push(Segment {
            lower,
            upper: self.upper.clone(),
            ..self.clone()
        });
        out
    }

    /// A short human form: `[10, 250)`, `[.., "m")`, `hash [0x0, 0x8000)`, `day 2024-03-15`.
    pub fn describe(&self) -> String {
        let b = |t: &Option<KeyTuple>| t.as_ref().map(format_tuple).unwrap_or_else(|| "..".into());
        let mut s = String::new();
        if let Some(p) = &self.period {
            let label = if p.label.is_empty() {
                "(no time)"
            } else {
                p.label.as_str()
            };
            s = format!("{} {label}", p.granularity.name());
            if !self.has_key_bounds() && self.hash.is_none() {
                return s;
            }
            s.push(' ');
        }
        if self.has_key_bounds() || self.hash.is_none() {
            s.push_str(&format!("[{}, {})", b(&self.lower), b(&self.upper)));
        }
        if let Some((lo, hi)) = self.hash {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&format!("hash [{lo:#x}, {hi:#x})"));
        }
        s
    }
}

/// How the agent divides one segment into child buckets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Whole,
    /// NTILE-style over the key order, chosen by the agent that is asked.
    Quantile(u32),
    Hash(u32),
    Cuts(Vec<KeyTuple>),
    /// Evenly spaced cuts of a single integer key, the planner's even split: the
    /// children of [`Split::Cuts`] of [`EvenCuts::cuts`], bucketed by one division.
    Even(EvenCuts),
    /// One child per calendar period of `column` present in the segment.
    Period {
        column: String,
        granularity: Granularity,
    },
}

/// A compared column in the resolved order, with its canonical format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnSpec {
    pub name: String,
    pub format: FieldFormat,
}

/// A wire conversion error naming the field by its path in the message
/// (`segments[3].split`, `seal.nonce`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct WireError {
    pub field: String,
    pub message: String,
}

impl WireError {
    /// The same error inside the field `prefix` of an enclosing message.
    pub fn at(mut self, prefix: &str) -> WireError {
        self.field = format!("{prefix}.{}", self.field);
        self
    }
}

pub fn wire_err(field: impl Into<String>, message: impl Into<String>) -> WireError {
    WireError {
        field: field.into(),
        message: message.into(),
    }
}

pub fn tuple_to_pb(t: &KeyTuple) -> pb::KeyTuple {
    pb::KeyTuple {
        parts: t
            .iter()
            .map(|p| pb::KeyValue {
                value: Some(match p {
                    KeyPart::Int(i) => pb::key_value::Value::Int(*i),
                    KeyPart::Text(s) => pb::key_value::Value::Text(s.clone()),
                }),
            })
            .collect(),
    }
}

pub fn tuple_from_pb(t: pb::KeyTuple, field: &str) -> Result<KeyTuple, WireError> {
    t.parts
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v.value {
            Some(pb::key_value::Value::Int(x)) => Ok(KeyPart::Int(x)),
            Some(pb::key_value::Value::Text(s)) => Ok(KeyPart::Text(s)),
            None => Err(wire_err(format!("{field}.parts[{i}]"), "empty key value")),
        })
        .collect()
}

impl From<&Segment> for pb::Segment {
    fn from(s: &Segment) -> Self {
        pb::Segment {
            lower: s.lower.as_ref().map(tuple_to_pb),
            upper: s.upper.as_ref().map(tuple_to_pb),
            hash_lo: s.hash.map(|h| h.0),
            hash_hi: s.hash.map(|h| h.1),
            period: s.period.as_ref().map(|p| pb::Period {
                column: p.column.clone(),
                granularity: p.granularity.name().to_string(),
                label: p.label.clone(),
            }),
            window: s.window.as_ref().map(|w| pb::Window {
                column: w.column.clone(),
                upper: w.upper.clone(),
            }),
        }
    }
}

impl Segment {
    pub fn from_pb(s: pb::Segment, field: &str) -> Result<Segment, WireError> {
        let hash = match (s.hash_lo, s.hash_hi) {
            (None, None) => None,
            (Some(lo), Some(hi)) if lo < hi && hi <= HASH_SPACE => Some((lo, hi)),
            _ => {
                return Err(wire_err(
                    format!("{field}.hash_lo"),
                    "hash range must be lo < hi <= 2^60",
                ));
            }
        };
        let period = s
            .period
            .map(|p| {
                let granularity = Granularity::parse(&p.granularity).ok_or_else(|| {
                    wire_err(
                        format!("{field}.period.granularity"),
                        "expected hour, day, week, month, quarter or year",
                    )
                })?;
                if p.column.is_empty() {
                    return Err(wire_err(format!("{field}.period.column"), "empty column name"));
                }
                Ok(Period {
                    column: p.column,
                    granularity,
                    label: p.label,
                })
            })
            .transpose()?;
        let window = s
            .window
            .map(|w| {
                if w.column.is_empty() || w.column.len() > 128 {
                    return Err(wire_err(format!("{field}.window.column"), "1 to 128 characters"));
                }
                if w.upper.is_empty() || w.upper.len() > 64 {
                    return Err(wire_err(format!("{field}.window.upper"), "1 to 64 characters"));
                }
                Ok(Window {
                    column: w.column,
                    upper: w.upper,
                })
            })
            .transpose()?;
        Ok(Segment {
            lower: s
                .lower
                .map(|t| tuple_from_pb(t, &format!("{field}.lower")))
                .transpose()?,
            upper: s
                .upper
                .map(|t| tuple_from_pb(t, &format!("{field}.upper")))
                .transpose()?,
            hash,
            period,
            window,
        })
    }
}

impl From<&ColumnSpec> for pb::ColumnRef {
    fn from(c: &ColumnSpec) -> Self {
        pb::ColumnRef {
            name: c.name.clone(),
            type_class: pb::TypeClass::from(c.format.class) as i32,
            scale: c.format.scale,
            fixed_char: c.format.fixed_char,
            exact: c.format.exact,
        }
    }
}

impl ColumnSpec {
    pub fn from_pb(c: pb::ColumnRef, field: &str) -> Result<ColumnSpec, WireError> {
        let class =
            TypeClass::try_from(c.type_class).map_err(|m| wire_err(format!("{field}.type_class"), m))?;
        if c.scale > 38 {
            return Err(wire_err(format!("{field}.scale"), "scale above 38"));
        }
        if c.name.is_empty() {
            return Err(wire_err(format!("{field}.name"), "empty column name"));
        }
        if c.exact && class != TypeClass::Decimal {
            return Err(wire_err(
                format!("{field}.exact"),
                "exact applies to decimals only",
            ));
        }
        Ok(ColumnSpec {
            name: c.name,
            format: FieldFormat::new(class)
                .with_scale(c.scale)
                .fixed_char(c.fixed_char)
                .exact(c.exact),
        })
    }
}

impl Split {
    pub fn to_pb(&self) -> pb::segment_split::Split {
        use pb::segment_split::Split as S;
        match self {
            Split::Whole => S::Whole(true),
            Split::Quantile(n) => S::Quantile(*n),
            Split::Hash(n) => S::Hash(*n),
            Split::Cuts(c) => S::Cuts(pb::KeyCuts {
                cuts: c.iter().map(tuple_to_pb).collect(),
                even: None,
            }),
            // the list too, for agents before the even form (even_cuts.rs)
            Split::Even(e) => S::Cuts(pb::KeyCuts {
                cuts: e.cuts().iter().map(tuple_to_pb).collect(),
                even: Some(e.to_pb()),
            }),
            Split::Period { column, granularity } => S::Period(pb::PeriodSplit {
                column: column.clone(),
                granularity: granularity.name().to_string(),
            }),
        }
    }

    pub fn from_pb(s: Option<pb::segment_split::Split>, field: &str) -> Result<Split, WireError> {
        use pb::segment_split::Split as S;
        let check = |n: u32| {
            if (1..=1024).contains(&n) {
                Ok(n)
            } else {
                Err(wire_err(field, "split factor must be 1..=1024"))
            }
        };
        Ok(match s {
            None | Some(S::Whole(_)) => Split::Whole,
            Some(S::Quantile(n)) => Split::Quantile(check(n)?),
            Some(S::Hash(n)) => Split::Hash(check(n)?),
            Some(S::Cuts(c)) => {
                if c.cuts.len() > MAX_CUTS {
                    return Err(wire_err(field, format!("at most {MAX_CUTS} cut points")));
                }
                let cuts = c
                    .cuts
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| tuple_from_pb(t, &format!("{field}.cuts[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                if cuts.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(wire_err(
                        field,
                        "cut points must be strictly increasing (duplicate keys in the source dataset?)",
                    ));
                }
                match c.even {
                    Some(e) => Split::Even(even_cuts::even_from_pb(e, &cuts, &format!("{field}.even"))?),
                    None => Split::Cuts(cuts),
                }
            }
            Some(S::Period(p)) => Split::Period {
                granularity: Granularity::parse(&p.granularity).ok_or_else(|| {
                    wire_err(
                        format!("{field}.granularity"),
                        "expected hour, day, week, month, quarter or year",
                    )
                })?,
                column: p.column,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_order_bytewise() {
        let k = |s: &str| KeyPart::Text(s.into());
        assert!(k("Z") < k("a"));
        assert!(k("a") < k("é"));
        assert!(vec![k("a"), KeyPart::Int(2)] < vec![k("a"), KeyPart::Int(10)]);
    }

    #[test]
    fn hash_children_cover_the_parent_exactly() {
        let s = Segment {
            hash: Some((5, 1000)),
            ..Default::default()
        };
        for n in [1, 2, 3, 7, 32, 1024] {
            let c = s.hash_children(n);
            assert_eq!(c.first().unwrap().hash.unwrap().0, 5);
            assert_eq!(c.last().unwrap().hash.unwrap().1, 1000);
            for w in c.windows(2) {
                assert_eq!(w[0].hash.unwrap().1, w[1].hash.unwrap().0);
            }
            for h in [5, 6, 500, 999] {
                let i = s.hash_child_of(n, h);
                assert!(c[i].contains(&vec![], h), "n={n} h={h} i={i}");
            }
        }
        assert_eq!(Segment::whole().hash_children(32).len(), 32);
    }

    #[test]
    fn cut_children_are_contiguous_and_open_at_the_ends() {
        let cuts = vec![vec![KeyPart::Int(10)], vec![KeyPart::Int(20)]];
        let c = Segment::whole().cut_children(&cuts);
        assert_eq!(c.len(), 3);
        assert!(c[0].lower.is_none() && c[2].upper.is_none());
        assert!(c[1].contains(&vec![KeyPart::Int(10)], 0));
        assert!(!c[1].contains(&vec![KeyPart::Int(20)], 0));
        assert_eq!(c[1].describe(), "[10, 20)");
    }

    #[test]
    fn wire_round_trip_and_validation() {
        let s = Segment {
            lower: Some(vec![KeyPart::Text("a".into()), KeyPart::Int(-3)]),
            upper: None,
            hash: Some((0, 16)),
            period: Some(Period {
                column: "at".into(),
                granularity: Granularity::Week,
                label: "2024-03-11".into(),
            }),
            window: Some(Window {
                column: "at".into(),
                upper: "2024-03-11T00:00:00Z".into(),
            }),
        };
        assert_eq!(Segment::from_pb(pb::Segment::from(&s), "s").unwrap(), s);
        for (column, upper, field) in [("", "1", "s.window.column"), ("at", "", "s.window.upper")] {
            let mut w = pb::Segment::from(&s);
            w.window = Some(pb::Window {
                column: column.into(),
                upper: upper.into(),
            });
            let e = Segment::from_pb(w, "s").unwrap_err();
            assert!(e.to_string().contains(field), "{e}");
        }
        let bad = pb::Segment {
            hash_lo: Some(9),
            hash_hi: Some(3),
            ..Default::default()
        };
        assert_eq!(
            Segment::from_pb(bad, "segments[0]").unwrap_err().field,
            "segments[0].hash_lo"
        );
        let cuts = Split::Cuts(vec![vec![KeyPart::Int(2)], vec![KeyPart::Int(1)]]).to_pb();
        assert!(Split::from_pb(Some(cuts), "split").is_err());
        assert!(Split::from_pb(Some(pb::segment_split::Split::Hash(0)), "split").is_err());
    }
}
