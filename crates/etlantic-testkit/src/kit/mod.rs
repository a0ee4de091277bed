//! The plugin kit: suites a plugin author runs with one call against their provider,
//! checking the invariants the plugin traits state.
//!
//! - [`source::check_source`]: a [`etlantic_core::plugin::SourceProvider`] on records a
//!   [`source::SourceHarness`] appends — constant schema, offsets that round-trip through
//!   JSON and a restart, deterministic replays, read limits, rejects with positions;
//! - [`sink::check_sink`]: a [`etlantic_core::plugin::SinkProvider`] written directly —
//!   each row once, replays of a `(query id, batch id)` that change nothing, complete
//!   mode replacing; and [`sink::check_sink_killed_at_every_step`]: a streaming query into
//!   it killed at every step of the batch protocol, 0 lost and 0 duplicated for the
//!   guarantee it declares;
//! - [`backend::check_backend`]: the backend-equivalence corpus and ETLantic-py's portable
//!   corpus on a backend — every case whose actions and functions it declares runs, gives
//!   the reference rows, and `output_schema` matches what it executes.
//!
//! Every check returns a [`KitReport`]; [`KitReport::assert_passed`] fails a test with the
//! list of broken invariants.
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_sink_passes_the_kit() {
//!     let dir = tempfile::tempdir().unwrap();
//!     etlantic_testkit::kit::sink::check_sink(&MySinkProvider, &MyHarness, dir.path())
//!         .await
//!         .assert_passed();
//! }
//! ```

pub mod backend;
pub mod sink;
pub mod source;

use serde_json::Value;
use std::fmt;

/// An I/O error as a diagnostic.
fn io(e: std::io::Error) -> etlantic_core::diagnostics::Error {
    etlantic_core::diagnostics::Error::new(
        &etlantic_core::diagnostics::codes::IO_ERROR,
        e.to_string(),
    )
}

/// One invariant the kit checked, and what it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The check's name (see the module docs of [`source`] and [`sink`]).
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// What was found when it did not hold (empty when it did).
    pub detail: String,
}

/// What a kit run found.
#[derive(Clone, Debug, Default)]
pub struct KitReport {
    /// What was checked (`source \`nats\``, ...).
    pub subject: String,
    /// The checks, in the order they ran; a check may appear more than once.
    pub checks: Vec<Check>,
    /// Declared capabilities no passing check exercised (the backend kit's coverage:
    /// informative, not a failure).
    pub coverage: Vec<String>,
}

impl KitReport {
    /// An empty report about `subject`.
    pub fn new(subject: String) -> Self {
        KitReport {
            subject,
            checks: Vec::new(),
            coverage: Vec::new(),
        }
    }

    /// Records a check that held.
    pub fn pass(&mut self, name: &str) {
        self.check(name, true, "");
    }

    /// Records a check that did not hold.
    pub fn fail(&mut self, name: &str, detail: impl Into<String>) {
        self.check(name, false, detail);
    }

    /// Records a check.
    pub fn check(&mut self, name: &str, passed: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_string(),
            passed,
            detail: if passed { String::new() } else { detail.into() },
        });
    }

    /// Records whether `got` holds exactly the ids `want`, in order.
    pub fn check_rows(&mut self, name: &str, got: &[i64], want: &[i64]) {
        self.check(
            name,
            got == want,
            format!("expected records {want:?}, got {got:?}"),
        );
    }

    /// Records whether `got` and `want` hold the same rows (as multisets, see
    /// [`canonical`]).
    pub fn check_values(&mut self, name: &str, got: &[Value], want: &[Value]) {
        let (got, want) = (canonical(got), canonical(want));
        self.check(
            name,
            got == want,
            format!("expected rows {want:?}, got {got:?}"),
        );
    }

    /// The checks that did not hold.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// Panics with every check that did not hold.
    #[track_caller]
    pub fn assert_passed(&self) {
        if !self.passed() {
            panic!("{self}");
        }
    }

    /// The names of the checks that ran, each once, in order.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = Vec::new();
        for c in &self.checks {
            if !v.contains(&c.name.as_str()) {
                v.push(&c.name);
            }
        }
        v
    }
}

impl fmt::Display for KitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed: Vec<&Check> = self.failures().collect();
        if failed.is_empty() {
            return write!(f, "{}: {} checks passed", self.subject, self.checks.len());
        }
        writeln!(
            f,
            "{}: {} of {} checks failed",
            self.subject,
            failed.len(),
            self.checks.len()
        )?;
        for c in failed {
            writeln!(f, "  {}: {}", c.name, c.detail)?;
        }
        Ok(())
    }
}

/// JSON objects as one record batch of `schema` (timestamps as RFC 3339 text).
pub fn to_batch(
    schema: &arrow::datatypes::SchemaRef,
    rows: &[Value],
) -> etlantic_core::Result<arrow::array::RecordBatch> {
    use etlantic_core::diagnostics::Error;
    let text: String = rows.iter().map(|r| r.to_string() + "\n").collect();
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .map_err(Error::engine)?;
    decoder.decode(text.as_bytes()).map_err(Error::engine)?;
    Ok(decoder
        .flush()
        .map_err(Error::engine)?
        .unwrap_or_else(|| arrow::array::RecordBatch::new_empty(schema.clone())))
}

/// Record batches as JSON objects (a harness's [`sink::SinkHarness::rows`] from Arrow).
pub fn batch_rows(batches: &[arrow::array::RecordBatch]) -> etlantic_core::Result<Vec<Value>> {
    use etlantic_core::diagnostics::Error;
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for b in batches {
        writer.write(b).map_err(Error::engine)?;
    }
    writer.finish().map_err(Error::engine)?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(vec![]);
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::engine(e.to_string()))
}

/// Rows as sorted canonical JSON texts (a multiset): keys sorted, and timestamp-looking
/// text (RFC 3339, or `YYYY-MM-DD HH:MM:SS[.f]` taken as UTC) as microseconds since the
/// epoch, so that rows read back from different systems compare.
pub fn canonical(rows: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = rows
        .iter()
        .map(|r| canonical_value(r).to_string())
        .collect();
    v.sort();
    v
}

fn canonical_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: std::collections::BTreeMap<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), canonical_value(v)))
                .collect();
            serde_json::to_value(sorted).expect("JSON")
        }
        Value::String(s) => match timestamp_micros(s) {
            Some(us) => Value::from(us),
            None => v.clone(),
        },
        other => other.clone(),
    }
}

fn timestamp_micros(s: &str) -> Option<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    for f in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc().timestamp_micros());
        }
    }
    None
}
