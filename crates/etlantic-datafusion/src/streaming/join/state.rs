//! One side's state of a stream-stream join: its rows in Arrow chunks, their entries in
//! an arena in arrival order, and a key index built only when probing needs it.
//!
//! Every row of every micro-batch is inserted here and later evicted, but how often a
//! side is probed depends on the other side: Nexmark q7 inserts 200 000 bids per
//! micro-batch and probes them with the one or two window maxima that closed. So:
//!
//! - `slots` holds the entries in arrival (`seq`) order, each with its key's bytes
//!   (Arrow's row format, in the append-only `slot_keys`; their hashes are apart, in
//!   `slot_hashes`, for scanning); a removed entry stays as a tombstone until dead
//!   slots outnumber live ones, when the arena is rebuilt (so
//!   iteration in arrival order is a scan, and the cost of rebuilding is amortized);
//! - the slots before `indexed` are in the key index (`keys` maps a key's hash to its id,
//!   whose `KeyMeta` holds where its bytes are and the head and tail of its chain of
//!   slots; the index holds the hashes too, so that growing it and telling keys apart
//!   touch no other memory, which a probe of a large state would miss in the cache);
//!   the later ones are found by
//!   scanning their hashes. [`SideState::prepare_probes`] indexes them when the coming
//!   probes would cost more than indexing;
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

/// An optional time in 8 bytes (`Option<i64>` takes 16): `i64::MIN` stands for none.
/// A time that is `i64::MIN` itself is kept as `i64::MIN + 1`, one unit later, some
/// 292 000 years BC. Entries hold three of these, and a join holds one entry per
/// buffered row, so the bytes of each time count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OptTime(i64);

impl OptTime {
    /// The time, if there is one.
    pub fn get(self) -> Option<i64> {
        (self.0 != i64::MIN).then_some(self.0)
    }
}

impl From<Option<i64>> for OptTime {
    fn from(t: Option<i64>) -> Self {
        OptTime(t.map_or(i64::MIN, |t| t.max(i64::MIN + 1)))
    }
}

/// A buffered row: where its values are and what eviction and matching need.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    /// Arrival order on this side (survives checkpoints).
    pub seq: u64,
    pub chunk: u32,
    pub row: u32,
    pub range_time: OptTime,
    pub evict_time: OptTime,
    /// Processing time (ms) it was added or last matched (state TTL).
    pub updated_ms: OptTime,
    pub matched: bool,
}

/// An entry in the arena, linked to the next entry of its key once indexed.
#[derive(Clone, Copy, Debug)]
struct Slot {
    entry: Entry,
    /// Its key's bytes: `slot_keys[key_start..key_start + key_len]`.
    key_start: usize,
    key_len: u32,
    /// Key id (indexed slots only).
    key: u32,
    next: u32,
    alive: bool,
    /// Changed since the last checkpoint (only tracked for entries older than it).
    dirty: bool,
}

/// An indexed key: where its bytes are (those of its first slot, in `slot_keys`) and its
/// chain of slots.
#[derive(Clone, Copy, Debug)]
struct KeyMeta {
    key_start: usize,
    key_len: u32,
    head: u32,
    tail: u32,
}

/// Slots per block of [`SideState::block_min_evict`].
const EVICT_BLOCK: usize = 1024;

/// The earliest eviction time of the live entries of `slots` (`i64::MAX`: none).
fn min_evict(slots: &[Slot]) -> i64 {
    slots
        .iter()
        .filter(|s| s.alive)
        .filter_map(|s| s.entry.evict_time.get())
        .min()
        .unwrap_or(i64::MAX)
}

/// The bookkeeping of entries removed in arrival order (evicted, expired, released): the
/// live count of their chunks, one update per run of one chunk, and the changelog's
/// removed `seq`s (entries older than the last checkpoint).
#[derive(Default)]
struct Removal {
    count: usize,
    run: Option<(u32, usize)>,
}

impl Removal {
    fn note(
        &mut self,
        e: &Entry,
        checkpointed_seq: u64,
        removed: &mut Vec<u64>,
        live_per_chunk: &mut FastMap<u32, usize>,
    ) {
        self.count += 1;
        if e.seq < checkpointed_seq {
            removed.push(e.seq);
        }
        match &mut self.run {
            Some((chunk, n)) if *chunk == e.chunk => *n += 1,
            run => {
                if let Some((chunk, n)) = run.replace((e.chunk, 1)) {
                    uncount(live_per_chunk, chunk, n);
                }
            }
        }
    }

