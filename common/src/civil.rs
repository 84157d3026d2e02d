//! Dates of the canonical form (DESIGN §3) on the proleptic Gregorian calendar with
//! astronomical year numbering (1 BC = year 0), for any year an engine stores:
//! PostgreSQL dates reach 4713 BC and 5874897 AD, beyond the `time` crate's range.
//! Also the tokens that are not calendar dates: PostgreSQL's `infinity` / `-infinity`
//! and MySQL's zero-in-date values (`0000-00-00`, `2024-00-15`), which are kept as
//! they are: distinct from every real date, so rendering them by value is injective.

/// A date as read from an engine's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CivilDate {
    Day {
        year: i64,
        month: u8,
        day: u8,
    },
    Infinity,
    NegInfinity,
    /// MySQL's zero date or a date with a zero month or day, kept as written.
    Zero {
        year: i64,
        month: u8,
        day: u8,
    },
}

pub fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

pub fn days_in_month(year: i64, month: u8) -> u8 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: u8, day: u8) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Appends a year in ISO 8601 form: four digits for 0000–9999, `-0001` before year 0,
/// `+10000` after 9999 (astronomical numbering).
pub fn push_year(out: &mut String, year: i64) {
    if year < 0 {
        out.push('-');
    } else if year > 9999 {
        out.push('+');
    }
    let a = year.unsigned_abs();
    if a < 10_000 {
        // the common case, without allocating
        for d in [a / 1000, a / 100 % 10, a / 10 % 10, a % 10] {
            out.push(char::from(b'0' + d as u8));
        }
    } else {
        out.push_str(&a.to_string());
    }
}

fn push2(out: &mut String, n: u8) {
    out.push(char::from(b'0' + n / 10));
    out.push(char::from(b'0' + n % 10));
}

impl CivilDate {
    /// `YYYY-MM-DD` with an expanded year where needed, or the token.
    pub fn push(&self, out: &mut String) {
        match *self {
            CivilDate::Infinity => out.push_str("infinity"),
            CivilDate::NegInfinity => out.push_str("-infinity"),
            CivilDate::Day { year, month, day } | CivilDate::Zero { year, month, day } => {
                push_year(out, year);
                out.push('-');
                push2(out, month);
                out.push('-');
                push2(out, day);
            }
        }
    }

    pub fn is_infinite(&self) -> bool {
        matches!(self, CivilDate::Infinity | CivilDate::NegInfinity)
    }
}

/// Parses the date part of an engine's text: `YYYY-MM-DD` (four or more year digits,
/// an optional `+`/`-` sign for ISO expanded years), `infinity`, `-infinity`. A
/// trailing ` BC` is handled by the caller ([`strip_era`]). `None` when malformed.
pub fn parse_date(v: &str, bc: bool) -> Option<CivilDate> {
    match v {
        "infinity" | "+infinity" if !bc => return Some(CivilDate::Infinity),
        "-infinity" if !bc => return Some(CivilDate::NegInfinity),
        _ => {}
    }
    let (sign, body) = match v.as_bytes().first()? {
        b'-' => (-1, &v[1..]),
        b'+' => (1, &v[1..]),
        _ => (1, v),
    };
    let (y, rest) = body.split_once('-')?;
    let (m, d) = rest.split_once('-')?;
    if y.len() < 4 || y.len() > 9 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    if ![y, m, d].iter().all(|p| p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let mut year: i64 = y.parse().ok()?;
    let month: u8 = m.parse().ok()?;
    let day: u8 = d.parse().ok()?;
    if sign < 0 {
        if bc {
            return None;
        }
        year = -year;
    }
    if bc {
        // 1 BC is year 0, 2 BC is -1; there is no year 0 BC
        if year < 1 {
            return None;
        }
        year = 1 - year;
    }
    if (month == 0 || day == 0) && !bc && sign > 0 && y.len() == 4 && month <= 12 && day <= 31 {
        return Some(CivilDate::Zero { year, month, day });
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(CivilDate::Day { year, month, day })
}

/// Splits PostgreSQL's era suffix off: `("2000-01-01", true)` for `2000-01-01 BC`.
pub fn strip_era(v: &str) -> (&str, bool) {
    match v.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (v.strip_suffix(" AD").unwrap_or(v), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(d: CivilDate) -> String {
        let mut s = String::new();
        d.push(&mut s);
        s
    }

    #[test]
    fn day_counts_round_trip_across_eras() {
        for (y, m, d) in [
            (1970, 1, 1),
            (2000, 2, 29),
            (0, 1, 1),
            (-4712, 1, 1),
            (5_874_897, 12, 31),
            (1, 1, 1),
        ] {
            let n = days_from_civil(y, m, d);
            assert_eq!(civil_from_days(n), (y, m, d));
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28), 2);
        // year 0 (1 BC) is a leap year in the proleptic calendar
        assert!(is_leap(0) && is_leap(-4) && !is_leap(-1) && !is_leap(1900) && is_leap(2000));
    }

    #[test]
    fn eras_and_expanded_years_render_astronomically() {
        let p = |v: &str| {
            let (d, bc) = strip_era(v);
            text(parse_date(d, bc).unwrap())
        };
        assert_eq!(p("2000-01-01 BC"), "-1999-01-01");
        assert_eq!(p("0001-01-01 BC"), "0000-01-01");
        assert_eq!(p("0002-12-31 BC"), "-0001-12-31");
        assert_eq!(p("10000-01-01"), "+10000-01-01");
        assert_eq!(p("+10000-01-01"), "+10000-01-01");
        assert_eq!(p("-0001-12-31"), "-0001-12-31");
        assert_eq!(p("2024-02-29"), "2024-02-29");
        assert_eq!(p("infinity"), "infinity");
        assert_eq!(p("-infinity"), "-infinity");
        assert_eq!(p("0000-00-00"), "0000-00-00");
        assert_eq!(p("2024-00-15"), "2024-00-15");
        for bad in [
            "2023-02-29",
            "2024-13-01",
            "24-01-01",
            "2024-1-01",
            "0000-01-01 BC",
            "x",
            "2024-00-32",
        ] {
            let (d, bc) = strip_era(bad);
            assert!(parse_date(d, bc).is_none(), "{bad}");
        }
    }
}
