//! Where a query stands, for the people who operate it: the run's status record
//! (`<checkpoint>/status.json`), kept by the running query, and [`QueryStatus`], what
//! `etlantic status` shows, read from a checkpoint without disturbing the query that
//! holds it.
//!
//! The status record says `running` from the start of a run, with a heartbeat every
//! [`HEARTBEAT_EVERY`]; a run that ends writes `stopped` (and why) or `failed` (and its
//! errors). A process that dies without writing either — killed, out of memory, a power
//! cut — leaves `running` behind: a reader on the same host sees that its process is
//! gone, any reader sees that its heartbeat stopped ([`STALE_AFTER`]), and reports the
//! query as failed.

use crate::progress::QueryProgress;
use chrono::{DateTime, SecondsFormat, Utc};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::storage::{self, Storage};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The status record's file in the checkpoint.
pub const STATUS_FILE: &str = "status.json";

/// How often a running query renews its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// A `running` record whose heartbeat is older than this is of a process that died.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// What a run is doing, as its status record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Started and not ended (or died without saying so).
    Running,
    /// Ended by its trigger or on request.
    Stopped,
    /// Ended by an error.
    Failed,
}

/// The ids every record of a run carries: the application, the query (stable across
/// restarts) and the run (new at every start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryIds {
    /// The application (the profile's `application_id`, else the checkpoint's).
    pub application_id: String,
    /// The query id.
    pub query_id: String,
    /// The run id.
    pub run_id: String,
}

/// `<checkpoint>/status.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// Running, stopped or failed.
    pub state: RunState,
    /// Whose run.
    #[serde(flatten)]
    pub ids: QueryIds,
    /// The pipeline.
    pub pipeline: String,
    /// The host the run's process runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When the run started (ISO-8601 UTC).
    pub started_at: String,
    /// When the running process last said it is alive.
    pub heartbeat_at: String,
    /// When the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// Why it stopped (a stopped run) or what failed (a failed one, with `errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The errors of a failed run (secrets scrubbed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Diagnostic>,
    /// Where the run serves Prometheus metrics (`etlantic run --metrics-addr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
}

fn now_iso() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// This machine's host name (empty when it cannot be read).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The running query's side: writes the status record at the start, renews its heartbeat
/// while the run goes on, and writes how it ended. Dropped without [`StatusWriter::end`]
/// (a panic), the record is left `running` and readers see the heartbeat stop.
pub struct StatusWriter {
    storage: Arc<dyn Storage>,
    status: Arc<Mutex<RunStatus>>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").finish_non_exhaustive()
    }
}

impl StatusWriter {
    /// Writes a `running` record for the run `ids` of `pipeline` into the checkpoint's
    /// storage and, inside a tokio runtime, starts renewing its heartbeat. The record is
    /// for people: a write that fails is logged and the query goes on.
    pub fn start(
        storage: Arc<dyn Storage>,
        ids: QueryIds,
        pipeline: &str,
        metrics_addr: Option<String>,
    ) -> Self {
        let now = now_iso();
        let status = RunStatus {
            state: RunState::Running,
            ids,
            pipeline: pipeline.to_string(),
            host: host_name(),
            pid: std::process::id(),
            started_at: now.clone(),
            heartbeat_at: now,
            stopped_at: None,
            reason: None,
            errors: Vec::new(),
            metrics_addr,
        };
        if let Err(e) = write(storage.as_ref(), &status) {
            tracing::warn!("the status record was not written: {e}");
        }
        let status = Arc::new(Mutex::new(status));
        let heartbeat = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (storage, status) = (storage.clone(), status.clone());
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(HEARTBEAT_EVERY).await;
                    let record = {
                        let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                        s.heartbeat_at = now_iso();
                        s.clone()
                    };
                    // A missed heartbeat only makes readers doubt sooner; the query goes on.
                    let storage = storage.clone();
                    let written =
                        tokio::task::spawn_blocking(move || write(storage.as_ref(), &record)).await;
                    if let Ok(Err(e)) = written {
                        tracing::warn!("the status heartbeat was not written: {e}");
                    }
                }
            })
        });
        StatusWriter {
            storage,
            status,
            heartbeat,
        }
    }

    /// Ends the run: `stopped` with `reason` when `result` is ok, `failed` with its
    /// errors otherwise.
    pub fn end(mut self, result: std::result::Result<&str, &Error>) -> Result<()> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        let record = {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            let now = now_iso();
            s.heartbeat_at = now.clone();
            s.stopped_at = Some(now);
            match result {
                Ok(reason) => {
                    s.state = RunState::Stopped;
                    s.reason = Some(reason.to_string());
                }
                Err(e) => {
                    s.state = RunState::Failed;
                    s.reason = e.0 .0.first().map(|d| format!("{}: {}", d.code, d.message));
                    s.errors = e.0 .0.clone();
                }
            }
            s.clone()
        };
        write(self.storage.as_ref(), &record)
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

