//! Cron expressions for scheduled runs, in UTC.
//!
//! Five fields (`minute hour day-of-month month day-of-week`, as crontab(5)) or six with
//! seconds first (`second minute hour day-of-month month day-of-week`). Each field is
//! `*`, a number, a range `a-b`, a step `*/n`, `a-b/n` or `a/n`, or a comma list of those;
//! months and weekdays also by name (`JAN`…`DEC`, `SUN`…`SAT`, any case), Sunday as 0 or
//! 7. As in Vixie cron, when both day-of-month and day-of-week are restricted a day
//! matches if either does; a day field that starts with `*` (`*/2`) is not a
//! restriction of that kind: the fields then both apply. Macros: `@yearly` (`@annually`), `@monthly`, `@weekly`,
//! `@daily` (`@midnight`), `@hourly`. Times are UTC: there are no DST gaps or repeats.

use std::fmt;

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    text: String,
    seconds: u64,
    minutes: u64,
    hours: u64,
    /// Bits 1..=31.
    days: u64,
    /// Bits 1..=12.
    months: u64,
    /// Bits 0..=6, Sunday = 0.
    weekdays: u64,
    /// Day of month, day of week starting with `*` (Vixie cron's `DOM_STAR`, `DOW_STAR`).
    days_star: bool,
    weekdays_star: bool,
}

/// Why a cron expression was refused: which field, what it said, what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronError(String);

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CronError {}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
};
const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
// 7 is Sunday too; folded to 0 after parsing
const WEEKDAY: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Field {
    fn value(&self, s: &str, whole: &str) -> Result<u32, CronError> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = self.names.iter().position(|n| *n == lower) {
            // names count from the field's minimum (JAN = 1, SUN = 0)
            return Ok(self.min + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| {
            let names = if self.names.is_empty() {
                String::new()
            } else {
                format!(" or a name ({}…)", self.names[..3].join(", "))
            };
            CronError(format!(
                "{} field {whole:?}: {s:?} is not a number{names}",
                self.name
            ))
        })?;
        if v < self.min || v > self.max {
            return Err(CronError(format!(
                "{} field {whole:?}: {v} is out of range {}–{}",
                self.name, self.min, self.max
            )));
        }
        Ok(v)
    }

    /// The field's set as bits, and whether it starts with `*` (`*`, `*/2`: Vixie cron
    /// then ANDs the day fields, see [`Cron::day_matches`]).
    fn parse(&self, text: &str) -> Result<(u64, bool), CronError> {
        let mut bits = 0u64;
        for part in text.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                        CronError(format!(
                            "{} field {text:?}: step {s:?} must be a positive number",
                            self.name
                        ))
                    })?;
                    (r, Some(step))
                }
                None => (part, None),
            };
            let (lo, hi) = if range == "*" {
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                let (a, b) = (self.value(a, text)?, self.value(b, text)?);
                if a > b {
                    return Err(CronError(format!(
                        "{} field {text:?}: range {range} runs backwards",
                        self.name
                    )));
                }
                (a, b)
            } else if range.is_empty() {
                return Err(CronError(format!("{} field {text:?}: an empty item", self.name)));
            } else {
                let a = self.value(range, text)?;
                // `a/n` runs from a to the end
                (a, if step.is_some() { self.max } else { a })
            };
            // a step past the field's end (up to u32::MAX) takes `lo` alone; never an overflow
            for v in (lo..=hi).step_by(step.unwrap_or(1) as usize) {
                bits |= 1 << v;
            }
        }
        Ok((bits, text.starts_with('*')))
    }
}

impl std::str::FromStr for Cron {
    type Err = CronError;

