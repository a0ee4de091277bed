//! The groups of a tumbling, sliding or plain aggregation's state, in one bucket per
//! window.
//!
//! A micro-batch folds its groups into the buckets of their windows, and a watermark
//! closes whole windows: the oldest buckets leave the store as they are and are emitted
//! from there. So eviction touches only the windows that close, not every group held
//! (a state of long windows would otherwise be scanned every micro-batch), and a group
//! allocates nothing of its own: a bucket keeps its groups' keys one after another in
//! Arrow's row format, their accumulators in one flat vector, and an index by key.
//!
//! A plain aggregation (no window) keeps all its groups in the bucket of start 0; one
//! keyed by the watermarked event time evicts group by group ([`GroupStore::remove_where`]),
//! as does a state TTL.

use super::accumulators::Acc;
use arrow::row::{Row, RowConverter, Rows};
use hashbrown::HashTable;
use std::collections::BTreeMap;
use std::hash::BuildHasher;

/// One group, as emitted or snapshotted.
#[derive(Clone, Copy)]
pub(super) struct GroupRef<'a> {
    pub start: i64,
    pub end: i64,
    pub key: Row<'a>,
    pub accs: &'a [Acc],
    pub event_key: Option<i64>,
    pub updated_ms: Option<i64>,
}

/// The groups of one window (see the module docs). Group `g`'s accumulators are
/// `accs[g * width..][..width]`.
pub(super) struct Bucket {
    end: i64,
    keys: Rows,
    hashes: Vec<u64>,
    /// Group ids by key hash.
    index: HashTable<u32>,
    accs: Vec<Acc>,
    event_keys: Vec<Option<i64>>,
    updated: Vec<bool>,
    updated_ms: Vec<Option<i64>>,
}

impl Bucket {
    fn new(converter: &RowConverter, end: i64) -> Self {
        Bucket {
            end,
            keys: converter.empty_rows(0, 0),
            hashes: Vec::new(),
            index: HashTable::new(),
            accs: Vec::new(),
            event_keys: Vec::new(),
            updated: Vec::new(),
            updated_ms: Vec::new(),
        }
    }

    /// Groups held.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    fn find(&self, hash: u64, key: Row<'_>) -> Option<usize> {
        self.index
            .find(hash, |&g| self.keys.row(g as usize) == key)
            .map(|&g| g as usize)
    }

    fn push(
        &mut self,
        hash: u64,
        key: Row<'_>,
        accs: impl Iterator<Item = Acc>,
        event_key: Option<i64>,
        updated_ms: Option<i64>,
        updated: bool,
    ) {
        let g = self.hashes.len() as u32;
        self.keys.push(key);
        self.hashes.push(hash);
        let hashes = &self.hashes;
        self.index.insert_unique(hash, g, |&i| hashes[i as usize]);
        self.accs.extend(accs);
        self.event_keys.push(event_key);
        self.updated.push(updated);
        self.updated_ms.push(updated_ms);
    }

    /// The groups, in the order they came.
    fn groups(&self, start: i64, width: usize) -> impl Iterator<Item = GroupRef<'_>> + '_ {
        (0..self.len()).map(move |g| GroupRef {
            start,
            end: self.end,
            key: self.keys.row(g),
            accs: &self.accs[g * width..(g + 1) * width],
            event_key: self.event_keys[g],
            updated_ms: self.updated_ms[g],
        })
    }

    /// Moves the groups that `remove` flags into `out` (a bucket of the same window),
    /// keeping the others in order.
    fn split(&mut self, converter: &RowConverter, remove: &[bool], width: usize, out: &mut Bucket) {
        let mut kept = Bucket::new(converter, self.end);
        let mut accs = std::mem::take(&mut self.accs).into_iter();
        for (g, &r) in remove.iter().enumerate() {
            let target = if r { &mut *out } else { &mut kept };
            target.push(
                self.hashes[g],
                self.keys.row(g),
                accs.by_ref().take(width),
                self.event_keys[g],
                self.updated_ms[g],
                self.updated[g],
            );
        }
        *self = kept;
    }
}

/// The buckets of an aggregation's state, by window start (see the module docs).
pub(super) struct GroupStore {
    buckets: BTreeMap<i64, Bucket>,
    hasher: foldhash::fast::RandomState,
    /// Accumulators per group.
    width: usize,
}

impl GroupStore {
    /// An empty store of groups with `width` accumulators each.
    pub fn new(width: usize) -> Self {
        GroupStore {
            buckets: BTreeMap::new(),
            hasher: foldhash::fast::RandomState::default(),
            width,
        }
    }

    /// Groups held.
    pub fn len(&self) -> usize {
        self.buckets.values().map(Bucket::len).sum()
    }

