//! The SQL connectors end to end through the real `etlantic` binary, against the real
//! PostgreSQL server on 127.0.0.1:5432 (database `test`) and SQLite files.
//!
//! Exactly-once: a directory of JSON-lines clicks (one file per micro-batch), a 1-minute
//! tumbling count per campaign with a 10 s watermark, written to an SQL table (append
//! mode on PostgreSQL and SQLite; update mode with an upsert by window and campaign on
//! PostgreSQL). The process is killed (`ETLANTIC_FAIL_POINT=<point>:<batch>`, which
//! `abort()`s) at every step of the batch protocol — after the offsets WAL, inside the
//! sink's transaction, after the sink commit, after the state, after the commit log — at
//! several batches, restarted, and the table must equal the uninterrupted run's: 0 lost,
//! 0 duplicated. Micro-batches alternate data / no-data (0 d, 1 nd, ..., 10 d, 11 nd).
//!
//! The source side: a stream-static join whose static side is a PostgreSQL table read in
//! bounded mode for every micro-batch, and the planner refusing an SQL table as a
//! streaming source.

mod common;
use common::crash::*;

use serde_json::Value;
use sqlx::{Connection, Row};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

const PROFILE: &str = r#"apiVersion: etlantic/v1
kind: Profile
name: local
mode: streaming
trigger: available_now
checkpoint: file://chk
bindings:
  clicks: file://in?format=jsonl
  counts: BINDING
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

fn write(dir: &Path, path: &str, text: &str) {
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One target of the sink: a fresh PostgreSQL schema or SQLite file per project.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    PgAppend,
    SqliteAppend,
    PgUpsertUpdate,
    /// Complete output mode: every micro-batch replaces the table's rows, in the same
    /// transaction as its progress row.
    PgComplete,
    SqliteComplete,
    /// Update mode with an upsert into SQLite, the window allowing 30 s of lateness: the
    /// late 00:30 click is inside it and updates its window, whose row is upserted again.
    SqliteUpsertLateness,
}

impl Case {
    fn sqlite(self) -> bool {
        matches!(
            self,
            Case::SqliteAppend | Case::SqliteComplete | Case::SqliteUpsertLateness
        )
    }

    fn update(self) -> bool {
        matches!(self, Case::PgUpsertUpdate | Case::SqliteUpsertLateness)
    }

    fn complete(self) -> bool {
        matches!(self, Case::PgComplete | Case::SqliteComplete)
    }
}

struct Project {
    _tmp: tempfile::TempDir,
    case: Case,
    schema: String,
}

impl Project {
    async fn new(case: Case) -> Project {
        let tmp = tempfile::tempdir().unwrap();
        let schema = format!(
            "etl_e2e_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let binding = match case {
            Case::PgAppend => format!("{PG}?table={schema}.counts"),
            Case::SqliteAppend | Case::SqliteComplete => {
                "sqlite://out/counts.db?table=counts".to_string()
            }
            Case::PgComplete => format!("{PG}?table={schema}.counts"),
            Case::PgUpsertUpdate => {
                format!("{PG}?table={schema}.counts&mode=upsert&keys=window_start,campaign")
            }
            Case::SqliteUpsertLateness => {
                "sqlite://out/counts.db?table=counts&mode=upsert&keys=window_start,campaign"
                    .to_string()
            }
        };
        if !case.sqlite() {
            pg_exec(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await;
        }
        let mode = match case {
            _ if case.update() => "update",
            _ if case.complete() => "complete",
            _ => "append",
        };
        let dir = tmp.path();
        let mut pipeline = common::crash::CLICK_COUNTS_PIPELINE
            .replace("output_mode: append", &format!("output_mode: {mode}"));
        if case == Case::SqliteUpsertLateness {
            pipeline = pipeline.replace(
                "size: 1 minute}",
                "size: 1 minute, allowed_lateness: 30 seconds}",
            );
        }
        write(dir, "pipeline.yaml", &pipeline);
        write(
            dir,
            "profiles/local.yaml",
            &PROFILE.replace("BINDING", &binding),
        );
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
            "contracts/counts.yaml",
            &contract(
                "counts",
                &[
                    ("window_start", "timestamp"),
                    ("window_end", "timestamp"),
                    ("campaign", "string"),
                    ("n", "integer"),
                ],
            ),
        );
        for (name, text) in input_files() {
            write(dir, &format!("in/{name}"), &text);
        }
        Project {
            _tmp: tmp,
            case,
            schema,
        }
    }

