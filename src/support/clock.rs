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
    const DAY_MS: i64 = 86_400_000;
    let (days, in_day) = (ms.div_euclid(DAY_MS), ms.rem_euclid(DAY_MS));
    let (year, month, day) = civil(days);
    if !(0..=9999).contains(&year) {
        // Outside four digits: the rare forms `format_ms` spells otherwise.
        out.extend_from_slice(format_ms(ms).as_bytes());
        return;
    }
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let mut digits = |at: usize, width: usize, mut n: i64| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    digits(0, 4, year);
    digits(5, 2, month);
    digits(8, 2, day);
    digits(11, 2, in_day / 3_600_000);
    digits(14, 2, in_day / 60_000 % 60);
    digits(17, 2, in_day / 1000 % 60);
    digits(20, 3, in_day % 1000);
    out.extend_from_slice(&text);
}

/// Year, month and day of a count of days since 1970-01-01 in the proleptic
/// Gregorian calendar (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
        // About every eleven days and at odd hours, from year 0 to past 9999, leap days and centuries included.
        let step = 997_000_017;
        let mut ms = -62_200_000_000_000;
        while ms < 253_500_000_000_000 {
            let mut out = Vec::new();
            write_ms(&mut out, ms);
            assert_eq!(out, format_ms(ms).as_bytes(), "{ms}");
            ms += step;
        }
    }
}
