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
use crate::streaming::{Duration, ExecutionMode, OutputMode, TimeMode};
use arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;

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
            w.write(&columns).map_err(engine)?;
            w.finish().map_err(engine)?;
            let rows: Vec<Map<String, Value>> =
                serde_json::from_slice(&w.into_inner()).map_err(engine)?;
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

/// The kind of a state variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list of values per key.
    List,
    /// A map per key.
    Map,
}

impl StateKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
        }
    }
}

/// A declared state variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    /// Its name (unique per processor; the checkpoint is keyed by it).
    pub name: String,
    /// Its kind.
    pub kind: StateKind,
    /// Time to live without a write, in processing time.
    pub ttl: Option<Duration>,
}

/// Marker for values that can live in state: anything `serde` can write and read back.
pub trait StateValue: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> StateValue for T {}

/// What `init` sees and where it declares state variables.
#[derive(Debug)]
pub struct ProcessorInit {
    decls: Vec<StateDecl>,
    time_mode: TimeMode,
    execution_mode: ExecutionMode,
}

impl ProcessorInit {
    /// A declaration context (runtime side).
    pub fn new(time_mode: TimeMode, execution_mode: ExecutionMode) -> Self {
        ProcessorInit {
            decls: Vec::new(),
            time_mode,
            execution_mode,
        }
    }

    /// The time mode of the step.
    pub fn time_mode(&self) -> TimeMode {
        self.time_mode
    }

    /// Batch or streaming.
    pub fn execution_mode(&self) -> ExecutionMode {
        self.execution_mode
    }

    /// The declarations made (runtime side).
    pub fn into_decls(self) -> Vec<StateDecl> {
        self.decls
    }

    fn declare(&mut self, name: &str, kind: StateKind, ttl: Option<Duration>) -> Result<usize> {
        if name.is_empty() || self.decls.iter().any(|d| d.name == name) {
            return Err(invalid(format!(
                "state variable name `{name}` is empty or declared twice"
            )));
        }
        if ttl.is_some_and(|t| t.as_millis() <= 0) {
            return Err(invalid(format!(
                "the TTL of state variable `{name}` must be positive"
            )));
        }
        self.decls.push(StateDecl {
            name: name.to_string(),
            kind,
            ttl,
        });
        Ok(self.decls.len() - 1)
    }

    /// Declares a value state (`ttl`: expires after that long without a write).
    pub fn value_state<T: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<ValueState<T>> {
        Ok(ValueState {
            id: self.declare(name, StateKind::Value, ttl)?,
            _t: PhantomData,
        })
    }

    /// Declares a list state (`ttl`: per element, from when it was written).
    pub fn list_state<T: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<ListState<T>> {
        Ok(ListState {
            id: self.declare(name, StateKind::List, ttl)?,
            _t: PhantomData,
        })
    }

    /// Declares a map state (`ttl`: per entry, from when it was written). Entries are
    /// ordered by the JSON bytes of their keys.
    pub fn map_state<K: StateValue, V: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<MapState<K, V>> {
        Ok(MapState {
            id: self.declare(name, StateKind::Map, ttl)?,
            _t: PhantomData,
        })
    }
}

/// One stored value with its expiry (runtime side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredValue {
    /// The value as JSON bytes.
    pub bytes: Vec<u8>,
    /// When it expires (epoch ms of processing time), for state with a TTL.
    pub expires_at_ms: Option<i64>,
}

impl StoredValue {
    fn live(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|e| e > now_ms)
    }
}

/// The stored form of one state variable of one key (runtime side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Slot {
    /// Nothing stored.
    #[default]
    Empty,
    /// A value state.
    Value(StoredValue),
    /// A list state, in order.
    List(Vec<StoredValue>),
    /// A map state: JSON bytes of the key → value.
    Map(BTreeMap<Vec<u8>, StoredValue>),
}

