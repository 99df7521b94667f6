//! Event times: parsing the formats clients send, and the reference service's
//! clock-skew correction.

use time::format_description::well_known::{Iso8601, Rfc3339};
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};

/// Events claiming to be further in the future than this are stamped with the
/// server's time instead: a client clock that far off is wrong, not early.
pub const MAX_FUTURE_MS: i64 = 23 * 60 * 60 * 1000;

/// Parse an ISO 8601 / RFC 3339 time into unix milliseconds. A time without an offset
/// is taken as UTC.
pub fn parse_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(s, &Iso8601::DEFAULT))
        .or_else(|_| {
            PrimitiveDateTime::parse(s, &Iso8601::DEFAULT).map(|t| t.assume_offset(UtcOffset::UTC))
        })
        .or_else(|_| {
            // "2024-01-02 03:04:05" as some server libraries send.
            PrimitiveDateTime::parse(&s.replacen(' ', "T", 1), &Iso8601::DEFAULT)
                .map(|t| t.assume_offset(UtcOffset::UTC))
        })
        .or_else(|_| {
            // A bare date is its midnight, UTC.
            time::Date::parse(s, &Iso8601::DEFAULT)
                .map(|d| d.midnight().assume_offset(UtcOffset::UTC))
        })
        .ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Parse a strict RFC 3339 time (what PostHog's v1 capture requires) into unix
/// milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// What the client told us about time for one event.
#[derive(Debug, Clone, Copy, Default)]
pub struct Claims {
    /// The event's `timestamp`, parsed.
    pub timestamp: Option<i64>,
    /// When the client sent the request by its own clock, unless `$ignore_sent_at`.
    pub sent_at: Option<i64>,
    /// posthog-js's `offset`: how many milliseconds ago the event happened.
    pub offset: Option<i64>,
}

/// The event time in unix milliseconds, given the server's `now`.
pub fn resolve(now: i64, claims: Claims) -> i64 {
    let t = match (claims.offset, claims.timestamp, claims.sent_at) {
        (Some(offset), _, _) => now.saturating_sub(offset),
        (None, Some(ts), Some(sent)) => now.saturating_add(ts.saturating_sub(sent)),
        (None, Some(ts), None) => ts,
        (None, None, _) => now,
    };
    if t > now.saturating_add(MAX_FUTURE_MS) {
        now
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::clock::format_ms;

    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn parses_client_formats() {
        assert_eq!(parse_ms("2023-11-14T22:13:20Z"), Some(NOW));
        assert_eq!(parse_ms("2023-11-14T22:13:20.123Z"), Some(NOW + 123));
        assert_eq!(parse_ms("2023-11-14T23:13:20+01:00"), Some(NOW));
        assert_eq!(
            parse_ms("2023-11-14T22:13:20.123456+00:00"),
            Some(NOW + 123)
        );
        assert_eq!(parse_ms("2023-11-14T22:13:20"), Some(NOW));
        assert_eq!(parse_ms("2023-11-14 22:13:20"), Some(NOW));
        assert_eq!(parse_ms("2023-11-14"), Some(NOW - 80_000_000));
        assert_eq!(parse_ms("yesterday"), None);
        assert_eq!(parse_ms(""), None);
    }

    #[test]
    fn formats() {
        assert_eq!(format_ms(NOW + 5), "2023-11-14T22:13:20.005Z");
        assert_eq!(parse_ms(&format_ms(NOW + 5)), Some(NOW + 5));
    }

    #[test]
    fn skew_correction() {
        let c = |timestamp, sent_at, offset| Claims {
            timestamp,
            sent_at,
            offset,
        };
        // No claims: now.
        assert_eq!(resolve(NOW, c(None, None, None)), NOW);
        // A timestamp alone is taken as is.
        assert_eq!(resolve(NOW, c(Some(NOW - 5000), None, None)), NOW - 5000);
        // Client clock 1 h fast, event 2 s before sending: corrected to 2 s before now.
        let fast = NOW + 3_600_000;
        assert_eq!(
            resolve(NOW, c(Some(fast - 2000), Some(fast), None)),
            NOW - 2000
        );
        // offset wins over everything.
        assert_eq!(resolve(NOW, c(Some(1), Some(2), Some(1500))), NOW - 1500);
        // Too far in the future: clamped to now; just inside the window: kept.
        assert_eq!(
            resolve(NOW, c(Some(NOW + MAX_FUTURE_MS + 1), None, None)),
            NOW
        );
        assert_eq!(
            resolve(NOW, c(Some(NOW + MAX_FUTURE_MS), None, None)),
            NOW + MAX_FUTURE_MS
        );
        // A negative offset that lands too far ahead is clamped too.
        assert_eq!(resolve(NOW, c(None, None, Some(-MAX_FUTURE_MS - 1))), NOW);
        // Extremes never overflow.
        assert_eq!(resolve(NOW, c(Some(i64::MAX), Some(i64::MIN), None)), NOW);
    }
}
