//! Where a stateful operator can keep state larger than memory: a versioned key-value
//! [`StateStore`], one per operator, committed with the micro-batches and checkpointed
//! incrementally.
//!
//! A store has a *working copy* (a local directory: a cache, which losing loses nothing)
//! and its place in the checkpoint (a [`Storage`]). Each micro-batch's writes become
//! version `N + 1` at [`StateStore::commit`], which copies to the checkpoint only what
//! earlier versions did not already hold there: the `disk` store uploads the
//! micro-batch's changelog, and from time to time, off the critical path, a snapshot of
//! which only the files new since the last snapshot are copied. Restoring a version on
//! a fresh machine reads the newest snapshot before it and replays the changelogs after.
//!
//! Stores are linked by registering a [`StateStoreProvider`] with [`inventory`] (see
//! [`StateStoreRegistration`]); the profile's `state_store` names one.

use etlantic_core::diagnostics::Result;
use etlantic_core::storage::Storage;
use std::path::PathBuf;
use std::sync::Arc;

/// One write of a [`StoreWrites`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreWrite {
    /// Sets `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Removes `key`.
    Delete(Vec<u8>),
    /// Removes every key in `from..to` (byte order; `to` excluded).
    DeleteRange(Vec<u8>, Vec<u8>),
}

/// Writes applied together, in order ([`StateStore::write`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreWrites(pub Vec<StoreWrite>);

impl StoreWrites {
    /// Sets `key` to `value`.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.0.push(StoreWrite::Put(key.into(), value.into()));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) {
        self.0.push(StoreWrite::Delete(key.into()));
    }

    /// Removes every key in `from..to`.
    pub fn delete_range(&mut self, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) {
        self.0.push(StoreWrite::DeleteRange(from.into(), to.into()));
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Visits one key and its value of a [`StateStore::scan`]; returns whether to go on.
pub type ScanVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// What a commit wrote to the checkpoint, and what the version it made is restored from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Files the commit copied to the checkpoint (new since the versions it already
    /// holds).
    pub files_uploaded: u64,
    /// Their bytes.
    pub bytes_uploaded: u64,
    /// Files a restore of the version reads (new and already there).
    pub files_total: u64,
    /// Their bytes.
    pub bytes_total: u64,
    /// Files that snapshots taken off the critical path copied to the checkpoint and
    /// finished since the previous commit (a store reports work of its background
    /// threads with the next commit).
    pub snapshot_files_uploaded: u64,
    /// Their bytes.
    pub snapshot_bytes_uploaded: u64,
}

/// Where a store keeps its working copy and its checkpoint, and how much memory it may
/// use.
#[derive(Clone, Debug)]
pub struct StoreContext {
    /// The operator whose state it holds (`<transformation>.<step>`).
    pub operator: String,
    /// The working copy: a local directory the store owns. It is a cache: a store
    /// opened on an empty or missing directory restores from the checkpoint alone.
    pub local_dir: PathBuf,
    /// The store's place in the checkpoint.
    pub checkpoint: Arc<dyn Storage>,
    /// What the store may hold in memory (caches and write buffers), in bytes.
    pub memory_limit_bytes: usize,
    /// How many versions a store that takes snapshots may commit between two (the
    /// profile's `state_snapshot_every`); `None`: the store's default.
    pub snapshot_every: Option<u64>,
}

/// A versioned key-value store holding one operator's state.
///
/// # Invariants an implementer must keep
/// - **Read-your-writes**: [`StateStore::get`] and [`StateStore::scan`] see every
///   [`StateStore::write`] made since the last commit or restore, in order, as well as
///   the version they build on.
/// - **Versioned commits**: [`StateStore::commit`] of version `v` makes exactly the state
///   as it is now restorable as `v`. It is durable in the checkpoint when `commit`
///   returns — the micro-batch commit that names `v` is written only after — and a crash
///   during `commit` leaves every version committed before restorable.
/// - **Restore of any retained version**: [`StateStore::restore`] of a committed version
///   not yet dropped by [`StateStore::retain`] gives that state exactly, whatever the
///   working copy holds (another version, a later uncommitted one, nothing at all: a new
///   machine). `restore(None)` gives the empty state.
/// - **Incremental**: a commit copies to the checkpoint only what no retained version
///   already holds there; [`StateStore::retain`] deletes from the checkpoint only what
///   no retained version needs (it may keep older versions that retained ones build on).
/// - **Bounded memory**: what the store holds in memory stays within
///   [`StoreContext::memory_limit_bytes`] (data beyond it lives on the working copy's
///   disk).
/// - `scan` visits keys in ascending byte order.
/// - Reads through `&self` may come from several threads at once (an operator may read
///   while its worker threads hold a shared reference to it), hence `Sync`.
pub trait StateStore: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// The values of `keys`, in their order. A store may read them in one pass (the
    /// default reads them one by one).
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Applies `writes`, in order.
    fn write(&mut self, writes: StoreWrites) -> Result<()>;

    /// Visits the keys in `from..to` (`to` `None`: to the end) in ascending order, until
    /// `visit` returns `false`.
    fn scan(&self, from: &[u8], to: Option<&[u8]>, visit: &mut ScanVisitor<'_>) -> Result<()>;

    /// Makes the state as it is now version `version`, durable in the checkpoint.
    fn commit(&mut self, version: u64) -> Result<CommitStats>;

    /// Replaces the state with committed version `version` (`None`: empty).
    fn restore(&mut self, version: Option<u64>) -> Result<()>;

    /// Drops the committed versions before `oldest` and the checkpoint files only they
    /// named.
    fn retain(&mut self, oldest: u64) -> Result<()>;

    /// The committed versions the checkpoint holds, ascending.
    fn versions(&self) -> Result<Vec<u64>>;

    /// Bytes the store holds in memory now (caches and write buffers); 0 when unknown.
    fn memory_bytes(&self) -> u64 {
        0
    }
}

/// Versions of a store's state the runtime keeps restorable (older ones are dropped by
/// [`StateStore::retain`]): as many as it keeps of state held in memory.
pub const KEPT_STORE_VERSIONS: u64 = crate::checkpoint::records::KEPT_VERSIONS;

/// Creates state stores of one kind.
///
/// # Invariants an implementer must keep
/// - `name()` is a constant; no two linked providers share it.
/// - `open` reads the checkpoint but changes nothing in it.
pub trait StateStoreProvider: Send + Sync {
    /// The name the profile's `state_store` gives (`disk`).
    fn name(&self) -> &'static str;

    /// Opens the store of `ctx.operator` on the empty state (restore a version with
    /// [`StateStore::restore`]).
    fn open(&self, ctx: StoreContext) -> Result<Box<dyn StateStore>>;
}

/// Links a [`StateStoreProvider`] into the runtime.
pub struct StateStoreRegistration(pub &'static dyn StateStoreProvider);

inventory::collect!(StateStoreRegistration);

/// The linked provider named `name`.
pub fn provider(name: &str) -> Option<&'static dyn StateStoreProvider> {
    inventory::iter::<StateStoreRegistration>
        .into_iter()
        .map(|r| r.0)
        .find(|p| p.name() == name)
}
