//! An aggregation's groups in a [`StateStore`] (`state_store: disk`): the store holds
//! every group; a micro-batch loads into the in-memory [`GroupStore`] only the groups it
//! touches — those its rows fold into, the windows the watermark closes, the groups
//! whose TTL ran out (complete mode: all, as it emits all) — runs as in memory, writes
//! back what changed and what left, and drops them from memory again.
//!
//! Layout of the store:
//!
//! ```text
//! g <window start, ordered> <key row>            → the group (see `encode_group`)
//! e <event-time key, ordered> <start> <key row>  → ""  plain aggregation keyed by the
//!                                                        watermarked event time
//! p <updated ms, ordered> <start> <key row>      → ""  with a state TTL
//! m                                              → groups held (u64 LE)
//! ```
//!
//! Groups are ordered by window start, so the windows a watermark closes (tumbling and
//! sliding: `start + size <= watermark`) are one range scan and one range delete. An
//! index entry whose group is gone or holds another time is stale: it is skipped, and
//! removed by the range delete that passes it.

use super::*;
use crate::streaming::store_layout::{self, clear_store, read_count, time_key, unordered};
use etlantic_runtime::state_store::StoreWrites;

const GROUP: u8 = b'g';
const BY_EVENT_KEY: u8 = b'e';
pub(super) const BY_UPDATE: u8 = b'p';
pub(super) const COUNT: &[u8] = b"m";

fn group_key(start: i64, key: &[u8]) -> Vec<u8> {
    time_key(&[GROUP], start, key)
}

/// An index entry: `prefix`, the time, then the group's key without its tag.
fn index_key(prefix: u8, t: i64, group: &[u8]) -> Vec<u8> {
    time_key(&[prefix], t, &group[1..])
}

/// The end (excluded) of the entries of `prefix` at or before `t`.
fn through(prefix: u8, t: i64) -> Vec<u8> {
    store_layout::through(&[prefix], t)
}

/// A group's value in the store, decoded.
pub(super) struct DecodedGroup {
    pub(super) end: i64,
    pub(super) event_key: Option<i64>,
    pub(super) updated_ms: Option<i64>,
    pub(super) accs: Vec<Acc>,
}

/// A group a micro-batch removed (evicted or expired), to delete from the store.
pub(super) struct Removed {
    pub(super) start: i64,
    pub(super) key: Vec<u8>,
    pub(super) event_key: Option<i64>,
}

/// The store of an aggregation's groups, and which of them a micro-batch has in memory.
pub(super) struct StoredGroups {
    pub(super) store: Box<dyn StateStore>,
    /// The store keys of the groups in memory this micro-batch, and whether the store
    /// held them before it.
    in_memory: HashMap<Vec<u8>, bool>,
    /// Session windows: the sessions in memory this micro-batch that the store holds, by
    /// id, with the end and update time they are indexed by.
    pub(super) sessions_loaded: HashMap<Vec<u8>, (i64, Option<i64>)>,
}

impl StoredGroups {
    pub(super) fn new(store: Box<dyn StateStore>) -> Self {
        StoredGroups {
            store,
            in_memory: HashMap::default(),
            sessions_loaded: HashMap::default(),
        }
    }

    /// Groups held.
    pub(super) fn count(&self) -> Result<u64> {
        read_count(self.store.as_ref(), COUNT, OP)
    }
}

pub(super) const OP: &str = "aggregation";

impl AggregateOperator {
    /// A group's value in the store: its end, flags (bit 0: an event-time key, bit 1:
    /// an update time), both (i64 LE, 0 when absent), then its accumulators.
    pub(super) fn encode_group(&self, g: &GroupRef<'_>) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(25 + 16 * g.accs.len());
        out.extend_from_slice(&g.end.to_le_bytes());
        out.push(u8::from(g.event_key.is_some()) | (u8::from(g.updated_ms.is_some()) << 1));
        out.extend_from_slice(&g.event_key.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&g.updated_ms.unwrap_or(0).to_le_bytes());
        self.accs.encode(g.accs, &mut out)?;
        Ok(out)
    }

    /// A group's value ([`Self::encode_group`]): its end, event-time key, update time
    /// and accumulators.
    pub(super) fn decode_group(&self, value: &[u8]) -> Result<DecodedGroup> {
        let bad = || corrupt_state(OP, "a group entry is too short");
        let int = |at: usize| -> Result<i64> {
            Ok(i64::from_le_bytes(
                value
                    .get(at..at + 8)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?,
            ))
        };
        let flags = *value.get(8).ok_or_else(bad)?;
        Ok(DecodedGroup {
            end: int(0)?,
            event_key: (flags & 1 != 0).then(|| int(9)).transpose()?,
            updated_ms: (flags & 2 != 0).then(|| int(17)).transpose()?,
            accs: self.accs.decode(value.get(25..).ok_or_else(bad)?)?,
        })
    }

