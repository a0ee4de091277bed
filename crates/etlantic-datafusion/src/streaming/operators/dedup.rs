//! Deduplication with state: Spark's `dropDuplicates` (keys, with the watermark) and
//! `dropDuplicatesWithinWatermark`.
//!
//! The state is every key seen (the watermark or the TTL forgets keys). It keeps a
//! changelog: a micro-batch's state write holds the keys it added and removed, not the
//! whole state, so the checkpoint cost of a dedup over ever more keys follows the keys
//! that arrive, not those held (a whole snapshot is written now and then, in the
//! background, see `etlantic_runtime::checkpoint`).
//!
//! Given a state store ([`StatefulOperator::use_store`]), the keys live there instead
//! (see [`super::dedup_store`]): a micro-batch reads only the keys of its rows, in one
//! pass, and writes those it adds.

use super::dedup_store::StoredKeys;
use super::*;
use arrow::array::BinaryArray;
use etlantic_runtime::checkpoint::{changes_batch, removed_rows};

/// What the state keeps of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Seen {
    /// Event time (µs) of the first occurrence, or its expiry in within-watermark mode;
    /// `None` when the key carries no event time.
    pub(super) value: Option<i64>,
    /// Processing time (epoch ms) it was first seen, for the TTL.
    pub(super) first_seen_ms: Option<i64>,
}

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
    /// Row-encoded key → what is kept of it. One map, the key stored once. Empty when
    /// the keys are in a store (`stored`).
    seen: HashMap<Box<[u8]>, Seen>,
    /// The keys, when a state store holds them.
    stored: Option<StoredKeys>,
    /// Keys added since the last [`StatefulOperator::changes`] (some may have left
    /// again: they are then in `gone` too).
    added: Vec<Box<[u8]>>,
    /// Keys that left since the last [`StatefulOperator::changes`].
    gone: Vec<Box<[u8]>>,
    /// Keys are forgotten this long (processing time) after they were first seen.
    ttl: Option<StateTtl>,
    /// Keys forgotten by the TTL in the last micro-batch.
    ttl_removed: u64,
    metrics: StateMetrics,
}

