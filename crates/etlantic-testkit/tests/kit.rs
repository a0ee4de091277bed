//! The plugin kit on the built-in plugins: the memory and file sources, the memory and
//! file sinks (the file sink also killed at every step of the batch protocol). Each
//! harness is what a plugin author writes for their own provider.

use etlantic_core::async_trait;
use etlantic_core::diagnostics::Result;
use etlantic_testkit::kit::sink::{self, SinkHarness};
use etlantic_testkit::kit::source::{self, SourceHarness};
use etlantic_testkit::kit::{batch_rows, to_batch};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn io(e: std::io::Error) -> etlantic_core::Error {
    etlantic_core::Error::new(&etlantic_core::diagnostics::codes::IO_ERROR, e.to_string())
}

/// The memory source: a named in-process stream of typed batches.
struct MemoryStreamHarness {
    name: String,
}

#[async_trait]
impl SourceHarness for MemoryStreamHarness {
    fn binding(&self) -> String {
        format!("memory://{}", self.name)
    }

    async fn append(&mut self, records: &[Value]) -> Result<()> {
        let schema = source::events_schema();
        etlantic_sources::memory::MemoryStream::push(&self.name, to_batch(&schema, records)?)?;
        Ok(())
    }
}

#[tokio::test]
async fn the_memory_source_passes_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = MemoryStreamHarness {
        name: format!("kit_{}", uuid::Uuid::new_v4().simple()),
    };
    etlantic_sources::memory::MemoryStream::register(&harness.name, source::events_schema());
    let report = source::check_source(
        &etlantic_sources::memory::MemorySourceProvider,
        &mut harness,
        dir.path(),
    )
    .await;
    report.assert_passed();
    // Typed batches cannot be malformed: every other check ran.
    assert_eq!(
        report.names(),
        [
            "capabilities",
            "schema",
            "empty",
            "read",
            "nothing_new",
            "offsets_json",
            "replay",
            "next_range",
            "read_limit",
            "commit"
        ]
    );
}

/// The file source: a directory of JSON-lines files, one file per append.
struct DirectoryHarness {
    dir: PathBuf,
    files: usize,
}

impl DirectoryHarness {
    fn write(&mut self, text: &str) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let path = self.dir.join(format!("{:04}.jsonl", self.files));
        self.files += 1;
        std::fs::write(path, text).map_err(io)
    }
}

#[async_trait]
impl SourceHarness for DirectoryHarness {
    fn binding(&self) -> String {
        format!("file://{}?format=jsonl", self.dir.display())
    }

    async fn append(&mut self, records: &[Value]) -> Result<()> {
        let text: String = records.iter().map(|r| r.to_string() + "\n").collect();
        self.write(&text)
    }

    async fn append_malformed(&mut self, raw: &str) -> Result<bool> {
        self.write(&format!("{raw}\n"))?;
        Ok(true)
    }
}

#[tokio::test]
async fn the_file_source_passes_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = DirectoryHarness {
        dir: dir.path().join("in"),
        files: 0,
    };
    let report = source::check_source(
        &etlantic_sources::files::FileSourceProvider,
        &mut harness,
        dir.path(),
    )
    .await;
    report.assert_passed();
    assert!(report.names().contains(&"rejects"), "{:?}", report.names());
}

/// The memory sink: named in-process targets.
struct MemorySinkHarness;

#[async_trait]
impl SinkHarness for MemorySinkHarness {
    fn binding(&self, name: &str) -> String {
        format!("memory://{name}")
    }

    async fn rows(&self, _project: &Path, name: &str) -> Result<Vec<Value>> {
        batch_rows(&etlantic_sinks::memory::MemorySink::rows(name))
    }
}

#[tokio::test]
async fn the_memory_sink_passes_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let report = sink::check_sink(
        &etlantic_sinks::memory::MemorySinkProvider,
        &MemorySinkHarness,
        dir.path(),
    )
    .await;
    report.assert_passed();
    assert_eq!(
        report.names(),
        [
            "capabilities",
            "write",
            "replay",
            "last_committed",
            "close",
            "complete"
        ]
    );
}

/// The file sink: a directory of JSON-lines files and its sink log, per target.
struct FileSinkHarness;

#[async_trait]
impl SinkHarness for FileSinkHarness {
    fn binding(&self, name: &str) -> String {
        format!("file://out/{name}?format=jsonl")
    }

    async fn rows(&self, project: &Path, name: &str) -> Result<Vec<Value>> {
        let dir = project.join("out").join(name);
        if !dir.exists() {
            return Ok(vec![]);
        }
        batch_rows(&etlantic_sinks::files::read_committed(dir)?)
    }
}

#[tokio::test]
async fn the_file_sink_passes_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let report = sink::check_sink(
        &etlantic_sinks::files::FileSinkProvider,
        &FileSinkHarness,
        dir.path(),
    )
    .await;
    report.assert_passed();
    assert!(report.names().contains(&"complete"), "{:?}", report.names());
}