    /// Settles the last run; returns how many entries were removed.
    fn finish(self, live_per_chunk: &mut FastMap<u32, usize>) -> usize {
        if let Some((chunk, n)) = self.run {
            uncount(live_per_chunk, chunk, n);
        }
        self.count
    }
}

fn uncount(live_per_chunk: &mut FastMap<u32, usize>, chunk: u32, n: usize) {
    if let Some(live) = live_per_chunk.get_mut(&chunk) {
        *live -= n;
    }
}

/// Below this many probes, a probe scans the hashes of the slots not yet indexed rather
/// than index them (indexing a slot costs about as much as scanning this many).
const SCAN_PROBES: usize = 64;

/// One side's state.
#[derive(Default)]
pub(super) struct SideState {
    pub chunks: FastMap<u32, RecordBatch>,
    live_per_chunk: FastMap<u32, usize>,
    next_chunk: u32,
    next_seq: u64,
    slots: Vec<Slot>,
    /// The key hash of each slot, apart from the slots: a probe of the slots not yet
    /// indexed scans these 8 bytes per slot, not the whole slots, so a micro-batch that
    /// probes many of them (Nexmark q7's window maxima) waits less on memory.
    slot_hashes: Vec<u64>,
    slot_keys: Vec<u8>,
    dead_slots: usize,
    /// The slots whose `dirty` flag is set.
    dirty_slots: Vec<u32>,
    /// Per block of [`EVICT_BLOCK`] slots, the earliest eviction time of its live
    /// entries (or earlier: it is recomputed when the block is scanned).
    block_min_evict: Vec<i64>,
    /// `slots[..indexed]` are in the key index.
    indexed: usize,
    /// `(hash, key id)` of each indexed key.
    keys: HashTable<(u64, u32)>,
    key_meta: Vec<KeyMeta>,
    hasher: foldhash::fast::RandomState,
    /// Live entries.
    pub rows: usize,
    /// Changelog since the last checkpoint: entries with a `seq` from here on are new...
    checkpointed_seq: u64,
    /// ...and older ones removed (evicted or expired).
    removed: Vec<u64>,
}

impl SideState {
    /// An empty side hashing keys with `hasher`. Both sides of a join share one, so that
    /// a row's key is hashed once per micro-batch ([`SideState::hash`]) for probing the
    /// other side and for its own side.
    pub fn new(hasher: foldhash::fast::RandomState) -> Self {
        SideState {
            hasher,
            ..SideState::default()
        }
    }

    /// The hash of `key` that [`Self::matches_hashed`] and [`Self::insert_hashed`] take.
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Adds a chunk of rows; returns its id for the entries that point into it.
    pub fn add_chunk(&mut self, batch: RecordBatch) -> u32 {
        let id = self.next_chunk;
        self.next_chunk += 1;
        self.chunks.insert(id, batch);
        self.live_per_chunk.insert(id, 0);
        id
    }

    fn slot_key(&self, slot: &Slot) -> &[u8] {
        &self.slot_keys[slot.key_start..slot.key_start + slot.key_len as usize]
    }

    /// Whether the index entry `(entry_hash, id)` is `key` of hash `hash`.
    fn is_key(&self, (entry_hash, id): (u64, u32), hash: u64, key: &[u8]) -> bool {
        if entry_hash != hash {
            return false;
        }
        let m = &self.key_meta[id as usize];
        &self.slot_keys[m.key_start..m.key_start + m.key_len as usize] == key
    }

    /// Adds the slots not yet indexed to the key index.
    fn index_pending(&mut self) {
        for at in self.indexed..self.slots.len() {
            let slot = self.slots[at];
            let hash = self.slot_hashes[at];
            let key = self.slot_key(&slot);
            let found = self
                .keys
                .find(hash, |e| self.is_key(*e, hash, key))
                .map(|(_, id)| *id);
            let id = match found {
                Some(id) => id,
                None => {
                    let id = self.key_meta.len() as u32;
                    self.key_meta.push(KeyMeta {
                        key_start: slot.key_start,
                        key_len: slot.key_len,
                        head: at as u32,
                        tail: NIL,
                    });
                    self.keys.insert_unique(hash, (hash, id), |(h, _)| *h);
                    id
                }
            };
            self.slots[at].key = id;
            let meta = &mut self.key_meta[id as usize];
            if meta.tail != NIL {
                self.slots[meta.tail as usize].next = at as u32;
            }
            meta.tail = at as u32;
        }
        self.indexed = self.slots.len();
    }

