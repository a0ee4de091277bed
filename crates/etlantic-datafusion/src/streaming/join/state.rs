//! One side's state of a stream-stream join: its rows in Arrow chunks, their entries in
//! an arena in arrival order, and per join key a chain through that arena.
//!
//! Every row of every micro-batch is inserted here, probed against, and later evicted,
//! so the layout avoids per-row and per-key allocations:
//!
//! - `slots` holds the entries in arrival (`seq`) order; a removed entry stays as a
//!   tombstone until dead slots outnumber live ones, when the arena is rebuilt (so
//!   iteration in arrival order is a scan, and the cost of rebuilding is amortized);
//! - keys are byte strings (Arrow's row format) kept once each in `key_bytes`; `keys`
//!   maps a key to its id, whose `KeyMeta` holds the head and tail of its chain of slots;
//! - the changelog since the last checkpoint needs no second index: entries with a `seq`
//!   from `checkpointed_seq` on are new, older ones carry a `dirty` flag when their match
//!   flag or update time changed, and the `seq`s of removed older ones are listed.

use super::super::ttl::StateTtl;
use arrow::array::RecordBatch;
use hashbrown::HashTable;
use std::collections::HashMap;
use std::hash::BuildHasher;

/// The state index is probed and filled for every row of every micro-batch: foldhash
/// instead of the default SipHash (seeded per process, so no `HashDoS` exposure).
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// No slot (the end of a chain).
const NIL: u32 = u32::MAX;

/// A buffered row: where its values are and what eviction and matching need.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    /// Arrival order on this side (survives checkpoints).
    pub seq: u64,
    pub chunk: u32,
    pub row: u32,
    pub range_time: Option<i64>,
    pub evict_time: Option<i64>,
    pub matched: bool,
    /// Processing time (ms) it was added or last matched (state TTL).
    pub updated_ms: Option<i64>,
}

/// An entry in the arena, linked to the next entry of its key.
#[derive(Clone, Copy, Debug)]
struct Slot {
    entry: Entry,
    key: u32,
    next: u32,
    alive: bool,
    /// Changed since the last checkpoint (only tracked for entries older than it).
    dirty: bool,
}

#[derive(Clone, Copy, Debug)]
struct KeyMeta {
    start: usize,
    len: u32,
    hash: u64,
    head: u32,
    tail: u32,
}

/// One side's state.
#[derive(Default)]
pub(super) struct SideState {
    pub chunks: FastMap<u32, RecordBatch>,
    live_per_chunk: FastMap<u32, usize>,
    next_chunk: u32,
    next_seq: u64,
    slots: Vec<Slot>,
    dead_slots: usize,
    keys: HashTable<u32>,
    key_meta: Vec<KeyMeta>,
    key_bytes: Vec<u8>,
    hasher: foldhash::fast::RandomState,
    /// Live entries.
    pub rows: usize,
    /// Changelog since the last checkpoint: entries with a `seq` from here on are new...
    checkpointed_seq: u64,
    /// ...and older ones removed (evicted or expired).
    removed: Vec<u64>,
}

impl SideState {
    /// Adds a chunk of rows; returns its id for the entries that point into it.
    pub fn add_chunk(&mut self, batch: RecordBatch) -> u32 {
        let id = self.next_chunk;
        self.next_chunk += 1;
        self.chunks.insert(id, batch);
        self.live_per_chunk.insert(id, 0);
        id
    }

    fn find_key(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.keys
            .find(hash, |id| {
                let m = &self.key_meta[*id as usize];
                m.hash == hash && &self.key_bytes[m.start..m.start + m.len as usize] == key
            })
            .copied()
    }

    fn key_id(&mut self, key: &[u8]) -> u32 {
        let hash = self.hasher.hash_one(key);
        let (meta, bytes) = (&self.key_meta, &self.key_bytes);
        let found = self.keys.find(hash, |id| {
            let m = &meta[*id as usize];
            m.hash == hash && &bytes[m.start..m.start + m.len as usize] == key
        });
        if let Some(id) = found {
            return *id;
        }
        let id = self.key_meta.len() as u32;
        self.key_meta.push(KeyMeta {
            start: self.key_bytes.len(),
            len: key.len() as u32,
            hash,
            head: NIL,
            tail: NIL,
        });
        self.key_bytes.extend_from_slice(key);
        let meta = &self.key_meta;
        self.keys
            .insert_unique(hash, id, |id| meta[*id as usize].hash);
        id
    }

    /// Adds an entry with the next arrival number.
    pub fn insert(&mut self, key: &[u8], e: Entry) {
        self.insert_at(self.next_seq, key, e);
    }

