//! The canonical form (DESIGN §3): each compared value rendered to one UTF-8 text,
//! identically on every engine, and the injective row string built from those texts.
//!
//! This is the reference encoder. Dialects render the same text in SQL; the agent's
//! in-process path calls these functions directly. `tests/vectors/canonical.json`
//! (written by an independent Python implementation) pins every rule.

use crate::civil::{self, CivilDate};
use crate::types::TypeClass;

/// Default resolved scale of floats and precision of timestamps and times.
/// The version of the canonical form and checksum rules (the `version` of
/// `tests/vectors/canonical.json`); evidence states it, and a rule change bumps both.
pub const CANONICAL_FORM_VERSION: u32 = 1;
pub const DEFAULT_FLOAT_SCALE: u32 = 6;
pub const DEFAULT_TIME_PRECISION: u32 = 6;
/// Fractional seconds are kept to nanoseconds at most.
pub const MAX_TIME_PRECISION: u32 = 9;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("invalid {class} value {value:?}: {reason}")]
    Invalid {
        class: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("type class {0} has no canonical form; the value is never hashed loosely")]
    Unsupported(&'static str),
}

fn invalid(class: &'static str, value: &str, reason: &'static str) -> CanonicalError {
    CanonicalError::Invalid {
        class,
        value: value.to_string(),
        reason,
    }
}

/// How one column is rendered: its class and the resolved scale or precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldFormat {
    pub class: TypeClass,
    /// Resolved scale (decimal, float) or fractional-second precision (timestamp, timestamptz, time).
    pub scale: u32,
    /// CHAR(n): trailing spaces removed; BINARY(n): trailing `0x00` bytes removed.
    pub fixed_char: bool,
    /// Decimal: the exact normalised form (trailing fractional zeros and a trailing
    /// point removed), used where either side's scale is undeclared; `scale` is unused.
    pub exact: bool,
    /// Text: the empty string is rendered as NULL, as Oracle stores it (set by the
    /// agent from its dataset's `empty_string_is_null`; it never travels on the wire).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_is_null: bool,
}

impl FieldFormat {
    pub fn new(class: TypeClass) -> Self {
        let scale = match class {
            TypeClass::Float => DEFAULT_FLOAT_SCALE,
            TypeClass::Timestamp | TypeClass::TimestampTz | TypeClass::Time => DEFAULT_TIME_PRECISION,
            _ => 0,
        };
        FieldFormat {
            class,
            scale,
            fixed_char: false,
            exact: false,
            empty_is_null: false,
        }
    }

    pub fn with_scale(mut self, scale: u32) -> Self {
        self.scale = scale;
        self
    }

    pub fn fixed_char(mut self, fixed_char: bool) -> Self {
        self.fixed_char = fixed_char;
        self
    }

    pub fn exact(mut self, exact: bool) -> Self {
        self.exact = exact;
        self
    }

    pub fn empty_is_null(mut self, empty_is_null: bool) -> Self {
        self.empty_is_null = empty_is_null;
        self
    }
}

/// A typed value as a driver hands it over. Text-like classes whose driver value is a
/// string (decimal, date, timestamp, …) go through [`canonical_from_text`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Int(i128),
    Float(f64),
    Bool(bool),
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// Renders a typed value; `None` means SQL NULL.
pub fn canonical_value(fmt: &FieldFormat, value: &Value<'_>) -> Result<Option<String>, CanonicalError> {
    Ok(Some(match (fmt.class, value) {
        (_, Value::Null) => return Ok(None),
        (TypeClass::Integer, Value::Int(i)) => i.to_string(),
        (TypeClass::Decimal, Value::Int(i)) => decimal_text(&i.to_string(), fmt)?,
        (TypeClass::Decimal, Value::Float(f)) if fmt.exact => match float_token(*f) {
            Some(t) => t.to_string(),
            None => exact_decimal(&crate::shortest::shortest_decimal(*f))?,
        },
        (TypeClass::Float | TypeClass::Decimal, Value::Float(f)) => canonical_float(*f, fmt.scale),
        (TypeClass::Boolean, Value::Bool(b)) => if *b { "1" } else { "0" }.to_string(),
        // a bit compared as an integer (SQL renders it 1 or 0 too)
        (TypeClass::Integer, Value::Bool(b)) => if *b { "1" } else { "0" }.to_string(),
        // an integer column compared as a boolean (MySQL TINYINT(1)) holding 2 is
        // rendered by its value: distinct from both booleans, never folded into one
        (TypeClass::Boolean, Value::Int(i)) => i.to_string(),
        (TypeClass::Binary, Value::Bytes(b)) => binary_hex(b, fmt.fixed_char),
        // a JSON document that is a bare number, stored as one (SQLite's NUMERIC
        // affinity): the number as RFC 8785 writes it
        // an integer no double holds exactly is refused, as its text would be (I-JSON)
        (TypeClass::Json, Value::Int(i)) if (*i as f64) as i128 != *i => {
            return Err(invalid(
                "json",
                &i.to_string(),
                "a JSON number with more precision than a double holds (not I-JSON)",
            ));
        }
        (TypeClass::Json, Value::Int(i)) => json_number(*i as f64)?,
        (TypeClass::Json, Value::Float(f)) => json_number(*f)?,
        // a text value compared as binary (or stored in a binary column, SQLite): its
        // UTF-8 bytes, never its characters read as hex digits
        (TypeClass::Binary, Value::Text(t)) => binary_hex(t.as_bytes(), fmt.fixed_char),
        (TypeClass::Uuid, Value::Bytes(b)) => canonical_uuid(&hex::encode(b))?,
        (_, Value::Text(s)) => return canonical_from_text(fmt, Some(s)),
        (class, _) => {
            return Err(invalid(
                class.name(),
                &format!("{value:?}"),
                "value does not match the column's type class",
            ));
        }
    }))
}

