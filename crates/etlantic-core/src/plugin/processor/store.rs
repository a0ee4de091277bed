//! The runtime side of processor state: the declared state variables, and the stored
//! slots and timers of one key, with TTL expiry and size accounting. The runtime's
//! state store checkpoints these; processors reach them only through typed handles.

use crate::streaming::Duration;
use arrow::array::RecordBatch;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The kind of a state variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list of values per key.
    List,
    /// A map per key.
    Map,
}

impl StateKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
        }
    }
}

/// A declared state variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    /// Its name (unique per processor; the checkpoint is keyed by it).
    pub name: String,
    /// Its kind.
    pub kind: StateKind,
    /// Time to live without a write, in processing time.
    pub ttl: Option<Duration>,
}

/// One stored value with its expiry (runtime side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredValue {
    /// The value as JSON bytes.
    pub bytes: Vec<u8>,
    /// When it expires (epoch ms of processing time), for state with a TTL.
    pub expires_at_ms: Option<i64>,
}

impl StoredValue {
    pub(super) fn live(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|e| e > now_ms)
    }
}

/// The stored form of one state variable of one key (runtime side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Nothing stored.
    #[default]
    Empty,
    /// A value state.
    Value(StoredValue),
    /// A list state, in order.
    List(Vec<StoredValue>),
    /// A map state: JSON bytes of the key → value.
    Map(BTreeMap<Vec<u8>, StoredValue>),
}

impl Slot {
    /// Stored entries (a value, list elements or map entries).
    pub fn entries(&self) -> usize {
        match self {
            Slot::Empty => 0,
            Slot::Value(_) => 1,
            Slot::List(l) => l.len(),
            Slot::Map(m) => m.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Slot::Empty => 0,
            Slot::Value(v) => v.bytes.len() + 16,
            Slot::List(l) => l.iter().map(|v| v.bytes.len() + 16).sum(),
            Slot::Map(m) => m.iter().map(|(k, v)| k.len() + v.bytes.len() + 40).sum(),
        }
    }
}

/// The state and timers of one key (runtime side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyState {
    /// One slot per declared state variable, in declaration order.
    pub(crate) slots: Vec<Slot>,
    /// Registered timers (epoch ms, in the step's time mode).
    pub(crate) timers: BTreeSet<i64>,
}

/// One stored entry of a key's state, as a runtime snapshots it: a value, a list
/// element or a map entry of state variable `slot` (its index in declaration order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredEntry<'a> {
    /// The state variable's index in declaration order.
    pub slot: usize,
    /// Its kind.
    pub kind: StateKind,
    /// The entry's key, for a map state.
    pub map_key: Option<&'a [u8]>,
    /// The encoded value.
    pub value: &'a [u8],
    /// When it expires (epoch ms), under a state TTL.
    pub expires_at_ms: Option<i64>,
}

impl KeyState {
    /// Empty state for `n` state variables.
    pub fn new(n: usize) -> Self {
        KeyState {
            slots: vec![Slot::Empty; n],
            timers: BTreeSet::new(),
        }
    }

    /// Stored entries (a value, a list element or a map entry each).
    pub fn entries(&self) -> u64 {
        self.slots.iter().map(Slot::entries).sum::<usize>() as u64
    }

    /// Approximate bytes held (values, map keys, timers).
    pub fn memory_bytes(&self) -> u64 {
        (self.slots.iter().map(Slot::bytes).sum::<usize>() + 16 * self.timers.len()) as u64
    }

