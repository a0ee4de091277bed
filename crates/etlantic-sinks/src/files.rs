//! The `file://` sink: JSON lines, CSV or Parquet files.
//!
//! # Binding
//!
//! `file://<path>?format=jsonl|json|csv|parquet&header=true&delimiter=,` — the format
//! comes from `format` or the extension of `<path>` (`.jsonl`/`.ndjson`/`.json`, `.csv`,
//! `.parquet`). A relative path is resolved against the project root. On an object
//! store, `s3://bucket/prefix/?format=…` (and `gs://`, `az://`) with the object-store
//! storage linked: the same layout, each file an object, the log entries created with a
//! conditional create (`If-None-Match: *`).
//!
//! # Batch runs
//!
//! The whole table is written to `<path>` atomically (temporary file, `fsync`, rename),
//! replacing the file (write mode `overwrite`). When `<path>` is an existing directory or
//! ends with `/`, the table is written into it in the streaming layout below as one
//! entry that replaces everything before it.
//!
//! # Streaming runs
//!
//! `<path>` is a directory. Each micro-batch becomes one data file
//! `part-<batch id, 5 digits>-<first 8 characters of the query id>.<ext>` (none for an
//! empty append batch), written atomically, and then — once the data file is durable —
//! an entry in the sink log `_etlantic_sink/<position>` (JSON, also written atomically)
//! listing the query and batch id, the batch's files, its row count and its Arrow schema.
//! A batch the log already has for its query is skipped
//! ([`WriteOutcome::AlreadyCommitted`]), so replays after a crash never duplicate data:
//! the sink is idempotent by batch id ([`SinkCommitProtocol::IdempotentByBatch`]). The
//! position is the batch id; when another query's entry holds it (a directory that also
//! takes the output of `etlantic dlq redrive`, which appends through its own query), the
//! batch goes after the last entry.
//!
//! Output modes: append, and complete (each batch's file replaces all earlier output: the
//! log entry is marked as replacing, and older data files are deleted after it is
//! written). Update is not supported (`ETL504`).
//!
//! Readers must trust only the files listed in the log (a crash may leave a data file
//! that no entry lists): [`read_committed`] and [`committed_files`] do that.
//!
//! # Value formats
//!
//! JSON lines and CSV write timestamps as ISO-8601 UTC strings with milliseconds
//! (`YYYY-MM-DDTHH:MM:SS.sssZ`), dates as `YYYY-MM-DD`, decimals as numbers; JSON keeps
//! nulls as `null` (every key is written), CSV writes them as empty cells. CSV cannot
//! hold nested columns (`ETL505`).

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::storage::{self, Location, Storage, StorageOptions};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The directory of the sink log inside an output directory.
pub const LOG_DIR: &str = "_etlantic_sink";

/// The timestamp format of JSON and CSV output.
pub const TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.3fZ";

/// A file format the `file://` sink writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileFormat {
    /// One JSON object per line.
    #[serde(rename = "jsonl")]
    JsonLines,
    /// Comma-separated values with a header line.
    #[serde(rename = "csv")]
    Csv,
    /// Apache Parquet (Snappy-compressed).
    #[serde(rename = "parquet")]
    Parquet,
}

impl FileFormat {
    /// The format named by a `?format=` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "jsonl" | "json" | "ndjson" | "jsonlines" => Some(FileFormat::JsonLines),
            "csv" => Some(FileFormat::Csv),
            "parquet" => Some(FileFormat::Parquet),
            _ => None,
        }
    }

    /// The format implied by a path's extension.
    pub fn from_path(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "jsonl" | "ndjson" | "json" => Some(FileFormat::JsonLines),
            "csv" => Some(FileFormat::Csv),
            "parquet" => Some(FileFormat::Parquet),
            _ => None,
        }
    }

    /// The extension of data files written in this format.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::JsonLines => "jsonl",
            FileFormat::Csv => "csv",
            FileFormat::Parquet => "parquet",
        }
    }
}

/// The options of a `file://` sink binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSinkOptions {
    /// The output format.
    pub format: FileFormat,
    /// CSV: write a header line (default `true`).
    pub header: bool,
    /// CSV: the delimiter (default `,`).
    pub delimiter: u8,
}

