//! The fast path of the JSON and text decoders.
//!
//! It decodes the common shapes of a record straight into the column builders, with no
//! intermediate `serde_json::Value` and no allocation per value. It is a *subset* of the
//! per-record path (`mod.rs`, `cells.rs`), never a second definition of the rules: whatever it does
//! not recognise with certainty — an escape it does not decode, a number that may round
//! differently, a timestamp in an unusual form, any value that may break a rule — makes it
//! give up on that record (or text cell), and the per-record path decides, with its exact
//! reasons. So the two paths accept the same records and produce the same values; the
//! property tests of `tests/decode_fast_path.rs` hold them to that.

use super::columns::ColumnBuilder;
use super::{check_cell, json_cell, millis_to_unit, Column};
use arrow::datatypes::{DataType, TimeUnit};
use std::collections::HashMap;

mod scan;
#[cfg(test)]
mod tests;

use scan::Scan;

/// What the fast path does with a column's values.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A signed integer within `lo..=hi`.
    Int {
        lo: i64,
        hi: i64,
    },
    /// An unsigned integer up to `hi`.
    UInt {
        hi: u64,
    },
    /// A float (`f32`: the value must fit `Float32`).
    Float {
        f32: bool,
    },
    Bool,
    /// UTF-8 text (`check`: the contract constrains it) or bytes.
    Text {
        utf8: bool,
    },
    /// A timestamp; `naive_utc`: a value without an offset is UTC.
    Timestamp {
        unit: TimeUnit,
        naive_utc: bool,
    },
    /// A date (`ms`: `Date64`).
    Date {
        ms: bool,
    },
    /// Decoded by the per-record rules from the value's own text.
    Other,
}

fn kind_of(dt: &DataType) -> Kind {
    use DataType::*;
    let int = |lo: i64, hi: i64| Kind::Int { lo, hi };
    match dt {
        Int8 => int(i8::MIN.into(), i8::MAX.into()),
        Int16 => int(i16::MIN.into(), i16::MAX.into()),
        Int32 => int(i32::MIN.into(), i32::MAX.into()),
        Int64 => int(i64::MIN, i64::MAX),
        UInt8 => Kind::UInt { hi: u8::MAX.into() },
        UInt16 => Kind::UInt {
            hi: u16::MAX.into(),
        },
        UInt32 => Kind::UInt {
            hi: u32::MAX.into(),
        },
        UInt64 => Kind::UInt { hi: u64::MAX },
        Float32 => Kind::Float { f32: true },
        Float64 => Kind::Float { f32: false },
        Boolean => Kind::Bool,
        Utf8 => Kind::Text { utf8: true },
        Binary => Kind::Text { utf8: false },
        Timestamp(unit, tz) => Kind::Timestamp {
            unit: *unit,
            naive_utc: matches!(
                tz.as_deref(),
                None | Some("UTC") | Some("+00:00") | Some("Z") | Some("Etc/UTC")
            ),
        },
        Date32 => Kind::Date { ms: false },
        Date64 => Kind::Date { ms: true },
        _ => Kind::Other,
    }
}

/// The fast decoder of one schema: its columns' kinds and a lookup from JSON key to
/// column.
pub(crate) struct FastSchema {
    /// `false` when two fields share a name (both read the same key): the per-record
    /// path decodes such schemas.
    usable: bool,
    kinds: Vec<Kind>,
    /// Per column: the contract constrains its values (computed once: checking the
    /// constraints for emptiness per value is not free).
    checked: Vec<bool>,
    names: Vec<Box<[u8]>>,
    /// Per column: its name followed by a closing quote, when the name needs no escape
    /// in JSON (no `"`, `\` or control character): a key that starts with these bytes
    /// is that name.
    quoted: Vec<Option<Box<[u8]>>>,
    /// Used instead of a linear search for wide schemas.
    index: Option<HashMap<Box<[u8]>, usize>>,
}

impl FastSchema {
    pub(crate) fn new(columns: &[Column]) -> Self {
        let names: Vec<Box<[u8]>> = columns
            .iter()
            .map(|c| c.field.name().as_bytes().into())
            .collect();
        let index = (names.len() > 12).then(|| {
            names
                .iter()
                .enumerate()
                .rev()
                .map(|(i, n)| (n.clone(), i))
                .collect()
        });
        let usable = names
            .iter()
            .map(|n| &**n)
            .collect::<std::collections::HashSet<&[u8]>>()
            .len()
            == names.len();
        let quoted = names
            .iter()
            .map(|n| {
                n.iter()
                    .all(|&c| c >= 0x20 && c != b'"' && c != b'\\')
                    .then(|| [&n[..], b"\""].concat().into())
            })
            .collect();
        FastSchema {
            quoted,
            usable,
            checked: columns.iter().map(|c| !c.checks.is_empty()).collect(),
            kinds: columns
                .iter()
                .map(|c| kind_of(c.field.data_type()))
                .collect(),
            names,
            index,
        }
    }

