//! The custom stateful processor operator (`etlantic:process`, Spark's
//! `transformWithState`): runs a linked [`StatefulProcessor`] over the input grouped by
//! key, with its typed state, timers and TTL in an operator state store that is
//! snapshotted and restored like every other operator's.
//!
//! One micro-batch, in this order:
//! 1. with `time_mode: event_time`, input rows at or behind the previous micro-batch's
//!    watermark are late (handled by the late-event policy, like dedup's);
//! 2. `handle_input_rows` once per key that has rows, keys in order of first appearance,
//!    rows in input order;
//! 3. every expired timer — event time: `timer <= watermark`; processing time:
//!    `timer <= batch timestamp` — in (time, key) order, each removed before its
//!    `handle_expired_timer` runs; timers registered by those handlers fire in a later
//!    micro-batch (the driver runs a no-data micro-batch when one is already due);
//! 4. state whose TTL ran out (processing time) is removed; keys with neither state nor
//!    timers are dropped.
//!
//! Emitted rows go to the next step in emission order. The snapshot is one Arrow batch
//! with a row per stored value, list element, map entry and timer:
//! `__key_<column>...` (the key), `__kind` (`value` | `list` | `map` | `timer`),
//! `__state` (the state variable), `__map_key` and `__value` (JSON bytes),
//! `__expires_ms` (TTL) and `__timer_ms`.
//!
//! In a batch run ([`ProcessorOperator::run_bounded`]) the whole input is one
//! micro-batch without a watermark, and then every event-time timer fires once.

