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

/// [`format_ms`] appended to `out` without a `String` in between: capture in edge
/// mode writes a time into every event it stores.
pub fn write_ms(out: &mut Vec<u8>, ms: i64) {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let Some(year) = u16::try_from(t.year()).ok().filter(|y| *y <= 9999) else {
        // Outside four digits: the rare forms `format_ms` spells otherwise.
        out.extend_from_slice(format_ms(ms).as_bytes());
        return;
    };
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let mut digits = |at: usize, width: usize, mut n: u32| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    digits(0, 4, u32::from(year));
    digits(5, 2, u32::from(u8::from(t.month())));
    digits(8, 2, u32::from(t.day()));
    digits(11, 2, u32::from(t.hour()));
    digits(14, 2, u32::from(t.minute()));
    digits(17, 2, u32::from(t.second()));
    digits(20, 3, u32::from(t.millisecond()));
    out.extend_from_slice(&text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_formatted() {
        for ms in [
            0,
            1_700_000_000_123,
            -1,
            -62_135_596_800_000,
            -62_135_596_800_001,
            253_402_300_799_999,
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = b"x".to_vec();
            write_ms(&mut out, ms);
            assert_eq!(&out[1..], format_ms(ms).as_bytes(), "{ms}");
        }
    }
}
