//! A stream-stream join recovers its state after the real `etlantic` process is killed
//! at every step of the batch protocol (`ETLANTIC_FAIL_POINT=<point>:<batch id>` makes it
//! `abort()`): after a restart, the committed sink output and the quarantine equal an
//! uninterrupted run's — no lost, duplicated or wrongly unmatched rows.
//!
//! The pipeline: impressions and clicks, two directories of JSON-lines files read one
//! file per micro-batch, watermarks of 10 s and 5 s, late clicks quarantined, a left
//! outer join on the ad with `imp_ts BETWEEN click_ts - 20 s AND click_ts`, a file sink.
//! The five data batches run back to back (0–4), each judging lateness by the previous
//! micro-batch's watermark and evicting state with its own, as Spark does with a backlog;
//! no-data batch 5 closes the run. Impression c is emitted unmatched by batch 3 and g by
//! batch 4, from restored state after a crash; d's click arrives in batch 3 while d is
//! still in the state; the late click in batch 4 is quarantined.
//!
//! The same with `state_store: disk` (the join's rows in RocksDB), with the local working
//! copy kept and deleted before the restart.

mod common;
use common::crash::quarantined;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: ad_attribution
assets:
  impressions:
    contract: contracts/impressions.yaml
  clicks:
    contract: contracts/clicks.yaml
  attributed:
    contract: contracts/attributed.yaml
sources:
  - id: impressions
    asset: impressions
    event_time: {column: imp_ts}
    watermark: 10 seconds
    read_limit: {max_files: 1}
  - id: clicks
    asset: clicks
    event_time: {column: click_ts}
    watermark: 5 seconds
    late_events: {policy: quarantine}
    read_limit: {max_files: 1}
transforms:
  - id: attributed
    inputs:
      impressions: impressions
      clicks: clicks
    steps:
      - join:
          right: clicks
          on: {left: [ad_id], right: [click_ad]}
          how: left
          time_range: {left: imp_ts, right: click_ts, lower: 20 seconds, upper: 0 seconds}
sinks:
  - id: write_attributed
    input: attributed
    asset: attributed
    output_mode: append
"#;

const PROFILE: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: file://chk
state_store: memory
bindings:
  impressions: file://in/impressions?format=jsonl
  clicks: file://in/clicks?format=jsonl
  attributed: file://out/attributed/?format=jsonl
quarantine: file://out/quarantine.jsonl
"#;

fn contract(id: &str, cols: &[(&str, &str)]) -> String {
    let mut s = format!(
        "version: \"1.0.0\"\napiVersion: \"v3.1.0\"\nkind: \"DataContract\"\nid: \"{id}\"\nname: \"{id}\"\nstatus: \"active\"\nschema:\n  - name: \"{id}\"\n    logicalType: \"object\"\n    properties:\n"
    );
    for (n, t) in cols {
        s.push_str(&format!(
            "      - name: \"{n}\"\n        logicalType: \"{t}\"\n"
        ));
    }
    s
}

fn at(secs: i64) -> String {
    format!("2024-01-01T00:{:02}:{:02}Z", secs / 60, secs % 60)
}