/// A text's canonical form, a slice of it: a fixed-width `CHAR`'s trailing spaces cut,
/// and `None` for an empty text where the dataset compares it as NULL.
fn canonical_text<'a>(fmt: &FieldFormat, v: &'a str) -> Option<&'a str> {
    let t = if fmt.fixed_char {
        v.trim_end_matches(' ')
    } else {
        v
    };
    (!(t.is_empty() && fmt.empty_is_null)).then_some(t)
}

/// [`canonical_from_text`] without a copy where the canonical text is the given text or
/// a slice of it (the hot cases of a row read: texts, and decimals already at their
/// scale).
pub fn canonical_from_text_borrowed<'a>(
    fmt: &FieldFormat,
    value: Option<&'a str>,
) -> Result<Option<std::borrow::Cow<'a, str>>, CanonicalError> {
    use std::borrow::Cow;
    let Some(v) = value else { return Ok(None) };
    match fmt.class {
        TypeClass::Text => Ok(canonical_text(fmt, v).map(Cow::Borrowed)),
        TypeClass::Decimal if !fmt.exact && is_canonical_fixed(v, fmt.scale) => Ok(Some(Cow::Borrowed(v))),
        TypeClass::Integer if is_canonical_integer(v) => Ok(Some(Cow::Borrowed(v))),
        _ => Ok(canonical_from_text(fmt, value)?.map(Cow::Owned)),
    }
}

/// [`canonical_from_text_borrowed`] for a reader that reuses `scratch`: what is not
/// borrowed from `value` is rendered there (the common timestamp shape without
/// allocating), so a fetch allocates nothing per value in the common cases.
pub fn canonical_from_text_in<'a>(
    fmt: &FieldFormat,
    value: Option<&'a str>,
    scratch: &'a mut String,
) -> Result<Option<&'a str>, CanonicalError> {
    use std::borrow::Cow;
    let Some(v) = value else { return Ok(None) };
    scratch.clear();
    let with_zone = match fmt.class {
        TypeClass::Timestamp => Some(false),
        TypeClass::TimestampTz => Some(true),
        _ => None,
    };
    if let Some(with_zone) = with_zone
        && fast_timestamp_into(v, fmt.scale, with_zone, scratch)
    {
        return Ok(Some(scratch.as_str()));
    }
    Ok(match canonical_from_text_borrowed(fmt, Some(v))? {
        None => None,
        Some(Cow::Borrowed(b)) => Some(b),
        Some(Cow::Owned(o)) => {
            *scratch = o;
            Some(scratch.as_str())
        }
    })
}

/// Renders a value given as text the way a user (or a driver's text protocol) writes it:
/// `"1250.5"`, `"2024-03-15 14:30:00.123456"`, `"2024-03-15T16:30:00.1+02:00"`, hex for binary.
pub fn canonical_from_text(fmt: &FieldFormat, value: Option<&str>) -> Result<Option<String>, CanonicalError> {
    let Some(v) = value else { return Ok(None) };
    let out = match fmt.class {
        TypeClass::Integer => canonical_integer(v)?,
        TypeClass::Decimal => decimal_text(v, fmt)?,
        TypeClass::Float => match v {
            "NaN" => "NaN".to_string(),
            "Infinity" | "inf" | "+Infinity" => "Infinity".to_string(),
            "-Infinity" | "-inf" => "-Infinity".to_string(),
            _ => canonical_float(
                v.parse::<f64>()
                    .map_err(|_| invalid("float", v, "not a number"))?,
                fmt.scale,
            ),
        },
        TypeClass::Boolean => match v.to_ascii_lowercase().as_str() {
            "true" | "t" | "1" => "1".to_string(),
            "false" | "f" | "0" => "0".to_string(),
            // an integer compared as a boolean: by value (see canonical_value)
            _ => canonical_integer(v)
                .map_err(|_| invalid("boolean", v, "expected true, false or an integer"))?,
        },
        TypeClass::Text => return Ok(canonical_text(fmt, v).map(str::to_string)),
        TypeClass::Date => canonical_date(v)?,
        TypeClass::Timestamp => canonical_timestamp(v, fmt.scale, false)?,
        TypeClass::TimestampTz => canonical_timestamp(v, fmt.scale, true)?,
        TypeClass::Time => canonical_time(v, fmt.scale)?,
        TypeClass::Uuid => canonical_uuid(v)?,
        TypeClass::Binary => {
            let bytes = hex::decode(v).map_err(|_| invalid("binary", v, "expected hex digits"))?;
            binary_hex(&bytes, fmt.fixed_char)
        }
        TypeClass::Json => crate::jcs::canonical_json(v).map_err(|reason| invalid("json", v, reason))?,
        TypeClass::Other => return Err(CanonicalError::Unsupported("other")),
    };
    Ok(Some(out))
}

/// Lowercase hex; a fixed-length BINARY(n) drops its trailing `0x00` padding.
pub fn binary_hex(b: &[u8], fixed: bool) -> String {
    let end = if fixed {
        b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)
    } else {
        b.len()
    };
    hex::encode(&b[..end])
}

fn json_number(f: f64) -> Result<String, CanonicalError> {
    if !f.is_finite() {
        return Err(invalid(
            "json",
            &f.to_string(),
            "a JSON number outside double range",
        ));
    }
    let mut out = String::new();
    crate::jcs::push_number(&mut out, f);
    Ok(out)
}

