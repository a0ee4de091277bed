//! A processor's state in a [`StateStore`] (`state_store: disk`): the store holds every
//! key's state and timers; a micro-batch loads into memory only the keys it can touch —
//! those of its input rows, those with a timer due, those with an entry whose TTL ran
//! out — runs as in memory, writes back the keys it changed, deletes those left with
//! neither state nor timers, and drops them from memory again.
//!
//! Layout of the store:
//!
//! ```text
//! k <key>                                → the key's state and timers (`encode_state`)
//! t <timer ms, ordered> <key>            → ""   one per registered timer
//! x <earliest expiry ms, ordered> <key>  → ""   a key with an entry under a TTL
//! m                                      → state rows held: entries and timers (u64 LE)
//! n                                      → timers registered (u64 LE)
//! ```
//!
//! The indexes are kept exact: a key's entries go and come with its state.

use super::*;
use crate::streaming::store_layout::{clear_store, read_count, through, time_key, unordered};
use etlantic_runtime::engine::corrupt_state;
use etlantic_runtime::state_store::{StateStore, StoreWrites};

const KEY: u8 = b'k';
const BY_TIMER: u8 = b't';
const BY_EXPIRY: u8 = b'x';
const ROWS: &[u8] = b"m";
const TIMERS: &[u8] = b"n";
const OP: &str = "stateful processor";

/// What the store held of a key loaded into memory: its value (so that a key the
/// micro-batch left as it was is not written again) and what it is indexed by.
struct LoadedKey {
    value: Vec<u8>,
    timers: Vec<i64>,
    expiry: Option<i64>,
    rows: u64,
}

/// The store of a processor's state, and which keys a micro-batch has in memory.
pub(super) struct StoredState {
    pub(super) store: Box<dyn StateStore>,
    loaded: HashMap<Vec<u8>, LoadedKey>,
    /// Timers registered over all keys (after the last micro-batch).
    pub(super) timers: u64,
}

impl StoredState {
    pub(super) fn new(store: Box<dyn StateStore>) -> Self {
        StoredState {
            store,
            loaded: HashMap::new(),
            timers: 0,
        }
    }
}

fn tagged(tag: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(tag);
    out.extend_from_slice(key);
    out
}

/// The earliest time an entry of `state` expires.
fn earliest_expiry(state: &KeyState) -> Option<i64> {
    state
        .entries_stored()
        .iter()
        .filter_map(|e| e.expires_at_ms)
        .min()
}

fn state_rows(state: &KeyState) -> u64 {
    state.entries() + state.timers().len() as u64
}

fn kind_byte(kind: StateKind) -> u8 {
    match kind {
        StateKind::Value => 0,
        StateKind::List => 1,
        StateKind::Map => 2,
    }
}

/// Reads the pieces of an encoded state, failing (never panicking) on a short one.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(corrupt_state(OP, "a key's state in the store is truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A length-prefixed byte string.
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