fn write(storage: &dyn Storage, status: &RunStatus) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(status).expect("status records serialise");
    storage::put_bytes(storage, STATUS_FILE, &bytes)
}

/// What `status` needs of a checkpoint's `metadata`: the runtime's [`crate::checkpoint::Metadata`], or the
/// `{"id": …}` Spark writes into a checkpoint of a query it runs whole (whose pipeline is
/// then named by the status record).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointIdentity {
    id: String,
    #[serde(default)]
    pipeline: Option<String>,
    #[serde(default)]
    application_id: Option<String>,
}

/// What a reader makes of a query: its status record checked against the process and
/// the heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    /// A run is going on.
    Running,
    /// The last run stopped.
    Stopped,
    /// The last run failed, or its process died without saying why.
    Failed,
    /// No run has recorded a status (a checkpoint of an earlier version, or a run that
    /// has not got that far).
    Unknown,
}

/// A query as `etlantic status` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryStatus {
    /// Where the checkpoint is.
    pub checkpoint: String,
    /// Its bytes, over all its files.
    pub checkpoint_bytes: u64,
    /// The application, query and run ids (the last run's).
    #[serde(flatten)]
    pub ids: QueryIds,
    /// The pipeline.
    pub pipeline: String,
    /// Running, stopped, failed, or unknown.
    pub state: Liveness,
    /// Why it stopped or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The status record as the run wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunStatus>,
    /// The newest progress record (the last committed micro-batch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_batch: Option<QueryProgress>,
    /// Rows read per second over the recent micro-batches (see [`RECENT`]).
    pub input_rows_per_second: f64,
    /// Rows processed per second of the time spent in micro-batches, over the recent ones.
    pub processed_rows_per_second: f64,
    /// How far the watermark is behind the wall clock (a stopped query: behind its last
    /// micro-batch's timestamp), in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark_lag_ms: Option<i64>,
    /// Rows behind the watermark, over the last run's retained progress records.
    pub late_rows: u64,
    /// Records quarantined, over the last run's retained progress records.
    pub quarantined_rows: u64,
    /// Micro-batches of the last run among the retained progress records.
    pub batches_this_run: u64,
    /// Each source: where it stands and what it has not read yet.
    pub sources: Vec<SourceStatus>,
    /// Each sink: what it was given.
    pub sinks: Vec<SinkStatus>,
}

/// A source of a query, as of its last micro-batch.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// The pipeline's source id (or how the system that ran the query named it).
    pub id: String,
    /// `id (asset)`.
    pub description: String,
    /// Where the last micro-batch stopped reading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<serde_json::Value>,
    /// What it held then that was not read yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog: Option<etlantic_core::data::Backlog>,
    /// Rows read over the last run's retained records.
    pub rows_this_run: u64,
}

