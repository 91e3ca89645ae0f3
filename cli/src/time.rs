//! Timestamps as the tool reads and prints them: milliseconds since the epoch, or RFC 3339 text in UTC.
//!
//! A small hand-written calendar conversion (proleptic Gregorian, days counted from 1970-01-01), enough
//! for `--since`/`--until` and for printing failure times, without a date-time dependency.

use anyhow::{Result, bail};

const MS_PER_DAY: i64 = 86_400_000;

/// Parses a point in time: milliseconds since the epoch (`1700000000000`), an RFC 3339 timestamp
/// (`2024-05-01T12:00:00Z`, `2024-05-01T14:00:00.250+02:00`) or a bare date (`2024-05-01`, midnight
/// UTC). Returns milliseconds since the epoch.
pub fn parse_time(s: &str) -> Result<i64> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<i64>().map_err(|_| anyhow::anyhow!("{s:?} is too large for milliseconds since the epoch"));
    }
    parse_rfc3339(s).map_err(|e| {
        anyhow::anyhow!(
            "invalid time {s:?}: {e} (use milliseconds since the epoch, YYYY-MM-DD, or RFC 3339 like 2024-05-01T12:00:00Z)"
        )
    })
}

fn parse_rfc3339(s: &str) -> Result<i64> {
    let b = s.as_bytes();
    let num = |range: std::ops::Range<usize>, what: &str| -> Result<i64> {
        let part = b.get(range).filter(|p| p.iter().all(u8::is_ascii_digit));
        match part {
            Some(p) => Ok(p.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0'))),
            None => bail!("expected the {what}"),
        }
    };
    let sep = |at: usize, c: u8| -> Result<()> {
        if b.get(at) == Some(&c) { Ok(()) } else { bail!("expected {:?} at position {}", c as char, at + 1) }
    };
    let year = num(0..4, "year (4 digits)")?;
    sep(4, b'-')?;
    let month = num(5..7, "month (2 digits)")?;
    sep(7, b'-')?;
    let day = num(8..10, "day (2 digits)")?;
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        bail!("no such date");
    }
    let date_ms = days_from_civil(year, month, day) * MS_PER_DAY;
    if b.len() == 10 {
        return Ok(date_ms);
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        bail!("expected 'T' between date and time");
    }
    let hour = num(11..13, "hour (2 digits)")?;
    sep(13, b':')?;
    let minute = num(14..16, "minute (2 digits)")?;
    sep(16, b':')?;
    let second = num(17..19, "second (2 digits)")?;
    if hour > 23 || minute > 59 || second > 59 {
        bail!("no such time of day");
    }
    let mut at = 19;
    let mut millis = 0;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            bail!("expected digits after '.'");
        }
        // Milliseconds are the finest unit kept; further digits are truncated.
        for i in 0..3 {
            millis = millis * 10 + b.get(at + 1 + i).filter(|_| i < digits).map_or(0, |d| i64::from(d - b'0'));
        }
        at += 1 + digits;
    }
    let offset_min = match b.get(at) {
        Some(b'Z' | b'z') if b.len() == at + 1 => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == at + 6 => {
            sep(at + 3, b':')?;
            let (h, m) = (num(at + 1..at + 3, "offset hours")?, num(at + 4..at + 6, "offset minutes")?);
            if h > 23 || m > 59 {
                bail!("no such UTC offset");
            }
            if sign == b'+' { h * 60 + m } else { -(h * 60 + m) }
        }
        _ => bail!("expected 'Z' or a UTC offset like +02:00 after the time"),
    };
    Ok(date_ms + ((hour * 60 + minute - offset_min) * 60 + second) * 1000 + millis)
}

/// Formats milliseconds since the epoch as RFC 3339 in UTC with milliseconds:
/// `2024-05-01T12:00:00.000Z`.
pub fn format_ms(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let rest = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (rest / 3_600_000, rest / 60_000 % 60, rest / 1000 % 60, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date (months 1..=12). Years are counted from March so that the leap day
/// comes last; an era is the 400-year cycle of 146,097 days.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let month_from_march = (m + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day counted from 1970-01-01: the inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let d = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let m = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let y = year_of_era + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_millis_dates_and_rfc3339() {
        assert_eq!(parse_time("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("1970-01-01").unwrap(), 0);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("2023-11-14t22:13:20.5z").unwrap(), 1_700_000_000_500);
        assert_eq!(parse_time("2023-11-15T00:13:20.123456+02:00").unwrap(), 1_700_000_000_123);
        assert_eq!(parse_time("2023-11-14T21:13:20-01:00").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("2024-02-29").unwrap(), 1_709_164_800_000);
        assert_eq!(parse_time("1969-12-31T23:59:59Z").unwrap(), -1000);
    }

    #[test]
    fn rejects_malformed_times() {
        for bad in [
            "",
            "yesterday",
            "2023-13-01",
            "2023-02-29",
            "2023-11-14T22:13:20",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:13Z",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+0200",
            "2023-11-14T22:13:20Zjunk",
            "99999999999999999999",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_and_round_trips() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
        for ms in [0, 951_782_400_000, 1_709_164_800_001, 4_102_444_800_000, -62_135_596_800_000] {
            assert_eq!(parse_time(&format_ms(ms)).unwrap(), ms, "{}", format_ms(ms));
        }
    }
}
