//! JSON decoding alone, three ways, on the same 100,000 click records (the clicks
//! benchmark's shape), into the same Arrow schema:
//!
//! - the contract decoder's fast path (`BatchBuilder::push_json_bytes`, per record, with
//!   per-record rejects);
//! - the contract decoder's per-record path (`serde_json` value, then the contract's
//!   rules): what every record cost before the fast path;
//! - arrow-json's tape decoder over the whole buffer: the fastest way arrow offers, but it
//!   reports a type error for a whole batch, not a record, and knows none of the
//!   contract's rules (time zones, epoch-millisecond timestamps, exact decimals, field
//!   constraints), so it is a reference, not a candidate.
//!
//! Each way decodes all records `--runs` times (default 15); the median is reported, with
//! each way's speed relative to the fast path in the same run.
//! `cargo bench -p etlantic --bench json_decode`; the figures are in docs/ingestion.md.

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use etlantic_sources::decode::ContractDecoder;
use std::sync::Arc;
use std::time::Instant;

const RECORDS: usize = 100_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("campaign_id", DataType::Utf8, true),
        Field::new("user_id", DataType::Int64, true),
        Field::new("price", DataType::Float64, true),
    ]))
}

/// Click records as `shared/bench/gen_clicks.py` writes them, one per line.
fn clicks() -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORDS * 110);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..RECORDS as u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ms = i * 37 + x % 1000;
        let line = format!(
            "{{\"event_id\":{i},\"ts\":\"2024-01-01T{:02}:{:02}:{:02}.{:03}Z\",\"campaign_id\":\"c{:04}\",\"user_id\":{},\"price\":{}.{:04}}}\n",
            ms / 3_600_000 % 24,
            ms / 60_000 % 60,
            ms / 1000 % 60,
            ms % 1000,
            x % 1000,
            x % 50_000,
            x % 3,
            x % 10_000
        );
        out.extend_from_slice(line.as_bytes());
    }
    out
}

/// The median seconds of `runs` calls of `f`.
fn median_secs(runs: usize, mut f: impl FnMut() -> usize) -> f64 {
    let mut secs: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            assert_eq!(std::hint::black_box(f()), RECORDS, "every record decoded");
            t.elapsed().as_secs_f64()
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    secs[runs / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(15usize);
    let text = clicks();
    let lines: Vec<&[u8]> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let fast = ContractDecoder::new(schema(), None).expect("decoder");
    let slow = ContractDecoder::new(schema(), None)
        .expect("decoder")
        .with_fast_path(false);
    let rows = |b: Option<arrow::array::RecordBatch>| b.map_or(0, |b| b.num_rows());
    let ways: Vec<(&str, f64)> = vec![
        (
            "contract decoder, fast path",
            median_secs(runs, || {
                let mut builder = fast.builder();
                for l in &lines {
                    assert!(builder.push_json_bytes(l));
                }
                rows(builder.finish().expect("finish"))
            }),
        ),
        (
            "contract decoder, per-record path (serde_json)",
            median_secs(runs, || {
                let mut builder = slow.builder();
                for l in &lines {
                    let v: serde_json::Value = serde_json::from_slice(l).expect("json");
                    builder.push_json(&v).expect("a good record");
                }
                rows(builder.finish().expect("finish"))
            }),
        ),
        (
            "arrow-json tape decoder, whole buffer (reference)",
            median_secs(runs, || {
                let mut decoder = arrow::json::ReaderBuilder::new(schema())
                    .with_batch_size(8192)
                    .build_decoder()
                    .expect("decoder");
                let mut rest = &text[..];
                let mut n = 0;
                while !rest.is_empty() {
                    let used = decoder.decode(rest).expect("decode");
                    rest = &rest[used..];
                    n += rows(decoder.flush().expect("flush"));
                }
                n + rows(decoder.flush().expect("flush"))
            }),
        ),
    ];
    println!(
        "json_decode: {RECORDS} click records ({} bytes), one thread, median of {runs}",
        text.len()
    );
    let base = ways[0].1;
    for (name, secs) in &ways {
        println!(
            "  {name:<52} {:>7.1} ms  {:>6.2} M records/s  {:>5.2}x the fast path's time",
            secs * 1e3,
            RECORDS as f64 / secs / 1e6,
            secs / base
        );
    }
}
