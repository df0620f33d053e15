//! Times: seconds from Python as durations, the clock, stored write times and Feast's
//! event timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

/// `s` seconds from Python as a Duration, saturating: NaN and negatives are zero, and
/// anything past a year (the settings' bound) is a year, where `Duration::from_secs_f64`
/// would panic on overflow and `Instant + Duration` past the clock's range.
pub(crate) fn seconds(s: f64) -> std::time::Duration {
    const YEAR: f64 = 365.0 * 24.0 * 3600.0;
    // NaN fails `s > 0.0`, +inf is past the year
    std::time::Duration::from_secs_f64(if s > 0.0 { s.min(YEAR) } else { 0.0 })
}

const LAST_STAMP: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z: the reference's strftime agrees up to here

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The clock in unix milliseconds.
pub(crate) fn unix_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A stored write time in whole seconds, as `layout.decode_timestamp` reads it (digits, at
/// most one decimal point and nine digits after it, up to 2**40); None for anything else.
pub(crate) fn unix_seconds(text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let (whole, fraction) = match text.iter().position(|&c| c == b'.') {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    if !digits(whole) || fraction.map_or(false, |f| !digits(f) || f.len() > 9) {
        return None;
    }
    let value: u64 = std::str::from_utf8(whole).ok()?.parse().ok()?;
    (value <= 1 << 40).then_some(value as i64)
}

/// A write time as Feast's event timestamp, `"%Y-%m-%dT%H:%M:%SZ"` in UTC, as
/// `feast_api._timestamp` writes it (`time.strftime` of `time.gmtime`); None outside
/// 1970 to 9999.
pub(crate) fn iso_stamp(out: &mut Vec<u8>, t: i64) -> Option<()> {
    if !(0..=LAST_STAMP).contains(&t) {
        return None;
    }
    let (days, secs) = (t / 86_400, t % 86_400);
    // the civil date of a day count (H. Hinnant's `civil_from_days`)
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3_600, secs % 3_600 / 60, secs % 60);
    // each part as two digits (the year as two pairs), without `write!`'s formatter:
    // one stamp per row answered
    let mut text = *b"\"0000-00-00T00:00:00Z\"";
    for (at, n) in [
        (1, year / 100),
        (3, year % 100),
        (6, month),
        (9, day),
        (12, h),
        (15, m),
        (18, s),
    ] {
        text[at] = b'0' + (n / 10) as u8;
        text[at + 1] = b'0' + (n % 10) as u8;
    }
    out.extend_from_slice(&text);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_times_as_strftime_writes_them() {
        let stamp = |t: i64| {
            let mut out = Vec::new();
            iso_stamp(&mut out, t).map(|()| String::from_utf8(out).unwrap())
        };
        for (t, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (951_868_799, "2000-02-29T23:59:59Z"),
            (1_709_164_800, "2024-02-29T00:00:00Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
            (LAST_STAMP, "9999-12-31T23:59:59Z"),
        ] {
            assert_eq!(
                stamp(t).as_deref(),
                Some(format!("\"{text}\"").as_str()),
                "{t}"
            );
        }
        assert_eq!(stamp(-1), None);
        assert_eq!(stamp(LAST_STAMP + 1), None);
    }

    #[test]
    fn write_times_as_the_reference_reads_them() {
        assert_eq!(unix_seconds(b"1700000000"), Some(1_700_000_000));
        assert_eq!(unix_seconds(b"1700000000.123456789"), Some(1_700_000_000));
        assert_eq!(unix_seconds(b"1099511627776"), Some(1 << 40));
        for refused in [
            &b""[..],
            b"1099511627777",
            b"-1",
            b"1.",
            b".5",
            b"1.2.3",
            b"1.1234567890",
            b" 1",
            b"1e9",
            b"99999999999999999999999",
        ] {
            assert_eq!(unix_seconds(refused), None, "{refused:?}");
        }
    }
}
