//! The quarantine writer: durable JSON lines, torn tails cut off.

use etlantic_core::data::{RejectedRecord, SourcePosition};
use etlantic_runtime::quarantine::{read_quarantine, QuarantineWriter};
use serde_json::json;

fn rejected(
    code: &str,
    field: Option<&str>,
    line: Option<u64>,
    row: Option<u64>,
    raw: &str,
) -> RejectedRecord {
    RejectedRecord {
        code: code.into(),
        reason: format!("reason for {raw}"),
        field: field.map(String::from),
        position: SourcePosition {
            asset: "orders".into(),
            file: Some("data/orders.jsonl".into()),
            line,
            row,
            ..SourcePosition::default()
        },
        raw: raw.into(),
    }
}

#[test]
fn quarantine_appends_json_lines_durably() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("out/deep/quarantine.jsonl");
    let mut w = QuarantineWriter::open(&path).unwrap();
    assert_eq!(
        w.location(),
        &etlantic_core::storage::Location::Local(path.clone())
    );
    let records = vec![
        rejected("ETL701", None, Some(2), None, "{bad"),
        rejected(
            "ETL702",
            Some("amount"),
            Some(5),
            None,
            "{\"amount\":\"x\"}",
        ),
    ];
    assert_eq!(w.write("run-1", Some(4), &records).unwrap(), 2);
    assert_eq!(w.write("run-1", Some(5), &[]).unwrap(), 0);
    drop(w);
    // Reopening appends.
    let mut w = QuarantineWriter::from_uri(
        "file://out/deep/quarantine.jsonl",
        tmp.path(),
        &Default::default(),
    )
    .unwrap();
    w.write(
        "run-2",
        None,
        &[rejected("ETL703", Some("ts"), None, Some(7), "{}")],
    )
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        r#"{"code":"ETL701","reason":"reason for {bad","field":null,"position":{"asset":"orders","file":"data/orders.jsonl","line":2},"raw":"{bad","run_id":"run-1","batch_id":4}"#
    );
    let lines = read_quarantine(&path).unwrap();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["field"], json!("amount"));
    assert_eq!(lines[1]["position"]["line"], json!(5));
    assert_eq!(
        lines[2],
        json!({
            "code": "ETL703",
            "reason": "reason for {}",
            "field": "ts",
            "position": {"asset": "orders", "file": "data/orders.jsonl", "row": 7},
            "raw": "{}",
            "run_id": "run-2",
            "batch_id": null
        })
    );
    assert_eq!(
        QuarantineWriter::from_uri("kafka://broker/topic", tmp.path(), &Default::default())
            .unwrap_err()
            .code(),
        "ETL505"
    );
}

/// A crash in the middle of an append leaves a torn last line: reading skips it, and
/// opening the writer cuts it off so the next append starts on a line of its own. Cut at
/// every byte of the last line (one of them inside a two-byte character), and with a last
/// line longer than the writer's 64 KiB backwards scan.
#[test]
fn a_torn_last_quarantine_line_is_cut_off_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("q.jsonl");
    for long in [false, true] {
        let raw = if long {
            format!("{{\"note\":\"é{}\"}}", "x".repeat(100_000))
        } else {
            "{\"note\":\"café\"}".to_string()
        };
        let _ = std::fs::remove_file(&path);
        let mut w = QuarantineWriter::open(&path).unwrap();
        w.write(
            "run-1",
            Some(0),
            &[rejected("ETL701", None, Some(1), None, "first")],
        )
        .unwrap();
        w.write(
            "run-1",
            Some(1),
            &[rejected("ETL701", None, Some(2), None, &raw)],
        )
        .unwrap();
        drop(w);
        let whole = std::fs::read(&path).unwrap();
        let first_end = whole.iter().position(|b| *b == b'\n').unwrap() + 1;
        let cuts: Vec<usize> = if long {
            vec![first_end + 1, first_end + 70_000, whole.len() - 1]
        } else {
            (first_end..whole.len()).collect()
        };
        for cut in cuts {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let lines = read_quarantine(&path).unwrap();
            assert_eq!(lines.len(), 1, "cut at {cut}");
            assert_eq!(lines[0]["raw"], "first");
            let mut w = QuarantineWriter::open(&path).unwrap();
            assert_eq!(
                std::fs::read(&path).unwrap(),
                whole[..first_end],
                "cut at {cut}"
            );
            w.write(
                "run-2",
                Some(1),
                &[rejected("ETL701", None, Some(2), None, &raw)],
            )
            .unwrap();
            let lines = read_quarantine(&path).unwrap();
            assert_eq!(lines.len(), 2, "cut at {cut}");
            assert_eq!(lines[1]["raw"], raw.as_str());
        }
    }
    // A torn first line leaves an empty file.
    std::fs::write(&path, b"{\"code\":\"ETL7").unwrap();
    assert!(read_quarantine(&path).unwrap().is_empty());
    drop(QuarantineWriter::open(&path).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    // Damage before the last line is an error, never skipped.
    std::fs::write(&path, b"not json\n{\"code\":\"ETL701\"}\n").unwrap();
    assert_eq!(read_quarantine(&path).unwrap_err().code(), "ETL706");
}