    /// When the key at `s` (past its opening quote) is the name of column `guess`, the
    /// column, with the scan moved past the key's closing quote. Records usually list
    /// their fields in one order, so this spares most keys a search.
    fn expected_key(&self, s: &mut Scan<'_>, guess: usize) -> Option<usize> {
        let quoted = self.quoted.get(guess)?.as_deref()?;
        if s.b[s.i..].starts_with(quoted) {
            s.i += quoted.len();
            Some(guess)
        } else {
            None
        }
    }

    /// The column named `key`, trying `guess` (the column after the previous key: records
    /// usually list their fields in one order) first.
    fn column(&self, key: &[u8], guess: usize) -> Option<usize> {
        if self.names.get(guess).is_some_and(|n| **n == *key) {
            return Some(guess);
        }
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.names.iter().position(|n| **n == *key),
        }
    }
}

/// Per-record scratch space, kept between records.
#[derive(Default)]
pub(crate) struct Scratch {
    seen: Vec<bool>,
    text: Vec<u8>,
    dates: DateCache,
}

/// The last date read and its day number: the timestamps of a stream mostly share their
/// date, and recomputing it is a good part of a timestamp's cost.
#[derive(Default)]
struct DateCache {
    date: [u8; 10],
    days: Option<i64>,
}

/// Decodes one JSON record (the whole of `line`, valid UTF-8) into `builders`, each of
/// which holds `rows` values before the call. `preset[i]` marks columns whose value the
/// caller has already pushed (a Kafka record's metadata): the record's own key of that
/// name is skipped, as the per-record path overwrites it.
///
/// Returns `false` when the record needs the per-record path; the builders may then hold
/// part of it, and the caller cuts them back to `rows`.
pub(crate) fn json_record(
    schema: &FastSchema,
    columns: &[Column],
    builders: &mut [ColumnBuilder],
    line: &[u8],
    preset: &[bool],
    scratch: &mut Scratch,
) -> bool {
    if !schema.usable {
        return false;
    }
    let n = columns.len();
    scratch.seen.clear();
    scratch.seen.resize(n, false);
    for (i, p) in preset.iter().enumerate() {
        if *p && i < n {
            scratch.seen[i] = true;
        }
    }
    let mut s = Scan { b: line, i: 0 };
    s.ws();
    if s.next() != Some(b'{') {
        return false;
    }
    s.ws();
    let mut guess = 0;
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.ws();
            if s.next() != Some(b'"') {
                return false;
            }
            let column = match schema.expected_key(&mut s, guess) {
                Some(c) => Some(c),
                None => {
                    let Some(key) = s.plain_string_body() else {
                        return false;
                    };
                    schema.column(key, guess)
                }
            };
            s.ws();
            if s.next() != Some(b':') {
                return false;
            }
            s.ws();
            match column {
                Some(c) if preset.get(c).copied().unwrap_or(false) => {
                    if s.skip_value(0).is_none() {
                        return false;
                    }
                }
                Some(c) => {
                    // A repeated key: serde_json keeps the last value; leave it to that path.
                    if scratch.seen[c] {
                        return false;
                    }
                    scratch.seen[c] = true;
                    if !value(
                        &mut s,
                        schema.kinds[c],
                        schema.checked[c],
                        &columns[c],
                        &mut builders[c],
                        scratch,
                    ) {
                        return false;
                    }
                    guess = c + 1;
                }
                None => {
                    if s.skip_value(0).is_none() {
                        return false;
                    }
                }
            }
            s.ws();
            match s.next() {
                Some(b',') => continue,
                Some(b'}') => break,
                _ => return false,
            }
        }
    }
    s.ws();
    if s.i != line.len() {
        return false;
    }
    for (c, seen) in scratch.seen.iter().enumerate() {
        if !seen {
            if !columns[c].field.is_nullable() {
                return false;
            }
            builders[c].push_null();
        }
    }
    true
}