impl FileSinkOptions {
    /// Parses the URI: the format from `format` or the extension (`ETL505` when neither
    /// tells), `header`, `delimiter`; any other parameter is an error (`ETL007`).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let mut format = None;
        let mut header = true;
        let mut delimiter = b',';
        let bad = |k: &str, v: &str, what: &str| {
            Error::new(
                &codes::BAD_URI,
                format!(
                    "binding `{}`: parameter `{k}={v}` is invalid, expected {what}",
                    uri.redacted()
                ),
            )
        };
        for (k, v) in &uri.params {
            match k.as_str() {
                "format" => {
                    format = Some(FileFormat::from_name(v).ok_or_else(|| {
                        Error::new(
                            &codes::FORMAT_UNSUPPORTED,
                            format!(
                                "binding `{}`: unknown format `{v}` (the file sink writes jsonl, csv, parquet)",
                                uri.redacted()
                            ),
                        )
                    })?)
                }
                "header" => {
                    header = match v.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad(k, v, "true or false")),
                    }
                }
                "delimiter" | "sep" => {
                    delimiter = match v.as_str() {
                        "tab" | "\\t" | "\t" => b'\t',
                        s if s.len() == 1 && s.is_ascii() => s.as_bytes()[0],
                        _ => return Err(bad(k, v, "one ASCII character or `tab`")),
                    }
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                            "binding `{}`: unknown parameter `{other}` for the file sink (known: {})",
                            uri.redacted(),
                            option_names(OPTIONS)
                        ),
                    ))
                }
            }
        }
        let format = format
            .or_else(|| FileFormat::from_path(Path::new(uri.location.trim_end_matches('/'))))
            .ok_or_else(|| {
                Error::new(
                    &codes::FORMAT_UNSUPPORTED,
                    format!(
                        "binding `{}`: cannot tell the output format; add ?format=jsonl|csv|parquet or a file extension",
                        uri.redacted()
                    ),
                )
            })?;
        Ok(FileSinkOptions {
            format,
            header,
            delimiter,
        })
    }
}

/// The provider of `file://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileSinkProvider;

inventory::submit! { SinkRegistration(&FileSinkProvider) }

/// The query parameters of a `file://` sink binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "format",
        default: "from the path's extension",
        meaning: "Output format: `jsonl` (also `json`, `ndjson`, `jsonlines`), `csv` or `parquet`; required when the path has no known extension.",
    },
    BindingOption {
        name: "header",
        default: "true",
        meaning: "CSV: write a header line with the column names.",
    },
    BindingOption {
        name: "delimiter",
        default: ",",
        meaning: "CSV field delimiter: one ASCII character or `tab` (also `sep`).",
    },
];

impl SinkProvider for FileSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "file"
    }

    fn aliases(&self) -> &'static [&'static str] {
        OBJECT_SCHEMES
    }

    fn description(&self) -> &'static str {
        "JSON lines, CSV or Parquet files, on a local disk or an object store (s3://); streaming writes a directory with an idempotent batch log"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        FileSinkOptions::from_uri(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append, OutputMode::Complete],
            guarantee: SinkGuarantee::new(SinkCommitProtocol::IdempotentByBatch),
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(FileSink::new(ctx)?))
    }
}

/// The object-store schemes the file sink writes to as well, through the storage
/// provider linked for them (`etlantic-object-store`): `s3://bucket/prefix/?format=…`.
pub use etlantic_core::storage::OBJECT_SCHEMES;

/// A `file://` sink (see the [module docs](self)).
#[derive(Debug)]
pub struct FileSink {
    asset: String,
    location: Location,
    storage_options: StorageOptions,
    /// The output directory (a streaming run's, or a batch run's when `path` is one); a
    /// batch run's single file is written in its parent's.
    storage: Arc<dyn Storage>,
    trailing_slash: bool,
    options: FileSinkOptions,
    mode: ExecutionMode,
}

impl FileSink {
    /// Creates the sink (writes nothing).
    pub fn new(ctx: SinkContext) -> Result<Self> {
        let options = FileSinkOptions::from_uri(&ctx.uri)?;
        if options.format == FileFormat::Csv {
            check_flat(&ctx.schema)?;
        }
        let location = Location::of_binding(&ctx.uri, &ctx.root)?;
        Ok(FileSink {
            asset: ctx.asset.clone(),
            storage: storage::open_location(&location, &ctx.storage_options)?,
            location,
            storage_options: ctx.storage_options.clone(),
            trailing_slash: ctx.uri.location.ends_with('/'),
            options,
            mode: ctx.mode,
        })
    }

