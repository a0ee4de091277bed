//! Where the bytes of one file come from: the local disk or an object of a [`Storage`]
//! (an object store's prefix), read the same way by every format.

use etlantic_core::diagnostics::Result;
use etlantic_core::storage::{io_error, FileMeta, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One file a source reads.
#[derive(Clone, Debug)]
pub(crate) enum FileRef {
    /// A file of the local file system.
    Local(PathBuf),
    /// The object `name` of `storage`, and its size when it is known already.
    Object {
        storage: Arc<dyn Storage>,
        name: String,
        size: Option<u64>,
    },
}

impl FileRef {
    /// The file as rejected records and messages name it: a local path relative to the
    /// project `root` (when inside it), an object by its URL.
    pub(crate) fn shown(&self, root: &Path) -> String {
        match self {
            FileRef::Local(path) => crate::fsutil::display_relative(path, root),
            FileRef::Object { storage, name, .. } => storage.display(name),
        }
    }

    /// The same file, known to be `size` bytes long (an object is then read without
    /// asking its size first).
    pub(crate) fn with_size(self, size: u64) -> Self {
        match self {
            FileRef::Object { storage, name, .. } => FileRef::Object {
                storage,
                name,
                size: Some(size),
            },
            local => local,
        }
    }

    /// The size of an object (as known, or asked for).
    pub(crate) fn object_size(storage: &dyn Storage, name: &str, size: Option<u64>) -> Result<u64> {
        match size {
            Some(size) => Ok(size),
            None => storage
                .size(name)?
                .ok_or_else(|| io_error("open", &storage.display(name), "the object is gone")),
        }
    }

    /// Where it is, for I/O errors.
    pub(crate) fn display(&self) -> String {
        match self {
            FileRef::Local(path) => path.display().to_string(),
            FileRef::Object { storage, name, .. } => storage.display(name),
        }
    }

    /// Its size, modification time and version now (`None`: it no longer exists).
    pub(crate) fn stat(&self) -> Result<Option<FileMeta>> {
        match self {
            FileRef::Local(path) => etlantic_core::storage::file_meta(path),
            FileRef::Object { storage, name, .. } => storage.stat(name),
        }
    }

    /// A Parquet reader of it.
    pub(crate) fn parquet(&self) -> Result<ParquetInput> {
        match self {
            FileRef::Local(path) => std::fs::File::open(path)
                .map(ParquetInput::File)
                .map_err(|e| io_error("open", &self.display(), e)),
            FileRef::Object {
                storage,
                name,
                size,
            } => {
                let len = FileRef::object_size(storage.as_ref(), name, *size)?;
                Ok(ParquetInput::Object {
                    storage: storage.clone(),
                    name: name.clone(),
                    len,
                })
            }
        }
    }
}

/// A Parquet file for the `parquet` crate's readers: a local file, or an object read by
/// ranges (the footer, then each column chunk the projection needs, never the whole
/// object at once).
pub(crate) enum ParquetInput {
    File(std::fs::File),
    Object {
        storage: Arc<dyn Storage>,
        name: String,
        len: u64,
    },
}

impl ParquetInput {
    fn range(&self, start: u64, len: u64) -> parquet::errors::Result<bytes::Bytes> {
        let ParquetInput::Object { storage, name, .. } = self else {
            unreachable!("only objects are read by range here")
        };
        storage
            .read_range(name, start, len)
            .map(bytes::Bytes::from)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
    }
}

impl parquet::file::reader::Length for ParquetInput {
    fn len(&self) -> u64 {
        match self {
            ParquetInput::File(f) => parquet::file::reader::Length::len(f),
            ParquetInput::Object { len, .. } => *len,
        }
    }
}

impl parquet::file::reader::ChunkReader for ParquetInput {
    type T = Box<dyn std::io::Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            ParquetInput::File(f) => Ok(Box::new(f.get_read(start)?)),
            ParquetInput::Object { len, .. } => {
                let bytes = self.range(start, len.saturating_sub(start))?;
                Ok(Box::new(std::io::Cursor::new(bytes)))
            }
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        match self {
            ParquetInput::File(f) => f.get_bytes(start, length),
            ParquetInput::Object { .. } => self.range(start, length as u64),
        }
    }
}
