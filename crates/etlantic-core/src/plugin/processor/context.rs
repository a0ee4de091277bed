//! The context of one processor callback: its key's state slots and timers, the clocks
//! of the micro-batch, and the rows it emits. Typed state handles read and write
//! through it.

use super::store::{Emitted, KeyState, ProcessorCounters, Slot, StateDecl, StateKind, StoredValue};
use super::TimerValues;
use crate::diagnostics::{codes, Error, Result};
use crate::streaming::{OutputMode, TimeMode};
use arrow::array::RecordBatch;
use serde::de::DeserializeOwned;
use serde::Serialize;

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
    /// (timestamps as ISO-8601 strings — see [`iso_millis`](super::iso_millis) — or
    /// integers in the column's unit).
    pub fn emit<T: Serialize + ?Sized>(&mut self, row: &T) -> Result<()> {
        let v = serde_json::to_value(row).map_err(Error::engine)?;
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

    pub(super) fn slot(&self, id: usize, kind: StateKind) -> Result<&Slot> {
        self.check(id, kind)?;
        Ok(&self.state.slots[id])
    }

    /// The slot to change, having counted `written` new entries and the `removed`
    /// entries (a function of the current slot) that the change drops.
    pub(super) fn slot_mut(
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

    pub(super) fn now(&self) -> i64 {
        self.times.processing_time_ms
    }

    pub(super) fn stored(&self, id: usize, bytes: Vec<u8>) -> StoredValue {
        StoredValue {
            bytes,
            expires_at_ms: self.decls[id]
                .ttl
                .map(|t| self.now().saturating_add(t.as_millis())),
        }
    }

    pub(super) fn decode<T: DeserializeOwned>(&self, id: usize, bytes: &[u8]) -> Result<T> {
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

    pub(super) fn encode<T: Serialize + ?Sized>(&self, id: usize, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(value).map_err(|e| {
            Error::new(
                &codes::ENGINE_ERROR,
                format!("state variable `{}`: {e}", self.decls[id].name),
            )
        })
    }
}
