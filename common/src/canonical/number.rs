//! Numbers in canonical form: integers, exact and fixed-point decimals, floats at a
//! resolved scale, and JSON numbers.

use super::{CanonicalError, FieldFormat, invalid};

pub(super) fn json_number(f: f64) -> Result<String, CanonicalError> {
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
pub(super) fn float_token(f: f64) -> Option<&'static str> {
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
pub(super) fn decimal_text(v: &str, fmt: &FieldFormat) -> Result<String, CanonicalError> {
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

pub(super) fn canonical_integer(v: &str) -> Result<String, CanonicalError> {
    v.trim()
        .parse::<i128>()
        .map(|i| i.to_string())
        .map_err(|_| invalid("integer", v, "not an integer"))
}

/// Whether `s` already is what [`canonical_integer`] renders: an optional `-` and up to
/// 20 digits (far inside `i128`) without a leading zero, or a single `0`.
pub(super) fn is_canonical_integer(s: &str) -> bool {
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
pub(super) fn is_canonical_fixed(s: &str, scale: u32) -> bool {
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

    proptest::proptest! {
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
}
