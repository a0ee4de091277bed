//! Session windows in a [`StateStore`] (`state_store: disk`): the store holds every
//! session; a micro-batch loads into memory the sessions of the keys its rows carry (a
//! new row may merge with any of them), the sessions the watermark closes and those
//! whose TTL ran out (complete mode: all, as it emits all), runs as in memory, writes
//! back the sessions it created, merged or changed, deletes those that left, and drops
//! them from memory again.
//!
//! Layout of the store (besides the group count `m` of [`super::stored`]):
//!
//! ```text
//! s <id>                        → the session (`encode_group`)
//! x <end, ordered> <id>         → ""   closed once the watermark reaches its end
//! p <updated ms, ordered> <id>  → ""   with a state TTL
//! ```
//!
//! where `<id>` is `<key length, u32 BE> <key> <start, ordered>`: a key's sessions are
//! one range of keys, by start. The indexes are kept exact (a session's entries go with
//! it).

use super::stored::{BY_UPDATE, COUNT, OP};
use super::*;
use crate::streaming::store_layout::{
    key_prefix, keyed_id, ordered, prefix_end, split_keyed_id, through, time_key, unordered,
};
use etlantic_runtime::state_store::StoreWrites;

const SESSION: u8 = b's';
const BY_END: u8 = b'x';

fn session_id(key: &[u8], start: i64) -> Vec<u8> {
    keyed_id(key, ordered(start))
}

fn tagged(tag: u8, id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + id.len());
    out.push(tag);
    out.extend_from_slice(id);
    out
}

impl AggregateOperator {
    /// Puts session `g` and its index entries into `w`.
    pub(super) fn put_session(&self, g: &Group, w: &mut StoreWrites) -> Result<()> {
        let id = session_id(g.key.row().as_ref(), g.start);
        w.put(time_key(&[BY_END], g.end, &id), Vec::new());
        if let (Some(_), Some(t)) = (self.ttl, g.updated_ms) {
            w.put(time_key(&[BY_UPDATE], t, &id), Vec::new());
        }
        w.put(tagged(SESSION, &id), self.encode_group(&g.as_ref())?);
        Ok(())
    }

    /// The session stored under `id` with value `value`.
    fn decode_session(&self, id: &[u8], value: &[u8]) -> Result<Group> {
        let (key, start) = split_keyed_id(id)
            .ok_or_else(|| corrupt_state(OP, "a session id of the state store is malformed"))?;
        let g = self.decode_group(value)?;
        Ok(Group {
            // Any 8 bytes are a time.
            start: unordered(&start).unwrap_or_default(),
            end: g.end,
            key: self.keys.parser().parse(key).owned(),
            event_key: g.event_key,
            accs: g.accs,
            updated: false,
            updated_ms: g.updated_ms,
        })
    }

