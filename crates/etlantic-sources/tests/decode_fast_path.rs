//! The decoders' fast path against their per-record path (proptest): for any JSON record
//! or CSV row — well-formed, mistyped, odd numbers, escapes, unusual timestamps, repeated
//! keys, broken text — the fast path adds exactly the records the per-record path adds,
//! with the same values, and leaves every other record to it (which then gives the
//! reason). A fast path that accepted one record too many, or decoded one value
//! differently, fails here.

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use etlantic_core::contract::Contract;
use etlantic_sources::decode::{BatchBuilder, ContractDecoder};
use proptest::prelude::*;
use std::sync::Arc;

fn schema() -> Arc<Schema> {
    let ts = |unit, tz: Option<&str>| DataType::Timestamp(unit, tz.map(Arc::from));
    Arc::new(Schema::new(vec![
        Field::new("i8", DataType::Int8, true),
        Field::new("i32", DataType::Int32, true),
        Field::new("i64", DataType::Int64, false),
        Field::new("u8", DataType::UInt8, true),
        Field::new("u64", DataType::UInt64, true),
        Field::new("f32", DataType::Float32, true),
        Field::new("f64", DataType::Float64, true),
        Field::new("b", DataType::Boolean, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("code", DataType::Utf8, true),
        Field::new("bin", DataType::Binary, true),
        Field::new("ts", ts(TimeUnit::Millisecond, Some("UTC")), false),
        Field::new(
            "ts_paris",
            ts(TimeUnit::Microsecond, Some("Europe/Paris")),
            true,
        ),
        Field::new("ts_ns", ts(TimeUnit::Nanosecond, None), true),
        Field::new("ts_s", ts(TimeUnit::Second, None), true),
        Field::new("d32", DataType::Date32, true),
        Field::new("d64", DataType::Date64, true),
        Field::new("dec", DataType::Decimal128(10, 2), true),
        Field::new("t", DataType::Time64(TimeUnit::Microsecond), true),
        Field::new(
            "st",
            DataType::Struct(vec![Field::new("a", DataType::Int64, true)].into()),
            true,
        ),
        Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
        Field::new("ls", DataType::LargeUtf8, true),
        Field::new("bounded", DataType::Int64, true),
        Field::new("bounded_day", DataType::Date32, true),
        Field::new("bounded_ts", ts(TimeUnit::Millisecond, None), true),
    ]))
}

/// A contract with rules on `code` (length, pattern), `bounded` (bounds) and the bounded
/// date and timestamp.
fn contract() -> Contract {
    let doc = serde_json::json!({
        "version": "1.0.0", "apiVersion": "v3.1.0", "kind": "DataContract", "id": "t",
        "status": "active",
        "schema": [{"name": "t", "logicalType": "object", "properties": [
            {"name": "code", "logicalType": "string",
             "logicalTypeOptions": {"maxLength": 4, "pattern": "[A-Z]+"}},
            {"name": "bounded", "logicalType": "integer",
             "logicalTypeOptions": {"minimum": 0, "maximum": 100}},
            // ODCS writes bounds of dates and timestamps as strings; a number in one
            // still bounds the column's value (days, or units since the epoch).
            {"name": "bounded_day", "logicalType": "date",
             "logicalTypeOptions": {"minimum": "0"}},
            {"name": "bounded_ts", "logicalType": "timestamp",
             "logicalTypeOptions": {"minimum": "0"}},
        ]}]
    });
    Contract::parse(&doc.to_string(), "t.json", None).expect("contract")
}

fn decoders() -> (ContractDecoder, ContractDecoder) {
    let c = contract();
    let fast = ContractDecoder::new(schema(), Some(&c)).expect("decoder");
    (fast.clone().with_fast_path(false), fast)
}

const NAMES: [&str; 26] = [
    "i8",
    "i32",
    "i64",
    "u8",
    "u64",
    "f32",
    "f64",
    "b",
    "s",
    "code",
    "bin",
    "ts",
    "ts_paris",
    "ts_ns",
    "ts_s",
    "d32",
    "d64",
    "dec",
    "t",
    "st",
    "l",
    "ls",
    "bounded",
    "bounded_day",
    "bounded_ts",
    "unknown",
];

/// A JSON value's text, chosen to sit on the edges of the fast path.
fn json_value() -> impl Strategy<Value = String> {
    let odd = [
        "0",
        "-0",
        "7",
        "-128",
        "128",
        "255",
        "256",
        "100",
        "101",
        "-1",
        "01",
        "1.",
        ".5",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775809",
        "123456789012345678",
        "1234567890123456789012",
        "3.0",
        "1e2",
        "1E+2",
        "1.5",
        "-1.5e-3",
        "0.1",
        "1e400",
        "-1e400",
        "-0.0",
        "3.4028236e38",
        "1.7976931348623157e308",
        "4.9e-324",
        "0.30000000000000004",
        "123456789.123456789",
        "1e-30",
        "1704164645000",
        "-1704164645000",
        "12.345",
        "true",
        "false",
        "null",
        "nul",
        "tru",
        "[]",
        "{}",
        "[1, \"a\", null]",
        "{\"a\": 5}",
        "{\"a\": \"x\"}",
        "[\"x\", \"y\"]",
        "{\"a\": [1, {\"b\": [true, null]}], \"c\": \"\\u00e9\"}",
        "[1,]",
        "{\"a\" 1}",
        "\"\"",
        "\"abc\"",
        "\"ABC\"",
        "\"ABCDE\"",
        "\"A\\\"B\"",
        "\"\\u00e9t\\u00e9\"",
        "\"\\ud800\"",
        "\"\\ud83d\\ude00\"",
        "\"x\\ty\\n\"",
        "\"\\/\\\\\\b\\f\\r\"",
        "\"bad \\q escape\"",
        "\"a\u{1}b\"",
        "\"日本\"",
        "\"12.50\"",
        "\" 12.5 \"",
        "\"2024-01-02T03:04:05Z\"",
        "\"2024-01-02T03:04:05.123Z\"",
        "\"2024-01-02 03:04:05.123456789\"",
        "\"2024-01-02T03:04:05.1234567891Z\"",
        "\"2024-02-30T00:00:00Z\"",
        "\"2024-02-29T23:59:59.999+01:00\"",
        "\"2024-01-02T03:04:05-05:30\"",
        "\"2024-01-02T03:04:05+24:00\"",
        "\"2024-01-02T03:04:05+0100\"",
        "\"2024-03-31T02:30:00\"",
        "\"2024-10-27T02:30:00\"",
        "\"2024-01-02t03:04:05z\"",
        "\"2024-01-02T03:04:60Z\"",
        "\"2024-01-02T24:00:00Z\"",
        "\"2024-01-02T03:04Z\"",
        "\"2024-01-02T03:04\"",
        "\"2024-01-02\"",
        "\" 2024-01-02\"",
        "\"2024-1-2\"",
        "\"1900-02-29\"",
        "\"2000-02-29\"",
        "\"0001-01-01T00:00:00Z\"",
        "\"1677-09-21T00:12:43.145224191Z\"",
        "\"2262-04-11T23:47:16.854775808Z\"",
        "\"12:30:00\"",
        "\"12:30:00.5\"",
        "\"25:00:00\"",
        "\"1969-12-31\"",
        "\"1969-12-31T23:59:59.999Z\"",
    ];
    prop_oneof![
        4 => proptest::sample::select(odd.to_vec()).prop_map(str::to_string),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| f.to_string()),
        1 => (-1e6f64..1e6).prop_map(|f| format!("{f:.4}")),
        1 => "[a-zA-Z0-9 é\\\\\"]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ]
}

/// Whitespace around a token: usually none.
fn ws() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec!["", "", "", " ", "\t", " \r ", "\n"])
}