/// Killed at every step of the batch protocol, in child processes (this test, run
/// again), the file sink ends with the uninterrupted run's rows.
#[tokio::test]
async fn the_file_sink_killed_at_every_step_loses_and_duplicates_nothing() {
    // (As the child, the kit runs the query in the directory its parent named.)
    let dir = tempfile::tempdir().unwrap();
    let report = sink::check_sink_killed_at_every_step(
        &etlantic_sinks::files::FileSinkProvider,
        "the_file_sink_killed_at_every_step_loses_and_duplicates_nothing",
        &FileSinkHarness,
        dir.path(),
    )
    .await;
    report.assert_passed();
    // Five steps of the batch protocol, each at several micro-batches, were killed.
    let kills = report.checks.iter().filter(|c| c.name == "kill").count();
    assert!(kills >= 15, "{kills} kill checks:\n{report:?}");
}

/// The embedded engine runs every case of both corpora it declares the actions and
/// functions of.
#[tokio::test]
async fn the_datafusion_backend_passes_the_kit() {
    let report = etlantic_testkit::kit::backend::check_backend(
        "datafusion",
        std::sync::Arc::new(etlantic_datafusion::DataFusionBackend),
        0.0,
    )
    .await;
    report.assert_passed();
    // Both corpora ran (63 portable cases and ETLantic-py's 43).
    assert!(report.checks.len() >= 100, "{}", report.checks.len());
}

#[cfg(feature = "equivalence")]
#[tokio::test]
async fn the_polars_and_sqlite_backends_pass_the_kit() {
    for (label, backend, tolerance) in [
        (
            "polars",
            std::sync::Arc::new(etlantic_polars::PolarsBackend)
                as std::sync::Arc<dyn etlantic_core::plugin::Backend>,
            0.0,
        ),
        (
            "sqlite",
            std::sync::Arc::new(etlantic_sql::SqlBackend::unbound(
                etlantic_sql::Dialect::Sqlite,
            )),
            etlantic_testkit::equivalence::SQLITE_TOLERANCE,
        ),
    ] {
        etlantic_testkit::kit::backend::check_backend(label, backend, tolerance)
            .await
            .assert_passed();
    }
}

/// A sink that declares itself idempotent by batch id but appends every write, replays
/// included: the kit must catch the lie (a kit that cannot fail checks nothing).
struct ForgetfulSinkProvider;

static FORGETFUL: std::sync::Mutex<Vec<(String, arrow::array::RecordBatch)>> =
    std::sync::Mutex::new(Vec::new());

struct ForgetfulSink {
    target: String,
}

#[async_trait]
impl etlantic_core::plugin::Sink for ForgetfulSink {
    async fn write(
        &mut self,
        batch: etlantic_core::plugin::SinkBatch<'_>,
    ) -> Result<etlantic_core::plugin::WriteOutcome> {
        let mut all = FORGETFUL.lock().unwrap();
        for b in &batch.data.batches {
            all.push((self.target.clone(), b.clone()));
        }
        Ok(etlantic_core::plugin::WriteOutcome::Written {
            rows: batch.data.num_rows() as u64,
        })
    }
}

impl etlantic_core::plugin::SinkProvider for ForgetfulSinkProvider {
    fn scheme(&self) -> &'static str {
        "forgetful"
    }

    fn description(&self) -> &'static str {
        "a broken sink for the kit's own test"
    }

    fn capabilities(
        &self,
        _uri: &etlantic_core::uri::BindingUri,
    ) -> Result<etlantic_core::plugin::SinkCapabilities> {
        Ok(etlantic_core::plugin::SinkCapabilities {
            batch: false,
            streaming: true,
            output_modes: vec![etlantic_core::streaming::OutputMode::Append],
            guarantee: etlantic_core::guarantee::SinkGuarantee::new(
                etlantic_core::guarantee::SinkCommitProtocol::IdempotentByBatch,
            ),
        })
    }

    fn create(
        &self,
        ctx: etlantic_core::plugin::SinkContext,
    ) -> Result<Box<dyn etlantic_core::plugin::Sink>> {
        Ok(Box::new(ForgetfulSink {
            target: ctx.uri.location.clone(),
        }))
    }
}

struct ForgetfulHarness;

#[async_trait]
impl SinkHarness for ForgetfulHarness {
    fn binding(&self, name: &str) -> String {
        format!("forgetful://{name}")
    }

    async fn rows(&self, _project: &Path, name: &str) -> Result<Vec<Value>> {
        let batches: Vec<arrow::array::RecordBatch> = FORGETFUL
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t == name)
            .map(|(_, b)| b.clone())
            .collect();
        batch_rows(&batches)
    }
}

#[tokio::test]
async fn the_kit_catches_a_sink_that_duplicates_replays() {
    let dir = tempfile::tempdir().unwrap();
    let report = sink::check_sink(&ForgetfulSinkProvider, &ForgetfulHarness, dir.path()).await;
    assert!(!report.passed(), "{report}");
    let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
    assert!(failed.contains(&"replay"), "{report}");
    assert!(report.to_string().contains("expected rows"), "{report}");
}
