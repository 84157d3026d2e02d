//! The canonical form (DESIGN §3): each compared value rendered to one UTF-8 text,
//! identically on every engine, and the injective row string built from those texts.
//!
//! This is the reference encoder. Dialects render the same text in SQL; the agent's
//! in-process path calls these functions directly. `tests/vectors/canonical.json`
//! (written by an independent Python implementation) pins every rule.

use crate::types::TypeClass;

mod number;
mod time;

pub use number::{canonical_float, exact_decimal, fixed_point, push_digits, push_integer};
use number::{
    canonical_integer, decimal_text, float_token, is_canonical_fixed, is_canonical_integer, json_number,
};
pub use time::DateTimeFields;
use time::{canonical_date, canonical_time, canonical_timestamp, fast_timestamp_into};

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