/// Decodes the JSON value at the scan position into `b`.
fn value(
    s: &mut Scan<'_>,
    kind: Kind,
    checked: bool,
    col: &Column,
    b: &mut ColumnBuilder,
    scratch: &mut Scratch,
) -> bool {
    let text = &mut scratch.text;
    match s.peek() {
        Some(b'n') => {
            return s.literal(b"null") && col.field.is_nullable() && {
                b.push_null();
                true
            };
        }
        None => return false,
        _ => {}
    }
    match kind {
        Kind::Int { lo, hi } => {
            let v = s.number().and_then(|t| t.int());
            return push_int(b, checked, col, lo, hi, v);
        }
        Kind::UInt { hi } => {
            let v = s.number().and_then(|t| t.int());
            return push_uint(b, checked, col, hi, v);
        }
        Kind::Float { f32 } => {
            let v = s.number().and_then(|t| t.float());
            return push_float(b, checked, col, f32, v);
        }
        Kind::Bool => {
            let v = match s.peek() {
                Some(b't') if s.literal(b"true") => true,
                Some(b'f') if s.literal(b"false") => false,
                _ => return false,
            };
            b.push_bool(v);
        }
        Kind::Text { utf8 } => {
            let Some(v) = s.string(text) else {
                return false;
            };
            if utf8 && checked {
                // The scanner checked the string's UTF-8; escapes decode to ASCII.
                match std::str::from_utf8(v) {
                    Ok(t) if col.checks.check_str(t).is_none() => {}
                    _ => return false,
                }
            }
            b.push_bytes(v);
        }
        Kind::Timestamp { unit, naive_utc } => {
            let v = if s.peek() == Some(b'"') {
                let dates = &mut scratch.dates;
                s.string(text)
                    .and_then(|t| iso_timestamp_cached(t, unit, naive_utc, dates))
            } else {
                s.number()
                    .and_then(|t| t.int())
                    .and_then(|ms| millis_to_unit(ms, unit))
            };
            let Some(v) = v else {
                return false;
            };
            return push_temporal(b, checked, col, v);
        }
        Kind::Date { ms } => {
            let Some(days) = s.string(text).and_then(iso_date) else {
                return false;
            };
            return push_temporal(b, checked, col, if ms { days * 86_400_000 } else { days });
        }
        Kind::Other => {
            let start = s.i;
            if s.skip_value(0).is_none() {
                return false;
            }
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&s.b[start..s.i]) else {
                return false;
            };
            let name = col.field.name();
            match json_cell(&v, &col.field, name) {
                Ok(cell) if check_cell(&cell, col).is_ok() => b.push_cell(cell),
                _ => return false,
            }
        }
    }
    true
}

/// Decodes one text cell (a CSV field, not empty) into `b`; `false` when the per-record
/// rules must decide (nothing is then pushed).
pub(crate) fn text_cell(
    schema: &FastSchema,
    c: usize,
    col: &Column,
    s: &str,
    b: &mut ColumnBuilder,
) -> bool {
    let checked = schema.checked[c];
    let bytes = s.as_bytes();
    // The per-record rules trim whitespace (Unicode's) around all but strings; values
    // with any are left to them.
    let plain = |bytes: &[u8]| {
        bytes.first().is_some_and(|b| b.is_ascii_graphic())
            && bytes.last().is_some_and(|b| b.is_ascii_graphic())
    };
    match schema.kinds[c] {
        Kind::Int { lo, hi } => return push_int(b, checked, col, lo, hi, plain_int(bytes)),
        Kind::UInt { hi } => return push_uint(b, checked, col, hi, plain_int(bytes)),
        Kind::Float { f32 } => {
            // The same parser as the per-record rules.
            let v = plain(bytes).then(|| s.parse::<f64>().ok()).flatten();
            return push_float(b, checked, col, f32, v);
        }
        Kind::Bool => {
            let v = if s.eq_ignore_ascii_case("true") {
                true
            } else if s.eq_ignore_ascii_case("false") {
                false
            } else {
                return false;
            };
            b.push_bool(v);
        }
        Kind::Text { utf8 } => {
            if utf8 && checked && col.checks.check_str(s).is_some() {
                return false;
            }
            b.push_bytes(bytes);
        }
        Kind::Timestamp { unit, naive_utc } => {
            let v = if let Some(ms) = plain_int(bytes) {
                millis_to_unit(ms, unit)
            } else if bytes.first().is_some_and(u8::is_ascii_digit) && bytes.len() >= 19 {
                iso_timestamp(bytes, unit, naive_utc)
            } else {
                None
            };
            let Some(v) = v else {
                return false;
            };
            return push_temporal(b, checked, col, v);
        }
        Kind::Date { ms } => {
            let Some(days) = iso_date(bytes) else {
                return false;
            };
            return push_temporal(b, checked, col, if ms { days * 86_400_000 } else { days });
        }
        Kind::Other => return false,
    }
    true
}