    fn from_str(text: &str) -> Result<Cron, CronError> {
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => {
                return Err(CronError(format!(
                    "unknown cron macro {t:?} (known: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)"
                )));
            }
            t => t,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (second, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(CronError(format!(
                    "cron expression {text:?} has {n} fields: give 5 (minute hour day-of-month month day-of-week) \
                     or 6 (second first)"
                )));
            }
        };
        let (seconds, _) = SECOND.parse(second)?;
        let (minutes, _) = MINUTE.parse(rest[0])?;
        let (hours, _) = HOUR.parse(rest[1])?;
        let (days, days_star) = DAY.parse(rest[2])?;
        let (months, _) = MONTH.parse(rest[3])?;
        let (mut weekdays, weekdays_star) = WEEKDAY.parse(rest[4])?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & !(1 << 7)) | 1;
        }
        let cron = Cron {
            text: text.trim().to_string(),
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_star,
            weekdays_star,
        };
        // e.g. `0 0 31 2 *`: a day that never comes would never run, silently
        if !(1..=12).any(|m| cron.months & (1 << m) != 0 && cron.days & month_days(m) != 0)
            && (cron.days_star || cron.weekdays_star)
        {
            return Err(CronError(format!(
                "cron expression {text:?} names no day that exists (day of month and month never meet)"
            )));
        }
        Ok(cron)
    }
}