    /// A group entry of the store: its start, end, event-time key, update time and
    /// accumulators.
    #[allow(clippy::type_complexity)]
    fn decode_entry(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Result<(i64, i64, Option<i64>, Option<i64>, Vec<Acc>)> {
        let start = unordered(key.get(1..).unwrap_or_default())
            .ok_or_else(|| corrupt_state(OP, "a group key is too short"))?;
        let g = self.decode_group(value)?;
        Ok((start, g.end, g.event_key, g.updated_ms, g.accs))
    }

    /// Puts a group read from the store (key `key`, value `value`) into memory.
    fn load_group(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let (start, end, event_key, updated_ms, accs) = self.decode_entry(key, value)?;
        let parser = self.keys.parser();
        let group = GroupRef {
            start,
            end,
            key: parser.parse(&key[9..]),
            accs: &[],
            event_key,
            updated_ms,
        };
        self.store.restore(&self.keys, group, accs);
        Ok(())
    }

    pub(super) fn stored(&self) -> Result<&StoredGroups> {
        self.stored
            .as_ref()
            .ok_or_else(|| Error::engine("internal: the aggregation has no state store"))
    }

    /// Loads the groups of `keys` (store keys) that are not in memory yet.
    fn load_keys(&mut self, keys: Vec<Vec<u8>>) -> Result<()> {
        let stored = self.stored()?;
        let mut wanted: Vec<Vec<u8>> = keys
            .into_iter()
            .filter(|k| !stored.in_memory.contains_key(k))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let refs: Vec<&[u8]> = wanted.iter().map(|k| k.as_slice()).collect();
        let values = stored.store.get_many(&refs)?;
        for (key, value) in wanted.into_iter().zip(values) {
            if let Some(v) = &value {
                self.load_group(&key, v)?;
            }
            if let Some(s) = self.stored.as_mut() {
                s.in_memory.insert(key, value.is_some());
            }
        }
        Ok(())
    }

    /// Loads the groups a micro-batch's grouped rows fold into.
    pub(super) fn load_batch_groups(&mut self, grouped: &[input::BatchGroups]) -> Result<()> {
        let mut keys = Vec::new();
        for g in grouped {
            let Some((starts, key_cols)) = g.groups.split_first() else {
                continue;
            };
            let starts = starts
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| Error::engine("window starts are not 64-bit integers"))?;
            let rows = self.keys.convert_columns(key_cols).map_err(Error::engine)?;
            keys.extend((0..starts.len()).map(|i| group_key(starts.value(i), rows.row(i).data())));
        }
        self.load_keys(keys)
    }

    /// Loads the groups of the entries of index `prefix` at or before `t`.
    fn load_indexed(&mut self, prefix: u8, t: i64) -> Result<()> {
        let mut keys = Vec::new();
        self.stored()?
            .store
            .scan(&[prefix], Some(&through(prefix, t)), &mut |k, _| {
                // The group's key is the entry after the indexed time, tagged.
                let mut key = vec![GROUP];
                key.extend_from_slice(k.get(9..).unwrap_or_default());
                keys.push(key);
                Ok(true)
            })?;
        self.load_keys(keys)
    }

    /// Loads every group of the range `from..to` of the store not in memory yet.
    fn load_range(&mut self, from: &[u8], to: &[u8]) -> Result<()> {
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let stored = self.stored()?;
        stored.store.scan(from, Some(to), &mut |k, v| {
            if !stored.in_memory.contains_key(k) {
                found.push((k.to_vec(), v.to_vec()));
            }
            Ok(true)
        })?;
        for (k, v) in found {
            self.load_group(&k, &v)?;
            if let Some(s) = self.stored.as_mut() {
                s.in_memory.insert(k, true);
            }
        }
        Ok(())
    }

    /// Loads the groups whose TTL may have run out at `now_ms`.
    pub(super) fn load_expiring(&mut self, now_ms: i64) -> Result<()> {
        match self.ttl {
            Some(ttl) if self.stored.is_some() => {
                self.load_indexed(BY_UPDATE, now_ms.saturating_sub(ttl.millis()))
            }
            _ => Ok(()),
        }
    }

