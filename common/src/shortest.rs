//! The shortest decimal digits that read back as a given double, with ties between
//! two equally short candidates broken to the even last digit: what PostgreSQL's
//! `float8out`, MySQL's double-to-text, Python's `repr` and ECMAScript (RFC 8785) print.
//! Rust's `{:e}` gives shortest digits too but may take the odd candidate of a tie
//! (`1000000000000000.25` → `…0.3`), so ties are settled here.

/// `(negative, digits, exponent of the first digit)` of a finite non-zero double:
/// `(true, "12345", -7)` for -1.2345e-7.
pub fn shortest_digits(f: f64) -> (bool, String, i32) {
    let sci = format!("{f:e}");
    let (m, e) = sci.split_once('e').expect("exponent form");
    let (neg, m) = m.strip_prefix('-').map_or((false, m), |m| (true, m));
    let digits: String = m.chars().filter(|c| *c != '.').collect();
    let exp: i32 = e.parse().expect("exponent digits");
    if digits.as_bytes()[digits.len() - 1].is_multiple_of(2) {
        return (neg, digits, exp);
    }
    match tie_partner(f.abs(), &digits, exp) {
        Some(even) => (neg, even, exp),
        None => (neg, digits, exp),
    }
}

/// The double's exact decimal value as (digits without trailing zeros, exponent of the
/// first digit), where it has at most 38 significant digits; `None` otherwise (then it
/// cannot lie exactly halfway between two candidates of at most 17 digits).
fn exact_short(x: f64) -> Option<(String, i32)> {
    let bits = x.to_bits();
    let exp_bits = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    let (mut m, mut e) = if exp_bits == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp_bits - 1075)
    };
    if m == 0 {
        return None;
    }
    let tz = m.trailing_zeros();
    m >>= tz;
    e += tz as i32;
    let (n, point) = if e >= 0 {
        // an integer m·2^e: exact in u128 while it fits
        if e > 74 {
            return None;
        }
        ((m as u128) << e, 0)
    } else {
        // m / 2^k = m·5^k / 10^k: exact in u128 for k ≤ 27 (m < 2^53, 5^27 < 2^63)
        let k = -e;
        if k > 27 {
            return None;
        }
        ((m as u128) * 5u128.pow(k as u32), k)
    };
    let text = n.to_string();
    let trimmed = text.trim_end_matches('0');
    let first_exp = text.len() as i32 - 1 - point;
    Some((trimmed.to_string(), first_exp))
}

/// The exact decimal value of a finite double in scientific form (`"125e-3"`), where it
/// has at most 38 significant digits (`None` otherwise, e.g. for 0.1).
pub fn exact_value(f: f64) -> Option<String> {
    if f == 0.0 {
        return Some("0".to_string());
    }
    let (digits, first_exp) = exact_short(f.abs())?;
    let sign = if f < 0.0 { "-" } else { "" };
    Some(format!("{sign}{digits}e{}", first_exp - digits.len() as i32 + 1))
}

/// Where `digits` (odd last digit) is one of two equally near shortest candidates, the
/// other one (whose last digit is then even), if it also reads back as the double.
fn tie_partner(x: f64, digits: &str, exp: i32) -> Option<String> {
    let (exact, exact_exp) = exact_short(x)?;
    let k = digits.len();
    if exact_exp != exp || exact.len() != k + 1 || !exact.ends_with('5') {
        return None;
    }
    // the exact value is prefix + "5": the candidates are prefix and prefix + 1
    let prefix = &exact[..k];
    let other = if prefix == digits {
        bump(digits)?
    } else {
        prefix.to_string()
    };
    if other.len() != k || !other.as_bytes()[k - 1].is_multiple_of(2) {
        return None;
    }
    let text = format!("{}.{}e{exp}", &other[..1], &other[1..]);
    (text.parse::<f64>().ok() == Some(x)).then_some(other)
}

/// A digit string plus one in its last place; `None` on a carry out of the first digit.
fn bump(digits: &str) -> Option<String> {
    let mut b = digits.as_bytes().to_vec();
    let mut i = b.len() - 1;
    loop {
        if b[i] == b'9' {
            b[i] = b'0';
            if i == 0 {
                return None;
            }
            i -= 1;
        } else {
            b[i] += 1;
            break;
        }
    }
    String::from_utf8(b).ok()
}

/// The double as a plain decimal with its shortest (ties-even) digits: `0.1`, `1e20` →
/// `100000000000000000000`, no exponent. For a finite double.
pub fn shortest_decimal(f: f64) -> String {
    if f == 0.0 {
        return "0".to_string();
    }
    let (neg, digits, exp) = shortest_digits(f);
    let mut out = String::with_capacity(digits.len() + 8);
    if neg {
        out.push('-');
    }
    let k = digits.len() as i32;
    if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else if exp + 1 >= k {
        out.push_str(&digits);
        for _ in 0..(exp + 1 - k) {
            out.push('0');
        }
    } else {
        let (int, frac) = digits.split_at((exp + 1) as usize);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // these literals are exact doubles (multiples of 1/8 near 2^50): clippy cannot tell
    #[allow(clippy::excessive_precision)]
    fn ties_go_to_the_even_digit_like_the_engines() {
        // exactly halfway between two 17-digit candidates
        assert_eq!(shortest_decimal(1000000000000000.25), "1000000000000000.2");
        assert_eq!(shortest_decimal(1125899906842624.25), "1125899906842624.2");
        assert_eq!(shortest_decimal(-2182764242667721.25), "-2182764242667721.2");
        assert_eq!(
            shortest_decimal(f64::from_bits(0x43143ff3c1cb0959)),
            "1424953923781206.2"
        );
        // no tie: Rust's digits stand
        assert_eq!(shortest_decimal(0.1), "0.1");
        assert_eq!(shortest_decimal(1e20), "100000000000000000000");
        assert_eq!(shortest_decimal(1.5), "1.5");
        assert_eq!(shortest_decimal(-0.000123), "-0.000123");
        assert_eq!(shortest_decimal(5e-324), format!("0.{}5", "0".repeat(323)));
        assert_eq!(shortest_decimal(123456789.0), "123456789");
    }

    #[test]
    fn every_shortest_decimal_reads_back_as_its_double() {
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f64::from_bits(x);
            if !f.is_finite() || f == 0.0 {
                continue;
            }
            assert_eq!(shortest_decimal(f).parse::<f64>().unwrap(), f, "{f:e}");
        }
    }
}