/// The token of a non-finite float, or `None` for a finite one.
fn float_token(f: f64) -> Option<&'static str> {
    if f.is_nan() {
        Some("NaN")
    } else if f.is_infinite() {
        Some(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        None
    }
}

/// A decimal's text: PostgreSQL's `NaN` and infinities as tokens, otherwise the
/// exact normalised form or fixed point at the resolved scale.
fn decimal_text(v: &str, fmt: &FieldFormat) -> Result<String, CanonicalError> {
    match v.trim() {
        "NaN" => return Ok("NaN".to_string()),
        "Infinity" | "+Infinity" => return Ok("Infinity".to_string()),
        "-Infinity" => return Ok("-Infinity".to_string()),
        _ => {}
    }
    if fmt.exact {
        exact_decimal(v)
    } else {
        fixed_point(v, fmt.scale)
    }
}

/// The exact normalised form of a decimal: no exponent, no leading zeros, trailing
/// fractional zeros and a trailing point removed, `-0` → `0` (`10.500` → `10.5`,
/// `10.00` → `10`, `1.5e3` → `1500`). Nothing is rounded.
pub fn exact_decimal(v: &str) -> Result<String, CanonicalError> {
    let s = v.trim();
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i64>().unwrap_or(i64::MAX)),
        None => (s, 0),
    };
    let frac_len = mantissa.split_once('.').map_or(0, |(_, f)| f.len()) as i64;
    // the fractional digits the value really has: rendering at that scale rounds nothing
    let scale = frac_len.saturating_sub(exp).clamp(0, 20_000) as u32;
    let fixed = fixed_point(s, scale)?;
    let out = if fixed.contains('.') {
        fixed.trim_end_matches('0').trim_end_matches('.')
    } else {
        fixed.as_str()
    };
    Ok(if out == "-0" {
        "0".to_string()
    } else {
        out.to_string()
    })
}

fn canonical_integer(v: &str) -> Result<String, CanonicalError> {
    v.trim()
        .parse::<i128>()
        .map(|i| i.to_string())
        .map_err(|_| invalid("integer", v, "not an integer"))
}

/// Whether `s` already is what [`canonical_integer`] renders: an optional `-` and up to
/// 20 digits (far inside `i128`) without a leading zero, or a single `0`.
fn is_canonical_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s).as_bytes();
    match digits {
        [b'0'] => digits.len() == s.len(),
        [first, ..] => *first != b'0' && digits.len() <= 20 && digits.iter().all(u8::is_ascii_digit),
        [] => false,
    }
}

/// A float is rendered from its shortest round-trip decimal (ties between two shortest
/// candidates to the even digit, as every engine prints them), rounded half away from
/// zero to `scale` digits.
pub fn canonical_float(f: f64, scale: u32) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    fixed_point(&crate::shortest::shortest_decimal(f), scale)
        .expect("a finite double's shortest decimal is plain")
}

/// Whether `s` already is the fixed-point text at `scale` (the common case of a decimal
/// column read at its own scale): an optional `-`, integer digits without a leading
/// zero (or a single `0`), and exactly `scale` fractional digits; never a negative zero.
fn is_canonical_fixed(s: &str, scale: u32) -> bool {
    let b = s.as_bytes();
    let (neg, b) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    let (int, frac) = match b.iter().position(|&c| c == b'.') {
        Some(i) => (&b[..i], Some(&b[i + 1..])),
        None => (b, None),
    };
    let frac_ok = match (scale, frac) {
        (0, None) => true,
        (n, Some(f)) if n > 0 => f.len() == n as usize && f.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let int_ok = !int.is_empty() && int.iter().all(u8::is_ascii_digit) && (int[0] != b'0' || int.len() == 1);
    let zero = int == b"0" && frac.is_none_or(|f| f.iter().all(|&c| c == b'0'));
    frac_ok && int_ok && !(neg && zero)
}

/// Fixed point at `scale` digits, rounded half away from zero, no exponent, `-0` → `0`.
/// Works on the digit string, so any precision (38 digits and beyond) is exact.
pub fn fixed_point(v: &str, scale: u32) -> Result<String, CanonicalError> {
    let bad = || {
        invalid(
            "decimal",
            v,
            "expected digits with an optional sign, point and exponent",
        )
    };
    let s = v.trim();
    if is_canonical_fixed(s, scale) {
        return Ok(s.to_string());
    }
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i64>().map_err(|_| bad())?),
        None => (s, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    // digits × 10^(exp - frac_len): shift into (integer digits, fractional digits)
    let mut digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = int_part.len() as i64 + exp; // position of the decimal point in `digits`
    if exp.abs() > 10_000 {
        return Err(bad());
    }
    let scale = scale as i64;
    // we need digits up to index point + scale (exclusive), plus one rounding digit
    let keep = point + scale;
    let mut lead_pad = 0i64;
    if keep < 0 {
        // every digit lies below the rounding position: the value rounds to zero
        // unless the first digit is at exactly the rounding position (impossible here)
        digits.clear();
    }
    let mut point = point;
    if point < 1 {
        lead_pad = 1 - point;
        point = 1;
    }
    let mut d: Vec<u8> = std::iter::repeat_n(0u8, lead_pad as usize)
        .chain(digits)
        .collect();
    let keep = (point + scale) as usize;
    if d.len() < keep + 1 {
        d.resize(keep + 1, 0);
    }
    let round_up = d[keep] >= 5;
    d.truncate(keep);
    if round_up {
        let mut i = d.len();
        loop {
            if i == 0 {
                d.insert(0, 1);
                point += 1;
                break;
            }
            i -= 1;
            if d[i] == 9 {
                d[i] = 0;
            } else {
                d[i] += 1;
                break;
            }
        }
    }
    let point = point as usize;
    let int_digits = &d[..point];
    let frac_digits = &d[point..];
    let first_nonzero = int_digits
        .iter()
        .position(|&x| x != 0)
        .unwrap_or(int_digits.len());
    let mut out = String::with_capacity(d.len() + 2);
    let is_zero = d.iter().all(|&x| x == 0);
    if neg && !is_zero {
        out.push('-');
    }
    if first_nonzero == int_digits.len() {
        out.push('0');
    } else {
        for &x in &int_digits[first_nonzero..] {
            out.push((b'0' + x) as char);
        }
    }
    if !frac_digits.is_empty() {
        out.push('.');
        for &x in frac_digits {
            out.push((b'0' + x) as char);
        }
    }
    Ok(out)
}

fn parse_civil(v: &str, whole: &str, class: &'static str) -> Result<CivilDate, CanonicalError> {
    let (d, bc) = civil::strip_era(v);
    civil::parse_date(d, bc).ok_or_else(|| {
        invalid(
            class,
            whole,
            "expected YYYY-MM-DD (an expanded year, BC, or infinity)",
        )
    })
}

fn canonical_date(v: &str) -> Result<String, CanonicalError> {
    let d = parse_civil(v.trim(), v, "date")?;
    let mut out = String::with_capacity(10);
    d.push(&mut out);
    Ok(out)
}

/// A clock reading: negative (durations only), seconds, fraction digits.
type Clock<'a> = (bool, i64, &'a str);

