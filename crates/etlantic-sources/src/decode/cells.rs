//! Values → cells: the per-record rules that turn a JSON value or a CSV text cell into a
//! cell of a field's type (integers in range, floats, exact decimals, dates, times,
//! timestamps, nested structs and lists), or say why not with the record's problem; and
//! the check of a cell against its field's constraints.

use super::{Cell, Column, RecordProblem};
use arrow::datatypes::{DataType, Field, TimeUnit};
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc};
use serde_json::Value;

pub(super) fn show_str(s: &str) -> String {
    show(&Value::String(s.to_string()))
}

fn show(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn type_name(dt: &DataType) -> String {
    use DataType::*;
    match dt {
        Boolean => "a boolean".into(),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            format!("an integer ({dt})")
        }
        Float32 | Float64 => format!("a number ({dt})"),
        Decimal128(p, s) => format!("a decimal({p},{s})"),
        Utf8 | LargeUtf8 => "a string".into(),
        Binary | LargeBinary => "a string (binary)".into(),
        Date32 | Date64 => "a date (YYYY-MM-DD)".into(),
        Time32(_) | Time64(_) => "a time (HH:MM:SS)".into(),
        Timestamp(_, _) => "a timestamp (ISO-8601 string or epoch milliseconds)".into(),
        Struct(_) => "an object".into(),
        List(_) => "an array".into(),
        other => other.to_string(),
    }
}

fn int_range(dt: &DataType) -> (i128, i128) {
    use DataType::*;
    match dt {
        Int8 => (i8::MIN as i128, i8::MAX as i128),
        Int16 => (i16::MIN as i128, i16::MAX as i128),
        Int32 => (i32::MIN as i128, i32::MAX as i128),
        Int64 => (i64::MIN as i128, i64::MAX as i128),
        UInt8 => (0, u8::MAX as i128),
        UInt16 => (0, u16::MAX as i128),
        UInt32 => (0, u32::MAX as i128),
        _ => (0, u64::MAX as i128),
    }
}

fn is_signed(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    )
}

fn int_cell(
    v: i128,
    dt: &DataType,
    path: &str,
    shown: &str,
) -> std::result::Result<Cell, RecordProblem> {
    let (lo, hi) = int_range(dt);
    if v < lo || v > hi {
        return Err(RecordProblem::type_mismatch(
            path,
            format!("field `{path}`: value {shown} is out of range for {dt}"),
        ));
    }
    Ok(if is_signed(dt) {
        Cell::Int(v as i64)
    } else {
        Cell::UInt(v as u64)
    })
}

fn json_integer(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i as i128);
    }
    if let Some(u) = n.as_u64() {
        return Some(u as i128);
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 1.0e20).then_some(f as i128)
}

fn float_cell(
    f: f64,
    dt: &DataType,
    path: &str,
    shown: &str,
) -> std::result::Result<Cell, RecordProblem> {
    if *dt == DataType::Float32 && f.is_finite() && f.abs() > f32::MAX as f64 {
        return Err(RecordProblem::type_mismatch(
            path,
            format!("field `{path}`: value {shown} is out of range for Float32"),
        ));
    }
    Ok(Cell::Float(f))
}