    /// Every session of the store whose key starts with `from` (after the tag) up to
    /// `to`, as (id, value).
    fn scan_sessions(&self, from: &[u8], to: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        self.stored()?.store.scan(from, Some(to), &mut |k, v| {
            out.push((k[1..].to_vec(), v.to_vec()));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Loads the sessions a micro-batch of `input` can touch (see the module docs).
    pub(super) fn load_sessions(&mut self, input: &[RecordBatch], ctx: &OpContext) -> Result<()> {
        if self.stored.is_none() {
            return Ok(());
        }
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if ctx.output_mode == OutputMode::Complete {
            found = self.scan_sessions(&[SESSION], &[SESSION + 1])?;
        } else {
            let mut keys: Vec<Vec<u8>> = Vec::new();
            for batch in input.iter().filter(|b| b.num_rows() > 0) {
                let cols = self.key_columns(batch)?;
                let rows = self.keys.convert_columns(&cols).map_err(Error::engine)?;
                keys.extend(
                    rows.iter()
                        .map(|r| tagged(SESSION, &key_prefix(r.as_ref()))),
                );
            }
            keys.sort_unstable();
            keys.dedup();
            for from in &keys {
                found.extend(self.scan_sessions(from, &prefix_end(from))?);
            }
            // Sessions found through an index: closed by the watermark, expired.
            let mut bounds = Vec::new();
            if ctx.has_watermark {
                bounds.push((BY_END, ctx.evict_watermark_us));
            }
            if let Some(ttl) = self.ttl {
                bounds.push((
                    BY_UPDATE,
                    ctx.processing_time_ms.saturating_sub(ttl.millis()),
                ));
            }
            let stored = self.stored()?;
            let held: HashMap<&[u8], ()> =
                found.iter().map(|(id, _)| (id.as_slice(), ())).collect();
            let mut ids: Vec<Vec<u8>> = Vec::new();
            for (tag, bound) in bounds {
                stored
                    .store
                    .scan(&[tag], Some(&through(&[tag], bound)), &mut |k, _| {
                        let id = k.get(9..).unwrap_or_default();
                        if !held.contains_key(id) {
                            ids.push(id.to_vec());
                        }
                        Ok(true)
                    })?;
            }
            drop(held);
            ids.sort_unstable();
            ids.dedup();
            let entries: Vec<Vec<u8>> = ids.iter().map(|id| tagged(SESSION, id)).collect();
            let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
            let values = stored.store.get_many(&refs)?;
            for (id, value) in ids.into_iter().zip(values) {
                let value = value.ok_or_else(|| {
                    corrupt_state(OP, "an index entry names a session the store does not hold")
                })?;
                found.push((id, value));
            }
        }
        let ttl = self.ttl;
        for (id, value) in found {
            let g = self.decode_session(&id, &value)?;
            let updated = g.updated_ms.filter(|_| ttl.is_some());
            if let Some(stored) = self.stored.as_mut() {
                stored.sessions_loaded.insert(id, (g.end, updated));
            }
            self.sessions
                .entry(g.key.row().as_ref().to_vec())
                .or_default()
                .push(g);
        }
        for list in self.sessions.values_mut() {
            list.sort_by_key(|g| g.start);
        }
        Ok(())
    }

    /// Writes back a micro-batch's sessions: deletes the loaded ones that left or
    /// changed, puts the new and changed ones, then drops them all from memory.
    pub(super) fn write_back_sessions(&mut self) -> Result<()> {
        let Some(stored) = self.stored.as_mut() else {
            return Ok(());
        };
        let mut gone = std::mem::take(&mut stored.sessions_loaded);
        let mut count = self.stored()?.count()?;
        let mut put = Vec::new();
        for g in self.sessions.values().flatten() {
            let id = session_id(g.key.row().as_ref(), g.start);
            let updated = g.updated_ms.filter(|_| self.ttl.is_some());
            // A loaded session the micro-batch left as it was stays as it is.
            if !g.updated && gone.get(&id) == Some(&(g.end, updated)) {
                gone.remove(&id);
                continue;
            }
            put.push(g);
        }
        let mut w = StoreWrites::default();
        for (id, (end, updated)) in gone {
            w.delete(time_key(&[BY_END], end, &id));
            if let Some(t) = updated {
                w.delete(time_key(&[BY_UPDATE], t, &id));
            }
            w.delete(tagged(SESSION, &id));
            count = count.saturating_sub(1);
        }
        for g in put {
            self.put_session(g, &mut w)?;
            count += 1;
        }
        w.put(COUNT.to_vec(), count.to_le_bytes().to_vec());
        let stored = self.stored.as_mut().expect("checked above");
        stored.store.write(w)?;
        self.sessions.clear();
        Ok(())
    }

    /// Every session of the store, sorted by key and start (a snapshot's order).
    pub(super) fn stored_sessions(&self) -> Result<Vec<Group>> {
        let mut all = self
            .scan_sessions(&[SESSION], &[SESSION + 1])?
            .into_iter()
            .map(|(id, value)| self.decode_session(&id, &value))
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| (a.key.row(), a.start).cmp(&(b.key.row(), b.start)));
        Ok(all)
    }
}