use super::operators::{micros, OpContext, OpOutput, StateMetrics, StatefulOperator};
use super::ttl::ROWS_REMOVED_BY_TTL;
use arrow::array::{
    Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow::compute::{concat_batches, filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::processor::{
    Emitted, ExpiredTimer, GroupKey, KeyState, ProcessorContext, ProcessorCounters, ProcessorInit,
    ProcessorSpec, StateDecl, StateKind, StatefulProcessor, TimerValues,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode, TimeMode};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

struct Entry {
    key: Arc<GroupKey>,
    state: KeyState,
}

/// Figures of the last micro-batch.
#[derive(Clone, Copy, Debug, Default)]
struct BatchFigures {
    counters: ProcessorCounters,
    timers_fired: u64,
    ttl_removed: u64,
}

/// The operator of a `process` step.
pub struct ProcessorOperator {
    name: String,
    processor: Box<dyn StatefulProcessor>,
    decls: Vec<StateDecl>,
    time_mode: TimeMode,
    keys: Vec<String>,
    key_schema: SchemaRef,
    converter: RowConverter,
    out_schema: SchemaRef,
    /// The watermarked event-time column, for late rows (event-time mode only).
    event_time: Option<String>,
    /// Key bytes (Arrow row format) → state; ordered, so iteration is deterministic.
    store: BTreeMap<Vec<u8>, Entry>,
    figures: BatchFigures,
    metrics: StateMetrics,
    /// The state store holding every key's state, when the profile gives one: `store`
    /// then holds a micro-batch's keys only (see [`stored`]).
    stored: Option<stored::StoredState>,
}

impl ProcessorOperator {
    /// Creates the processor `name` for a step over rows of `input`, grouped by `keys`,
    /// and runs its `init`. In batch runs state TTL is dropped.
    pub fn new(
        name: &str,
        keys: &[String],
        time_mode: TimeMode,
        options: &Value,
        input: SchemaRef,
        event_time: Option<String>,
        mode: ExecutionMode,
    ) -> Result<Self> {
        let provider = etlantic_core::plugin::processor(name).ok_or_else(|| {
            let linked: Vec<&str> = etlantic_core::plugin::processors()
                .map(|p| p.name())
                .collect();
            Error::from(
                etlantic_core::Diagnostic::new(
                    &codes::UNKNOWN_PROCESSOR,
                    format!("no linked stateful processor is named `{name}`"),
                )
                .help(format!("Linked processors: {linked:?}.")),
            )
        })?;
        let key_fields = keys
            .iter()
            .map(|k| {
                input.field_with_name(k).cloned().map_err(|_| {
                    Error::new(
                        &codes::UNKNOWN_COLUMN,
                        format!("key `{k}` of processor `{name}` is not an input column"),
                    )
                })
            })
            .collect::<Result<Vec<Field>>>()?;
        let key_schema = Arc::new(Schema::new(key_fields.clone()));
        let converter = RowConverter::new(if key_fields.is_empty() {
            vec![SortField::new(DataType::Boolean)]
        } else {
            key_fields
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect()
        })
        .map_err(Error::engine)?;
        let spec = ProcessorSpec {
            input_schema: input.clone(),
            keys: keys.to_vec(),
            time_mode,
            options: if options.is_null() {
                Value::Object(Default::default())
            } else {
                options.clone()
            },
        };
        let mut processor = provider.create(&spec)?;
        let mut init = ProcessorInit::new(time_mode, mode);
        processor.init(&mut init)?;
        let mut decls = init.into_decls();
        if mode == ExecutionMode::Batch {
            for d in decls.iter_mut() {
                d.ttl = None;
            }
        }
        let out_schema = processor.output_schema();
        Ok(ProcessorOperator {
            name: name.to_string(),
            processor,
            decls,
            time_mode,
            keys: keys.to_vec(),
            key_schema,
            converter,
            out_schema,
            event_time: event_time.filter(|_| time_mode == TimeMode::EventTime),
            store: BTreeMap::new(),
            figures: BatchFigures::default(),
            metrics: StateMetrics::default(),
            stored: None,
        })
    }

    /// The processor's name.
    pub fn processor_name(&self) -> &str {
        &self.name
    }

    fn key_columns(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        if self.keys.is_empty() {
            return Ok(vec![Arc::new(arrow::array::BooleanArray::from(vec![
                true;
                batch
                    .num_rows(
                    )
            ]))]);
        }
        self.keys
            .iter()
            .map(|k| {
                batch.column_by_name(k).cloned().ok_or_else(|| {
                    Error::engine(format!("the processor input has no key column `{k}`"))
                })
            })
            .collect()
    }

    /// The key of row `i` of `batch` as a [`GroupKey`].
    fn group_key(&self, batch: &RecordBatch, i: usize) -> Result<GroupKey> {
        let cols: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|k| batch.column_by_name(k).expect("checked").slice(i, 1))
            .collect();
        let b = if cols.is_empty() {
            RecordBatch::new_empty(self.key_schema.clone())
        } else {
            RecordBatch::try_new(self.key_schema.clone(), cols).map_err(Error::engine)?
        };
        GroupKey::new(b)
    }

    /// Rows that are not late, and the late rows with their positions.
    fn split_late(
        &self,
        input: &[RecordBatch],
        ctx: &OpContext,
        out: &mut OpOutput,
    ) -> Result<Vec<RecordBatch>> {
        let mut kept = Vec::new();
        let mut late_batches = Vec::new();
        for (bi, b) in input.iter().enumerate().filter(|(_, b)| b.num_rows() > 0) {
            let col = match &self.event_time {
                Some(c) if ctx.has_watermark && !ctx.accept_late => b.column_by_name(c),
                _ => None,
            };
            let Some(col) = col else {
                kept.push(b.clone());
                continue;
            };
            let t = micros(col)?;
            let late: Vec<u32> = (0..b.num_rows())
                .filter(|i| t.is_valid(*i) && t.value(*i) <= ctx.late_watermark_us)
                .map(|i| i as u32)
                .collect();
            if late.is_empty() {
                kept.push(b.clone());
                continue;
            }
            let keep: arrow::array::BooleanArray = (0..b.num_rows())
                .map(|i| Some(!(t.is_valid(i) && t.value(i) <= ctx.late_watermark_us)))
                .collect();
            kept.push(filter_record_batch(b, &keep).map_err(Error::engine)?);
            out.late_count += late.len() as u64;
            late_batches.push(
                take_record_batch(b, &UInt32Array::from(late.clone())).map_err(Error::engine)?,
            );
            out.late_index.push((bi, late));
        }
        if let Some(first) = late_batches.first() {
            out.late = Some(concat_batches(&first.schema(), &late_batches).map_err(Error::engine)?);
        }
        Ok(kept)
    }

    /// Runs `handle_input_rows` for every key of `kept`.
    fn handle_input(
        &mut self,
        kept: &[RecordBatch],
        times: TimerValues,
        output_mode: OutputMode,
        emitted: &mut Vec<Emitted>,
    ) -> Result<()> {
        let kept: Vec<&RecordBatch> = kept.iter().filter(|b| b.num_rows() > 0).collect();
        let Some(first) = kept.first() else {
            return Ok(());
        };
        let batch = concat_batches(&first.schema(), kept.iter().copied()).map_err(Error::engine)?;
        let rows = self
            .converter
            .convert_columns(&self.key_columns(&batch)?)
            .map_err(Error::engine)?;
        let mut order: Vec<Vec<u8>> = Vec::new();
        let mut groups: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
        for i in 0..batch.num_rows() {
            let row = rows.row(i);
            let k = row.as_ref();
            match groups.get_mut(k) {
                Some(v) => v.push(i as u32),
                None => {
                    order.push(k.to_vec());
                    groups.insert(k.to_vec(), vec![i as u32]);
                }
            }
        }
        for k in order {
            let idx = groups.remove(&k).expect("grouped");
            if !self.store.contains_key(&k) {
                let key = Arc::new(self.group_key(&batch, idx[0] as usize)?);
                self.store.insert(
                    k.clone(),
                    Entry {
                        key,
                        state: KeyState::new(self.decls.len()),
                    },
                );
            }
            let rows = take_record_batch(&batch, &UInt32Array::from(idx)).map_err(Error::engine)?;
            let entry = self.store.get_mut(&k).expect("inserted");
            let key = entry.key.clone();
            let mut ctx = ProcessorContext::new(
                &mut entry.state,
                &self.decls,
                self.time_mode,
                output_mode,
                times,
                None,
                emitted,
                &mut self.figures.counters,
            );
            self.processor
                .handle_input_rows(&key, &rows, &mut ctx)
                .map_err(|e| self.in_processor(e))?;
        }
        Ok(())
    }

    /// Fires the timers for which `due` holds, in (time, key) order; returns how many.
    fn fire_timers(
        &mut self,
        due: impl Fn(i64) -> bool,
        times: TimerValues,
        output_mode: OutputMode,
        emitted: &mut Vec<Emitted>,
    ) -> Result<u64> {
        let mut expired: Vec<(i64, Vec<u8>)> = self
            .store
            .iter()
            .flat_map(|(k, e)| {
                e.state
                    .timers()
                    .iter()
                    .take_while(|t| due(**t))
                    .map(move |t| (*t, k.clone()))
            })
            .collect();
        expired.sort();
        let mut fired = 0;
        for (t, k) in expired {
            let Some(entry) = self.store.get_mut(&k) else {
                continue;
            };
            if !entry.state.remove_timer(t) {
                continue;
            }
            fired += 1;
            let key = entry.key.clone();
            let mut ctx = ProcessorContext::new(
                &mut entry.state,
                &self.decls,
                self.time_mode,
                output_mode,
                times,
                Some(t),
                emitted,
                &mut self.figures.counters,
            );
            self.processor
                .handle_expired_timer(
                    &key,
                    ExpiredTimer {
                        time_ms: t,
                        mode: self.time_mode,
                    },
                    &mut ctx,
                )
                .map_err(|e| self.in_processor(e))?;
        }
        Ok(fired)
    }

    fn in_processor(&self, e: Error) -> Error {
        let name = self.name.clone();
        e.map_diagnostics(|mut d| {
            if !d.message.contains(&name) {
                d.message = format!("processor `{name}`: {}", d.message);
            }
            d
        })
    }

    /// Converts emitted rows into batches of the output schema, in emission order.
    fn to_batches(&self, emitted: Vec<Emitted>) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut rows: Vec<Value> = Vec::new();
        let flush = |rows: &mut Vec<Value>, out: &mut Vec<RecordBatch>| -> Result<()> {
            if rows.is_empty() {
                return Ok(());
            }
            let mut decoder = arrow::json::ReaderBuilder::new(self.out_schema.clone())
                .with_strict_mode(true)
                .build_decoder()
                .map_err(Error::engine)?;
            decoder.serialize(rows).map_err(|e| {
                self.in_processor(Error::new(
                    &codes::ENGINE_ERROR,
                    format!("an emitted row does not match the output schema: {e}"),
                ))
            })?;
            if let Some(b) = decoder.flush().map_err(|e| {
                self.in_processor(Error::new(
                    &codes::ENGINE_ERROR,
                    format!("an emitted row does not match the output schema: {e}"),
                ))
            })? {
                out.push(b);
            }
            rows.clear();
            Ok(())
        };
        for e in emitted {
            match e {
                Emitted::Row(v) => rows.push(v),
                Emitted::Batch(b) => {
                    flush(&mut rows, &mut out)?;
                    let same = b.schema().fields().len() == self.out_schema.fields().len()
                        && b.schema()
                            .fields()
                            .iter()
                            .zip(self.out_schema.fields())
                            .all(|(a, o)| a.name() == o.name() && a.data_type() == o.data_type());
                    if !same {
                        return Err(self.in_processor(Error::new(
                            &codes::ENGINE_ERROR,
                            format!(
                                "an emitted batch has schema {:?}, not the output schema {:?}",
                                b.schema().fields(),
                                self.out_schema.fields()
                            ),
                        )));
                    }
                    out.push(
                        RecordBatch::try_new(self.out_schema.clone(), b.columns().to_vec())
                            .map_err(|e| self.in_processor(Error::engine(e)))?,
                    );
                }
            }
        }
        flush(&mut rows, &mut out)?;
        Ok(out)
    }

    fn finish_batch(&mut self, now_ms: Option<i64>) {
        let mut ttl_removed = 0;
        if let Some(now) = now_ms {
            for e in self.store.values_mut() {
                ttl_removed += e.state.expire(now);
            }
        }
        self.store.retain(|_, e| !e.state.is_empty());
        self.figures.ttl_removed = ttl_removed;
        let c = self.figures.counters;
        let total = self.rows_total();
        self.metrics = StateMetrics {
            rows_total: total,
            rows_updated: c.rows_written + c.timers_registered,
            rows_removed: c.rows_removed
                + c.timers_deleted
                + self.figures.timers_fired
                + ttl_removed,
            memory_bytes: self
                .store
                .iter()
                .map(|(k, e)| 48 + k.len() as u64 + e.state.memory_bytes())
                .sum(),
        };
    }

    fn rows_total(&self) -> u64 {
        self.store
            .values()
            .map(|e| e.state.entries() + e.state.timers().len() as u64)
            .sum()
    }

    /// Runs the processor over a bounded input (a batch run): one micro-batch without a
    /// watermark, then every event-time timer fires once, in timer order.
    pub fn run_bounded(&mut self, input: &[RecordBatch], now_ms: i64) -> Result<Vec<RecordBatch>> {
        let times = TimerValues {
            processing_time_ms: now_ms,
            watermark_ms: None,
        };
        let mut emitted = Vec::new();
        self.handle_input(input, times, OutputMode::Append, &mut emitted)?;
        if self.time_mode == TimeMode::EventTime {
            self.fire_timers(|_| true, times, OutputMode::Append, &mut emitted)?;
        }
        self.processor.close()?;
        self.to_batches(emitted)
    }

    /// The snapshot of `store` (see [`StatefulOperator::snapshot`]).
    fn snapshot_of(&self, store: &BTreeMap<Vec<u8>, Entry>) -> Result<RecordBatch> {
        let mut snap: Vec<SnapRow<'_>> = Vec::new();
        for (k, e) in store {
            snap.extend(e.state.entries_stored().into_iter().map(|s| SnapRow {
                key: k,
                kind: match s.kind {
                    StateKind::Value => KIND_VALUE,
                    StateKind::List => KIND_LIST,
                    StateKind::Map => KIND_MAP,
                },
                state: Some(self.decls[s.slot].name.as_str()),
                map_key: s.map_key,
                value: Some((s.value, s.expires_at_ms)),
                timer: None,
            }));
            snap.extend(e.state.timers().iter().map(|t| SnapRow {
                key: k,
                kind: KIND_TIMER,
                state: None,
                map_key: None,
                value: None,
                timer: Some(*t),
            }));
        }
        let parser = self.converter.parser();
        let key_cols = self
            .converter
            .convert_rows(snap.iter().map(|r| parser.parse(r.key)))
            .map_err(Error::engine)?;
        let mut fields: Vec<Field> = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        if !self.keys.is_empty() {
            for (f, c) in self.key_schema.fields().iter().zip(key_cols) {
                fields.push(Field::new(
                    format!("__key_{}", f.name()),
                    f.data_type().clone(),
                    true,
                ));
                cols.push(c);
            }
        }
        fields.push(Field::new("__kind", DataType::Utf8, false));
        cols.push(Arc::new(StringArray::from_iter_values(
            snap.iter().map(|r| r.kind),
        )));
        fields.push(Field::new("__state", DataType::Utf8, true));
        cols.push(Arc::new(StringArray::from_iter(
            snap.iter().map(|r| r.state),
        )));
        fields.push(Field::new("__map_key", DataType::Binary, true));
        cols.push(Arc::new(BinaryArray::from_iter(
            snap.iter().map(|r| r.map_key),
        )));
        fields.push(Field::new("__value", DataType::Binary, true));
        cols.push(Arc::new(BinaryArray::from_iter(
            snap.iter().map(|r| r.value.map(|(bytes, _)| bytes)),
        )));
        fields.push(Field::new("__expires_ms", DataType::Int64, true));
        cols.push(Arc::new(Int64Array::from_iter(
            snap.iter()
                .map(|r| r.value.and_then(|(_, expires)| expires)),
        )));
        fields.push(Field::new("__timer_ms", DataType::Int64, true));
        cols.push(Arc::new(Int64Array::from_iter(
            snap.iter().map(|r| r.timer),
        )));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::engine)
    }

    /// Adds a stored entry of state variable `name` to `state` (a row of a snapshot or
    /// of the state store). A variable the processor no longer declares is dropped; one
    /// declared with another kind is an incompatible checkpoint (`ETL802`).
    fn restore_row(
        &self,
        state: &mut KeyState,
        name: &str,
        found: StateKind,
        map_key: Option<Vec<u8>>,
        value: Vec<u8>,
        expires_at_ms: Option<i64>,
    ) -> Result<()> {
        let Some(slot) = self.decls.iter().position(|d| d.name == name) else {
            return Ok(());
        };
        let want = self.decls[slot].kind;
        if want != found {
            return Err(Error::new(
                &codes::CHECKPOINT_INCOMPATIBLE,
                format!(
                    "processor `{}`: state variable `{}` is a {} state in the checkpoint but is declared as a {} state",
                    self.name,
                    self.decls[slot].name,
                    found.as_str(),
                    want.as_str()
                ),
            ));
        }
        state
            .restore_entry(slot, found, map_key, value, expires_at_ms)
            .map_err(|m| {
                Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!(
                        "processor `{}` state: a {} row: {m}",
                        self.name,
                        found.as_str()
                    ),
                )
            })
    }
}