/// A well-formed record with every required field (so that many are accepted), and some
/// others.
fn complete() -> impl Strategy<Value = String> {
    (
        json_value(),
        json_value(),
        proptest::collection::vec((0..NAMES.len(), json_value()), 0..6),
    )
        .prop_map(|(i, t, rest)| {
            let mut body = vec![
                format!(
                    "\"i64\":{}",
                    if i.parse::<i64>().is_ok() {
                        i
                    } else {
                        "5".into()
                    }
                ),
                format!(
                    "\"ts\":{}",
                    if t.starts_with("\"20") {
                        t
                    } else {
                        "\"2024-01-02T03:04:05Z\"".into()
                    }
                ),
            ];
            body.extend(rest.iter().map(|(k, v)| format!("\"{}\":{v}", NAMES[*k])));
            format!("{{{}}}", body.join(", "))
        })
}

/// The text of one record: an object over some fields (repeats allowed), sometimes broken.
fn record() -> impl Strategy<Value = String> {
    let pair = (0..NAMES.len(), json_value(), ws(), ws());
    let object = proptest::collection::vec(pair, 0..10).prop_map(|kv| {
        let body: Vec<String> = kv
            .iter()
            .map(|(k, v, a, b)| format!("{a}\"{}\"{b}:{a}{v}{b}", NAMES[*k]))
            .collect();
        format!("{{{}}}", body.join(","))
    });
    let broken = (
        complete(),
        0usize..200,
        proptest::sample::select(vec!["", "}", ",", "x", " ", "]", "\"", "\\"]),
    )
        .prop_map(|(s, at, tail)| {
            let at = at.min(s.len());
            let cut = (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
            format!("{}{tail}", &s[..cut])
        });
    prop_oneof![
        2 => object,
        4 => complete(),
        1 => broken,
        1 => json_value(),
        1 => (ws(), complete_ws()).prop_map(|(a, s)| format!("{a}{s}{a}")),
    ]
}

fn complete_ws() -> impl Strategy<Value = String> {
    Just("{\"i64\": 1, \"ts\": 1704164645000, \"s\": \"x\"}".to_string())
}

/// Decodes `records` with the per-record path only (`slow`) and with the fast path first
/// (`fast`), as the sources do; returns each side's outcomes and batches.
/// Which records a decoder took, and the batch it built.
type Outcome = (Vec<bool>, Vec<Decoded>);

fn decode_json(records: &[String]) -> (Outcome, Outcome) {
    let (slow, fast) = decoders();
    let run = |decoder: &ContractDecoder| {
        let mut b: BatchBuilder = decoder.builder();
        let mut outcomes = Vec::new();
        for r in records {
            let ok = b.push_json_text(r)
                || match serde_json::from_str::<serde_json::Value>(r) {
                    Ok(v) => b.push_json(&v).is_ok(),
                    Err(_) => false,
                };
            outcomes.push(ok);
        }
        let batch = b.finish().expect("finish");
        (outcomes, batch.map(|b| pretty(&b)).into_iter().collect())
    };
    (run(&slow), run(&fast))
}

/// The batch as comparable data: Arrow's logical equality (null slots ignored, floats by
/// their bits), shown as a table when it differs.
#[derive(PartialEq)]
struct Decoded(arrow::array::RecordBatch);

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match arrow::util::pretty::pretty_format_batches(std::slice::from_ref(&self.0)) {
            Ok(t) => write!(f, "\n{t}"),
            Err(e) => write!(f, "{e}"),
        }
    }
}

