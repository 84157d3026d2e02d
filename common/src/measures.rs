//! Measures (DESIGN §5, comparison mode `measures`): per group, the SUM, MIN and MAX of
//! numeric columns, computed by the agent from the columns' canonical text (so every
//! engine, and both paths, give the same text for the same values), and the exact
//! comparison of two sides' values with a tolerance.
//!
//! Values are exact decimals: the canonical text of an integer, a decimal at its
//! resolved scale, or a float rounded to its resolved scale (DESIGN §3). Summing that
//! text is exact and does not depend on the order rows arrive in, unlike a
//! floating-point SUM in SQL. `NaN`, `Infinity` and `-Infinity` (float columns) are
//! kept apart: they order after, above and below every number, and a sum that meets
//! them is one of them. A sum beyond 38 digits is an error, never rounded.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// An exact decimal: `mantissa / 10^scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dec {
    mantissa: i128,
    scale: u32,
}

/// The most fractional digits a measure value may have.
pub const MAX_SCALE: u32 = 30;

impl Dec {
    pub const ZERO: Dec = Dec {
        mantissa: 0,
        scale: 0,
    };

    /// Parses plain decimal text: an optional sign, digits, an optional fraction.
    pub fn parse(t: &str) -> Option<Dec> {
        let t = t.trim();
        let (neg, digits) = match t.as_bytes().first()? {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        if (int.is_empty() && frac.is_empty())
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
            || frac.len() as u32 > MAX_SCALE
        {
            return None;
        }
        let mut m: i128 = 0;
        for b in int.bytes().chain(frac.bytes()) {
            m = m.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        }
        Some(Dec {
            mantissa: if neg { -m } else { m },
            scale: frac.len() as u32,
        })
    }

    fn rescale(self, scale: u32) -> Option<Dec> {
        let by = 10i128.checked_pow(scale.checked_sub(self.scale)?)?;
        Some(Dec {
            mantissa: self.mantissa.checked_mul(by)?,
            scale,
        })
    }

    /// Both at the larger scale.
    fn aligned(a: Dec, b: Dec) -> Option<(i128, i128, u32)> {
        let s = a.scale.max(b.scale);
        Some((a.rescale(s)?.mantissa, b.rescale(s)?.mantissa, s))
    }

    pub fn checked_add(self, o: Dec) -> Option<Dec> {
        let (a, b, scale) = Dec::aligned(self, o)?;
        Some(Dec {
            mantissa: a.checked_add(b)?,
            scale,
        })
    }

    pub fn checked_sub(self, o: Dec) -> Option<Dec> {
        let (a, b, scale) = Dec::aligned(self, o)?;
        Some(Dec {
            mantissa: a.checked_sub(b)?,
            scale,
        })
    }

    pub fn checked_mul(self, o: Dec) -> Option<Dec> {
        Some(Dec {
            mantissa: self.mantissa.checked_mul(o.mantissa)?,
            scale: self.scale.checked_add(o.scale)?,
        })
    }

    pub fn abs(self) -> Option<Dec> {
        Some(Dec {
            mantissa: self.mantissa.checked_abs()?,
            scale: self.scale,
        })
    }

    /// Compares exactly; `None` only where aligning the scales overflows.
    pub fn cmp_exact(self, o: Dec) -> Option<Ordering> {
        let (a, b, _) = Dec::aligned(self, o)?;
        Some(a.cmp(&b))
    }
}

impl fmt::Display for Dec {
    /// Normalised: no trailing fractional zeros, no trailing `.`, `0` for zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.mantissa.unsigned_abs().to_string();
        let scale = self.scale as usize;
        let (int, frac) = if digits.len() > scale {
            digits.split_at(digits.len() - scale)
        } else {
            ("0", digits.as_str())
        };
        let frac = format!("{frac:0>scale$}");
        let frac = frac.trim_end_matches('0');
        let neg = self.mantissa < 0;
        match (neg, frac.is_empty()) {
            (true, true) => write!(f, "-{int}"),
            (true, false) => write!(f, "-{int}.{frac}"),
            (false, true) => write!(f, "{int}"),
            (false, false) => write!(f, "{int}.{frac}"),
        }
    }
}

