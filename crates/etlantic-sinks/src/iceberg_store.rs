//! iceberg-rust's file I/O over the storage layer ([`etlantic_core::storage`]).
//!
//! iceberg-rust's own local file I/O writes metadata files without `fsync`; through the
//! storage layer every whole-file write (table metadata, manifest lists, manifests) is an
//! atomic, durable [`Storage::put`], and a streamed file (a data file) is appended and
//! synced when closed. So when the catalog commits a snapshot, every file the snapshot
//! names is already durable: a power cut after the commit cannot leave the catalog
//! pointing at a lost or torn file. It also lets the power-cut tests, which
//! [`mount`](etlantic_core::storage::mount) a simulated disk, cut the table's own writes.
//!
//! Locations are `file://` URLs or absolute paths, each operation opening the storage of
//! the file's directory with [`etlantic_core::storage::open`]; or object-store URLs
//! (`s3://bucket/key`), served by the storage of the bucket (opened once per bucket with
//! the factory's [`StorageOptions`]): there a whole-file write is one `PUT` and a streamed
//! file is held until it is closed, then written with one `PUT`.

use async_trait::async_trait;
use bytes::Bytes;
use etlantic_core::storage::{
    self as storage, AppendFile, Location, Storage as EtlStorage, StorageOptions, Sub,
};
use futures::stream::{BoxStream, StreamExt};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The [`StorageFactory`] of [`LayeredStorage`] (see the [module docs](self)).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LayeredStorageFactory {
    /// How to reach object stores. Never serialised: values may be credentials (a
    /// deserialised factory reaches stores with the environment's configuration).
    #[serde(skip)]
    options: StorageOptions,
}

impl LayeredStorageFactory {
    /// A factory whose storages reach object stores with `options`.
    pub fn new(options: StorageOptions) -> Self {
        LayeredStorageFactory { options }
    }
}

#[typetag::serde]
impl StorageFactory for LayeredStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LayeredStorage::new(self.options.clone())))
    }
}

/// iceberg-rust's [`Storage`] over the storage layer (see the [module docs](self)).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LayeredStorage {
    #[serde(skip)]
    options: StorageOptions,
    /// The storage of each bucket reached so far (`scheme://bucket`).
    #[serde(skip)]
    buckets: Arc<Mutex<HashMap<String, Arc<dyn EtlStorage>>>>,
}

impl LayeredStorage {
    /// A storage reaching object stores with `options`.
    pub fn new(options: StorageOptions) -> Self {
        LayeredStorage {
            options,
            buckets: Arc::default(),
        }
    }

    /// The storage of the directory `location` is in (local, or on its bucket) and the
    /// file's name in it.
    fn locate(&self, location: &str) -> Result<(Arc<dyn EtlStorage>, String)> {
        let Some((dir, name)) = self.remote(location)? else {
            return locate(location);
        };
        let name = name.ok_or_else(|| err("use", location, "it names no file"))?;
        Ok((dir, name))
    }

    /// For an object-store location: the storage of its directory and its last segment.
    #[allow(clippy::type_complexity)]
    fn remote(&self, location: &str) -> Result<Option<(Arc<dyn EtlStorage>, Option<String>)>> {
        let Some((scheme, _)) = location.split_once("://") else {
            return Ok(None);
        };
        if !storage::OBJECT_SCHEMES.contains(&scheme) {
            return Ok(None);
        }
        let url = url::Url::parse(location).map_err(|e| err("use", location, e))?;
        let bucket = format!("{scheme}://{}", url.host_str().unwrap_or_default());
        let root = {
            let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            match buckets.get(&bucket) {
                Some(s) => s.clone(),
                None => {
                    let at = Location::parse(&bucket, Path::new("/"))
                        .map_err(|e| err("use", location, e))?;
                    let s = storage::open_location(&at, &self.options)
                        .map_err(|e| err("open", location, e))?;
                    buckets.insert(bucket, s.clone());
                    s
                }
            }
        };
        let key = url.path().trim_matches('/');
        let (dir, name) = match key.rsplit_once('/') {
            Some((dir, name)) => (dir, Some(name.to_string())),
            None => ("", (!key.is_empty()).then(|| key.to_string())),
        };
        Ok(Some((Arc::new(Sub::new(root, dir)), name)))
    }

    /// The storage of the directory `location` names.
    fn directory(&self, location: &str) -> Result<Arc<dyn EtlStorage>> {
        match self.remote(location)? {
            Some((dir, Some(name))) => Ok(Arc::new(Sub::new(dir, &name))),
            Some((dir, None)) => Ok(dir),
            None => Ok(storage::open(&local_path(location)?)),
        }
    }
}

fn err(what: &str, path: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("cannot {what} `{path}`: {e}"),
    )
}

/// The local path of a `file://` location or an absolute path.
fn local_path(location: &str) -> Result<PathBuf> {
    let rest = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    let path = if rest.starts_with('/') {
        PathBuf::from(rest)
    } else if location.contains("://") {
        return Err(Error::new(
            ErrorKind::FeatureUnsupported,
            format!("`{location}` is not on the local file system"),
        ));
    } else {
        PathBuf::from(format!("/{rest}"))
    };
    Ok(path)
}

