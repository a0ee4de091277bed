//! The fast path of the JSON and text decoders.
//!
//! It decodes the common shapes of a record straight into the column builders, with no
//! intermediate `serde_json::Value` and no allocation per value. It is a *subset* of the
//! per-record path in `mod.rs`, never a second definition of the rules: whatever it does
//! not recognise with certainty — an escape it does not decode, a number that may round
//! differently, a timestamp in an unusual form, any value that may break a rule — makes it
//! give up on that record (or text cell), and the per-record path decides, with its exact
//! reasons. So the two paths accept the same records and produce the same values; the
//! property tests of `tests/decode_fast_path.rs` hold them to that.

use super::columns::ColumnBuilder;
use super::{check_cell, json_cell, millis_to_unit, Column};
use arrow::datatypes::{DataType, TimeUnit};
use std::collections::HashMap;

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

// ---------------------------------------------------------------------------------------
// The JSON scanner: strict RFC 8259, as serde_json reads it.

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

/// A number token as it appears in the text.
struct Number<'a> {
    text: &'a [u8],
    /// No fraction and no exponent.
    integral: bool,
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

impl Number<'_> {
    /// The token as an `i64` when it is an integer of at most 18 digits (`-0` is left to
    /// serde_json, which reads it as the float `-0.0`).
    fn int(&self) -> Option<i64> {
        if !self.integral || self.text == b"-0" {
            return None;
        }
        plain_int(self.text)
    }

    /// The token as an `f64`, exactly as serde_json reads it. Integers and decimals of at
    /// most 15 digits with a power of ten up to 22 are computed with one exact
    /// multiplication or division (correctly rounded, so every correct parser agrees);
    /// the rest goes through serde_json itself.
    fn float(&self) -> Option<f64> {
        if self.integral {
            if let Some(v) = self.int() {
                return Some(v as f64);
            }
        }
        let t = self.text;
        let (neg, mut i) = if t.first() == Some(&b'-') {
            (true, 1)
        } else {
            (false, 0)
        };
        let mut mantissa: u64 = 0;
        let mut digits = 0;
        let mut frac = 0i32;
        let mut dot = false;
        while i < t.len() {
            match t[i] {
                d @ b'0'..=b'9' => {
                    mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
                    digits += 1;
                    if dot {
                        frac += 1;
                    }
                }
                b'.' => dot = true,
                _ => break,
            }
            i += 1;
        }
        let mut exp: i32 = 0;
        if i < t.len() {
            // An exponent: `e` or `E`, a sign, digits (the grammar was checked).
            let e = std::str::from_utf8(&t[i + 1..]).ok()?;
            exp = match e.parse::<i32>() {
                Ok(x) => x,
                Err(_) => return self.serde_float(),
            };
        }
        let exp = exp.checked_sub(frac)?;
        if digits > 15 || exp.unsigned_abs() > 22 {
            return self.serde_float();
        }
        let f = mantissa as f64;
        let f = if exp >= 0 {
            f * POW10[exp as usize]
        } else {
            f / POW10[(-exp) as usize]
        };
        Some(if neg { -f } else { f })
    }

    fn serde_float(&self) -> Option<f64> {
        serde_json::from_slice::<f64>(self.text).ok()
    }
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn ws(&mut self) {
        let skipped = self.b[self.i..]
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        self.i += skipped;
    }

    /// The bytes of a string from the scan position up to its closing quote or its first
    /// escape (`Some((length, at_quote))`), checked: no control character, and UTF-8 (the
    /// scanner reads bytes; only inside strings may they be other than ASCII).
    fn segment(&self) -> Option<(usize, bool)> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        // Whether some byte of `w` is zero, or below `n` (n <= 0x80): exact as an "any".
        let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
        let rest = &self.b[self.i..];
        let mut k = 0;
        let mut ascii = true;
        loop {
            // Eight bytes at a time while none is a quote, a backslash, a control
            // character or non-ASCII: most strings are short ASCII, and this finds their
            // end in a few steps without setting up a vector search.
            while let Some(chunk) = rest.get(k..k + 8) {
                let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                let special = below(w ^ (ONES * u64::from(b'"')), 1)
                    | below(w ^ (ONES * u64::from(b'\\')), 1)
                    | below(w, 0x20)
                    | (w & HIGHS);
                if special != 0 {
                    break;
                }
                k += 8;
            }
            // Byte by byte through the word that stopped the loop (or the last bytes).
            let stop = (k + 8).min(rest.len());
            while k < stop {
                match rest[k] {
                    b'"' | b'\\' => {
                        if !ascii && std::str::from_utf8(&rest[..k]).is_err() {
                            return None;
                        }
                        return Some((k, rest[k] == b'"'));
                    }
                    c if c < 0x20 => return None,
                    c => ascii &= c < 0x80,
                }
                k += 1;
            }
            if k >= rest.len() {
                return None;
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// A string without escapes (a key), from past its opening quote: its bytes.
    fn plain_string_body(&mut self) -> Option<&'a [u8]> {
        let (len, at_quote) = self.segment()?;
        if !at_quote {
            return None;
        }
        let start = self.i;
        self.i += len + 1;
        Some(&self.b[start..start + len])
    }

    /// A string value: its bytes, with the escapes `\" \\ \/ \b \f \n \r \t` decoded into
    /// `buf` when there are any. `\u` escapes (and surrogate pairs) are left to serde_json.
    fn string<'s>(&mut self, buf: &'s mut Vec<u8>) -> Option<&'s [u8]>
    where
        'a: 's,
    {
        if self.next()? != b'"' {
            return None;
        }
        let (len, at_quote) = self.segment()?;
        let start = self.i;
        self.i += len + 1;
        if at_quote {
            return Some(&self.b[start..start + len]);
        }
        // Escapes: the string is decoded into `buf`, segment by segment.
        buf.clear();
        buf.extend_from_slice(&self.b[start..start + len]);
        loop {
            buf.push(match self.next()? {
                b'"' => b'"',
                b'\\' => b'\\',
                b'/' => b'/',
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                _ => return None,
            });
            let (len, at_quote) = self.segment()?;
            buf.extend_from_slice(&self.b[self.i..self.i + len]);
            self.i += len + 1;
            if at_quote {
                return Some(buf.as_slice());
            }
        }
    }

    /// A number token, its grammar checked: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<Number<'a>> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.i += 1;
            integral = false;
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        Some(Number {
            text: &self.b[start..self.i],
            integral,
        })
    }

    fn digits(&mut self) {
        let n = self.b[self.i..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        self.i += n;
    }

    /// Skips one value, checking it as serde_json would (nested at most 64 deep here;
    /// deeper values are left to serde_json and its own limit).
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > 64 {
            return None;
        }
        match self.peek()? {
            b'"' => {
                // Checked as a value is (`\u` escapes, which may be lone surrogates, are
                // left to serde_json); decoded only when it has escapes.
                self.string(&mut Vec::new())?;
            }
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    let mut ignored = Vec::new();
                    self.string(&mut ignored)?;
                    self.ws();
                    if self.next()? != b':' {
                        return None;
                    }
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => break,
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => break,
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true").then_some(())?,
            b'f' => self.literal(b"false").then_some(())?,
            b'n' => self.literal(b"null").then_some(())?,
            _ => {
                let n = self.number()?;
                // serde_json refuses numbers beyond f64's range.
                if !n.integral && !n.float()?.is_finite() {
                    return None;
                }
                if n.integral && n.text.len() > 300 {
                    return None;
                }
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
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
}
