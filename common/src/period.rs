//! Calendar periods for the time strategy. A period is named by a label: the canonical
//! text (DESIGN §3) of its start, cut to the granularity. Labels sort in time order as
//! plain strings, and every engine computes them from the same canonical text.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl Granularity {
    pub fn name(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Week => "week",
            Granularity::Month => "month",
            Granularity::Quarter => "quarter",
            Granularity::Year => "year",
        }
    }

    pub fn parse(s: &str) -> Option<Granularity> {
        [
            Granularity::Hour,
            Granularity::Day,
            Granularity::Week,
            Granularity::Month,
            Granularity::Quarter,
            Granularity::Year,
        ]
        .into_iter()
        .find(|g| g.name() == s)
    }

    /// How many leading characters of the canonical text name a period (week and
    /// quarter are computed, not cut).
    pub fn prefix_len(self) -> usize {
        match self {
            Granularity::Hour => 13,
            Granularity::Day | Granularity::Week => 10,
            Granularity::Month | Granularity::Quarter => 7,
            Granularity::Year => 4,
        }
    }
}

/// The period label of a canonical date/timestamp text (`None`: NULL → the empty label).
///
/// This is the one definition every path computes (the agent in-process, and each
/// dialect's SQL in `agent/src/dialect/mod.rs`, `period_expr`), so it is written with
/// the operations SQL has: fixed substrings and integer arithmetic.
///
/// - A text that does not start with a digit (`infinity`, `-infinity`, a signed
///   expanded year: before 1 BC or after 9999) is a period of its own at every
///   granularity, labelled by the whole text.
/// - Otherwise (`YYYY-MM-DD[THH...]`): hour, day, month and year are the first 13, 10,
///   7 and 4 characters; a quarter is `YYYY-` and its first month (`01`, `04`, `07`,
///   `10`), a month outside 01-12 (MySQL's `00`) its own quarter; a week is its
///   Monday in the proleptic Gregorian calendar (year 0000 is a leap year, the Monday
///   before 0000-01-03 is `-0001-12-27`), and a text that is no calendar date (MySQL's
///   `2024-00-15`, `2024-05-00`, `0000-00-00`) has its day as its week.
pub fn period_label(canonical: Option<&str>, g: Granularity) -> Option<String> {
    let c = canonical?;
    if !c.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return Some(c.to_string());
    }
    let cut = |n: usize| c.get(..n.min(c.len())).unwrap_or(c).to_string();
    let label = match g {
        Granularity::Hour | Granularity::Day | Granularity::Month | Granularity::Year => cut(g.prefix_len()),
        Granularity::Quarter => {
            let first = match c.get(5..7) {
                Some("01" | "02" | "03") => "01",
                Some("04" | "05" | "06") => "04",
                Some("07" | "08" | "09") => "07",
                Some("10" | "11" | "12") => "10",
                Some(m) => m,
                None => return Some(c.to_string()),
            };
            format!("{}{first}", cut(5))
        }
        Granularity::Week => week_label(c).unwrap_or_else(|| cut(10)),
    };
    Some(label)
}

