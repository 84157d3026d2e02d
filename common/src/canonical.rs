//! The canonical form (DESIGN §3): each compared value rendered to one UTF-8 text,
//! identically on every engine, and the injective row string built from those texts.
//!
//! This is the reference encoder. Dialects render the same text in SQL; the agent's
//! in-process path calls these functions directly. `tests/vectors/canonical.json`
//! (written by an independent Python implementation) pins every rule.

use crate::types::TypeClass;

/// Default resolved scale of floats and precision of timestamps and times.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldFormat {
    pub class: TypeClass,
    /// Resolved scale (decimal, float) or fractional-second precision (timestamp, timestamptz, time).
    pub scale: u32,
    /// CHAR(n): trailing spaces removed.
    pub fixed_char: bool,
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
        (TypeClass::Decimal, Value::Int(i)) => fixed_point(&i.to_string(), fmt.scale)?,
        (TypeClass::Float | TypeClass::Decimal, Value::Float(f)) => canonical_float(*f, fmt.scale),
        (TypeClass::Boolean, Value::Bool(b)) => if *b { "1" } else { "0" }.to_string(),
        (TypeClass::Boolean, Value::Int(i)) => match i {
            0 => "0".to_string(),
            1 => "1".to_string(),
            _ => return Err(invalid("boolean", &i.to_string(), "only 0 and 1 are booleans")),
        },
        (TypeClass::Binary, Value::Bytes(b)) => hex::encode(b),
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

/// Renders a value given as text the way a user (or a driver's text protocol) writes it:
/// `"1250.5"`, `"2024-03-15 14:30:00.123456"`, `"2024-03-15T16:30:00.1+02:00"`, hex for binary.
pub fn canonical_from_text(fmt: &FieldFormat, value: Option<&str>) -> Result<Option<String>, CanonicalError> {
    let Some(v) = value else { return Ok(None) };
    let out = match fmt.class {
        TypeClass::Integer => canonical_integer(v)?,
        TypeClass::Decimal => fixed_point(v, fmt.scale)?,
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
            _ => return Err(invalid("boolean", v, "expected true or false")),
        },
        TypeClass::Text => {
            if fmt.fixed_char {
                v.trim_end_matches(' ').to_string()
            } else {
                v.to_string()
            }
        }
        TypeClass::Date => canonical_date(v)?,
        TypeClass::Timestamp => canonical_timestamp(v, fmt.scale, false)?,
        TypeClass::TimestampTz => canonical_timestamp(v, fmt.scale, true)?,
        TypeClass::Time => canonical_time(v, fmt.scale)?,
        TypeClass::Uuid => canonical_uuid(v)?,
        TypeClass::Binary => {
            let bytes = hex::decode(v).map_err(|_| invalid("binary", v, "expected hex digits"))?;
            hex::encode(bytes)
        }
        TypeClass::Other => return Err(CanonicalError::Unsupported("other")),
    };
    Ok(Some(out))
}

fn canonical_integer(v: &str) -> Result<String, CanonicalError> {
    v.trim()
        .parse::<i128>()
        .map(|i| i.to_string())
        .map_err(|_| invalid("integer", v, "not an integer"))
}

/// A float is rendered from its shortest round-trip decimal, rounded half away from
/// zero to `scale` digits. Rust's `Display` for `f64` gives exactly that decimal, with
/// no exponent.
pub fn canonical_float(f: f64, scale: u32) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    fixed_point(&format!("{f}"), scale).expect("Display of a finite f64 is a plain decimal")
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

fn parse_ymd(v: &str, whole: &str) -> Result<(i32, u8, u8), CanonicalError> {
    let bad = || invalid("date", whole, "expected YYYY-MM-DD");
    let b = v.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let y: i32 = v[0..4].parse().map_err(|_| bad())?;
    let m: u8 = v[5..7].parse().map_err(|_| bad())?;
    let d: u8 = v[8..10].parse().map_err(|_| bad())?;
    let month = time::Month::try_from(m).map_err(|_| bad())?;
    time::Date::from_calendar_date(y, month, d).map_err(|_| bad())?;
    if y < 1 {
        return Err(bad());
    }
    Ok((y, m, d))
}

fn canonical_date(v: &str) -> Result<String, CanonicalError> {
    let (y, m, d) = parse_ymd(v.trim(), v)?;
    Ok(format!("{y:04}-{m:02}-{d:02}"))
}