    /// Adds an entry with arrival number `seq`, which must exceed every `seq` here.
    pub fn insert_at(&mut self, seq: u64, key: &[u8], mut e: Entry) {
        debug_assert!(self.slots.last().is_none_or(|s| s.entry.seq < seq));
        e.seq = seq;
        self.next_seq = self.next_seq.max(seq + 1);
        *self.live_per_chunk.entry(e.chunk).or_insert(0) += 1;
        self.rows += 1;
        let key = self.key_id(key);
        let slot = self.slots.len() as u32;
        self.slots.push(Slot {
            entry: e,
            key,
            next: NIL,
            alive: true,
            dirty: false,
        });
        let meta = &mut self.key_meta[key as usize];
        match meta.tail {
            NIL => meta.head = slot,
            tail => self.slots[tail as usize].next = slot,
        }
        meta.tail = slot;
    }

    /// The live entries of `key` in arrival order, with their slot (for [`Self::entry_mut`]).
    pub fn matches<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = (u32, &'a Entry)> + 'a {
        let mut next = self
            .find_key(key)
            .map_or(NIL, |id| self.key_meta[id as usize].head);
        std::iter::from_fn(move || {
            while next != NIL {
                let slot = &self.slots[next as usize];
                let at = next;
                next = slot.next;
                if slot.alive {
                    return Some((at, &slot.entry));
                }
            }
            None
        })
    }

    /// The entry in `slot` (from [`Self::matches`]).
    pub fn entry(&self, slot: u32) -> &Entry {
        &self.slots[slot as usize].entry
    }

    /// The entry in `slot`, to change its match flag or update time (which the next
    /// changelog then carries).
    pub fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        let s = &mut self.slots[slot as usize];
        if s.entry.seq < self.checkpointed_seq {
            s.dirty = true;
        }
        &mut s.entry
    }

    /// Removes the live entries `gone` selects; returns them in arrival order.
    fn remove_where(&mut self, mut gone: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        for s in self.slots.iter_mut().filter(|s| s.alive) {
            if gone(&s.entry) {
                s.alive = false;
                out.push(s.entry);
            }
        }
        for e in &out {
            if let Some(n) = self.live_per_chunk.get_mut(&e.chunk) {
                *n -= 1;
            }
            if e.seq < self.checkpointed_seq {
                self.removed.push(e.seq);
            }
        }
        self.rows -= out.len();
        self.dead_slots += out.len();
        if self.dead_slots > self.rows.max(4096) {
            self.rebuild();
        }
        out
    }

    /// Removes the entries at or below `threshold_us`; returns them in arrival order.
    pub fn evict(&mut self, threshold_us: i64) -> Vec<Entry> {
        self.remove_where(|e| e.evict_time.is_some_and(|t| t <= threshold_us))
    }

    /// Removes the entries a state TTL expires at `now_ms`; returns how many.
    pub fn expire(&mut self, ttl: &StateTtl, now_ms: i64) -> usize {
        self.remove_where(|e| ttl.expired(e.updated_ms, now_ms))
            .len()
    }

    /// Drops the tombstones and the keys without live entries.
    fn rebuild(&mut self) {
        let slots = std::mem::take(&mut self.slots);
        let key_meta = std::mem::take(&mut self.key_meta);
        let key_bytes = std::mem::take(&mut self.key_bytes);
        self.keys.clear();
        self.dead_slots = 0;
        self.slots.reserve(self.rows);
        for s in slots.into_iter().filter(|s| s.alive) {
            let m = &key_meta[s.key as usize];
            let key = self.key_id(&key_bytes[m.start..m.start + m.len as usize]);
            let at = self.slots.len() as u32;
            self.slots.push(Slot {
                key,
                next: NIL,
                ..s
            });
            let meta = &mut self.key_meta[key as usize];
            match meta.tail {
                NIL => meta.head = at,
                tail => self.slots[tail as usize].next = at,
            }
            meta.tail = at;
        }
    }