const KIND_VALUE: &str = "value";
const KIND_LIST: &str = "list";
const KIND_MAP: &str = "map";
const KIND_TIMER: &str = "timer";

impl StatefulOperator for ProcessorOperator {
    fn name(&self) -> &'static str {
        "transformWithStateExec"
    }

    fn output_schema(&self) -> SchemaRef {
        self.out_schema.clone()
    }

    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput> {
        let mut out = OpOutput::default();
        self.figures = BatchFigures::default();
        let now = ctx.processing_time_ms;
        let watermark_ms = ctx
            .has_watermark
            .then(|| ctx.evict_watermark_us.div_euclid(1000));
        let times = TimerValues {
            processing_time_ms: now,
            watermark_ms,
        };
        let kept = if self.time_mode == TimeMode::EventTime {
            self.split_late(input, ctx, &mut out)?
        } else {
            input.to_vec()
        };
        let due_by = match self.time_mode {
            TimeMode::EventTime => watermark_ms,
            TimeMode::ProcessingTime => Some(now),
            TimeMode::None => None,
        };
        // On a state store, the keys this micro-batch can touch come into memory.
        self.load_keys(&kept, due_by, now)?;
        let mut emitted = Vec::new();
        self.handle_input(&kept, times, ctx.output_mode, &mut emitted)?;
        let mode = self.time_mode;
        let due = move |t: i64| match mode {
            TimeMode::EventTime => watermark_ms.is_some_and(|w| t <= w),
            TimeMode::ProcessingTime => t <= now,
            TimeMode::None => false,
        };
        self.figures.timers_fired = self.fire_timers(due, times, ctx.output_mode, &mut emitted)?;
        self.finish_batch(Some(now));
        if let Some(held) = self
            .stored
            .is_some()
            .then(|| self.write_back())
            .transpose()?
        {
            self.metrics.rows_total = held;
            self.metrics.memory_bytes = self.stored()?.store.memory_bytes();
        }
        out.rows = self.to_batches(emitted)?;
        if out.rows.is_empty() {
            out.rows
                .push(RecordBatch::new_empty(self.out_schema.clone()));
        }
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        if self.stored.is_some() {
            return self.snapshot_of(&self.stored_entries()?);
        }
        self.snapshot_of(&self.store)
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        let corrupt = |m: String| {
            Error::new(
                &codes::CHECKPOINT_CORRUPT,
                format!("processor `{}` state: {m}", self.name),
            )
        };
        let col = |name: &str| {
            state
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| corrupt(format!("no column `{name}`")))
        };
        let key_cols: Vec<ArrayRef> = if self.keys.is_empty() {
            vec![Arc::new(arrow::array::BooleanArray::from(vec![
                true;
                state
                    .num_rows(
                    )
            ]))]
        } else {
            self.key_schema
                .fields()
                .iter()
                .map(|f| col(&format!("__key_{}", f.name())))
                .collect::<Result<_>>()?
        };
        let key_batch = if self.keys.is_empty() {
            None
        } else {
            let renamed: Vec<ArrayRef> = key_cols.clone();
            Some(
                RecordBatch::try_new(self.key_schema.clone(), renamed)
                    .map_err(|e| corrupt(e.to_string()))?,
            )
        };
        let rows = self
            .converter
            .convert_columns(&key_cols)
            .map_err(|e| corrupt(format!("keys: {e}")))?;
        let kinds = col("__kind")?;
        let kinds = kinds
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| corrupt("`__kind` is not a string".into()))?
            .clone();
        let states = col("__state")?;
        let states = states
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| corrupt("`__state` is not a string".into()))?
            .clone();
        let bin = |name: &str| -> Result<BinaryArray> {
            col(name)?
                .as_any()
                .downcast_ref::<BinaryArray>()
                .cloned()
                .ok_or_else(|| corrupt(format!("`{name}` is not binary")))
        };
        let int = |name: &str| -> Result<Int64Array> {
            col(name)?
                .as_any()
                .downcast_ref::<Int64Array>()
                .cloned()
                .ok_or_else(|| corrupt(format!("`{name}` is not an integer")))
        };
        let (map_keys, values) = (bin("__map_key")?, bin("__value")?);
        let (expires, timers) = (int("__expires_ms")?, int("__timer_ms")?);
        let mut store: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
        for i in 0..state.num_rows() {
            let k = rows.row(i).as_ref().to_vec();
            if !store.contains_key(&k) {
                let key = match &key_batch {
                    Some(b) => GroupKey::new(b.slice(i, 1))?,
                    None => GroupKey::new(RecordBatch::new_empty(self.key_schema.clone()))?,
                };
                store.insert(
                    k.clone(),
                    Entry {
                        key: Arc::new(key),
                        state: KeyState::new(self.decls.len()),
                    },
                );
            }
            let entry = store.get_mut(&k).expect("inserted");
            let kind = kinds.value(i);
            if kind == KIND_TIMER {
                if timers.is_null(i) {
                    return Err(corrupt("a timer row without `__timer_ms`".into()));
                }
                entry.state.add_timer(timers.value(i));
                continue;
            }
            if !states.is_valid(i) {
                continue;
            }
            let found = match kind {
                KIND_VALUE => StateKind::Value,
                KIND_LIST => StateKind::List,
                KIND_MAP => StateKind::Map,
                other => return Err(corrupt(format!("unknown row kind `{other}`"))),
            };
            if values.is_null(i) {
                return Err(corrupt("a state row without `__value`".into()));
            }
            let map_key = map_keys.is_valid(i).then(|| map_keys.value(i).to_vec());
            self.restore_row(
                &mut entry.state,
                states.value(i),
                found,
                map_key,
                values.value(i).to_vec(),
                expires.is_valid(i).then(|| expires.value(i)),
            )?;
        }
        self.store = store;
        self.metrics.rows_total = self.rows_total();
        self.replace_stored()
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    /// Event-time timers fire when the watermark moves (Spark runs another batch then).
    fn needs_no_data_batch(&self, _mode: OutputMode) -> bool {
        self.time_mode == TimeMode::EventTime
    }

    fn has_due_work(&self, watermark_ms: Option<i64>, now_ms: i64) -> bool {
        let next = match &self.stored {
            // A store that cannot be read runs the micro-batch, which reports why.
            Some(_) => match self.first_stored_timer() {
                Ok(t) => t,
                Err(_) => return true,
            },
            None => self
                .store
                .values()
                .filter_map(|e| e.state.timers().first().copied())
                .min(),
        };
        match (self.time_mode, next) {
            (TimeMode::EventTime, Some(t)) => watermark_ms.is_some_and(|w| t <= w),
            (TimeMode::ProcessingTime, Some(t)) => t <= now_ms,
            _ => false,
        }
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        let count = |k: StateKind| self.decls.iter().filter(|d| d.kind == k).count() as u64;
        vec![
            ("numValueStateVars", count(StateKind::Value)),
            ("numListStateVars", count(StateKind::List)),
            ("numMapStateVars", count(StateKind::Map)),
            (
                "numRegisteredTimers",
                match &self.stored {
                    Some(stored) => stored.timers,
                    None => self
                        .store
                        .values()
                        .map(|e| e.state.timers().len() as u64)
                        .sum(),
                },
            ),
            ("numExpiredTimers", self.figures.timers_fired),
            ("numDeletedTimers", self.figures.counters.timers_deleted),
            (ROWS_REMOVED_BY_TTL, self.figures.ttl_removed),
        ]
    }

    fn use_store(
        &mut self,
        store: Box<dyn etlantic_runtime::state_store::StateStore>,
    ) -> Result<()> {
        self.store.clear();
        self.stored = Some(stored::StoredState::new(store));
        Ok(())
    }

    fn store(&mut self) -> Option<&mut dyn etlantic_runtime::state_store::StateStore> {
        self.stored
            .as_mut()
            .map(|s| s.store.as_mut() as &mut dyn etlantic_runtime::state_store::StateStore)
    }

    fn close(&mut self) -> Result<()> {
        self.processor.close()
    }
}

/// One row of a snapshot.
struct SnapRow<'a> {
    key: &'a [u8],
    kind: &'static str,
    state: Option<&'a str>,
    map_key: Option<&'a [u8]>,
    /// The encoded value and when it expires.
    value: Option<(&'a [u8], Option<i64>)>,
    timer: Option<i64>,
}

mod stored;

#[cfg(test)]
mod tests;
