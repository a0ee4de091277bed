//! Custom stateful processing: keyed processors with typed state, timers and state TTL,
//! modelled on Spark Structured Streaming's `transformWithState`.
//!
//! A pipeline runs a processor with a `process` step (the `etlantic:process` action):
//!
//! ```yaml
//! steps:
//!   - process:
//!       processor: session_summary        # a linked ProcessorProvider
//!       keys: [user]                      # grouping key columns of the input
//!       time_mode: event_time             # none | processing_time | event_time
//!       options: {time_column: ts, gap: 30 minutes}
//! ```
//!
//! The runtime groups each micro-batch's rows by key and calls
//! [`StatefulProcessor::handle_input_rows`] once per key (keys in order of first
//! appearance, rows in input order), then fires every expired timer with
//! [`StatefulProcessor::handle_expired_timer`] (in timer order, then key order), then
//! removes state whose TTL ran out. State lives in the runtime's state store, is reached
//! only through the typed handles declared in [`StatefulProcessor::init`]
//! ([`ValueState`], [`ListState`], [`MapState`]), and is checkpointed and recovered with
//! the other operators' state.
//!
//! A third-party crate adds a processor like any plugin:
//!
//! ```text
//! struct MyProvider;
//! impl etlantic_core::plugin::ProcessorProvider for MyProvider { /* ... */ }
//! inventory::submit! { etlantic_core::plugin::ProcessorRegistration(&MyProvider) }
//! ```
//!
//! # Time
//!
//! - **Event time** (`time_mode: event_time`, needs a watermarked input): a timer fires in
//!   the first micro-batch whose watermark is at or past it (`timer <= watermark`). When
//!   the watermark moves, a no-data micro-batch runs so timers fire without new input.
//!   Input rows at or behind the watermark of the previous micro-batch are late and are
//!   handled by the source's late-event policy before the processor sees them.
//! - **Processing time** (`time_mode: processing_time`): a timer fires in the first
//!   micro-batch whose batch timestamp is at or past it. Batch timestamps are logged in
//!   the write-ahead log, so a replayed micro-batch sees the same processing time.
//! - **State TTL**: a state variable declared with a TTL expires when it has not been
//!   written for that long in processing time (each list element and map entry on its
//!   own). Expired values read as absent at once and are removed at the end of the
//!   micro-batch. Expiry is silent: no callback runs, timers stay registered.
//!
//! In a **batch** run the processor sees the whole bounded input as one micro-batch
//! (every key's rows in one call); afterwards, as if the watermark jumped to +∞, every
//! registered event-time timer fires once, in timer order (timers registered by those
//! handlers do not fire). Processing-time timers never fire and TTL does not apply.

use crate::diagnostics::{codes, Error, Result};
use crate::streaming::{Duration, TimeMode};
use arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use serde_json::{Map, Value};

mod context;
mod handles;
mod store;
#[cfg(test)]
mod tests;

pub use context::ProcessorContext;
pub use handles::{ListState, MapState, ProcessorInit, StateValue, ValueState};
pub use store::{Emitted, KeyState, ProcessorCounters, StateDecl, StateKind, StoredEntry};

/// What a provider is asked to create a processor for.
#[derive(Clone, Debug)]
pub struct ProcessorSpec {
    /// The schema of the rows the processor receives.
    pub input_schema: SchemaRef,
    /// The grouping key columns (columns of `input_schema`, already checked).
    pub keys: Vec<String>,
    /// The time mode the step declares.
    pub time_mode: TimeMode,
    /// The step's `options` (a JSON object, `{}` when absent).
    pub options: Value,
}

impl ProcessorSpec {
    /// A string option.
    pub fn option_str(&self, name: &str) -> Option<&str> {
        self.options.get(name).and_then(Value::as_str)
    }

