//! Folding a micro-batch's rows into an aggregation's groups: the rows are grouped by
//! window and key (in pieces, on several threads for large batches), late rows set
//! aside, and each group's accumulators merged into the state.

use super::*;

/// The groups of a keyless aggregation in one micro-batch: its distinct window starts
/// in first-seen order, a start's position being its group id. A micro-batch spans a
/// few windows and its rows come nearly in event-time order, so a row's start is mostly
/// the previous row's and a map holds the rest; DataFusion's general group table would
/// hash every row (Nexmark q7: 200 000 bids per micro-batch, two or three windows).
#[derive(Default)]
pub(super) struct StartGroups {
    pub(super) starts: Vec<i64>,
    ids: HashMap<i64, usize>,
    last: Option<(i64, usize)>,
}

impl StartGroups {
    /// Appends the group id of each of `starts` to `ids`.
    pub(super) fn intern(&mut self, starts: &[i64], ids: &mut Vec<usize>) {
        ids.reserve(starts.len());
        for &start in starts {
            let id = match self.last {
                Some((last, id)) if last == start => id,
                _ => {
                    let next = self.starts.len();
                    let id = *self.ids.entry(start).or_insert(next);
                    if id == next {
                        self.starts.push(start);
                    }
                    self.last = Some((start, id));
                    id
                }
            };
            ids.push(id);
        }
    }

    /// How many groups.
    pub(super) fn len(&self) -> usize {
        self.starts.len()
    }

    /// The group columns of a keyless aggregation's batch groups: the window starts and
    /// the constant key (none when there are no groups).
    pub(super) fn into_groups(self) -> Vec<ArrayRef> {
        if self.starts.is_empty() {
            return vec![];
        }
        let n = self.starts.len();
        vec![Arc::new(Int64Array::from(self.starts)), constant_key(n)]
    }
}

/// Batches smaller than twice this are grouped on one thread.
pub(super) const MIN_ROWS_PER_THREAD: usize = 32 * 1024;
/// At most this many threads group one batch.
pub(super) const MAX_THREADS: usize = 4;

/// The columns of one input batch an aggregation reads.
pub(super) struct BatchColumns {
    keys: Vec<ArrayRef>,
    args: Vec<Option<ArrayRef>>,
    times: Option<TimestampMicrosecondArray>,
    event_keys: Option<TimestampMicrosecondArray>,
}

/// Rows `offset..offset + len` of input batch `batch`.
pub(super) struct Piece {
    batch: usize,
    offset: usize,
    len: usize,
}

/// Pieces of a micro-batch, grouped and aggregated: the late rows (input batch, rows),
/// the group values (window starts, then the key columns) and the groups' accumulators,
/// flat: group `g`'s are `accs[g * n..][..n]` for `n` aggregates.
pub(super) struct BatchGroups {
    late: Vec<(usize, Vec<u32>)>,
    pub(super) groups: Vec<ArrayRef>,
    accs: Vec<Acc>,
}

impl AggregateOperator {
    /// The input columns of one batch: key columns, aggregate arguments, event times
    /// (µs; windowed aggregations) and event-time keys (µs; plain aggregations keyed by
    /// the watermarked event time).
    pub(super) fn batch_columns(&self, batch: &RecordBatch) -> Result<BatchColumns> {
        let keys = self.key_columns(batch)?;
        let args = (0..self.layout.aggregates.len())
            .map(|i| batch.column_by_name(&format!("__arg{i}")).cloned())
            .collect();
        let times = match &self.layout.window {
            Some(_) => Some(micros(
                batch
                    .column_by_name("__time")
                    .ok_or_else(|| Error::engine("no __time column"))?,
            )?),
            None => None,
        };
        let event_keys = match self.layout.event_time_key {
            Some(k) => Some(micros(&keys[k])?),
            None => None,
        };
        Ok(BatchColumns {
            keys,
            args,
            times,
            event_keys,
        })
    }