    /// Adds an entry with the next arrival number.
    #[cfg(test)]
    pub fn insert(&mut self, key: &[u8], e: Entry) {
        self.insert_hashed(self.hash(key), key, e);
    }

    /// Adds an entry with the next arrival number; `hash` is [`Self::hash`] of `key`.
    pub fn insert_hashed(&mut self, hash: u64, key: &[u8], e: Entry) {
        self.insert_at_hashed(self.next_seq, hash, key, e);
    }

    /// Adds an entry with arrival number `seq`, which must exceed every `seq` here.
    pub fn insert_at(&mut self, seq: u64, key: &[u8], e: Entry) {
        self.insert_at_hashed(seq, self.hash(key), key, e);
    }

    fn insert_at_hashed(&mut self, seq: u64, hash: u64, key: &[u8], mut e: Entry) {
        debug_assert_eq!(hash, self.hash(key));
        debug_assert!(self.slots.last().is_none_or(|s| s.entry.seq < seq));
        e.seq = seq;
        self.next_seq = self.next_seq.max(seq + 1);
        *self.live_per_chunk.entry(e.chunk).or_insert(0) += 1;
        self.rows += 1;
        let key_start = self.slot_keys.len();
        self.slot_keys.extend_from_slice(key);
        let block = self.slots.len() / EVICT_BLOCK;
        if block == self.block_min_evict.len() {
            self.block_min_evict.push(i64::MAX);
        }
        if let Some(t) = e.evict_time.get() {
            self.block_min_evict[block] = self.block_min_evict[block].min(t);
        }
        self.slot_hashes.push(hash);
        self.slots.push(Slot {
            entry: e,
            key_start,
            key_len: key.len() as u32,
            key: NIL,
            next: NIL,
            alive: true,
            dirty: false,
        });
    }

    /// Readies the state for `probes` calls of [`Self::matches`]: indexes the slots not
    /// yet indexed when scanning them that often would cost more.
    pub fn prepare_probes(&mut self, probes: usize) {
        if probes >= SCAN_PROBES && self.indexed < self.slots.len() {
            self.index_pending();
        }
    }

    /// The live entries of `key` in arrival order, with their slot (for [`Self::entry_mut`]).
    #[cfg(test)]
    pub fn matches<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = (u32, &'a Entry)> + 'a {
        self.matches_hashed(self.hash(key), key)
    }

    /// The live entries of `key`, whose [`Self::hash`] is `hash`, in arrival order, with
    /// their slot (for [`Self::entry_mut`]).
    pub fn matches_hashed<'a>(
        &'a self,
        hash: u64,
        key: &'a [u8],
    ) -> impl Iterator<Item = (u32, &'a Entry)> + 'a {
        debug_assert_eq!(hash, self.hash(key));
        let mut next = self
            .keys
            .find(hash, |e| self.is_key(*e, hash, key))
            .map_or(NIL, |(_, id)| self.key_meta[*id as usize].head);
        let indexed = std::iter::from_fn(move || {
            while next != NIL {
                let slot = &self.slots[next as usize];
                let at = next;
                next = slot.next;
                if slot.alive {
                    return Some((at, &slot.entry));
                }
            }
            None
        });
        let pending = self.slot_hashes[self.indexed..]
            .iter()
            .enumerate()
            .filter(move |(_, h)| **h == hash)
            .filter_map(move |(i, _)| {
                let at = self.indexed + i;
                let s = &self.slots[at];
                (s.alive && self.slot_key(s) == key).then_some((at as u32, &s.entry))
            });
        indexed.chain(pending)
    }

    /// The entry in `slot` (from [`Self::matches`]).
    pub fn entry(&self, slot: u32) -> &Entry {
        &self.slots[slot as usize].entry
    }

    /// The entry in `slot`, to change its match flag or update time (which the next
    /// changelog then carries).
    pub fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        let s = &mut self.slots[slot as usize];
        if s.entry.seq < self.checkpointed_seq && !s.dirty {
            s.dirty = true;
            self.dirty_slots.push(slot);
        }
        &mut s.entry
    }