/// A sink of a query.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkStatus {
    /// The pipeline's sink id.
    pub id: String,
    /// Its binding (secrets redacted).
    pub description: String,
    /// Rows written in the last micro-batch (`-1`: not counted).
    pub rows_last_batch: i64,
    /// Rows written over the last run's retained records.
    pub rows_this_run: u64,
}

/// How many of the newest progress records the recent rates are taken over.
pub const RECENT: usize = 10;

impl QueryStatus {
    /// Reads the status of the query whose checkpoint is `storage` (named `display`),
    /// taking no lock and changing nothing. `now_ms` is the wall clock.
    pub fn read(storage: &dyn Storage, display: &str, now_ms: i64) -> Result<Self> {
        let metadata: CheckpointIdentity = match storage.read("metadata")? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!("the metadata of checkpoint {display} does not parse: {e}"),
                )
            })?,
            None => {
                return Err(Diagnostic::new(
                    &codes::STORAGE_NOT_FOUND,
                    format!("no checkpoint at {display} (it has no `metadata`)"),
                )
                .help("Name the checkpoint directory a streaming query ran with (the profile's `checkpoint`, default `.etlantic/checkpoints/<pipeline>`).")
                .into())
            }
        };
        let run: Option<RunStatus> = match storage.read(STATUS_FILE)? {
            // A torn or foreign file says nothing; the progress records still do.
            Some(bytes) => serde_json::from_slice(&bytes).ok(),
            None => None,
        };
        let records = read_progress(storage)?;
        let last = records.last().cloned();
        let (state, reason) = liveness(run.as_ref(), now_ms, &host_name());
        let pipeline = match (&metadata.pipeline, &run) {
            (Some(p), _) => p.clone(),
            (None, Some(r)) => r.pipeline.clone(),
            (None, None) => String::new(),
        };
        let ids = match (&run, &last) {
            (Some(r), _) => r.ids.clone(),
            (None, Some(p)) => QueryIds {
                application_id: p.application_id.clone(),
                query_id: p.id.clone(),
                run_id: p.run_id.clone(),
            },
            (None, None) => QueryIds {
                application_id: metadata.application_id.clone().unwrap_or_default(),
                query_id: metadata.id.clone(),
                run_id: String::new(),
            },
        };
        let this_run: Vec<&QueryProgress> = records
            .iter()
            .filter(|p| ids.run_id.is_empty() || p.run_id == ids.run_id)
            .collect();
        let recent = &records[records.len().saturating_sub(RECENT)..];
        let (input_rate, processed_rate) = rates(recent);
        let watermark_lag_ms = last.as_ref().and_then(|p| {
            let wm = parse_ms(p.event_time.watermark.as_deref()?)?;
            let reference = if state == Liveness::Running {
                now_ms
            } else {
                parse_ms(&p.timestamp)?
            };
            // Before the first event the watermark is the epoch: no lag to speak of.
            (wm > 0).then_some(reference - wm)
        });
        let sources = last
            .iter()
            .flat_map(|p| &p.sources)
            .map(|s| {
                let id = s.source_id.clone().unwrap_or_else(|| s.description.clone());
                SourceStatus {
                    rows_this_run: this_run
                        .iter()
                        .filter_map(|p| p.sources.iter().find(|x| x.source_id == s.source_id))
                        .map(|x| x.num_input_rows)
                        .sum(),
                    id,
                    description: s.description.clone(),
                    end_offset: s.end_offset.clone(),
                    backlog: s.backlog,
                }
            })
            .collect();
        let sinks = last
            .iter()
            .flat_map(|p| &p.sinks)
            .map(|k| SinkStatus {
                id: k.sink_id.clone().unwrap_or_default(),
                description: k.description.clone(),
                rows_last_batch: k.num_output_rows,
                rows_this_run: this_run
                    .iter()
                    .filter_map(|p| p.sinks.iter().find(|x| x.sink_id == k.sink_id))
                    .map(|x| x.num_output_rows.max(0) as u64)
                    .sum(),
            })
            .collect();
        let checkpoint_bytes = storage::walk_files(storage, "")?
            .iter()
            .map(|(_, n)| n)
            .sum();
        Ok(QueryStatus {
            checkpoint: display.to_string(),
            checkpoint_bytes,
            pipeline,
            ids,
            state,
            reason,
            late_rows: this_run.iter().map(|p| p.late_rows).sum(),
            quarantined_rows: this_run.iter().map(|p| p.quarantined_rows).sum(),
            batches_this_run: this_run.len() as u64,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed_rate,
            watermark_lag_ms,
            sources,
            sinks,
            run,
            last_batch: last,
        })
    }
}

