//! Progress records shaped like Spark's `StreamingQueryProgress`, one per micro-batch,
//! written as JSON lines to `<checkpoint>/progress.jsonl` and handed to listeners.
//!
//! [`QueryProgress`] is the record as a type: the runtime fills it, listeners read its
//! fields, and it serialises to Spark's JSON (camelCase names, Spark's members first,
//! ETLantic's after). A record of a backend that runs the whole query (Spark) keeps the
//! members it has beyond these in `extra`.

use crate::quality::RuleCount;
use chrono::{DateTime, SecondsFormat, Utc};
use etlantic_core::data::DataLoss;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{AppendFile, Storage};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The progress log of a query: one JSON record per micro-batch appended to
/// `<checkpoint>/progress.jsonl`, which is rotated so that it never grows without bound.
///
/// When a record would take the file past its size limit ([`PROGRESS_ROTATE_BYTES`] by
/// default), the file is renamed to `progress.1.jsonl` (replacing the previous one) and a
/// new `progress.jsonl` starts: the log keeps the newest records, between one and two
/// limits' worth. The records are for people and tools (`etlantic status`); recovery
/// never reads them, so they are not synced on a disk. On an object store, where a write
/// reaches the store only at a sync (a `PUT` of the whole file), the file is synced at
/// most every [`OBJECT_SYNC_EVERY`] and when the log is dropped, and rotated at
/// [`OBJECT_ROTATE_BYTES`].
#[derive(Debug)]
pub struct ProgressLog {
    /// The checkpoint directory.
    storage: Arc<dyn Storage>,
    file: Option<Box<dyn AppendFile>>,
    limit: u64,
    /// On an object store: when the file was last synced.
    synced_at: Option<std::time::Instant>,
}

/// How often the progress log reaches an object store (one `PUT` each).
pub const OBJECT_SYNC_EVERY: Duration = Duration::from_secs(5);

/// The rotation size on an object store, where each sync writes the whole file.
pub const OBJECT_ROTATE_BYTES: u64 = 256 << 10;

/// The default size at which `progress.jsonl` is rotated (8 MiB: some 5,000 micro-batches
/// of a query with a few operators).
pub const PROGRESS_ROTATE_BYTES: u64 = 8 << 20;

const CURRENT: &str = "progress.jsonl";
const ROTATED: &str = "progress.1.jsonl";

impl ProgressLog {
    /// The progress log in checkpoint directory `dir` (nothing is opened yet).
    pub fn new(dir: &Path) -> Self {
        Self::with_limit(dir, PROGRESS_ROTATE_BYTES)
    }

    /// Like [`ProgressLog::new`] with another rotation size.
    pub fn with_limit(dir: &Path, limit: u64) -> Self {
        let mut log = Self::in_storage(etlantic_core::storage::open(dir));
        log.limit = limit.max(1);
        log
    }

    /// The progress log of the checkpoint kept in `storage`.
    pub fn in_storage(storage: Arc<dyn Storage>) -> Self {
        let limit = if storage.appends() {
            PROGRESS_ROTATE_BYTES
        } else {
            OBJECT_ROTATE_BYTES
        };
        ProgressLog {
            storage,
            file: None,
            limit,
            synced_at: None,
        }
    }

    /// `progress.jsonl` in `dir`.
    pub fn current_path(dir: &Path) -> PathBuf {
        dir.join(CURRENT)
    }

    /// The rotated predecessor of `progress.jsonl` in `dir`.
    pub fn rotated_path(dir: &Path) -> PathBuf {
        dir.join(ROTATED)
    }

