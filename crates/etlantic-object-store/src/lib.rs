//! ETLantic's storage on object stores: `s3://bucket/prefix` (AWS S3 and S3-compatible
//! stores), `gs://` and `az://`, through the `object_store` crate.
//!
//! Linking this crate registers [`ObjectStoreProvider`] for those schemes, so that
//! [`etlantic_core::storage::open_location`] opens them as an [`ObjectStorage`]: the
//! [`Storage`] trait on whole objects. What differs from a disk:
//!
//! - **No append.** [`Storage::appends`] is `false`. [`Storage::append`] is emulated
//!   ([`append`]): the file is held in memory and each `sync` rewrites the whole object,
//!   conditionally on the ETag it last wrote, so writes are durable at `sync` only and a
//!   second writer's `sync` fails (`ETL803`). Its cost grows with the file: callers keep
//!   such files short where appends are not cheap (the checkpoint's logs do).
//! - **Conditional creates.** [`Storage::put_if_absent`] is a `PUT` with
//!   `If-None-Match: *`; of two writers exactly one creates the object. A store that
//!   ignores the header would let both win: [`StorageProvider::check`] with
//!   `conditional` proves it honours it (`ETL717` otherwise).
//! - **Rename** is a copy then a delete, not atomic.
//! - **Locks are leases** ([`lease`]): an object naming its holder (host, boot, process)
//!   and an expiry its holder keeps pushing forward; taken over when its holder is known
//!   dead (same machine) or its expiry passed.
//!
//! # Configuration
//!
//! Credentials, region and endpoint come the AWS way: the `AWS_*` environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, web identity, ECS and instance credentials; for
//! `gs://` and `az://` the `GOOGLE_*` and `AZURE_*` ones), overridden by the profile's
//! `storage_options` (`endpoint`, `region`, `access_key_id`, `secret_access_key`,
//! `session_token`, `allow_http`, and any other key `object_store` takes, such as
//! `virtual_hosted_style_request`). Values there may be `${secret:NAME}`; they are
//! resolved before they reach this crate and never printed.
//!
//! # Retries
//!
//! A request failing transiently (the connection, a timeout, HTTP 5xx, 429, S3's
//! `SlowDown`) is retried with exponential backoff, up to [`RetryPolicy::attempts`]
//! times; each retry is counted ([`Storage::retries`]) and the count shows in the
//! progress records. Other failures are not retried: a missing bucket is `ETL714`,
//! refused credentials `ETL715`, an endpoint still unreachable after the retries `ETL716`.

mod append;
mod counted;
pub mod lease;
pub mod testing;

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::{
    io_error, AppendFile, FileMeta, Lock, Storage, StorageOptions, StorageProvider,
    StorageRegistration,
};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The provider of `s3://`, `gs://` and `az://` locations.
pub struct ObjectStoreProvider;

inventory::submit! { StorageRegistration(&ObjectStoreProvider) }

impl StorageProvider for ObjectStoreProvider {
    fn schemes(&self) -> &'static [&'static str] {
        etlantic_core::storage::OBJECT_SCHEMES
    }

    fn open(&self, url: &url::Url, options: &StorageOptions) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage::open(url, options)?))
    }

    fn check(&self, url: &url::Url, options: &StorageOptions, conditional: bool) -> Result<()> {
        ObjectStorage::open(url, options)?
            .with_policy(RetryPolicy::probe())
            .check(conditional)
    }
}

/// How transient failures are retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts in all (the first one included).
    pub attempts: u32,
    /// The wait before the first retry; doubled at each retry.
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Ten attempts over about half a minute: a store that is down longer fails the
    /// micro-batch, which a restart runs again.
    fn default() -> Self {
        RetryPolicy {
            attempts: 10,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Three attempts within a second: for checks at `validate` and start, which must
    /// answer rather than hang.
    pub fn probe() -> Self {
        RetryPolicy {
            attempts: 3,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
        }
    }
}

/// The runtime the object-store requests run on: [`Storage`] is synchronous and is
/// called from async code, so requests run on threads of their own and callers wait.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("etlantic-object-store")
            .enable_all()
            .build()
            .expect("the object-store runtime starts")
    })
}

/// Runs `fut` on the object-store runtime and waits for it. Safe from any thread,
/// including a tokio worker of another runtime (it blocks that thread, as a file read
/// would).
fn block<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> T {
    let task = runtime().spawn(fut);
    futures::executor::block_on(task).expect("an object-store request does not panic")
}

