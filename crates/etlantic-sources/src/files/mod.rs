//! The `file://` source: a file, or a directory of files, in JSON lines, CSV or Parquet.
//!
//! # Binding
//!
//! `file://<path>?format=jsonl|json|csv|parquet&header=true&delimiter=,&max_files_per_trigger=N`
//!
//! - `<path>` is a file or a directory; a relative path is resolved against the project
//!   root ([`SourceContext::resolve_path`]).
//! - `format` defaults to the file extension: `.jsonl`, `.ndjson` and `.json` are JSON
//!   lines, `.csv` is CSV, `.parquet` is Parquet.
//! - A directory is read as every file of the format directly inside it, sorted by
//!   name. Hidden files and files whose name starts with `_` or `.` are ignored (so a
//!   writer can stage files under such names and rename them into place). With an
//!   explicit `format`, files without an extension are read too; without one, each file
//!   is read according to its own extension and files with other extensions are ignored.
//! - CSV: `header` (default `true`: the first line names the columns, which are matched
//!   to the contract by name; `false`: columns are matched by position) and `delimiter`
//!   (one character, or `tab`).
//! - `max_files_per_trigger` (also `maxFilesPerTrigger`): at most this many new files per
//!   micro-batch; the runtime's [`ReadLimit::max_files`] applies as well (the smaller
//!   wins).
//! - `batch_size`: rows per Arrow batch (default 8192).
//!
//! Decoding is contract-aware and never loses a record; see [`crate::decode`]. Rejected
//! records carry the asset, the file (relative to the project root), the 1-based line
//! for JSON lines and CSV (CSV counts its header line) or the 0-based row for Parquet,
//! and the raw line (Parquet: the row as JSON).
//!
//! # Capabilities and offsets
//!
//! Always bounded; unbounded (streaming) only for directories (decided from the URI: a
//! location whose last segment has a known format extension is a file). Replayable.
//!
//! Streaming follows Spark's file stream source: the source keeps a log of the files it
//! has seen under [`SourceContext::state`] (the checkpoint's `sources/<n>/`; its
//! layout and compaction in [`seen_log`]). [`Source::latest_offset`] lists the
//! directory, assigns unseen files (at most the file limit) to the next index, persists
//! that assignment with each file's size and modification time, and returns
//! `{"index": n}`; [`Source::read`] reads exactly the files assigned to the indexes in
//! `(start, end]`, also after a restart with a new instance. A file name is read once.
//!
//! Files must not change once they are in the directory (write them elsewhere, or under
//! a name starting with `.` or `_`, and rename them into place). A file whose size or
//! modification time differs from what was logged when it was picked up — appended,
//! truncated, replaced or deleted — would make a replay read other bytes than the first
//! read, so it is never read: the read returns it as one rejected record (`ETL713`, the
//! file as its position, no raw text), checked before and after decoding it. The
//! profile's `on_error` then decides: `fail` stops the query, `quarantine` records it
//! and goes on without the file.
//!
//! # Object stores
//!
//! `s3://bucket/prefix/?format=…` (and `gs://`, `az://`, through the storage provider
//! linked for them, `etlantic-object-store`) reads the objects directly under the prefix
//! as a directory's files, with the same options, formats, limits and log; a location
//! ending in a known extension is one object. The listing is one `LIST` per micro-batch
//! (pages of 1,000 objects), and an object is logged with its ETag besides its size and
//! time: an object overwritten after it was picked up is rejected with `ETL713` as a
//! changed file is. Objects are read by ranged `GET`s of 4 MiB (JSON lines, CSV) or the
//! footer and the needed column chunks (Parquet), never held whole. The store's options
//! (endpoint, credentials) are the profile's `storage_options`.
//!
//! Without a state directory (batch runs) the offset lists the files themselves:
//! `{"files": ["a.jsonl", "b.jsonl"]}` covers those files (cumulatively), and `read`
//! returns the files of `end` that are not in `start`. A plain file is one file.

mod formats;
mod input;
mod lines;
pub mod seen_log;

pub use formats::{CsvOptions, FileFormat};
pub use seen_log::{LogEntry, LoggedFile, SeenLog};