    /// Appends one record, rotating first when it would pass the limit.
    pub fn append<T: Serialize + ?Sized>(&mut self, record: &T) -> Result<()> {
        let mut line = serde_json::to_vec(record)
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("a progress record: {e}")))?;
        line.push(b'\n');
        if self.file.is_none() {
            self.file = Some(self.storage.append(CURRENT)?);
        }
        let len = self.file.as_ref().map_or(0, |f| f.len());
        if len > 0 && len + line.len() as u64 > self.limit {
            if let Some(mut f) = self.file.take() {
                f.sync()?;
            }
            self.storage.rename(CURRENT, ROTATED)?;
            self.file = Some(self.storage.append(CURRENT)?);
        }
        let file = self.file.as_mut().expect("opened above");
        file.write(&line)?;
        if !self.storage.appends()
            && self
                .synced_at
                .is_none_or(|t| t.elapsed() >= OBJECT_SYNC_EVERY)
        {
            file.sync()?;
            self.synced_at = Some(std::time::Instant::now());
        }
        Ok(())
    }
}

impl Drop for ProgressLog {
    fn drop(&mut self) {
        // On an object store the last records reach the store only at a sync.
        if !self.storage.appends() {
            if let Some(f) = self.file.as_mut() {
                if let Err(e) = f.sync() {
                    eprintln!("warning: the last progress records were not written: {e}");
                }
            }
        }
    }
}