    /// Session windows: every row opens a session that merges with the overlapping ones of
    /// its key. Returns the late rows.
    pub(super) fn add_sessions(
        &mut self,
        batch: &RecordBatch,
        ctx: &OpContext,
        updated: &mut u64,
    ) -> Result<Vec<u32>> {
        let cols = self.batch_columns(batch)?;
        let rows = self
            .keys
            .convert_columns(&cols.keys)
            .map_err(Error::engine)?;
        let inputs = self.accs.prepare(&cols.args)?;
        let mut late_rows = Vec::new();
        let mut windows = Vec::new();
        for i in 0..batch.num_rows() {
            let ts = match &cols.times {
                Some(t) if t.is_null(i) => continue,
                Some(t) => t.value(i),
                None => 0,
            };
            self.windows_of(ts, &mut windows);
            let mut row_late = false;
            for &(start, end) in windows.iter() {
                if self.is_late(end, None, ctx) {
                    row_late = true;
                    continue;
                }
                let key = rows.row(i);
                let owned = key.owned();
                self.add_session(key.as_ref(), &owned, start, end, i, &inputs)?;
                *updated += 1;
            }
            if row_late {
                late_rows.push(i as u32);
            }
        }
        Ok(late_rows)
    }

    /// Tumbling, sliding and plain aggregation of a micro-batch. The rows are first
    /// grouped by (window start, key) with DataFusion's vectorised group tables and
    /// aggregated per group of the micro-batch; then each such group is folded into the
    /// state. That is one state lookup per group of the micro-batch instead of one per
    /// row. A large micro-batch is split into contiguous row ranges grouped on their own
    /// threads; the ranges are folded in in order, so `first`/`last` keep the row order.
    /// Returns the late rows (input batch, rows).
    pub(super) fn add_grouped(
        &mut self,
        input: &[RecordBatch],
        ctx: &OpContext,
        updated: &mut u64,
    ) -> Result<Vec<(usize, Vec<u32>)>> {
        let cols = input
            .iter()
            .map(|b| self.batch_columns(b))
            .collect::<Result<Vec<_>>>()?;
        let total: usize = input.iter().map(RecordBatch::num_rows).sum();
        if total == 0 {
            return Ok(vec![]);
        }
        let threads = if total >= 2 * MIN_ROWS_PER_THREAD {
            std::thread::available_parallelism()
                .map_or(1, |p| p.get())
                .min(total / MIN_ROWS_PER_THREAD)
                .min(MAX_THREADS)
        } else {
            1
        };
        // Contiguous pieces (batch, offset, length) of about `total / threads` rows each.
        let share = total.div_ceil(threads);
        let mut parts: Vec<Vec<Piece>> = vec![Vec::new()];
        let mut filled = 0;
        for (b, batch) in input.iter().enumerate() {
            let mut offset = 0;
            while offset < batch.num_rows() {
                if filled == share {
                    parts.push(Vec::new());
                    filled = 0;
                }
                let len = (batch.num_rows() - offset).min(share - filled);
                parts.last_mut().expect("one part").push(Piece {
                    batch: b,
                    offset,
                    len,
                });
                offset += len;
                filled += len;
            }
        }
        let this = &*self;
        let cols = &cols;
        let grouped: Vec<Result<BatchGroups>> = if parts.len() == 1 {
            vec![this.group_pieces(cols, &parts[0], ctx)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = parts[1..]
                    .iter()
                    .map(|p| scope.spawn(move || this.group_pieces(cols, p, ctx)))
                    .collect();
                let mut all = vec![this.group_pieces(cols, &parts[0], ctx)];
                for h in handles {
                    all.push(h.join().unwrap_or_else(|_| {
                        Err(Error::engine("a worker thread of the aggregation panicked"))
                    }));
                }
                all
            })
        };
        let grouped = grouped.into_iter().collect::<Result<Vec<_>>>()?;
        if self.stored.is_some() {
            self.load_batch_groups(&grouped)?;
        }
        let mut late: Vec<(usize, Vec<u32>)> = Vec::new();
        for g in grouped {
            for (b, rows) in g.late {
                match late.last_mut() {
                    Some((last, acc)) if *last == b => acc.extend(rows),
                    _ => late.push((b, rows)),
                }
            }
            self.fold_in(g.groups, g.accs, ctx.processing_time_ms, updated)?;
        }
        Ok(late)
    }

    /// Groups the rows of some pieces of a micro-batch by (window start, key) and
    /// aggregates each group.
    pub(super) fn group_pieces(
        &self,
        cols: &[BatchColumns],
        pieces: &[Piece],
        ctx: &OpContext,
    ) -> Result<BatchGroups> {
        let df = |e: datafusion::error::DataFusionError| Error::engine(e);
        let cut = self.late_cutoff(ctx);
        let sliding = matches!(self.geometry(), Some(Geometry::Sliding(..)));
        let mut table: Option<Box<dyn GroupValues>> = None;
        // Without keys, the window start alone is the group.
        let keyless = self.layout.keys.is_empty();
        let mut windows = StartGroups::default();
        let mut accs: Vec<Acc> = Vec::new();
        let width = self.layout.aggregates.len();
        let mut late: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut ids = Vec::new();
        let mut key_types: Vec<DataType> = Vec::new();
        for piece in pieces {
            let (offset, len) = (piece.offset, piece.len);
            let c = &cols[piece.batch];
            let times = c.times.as_ref().map(|t| t.slice(offset, len));
            let event_keys = c.event_keys.as_ref().map(|t| t.slice(offset, len));
            // Which rows go to which window, and which are late.
            let mut rows: Vec<u32> = Vec::with_capacity(len);
            let mut starts: Vec<i64> = Vec::with_capacity(len);
            let mut late_rows: Vec<u32> = Vec::new();
            self.assign_windows(
                times.as_ref(),
                event_keys.as_ref(),
                cut,
                (offset, len),
                &mut rows,
                &mut starts,
                &mut late_rows,
            );
            if !late_rows.is_empty() {
                late.push((piece.batch, late_rows));
            }
            if rows.is_empty() {
                continue;
            }
            // With at most one window per row and none left out, the rows are the piece.
            let identity = rows.len() == len && !sliding;
            let index = UInt32Array::from(rows);
            let pick = |a: &ArrayRef| -> Result<ArrayRef> {
                let a = a.slice(offset, len);
                if identity {
                    Ok(a)
                } else {
                    take(&a, &index, None).map_err(Error::engine)
                }
            };
            let args = c
                .args
                .iter()
                .map(|a| a.as_ref().map(&pick).transpose())
                .collect::<Result<Vec<_>>>()?;
            let inputs = self.accs.prepare(&args)?;
            ids.clear();
            let group_count = if keyless {
                windows.intern(&starts, &mut ids);
                windows.len()
            } else {
                let mut group_cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(starts))];
                for k in &c.keys {
                    group_cols.push(pick(k)?);
                }
                let table = match &mut table {
                    Some(t) => t,
                    None => {
                        key_types = group_cols.iter().map(|c| c.data_type().clone()).collect();
                        let schema = Arc::new(Schema::new(
                            key_types
                                .iter()
                                .enumerate()
                                .map(|(i, t)| Field::new(format!("g{i}"), t.clone(), true))
                                .collect::<Vec<_>>(),
                        ));
                        table.insert(new_group_values(schema, &GroupOrdering::None).map_err(df)?)
                    }
                };
                table.intern(&group_cols, &mut ids).map_err(df)?;
                table.len()
            };
            while accs.len() < group_count * width {
                self.accs.init_into(&mut accs);
            }
            self.accs.update_groups(&mut accs, &ids, &inputs)?;
        }
        if keyless {
            let groups = windows.into_groups();
            return Ok(BatchGroups { late, groups, accs });
        }
        let Some(mut table) = table else {
            return Ok(BatchGroups {
                late,
                groups: vec![],
                accs,
            });
        };
        let mut groups = table.emit(EmitTo::All).map_err(df)?;
        // Group tables may hand back an equivalent type (a dictionary's values): the
        // state encodes keys with the input's types.
        for (g, t) in groups.iter_mut().zip(&key_types) {
            if g.data_type() != t {
                *g = cast(g, t).map_err(Error::engine)?;
            }
        }
        Ok(BatchGroups { late, groups, accs })
    }

    /// Assigns the rows of a piece (`times` and `event_keys` sliced to it, starting at
    /// `offset` of its input batch, `len` rows) to their windows: each (row, window) that is not late
    /// goes to `rows`/`starts`, each row with a late window to `late_rows` (by its index in
    /// the input batch). Rows with a null event time belong to no window.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assign_windows(
        &self,
        times: Option<&TimestampMicrosecondArray>,
        event_keys: Option<&TimestampMicrosecondArray>,
        cut: Option<i64>,
        (offset, len): (usize, usize),
        rows: &mut Vec<u32>,
        starts: &mut Vec<i64>,
        late_rows: &mut Vec<u32>,
    ) {
        if let (Some(Geometry::Tumbling(size)), Some(t)) = (self.geometry(), times) {
            // One window per row, the common case: no per-row window list.
            let has_nulls = t.null_count() > 0;
            for (i, &ts) in t.values().iter().enumerate() {
                if has_nulls && t.is_null(i) {
                    continue;
                }
                let start = ts.div_euclid(size) * size;
                if cut.is_some_and(|wm| start + size <= wm) {
                    late_rows.push((offset + i) as u32);
                } else {
                    rows.push(i as u32);
                    starts.push(start);
                }
            }
            return;
        }
        let windowed = self.layout.window.is_some();
        let mut windows = Vec::new();
        for i in 0..len {
            let ts = match times {
                Some(t) if t.is_null(i) => continue,
                Some(t) => t.value(i),
                None => 0,
            };
            self.windows_of(ts, &mut windows);
            let event_key = event_keys.and_then(|e| e.is_valid(i).then(|| e.value(i)));
            let mut row_late = false;
            for &(start, end) in windows.iter() {
                if late_for(cut, windowed, end, event_key) {
                    row_late = true;
                } else {
                    rows.push(i as u32);
                    starts.push(start);
                }
            }
            if row_late {
                late_rows.push((offset + i) as u32);
            }
        }
    }

    /// Folds the groups of a batch (`groups` = [window starts, key columns...], their
    /// accumulators flat as in [`BatchGroups`]) into the state.
    pub(super) fn fold_in(
        &mut self,
        groups: Vec<ArrayRef>,
        mut accs: Vec<Acc>,
        now_ms: i64,
        updated: &mut u64,
    ) -> Result<()> {
        if groups.is_empty() || groups[0].is_empty() {
            return Ok(());
        }
        let width = self.layout.aggregates.len();
        let starts = groups[0]
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| Error::engine("window starts are not 64-bit integers"))?
            .clone();
        let keys = &groups[1..];
        let rows = self.keys.convert_columns(keys).map_err(Error::engine)?;
        let event_keys = match self.layout.event_time_key {
            Some(k) => Some(micros(&keys[k])?),
            None => None,
        };
        let size = match self.geometry() {
            Some(Geometry::Tumbling(size) | Geometry::Sliding(size, _)) => size,
            _ => 0,
        };
        let windowed = self.layout.window.is_some();
        let merger = &self.accs;
        for g in 0..starts.len() {
            let start = starts.value(g);
            let event_key = event_keys
                .as_ref()
                .and_then(|e| e.is_valid(g).then(|| e.value(g)));
            let newly = self.store.fold(
                &self.keys,
                start,
                if windowed { start + size } else { 0 },
                rows.row(g),
                &mut accs[g * width..(g + 1) * width],
                event_key,
                now_ms,
                |state, batch| merger.merge(state, batch),
            )?;
            *updated += u64::from(newly);
        }
        Ok(())
    }

    pub(super) fn add_session(
        &mut self,
        key: &[u8],
        owned: &OwnedRow,
        start: i64,
        end: i64,
        row: usize,
        inputs: &[crate::streaming::accumulators::AggInput],
    ) -> Result<()> {
        let now_ms = self.now_ms;
        let list = self.sessions.entry(key.to_vec()).or_default();
        // Sessions that overlap or touch [start, end) merge with it.
        let mut merged = Group {
            start,
            end,
            key: owned.clone(),
            event_key: None,
            accs: self.accs.init(),
            updated: true,
            updated_ms: Some(now_ms),
        };
        self.accs.update(&mut merged.accs, inputs, row)?;
        let mut keep = Vec::with_capacity(list.len() + 1);
        let mut parts: Vec<Group> = Vec::new();
        for g in list.drain(..) {
            if g.start <= merged.end && merged.start <= g.end {
                parts.push(g);
            } else {
                keep.push(g);
            }
        }
        parts.push(merged);
        parts.sort_by_key(|g| (g.start, g.end));
        let mut it = parts.into_iter();
        let mut acc = it.next().expect("at least the new session");
        for mut g in it {
            acc.start = acc.start.min(g.start);
            acc.end = acc.end.max(g.end);
            self.accs.merge(&mut acc.accs, &mut g.accs)?;
        }
        acc.updated = true;
        acc.updated_ms = Some(now_ms);
        keep.push(acc);
        keep.sort_by_key(|g| g.start);
        *list = keep;
        Ok(())
    }
}