/// Splits `[-]HH:MM:SS[.fffffffff]`. Timestamps take hours 0–23; `duration` (the time
/// class: PostgreSQL's `24:00:00`, MySQL's TIME up to `838:59:59` either side of zero)
/// takes a sign and up to three hour digits. A time is rendered by its value.
fn parse_hms<'a>(
    v: &'a str,
    whole: &str,
    class: &'static str,
    duration: bool,
) -> Result<Clock<'a>, CanonicalError> {
    let bad = || invalid(class, whole, "expected HH:MM:SS with up to 9 fractional digits");
    let (neg, v) = match v.strip_prefix('-') {
        Some(rest) if duration => (true, rest),
        _ => (false, v),
    };
    let (hms, frac) = v.split_once('.').unwrap_or((v, ""));
    let mut parts = hms.split(':');
    let (Some(h), Some(m), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let hour_digits = if duration { 2..=3 } else { 2..=2 };
    if !hour_digits.contains(&h.len())
        || m.len() != 2
        || s.len() != 2
        || frac.len() > 9
        || ![h, m, s, frac]
            .iter()
            .all(|p| p.bytes().all(|c| c.is_ascii_digit()))
    {
        return Err(bad());
    }
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    let s: i64 = s.parse().map_err(|_| bad())?;
    let max_hour = if duration { 838 } else { 23 };
    if h > max_hour || m > 59 || s > 59 {
        return Err(bad());
    }
    let zero = h == 0 && m == 0 && s == 0 && frac.bytes().all(|c| c == b'0');
    Ok((neg && !zero, h * 3600 + m * 60 + s, frac))
}

/// `.` + the first `precision` digits (cut, never rounded, zero-padded); nothing at precision 0.
fn push_fraction(out: &mut String, digits: &str, precision: u32) {
    let p = precision.min(MAX_TIME_PRECISION) as usize;
    if p == 0 {
        return;
    }
    out.push('.');
    let cut = &digits[..digits.len().min(p)];
    out.push_str(cut);
    for _ in cut.len()..p {
        out.push('0');
    }
}

/// The offset in seconds of a zone suffix: `Z`, `+HH`, `+HHMM`, `+HH:MM`, `+HH:MM:SS`.
fn parse_offset(z: &str, whole: &str, class: &'static str) -> Result<i64, CanonicalError> {
    if z == "Z" {
        return Ok(0);
    }
    let bad = || invalid(class, whole, "offset must be Z, +HH, +HHMM or +HH:MM");
    let sign = match z.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let digits: String = z[1..].chars().filter(|c| *c != ':').collect();
    if !matches!(digits.len(), 2 | 4 | 6) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n = |r: std::ops::Range<usize>| {
        digits
            .get(r)
            .map_or(Ok(0), |d| d.parse::<i64>().map_err(|_| bad()))
    };
    Ok(sign * (n(0..2)? * 3600 + n(2..4)? * 60 + n(4..6)?))
}

/// The common shape, `YYYY-MM-DD HH:MM:SS[.f…]` in years 0001-9999 (with a zero UTC
/// offset where the class has a zone), rendered without the general parser: it is the
/// hot path of every in-process read of a timestamp column. `None` for anything else,
/// which the general path then renders (or refuses) the same way.
fn fast_timestamp(v: &str, precision: u32, with_zone: bool) -> Option<String> {
    let mut out = String::with_capacity(32);
    fast_timestamp_into(v, precision, with_zone, &mut out).then_some(out)
}

/// [`fast_timestamp`] appended to `out`; `false`, with nothing written, for any other shape.
fn fast_timestamp_into(v: &str, precision: u32, with_zone: bool, out: &mut String) -> bool {
    fast_timestamp_parts(v, with_zone).is_some_and(|frac| {
        out.push_str(&v[..10]);
        out.push('T');
        out.push_str(&v[11..19]);
        push_fraction(out, frac, precision);
        if with_zone {
            out.push('Z');
        }
        true
    })
}