    fn dir(&self) -> &Path {
        self._tmp.path()
    }

    fn run(&self, fail_point: Option<&str>) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_etlantic"));
        cmd.current_dir(self.dir())
            .args(["run", "pipeline.yaml", "--format", "json"])
            .env_remove("ETLANTIC_FAIL_POINT");
        if let Some(fp) = fail_point {
            cmd.env("ETLANTIC_FAIL_POINT", fp);
        }
        cmd.output().expect("the etlantic binary runs")
    }

    fn run_ok(&self) {
        let o = self.run(None);
        assert!(o.status.success(), "run failed: {}", describe(&o));
    }

    fn table(&self) -> String {
        if self.case.sqlite() {
            "counts".into()
        } else {
            format!("{}.counts", self.schema)
        }
    }

    /// The rows of the table, rendered as text and sorted (a multiset).
    async fn rows(&self) -> Vec<String> {
        let sql = format!(
            "SELECT CAST(window_start AS TEXT), CAST(window_end AS TEXT), campaign, CAST(n AS TEXT) FROM {}",
            self.table()
        );
        let rows: Vec<(String, String, String, String)> = match self.case.sqlite() {
            true => {
                let path = self.dir().join("out/counts.db");
                if !path.exists() {
                    return vec![];
                }
                let o = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
                match sqlx::query_as(&sql).fetch_all(&mut c).await {
                    Ok(r) => r,
                    Err(_) => return vec![], // no table yet
                }
            }
            false => {
                let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
                match sqlx::query_as(&sql).fetch_all(&mut c).await {
                    Ok(r) => r,
                    Err(_) => return vec![],
                }
            }
        };
        let mut v: Vec<String> = rows
            .into_iter()
            .map(|(a, b, c, d)| format!("{a} | {b} | {c} | {d}"))
            .collect();
        v.sort();
        v
    }

    /// The batch id in the progress row.
    async fn progress(&self) -> Option<i64> {
        let sql = match self.case.sqlite() {
            true => "SELECT batch_id FROM _etlantic_sink_progress".to_string(),
            false => format!(
                "SELECT batch_id FROM {}._etlantic_sink_progress",
                self.schema
            ),
        };
        match self.case.sqlite() {
            true => {
                let o = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(self.dir().join("out/counts.db"));
                let mut c = sqlx::SqliteConnection::connect_with(&o).await.ok()?;
                let row = sqlx::query(&sql).fetch_optional(&mut c).await.ok()?;
                row.and_then(|r| r.get::<Option<i64>, _>(0))
            }
            false => {
                let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
                let row = sqlx::query(&sql).fetch_optional(&mut c).await.ok()?;
                row.and_then(|r| r.get::<Option<i64>, _>(0))
            }
        }
    }

    async fn drop(self) {
        if !self.case.sqlite() {
            pg_exec(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema)).await;
        }
    }
}

async fn pg_exec(sql: &str) {
    let mut c = sqlx::PgConnection::connect(PG)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run `cargo xtask setup`)");
    sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
}

/// The committed counts as (campaign, n) pairs per window start minute, from a rendered
/// row `start | end | campaign | n`.
fn summary(rows: &[String]) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            let parts: Vec<&str> = r.split(" | ").collect();
            // "2024-01-01T00:MM:..." or "2024-01-01 00:MM:..." — the minute.
            let minute = parts[0][14..16].to_string();
            (minute, parts[2].to_string(), parts[3].to_string())
        })
        .collect();
    v.sort();
    v
}

