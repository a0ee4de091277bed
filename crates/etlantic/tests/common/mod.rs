//! Helpers shared by the CLI integration tests: they drive the real `etlantic` binary in
//! temporary directories and look at its exit code, its output and the files it writes.
#![allow(dead_code)]

pub mod crash;

/// The quarantine line of the test profiles: rejected records into `out/`.
pub const QUARANTINE: &str = "quarantine: file://out/quarantine.jsonl\n";

/// A streaming profile `local` as the recovery tests run it: available-now, checkpoint
/// `chk`, `bindings` (asset, URL as YAML), then `extra` (YAML lines, e.g. [`QUARANTINE`]).
pub fn available_now_profile(bindings: &[(&str, &str)], extra: &str) -> String {
    let bindings: String = bindings
        .iter()
        .map(|(asset, url)| format!("  {asset}: {url}\n"))
        .collect();
    format!(
        "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: streaming\n\
         trigger: available_now\ncheckpoint: file://chk\nbindings:\n{bindings}{extra}"
    )
}

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use etlantic::exit;

/// The `etlantic` binary built by cargo for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_etlantic");

/// What one invocation of the binary did.
#[derive(Debug)]
pub struct Run {
    /// The arguments, for failure messages.
    pub args: Vec<String>,
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    fn from_output(args: Vec<String>, out: Output) -> Self {
        Run {
            args,
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            code,
            "`etlantic {}` exited with {} (expected {code})\n--- stdout\n{}\n--- stderr\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless the command succeeded.
    #[track_caller]
    pub fn ok(&self) -> &Self {
        self.expect_code(exit::OK)
    }

    /// Standard output parsed as one JSON document.
    #[track_caller]
    pub fn stdout_json(&self) -> Value {
        parse_json(&self.stdout, &self.args)
    }

    /// Standard error parsed as one JSON document.
    #[track_caller]
    pub fn stderr_json(&self) -> Value {
        parse_json(&self.stderr, &self.args)
    }

    /// Everything the process printed.
    pub fn all_output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

#[track_caller]
fn parse_json(text: &str, args: &[String]) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "`etlantic {}` did not print one JSON document ({e}):\n{text}",
            args.join(" ")
        )
    })
}

/// Runs `etlantic args...` in `dir` with extra environment variables.
pub fn etlantic_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(dir).env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
    Run::from_output(args.iter().map(|s| s.to_string()).collect(), out)
}

/// Runs `etlantic args...` in `dir`.
pub fn etlantic(dir: &Path, args: &[&str]) -> Run {
    etlantic_env(dir, args, &[])
}

/// A temporary project directory.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// An empty directory.
    pub fn empty() -> Self {
        Project {
            dir: tempfile::Builder::new()
                .prefix("etlantic-cli-")
                .tempdir()
                .expect("a temporary directory"),
        }
    }

    /// A directory scaffolded by `etlantic init`.
    pub fn init() -> Self {
        let p = Self::empty();
        p.run(&["init"]).ok();
        p
    }

    /// The project directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the project.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    /// Runs the binary in the project directory.
    pub fn run(&self, args: &[&str]) -> Run {
        etlantic(self.path(), args)
    }

    /// Runs the binary in the project directory with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        etlantic_env(self.path(), args, env)
    }

    /// Writes a file (creating its directory).
    pub fn write(&self, rel: &str, content: &str) {
        let p = self.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, content).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    }

    /// Reads a file.
    #[track_caller]
    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    /// Whether a file exists.
    pub fn exists(&self, rel: &str) -> bool {
        self.join(rel).exists()
    }

    /// Replaces `from` by `to` in a file; panics when `from` is not there.
    #[track_caller]
    pub fn edit(&self, rel: &str, from: &str, to: &str) {
        let text = self.read(rel);
        assert!(text.contains(from), "{rel} does not contain {from:?}");
        self.write(rel, &text.replacen(from, to, 1));
    }

    /// Lines of a JSON-lines file, parsed.
    #[track_caller]
    pub fn jsonl(&self, rel: &str) -> Vec<Value> {
        jsonl(&self.read(rel))
    }
}

/// Parses JSON lines.
#[track_caller]
pub fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
        .collect()
}

/// The diagnostics of a `--format json` rendering.
#[track_caller]
/// The records `etlantic dlq list --format json` counted, over all its groups.
#[allow(dead_code)]
pub fn dlq_records(groups: &Value) -> u64 {
    groups
        .as_array()
        .expect("dlq list gives an array of groups")
        .iter()
        .map(|g| g["records"].as_u64().expect("a group counts its records"))
        .sum()
}