/// A measure value: a number, or one of the float specials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Num {
    NegInf,
    Fin(Dec),
    PosInf,
    NaN,
}

impl Num {
    /// A canonical numeric text (`NaN`, `Infinity`, `-Infinity`, or decimal).
    pub fn parse(t: &str) -> Option<Num> {
        Some(match t.trim() {
            "NaN" => Num::NaN,
            "Infinity" => Num::PosInf,
            "-Infinity" => Num::NegInf,
            other => Num::Fin(Dec::parse(other)?),
        })
    }

    fn rank(self) -> u8 {
        match self {
            Num::NegInf => 0,
            Num::Fin(_) => 1,
            Num::PosInf => 2,
            Num::NaN => 3,
        }
    }

    /// Total order: -Infinity < numbers < Infinity < NaN; `None` if aligning overflows.
    pub fn cmp_total(self, o: Num) -> Option<Ordering> {
        match (self, o) {
            (Num::Fin(a), Num::Fin(b)) => a.cmp_exact(b),
            _ => Some(self.rank().cmp(&o.rank())),
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::NegInf => f.write_str("-Infinity"),
            Num::Fin(d) => d.fmt(f),
            Num::PosInf => f.write_str("Infinity"),
            Num::NaN => f.write_str("NaN"),
        }
    }
}

/// One group's running SUM, MIN, MAX and counts of one measure. The specials (`NaN`,
/// `±Infinity`) are counted apart and never absorb the finite values: a NaN in a group
/// must not hide a change to any other row of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeasureAcc {
    pub non_null: u64,
    sum: Option<Dec>,
    min: Option<Dec>,
    max: Option<Dec>,
    nan: u64,
    pos_inf: u64,
    neg_inf: u64,
}

/// What went wrong adding a value: the caller names the column. Never the value: it
/// would leave the zone in the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeasureError {
    #[error("a value is not a plain decimal of at most 38 digits and 30 fractional ones")]
    NotANumber,
    #[error("a sum exceeds 38 significant digits")]
    Overflow,
}

impl MeasureAcc {
    /// Adds one row's canonical value (`None` for NULL, which only counts as a row).
    pub fn add(&mut self, v: Option<&str>) -> Result<(), MeasureError> {
        let Some(t) = v else { return Ok(()) };
        let d = match Num::parse(t).ok_or(MeasureError::NotANumber)? {
            Num::Fin(d) => d,
            special => {
                self.non_null += 1;
                match special {
                    Num::NaN => self.nan += 1,
                    Num::PosInf => self.pos_inf += 1,
                    _ => self.neg_inf += 1,
                }
                return Ok(());
            }
        };
        let less = |a: Dec, b: Dec| {
            a.cmp_exact(b)
                .ok_or(MeasureError::Overflow)
                .map(|o| o == Ordering::Less)
        };
        let sum = match self.sum {
            None => d,
            Some(s) => s.checked_add(d).ok_or(MeasureError::Overflow)?,
        };
        let min = match self.min {
            Some(m) if !less(d, m)? => m,
            _ => d,
        };
        let max = match self.max {
            Some(m) if !less(m, d)? => m,
            _ => d,
        };
        (self.sum, self.min, self.max) = (Some(sum), Some(min), Some(max));
        self.non_null += 1;
        Ok(())
    }

