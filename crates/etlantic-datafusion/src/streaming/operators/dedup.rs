//! Deduplication with state: Spark's `dropDuplicates` (keys, with the watermark) and
//! `dropDuplicatesWithinWatermark`.

use super::*;

/// Deduplication: Spark's `dropDuplicates(keys)` (with or without a watermark) and
/// `dropDuplicatesWithinWatermark(keys)`.
pub struct DedupOperator {
    schema: SchemaRef,
    keys: Vec<String>,
    converter: RowConverter,
    /// Watermarked event-time column, if the input has one.
    time_column: Option<String>,
    /// `Some(delay µs)`: within-watermark mode (state expires at first event time + delay).
    within_delay_us: Option<i64>,
    /// key bytes → event time (µs) of the first occurrence, or expiry for within mode;
    /// `None` when the key carries no event time.
    seen: HashMap<Vec<u8>, Option<i64>>,
    /// key bytes → processing time (epoch ms) it was first seen, for the TTL.
    first_seen_ms: HashMap<Vec<u8>, i64>,
    /// Keys are forgotten this long (processing time) after they were first seen.
    ttl: Option<StateTtl>,
    /// Keys forgotten by the TTL in the last micro-batch.
    ttl_removed: u64,
    metrics: StateMetrics,
}

impl DedupOperator {
    /// A dedup over `keys` of rows with `schema` (all columns when `keys` is empty).
    pub fn new(
        schema: SchemaRef,
        keys: Vec<String>,
        time_column: Option<String>,
        within_delay_us: Option<i64>,
    ) -> Result<Self> {
        let keys = if keys.is_empty() {
            schema.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            keys
        };
        let fields = keys
            .iter()
            .map(|k| {
                schema
                    .field_with_name(k)
                    .map(|f| SortField::new(f.data_type().clone()))
                    .map_err(|_| {
                        Error::new(
                            &codes::UNKNOWN_COLUMN,
                            format!("dedup key `{k}` is not a column"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DedupOperator {
            converter: RowConverter::new(fields).map_err(Error::engine)?,
            schema,
            keys,
            time_column,
            within_delay_us,
            seen: HashMap::default(),
            first_seen_ms: HashMap::default(),
            ttl: None,
            ttl_removed: 0,
            metrics: StateMetrics::default(),
        })
    }

    /// Whether the state can be evicted (the event time is a key, or within mode).
    fn evictable(&self) -> bool {
        self.within_delay_us.is_some()
            || self
                .time_column
                .as_ref()
                .is_some_and(|t| self.keys.contains(t))
    }
}

impl StatefulOperator for DedupOperator {
    fn name(&self) -> &'static str {
        if self.within_delay_us.is_some() {
            "dedupeWithinWatermark"
        } else {
            "dedupe"
        }
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput> {
        let mut out = OpOutput::default();
        let mut late_batches = Vec::new();
        let mut updated = 0;
        let now_ms = ctx.processing_time_ms;
        // Keys whose TTL ran out are forgotten before the input is checked.
        self.ttl_removed = 0;
        if let Some(ttl) = self.ttl {
            let expired: Vec<Vec<u8>> = self
                .seen
                .keys()
                .filter(|k| ttl.expired(self.first_seen_ms.get(*k).copied(), now_ms))
                .cloned()
                .collect();
            for k in expired {
                self.seen.remove(&k);
                self.first_seen_ms.remove(&k);
                self.ttl_removed += 1;
            }
        }
        let before = self.seen.len() as u64;
        for (batch_index, batch) in input.iter().enumerate().filter(|(_, b)| b.num_rows() > 0) {
            let cols: Vec<ArrayRef> = self
                .keys
                .iter()
                .map(|k| {
                    batch
                        .column_by_name(k)
                        .cloned()
                        .ok_or_else(|| Error::engine(format!("missing dedup key {k}")))
                })
                .collect::<Result<_>>()?;
            let rows = self
                .converter
                .convert_columns(&cols)
                .map_err(Error::engine)?;
            let times = match (&self.time_column, ctx.has_watermark) {
                (Some(t), true) => Some(micros(
                    batch
                        .column_by_name(t)
                        .ok_or_else(|| Error::engine(format!("missing {t}")))?,
                )?),
                _ => None,
            };
            let mut keep = Vec::with_capacity(batch.num_rows());
            let mut late = Vec::new();
            for i in 0..batch.num_rows() {
                let ts = times
                    .as_ref()
                    .and_then(|t| t.is_valid(i).then(|| t.value(i)));
                if let Some(ts) = ts {
                    if !ctx.accept_late && ts <= ctx.late_watermark_us {
                        keep.push(false);
                        late.push(i as u32);
                        continue;
                    }
                }
                let row = rows.row(i);
                let key = row.as_ref();
                if self.seen.contains_key(key) {
                    keep.push(false);
                    continue;
                }
                let value = match self.within_delay_us {
                    Some(d) => ts.map(|t| t + d),
                    None => ts,
                };
                self.seen.insert(key.to_vec(), value);
                self.first_seen_ms.insert(key.to_vec(), now_ms);
                updated += 1;
                keep.push(true);
            }
            if !late.is_empty() {
                out.late_count += late.len() as u64;
                out.late_index.push((batch_index, late.clone()));
                let idx = UInt32Array::from(late);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(Error::engine)?;
                late_batches
                    .push(RecordBatch::try_new(batch.schema(), cols).map_err(Error::engine)?);
            }
            out.rows.push(
                filter_record_batch(batch, &BooleanArray::from(keep)).map_err(Error::engine)?,
            );
        }
        if !late_batches.is_empty() {
            out.late = Some(
                arrow::compute::concat_batches(&late_batches[0].schema(), &late_batches)
                    .map_err(Error::engine)?,
            );
        }
        if ctx.has_watermark && self.evictable() {
            let wm = ctx.evict_watermark_us;
            self.seen.retain(|_, v| v.is_none_or(|t| t > wm));
            let seen = &self.seen;
            self.first_seen_ms.retain(|k, _| seen.contains_key(k));
        }
        let after = self.seen.len() as u64;
        self.metrics = StateMetrics {
            rows_total: after,
            rows_updated: updated,
            rows_removed: (before + updated).saturating_sub(after) + self.ttl_removed,
            memory_bytes: self.seen.keys().map(|k| k.len() as u64 + 40).sum(),
        };
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        let mut entries: Vec<(&Vec<u8>, &Option<i64>)> = self.seen.iter().collect();
        entries.sort();
        let keys =
            arrow::array::BinaryArray::from_iter_values(entries.iter().map(|(k, _)| k.as_slice()));
        let values: Int64Array = entries.iter().map(|(_, v)| **v).collect();
        let first_seen: Int64Array = entries
            .iter()
            .map(|(k, _)| self.first_seen_ms.get(*k).copied())
            .collect();
        RecordBatch::try_from_iter(vec![
            ("__key", Arc::new(keys) as ArrayRef),
            ("__value", Arc::new(values) as ArrayRef),
            (UPDATED_COLUMN, Arc::new(first_seen) as ArrayRef),
        ])
        .map_err(Error::engine)
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        const OP: &str = "dedup";
        let keys: arrow::array::BinaryArray = state_column(state, "__key", OP)?;
        let values: Int64Array = state_column(state, "__value", OP)?;
        self.seen = (0..state.num_rows())
            .map(|i| {
                (
                    keys.value(i).to_vec(),
                    values.is_valid(i).then(|| values.value(i)),
                )
            })
            .collect();
        // Checkpoints written before TTL existed have no first-seen times.
        let first_seen: Option<Int64Array> = match state.column_by_name(UPDATED_COLUMN) {
            Some(_) => Some(state_column(state, UPDATED_COLUMN, OP)?),
            None => None,
        };
        self.first_seen_ms = match first_seen {
            Some(t) => (0..state.num_rows())
                .filter(|i| t.is_valid(*i))
                .map(|i| (keys.value(i).to_vec(), t.value(i)))
                .collect(),
            None => HashMap::default(),
        };
        Ok(())
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        self.ttl = Some(StateTtl::new(ttl)?);
        Ok(())
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        match self.ttl {
            Some(_) => vec![(ROWS_REMOVED_BY_TTL, self.ttl_removed)],
            None => vec![],
        }
    }
}
