//! Dates, timestamps and times in canonical form: the general parser, the fast path
//! of the common timestamp shape, and the fields of a binary protocol.

use super::number::push_digits;
use super::{CanonicalError, MAX_TIME_PRECISION, invalid};
use crate::civil::{self, CivilDate};

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

pub(super) fn canonical_date(v: &str) -> Result<String, CanonicalError> {
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
pub(super) fn fast_timestamp_into(v: &str, precision: u32, with_zone: bool, out: &mut String) -> bool {
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

pub(super) fn canonical_timestamp(
    v: &str,
    precision: u32,
    with_zone: bool,
) -> Result<String, CanonicalError> {
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

    /// Appends the canonical `date` of these fields, as
    /// [`canonical_from_text`](super::canonical_from_text) renders their text
    /// `YYYY-MM-DD`; `false`, with nothing written, where the date is not a plain one
    /// (the caller renders the text instead).
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
    /// fractional digits, as [`canonical_from_text`](super::canonical_from_text) renders
    /// their text `YYYY-MM-DD HH:MM:SS[.ffffff]`; `false`, with nothing written, where
    /// the date is not a plain one or the clock not a time of day (the caller renders
    /// the text).
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

pub(super) fn canonical_time(v: &str, precision: u32) -> Result<String, CanonicalError> {
    let s = v.trim();
    let (neg, secs, frac) = parse_hms(s, v, "time", true)?;
    let mut out = String::with_capacity(18);
    push_clock(&mut out, neg, secs);
    push_fraction(&mut out, frac, precision);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Strategy;

    use super::*;
    use crate::canonical::{FieldFormat, canonical_from_text};
    use crate::types::TypeClass;

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
    }
}