    /// Drops chunks nothing refers to.
    pub fn drop_dead_chunks(&mut self) {
        let dead: Vec<u32> = self
            .live_per_chunk
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(c, _)| *c)
            .collect();
        for c in dead {
            self.live_per_chunk.remove(&c);
            self.chunks.remove(&c);
        }
    }

    /// Rows held by the chunks, live or not.
    pub fn chunk_rows(&self) -> usize {
        self.chunks.values().map(RecordBatch::num_rows).sum()
    }

    /// The live entries in arrival order.
    pub fn entries_by_seq(&self) -> Vec<Entry> {
        self.slots
            .iter()
            .filter(|s| s.alive)
            .map(|s| s.entry)
            .collect()
    }

    /// Replaces all chunks by `batch`, which holds the live rows in arrival order.
    pub fn rechunk(&mut self, batch: RecordBatch) {
        debug_assert_eq!(batch.num_rows(), self.rows);
        self.chunks.clear();
        self.live_per_chunk.clear();
        let chunk = self.add_chunk(batch);
        for (row, s) in self.slots.iter_mut().filter(|s| s.alive).enumerate() {
            s.entry.chunk = chunk;
            s.entry.row = row as u32;
        }
        self.live_per_chunk.insert(chunk, self.rows);
    }

    /// The changes since the last call (or restore): the entries added or changed, in
    /// arrival order, and the `seq`s of older entries removed. What is returned counts
    /// as checkpointed.
    pub fn take_changes(&mut self) -> (Vec<Entry>, Vec<u64>) {
        let from = self.checkpointed_seq;
        let mut upserts = Vec::new();
        for s in self.slots.iter_mut().filter(|s| s.alive) {
            if s.entry.seq >= from || s.dirty {
                upserts.push(s.entry);
                s.dirty = false;
            }
        }
        self.mark_checkpointed();
        (upserts, std::mem::take(&mut self.removed))
    }

    /// Everything here counts as checkpointed (after a restore).
    pub fn mark_checkpointed(&mut self) {
        self.checkpointed_seq = self.next_seq;
    }

    /// Approximate bytes held: the chunks, the arena and the key index.
    pub fn memory_bytes(&self) -> u64 {
        let chunks: usize = self
            .chunks
            .values()
            .map(RecordBatch::get_array_memory_size)
            .sum();
        let index = self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.key_meta.capacity() * std::mem::size_of::<KeyMeta>()
            + self.key_bytes.capacity()
            + self.keys.capacity() * std::mem::size_of::<u32>();
        (chunks + index) as u64
    }

    #[cfg(test)]
    pub fn keys_held(&self) -> usize {
        self.key_meta.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(t: i64) -> Entry {
        Entry {
            seq: 0,
            chunk: 0,
            row: t as u32,
            range_time: Some(t),
            evict_time: Some(t),
            matched: false,
            updated_ms: None,
        }
    }

    fn rows_of(st: &SideState, key: &[u8]) -> Vec<u32> {
        st.matches(key).map(|(_, e)| e.row).collect()
    }

    #[test]
    fn chains_survive_eviction_and_rebuild() {
        let mut st = SideState::default();
        st.add_chunk(RecordBatch::new_empty(std::sync::Arc::new(
            arrow::datatypes::Schema::empty(),
        )));
        for t in 0..10_000i64 {
            st.insert(&[(t % 3) as u8], entry(t));
        }
        assert_eq!(rows_of(&st, &[1]).len(), 3333);
        // Evicting 9000 entries rebuilds the arena (dead > live and > 4096).
        let gone = st.evict(8_999);
        assert_eq!(gone.len(), 9_000);
        assert!(gone.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(st.rows, 1_000);
        assert_eq!(st.slots.len(), 1_000, "the tombstones are gone");
        let want: Vec<u32> = (9_000..10_000).filter(|t| t % 3 == 1).collect();
        assert_eq!(rows_of(&st, &[1]), want);
        // Keys without entries go at the rebuild; a new entry of a new key chains.
        st.evict(9_999);
        st.insert(&[7], entry(20_000));
        assert_eq!(rows_of(&st, &[7]), vec![20_000]);
        assert!(rows_of(&st, &[1]).is_empty());
        assert!(st.keys_held() <= 4);
    }

    #[test]
    fn the_changelog_holds_new_changed_and_removed_entries() {
        let mut st = SideState::default();
        for t in 0..5i64 {
            st.insert(&[0], entry(t));
        }
        let (upserts, removed) = st.take_changes();
        assert_eq!(upserts.len(), 5);
        assert!(removed.is_empty());
        // Change an old entry, add a new one, remove an old one.
        let (slot, _) = st.matches(&[0]).nth(3).expect("entry 3");
        st.entry_mut(slot).matched = true;
        st.insert(&[0], entry(5));
        st.evict(0);
        let (upserts, removed) = st.take_changes();
        let seqs: Vec<u64> = upserts.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![3, 5]);
        assert_eq!(removed, vec![0]);
        let (upserts, removed) = st.take_changes();
        assert!(upserts.is_empty() && removed.is_empty());
    }
}