/// Rows of one file: (seconds after 2024-01-01T00:00:00Z, ad).
type Rows = Vec<(i64, &'static str)>;

/// (impression files, click files), one of each per data micro-batch.
fn files() -> Vec<(Rows, Rows)> {
    vec![
        (vec![(0, "a"), (2, "b"), (4, "c")], vec![(5, "a"), (6, "x")]),
        (vec![(10, "d")], vec![(21, "b"), (30, "c"), (9, "d")]),
        (vec![(40, "e")], vec![(45, "e"), (41, "a")]),
        (vec![(70, "f"), (12, "g")], vec![(75, "f"), (12, "d")]),
        (vec![(120, "h")], vec![(121, "h"), (20, "x")]),
    ]
}

const MICRO_BATCHES: u64 = 6;

fn project(dir: &Path, store: &str) {
    let write = |path: &str, text: &str| {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("pipeline.yaml", PIPELINE);
    write(
        "profiles/local.yaml",
        &PROFILE.replace("state_store: memory", &format!("state_store: {store}")),
    );
    write(
        "contracts/impressions.yaml",
        &contract(
            "impressions",
            &[("ad_id", "string"), ("imp_ts", "timestamp")],
        ),
    );
    write(
        "contracts/clicks.yaml",
        &contract(
            "clicks",
            &[("click_ad", "string"), ("click_ts", "timestamp")],
        ),
    );
    write(
        "contracts/attributed.yaml",
        &contract(
            "attributed",
            &[
                ("ad_id", "string"),
                ("imp_ts", "timestamp"),
                ("click_ad", "string"),
                ("click_ts", "timestamp"),
            ],
        ),
    );
    for (i, (imps, clicks)) in files().into_iter().enumerate() {
        let lines = |rows: Vec<(i64, &str)>, ad: &str, t: &str| -> String {
            rows.iter()
                .map(|(s, a)| format!("{{\"{ad}\": \"{a}\", \"{t}\": \"{}\"}}\n", at(*s)))
                .collect()
        };
        write(
            &format!("in/impressions/{i:03}.jsonl"),
            &lines(imps, "ad_id", "imp_ts"),
        );
        write(
            &format!("in/clicks/{i:03}.jsonl"),
            &lines(clicks, "click_ad", "click_ts"),
        );
    }
}

fn run(dir: &Path, fail_point: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
    cmd.current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .env_remove("ETLANTIC_FAIL_POINT");
    if let Some(fp) = fail_point {
        cmd.env("ETLANTIC_FAIL_POINT", fp);
    }
    cmd.output().expect("the etlantic binary runs")
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The committed sink rows, canonical (timestamps as UTC milliseconds), sorted.
fn committed(dir: &Path) -> Vec<String> {
    let batches =
        etlantic_sinks::files::read_committed(dir.join("out/attributed")).unwrap_or_default();
    let mut rows = Vec::new();
    for b in &batches {
        let mut buf = Vec::new();
        {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(b).unwrap();
            w.finish().unwrap();
        }
        for line in String::from_utf8(buf).unwrap().lines() {
            let mut v: BTreeMap<String, Value> = serde_json::from_str(line).unwrap();
            for k in ["imp_ts", "click_ts"] {
                let t = v.get(k).and_then(Value::as_str).map(|s| {
                    chrono::DateTime::parse_from_rfc3339(s)
                        .unwrap()
                        .with_timezone(&chrono::Utc)
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                });
                v.insert(k.into(), json!(t));
            }
            for k in ["ad_id", "click_ad"] {
                v.entry(k.into()).or_insert(Value::Null);
            }
            rows.push(serde_json::to_string(&v).unwrap());
        }
    }
    rows.sort();
    rows
}

fn row(imp: Option<(i64, &str)>, click: Option<(i64, &str)>) -> String {
    let ms = |s: i64| format!("2024-01-01T00:{:02}:{:02}.000Z", s / 60, s % 60);
    let v: BTreeMap<&str, Value> = BTreeMap::from([
        ("ad_id", json!(imp.map(|i| i.1))),
        ("imp_ts", json!(imp.map(|i| ms(i.0)))),
        ("click_ad", json!(click.map(|c| c.1))),
        ("click_ts", json!(click.map(|c| ms(c.0)))),
    ]);
    serde_json::to_string(&v).unwrap()
}

/// The uninterrupted run on the memory store, checked by hand: its rows and quarantine.
fn reference() -> (Vec<String>, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path(), "memory");
    let o = run(tmp.path(), None);
    assert!(o.status.success(), "{}", describe(&o));
    let reference = committed(tmp.path());
    let mut want = vec![
        row(Some((0, "a")), Some((5, "a"))),
        row(Some((2, "b")), Some((21, "b"))),
        row(Some((40, "e")), Some((45, "e"))),
        row(Some((70, "f")), Some((75, "f"))),
        row(Some((120, "h")), Some((121, "h"))),
        row(Some((10, "d")), Some((12, "d"))),
        row(Some((4, "c")), None),
        row(Some((12, "g")), None),
    ];
    want.sort();
    assert_eq!(reference, want);
    let reference_quarantine = quarantined(tmp.path());
    assert_eq!(reference_quarantine.len(), 1, "{reference_quarantine:?}");
    assert!(reference_quarantine[0].contains("\"batch\":4"));
    let chk = tmp.path().join("chk");
    assert!(common::logged_commit(&chk, MICRO_BATCHES - 1).is_some());
    assert!(common::logged_offsets(&chk, MICRO_BATCHES).is_none());
    (reference, reference_quarantine)
}

/// Kills the query at every step of every micro-batch on `store`, deletes the working
/// copy of the disk store before the restart when `lose_working_copy`, and checks the
/// finished run against the reference.
fn killed_at_every_step(store: &str, lose_working_copy: bool) {
    let (reference, reference_quarantine) = reference();
    for point in ["after_offsets", "after_sink", "after_state", "after_commit"] {
        for batch in 0..MICRO_BATCHES {
            let label = format!("{store} {point}:{batch}, working copy lost: {lose_working_copy}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            project(dir, store);
            let crashed = run(dir, Some(&format!("{point}:{batch}")));
            assert_eq!(
                crashed.status.signal(),
                Some(6),
                "{label}: the process aborts at the fail point\n{}",
                describe(&crashed)
            );
            if lose_working_copy {
                let working = dir.join(".etlantic/state");
                assert!(working.is_dir(), "{label}: the working copy is there");
                std::fs::remove_dir_all(&working).unwrap();
            }
            let resumed = run(dir, None);
            assert!(resumed.status.success(), "{label}: {}", describe(&resumed));
            assert_eq!(committed(dir), reference, "{label}: committed rows");
            assert_eq!(
                quarantined(dir),
                reference_quarantine,
                "{label}: quarantine"
            );
        }
    }
}

#[test]
fn a_killed_join_query_recovers_its_state_at_every_step() {
    killed_at_every_step("memory", false);
}

/// With both sides' rows in RocksDB: the rows of the memory store, whether the restart
/// finds its working copy or restores from the checkpoint alone.
#[test]
fn on_the_disk_store_a_killed_join_query_recovers_at_every_step() {
    let tmp = tempfile::tempdir().unwrap();
    project(tmp.path(), "disk");
    let o = run(tmp.path(), None);
    assert!(o.status.success(), "{}", describe(&o));
    assert_eq!(committed(tmp.path()), reference().0);
    assert!(
        tmp.path().join("chk/state-store").is_dir(),
        "the join's state is in the store"
    );
    killed_at_every_step("disk", false);
    killed_at_every_step("disk", true);
}