pub(super) fn json_cell(
    v: &Value,
    field: &Field,
    path: &str,
) -> std::result::Result<Cell, RecordProblem> {
    if v.is_null() {
        return if field.is_nullable() {
            Ok(Cell::Null)
        } else {
            Err(RecordProblem::missing_required(path, "null"))
        };
    }
    let dt = field.data_type();
    let wrong = || {
        RecordProblem::type_mismatch(
            path,
            format!(
                "field `{path}`: expected {}, got {} {}",
                type_name(dt),
                json_kind(v),
                show(v)
            ),
        )
    };
    use DataType::*;
    match dt {
        Boolean => v.as_bool().map(Cell::Bool).ok_or_else(wrong),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => match v {
            Value::Number(n) => {
                let i = json_integer(n).ok_or_else(wrong)?;
                int_cell(i, dt, path, &show(v))
            }
            _ => Err(wrong()),
        },
        Float32 | Float64 => match v {
            Value::Number(n) => float_cell(n.as_f64().ok_or_else(wrong)?, dt, path, &show(v)),
            _ => Err(wrong()),
        },
        Utf8 | LargeUtf8 => v
            .as_str()
            .map(|s| Cell::Str(s.to_string()))
            .ok_or_else(wrong),
        Binary | LargeBinary => v
            .as_str()
            .map(|s| Cell::Bytes(s.as_bytes().to_vec()))
            .ok_or_else(wrong),
        Decimal128(p, s) => {
            let text = match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.trim().to_string(),
                _ => return Err(wrong()),
            };
            parse_decimal(&text, *p, *s)
                .map(Cell::Dec)
                .map_err(|why| decimal_problem(path, v, *p, *s, why))
        }
        Date32 | Date64 => {
            let s = v.as_str().ok_or_else(wrong)?;
            date_cell(s, dt).ok_or_else(wrong)
        }
        Time32(_) | Time64(_) => {
            let s = v.as_str().ok_or_else(wrong)?;
            time_cell(s, dt).ok_or_else(wrong)
        }
        Timestamp(unit, tz) => {
            let t = match v {
                Value::String(s) => {
                    parse_timestamp_in(s, tz.as_deref()).and_then(|t| datetime_to_unit(&t, *unit))
                }
                Value::Number(n) => json_integer(n)
                    .and_then(|ms| i64::try_from(ms).ok())
                    .and_then(|ms| millis_to_unit(ms, *unit)),
                _ => None,
            };
            t.map(Cell::Int).ok_or_else(wrong)
        }
        Struct(fields) => {
            let obj = v.as_object().ok_or_else(wrong)?;
            let mut cells = Vec::with_capacity(fields.len());
            for child in fields.iter() {
                let child_path = format!("{path}.{}", child.name());
                let cell = match obj.get(child.name()) {
                    None if !child.is_nullable() => {
                        return Err(RecordProblem::missing_required(&child_path, "missing"))
                    }
                    None => Cell::Null,
                    Some(cv) => json_cell(cv, child, &child_path)?,
                };
                cells.push(cell);
            }
            Ok(Cell::Struct(cells))
        }
        List(item) => {
            let arr = v.as_array().ok_or_else(wrong)?;
            let mut cells = Vec::with_capacity(arr.len());
            for (i, iv) in arr.iter().enumerate() {
                cells.push(json_cell(iv, item, &format!("{path}[{i}]"))?);
            }
            Ok(Cell::List(cells))
        }
        _ => Err(wrong()),
    }
}

pub(super) fn text_cell(
    s: &str,
    field: &Field,
    path: &str,
) -> std::result::Result<Cell, RecordProblem> {
    if s.is_empty() {
        return if field.is_nullable() {
            Ok(Cell::Null)
        } else {
            Err(RecordProblem::missing_required(path, "empty"))
        };
    }
    let dt = field.data_type();
    let wrong = || {
        RecordProblem::type_mismatch(
            path,
            format!(
                "field `{path}`: expected {}, got {}",
                type_name(dt),
                show_str(s)
            ),
        )
    };
    let t = s.trim();
    use DataType::*;
    match dt {
        Boolean => {
            if t.eq_ignore_ascii_case("true") {
                Ok(Cell::Bool(true))
            } else if t.eq_ignore_ascii_case("false") {
                Ok(Cell::Bool(false))
            } else {
                Err(wrong())
            }
        }
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => {
            let i: i128 = t.parse().map_err(|_| wrong())?;
            int_cell(i, dt, path, t)
        }
        Float32 | Float64 => float_cell(t.parse().map_err(|_| wrong())?, dt, path, t),
        Utf8 | LargeUtf8 => Ok(Cell::Str(s.to_string())),
        Binary | LargeBinary => Ok(Cell::Bytes(s.as_bytes().to_vec())),
        Decimal128(p, sc) => parse_decimal(t, *p, *sc)
            .map(Cell::Dec)
            .map_err(|why| decimal_problem(path, &Value::String(t.to_string()), *p, *sc, why)),
        Date32 | Date64 => date_cell(t, dt).ok_or_else(wrong),
        Time32(_) | Time64(_) => time_cell(t, dt).ok_or_else(wrong),
        Timestamp(unit, tz) => {
            let v = if let Ok(ms) = t.parse::<i64>() {
                millis_to_unit(ms, *unit)
            } else {
                parse_timestamp_in(t, tz.as_deref()).and_then(|d| datetime_to_unit(&d, *unit))
            };
            v.map(Cell::Int).ok_or_else(wrong)
        }
        Struct(_) | List(_) => {
            let v: Value = serde_json::from_str(t).map_err(|_| wrong())?;
            json_cell(&v, field, path)
        }
        _ => Err(wrong()),
    }
}

