//! A stream-stream join's buffered rows in a [`StateStore`] (`state_store: disk`): the
//! store holds every row of both sides; a micro-batch loads into the in-memory
//! [`SideState`]s only the rows it can touch — a side's rows of the keys the other side's
//! input carries (they may match), and of a unique side also those of its own input's
//! keys (a repeated key is rejected); the rows the state watermark evicts; those whose
//! TTL ran out — runs as in memory, writes back what it added, changed and removed, and
//! drops them from memory again.
//!
//! Layout of the store (`s`: 0 the left side, 1 the right):
//!
//! ```text
//! r s <id>                        → the row (see `encode_row`)
//! e s <evict time, ordered> <id>  → ""   a side evicted by a state watermark
//! p s <updated ms, ordered> <id>  → ""   with a state TTL
//! n s                             → the side's next arrival number (u64 LE)
//! m s                             → rows the side holds (u64 LE)
//! ```
//!
//! where `<id>` is `<key length, u32 BE> <key> <seq, BE>`: the rows of a key are one
//! range of keys, in arrival order. The indexes are kept exact (a row's entries go with
//! it), so a scan of one finds only rows that are there.

use super::*;
use crate::streaming::store_layout::{
    clear_store, key_prefix, keyed_id, prefix_end, read_count, split_keyed_id, through, time_key,
};
use etlantic_runtime::engine::{corrupt_state, store_unsupported};
use etlantic_runtime::state_store::{StateStore, StoreWrites};
use std::collections::BTreeMap;

const ROW: u8 = b'r';
const BY_EVICT: u8 = b'e';
const BY_UPDATE: u8 = b'p';
const NEXT_SEQ: u8 = b'n';
const COUNT: u8 = b'm';
const OP: &str = "stream join";
/// Bytes of a row's value before its values: flags, range, eviction and update times.
const HEADER: usize = 25;

/// `tag`, the side, then `rest`.
fn tagged(tag: u8, side: usize, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + rest.len());
    out.push(tag);
    out.push(side as u8);
    out.extend_from_slice(rest);
    out
}

fn row_id(key: &[u8], seq: u64) -> Vec<u8> {
    keyed_id(key, seq.to_be_bytes())
}

/// The key and arrival number of an id.
fn split_id(id: &[u8]) -> Result<(&[u8], u64)> {
    split_keyed_id(id)
        .map(|(key, seq)| (key, u64::from_be_bytes(seq)))
        .ok_or_else(|| corrupt_state(OP, "a row id of the state store is malformed"))
}

/// An optional time as 8 bytes (`i64::MIN`: none, which an `OptTime` never holds).
fn time_bytes(t: Option<i64>) -> [u8; 8] {
    t.unwrap_or(i64::MIN).to_le_bytes()
}

/// A row's value: flags (bit 0: matched), its range, eviction and update times
/// ([`time_bytes`]), then its values in Arrow's row format.
fn encode_row(e: &Entry, values: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + values.len());
    out.push(u8::from(e.matched));
    out.extend_from_slice(&time_bytes(e.range_time.get()));
    out.extend_from_slice(&time_bytes(e.evict_time.get()));
    out.extend_from_slice(&time_bytes(e.updated_ms.get()));
    out.extend_from_slice(values);
    out
}

/// The entry a row's value describes (its chunk and row still to be set).
fn decode_entry(seq: u64, value: &[u8]) -> Result<Entry> {
    let bad = || corrupt_state(OP, "a row of the state store is too short");
    let time = |at: usize| -> Result<OptTime> {
        let b: [u8; 8] = value
            .get(at..at + 8)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?;
        let t = i64::from_le_bytes(b);
        Ok((t != i64::MIN).then_some(t).into())
    };
    Ok(Entry {
        seq,
        chunk: 0,
        row: 0,
        matched: value.first().ok_or_else(bad)? & 1 != 0,
        range_time: time(1)?,
        evict_time: time(9)?,
        updated_ms: time(17)?,
    })
}

/// A row of the micro-batch's working set: its id, and the times it is indexed by (so
/// that its index entries go with it).
struct Loaded {
    id: Vec<u8>,
    evict: Option<i64>,
    updated: Option<i64>,
}

/// The store of a join's buffered rows, and which of them a micro-batch has in memory.
pub(super) struct StoredSides {
    pub(super) store: Box<dyn StateStore>,
    /// Encodes each side's rows for the store (Arrow's row format over its columns).
    values: [RowConverter; 2],
    /// The rows in memory this micro-batch, by side and arrival number.
    loaded: [FastMap<u64, Loaded>; 2],
}