/// One micro-batch's progress record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueryProgress {
    /// The query id, stable across restarts.
    pub id: String,
    /// The id of this run of the query.
    pub run_id: String,
    /// The pipeline.
    pub name: Option<String>,
    /// The micro-batch's timestamp (ISO-8601 UTC, milliseconds).
    pub timestamp: String,
    /// The micro-batch id.
    pub batch_id: u64,
    /// `data`, or `no_data` for a micro-batch run for a watermark or timers alone.
    pub kind: String,
    /// Wall time of the micro-batch (ms): `durationMs.triggerExecution`.
    pub batch_duration: u64,
    /// Rows read from every source.
    pub num_input_rows: u64,
    /// Rows read per second of the micro-batch.
    pub input_rows_per_second: f64,
    /// Rows processed per second of the micro-batch.
    pub processed_rows_per_second: f64,
    /// Phase → milliseconds (`latestOffset`, `walCommit`, `getBatch`, `addBatch`,
    /// `commitOffsets`, `triggerExecution`), in the order they ran.
    pub duration_ms: IndexMap<String, u64>,
    /// Event-time figures of the micro-batch.
    pub event_time: EventTimeProgress,
    /// One entry per stateful operator.
    pub state_operators: Vec<StateOperatorProgress>,
    /// One entry per streaming source, in the plan's order.
    pub sources: Vec<SourceProgress>,
    /// The sinks together.
    pub sink: SinkProgress,
    /// Each sink on its own, in the plan's order (ETLantic's; a record of a system that
    /// counts the sinks only together has none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sinks: Vec<SinkProgress>,
    /// Records quarantined: rejected while decoding, taken out by a quality rule, or late
    /// under the `quarantine` policy.
    pub quarantined_rows: u64,
    /// Those records by diagnostic code (`ETL702`, `ETL704`, `ETL708`, ...; ETLantic's).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub quarantined_by_code: std::collections::BTreeMap<String, u64>,
    /// Rows behind the watermark.
    pub late_rows: u64,
    /// The checkpoint directory.
    pub checkpoint_location: String,
    /// Requests to the checkpoint's object store retried after transient failures since
    /// the query started (0 on a local disk).
    #[serde(skip_serializing_if = "is_zero")]
    pub storage_retries: u64,
    /// Requests this process sent to object stores since the previous record (the first
    /// record: since the process started), by kind: what the micro-batch cost on stores
    /// that bill by request (the checkpoint, sources, sinks and tables together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_requests: Option<etlantic_core::storage::requests::RequestCounts>,
    /// The contracts' quality rules evaluated in the micro-batch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<QualityProgress>,
    /// The application the query belongs to (ETLantic's; see
    /// `etlantic_core::profile::Profile::application_id`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub application_id: String,
    /// Members of a record written by another system (Spark's `observedMetrics`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Event-time figures of a micro-batch (ISO-8601 UTC).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EventTimeProgress {
    /// The earliest event time read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<String>,
    /// The latest event time read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// The average event time read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg: Option<String>,
    /// The watermark in force, when the query has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// The watermark the next micro-batch runs with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_watermark: Option<String>,
    /// Members of a record written by another system.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A stateful operator's figures of a micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StateOperatorProgress {
    /// Spark's operator name (`stateStoreSave`, `dedupe`, `symmetricHashJoin`, ...).
    pub operator_name: String,
    /// The operator id (`<transformation>.<step>`).
    pub operator_id: String,
    /// Rows in the state after the micro-batch.
    pub num_rows_total: u64,
    /// Rows added or changed.
    pub num_rows_updated: u64,
    /// Rows evicted.
    pub num_rows_removed: u64,
    /// Approximate bytes held.
    pub memory_used_bytes: u64,
    /// Rows dropped (or routed by the late policy) as late.
    pub num_rows_dropped_by_watermark: u64,
    /// Time spent in the operator (ms).
    pub all_updates_time_ms: u64,
    /// Operator-specific figures (signed: Spark reports `-1` for "not yet").
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    pub custom_metrics: IndexMap<String, i64>,
    /// Members of a record written by another system.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A source's figures of a micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SourceProgress {
    /// The pipeline's source id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// `id (asset)`, or how the system that ran the query names the source.
    pub description: String,
    /// Where the micro-batch started reading (`None` before the first).
    pub start_offset: Option<Value>,
    /// Where it stopped.
    pub end_offset: Option<Value>,
    /// The latest offset the source had when asked.
    pub latest_offset: Option<Value>,
    /// Rows read.
    pub num_input_rows: u64,
    /// Rows read per second.
    pub input_rows_per_second: f64,
    /// Rows processed per second.
    pub processed_rows_per_second: f64,
    /// What the source held after this micro-batch that is not read yet (ETLantic's;
    /// absent when the source cannot tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<etlantic_core::data::Backlog>,
    /// Records the source could not read any more and went on without
    /// (`failOnDataLoss=false`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_loss: Vec<DataLoss>,
    /// Records of this source quarantined: rejected while decoding (not among
    /// `numInputRows`) or taken out by a quality rule of its contract.
    #[serde(skip_serializing_if = "is_zero")]
    pub num_quarantined_rows: u64,
    /// Rows read that its contract's quality rules took out (dropped or quarantined):
    /// `numInputRows` less these went on to the transformations.
    #[serde(skip_serializing_if = "is_zero")]
    pub num_rows_ruled_out: u64,
    /// Records its decoder quarantined for breaking a record rule of its contract
    /// (range, length, pattern), by rule id (ETLantic's).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub quarantined_by_rule: std::collections::BTreeMap<String, u64>,
    /// Members of a record written by another system.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The figures of a sink, or of the sinks together, in a micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SinkProgress {
    /// The pipeline's sink id (an entry of [`QueryProgress::sinks`]; `None` for the
    /// sinks together).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink_id: Option<String>,
    /// The sink's binding (secrets redacted); the sinks' comma-separated.
    pub description: String,
    /// Rows written; `-1` when the system that wrote them did not count them (Spark's
    /// file sink).
    pub num_output_rows: i64,
    /// Members of a record written by another system.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One quality rule's outcome on a micro-batch, with the asset whose contract has it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QualityProgress {
    /// The asset.
    pub asset: String,
    /// The rule's outcome.
    #[serde(flatten)]
    pub count: RuleCount,
}

/// State size figures of an operator (Spark's `stateOperators[]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateMetrics {
    /// Rows in the state after the batch.
    pub rows_total: u64,
    /// Rows added or changed in the batch.
    pub rows_updated: u64,
    /// Rows evicted in the batch.
    pub rows_removed: u64,
    /// Approximate bytes held.
    pub memory_bytes: u64,
}

impl StateOperatorProgress {
    /// The entry of an operator: its name and id, state metrics, late rows and time.
    pub fn new(
        operator_name: &str,
        operator_id: &str,
        metrics: StateMetrics,
        dropped_by_watermark: u64,
        time: Duration,
    ) -> Self {
        StateOperatorProgress {
            operator_name: operator_name.to_string(),
            operator_id: operator_id.to_string(),
            num_rows_total: metrics.rows_total,
            num_rows_updated: metrics.rows_updated,
            num_rows_removed: metrics.rows_removed,
            memory_used_bytes: metrics.memory_bytes,
            num_rows_dropped_by_watermark: dropped_by_watermark,
            all_updates_time_ms: time.as_millis() as u64,
            ..Default::default()
        }
    }
}