fn pretty(b: &arrow::array::RecordBatch) -> Decoded {
    Decoded(b.clone())
}

/// A CSV cell's text.
fn text_value() -> impl Strategy<Value = String> {
    let odd = [
        "",
        "0",
        "-0",
        "+7",
        "007",
        "7",
        " 7",
        "7 ",
        "255",
        "256",
        "-1",
        "101",
        "1e2",
        "1.5",
        "-1.5e-3",
        "inf",
        "NaN",
        "-inf",
        "3.4028236e38",
        "1704164645000",
        "+1704164645000",
        "true",
        "TRUE",
        " false",
        "yes",
        "abc",
        "ABC",
        "ABCDE",
        "日本",
        "12.50",
        "12.505",
        "2024-01-02T03:04:05Z",
        "2024-01-02 03:04:05.123456",
        "2024-01-02T03:04:05+01:00",
        "2024-02-30T00:00:00Z",
        "2024-03-31T02:30:00",
        "2024-01-02",
        " 2024-01-02",
        "2024-1-2",
        "12:30:00",
        "{\"a\": 1}",
        "[\"x\"]",
        "[1",
        "99999999999999999999",
    ];
    prop_oneof![
        4 => proptest::sample::select(odd.to_vec()).prop_map(str::to_string),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| f.to_string()),
        1 => "[a-zA-Z0-9 .:+-]{0,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn fast_json_decoding_matches_the_per_record_path(
        records in proptest::collection::vec(record(), 1..12)
    ) {
        let (slow, fast) = decode_json(&records);
        prop_assert_eq!(&slow.0, &fast.0, "accepted records differ: {:?}", records);
        prop_assert_eq!(&slow.1, &fast.1, "decoded values differ: {:?}", records);
    }

    #[test]
    fn fast_text_decoding_matches_the_per_record_path(
        rows in proptest::collection::vec(proptest::collection::vec(text_value(), NAMES.len() - 1), 1..8)
    ) {
        let (slow, fast) = decoders();
        let run = |decoder: &ContractDecoder| {
            let mut b = decoder.builder();
            let outcomes: Vec<Result<(), String>> = rows
                .iter()
                .map(|row| {
                    let values: Vec<Option<&str>> = row.iter().map(|s| Some(s.as_str())).collect();
                    b.push_text(&values).map_err(|p| format!("{} {:?} {}", p.code.code, p.field, p.reason))
                })
                .collect();
            (outcomes, b.finish().expect("finish").map(|b| pretty(&b)))
        };
        let (a, b) = (run(&slow), run(&fast));
        prop_assert_eq!(&a.0, &b.0, "outcomes differ: {:?}", rows);
        prop_assert_eq!(&a.1, &b.1, "decoded values differ: {:?}", rows);
    }
}