impl StoredSides {
    /// Rows held by both sides.
    pub(super) fn count(&self) -> Result<u64> {
        let store = self.store.as_ref();
        Ok(read_count(store, &[COUNT, LEFT as u8], OP)?
            + read_count(store, &[COUNT, RIGHT as u8], OP)?)
    }
}

impl StreamJoinOperator {
    /// Keeps both sides' rows in `store` from now on, starting empty.
    pub(super) fn use_stored(&mut self, store: Box<dyn StateStore>) -> Result<()> {
        let converter = |side: usize| {
            let fields: Vec<SortField> = self
                .spec(side)
                .schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            RowConverter::new(fields).map_err(|e| {
                store_unsupported(
                    "symmetricHashJoin",
                    format!(
                        "a column of its {} input has a type the store cannot hold: {e}",
                        side_name(side)
                    ),
                )
            })
        };
        let values = [converter(LEFT)?, converter(RIGHT)?];
        self.sides = [
            SideState::new(self.hasher.clone()),
            SideState::new(self.hasher.clone()),
        ];
        self.stored = Some(StoredSides {
            store,
            values,
            loaded: Default::default(),
        });
        Ok(())
    }

    fn stored(&self) -> Result<&StoredSides> {
        self.stored
            .as_ref()
            .ok_or_else(|| Error::engine("internal: the join has no state store"))
    }

    /// Loads the rows a micro-batch of `inputs` (left, right) can touch: those of the
    /// keys of its rows, those the state watermark of `ctx` evicts, those whose TTL ran
    /// out at its processing time.
    pub(super) fn load_working_set(
        &mut self,
        inputs: [&[RecordBatch]; 2],
        ctx: &OpContext,
    ) -> Result<()> {
        if self.stored.is_none() {
            return Ok(());
        }
        // The distinct keys of each side's input rows; null keys never match (unless
        // null-safe, when `key_rows` marks none).
        let mut input_keys: [Vec<Vec<u8>>; 2] = Default::default();
        for side in [LEFT, RIGHT] {
            for batch in inputs[side].iter().filter(|b| b.num_rows() > 0) {
                let (rows, null_key) = self.key_rows(side, batch)?;
                input_keys[side].extend(
                    (0..rows.num_rows())
                        .filter(|i| !null_key[*i])
                        .map(|i| key_prefix(rows.row(i).as_ref())),
                );
            }
            input_keys[side].sort_unstable();
            input_keys[side].dedup();
        }
        let ttl_bound = self
            .ttl
            .map(|t| ctx.processing_time_ms.saturating_sub(t.millis()));
        for side in [LEFT, RIGHT] {
            // A side's rows meet the other side's input; a unique side's rows also its
            // own input, whose repeated keys they reject.
            let mut keys = input_keys[1 - side].clone();
            if self.unique[side] {
                keys.extend(input_keys[side].iter().cloned());
            }
            keys.sort_unstable();
            keys.dedup();
            let threshold = self.threshold_us(side, ctx);
            let stored = self.stored()?;
            // Arrival number → (id, value): the side's rows in arrival order.
            let mut found: BTreeMap<u64, (Vec<u8>, Vec<u8>)> = BTreeMap::new();
            for key in &keys {
                let from = tagged(ROW, side, key);
                let to = prefix_end(&from);
                let mut failed = None;
                stored.store.scan(&from, Some(&to), &mut |k, v| {
                    let id = &k[2..];
                    match split_id(id) {
                        Ok((_, seq)) => {
                            found.insert(seq, (id.to_vec(), v.to_vec()));
                            Ok(true)
                        }
                        Err(e) => {
                            failed = Some(e);
                            Ok(false)
                        }
                    }
                })?;
                if let Some(e) = failed {
                    return Err(e);
                }
            }
            let mut ids: Vec<Vec<u8>> = Vec::new();
            let indexed = [(BY_EVICT, threshold), (BY_UPDATE, ttl_bound)];
            for (tag, bound) in indexed {
                let Some(bound) = bound else { continue };
                let prefix = [tag, side as u8];
                stored
                    .store
                    .scan(&prefix, Some(&through(&prefix, bound)), &mut |k, _| {
                        ids.push(k.get(10..).unwrap_or_default().to_vec());
                        Ok(true)
                    })?;
            }
            let mut missing = Vec::new();
            for id in ids {
                let (_, seq) = split_id(&id)?;
                if !found.contains_key(&seq) {
                    missing.push((seq, id));
                }
            }
            missing.sort_unstable();
            missing.dedup();
            let row_keys: Vec<Vec<u8>> = missing
                .iter()
                .map(|(_, id)| tagged(ROW, side, id))
                .collect();
            let refs: Vec<&[u8]> = row_keys.iter().map(Vec::as_slice).collect();
            let values = stored.store.get_many(&refs)?;
            for ((seq, id), value) in missing.into_iter().zip(values) {
                let value = value.ok_or_else(|| {
                    corrupt_state(OP, "an index entry names a row the store does not hold")
                })?;
                found.insert(seq, (id, value));
            }
            let next_seq = read_count(stored.store.as_ref(), &[NEXT_SEQ, side as u8], OP)?;
            self.fill_side(side, found, next_seq)?;
        }
        Ok(())
    }

