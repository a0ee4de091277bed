//! An [`ObjectStore`] that counts the requests sent through it, for table formats
//! (Delta, Iceberg) that speak `object_store` themselves: their requests show in
//! [`crate::request_counts`] beside the checkpoint's and the file connectors'.

use async_trait::async_trait;
use bytes::Bytes;
use etlantic_core::storage::requests::{count, Request};
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use std::ops::Range;
use std::sync::Arc;

/// `inner`, counting each request by kind (a listing counts once, however many pages it
/// takes; a multipart upload counts as one `PUT`).
#[derive(Debug)]
pub struct Counted {
    inner: Arc<dyn ObjectStore>,
}

impl Counted {
    /// Counts the requests sent to `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Counted { inner }
    }
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        count(Request::Put);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        count(Request::Put);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        count(if options.head {
            Request::Head
        } else {
            Request::Get
        });
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        count(Request::Get);
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        count(Request::Delete);
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        count(Request::List);
        self.inner.list(prefix).boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        count(Request::List);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        count(Request::List);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        count(Request::Copy);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        count(Request::Copy);
        count(Request::Delete);
        self.inner.rename_opts(from, to, options).await
    }
}
