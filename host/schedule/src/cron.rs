//! Cron expressions: five fields (minute, hour, day of month, month, day of week), six with
//! seconds first, or a name (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`,
//! `@hourly`), matched against the wall clock of a time zone.
//!
//! A field is a list (`1,15`) of `*` (or `?` for the days), a number or name (`5`, `MON`, `JAN`), a
//! range (`1-5`, `MON-FRI`) or a step over either (`*/15`, `0-30/10`, `5/10`: from 5 to the end).
//! Days of the week are 0 to 7 (0 and 7 are Sunday). As in Vixie cron, when both the day of the
//! month and the day of the week are restricted, a day matches if either does.
//!
//! Daylight-saving time is handled as a cron user expects: a wall-clock time that does not exist
//! (the hour skipped when clocks go forward) does not run that day, and a wall-clock time that
//! occurs twice (the hour repeated when clocks go back) runs once, at its first occurrence.

use chrono::{Datelike, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Timelike};
use chrono_tz::Tz;

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Both the day of the month and the day of the week are restricted: either matches.
    either_day: bool,
    text: String,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// How far ahead a search for the next time looks: beyond any leap-year and weekday cycle a valid
/// expression has (the 29th of February on a Monday recurs within 28 years).
const HORIZON_YEARS: i32 = 30;

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// The first name stands for this number (`JAN` is 1, `SUN` is 0).
    names_from: u32,
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    names_from: 0,
};
const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    names_from: 0,
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    names_from: 0,
};
const DAY: Field = Field {
    name: "day of the month",
    min: 1,
    max: 31,
    names: &[],
    names_from: 0,
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &MONTHS,
    names_from: 1,
};
const WEEKDAY: Field = Field {
    name: "day of the week",
    min: 0,
    max: 7,
    names: &WEEKDAYS,
    names_from: 0,
};

impl Cron {
    /// Parses an expression; the error says which field is wrong and why.
    pub fn parse(text: &str) -> Result<Cron, String> {
        let trimmed = text.trim();
        let expanded = match trimmed.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => {
                return Err(format!(
                    "unknown name {trimmed:?}: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly"
                ))
            }
            _ => trimmed,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => (1u64, &fields[..]),
            6 => (set(fields[0], &SECOND)?.0, &fields[1..]),
            n => {
                return Err(format!(
                    "{n} fields: a cron expression has 5 (minute hour day-of-month month day-of-week), or 6 with seconds first"
                ))
            }
        };
        let (minutes, _) = set(rest[0], &MINUTE)?;
        let (hours, _) = set(rest[1], &HOUR)?;
        let (days, days_star) = set(rest[2], &DAY)?;
        let (months, _) = set(rest[3], &MONTH)?;
        let (mut weekdays, weekdays_star) = set(rest[4], &WEEKDAY)?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let cron = Cron {
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            either_day: !days_star && !weekdays_star,
            text: trimmed.to_string(),
        };
        // A day that no month has (the 31st of February) never comes: say so now, not never.
        let possible = (1..=12).any(|m| {
            cron.months & (1 << m) != 0 && (cron.either_day || (1..=days_in(m)).any(|d| cron.days & (1 << d) != 0))
        });
        if !possible {
            return Err("no month has the days it names: the expression never matches".into());
        }
        Ok(cron)
    }

    /// The expression as it was given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The first time strictly after `after` (ms since the Unix epoch) that matches in `tz`, in
    /// whole seconds; `None` when none comes within the search horizon.
    pub fn next_after(&self, after: i64, tz: Tz) -> Option<i64> {
        let from_sec = after.div_euclid(1000) + 1;
        let start = tz.timestamp_opt(from_sec, 0).single()?;
        let mut t = start.naive_local();
        let limit = t.date().year() + HORIZON_YEARS;
        loop {
            if t.date().year() > limit {
                return None;
            }
            if !self.has(self.months, t.month()) {
                t = first_of_next_month(t)?;
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t.date().succ_opt()?.and_time(NaiveTime::MIN);
                continue;
            }
            if !self.has(self.hours, t.hour()) {
                t = t.date().and_hms_opt(t.hour(), 0, 0)? + chrono::Duration::hours(1);
                continue;
            }
            if !self.has(self.minutes, t.minute()) {
                t = t.date().and_hms_opt(t.hour(), t.minute(), 0)? + chrono::Duration::minutes(1);
                continue;
            }
            if !self.has(self.seconds, t.second()) {
                t += chrono::Duration::seconds(1);
                continue;
            }
            match tz.from_local_datetime(&t) {
                // Skipped by a clock that went forward: not run that day.
                LocalResult::None => {}
                LocalResult::Single(at) if at.timestamp() >= from_sec => return Some(at.timestamp() * 1000),
                // Repeated by a clock that went back: run at the first occurrence only.
                LocalResult::Ambiguous(first, _) if first.timestamp() >= from_sec => {
                    return Some(first.timestamp() * 1000)
                }
                _ => {}
            }
            t += chrono::Duration::seconds(1);
        }
    }

    fn has(&self, set: u64, n: u32) -> bool {
        set & (1 << n) != 0
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        let dom = self.has(self.days, d.day());
        let dow = self.has(self.weekdays, d.weekday().num_days_from_sunday());
        match self.either_day {
            true => dom || dow,
            false => dom && dow,
        }
    }
}