/// Days (as bits 1..=31) that month `m` can have, counting February 29.
fn month_days(m: u32) -> u64 {
    let n = match m {
        2 => 29,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    ((1u64 << (n + 1)) - 1) & !1
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

const DAY_SECS: i64 = 86_400;

impl Cron {
    fn day_matches(&self, date: time::Date) -> bool {
        if self.months & (1 << u8::from(date.month())) == 0 {
            return false;
        }
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().number_days_from_sunday()) != 0;
        // Vixie cron: a day field starting with `*` (`*`, `*/2`) restricts with the other
        // (AND); when neither does, a day matches if either field does (OR)
        if self.days_star || self.weekdays_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The latest second of `day_start..=day_start + limit` that matches (offsets in
    /// seconds from the start of a matching day).
    fn latest_in_day(&self, limit: i64) -> Option<i64> {
        for h in (0..24i64).rev() {
            if self.hours & (1 << h) == 0 || h * 3600 > limit {
                continue;
            }
            for m in (0..60i64).rev() {
                if self.minutes & (1 << m) == 0 || h * 3600 + m * 60 > limit {
                    continue;
                }
                for s in (0..60i64).rev() {
                    let t = h * 3600 + m * 60 + s;
                    if self.seconds & (1 << s) != 0 && t <= limit {
                        return Some(t);
                    }
                }
            }
        }
        None
    }

    fn earliest_in_day(&self, from: i64) -> Option<i64> {
        for h in 0..24i64 {
            if self.hours & (1 << h) == 0 || h * 3600 + 3599 < from {
                continue;
            }
            for m in 0..60i64 {
                if self.minutes & (1 << m) == 0 || h * 3600 + m * 60 + 59 < from {
                    continue;
                }
                for s in 0..60i64 {
                    let t = h * 3600 + m * 60 + s;
                    if self.seconds & (1 << s) != 0 && t >= from {
                        return Some(t);
                    }
                }
            }
        }
        None
    }

    /// The latest matching time at or before `t` (Unix seconds), looking back at most
    /// `not_before`; `None` when no tick falls in `not_before..=t`.
    pub fn latest_at_or_before(&self, t: i64, not_before: i64) -> Option<i64> {
        let mut day = t.div_euclid(DAY_SECS);
        let mut limit = t.rem_euclid(DAY_SECS);
        while (day + 1) * DAY_SECS > not_before {
            let date = time::OffsetDateTime::from_unix_timestamp(day * DAY_SECS)
                .ok()?
                .date();
            if self.day_matches(date)
                && let Some(s) = self.latest_in_day(limit)
            {
                let tick = day * DAY_SECS + s;
                return (tick >= not_before).then_some(tick);
            }
            day -= 1;
            limit = DAY_SECS - 1;
        }
        None
    }

    /// The first matching time strictly after `t` (Unix seconds), within about eight
    /// years (a 29 February on a given weekday can take that long).
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let t = t + 1;
        let first = t.div_euclid(DAY_SECS);
        for day in first..first + 366 * 8 + 2 {
            let from = if day == first { t.rem_euclid(DAY_SECS) } else { 0 };
            let date = time::OffsetDateTime::from_unix_timestamp(day * DAY_SECS)
                .ok()?
                .date();
            if self.day_matches(date)
                && let Some(s) = self.earliest_in_day(from)
            {
                return Some(day * DAY_SECS + s);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .unwrap()
            .unix_timestamp()
    }

    fn cron(s: &str) -> Cron {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_next_tick_follows_each_field() {
        let t = at("2026-12-01T16:53:26Z"); // a Tuesday
        for (expr, next) in [
            ("* * * * *", "2026-12-01T16:54:00Z"),
            ("*/15 * * * *", "2026-12-01T17:00:00Z"),
            ("0 2 * * *", "2026-12-02T02:00:00Z"),
            ("30 9 * * mon-fri", "2026-12-02T09:30:00Z"),
            ("0 0 1 * *", "2027-01-01T00:00:00Z"),
            ("0 12 * feb *", "2027-02-01T12:00:00Z"),
            ("0 0 29 2 *", "2028-02-29T00:00:00Z"),
            ("*/10 * * * * *", "2026-12-01T16:53:30Z"),
            ("5 53 16 * * *", "2026-12-02T16:53:05Z"),
            ("0 0 * * 7", "2026-12-06T00:00:00Z"),
            ("0 0 * * SUN", "2026-12-06T00:00:00Z"),
            ("@hourly", "2026-12-01T17:00:00Z"),
            ("@weekly", "2026-12-06T00:00:00Z"),
            ("@yearly", "2027-01-01T00:00:00Z"),
            ("10-20/5 * * * *", "2026-12-01T17:10:00Z"),
            ("0 8,20 * * *", "2026-12-01T20:00:00Z"),
            ("0 0 */10 * *", "2026-12-11T00:00:00Z"),
        ] {
            assert_eq!(cron(expr).next_after(t), Some(at(next)), "{expr}");
        }
    }

    #[test]
    fn day_of_month_and_weekday_match_either_when_both_are_given() {
        // the 15th, or any Friday
        let c = cron("0 0 15 * fri");
        let t = at("2026-12-01T00:00:00Z");
        assert_eq!(c.next_after(t), Some(at("2026-12-04T00:00:00Z")));
        assert_eq!(
            c.next_after(at("2026-12-11T00:00:00Z")),
            Some(at("2026-12-15T00:00:00Z"))
        );
        // restricted day of month alone: not every Friday
        let c = cron("0 0 15 * *");
        assert_eq!(c.next_after(t), Some(at("2026-12-15T00:00:00Z")));
        // a day field starting with `*` restricts with the other (Vixie's DOM_STAR):
        // odd days that are Fridays, not odd days or Fridays
        let c = cron("0 0 */2 * fri");
        assert_eq!(c.next_after(t), Some(at("2026-12-11T00:00:00Z")));
        let c = cron("0 0 1 * */2");
        // the 1st on a Sunday, Tuesday, Thursday or Saturday
        assert_eq!(c.next_after(t), Some(at("2027-04-01T00:00:00Z")));
    }

    #[test]
    fn the_latest_tick_is_found_looking_back_and_not_before_the_bound() {
        let c = cron("0 2 * * *");
        let now = at("2026-12-01T16:53:26Z");
        assert_eq!(c.latest_at_or_before(now, 0), Some(at("2026-12-01T02:00:00Z")));
        assert_eq!(
            c.latest_at_or_before(at("2026-12-01T02:00:00Z"), 0),
            Some(at("2026-12-01T02:00:00Z")),
            "a tick at t is at or before t"
        );
        assert_eq!(
            c.latest_at_or_before(at("2026-12-01T01:59:59Z"), 0),
            Some(at("2026-11-30T02:00:00Z"))
        );
        // a schedule created after today's tick has none yet
        assert_eq!(c.latest_at_or_before(now, at("2026-12-01T03:00:00Z")), None);
        assert_eq!(
            c.latest_at_or_before(now, at("2026-12-01T02:00:00Z")),
            Some(at("2026-12-01T02:00:00Z"))
        );
        // leap day, years back
        let c = cron("0 0 29 2 *");
        assert_eq!(c.latest_at_or_before(now, 0), Some(at("2024-02-29T00:00:00Z")));
        assert_eq!(c.latest_at_or_before(now, at("2025-01-01T00:00:00Z")), None);
        // seconds
        let c = cron("*/20 * * * * *");
        assert_eq!(c.latest_at_or_before(now, 0), Some(at("2026-12-01T16:53:20Z")));
    }

    #[test]
    fn every_tick_between_two_times_is_seen_once_walking_forward_and_back() {
        let c = cron("*/7 */5 * * * *");
        let (from, to) = (at("2026-12-01T00:00:00Z"), at("2026-12-01T01:00:00Z"));
        let mut forward = Vec::new();
        let mut t = from - 1;
        while let Some(n) = c.next_after(t).filter(|n| *n <= to) {
            forward.push(n);
            t = n;
        }
        let mut back = Vec::new();
        let mut t = to;
        while let Some(p) = c.latest_at_or_before(t, from) {
            back.push(p);
            t = p - 1;
        }
        back.reverse();
        assert_eq!(forward, back);
        // 12 minutes (0, 5, …, 55) × 9 seconds (0, 7, …, 56), and 01:00:00 itself
        assert_eq!(forward.len(), 12 * 9 + 1);
        assert_eq!(forward.last(), Some(&to));
    }

    #[test]
    fn bad_expressions_name_the_field_and_what_is_allowed() {
        for (expr, says) in [
            ("* * * *", "has 4 fields"),
            ("* * * * * * *", "has 7 fields"),
            ("61 * * * *", "minute field \"61\": 61 is out of range 0–59"),
            ("* 24 * * *", "hour field"),
            ("* * 0 * *", "day of month field \"0\": 0 is out of range 1–31"),
            ("* * * 13 *", "month field"),
            ("* * * * 8", "day of week field"),
            ("* * * * funday", "not a number or a name (sun, mon, tue…)"),
            ("*/0 * * * *", "step \"0\" must be a positive number"),
            ("5-1 * * * *", "range 5-1 runs backwards"),
            ("1,,2 * * * *", "an empty item"),
            ("0 0 31 2 *", "names no day that exists"),
            ("@sometimes", "unknown cron macro"),
            ("x * * * * *", "second field \"x\""),
        ] {
            let e = expr.parse::<Cron>().unwrap_err().to_string();
            assert!(e.contains(says), "{expr}: {e}");
        }
    }

    #[test]
    fn steps_and_edge_fields_parse_to_what_crontab_means_and_nothing_panics() {
        let t = at("2026-12-01T16:53:26Z");
        for (expr, same_as) in [
            // a step longer than the field is its first value alone, up to u32::MAX
            ("*/60 * * * *", "0 * * * *"),
            ("5/4294967295 * * * *", "5 * * * *"),
            ("1/4294967295 * * * *", "1 * * * *"),
            ("0 0 1/4294967295 * *", "0 0 1 * *"),
            ("*/4294967295 * * * *", "0 * * * *"),
            ("0 0 * * 7-7", "0 0 * * 0"),
            ("0 0 * * sun-sat", "0 0 * * *"),
            ("0 0 * * 0-7", "0 0 * * *"),
        ] {
            let (a, b) = (cron(expr), cron(same_as));
            assert_eq!(a.next_after(t), b.next_after(t), "{expr}");
            assert_eq!(a.latest_at_or_before(t, 0), b.latest_at_or_before(t, 0), "{expr}");
        }
        for (expr, says) in [
            ("0-59/0 * * * *", "must be a positive number"),
            ("*/4294967296 * * * *", "must be a positive number"),
            ("99999999999 * * * *", "is not a number"),
            ("", "has 0 fields"),
            ("é * * * *", "minute field \"é\""),
            ("* * * * mon-sun", "runs backwards"),
        ] {
            let e = expr.parse::<Cron>().unwrap_err().to_string();
            assert!(e.contains(says), "{expr}: {e}");
        }
        // year 2038 and the last second `time` can show: no overflow, no tick past 9999
        let c = cron("* * * * *");
        assert_eq!(c.next_after(2_147_483_647), Some(2_147_483_700));
        assert_eq!(c.next_after(at("9999-12-31T23:59:59Z")), None);
    }
}
