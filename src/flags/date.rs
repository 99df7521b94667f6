//! Dates for the `is_date_before` / `is_date_after` / `is_date_exact` operators, read as
//! PostHog's flags service reads them. A property value may be epoch seconds (a number or
//! numeric text, never milliseconds), a relative date, or a date in text; a filter value
//! must be text: relative (`-7d`, `3m`), a date, or 10/13/19 digits of epoch seconds,
//! milliseconds or nanoseconds. Text dates are ISO dates and datetimes (`T` or space
//! separated) with an optional zone, written `Z`, ` UTC`, `+01`, `+0100` or `+01:00`,
//! with or without a space before it (Postgres writes `2024-01-15 10:00:00+01`).
//! Without a zone, a date is UTC.

use serde_json::Value;
use time::{Date, Duration, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

/// PostHog rejects relative amounts from this size on; it also keeps the arithmetic in range.
const MAX_RELATIVE_AMOUNT: u32 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    Hour,
    Day,
    Week,
    Month,
    Year,
}

/// The date a filter compares against, resolved per evaluation when relative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DateTarget {
    Absolute(OffsetDateTime),
    Relative { amount: u32, unit: Unit },
}

impl DateTarget {
    /// `None` when the value is no date at all; such a filter never matches. Only text is
    /// a date here: PostHog ignores a filter whose value is a JSON number.
    pub(super) fn parse(value: &Value) -> Option<DateTarget> {
        let text = value.as_str()?;
        if let Some(relative) = parse_relative(text) {
            return Some(relative);
        }
        let digits = text.len();
        if matches!(digits, 10 | 13 | 19) && text.bytes().all(|b| b.is_ascii_digit()) {
            let n: i128 = text.parse().ok()?;
            let nanos = match digits {
                10 => n * 1_000_000_000,
                13 => n * 1_000_000,
                _ => n,
            };
            return OffsetDateTime::from_unix_timestamp_nanos(nanos)
                .ok()
                .map(DateTarget::Absolute);
        }
        parse_text(text).map(DateTarget::Absolute)
    }

    pub(super) fn resolve(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        match *self {
            DateTarget::Absolute(at) => Some(at),
            DateTarget::Relative { amount, unit } => match unit {
                Unit::Hour => now.checked_sub(Duration::hours(amount.into())),
                Unit::Day => now.checked_sub(Duration::days(amount.into())),
                Unit::Week => now.checked_sub(Duration::weeks(amount.into())),
                Unit::Month => months_back(now, amount),
                Unit::Year => years_back(now, amount),
            },
        }
    }
}