    /// Replaces a side's in-memory state by the rows `found` (arrival number → id and
    /// value), going on from arrival number `next_seq`.
    fn fill_side(
        &mut self,
        side: usize,
        found: BTreeMap<u64, (Vec<u8>, Vec<u8>)>,
        next_seq: u64,
    ) -> Result<()> {
        let mut st = SideState::new(self.hasher.clone());
        let schema = self.spec(side).schema.clone();
        let stored = self
            .stored
            .as_mut()
            .ok_or_else(|| Error::engine("internal: the join has no state store"))?;
        stored.loaded[side].clear();
        if !found.is_empty() {
            let batch = decode_rows(&stored.values[side], &schema, found.values())?;
            let chunk = st.add_chunk(batch);
            for (row, (seq, (id, value))) in found.into_iter().enumerate() {
                let (key, _) = split_id(&id)?;
                let mut e = decode_entry(seq, &value)?;
                e.chunk = chunk;
                e.row = row as u32;
                st.insert_at(seq, key, e);
                stored.loaded[side].insert(
                    seq,
                    Loaded {
                        evict: e.evict_time.get(),
                        updated: e.updated_ms.get().filter(|_| self.ttl.is_some()),
                        id,
                    },
                );
            }
        }
        st.resume_at(next_seq);
        self.sides[side] = st;
        Ok(())
    }

    /// Writes `entries` of `side` (each with its key's bytes) into `w`: their rows and
    /// their index entries, replacing those of the rows `loaded` holds. Returns how
    /// many of them are new to the store.
    fn put_rows(
        &self,
        side: usize,
        entries: &[(Entry, Vec<u8>)],
        w: &mut StoreWrites,
    ) -> Result<u64> {
        let stored = self.stored()?;
        if entries.is_empty() {
            return Ok(0);
        }
        let refs: Vec<Option<RowRef>> = entries
            .iter()
            .map(|(e, _)| Some((e.chunk, e.row)))
            .collect();
        let cols = self.gather(side, &refs)?;
        let rows = stored.values[side]
            .convert_columns(&cols)
            .map_err(Error::engine)?;
        let mut added = 0;
        for (i, (e, key)) in entries.iter().enumerate() {
            let id = row_id(key, e.seq);
            let updated = e.updated_ms.get().filter(|_| self.ttl.is_some());
            match stored.loaded[side].get(&e.seq) {
                // A changed row: only its update time can have moved.
                Some(old) => {
                    if old.updated != updated {
                        if let Some(t) = old.updated {
                            w.delete(time_key(&[BY_UPDATE, side as u8], t, &id));
                        }
                        if let Some(t) = updated {
                            w.put(time_key(&[BY_UPDATE, side as u8], t, &id), Vec::new());
                        }
                    }
                }
                None => {
                    added += 1;
                    if let Some(t) = e.evict_time.get() {
                        w.put(time_key(&[BY_EVICT, side as u8], t, &id), Vec::new());
                    }
                    if let Some(t) = updated {
                        w.put(time_key(&[BY_UPDATE, side as u8], t, &id), Vec::new());
                    }
                }
            }
            w.put(tagged(ROW, side, &id), encode_row(e, rows.row(i).as_ref()));
        }
        Ok(added)
    }

    /// Writes back a micro-batch: the rows it added or changed, the deletion of those it
    /// removed (evicted, expired, released), each side's count and next arrival number;
    /// then drops the rows from memory.
    pub(super) fn write_back(&mut self) -> Result<()> {
        if self.stored.is_none() {
            return Ok(());
        }
        let mut w = StoreWrites::default();
        for side in [LEFT, RIGHT] {
            let (upserts, removed) = self.sides[side].take_keyed_changes();
            let stored = self.stored()?;
            let mut count = read_count(stored.store.as_ref(), &[COUNT, side as u8], OP)?;
            for seq in removed {
                let old = stored.loaded[side].get(&seq).ok_or_else(|| {
                    Error::engine("internal: the join removed a row it had not loaded")
                })?;
                w.delete(tagged(ROW, side, &old.id));
                if let Some(t) = old.evict {
                    w.delete(time_key(&[BY_EVICT, side as u8], t, &old.id));
                }
                if let Some(t) = old.updated {
                    w.delete(time_key(&[BY_UPDATE, side as u8], t, &old.id));
                }
                count = count.saturating_sub(1);
            }
            count += self.put_rows(side, &upserts, &mut w)?;
            w.put(vec![COUNT, side as u8], count.to_le_bytes().to_vec());
            let next = self.sides[side].next_seq();
            w.put(vec![NEXT_SEQ, side as u8], next.to_le_bytes().to_vec());
        }
        self.clear_working_set(w)
    }