impl Slot {
    /// Stored entries (a value, list elements or map entries).
    pub fn entries(&self) -> usize {
        match self {
            Slot::Empty => 0,
            Slot::Value(_) => 1,
            Slot::List(l) => l.len(),
            Slot::Map(m) => m.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Slot::Empty => 0,
            Slot::Value(v) => v.bytes.len() + 16,
            Slot::List(l) => l.iter().map(|v| v.bytes.len() + 16).sum(),
            Slot::Map(m) => m.iter().map(|(k, v)| k.len() + v.bytes.len() + 40).sum(),
        }
    }
}

/// The state and timers of one key (runtime side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyState {
    /// One slot per declared state variable, in declaration order.
    pub slots: Vec<Slot>,
    /// Registered timers (epoch ms, in the step's time mode).
    pub timers: BTreeSet<i64>,
}

impl KeyState {
    /// Empty state for `n` state variables.
    pub fn new(n: usize) -> Self {
        KeyState {
            slots: vec![Slot::Empty; n],
            timers: BTreeSet::new(),
        }
    }

    /// Stored entries (a value, a list element or a map entry each).
    pub fn entries(&self) -> u64 {
        self.slots.iter().map(Slot::entries).sum::<usize>() as u64
    }

    /// Approximate bytes held (values, map keys, timers).
    pub fn memory_bytes(&self) -> u64 {
        (self.slots.iter().map(Slot::bytes).sum::<usize>() + 16 * self.timers.len()) as u64
    }

    /// Whether the key holds no state and no timer.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty() && self.slots.iter().all(|s| s.entries() == 0)
    }

    /// Removes every entry whose TTL ran out at `now_ms`; returns how many.
    pub fn expire(&mut self, now_ms: i64) -> u64 {
        let mut removed = 0u64;
        for slot in self.slots.iter_mut() {
            match slot {
                Slot::Empty => {}
                Slot::Value(v) => {
                    if !v.live(now_ms) {
                        *slot = Slot::Empty;
                        removed += 1;
                    }
                }
                Slot::List(l) => {
                    let before = l.len();
                    l.retain(|v| v.live(now_ms));
                    removed += (before - l.len()) as u64;
                    if l.is_empty() {
                        *slot = Slot::Empty;
                    }
                }
                Slot::Map(m) => {
                    let before = m.len();
                    m.retain(|_, v| v.live(now_ms));
                    removed += (before - m.len()) as u64;
                    if m.is_empty() {
                        *slot = Slot::Empty;
                    }
                }
            }
        }
        removed
    }
}

/// What a callback emitted, in order (runtime side).
#[derive(Clone, Debug)]
pub enum Emitted {
    /// A row as a JSON object (converted to the output schema by the runtime).
    Row(Value),
    /// A batch in the output schema.
    Batch(RecordBatch),
}

/// Counters the runtime reports in progress (runtime side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessorCounters {
    /// Timers registered.
    pub timers_registered: u64,
    /// Timers deleted.
    pub timers_deleted: u64,
    /// State entries written (a value set, a list element put or appended, a map entry
    /// put).
    pub rows_written: u64,
    /// State entries removed by the processor (cleared values, replaced or cleared list
    /// elements, removed or cleared map entries).
    pub rows_removed: u64,
}

/// The view a callback has of its key's state, timers and output.
pub struct ProcessorContext<'a> {
    state: &'a mut KeyState,
    decls: &'a [StateDecl],
    time_mode: TimeMode,
    output_mode: OutputMode,
    times: TimerValues,
    firing: Option<i64>,
    output: &'a mut Vec<Emitted>,
    counters: &'a mut ProcessorCounters,
}

fn engine(e: impl std::fmt::Display) -> Error {
    Error::new(&codes::ENGINE_ERROR, e.to_string())
}