/// The fraction digits of a timestamp text in the common shape, `None` for any other.
fn fast_timestamp_parts(v: &str, with_zone: bool) -> Option<&str> {
    let b = v.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b' ' | b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if y == 0
        || !(1..=12).contains(&mo)
        || d == 0
        || d > u32::from(civil::days_in_month(i64::from(y), mo as u8))
    {
        return None;
    }
    if h > 23 || mi > 59 || se > 59 {
        return None;
    }
    let mut rest = &v[19..];
    let mut frac = "";
    if let Some(f) = rest.strip_prefix('.') {
        let n = f.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return None;
        }
        frac = &f[..n];
        rest = &f[n..];
    }
    match (with_zone, rest) {
        (false, "") | (true, "Z" | "+00" | "+00:00" | "+0000") => Some(frac),
        _ => None,
    }
}

fn canonical_timestamp(v: &str, precision: u32, with_zone: bool) -> Result<String, CanonicalError> {
    match fast_timestamp(v, precision, with_zone) {
        Some(out) => Ok(out),
        None => general_timestamp(v, precision, with_zone),
    }
}

fn general_timestamp(v: &str, precision: u32, with_zone: bool) -> Result<String, CanonicalError> {
    let class = if with_zone { "timestamptz" } else { "timestamp" };
    let (s, bc) = civil::strip_era(v.trim());
    match civil::parse_date(s, bc) {
        Some(d) if d.is_infinite() => {
            let mut out = String::new();
            d.push(&mut out);
            return Ok(out);
        }
        _ => {}
    }
    // the date ends at the first space or T after its year (which may carry a sign)
    let split = s
        .char_indices()
        .skip(1)
        .find(|(_, c)| *c == ' ' || *c == 'T')
        .map(|(i, _)| i)
        .ok_or_else(|| invalid(class, v, "expected YYYY-MM-DD HH:MM:SS[.f][offset]"))?;
    let date = civil::parse_date(&s[..split], bc)
        .ok_or_else(|| invalid(class, v, "expected YYYY-MM-DD HH:MM:SS[.f][offset]"))?;
    let rest = &s[split + 1..];
    let (clock, zone) = match rest.find(['Z', '+', '-']) {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let (_, secs, frac) = parse_hms(clock, v, class, false)?;
    let offset = match (zone, with_zone) {
        (None, false) => 0,
        (Some(_), false) => {
            return Err(invalid(
                class,
                v,
                "a timestamp without time zone cannot carry an offset",
            ));
        }
        (None, true) => {
            return Err(invalid(
                class,
                v,
                "a timestamp with time zone needs an offset (Z or +HH:MM)",
            ));
        }
        (Some(z), true) => parse_offset(z, v, class)?,
    };
    let (date, secs) = match date {
        // already in UTC (the common case) needs no calendar arithmetic
        _ if offset == 0 => (date, secs),
        CivilDate::Day { year, month, day } => {
            let t = civil::days_from_civil(year, month, day) * 86_400 + secs - offset;
            let (year, month, day) = civil::civil_from_days(t.div_euclid(86_400));
            (CivilDate::Day { year, month, day }, t.rem_euclid(86_400))
        }
        // a MySQL zero date is no instant: kept by value, as the engine's SQL keeps it
        _ => (date, secs),
    };
    let mut out = String::with_capacity(32);
    date.push(&mut out);
    out.push('T');
    push_clock(&mut out, false, secs);
    push_fraction(&mut out, frac, precision);
    if with_zone {
        out.push('Z');
    }
    Ok(out)
}

/// `n` as at least `width` decimal digits (zero-padded), without allocating (hot: a
/// timestamp pushes five of these per row, MySQL's binary integers one per field).
pub fn push_digits(out: &mut String, n: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(n);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

/// `v` in decimal with its sign: the canonical form of an integer.
pub fn push_integer(out: &mut String, v: i64) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// A date and clock reading as a binary protocol carries them (MySQL's `DATE` and
/// `DATETIME`: a year, month, day, hour, minute, second and microseconds, each a number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DateTimeFields {
    pub year: u16,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
    pub micros: u32,
}

impl DateTimeFields {
    /// A calendar day of years 0001–9999: the dates rendered here. Zero dates, zero
    /// months or days and anything out of range are not, and go through their text.
    fn is_plain_date(&self) -> bool {
        (1..=9999).contains(&self.year)
            && (1..=12).contains(&self.month)
            && self.day >= 1
            && self.day <= civil::days_in_month(i64::from(self.year), self.month)
    }

    /// Appends the canonical `date` of these fields, as [`canonical_from_text`] renders
    /// their text `YYYY-MM-DD`; `false`, with nothing written, where the date is not a
    /// plain one (the caller renders the text instead).
    pub fn push_canonical_date(&self, out: &mut String) -> bool {
        if !self.is_plain_date() {
            return false;
        }
        let date = CivilDate::Day {
            year: i64::from(self.year),
            month: self.month,
            day: self.day,
        };
        date.push(out);
        true
    }

    /// Appends the canonical `timestamp` (without zone) of these fields at `precision`
    /// fractional digits, as [`canonical_from_text`] renders their text
    /// `YYYY-MM-DD HH:MM:SS[.ffffff]`; `false`, with nothing written, where the date is
    /// not a plain one or the clock not a time of day (the caller renders the text).
    pub fn push_canonical_timestamp(&self, out: &mut String, precision: u32) -> bool {
        if !self.is_plain_date()
            || self.hour > 23
            || self.minute > 59
            || self.second > 59
            || self.micros > 999_999
        {
            return false;
        }
        self.push_canonical_date(out);
        out.push('T');
        push_clock(
            out,
            false,
            i64::from(self.hour) * 3600 + i64::from(self.minute) * 60 + i64::from(self.second),
        );
        // the six microsecond digits, cut or zero-padded to the precision
        let mut digits = [b'0'; 6];
        let mut m = self.micros;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (m % 10) as u8;
            m /= 10;
        }
        push_fraction(
            out,
            std::str::from_utf8(&digits).expect("ASCII digits"),
            precision,
        );
        true
    }
}

