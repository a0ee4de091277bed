//! Progress records shaped like Spark's `StreamingQueryProgress`, one per micro-batch,
//! written as JSON lines to `<checkpoint>/progress.jsonl` and handed to listeners.

use super::checkpoint::OffsetEntry;
use super::operators::StateMetrics;
use chrono::{DateTime, SecondsFormat, Utc};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{AppendFile, Storage};
use serde_json::{json, Map, Value};
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
/// never reads them, so they are not synced.
#[derive(Debug)]
pub struct ProgressLog {
    /// The checkpoint directory.
    storage: Arc<dyn Storage>,
    file: Option<Box<dyn AppendFile>>,
    limit: u64,
}

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
        ProgressLog {
            storage,
            file: None,
            limit: PROGRESS_ROTATE_BYTES,
        }
    }

    /// The rotated predecessor of `progress.jsonl` in `dir`.
    pub fn rotated_path(dir: &Path) -> PathBuf {
        dir.join(ROTATED)
    }

    /// Appends one record, rotating first when it would pass the limit.
    pub fn append(&mut self, record: &Value) -> Result<()> {
        let mut line = serde_json::to_vec(record)
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("a progress record: {e}")))?;
        line.push(b'\n');
        if self.file.is_none() {
            self.file = Some(self.storage.append(CURRENT)?);
        }
        let len = self.file.as_ref().map_or(0, |f| f.len());
        if len > 0 && len + line.len() as u64 > self.limit {
            self.file = None;
            self.storage.rename(CURRENT, ROTATED)?;
            self.file = Some(self.storage.append(CURRENT)?);
        }
        self.file.as_mut().expect("opened above").write(&line)
    }
}

/// Per-source figures of a batch.
pub struct SourceProgress {
    /// `id (asset)`.
    pub description: String,
    /// Start offset.
    pub start_offset: Option<Value>,
    /// End offset.
    pub end_offset: Option<Value>,
    /// Rows read.
    pub num_input_rows: u64,
    /// Records the source could not read any more and went on without
    /// (`failOnDataLoss=false`).
    pub lost: Vec<etlantic_core::data::DataLoss>,
}

/// Per-operator figures of a batch.
pub struct StateProgress {
    /// Spark's operator name.
    pub operator_name: String,
    /// Operator id.
    pub id: String,
    /// State size.
    pub metrics: StateMetrics,
    /// Rows dropped (or routed) as late.
    pub dropped_by_watermark: u64,
    /// Time spent in the operator.
    pub time_ms: u64,
}

/// Batch-level figures.
pub struct BatchView {
    /// Rows read from all sources.
    pub num_input_rows: u64,
    /// Records quarantined (decoding, quality rules, late rows under `quarantine`).
    pub rejected: u64,
    /// Late rows.
    pub late: u64,
    /// Minimum event time (µs).
    pub event_min_us: Option<i64>,
    /// Maximum event time (µs).
    pub event_max_us: Option<i64>,
    /// Average event time (µs).
    pub event_avg_us: Option<i64>,
    /// The watermark in force (ms), when the query has one.
    pub watermark_ms: Option<i64>,
}

/// Builds one progress record.
pub struct ProgressBuilder {
    record: Map<String, Value>,
    durations: Map<String, Value>,
}

/// ISO-8601 UTC with milliseconds, like Spark.
pub fn iso_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

impl ProgressBuilder {
    /// Starts the record of `batch_id`.
    pub fn new(
        query_id: &str,
        run_id: &str,
        name: &str,
        batch_id: u64,
        entry: &OffsetEntry,
    ) -> Self {
        let mut record = Map::new();
        record.insert("id".into(), json!(query_id));
        record.insert("runId".into(), json!(run_id));
        record.insert("name".into(), json!(name));
        record.insert("timestamp".into(), json!(iso_ms(entry.batch_timestamp_ms)));
        record.insert("batchId".into(), json!(batch_id));
        record.insert("kind".into(), json!(entry.kind));
        ProgressBuilder {
            record,
            durations: Map::new(),
        }
    }

    /// Records a duration of a phase (`walCommit`, `getBatch`, `addBatch`, ...).
    pub fn duration(&mut self, phase: &str, d: Duration) {
        self.durations
            .insert(phase.into(), json!(d.as_millis() as u64));
    }