    /// Approximate bytes held: per group its key, its accumulators and its entries in
    /// the bucket's vectors and index.
    pub fn memory_bytes(&self) -> u64 {
        let per_group = 8 + 4 + 16 + 1 + 16 + 8;
        self.buckets
            .values()
            .map(|b| {
                (b.keys.size() + b.len() * per_group + b.accs.len() * std::mem::size_of::<Acc>())
                    as u64
            })
            .sum()
    }

    /// Every group, by window start and then in the order they came.
    pub fn groups(&self) -> impl Iterator<Item = GroupRef<'_>> + '_ {
        self.buckets
            .iter()
            .flat_map(|(start, b)| b.groups(*start, self.width))
    }

    /// The groups updated since [`GroupStore::clear_updated`].
    pub fn updated(&self) -> impl Iterator<Item = GroupRef<'_>> + '_ {
        self.buckets.iter().flat_map(|(start, b)| {
            b.groups(*start, self.width)
                .zip(&b.updated)
                .filter(|(_, u)| **u)
                .map(|(g, _)| g)
        })
    }

    /// Marks every group as not updated.
    pub fn clear_updated(&mut self) {
        for b in self.buckets.values_mut() {
            b.updated.fill(false);
        }
    }

    /// Drops every group.
    pub fn clear(&mut self) {
        self.buckets.clear();
    }

    /// Folds a group of a micro-batch into the state: merged into the group of its
    /// window and key when there is one (`merge(state, batch)`), else added with the
    /// batch's accumulators (moved out of `accs`). Returns whether the group was not
    /// updated before in this micro-batch.
    #[allow(clippy::too_many_arguments)]
    pub fn fold(
        &mut self,
        converter: &RowConverter,
        start: i64,
        end: i64,
        key: Row<'_>,
        accs: &mut [Acc],
        event_key: Option<i64>,
        now_ms: i64,
        merge: impl FnOnce(&mut [Acc], &mut [Acc]) -> etlantic_core::diagnostics::Result<()>,
    ) -> etlantic_core::diagnostics::Result<bool> {
        let width = self.width;
        let hash = self.hasher.hash_one(key.as_ref());
        let bucket = self
            .buckets
            .entry(start)
            .or_insert_with(|| Bucket::new(converter, end));
        match bucket.find(hash, key) {
            Some(g) => {
                merge(&mut bucket.accs[g * width..(g + 1) * width], accs)?;
                bucket.updated_ms[g] = Some(now_ms);
                Ok(!std::mem::replace(&mut bucket.updated[g], true))
            }
            None => {
                bucket.push(
                    hash,
                    key,
                    accs.iter_mut().map(|a| std::mem::replace(a, Acc::Count(0))),
                    event_key,
                    Some(now_ms),
                    true,
                );
                Ok(true)
            }
        }
    }

    /// Adds a restored group (not updated).
    pub fn restore(&mut self, converter: &RowConverter, group: GroupRef<'_>, accs: Vec<Acc>) {
        let hash = self.hasher.hash_one(group.key.as_ref());
        let bucket = self
            .buckets
            .entry(group.start)
            .or_insert_with(|| Bucket::new(converter, group.end));
        bucket.push(
            hash,
            group.key,
            accs.into_iter(),
            group.event_key,
            group.updated_ms,
            false,
        );
    }

    /// Removes the windows that end at or before `watermark`, oldest first.
    pub fn close_windows(&mut self, watermark: i64) -> Vec<(i64, Bucket)> {
        let mut closed = Vec::new();
        while let Some(first) = self.buckets.first_entry() {
            if first.get().end > watermark {
                break;
            }
            closed.push(first.remove_entry());
        }
        closed
    }

    /// Removes the groups `gone` selects; returns them as buckets by window.
    pub fn remove_where(
        &mut self,
        converter: &RowConverter,
        mut gone: impl FnMut(&GroupRef<'_>) -> bool,
    ) -> Vec<(i64, Bucket)> {
        let width = self.width;
        let mut removed = Vec::new();
        for (start, b) in self.buckets.iter_mut() {
            let flags: Vec<bool> = b.groups(*start, width).map(|g| gone(&g)).collect();
            if !flags.iter().any(|f| *f) {
                continue;
            }
            let mut out = Bucket::new(converter, b.end);
            b.split(converter, &flags, width, &mut out);
            removed.push((*start, out));
        }
        self.buckets.retain(|_, b| b.len() > 0);
        removed
    }

    /// The groups of buckets taken out of the store.
    pub fn groups_of(
        buckets: &[(i64, Bucket)],
        width: usize,
    ) -> impl Iterator<Item = GroupRef<'_>> + '_ {
        buckets
            .iter()
            .flat_map(move |(start, b)| b.groups(*start, width))
    }

    /// Accumulators per group.
    pub fn width(&self) -> usize {
        self.width
    }
}