/// The fast path really is taken for the usual records (else the properties above would
/// hold trivially).
#[test]
fn the_fast_path_takes_the_usual_records() {
    let (_, fast) = decoders();
    let mut b = fast.builder();
    for r in [
        r#"{"i64": 1, "ts": "2024-01-02T03:04:05.123Z", "s": "x", "f64": 1.25, "b": true}"#,
        r#"{"ts": 1704164645000, "i64": -5, "code": "AB", "bounded": 100, "d32": "2024-02-29"}"#,
        r#"{"i64": 1, "ts": "2024-01-02T03:04:05Z", "dec": 12.5, "st": {"a": 1}, "l": ["x"], "extra": [1, {"y": null}]}"#,
        r#"{"i64": 1, "ts": "2024-01-02T03:04:05Z", "s": "tab\tquote\"slash\\"}"#,
    ] {
        assert!(b.push_json_text(r), "{r}");
    }
    // A rule broken, a repeated key, an escape left to serde_json: the per-record path.
    for r in [
        r#"{"i64": 1, "ts": "2024-01-02T03:04:05Z", "bounded": 101}"#,
        r#"{"i64": 1, "i64": 2, "ts": "2024-01-02T03:04:05Z"}"#,
        r#"{"i64": 1, "ts": "2024-01-02T03:04:05Z", "s": "\u00e9"}"#,
    ] {
        assert!(!b.push_json_text(r), "{r}");
    }
    assert_eq!(b.len(), 4);
    assert_eq!(b.finish().expect("finish").expect("batch").num_rows(), 4);
}

/// Bytes that are not UTF-8 — in a value, in a key, in an ignored field — never pass the
/// fast path (the per-record path rejects the record as not UTF-8); UTF-8 text does.
#[test]
fn the_fast_path_checks_utf8_where_it_reads_bytes() {
    let (_, fast) = decoders();
    let mut b = fast.builder();
    let ok = "{\"i64\": 1, \"ts\": 1704164645000, \"s\": \"d\u{e9}j\u{e0} \u{65e5}\", \"x\": \"\u{e9}\"}";
    assert!(b.push_json_bytes(ok.as_bytes()));
    for bad in [
        &b"{\"i64\": 1, \"ts\": 1704164645000, \"s\": \"d\xe9j\"}"[..],
        b"{\"i64\": 1, \"ts\": 1704164645000, \"x\": \"\xff\"}",
        b"{\"i64\": 1, \"ts\": 1704164645000, \"\xc3\": 1}",
        b"{\"i64\": 1, \"ts\": 1704164645000, \"s\": \"a\\n\xe9\"}",
        b"{\"i64\": 1, \"ts\": 1704164645000}\xe9",
    ] {
        assert!(!b.push_json_bytes(bad), "{}", String::from_utf8_lossy(bad));
    }
    let batch = b.finish().expect("finish").expect("batch");
    assert_eq!(batch.num_rows(), 1);
    let s = batch
        .column_by_name("s")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    assert_eq!(s, "d\u{e9}j\u{e0} \u{65e5}");
}

/// Records on the edges the random ones reach too rarely to be sure of: each is decoded
/// both ways, with the same outcome and values required.
#[test]
fn edge_records_decode_the_same_both_ways() {
    let base = r#""i64": 1, "ts": "2024-01-02T03:04:05Z""#;
    let edges: Vec<String> = [
        r#""bounded_day": "1969-12-31""#,
        r#""bounded_day": "1970-01-01""#,
        r#""bounded_ts": -1"#,
        r#""bounded_ts": "1969-12-31T23:59:59.999Z""#,
        r#""bounded_ts": "1970-01-01T00:00:00Z""#,
        r#""bounded": 101"#,
        r#""bounded": 100"#,
        r#""code": "ABCDE""#,
        r#""code": "AB""#,
        r#""f32": 3.4028236e38"#,
        r#""u8": -0"#,
        r#""f64": -0"#,
        r#""ts_paris": "2024-03-31T02:30:00""#,
        r#""ts_paris": "2024-03-31T02:30:00Z""#,
    ]
    .iter()
    .map(|field| format!("{{{base}, {field}}}"))
    .collect();
    let (slow, fast) = decode_json(&edges);
    assert_eq!(slow.0, fast.0, "accepted records differ");
    assert_eq!(slow.1, fast.1, "decoded values differ");
    // Rejected: the three temporal values below their minimum, 101, ABCDE, a float
    // beyond Float32 and a Paris time in the DST gap.
    assert_eq!(slow.0.iter().filter(|ok| !**ok).count(), 7, "{:?}", slow.0);
}