    /// Removes the live entries of `slots[range]` that `gone` selects, accounting for
    /// them as they go ([`Removal`]), and copies them into `out` when given.
    fn remove_in(
        &mut self,
        range: std::ops::Range<usize>,
        gone: &mut impl FnMut(&Entry) -> bool,
        removal: &mut Removal,
        mut out: Option<&mut Vec<Entry>>,
    ) {
        let checkpointed = self.checkpointed_seq;
        for s in self.slots[range].iter_mut().filter(|s| s.alive) {
            if gone(&s.entry) {
                s.alive = false;
                removal.note(
                    &s.entry,
                    checkpointed,
                    &mut self.removed,
                    &mut self.live_per_chunk,
                );
                if let Some(out) = out.as_deref_mut() {
                    out.push(s.entry);
                }
            }
        }
    }

    /// Removes the live entries `gone` selects; returns how many.
    fn remove_where(&mut self, mut gone: impl FnMut(&Entry) -> bool) -> usize {
        let mut removal = Removal::default();
        self.remove_in(0..self.slots.len(), &mut gone, &mut removal, None);
        self.forget(removal)
    }

    /// Ends a removal: the live count, and a rebuild of the arena when tombstones
    /// dominate. Returns how many entries were removed.
    fn forget(&mut self, removal: Removal) -> usize {
        let n = removal.finish(&mut self.live_per_chunk);
        self.rows -= n;
        self.dead_slots += n;
        if self.dead_slots > self.rows.max(4096) {
            self.rebuild();
        }
        n
    }

    /// Removes the live entries in `slots` (from [`Self::matches_hashed`]); returns how
    /// many there were. Slots from before the removal mean nothing after it (the arena
    /// may be rebuilt).
    pub fn remove_slots(&mut self, slots: &[u32]) -> usize {
        let mut at: Vec<u32> = slots.to_vec();
        // Arrival order, as `Removal` wants it.
        at.sort_unstable();
        at.dedup();
        let checkpointed = self.checkpointed_seq;
        let mut removal = Removal::default();
        for a in at {
            let s = &mut self.slots[a as usize];
            if s.alive {
                s.alive = false;
                removal.note(
                    &s.entry,
                    checkpointed,
                    &mut self.removed,
                    &mut self.live_per_chunk,
                );
            }
        }
        self.forget(removal)
    }

    /// Removes the entries at or below `threshold_us`, copying them into `out` (in
    /// arrival order) when given; returns how many. Only blocks of slots whose earliest
    /// eviction time is due are scanned (arrival order roughly follows event time, so
    /// most blocks are either all due or none).
    pub fn evict(&mut self, threshold_us: i64, mut out: Option<&mut Vec<Entry>>) -> usize {
        let mut gone = |e: &Entry| e.evict_time.get().is_some_and(|t| t <= threshold_us);
        let mut removal = Removal::default();
        for b in 0..self.block_min_evict.len() {
            if self.block_min_evict[b] > threshold_us {
                continue;
            }
            let range = b * EVICT_BLOCK..((b + 1) * EVICT_BLOCK).min(self.slots.len());
            self.remove_in(range.clone(), &mut gone, &mut removal, out.as_deref_mut());
            self.block_min_evict[b] = min_evict(&self.slots[range]);
        }
        self.forget(removal)
    }

    /// Removes the entries a state TTL expires at `now_ms`; returns how many.
    pub fn expire(&mut self, ttl: &StateTtl, now_ms: i64) -> usize {
        self.remove_where(|e| ttl.expired(e.updated_ms.get(), now_ms))
    }

