//! The clock behind the templates' `strftime_now(format)`: a civil date and time, and Python's
//! `datetime.strftime` for the directives templates use (C locale, as glibc formats them).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A date and time of day (no time zone) that `strftime_now` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateDate {
    year: i32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl TemplateDate {
    /// Midnight of a calendar date; `None` if the date does not exist (or the year is outside
    /// 1..=9999, Python's range).
    pub fn from_ymd(year: i32, month: u32, day: u32) -> Option<TemplateDate> {
        TemplateDate::from_ymd_hms(year, month, day, 0, 0, 0)
    }

    /// A date and time of day; `None` if it does not exist.
    pub fn from_ymd_hms(
        year: i32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
    ) -> Option<TemplateDate> {
        let valid = (1..=9999).contains(&year)
            && (1..=12).contains(&month)
            && day >= 1
            && day <= days_in_month(year, month)
            && hour < 24
            && minute < 60
            && second < 60;
        valid.then_some(TemplateDate {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// The current date and time in UTC (rill has no time-zone database; transformers uses the
    /// machine's local time, which on servers is usually UTC).
    pub fn now_utc() -> TemplateDate {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let days = i64::try_from(secs / 86_400).unwrap_or(0);
        let rem = (secs % 86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        TemplateDate {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// Monday = 0 .. Sunday = 6.
    fn weekday(&self) -> usize {
        // 1970-01-01 was a Thursday (3).
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as usize
    }

    /// Day of the year, 1-based.
    fn ordinal(&self) -> u32 {
        (1..self.month)
            .map(|m| days_in_month(self.year, m))
            .sum::<u32>()
            + self.day
    }

    /// Python's `datetime.strftime(format)` in the C locale. Unknown directives are an error
    /// (glibc would print them differently from one platform to another).
    pub fn strftime(&self, format: &str) -> Result<String, String> {
        let mut out = String::with_capacity(format.len() + 16);
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            let month_name = MONTHS[(self.month - 1) as usize];
            let weekday_name = WEEKDAYS[self.weekday()];
            let _ = match d {
                'Y' => write!(out, "{}", self.year),
                'y' => write!(out, "{:02}", self.year % 100),
                'C' => write!(out, "{:02}", self.year / 100),
                'm' => write!(out, "{:02}", self.month),
                'd' => write!(out, "{:02}", self.day),
                'e' => write!(out, "{:>2}", self.day),
                'j' => write!(out, "{:03}", self.ordinal()),
                'H' => write!(out, "{:02}", self.hour),
                'I' => write!(out, "{:02}", hour12),
                'M' => write!(out, "{:02}", self.minute),
                'S' => write!(out, "{:02}", self.second),
                'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
                'B' => write!(out, "{month_name}"),
                'b' | 'h' => write!(out, "{}", &month_name[..3]),
                'A' => write!(out, "{weekday_name}"),
                'a' => write!(out, "{}", &weekday_name[..3]),
                'u' => write!(out, "{}", self.weekday() + 1),
                'w' => write!(out, "{}", (self.weekday() + 1) % 7),
                'F' => write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day),
                'D' => write!(
                    out,
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year % 100
                ),
                'T' => write!(
                    out,
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                ),
                'R' => write!(out, "{:02}:{:02}", self.hour, self.minute),
                'n' => out.write_char('\n'),
                't' => out.write_char('\t'),
                '%' => out.write_char('%'),
                other => return Err(format!("unsupported strftime directive %{other}")),
            };
        }
        Ok(out)
    }
}

fn is_leap(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years, March-based years).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (i32::try_from(year).unwrap_or(i32::MAX), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python() {
        // datetime(2026, 1, 15, 0, 0, 0).strftime(...) in CPython 3.11 (C locale).
        let d = TemplateDate::from_ymd(2026, 1, 15).unwrap();
        assert_eq!(d.strftime("%Y-%m-%d").unwrap(), "2026-01-15");
        assert_eq!(d.strftime("%d %b %Y").unwrap(), "15 Jan 2026");
        assert_eq!(d.strftime("%B %d, %Y").unwrap(), "January 15, 2026");
        assert_eq!(
            d.strftime("%A %a %j %H:%M:%S %I %p %y %e %u %w %%")
                .unwrap(),
            "Thursday Thu 015 00:00:00 12 AM 26 15 4 4 %"
        );
        let d = TemplateDate::from_ymd_hms(2024, 12, 31, 13, 5, 9).unwrap();
        assert_eq!(
            d.strftime("%F %T %I%p %j %a").unwrap(),
            "2024-12-31 13:05:09 01PM 366 Tue"
        );
        assert!(d.strftime("%Q").is_err());
    }

    #[test]
    fn calendar_round_trips() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert!(TemplateDate::from_ymd(y, m, d).is_some() || !(1..=9999).contains(&y));
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert!(TemplateDate::from_ymd(2023, 2, 29).is_none());
        assert!(TemplateDate::from_ymd(2024, 2, 29).is_some());
        let now = TemplateDate::now_utc();
        assert!(now.year >= 2024, "{now:?}");
    }
}