    /// The storage of the directory of a single output file, and the file's name.
    fn parent_and_name(&self) -> Result<(Arc<dyn Storage>, String)> {
        let (parent, name) = self.location.parent_and_name();
        Ok((
            storage::open_location(&parent, &self.storage_options)?,
            name,
        ))
    }

    fn write_dir(
        &self,
        query_id: &str,
        batch_id: u64,
        position: u64,
        kind: EntryKind,
        data: &Table,
    ) -> Result<()> {
        let dir = self.storage.as_ref();
        let rows = data.num_rows() as u64;
        let mut files = Vec::new();
        if rows > 0 || kind != EntryKind::Append {
            let name = part_name(batch_id, query_id, self.options.format);
            write_table(dir, &name, &self.options, &data.schema, &data.batches)?;
            files.push(name);
        }
        let entry = SinkLogEntry {
            version: 1,
            query_id: query_id.to_string(),
            batch_id,
            output_mode: kind.as_str().to_string(),
            replaces: kind != EntryKind::Append,
            format: self.options.format,
            csv_header: (self.options.format == FileFormat::Csv).then_some(self.options.header),
            csv_delimiter: (self.options.format == FileFormat::Csv)
                .then(|| (self.options.delimiter as char).to_string()),
            files: files.clone(),
            rows,
            schema: schema_to_hex(&data.schema)?,
        };
        let text = serde_json::to_string_pretty(&entry).expect("log entries serialise");
        // The data file is written, the batch is not committed yet: a crash here must
        // leave an orphan file that readers ignore.
        etlantic_core::faults::check(etlantic_core::faults::IN_SINK, batch_id);
        // Created only if absent: of two writers of one position (a zombie and its
        // restart, on an object store without a lock) one commits.
        let at = format!("{LOG_DIR}/{position}");
        if !dir.put_if_absent(&at, text.as_bytes())? {
            let theirs = read_entry(dir, &position.to_string())?;
            if theirs.is_some_and(|e| e.query_id == query_id && e.batch_id == batch_id) {
                return Ok(());
            }
            return Err(Error::new(
                &codes::SINK_WRITE_FAILED,
                format!(
                    "sink log entry `{}` was written by another writer meanwhile",
                    dir.display(&at)
                ),
            ));
        }
        if entry.replaces {
            remove_other_parts(dir, &files);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryKind {
    Append,
    Complete,
    Overwrite,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            EntryKind::Append => "append",
            EntryKind::Complete => "complete",
            EntryKind::Overwrite => "overwrite",
        }
    }
}

/// One entry of the sink log (`_etlantic_sink/<batch id>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkLogEntry {
    /// Format version (1).
    pub version: u32,
    /// The query that wrote the batch.
    pub query_id: String,
    /// The batch id (the entry's file name).
    pub batch_id: u64,
    /// `append`, `complete` or `overwrite` (a batch run).
    pub output_mode: String,
    /// Whether this entry replaces all output before it.
    pub replaces: bool,
    /// The data files' format.
    pub format: FileFormat,
    /// CSV: whether the files have a header line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv_header: Option<bool>,
    /// CSV: the delimiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv_delimiter: Option<String>,
    /// The data files written for the batch, relative to the output directory.
    pub files: Vec<String>,
    /// Rows written.
    pub rows: u64,
    /// The Arrow schema of the files (an Arrow IPC schema message, hex-encoded).
    pub schema: String,
}

impl SinkLogEntry {
    /// The Arrow schema of the entry's files.
    pub fn arrow_schema(&self) -> Result<SchemaRef> {
        schema_from_hex(&self.schema)
    }
}

fn part_name(batch_id: u64, query_id: &str, format: FileFormat) -> String {
    let mut short: String = query_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    if short.is_empty() {
        short.push('q');
    }
    format!("part-{batch_id:05}-{short}.{}", format.extension())
}

fn remove_other_parts(dir: &dyn Storage, keep: &[String]) {
    let Ok(listing) = dir.list("") else {
        return;
    };
    let gone: Vec<String> = listing
        .into_iter()
        .filter(|name| name.starts_with("part-") && !keep.contains(name))
        .collect();
    if let Err(e) = dir.delete_all(&gone) {
        tracing::warn!("file sink: cannot remove superseded files: {e}");
    }
}