fn expected_summary() -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = [
        ("00", "c1", "2"),
        ("00", "c2", "1"),
        ("01", "c1", "2"),
        ("01", "c2", "1"),
        ("02", "c2", "1"),
        ("02", "c3", "1"),
        ("03", "c3", "1"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    v.sort();
    v
}

async fn killed_and_restarted(case: Case, points: &[&str], batches: &[u64]) {
    let reference = Project::new(case).await;
    reference.run_ok();
    let want = reference.rows().await;
    let mut expected = expected_summary();
    if case.update() || case.complete() {
        // Update and complete modes also emit the window the watermark has not closed.
        expected.push(("05".into(), "c1".into(), "1".into()));
    }
    if case == Case::SqliteUpsertLateness {
        // Batch 6 judges the 00:30 click by the watermark 01:20: its window [00:00,
        // 01:00) ended 20 s before, inside the 30 s of lateness, so it counts (and the
        // window, evicted only at watermark 01:30 or later, is upserted again with 3);
        // nothing is quarantined as late.
        expected.retain(|(m, c, _)| !(m == "00" && c == "c1"));
        expected.push(("00".into(), "c1".into(), "3".into()));
        expected.sort();
        let quarantine =
            std::fs::read_to_string(reference.dir().join("out/quarantine.jsonl")).unwrap();
        assert!(!quarantine.contains("ETL708"), "{quarantine}");
    }
    if case.complete() {
        // Complete mode keeps all state and drops no late row (as Spark): the late
        // 00:30 click counts.
        expected.retain(|(m, c, _)| !(m == "00" && c == "c1"));
        expected.push(("00".into(), "c1".into(), "3".into()));
        expected.sort();
    }
    assert_eq!(summary(&want), expected, "{case:?}: the uninterrupted run");
    let last = reference.progress().await.expect("a progress row");
    // Complete mode runs no no-data batches: the six files are batches 0-5.
    let last_batch = if case.complete() { 5 } else { 6 };
    assert!(last >= last_batch, "{case:?}: progress {last}");
    // A finished query restarted writes nothing.
    reference.run_ok();
    assert_eq!(reference.rows().await, want);
    reference.drop().await;

    for point in points {
        for batch in batches {
            let label = format!("{case:?} {point}:{batch}");
            let p = Project::new(case).await;
            let o = p.run(Some(&format!("{point}:{batch}")));
            assert_eq!(
                o.status.signal(),
                Some(6),
                "{label}: must abort\n{}",
                describe(&o)
            );
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("ETLANTIC_FAIL_POINT reached"),
                "{label}: {}",
                describe(&o)
            );
            // The sink's transaction committed unless the process died before it ended.
            let progress = p.progress().await;
            let committed = !matches!(*point, "after_offsets" | "in_sink");
            if !case.update() {
                let expected = if committed {
                    Some(*batch as i64)
                } else {
                    batch.checked_sub(1).map(|b| b as i64)
                };
                assert_eq!(progress, expected, "{label}: progress row after the crash");
            }
            p.run_ok();
            assert_eq!(p.rows().await, want, "{label}: lost or duplicated rows");
            assert_eq!(p.progress().await, Some(last), "{label}: progress row");
            p.drop().await;
        }
    }
}

const POINTS: [&str; 5] = [
    "after_offsets",
    "in_sink",
    "after_sink",
    "after_state",
    "after_commit",
];

#[tokio::test]
async fn postgres_append_killed_at_every_step_loses_and_duplicates_nothing() {
    killed_and_restarted(Case::PgAppend, &POINTS, &[0, 2, 3, 5, 6]).await;
}

#[tokio::test]
async fn sqlite_append_killed_at_every_step_loses_and_duplicates_nothing() {
    killed_and_restarted(Case::SqliteAppend, &POINTS, &[0, 2, 3, 5, 6]).await;
}

