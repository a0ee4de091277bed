//! Unit tests of the per-record decoder: decimals, timestamps, JSON records and the
//! conforming of foreign batches.

use super::cells::{parse_decimal, DecimalError};
use super::*;
use arrow::array::{Int32Array, TimestampMicrosecondArray, TimestampNanosecondArray};
use arrow::datatypes::{Field, Schema};
use serde_json::json;

#[test]
fn decimals_are_exact_or_rejected() {
    assert_eq!(parse_decimal("12.5", 10, 2), Ok(1250));
    assert_eq!(parse_decimal("-0.01", 10, 2), Ok(-1));
    assert_eq!(parse_decimal("1e3", 10, 2), Ok(100000));
    assert_eq!(parse_decimal("1.500", 10, 1), Ok(15));
    assert_eq!(parse_decimal("0", 3, 2), Ok(0));
    assert_eq!(parse_decimal("1.234", 10, 2), Err(DecimalError::Scale));
    assert_eq!(parse_decimal("12345", 5, 2), Err(DecimalError::Precision));
    assert_eq!(parse_decimal("999.99", 5, 2), Ok(99999));
    assert_eq!(parse_decimal("abc", 5, 2), Err(DecimalError::Syntax));
    assert_eq!(parse_decimal("1.2.3", 5, 2), Err(DecimalError::Syntax));
    assert_eq!(parse_decimal("", 5, 2), Err(DecimalError::Syntax));
}

#[test]
fn timestamps_parse_in_every_documented_form() {
    let base = 1_704_164_645_000i64; // 2024-01-02T03:04:05Z
    for s in [
        "2024-01-02T03:04:05Z",
        "2024-01-02T03:04:05.000Z",
        "2024-01-02 03:04:05Z",
        "2024-01-02T04:04:05+01:00",
        "2024-01-02T04:04:05+0100",
        "2024-01-02 04:04:05+01:00",
        "2024-01-02T03:04:05",
        "2024-01-02 03:04:05",
    ] {
        let t = parse_timestamp(s).unwrap_or_else(|| panic!("{s}"));
        assert_eq!(t.timestamp_millis(), base, "{s}");
    }
    assert_eq!(
        parse_timestamp("2024-01-02T03:04:05.123456Z")
            .unwrap()
            .timestamp_micros(),
        base * 1000 + 123_456
    );
    assert_eq!(
        parse_timestamp("2024-01-02").unwrap().timestamp_millis(),
        1_704_153_600_000
    );
    assert!(parse_timestamp("yesterday").is_none());
    // Naive values are local time in the column's zone; explicit offsets win.
    let paris = parse_timestamp_in("2024-07-01T12:00:00", Some("Europe/Paris")).unwrap();
    assert_eq!(paris.to_rfc3339(), "2024-07-01T10:00:00+00:00");
    let z = parse_timestamp_in("2024-07-01T12:00:00Z", Some("Europe/Paris")).unwrap();
    assert_eq!(z.to_rfc3339(), "2024-07-01T12:00:00+00:00");
    let utc = parse_timestamp_in("2024-07-01T12:00:00", Some("UTC")).unwrap();
    assert_eq!(utc.to_rfc3339(), "2024-07-01T12:00:00+00:00");
    assert!(parse_timestamp_in("2024-03-31T02:30:00", Some("Europe/Paris")).is_none());
    assert!(parse_timestamp("2024-13-02T00:00:00Z").is_none());
    // A multi-byte character across byte 10 is not a timestamp, and slicing there must
    // not panic.
    for s in [
        "2024-01-0é:00:00",
        "2024-01-01é12:00",
        "日本語の時刻です",
        "2024-01-01\u{1F600}",
    ] {
        assert!(parse_timestamp_in(s, Some("Europe/Paris")).is_none(), "{s}");
    }
}

#[test]
fn json_records_decode_and_problems_have_codes() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new(
            "s",
            DataType::Struct(vec![Field::new("x", DataType::Int64, false)].into()),
            true,
        ),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ]));
    let d = ContractDecoder::new(schema.clone(), None).unwrap();
    let mut b = d.builder();
    b.push_json(&json!({"id": 1, "s": {"x": 5}, "tags": ["a", null]}))
        .unwrap();
    b.push_json(&json!({"id": 2.0, "extra": true})).unwrap();
    let e = b.push_json(&json!({"id": 3, "s": {}})).unwrap_err();
    assert_eq!(e.code.code, "ETL703");
    assert_eq!(e.field.as_deref(), Some("s.x"));
    let e = b.push_json(&json!({"id": 3000000000i64})).unwrap_err();
    assert_eq!(e.code.code, "ETL702");
    assert!(e.reason.contains("out of range for Int32"), "{}", e.reason);
    let e = b.push_json(&json!({"id": 4, "tags": [1]})).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("tags[0]"));
    let e = b.push_json(&json!([1])).unwrap_err();
    assert_eq!(e.code.code, "ETL701");
    assert_eq!(b.len(), 2);
    let batch = b.finish().unwrap().unwrap();
    assert_eq!(batch.schema(), schema);
    assert_eq!(batch.num_rows(), 2);
    assert_eq!(
        row_as_json(&batch, 0),
        r#"{"id":1,"s":{"x":5},"tags":["a",null]}"#
    );
    assert_eq!(row_as_json(&batch, 1), r#"{"id":2,"s":null,"tags":null}"#);
    assert!(b.finish().unwrap().is_none());
}

#[test]
fn conform_casts_losslessly_and_refuses_narrowing() {
    let target = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("missing", DataType::Utf8, true),
    ]));
    let d = ContractDecoder::new(target.clone(), None).unwrap();
    let src = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        ])),
        vec![
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])),
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(1_000_000_000),
                Some(5),
                Some(1_500),
            ])),
        ],
    )
    .unwrap();
    let c = d.conform_batch(&src).unwrap();
    assert_eq!(c.batch.schema(), target);
    assert_eq!(c.batch.num_rows(), 1);
    assert_eq!(c.rejected.len(), 2);
    assert_eq!(c.rejected[0].0, 1);
    assert_eq!(c.rejected[0].1.code.code, "ETL703");
    assert_eq!(c.rejected[1].0, 2);
    assert_eq!(c.rejected[1].1.code.code, "ETL702");
    let t = c
        .batch
        .column(1)
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .unwrap();
    assert_eq!(t.value(0), 1_000_000);

    let narrow = Arc::new(Schema::new(vec![Field::new("a", DataType::Int8, true)]));
    let d = ContractDecoder::new(narrow, None).unwrap();
    let e = d.conform_batch(&src).unwrap_err();
    assert_eq!(e.code(), "ETL702");
}