impl<'a> ProcessorContext<'a> {
    /// A context for one callback (runtime side). `firing` is the time of the timer being
    /// handled, if any.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        state: &'a mut KeyState,
        decls: &'a [StateDecl],
        time_mode: TimeMode,
        output_mode: OutputMode,
        times: TimerValues,
        firing: Option<i64>,
        output: &'a mut Vec<Emitted>,
        counters: &'a mut ProcessorCounters,
    ) -> Self {
        if state.slots.len() < decls.len() {
            state.slots.resize(decls.len(), Slot::Empty);
        }
        ProcessorContext {
            state,
            decls,
            time_mode,
            output_mode,
            times,
            firing,
            output,
            counters,
        }
    }

    /// The clocks of this micro-batch.
    pub fn timer_values(&self) -> TimerValues {
        self.times
    }

    /// The step's time mode.
    pub fn time_mode(&self) -> TimeMode {
        self.time_mode
    }

    /// The output mode of the query (append or update).
    pub fn output_mode(&self) -> OutputMode {
        self.output_mode
    }

    /// Registers a timer of this key at `time_ms` (event time or processing time, by the
    /// step's time mode). Registering an existing timer does nothing.
    pub fn register_timer(&mut self, time_ms: i64) -> Result<()> {
        if self.time_mode == TimeMode::None {
            return Err(Error::new(
                &codes::ENGINE_ERROR,
                "a processor registered a timer, but its step has `time_mode: none`",
            )
            .map_diagnostics(|d| {
                d.help(
                    "Declare `time_mode: event_time` or `processing_time` on the `process` step.",
                )
            }));
        }
        if let Some(f) = self.firing {
            if time_ms <= f {
                return Err(Error::new(
                    &codes::ENGINE_ERROR,
                    format!(
                        "a timer handler registered a timer at {time_ms}, not after the timer it handles ({f})"
                    ),
                ));
            }
        }
        if self.state.timers.insert(time_ms) {
            self.counters.timers_registered += 1;
        }
        Ok(())
    }

    /// Deletes a timer of this key (nothing happens when there is none).
    pub fn delete_timer(&mut self, time_ms: i64) {
        if self.state.timers.remove(&time_ms) {
            self.counters.timers_deleted += 1;
        }
    }

    /// The key's registered timers, in order.
    pub fn list_timers(&self) -> Vec<i64> {
        self.state.timers.iter().copied().collect()
    }

    /// Emits one row: anything that serialises to a JSON object with the output columns
    /// (timestamps as ISO-8601 strings — see [`iso_millis`] — or integers in the column's
    /// unit).
    pub fn emit<T: Serialize + ?Sized>(&mut self, row: &T) -> Result<()> {
        let v = serde_json::to_value(row).map_err(engine)?;
        if !v.is_object() {
            return Err(Error::new(
                &codes::ENGINE_ERROR,
                format!("a processor emitted {v}, which is not a row (a JSON object)"),
            ));
        }
        self.output.push(Emitted::Row(v));
        Ok(())
    }

    /// Emits a batch of rows in the output schema.
    pub fn emit_batch(&mut self, batch: RecordBatch) {
        self.output.push(Emitted::Batch(batch));
    }

    fn slot(&self, id: usize, kind: StateKind) -> Result<&Slot> {
        self.check(id, kind)?;
        Ok(&self.state.slots[id])
    }

    /// The slot to change, having counted `written` new entries and the `removed`
    /// entries (a function of the current slot) that the change drops.
    fn slot_mut(
        &mut self,
        id: usize,
        kind: StateKind,
        written: u64,
        removed: impl Fn(&Slot) -> u64,
    ) -> Result<&mut Slot> {
        self.check(id, kind)?;
        self.counters.rows_written += written;
        self.counters.rows_removed += removed(&self.state.slots[id]);
        Ok(&mut self.state.slots[id])
    }

    fn check(&self, id: usize, kind: StateKind) -> Result<()> {
        match self.decls.get(id) {
            Some(d) if d.kind == kind => Ok(()),
            _ => Err(Error::new(
                &codes::ENGINE_ERROR,
                format!(
                    "a {} state handle does not belong to this processor",
                    kind.as_str()
                ),
            )),
        }
    }

    fn now(&self) -> i64 {
        self.times.processing_time_ms
    }

    fn stored(&self, id: usize, bytes: Vec<u8>) -> StoredValue {
        StoredValue {
            bytes,
            expires_at_ms: self.decls[id]
                .ttl
                .map(|t| self.now().saturating_add(t.as_millis())),
        }
    }

    fn decode<T: DeserializeOwned>(&self, id: usize, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                &codes::ENGINE_ERROR,
                format!(
                    "state variable `{}` holds a value the processor cannot read: {e}",
                    self.decls[id].name
                ),
            )
        })
    }

    fn encode<T: Serialize + ?Sized>(&self, id: usize, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(value).map_err(|e| {
            Error::new(
                &codes::ENGINE_ERROR,
                format!("state variable `{}`: {e}", self.decls[id].name),
            )
        })
    }
}