/// Pushes a signed integer within `lo..=hi` that the contract's bounds allow.
fn push_int(
    b: &mut ColumnBuilder,
    checked: bool,
    col: &Column,
    lo: i64,
    hi: i64,
    v: Option<i64>,
) -> bool {
    match v {
        Some(v)
            if v >= lo
                && v <= hi
                && !(checked && col.checks.check_number(v as f64, &v).is_some()) =>
        {
            b.push_int(v);
            true
        }
        _ => false,
    }
}

/// Pushes a non-negative integer up to `hi` that the contract's bounds allow.
fn push_uint(b: &mut ColumnBuilder, checked: bool, col: &Column, hi: u64, v: Option<i64>) -> bool {
    match v.and_then(|v| u64::try_from(v).ok()) {
        Some(v) if v <= hi && !(checked && col.checks.check_number(v as f64, &v).is_some()) => {
            b.push_uint(v);
            true
        }
        _ => false,
    }
}

/// Pushes a float that fits the column (`f32`: `Float32`) and the contract's bounds.
fn push_float(
    b: &mut ColumnBuilder,
    checked: bool,
    col: &Column,
    f32: bool,
    v: Option<f64>,
) -> bool {
    let Some(v) = v else {
        return false;
    };
    let beyond_f32 = f32 && v.is_finite() && v.abs() > f32::MAX as f64;
    if beyond_f32 || (checked && col.checks.check_number(v, &v).is_some()) {
        return false;
    }
    b.push_float(v);
    true
}

/// Pushes a date or timestamp value, unless the contract's numeric bounds reject it (the
/// per-record rules hold a temporal value to them by its number).
fn push_temporal(b: &mut ColumnBuilder, checked: bool, col: &Column, v: i64) -> bool {
    if checked && col.checks.check_number(v as f64, &v).is_some() {
        return false;
    }
    b.push_int(v);
    true
}

/// `-?[0-9]{1,18}`: an integer that fits `i64` whatever its digits.
fn plain_int(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(d - b'0');
    }
    Some(if neg { -v } else { v })
}

// ---------------------------------------------------------------------------------------
// Dates and timestamps

fn two(b: &[u8], i: usize) -> Option<u32> {
    let (x, y) = (*b.get(i)?, *b.get(i + 1)?);
    (x.is_ascii_digit() && y.is_ascii_digit())
        .then(|| u32::from(x - b'0') * 10 + u32::from(y - b'0'))
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD` at the start of `b`: days since the epoch.
fn date_prefix(b: &[u8]) -> Option<i64> {
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let y = i64::from(two(b, 0)? * 100 + two(b, 2)?);
    let (m, d) = (two(b, 5)?, two(b, 8)?);
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// Exactly `YYYY-MM-DD`: days since the epoch.
fn iso_date(b: &[u8]) -> Option<i64> {
    if b.len() != 10 {
        return None;
    }
    date_prefix(b)
}

/// `YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|z|±HH:MM]` in `unit`; a value without an offset
/// only when `naive_utc`. Anything else (no seconds, other separators, leap seconds,
/// more than nine fraction digits) is `None`: the per-record rules decide.
fn iso_timestamp(b: &[u8], unit: TimeUnit, naive_utc: bool) -> Option<i64> {
    iso_timestamp_cached(b, unit, naive_utc, &mut DateCache::default())
}

/// [`iso_timestamp`], taking the day number from `dates` when the date is the last one.
fn iso_timestamp_cached(
    b: &[u8],
    unit: TimeUnit,
    naive_utc: bool,
    dates: &mut DateCache,
) -> Option<i64> {
    if b.len() < 19 || !matches!(b[10], b'T' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let days = match dates.days {
        Some(days) if dates.date == b[..10] => days,
        _ => {
            let days = date_prefix(b)?;
            dates.date.copy_from_slice(&b[..10]);
            dates.days = Some(days);
            days
        }
    };
    let (h, mi, sec) = (two(b, 11)?, two(b, 14)?, two(b, 17)?);
    if h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            nanos = nanos * 10 + i64::from(b[i] - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos *= 10i64.pow((9 - digits) as u32);
    }
    let offset: i64 = match b.get(i) {
        None if naive_utc => 0,
        None => return None,
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (two(b, i + 1)?, two(b, i + 4)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = i64::from(oh * 3600 + om * 60);
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + sec) - offset;
    match unit {
        TimeUnit::Second => Some(secs),
        TimeUnit::Millisecond => Some(secs * 1_000 + nanos / 1_000_000),
        TimeUnit::Microsecond => Some(secs * 1_000_000 + nanos / 1_000),
        TimeUnit::Nanosecond => secs.checked_mul(1_000_000_000)?.checked_add(nanos),
    }
}