/// A prefix of an object store as a [`Storage`] (see the [crate docs](crate)).
#[derive(Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// The store for multipart uploads, retrying with `object_store`'s own retries: a
    /// failed part cannot be sent again by ours (`put_part` numbers parts as it goes).
    multipart: Arc<dyn ObjectStore>,
    /// The prefix every path is under (no leading or trailing `/`).
    prefix: String,
    /// `scheme://bucket` and the prefix, for messages.
    url: String,
    policy: RetryPolicy,
    retries: Arc<AtomicU64>,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("url", &self.url)
            .finish()
    }
}

pub use etlantic_core::storage::requests::{request_counts, Request, RequestCounts};

fn verb(request: Request) -> &'static str {
    match request {
        Request::Get | Request::Head => "read",
        Request::Put => "write",
        Request::List => "list",
        Request::Delete => "delete",
        Request::Copy => "copy",
    }
}

/// A request that failed for good.
enum Failed {
    /// The store's answer, for the caller to interpret (a missing object may be fine).
    Store(object_store::Error),
    /// Already a diagnostic (transient failures past the retries).
    Diagnostic(Error),
}

impl ObjectStorage {
    /// The storage at `url` (`scheme://bucket/prefix`), configured from the environment
    /// and `options`. Offline: nothing is requested yet.
    pub fn open(url: &url::Url, options: &StorageOptions) -> Result<Self> {
        let store = build_store(url, options)?;
        let prefix = url.path().trim_matches('/').to_string();
        let mut storage = ObjectStorage::new(store, url.as_str(), &prefix);
        storage.multipart = table_store(url, options)?;
        Ok(storage)
    }

