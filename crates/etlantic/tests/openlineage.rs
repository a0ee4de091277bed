//! OpenLineage: the run events of streaming and batch runs, validated against the
//! OpenLineage JSON schemas (`tests/openlineage-spec/`, release 1.50), sent to a file and
//! POSTed to a local HTTP server as Marquez takes them.
//!
//! The pipeline is the click counts of the recovery tests with a filter step and a
//! pattern rule on the campaign (`^c[12]$`: the two `c3` clicks break it and are
//! quarantined), so the events carry column lineage of every kind and a failed
//! data-quality assertion.

mod common;
use common::crash::*;
use common::{etlantic, etlantic_env, BIN};

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn profile(extra: &str) -> String {
    click_counts_profile(&format!("application_id: clicks-app\n{extra}"))
}

/// The click-count project with a filter step and a campaign pattern rule.
fn write_project(dir: &Path, profile: &str) {
    write_click_counts(dir, profile);
    let pipeline = CLICK_COUNTS_PIPELINE.replace(
        "    steps:\n",
        "    steps:\n      - filter: \"user != 'bot'\"\n",
    );
    std::fs::write(dir.join("pipeline.yaml"), pipeline).unwrap();
    let contract = CLICKS.replace(
        "      - name: \"campaign\"\n        logicalType: \"string\"\n",
        "      - name: \"campaign\"\n        logicalType: \"string\"\n        logicalTypeOptions: {pattern: \"^c[12]$\"}\n",
    );
    assert_ne!(contract, CLICKS);
    std::fs::write(dir.join("contracts/clicks.yaml"), contract).unwrap();
}

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["eventType"].as_str().unwrap())
        .collect()
}

/// Validates events against the vendored OpenLineage schemas: the run event against
/// `OpenLineage.json`, and every facet whose schema is vendored against it (the others
/// against the core's base facet definitions, which the run event's schema applies).
struct Spec {
    resources: Vec<(String, Value)>,
}

/// Resolves nothing: every schema must be vendored.
struct Offline;

impl jsonschema::Retrieve for Offline {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("schema {uri} is not vendored").into())
    }
}

impl Spec {
    fn load() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let spec = root.join("tests/openlineage-spec");
        let mut files = vec![
            spec.join("OpenLineage.json"),
            common::repo_root().join("docs/openlineage/EtlanticRunFacet.json"),
        ];
        for e in std::fs::read_dir(spec.join("facets")).unwrap() {
            files.push(e.unwrap().path());
        }
        let resources = files
            .iter()
            .map(|f| {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
                (v["$id"].as_str().unwrap().to_string(), v)
            })
            .collect();
        Spec { resources }
    }

    fn validator(&self, reference: &str) -> jsonschema::Validator {
        let mut opts = jsonschema::options().with_retriever(Offline);
        for (id, v) in &self.resources {
            opts = opts.with_resource(
                id.clone(),
                jsonschema::Resource::from_contents(v.clone()).unwrap(),
            );
        }
        opts.build(&json!({ "$ref": reference }))
            .unwrap_or_else(|e| panic!("cannot build a validator for {reference}: {e}"))
    }

    fn is_vendored(&self, schema_url: &str) -> bool {
        let id = schema_url.split('#').next().unwrap();
        self.resources.iter().any(|(r, _)| r == id)
    }

    #[track_caller]
    fn check(&self, event: &Value) {
        let run_event =
            self.validator("https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent");
        let errors: Vec<String> = run_event
            .iter_errors(event)
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{errors:#?}\n{event:#}");
        assert_eq!(
            event["schemaURL"],
            "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
        );
        let mut checked = 0;
        for f in facets(event) {
            let url = f["_schemaURL"].as_str().unwrap();
            if !self.is_vendored(url) {
                assert!(
                    url.contains("DataQualityAssertionsDatasetFacet")
                        || url.contains("DocumentationJobFacet"),
                    "facet schema {url} is neither vendored nor known"
                );
                continue;
            }
            let errors: Vec<String> = self
                .validator(url)
                .iter_errors(f)
                .map(|e| format!("{e} at {}", e.instance_path))
                .collect();
            assert!(errors.is_empty(), "{url}: {errors:#?}\n{f:#}");
            checked += 1;
        }
        assert!(checked >= 4, "{event:#}");
    }
}