#[tokio::test]
async fn postgres_upsert_in_update_mode_killed_at_every_step_loses_and_duplicates_nothing() {
    killed_and_restarted(Case::PgUpsertUpdate, &POINTS, &[0, 2, 4]).await;
}

/// Allowed lateness: killed at every step of the batches while the first window is past
/// its end but inside its lateness (3: the watermark passed 01:00; 4; 6: the late click
/// arrives), the restarted query still holds the window and upserts the late update.
#[tokio::test]
async fn sqlite_upsert_with_allowed_lateness_killed_inside_the_lateness_keeps_late_updates() {
    killed_and_restarted(Case::SqliteUpsertLateness, &POINTS, &[3, 4, 6]).await;
}

/// Complete mode replaces the table at every micro-batch: a crash between the replace
/// and the commit log must neither leave a half-replaced table nor append a second copy.
#[tokio::test]
async fn postgres_complete_mode_killed_at_every_step_loses_and_duplicates_nothing() {
    killed_and_restarted(Case::PgComplete, &POINTS, &[0, 2, 3, 5]).await;
}

#[tokio::test]
async fn sqlite_complete_mode_killed_at_every_step_loses_and_duplicates_nothing() {
    killed_and_restarted(Case::SqliteComplete, &POINTS, &[0, 2, 3, 5]).await;
}

// ------------------------------------------------------------ the source: static side

const JOIN_PIPELINE: &str = r#"apiVersion: etlantic/v1
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
    STATIC
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

fn join_project(dir: &Path, schema: &str, static_side: bool) {
    write(
        dir,
        "pipeline.yaml",
        &JOIN_PIPELINE.replace(
            "STATIC",
            if static_side {
                "static_refresh: per_batch"
            } else {
                ""
            },
        ),
    );
    write(
        dir,
        "profiles/local.yaml",
        &format!(
            "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  clicks: file://in?format=jsonl\n  campaigns: {PG}?query=SELECT%20*%20FROM%20{schema}.campaigns%20ORDER%20BY%20id\n  enriched: file://out/enriched/?format=jsonl\nquarantine: file://out/quarantine.jsonl\n"
        ),
    );
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
    write(
        dir,
        "in/000.jsonl",
        &(click("00:10", "c1", "u1") + "\n" + &click("00:20", "c2", "u2") + "\n"),
    );
}

