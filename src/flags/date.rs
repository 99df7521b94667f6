//! Dates for the `is_date_before` / `is_date_after` / `is_date_exact` operators. Values come
//! from many clients, so several spellings are accepted: RFC 3339, ISO datetimes without an
//! offset (read as UTC, `T` or space separated), plain dates (midnight UTC), and epoch
//! numbers. Filter values may also be relative (`-7d`, `3m`), measured back from `now`.

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, Duration, Month, OffsetDateTime, PrimitiveDateTime, UtcOffset};

/// PostHog rejects relative amounts from this size on; it also keeps the arithmetic in range.
const MAX_RELATIVE_AMOUNT: u32 = 10_000;

/// Epoch numbers at or above this magnitude are read as milliseconds: as seconds they would
/// lie past the year 5000, as milliseconds they are after 1973.
const EPOCH_MILLIS_THRESHOLD: f64 = 1e11;

/// A point in time, remembering whether it was written as a bare date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Instant {
    at: OffsetDateTime,
    date_only: bool,
}

impl Instant {
    /// Same calendar day (UTC) when either side is a bare date, else the same instant.
    pub(super) fn same_as(&self, other: &Instant) -> bool {
        if self.date_only || other.date_only {
            self.at.to_offset(UtcOffset::UTC).date() == other.at.to_offset(UtcOffset::UTC).date()
        } else {
            self.at == other.at
        }
    }

    pub(super) fn at(&self) -> OffsetDateTime {
        self.at
    }
}

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
    Absolute(Instant),
    Relative { amount: u32, unit: Unit },
}

impl DateTarget {
    /// `None` when the value is no date at all; such a filter never matches.
    pub(super) fn parse(value: &Value) -> Option<DateTarget> {
        if let Value::String(s) = value {
            if let Some(relative) = parse_relative(s.trim()) {
                return Some(relative);
            }
        }
        parse_instant(value).map(DateTarget::Absolute)
    }

    pub(super) fn resolve(&self, now: OffsetDateTime) -> Option<Instant> {
        match *self {
            DateTarget::Absolute(instant) => Some(instant),
            DateTarget::Relative { amount, unit } => {
                let at = match unit {
                    Unit::Hour => now.checked_sub(Duration::hours(amount.into())),
                    Unit::Day => now.checked_sub(Duration::days(amount.into())),
                    Unit::Week => now.checked_sub(Duration::weeks(amount.into())),
                    Unit::Month => months_back(now, amount),
                    Unit::Year => months_back(now, amount.checked_mul(12)?),
                }?;
                Some(Instant {
                    at,
                    date_only: false,
                })
            }
        }
    }
}

/// `^-?\d+[hdwmy]$`; the sign is optional and both forms mean "ago".
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

/// Calendar arithmetic: the same day-of-month `months` earlier, clamped to the month's end
/// (31 March minus one month is 28 or 29 February).
fn months_back(now: OffsetDateTime, months: u32) -> Option<OffsetDateTime> {
    let total =
        i64::from(now.year()) * 12 + i64::from(u8::from(now.month())) - 1 - i64::from(months);
    let year = i32::try_from(total.div_euclid(12)).ok()?;
    let month = Month::try_from(u8::try_from(total.rem_euclid(12) + 1).ok()?).ok()?;
    let day = now.day().min(month.length(year));
    let date = Date::from_calendar_date(year, month, day).ok()?;
    Some(now.replace_date(date))
}

/// An absolute date from a property or filter value: text or an epoch number.
pub(super) fn parse_instant(value: &Value) -> Option<Instant> {
    match value {
        Value::Number(n) => from_epoch(n.as_f64()?),
        Value::String(s) => {
            let s = s.trim();
            match s.parse::<f64>() {
                Ok(epoch) => from_epoch(epoch),
                Err(_) => parse_text(s),
            }
        }
        _ => None,
    }
}

fn from_epoch(epoch: f64) -> Option<Instant> {
    if !epoch.is_finite() {
        return None;
    }
    let millis = if epoch.abs() >= EPOCH_MILLIS_THRESHOLD {
        epoch
    } else {
        epoch * 1000.0
    };
    // Whole milliseconds are enough for date comparisons and keep the cast exact.
    let nanos = (millis.trunc() as i128).checked_mul(1_000_000)?;
    let at = OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
    Some(Instant {
        at,
        date_only: false,
    })
}