    /// The values as released: SUM, MIN and MAX of the finite values as canonical text
    /// (normalised; `None` without one), and how many values were specials.
    pub fn values(&self) -> MeasureValues {
        MeasureValues {
            non_null: self.non_null,
            sum: self.sum.map(|n| n.to_string()),
            min: self.min.map(|n| n.to_string()),
            max: self.max.map(|n| n.to_string()),
            nan: self.nan,
            pos_inf: self.pos_inf,
            neg_inf: self.neg_inf,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One group's measure in clear.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasureValues {
    /// Rows with a value (not NULL), specials included.
    pub non_null: u64,
    /// Of the finite values.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sum: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub min: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max: Option<String>,
    /// Values that were `NaN`, `Infinity`, `-Infinity` (float columns).
    #[serde(skip_serializing_if = "is_zero", default)]
    pub nan: u64,
    #[serde(skip_serializing_if = "is_zero", default)]
    pub pos_inf: u64,
    #[serde(skip_serializing_if = "is_zero", default)]
    pub neg_inf: u64,
}

/// `tolerance: {amount: 0.01}` (absolute) or `{qty: 0.1%}` (relative to the larger
/// magnitude of the two values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    Absolute(Dec),
    /// Percent.
    Relative(Dec),
}

impl Tolerance {
    /// `0.01`, `5`, or `0.1%`; never negative.
    pub fn parse(t: &str) -> Option<Tolerance> {
        let t = t.trim();
        let (num, relative) = match t.strip_suffix('%') {
            Some(n) => (n.trim(), true),
            None => (t, false),
        };
        let d = Dec::parse(num)?;
        if d.mantissa < 0 || num.starts_with('+') {
            return None;
        }
        Some(if relative {
            Tolerance::Relative(d)
        } else {
            Tolerance::Absolute(d)
        })
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Absolute(d) => write!(f, "{d}"),
            Tolerance::Relative(d) => write!(f, "{d}%"),
        }
    }
}

/// How two sides' values of one measure compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    Equal,
    /// Different, within the tolerance.
    Tolerated,
    Differ,
}

