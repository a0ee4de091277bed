//! Byte layouts shared by the operators that keep their state in a
//! [`etlantic_runtime::state_store::StateStore`]: times that sort as bytes (for indexes
//! evicted by range scans and range deletes), the bounds of such ranges, and counters.
//!
//! A store compares keys bytewise, so an index by time puts the time first, encoded so
//! that bytes compare like the numbers: big endian with the sign bit flipped.

use etlantic_core::diagnostics::Result;
use etlantic_runtime::engine::corrupt_state;
use etlantic_runtime::state_store::{StateStore, StoreWrites};

/// `t` in 8 bytes that compare like the numbers.
pub(crate) fn ordered(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The time [`ordered`] wrote in the first 8 bytes of `bytes`.
pub(crate) fn unordered(bytes: &[u8]) -> Option<i64> {
    let b: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// `prefix`, then `t` ([`ordered`]), then `rest`: an index entry.
pub(crate) fn time_key(prefix: &[u8], t: i64, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 8 + rest.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(&ordered(t));
    out.extend_from_slice(rest);
    out
}

/// The end (excluded) of the index entries of `prefix` at or before `t`.
pub(crate) fn through(prefix: &[u8], t: i64) -> Vec<u8> {
    match t.checked_add(1) {
        Some(next) => time_key(prefix, next, &[]),
        None => prefix_end(prefix),
    }
}

/// The first key after every key that starts with `prefix` (empty: past all keys,
/// which only a prefix of `0xff`s has).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    end
}

/// The prefix of the ids of `key`'s entries: the key's length (u32 BE), then the key.
/// No key's prefix starts another's, so one key's entries are one range.
pub(crate) fn key_prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + key.len());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The id of one of `key`'s entries: [`key_prefix`], then `suffix` (an arrival number,
/// an [`ordered`] time), which orders the key's entries.
pub(crate) fn keyed_id(key: &[u8], suffix: [u8; 8]) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.extend_from_slice(&suffix);
    out
}

/// The key and suffix of a [`keyed_id`].
pub(crate) fn split_keyed_id(id: &[u8]) -> Option<(&[u8], [u8; 8])> {
    let len = u32::from_be_bytes(id.get(..4)?.try_into().ok()?) as usize;
    let key = id.get(4..4 + len)?;
    let suffix = id.get(4 + len..)?.try_into().ok()?;
    Some((key, suffix))
}

/// Deletes every key of `store` (a restore from a snapshot replaces the whole state).
/// The operators' keys all start with an ASCII tag, so one range covers them.
pub(crate) fn clear_store(store: &mut dyn StateStore) -> Result<()> {
    let mut w = StoreWrites::default();
    w.delete_range(vec![0], vec![0xff]);
    store.write(w)
}

/// The counter at `key` (u64 LE; 0 when absent).
pub(crate) fn read_count(store: &dyn StateStore, key: &[u8], operator: &str) -> Result<u64> {
    match store.get(key)? {
        Some(b) => Ok(u64::from_le_bytes(b.as_slice().try_into().map_err(
            |_| corrupt_state(operator, "a counter of the state store is not 8 bytes"),
        )?)),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_order_like_their_times() {
        let times = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys: Vec<Vec<u8>> = times.iter().map(|t| time_key(b"e", *t, b"x")).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for t in times {
            let key = time_key(b"e\x01", t, b"key");
            assert_eq!(unordered(&key[2..]), Some(t));
            assert!(time_key(b"e\x01", t, b"\xff\xff") < through(b"e\x01", t));
            assert!(through(b"e\x01", t) <= prefix_end(b"e\x01"));
        }
        assert_eq!(prefix_end(b"r\x00"), b"r\x01");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert!(prefix_end(b"\xff").is_empty());
        assert_eq!(unordered(b"short"), None);
    }

    #[test]
    fn keyed_ids_round_trip_and_group_by_key() {
        for (key, suffix) in [
            (&b""[..], [0u8; 8]),
            (b"abc", ordered(-7)),
            (b"\xff", [0xff; 8]),
        ] {
            let id = keyed_id(key, suffix);
            assert_eq!(split_keyed_id(&id), Some((key, suffix)));
            assert!(id.starts_with(&key_prefix(key)));
        }
        // A key's prefix does not start a longer key's ids.
        assert!(!keyed_id(b"ab", [1; 8]).starts_with(&key_prefix(b"a")));
        assert_eq!(split_keyed_id(b"\x00\x00\x00\x09ab"), None);
        assert_eq!(split_keyed_id(&key_prefix(b"ab")), None);
    }
}