    /// Drops the tombstones, in place: the arena keeps its allocation, so a state that
    /// fills and drains every micro-batch (a window's rows) reuses the same memory
    /// instead of growing a fresh arena (and faulting in its pages) after every rebuild.
    /// The key index is dropped too: the live slots are indexed again when probes need
    /// it (their hashes are kept, so nothing is hashed again).
    fn rebuild(&mut self) {
        let (mut live, mut key_end) = (0usize, 0usize);
        let n = self.slots.len();
        let mut at = 0;
        while at < n {
            if !self.slots[at].alive {
                at += 1;
                continue;
            }
            // A run of live slots whose keys lie back to back (as inserted) moves with one
            // copy of its slots and one of its keys, not one per key.
            let first = at;
            let key_start = self.slots[at].key_start;
            let mut key_stop = key_start + self.slots[at].key_len as usize;
            at += 1;
            while at < n && self.slots[at].alive && self.slots[at].key_start == key_stop {
                key_stop += self.slots[at].key_len as usize;
                at += 1;
            }
            // Live slots and their keys only move towards the front (`key_end` never
            // passes `key_start`), so moving them in arrival order overwrites nothing
            // still needed.
            self.slot_keys.copy_within(key_start..key_stop, key_end);
            self.slots.copy_within(first..at, live);
            self.slot_hashes.copy_within(first..at, live);
            let shift = key_start - key_end;
            for s in &mut self.slots[live..live + (at - first)] {
                s.key_start -= shift;
                s.key = NIL;
                s.next = NIL;
            }
            live += at - first;
            key_end += key_stop - key_start;
        }
        self.slots.truncate(live);
        self.slot_hashes.truncate(live);
        self.slot_keys.truncate(key_end);
        self.dead_slots = 0;
        self.indexed = 0;
        self.keys.clear();
        self.key_meta.clear();
        self.dirty_slots.clear();
        self.dirty_slots
            .extend((0..self.slots.len() as u32).filter(|at| self.slots[*at as usize].dirty));
        self.block_min_evict.clear();
        self.block_min_evict
            .extend(self.slots.chunks(EVICT_BLOCK).map(min_evict));
    }

    /// Makes room for `rows` more entries whose keys take `key_bytes` in all, so that a
    /// micro-batch's inserts grow the arena at most once.
    pub fn reserve(&mut self, rows: usize, key_bytes: usize) {
        self.slots.reserve(rows);
        self.slot_hashes.reserve(rows);
        self.slot_keys.reserve(key_bytes);
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
        self.take_changes_as(|_, slot| slot.entry)
    }

    /// [`Self::take_changes`], each entry with its key's bytes.
    pub fn take_keyed_changes(&mut self) -> (Vec<(Entry, Vec<u8>)>, Vec<u64>) {
        self.take_changes_as(|st, slot| (slot.entry, st.slot_key(slot).to_vec()))
    }

    fn take_changes_as<T>(&mut self, item: impl Fn(&Self, &Slot) -> T) -> (Vec<T>, Vec<u64>) {
        // Changed older entries, then the new ones (slots are in arrival order).
        let mut dirty = std::mem::take(&mut self.dirty_slots);
        dirty.sort_unstable();
        let first_new = self
            .slots
            .partition_point(|s| s.entry.seq < self.checkpointed_seq);
        let mut upserts = Vec::with_capacity(dirty.len() + self.slots.len() - first_new);
        for at in dirty {
            let s = &mut self.slots[at as usize];
            s.dirty = false;
            let slot = *s;
            if slot.alive {
                upserts.push(item(self, &slot));
            }
        }
        upserts.extend(
            self.slots[first_new..]
                .iter()
                .filter(|s| s.alive)
                .map(|s| item(self, s)),
        );
        self.mark_checkpointed();
        (upserts, std::mem::take(&mut self.removed))
    }

    /// The live entries in arrival order, each with its key's bytes.
    pub fn keyed_entries(&self) -> Vec<(Entry, Vec<u8>)> {
        self.slots
            .iter()
            .filter(|s| s.alive)
            .map(|s| (s.entry, self.slot_key(s).to_vec()))
            .collect()
    }