/// `^-?\d+[hdwmy]$`, exactly as written; the sign is optional and both forms mean "ago".
fn parse_relative(s: &str) -> Option<DateTarget> {
    let body = s.strip_prefix('-').unwrap_or(s);
    let unit = match body.as_bytes().last()? {
        b'h' => Unit::Hour,
        b'd' => Unit::Day,
        b'w' => Unit::Week,
        b'm' => Unit::Month,
        b'y' => Unit::Year,
        _ => return None,
    };
    let digits = &body[..body.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Overlong digit strings fail to parse and are rejected like large amounts.
    let amount: u32 = digits.parse().ok()?;
    (amount < MAX_RELATIVE_AMOUNT).then_some(DateTarget::Relative { amount, unit })
}

/// Back one calendar month at a time, clamping the day at every step as PostHog does:
/// from 31 March, `-2m` passes 29 February and lands on 29 January, not 31 January.
fn months_back(now: OffsetDateTime, months: u32) -> Option<OffsetDateTime> {
    let (mut year, mut month, mut day) = (now.year(), now.month(), now.day());
    for _ in 0..months {
        if month == Month::January {
            year -= 1;
        }
        month = month.previous();
        day = day.min(month.length(year));
    }
    let date = Date::from_calendar_date(year, month, day).ok()?;
    Some(now.replace_date(date))
}

/// Back one year at a time; 29 February becomes the 28th at the first step.
fn years_back(now: OffsetDateTime, years: u32) -> Option<OffsetDateTime> {
    let year = now.year().checked_sub(i32::try_from(years).ok()?)?;
    let day = match (now.month(), years) {
        (Month::February, 1..) => now.day().min(28),
        _ => now.day(),
    };
    let date = Date::from_calendar_date(year, now.month(), day).ok()?;
    Some(now.replace_date(date))
}

/// A property value as an instant: epoch seconds, a relative date, or a text date.
pub(super) fn parse_property_instant(value: &Value, now: OffsetDateTime) -> Option<OffsetDateTime> {
    match value {
        Value::Number(n) => from_epoch_seconds(n.as_f64()?),
        // A date's dashes at 4 and 7 cannot be a number's (it has at most one sign past
        // its first byte), so ISO dates skip the float parse.
        Value::String(s) if is_dated(s) => parse_text(s),
        Value::String(s) => match s.parse::<f64>() {
            Ok(seconds) => from_epoch_seconds(seconds),
            Err(_) => match parse_relative(s) {
                Some(relative) => relative.resolve(now),
                None => parse_text(s),
            },
        },
        _ => None,
    }
}

/// Whether `s` starts like `YYYY-MM-DD`: dashes at bytes 4 and 7.
fn is_dated(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 10 && b[4] == b'-' && b[7] == b'-'
}

/// Epoch seconds, fractions kept to the nanosecond. Instants past what the time crate
/// holds (±9999 years) are clamped to its ends, which keeps their order against any
/// filter date PostHog could write.
fn from_epoch_seconds(seconds: f64) -> Option<OffsetDateTime> {
    if seconds.is_nan() {
        return None;
    }
    let whole = seconds.floor();
    let nanos = ((seconds - whole) * 1e9).round() as i128;
    let min = PrimitiveDateTime::MIN.assume_utc();
    let max = PrimitiveDateTime::MAX.assume_utc();
    if whole < min.unix_timestamp() as f64 {
        return Some(min);
    }
    if whole > max.unix_timestamp() as f64 {
        return Some(max);
    }
    OffsetDateTime::from_unix_timestamp_nanos(whole as i128 * 1_000_000_000 + nanos).ok()
}

/// `YYYY-MM-DD[(T| )HH:MM[:SS[.fraction]]][ ][zone]`, surrounding spaces ignored.
pub(super) fn parse_text(s: &str) -> Option<OffsetDateTime> {
    let s = s.trim();
    let date = parse_date(s.get(..10)?)?;
    let rest = &s[10..];
    if rest.is_empty() {
        return Some(date.midnight().assume_utc());
    }
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let (time, rest) = parse_time(rest)?;
    let offset = parse_zone(rest.trim_start())?;
    Some(PrimitiveDateTime::new(date, time).assume_offset(offset))
}

fn parse_date(s: &str) -> Option<Date> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let year: i32 = digits(&s[..4])?.try_into().ok()?;
    let month = Month::try_from(u8::try_from(digits(&s[5..7])?).ok()?).ok()?;
    let day = u8::try_from(digits(&s[8..10])?).ok()?;
    Date::from_calendar_date(year, month, day).ok()
}

/// `HH:MM[:SS[.fraction]]` and what follows it.
fn parse_time(s: &str) -> Option<(Time, &str)> {
    let hour = digits(s.get(..2)?)?;
    let rest = s.get(2..)?.strip_prefix(':')?;
    let minute = digits(rest.get(..2)?)?;
    let mut rest = &rest[2..];
    let mut second = 0;
    let mut nanos = 0;
    if let Some(after) = rest.strip_prefix(':') {
        second = digits(after.get(..2)?)?;
        rest = &after[2..];
        if let Some(after) = rest.strip_prefix('.') {
            let len = after.bytes().take_while(u8::is_ascii_digit).count();
            if len == 0 {
                return None;
            }
            // Nanosecond precision; further digits are dropped.
            let kept = &after[..len.min(9)];
            nanos = digits(kept)? * 10u32.pow(9 - kept.len() as u32);
            rest = &after[len..];
        }
    }
    let time = Time::from_hms_nano(
        u8::try_from(hour).ok()?,
        u8::try_from(minute).ok()?,
        u8::try_from(second).ok()?,
        nanos,
    )
    .ok()?;
    Some((time, rest))
}