fn parse_text(s: &str) -> Option<Instant> {
    if let Ok(at) = OffsetDateTime::parse(s, &Rfc3339) {
        return Some(Instant {
            at,
            date_only: false,
        });
    }
    if s.len() == 10 {
        let date = Date::parse(s, format_description!("[year]-[month]-[day]")).ok()?;
        return Some(Instant {
            at: date.midnight().assume_utc(),
            date_only: true,
        });
    }
    // Accept a space instead of `T`, as Python's isoformat(" ") and SQL dumps write it.
    let normalised;
    let s = match s.as_bytes().get(10) {
        Some(b' ') => {
            normalised = format!("{}T{}", &s[..10], &s[11..]);
            normalised.as_str()
        }
        _ => s,
    };
    parse_datetime(s).map(|at| Instant {
        at,
        date_only: false,
    })
}

fn parse_datetime(s: &str) -> Option<OffsetDateTime> {
    let local = format_description!(
        version = 2,
        "[year]-[month]-[day]T[hour]:[minute][optional [:[second][optional [.[subsecond]]]]]"
    );
    let with_offset = format_description!(
        version = 2,
        "[year]-[month]-[day]T[hour]:[minute][optional [:[second][optional [.[subsecond]]]]]\
         [offset_hour sign:mandatory][optional [:]][offset_minute]"
    );
    if let Ok(at) = OffsetDateTime::parse(s, with_offset) {
        return Some(at);
    }
    let s = s.strip_suffix(['Z', 'z']).unwrap_or(s);
    PrimitiveDateTime::parse(s, local)
        .ok()
        .map(PrimitiveDateTime::assume_utc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    fn at(value: Value) -> OffsetDateTime {
        parse_instant(&value).expect("a date").at()
    }

    #[test]
    fn accepted_spellings() {
        let noon = datetime!(2024-03-05 12:00:00 UTC);
        assert_eq!(at(json!("2024-03-05T12:00:00Z")), noon);
        assert_eq!(at(json!("2024-03-05T14:00:00+02:00")), noon);
        assert_eq!(at(json!("2024-03-05T14:00:00+0200")), noon);
        assert_eq!(at(json!("2024-03-05T12:00:00")), noon);
        assert_eq!(at(json!("2024-03-05 12:00:00")), noon);
        assert_eq!(at(json!("2024-03-05T12:00")), noon);
        assert_eq!(at(json!("2024-03-05T12:00Z")), noon);
        assert_eq!(
            at(json!("2024-03-05T12:00:00.250Z")),
            noon + Duration::milliseconds(250)
        );
        assert_eq!(at(json!("2024-03-05")), datetime!(2024-03-05 0:00 UTC));
        assert_eq!(at(json!(1_709_640_000)), noon);
        assert_eq!(at(json!(1_709_640_000_000_i64)), noon);
        assert_eq!(at(json!("1709640000")), noon);
    }

    #[test]
    fn rejected_spellings() {
        for value in [
            json!("yesterday"),
            json!("2024-13-01"),
            json!(true),
            json!(null),
            json!(""),
        ] {
            assert_eq!(parse_instant(&value), None, "{value}");
        }
    }

    #[test]
    fn relative_values_count_back_from_now() {
        let now = datetime!(2024-03-31 10:00:00 UTC);
        let back = |s: &str| {
            DateTarget::parse(&json!(s))
                .unwrap()
                .resolve(now)
                .unwrap()
                .at()
        };
        assert_eq!(back("-6h"), datetime!(2024-03-31 04:00:00 UTC));
        assert_eq!(back("-1d"), datetime!(2024-03-30 10:00:00 UTC));
        assert_eq!(back("2w"), datetime!(2024-03-17 10:00:00 UTC));
        assert_eq!(back("-1m"), datetime!(2024-02-29 10:00:00 UTC));
        assert_eq!(back("-13m"), datetime!(2023-02-28 10:00:00 UTC));
        assert_eq!(back("-1y"), datetime!(2023-03-31 10:00:00 UTC));
        assert_eq!(back("-0d"), now);
        assert_eq!(DateTarget::parse(&json!("-10000d")), None);
        assert_eq!(DateTarget::parse(&json!("-5x")), None);
        assert_eq!(DateTarget::parse(&json!("--5d")), None);
    }

    #[test]
    fn leap_day_minus_a_year_clamps() {
        let now = datetime!(2024-02-29 00:00:00 UTC);
        let target = DateTarget::parse(&json!("-1y")).unwrap();
        assert_eq!(
            target.resolve(now).unwrap().at(),
            datetime!(2023-02-28 00:00:00 UTC)
        );
    }

    #[test]
    fn exact_compares_days_for_bare_dates() {
        let day = parse_instant(&json!("2024-03-05")).unwrap();
        let evening = parse_instant(&json!("2024-03-05T23:59:59Z")).unwrap();
        let next = parse_instant(&json!("2024-03-06T00:00:00Z")).unwrap();
        assert!(day.same_as(&evening));
        assert!(!day.same_as(&next));
        assert!(!evening.same_as(&next));
    }
}