/// Reads the sink log of an output directory, by batch id (empty when there is none).
pub fn read_log(dir: impl AsRef<Path>) -> Result<BTreeMap<u64, SinkLogEntry>> {
    read_log_in(storage::open(dir.as_ref()).as_ref())
}

fn read_log_in(dir: &dyn Storage) -> Result<BTreeMap<u64, SinkLogEntry>> {
    let mut entries = BTreeMap::new();
    for name in dir.list(LOG_DIR)? {
        let Ok(id) = name.parse::<u64>() else {
            continue;
        };
        if let Some(entry) = read_entry(dir, &name)? {
            entries.insert(id, entry);
        }
    }
    Ok(entries)
}

/// The entry `name` of the sink log (`None` when there is none).
fn read_entry(dir: &dyn Storage, name: &str) -> Result<Option<SinkLogEntry>> {
    let path = format!("{LOG_DIR}/{name}");
    let at = dir.display(&path);
    let corrupt = |e: String| {
        Error::new(
            &codes::SINK_WRITE_FAILED,
            format!("sink log entry `{at}` is corrupt: {e}"),
        )
    };
    let Some(bytes) = dir.read(&path)? else {
        return Ok(None);
    };
    let entry: SinkLogEntry = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    // The sink writes its data files into the output directory itself: a name with a
    // directory in it would send readers elsewhere (even to a device that never ends).
    if let Some(bad) = entry
        .files
        .iter()
        .find(|f| f.is_empty() || f.contains(['/', '\\']) || f.as_str() == "..")
    {
        return Err(corrupt(format!(
            "it lists `{bad}`, not a file of the directory"
        )));
    }
    Ok(Some(entry))
}

/// The log entries that make up the current output: those from the last replacing
/// entry on (all of them when none replaces).
fn current_entries(dir: &dyn Storage) -> Result<Vec<SinkLogEntry>> {
    let entries: Vec<SinkLogEntry> = read_log_in(dir)?.into_values().collect();
    let start = entries.iter().rposition(|e| e.replaces).unwrap_or(0);
    Ok(entries.into_iter().skip(start).collect())
}

/// The data files of an output directory that the sink log vouches for, in order.
pub fn committed_files(dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let dir = dir.as_ref();
    Ok(current_entries(storage::open(dir).as_ref())?
        .into_iter()
        .flat_map(|e| e.files.into_iter().map(|f| dir.join(f)))
        .collect())
}

/// Reads the committed output of a file sink directory: the files listed in the sink
/// log (from the last replacing entry on), in batch order, with the schema recorded in
/// the log. Files no entry lists are ignored.
pub fn read_committed(dir: impl AsRef<Path>) -> Result<Vec<RecordBatch>> {
    read_committed_in(storage::open(dir.as_ref()).as_ref())
}

/// [`read_committed`] of the output directory kept in `dir` (any storage: an object
/// store's too).
pub fn read_committed_in(dir: &dyn Storage) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for entry in current_entries(dir)? {
        let schema = entry.arrow_schema()?;
        for f in &entry.files {
            out.extend(read_data_file(dir, f, &entry, schema.clone())?);
        }
    }
    Ok(out)
}

fn read_data_file(
    dir: &dyn Storage,
    name: &str,
    entry: &SinkLogEntry,
    schema: SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let path = dir.display(name);
    let bad = |e: String| {
        Error::new(
            &codes::IO_ERROR,
            format!("cannot read committed file `{path}`: {e}"),
        )
    };
    let file = dir
        .read(name)?
        .ok_or_else(|| bad("the sink log lists it but it is gone".into()))?;
    let file = bytes::Bytes::from(file);
    match entry.format {
        FileFormat::JsonLines => arrow::json::ReaderBuilder::new(schema)
            .build(std::io::Cursor::new(file))
            .map_err(|e| bad(e.to_string()))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string())),
        FileFormat::Csv => {
            let delimiter = entry
                .csv_delimiter
                .as_deref()
                .and_then(|d| d.bytes().next())
                .unwrap_or(b',');
            arrow::csv::ReaderBuilder::new(schema)
                .with_header(entry.csv_header.unwrap_or(true))
                .with_delimiter(delimiter)
                .build(std::io::Cursor::new(file))
                .map_err(|e| bad(e.to_string()))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))
        }
        FileFormat::Parquet => {
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| bad(e.to_string()))?
                .build()
                .map_err(|e| bad(e.to_string()))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))
        }
    }
}