    /// The arrival number the next entry gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Goes on from arrival number `next_seq` (at least), everything here counting as
    /// checkpointed: a side holding part of its rows, loaded from a state store.
    pub fn resume_at(&mut self, next_seq: u64) {
        self.next_seq = self.next_seq.max(next_seq);
        self.mark_checkpointed();
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
            + self.slot_hashes.capacity() * std::mem::size_of::<u64>()
            + self.slot_keys.capacity()
            + self.key_meta.capacity() * std::mem::size_of::<KeyMeta>()
            + self.keys.capacity() * std::mem::size_of::<(u64, u32)>();
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

    /// Evicts at `threshold`; returns the entries removed.
    fn evicted(st: &mut SideState, threshold: i64) -> Vec<Entry> {
        let mut out = Vec::new();
        let n = st.evict(threshold, Some(&mut out));
        assert_eq!(n, out.len());
        out
    }

    fn entry(t: i64) -> Entry {
        Entry {
            seq: 0,
            chunk: 0,
            row: t as u32,
            range_time: Some(t).into(),
            evict_time: Some(t).into(),
            matched: false,
            updated_ms: None.into(),
        }
    }

    #[test]
    fn a_slot_takes_72_bytes_and_optional_times_round_trip() {
        // One slot per buffered row: its size is the state's memory per row (besides
        // the row's values, key bytes and its 8-byte hash in `slot_hashes`).
        assert_eq!(std::mem::size_of::<Slot>(), 72);
        for t in [None, Some(0), Some(-1), Some(i64::MAX), Some(i64::MIN + 1)] {
            assert_eq!(OptTime::from(t).get(), t);
        }
        assert_eq!(OptTime::from(Some(i64::MIN)).get(), Some(i64::MIN + 1));
    }

    fn rows_of(st: &SideState, key: &[u8]) -> Vec<u32> {
        st.matches(key).map(|(_, e)| e.row).collect()
    }

    #[test]
    fn indexed_and_scanned_entries_are_found_in_arrival_order() {
        let mut st = SideState::default();
        st.add_chunk(RecordBatch::new_empty(std::sync::Arc::new(
            arrow::datatypes::Schema::empty(),
        )));
        for t in 0..10_000i64 {
            st.insert(&[(t % 3) as u8], entry(t));
        }
        // Few probes scan; many index first. Both find the same.
        let scanned = rows_of(&st, &[1]);
        assert_eq!(scanned.len(), 3333);
        st.prepare_probes(SCAN_PROBES);
        assert_eq!(st.indexed, 10_000);
        assert_eq!(rows_of(&st, &[1]), scanned);
        // New entries are scanned after the indexed ones.
        st.insert(&[1], entry(10_000));
        assert_eq!(rows_of(&st, &[1]).last(), Some(&10_000));
        // Evicting 9000 entries rebuilds the arena (dead > live and > 4096).
        let gone = evicted(&mut st, 8_999);
        assert_eq!(gone.len(), 9_000);
        assert!(gone.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(st.rows, 1_001);
        assert_eq!(st.slots.len(), 1_001, "the tombstones are gone");
        assert_eq!(
            st.keys_held(),
            0,
            "the index is rebuilt when probes need it"
        );
        let want: Vec<u32> = (9_000..10_001)
            .filter(|t| t % 3 == 1 || *t == 10_000)
            .collect();
        assert_eq!(rows_of(&st, &[1]), want);
        st.prepare_probes(SCAN_PROBES);
        assert_eq!(rows_of(&st, &[1]), want);
        // Tombstones left in a chain are skipped.
        st.evict(9_999, None);
        st.insert(&[7], entry(20_000));
        assert_eq!(rows_of(&st, &[7]), vec![20_000]);
        assert_eq!(rows_of(&st, &[1]), vec![10_000]);
        assert!(rows_of(&st, &[2]).is_empty());
    }

    /// Eviction skips blocks whose entries are not due, but finds every due entry,
    /// however out of order the eviction times are.
    #[test]
    fn eviction_finds_every_due_entry_out_of_order() {
        let mut st = SideState::default();
        // Times 0..5000 in a scrambled order (7919 is prime, so this is a permutation).
        let times: Vec<i64> = (0..5_000i64).map(|i| (i * 7_919) % 5_000).collect();
        for t in &times {
            st.insert(&[0], entry(*t));
        }
        for threshold in [10, 999, 2_500, 4_999] {
            let gone = evicted(&mut st, threshold);
            assert!(gone
                .iter()
                .all(|e| e.evict_time.get().expect("set") <= threshold));
            assert!(st
                .entries_by_seq()
                .iter()
                .all(|e| e.evict_time.get().expect("set") > threshold));
        }
        assert_eq!(st.rows, 0);
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
        assert_eq!(st.evict(0, None), 1);
        let (upserts, removed) = st.take_changes();
        let seqs: Vec<u64> = upserts.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![3, 5]);
        assert_eq!(removed, vec![0]);
        let (upserts, removed) = st.take_changes();
        assert!(upserts.is_empty() && removed.is_empty());
    }
}