/// Every facet of an event.
fn facets(event: &Value) -> Vec<&Value> {
    fn add<'a>(out: &mut Vec<&'a Value>, m: &'a Value) {
        out.extend(m.as_object().into_iter().flat_map(|m| m.values()));
    }
    let mut out = Vec::new();
    add(&mut out, &event["run"]["facets"]);
    add(&mut out, &event["job"]["facets"]);
    let datasets = event["inputs"].as_array().unwrap().iter();
    for d in datasets.chain(event["outputs"].as_array().unwrap()) {
        add(&mut out, &d["facets"]);
        add(&mut out, &d["inputFacets"]);
        add(&mut out, &d["outputFacets"]);
    }
    out
}

fn real(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

/// One transformation entry of an input field, as `(field, type, subtype)`.
fn fields_of(inputs: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = inputs
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| {
            f["transformations"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| {
                    (
                        f["field"].as_str().unwrap().to_string(),
                        t["type"].as_str().unwrap().to_string(),
                        t["subtype"].as_str().unwrap().to_string(),
                    )
                })
        })
        .collect();
    out.sort();
    out
}

fn t(field: &str, kind: &str, sub: &str) -> (String, String, String) {
    (field.into(), kind.into(), sub.into())
}

#[test]
fn a_streaming_run_sends_start_running_and_complete_that_follow_the_spec() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_project(
        dir,
        &profile("lineage:\n  url: file://out/lineage.jsonl\n  running_interval: 0 seconds\n"),
    );
    let run = etlantic(dir, &["run", "--format", "json"]);
    run.ok();
    let report = run.stdout_json();
    let progress: Vec<Value> =
        common::jsonl(&std::fs::read_to_string(dir.join("chk/progress.jsonl")).unwrap());
    let events = events(&dir.join("out/lineage.jsonl"));

    // START, a RUNNING after each micro-batch (interval 0), COMPLETE (available-now done).
    let mut expected = vec!["START"];
    expected.extend(std::iter::repeat_n("RUNNING", progress.len()));
    expected.push("COMPLETE");
    assert_eq!(kinds(&events), expected);

    let spec = Spec::load();
    for e in &events {
        spec.check(e);
        assert_eq!(e["run"]["runId"], report["run_id"]);
        assert_eq!(e["job"]["namespace"], "clicks-app");
        assert_eq!(e["job"]["name"], "click_counts");
        assert_eq!(e["job"]["facets"]["jobType"]["processingType"], "STREAMING");
        let ids = &e["run"]["facets"]["etlantic"];
        assert_eq!(ids["applicationId"], "clicks-app");
        assert_eq!(ids["queryId"], report["query_id"]);
        assert_eq!(ids["runId"], report["run_id"]);
        assert_eq!(ids["planFingerprint"], report["fingerprint"]);
    }
    // The RUNNING events follow the micro-batches.
    for (e, p) in events[1..events.len() - 1].iter().zip(&progress) {
        assert_eq!(e["run"]["facets"]["etlantic"]["batchId"], p["batchId"]);
    }

    // The datasets, named after OpenLineage's conventions, with their contract schemas.
    let start = &events[0];
    let input = &start["inputs"][0];
    assert_eq!(input["namespace"], "file");
    assert_eq!(input["name"], real(dir.join("in")).as_str());
    let schema: Vec<&str> = input["facets"]["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(schema, ["ts", "campaign", "user"]);
    assert!(
        input.get("inputFacets").is_none(),
        "no counts before a micro-batch"
    );
    let output = &start["outputs"][0];
    assert_eq!(output["namespace"], "file");
    assert_eq!(output["name"], real(dir.join("out/counts")).as_str());

    // Column lineage: the window bounds from `ts`, the campaign itself, the count from
    // no column; rows decided by the filter (`user`), the grouping and the window.
    let cl = &output["facets"]["columnLineage"];
    let f = &cl["fields"];
    assert_eq!(
        fields_of(&f["window_start"]["inputFields"]),
        [t("ts", "DIRECT", "TRANSFORMATION")]
    );
    assert_eq!(
        fields_of(&f["window_end"]["inputFields"]),
        [t("ts", "DIRECT", "TRANSFORMATION")]
    );
    assert_eq!(
        fields_of(&f["campaign"]["inputFields"]),
        [t("campaign", "DIRECT", "IDENTITY")]
    );
    assert_eq!(fields_of(&f["n"]["inputFields"]), []);
    assert_eq!(
        fields_of(&cl["dataset"]),
        [
            t("campaign", "INDIRECT", "GROUP_BY"),
            t("ts", "INDIRECT", "WINDOW"),
            t("user", "INDIRECT", "FILTER"),
        ]
    );
    for d in cl["dataset"].as_array().unwrap() {
        assert_eq!(d["namespace"], "file");
        assert_eq!(d["name"], input["name"]);
    }

    // COMPLETE: rows in and out, and the quality of the input.
    let done = events.last().unwrap();
    // 13 records read: 4 quarantined by the source (the unparsable line, the bad
    // timestamp, the two c3 clicks); the late click is read, then quarantined as late.
    let rejected = 4;
    assert_eq!(report["sources"][0]["rows"], 13 - rejected);
    assert_eq!(report["sources"][0]["rejected"], rejected);
    assert_eq!(
        report["sources"][0]["quarantined_by_rule"],
        json!({"clicks.campaign.pattern": 2})
    );
    assert_eq!(
        done["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"],
        13
    );
    // Windows closed by the last watermark (04:50): [00:00) c1 2, c2 1; [01:00) c1 2,
    // c2 1; [02:00) c2 1. The c3 clicks are quarantined by the rule.
    assert_eq!(
        done["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"],
        5
    );
    let assertions = done["inputs"][0]["inputFacets"]["dataQualityAssertions"]["assertions"]
        .as_array()
        .unwrap();
    let rule = assertions
        .iter()
        .find(|a| a["name"] == "clicks.campaign.pattern")
        .unwrap_or_else(|| panic!("{assertions:#?}"));
    assert_eq!(rule["assertion"], "pattern");
    assert_eq!(rule["column"], "campaign");
    assert_eq!(rule["success"], false);
    assert_eq!(rule["actual"], "2");
    assert_eq!(rule["params"]["removed"], 2);
    assert_eq!(rule["params"]["policy"], "quarantine");
    let contract = assertions
        .iter()
        .find(|a| a["assertion"] == "contract")
        .unwrap();
    assert_eq!(contract["success"], false);
    assert_eq!(contract["actual"], rejected.to_string().as_str());
}

