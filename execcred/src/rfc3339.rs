//! RFC 3339 times as client-go's `metav1.Time` writes and reads them
//! (`status.expirationTimestamp`).

use std::time::SystemTime;

/// Unix seconds → RFC 3339 UTC with second precision (`2026-11-30T12:34:56Z`), the form
/// client-go's `metav1.Time` parses. `None` outside years 0000–9999, which RFC 3339 cannot
/// express.
pub fn rfc3339_utc(unix: i64) -> Option<String> {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return None;
    }
    Some(format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    ))
}

/// Days since 1970-01-01 → proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`, exact for every representable day and a dozen lines instead of a
/// date crate.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468; // shift the epoch to 0000-03-01
    let era = z.div_euclid(146_097); // 400-year eras
    let doe = z.rem_euclid(146_097); // day of era [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st
    let mp = (5 * doy + 2) / 153; // March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Parses `status.expirationTimestamp` (any RFC 3339 time: offsets and fractions too, as
/// `metav1.Time` accepts). The error says what is wrong, never quoting the text.
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, crate::Error> {
    parse(text).map_err(crate::Error::NotRfc3339)
}

/// [`parse_rfc3339`] with the `time` crate's own error, for errors that name the field too.
pub(crate) fn parse(text: &str) -> Result<SystemTime, time::error::Parse> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (86_399, "1970-01-01T23:59:59Z"),
            (951_782_400, "2000-02-29T00:00:00Z"), // leap day of a year divisible by 400
            (951_868_800, "2000-03-01T00:00:00Z"),
            (1_709_164_800, "2024-02-29T00:00:00Z"),
            (1_735_689_599, "2024-12-31T23:59:59Z"), // day 366 of a leap year
            (2_147_483_647, "2038-01-19T03:14:07Z"), // i32 overflow point
            (2_147_483_648, "2038-01-19T03:14:08Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"), // 2100 is not a leap year
            (4_107_456_000, "2100-02-28T00:00:00Z"),
            (253_402_300_799, "9999-12-31T23:59:59Z"),
            (-1, "1969-12-31T23:59:59Z"),
            (-62_167_219_200, "0000-01-01T00:00:00Z"),
        ];
        for (secs, want) in cases {
            assert_eq!(rfc3339_utc(secs).as_deref(), Some(want), "{secs}");
        }
        assert_eq!(rfc3339_utc(253_402_300_800), None);
        assert_eq!(rfc3339_utc(-62_167_219_201), None);
        assert_eq!(rfc3339_utc(i64::MIN), None);
    }

    #[test]
    fn civil_dates_round_trip_every_day_for_four_centuries() {
        // Walk day by day from 1970 and compare with a naive calendar.
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for day in 0..146_097 {
            assert_eq!(civil_from_days(day), (y, m, d), "day {day}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > len[(m - 1) as usize] {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[test]
    fn parses_what_client_go_writes_and_refuses_the_rest() {
        let at = |unix: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix);
        assert_eq!(
            parse_rfc3339("2026-11-30T12:21:36Z").ok(),
            Some(at(1_796_041_296))
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T13:21:36+01:00").ok(),
            Some(at(1_796_041_296))
        );
        for bad in ["", "tomorrow", "2026-11-30", "2026-11-30T12:21Z"] {
            assert!(
                parse_rfc3339(bad)
                    .unwrap_err()
                    .to_string()
                    .starts_with("not an RFC 3339 time"),
                "{bad:?}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// The hand-written RFC 3339 formatter agrees with the `time` crate on every second
            /// from 1970 to 9999.
            #[test]
            fn rfc3339_matches_the_time_crate(unix in 0i64..253_402_300_800) {
                let ours = rfc3339_utc(unix).unwrap();
                let theirs = time::OffsetDateTime::from_unix_timestamp(unix)
                    .unwrap()
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap();
                prop_assert_eq!(ours, theirs);
            }

            /// What the formatter writes, the parser reads back to the same second.
            #[test]
            fn rendered_times_parse_back(unix in 0i64..253_402_300_800) {
                let text = rfc3339_utc(unix).unwrap();
                let back = parse_rfc3339(&text).unwrap();
                prop_assert_eq!(back, SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.unsigned_abs()));
            }
        }
    }
}