/// The storage of the file's directory and the file's name in it.
fn locate(location: &str) -> Result<(Arc<dyn EtlStorage>, String)> {
    let path = local_path(location)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| err("use", location, "it names no file"))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    Ok((storage::open(dir), name))
}

#[async_trait]
#[typetag::serde]
impl Storage for LayeredStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let (dir, name) = self.locate(path)?;
        if dir
            .size(&name)
            .map_err(|e| err("inspect", path, e))?
            .is_some()
        {
            return Ok(true);
        }
        // A directory exists when it has entries (as on an object store).
        Ok(!dir
            .list(&name)
            .map_err(|e| err("list", path, e))?
            .is_empty())
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let (dir, name) = self.locate(path)?;
        let size = dir
            .size(&name)
            .map_err(|e| err("inspect", path, e))?
            .ok_or_else(|| err("inspect", path, "no such file"))?;
        Ok(FileMetadata { size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let (dir, name) = self.locate(path)?;
        dir.read(&name)
            .map_err(|e| err("read", path, e))?
            .map(Bytes::from)
            .ok_or_else(|| err("read", path, "no such file"))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let (dir, name) = self.locate(path)?;
        if dir.size(&name).map_err(|e| err("open", path, e))?.is_none() {
            return Err(err("open", path, "no such file"));
        }
        Ok(Box::new(Reader {
            dir,
            name,
            location: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (dir, name) = self.locate(path)?;
        storage::put_bytes(dir.as_ref(), &name, &bs).map_err(|e| err("write", path, e))
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (dir, name) = self.locate(path)?;
        let mut file = dir.append(&name).map_err(|e| err("create", path, e))?;
        // A writer replaces the file, as creating it on a local disk does.
        if !file.is_empty() {
            file.truncate(0).map_err(|e| err("truncate", path, e))?;
        }
        Ok(Box::new(Writer {
            file: Some(file),
            location: path.to_string(),
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (dir, name) = self.locate(path)?;
        dir.delete(&name).map_err(|e| err("delete", path, e))
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let dir = self.directory(path)?;
        let files: Vec<String> = storage::walk_files(dir.as_ref(), "")
            .map_err(|e| err("list", path, e))?
            .into_iter()
            .map(|(rel, _)| rel)
            .collect();
        dir.delete_all(&files).map_err(|e| err("delete", path, e))
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Reads ranges of one file.
struct Reader {
    dir: Arc<dyn EtlStorage>,
    name: String,
    location: String,
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let len = range.end.saturating_sub(range.start);
        self.dir
            .read_range(&self.name, range.start, len)
            .map(Bytes::from)
            .map_err(|e| err("read", &self.location, e))
    }
}

/// Streams one file; it is durable once closed.
struct Writer {
    file: Option<Box<dyn AppendFile>>,
    location: String,
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| err("write", &self.location, "the file is closed"))?;
        file.write(&bs).map_err(|e| err("write", &self.location, e))
    }

    async fn close(&mut self) -> Result<()> {
        let mut file = self
            .file
            .take()
            .ok_or_else(|| err("close", &self.location, "the file is closed"))?;
        file.sync().map_err(|e| err("sync", &self.location, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_map_to_local_paths() {
        for (location, path) in [
            ("file:///a/b.json", "/a/b.json"),
            ("file:/a/b.json", "/a/b.json"),
            ("/a/b.json", "/a/b.json"),
        ] {
            assert_eq!(local_path(location).unwrap(), PathBuf::from(path));
        }
        assert!(local_path("s3://bucket/a").is_err());
    }

    #[tokio::test]
    async fn files_written_whole_or_streamed_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let io = LayeredStorage::default();
        let meta = format!("file://{}/t/metadata/v1.json", tmp.path().display());
        io.write(&meta, Bytes::from_static(b"{\"v\":1}"))
            .await
            .unwrap();
        assert_eq!(&io.read(&meta).await.unwrap()[..], b"{\"v\":1}");
        assert!(io.exists(&meta).await.unwrap());

        let data = format!("{}/t/data/part-0.parquet", tmp.path().display());
        let mut w = io.writer(&data).await.unwrap();
        w.write(Bytes::from_static(b"hello ")).await.unwrap();
        w.write(Bytes::from_static(b"world")).await.unwrap();
        w.close().await.unwrap();
        assert!(w.close().await.is_err(), "a closed writer refuses");
        assert_eq!(io.metadata(&data).await.unwrap().size, 11);
        let r = io.reader(&data).await.unwrap();
        assert_eq!(&r.read(6..11).await.unwrap()[..], b"world");
        assert!(r.read(6..20).await.is_err(), "a range past the end fails");

        // A second writer replaces the file.
        let mut w = io.writer(&data).await.unwrap();
        w.write(Bytes::from_static(b"new")).await.unwrap();
        w.close().await.unwrap();
        assert_eq!(&io.read(&data).await.unwrap()[..], b"new");

        let table = format!("{}/t", tmp.path().display());
        assert!(io.exists(&table).await.unwrap(), "a directory with files");
        io.delete_prefix(&table).await.unwrap();
        assert!(!io.exists(&meta).await.unwrap());
        assert!(!io.exists(&data).await.unwrap());
        assert!(io.read(&data).await.is_err());
    }
}