/// A value per key (Spark's `ValueState`). Obtained from [`ProcessorInit::value_state`].
#[derive(Debug)]
pub struct ValueState<T> {
    id: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for ValueState<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ValueState<T> {}

impl<T: StateValue> ValueState<T> {
    /// The key's value (`None` when unset or expired).
    pub fn get(&self, ctx: &ProcessorContext<'_>) -> Result<Option<T>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Value)? {
            Slot::Value(v) if v.live(now) => ctx.decode(self.id, &v.bytes).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether the key has a (live) value.
    pub fn exists(&self, ctx: &ProcessorContext<'_>) -> Result<bool> {
        let now = ctx.now();
        Ok(matches!(ctx.slot(self.id, StateKind::Value)?, Slot::Value(v) if v.live(now)))
    }

    /// Sets the key's value (and restarts its TTL).
    pub fn set(&self, ctx: &mut ProcessorContext<'_>, value: &T) -> Result<()> {
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        *ctx.slot_mut(self.id, StateKind::Value, 1, |_| 0)? = Slot::Value(v);
        Ok(())
    }

    /// Removes the key's value.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::Value, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
}

/// A list per key (Spark's `ListState`). Obtained from [`ProcessorInit::list_state`].
#[derive(Debug)]
pub struct ListState<T> {
    id: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for ListState<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ListState<T> {}

impl<T: StateValue> ListState<T> {
    /// The key's live elements, in order.
    pub fn get(&self, ctx: &ProcessorContext<'_>) -> Result<Vec<T>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::List)? {
            Slot::List(l) => l
                .iter()
                .filter(|v| v.live(now))
                .map(|v| ctx.decode(self.id, &v.bytes))
                .collect(),
            _ => Ok(vec![]),
        }
    }

    /// Whether the key has live elements.
    pub fn exists(&self, ctx: &ProcessorContext<'_>) -> Result<bool> {
        let now = ctx.now();
        Ok(
            matches!(ctx.slot(self.id, StateKind::List)?, Slot::List(l) if l.iter().any(|v| v.live(now))),
        )
    }

    /// Replaces the list (every element gets a fresh TTL).
    pub fn put(&self, ctx: &mut ProcessorContext<'_>, values: &[T]) -> Result<()> {
        let stored = values
            .iter()
            .map(|v| Ok(ctx.stored(self.id, ctx.encode(self.id, v)?)))
            .collect::<Result<Vec<_>>>()?;
        let n = stored.len() as u64;
        *ctx.slot_mut(self.id, StateKind::List, n, |s| s.entries() as u64)? = if stored.is_empty() {
            Slot::Empty
        } else {
            Slot::List(stored)
        };
        Ok(())
    }

    /// Appends one element.
    pub fn append(&self, ctx: &mut ProcessorContext<'_>, value: &T) -> Result<()> {
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        let slot = ctx.slot_mut(self.id, StateKind::List, 1, |_| 0)?;
        match slot {
            Slot::List(l) => l.push(v),
            other => *other = Slot::List(vec![v]),
        }
        Ok(())
    }