    /// A duration option (`"30 minutes"`), `None` when absent.
    pub fn option_duration(&self, name: &str) -> Result<Option<Duration>> {
        match self.options.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|e: Error| e.map_diagnostics(|d| d.at(format!("options.{name}")))),
            Some(other) => Err(invalid(format!(
                "option `{name}` must be a duration like \"5 minutes\", got {other}"
            ))),
        }
    }

    /// Fails unless every option is one of `known`.
    pub fn expect_options(&self, processor: &str, known: &[&str]) -> Result<()> {
        match &self.options {
            Value::Null => Ok(()),
            Value::Object(m) => match m.keys().find(|k| !known.contains(&k.as_str())) {
                Some(k) => Err(invalid(format!(
                    "processor `{processor}` has no option `{k}` (options: {})",
                    known.join(", ")
                ))),
                None => Ok(()),
            },
            other => Err(invalid(format!(
                "the options of processor `{processor}` must be a mapping, got {other}"
            ))),
        }
    }

    /// The input field of a column, or an `ETL206` error.
    pub fn column(&self, name: &str) -> Result<&arrow::datatypes::Field> {
        self.input_schema.field_with_name(name).map_err(|_| {
            Error::new(
                &codes::UNKNOWN_COLUMN,
                format!("the processor input has no column `{name}`"),
            )
        })
    }
}

/// An `ETL320` error: a processor rejected its keys or options.
pub fn invalid(message: impl Into<String>) -> Error {
    Error::new(&codes::PROCESSOR_INVALID, message)
}

/// Creates [`StatefulProcessor`]s for one name. Registered with [`inventory::submit!`]
/// through [`crate::plugin::ProcessorRegistration`]; a pipeline's `process` step names it.
///
/// # Invariants an implementer must keep
/// - `name()` is constant; no two linked providers share it.
/// - `create` is pure (no I/O, no clock, no randomness): planning calls it to learn the
///   output schema, and every run and restart calls it again. It validates the options,
///   keys and time mode and reports problems as diagnostics with codes (`ETL320` through
///   [`invalid`], `ETL206` for unknown columns).
pub trait ProcessorProvider: Send + Sync + 'static {
    /// The name a `process` step uses.
    fn name(&self) -> &'static str;
    /// One line describing it (for `etlantic plugins`).
    fn description(&self) -> &'static str;
    /// A new processor, with no state, for one `process` step.
    fn create(&self, spec: &ProcessorSpec) -> Result<Box<dyn StatefulProcessor>>;
}

/// A keyed stateful processor (Spark's `StatefulProcessor`).
///
/// # Invariants an implementer must keep
/// - **Determinism under replay.** Given the same key, rows, state, timers and
///   [`TimerValues`], a callback makes the same state changes, registers and deletes the
///   same timers and emits the same rows. A micro-batch may run again after a failure
///   (with the same rows and times); anything that is not a function of those (the wall
///   clock, randomness, I/O, iteration order of a `HashMap`) breaks exactly-once output.
/// - **State only through the handles.** Everything that must survive a micro-batch lives
///   in the [`ValueState`], [`ListState`] and [`MapState`] variables declared in `init`
///   and is read and written through them with the [`ProcessorContext`] of the call.
///   Fields of the processor itself are not checkpointed: after a restart only the
///   handles' values come back. Handles are per key: a callback sees and changes only
///   the state of its own key.
/// - **Constant output schema.** `output_schema` never changes after `create`, and
///   every row emitted matches it (the runtime checks and fails the batch otherwise).
/// - **Serialisable, evolvable state.** Values are stored as JSON (`serde`); a later
///   version of the processor must be able to read what an earlier one wrote (add fields
///   with `#[serde(default)]`). Removing a state variable discards its values.
/// - `init` declares every state variable, always in the same way; it runs once, before
///   any state is restored.
/// - A timer handler may only register timers strictly after the timer it handles, so
///   a query always makes progress.
/// - Callbacks never panic; they return diagnostics with codes (`ETL707` for failures).
pub trait StatefulProcessor: Send {
    /// The schema of the rows the processor emits.
    fn output_schema(&self) -> SchemaRef;

    /// Declares the state variables and keeps their handles.
    fn init(&mut self, init: &mut ProcessorInit) -> Result<()>;