fn decimal_problem(path: &str, v: &Value, p: u8, s: i8, why: DecimalError) -> RecordProblem {
    let reason = match why {
        DecimalError::Syntax => format!(
            "field `{path}`: expected a decimal({p},{s}), got {} {}",
            json_kind(v),
            show(v)
        ),
        DecimalError::Scale => format!(
            "field `{path}`: value {} has more than {s} decimal places (decimal({p},{s})); it is not rounded",
            show(v)
        ),
        DecimalError::Precision => format!(
            "field `{path}`: value {} does not fit decimal({p},{s})",
            show(v)
        ),
    };
    RecordProblem::type_mismatch(path, reason)
}

pub(super) fn check_cell(cell: &Cell, col: &Column) -> std::result::Result<(), RecordProblem> {
    if col.checks.is_empty() {
        return Ok(());
    }
    let problem = match cell {
        Cell::Int(i) => col.checks.check_number(*i as f64, i),
        Cell::UInt(u) => col.checks.check_number(*u as f64, u),
        Cell::Float(f) => col.checks.check_number(*f, f),
        Cell::Dec(d) => {
            if let DataType::Decimal128(_, s) = col.field.data_type() {
                let v = *d as f64 / 10f64.powi(*s as i32);
                col.checks.check_number(v, &v)
            } else {
                None
            }
        }
        Cell::Str(s) => col.checks.check_str(s),
        _ => None,
    };
    match problem {
        Some(p) => Err(p),
        None => Ok(()),
    }
}

/// Why a decimal did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecimalError {
    Syntax,
    Scale,
    Precision,
}

/// Parses a decimal number (`-12.50`, `1e3`, `+.5`) into its unscaled value at `scale`,
/// refusing rounding and overflow.
pub(super) fn parse_decimal(
    text: &str,
    precision: u8,
    scale: i8,
) -> std::result::Result<i128, DecimalError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
        negative = bytes[i] == b'-';
        i += 1;
    }
    let mut digits = String::new();
    let mut frac_len: i64 = 0;
    let mut seen_digit = false;
    let mut seen_dot = false;
    while i < bytes.len() {
        match bytes[i] {
            b'0'..=b'9' => {
                digits.push(bytes[i] as char);
                seen_digit = true;
                if seen_dot {
                    frac_len += 1;
                }
            }
            b'.' if !seen_dot => seen_dot = true,
            b'e' | b'E' => break,
            _ => return Err(DecimalError::Syntax),
        }
        i += 1;
    }
    if !seen_digit {
        return Err(DecimalError::Syntax);
    }
    let mut exp: i64 = 0;
    if i < bytes.len() {
        let e = &text[i + 1..];
        if e.is_empty() {
            return Err(DecimalError::Syntax);
        }
        exp = e.parse().map_err(|_| DecimalError::Syntax)?;
    }
    // value = digits * 10^(exp - frac_len)
    let mut exp10 = exp - frac_len;
    let mut digits = digits.trim_start_matches('0').to_string();
    while digits.ends_with('0') {
        digits.pop();
        exp10 += 1;
    }
    if digits.is_empty() {
        return Ok(0);
    }
    let shift = scale as i64 + exp10;
    if shift < 0 {
        return Err(DecimalError::Scale);
    }
    if digits.len() as i64 + shift > precision as i64 {
        return Err(DecimalError::Precision);
    }
    let mut v: i128 = digits.parse().map_err(|_| DecimalError::Precision)?;
    for _ in 0..shift {
        v = v.checked_mul(10).ok_or(DecimalError::Precision)?;
    }
    Ok(if negative { -v } else { v })
}

const EPOCH_DAYS_CE: i32 = 719_163;