use crate::decode::ContractDecoder;
use crate::fsutil::io_error;
use etlantic_core::data::{Backlog, Offset, RejectedRecord, SourcePosition};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::read_progress::ReadProgress;
use etlantic_core::storage::{FileMeta, Location, Storage};
use etlantic_core::uri::BindingUri;
use formats::ReadCtx;
use input::FileRef;
use serde_json::json;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Default number of rows per Arrow batch.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// The provider of `file://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileSourceProvider;

inventory::submit! { SourceRegistration(&FileSourceProvider) }

/// The options of a `file://` source binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSourceOptions {
    /// `?format=`, when given.
    pub format: Option<FileFormat>,
    /// CSV options.
    pub csv: CsvOptions,
    /// `?max_files_per_trigger=`.
    pub max_files_per_trigger: Option<usize>,
    /// `?batch_size=` (rows per Arrow batch).
    pub batch_size: usize,
    /// `?read_ahead=` (default `false`): a stream decodes its next micro-batch's files
    /// while the current one is processed, holding one micro-batch more in memory. It
    /// pays where cores would otherwise idle; where decoding and aggregation already use
    /// every core it gains nothing and raises the peak memory (docs/ingestion.md), hence
    /// off by default.
    pub read_ahead: bool,
}

fn bad_param(uri: &BindingUri, key: &str, value: &str, expected: &str) -> Error {
    Error::new(
        &codes::BAD_URI,
        format!(
            "binding `{}`: parameter `{key}={value}` is invalid, expected {expected}",
            uri.redacted()
        ),
    )
}

fn flag(uri: &BindingUri, key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(bad_param(uri, key, value, "true or false")),
    }
}

impl FileSourceOptions {
    /// Parses the query parameters of a `file://` URI. An unknown parameter is an error
    /// (`ETL007`), an unknown format `ETL505`.
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let mut o = FileSourceOptions {
            format: None,
            csv: CsvOptions::default(),
            max_files_per_trigger: None,
            batch_size: DEFAULT_BATCH_SIZE,
            read_ahead: false,
        };
        for (key, value) in &uri.params {
            match key.as_str() {
                "format" => {
                    o.format = Some(FileFormat::from_name(value).ok_or_else(|| {
                        Error::new(
                            &codes::FORMAT_UNSUPPORTED,
                            format!(
                                "binding `{}`: unknown format `{value}` (the file source reads jsonl, json, csv, parquet)",
                                uri.redacted()
                            ),
                        )
                    })?)
                }
                "header" => o.csv.header = flag(uri, key, value)?,
                "read_ahead" => o.read_ahead = flag(uri, key, value)?,
                "delimiter" | "sep" => {
                    o.csv.delimiter = match value.as_str() {
                        "tab" | "\\t" | "\t" => b'\t',
                        v if v.len() == 1 && v.is_ascii() => v.as_bytes()[0],
                        _ => return Err(bad_param(uri, key, value, "one ASCII character or `tab`")),
                    }
                }
                "max_files_per_trigger" | "maxFilesPerTrigger" => {
                    let n: usize = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad_param(uri, key, value, "a positive integer"))?;
                    o.max_files_per_trigger = Some(n);
                }
                "batch_size" => {
                    o.batch_size = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad_param(uri, key, value, "a positive integer"))?;
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                            "binding `{}`: unknown parameter `{other}` for the file source (known: {})",
                            uri.redacted(),
                            option_names(OPTIONS)
                        ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// Whether a location names a file (its last segment has a known format extension)
/// rather than a directory. Decided without I/O.
pub fn looks_like_file(location: &str) -> bool {
    !location.ends_with('/') && FileFormat::from_path(Path::new(location)).is_some()
}

/// The query parameters of a `file://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "format",
        default: "from the file extension",
        meaning: "File format: `jsonl` (also `json`, `ndjson`, `jsonlines`), `csv` or `parquet`; without it, a directory reads each file by its own extension.",
    },
    BindingOption {
        name: "header",
        default: "true",
        meaning: "CSV: the first line names the columns (matched to the contract by name); `false` matches them by position.",
    },
    BindingOption {
        name: "delimiter",
        default: ",",
        meaning: "CSV field delimiter: one ASCII character or `tab` (also `sep`).",
    },
    BindingOption {
        name: "max_files_per_trigger",
        default: "unlimited",
        meaning: "A stream reads at most this many new files per micro-batch; with the pipeline's `read_limit.max_files` the smaller wins (also `maxFilesPerTrigger`).",
    },
    BindingOption {
        name: "batch_size",
        default: "8192",
        meaning: "Rows per Arrow batch when decoding.",
    },
    BindingOption {
        name: "read_ahead",
        default: "false",
        meaning: "A stream decodes the next micro-batch's files on a thread of its own while the current one is processed (more memory, less waiting).",
    },
];