    /// `prefix` of `store` (shown as `url` in messages).
    pub fn new(store: Arc<dyn ObjectStore>, url: &str, prefix: &str) -> Self {
        ObjectStorage {
            multipart: store.clone(),
            store,
            prefix: prefix.trim_matches('/').to_string(),
            url: url.trim_end_matches('/').to_string(),
            policy: RetryPolicy::default(),
            retries: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The same storage retrying by `policy`.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The object store underneath (for table formats that speak `object_store`).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The object path of `path`.
    pub fn object_path(&self, path: &str) -> ObjectPath {
        let full = etlantic_core::storage::join(&self.prefix, path);
        ObjectPath::from(full.as_str())
    }

    /// Proves the location usable (see [`StorageProvider::check`]).
    pub fn check(&self, conditional: bool) -> Result<()> {
        self.list("")?;
        if conditional {
            let probe = format!(".etlantic-check/{}", uuid::Uuid::new_v4());
            let first = self.put_if_absent(&probe, b"1")?;
            let second = self.put_if_absent(&probe, b"2")?;
            self.delete(&probe)?;
            if !first || second {
                return Err(Error::new(
                    &codes::STORAGE_UNSUPPORTED,
                    format!(
                        "`{}` does not honour conditional creates (a second PUT with If-None-Match: * of the same object succeeded)",
                        self.url
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Runs `op` (built afresh for each attempt), retrying transient failures; a final
    /// failure comes back as the store's error, for the caller to interpret.
    fn attempt<T, F, Fut>(
        &self,
        request: Request,
        path: &str,
        op: F,
    ) -> std::result::Result<T, Failed>
    where
        T: Send + 'static,
        F: Fn(Arc<dyn ObjectStore>) -> Fut,
        Fut: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        let what = verb(request);
        let mut backoff = self.policy.first_backoff;
        let mut attempt = 1;
        loop {
            etlantic_core::storage::requests::count(request);
            match block(op(self.store.clone())) {
                Ok(v) => return Ok(v),
                Err(e) if transient(&e) && attempt < self.policy.attempts => {
                    tracing::warn!(
                        "{what} {}: transient failure, retry {attempt} in {backoff:?}: {e}",
                        self.display(path)
                    );
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(self.policy.max_backoff);
                    attempt += 1;
                }
                Err(e) if transient(&e) => {
                    return Err(Failed::Diagnostic(Error::new(
                        &codes::STORAGE_UNREACHABLE,
                        format!(
                            "cannot {what} `{}`: still failing after {attempt} attempts: {}",
                            self.display(path),
                            error_text(&e)
                        ),
                    )))
                }
                Err(e) => return Err(Failed::Store(e)),
            }
        }
    }

    /// [`ObjectStorage::attempt`] with every failure a diagnostic.
    fn run<T, F, Fut>(&self, request: Request, path: &str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Arc<dyn ObjectStore>) -> Fut,
        Fut: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        self.attempt(request, path, op)
            .map_err(|f| self.diagnostic(verb(request), path, f))
    }

    fn diagnostic(&self, what: &str, path: &str, f: Failed) -> Error {
        match f {
            Failed::Store(e) => self.error(what, path, e),
            Failed::Diagnostic(d) => d,
        }
    }

    /// `None` for a missing object; a missing bucket is still an error.
    fn absent_as_none<T>(
        &self,
        what: &str,
        path: &str,
        r: std::result::Result<T, Failed>,
    ) -> Result<Option<T>> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(Failed::Store(e @ object_store::Error::NotFound { .. }))
                if !error_text(&e).contains("NoSuchBucket") =>
            {
                Ok(None)
            }
            Err(f) => Err(self.diagnostic(what, path, f)),
        }
    }

    /// The diagnostic of a final failure.
    fn error(&self, what: &str, path: &str, e: object_store::Error) -> Error {
        let at = self.display(path);
        let text = error_text(&e);
        if text.contains("NoSuchBucket") {
            return Error::new(
                &codes::STORAGE_NOT_FOUND,
                format!("cannot {what} `{at}`: the bucket does not exist ({text})"),
            );
        }
        match e {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Error::new(
                &codes::STORAGE_DENIED,
                format!("cannot {what} `{at}`: access denied: {text}"),
            ),
            _ if [
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
            ]
            .iter()
            .any(|m| text.contains(m)) =>
            {
                Error::new(
                    &codes::STORAGE_DENIED,
                    format!("cannot {what} `{at}`: access denied: {text}"),
                )
            }
            object_store::Error::NotImplemented { .. }
            | object_store::Error::NotSupported { .. } => Error::new(
                &codes::STORAGE_UNSUPPORTED,
                format!("cannot {what} `{at}`: the store does not support it: {text}"),
            ),
            _ => io_error(what, &at, text),
        }
    }

    fn put_payload(
        &self,
        path: &str,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> std::result::Result<Option<String>, Failed> {
        let at = self.object_path(path);
        let payload = PutPayload::from(bytes);
        self.attempt(Request::Put, path, move |s| {
            let (at, payload, mode) = (at.clone(), payload.clone(), mode.clone());
            async move {
                s.put_opts(&at, payload, PutOptions::from(mode))
                    .await
                    .map(|r| r.e_tag)
            }
        })
    }

    /// Writes `bytes` to `path` in `mode`, a conditional create or update: the new
    /// object's ETag, or `None` when the condition failed.
    pub(crate) fn put_conditional(
        &self,
        path: &str,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> Result<Option<Option<String>>> {
        match self.put_payload(path, bytes, mode) {
            Ok(etag) => Ok(Some(etag)),
            Err(Failed::Store(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            )) => Ok(None),
            Err(f) => Err(self.diagnostic("write", path, f)),
        }
    }

    /// One listing of directory `dir` (every page of it).
    fn list_dir(&self, dir: &str) -> Result<object_store::ListResult> {
        let at = self.object_path(dir);
        let root = dir.trim_matches('/').is_empty() && self.prefix.is_empty();
        self.run(Request::List, dir, move |s| {
            let at = at.clone();
            async move {
                let prefix = if root { None } else { Some(&at) };
                s.list_with_delimiter(prefix).await
            }
        })
    }

    /// The object at `path` and its ETag, if there is one.
    pub(crate) fn read_with_etag(&self, path: &str) -> Result<Option<(Vec<u8>, Option<String>)>> {
        let at = self.object_path(path);
        let r = self.attempt(Request::Get, path, move |s| {
            let at = at.clone();
            async move {
                let got = s.get(&at).await?;
                let etag = got.meta.e_tag.clone();
                Ok((got.bytes().await?.to_vec(), etag))
            }
        });
        self.absent_as_none("read", path, r)
    }
}

/// The [`FileMeta`] of a listed or headed object: its ETag is its version.
fn file_meta(m: &object_store::ObjectMeta) -> FileMeta {
    FileMeta {
        size: m.size,
        modified_ms: m.last_modified.timestamp_millis(),
        version: m.e_tag.clone(),
    }
}

/// Whether `e` may pass on its own: the connection or a timeout, or the store saying it
/// is overloaded or failing (HTTP 5xx, 429, `SlowDown`).
fn transient(e: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind;
    let object_store::Error::Generic { .. } = e else {
        return false;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<object_store::client::HttpError>() {
            return matches!(
                h.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            );
        }
        source = s.source();
    }
    let text = e.to_string();
    [
        "status code: 5",
        "429",
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// The message of `e` with its sources, credentials never among them.
fn error_text(e: &object_store::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        source = s.source();
    }
    out
}

/// What [`Storage::put`] writes to: up to [`PART_BYTES`] it is one `PUT` (retried);
/// beyond, a multipart upload of parts of that size, so that an object of any size is
/// written in bounded memory. Either way the object appears whole, or not at all.
struct Upload<'a> {
    storage: &'a ObjectStorage,
    path: &'a str,
    buffer: Vec<u8>,
    multipart: Option<Box<dyn object_store::MultipartUpload>>,
}

/// The size of a multipart upload's parts (S3 takes at least 5 MiB but for the last).
pub const PART_BYTES: usize = 8 << 20;

impl Upload<'_> {
    fn failed(&self, e: object_store::Error) -> Error {
        self.storage
            .diagnostic("write", self.path, Failed::Store(e))
    }

    /// Sends the buffer as the next part, starting the upload with the first.
    fn send_part(&mut self) -> Result<()> {
        if self.multipart.is_none() {
            let store = self.storage.multipart.clone();
            let at = self.storage.object_path(self.path);
            let started = block(async move { store.put_multipart(&at).await });
            self.multipart = Some(started.map_err(|e| self.failed(e))?);
        }
        let part = PutPayload::from(std::mem::take(&mut self.buffer));
        let upload = self.multipart.as_mut().expect("started");
        block(upload.put_part(part)).map_err(|e| self.failed(e))
    }

    fn finish(mut self) -> Result<()> {
        if self.multipart.is_none() {
            let bytes = std::mem::take(&mut self.buffer);
            return self
                .storage
                .put_payload(self.path, bytes, PutMode::Overwrite)
                .map(|_| ())
                .map_err(|f| self.storage.diagnostic("write", self.path, f));
        }
        if !self.buffer.is_empty() {
            if let Err(e) = self.send_part() {
                self.abort();
                return Err(e);
            }
        }
        let mut upload = self.multipart.take().expect("started");
        block(async move { upload.complete().await })
            .map(|_| ())
            .map_err(|e| self.failed(e))
    }

    /// Gives up an upload started: its parts are deleted, no object appears.
    fn abort(mut self) {
        if let Some(mut upload) = self.multipart.take() {
            if let Err(e) = block(async move { upload.abort().await }) {
                tracing::warn!(
                    "abandoning the upload of {}: {e}",
                    self.storage.display(self.path)
                );
            }
        }
    }
}

impl Write for Upload<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(PART_BYTES - self.buffer.len());
        self.buffer.extend_from_slice(&buf[..n]);
        if self.buffer.len() == PART_BYTES {
            self.send_part().map_err(std::io::Error::other)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub use counted::Counted;

/// The object store of `url`'s bucket for table formats (Delta, Iceberg) that send their
/// own requests through `object_store`: configured as [`build_store`] does, but with
/// `object_store`'s own retries of transient failures (ours cannot wrap their calls), and
/// every request counted in [`request_counts`].
pub fn table_store(url: &url::Url, options: &StorageOptions) -> Result<Arc<dyn ObjectStore>> {
    let store = build_store_with(url, options, object_store::RetryConfig::default())?;
    Ok(Arc::new(Counted::new(store)))
}

/// A table's stores for table formats that take a bucket's store and the table's
/// (`deltalake`'s log stores): the bucket's [`table_store`], the same under the table's
/// prefix, and the table's URL ending in `/`.
pub struct TableStores {
    /// The store of the bucket.
    pub root: Arc<dyn ObjectStore>,
    /// The store of the table's prefix.
    pub prefixed: Arc<dyn ObjectStore>,
    /// `scheme://bucket/prefix/`.
    pub url: url::Url,
}

/// The [`TableStores`] of the table at `url` (`scheme://bucket/prefix`).
pub fn table_stores(url: &url::Url, options: &StorageOptions) -> Result<TableStores> {
    let mut bucket = url.clone();
    bucket.set_path("/");
    let root = table_store(&bucket, options)?;
    let prefix = url.path().trim_matches('/');
    let prefixed: Arc<dyn ObjectStore> = if prefix.is_empty() {
        root.clone()
    } else {
        Arc::new(object_store::prefix::PrefixStore::new(
            root.clone(),
            ObjectPath::from(prefix),
        ))
    };
    let mut table_url = url.clone();
    table_url.set_path(&format!("/{prefix}/").replace("//", "/"));
    Ok(TableStores {
        root,
        prefixed,
        url: table_url,
    })
}

/// The log store of the Delta table at `url` (`scheme://bucket/prefix`): `deltalake`'s
/// default log store over [`table_stores`], whose commits are conditional puts of
/// `_delta_log/<version>.json` (`If-None-Match: *`), so of two writers of one version
/// exactly one wins.
#[cfg(feature = "delta")]
pub fn delta_log_store(
    url: &url::Url,
    options: &StorageOptions,
) -> Result<deltalake::logstore::LogStoreRef> {
    let stores = table_stores(url, options)?;
    Ok(deltalake::logstore::default_logstore(
        stores.prefixed,
        stores.root,
        &stores.url,
        &deltalake::logstore::StorageConfig::default(),
    ))
}

/// The object store of `url`, configured from the environment, then `options`, with no
/// retries of its own ([`ObjectStorage`] retries, counted).
pub fn build_store(url: &url::Url, options: &StorageOptions) -> Result<Arc<dyn ObjectStore>> {
    // Retries are ours (counted, and classified with the request's own diagnostics).
    let retry = object_store::RetryConfig {
        max_retries: 0,
        ..object_store::RetryConfig::default()
    };
    build_store_with(url, options, retry)
}

fn build_store_with(
    url: &url::Url,
    options: &StorageOptions,
    retry: object_store::RetryConfig,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use object_store::ClientConfigKey;
    let bad_option = |key: &str, e: &dyn std::fmt::Display| {
        Error::new(
            &codes::BAD_URI,
            format!("storage option `{key}` for `{url}`: {e}"),
        )
        .with_help("See docs/connectors.md, \"Object stores\", for the options each store takes.")
    };
    let built = |r: object_store::Result<Arc<dyn ObjectStore>>| {
        r.map_err(|e| {
            Error::new(
                &codes::BAD_URI,
                format!("cannot configure the object store of `{url}`: {e}"),
            )
        })
    };
    // A connection that cannot open fails fast into our retries; a request may take long
    // (large objects on a slow link).
    let defaults = [
        (ClientConfigKey::ConnectTimeout, "5s"),
        (ClientConfigKey::Timeout, "300s"),
    ];
    let base = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    match url.scheme() {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env()
                .with_url(format!("s3://{}", url.host_str().unwrap_or_default()))
                .with_retry(retry);
            for (k, v) in defaults {
                b = b.with_config(AmazonS3ConfigKey::Client(k), v);
            }
            for (k, v) in &options.0 {
                let key: AmazonS3ConfigKey = k
                    .parse()
                    .or_else(|_| format!("aws_{k}").parse())
                    .map_err(|e| bad_option(k, &e))?;
                b = b.with_config(key, v);
            }
            built(b.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>))
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_url(base)
                .with_retry(retry);
            for (k, v) in defaults {
                b = b.with_config(GoogleConfigKey::Client(k), v);
            }
            for (k, v) in &options.0 {
                let key: GoogleConfigKey = k.parse().map_err(|e| bad_option(k, &e))?;
                b = b.with_config(key, v);
            }
            built(b.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>))
        }
        "az" | "abfs" | "abfss" => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry);
            for (k, v) in defaults {
                b = b.with_config(AzureConfigKey::Client(k), v);
            }
            for (k, v) in &options.0 {
                let key: AzureConfigKey = k.parse().map_err(|e| bad_option(k, &e))?;
                b = b.with_config(key, v);
            }
            built(b.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>))
        }
        other => Err(Error::new(
            &codes::BAD_URI,
            format!("`{other}://` is not an object store this crate serves (at {url})"),
        )),
    }
}

