//! Unit tests of the fast path: dates, timestamps, the string scanner and floats.

use super::*;

#[test]
fn dates_count_days_from_the_epoch() {
    assert_eq!(iso_date(b"1970-01-01"), Some(0));
    assert_eq!(iso_date(b"2024-02-29"), Some(19_782));
    assert_eq!(iso_date(b"1969-12-31"), Some(-1));
    assert_eq!(iso_date(b"2023-02-29"), None);
    assert_eq!(iso_date(b"2024-13-01"), None);
    assert_eq!(iso_date(b"2024-1-01"), None);
}

#[test]
fn timestamps_in_the_common_forms() {
    let ms = |s: &str| iso_timestamp(s.as_bytes(), TimeUnit::Millisecond, true);
    assert_eq!(ms("2024-01-02T03:04:05Z"), Some(1_704_164_645_000));
    assert_eq!(ms("2024-01-02T03:04:05.123Z"), Some(1_704_164_645_123));
    assert_eq!(ms("2024-01-02 03:04:05.1239"), Some(1_704_164_645_123));
    assert_eq!(ms("2024-01-02T04:04:05+01:00"), Some(1_704_164_645_000));
    assert_eq!(ms("2024-01-02T02:04:05-01:00"), Some(1_704_164_645_000));
    assert_eq!(ms("1969-12-31T23:59:59.5Z"), Some(-500));
    assert_eq!(ms("2024-01-02T03:04Z"), None);
    assert_eq!(ms("2024-01-02T03:04:60Z"), None);
    assert_eq!(ms("2024-01-02T03:04:05.1234567891Z"), None);
    assert_eq!(
        iso_timestamp(b"2024-01-02T03:04:05", TimeUnit::Millisecond, false),
        None
    );
}

/// The end of a string segment, found the plain way.
fn segment_reference(b: &[u8]) -> Option<(usize, bool)> {
    let k = b.iter().position(|&c| c == b'"' || c == b'\\')?;
    let body = &b[..k];
    if body.iter().any(|&c| c < 0x20) || std::str::from_utf8(body).is_err() {
        return None;
    }
    Some((k, b[k] == b'"'))
}

#[test]
fn segments_end_where_a_plain_search_says() {
    let fillers: [&[u8]; 4] = [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"~"];
    let specials: [&[u8]; 7] = [b"\"", b"\\", b"\n", b"\x1f", b"\xff", b"\xc3", b""];
    let mut cases = 0;
    for len in 0..40 {
        for filler in fillers {
            for special in specials {
                let mut text: Vec<u8> = Vec::new();
                while text.len() < len {
                    text.extend_from_slice(filler);
                }
                text.extend_from_slice(special);
                for tail in [&b""[..], b"\"", b"rest\"x"] {
                    let mut t = text.clone();
                    t.extend_from_slice(tail);
                    let s = Scan { b: &t, i: 0 };
                    assert_eq!(
                        s.segment(),
                        segment_reference(&t),
                        "{:?}",
                        String::from_utf8_lossy(&t)
                    );
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 3000);
}

#[test]
fn floats_match_serde_json() {
    for t in [
        "0",
        "1.5",
        "-2.25",
        "1e5",
        "12.5e-1",
        "0.1",
        "3.14159",
        "1e22",
        "1e23",
        "1.7976931348623157e308",
        "123456789012345678",
        "1234567890123456789",
        "4.9e-324",
        "0.30000000000000004",
        "-0.0",
    ] {
        let mut s = Scan {
            b: t.as_bytes(),
            i: 0,
        };
        let n = s.number().expect(t);
        assert_eq!(n.float(), serde_json::from_str::<f64>(t).ok(), "{t}");
    }
}