/// The column of a snapshot holding the row-encoded key (its identity in the changelog).
const KEY: &str = "__key";
/// The column of a snapshot holding [`Seen::value`].
const VALUE: &str = "__value";

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
            stored: None,
            added: Vec::new(),
            gone: Vec::new(),
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

    /// The layout of a snapshot (and of the changelog's rows).
    fn snapshot_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(KEY, DataType::Binary, true),
            Field::new(VALUE, DataType::Int64, true),
            Field::new(UPDATED_COLUMN, DataType::Int64, true),
        ]))
    }

    /// State rows for `entries`, in the snapshot's layout.
    fn state_rows<'a>(
        entries: impl ExactSizeIterator<Item = (&'a [u8], Seen)> + Clone,
    ) -> Result<RecordBatch> {
        let keys = BinaryArray::from_iter_values(entries.clone().map(|(k, _)| k));
        let values: Int64Array = entries.clone().map(|(_, s)| s.value).collect();
        let first_seen: Int64Array = entries.map(|(_, s)| s.first_seen_ms).collect();
        RecordBatch::try_new(
            Self::snapshot_schema(),
            vec![Arc::new(keys), Arc::new(values), Arc::new(first_seen)],
        )
        .map_err(Error::engine)
    }

    /// Keys held now.
    fn held(&self) -> Result<u64> {
        match &self.stored {
            Some(stored) => stored.count(),
            None => Ok(self.seen.len() as u64),
        }
    }

    /// Forgets the keys `drop` selects, noting them for the changelog; returns how many.
    fn forget(&mut self, mut drop: impl FnMut(&Seen) -> bool) -> u64 {
        let before = self.seen.len();
        let gone = &mut self.gone;
        self.seen.retain(|k, s| {
            let keep = !drop(s);
            if !keep {
                gone.push(k.clone());
            }
            keep
        });
        (before - self.seen.len()) as u64
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
        let now_ms = ctx.processing_time_ms;
        let name = self.name();
        // Keys whose TTL ran out are forgotten before the input is checked.
        self.ttl_removed = match self.ttl {
            None => 0,
            Some(ttl) => match self.stored.as_mut() {
                Some(stored) => stored.forget_by_ttl(now_ms.saturating_sub(ttl.millis()), name)?,
                None => self.forget(|s| ttl.expired(s.first_seen_ms, now_ms)),
            },
        };
        let held_before = self.held()?;
        // Keys a store does not hold yet that this micro-batch adds, in arrival order.
        let mut added: Vec<(Box<[u8]>, Seen)> = Vec::new();
        let mut added_keys: std::collections::HashSet<Box<[u8]>, foldhash::fast::RandomState> =
            Default::default();
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
            let mut keep = vec![false; batch.num_rows()];
            let mut late = Vec::new();
            // Rows on time, with the value their key would keep.
            let mut on_time: Vec<(usize, Option<i64>)> = Vec::with_capacity(batch.num_rows());
            for i in 0..batch.num_rows() {
                let ts = times
                    .as_ref()
                    .and_then(|t| t.is_valid(i).then(|| t.value(i)));
                if let Some(ts) = ts {
                    if !ctx.accept_late && ts <= ctx.late_watermark_us {
                        late.push(i as u32);
                        continue;
                    }
                }
                let value = match self.within_delay_us {
                    Some(d) => ts.map(|t| t + d),
                    None => ts,
                };
                on_time.push((i, value));
            }
            let first_seen_ms = Some(now_ms);
            match self.stored.as_ref() {
                None => {
                    for (i, value) in on_time {
                        let key = rows.row(i).data();
                        if self.seen.contains_key(key) {
                            continue;
                        }
                        let key: Box<[u8]> = key.into();
                        self.added.push(key.clone());
                        self.seen.insert(
                            key,
                            Seen {
                                value,
                                first_seen_ms,
                            },
                        );
                        keep[i] = true;
                    }
                }
                Some(stored) => {
                    // The store is asked once for the distinct keys of the batch that
                    // this micro-batch has not added already.
                    let mut asked: std::collections::HashSet<&[u8], foldhash::fast::RandomState> =
                        Default::default();
                    let lookup: Vec<&[u8]> = on_time
                        .iter()
                        .map(|(i, _)| rows.row(*i).data())
                        .filter(|k| !added_keys.contains(*k) && asked.insert(*k))
                        .collect();
                    let held = stored.held(&lookup)?;
                    let held: std::collections::HashSet<&[u8], foldhash::fast::RandomState> =
                        lookup
                            .iter()
                            .zip(held)
                            .filter_map(|(k, h)| h.then_some(*k))
                            .collect();
                    for (i, value) in on_time {
                        let key = rows.row(i).data();
                        if held.contains(key) || added_keys.contains(key) {
                            continue;
                        }
                        added_keys.insert(key.into());
                        added.push((
                            key.into(),
                            Seen {
                                value,
                                first_seen_ms,
                            },
                        ));
                        keep[i] = true;
                    }
                }
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
        let updated = match self.stored.as_mut() {
            Some(stored) => {
                stored.add(&added, held_before + added.len() as u64)?;
                added.len() as u64
            }
            None => self.seen.len() as u64 - held_before,
        };
        let mut evicted = 0;
        if ctx.has_watermark && self.evictable() {
            let wm = ctx.evict_watermark_us;
            evicted = match self.stored.as_mut() {
                Some(stored) => stored.forget_by_watermark(wm, name)?,
                None => self.forget(|s| s.value.is_some_and(|t| t <= wm)),
            };
        }
        self.metrics = StateMetrics {
            rows_total: self.held()?,
            rows_updated: updated,
            rows_removed: evicted + self.ttl_removed,
            memory_bytes: match &self.stored {
                Some(stored) => stored.store.memory_bytes(),
                // The key, its box (pointer and length), the entry and the table's
                // control byte.
                None => self
                    .seen
                    .keys()
                    .map(|k| (k.len() + 16 + std::mem::size_of::<Seen>() + 1) as u64)
                    .sum(),
            },
        };
        Ok(out)
    }

    fn snapshot(&self) -> Result<RecordBatch> {
        if let Some(stored) = &self.stored {
            let entries = stored.all(self.name())?;
            return Self::state_rows(entries.iter().map(|(k, s)| (&**k, *s)));
        }
        // In the map's order, unsorted: a restore does not depend on the order (and the
        // checkpoint orders a state it rebuilds from changes by key), while sorting
        // millions of keys, on the micro-batch's path, is what made a whole snapshot
        // slower the more keys the dedup held.
        let entries: Vec<(&[u8], Seen)> = self.seen.iter().map(|(k, s)| (&**k, *s)).collect();
        Self::state_rows(entries.into_iter())
    }

    fn restore(&mut self, state: &RecordBatch) -> Result<()> {
        const OP: &str = "dedup";
        let keys: BinaryArray = state_column(state, KEY, OP)?;
        let values: Int64Array = state_column(state, VALUE, OP)?;
        let first_seen: Int64Array = state_column(state, UPDATED_COLUMN, OP)?;
        let at = |a: &Int64Array, i: usize| a.is_valid(i).then(|| a.value(i));
        let entries = (0..state.num_rows()).map(|i| {
            (
                Box::<[u8]>::from(keys.value(i)),
                Seen {
                    value: at(&values, i),
                    first_seen_ms: at(&first_seen, i),
                },
            )
        });
        if let Some(stored) = self.stored.as_mut() {
            return stored.replace(&entries.collect::<Vec<_>>());
        }
        self.seen = entries.collect();
        self.added.clear();
        self.gone.clear();
        Ok(())
    }

    fn changelog_identity(&self) -> Option<&'static [&'static str]> {
        Some(&[KEY])
    }

    /// The keys added since the last call that are still held, and those that left.
    fn changes(&mut self) -> Result<Option<RecordBatch>> {
        if self.stored.is_some() {
            return Ok(None);
        }
        let added = std::mem::take(&mut self.added);
        let gone = std::mem::take(&mut self.gone);
        let mut held: Vec<(&[u8], Seen)> = added
            .iter()
            .filter_map(|k| self.seen.get(k).map(|s| (&**k, *s)))
            .collect();
        // A key forgotten and seen again since the last call was added twice; without
        // a key gone there is none.
        if !gone.is_empty() {
            let mut once: std::collections::HashSet<&[u8], foldhash::fast::RandomState> =
                Default::default();
            held.retain(|(k, _)| once.insert(*k));
        }
        let upserts = Self::state_rows(held.into_iter())?;
        let removed = removed_rows(
            &Self::snapshot_schema(),
            vec![(
                KEY,
                Arc::new(BinaryArray::from_iter_values(gone.iter().map(|k| &**k))) as ArrayRef,
            )],
        )?;
        Ok(Some(changes_batch(&[upserts], &removed)?))
    }

    fn metrics(&self) -> StateMetrics {
        self.metrics
    }

    fn set_state_ttl(&mut self, ttl: etlantic_core::streaming::Duration) -> Result<()> {
        self.ttl = Some(StateTtl::new(ttl)?);
        if let Some(stored) = self.stored.as_mut() {
            stored.by_first_seen = true;
        }
        Ok(())
    }

    fn use_store(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        self.seen.clear();
        self.added.clear();
        self.gone.clear();
        self.stored = Some(StoredKeys {
            store,
            by_event_time: self.evictable(),
            by_first_seen: self.ttl.is_some(),
        });
        Ok(())
    }

    fn store(&mut self) -> Option<&mut dyn StateStore> {
        self.stored
            .as_mut()
            .map(|s| s.store.as_mut() as &mut dyn StateStore)
    }

    fn custom_metrics(&self) -> Vec<(&'static str, u64)> {
        match self.ttl {
            Some(_) => vec![(ROWS_REMOVED_BY_TTL, self.ttl_removed)],
            None => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot ordered by key (snapshots come in the map's order).
    fn by_key(snapshot: RecordBatch) -> RecordBatch {
        let keys = snapshot.column_by_name(KEY).expect("a key column").clone();
        let order = arrow::compute::sort_to_indices(&keys, None, None).unwrap();
        arrow::compute::take_record_batch(&snapshot, &order).unwrap()
    }
    use etlantic_runtime::checkpoint::apply_changes;

    const SEC: i64 = 1_000_000;

    fn batch(rows: &[(i64, i64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None),
                false,
            ),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter().map(|r| r.1 * SEC),
                )),
            ],
        )
        .unwrap()
    }

    /// Late rows judged against `late_s`, state evicted with `evict_s` (the previous and
    /// the current micro-batch's watermarks), at processing time `now_ms`.
    fn ctx(late_s: i64, evict_s: i64, now_ms: i64) -> OpContext {
        OpContext {
            late_watermark_us: late_s * SEC,
            evict_watermark_us: evict_s * SEC,
            has_watermark: true,
            output_mode: OutputMode::Append,
            accept_late: false,
            processing_time_ms: now_ms,
        }
    }

    /// Every version is the previous one with the micro-batch's changes applied: keys
    /// added, keys the watermark or the TTL forgot, a key forgotten and seen again, a key
    /// added and forgotten in one micro-batch.
    #[test]
    fn the_changelog_rebuilds_every_version_of_the_state() {
        let input = batch(&[]).schema();
        // Within-watermark mode: a key expires 10 s after its first event time.
        let mut op =
            DedupOperator::new(input, vec!["k".into()], Some("ts".into()), Some(10 * SEC)).unwrap();
        op.set_state_ttl("30 seconds".parse().unwrap()).unwrap();
        // (rows (key, event time s), late watermark s, eviction watermark s, now ms)
        type Step = (Vec<(i64, i64)>, i64, i64, i64);
        let steps: Vec<Step> = vec![
            (vec![(1, 100), (2, 101), (1, 102), (3, 103)], 0, 90, 0),
            (vec![(2, 104), (4, 105), (5, 106)], 90, 95, 1_000),
            // The watermark passes 1's and 2's expiry (110, 111).
            (vec![(6, 121)], 95, 112, 2_000),
            // 1 comes back; 7 arrives and expires (123) in the same micro-batch.
            (vec![(1, 120), (7, 113), (8, 130)], 112, 125, 3_000),
            // The TTL forgets 6, 1 and 8 (first seen 30 s ago or more), then 1 comes
            // back again.
            (vec![(1, 131), (9, 132)], 125, 127, 34_000),
            (vec![], 127, 127, 40_000),
        ];
        let mut version: Option<RecordBatch> = None;
        for (n, (rows, late, evict, now)) in steps.into_iter().enumerate() {
            op.process(&[batch(&rows)], &ctx(late, evict, now)).unwrap();
            let changes = op.changes().unwrap().expect("a changelog");
            let next = apply_changes(version.as_ref(), &changes, &[KEY]).unwrap();
            assert_eq!(next, by_key(op.snapshot().unwrap()), "version {n}");
            version = Some(next);
        }
        assert_eq!(op.seen.len(), 2, "1 and 9: {:?}", op.seen);
        // A restored operator has no changes of its own and behaves the same.
        let mut restored = DedupOperator::new(
            batch(&[]).schema(),
            vec!["k".into()],
            Some("ts".into()),
            Some(10 * SEC),
        )
        .unwrap();
        restored.restore(version.as_ref().unwrap()).unwrap();
        assert_eq!(
            by_key(restored.snapshot().unwrap()),
            by_key(op.snapshot().unwrap())
        );
        let nothing = restored.changes().unwrap().unwrap();
        assert_eq!(nothing.num_rows(), 0);
    }

    /// A dedup on the disk store (RocksDB) emits what the memory one emits and holds the
    /// same keys after every micro-batch — on time, late, within the watermark, TTL —
    /// and a store restored from its checkpoint on another working copy goes on alike.
    #[test]
    fn on_the_disk_store_it_behaves_like_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = |local: &str, checkpoint: &str| test_disk_store(dir.path(), local, checkpoint);
        let make = |within: Option<i64>| {
            let mut op = DedupOperator::new(
                batch(&[]).schema(),
                vec!["k".into()],
                Some("ts".into()),
                within,
            )
            .unwrap();
            op.set_state_ttl("30 seconds".parse().unwrap()).unwrap();
            op
        };
        type Step = (Vec<(i64, i64)>, i64, i64, i64);
        let steps: Vec<Step> = vec![
            (
                vec![(1, 100), (2, 101), (1, 102), (3, 103), (1, 100)],
                0,
                90,
                0,
            ),
            (
                vec![(2, 104), (4, 105), (5, 106), (1, 100), (6, 95)],
                90,
                95,
                1_000,
            ),
            (vec![(6, 121), (2, 101)], 95, 112, 2_000),
            (
                vec![(1, 120), (7, 113), (8, 130), (7, 113)],
                112,
                125,
                3_000,
            ),
            (vec![(1, 131), (9, 132), (8, 130)], 125, 127, 34_000),
            (vec![], 127, 127, 40_000),
            (vec![(9, 132), (10, 200)], 127, 190, 41_000),
        ];
        let rows = |out: &OpOutput| -> Vec<(i64, i64)> {
            out.rows
                .iter()
                .flat_map(|b| {
                    let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    let ts = b
                        .column(1)
                        .as_any()
                        .downcast_ref::<TimestampMicrosecondArray>()
                        .unwrap();
                    (0..b.num_rows())
                        .map(|i| (k.value(i), ts.value(i) / SEC))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        for within in [Some(10 * SEC), None] {
            let mut memory = make(within);
            let mut disk = make(within);
            let checkpoint = format!("checkpoint-{within:?}");
            disk.use_store(store(&format!("a{within:?}"), &checkpoint))
                .unwrap();
            for (n, (input, late, evict, now)) in steps.iter().enumerate() {
                let ctx = ctx(*late, *evict, *now);
                let want = memory.process(&[batch(input)], &ctx).unwrap();
                let got = disk.process(&[batch(input)], &ctx).unwrap();
                assert_eq!(rows(&got), rows(&want), "{within:?} step {n}: rows");
                assert_eq!(got.late_count, want.late_count, "{within:?} step {n}: late");
                assert_eq!(
                    by_key(disk.snapshot().unwrap()),
                    by_key(memory.snapshot().unwrap()),
                    "{within:?} step {n}: state"
                );
                let (m, d) = (memory.metrics(), disk.metrics());
                assert_eq!(
                    (d.rows_total, d.rows_updated, d.rows_removed),
                    (m.rows_total, m.rows_updated, m.rows_removed),
                    "{within:?} step {n}: metrics"
                );
                assert_eq!(disk.custom_metrics(), memory.custom_metrics());
                disk.store().unwrap().commit(n as u64 + 1).unwrap();
            }
            // Another machine: a fresh working copy restores version 4 from the
            // checkpoint and runs steps 4.. again.
            let mut moved = make(within);
            moved
                .use_store(store(&format!("b{within:?}"), &checkpoint))
                .unwrap();
            moved.store().unwrap().restore(Some(4)).unwrap();
            let mut again = make(within);
            for (input, late, evict, now) in &steps[..4] {
                again
                    .process(&[batch(input)], &ctx(*late, *evict, *now))
                    .unwrap();
            }
            assert_eq!(
                by_key(moved.snapshot().unwrap()),
                by_key(again.snapshot().unwrap())
            );
            for (n, (input, late, evict, now)) in steps.iter().enumerate().skip(4) {
                let ctx = ctx(*late, *evict, *now);
                let want = again.process(&[batch(input)], &ctx).unwrap();
                let got = moved.process(&[batch(input)], &ctx).unwrap();
                assert_eq!(rows(&got), rows(&want), "{within:?} restored, step {n}");
            }
            assert_eq!(
                by_key(moved.snapshot().unwrap()),
                by_key(again.snapshot().unwrap())
            );
            assert!(
                moved.changes().unwrap().is_none(),
                "a store keeps no changelog"
            );
        }
    }
}
