//! The RFC 3339 form of `google.protobuf.Timestamp` (protobuf's JSON mapping): UTC, `Z`,
//! nanoseconds shown when not zero. Used by the command line's JSON and by the store, which
//! writes the `deletionTimestamp` metadata of a resource marked for deletion.
//!
//! Invariant: [`parse_timestamp`] inverts [`format_timestamp`] over years 0000–9999.

use crate::google::protobuf::Timestamp;

const SECONDS_PER_DAY: i64 = 86_400;
/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z in Unix seconds.
pub const RFC3339_SECONDS_MIN: i64 = -62_167_219_200;
pub const RFC3339_SECONDS_MAX: i64 = 253_402_300_799;

/// RFC 3339 in UTC, nanoseconds shown when non-zero; `None` outside years
/// 0000–9999 or for nanos outside 0..1e9.
pub fn format_timestamp(t: &Timestamp) -> Option<String> {
    if !(RFC3339_SECONDS_MIN..=RFC3339_SECONDS_MAX).contains(&t.seconds)
        || !(0..1_000_000_000).contains(&t.nanos)
    {
        return None;
    }
    let days = t.seconds.div_euclid(SECONDS_PER_DAY);
    let second_of_day = t.seconds.rem_euclid(SECONDS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
    );
    let mut out = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}");
    if t.nanos != 0 {
        out.push_str(&format!(".{:09}", t.nanos));
    }
    out.push('Z');
    Some(out)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`.
pub fn parse_timestamp(s: &str) -> Option<Timestamp> {
    let body = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix('z'))
        .or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = body.split_once(['T', 't'])?;
    let mut d = date.split('-');
    let year: i64 = digits(d.next()?, 4)?;
    let month: i64 = digits(d.next()?, 2)?;
    let day: i64 = digits(d.next()?, 2)?;
    if d.next().is_some() {
        return None;
    }
    let (clock, fraction) = match time.split_once('.') {
        Some((c, f)) => (c, Some(f)),
        None => (time, None),
    };
    let mut c = clock.split(':');
    let hour: i64 = digits(c.next()?, 2)?;
    let minute: i64 = digits(c.next()?, 2)?;
    let second: i64 = digits(c.next()?, 2)?;
    if c.next().is_some() {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let nanos = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            let n: i32 = f.parse().ok()?;
            n * 10_i32.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(Timestamp {
        seconds: days * SECONDS_PER_DAY + hour * 3600 + minute * 60 + second,
        nanos,
    })
}

fn digits(s: &str, len: usize) -> Option<i64> {
    if s.len() == len && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years,
/// years starting in March so the leap day is last).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_format_and_parse_as_rfc3339() {
        // Known instants, leap days, and the fallback object form outside 0000-9999.
        let cases = [
            (0, 0, "1970-01-01T00:00:00Z"),
            (951_782_400, 0, "2000-02-29T00:00:00Z"),
            (1_709_287_200, 120_000_000, "2024-03-01T10:00:00.120000000Z"),
            (-1, 0, "1969-12-31T23:59:59Z"),
            (RFC3339_SECONDS_MIN, 0, "0000-01-01T00:00:00Z"),
            (
                RFC3339_SECONDS_MAX,
                999_999_999,
                "9999-12-31T23:59:59.999999999Z",
            ),
        ];
        for (seconds, nanos, text) in cases {
            let t = Timestamp { seconds, nanos };
            assert_eq!(format_timestamp(&t).as_deref(), Some(text));
            assert_eq!(parse_timestamp(text), Some(t));
        }
        assert_eq!(
            parse_timestamp("2024-03-01T10:00:00.12+00:00"),
            Some(Timestamp {
                seconds: 1_709_287_200,
                nanos: 120_000_000
            })
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2024-03-01 10:00:00Z",
            "2024-03-01T10:00:00",
            "2024-13-01T00:00:00Z",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_day_of_four_centuries_converts_both_ways() {
        // days_from_civil and civil_from_days are inverses over a full 400-year era.
        for days in -73_000..73_000 {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
