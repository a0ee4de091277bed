//! Typed state handles: how `init` declares state variables ([`ProcessorInit`]) and the
//! per-key value, list and map handles a processor reads and writes them through.

use super::context::ProcessorContext;
use super::invalid;
use super::store::{Slot, StateDecl, StateKind};
use crate::diagnostics::Result;
use crate::streaming::{Duration, ExecutionMode, TimeMode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::marker::PhantomData;

/// Marker for values that can live in state: anything `serde` can write and read back.
pub trait StateValue: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> StateValue for T {}

/// What `init` sees and where it declares state variables.
#[derive(Debug)]
pub struct ProcessorInit {
    decls: Vec<StateDecl>,
    time_mode: TimeMode,
    execution_mode: ExecutionMode,
}

impl ProcessorInit {
    /// A declaration context (runtime side).
    pub fn new(time_mode: TimeMode, execution_mode: ExecutionMode) -> Self {
        ProcessorInit {
            decls: Vec::new(),
            time_mode,
            execution_mode,
        }
    }

    /// The time mode of the step.
    pub fn time_mode(&self) -> TimeMode {
        self.time_mode
    }

    /// Batch or streaming.
    pub fn execution_mode(&self) -> ExecutionMode {
        self.execution_mode
    }

    /// The declarations made (runtime side).
    pub fn into_decls(self) -> Vec<StateDecl> {
        self.decls
    }

    fn declare(&mut self, name: &str, kind: StateKind, ttl: Option<Duration>) -> Result<usize> {
        if name.is_empty() || self.decls.iter().any(|d| d.name == name) {
            return Err(invalid(format!(
                "state variable name `{name}` is empty or declared twice"
            )));
        }
        if ttl.is_some_and(|t| t.as_millis() <= 0) {
            return Err(invalid(format!(
                "the TTL of state variable `{name}` must be positive"
            )));
        }
        self.decls.push(StateDecl {
            name: name.to_string(),
            kind,
            ttl,
        });
        Ok(self.decls.len() - 1)
    }

    /// Declares a value state (`ttl`: expires after that long without a write).
    pub fn value_state<T: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<ValueState<T>> {
        Ok(ValueState {
            id: self.declare(name, StateKind::Value, ttl)?,
            _t: PhantomData,
        })
    }

    /// Declares a list state (`ttl`: per element, from when it was written).
    pub fn list_state<T: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<ListState<T>> {
        Ok(ListState {
            id: self.declare(name, StateKind::List, ttl)?,
            _t: PhantomData,
        })
    }

    /// Declares a map state (`ttl`: per entry, from when it was written). Entries are
    /// ordered by the JSON bytes of their keys.
    pub fn map_state<K: StateValue, V: StateValue>(
        &mut self,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<MapState<K, V>> {
        Ok(MapState {
            id: self.declare(name, StateKind::Map, ttl)?,
            _t: PhantomData,
        })
    }
}

/// A value per key (Spark's `ValueState`). Obtained from [`ProcessorInit::value_state`].
#[derive(Debug)]
pub struct ValueState<T> {
    pub(super) id: usize,
    pub(super) _t: PhantomData<fn() -> T>,
}

impl<T> Clone for ValueState<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ValueState<T> {}

impl<T: StateValue> ValueState<T> {
    /// The key's value (`None` when unset or expired).
    pub fn get(&self, ctx: &ProcessorContext<'_>) -> Result<Option<T>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Value)? {
            Slot::Value(v) if v.live(now) => ctx.decode(self.id, &v.bytes).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether the key has a (live) value.
    pub fn exists(&self, ctx: &ProcessorContext<'_>) -> Result<bool> {
        let now = ctx.now();
        Ok(matches!(ctx.slot(self.id, StateKind::Value)?, Slot::Value(v) if v.live(now)))
    }

    /// Sets the key's value (and restarts its TTL).
    pub fn set(&self, ctx: &mut ProcessorContext<'_>, value: &T) -> Result<()> {
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        *ctx.slot_mut(self.id, StateKind::Value, 1, |_| 0)? = Slot::Value(v);
        Ok(())
    }

    /// Removes the key's value.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::Value, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
}

/// A list per key (Spark's `ListState`). Obtained from [`ProcessorInit::list_state`].
#[derive(Debug)]
pub struct ListState<T> {
    id: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for ListState<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ListState<T> {}

impl<T: StateValue> ListState<T> {
    /// The key's live elements, in order.
    pub fn get(&self, ctx: &ProcessorContext<'_>) -> Result<Vec<T>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::List)? {
            Slot::List(l) => l
                .iter()
                .filter(|v| v.live(now))
                .map(|v| ctx.decode(self.id, &v.bytes))
                .collect(),
            _ => Ok(vec![]),
        }
    }

    /// Whether the key has live elements.
    pub fn exists(&self, ctx: &ProcessorContext<'_>) -> Result<bool> {
        let now = ctx.now();
        Ok(
            matches!(ctx.slot(self.id, StateKind::List)?, Slot::List(l) if l.iter().any(|v| v.live(now))),
        )
    }

    /// Replaces the list (every element gets a fresh TTL).
    pub fn put(&self, ctx: &mut ProcessorContext<'_>, values: &[T]) -> Result<()> {
        let stored = values
            .iter()
            .map(|v| Ok(ctx.stored(self.id, ctx.encode(self.id, v)?)))
            .collect::<Result<Vec<_>>>()?;
        let n = stored.len() as u64;
        *ctx.slot_mut(self.id, StateKind::List, n, |s| s.entries() as u64)? = if stored.is_empty() {
            Slot::Empty
        } else {
            Slot::List(stored)
        };
        Ok(())
    }

    /// Appends one element.
    pub fn append(&self, ctx: &mut ProcessorContext<'_>, value: &T) -> Result<()> {
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        let slot = ctx.slot_mut(self.id, StateKind::List, 1, |_| 0)?;
        match slot {
            Slot::List(l) => l.push(v),
            other => *other = Slot::List(vec![v]),
        }
        Ok(())
    }

    /// Removes the list.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::List, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
}

/// A map per key (Spark's `MapState`). Obtained from [`ProcessorInit::map_state`].
#[derive(Debug)]
pub struct MapState<K, V> {
    id: usize,
    _t: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for MapState<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for MapState<K, V> {}

impl<K: StateValue, V: StateValue> MapState<K, V> {
    /// The value of `key` (`None` when absent or expired).
    pub fn get(&self, ctx: &ProcessorContext<'_>, key: &K) -> Result<Option<V>> {
        let k = ctx.encode(self.id, key)?;
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Map)? {
            Slot::Map(m) => match m.get(&k) {
                Some(v) if v.live(now) => ctx.decode(self.id, &v.bytes).map(Some),
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Whether `key` has a live value.
    pub fn contains(&self, ctx: &ProcessorContext<'_>, key: &K) -> Result<bool> {
        let k = ctx.encode(self.id, key)?;
        let now = ctx.now();
        Ok(
            matches!(ctx.slot(self.id, StateKind::Map)?, Slot::Map(m) if m.get(&k).is_some_and(|v| v.live(now))),
        )
    }

    /// Sets `key` to `value` (and restarts the entry's TTL).
    pub fn put(&self, ctx: &mut ProcessorContext<'_>, key: &K, value: &V) -> Result<()> {
        let k = ctx.encode(self.id, key)?;
        let v = ctx.stored(self.id, ctx.encode(self.id, value)?);
        let slot = ctx.slot_mut(self.id, StateKind::Map, 1, |_| 0)?;
        match slot {
            Slot::Map(m) => {
                m.insert(k, v);
            }
            other => *other = Slot::Map(BTreeMap::from([(k, v)])),
        }
        Ok(())
    }

    /// Removes `key`.
    pub fn remove(&self, ctx: &mut ProcessorContext<'_>, key: &K) -> Result<()> {
        let k = ctx.encode(self.id, key)?;
        let slot = ctx.slot_mut(self.id, StateKind::Map, 0, |s| match s {
            Slot::Map(m) => m.contains_key(&k) as u64,
            _ => 0,
        })?;
        if let Slot::Map(m) = slot {
            m.remove(&k);
            if m.is_empty() {
                *slot = Slot::Empty;
            }
        }
        Ok(())
    }

    /// The live entries, ordered by the JSON bytes of their keys.
    pub fn entries(&self, ctx: &ProcessorContext<'_>) -> Result<Vec<(K, V)>> {
        let now = ctx.now();
        match ctx.slot(self.id, StateKind::Map)? {
            Slot::Map(m) => m
                .iter()
                .filter(|(_, v)| v.live(now))
                .map(|(k, v)| Ok((ctx.decode(self.id, k)?, ctx.decode(self.id, &v.bytes)?)))
                .collect(),
            _ => Ok(vec![]),
        }
    }

    /// Removes every entry.
    pub fn clear(&self, ctx: &mut ProcessorContext<'_>) -> Result<()> {
        *ctx.slot_mut(self.id, StateKind::Map, 0, |s| s.entries() as u64)? = Slot::Empty;
        Ok(())
    }
}