impl std::fmt::Display for Cron {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn days_in(month: u32) -> u32 {
    match month {
        2 => 29,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn first_of_next_month(t: NaiveDateTime) -> Option<NaiveDateTime> {
    let (y, m) = match t.month() {
        12 => (t.year() + 1, 1),
        m => (t.year(), m + 1),
    };
    Some(NaiveDate::from_ymd_opt(y, m, 1)?.and_time(NaiveTime::MIN))
}

/// A field's set of values (bit n for value n) and whether it was `*` (or `?`) alone.
fn set(text: &str, f: &Field) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let star = matches!(text, "*" | "?");
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{}: step {s:?} in {part:?} is not a whole number above 0", f.name))?;
                (r, Some(step))
            }
            None => (part, None),
        };
        let (lo, hi) = match range {
            "*" | "?" => (f.min, f.max),
            _ => match range.split_once('-') {
                Some((a, b)) => (value(a, f)?, value(b, f)?),
                // `5/10`: from 5 to the end, every 10.
                None if step.is_some() => (value(range, f)?, f.max),
                None => {
                    let v = value(range, f)?;
                    (v, v)
                }
            },
        };
        if (range == "?") && !matches!(f.name, "day of the month" | "day of the week") {
            return Err(format!("{}: '?' stands only for a day", f.name));
        }
        if lo > hi {
            return Err(format!("{}: range {range:?} runs backwards", f.name));
        }
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

fn value(text: &str, f: &Field) -> Result<u32, String> {
    let upper = text.to_ascii_uppercase();
    let v = match f.names.iter().position(|n| *n == upper) {
        Some(i) => i as u32 + f.names_from,
        None => text.parse::<u32>().map_err(|_| {
            let names = match f.names.is_empty() {
                true => String::new(),
                false => format!(" or a name ({}-{})", f.names[0], f.names[f.names.len() - 1]),
            };
            format!("{}: {text:?} is not a number{names}", f.name)
        })?,
    };
    if v < f.min || v > f.max {
        return Err(format!("{}: {v} is outside {}-{}", f.name, f.min, f.max));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("a time")
            .timestamp_millis()
    }

    fn utc(ms: i64) -> String {
        chrono::DateTime::from_timestamp_millis(ms)
            .expect("in range")
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    }

    fn times(expr: &str, tz: Tz, from: &str, n: usize) -> Vec<String> {
        let c = Cron::parse(expr).expect("parses");
        let mut t = at(from);
        (0..n)
            .map(|_| {
                t = c.next_after(t, tz).expect("a next time");
                utc(t)
            })
            .collect()
    }

    #[test]
    fn five_and_six_fields_names_steps_and_lists() {
        assert_eq!(
            times("*/15 9-10 * * MON-FRI", Tz::UTC, "2026-11-27T10:40:00Z", 3),
            ["2026-11-27T10:45:00Z", "2026-11-30T09:00:00Z", "2026-11-30T09:15:00Z"]
        );
        assert_eq!(
            times("*/20 * * * * *", Tz::UTC, "2026-11-28T00:00:00Z", 3),
            ["2026-11-28T00:00:20Z", "2026-11-28T00:00:40Z", "2026-11-28T00:01:00Z"]
        );
        // Strictly after: a time on the dot is not its own next.
        assert_eq!(
            times("0 2 * * *", Tz::UTC, "2026-11-28T02:00:00Z", 1),
            ["2026-11-29T02:00:00Z"]
        );
        assert_eq!(
            times("@monthly", Tz::UTC, "2026-11-28T00:00:00Z", 2),
            ["2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"]
        );
        assert_eq!(
            times("@yearly", Tz::UTC, "2026-11-28T00:00:00Z", 1),
            ["2027-01-01T00:00:00Z"]
        );
        assert_eq!(
            times("0 0 * * 7", Tz::UTC, "2026-11-28T00:00:00Z", 1),
            ["2026-11-29T00:00:00Z"]
        );
        assert_eq!(
            times("5/20 0 1 jan,Jul ?", Tz::UTC, "2026-11-28T00:00:00Z", 4),
            [
                "2027-01-01T00:05:00Z",
                "2027-01-01T00:25:00Z",
                "2027-01-01T00:45:00Z",
                "2027-07-01T00:05:00Z"
            ]
        );
    }

    #[test]
    fn the_first_monday_of_the_month_and_the_vixie_day_rule() {
        // Both days restricted: the 1st to the 7th, or a Monday (Vixie's rule).
        assert_eq!(
            times("0 9 1 * MON", Tz::UTC, "2026-11-28T00:00:00Z", 3),
            ["2026-11-30T09:00:00Z", "2026-12-01T09:00:00Z", "2026-12-07T09:00:00Z"]
        );
        // A leap day.
        assert_eq!(
            times("0 0 29 2 *", Tz::UTC, "2026-11-28T00:00:00Z", 1),
            ["2028-02-29T00:00:00Z"]
        );
    }

    #[test]
    fn a_time_zone_moves_the_wall_clock() {
        let paris: Tz = "Europe/Paris".parse().expect("a zone");
        assert_eq!(
            times("0 2 * * *", paris, "2026-11-28T00:00:00Z", 1),
            ["2026-11-28T01:00:00Z"]
        );
        let kolkata: Tz = "Asia/Kolkata".parse().expect("a zone");
        assert_eq!(
            times("0 9 * * *", kolkata, "2026-11-28T00:00:00Z", 1),
            ["2026-11-28T03:30:00Z"]
        );
    }

    #[test]
    fn a_skipped_hour_does_not_run_and_a_repeated_hour_runs_once() {
        let ny: Tz = "America/New_York".parse().expect("a zone");
        // 8 March 2026: 02:00 EST goes to 03:00 EDT. 02:30 does not exist that day.
        assert_eq!(
            times("30 2 * * *", ny, "2026-03-07T00:00:00Z", 3),
            ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
        );
        // Every 30 minutes across the gap: 01:30 EST, then 03:00 EDT.
        assert_eq!(
            times("*/30 * * * *", ny, "2026-03-08T06:00:00Z", 3),
            ["2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]
        );
        // 1 November 2026: 02:00 EDT goes back to 01:00 EST. 01:30 happens twice; it runs once,
        // at its first occurrence (05:30Z), not at its second (06:30Z).
        assert_eq!(
            times("30 1 * * *", ny, "2026-10-31T12:00:00Z", 3),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]
        );
        // Hourly across the repeated hour: 01:00 EDT, then 02:00 EST (01:00 EST is the same wall time).
        assert_eq!(
            times("0 * * * *", ny, "2026-11-01T04:30:00Z", 3),
            ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]
        );
        // Asked from inside the repeated hour (01:10 EST, after 01:30 EDT ran): the second 01:30 is
        // not run again.
        assert_eq!(
            times("30 1 * * *", ny, "2026-11-01T06:10:00Z", 1),
            ["2026-11-02T06:30:00Z"]
        );
    }

    #[test]
    fn bad_expressions_name_their_field() {
        for (expr, says) in [
            ("* * * *", "4 fields"),
            ("60 * * * *", "minute: 60 is outside 0-59"),
            ("* 24 * * *", "hour: 24 is outside 0-23"),
            ("* * 0 * *", "day of the month: 0 is outside 1-31"),
            ("* * * 13 *", "month: 13 is outside 1-12"),
            ("* * * FOO *", "month: \"FOO\" is not a number or a name (JAN-DEC)"),
            ("* * * * 8", "day of the week: 8 is outside 0-7"),
            ("*/0 * * * *", "minute: step \"0\""),
            ("5-1 * * * *", "minute: range \"5-1\" runs backwards"),
            ("0 0 31 2 *", "never matches"),
            ("? * * * *", "minute: '?' stands only for a day"),
            ("@often", "unknown name \"@often\""),
            ("* * * * * * *", "7 fields"),
        ] {
            let e = Cron::parse(expr).expect_err(expr);
            assert!(e.contains(says), "{expr}: {e}");
        }
    }
}