impl ProcessorOperator {
    /// A key's state as stored: its entries (kind, state variable name, map key flag
    /// and bytes, value, expiry flag and time), then its timers.
    fn encode_state(&self, state: &KeyState) -> Vec<u8> {
        let entries = state.entries_stored();
        let mut out = Vec::new();
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in entries {
            out.push(kind_byte(e.kind));
            put_bytes(&mut out, self.decls[e.slot].name.as_bytes());
            out.push(u8::from(e.map_key.is_some()));
            put_bytes(&mut out, e.map_key.unwrap_or_default());
            put_bytes(&mut out, e.value);
            out.push(u8::from(e.expires_at_ms.is_some()));
            out.extend_from_slice(&e.expires_at_ms.unwrap_or(0).to_le_bytes());
        }
        out.extend_from_slice(&(state.timers().len() as u32).to_le_bytes());
        for t in state.timers() {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out
    }

    /// The state [`Self::encode_state`] wrote.
    fn decode_state(&self, bytes: &[u8]) -> Result<KeyState> {
        let mut r = Reader { bytes };
        let mut state = KeyState::new(self.decls.len());
        for _ in 0..r.u32()? {
            let kind = match r.u8()? {
                0 => StateKind::Value,
                1 => StateKind::List,
                2 => StateKind::Map,
                other => {
                    return Err(corrupt_state(
                        OP,
                        format!("unknown state kind {other} in the store"),
                    ))
                }
            };
            let name = std::str::from_utf8(r.bytes()?)
                .map_err(|_| corrupt_state(OP, "a state variable name is not UTF-8"))?
                .to_string();
            let has_map_key = r.u8()? != 0;
            let map_key = r.bytes()?.to_vec();
            let value = r.bytes()?.to_vec();
            let has_expiry = r.u8()? != 0;
            let expiry = r.i64()?;
            self.restore_row(
                &mut state,
                &name,
                kind,
                has_map_key.then_some(map_key),
                value,
                has_expiry.then_some(expiry),
            )?;
        }
        for _ in 0..r.u32()? {
            state.add_timer(r.i64()?);
        }
        if !r.bytes.is_empty() {
            return Err(corrupt_state(
                OP,
                "a key's state in the store has trailing bytes",
            ));
        }
        Ok(state)
    }

    /// The [`GroupKey`] of key bytes (Arrow's row format of the key columns).
    fn key_of(&self, key: &[u8]) -> Result<GroupKey> {
        if self.keys.is_empty() {
            return GroupKey::new(RecordBatch::new_empty(self.key_schema.clone()));
        }
        let parser = self.converter.parser();
        let cols = self
            .converter
            .convert_rows([parser.parse(key)])
            .map_err(|e| corrupt_state(OP, format!("a key in the store: {e}")))?;
        GroupKey::new(RecordBatch::try_new(self.key_schema.clone(), cols).map_err(Error::engine)?)
    }

    pub(super) fn stored(&self) -> Result<&StoredState> {
        self.stored
            .as_ref()
            .ok_or_else(|| Error::engine("internal: the processor has no state store"))
    }

    /// Loads the keys a micro-batch can touch: those of `kept` (its input rows), those
    /// with a timer at or before `due_by`, those with an entry expiring at or before
    /// `now_ms`.
    pub(super) fn load_keys(
        &mut self,
        kept: &[RecordBatch],
        due_by: Option<i64>,
        now_ms: i64,
    ) -> Result<()> {
        if self.stored.is_none() {
            return Ok(());
        }
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for b in kept.iter().filter(|b| b.num_rows() > 0) {
            let rows = self
                .converter
                .convert_columns(&self.key_columns(b)?)
                .map_err(Error::engine)?;
            keys.extend(rows.iter().map(|r| r.as_ref().to_vec()));
        }
        let stored = self.stored()?;
        let mut bounds = vec![(BY_EXPIRY, now_ms)];
        if let Some(t) = due_by {
            bounds.push((BY_TIMER, t));
        }
        for (tag, bound) in bounds {
            stored
                .store
                .scan(&[tag], Some(&through(&[tag], bound)), &mut |k, _| {
                    keys.push(k.get(9..).unwrap_or_default().to_vec());
                    Ok(true)
                })?;
        }
        keys.sort_unstable();
        keys.dedup();
        let entries: Vec<Vec<u8>> = keys.iter().map(|k| tagged(KEY, k)).collect();
        let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
        let values = stored.store.get_many(&refs)?;
        let mut loaded = Vec::new();
        for (k, value) in keys.into_iter().zip(values) {
            let Some(value) = value else { continue };
            let state = self.decode_state(&value)?;
            let entry = Entry {
                key: Arc::new(self.key_of(&k)?),
                state,
            };
            loaded.push((k, entry, value));
        }
        for (k, entry, value) in loaded {
            let meta = LoadedKey {
                value,
                timers: entry.state.timers().iter().copied().collect(),
                expiry: earliest_expiry(&entry.state),
                rows: state_rows(&entry.state),
            };
            if let Some(s) = self.stored.as_mut() {
                s.loaded.insert(k.clone(), meta);
            }
            self.store.insert(k, entry);
        }
        Ok(())
    }

    /// Puts `key`'s `state` (encoded as `value`) and its index entries into `w`.
    fn put_key(key: &[u8], state: &KeyState, value: Vec<u8>, w: &mut StoreWrites) {
        for t in state.timers() {
            w.put(time_key(&[BY_TIMER], *t, key), Vec::new());
        }
        if let Some(x) = earliest_expiry(state) {
            w.put(time_key(&[BY_EXPIRY], x, key), Vec::new());
        }
        w.put(tagged(KEY, key), value);
    }

    /// Writes back a micro-batch: the keys it changed, the deletion of the loaded keys
    /// it emptied; then drops them from memory. Returns the state rows held.
    pub(super) fn write_back(&mut self) -> Result<u64> {
        let Some(stored) = self.stored.as_mut() else {
            return Ok(self.rows_total());
        };
        let mut gone = std::mem::take(&mut stored.loaded);
        let stored = self.stored()?;
        let mut rows = read_count(stored.store.as_ref(), ROWS, OP)?;
        let mut timers = read_count(stored.store.as_ref(), TIMERS, OP)?;
        let mut w = StoreWrites::default();
        let mut puts = Vec::new();
        for (k, e) in &self.store {
            let value = self.encode_state(&e.state);
            if gone.get(k).is_some_and(|old| old.value == value) {
                gone.remove(k);
                continue;
            }
            puts.push((k, value));
        }
        // The old index entries of the keys that changed or left go first; a changed
        // key's new ones follow.
        for (k, old) in &gone {
            for t in &old.timers {
                w.delete(time_key(&[BY_TIMER], *t, k));
            }
            if let Some(x) = old.expiry {
                w.delete(time_key(&[BY_EXPIRY], x, k));
            }
            w.delete(tagged(KEY, k));
            rows = rows.saturating_sub(old.rows);
            timers = timers.saturating_sub(old.timers.len() as u64);
        }
        for (k, value) in puts {
            let state = &self.store[k].state;
            rows += state_rows(state);
            timers += state.timers().len() as u64;
            Self::put_key(k, state, value, &mut w);
        }
        self.finish_writes(w, rows, timers)?;
        Ok(rows)
    }

    /// Writes `w` with the counters (`rows` state rows, `timers` timers), then drops
    /// the keys from memory.
    fn finish_writes(&mut self, mut w: StoreWrites, rows: u64, timers: u64) -> Result<()> {
        w.put(ROWS.to_vec(), rows.to_le_bytes().to_vec());
        w.put(TIMERS.to_vec(), timers.to_le_bytes().to_vec());
        let stored = self
            .stored
            .as_mut()
            .ok_or_else(|| Error::engine("internal: the processor has no state store"))?;
        stored.store.write(w)?;
        stored.timers = timers;
        self.store.clear();
        Ok(())
    }

    /// Replaces what the store holds with the state in memory, then drops it from
    /// memory (a restore from a snapshot).
    pub(super) fn replace_stored(&mut self) -> Result<()> {
        let Some(stored) = self.stored.as_mut() else {
            return Ok(());
        };
        clear_store(stored.store.as_mut())?;
        stored.loaded.clear();
        let mut w = StoreWrites::default();
        let (mut rows, mut timers) = (0u64, 0u64);
        for (k, e) in &self.store {
            rows += state_rows(&e.state);
            timers += e.state.timers().len() as u64;
            Self::put_key(k, &e.state, self.encode_state(&e.state), &mut w);
        }
        self.finish_writes(w, rows, timers)
    }

    /// Every key of the store with its state (for a snapshot).
    pub(super) fn stored_entries(&self) -> Result<BTreeMap<Vec<u8>, Entry>> {
        let mut raw = Vec::new();
        self.stored()?
            .store
            .scan(&[KEY], Some(&[KEY + 1]), &mut |k, v| {
                raw.push((k[1..].to_vec(), v.to_vec()));
                Ok(true)
            })?;
        raw.into_iter()
            .map(|(k, v)| {
                let entry = Entry {
                    key: Arc::new(self.key_of(&k)?),
                    state: self.decode_state(&v)?,
                };
                Ok((k, entry))
            })
            .collect()
    }

    /// The earliest timer of the store.
    pub(super) fn first_stored_timer(&self) -> Result<Option<i64>> {
        let mut first = None;
        self.stored()?
            .store
            .scan(&[BY_TIMER], Some(&[BY_TIMER + 1]), &mut |k, _| {
                first = unordered(k.get(1..).unwrap_or_default());
                Ok(false)
            })?;
        Ok(first)
    }
}