    /// Writes `w`, then drops the working set from memory.
    fn clear_working_set(&mut self, w: StoreWrites) -> Result<()> {
        let hasher = self.hasher.clone();
        let stored = self
            .stored
            .as_mut()
            .ok_or_else(|| Error::engine("internal: the join has no state store"))?;
        stored.store.write(w)?;
        stored.loaded = Default::default();
        self.sides = [SideState::new(hasher.clone()), SideState::new(hasher)];
        Ok(())
    }

    /// Replaces what the store holds with the rows in memory, then drops them from
    /// memory (a restore from a snapshot).
    pub(super) fn replace_stored(&mut self) -> Result<()> {
        let Some(stored) = self.stored.as_mut() else {
            return Ok(());
        };
        clear_store(stored.store.as_mut())?;
        stored.loaded = Default::default();
        let mut w = StoreWrites::default();
        for side in [LEFT, RIGHT] {
            let entries = self.sides[side].keyed_entries();
            let count = self.put_rows(side, &entries, &mut w)?;
            w.put(vec![COUNT, side as u8], count.to_le_bytes().to_vec());
            let next = self.sides[side].next_seq();
            w.put(vec![NEXT_SEQ, side as u8], next.to_le_bytes().to_vec());
        }
        self.clear_working_set(w)
    }

    /// Every row of `side` in the store, in arrival order: their entries (`chunk` 0,
    /// `row` their position) and their values.
    pub(super) fn stored_side(&self, side: usize) -> Result<(Vec<Entry>, Vec<ArrayRef>)> {
        let stored = self.stored()?;
        let from = [ROW, side as u8];
        let mut found: BTreeMap<u64, (Vec<u8>, Vec<u8>)> = BTreeMap::new();
        let mut failed = None;
        stored
            .store
            .scan(&from, Some(&prefix_end(&from)), &mut |k, v| {
                match split_id(&k[2..]) {
                    Ok((_, seq)) => {
                        found.insert(seq, (Vec::new(), v.to_vec()));
                    }
                    Err(e) => {
                        failed = Some(e);
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
        if let Some(e) = failed {
            return Err(e);
        }
        let schema = &self.spec(side).schema;
        let batch = decode_rows(&stored.values[side], schema, found.values())?;
        let entries = found
            .iter()
            .enumerate()
            .map(|(row, (seq, (_, value)))| {
                let mut e = decode_entry(*seq, value)?;
                e.row = row as u32;
                Ok(e)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((entries, batch.columns().to_vec()))
    }
}

/// The values of stored rows (`(id, value)`) as a batch of `schema`.
fn decode_rows<'a>(
    converter: &RowConverter,
    schema: &SchemaRef,
    rows: impl Iterator<Item = &'a (Vec<u8>, Vec<u8>)>,
) -> Result<RecordBatch> {
    let parser = converter.parser();
    let mut values = Vec::new();
    for (_, value) in rows {
        let bytes = value
            .get(HEADER..)
            .ok_or_else(|| corrupt_state(OP, "a row of the state store is too short"))?;
        values.push(parser.parse(bytes));
    }
    let cols = converter
        .convert_rows(values)
        .map_err(|e| corrupt_state(OP, format!("a row of the state store is unreadable: {e}")))?;
    let cols = cols
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                cast(&c, f.data_type()).map_err(Error::engine)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if cols.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    RecordBatch::try_new(schema.clone(), cols.clone())
        .or_else(|_| RecordBatch::try_new(relaxed(schema), cols))
        .map_err(Error::engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_rows_round_trip() {
        for (key, seq) in [(&b""[..], 0u64), (b"abc", 7), (b"\xff\x00", u64::MAX)] {
            assert_eq!(split_id(&row_id(key, seq)).unwrap(), (key, seq));
        }
        assert!(split_id(b"\x00\x00\x00\x09ab").is_err());
        let e = Entry {
            seq: 3,
            chunk: 0,
            row: 0,
            range_time: Some(-5).into(),
            evict_time: None.into(),
            updated_ms: Some(i64::MIN + 1).into(),
            matched: true,
        };
        let d = decode_entry(3, &encode_row(&e, b"values")).unwrap();
        assert_eq!(
            (d.matched, d.range_time, d.evict_time, d.updated_ms),
            (e.matched, e.range_time, e.evict_time, e.updated_ms)
        );
        assert!(decode_entry(0, b"short").is_err());
    }
}
