//! The deduplication's state in a [`StateStore`] (the profile's `state_store: disk`): the
//! keys seen, on disk, with indexes ordered by time so that the watermark and the TTL
//! forget keys by range scans and range deletes, never by reading every key.
//!
//! Layout of the store (keys are byte strings, compared bytewise):
//!
//! ```text
//! k <row-encoded key>                  → Seen (17 bytes, see `encode`)
//! e <event time, ordered> <key>        → ""   when the watermark can evict the key
//! p <first seen ms, ordered> <key>     → ""   when a TTL is set
//! m                                    → keys held (u64 LE)
//! ```
//!
//! An index entry may outlive its key (a key the TTL forgot keeps its `e` entry until
//! the watermark passes it; a key forgotten and seen again gets new entries): an entry
//! whose key is gone, or whose key holds another time, is skipped, and the range delete
//! that passes it removes it.

use super::dedup::Seen;
use super::StateStore;
use crate::streaming::store_layout::{read_count, through, time_key, unordered};
use etlantic_core::diagnostics::Result;
use etlantic_runtime::state_store::StoreWrites;

const KEY: u8 = b'k';
const BY_EVENT_TIME: u8 = b'e';
const BY_FIRST_SEEN: u8 = b'p';
const COUNT: &[u8] = b"m";
/// Past every prefix above.
const END: &[u8] = &[0xff];

/// The time and key of an index entry.
fn split_index(entry: &[u8]) -> Option<(i64, &[u8])> {
    Some((unordered(entry.get(1..)?)?, entry.get(9..)?))
}

fn key_entry(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(KEY);
    out.extend_from_slice(key);
    out
}

/// A [`Seen`] as 17 bytes: a flags byte (bit 0: has a value, bit 1: has a first-seen
/// time), then both as i64 LE (0 when absent).
fn encode(seen: Seen) -> [u8; 17] {
    let mut out = [0u8; 17];
    out[0] = u8::from(seen.value.is_some()) | (u8::from(seen.first_seen_ms.is_some()) << 1);
    out[1..9].copy_from_slice(&seen.value.unwrap_or(0).to_le_bytes());
    out[9..17].copy_from_slice(&seen.first_seen_ms.unwrap_or(0).to_le_bytes());
    out
}

fn decode(bytes: &[u8], operator: &str) -> Result<Seen> {
    let bad = || super::corrupt_state(operator, "a dedup key's entry is not 17 bytes");
    let fixed: &[u8; 17] = bytes.try_into().map_err(|_| bad())?;
    let int = |at: usize| i64::from_le_bytes(fixed[at..at + 8].try_into().expect("8 bytes"));
    Ok(Seen {
        value: (fixed[0] & 1 != 0).then(|| int(1)),
        first_seen_ms: (fixed[0] & 2 != 0).then(|| int(9)),
    })
}

/// The keys a dedup has seen, in a store.
pub(super) struct StoredKeys {
    pub(super) store: Box<dyn StateStore>,
    /// Whether keys are indexed by event time (the watermark can evict them).
    pub(super) by_event_time: bool,
    /// Whether keys are indexed by first-seen time (a TTL is set).
    pub(super) by_first_seen: bool,
}

impl StoredKeys {
    /// Keys held.
    pub(super) fn count(&self) -> Result<u64> {
        read_count(self.store.as_ref(), COUNT, "dedup")
    }

    /// Which of `keys` (distinct) are held.
    pub(super) fn held(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        let entries: Vec<Vec<u8>> = keys.iter().map(|k| key_entry(k)).collect();
        let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
        Ok(self
            .store
            .get_many(&refs)?
            .into_iter()
            .map(|v| v.is_some())
            .collect())
    }

    /// Adds `added` (keys not held) and sets the count to `count`.
    pub(super) fn add(&mut self, added: &[(Box<[u8]>, Seen)], count: u64) -> Result<()> {
        let mut w = StoreWrites::default();
        for (key, seen) in added {
            w.put(key_entry(key), encode(*seen).to_vec());
            if let (true, Some(t)) = (self.by_event_time, seen.value) {
                w.put(time_key(&[BY_EVENT_TIME], t, key), Vec::new());
            }
            if let (true, Some(t)) = (self.by_first_seen, seen.first_seen_ms) {
                w.put(time_key(&[BY_FIRST_SEEN], t, key), Vec::new());
            }
        }
        w.put(COUNT.to_vec(), count.to_le_bytes().to_vec());
        self.store.write(w)
    }