/// The Monday of a plain canonical date's week, `None` where the text is no calendar
/// date. The same steps as the SQL: Sakamoto's weekday with the year moved on by 400
/// (the calendar repeats every 400 years, so nothing is negative), then the Monday's
/// day in this month or the previous one.
fn week_label(c: &str) -> Option<String> {
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = c.get(r)?;
        t.bytes().all(|b| b.is_ascii_digit()).then(|| t.parse().ok())?
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    const T: [i64; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
    let yp = y + if m <= 2 { 399 } else { 400 };
    let w = (yp + yp / 4 - yp / 100 + yp / 400 + T[(m - 1) as usize] + d + 6) % 7;
    let md = d - w;
    Some(if md >= 1 {
        format!("{}{md:02}", &c[..8])
    } else if m == 1 {
        let year = if y == 0 {
            "-0001".to_string()
        } else {
            format!("{:04}", y - 1)
        };
        format!("{year}-12-{:02}", 31 + md)
    } else {
        format!("{}{:02}-{:02}", &c[..5], m - 1, days_in_month(y, m - 1) + md)
    })
}

fn days_in_month(y: i64, m: i64) -> i64 {
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let t = Some("2024-03-15T14:30:00.123456");
        assert_eq!(period_label(t, Granularity::Hour).unwrap(), "2024-03-15T14");
        assert_eq!(period_label(t, Granularity::Day).unwrap(), "2024-03-15");
        assert_eq!(period_label(t, Granularity::Week).unwrap(), "2024-03-11");
        assert_eq!(period_label(t, Granularity::Month).unwrap(), "2024-03");
        assert_eq!(period_label(t, Granularity::Quarter).unwrap(), "2024-01");
        assert_eq!(
            period_label(Some("2024-12-31"), Granularity::Quarter).unwrap(),
            "2024-10"
        );
        assert_eq!(
            period_label(Some("2024-01-01"), Granularity::Week).unwrap(),
            "2024-01-01"
        );
        assert_eq!(
            period_label(Some("2023-01-01"), Granularity::Week).unwrap(),
            "2022-12-26"
        );
        assert_eq!(
            period_label(Some("2024-03-15T14:30:00Z"), Granularity::Year).unwrap(),
            "2024"
        );
        assert_eq!(period_label(None, Granularity::Day), None);
    }

    const ALL: [Granularity; 6] = [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ];

    #[test]
    fn values_beyond_the_iso_calendar_are_periods_of_their_own() {
        for v in [
            "infinity",
            "-infinity",
            "-0009-06-01",
            "-0009-06-01T12:00:00.000000",
            "+10000-01-01",
            "+10000-01-01T00:00:00.000000Z",
        ] {
            for g in ALL {
                assert_eq!(period_label(Some(v), g).as_deref(), Some(v), "{v} {g:?}");
            }
        }
    }

    #[test]
    fn mysql_zero_dates_have_their_own_quarter_and_their_day_as_week() {
        let q = |v| period_label(Some(v), Granularity::Quarter).unwrap();
        let w = |v| period_label(Some(v), Granularity::Week).unwrap();
        assert_eq!(q("2024-00-15"), "2024-00");
        assert_eq!(q("0000-00-00T00:00:00.000000"), "0000-00");
        assert_eq!(q("2024-05-00"), "2024-04");
        assert_eq!(w("2024-00-15T10:00:00"), "2024-00-15");
        assert_eq!(w("2024-05-00"), "2024-05-00");
        assert_eq!(w("0000-00-00"), "0000-00-00");
        assert_eq!(w("2023-02-29"), "2023-02-29", "no calendar date");
        assert_eq!(
            period_label(Some("2024-00-15"), Granularity::Month).unwrap(),
            "2024-00"
        );
    }

    #[test]
    fn weeks_cross_month_and_year_ends_and_year_zero() {
        let w = |v| period_label(Some(v), Granularity::Week).unwrap();
        assert_eq!(w("2021-01-03T23:59:59.999999Z"), "2020-12-28");
        assert_eq!(w("2024-03-01"), "2024-02-26");
        assert_eq!(w("2023-03-01"), "2023-02-27");
        assert_eq!(w("0000-01-01"), "-0001-12-27");
        assert_eq!(w("0000-03-01"), "0000-02-28");
        assert_eq!(w("0000-02-29"), "0000-02-28");
        assert_eq!(w("9999-12-31"), "9999-12-27");
        assert_eq!(w("0001-01-01"), "0001-01-01");
    }

    /// Every day of years 0001-9999 sampled, and all of years 0-2 and 1999-2001: the
    /// week label is the Monday the `time` crate computes.
    #[test]
    fn weeks_agree_with_an_independent_calendar() {
        let years = (0..=2)
            .chain(1999..=2001)
            .chain((3..9999).step_by(37))
            .chain([9999]);
        for y in years {
            let mut d = time::Date::from_calendar_date(y, time::Month::January, 1).unwrap();
            while d.year() == y {
                let monday = d - time::Duration::days(i64::from(d.weekday().number_days_from_monday()));
                let want = if monday.year() < 0 {
                    format!(
                        "-{:04}-{:02}-{:02}",
                        -monday.year(),
                        monday.month() as u8,
                        monday.day()
                    )
                } else {
                    format!(
                        "{:04}-{:02}-{:02}",
                        monday.year(),
                        monday.month() as u8,
                        monday.day()
                    )
                };
                let text = format!("{:04}-{:02}-{:02}T12:00:00", y, d.month() as u8, d.day());
                assert_eq!(
                    period_label(Some(&text), Granularity::Week).unwrap(),
                    want,
                    "{text}"
                );
                match d.next_day() {
                    Some(n) => d = n,
                    None => break,
                }
            }
        }
    }
}