/// What the status record means, given the wall clock and this host: a `running` record
/// of a process that is gone (same host) or whose heartbeat stopped is a failure.
pub fn liveness(
    run: Option<&RunStatus>,
    now_ms: i64,
    this_host: &str,
) -> (Liveness, Option<String>) {
    let Some(run) = run else {
        return (Liveness::Unknown, None);
    };
    match run.state {
        RunState::Stopped => (Liveness::Stopped, run.reason.clone()),
        RunState::Failed => (Liveness::Failed, run.reason.clone()),
        RunState::Running => {
            let died = format!(
                "the process ({} on {}) ended without recording why (killed, out of memory, or the machine stopped); its last heartbeat was at {}",
                run.pid, run.host, run.heartbeat_at
            );
            if !run.host.is_empty() && run.host == this_host && !process_alive(run.pid) {
                return (Liveness::Failed, Some(died));
            }
            let stale = parse_ms(&run.heartbeat_at)
                .is_none_or(|t| now_ms - t > STALE_AFTER.as_millis() as i64);
            if stale {
                (Liveness::Failed, Some(died))
            } else {
                (Liveness::Running, None)
            }
        }
    }
}

/// Whether process `pid` of this host is alive (where that cannot be told: yes).
fn process_alive(pid: u32) -> bool {
    let proc = std::path::Path::new("/proc");
    if !proc.join("self").exists() {
        return true;
    }
    proc.join(pid.to_string()).exists()
}

fn parse_ms(iso: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(iso)
        .ok()
        .map(|d| d.timestamp_millis())
}