    /// Forgets the keys whose index `prefix` time is at or before `t` (event time for the
    /// watermark, first-seen time for the TTL); returns how many.
    pub(super) fn forget_through(&mut self, prefix: u8, t: i64, operator: &str) -> Result<u64> {
        let upper = through(&[prefix], t);
        let mut entries: Vec<Vec<u8>> = Vec::new();
        self.store.scan(&[prefix], Some(&upper), &mut |k, _| {
            entries.push(k.to_vec());
            Ok(true)
        })?;
        if entries.is_empty() {
            return Ok(0);
        }
        let indexed: Vec<(i64, &[u8])> = entries
            .iter()
            .map(|e| {
                split_index(e).ok_or_else(|| super::corrupt_state(operator, "a short index entry"))
            })
            .collect::<Result<_>>()?;
        let keys: Vec<&[u8]> = indexed.iter().map(|(_, k)| *k).collect();
        let key_entries: Vec<Vec<u8>> = keys.iter().map(|k| key_entry(k)).collect();
        let refs: Vec<&[u8]> = key_entries.iter().map(|e| e.as_slice()).collect();
        let values = self.store.get_many(&refs)?;
        let mut w = StoreWrites::default();
        let mut forgotten = 0u64;
        for (((at, key), entry), value) in indexed.iter().zip(&key_entries).zip(values) {
            let Some(value) = value else { continue };
            let seen = decode(&value, operator)?;
            let indexed_time = match prefix {
                BY_EVENT_TIME => seen.value,
                _ => seen.first_seen_ms,
            };
            if indexed_time != Some(*at) {
                continue;
            }
            w.delete(entry.clone());
            // The key's entry in the other index goes with it.
            match (prefix, seen.value, seen.first_seen_ms) {
                (BY_FIRST_SEEN, Some(v), _) if self.by_event_time => {
                    w.delete(time_key(&[BY_EVENT_TIME], v, key))
                }
                (BY_EVENT_TIME, _, Some(f)) if self.by_first_seen => {
                    w.delete(time_key(&[BY_FIRST_SEEN], f, key))
                }
                _ => {}
            }
            forgotten += 1;
        }
        w.delete_range(vec![prefix], upper);
        let count = self.count()?.saturating_sub(forgotten);
        w.put(COUNT.to_vec(), count.to_le_bytes().to_vec());
        self.store.write(w)?;
        Ok(forgotten)
    }

    /// Forgets keys by the watermark: those whose event time is at or before `wm`.
    pub(super) fn forget_by_watermark(&mut self, wm: i64, operator: &str) -> Result<u64> {
        if !self.by_event_time {
            return Ok(0);
        }
        self.forget_through(BY_EVENT_TIME, wm, operator)
    }

    /// Forgets keys by the TTL: those first seen at or before `seen_by`.
    pub(super) fn forget_by_ttl(&mut self, seen_by: i64, operator: &str) -> Result<u64> {
        if !self.by_first_seen {
            return Ok(0);
        }
        self.forget_through(BY_FIRST_SEEN, seen_by, operator)
    }

    /// Every key held and what is kept of it, in key order.
    pub(super) fn all(&self, operator: &str) -> Result<Vec<(Box<[u8]>, Seen)>> {
        let mut out = Vec::new();
        let mut failed = None;
        self.store.scan(&[KEY], Some(&[KEY + 1]), &mut |k, v| {
            match decode(v, operator) {
                Ok(seen) => out.push((k[1..].into(), seen)),
                Err(e) => {
                    failed = Some(e);
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Replaces what the store holds with `entries`.
    pub(super) fn replace(&mut self, entries: &[(Box<[u8]>, Seen)]) -> Result<()> {
        let mut w = StoreWrites::default();
        w.delete_range(vec![0], END.to_vec());
        self.store.write(w)?;
        self.add(entries, entries.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_split_and_seen_round_trips() {
        for t in [i64::MIN, -1, 0, i64::MAX] {
            assert_eq!(
                split_index(&time_key(&[BY_EVENT_TIME], t, b"key")),
                Some((t, &b"key"[..]))
            );
        }
        assert_eq!(split_index(b"e123"), None);
        let seen = Seen {
            value: Some(-3),
            first_seen_ms: None,
        };
        assert_eq!(decode(&encode(seen), "t").unwrap(), seen);
        assert!(decode(b"short", "t").is_err());
    }
}