impl SourceProvider for FileSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "file"
    }

    fn aliases(&self) -> &'static [&'static str] {
        etlantic_core::storage::OBJECT_SCHEMES
    }

    fn description(&self) -> &'static str {
        "Files and directories of JSON lines, CSV or Parquet, on a local disk or an object store (s3://); directories stream new files"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        FileSourceOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: true,
            unbounded: !looks_like_file(&uri.location),
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(FileSource::new(ctx)?))
    }
}

#[derive(Debug)]
enum Position {
    Index(u64),
    Files(Vec<String>),
}

fn bad_offset(offset: &Offset) -> Error {
    Error::new(
        &codes::CHECKPOINT_CORRUPT,
        format!(
            "`{}` is not an offset of the file source (expected {{\"index\": n}} or {{\"files\": [...]}})",
            offset.0
        ),
    )
}

fn parse_offset(offset: &Offset) -> Result<Position> {
    if let Some(i) = offset.0.get("index").and_then(|v| v.as_u64()) {
        return Ok(Position::Index(i));
    }
    if let Some(files) = offset.0.get("files").and_then(|v| v.as_array()) {
        return files
            .iter()
            .map(|f| f.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .map(Position::Files)
            .ok_or_else(|| bad_offset(offset));
    }
    Err(bad_offset(offset))
}

/// A file's size, modification time and (on an object store) ETag: what a stream logs
/// when it picks the file up, and compares before it reads it.
type Stamp = FileMeta;

/// Where a source's files are.
#[derive(Clone, Debug)]
enum Dir {
    /// A directory of the local file system.
    Local(PathBuf),
    /// A prefix of an object store.
    Remote(Arc<dyn Storage>),
}

impl Dir {
    fn file(&self, name: &str) -> FileRef {
        match self {
            Dir::Local(base) => FileRef::Local(base.join(name)),
            Dir::Remote(storage) => FileRef::Object {
                storage: storage.clone(),
                name: name.to_string(),
                size: None,
            },
        }
    }
}

/// A `file://` source (see the [module docs](self)).
pub struct FileSource {
    asset: String,
    root: PathBuf,
    /// The directory files are listed in (a plain file's parent).
    dir: Dir,
    /// The file name, for a plain-file source.
    single: Option<(String, FileFormat)>,
    options: FileSourceOptions,
    decoder: ContractDecoder,
    log: Option<SeenLog>,
    /// The files limit of the last `latest_offset` (a stream's read-ahead takes as many).
    last_limit: Option<usize>,
    /// Files the last `latest_offset` found but left for later micro-batches.
    waiting: Option<Backlog>,
    /// The next micro-batch's files, being decoded while the current one is processed.
    read_ahead: Option<ReadAhead>,
    /// The columns the pipeline reads ([`Source::read_only`]); Parquet files skip the
    /// others where no rule needs them.
    columns_read: Option<HashSet<String>>,
    /// How far the read going on is ([`Source::read_progress`]).
    progress: Arc<ReadProgress>,
}

/// Files decoded ahead of their micro-batch on a thread of their own: a stream's next
/// files are known (the listing minus the seen files, up to the trigger's limit) before
/// the driver asks for them, so their decoding overlaps the processing of the current
/// micro-batch. A file that changes after it was listed is rejected by the read ahead as
/// by any read (see the module docs), so what was read ahead is what a later read would
/// read; it is used only when the next read asks for exactly these files (and sizes and
/// times), and a failed read-ahead is read again in the foreground, where its error is
/// reported.
struct ReadAhead {
    names: Vec<(String, Option<Stamp>)>,
    handle: std::thread::JoinHandle<Result<SourceBatch>>,
}

/// Everything needed to read some files of a source, owned (it may run on another
/// thread).
struct ReadJob {
    asset: String,
    root: PathBuf,
    decoder: ContractDecoder,
    csv: CsvOptions,
    batch_size: usize,
    columns_read: Option<HashSet<String>>,
    /// The files, with their size and modification time as logged when a stream picked
    /// them up (`None` in batch runs).
    files: Vec<(FileRef, FileFormat, Option<Stamp>)>,
    /// Told of each file done (not for a read ahead, which would count a micro-batch
    /// before its turn).
    progress: Option<Arc<ReadProgress>>,
}

impl ReadJob {
    fn run(self) -> Result<SourceBatch> {
        let ctx = ReadCtx {
            asset: &self.asset,
            root: &self.root,
            decoder: &self.decoder,
            csv: self.csv,
            batch_size: self.batch_size,
            columns_read: self.columns_read.as_ref(),
        };
        let mut out = SourceBatch::default();
        let sizes: Vec<u64> = match &self.progress {
            Some(_) => self
                .files
                .iter()
                .map(|(f, _, l)| known_size(f, l.as_ref()))
                .collect(),
            None => Vec::new(),
        };
        if let Some(p) = &self.progress {
            p.begin(self.files.len() as u64, sizes.iter().sum());
        }
        for (i, (file, format, logged)) in self.files.iter().enumerate() {
            let rows_before = out.num_rows() + out.rejected.len();
            let done = |out: &SourceBatch| {
                if let Some(p) = &self.progress {
                    let rows = (out.num_rows() + out.rejected.len()).saturating_sub(rows_before);
                    p.file_done(sizes.get(i).copied().unwrap_or(0), rows as u64);
                }
            };
            let Some(logged) = logged else {
                formats::read_file(&ctx, file, *format, &mut out)?;
                done(&out);
                continue;
            };
            // Checked before and after decoding: a change while the file is read counts
            // (also when it made the read fail: an object that shrank mid-read).
            if let Some(changed) = self.changed(file, logged)? {
                out.rejected.push(changed);
                continue;
            }
            let mut part = SourceBatch::default();
            // Unchanged since it was logged: its size is the logged one.
            let sized = file.clone().with_size(logged.size);
            let read = formats::read_file(&ctx, &sized, *format, &mut part);
            if let Some(changed) = self.changed(file, logged)? {
                out.rejected.push(changed);
                continue;
            }
            read?;
            out.batches.extend(part.batches);
            out.rejected.extend(part.rejected);
            for run in part.origins.runs() {
                out.origins.push_run(run.first.clone(), run.rows);
            }
            done(&out);
        }
        Ok(out)
    }

    /// The `ETL713` record of a file whose size or modification time is no longer the
    /// logged one, if it changed.
    fn changed(&self, file: &FileRef, logged: &Stamp) -> Result<Option<RejectedRecord>> {
        let now = file.stat()?;
        if now.as_ref().is_some_and(|now| now.same_as(logged)) {
            return Ok(None);
        }
        let size = logged.size;
        let what = match now {
            None => "was deleted".to_string(),
            Some(FileMeta { size: n, .. }) if n > size => format!("grew from {size} to {n} bytes"),
            Some(FileMeta { size: n, .. }) if n < size => {
                format!("shrank from {size} to {n} bytes")
            }
            Some(FileMeta {
                version: Some(v), ..
            }) if logged.version.as_ref().is_some_and(|l| *l != v) => format!(
                "was rewritten (ETag {v}, not {})",
                logged.version.as_deref().unwrap_or_default()
            ),
            Some(FileMeta { modified_ms: m, .. }) => format!(
                "was rewritten (modified at {m} ms, not {} ms)",
                logged.modified_ms
            ),
        };
        Ok(Some(RejectedRecord {
            code: codes::SOURCE_FILE_CHANGED.code.to_string(),
            reason: format!(
                "the file {what} after the stream picked it up; none of its records were read, since a replay would read other bytes"
            ),
            field: None,
            position: SourcePosition {
                asset: self.asset.clone(),
                file: Some(file.shown(&self.root)),
                ..SourcePosition::default()
            },
            raw: String::new(),
        }))
    }
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("asset", &self.asset)
            .field("dir", &self.dir)
            .field("single", &self.single)
            .finish()
    }
}