    /// Whether the key holds no state and no timer.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty() && self.slots.iter().all(|s| s.entries() == 0)
    }

    /// The registered timers (epoch ms), earliest first.
    pub fn timers(&self) -> &BTreeSet<i64> {
        &self.timers
    }

    /// Registers a timer (restoring a snapshot).
    pub fn add_timer(&mut self, time_ms: i64) {
        self.timers.insert(time_ms);
    }

    /// Removes a timer; returns whether it was registered.
    pub fn remove_timer(&mut self, time_ms: i64) -> bool {
        self.timers.remove(&time_ms)
    }

    /// Every stored entry, state variable by state variable (list elements in order,
    /// map entries by key).
    pub fn entries_stored(&self) -> Vec<StoredEntry<'_>> {
        fn entry<'a>(
            slot: usize,
            kind: StateKind,
            map_key: Option<&'a [u8]>,
            v: &'a StoredValue,
        ) -> StoredEntry<'a> {
            StoredEntry {
                slot,
                kind,
                map_key,
                value: v.bytes.as_slice(),
                expires_at_ms: v.expires_at_ms,
            }
        }
        let mut out = Vec::new();
        for (slot, s) in self.slots.iter().enumerate() {
            match s {
                Slot::Empty => {}
                Slot::Value(v) => out.push(entry(slot, StateKind::Value, None, v)),
                Slot::List(l) => {
                    out.extend(l.iter().map(|v| entry(slot, StateKind::List, None, v)))
                }
                Slot::Map(m) => out.extend(
                    m.iter()
                        .map(|(k, v)| entry(slot, StateKind::Map, Some(k.as_slice()), v)),
                ),
            }
        }
        out
    }

    /// Adds a stored entry back (restoring a snapshot): the value of a value state, the
    /// next element of a list state, an entry of a map state (`map_key` required). A
    /// `slot` out of range or a map entry without its key is refused with the reason.
    pub fn restore_entry(
        &mut self,
        slot: usize,
        kind: StateKind,
        map_key: Option<Vec<u8>>,
        value: Vec<u8>,
        expires_at_ms: Option<i64>,
    ) -> std::result::Result<(), String> {
        let v = StoredValue {
            bytes: value,
            expires_at_ms,
        };
        let target = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| format!("no state variable number {slot}"))?;
        match kind {
            StateKind::Value => *target = Slot::Value(v),
            StateKind::List => match target {
                Slot::List(l) => l.push(v),
                other => *other = Slot::List(vec![v]),
            },
            StateKind::Map => {
                let mk = map_key.ok_or("a map entry without its key")?;
                match target {
                    Slot::Map(m) => {
                        m.insert(mk, v);
                    }
                    other => *other = Slot::Map(std::collections::BTreeMap::from([(mk, v)])),
                }
            }
        }
        Ok(())
    }

    /// Removes every entry whose TTL ran out at `now_ms`; returns how many.
    pub fn expire(&mut self, now_ms: i64) -> u64 {
        let mut removed = 0u64;
        for slot in self.slots.iter_mut() {
            match slot {
                Slot::Empty => {}
                Slot::Value(v) => {
                    if !v.live(now_ms) {
                        *slot = Slot::Empty;
                        removed += 1;
                    }
                }
                Slot::List(l) => {
                    let before = l.len();
                    l.retain(|v| v.live(now_ms));
                    removed += (before - l.len()) as u64;
                    if l.is_empty() {
                        *slot = Slot::Empty;
                    }
                }
                Slot::Map(m) => {
                    let before = m.len();
                    m.retain(|_, v| v.live(now_ms));
                    removed += (before - m.len()) as u64;
                    if m.is_empty() {
                        *slot = Slot::Empty;
                    }
                }
            }
        }
        removed
    }
}

/// What a callback emitted, in order (runtime side).
#[derive(Clone, Debug)]
pub enum Emitted {
    /// A row as a JSON object (converted to the output schema by the runtime).
    Row(Value),
    /// A batch in the output schema.
    Batch(RecordBatch),
}

/// Counters the runtime reports in progress (runtime side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessorCounters {
    /// Timers registered.
    pub timers_registered: u64,
    /// Timers deleted.
    pub timers_deleted: u64,
    /// State entries written (a value set, a list element put or appended, a map entry
    /// put).
    pub rows_written: u64,
    /// State entries removed by the processor (cleared values, replaced or cleared list
    /// elements, removed or cleared map entries).
    pub rows_removed: u64,
}