/// `[-]HH:MM:SS` (hours past 24 for durations).
fn push_clock(out: &mut String, neg: bool, secs: i64) {
    if neg {
        out.push('-');
    }
    let a = secs.unsigned_abs();
    push_digits(out, a / 3600, 2);
    out.push(':');
    push_digits(out, a / 60 % 60, 2);
    out.push(':');
    push_digits(out, a % 60, 2);
}

fn canonical_time(v: &str, precision: u32) -> Result<String, CanonicalError> {
    let s = v.trim();
    let (neg, secs, frac) = parse_hms(s, v, "time", true)?;
    let mut out = String::with_capacity(18);
    push_clock(&mut out, neg, secs);
    push_fraction(&mut out, frac, precision);
    Ok(out)
}

fn canonical_uuid(v: &str) -> Result<String, CanonicalError> {
    let hexes: String = v.trim().chars().filter(|c| *c != '-').collect();
    if hexes.len() != 32 || !hexes.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(
            "uuid",
            v,
            "expected 32 hex digits, optionally hyphenated",
        ));
    }
    let h = hexes.to_ascii_lowercase();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// Appends one field of a row string: `<octet length>:<text>`, or `~` for NULL.
pub fn push_field(row: &mut String, canonical: Option<&str>) {
    match canonical {
        None => row.push('~'),
        Some(text) => {
            // the decimal length (hot: once per field, and nearly always one or two digits)
            let n = text.len();
            let digit = |d: usize| char::from(b'0' + (d % 10) as u8);
            if n < 10 {
                row.push(digit(n));
            } else if n < 100 {
                row.push(digit(n / 10));
                row.push(digit(n));
            } else {
                row.push_str(itoa::Buffer::new().format(n));
            }
            row.push(':');
            row.push_str(text);
        }
    }
}