pub fn diagnostics(json: &Value) -> Vec<Value> {
    json["diagnostics"]
        .as_array()
        .unwrap_or_else(|| panic!("no `diagnostics` array in {json}"))
        .clone()
}

/// The codes of the error diagnostics of a `--format json` rendering.
pub fn error_codes(json: &Value) -> Vec<String> {
    diagnostics(json)
        .iter()
        .filter(|d| d["severity"] == "error")
        .map(|d| d["code"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The first error diagnostic with `code`; panics when there is none.
#[track_caller]
pub fn find_diag(json: &Value, code: &str) -> Value {
    diagnostics(json)
        .into_iter()
        .find(|d| d["code"] == code)
        .unwrap_or_else(|| panic!("no {code} diagnostic in {json:#}"))
}

/// Checks a SARIF 2.1.0 log: its version, and that `code` is the rule of a result.
#[track_caller]
pub fn assert_sarif_has(sarif: &Value, code: &str) {
    assert_eq!(sarif["version"], "2.1.0", "{sarif:#}");
    let results = sarif["runs"][0]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs[0].results in {sarif:#}"));
    assert!(
        results.iter().any(|r| r["ruleId"] == code),
        "no result with ruleId {code} in {sarif:#}"
    );
    let rules = sarif["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("no rules in {sarif:#}"));
    assert!(rules.iter().any(|r| r["id"] == code), "no rule {code}");
}

/// The directory of the ETLantic-py interop fixtures.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/etlantic-py")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// The fingerprint `etlantic plan` prints for the project.
#[track_caller]
pub fn plan_fingerprint(dir: &Path, args: &[&str]) -> String {
    let r = etlantic(dir, args);
    r.ok();
    // With `-o FILE` the plan is in the file (the terminal gets one line).
    let plan: Value = match args.iter().position(|a| *a == "-o" || *a == "--out") {
        Some(i) => serde_json::from_str(
            &std::fs::read_to_string(dir.join(args[i + 1])).expect("the plan file"),
        )
        .expect("the plan file is JSON"),
        None => r.stdout_json(),
    };
    plan["fingerprint"]
        .as_str()
        .expect("a fingerprint")
        .to_string()
}

/// Numbers compared by value (`20` equals `20.0`); everything else as is.
pub fn normalize(v: &Value) -> Value {
    match v {
        Value::Number(n) => serde_json::json!(n.as_f64().unwrap_or(f64::NAN)),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        other => other.clone(),
    }
}

/// A project around one of the ETLantic-py fixture plans (see `fixture_pipeline`).
pub fn plan_project(fixture: &str, port_rename: Option<(&str, &str)>, params: bool) -> Project {
    let p = Project::empty();
    let f = fixtures_dir().join(fixture);
    copy_dir(&f, p.path());
    let (pipeline, profile) = fixture_pipeline(fixture, params);
    let pipeline = match port_rename {
        Some((from, to)) => pipeline.replace(&format!("{from}: {from}"), &format!("{to}: {from}")),
        None => pipeline,
    };
    p.write("pipeline.yaml", &pipeline);
    p.write("profiles/local.yaml", &profile);
    p
}

/// A pipeline and a profile around an ETLantic-py fixture, derived from its DPCS
/// contract: one source per pipeline input, one `plan:` transformation `step`, one sink.
pub fn fixture_pipeline(fixture: &str, with_params: bool) -> (String, String) {
    let dir = fixtures_dir().join(fixture);
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("manifest.json")).unwrap(),
    )
    .unwrap();
    let entry = manifest["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == fixture)
        .unwrap()
        .clone();
    let dpcs_path = std::fs::read_dir(dir.join("contracts/pipelines"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let dpcs: Value = serde_yaml::from_str(&std::fs::read_to_string(dpcs_path).unwrap()).unwrap();
    let location = |r: &Value| -> String {
        let loc = dpcs["contractReferences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == *r)
            .unwrap()["location"]
            .as_str()
            .unwrap()
            .to_string();
        format!("contracts/{loc}")
    };
    let mut pipeline = String::from("apiVersion: etlantic/v1\nkind: Pipeline\n");
    pipeline.push_str(&format!("name: {fixture}\nassets:\n"));
    let mut profile =
        String::from("apiVersion: etlantic/v1\nkind: Profile\nname: local\nbindings:\n");
    let mut sources = String::from("sources:\n");
    let mut ports = String::new();
    for i in dpcs["interface"]["inputs"].as_array().unwrap() {
        let id = i["id"].as_str().unwrap();
        pipeline.push_str(&format!(
            "  {id}:\n    contract: {}\n",
            location(&i["contractRef"])
        ));
        sources.push_str(&format!("  - id: {id}\n    asset: {id}\n"));
        let edge = dpcs["dataFlow"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["from"] == format!("interface.inputs.{id}"))
            .unwrap();
        let port = edge["to"].as_str().unwrap().rsplit('.').next().unwrap();
        ports.push_str(&format!("      {port}: {id}\n"));
        profile.push_str(&format!(
            "  {id}: file://{}\n",
            entry["inputs"][port]
                .as_str()
                .unwrap()
                .split_once('/')
                .unwrap()
                .1
        ));
    }
    let out = &dpcs["interface"]["outputs"][0];
    let out_id = out["id"].as_str().unwrap();
    pipeline.push_str(&format!(
        "  {out_id}_asset:\n    contract: {}\n",
        location(&out["contractRef"])
    ));
    profile.push_str(&format!("  {out_id}_asset: file://out/result.jsonl\n"));
    pipeline.push_str(&sources);
    pipeline.push_str("transforms:\n  - id: step\n    inputs:\n");
    pipeline.push_str(&ports);
    pipeline.push_str("    plan: plan.json\n");
    if with_params {
        if let Some(params) = entry["parameters"].as_object().filter(|m| !m.is_empty()) {
            pipeline.push_str("    parameters:\n");
            for (k, v) in params {
                pipeline.push_str(&format!("      {k}: {v}\n"));
            }
        }
    }
    pipeline.push_str(&format!(
        "sinks:\n  - id: {out_id}\n    input: step\n    asset: {out_id}_asset\n"
    ));
    (pipeline, profile)
}

/// The micro-batch log of the checkpoint directory `chk` (its offsets and commit
/// records, see `etlantic_runtime::checkpoint::batch_log`).
pub fn batch_log(chk: &Path) -> etlantic_runtime::checkpoint::batch_log::LogRecords {
    etlantic_runtime::checkpoint::batch_log::read_all(&chk.join("log"))
        .expect("the checkpoint log is readable")
}

/// The versions each stateful operator has an entry for in the state log of the
/// checkpoint directory `chk` (see `etlantic_runtime::checkpoint::state_log`).
#[allow(dead_code)]
pub fn logged_state_versions(chk: &Path) -> std::collections::BTreeMap<String, Vec<u64>> {
    etlantic_runtime::checkpoint::state_log::logged_versions(&chk.join("state-changes"))
        .expect("the state log is readable")
}

/// The whole state the state log of `chk` holds of operator `op` at `version`.
#[allow(dead_code)]
pub fn logged_whole_state(chk: &Path, op: &str, version: u64) -> Option<arrow::array::RecordBatch> {
    use etlantic_runtime::checkpoint::state_log::{read_logged, Logged};
    match read_logged(&chk.join("state-changes"), op, version)
        .expect("the state log is readable")?
    {
        Logged::Whole(state) => Some(state),
        Logged::Changes { .. } => panic!("{op} logs changes, not its whole state"),
    }
}

/// The offsets records of `log` as JSON without their batch timestamps and plan
/// fingerprints: what two runs of one input agree on when their profiles differ (the
/// profile is part of the plan).
#[allow(dead_code)]
pub fn comparable_offsets(
    log: etlantic_runtime::checkpoint::batch_log::LogRecords,
) -> std::collections::BTreeMap<u64, Value> {
    log.offsets
        .into_iter()
        .map(|(n, e)| {
            let mut v = serde_json::to_value(e).expect("serialisable");
            v.as_object_mut()
                .expect("an object")
                .remove("batchTimestampMs");
            if let Some(conf) = v["conf"].as_object_mut() {
                conf.remove("planFingerprint");
            }
            (n, v)
        })
        .collect()
}

/// The offsets record of batch `n` in the checkpoint `chk`, as JSON.
pub fn logged_offsets(chk: &Path, n: u64) -> Option<Value> {
    batch_log(chk)
        .offsets
        .get(&n)
        .map(|e| serde_json::to_value(e).expect("serialisable"))
}

/// The commit record of batch `n` in the checkpoint `chk`, as JSON.
pub fn logged_commit(chk: &Path, n: u64) -> Option<Value> {
    batch_log(chk)
        .commits
        .get(&n)
        .map(|e| serde_json::to_value(e).expect("serialisable"))
}

/// Arrow batches as JSON rows (one object per row), as arrow's JSON writer writes them.
pub fn json_rows(batches: &[arrow::array::RecordBatch]) -> Vec<Value> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
    }
    String::from_utf8(buf)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