/// ISO-8601 UTC with milliseconds, like Spark.
pub fn iso_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

impl QueryProgress {
    /// The record of micro-batch `batch_id` (of `kind`, `data` or `no_data`, with the
    /// timestamp `batch_timestamp_ms`), to be completed as it runs.
    pub fn start(
        query_id: &str,
        run_id: &str,
        name: &str,
        batch_id: u64,
        (kind, batch_timestamp_ms): (&str, i64),
    ) -> Self {
        QueryProgress {
            id: query_id.to_string(),
            run_id: run_id.to_string(),
            name: Some(name.to_string()),
            timestamp: iso_ms(batch_timestamp_ms),
            batch_id,
            kind: kind.to_string(),
            ..Default::default()
        }
    }

    /// Records how long a phase took.
    pub fn duration(&mut self, phase: &str, d: Duration) {
        self.duration_ms
            .insert(phase.to_string(), d.as_millis() as u64);
    }

    /// Sets the rates from the rows read and `triggerExecution`, over the whole
    /// micro-batch and per source.
    pub fn set_rates(&mut self) {
        let total_ms = self
            .duration_ms
            .get("triggerExecution")
            .copied()
            .unwrap_or(0);
        self.batch_duration = total_ms;
        let secs = total_ms.max(1) as f64 / 1000.0;
        self.num_input_rows = self.sources.iter().map(|s| s.num_input_rows).sum();
        self.input_rows_per_second = self.num_input_rows as f64 / secs;
        self.processed_rows_per_second = self.input_rows_per_second;
        for s in &mut self.sources {
            s.input_rows_per_second = s.num_input_rows as f64 / secs;
            s.processed_rows_per_second = s.input_rows_per_second;
        }
    }

    /// The record as JSON (Spark's shape).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("progress records serialise")
    }

    /// The record of a JSON one (a line of `progress.jsonl`, or another system's).
    pub fn from_json(v: &Value) -> Result<Self> {
        serde_json::from_value(v.clone())
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("not a progress record: {e}")))
    }

    /// The entry of source `id`.
    pub fn source(&self, id: &str) -> Option<&SourceProgress> {
        self.sources
            .iter()
            .find(|s| s.source_id.as_deref() == Some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// 100,000 micro-batches' records leave at most two files, each under the limit, the
    /// newest records last in `progress.jsonl` and none torn.
    #[test]
    fn the_progress_log_rotates_and_keeps_the_newest_records() {
        let tmp = tempfile::tempdir().unwrap();
        let limit = 256 * 1024;
        let mut log = ProgressLog::with_limit(tmp.path(), limit);
        for batch in 0..100_000u64 {
            log.append(&json!({"batchId": batch, "numInputRows": batch % 7}))
                .unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, vec!["progress.1.jsonl", "progress.jsonl"]);
        let read = |p: PathBuf| -> Vec<u64> {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.len() as u64 <= limit);
            text.lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["batchId"]
                        .as_u64()
                        .unwrap()
                })
                .collect()
        };
        let older = read(ProgressLog::rotated_path(tmp.path()));
        let newer = read(tmp.path().join("progress.jsonl"));
        assert_eq!(*newer.last().unwrap(), 99_999);
        // Consecutive across the two files.
        let all: Vec<u64> = older.iter().chain(&newer).copied().collect();
        assert!(all.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(all.len() > 1000);
        // A restarted query appends to the current file and rotates at the same size.
        drop(log);
        let mut log = ProgressLog::with_limit(tmp.path(), limit);
        log.append(&json!({"batchId": 100_000})).unwrap();
        assert_eq!(
            *read(tmp.path().join("progress.jsonl")).last().unwrap(),
            100_000
        );
    }
}