    /// Removes the list.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::List, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
}

/// A map per key (Spark's `MapState`). Obtained from [`ProcessorInit::map_state`].
#[derive(Debug)]
pub struct MapState<K, V> {
    id: usize,
    _t: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for MapState<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for MapState<K, V> {}

impl<K: StateValue, V: StateValue> MapState<K, V> {
    /// The value of `key` (`None` when absent or expired).
    pub fn get(&self, ctx: &ProcessorContext<'_>, key: &K) -> Result<Option<V>> {
        let k = ctx.encode(self.id, key)?;
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Map)? {
            Slot::Map(m) => match m.get(&k) {
                Some(v) if v.live(now) => ctx.decode(self.id, &v.bytes).map(Some),
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Whether `key` has a live value.
    pub fn contains(&self, ctx: &ProcessorContext<'_>, key: &K) -> Result<bool> {
        let k = ctx.encode(self.id, key)?;
        let now = ctx.now();
        Ok(
            matches!(ctx.slot(self.id, StateKind::Map)?, Slot::Map(m) if m.get(&k).is_some_and(|v| v.live(now))),
        )
    }

    /// Sets `key` to `value` (and restarts the entry's TTL).
    pub fn put(&self, ctx: &mut ProcessorContext<'_>, key: &K, value: &V) -> Result<()> {
        let k = ctx.encode(self.id, key)?;
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        let slot = ctx.slot_mut(self.id, StateKind::Map, 1, |_| 0)?;
        match slot {
            Slot::Map(m) => {
                m.insert(k, v);
            }
            other => *other = Slot::Map(BTreeMap::from([(k, v)])),
        }
        Ok(())
    }

    /// Removes `key`.
    pub fn remove(&self, ctx: &mut ProcessorContext<'_>, key: &K) -> Result<()> {
        let k = ctx.encode(self.id, key)?;
        let slot = ctx.slot_mut(self.id, StateKind::Map, 0, |s| match s {
            Slot::Map(m) => m.contains_key(&k) as u64,
            _ => 0,
        })?;
        if let Slot::Map(m) = slot {
            m.remove(&k);
            if m.is_empty() {
                *slot = Slot::Empty;
            }
        }
        Ok(())
    }

    /// The live entries, ordered by the JSON bytes of their keys.
    pub fn entries(&self, ctx: &ProcessorContext<'_>) -> Result<Vec<(K, V)>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Map)? {
            Slot::Map(m) => m
                .iter()
                .filter(|(_, v)| v.live(now))
                .map(|(k, v)| Ok((ctx.decode(self.id, k)?, ctx.decode(self.id, &v.bytes)?)))
                .collect(),
            _ => Ok(vec![]),
        }
    }

    /// Removes every entry.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::Map, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
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
        .map_err(engine)?;
    let c = c
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| engine("timestamp cast"))?;
    Ok((0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i).div_euclid(1000)))
        .collect())
}

/// The rows as JSON objects (column → value; nulls as `null`).
pub fn rows_as_json(rows: &RecordBatch) -> Result<Vec<Map<String, Value>>> {
    let mut w = arrow::json::ArrayWriter::new(Vec::new());
    w.write(rows).map_err(engine)?;
    w.finish().map_err(engine)?;
    let bytes = w.into_inner();
    let mut out: Vec<Map<String, Value>> = if bytes.is_empty() {
        vec![]
    } else {
        serde_json::from_slice(&bytes).map_err(engine)?
    };
    for row in out.iter_mut() {
        for f in rows.schema().fields() {
            row.entry(f.name().clone()).or_insert(Value::Null);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Counter {
        n: u64,
    }

    fn ctx<'a>(
        state: &'a mut KeyState,
        decls: &'a [StateDecl],
        now: i64,
        firing: Option<i64>,
        out: &'a mut Vec<Emitted>,
        counters: &'a mut ProcessorCounters,
    ) -> ProcessorContext<'a> {
        ProcessorContext::new(
            state,
            decls,
            TimeMode::EventTime,
            OutputMode::Append,
            TimerValues {
                processing_time_ms: now,
                watermark_ms: Some(0),
            },
            firing,
            out,
            counters,
        )
    }

    #[test]
    fn typed_state_with_ttl_timers_and_emission() {
        let mut init = ProcessorInit::new(TimeMode::EventTime, ExecutionMode::Streaming);
        let count = init
            .value_state::<Counter>("count", Some(Duration::from_secs(10)))
            .unwrap();
        let seen = init.list_state::<String>("seen", None).unwrap();
        let by = init.map_state::<String, i64>("by", None).unwrap();
        assert!(init.value_state::<u8>("count", None).is_err());
        let decls = init.into_decls();
        let mut state = KeyState::new(decls.len());
        let (mut out, mut counters) = (Vec::new(), ProcessorCounters::default());
        {
            let mut c = ctx(&mut state, &decls, 1_000, None, &mut out, &mut counters);
            assert_eq!(count.get(&c).unwrap(), None);
            count.set(&mut c, &Counter { n: 2 }).unwrap();
            seen.append(&mut c, &"a".into()).unwrap();
            seen.append(&mut c, &"b".into()).unwrap();
            by.put(&mut c, &"x".into(), &5).unwrap();
            by.put(&mut c, &"a".into(), &1).unwrap();
            c.register_timer(50).unwrap();
            c.register_timer(20).unwrap();
            c.emit(&serde_json::json!({"k": 1})).unwrap();
            assert!(c.emit(&3).is_err());
            assert_eq!(c.list_timers(), [20, 50]);
            assert_eq!(seen.get(&c).unwrap(), ["a", "b"]);
            assert_eq!(
                by.entries(&c).unwrap(),
                [("a".to_string(), 1), ("x".to_string(), 5)]
            );
        }
        assert_eq!(state.entries(), 5);
        assert_eq!(counters.timers_registered, 2);
        assert_eq!(counters.rows_written, 5);
        assert_eq!(out.len(), 1);
        {
            // 10 s later the value expired (reads hide it at once); lists and maps have no TTL.
            let mut c = ctx(
                &mut state,
                &decls,
                11_000,
                Some(20),
                &mut out,
                &mut counters,
            );
            assert_eq!(count.get(&c).unwrap(), None);
            assert!(!count.exists(&c).unwrap());
            assert!(c.register_timer(20).is_err(), "not after the firing timer");
            c.delete_timer(50);
            by.remove(&mut c, &"x".into()).unwrap();
        }
        assert_eq!(state.expire(11_000), 1);
        assert_eq!(state.entries(), 3);
        assert_eq!((counters.rows_removed, counters.timers_deleted), (1, 1));
        assert!(!state.is_empty());
        // Handles of another kind are refused.
        let wrong: ValueState<u8> = ValueState {
            id: 1,
            _t: PhantomData,
        };
        let c = ctx(&mut state, &decls, 0, None, &mut out, &mut counters);
        assert!(wrong.get(&c).is_err());
    }

    #[test]
    fn keys_and_rows_as_json() {
        use arrow::array::{Int64Array, StringArray};
        let b = RecordBatch::try_from_iter(vec![
            (
                "user",
                std::sync::Arc::new(StringArray::from(vec![Some("u1")])) as _,
            ),
            (
                "n",
                std::sync::Arc::new(Int64Array::from(vec![None::<i64>])) as _,
            ),
        ])
        .unwrap();
        let k = GroupKey::new(b.clone()).unwrap();
        assert_eq!(k.get("user"), Some(&Value::from("u1")));
        assert_eq!(k.get("n"), Some(&Value::Null));
        let rows = rows_as_json(&b).unwrap();
        assert_eq!(rows[0]["n"], Value::Null);
        assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
    }
}
