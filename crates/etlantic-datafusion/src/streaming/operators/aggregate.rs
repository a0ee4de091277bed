//! Window (tumbling, sliding, session) and plain group-by aggregation with state: the
//! groups live in a [`GroupStore`] by window; each micro-batch's rows are folded in
//! ([`input`]), then windows the watermark closed are emitted and evicted.

mod input;
mod stored;
mod stored_sessions;
#[cfg(test)]
mod tests;

use stored::StoredGroups;

use super::*;

/// The geometry of a window in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Geometry {
    /// Tumbling windows of this size.
    Tumbling(i64),
    /// Sliding windows (size, slide).
    Sliding(i64, i64),
    /// Sessions with this gap.
    Session(i64),
}

/// Where the columns of an aggregation's prepared input are.
#[derive(Clone, Debug)]
pub struct AggregateLayout {
    /// Group key fields (in the prepared input and in the output).
    pub keys: Vec<Field>,
    /// Aggregates; argument `i` is the prepared column `__arg{i}`.
    pub aggregates: Vec<AggSpec>,
    /// The window, with the type of the time column (prepared column `__time`).
    pub window: Option<(Geometry, DataType)>,
    /// For a plain aggregation: the key that is the watermarked event time.
    pub event_time_key: Option<usize>,
}

struct Group {
    start: i64,
    end: i64,
    key: OwnedRow,
    /// For plain aggregations keyed by the watermarked event time: its value (µs).
    event_key: Option<i64>,
    accs: Vec<Acc>,
    updated: bool,
    /// Processing time of its last update (epoch ms); `None` when restored from a
    /// checkpoint that did not record it.
    updated_ms: Option<i64>,
}

/// The key column of an aggregation without keys: one constant value per row.
fn constant_key(rows: usize) -> ArrayRef {
    Arc::new(BooleanArray::new(
        arrow::buffer::BooleanBuffer::new_set(rows),
        None,
    ))
}

/// Whether a row is late: its window ends at or before the cutoff (windowed), or its
/// event-time key is at or before it (plain aggregation keyed by the event time).
fn late_for(cutoff: Option<i64>, windowed: bool, end: i64, event_key: Option<i64>) -> bool {
    match cutoff {
        None => false,
        Some(wm) if windowed => end <= wm,
        Some(wm) => event_key.is_some_and(|k| k <= wm),
    }
}

/// Window and plain group-by aggregation.
pub struct AggregateOperator {
    layout: AggregateLayout,
    accs: Accumulators,
    /// Encodes the key columns (or a constant column for a global aggregation).
    keys: RowConverter,
    schema: SchemaRef,
    /// Tumbling, sliding and plain aggregation: the groups in buckets by window.
    store: GroupStore,
    /// Session windows: key bytes → sessions sorted by start, never overlapping.
    sessions: HashMap<Vec<u8>, Vec<Group>>,
    metrics: StateMetrics,
    /// Groups not updated for this long (processing time) are evicted.
    ttl: Option<StateTtl>,
    /// Groups evicted by the TTL in the last micro-batch.
    ttl_removed: u64,
    /// The processing time of the micro-batch being processed (epoch ms).
    now_ms: i64,
    /// The groups, when a state store holds them (`store` then holds only those a
    /// micro-batch touches, while it runs).
    stored: Option<StoredGroups>,
}

fn key_fields(layout: &AggregateLayout) -> Vec<Field> {
    if layout.keys.is_empty() {
        vec![Field::new("__global", DataType::Boolean, true)]
    } else {
        layout.keys.clone()
    }
}