#[test]
fn a_failed_batch_run_sends_start_then_fail_with_the_error() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_project(
        dir,
        &(as_batch(&profile(
            "lineage:\n  url: file://out/lineage.jsonl\n  namespace: analytics\n",
        )) + "on_error: fail\n"),
    );
    let run = etlantic(dir, &["run", "--format", "json"]);
    run.expect_code(common::exit::EXECUTION_FAILED);
    let events = events(&dir.join("out/lineage.jsonl"));
    assert_eq!(kinds(&events), ["START", "FAIL"]);
    let spec = Spec::load();
    for e in &events {
        spec.check(e);
        assert_eq!(e["job"]["namespace"], "analytics");
        assert_eq!(e["job"]["facets"]["jobType"]["processingType"], "BATCH");
        assert_eq!(e["run"]["runId"], events[0]["run"]["runId"]);
    }
    let message = events[1]["run"]["facets"]["errorMessage"]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("ETL705"), "{message}");
    assert_eq!(
        events[1]["run"]["facets"]["errorMessage"]["programmingLanguage"],
        "Rust"
    );
}

/// A local HTTP server that records each request (head and body) and answers `status`.
struct Server {
    addr: String,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Server {
    fn start(status: u16) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let requests: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    head.push_str(&line);
                    line.clear();
                }
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                seen.lock()
                    .unwrap()
                    .push((head, serde_json::from_slice(&body).unwrap_or(Value::Null)));
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        Server { addr, requests }
    }
}