/// Splits `HH:MM:SS[.fffffffff]` into seconds of the day and the fraction digits.
fn parse_hms<'a>(v: &'a str, whole: &str, class: &'static str) -> Result<(u32, &'a str), CanonicalError> {
    let bad = || invalid(class, whole, "expected HH:MM:SS with up to 9 fractional digits");
    let (hms, frac) = v.split_once('.').unwrap_or((v, ""));
    let b = hms.as_bytes();
    if b.len() != 8
        || b[2] != b':'
        || b[5] != b':'
        || frac.len() > 9
        || !frac.bytes().all(|c| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let h: u32 = hms[0..2].parse().map_err(|_| bad())?;
    let m: u32 = hms[3..5].parse().map_err(|_| bad())?;
    let s: u32 = hms[6..8].parse().map_err(|_| bad())?;
    if h > 23 || m > 59 || s > 59 {
        return Err(bad());
    }
    Ok((h * 3600 + m * 60 + s, frac))
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

fn canonical_timestamp(v: &str, precision: u32, with_zone: bool) -> Result<String, CanonicalError> {
    let class = if with_zone { "timestamptz" } else { "timestamp" };
    let s = v.trim();
    if s.len() < 19 || !matches!(s.as_bytes()[10], b' ' | b'T') {
        return Err(invalid(class, v, "expected YYYY-MM-DD HH:MM:SS[.f][offset]"));
    }
    let (y, mo, d) = parse_ymd(&s[..10], v)?;
    let rest = &s[11..];
    // the zone suffix: Z, +HH:MM, -HH:MM, +HH, +HHMM
    let zone_at = rest.find(['Z', '+', '-']);
    let (clock, zone) = match zone_at {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let (secs, frac) = parse_hms(clock, v, class)?;
    let offset_secs: i64 = match (zone, with_zone) {
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
        (Some("Z"), true) => 0,
        (Some(z), true) => {
            let bad = || invalid(class, v, "offset must be Z, +HH, +HHMM or +HH:MM");
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let digits: String = z[1..].chars().filter(|c| *c != ':').collect();
            if !(digits.len() == 2 || digits.len() == 4) || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let hh: i64 = digits[0..2].parse().map_err(|_| bad())?;
            let mm: i64 = if digits.len() == 4 {
                digits[2..4].parse().map_err(|_| bad())?
            } else {
                0
            };
            sign * (hh * 3600 + mm * 60)
        }
    };
    // already in UTC (the common case) needs no calendar arithmetic
    let (y, mo, d, secs) = if offset_secs == 0 {
        (y, mo, d, secs)
    } else {
        let date = time::Date::from_calendar_date(y, time::Month::try_from(mo).expect("validated"), d)
            .expect("validated");
        let local = date.midnight().assume_utc().unix_timestamp() + secs as i64;
        let utc = time::OffsetDateTime::from_unix_timestamp(local - offset_secs)
            .map_err(|_| invalid(class, v, "out of range"))?;
        if utc.year() < 1 || utc.year() > 9999 {
            return Err(invalid(class, v, "outside years 0001-9999 in UTC"));
        }
        let t = utc.time();
        (
            utc.year(),
            utc.month() as u8,
            utc.day(),
            u32::from(t.hour()) * 3600 + u32::from(t.minute()) * 60 + u32::from(t.second()),
        )
    };
    let mut out = String::with_capacity(32);
    push_digits(&mut out, y as u32, 4);
    out.push('-');
    push_digits(&mut out, u32::from(mo), 2);
    out.push('-');
    push_digits(&mut out, u32::from(d), 2);
    out.push('T');
    push_clock(&mut out, secs);
    push_fraction(&mut out, frac, precision);
    if with_zone {
        out.push('Z');
    }
    Ok(out)
}

/// `n` as exactly `width` decimal digits (zero-padded; `n` fits).
fn push_digits(out: &mut String, n: u32, width: u32) {
    for p in (0..width).rev() {
        out.push(char::from(b'0' + (n / 10u32.pow(p) % 10) as u8));
    }
}

/// `HH:MM:SS` of seconds since midnight.
fn push_clock(out: &mut String, secs: u32) {
    push_digits(out, secs / 3600, 2);
    out.push(':');
    push_digits(out, secs / 60 % 60, 2);
    out.push(':');
    push_digits(out, secs % 60, 2);
}

fn canonical_time(v: &str, precision: u32) -> Result<String, CanonicalError> {
    let s = v.trim();
    let (secs, frac) = parse_hms(s, v, "time")?;
    let mut out = String::with_capacity(18);
    push_clock(&mut out, secs);
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
            // the decimal length without the formatting machinery (hot: once per field)
            let mut digits = [0u8; 20];
            let mut n = text.len();
            let mut i = digits.len();
            loop {
                i -= 1;
                digits[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            row.push_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"));
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
        assert!(canonical_value(&b, &Value::Int(2)).is_err());
        let bin = FieldFormat::new(TypeClass::Binary);
        assert_eq!(
            canonical_value(&bin, &Value::Bytes(&[0xDE, 0xAD]))
                .unwrap()
                .unwrap(),
            "dead"
        );
        assert_eq!(canonical_value(&bin, &Value::Null).unwrap(), None);
    }
}