impl AggregateOperator {
    /// A new operator with empty state.
    pub fn new(layout: AggregateLayout) -> Result<Self> {
        let keys = RowConverter::new(
            key_fields(&layout)
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(Error::engine)?;
        let accs = Accumulators::new(layout.aggregates.clone())?;
        let mut fields = Vec::new();
        if let Some((_, t)) = &layout.window {
            fields.push(Field::new("window_start", t.clone(), false));
            fields.push(Field::new("window_end", t.clone(), false));
        }
        fields.extend(layout.keys.iter().cloned());
        fields.extend(layout.aggregates.iter().map(AggSpec::output_field));
        let store = GroupStore::new(layout.aggregates.len());
        Ok(AggregateOperator {
            schema: Arc::new(Schema::new(fields)),
            layout,
            accs,
            keys,
            store,
            sessions: HashMap::default(),
            metrics: StateMetrics::default(),
            ttl: None,
            ttl_removed: 0,
            now_ms: 0,
            stored: None,
        })
    }

    fn geometry(&self) -> Option<Geometry> {
        self.layout.window.as_ref().map(|(g, _)| *g)
    }

    fn key_columns(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        if self.layout.keys.is_empty() {
            return Ok(vec![constant_key(batch.num_rows())]);
        }
        self.layout
            .keys
            .iter()
            .map(|f| {
                batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                    Error::engine(format!(
                        "the aggregation input has no key column `{}`",
                        f.name()
                    ))
                })
            })
            .collect()
    }

    fn emit(&self, groups: &[GroupRef<'_>]) -> Result<RecordBatch> {
        let mut cols: Vec<ArrayRef> = Vec::new();
        if let Some((_, t)) = &self.layout.window {
            let tz = match t {
                DataType::Timestamp(_, tz) => tz.clone(),
                _ => None,
            };
            let starts =
                TimestampMicrosecondArray::from(groups.iter().map(|g| g.start).collect::<Vec<_>>())
                    .with_timezone_opt(tz.clone());
            let ends =
                TimestampMicrosecondArray::from(groups.iter().map(|g| g.end).collect::<Vec<_>>())
                    .with_timezone_opt(tz);
            cols.push(cast(&(Arc::new(starts) as ArrayRef), t).map_err(Error::engine)?);
            cols.push(cast(&(Arc::new(ends) as ArrayRef), t).map_err(Error::engine)?);
        }
        if !self.layout.keys.is_empty() {
            cols.extend(
                self.keys
                    .convert_rows(groups.iter().map(|g| g.key))
                    .map_err(Error::engine)?,
            );
        }
        cols.extend(self.accs.finish(groups.iter().map(|g| g.accs))?);
        RecordBatch::try_new(self.schema.clone(), cols).map_err(Error::engine)
    }

    fn windows_of(&self, ts: i64, out: &mut Vec<(i64, i64)>) {
        out.clear();
        match self.geometry() {
            Some(Geometry::Tumbling(size)) => {
                let start = ts.div_euclid(size) * size;
                out.push((start, start + size));
            }
            Some(Geometry::Sliding(size, slide)) => {
                let mut start = ts.div_euclid(slide) * slide;
                while start + size > ts {
                    out.push((start, start + size));
                    start -= slide;
                }
                out.reverse();
            }
            Some(Geometry::Session(gap)) => out.push((ts, ts + gap)),
            None => out.push((0, 0)),
        }
    }

    fn is_late(&self, end: i64, event_key: Option<i64>, ctx: &OpContext) -> bool {
        late_for(
            self.late_cutoff(ctx),
            self.layout.window.is_some(),
            end,
            event_key,
        )
    }

    /// The watermark late rows are judged against, or `None` when no row is late.
    fn late_cutoff(&self, ctx: &OpContext) -> Option<i64> {
        if !ctx.has_watermark || ctx.accept_late {
            return None;
        }
        // Spark filters late rows of a complete-mode aggregation only for session windows
        // (in the session restore step); tumbling, sliding and plain aggregations keep
        // them, as complete mode keeps every group anyway.
        if ctx.output_mode == OutputMode::Complete
            && !matches!(self.geometry(), Some(Geometry::Session(_)))
        {
            return None;
        }
        Some(ctx.late_watermark_us)
    }
}