fn batch_profile(url: &str) -> String {
    as_batch(&profile(&format!(
        "lineage:\n  url: {url}\n  api_key: ${{secret:marquez}}\nsecrets:\n  marquez: ${{env:MARQUEZ_KEY}}\n"
    )))
}

#[test]
fn the_http_transport_posts_each_event_with_the_api_key() {
    let server = Server::start(200);
    let p = common::Project::empty();
    let dir = p.dir.path();
    let url = format!("http://{}/api/v1/lineage", server.addr);
    write_project(dir, &batch_profile(&url));
    let run = etlantic_env(dir, &["run"], &[("MARQUEZ_KEY", "k-123")]);
    run.ok();
    let requests = server.requests.lock().unwrap().clone();
    let kinds: Vec<&str> = requests
        .iter()
        .map(|(_, e)| e["eventType"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["START", "COMPLETE"]);
    let spec = Spec::load();
    for (head, event) in &requests {
        assert!(head.starts_with("POST /api/v1/lineage HTTP/1.1"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("authorization: bearer k-123"), "{head}");
        assert!(lower.contains("content-type: application/json"), "{head}");
        spec.check(event);
    }
    // The key never reaches what the run writes.
    assert!(!run.all_output().contains("k-123"));
}

#[test]
fn a_lineage_server_that_fails_never_fails_the_run() {
    let server = Server::start(500);
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_project(
        dir,
        &batch_profile(&format!("http://{}/api/v1/lineage", server.addr)),
    );
    let run = etlantic_env(dir, &["run"], &[("MARQUEZ_KEY", "k-123")]);
    run.ok();
    assert_eq!(server.requests.lock().unwrap().len(), 2);
    assert!(
        run.stderr.contains("cannot send an OpenLineage event"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("HTTP 500"), "{}", run.stderr);
    // The results are there all the same.
    assert!(std::fs::read_dir(dir.join("out/counts")).unwrap().count() > 0);
}

#[test]
fn a_streaming_query_stopped_on_request_sends_abort() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_project(
        dir,
        &profile("lineage:\n  url: file://out/lineage.jsonl\n  running_interval: 0 seconds\n")
            .replace(
                "trigger: available_now",
                "trigger: processing_time 100 milliseconds",
            ),
    );
    let mut child = Command::new(BIN)
        .args(["run"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let path = dir.join("out/lineage.jsonl");
    let deadline = Instant::now() + Duration::from_secs(120);
    while events(&path).len() < 3 {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no RUNNING event: {:?}", events(&path));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let events = events(&path);
    let kinds = kinds(&events);
    assert_eq!(kinds[0], "START");
    assert_eq!(*kinds.last().unwrap(), "ABORT", "{kinds:?}");
    assert!(
        kinds[1..kinds.len() - 1].iter().all(|k| *k == "RUNNING"),
        "{kinds:?}"
    );
    Spec::load().check(events.last().unwrap());
}

#[test]
fn a_bad_lineage_configuration_is_a_diagnostic() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_project(dir, &profile("lineage:\n  url: ftp://lineage.example\n"));
    let run = etlantic(dir, &["validate", "--format", "json"]);
    run.expect_code(common::exit::INVALID_PIPELINE);
    let diag = common::find_diag(&run.stdout_json(), "ETL007");
    assert_eq!(diag["path"], "lineage.url", "{diag}");

    write_project(
        dir,
        &profile("lineage:\n  url: http://x/api/v1/lineage\n  api_key: plain-key\n"),
    );
    let run = etlantic(dir, &["validate", "--format", "json"]);
    run.expect_code(common::exit::INVALID_PIPELINE);
    let diag = common::find_diag(&run.stdout_json(), "ETL602");
    assert_eq!(diag["path"], "lineage.api_key", "{diag}");
}
