//! A stream-static join whose static side is a Delta table (issue 4's "file, Delta or SQL
//! table"): click files streamed in, each joined (left outer) with the `campaigns` Delta
//! table read per micro-batch, so a micro-batch sees the table as it is when it runs.

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use deltalake::logstore::{logstore_for, StorageConfig};
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableConfig};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: enrich_clicks
assets:
  clicks:
    contract: contracts/clicks.yaml
  campaigns:
    contract: contracts/campaigns.yaml
  enriched:
    contract: contracts/enriched.yaml
sources:
  - id: clicks
    asset: clicks
    read_limit: {max_files: 1}
  - id: campaigns
    asset: campaigns
    static_refresh: per_batch
transforms:
  - id: enriched
    inputs:
      clicks: clicks
      campaigns: campaigns
    steps:
      - join: {right: campaigns, on: {left: [campaign], right: [id]}, how: left}
sinks:
  - id: write_enriched
    input: enriched
    asset: enriched
    output_mode: append
"#;

const PROFILE: &str = "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  clicks: file://in?format=jsonl\n  campaigns: delta://tables/campaigns\n  enriched: file://out/enriched/?format=jsonl\nquarantine: file://out/quarantine.jsonl\n";

fn contract(id: &str, cols: &[(&str, &str)]) -> String {
    let mut s = format!(
        "version: \"1.0.0\"\napiVersion: \"v3.1.0\"\nkind: \"DataContract\"\nid: \"{id}\"\nname: \"{id}\"\nstatus: \"active\"\nschema:\n  - name: \"{id}\"\n    logicalType: \"object\"\n    properties:\n"
    );
    for (name, ty) in cols {
        s.push_str(&format!(
            "      - name: \"{name}\"\n        logicalType: \"{ty}\"\n"
        ));
        if *ty == "integer" {
            s.push_str("        logicalTypeOptions: {format: \"i64\"}\n");
        }
    }
    s
}

fn write(dir: &Path, path: &str, text: &str) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn click(minute: &str, campaign: &str, user: &str) -> String {
    format!(r#"{{"ts": "2026-11-30T08:{minute}:00Z", "campaign": "{campaign}", "user": "{user}"}}"#)
}

async fn open(dir: &Path) -> DeltaTable {
    std::fs::create_dir_all(dir).unwrap();
    let url = url::Url::from_directory_path(dir).unwrap();
    let store = logstore_for(&url, StorageConfig::default()).unwrap();
    let mut t = DeltaTable::new(store, DeltaTableConfig::default());
    let _ = t.load().await;
    t
}

async fn write_campaigns(dir: &Path, rows: &[(&str, &str, i64)], mode: SaveMode) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("budget", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    open(dir)
        .await
        .write(vec![batch])
        .with_save_mode(mode)
        .await
        .unwrap();
}

fn run(dir: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn enriched(dir: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    for b in &etlantic_sinks::files::read_committed(dir.join("out/enriched")).unwrap() {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(Vec::new());
        w.write(b).unwrap();
        w.finish().unwrap();
        for line in String::from_utf8(w.into_inner()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            rows.push(format!(
                "{} {} {} {}",
                v["user"], v["campaign"], v["name"], v["budget"]
            ));
        }
    }
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_is_the_static_side_of_a_stream_static_join() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "pipeline.yaml", PIPELINE);
    write(dir, "profiles/local.yaml", PROFILE);
    write(
        dir,
        "contracts/clicks.yaml",
        &contract(
            "clicks",
            &[
                ("ts", "timestamp"),
                ("campaign", "string"),
                ("user", "string"),
            ],
        ),
    );
    write(
        dir,
        "contracts/campaigns.yaml",
        &contract(
            "campaigns",
            &[("id", "string"), ("name", "string"), ("budget", "integer")],
        ),
    );
    write(
        dir,
        "contracts/enriched.yaml",
        &contract(
            "enriched",
            &[
                ("ts", "timestamp"),
                ("campaign", "string"),
                ("user", "string"),
                ("id", "string"),
                ("name", "string"),
                ("budget", "integer"),
            ],
        ),
    );
    let table = dir.join("tables/campaigns");
    write_campaigns(
        &table,
        &[("c1", "spring", 100), ("c9", "unused", 1)],
        SaveMode::Append,
    )
    .await;
    write(
        dir,
        "in/000.jsonl",
        &(click("10", "c1", "u1") + "\n" + &click("20", "c2", "u2") + "\n"),
    );
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || run(&d)).await.unwrap();

    // A new version of the table: the next micro-batch joins with it, the first one's
    // output stays as it was.
    write_campaigns(
        &table,
        &[("c1", "summer", 150), ("c2", "autumn", 20)],
        SaveMode::Overwrite,
    )
    .await;
    write(
        dir,
        "in/001.jsonl",
        &(click("30", "c1", "u3") + "\n" + &click("40", "c2", "u4") + "\n"),
    );
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || run(&d)).await.unwrap();

    assert_eq!(
        enriched(dir),
        [
            r#""u1" "c1" "spring" 100"#,
            r#""u2" "c2" null null"#,
            r#""u3" "c1" "summer" 150"#,
            r#""u4" "c2" "autumn" 20"#,
        ]
    );
}