fn schema_to_hex(schema: &Schema) -> Result<String> {
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), schema)
        .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow ipc: {e}")))?;
    w.finish()
        .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow ipc: {e}")))?;
    let bytes = w
        .into_inner()
        .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow ipc: {e}")))?;
    Ok(hex::encode(bytes))
}

fn schema_from_hex(text: &str) -> Result<SchemaRef> {
    let bad = |e: String| {
        Error::new(
            &codes::SINK_WRITE_FAILED,
            format!("the schema in a sink log entry is corrupt: {e}"),
        )
    };
    let bytes = hex::decode(text).map_err(|e| bad(e.to_string()))?;
    // Arrow's reader panics on some malformed schemas (see `untrusted`).
    etlantic_core::untrusted::decode(
        || {
            let reader =
                arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
                    .map_err(|e| bad(e.to_string()))?;
            Ok(reader.schema())
        },
        |why| bad(why.to_string()),
    )
}

fn check_flat(schema: &Schema) -> Result<()> {
    for f in schema.fields() {
        if f.data_type().is_nested() {
            return Err(Error::new(
                &codes::FORMAT_UNSUPPORTED,
                format!(
                    "column `{}` is nested ({}); CSV cannot hold it — write jsonl or parquet",
                    f.name(),
                    f.data_type()
                ),
            ));
        }
    }
    Ok(())
}

/// The type with every zoned timestamp relabelled as UTC (`+00:00`), at any depth.
fn utc_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Timestamp(unit, Some(_)) => DataType::Timestamp(*unit, Some("+00:00".into())),
        DataType::Struct(fields) => DataType::Struct(utc_fields(fields)),
        DataType::List(item) => DataType::List(Arc::new(utc_field(item))),
        DataType::LargeList(item) => DataType::LargeList(Arc::new(utc_field(item))),
        other => other.clone(),
    }
}

fn utc_field(f: &Field) -> Field {
    f.clone().with_data_type(utc_type(f.data_type()))
}

fn utc_fields(fields: &Fields) -> Fields {
    fields.iter().map(|f| utc_field(f)).collect()
}

/// Relabels zoned timestamps as UTC so that text formats render the UTC instant.
fn utc_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let target = Arc::new(Schema::new_with_metadata(
        utc_fields(schema.fields()),
        schema.metadata().clone(),
    ));
    if target == *schema {
        return Ok((target, batches.to_vec()));
    }
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let columns = b
            .columns()
            .iter()
            .zip(target.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    cast(c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()
            .map_err(err)?;
        out.push(RecordBatch::try_new(target.clone(), columns).map_err(err)?);
    }
    Ok((target, out))
}

/// Writes a table to `path` of `dir` atomically and durably in the given format.
pub(crate) fn write_table(
    dir: &dyn Storage,
    path: &str,
    options: &FileSinkOptions,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<()> {
    let at = dir.display(path);
    let write_err = |e: String| {
        Error::new(
            &codes::SINK_WRITE_FAILED,
            format!("cannot write `{at}`: {e}"),
        )
    };
    dir.put(path, &mut |file| match options.format {
        FileFormat::JsonLines => {
            let (_, batches) = utc_batches(schema, batches)?;
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_timestamp_format(TIMESTAMP_FORMAT.to_string())
                .with_timestamp_tz_format(TIMESTAMP_FORMAT.to_string())
                .build::<_, arrow::json::writer::LineDelimited>(BufWriter::new(file));
            for b in &batches {
                w.write(b).map_err(|e| write_err(e.to_string()))?;
            }
            w.finish().map_err(|e| write_err(e.to_string()))?;
            w.into_inner().flush().map_err(|e| write_err(e.to_string()))
        }
        FileFormat::Csv => {
            check_flat(schema)?;
            let (target, mut batches) = utc_batches(schema, batches)?;
            if batches.is_empty() {
                batches.push(RecordBatch::new_empty(target));
            }
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(options.header)
                .with_delimiter(options.delimiter)
                .with_timestamp_format(TIMESTAMP_FORMAT.to_string())
                .with_timestamp_tz_format(TIMESTAMP_FORMAT.to_string())
                .build(BufWriter::new(file));
            for b in &batches {
                w.write(b).map_err(|e| write_err(e.to_string()))?;
            }
            w.into_inner().flush().map_err(|e| write_err(e.to_string()))
        }
        FileFormat::Parquet => {
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .build();
            let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props))
                .map_err(|e| write_err(e.to_string()))?;
            for b in batches {
                w.write(b).map_err(|e| write_err(e.to_string()))?;
            }
            w.close().map(|_| ()).map_err(|e| write_err(e.to_string()))
        }
    })
}