    /// Called once per key and micro-batch with the key's new rows (all input columns, in
    /// input order; never empty).
    fn handle_input_rows(
        &mut self,
        key: &GroupKey,
        rows: &RecordBatch,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()>;

    /// Called for each expired timer of a key (the timer is already removed).
    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: ExpiredTimer,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let _ = (key, timer, ctx);
        Ok(())
    }

    /// Called when the query stops. Idempotent.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The key of a group: its key columns (one row) and their values as JSON.
#[derive(Clone, Debug)]
pub struct GroupKey {
    columns: RecordBatch,
    values: Map<String, Value>,
}

impl GroupKey {
    /// A key from a one-row batch of key columns (runtime side).
    pub fn new(columns: RecordBatch) -> Result<Self> {
        let mut values = Map::new();
        if columns.num_columns() > 0 {
            let mut w = arrow::json::ArrayWriter::new(Vec::new());
            w.write(&columns).map_err(Error::engine)?;
            w.finish().map_err(Error::engine)?;
            let rows: Vec<Map<String, Value>> =
                serde_json::from_slice(&w.into_inner()).map_err(Error::engine)?;
            let row = rows.into_iter().next().unwrap_or_default();
            for f in columns.schema().fields() {
                values.insert(
                    f.name().clone(),
                    row.get(f.name()).cloned().unwrap_or(Value::Null),
                );
            }
        }
        Ok(GroupKey { columns, values })
    }

    /// The key columns (one row, the input's types).
    pub fn columns(&self) -> &RecordBatch {
        &self.columns
    }

    /// Key column → value as JSON, in key order (`null` for a null key). Timestamps are
    /// ISO-8601 strings; emitting them back into a timestamp column parses them.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }

    /// The value of one key column.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.values.get(column)
    }
}

/// A timer that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredTimer {
    /// The time it was registered for (epoch milliseconds).
    pub time_ms: i64,
    /// Event time or processing time.
    pub mode: TimeMode,
}

/// The clocks of a callback (Spark's `TimerValues`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerValues {
    /// The micro-batch's processing time (its logged batch timestamp, epoch ms).
    pub processing_time_ms: i64,
    /// The event-time watermark used for timers and eviction in this micro-batch (epoch
    /// ms); `None` when the input has no watermark and in batch runs.
    pub watermark_ms: Option<i64>,
}

/// Epoch milliseconds as ISO-8601 UTC with milliseconds (how to emit a timestamp).
pub fn iso_millis(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The values of a timestamp column in epoch milliseconds (`None` for nulls).
pub fn timestamp_millis(rows: &RecordBatch, column: &str) -> Result<Vec<Option<i64>>> {
    let col = rows.column_by_name(column).ok_or_else(|| {
        Error::new(
            &codes::UNKNOWN_COLUMN,
            format!("the rows have no column `{column}`"),
        )
    })?;
    let tz = match col.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::new(
                &codes::TYPE_MISMATCH,
                format!("column `{column}` is {other}, not a timestamp"),
            ))
        }
    };
    let c = arrow::compute::cast(col, &DataType::Timestamp(TimeUnit::Microsecond, tz))
        .map_err(Error::engine)?;
    let c = c
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| Error::engine("timestamp cast"))?;
    Ok((0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i).div_euclid(1000)))
        .collect())
}

/// The rows as JSON objects (column → value; nulls as `null`).
pub fn rows_as_json(rows: &RecordBatch) -> Result<Vec<Map<String, Value>>> {
    let mut w = arrow::json::ArrayWriter::new(Vec::new());
    w.write(rows).map_err(Error::engine)?;
    w.finish().map_err(Error::engine)?;
    let bytes = w.into_inner();
    let mut out: Vec<Map<String, Value>> = if bytes.is_empty() {
        vec![]
    } else {
        serde_json::from_slice(&bytes).map_err(Error::engine)?
    };
    for row in out.iter_mut() {
        for f in rows.schema().fields() {
            row.entry(f.name().clone()).or_insert(Value::Null);
        }
    }
    Ok(out)
}
