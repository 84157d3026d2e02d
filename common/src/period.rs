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
pub fn period_label(canonical: Option<&str>, g: Granularity) -> Option<String> {
    let c = canonical?;
    let cut = |n: usize| c.get(..n.min(c.len())).unwrap_or(c).to_string();
    Some(match g {
        Granularity::Hour | Granularity::Day | Granularity::Month | Granularity::Year => cut(g.prefix_len()),
        Granularity::Quarter => {
            let month: u32 = c.get(5..7)?.parse().ok()?;
            format!("{}-{:02}", c.get(..4)?, (month - 1) / 3 * 3 + 1)
        }
        Granularity::Week => {
            let (y, m, d) = (
                c.get(..4)?.parse().ok()?,
                c.get(5..7)?.parse::<u8>().ok()?,
                c.get(8..10)?.parse().ok()?,
            );
            let date = time::Date::from_calendar_date(y, time::Month::try_from(m).ok()?, d).ok()?;
            let monday = date - time::Duration::days(i64::from(date.weekday().number_days_from_monday()));
            format!(
                "{:04}-{:02}-{:02}",
                monday.year(),
                monday.month() as u8,
                monday.day()
            )
        }
    })
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
}