impl Storage for ObjectStorage {
    fn display(&self, path: &str) -> String {
        if path.is_empty() {
            self.url.clone()
        } else {
            format!("{}/{path}", self.url)
        }
    }

    fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let at = self.object_path(path);
        let r = self.attempt(Request::Get, path, move |s| {
            let at = at.clone();
            async move { s.get(&at).await?.bytes().await.map(|b| b.to_vec()) }
        });
        self.absent_as_none("read", path, r)
    }

    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let at = self.object_path(path);
        let bytes = self.run(Request::Get, path, move |s| {
            let at = at.clone();
            async move { s.get_range(&at, offset..offset + len).await }
        })?;
        if bytes.len() as u64 != len {
            return Err(io_error(
                "read",
                &self.display(path),
                format!("{len} bytes at {offset} pass its end"),
            ));
        }
        Ok(bytes.to_vec())
    }

    fn size(&self, path: &str) -> Result<Option<u64>> {
        let at = self.object_path(path);
        let r = self.attempt(Request::Head, path, move |s| {
            let at = at.clone();
            async move { s.head(&at).await.map(|m| m.size) }
        });
        self.absent_as_none("read", path, r)
    }

    fn stat(&self, path: &str) -> Result<Option<FileMeta>> {
        let at = self.object_path(path);
        let r = self.attempt(Request::Head, path, move |s| {
            let at = at.clone();
            async move { s.head(&at).await.map(|m| file_meta(&m)) }
        });
        self.absent_as_none("read", path, r)
    }

    fn list_files(&self, dir: &str) -> Result<Vec<(String, FileMeta)>> {
        let mut files: Vec<(String, FileMeta)> = self
            .list_dir(dir)?
            .objects
            .iter()
            .filter_map(|m| Some((m.location.filename()?.to_string(), file_meta(m))))
            .collect();
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(files)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let listed = self.list_dir(dir)?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(|n| format!("{n}/")))
            .chain(
                listed
                    .objects
                    .iter()
                    .filter_map(|m| m.location.filename().map(str::to_string)),
            )
            .collect();
        names.sort();
        Ok(names)
    }

    fn put(
        &self,
        path: &str,
        fill: &mut dyn FnMut(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<()> {
        let mut upload = Upload {
            storage: self,
            path,
            buffer: Vec::new(),
            multipart: None,
        };
        match fill(&mut upload) {
            Ok(()) => upload.finish(),
            Err(e) => {
                upload.abort();
                Err(e)
            }
        }
    }

    fn put_if_absent(&self, path: &str, bytes: &[u8]) -> Result<bool> {
        let retries_before = self.retries.load(Ordering::Relaxed);
        if self
            .put_conditional(path, bytes.to_vec(), PutMode::Create)?
            .is_some()
        {
            return Ok(true);
        }
        // A retried create may have succeeded on an attempt whose answer was lost: the
        // object then holds exactly our bytes.
        if self.retries.load(Ordering::Relaxed) != retries_before {
            if let Some(existing) = self.read(path)? {
                return Ok(existing == bytes);
            }
        }
        Ok(false)
    }

    fn delete(&self, path: &str) -> Result<()> {
        let at = self.object_path(path);
        let r = self.attempt(Request::Delete, path, move |s| {
            let at = at.clone();
            async move { s.delete(&at).await }
        });
        self.absent_as_none("delete", path, r).map(|_| ())
    }

    fn delete_all(&self, paths: &[String]) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let at: Vec<ObjectPath> = paths.iter().map(|p| self.object_path(p)).collect();
        self.run(Request::Delete, &paths[0], move |s| {
            let at = at.clone();
            async move {
                let stream = futures::stream::iter(at.into_iter().map(Ok)).boxed();
                s.delete_stream(stream)
                    .try_filter_map(|_| async { Ok(None::<()>) })
                    .or_else(|e| async move {
                        match e {
                            object_store::Error::NotFound { .. } => Ok(()),
                            e => Err(e),
                        }
                    })
                    .try_collect::<Vec<()>>()
                    .await
                    .map(|_| ())
            }
        })
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (a, b) = (self.object_path(from), self.object_path(to));
        self.run(Request::Copy, from, move |s| {
            let (a, b) = (a.clone(), b.clone());
            async move { s.copy(&a, &b).await }
        })?;
        self.delete(from)
    }

    fn append(&self, path: &str) -> Result<Box<dyn AppendFile>> {
        Ok(Box::new(append::ObjectAppend::open(self.clone(), path)?))
    }

    fn lock(&self, path: &str) -> Result<Lock> {
        lease::take(self.clone(), path)
    }

    fn appends(&self) -> bool {
        false
    }

    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