    /// Completes the record.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        mut self,
        batch: &BatchView,
        sources: Vec<SourceProgress>,
        state: Vec<StateProgress>,
        sink: String,
        output_rows: u64,
        checkpoint: String,
        next_watermark_ms: Option<i64>,
    ) -> Value {
        let total_ms = self
            .durations
            .get("triggerExecution")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let secs = (total_ms.max(1)) as f64 / 1000.0;
        let rate = batch.num_input_rows as f64 / secs;
        self.record.insert("batchDuration".into(), json!(total_ms));
        self.record
            .insert("numInputRows".into(), json!(batch.num_input_rows));
        self.record.insert("inputRowsPerSecond".into(), json!(rate));
        self.record
            .insert("processedRowsPerSecond".into(), json!(rate));
        self.record
            .insert("durationMs".into(), Value::Object(self.durations.clone()));
        let mut event = Map::new();
        if let Some(v) = batch.event_min_us {
            event.insert("min".into(), json!(iso_ms(v.div_euclid(1000))));
        }
        if let Some(v) = batch.event_max_us {
            event.insert("max".into(), json!(iso_ms(v.div_euclid(1000))));
        }
        if let Some(v) = batch.event_avg_us {
            event.insert("avg".into(), json!(iso_ms(v.div_euclid(1000))));
        }
        if let Some(w) = batch.watermark_ms {
            event.insert("watermark".into(), json!(iso_ms(w)));
        }
        if let Some(w) = next_watermark_ms {
            event.insert("nextWatermark".into(), json!(iso_ms(w)));
        }
        self.record.insert("eventTime".into(), Value::Object(event));
        self.record.insert(
            "stateOperators".into(),
            Value::Array(
                state
                    .into_iter()
                    .map(|s| {
                        json!({
                            "operatorName": s.operator_name,
                            "operatorId": s.id,
                            "numRowsTotal": s.metrics.rows_total,
                            "numRowsUpdated": s.metrics.rows_updated,
                            "numRowsRemoved": s.metrics.rows_removed,
                            "memoryUsedBytes": s.metrics.memory_bytes,
                            "numRowsDroppedByWatermark": s.dropped_by_watermark,
                            "allUpdatesTimeMs": s.time_ms,
                        })
                    })
                    .collect(),
            ),
        );
        self.record.insert(
            "sources".into(),
            Value::Array(
                sources
                    .into_iter()
                    .map(|s| {
                        let mut v = json!({
                            "description": s.description,
                            "startOffset": s.start_offset,
                            "endOffset": s.end_offset,
                            "latestOffset": s.end_offset,
                            "numInputRows": s.num_input_rows,
                            "inputRowsPerSecond": s.num_input_rows as f64 / secs,
                            "processedRowsPerSecond": s.num_input_rows as f64 / secs,
                        });
                        if !s.lost.is_empty() {
                            v["dataLoss"] = json!(s.lost);
                        }
                        v
                    })
                    .collect(),
            ),
        );
        self.record.insert(
            "sink".into(),
            json!({"description": sink, "numOutputRows": output_rows}),
        );
        self.record
            .insert("quarantinedRows".into(), json!(batch.rejected));
        self.record.insert("lateRows".into(), json!(batch.late));
        self.record
            .insert("checkpointLocation".into(), json!(checkpoint));
        Value::Object(self.record)
    }
}

/// Operator id → operator-specific figures of the last micro-batch
/// ([`super::operators::StatefulOperator::custom_metrics`]).
pub type CustomMetrics = Vec<(String, Vec<(&'static str, u64)>)>;

/// The custom metrics of every stateful operator of a program.
pub fn custom_metrics_of(transforms: &[super::program::TransformUnit]) -> CustomMetrics {
    transforms
        .iter()
        .flat_map(|t| t.units.iter())
        .filter_map(|u| match u {
            super::program::Unit::Stateful(s) => {
                let m = s.op.custom_metrics();
                (!m.is_empty()).then(|| (s.id.clone(), m))
            }
            _ => None,
        })
        .collect()
}

/// Adds `customMetrics` (Spark's name) to the `stateOperators[]` entries of a progress
/// record, matched by `operatorId`.
pub fn attach_custom_metrics(record: &mut Value, metrics: &CustomMetrics) {
    let Some(ops) = record
        .get_mut("stateOperators")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for op in ops.iter_mut() {
        let Some(id) = op.get("operatorId").and_then(Value::as_str) else {
            continue;
        };
        if let Some((_, m)) = metrics.iter().find(|(i, _)| i == id) {
            let custom: Map<String, Value> =
                m.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            op["customMetrics"] = Value::Object(custom);
        }
    }
}

/// The progress record's `quality` member: one entry per asset and rule, with the policy,
/// the offending rows, the measure, whether the rule failed, and the rows it removed.
pub fn quality_json(counts: &[(String, crate::quality::RuleCount)]) -> Value {
    Value::Array(
        counts
            .iter()
            .map(|(asset, c)| {
                let mut v = serde_json::to_value(c).expect("rule counts serialise");
                v["asset"] = json!(asset);
                v
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