#[tokio::test]
async fn a_postgres_table_is_the_static_side_of_a_stream_static_join() {
    let schema = format!("etl_e2e_join_{}", std::process::id());
    pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.campaigns (id TEXT, name TEXT, budget BIGINT);
         INSERT INTO {schema}.campaigns VALUES ('c1', 'spring', 100), ('c9', 'unused', 1), ('c2', 'bad budget', NULL);
         ALTER TABLE {schema}.campaigns ALTER COLUMN budget TYPE TEXT;
         UPDATE {schema}.campaigns SET budget = 'lots' WHERE id = 'c2';"
    ))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    join_project(dir, &schema, true);
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    // The static table is read per batch; the row with a budget that is not an integer
    // (row 1 of the ordered query) is quarantined with its row, so c2 finds no match.
    std::fs::write(dir.join("in/001.jsonl"), click("00:30", "c1", "u3") + "\n").unwrap();
    pg_exec(&format!(
        "UPDATE {schema}.campaigns SET name = 'summer' WHERE id = 'c1'"
    ))
    .await;
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(dir)
        .args(["run", "pipeline.yaml", "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let batches = etlantic_sinks::files::read_committed(dir.join("out/enriched")).unwrap();
    let mut rows = Vec::new();
    for b in &batches {
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
    assert_eq!(
        rows,
        [
            r#""u1" "c1" "spring" 100"#,
            r#""u2" "c2" null null"#,
            r#""u3" "c1" "summer" 100"#,
        ]
    );
    let q =
        etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl")).unwrap();
    assert!(!q.is_empty());
    assert!(
        q.iter()
            .all(|l| l["code"] == "ETL702" && l["position"]["row"] == 1),
        "{q:?}"
    );

    // As a streaming (non-static) source the planner refuses the table.
    let tmp2 = tempfile::tempdir().unwrap();
    join_project(tmp2.path(), &schema, false);
    write(
        tmp2.path(),
        "pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: copy_campaigns\nassets:\n  campaigns:\n    contract: contracts/campaigns.yaml\n  campaigns_out:\n    contract: contracts/campaigns.yaml\nsources:\n  - id: campaigns\n    asset: campaigns\nsinks:\n  - id: write_campaigns\n    input: campaigns\n    asset: campaigns_out\n    output_mode: append\n",
    );
    write(
        tmp2.path(),
        "profiles/local.yaml",
        &format!("apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\ntrigger: available_now\ncheckpoint: file://chk\nbindings:\n  campaigns: {PG}?table={schema}.campaigns\n  campaigns_out: file://out/c/?format=jsonl\n"),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
        .current_dir(tmp2.path())
        .args(["run", "pipeline.yaml", "--format", "json"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("ETL503") && text.contains("cannot be read in a streaming run"),
        "{text}"
    );
    pg_exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
}

// ------------------------------------------------------------------ batch runs

#[tokio::test]
async fn a_batch_run_copies_an_sqlite_table_into_postgres() {
    let schema = format!("etl_e2e_batch_{}", std::process::id());
    pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    ))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let db = dir.join("data/shop.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    {
        let o = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE campaigns (id TEXT, name TEXT, budget INTEGER);
             INSERT INTO campaigns VALUES ('c1', 'spring', 100), ('c2', 'summer', 'lots'), ('c3', NULL, 7);",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    }
    write(
        dir,
        "pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: copy_campaigns\nassets:\n  campaigns:\n    contract: contracts/campaigns.yaml\n  campaigns_out:\n    contract: contracts/campaigns.yaml\nsources:\n  - id: campaigns\n    asset: campaigns\nsinks:\n  - id: write_campaigns\n    input: campaigns\n    asset: campaigns_out\n",
    );
    write(
        dir,
        "profiles/local.yaml",
        &format!("apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: batch\nbindings:\n  campaigns: sqlite://data/shop.db?table=campaigns\n  campaigns_out: {PG}?table={schema}.campaigns&mode=overwrite\nquarantine: file://out/quarantine.jsonl\n"),
    );
    write(
        dir,
        "contracts/campaigns.yaml",
        &contract(
            "campaigns",
            &[("id", "string"), ("name", "string"), ("budget", "integer")],
        ),
    );
    for _ in 0..2 {
        let o = Command::new(env!("CARGO_BIN_EXE_etlantic"))
            .current_dir(dir)
            .args(["run", "pipeline.yaml", "--format", "json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", describe(&o));
    }
    // overwrite: the second run replaced the first run's rows.
    let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
    let rows: Vec<(String, Option<String>, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT id, name, budget FROM {schema}.campaigns ORDER BY id"
    ))
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("c1".to_string(), Some("spring".to_string()), Some(100)),
            ("c3".to_string(), None, Some(7)),
        ]
    );
    let q =
        etlantic_runtime::quarantine::read_quarantine(dir.join("out/quarantine.jsonl")).unwrap();
    assert_eq!(q.len(), 2, "one bad row per run: {q:?}");
    assert!(q
        .iter()
        .all(|l| l["code"] == "ETL702" && l["position"]["row"] == 1));
    // Batch runs keep no progress row.
    let n: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}' AND tablename = '_etlantic_sink_progress'"
    ))
    .fetch_one(&mut c)
    .await
    .unwrap()
    .get(0);
    assert_eq!(n, 0);
    pg_exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
}