fn date_cell(s: &str, dt: &DataType) -> Option<Cell> {
    let d = NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").ok()?;
    let days = d.num_days_from_ce() - EPOCH_DAYS_CE;
    Some(match dt {
        DataType::Date64 => Cell::Int(days as i64 * 86_400_000),
        _ => Cell::Int(days as i64),
    })
}

fn time_cell(s: &str, dt: &DataType) -> Option<Cell> {
    let t = NaiveTime::parse_from_str(s.trim(), "%H:%M:%S%.f")
        .or_else(|_| NaiveTime::parse_from_str(s.trim(), "%H:%M"))
        .ok()?;
    let nanos = t.num_seconds_from_midnight() as i64 * 1_000_000_000 + t.nanosecond() as i64;
    Some(Cell::Int(match dt {
        DataType::Time32(TimeUnit::Second) => nanos / 1_000_000_000,
        DataType::Time32(TimeUnit::Millisecond) => nanos / 1_000_000,
        DataType::Time64(TimeUnit::Microsecond) => nanos / 1_000,
        _ => nanos,
    }))
}

/// Parses an ISO-8601 timestamp like [`parse_timestamp`], except that a naive value (no
/// `Z`, no offset) is local time in `zone` (an IANA name or an offset) when the column has
/// a zone other than UTC — the contract's `defaultTimezone`. A local time that does not
/// exist (a DST gap) is not a timestamp; an ambiguous one takes the earlier instant.
pub fn parse_timestamp_in(s: &str, zone: Option<&str>) -> Option<DateTime<Utc>> {
    let zone = match zone {
        None | Some("UTC") | Some("+00:00") | Some("Z") | Some("Etc/UTC") => {
            return parse_timestamp(s)
        }
        Some(z) => z,
    };
    let t = s.trim();
    let has_offset = t.ends_with(['Z', 'z'])
        || DateTime::parse_from_rfc3339(t).is_ok()
        // Bytes, not a `str` slice: offset 10 may fall inside a multi-byte character.
        || t.as_bytes()
            .get(10..)
            .is_some_and(|rest| rest.contains(&b'+') || rest.contains(&b'-'));
    if has_offset {
        return parse_timestamp(s);
    }
    let naive = parse_timestamp(s)?.naive_utc();
    let tz: arrow::array::timezone::Tz = zone.parse().ok()?;
    use chrono::TimeZone;
    tz.from_local_datetime(&naive)
        .earliest()
        .map(|d| d.with_timezone(&Utc))
}

/// Parses an ISO-8601 timestamp: with `Z` or an offset, or naive (taken as UTC), with `T`
/// or a space between date and time, with or without fractional seconds; a bare date is
/// midnight UTC.
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    for fmt in [
        "%Y-%m-%dT%H:%M:%S%.f%:z",
        "%Y-%m-%d %H:%M:%S%.f%:z",
        "%Y-%m-%dT%H:%M:%S%.f%z",
        "%Y-%m-%d %H:%M:%S%.f%z",
        "%Y-%m-%dT%H:%M%:z",
        "%Y-%m-%d %H:%M%:z",
    ] {
        if let Ok(t) = DateTime::parse_from_str(s, fmt) {
            return Some(t.with_timezone(&Utc));
        }
    }
    let naive = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix('z'))
        .unwrap_or(s);
    for fmt in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(naive, fmt) {
            return Some(t.and_utc());
        }
    }
    if naive.len() == 10 {
        if let Ok(d) = NaiveDate::parse_from_str(naive, "%Y-%m-%d") {
            return Some(d.and_hms_opt(0, 0, 0)?.and_utc());
        }
    }
    None
}

fn datetime_to_unit(t: &DateTime<Utc>, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => Some(t.timestamp()),
        TimeUnit::Millisecond => Some(t.timestamp_millis()),
        TimeUnit::Microsecond => Some(t.timestamp_micros()),
        TimeUnit::Nanosecond => t.timestamp_nanos_opt(),
    }
}

/// Converts epoch milliseconds to a value of `unit` (floor for seconds).
pub fn millis_to_unit(ms: i64, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => Some(ms.div_euclid(1000)),
        TimeUnit::Millisecond => Some(ms),
        TimeUnit::Microsecond => ms.checked_mul(1_000),
        TimeUnit::Nanosecond => ms.checked_mul(1_000_000),
    }
}