#[async_trait::async_trait]
impl Sink for FileSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let rows = batch.data.num_rows() as u64;
        let in_asset = |e: Error| {
            let asset = self.asset.clone();
            e.map_diagnostics(move |d| d.at(format!("sinks[{asset}]")))
        };
        if self.mode == ExecutionMode::Batch {
            let is_dir = match &self.location {
                Location::Local(p) => p.is_dir(),
                Location::Remote(_) => !self.storage.list(LOG_DIR).map_err(in_asset)?.is_empty(),
            };
            if is_dir || self.trailing_slash {
                let next = read_log_in(self.storage.as_ref())
                    .map_err(in_asset)?
                    .keys()
                    .next_back()
                    .map_or(0, |id| id + 1);
                self.write_dir(batch.query_id, next, next, EntryKind::Overwrite, batch.data)
                    .map_err(in_asset)?;
            } else {
                // One file: written in its directory's storage.
                let (parent, name) = self.parent_and_name().map_err(in_asset)?;
                write_table(
                    parent.as_ref(),
                    &name,
                    &self.options,
                    &batch.data.schema,
                    &batch.data.batches,
                )
                .map_err(in_asset)?;
            }
            return Ok(WriteOutcome::Written { rows });
        }
        let kind = match batch.output_mode {
            OutputMode::Append => EntryKind::Append,
            OutputMode::Complete => EntryKind::Complete,
            OutputMode::Update => {
                return Err(in_asset(Error::new(
                    &codes::SINK_MODE_UNSUPPORTED,
                    "the file sink supports the append and complete output modes, not update",
                )))
            }
        };
        // The log position of a streaming batch is its batch id, unless another query's
        // entry holds it (a `dlq redrive` appending through its own query): then the batch
        // goes after the last entry. Either way a (query, batch) is written once.
        let mut position = batch.batch_id;
        let dir = self.storage.as_ref();
        if let Some(entry) = read_entry(dir, &batch.batch_id.to_string()).map_err(in_asset)? {
            if entry.query_id == batch.query_id {
                return Ok(WriteOutcome::AlreadyCommitted);
            }
            let log = read_log_in(dir).map_err(in_asset)?;
            if log
                .values()
                .any(|e| e.query_id == batch.query_id && e.batch_id == batch.batch_id)
            {
                return Ok(WriteOutcome::AlreadyCommitted);
            }
            position = log.keys().next_back().map_or(0, |p| p + 1);
        }
        self.write_dir(batch.query_id, batch.batch_id, position, kind, batch.data)
            .map_err(in_asset)?;
        Ok(WriteOutcome::Written { rows })
    }

    async fn last_committed_batch(&mut self, query_id: &str) -> Result<Option<u64>> {
        if self.mode == ExecutionMode::Batch {
            return Ok(None);
        }
        Ok(read_log_in(self.storage.as_ref())?
            .values()
            .filter(|e| e.query_id == query_id)
            .map(|e| e.batch_id)
            .max())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_names() {
        let o =
            FileSinkOptions::from_uri(&BindingUri::parse("file://out/x.csv?delimiter=;").unwrap())
                .unwrap();
        assert_eq!(o.format, FileFormat::Csv);
        assert_eq!(o.delimiter, b';');
        let e =
            FileSinkOptions::from_uri(&BindingUri::parse("file://out/dir").unwrap()).unwrap_err();
        assert_eq!(e.code(), "ETL505");
        let e = FileSinkOptions::from_uri(&BindingUri::parse("file://out/x.csv?mode=x").unwrap())
            .unwrap_err();
        assert_eq!(e.code(), "ETL007");
        assert_eq!(
            part_name(7, "4f3c-9a1b-77de-0000", FileFormat::Parquet),
            "part-00007-4f3c9a1b.parquet"
        );
        assert_eq!(
            part_name(123456, "", FileFormat::JsonLines),
            "part-123456-q.jsonl"
        );
    }

    #[test]
    fn schema_survives_hex() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new(
                "t",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]);
        let back = schema_from_hex(&schema_to_hex(&schema).unwrap()).unwrap();
        assert_eq!(back.as_ref(), &schema);
    }
}
