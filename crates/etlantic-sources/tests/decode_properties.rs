//! Property tests of the record decoders (proptest): whatever the lines of a JSON-lines
//! or CSV file hold — records that fit the contract, records that break it, random bytes —
//! a read never fails or panics on them, and every non-blank line is accounted for exactly
//! once: as a row, whose origin names its line, or as a rejected record naming its line.

mod common;

use common::*;
use etlantic_core::plugin::{source_provider, ReadLimit};
use etlantic_core::streaming::ExecutionMode;
use proptest::prelude::*;
use std::collections::BTreeSet;

// Links the crate so that its providers register themselves.
use etlantic_sources as _;

/// A JSON value for a field: of the right type, of a wrong one, or odd.
fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        "[a-zA-Z0-9 é日\\\\\"]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("null".to_string()),
        Just("true".to_string()),
        Just("[1, {\"a\": 2}]".to_string()),
        Just("\"2024-02-30T25:00:00Z\"".to_string()),
        Just("\"2024-01-0é:00:00\"".to_string()),
        (0i64..100_000, 0u32..86_400).prop_map(|(d, s)| format!(
            "\"{}\"",
            chrono::DateTime::from_timestamp(d * 86_400 + s as i64, 0)
                .unwrap()
                .to_rfc3339()
        )),
    ]
}

/// A line of a JSON-lines file: an object over some of the contract's fields (and an
/// unknown one), or random bytes without a newline.
fn jsonl_line() -> impl Strategy<Value = Vec<u8>> {
    let fields = [
        "order_id", "customer", "amount", "ts", "day", "paid", "score", "x",
    ];
    prop_oneof![
        3 => proptest::collection::vec((0..fields.len(), json_value()), 0..8).prop_map(move |kv| {
            let body: Vec<String> = kv
                .iter()
                .map(|(k, v)| format!("\"{}\": {v}", fields[*k]))
                .collect();
            format!("{{{}}}", body.join(", ")).into_bytes()
        }),
        1 => proptest::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..40),
    ]
}

/// A CSV cell: a value of some type, empty, quoted with a delimiter inside, or odd bytes.
fn csv_cell() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<i32>().prop_map(|n| n.to_string().into_bytes()),
        "[A-Z][a-z]{0,8}".prop_map(String::into_bytes),
        Just(Vec::new()),
        Just(b"\"a, \"\"b\"\"\"".to_vec()),
        Just(b"2024-01-02T03:04:05Z".to_vec()),
        Just(b"12.50".to_vec()),
        proptest::collection::vec(
            any::<u8>().prop_filter("no newline", |b| *b != b'\n' && *b != b'\r'),
            0..6
        ),
    ]
}

/// Reads `bytes` as the file `name` in a batch run; returns the good rows' lines (from
/// their origins) and the rejected records' lines.
fn read(name: &str, bytes: &[u8]) -> (Vec<u64>, Vec<u64>, usize) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(name), bytes).unwrap();
    let c = contract(ORDERS);
    let mut src = source_provider("file")
        .unwrap()
        .create(ctx(
            tmp.path(),
            "orders",
            &format!("file://{name}"),
            &c,
            ExecutionMode::Batch,
            None,
        ))
        .unwrap();
    let batch = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async {
            let end = src
                .latest_offset(None, &ReadLimit::unlimited())
                .await
                .unwrap()
                .unwrap();
            src.read(None, &end).await
        })
        .expect("a read never fails on the records it holds");
    for b in &batch.batches {
        assert_eq!(b.schema(), src.schema());
    }
    let rows = batch.num_rows();
    assert_eq!(
        batch.origins.len() as usize,
        rows,
        "every row has an origin"
    );
    let good: Vec<u64> = (0..rows as u64)
        .map(|i| batch.origins.position(i).unwrap().line.unwrap())
        .collect();
    let bad: Vec<u64> = batch
        .rejected
        .iter()
        .map(|r| {
            assert_eq!(r.position.file.as_deref(), Some(name));
            assert!(!r.reason.is_empty());
            r.position.line.expect("a rejected record names its line")
        })
        .collect();
    (good, bad, rows)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_json_line_is_a_row_or_a_rejected_record(lines in proptest::collection::vec(jsonl_line(), 0..12)) {
        let bytes = lines.join(&b'\n');
        let (good, bad, _) = read("orders.jsonl", &bytes);
        let expected: BTreeSet<u64> = bytes
            .split(|b| *b == b'\n')
            .enumerate()
            .filter(|(_, l)| {
                let l = l.strip_suffix(b"\r").unwrap_or(l);
                !l.iter().all(u8::is_ascii_whitespace)
            })
            .map(|(i, _)| i as u64 + 1)
            .collect();
        let mut all: Vec<u64> = good.iter().chain(&bad).copied().collect();
        all.sort_unstable();
        let unique: BTreeSet<u64> = all.iter().copied().collect();
        prop_assert_eq!(all.len(), unique.len(), "a line counted twice");
        prop_assert_eq!(unique, expected);
    }

    #[test]
    fn every_csv_line_is_a_row_or_a_rejected_record(
        rows in proptest::collection::vec(proptest::collection::vec(csv_cell(), 0..9), 1..10)
    ) {
        let mut bytes = b"order_id,customer,amount,ts,day,paid,score\n".to_vec();
        for r in &rows {
            bytes.extend(r.join(&b','));
            bytes.push(b'\n');
        }
        let (good, bad, _) = read("orders.csv", &bytes);
        let mut all: Vec<u64> = good.iter().chain(&bad).copied().collect();
        all.sort_unstable();
        let unique: BTreeSet<u64> = all.iter().copied().collect();
        prop_assert_eq!(all.len(), unique.len(), "a line counted twice");
        // The header is line 1; records start at line 2 (a quoted cell may span lines,
        // so only the count is bounded, not the exact set).
        prop_assert!(unique.iter().all(|l| *l >= 2), "{:?}", unique);
        prop_assert!(unique.len() <= rows.len());
    }
}
