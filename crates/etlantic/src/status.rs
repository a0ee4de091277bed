//! `etlantic status`: where a streaming query stands, read from its checkpoint (see
//! [`etlantic_runtime::status`]), rendered for a terminal.

use etlantic_core::diagnostics::Result;
use etlantic_core::storage::{self, Location, StorageOptions};
use etlantic_runtime::status::{Liveness, QueryStatus};
use std::fmt::Write;
use std::path::Path;

/// Reads the status of the query whose checkpoint is at `location`.
pub fn read(location: &Location, options: &StorageOptions) -> Result<QueryStatus> {
    let storage = storage::open_location(location, options)?;
    QueryStatus::read(
        storage.as_ref(),
        &location.to_string(),
        chrono::Utc::now().timestamp_millis(),
    )
}

/// The checkpoint named on the command line: a directory (relative to the working
/// directory) or an object-store URI.
pub fn location_of(text: &str) -> Result<Location> {
    Location::parse_path_or_object(text, Path::new("."))
}

/// A byte count for people (`1.5 MB`).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A duration in milliseconds for people (`850 ms`, `12.5 s`, `3.2 min`, `4.1 h`).
pub fn millis(ms: i64) -> String {
    let a = ms.unsigned_abs() as f64;
    let sign = if ms < 0 { "-" } else { "" };
    if a < 1000.0 {
        format!("{sign}{a:.0} ms")
    } else if a < 60_000.0 {
        format!("{sign}{:.1} s", a / 1000.0)
    } else if a < 3_600_000.0 {
        format!("{sign}{:.1} min", a / 60_000.0)
    } else {
        format!("{sign}{:.1} h", a / 3_600_000.0)
    }
}

/// The status as text: state, ids, the last micro-batch, rates, watermark, sources,
/// state, sinks, checkpoint.
pub fn render(s: &QueryStatus) -> String {
    let mut out = String::new();
    let state = match s.state {
        Liveness::Running => "running",
        Liveness::Stopped => "stopped",
        Liveness::Failed => "FAILED",
        Liveness::Unknown => "unknown (no status record)",
    };
    let _ = writeln!(out, "query {}: {state}", s.pipeline);
    if let Some(reason) = &s.reason {
        let _ = writeln!(out, "  why          {reason}");
    }
    let _ = writeln!(out, "  application  {}", or_dash(&s.ids.application_id));
    let _ = writeln!(out, "  query id     {}", or_dash(&s.ids.query_id));
    let _ = writeln!(out, "  run id       {}", or_dash(&s.ids.run_id));
    if let Some(run) = &s.run {
        let ended = run
            .stopped_at
            .as_deref()
            .map(|t| format!(", ended {t}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  process      {} on {}, started {}{ended}, heartbeat {}",
            run.pid,
            or_dash(&run.host),
            run.started_at,
            run.heartbeat_at
        );
        if let Some(addr) = &run.metrics_addr {
            let _ = writeln!(out, "  metrics      http://{addr}/metrics");
        }
        for e in run.errors.iter().skip(1) {
            let _ = writeln!(out, "  error        {}: {}", e.code, e.message);
        }
    }
    let _ = writeln!(
        out,
        "  checkpoint   {} ({})",
        s.checkpoint,
        bytes(s.checkpoint_bytes)
    );
    let Some(last) = &s.last_batch else {
        let _ = writeln!(out, "  no micro-batch has run yet");
        return out;
    };
    let _ = writeln!(
        out,
        "  last batch   {} ({}) at {}: {} rows in {}",
        last.batch_id,
        last.kind,
        last.timestamp,
        last.num_input_rows,
        millis(last.batch_duration as i64)
    );
    let _ = writeln!(
        out,
        "  rates        {:.1} rows/s in, {:.1} rows/s processed (last {} micro-batches)",
        s.input_rows_per_second,
        s.processed_rows_per_second,
        etlantic_runtime::status::RECENT.min(s.batches_this_run.max(1) as usize)
    );
    if let Some(wm) = &last.event_time.watermark {
        let lag = s
            .watermark_lag_ms
            .map(|l| {
                let behind = if s.state == Liveness::Running {
                    "the wall clock"
                } else {
                    "its last micro-batch"
                };
                format!(", {} behind {behind}", millis(l))
            })
            .unwrap_or_default();
        let _ = writeln!(out, "  watermark    {wm}{lag}");
    }
    let _ = writeln!(
        out,
        "  this run     {} micro-batches, {} late rows, {} quarantined",
        s.batches_this_run, s.late_rows, s.quarantined_rows
    );
    if !s.sources.is_empty() {
        let _ = writeln!(out, "  sources");
        for src in &s.sources {
            let backlog = match src.backlog {
                Some(b) => {
                    let mut parts = Vec::new();
                    if let Some(r) = b.records {
                        parts.push(format!("{r} records"));
                    }
                    if let Some(f) = b.files {
                        parts.push(format!("{f} files"));
                    }
                    if let Some(n) = b.bytes {
                        parts.push(bytes(n));
                    }
                    format!("behind by {}", parts.join(", "))
                }
                None => "backlog unknown".into(),
            };
            let _ = writeln!(
                out,
                "    {:<24} {} rows this run; {backlog}",
                src.description, src.rows_this_run
            );
        }
    }
    if !last.state_operators.is_empty() {
        let _ = writeln!(out, "  state");
        for op in &last.state_operators {
            let _ = writeln!(
                out,
                "    {:<24} {:<18} {} rows, {}",
                op.operator_id,
                op.operator_name,
                op.num_rows_total,
                bytes(op.memory_used_bytes)
            );
        }
    }
    if !s.sinks.is_empty() {
        let _ = writeln!(out, "  sinks");
        for k in &s.sinks {
            let last_rows = if k.rows_last_batch < 0 {
                "not counted".to_string()
            } else {
                k.rows_last_batch.to_string()
            };
            let _ = writeln!(
                out,
                "    {:<24} last commit: batch {} ({last_rows} rows); {} rows this run; {}",
                k.id, last.batch_id, k.rows_this_run, k.description
            );
        }
    }
    out
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_well() {
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500_000), "1.5 MB");
        assert_eq!(millis(850), "850 ms");
        assert_eq!(millis(12_500), "12.5 s");
        assert_eq!(millis(-90_000), "-1.5 min");
        assert_eq!(millis(4 * 3_600_000), "4.0 h");
    }
}
