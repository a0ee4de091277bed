//! Appending on an object store, emulated: the file is held in memory, and each
//! [`AppendFile::sync`] writes the whole object, as a conditional create when it is new
//! and as a conditional update on the ETag of the previous write otherwise.
//!
//! What the storage contract asks of an [`AppendFile`] holds: bytes synced survive (a
//! `PUT` is durable when it returns), and a crash keeps the object of the last sync —
//! whole objects, so never a torn tail. One difference: a new file is created at its
//! first sync, not when opened (which would cost a `PUT` of nothing); until then it is
//! absent, which readers of the checkpoint take as empty. The conditions make a second
//! writer fail instead of overwriting the first: its sync finds the object created or
//! changed by someone else and answers `ETL803`. Each sync costs one `PUT` of the whole
//! file: callers keep these files short on object stores.

use crate::ObjectStorage;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{io_error, AppendFile, Storage};
use object_store::{PutMode, UpdateVersion};

/// A file of an object store open for appending (see the [module docs](self)).
pub(crate) struct ObjectAppend {
    storage: ObjectStorage,
    path: String,
    bytes: Vec<u8>,
    /// The ETag of the object as last read or written; `None` while it does not exist.
    etag: Option<Option<String>>,
    /// Written to since the last sync.
    dirty: bool,
}

impl std::fmt::Debug for ObjectAppend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectAppend")
            .field("at", &self.storage.display(&self.path))
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl ObjectAppend {
    /// Opens `path`, reading it when it exists (it is created at the first sync
    /// otherwise).
    pub(crate) fn open(storage: ObjectStorage, path: &str) -> Result<Self> {
        let mut file = ObjectAppend {
            storage,
            path: path.to_string(),
            bytes: Vec::new(),
            etag: None,
            dirty: false,
        };
        if let Some((bytes, etag)) = file.current()? {
            file.bytes = bytes;
            file.etag = Some(etag);
        }
        Ok(file)
    }

    fn current(&self) -> Result<Option<(Vec<u8>, Option<String>)>> {
        self.storage.read_with_etag(&self.path)
    }

    /// Writes the whole file in `mode`: `Ok(Some(etag))` when written, `Ok(None)` when
    /// the condition failed.
    fn put_whole(&self, mode: PutMode) -> Result<Option<Option<String>>> {
        self.storage
            .put_conditional(&self.path, self.bytes.clone(), mode)
    }

    fn taken(&self) -> Error {
        Error::new(
            &codes::CHECKPOINT_LOCKED,
            format!(
                "`{}` was written by another process while this one had it open",
                self.storage.display(&self.path)
            ),
        )
    }

    fn save(&mut self) -> Result<()> {
        let mode = match &self.etag {
            Some(etag) => PutMode::Update(UpdateVersion {
                e_tag: etag.clone(),
                version: None,
            }),
            None => PutMode::Create,
        };
        match self.put_whole(mode)? {
            Some(etag) => {
                self.etag = Some(etag);
                self.dirty = false;
                Ok(())
            }
            None => Err(self.taken()),
        }
    }
}

impl AppendFile for ObjectAppend {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.bytes.extend_from_slice(bytes);
        self.dirty = true;
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let Some(end) = start
            .checked_add(bytes.len())
            .filter(|e| *e <= self.bytes.len())
        else {
            return Err(io_error(
                "write",
                &self.storage.display(&self.path),
                format!(
                    "{} bytes at {offset} pass its end ({})",
                    bytes.len(),
                    self.bytes.len()
                ),
            ));
        };
        self.bytes[start..end].copy_from_slice(bytes);
        self.dirty = true;
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        self.bytes
            .truncate(usize::try_from(len).unwrap_or(usize::MAX));
        self.save()
    }

    fn sync(&mut self) -> Result<()> {
        if self.dirty || self.etag.is_none() {
            self.save()?;
        }
        Ok(())
    }
}
