//! An `object_store` over the storage layer ([`etlantic_core::storage`]), so that Delta
//! Lake tables under a storage mount (the power-cut tests' simulated disk) are written
//! through it like the checkpoint is.
//!
//! Object paths are absolute file-system paths without their leading `/` (the root store
//! `deltalake` prefixes with the table's location). Each operation opens the storage of
//! the object's directory with [`etlantic_core::storage::open`]. A put is atomic and
//! durable ([`Storage::put`]); `PutMode::Create` is [`Storage::put_if_absent`], the
//! conditional put Delta's commits rely on; multipart uploads gather their parts in
//! memory and put them once complete.

use async_trait::async_trait;
use bytes::Bytes;
use deltalake::logstore::object_store::path::Path as ObjectPath;
use deltalake::logstore::object_store::{
    self, Attributes, CopyMode, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, UploadPart,
};
use etlantic_core::storage::{self as storage, Storage};
use futures::stream::{self, BoxStream, StreamExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The object store over the storage layer (see the [module docs](self)).
#[derive(Debug, Default, Clone, Copy)]
pub struct StorageObjectStore;

impl std::fmt::Display for StorageObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageObjectStore")
    }
}

type OsResult<T> = object_store::Result<T>;

fn generic(e: impl std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic {
        store: "StorageObjectStore",
        source: e.to_string().into(),
    }
}

/// The storage of the object's directory and the object's name in it.
fn locate(path: &ObjectPath) -> (Arc<dyn Storage>, String) {
    let full = PathBuf::from("/").join(path.as_ref());
    let dir = full
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| "/".into());
    let name = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (storage::open(&dir), name)
}

fn meta(location: ObjectPath, size: u64) -> ObjectMeta {
    ObjectMeta {
        location,
        last_modified: chrono::Utc::now(),
        size,
        e_tag: None,
        version: None,
    }
}

/// Every file under directory `dir` of the storage, recursively, with its size.
fn walk(dir: &ObjectPath) -> OsResult<Vec<ObjectMeta>> {
    let root = storage::open(&PathBuf::from("/").join(dir.as_ref()));
    Ok(storage::walk_files(root.as_ref(), "")
        .map_err(generic)?
        .into_iter()
        .map(|(rel, size)| meta(dir.clone().join_all(rel.split('/')), size))
        .collect())
}

trait JoinAll {
    fn join_all<'a>(self, parts: impl Iterator<Item = &'a str>) -> ObjectPath;
}

impl JoinAll for ObjectPath {
    fn join_all<'a>(self, parts: impl Iterator<Item = &'a str>) -> ObjectPath {
        parts.fold(self, |p, part| p.join(part))
    }
}

#[async_trait]
impl ObjectStore for StorageObjectStore {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        let (dir, name) = locate(location);
        let bytes: Vec<u8> = payload.iter().flat_map(|b| b.iter().copied()).collect();
        match opts.mode {
            PutMode::Overwrite => {
                storage::put_bytes(dir.as_ref(), &name, &bytes).map_err(generic)?
            }
            PutMode::Create => {
                if !dir.put_if_absent(&name, &bytes).map_err(generic)? {
                    return Err(object_store::Error::AlreadyExists {
                        path: location.to_string(),
                        source: "the object exists".into(),
                    });
                }
            }
            PutMode::Update(_) => {
                return Err(object_store::Error::NotImplemented {
                    operation: "put with PutMode::Update".into(),
                    implementer: self.to_string(),
                })
            }
        }
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        _opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        Ok(Box::new(Upload {
            location: location.clone(),
            parts: Arc::new(Mutex::new(Vec::new())),
        }))
    }

    async fn get_opts(&self, location: &ObjectPath, options: GetOptions) -> OsResult<GetResult> {
        let (dir, name) = locate(location);
        let bytes =
            dir.read(&name)
                .map_err(generic)?
                .ok_or_else(|| object_store::Error::NotFound {
                    path: location.to_string(),
                    source: "no such object".into(),
                })?;
        let len = bytes.len() as u64;
        let range = match &options.range {
            Some(r) => r.as_range(len).map_err(generic)?,
            None => 0..len,
        };
        let body = if options.head {
            Bytes::new()
        } else {
            Bytes::from(bytes).slice(range.start as usize..range.end as usize)
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(body) }).boxed()),
            meta: meta(location.clone(), len),
            range,
            attributes: Attributes::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, OsResult<ObjectPath>>,
    ) -> BoxStream<'static, OsResult<ObjectPath>> {
        locations
            .map(|p| {
                let p = p?;
                let (dir, name) = locate(&p);
                dir.delete(&name).map_err(generic)?;
                Ok(p)
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, OsResult<ObjectMeta>> {
        let prefix = prefix.cloned().unwrap_or_default();
        match walk(&prefix) {
            Ok(all) => stream::iter(all.into_iter().map(Ok)).boxed(),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&ObjectPath>) -> OsResult<ListResult> {
        let prefix = prefix.cloned().unwrap_or_default();
        let dir = storage::open(&PathBuf::from("/").join(prefix.as_ref()));
        let mut out = ListResult {
            common_prefixes: Vec::new(),
            objects: Vec::new(),
        };
        for name in dir.list("").map_err(generic)? {
            match name.strip_suffix('/') {
                Some(d) => out.common_prefixes.push(prefix.clone().join(d)),
                None => {
                    if let Some(size) = dir.size(&name).map_err(generic)? {
                        out.objects
                            .push(meta(prefix.clone().join(name.as_str()), size));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> OsResult<()> {
        let (from_dir, from_name) = locate(from);
        let bytes = from_dir.read(&from_name).map_err(generic)?.ok_or_else(|| {
            object_store::Error::NotFound {
                path: from.to_string(),
                source: "no such object".into(),
            }
        })?;
        let (dir, name) = locate(to);
        match options.mode {
            CopyMode::Overwrite => storage::put_bytes(dir.as_ref(), &name, &bytes).map_err(generic),
            CopyMode::Create => {
                if dir.put_if_absent(&name, &bytes).map_err(generic)? {
                    Ok(())
                } else {
                    Err(object_store::Error::AlreadyExists {
                        path: to.to_string(),
                        source: "the object exists".into(),
                    })
                }
            }
        }
    }
}

/// A multipart upload: its parts kept in memory, put as one object on completion.
#[derive(Debug)]
struct Upload {
    location: ObjectPath,
    parts: Arc<Mutex<Vec<PutPayload>>>,
}

#[async_trait]
impl MultipartUpload for Upload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(data);
        Box::pin(async { Ok(()) })
    }

    async fn complete(&mut self) -> OsResult<PutResult> {
        let parts = std::mem::take(&mut *self.parts.lock().unwrap_or_else(|p| p.into_inner()));
        let bytes: Vec<u8> = parts
            .iter()
            .flat_map(|p| {
                p.iter()
                    .flat_map(|b| b.iter().copied())
                    .collect::<Vec<u8>>()
            })
            .collect();
        let (dir, name) = locate(&self.location);
        storage::put_bytes(dir.as_ref(), &name, &bytes).map_err(generic)?;
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn abort(&mut self) -> OsResult<()> {
        self.parts.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }
}