impl StatefulOperator for AggregateOperator {
    fn name(&self) -> &'static str {
        if matches!(self.geometry(), Some(Geometry::Session(_))) {
            "sessionWindowStateStoreSaveExec"
        } else {
            "stateStoreSave"
        }
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn process(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<OpOutput> {
        let mut out = OpOutput::default();
        let mut late_batches = Vec::new();
        let mut updated = 0u64;
        let now_ms = ctx.processing_time_ms;
        self.now_ms = now_ms;
        let session = matches!(self.geometry(), Some(Geometry::Session(_)));
        // On a state store, the groups this micro-batch can touch come into memory.
        if session {
            self.load_sessions(input, ctx)?;
        } else {
            self.load_expiring(now_ms)?;
        }
        // Groups whose TTL ran out are gone before the input is applied.
        let expired = self.expire_ttl(now_ms);
        self.ttl_removed = expired.0;
        let late = if session {
            let mut late = Vec::new();
            for (b, batch) in input.iter().enumerate().filter(|(_, b)| b.num_rows() > 0) {
                late.push((b, self.add_sessions(batch, ctx, &mut updated)?));
            }
            late
        } else {
            self.add_grouped(input, ctx, &mut updated)?
        };
        for (batch_index, late_rows) in late {
            let batch = &input[batch_index];
            if !late_rows.is_empty() {
                out.late_count += late_rows.len() as u64;
                out.late_index.push((batch_index, late_rows.clone()));
                let idx = UInt32Array::from(late_rows);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &idx, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(Error::engine)?;
                late_batches
                    .push(RecordBatch::try_new(batch.schema(), cols).map_err(Error::engine)?);
            }
        }
        if !late_batches.is_empty() {
            out.late = Some(
                arrow::compute::concat_batches(&late_batches[0].schema(), &late_batches)
                    .map_err(Error::engine)?,
            );
        }

        // Emit and evict.
        if !session {
            self.load_for_output(ctx)?;
        }
        let mut removed = Vec::new();
        let evicted = match ctx.output_mode {
            OutputMode::Complete => {
                let batch = self.emit(&self.all_groups())?;
                out.rows.push(batch);
                0
            }
            OutputMode::Update => {
                let changed: Vec<GroupRef<'_>> = if session {
                    self.session_groups()
                        .filter(|(_, u)| *u)
                        .map(|(g, _)| g)
                        .collect()
                } else {
                    self.store.updated().collect()
                };
                let batch = self.emit(&changed)?;
                out.rows.push(batch);
                let evicted = self.evict(ctx, session);
                let n = evicted.len();
                removed.push(evicted);
                n
            }
            OutputMode::Append => {
                let evicted = self.evict(ctx, session);
                let mut refs: Vec<GroupRef<'_>> = Vec::with_capacity(evicted.len());
                refs.extend(evicted.groups());
                out.rows.push(self.emit(&refs)?);
                let n = refs.len();
                drop(refs);
                removed.push(evicted);
                n
            }
        };
        if self.stored.is_some() && session {
            self.write_back_sessions()?;
        } else if self.stored.is_some() {
            removed.push(Evicted::Windows(expired.1, self.store.width()));
            let gone: Vec<stored::Removed> = removed
                .iter()
                .flat_map(Evicted::groups)
                .map(|g| stored::Removed {
                    start: g.start,
                    key: g.key.as_ref().to_vec(),
                    event_key: g.event_key,
                })
                .collect();
            self.write_back(&gone, ctx)?;
        }
        self.store.clear_updated();
        for list in self.sessions.values_mut() {
            for g in list.iter_mut() {
                g.updated = false;
            }
        }
        let after = match &self.stored {
            Some(stored) => stored.count()?,
            None => self.state_rows(),
        };
        self.metrics = StateMetrics {
            rows_total: after,
            rows_updated: updated,
            rows_removed: evicted as u64 + self.ttl_removed,
            memory_bytes: match &self.stored {
                Some(stored) => stored.store.memory_bytes(),
                None => self.memory_bytes(),
            },
        };
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        if self.stored.is_some() && matches!(self.geometry(), Some(Geometry::Session(_))) {
            let all = self.stored_sessions()?;
            let groups: Vec<GroupRef<'_>> = all.iter().map(Group::as_ref).collect();
            return self.snapshot_of(&groups);
        }
        if let Some(stored) = &self.stored {
            let all = self.stored_groups(stored)?;
            let groups: Vec<GroupRef<'_>> = all.groups().collect();
            return self.snapshot_of(&groups);
        }
        self.snapshot_of(&self.all_groups())
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        self.restore_in_memory(state)?;
        if self.stored.is_some() {
            self.replace_stored()?;
        }
        Ok(())
    }

    fn use_store(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        self.store.clear();
        self.sessions.clear();
        self.stored = Some(StoredGroups::new(store));
        Ok(())
    }

