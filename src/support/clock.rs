//! Time as the server counts it: unix milliseconds, read from the system clock and
//! written as RFC 3339. Capture, the compactor, the store and the read API all need
//! it, so it sits below them all rather than in any one of them.

use time::OffsetDateTime;

/// The system clock in unix milliseconds (0 if it reads before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Format unix milliseconds as RFC 3339 UTC with millisecond precision.
pub fn format_ms(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let (y, mo, d) = (t.year(), u8::from(t.month()), t.day());
    let (h, mi, s, milli) = (t.hour(), t.minute(), t.second(), t.millisecond());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}