/// Compares two canonical values (`None`: no non-NULL value) exactly, then within
/// `tol`. Specials and NULL agree only with themselves; an arithmetic overflow counts
/// as beyond the tolerance (fail closed).
pub fn agree(a: Option<&str>, b: Option<&str>, tol: Option<Tolerance>) -> Agreement {
    let (a, b) = match (a.map(Num::parse), b.map(Num::parse)) {
        (None, None) => return Agreement::Equal,
        (Some(Some(a)), Some(Some(b))) => (a, b),
        _ => return Agreement::Differ,
    };
    if a.cmp_total(b) == Some(Ordering::Equal) {
        return Agreement::Equal;
    }
    let (Num::Fin(x), Num::Fin(y), Some(tol)) = (a, b, tol) else {
        return Agreement::Differ;
    };
    let within = (|| {
        let diff = x.checked_sub(y)?.abs()?;
        match tol {
            Tolerance::Absolute(t) => Some(diff.cmp_exact(t)? != Ordering::Greater),
            Tolerance::Relative(p) => {
                // |x - y| * 100 <= p * max(|x|, |y|)
                let (ax, ay) = (x.abs()?, y.abs()?);
                let big = if ax.cmp_exact(ay)? == Ordering::Less {
                    ay
                } else {
                    ax
                };
                let lhs = diff.checked_mul(Dec {
                    mantissa: 100,
                    scale: 0,
                })?;
                Some(lhs.cmp_exact(p.checked_mul(big)?)? != Ordering::Greater)
            }
        }
    })();
    if within == Some(true) {
        Agreement::Tolerated
    } else {
        Agreement::Differ
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(vals: &[Option<&str>]) -> MeasureValues {
        let mut a = MeasureAcc::default();
        for v in vals {
            a.add(*v).unwrap();
        }
        a.values()
    }

    #[test]
    fn sums_are_exact_normalised_and_independent_of_order() {
        let v = acc(&[Some("1250.50"), Some("-0.25"), None, Some("3"), Some("0.000001")]);
        assert_eq!(v.sum.as_deref(), Some("1253.250001"));
        assert_eq!(v.min.as_deref(), Some("-0.25"));
        assert_eq!(v.max.as_deref(), Some("1250.5"));
        let w = acc(&[Some("3"), Some("0.000001"), Some("-0.25"), Some("1250.50")]);
        assert_eq!(v, w);
        // 0.1 + 0.2 is 0.3 here, not 0.30000000000000004
        assert_eq!(acc(&[Some("0.1"), Some("0.2")]).sum.as_deref(), Some("0.3"));
        assert_eq!(acc(&[Some("-1.50"), Some("1.5")]).sum.as_deref(), Some("0"));
        assert_eq!(acc(&[Some("-0.05")]).sum.as_deref(), Some("-0.05"));
        assert_eq!(acc(&[None, None]), MeasureValues::default());
        // beyond 38 digits: an error, never a rounded sum
        let big = "9".repeat(38);
        let mut a = MeasureAcc::default();
        a.add(Some(&big)).unwrap();
        assert_eq!(a.add(Some(&big)), Err(MeasureError::Overflow));
        assert_eq!(
            MeasureAcc::default().add(Some("1e5")),
            Err(MeasureError::NotANumber)
        );
        // the error never carries the value
        assert!(!MeasureError::NotANumber.to_string().contains("1e5"));
    }

    #[test]
    fn float_specials_are_counted_apart_and_hide_no_finite_change() {
        let v = acc(&[
            Some("1.5"),
            Some("Infinity"),
            Some("-2"),
            Some("NaN"),
            Some("-Infinity"),
        ]);
        assert_eq!(
            (v.sum.as_deref(), v.min.as_deref(), v.max.as_deref()),
            (Some("-0.5"), Some("-2"), Some("1.5"))
        );
        assert_eq!((v.non_null, v.nan, v.pos_inf, v.neg_inf), (5, 1, 1, 1));
        // a NaN beside 1 and 5 is not a NaN beside 1 and 9
        assert_ne!(
            acc(&[Some("NaN"), Some("1"), Some("5")]),
            acc(&[Some("NaN"), Some("1"), Some("9")])
        );
        assert_ne!(acc(&[Some("NaN")]), acc(&[Some("Infinity")]));
        let only = acc(&[Some("NaN")]);
        assert_eq!((only.sum, only.non_null), (None, 1));
    }

    #[test]
    fn tolerances_are_exact_at_their_boundary_and_fail_closed() {
        let abs = Tolerance::parse("0.01");
        let rel = Tolerance::parse("0.1%");
        assert_eq!(abs.unwrap().to_string(), "0.01");
        assert_eq!(rel.unwrap().to_string(), "0.1%");
        assert_eq!(agree(Some("10.5"), Some("10.50"), None), Agreement::Equal);
        assert_eq!(agree(Some("10.50"), Some("10.51"), None), Agreement::Differ);
        assert_eq!(agree(Some("10.50"), Some("10.51"), abs), Agreement::Tolerated);
        assert_eq!(agree(Some("10.50"), Some("10.52"), abs), Agreement::Differ);
        // a huge sum with a cent's difference: exact, where a double would see none
        let (x, y) = ("1000000000000000.00", "1000000000000000.02");
        assert_eq!(agree(Some(x), Some(y), abs), Agreement::Differ);
        assert_eq!(
            agree(Some(x), Some("1000000000000000.01"), abs),
            Agreement::Tolerated
        );
        // 0.1% of 1000 is 1
        assert_eq!(agree(Some("1000"), Some("999"), rel), Agreement::Tolerated);
        assert_eq!(agree(Some("1000"), Some("998.9"), rel), Agreement::Differ);
        assert_eq!(agree(Some("-1000"), Some("-999"), rel), Agreement::Tolerated);
        // NULL and specials agree only with themselves
        assert_eq!(agree(None, Some("0"), abs), Agreement::Differ);
        assert_eq!(agree(Some("NaN"), Some("NaN"), None), Agreement::Equal);
        assert_eq!(agree(Some("Infinity"), Some("1e308"), abs), Agreement::Differ);
        assert_eq!(
            agree(Some("Infinity"), Some("9"), Tolerance::parse("100%")),
            Agreement::Differ
        );
        // overflow while comparing: beyond the tolerance
        let big = format!("-{}", "9".repeat(38));
        assert_eq!(
            agree(Some(&big), Some(&"9".repeat(38)), Tolerance::parse("1")),
            Agreement::Differ
        );
        for bad in ["", "-1", "x", "1%%", "+1", "%"] {
            assert_eq!(Tolerance::parse(bad), None, "{bad:?}");
        }
    }
}