impl FileSource {
    /// Creates the source; checks that the path exists (a directory may be missing in a
    /// streaming run: it is read as empty until it appears; an object-store prefix is not
    /// checked here, its first listing is) and loads the seen-files log.
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = FileSourceOptions::from_uri(&ctx.uri)?;
        let streaming = ctx.mode == etlantic_core::streaming::ExecutionMode::Streaming;
        let location = Location::of_binding(&ctx.uri, &ctx.root)?;
        let (shown, is_file) = match &location {
            Location::Local(path) => {
                let is_file = if path.is_dir() {
                    false
                } else if path.is_file() {
                    true
                } else if streaming && !looks_like_file(&ctx.uri.location) {
                    false
                } else {
                    return Err(Error::new(
                        &codes::IO_ERROR,
                        format!("asset `{}`: `{}` does not exist", ctx.asset, path.display()),
                    ));
                };
                (path.display().to_string(), is_file)
            }
            Location::Remote(url) => (url.to_string(), looks_like_file(&ctx.uri.location)),
        };
        let (dir_location, single) = if is_file {
            if streaming {
                return Err(Error::new(
                    &codes::SOURCE_NOT_STREAMABLE,
                    format!(
                        "asset `{}`: `{shown}` is a file; only a directory can be read as a stream",
                        ctx.asset,
                    ),
                ));
            }
            let (parent, name) = location.parent_and_name();
            let format = options
                .format
                .or_else(|| FileFormat::from_path(Path::new(&name)))
                .ok_or_else(|| {
                    Error::new(
                        &codes::FORMAT_UNSUPPORTED,
                        format!(
                            "asset `{}`: cannot tell the format of `{shown}` from its extension; add ?format=jsonl|csv|parquet",
                            ctx.asset,
                        ),
                    )
                })?;
            (parent, Some((name, format)))
        } else {
            (location, None)
        };
        let dir = match dir_location {
            Location::Local(path) => Dir::Local(path),
            remote => Dir::Remote(etlantic_core::storage::open_location(
                &remote,
                &ctx.storage_options,
            )?),
        };
        let decoder = ContractDecoder::new(ctx.schema.clone(), ctx.contract.as_deref())?;
        let log = match &ctx.state {
            Some(state) => Some(SeenLog::open_in(state.clone())?),
            None => None,
        };
        Ok(FileSource {
            asset: ctx.asset,
            root: ctx.root,
            dir,
            single,
            options,
            decoder,
            log,
            last_limit: None,
            waiting: None,
            read_ahead: None,
            progress: Arc::default(),
            columns_read: None,
        })
    }

    fn format_of(&self, name: &str) -> Option<FileFormat> {
        if let Some((single, format)) = &self.single {
            return (single == name).then_some(*format);
        }
        let path = Path::new(name);
        match (self.options.format, FileFormat::from_path(path)) {
            (Some(f), Some(e)) => (f == e).then_some(f),
            (Some(f), None) => path.extension().is_none().then_some(f),
            (None, e) => e,
        }
    }

    /// The files to read, sorted by name, with their size, time and version now.
    fn list(&self) -> Result<Vec<(String, Stamp)>> {
        if let Some((name, _)) = &self.single {
            let file = self.dir.file(name);
            let meta = file.stat()?.ok_or_else(|| {
                io_error(
                    "stat",
                    Path::new(&file.display()),
                    "the file was deleted while it was listed",
                )
            })?;
            return Ok(vec![(name.clone(), meta)]);
        }
        let wanted = |name: &str| {
            !(name.starts_with('.') || name.starts_with('_') || self.format_of(name).is_none())
        };
        let base = match &self.dir {
            Dir::Remote(storage) => {
                // One listing carries every object's size and ETag.
                let mut files = storage.list_files("")?;
                files.retain(|(name, _)| wanted(name));
                return Ok(files);
            }
            Dir::Local(base) => base,
        };
        let listing = match std::fs::read_dir(base) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("list", base, e)),
        };
        let mut names = Vec::new();
        for item in listing {
            let item = item.map_err(|e| io_error("list", base, e))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if !wanted(&name) {
                continue;
            }
            // Follow symlinks: a link to a file counts as a file.
            if std::fs::metadata(item.path()).is_ok_and(|m| m.is_file()) {
                names.push(name);
            }
        }
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let path = base.join(&name);
                let meta = etlantic_core::storage::file_meta(&path)?.ok_or_else(|| {
                    io_error("stat", &path, "the file was deleted while it was listed")
                })?;
                Ok((name, meta))
            })
            .collect()
    }

    fn file_limit(&self, limit: &ReadLimit) -> Option<usize> {
        match (limit.max_files, self.options.max_files_per_trigger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(|n| n.max(1))
    }

    /// The job that reads these files (with the size and modification time a stream
    /// logged for each; checked to have a known format).
    fn read_job(&self, names: &[(String, Option<Stamp>)]) -> Result<ReadJob> {
        let mut files = Vec::with_capacity(names.len());
        for (name, logged) in names {
            let file = self.dir.file(name);
            let format = self.format_of(name).ok_or_else(|| {
                Error::new(
                    &codes::FORMAT_UNSUPPORTED,
                    format!("cannot tell the format of `{}`", file.display()),
                )
            })?;
            if logged.is_none() && file.stat()?.is_none() {
                return Err(Error::new(
                    &codes::IO_ERROR,
                    format!(
                        "asset `{}`: `{}` does not exist",
                        self.asset,
                        file.display()
                    ),
                ));
            }
            files.push((file, format, logged.clone()));
        }
        Ok(ReadJob {
            asset: self.asset.clone(),
            root: self.root.clone(),
            decoder: self.decoder.clone(),
            csv: self.options.csv,
            batch_size: self.options.batch_size,
            columns_read: self.columns_read.clone(),
            files,
            progress: Some(self.progress.clone()),
        })
    }

    fn read_names(&mut self, names: &[(String, Option<Stamp>)]) -> Result<SourceBatch> {
        if let Some(ahead) = self.read_ahead.take() {
            if ahead.names == names {
                if let Ok(Ok(batch)) = ahead.handle.join() {
                    // A file that changed since it was read ahead is read (and rejected)
                    // now, as a read without read-ahead would.
                    let unchanged = names.iter().all(|(name, logged)| {
                        logged.as_ref().is_none_or(|l| {
                            self.dir
                                .file(name)
                                .stat()
                                .ok()
                                .flatten()
                                .is_some_and(|now| now.same_as(l))
                        })
                    });
                    if unchanged {
                        // Decoded already: done at once.
                        let bytes = names
                            .iter()
                            .filter_map(|(_, l)| l.as_ref())
                            .map(|l| l.size)
                            .sum();
                        self.progress.begin(names.len() as u64, bytes);
                        self.progress
                            .file_done(bytes, (batch.num_rows() + batch.rejected.len()) as u64);
                        for _ in 1..names.len() {
                            self.progress.file_done(0, 0);
                        }
                        return Ok(batch);
                    }
                }
            }
            // Not what is asked for (or it failed): left to finish on its own.
        }
        self.read_job(names)?.run()
    }

    /// Starts decoding the files the micro-batch after log index `index` will read: the
    /// ones already assigned to `index + 1`, or else the unseen files up to the last
    /// limit. Does nothing when there are none or they cannot be read.
    fn start_read_ahead(&mut self, index: u64) {
        let Some(log) = &self.log else { return };
        let names: Vec<(String, Option<Stamp>)> = match log.files(index + 1) {
            Ok(Some(files)) => logged_names(files),
            Ok(None) => match self.list() {
                Ok(listed) => listed
                    .into_iter()
                    .filter(|(name, _)| !log.contains(name))
                    .take(self.last_limit.unwrap_or(usize::MAX))
                    .map(|(name, meta)| (name, Some(meta)))
                    .collect(),
                Err(_) => return,
            },
            Err(_) => return,
        };
        if names.is_empty() {
            return;
        }
        let Ok(mut job) = self.read_job(&names) else {
            return;
        };
        job.progress = None;
        let spawned = std::thread::Builder::new()
            .name(format!("read-ahead {}", self.asset))
            .spawn(move || job.run());
        if let Ok(handle) = spawned {
            self.read_ahead = Some(ReadAhead { names, handle });
        }
    }
}