/// The retained progress records, oldest first (`progress.1.jsonl`, then
/// `progress.jsonl`). A line that does not parse (torn by a crash) is skipped.
pub fn read_progress(storage: &dyn Storage) -> Result<Vec<QueryProgress>> {
    let mut out = Vec::new();
    for file in ["progress.1.jsonl", "progress.jsonl"] {
        let Some(bytes) = storage.read(file)? else {
            continue;
        };
        for line in bytes.split(|b| *b == b'\n') {
            if let Ok(p) = serde_json::from_slice::<QueryProgress>(line) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Input rows per second of wall time over `recent` (from the first record's timestamp
/// to the last one's end), and rows per second of the time spent in micro-batches.
fn rates(recent: &[QueryProgress]) -> (f64, f64) {
    let rows: u64 = recent.iter().map(|p| p.num_input_rows).sum();
    let busy_ms: u64 = recent.iter().map(|p| p.batch_duration).sum();
    let span_ms = match (recent.first(), recent.last()) {
        (Some(a), Some(b)) => match (parse_ms(&a.timestamp), parse_ms(&b.timestamp)) {
            (Some(a), Some(end)) => (end - a).max(0) as u64 + b.batch_duration,
            _ => busy_ms,
        },
        _ => 0,
    };
    let per_second = |ms: u64| {
        if ms == 0 {
            0.0
        } else {
            rows as f64 * 1000.0 / ms as f64
        }
    };
    (per_second(span_ms), per_second(busy_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::iso_ms;

    fn record(state: RunState, heartbeat_ms: i64, host: &str, pid: u32) -> RunStatus {
        RunStatus {
            state,
            ids: QueryIds::default(),
            pipeline: "p".into(),
            host: host.into(),
            pid,
            started_at: iso_ms(0),
            heartbeat_at: iso_ms(heartbeat_ms),
            stopped_at: None,
            reason: Some("why".into()),
            errors: Vec::new(),
            metrics_addr: None,
        }
    }

    #[test]
    fn a_running_record_is_believed_only_while_its_process_lives_and_beats() {
        let now = 1_000_000_000;
        let me = std::process::id();
        let here = host_name();
        let fresh = record(RunState::Running, now - 5_000, &here, me);
        assert_eq!(liveness(Some(&fresh), now, &here).0, Liveness::Running);
        // Another host's process cannot be checked: the heartbeat decides.
        let elsewhere = record(RunState::Running, now - 5_000, "elsewhere", 1);
        assert_eq!(liveness(Some(&elsewhere), now, &here).0, Liveness::Running);
        let stale = record(RunState::Running, now - 61_000, "elsewhere", 1);
        let (state, why) = liveness(Some(&stale), now, &here);
        assert_eq!(state, Liveness::Failed);
        assert!(why.unwrap().contains("without recording why"));
        // A dead process on this host: failed at once, heartbeat or not.
        let dead = record(RunState::Running, now - 1_000, &here, u32::MAX - 1);
        assert_eq!(liveness(Some(&dead), now, &here).0, Liveness::Failed);
        // Stopped and failed records say so themselves.
        let stopped = record(RunState::Stopped, 0, &here, me);
        assert_eq!(
            liveness(Some(&stopped), now, &here),
            (Liveness::Stopped, Some("why".into()))
        );
        assert_eq!(liveness(None, now, &here).0, Liveness::Unknown);
    }

    #[test]
    fn a_checkpoint_spark_wrote_is_read_with_the_status_record_of_its_run() {
        let dir = tempfile::tempdir().unwrap();
        let storage = etlantic_core::storage::open(dir.path());
        // Spark's own `metadata`: the query id alone.
        storage::put_bytes(storage.as_ref(), "metadata", br#"{"id":"spark-query"}"#).unwrap();
        let unknown = QueryStatus::read(storage.as_ref(), "chk", 0).unwrap();
        assert_eq!(unknown.state, Liveness::Unknown);
        assert_eq!(unknown.ids.query_id, "spark-query");
        let ids = QueryIds {
            application_id: "app".into(),
            query_id: "spark-query".into(),
            run_id: "run-1".into(),
        };
        let writer = StatusWriter::start(storage.clone(), ids.clone(), "clicks", None);
        writer.end(Ok("the spark query finished")).unwrap();
        let stopped = QueryStatus::read(storage.as_ref(), "chk", 0).unwrap();
        assert_eq!(stopped.state, Liveness::Stopped);
        assert_eq!(stopped.reason.as_deref(), Some("the spark query finished"));
        assert_eq!(stopped.pipeline, "clicks", "named by the status record");
        assert_eq!(stopped.ids, ids);
    }

    #[test]
    fn rates_are_over_wall_time_and_over_busy_time() {
        let p = |ts: i64, rows: u64, ms: u64| QueryProgress {
            timestamp: iso_ms(ts),
            num_input_rows: rows,
            batch_duration: ms,
            ..Default::default()
        };
        // Three micro-batches of 1,000 rows, 500 ms each, starting every 2 s: 3,000 rows
        // over 4.5 s of wall time, 1.5 s busy.
        let (input, processed) = rates(&[p(0, 1000, 500), p(2000, 1000, 500), p(4000, 1000, 500)]);
        assert!((input - 3000.0 / 4.5).abs() < 1e-6, "{input}");
        assert!((processed - 2000.0).abs() < 1e-6, "{processed}");
        assert_eq!(rates(&[]), (0.0, 0.0));
    }
}