    /// Loads what emitting and evicting need: every group in complete mode, else the
    /// groups the eviction watermark closes.
    pub(super) fn load_for_output(&mut self, ctx: &OpContext) -> Result<()> {
        if self.stored.is_none() {
            return Ok(());
        }
        if ctx.output_mode == OutputMode::Complete {
            return self.load_range(&[GROUP], &[GROUP + 1]);
        }
        if !ctx.has_watermark {
            return Ok(());
        }
        let wm = ctx.evict_watermark_us;
        match self.geometry() {
            Some(Geometry::Tumbling(size) | Geometry::Sliding(size, _)) => {
                self.load_range(&[GROUP], &through(GROUP, wm.saturating_sub(size)))
            }
            None if self.layout.event_time_key.is_some() => self.load_indexed(BY_EVENT_KEY, wm),
            _ => Ok(()),
        }
    }

    /// Writes back a micro-batch: deletes the groups `removed` (evicted, expired) and
    /// their index entries, puts the groups it updated, clears the index ranges it
    /// scanned, then drops every group from memory.
    pub(super) fn write_back(&mut self, removed: &[Removed], ctx: &OpContext) -> Result<()> {
        let Some(stored) = self.stored.as_ref() else {
            return Ok(());
        };
        let mut w = StoreWrites::default();
        let mut count = stored.count()?;
        let by_update = self.ttl.is_some();
        for g in removed {
            let key = group_key(g.start, &g.key);
            if stored.in_memory.get(&key).copied().unwrap_or(false) {
                count = count.saturating_sub(1);
            }
            if let Some(t) = g.event_key {
                w.delete(index_key(BY_EVENT_KEY, t, &key));
            }
            w.delete(key);
        }
        for g in self.store.updated() {
            let key = group_key(g.start, g.key.data());
            if !stored.in_memory.get(&key).copied().unwrap_or(false) {
                count += 1;
            }
            if let Some(t) = g.event_key.filter(|_| self.layout.event_time_key.is_some()) {
                w.put(index_key(BY_EVENT_KEY, t, &key), Vec::new());
            }
            if let (true, Some(t)) = (by_update, g.updated_ms) {
                w.put(index_key(BY_UPDATE, t, &key), Vec::new());
            }
            w.put(key, self.encode_group(&g)?);
        }
        // Every index entry up to the bounds scanned was loaded: live ones are re-put
        // above (a later time) or deleted; the rest are stale.
        if let Some(ttl) = self.ttl {
            let bound = ctx.processing_time_ms.saturating_sub(ttl.millis());
            w.delete_range(vec![BY_UPDATE], through(BY_UPDATE, bound));
        }
        w.put(COUNT.to_vec(), count.to_le_bytes().to_vec());
        let stored = self.stored.as_mut().expect("checked above");
        stored.store.write(w)?;
        stored.in_memory.clear();
        self.store.clear();
        Ok(())
    }

    /// Every group of the store, in a group store of its own (for a snapshot).
    pub(super) fn stored_groups(&self, stored: &StoredGroups) -> Result<GroupStore> {
        let mut all = GroupStore::new(self.layout.aggregates.len());
        let mut failed = None;
        let parser = self.keys.parser();
        stored.store.scan(
            &[GROUP],
            Some(&[GROUP + 1]),
            &mut |k, v| match self.decode_entry(k, v) {
                Ok((start, end, event_key, updated_ms, accs)) => {
                    let group = GroupRef {
                        start,
                        end,
                        key: parser.parse(&k[9..]),
                        accs: &[],
                        event_key,
                        updated_ms,
                    };
                    all.restore(&self.keys, group, accs);
                    Ok(true)
                }
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            },
        )?;
        match failed {
            Some(e) => Err(e),
            None => Ok(all),
        }
    }

    /// Replaces what the store holds with the groups in memory, then drops them from
    /// memory (a restore from a snapshot).
    pub(super) fn replace_stored(&mut self) -> Result<()> {
        let Some(stored) = self.stored.as_mut() else {
            return Ok(());
        };
        clear_store(stored.store.as_mut())?;
        let mut w = StoreWrites::default();
        let mut count = 0u64;
        for g in self.store.groups() {
            let key = group_key(g.start, g.key.data());
            if let Some(t) = g.event_key.filter(|_| self.layout.event_time_key.is_some()) {
                w.put(index_key(BY_EVENT_KEY, t, &key), Vec::new());
            }
            if let (Some(_), Some(t)) = (self.ttl, g.updated_ms) {
                w.put(index_key(BY_UPDATE, t, &key), Vec::new());
            }
            w.put(key, self.encode_group(&g)?);
            count += 1;
        }
        for list in self.sessions.values() {
            for g in list {
                self.put_session(g, &mut w)?;
                count += 1;
            }
        }
        w.put(COUNT.to_vec(), count.to_le_bytes().to_vec());
        let stored = self.stored.as_mut().expect("checked above");
        stored.store.write(w)?;
        stored.sessions_loaded.clear();
        self.store.clear();
        self.sessions.clear();
        Ok(())
    }
}