/// A file's size for progress: as logged, else the local file's (0 when not known
/// cheaply: an object whose size was not listed).
fn known_size(file: &FileRef, logged: Option<&Stamp>) -> u64 {
    if let Some(l) = logged {
        return l.size;
    }
    match file {
        FileRef::Local(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        FileRef::Object { size, .. } => size.unwrap_or(0),
    }
}

/// The names of logged files with the size and modification time logged for each.
fn logged_names(files: Vec<LoggedFile>) -> Vec<(String, Option<Stamp>)> {
    files
        .into_iter()
        .map(|f| {
            let meta = f.meta();
            (f.path, Some(meta))
        })
        .collect()
}

#[async_trait::async_trait]
impl Source for FileSource {
    fn checks_record_rules(&self) -> bool {
        // The contract decoder checks them while it decodes, with each record's position.
        true
    }

    fn schema(&self) -> arrow::datatypes::SchemaRef {
        self.decoder.schema()
    }

    fn read_progress(&self) -> Option<Arc<ReadProgress>> {
        Some(self.progress.clone())
    }

    fn read_only(&mut self, columns: &[String]) {
        self.columns_read = Some(columns.iter().cloned().collect());
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let max = self.file_limit(limit);
        self.last_limit = max;
        if self.log.is_none() {
            // Offsets list the files themselves (cumulatively).
            let seen: Vec<String> = match start.map(parse_offset).transpose()? {
                None => Vec::new(),
                Some(Position::Files(f)) => f,
                Some(Position::Index(_)) => {
                    return Err(Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        "an index offset of the file source needs the source's state directory",
                    ))
                }
            };
            let seen_set: HashSet<&str> = seen.iter().map(String::as_str).collect();
            let mut new: Vec<(String, u64)> = self
                .list()?
                .into_iter()
                .filter(|(n, _)| !seen_set.contains(n.as_str()))
                .map(|(n, meta)| (n, meta.size))
                .collect();
            let waiting = new.split_off(max.unwrap_or(usize::MAX).min(new.len()));
            self.waiting = Some(Backlog {
                records: None,
                files: Some(waiting.len() as u64),
                bytes: Some(waiting.iter().map(|(_, size)| size).sum()),
            });
            let new: Vec<String> = new.into_iter().map(|(n, _)| n).collect();
            if new.is_empty() {
                return Ok(start.cloned());
            }
            let mut all = seen.clone();
            all.extend(new);
            return Ok(Some(Offset(json!({ "files": all }))));
        }
        let start_index = match start.map(parse_offset).transpose()? {
            None => None,
            Some(Position::Index(i)) => Some(i),
            Some(Position::Files(_)) => return Err(bad_offset(start.expect("some"))),
        };
        let listed = self.list()?;
        let log = self.log.as_mut().expect("streaming log");
        let last = log.last_index();
        if let Some(s) = start_index {
            if last.is_none_or(|l| s > l) {
                return Err(Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!(
                        "file source offset index {s} is beyond its log in `{}` (last index: {})",
                        log.location(),
                        last.map_or("none".to_string(), |l| l.to_string())
                    ),
                ));
            }
        }
        let next = start_index.map_or(0, |s| s + 1);
        if last.is_some_and(|l| l >= next) {
            // Already assigned (e.g. before a restart): hand out the next logged index.
            return Ok(Some(Offset(json!({ "index": next }))));
        }
        let mut new: Vec<LoggedFile> = listed
            .into_iter()
            .filter(|(name, _)| !log.contains(name))
            .map(|(name, meta)| LoggedFile {
                path: name,
                size: meta.size,
                modified_ms: meta.modified_ms,
                version: meta.version,
            })
            .collect();
        let waiting = new.split_off(max.unwrap_or(usize::MAX).min(new.len()));
        self.waiting = Some(Backlog {
            records: None,
            files: Some(waiting.len() as u64),
            bytes: Some(waiting.iter().map(|f| f.size).sum()),
        });
        if new.is_empty() {
            return Ok(start.cloned());
        }
        log.append(next, new)?;
        Ok(Some(Offset(json!({ "index": next }))))
    }

    fn backlog(&self, _position: Option<&Offset>) -> Option<Backlog> {
        // Files found by the last listing beyond the micro-batch's limit (files already
        // assigned to a later index, after a restart, are read next and not counted).
        self.waiting
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let names: Vec<(String, Option<Stamp>)> = match parse_offset(end)? {
            Position::Files(end_files) => {
                let start_files = match start.map(parse_offset).transpose()? {
                    None => Vec::new(),
                    Some(Position::Files(f)) => f,
                    Some(Position::Index(_)) => return Err(bad_offset(start.expect("some"))),
                };
                let before: HashSet<&String> = start_files.iter().collect();
                end_files
                    .into_iter()
                    .filter(|f| !before.contains(f))
                    .map(|f| (f, None))
                    .collect()
            }
            Position::Index(e) => {
                let s = match start.map(parse_offset).transpose()? {
                    None => None,
                    Some(Position::Index(s)) => Some(s),
                    Some(Position::Files(_)) => return Err(bad_offset(start.expect("some"))),
                };
                let log = self.log.as_ref().ok_or_else(|| {
                    Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        "an index offset of the file source needs the source's state directory",
                    )
                })?;
                let first = s.map_or(0, |s| s + 1);
                let mut names = Vec::new();
                for index in first..=e {
                    let files = log.files(index)?.ok_or_else(|| {
                        Error::new(
                            &codes::CHECKPOINT_CORRUPT,
                            format!(
                                "the file source log in `{}` has no entry for index {index}",
                                log.location()
                            ),
                        )
                    })?;
                    names.extend(logged_names(files));
                }
                let batch = self.read_names(&names)?;
                if self.options.read_ahead {
                    self.start_read_ahead(e);
                }
                return Ok(batch);
            }
        };
        self.read_names(&names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_or_directory_from_the_uri_alone() {
        assert!(looks_like_file("data/orders.jsonl"));
        assert!(looks_like_file("data/orders.PARQUET"));
        assert!(!looks_like_file("data/orders"));
        assert!(!looks_like_file("data/orders.d/"));
        let caps = FileSourceProvider
            .capabilities(&BindingUri::parse("file://in/events?format=csv").unwrap())
            .unwrap();
        assert!(caps.bounded && caps.unbounded);
        assert_eq!(caps.guarantee, SourceGuarantee::Replayable);
        let caps = FileSourceProvider
            .capabilities(&BindingUri::parse("file://in/events.csv").unwrap())
            .unwrap();
        assert!(caps.bounded && !caps.unbounded);
    }

    #[test]
    fn options_are_checked() {
        let o = FileSourceOptions::from_uri(
            &BindingUri::parse(
                "file://x?format=CSV&header=false&delimiter=tab&maxFilesPerTrigger=3",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(o.format, Some(FileFormat::Csv));
        assert!(!o.csv.header);
        assert_eq!(o.csv.delimiter, b'\t');
        assert_eq!(o.max_files_per_trigger, Some(3));
        let e = FileSourceOptions::from_uri(&BindingUri::parse("file://x?format=xml").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "ETL505");
        let e = FileSourceOptions::from_uri(&BindingUri::parse("file://x?heder=true").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "ETL007");
        let e = FileSourceOptions::from_uri(&BindingUri::parse("file://x?delimiter=ab").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "ETL007");
    }
}