/// The row string of already-canonical fields, in the resolved column order.
pub fn row_string<'a>(fields: impl IntoIterator<Item = Option<&'a str>>) -> String {
    let mut row = String::with_capacity(128);
    for f in fields {
        push_field(&mut row, f);
    }
    row
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Strategy;

    /// The length prefix has its own short paths for one and two digits: every length
    /// across them and beyond is written as its decimal digits.
    #[test]
    fn a_field_is_its_octet_length_colon_and_text() {
        for n in (0..=1000).chain([9_999, 10_000, 123_456]) {
            let text = "é".repeat(n / 2) + &"x".repeat(n % 2);
            assert_eq!(text.len(), n);
            let mut row = String::from("~");
            super::push_field(&mut row, Some(&text));
            assert_eq!(row, format!("~{n}:{text}"));
        }
        let mut row = String::new();
        super::push_field(&mut row, None);
        assert_eq!(row, "~");
    }

    proptest::proptest! {
        // the borrowed form is only ever a shortcut: same text, same errors
        #[test]
        fn borrowed_rendering_equals_the_owned_one(
            v in proptest::prop_oneof![
                "[ 0-9.eE+-]{0,12}",
                "-?[0-9]{1,6}\\.[0-9]{0,4}",
                "[+-]?[0-9]{1,24}",
                "[a-zë ~:]{0,8}",
                proptest::strategy::Just("NaN".to_string()),
                "[0-9]{4}-[01][0-9]-[0-3][0-9][ T][0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{0,10})?(Z|[+-]00(:?00)?|[+-]01:30)?",
                "-?[0-9]{5}-0[1-9]-[12][0-9] [0-2][0-9]:00:00( BC)?",
            ],
            scale in 0u32..4,
            fixed in proptest::bool::ANY,
            empty_null in proptest::bool::ANY,
            exact in proptest::bool::ANY,
        ) {
            let mut formats = vec![
                FieldFormat::new(TypeClass::Text).fixed_char(fixed).empty_is_null(empty_null),
                FieldFormat::new(TypeClass::Decimal).with_scale(scale),
                FieldFormat::new(TypeClass::Integer),
            ];
            if exact {
                formats.push(FieldFormat::new(TypeClass::Decimal).exact(true));
            }
            for class in [TypeClass::Timestamp, TypeClass::TimestampTz, TypeClass::Date] {
                formats.push(FieldFormat::new(class).with_scale(scale * 3));
            }
            for f in &formats {
                let owned = canonical_from_text(f, Some(&v)).map_err(|e| e.to_string());
                let borrowed = canonical_from_text_borrowed(f, Some(&v))
                    .map(|c| c.map(|c| c.into_owned()))
                    .map_err(|e| e.to_string());
                proptest::prop_assert_eq!(&owned, &borrowed, "{:?} of {:?}", f, v);
                let mut scratch = String::from("left over");
                let reused = canonical_from_text_in(f, Some(&v), &mut scratch)
                    .map(|c| c.map(str::to_string))
                    .map_err(|e| e.to_string());
                proptest::prop_assert_eq!(&owned, &reused, "{:?} of {:?}", f, v);
            }
        }
    }

    proptest::proptest! {
        // binary date and datetime fields rendered directly are what their text renders
        // to, at every precision and however many fraction digits the text shows; the
        // fields that are no plain date or time of day are left to the text
        #[test]
        fn datetime_fields_render_as_their_text_does(
            year in proptest::prop_oneof![0u16..=3, 1u16..=9999, 9998u16..=10001, proptest::num::u16::ANY],
            month in 0u8..=13,
            day in 0u8..=32,
            hour in 0u8..=25,
            minute in 0u8..=60,
            second in 0u8..=60,
            micros in proptest::prop_oneof![
                proptest::strategy::Just(0u32),
                0u32..=999_999,
                (0u32..=999).prop_map(|m| m * 1000),
                999_999u32..=1_000_001,
            ],
            precision in 0u32..=10,
            shown in 0u32..=6,
        ) {
            use proptest::{prop_assert, prop_assert_eq};
            let f = DateTimeFields { year, month, day, hour, minute, second, micros };
            let date_text = format!("{year:04}-{month:02}-{day:02}");
            let plain_date = (1..=9999).contains(&year)
                && (1..=12).contains(&month)
                && day >= 1
                && day <= civil::days_in_month(i64::from(year), month);
            let mut out = String::new();
            prop_assert_eq!(f.push_canonical_date(&mut out), plain_date);
            if plain_date {
                let via_text = canonical_from_text(&FieldFormat::new(TypeClass::Date), Some(&date_text));
                prop_assert_eq!(Some(out.clone()), via_text.unwrap());
            } else {
                prop_assert!(out.is_empty());
            }
            let clock = format!("{date_text} {hour:02}:{minute:02}:{second:02}");
            let mut texts = vec![format!("{clock}.{micros:06}")];
            if micros == 0 {
                texts.push(clock.clone());
            }
            if shown > 0 && micros % 10u32.pow(6 - shown) == 0 && micros < 1_000_000 {
                let digits = format!("{micros:06}");
                texts.push(format!("{clock}.{}", &digits[..shown as usize]));
            }
            let plain = plain_date && hour <= 23 && minute <= 59 && second <= 59 && micros <= 999_999;
            let fmt = FieldFormat::new(TypeClass::Timestamp).with_scale(precision);
            let mut out = String::new();
            prop_assert_eq!(f.push_canonical_timestamp(&mut out, precision), plain);
            if plain {
                for t in &texts {
                    let via_text = canonical_from_text(&fmt, Some(t)).map_err(|e| e.to_string());
                    prop_assert_eq!(Ok(Some(out.clone())), via_text, "{:?}", t);
                }
            } else {
                prop_assert!(out.is_empty());
            }
        }

        #[test]
        fn integers_push_as_canonical_text(v in proptest::num::i64::ANY, width in 0usize..=22) {
            let mut out = String::new();
            push_integer(&mut out, v);
            proptest::prop_assert_eq!(&out, &v.to_string());
            proptest::prop_assert!(is_canonical_integer(&out));
            let mut padded = String::new();
            push_digits(&mut padded, v.unsigned_abs(), width);
            proptest::prop_assert_eq!(padded, format!("{:0width$}", v.unsigned_abs()));
        }
    }

    #[test]
    fn empty_strings_are_null_only_where_the_dataset_says_so() {
        let text = FieldFormat::new(TypeClass::Text);
        assert_eq!(canonical_from_text(&text, Some("")).unwrap(), Some(String::new()));
        let oracle_like = text.empty_is_null(true);
        assert_eq!(canonical_from_text(&oracle_like, Some("")).unwrap(), None);
        assert_eq!(canonical_value(&oracle_like, &Value::Text("")).unwrap(), None);
        assert_eq!(
            canonical_from_text(&oracle_like, Some(" ")).unwrap(),
            Some(" ".into())
        );
        // CHAR(n) padding is removed first
        assert_eq!(
            canonical_from_text(&oracle_like.fixed_char(true), Some("   ")).unwrap(),
            None
        );
        // other classes are untouched
        let bin = FieldFormat::new(TypeClass::Binary).empty_is_null(true);
        assert_eq!(canonical_from_text(&bin, Some("")).unwrap(), Some(String::new()));
    }

    use super::*;

    fn fp(v: &str, s: u32) -> String {
        fixed_point(v, s).unwrap()
    }

    #[test]
    fn text_already_at_scale_is_kept_and_everything_else_is_rendered() {
        for (v, scale) in [
            ("123.45", 2),
            ("-0.01", 2),
            ("0.00", 2),
            ("7", 0),
            ("-7", 0),
            ("0", 0),
        ] {
            assert!(is_canonical_fixed(v, scale), "{v}");
            assert_eq!(fp(v, scale), v);
        }
        for (v, scale, want) in [
            ("-0.00", 2, "0.00"),
            ("-0", 0, "0"),
            ("007.10", 2, "7.10"),
            ("1.5", 2, "1.50"),
            ("1.555", 2, "1.56"),
            ("+3.00", 2, "3.00"),
            ("1e2", 0, "100"),
            ("5.", 0, "5"),
            (".50", 2, "0.50"),
        ] {
            assert!(!is_canonical_fixed(v, scale), "{v}");
            assert_eq!(fp(v, scale), want, "{v}");
        }
    }

    #[test]
    fn fixed_point_rounds_half_away_from_zero_and_pads() {
        assert_eq!(fp("1250.5", 2), "1250.50");
        assert_eq!(fp("2.345", 2), "2.35");
        assert_eq!(fp("-2.345", 2), "-2.35");
        assert_eq!(fp("9.995", 2), "10.00");
        assert_eq!(fp("-0.001", 2), "0.00");
        assert_eq!(fp("-0", 0), "0");
        assert_eq!(fp("0.0000001", 6), "0.000000");
        assert_eq!(fp("0.0000005", 6), "0.000001");
        assert_eq!(fp("1e20", 1), "100000000000000000000.0");
        assert_eq!(fp("1.5e-1", 2), "0.15");
        assert_eq!(fp(".5", 0), "1");
        assert_eq!(fp("007", 0), "7");
        assert_eq!(fp("99.5", 0), "100");
        assert!(fixed_point("1.2.3", 2).is_err());
        assert!(fixed_point("", 2).is_err());
        assert!(fixed_point("abc", 2).is_err());
    }

    #[test]
    fn timestamps_cut_and_convert_to_utc() {
        let f = FieldFormat::new(TypeClass::TimestampTz).with_scale(3);
        let c = |v| canonical_from_text(&f, Some(v)).unwrap().unwrap();
        assert_eq!(c("2024-01-01T00:30:00.9999+01:00"), "2023-12-31T23:30:00.999Z");
        assert_eq!(c("2024-01-01 00:30:00-0130"), "2024-01-01T02:00:00.000Z");
        assert!(canonical_from_text(&f, Some("2024-01-01 00:30:00")).is_err());
        let naive = FieldFormat::new(TypeClass::Timestamp);
        assert!(canonical_from_text(&naive, Some("2024-01-01 00:30:00Z")).is_err());
        assert!(canonical_from_text(&naive, Some("2024-02-30 00:30:00")).is_err());
    }

    proptest::proptest! {
        // wherever the fast path renders a timestamp, the general parser renders it alike
        #[test]
        fn the_fast_timestamp_path_agrees_with_the_general_one_everywhere(
            v in "[0-9]{4}-[01][0-9]-[0-3][0-9][ T][0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{0,10})?(Z|[+-]00(:?00)?|[+-]01:30)?",
            precision in 0u32..=10,
            with_zone in proptest::bool::ANY,
        ) {
            if let Some(fast) = fast_timestamp(&v, precision, with_zone) {
                let general = general_timestamp(&v, precision, with_zone).map_err(|e| e.to_string());
                proptest::prop_assert_eq!(Ok(fast), general, "{:?}", v);
            }
        }
    }

    #[test]
    fn the_fast_timestamp_path_agrees_with_the_general_one() {
        let inputs = [
            "2024-03-15 14:30:00",
            "2024-03-15T14:30:00.123456789",
            "2024-02-29 23:59:59.5",
            "0001-01-01 00:00:00",
            "9999-12-31 23:59:59.999999",
            "2024-03-15 14:30:00+00",
            "2024-03-15 14:30:00Z",
            "2024-03-15 14:30:00+00:00",
            "2024-03-15 14:30:00.1+0000",
        ];
        for v in inputs {
            for (p, z) in [(0, false), (3, false), (6, true), (9, true)] {
                let fast = fast_timestamp(v, p, z);
                let general = general_timestamp(v, p, z).ok();
                assert!(
                    fast.is_none() || fast == general,
                    "{v} at {p}: {fast:?} / {general:?}"
                );
            }
        }
        // shapes the fast path leaves to the general one
        for v in [
            "2023-02-29 00:00:00",
            "0000-01-01 00:00:00",
            " 2024-03-15 14:30:00",
            "2024-03-15 24:00:00",
            "2024-03-15 14:30:00 BC",
            "12024-03-15 14:30:00",
            "2024-03-15 14:30:00+01",
            "2024-03-15 14:30:00.",
        ] {
            assert!(
                fast_timestamp(v, 6, true).is_none() && fast_timestamp(v, 6, false).is_none(),
                "{v}"
            );
        }
    }

    #[test]
    fn bad_input_names_the_class_and_value() {
        let f = FieldFormat::new(TypeClass::Uuid);
        let e = canonical_from_text(&f, Some("xyz")).unwrap_err().to_string();
        assert!(e.contains("uuid") && e.contains("xyz"), "{e}");
    }

    #[test]
    fn typed_values_match_their_text_forms() {
        let d = FieldFormat::new(TypeClass::Decimal).with_scale(2);
        assert_eq!(canonical_value(&d, &Value::Int(-7)).unwrap().unwrap(), "-7.00");
        let fl = FieldFormat::new(TypeClass::Float);
        assert_eq!(
            canonical_value(&fl, &Value::Float(0.1)).unwrap().unwrap(),
            "0.100000"
        );
        assert_eq!(
            canonical_value(&fl, &Value::Float(-0.0)).unwrap().unwrap(),
            "0.000000"
        );
        let b = FieldFormat::new(TypeClass::Boolean);
        assert_eq!(canonical_value(&b, &Value::Int(1)).unwrap().unwrap(), "1");
        // TINYINT(1) holding 2: by value, never folded into true
        assert_eq!(canonical_value(&b, &Value::Int(2)).unwrap().unwrap(), "2");
        assert_eq!(canonical_from_text(&b, Some("2")).unwrap().unwrap(), "2");
        let bin = FieldFormat::new(TypeClass::Binary);
        assert_eq!(
            canonical_value(&bin, &Value::Bytes(&[0xDE, 0xAD]))
                .unwrap()
                .unwrap(),
            "dead"
        );
        assert_eq!(canonical_value(&bin, &Value::Null).unwrap(), None);
        // text as binary is its bytes: 'abcd' is 61626364, never the bytes ab cd
        assert_eq!(
            canonical_value(&bin, &Value::Text("abcd")).unwrap().unwrap(),
            "61626364"
        );
    }
}