/// Nothing (UTC), `Z`, `UTC`, `GMT`, or `±HH`, `±HHMM`, `±HH:MM`.
fn parse_zone(s: &str) -> Option<UtcOffset> {
    if s.is_empty()
        || s.eq_ignore_ascii_case("z")
        || s.eq_ignore_ascii_case("utc")
        || s.eq_ignore_ascii_case("gmt")
    {
        return Some(UtcOffset::UTC);
    }
    let sign: i8 = match s.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let body = &s[1..];
    // `get`, not indexing: the text is a client's and may hold any character.
    let (hours, minutes) = match body.len() {
        2 => (body, "00"),
        4 => (body.get(..2)?, body.get(2..)?),
        5 if body.as_bytes()[2] == b':' => (body.get(..2)?, body.get(3..)?),
        _ => return None,
    };
    let hours = i8::try_from(digits(hours)?).ok()?;
    let minutes = i8::try_from(digits(minutes)?).ok()?;
    UtcOffset::from_hms(sign * hours, sign * minutes, 0).ok()
}

/// A run of ASCII digits (nothing else) as a number.
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2024-03-31 10:00:00 UTC);

    fn at(value: Value) -> OffsetDateTime {
        parse_property_instant(&value, NOW).expect("a date")
    }

    fn filter(value: &str) -> OffsetDateTime {
        DateTarget::parse(&json!(value))
            .expect("a filter date")
            .resolve(NOW)
            .expect("in range")
    }

    #[test]
    fn accepted_spellings() {
        let noon = datetime!(2024-03-05 12:00:00 UTC);
        for text in [
            "2024-03-05T12:00:00Z",
            "2024-03-05T14:00:00+02:00",
            "2024-03-05T14:00:00+0200",
            "2024-03-05 14:00:00+02",
            "2024-03-05T14:00:00+02",
            "2024-03-05 14:00:00 +0200",
            "2024-03-05 14:00:00 +02:00",
            "2024-03-05 12:00:00 UTC",
            "2024-03-05T12:00:00",
            "2024-03-05 12:00:00",
            "2024-03-05T12:00",
            "2024-03-05T12:00Z",
            " 2024-03-05T12:00:00Z ",
        ] {
            assert_eq!(at(json!(text)), noon, "{text}");
            assert_eq!(filter(text), noon, "{text}");
        }
        assert_eq!(
            at(json!("2024-03-05T12:00:00.250Z")),
            noon + Duration::milliseconds(250)
        );
        assert_eq!(at(json!("2024-03-05")), datetime!(2024-03-05 0:00 UTC));
        assert_eq!(at(json!(1_709_640_000)), noon);
        assert_eq!(at(json!("1709640000")), noon);
        assert_eq!(
            at(json!(1_709_640_000.5)),
            noon + Duration::milliseconds(500)
        );
    }

    #[test]
    fn property_numbers_are_always_seconds() {
        // 20240115 seconds after 1970, not 15 January 2024; and milliseconds read as
        // seconds land far in the future, as in PostHog.
        assert_eq!(at(json!("20240115")), datetime!(1970-08-23 06:15:15 UTC));
        assert_eq!(
            at(json!(1_709_640_000_000_i64)),
            PrimitiveDateTime::MAX.assume_utc()
        );
    }

    #[test]
    fn filter_digits_are_epoch_by_length_and_numbers_are_no_date() {
        let noon = datetime!(2024-03-05 12:00:00 UTC);
        assert_eq!(filter("1709640000"), noon);
        assert_eq!(filter("1709640000000"), noon);
        assert_eq!(filter("1709640000000000000"), noon);
        assert_eq!(DateTarget::parse(&json!(1_709_640_000)), None);
        assert_eq!(DateTarget::parse(&json!("20240115")), None);
    }

    #[test]
    fn rejected_spellings() {
        for value in [
            json!("yesterday"),
            json!("2024-13-01"),
            json!("2024-03-05T25:00:00"),
            json!("2024-03-05 12:00:00 +1"),
            json!("2024-03-05 12:00:00 +aé1"),
            json!("2024-03-05 12:00:00 +é"),
            json!("2024-03-05é12:00"),
            json!("2024-03-05T12:0é"),
            json!("2024-03-05T12:00:0é"),
            json!("2024-03-05T12:00:00.é"),
            json!("20é4-03-05"),
            json!(true),
            json!(null),
            json!(""),
        ] {
            assert_eq!(parse_property_instant(&value, NOW), None, "{value}");
        }
    }

    /// Every cut of a date with multi-byte characters spliced in parses or not, never
    /// panics: values come from clients.
    #[test]
    fn any_text_is_safe() {
        let pieces = [
            "2024-03-05",
            "T",
            " ",
            "12:00",
            ":00",
            ".5",
            "Z",
            "+01",
            ":00",
            "é",
            "€",
            "00",
        ];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    for d in pieces {
                        let text = format!("{a}{b}{c}{d}");
                        for end in 0..=text.len() {
                            if let Some(cut) = text.get(..end) {
                                let _ = parse_property_instant(&json!(cut), NOW);
                                let _ = DateTarget::parse(&json!(cut));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn relative_values_count_back_from_now() {
        assert_eq!(filter("-6h"), datetime!(2024-03-31 04:00:00 UTC));
        assert_eq!(filter("-1d"), datetime!(2024-03-30 10:00:00 UTC));
        assert_eq!(filter("2w"), datetime!(2024-03-17 10:00:00 UTC));
        assert_eq!(filter("-1m"), datetime!(2024-02-29 10:00:00 UTC));
        assert_eq!(filter("-13m"), datetime!(2023-02-28 10:00:00 UTC));
        assert_eq!(filter("-1y"), datetime!(2023-03-31 10:00:00 UTC));
        assert_eq!(filter("-0d"), NOW);
        assert_eq!(at(json!("-1d")), datetime!(2024-03-30 10:00:00 UTC));
        for bad in ["-10000d", "-5x", "--5d", " -5d", "-5d "] {
            assert_eq!(DateTarget::parse(&json!(bad)), None, "{bad}");
        }
    }

    #[test]
    fn months_clamp_at_every_step() {
        // 31 March, back two months: 29 February, then 29 January.
        assert_eq!(filter("-2m"), datetime!(2024-01-29 10:00:00 UTC));
        let now = datetime!(2023-03-31 10:00:00 UTC);
        let back = |s: &str| DateTarget::parse(&json!(s)).unwrap().resolve(now).unwrap();
        assert_eq!(back("-2m"), datetime!(2023-01-28 10:00:00 UTC));
        assert_eq!(back("-3m"), datetime!(2022-12-28 10:00:00 UTC));
        let now = datetime!(2024-05-31 00:00:00 UTC);
        let back = |s: &str| DateTarget::parse(&json!(s)).unwrap().resolve(now).unwrap();
        assert_eq!(back("-1m"), datetime!(2024-04-30 00:00:00 UTC));
        assert_eq!(back("-2m"), datetime!(2024-03-30 00:00:00 UTC));
    }

    #[test]
    fn leap_day_minus_years_clamps_once() {
        let now = datetime!(2024-02-29 00:00:00 UTC);
        let back = |s: &str| DateTarget::parse(&json!(s)).unwrap().resolve(now).unwrap();
        assert_eq!(back("-1y"), datetime!(2023-02-28 00:00:00 UTC));
        assert_eq!(back("-4y"), datetime!(2020-02-28 00:00:00 UTC));
    }

    #[test]
    fn dated_text_is_never_a_number() {
        // What the shortcut skips could never parse as a float: the same answer either way.
        for s in [
            "2024-03-01",
            "2024-03-01T10:00:00Z",
            "2024-03-01 10:00:00+01:00",
            "1e-5-55-55",
            "0000-00-00",
            "+1.0-e5-00",
            "inf--na-n--",
        ] {
            assert!(is_dated(s), "{s}");
            assert!(s.parse::<f64>().is_err(), "{s}");
            assert!(parse_relative(s).is_none(), "{s}");
            assert_eq!(parse_property_instant(&json!(s), NOW), parse_text(s), "{s}");
        }
        assert!(!is_dated("1.0e-5"));
        assert!(!is_dated(" 2024-03-01"));
    }
}