    fn store(&mut self) -> Option<&mut dyn StateStore> {
        self.stored
            .as_mut()
            .map(|s| s.store.as_mut() as &mut dyn StateStore)
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    /// Complete mode never evicts or emits on a watermark advance alone.
    fn needs_no_data_batch(&self, mode: OutputMode) -> bool {
        mode != OutputMode::Complete
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

impl AggregateOperator {
    /// The snapshot of `groups` (see [`StatefulOperator::snapshot`]).
    fn snapshot_of(&self, groups: &[GroupRef<'_>]) -> Result<RecordBatch> {
        let mut fields = vec![
            Field::new("__start", DataType::Int64, false),
            Field::new("__end", DataType::Int64, false),
            Field::new("__event_key", DataType::Int64, true),
            Field::new(UPDATED_COLUMN, DataType::Int64, true),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(
                groups.iter().map(|g| g.start).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                groups.iter().map(|g| g.end).collect::<Vec<_>>(),
            )),
            Arc::new(groups.iter().map(|g| g.event_key).collect::<Int64Array>()),
            Arc::new(groups.iter().map(|g| g.updated_ms).collect::<Int64Array>()),
        ];
        let key_fields = key_fields(&self.layout);
        let key_cols = self
            .keys
            .convert_rows(groups.iter().map(|g| g.key))
            .map_err(Error::engine)?;
        for (f, c) in key_fields.iter().zip(key_cols) {
            fields.push(Field::new(
                format!("__key_{}", f.name()),
                c.data_type().clone(),
                true,
            ));
            cols.push(c);
        }
        for (f, c) in self.accs.state_columns(groups.iter().map(|g| g.accs))? {
            fields.push(f);
            cols.push(c);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::engine)
    }

    /// Replaces the in-memory groups with a snapshot.
    fn restore_in_memory(&mut self, state: &RecordBatch) -> Result<()> {
        const OP: &str = "aggregation";
        let col = |name: &str| {
            state
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| corrupt_state(OP, format!("no column `{name}`")))
        };
        let starts: Int64Array = state_column(state, "__start", OP)?;
        let ends: Int64Array = state_column(state, "__end", OP)?;
        let ek: Int64Array = state_column(state, "__event_key", OP)?;
        // Checkpoints written before TTL existed have no update times.
        let updated_ms: Option<Int64Array> = match state.column_by_name(UPDATED_COLUMN) {
            Some(_) => Some(state_column(state, UPDATED_COLUMN, OP)?),
            None => None,
        };
        let key_cols: Vec<ArrayRef> = key_fields(&self.layout)
            .iter()
            .map(|f| col(&format!("__key_{}", f.name())))
            .collect::<Result<_>>()?;
        let rows = self
            .keys
            .convert_columns(&key_cols)
            .map_err(|e| corrupt_state(OP, format!("group keys: {e}")))?;
        let accs = self.accs.restore(state)?;
        self.store.clear();
        self.sessions.clear();
        let session = matches!(self.geometry(), Some(Geometry::Session(_)));
        for (i, a) in accs.into_iter().enumerate() {
            let event_key = ek.is_valid(i).then(|| ek.value(i));
            let updated_ms = updated_ms
                .as_ref()
                .and_then(|u| u.is_valid(i).then(|| u.value(i)));
            if session {
                let g = Group {
                    start: starts.value(i),
                    end: ends.value(i),
                    key: rows.row(i).owned(),
                    event_key,
                    accs: a,
                    updated: false,
                    updated_ms,
                };
                self.sessions
                    .entry(rows.row(i).as_ref().to_vec())
                    .or_default()
                    .push(g);
            } else {
                let group = GroupRef {
                    start: starts.value(i),
                    end: ends.value(i),
                    key: rows.row(i),
                    accs: &[],
                    event_key,
                    updated_ms,
                };
                self.store.restore(&self.keys, group, a);
            }
        }
        for list in self.sessions.values_mut() {
            list.sort_by_key(|g| g.start);
        }
        Ok(())
    }
}

/// Groups taken out of the state by an eviction: whole windows of the store, or
/// sessions.
enum Evicted {
    Windows(Vec<(i64, Bucket)>, usize),
    Sessions(Vec<Group>),
}

impl Evicted {
    fn groups(&self) -> Box<dyn Iterator<Item = GroupRef<'_>> + '_> {
        match self {
            Evicted::Windows(buckets, width) => Box::new(GroupStore::groups_of(buckets, *width)),
            Evicted::Sessions(list) => Box::new(list.iter().map(Group::as_ref)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Evicted::Windows(buckets, _) => buckets.iter().map(|(_, b)| b.len()).sum(),
            Evicted::Sessions(list) => list.len(),
        }
    }
}

impl Group {
    fn as_ref(&self) -> GroupRef<'_> {
        GroupRef {
            start: self.start,
            end: self.end,
            key: self.key.row(),
            accs: &self.accs,
            event_key: self.event_key,
            updated_ms: self.updated_ms,
        }
    }
}

impl AggregateOperator {
    /// The sessions, sorted by key and start, with their update flags.
    fn session_groups(&self) -> impl Iterator<Item = (GroupRef<'_>, bool)> + '_ {
        let mut v: Vec<&Group> = self.sessions.values().flatten().collect();
        v.sort_by(|a, b| (a.key.row(), a.start).cmp(&(b.key.row(), b.start)));
        v.into_iter().map(|g| (g.as_ref(), g.updated))
    }

    fn all_groups(&self) -> Vec<GroupRef<'_>> {
        // Sized up front: the groups come bucket by bucket, with no size hint, and a
        // snapshot of every micro-batch would otherwise regrow (and copy) the list.
        let mut all = Vec::with_capacity(self.state_rows() as usize);
        if matches!(self.geometry(), Some(Geometry::Session(_))) {
            all.extend(self.session_groups().map(|(g, _)| g));
        } else {
            all.extend(self.store.groups());
        }
        all
    }

    fn state_rows(&self) -> u64 {
        (self.store.len() + self.sessions.values().map(Vec::len).sum::<usize>()) as u64
    }

    /// Evicts the groups whose TTL ran out at `now_ms`; returns how many, and those of
    /// the window store.
    fn expire_ttl(&mut self, now_ms: i64) -> (u64, Vec<(i64, Bucket)>) {
        let Some(ttl) = self.ttl else {
            return (0, Vec::new());
        };
        let mut removed = 0u64;
        for list in self.sessions.values_mut() {
            let before = list.len();
            list.retain(|g| !ttl.expired(g.updated_ms, now_ms));
            removed += (before - list.len()) as u64;
        }
        self.sessions.retain(|_, l| !l.is_empty());
        let gone = self
            .store
            .remove_where(&self.keys, |g| ttl.expired(g.updated_ms, now_ms));
        removed += gone.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        (removed, gone)
    }

    fn memory_bytes(&self) -> u64 {
        let per_group =
            |g: &Group| 72 + g.key.row().as_ref().len() as u64 + 24 * g.accs.len() as u64;
        self.store.memory_bytes() + self.sessions.values().flatten().map(per_group).sum::<u64>()
    }

    /// Takes the closed groups (by the eviction watermark) out of the state.
    fn evict(&mut self, ctx: &OpContext, session: bool) -> Evicted {
        let width = self.store.width();
        if !ctx.has_watermark {
            return Evicted::Windows(Vec::new(), width);
        }
        let wm = ctx.evict_watermark_us;
        if session {
            let mut out = Vec::new();
            for list in self.sessions.values_mut() {
                let (closed, open): (Vec<Group>, Vec<Group>) =
                    list.drain(..).partition(|g| g.end <= wm);
                out.extend(closed);
                *list = open;
            }
            self.sessions.retain(|_, l| !l.is_empty());
            return Evicted::Sessions(out);
        }
        let buckets = if self.layout.window.is_some() {
            // A window closes once the watermark reaches its end: whole buckets go.
            self.store.close_windows(wm)
        } else if self.layout.event_time_key.is_some() {
            // A plain aggregation keyed by the event time: group by group.
            self.store
                .remove_where(&self.keys, |g| g.event_key.is_some_and(|k| k <= wm))
        } else {
            Vec::new()
        };
        Evicted::Windows(buckets, width)
    }
}
