//! Readers of one file: JSON lines, CSV and Parquet, all contract-aware.

use super::input::FileRef;
use crate::decode::{row_as_json, BatchBuilder, ContractDecoder, RecordProblem};
use arrow::array::RecordBatch;
use etlantic_core::data::SourcePosition;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::SourceBatch;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;

/// A file format the `file://` source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// One JSON object per line (`.jsonl`, `.ndjson`, `.json`).
    #[serde(rename = "jsonl")]
    JsonLines,
    /// Comma-separated values (`.csv`).
    Csv,
    /// Apache Parquet (`.parquet`).
    Parquet,
}

impl FileFormat {
    /// The format named by a `?format=` value (`jsonl`, `json`, `ndjson`, `csv`,
    /// `parquet`; case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "jsonl" | "json" | "ndjson" | "jsonlines" => Some(FileFormat::JsonLines),
            "csv" => Some(FileFormat::Csv),
            "parquet" => Some(FileFormat::Parquet),
            _ => None,
        }
    }

    /// The format implied by a file name's extension.
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" | "json" => Some(FileFormat::JsonLines),
            "csv" => Some(FileFormat::Csv),
            "parquet" => Some(FileFormat::Parquet),
            _ => None,
        }
    }

    /// The canonical name (`jsonl`, `csv`, `parquet`).
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::JsonLines => "jsonl",
            FileFormat::Csv => "csv",
            FileFormat::Parquet => "parquet",
        }
    }
}

/// CSV reading options (`?header=`, `?delimiter=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsvOptions {
    /// The first line names the columns (default `true`). Columns are then matched to
    /// the contract by name; without a header they are matched by position.
    pub header: bool,
    /// The field delimiter (default `,`).
    pub delimiter: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            header: true,
            delimiter: b',',
        }
    }
}

/// Everything needed to read files of one source.
pub(crate) struct ReadCtx<'a> {
    pub asset: &'a str,
    pub root: &'a Path,
    pub decoder: &'a ContractDecoder,
    pub csv: CsvOptions,
    pub batch_size: usize,
    /// The columns the pipeline reads (`None`: all; see `Source::read_only`).
    pub columns_read: Option<&'a HashSet<String>>,
}

impl ReadCtx<'_> {
    fn position(&self, rel: &str) -> SourcePosition {
        SourcePosition {
            asset: self.asset.to_string(),
            file: Some(rel.to_string()),
            ..SourcePosition::default()
        }
    }
}

/// Reads one file into `out`: good rows into batches, bad records into rejects. Errors
/// that concern the whole file (unreadable, not Parquet, a missing required column or a
/// lossy cast) are returned as `Err`, naming the file.
pub(crate) fn read_file(
    ctx: &ReadCtx<'_>,
    file: &FileRef,
    format: FileFormat,
    out: &mut SourceBatch,
) -> Result<()> {
    let rel = file.shown(ctx.root);
    let result = match format {
        FileFormat::JsonLines => read_jsonl(ctx, file, &rel, out),
        FileFormat::Csv => read_csv(ctx, file, &rel, out),
        FileFormat::Parquet => read_parquet(ctx, file, &rel, out),
    };
    result.map_err(|e| {
        e.map_diagnostics(|d| {
            let d = if d.file.is_none() { d.in_file(&rel) } else { d };
            if d.message.contains(&rel) {
                d
            } else {
                let msg = format!("{}: {}", rel, d.message);
                etlantic_core::Diagnostic { message: msg, ..d }
            }
        })
    })
}

/// The lines of a text file's good rows, gathered into origin runs of consecutive lines
/// (a rejected or blank line ends a run).
#[derive(Default)]
struct LineRuns {
    first: u64,
    count: u64,
}

impl LineRuns {
    fn good(&mut self, line: u64, ctx: &ReadCtx<'_>, rel: &str, out: &mut SourceBatch) {
        if self.count > 0 && self.first + self.count == line {
            self.count += 1;
        } else {
            self.close(ctx, rel, out);
            self.first = line;
            self.count = 1;
        }
    }

    fn close(&mut self, ctx: &ReadCtx<'_>, rel: &str, out: &mut SourceBatch) {
        if self.count > 0 {
            let mut first = ctx.position(rel);
            first.line = Some(self.first);
            out.origins.push_run(first, self.count);
            self.count = 0;
        }
    }
}

fn flush(builder: &mut BatchBuilder, out: &mut SourceBatch) -> Result<()> {
    if let Some(b) = builder.finish()? {
        out.batches.push(b);
    }
    Ok(())
}

fn read_jsonl(ctx: &ReadCtx<'_>, file: &FileRef, rel: &str, out: &mut SourceBatch) -> Result<()> {
    let mut builder = ctx.decoder.builder();
    let mut runs = LineRuns::default();
    super::lines::for_each_line(file, |lineno, line| {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        // The fast path takes the usual records (checking UTF-8 itself); the others are
        // parsed whole, and the per-record rules say why they are rejected (or take them).
        if builder.push_json_bytes(line) {
            runs.good(lineno, ctx, rel, out);
            if builder.len() >= ctx.batch_size {
                flush(&mut builder, out)?;
            }
            return Ok(());
        }
        let reject = |p: RecordProblem, out: &mut SourceBatch| {
            let mut pos = ctx.position(rel);
            pos.line = Some(lineno);
            out.rejected
                .push(p.into_rejected(pos, String::from_utf8_lossy(line).into_owned()));
        };
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(e) => {
                reject(
                    RecordProblem::unparsable(format!("line {lineno} is not valid UTF-8: {e}")),
                    out,
                );
                return Ok(());
            }
        };
        let pushed = {
            let value: Value = match serde_json::from_str(text) {
                Ok(v) => v,
                Err(e) => {
                    reject(
                        RecordProblem::unparsable(format!("line {lineno} is not valid JSON: {e}")),
                        out,
                    );
                    return Ok(());
                }
            };
            match builder.push_json(&value) {
                Ok(()) => true,
                Err(p) => {
                    reject(p, out);
                    false
                }
            }
        };
        if pushed {
            runs.good(lineno, ctx, rel, out);
            if builder.len() >= ctx.batch_size {
                flush(&mut builder, out)?;
            }
        }
        Ok(())
    })?;
    runs.close(ctx, rel, out);
    flush(&mut builder, out)
}

fn read_csv(ctx: &ReadCtx<'_>, file: &FileRef, rel: &str, out: &mut SourceBatch) -> Result<()> {
    super::lines::with_blocks(file, |blocks| {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .delimiter(ctx.csv.delimiter)
            .from_reader(super::lines::MarkedRead::new(blocks));
        let result = read_csv_records(ctx, rel, &mut reader, out);
        // An error reading the file is reported as itself, not as the parser saw it.
        match reader.get_mut().take_error() {
            Some(e) => Err(e),
            None => result,
        }
    })
}

/// The text of the record that starts at position `start` and that `reader` has just
/// read, as it is in the file, without its line end: only needed for a rejected record.
fn record_text(reader: &csv::Reader<super::lines::MarkedRead<'_>>, start: u64) -> String {
    let raw_bytes = reader.get_ref().text(start, reader.position().byte());
    let raw_bytes = raw_bytes.strip_suffix(b"\n").unwrap_or(raw_bytes);
    let raw_bytes = raw_bytes.strip_suffix(b"\r").unwrap_or(raw_bytes);
    String::from_utf8_lossy(raw_bytes).into_owned()
}

/// Reads the records of a CSV file (see [`read_csv`]).
fn read_csv_records(
    ctx: &ReadCtx<'_>,
    rel: &str,
    reader: &mut csv::Reader<super::lines::MarkedRead<'_>>,
    out: &mut SourceBatch,
) -> Result<()> {
    let schema = ctx.decoder.schema();
    let csv_error = |e: csv::Error| {
        Error::new(
            &codes::RECORD_UNPARSABLE,
            format!("cannot read the CSV file: {e}"),
        )
    };
    let mut record = csv::ByteRecord::new();
    // Which CSV column feeds each schema field.
    let (mapping, expected): (Vec<Option<usize>>, usize) = if ctx.csv.header {
        if !reader.read_byte_record(&mut record).map_err(csv_error)? {
            return Ok(());
        }
        let names: Vec<String> = record
            .iter()
            .map(|n| String::from_utf8_lossy(n).trim().to_string())
            .collect();
        let mut mapping = Vec::with_capacity(schema.fields().len());
        for f in schema.fields() {
            let idx = names
                .iter()
                .position(|n| n == f.name())
                .or_else(|| names.iter().position(|n| n.eq_ignore_ascii_case(f.name())));
            if idx.is_none() && !f.is_nullable() {
                return Err(Error::new(
                    &codes::RECORD_TYPE_MISMATCH,
                    format!(
                        "the CSV header has no column `{}`, which the contract requires (header: {})",
                        f.name(),
                        names.join(",")
                    ),
                )
                .map_diagnostics(|d| d.on_line(1)));
            }
            mapping.push(idx);
        }
        (mapping, names.len())
    } else {
        let n = schema.fields().len();
        ((0..n).map(Some).collect(), n)
    };
    let mut builder = ctx.decoder.builder();
    let mut runs = LineRuns::default();
    loop {
        // The text of records before this one is not needed any more.
        let next = reader.position().byte();
        reader.get_mut().mark(next);
        if !reader.read_byte_record(&mut record).map_err(csv_error)? {
            break;
        }
        let (line, start) = record
            .position()
            .map(|p| (p.line(), p.byte()))
            .unwrap_or((0, 0));
        let mut pos = ctx.position(rel);
        pos.line = Some(line);
        if record.len() != expected {
            out.rejected.push(
                RecordProblem::unparsable(format!(
                    "line {line} has {} columns, expected {expected}",
                    record.len()
                ))
                .into_rejected(pos, record_text(reader, start)),
            );
            continue;
        }
        let fields = match csv::StringRecord::from_byte_record(std::mem::take(&mut record)) {
            Ok(fields) => fields,
            Err(e) => {
                record = e.into_byte_record();
                let why = record
                    .iter()
                    .find_map(|f| std::str::from_utf8(f).err())
                    .map_or_else(|| "invalid UTF-8".to_string(), |e| e.to_string());
                out.rejected.push(
                    RecordProblem::unparsable(format!("line {line} is not valid UTF-8: {why}"))
                        .into_rejected(pos, record_text(reader, start)),
                );
                continue;
            }
        };
        let values: Vec<Option<&str>> = mapping
            .iter()
            .map(|m| m.and_then(|i| fields.get(i)))
            .collect();
        match builder.push_text(&values) {
            Ok(()) => {
                runs.good(line, ctx, rel, out);
                if builder.len() >= ctx.batch_size {
                    flush(&mut builder, out)?;
                }
            }
            Err(p) => out
                .rejected
                .push(p.into_rejected(pos, record_text(reader, start))),
        }
        drop(values);
        record = fields.into_byte_record();
    }
    runs.close(ctx, rel, out);
    flush(&mut builder, out)
}

/// Files with at least this many rows have their columns decoded on two threads.
const PARALLEL_DECODE_ROWS: i64 = 64 * 1024;

fn not_parquet(e: parquet::errors::ParquetError) -> Error {
    Error::new(
        &codes::RECORD_UNPARSABLE,
        format!("cannot read the Parquet file: {e}"),
    )
}

fn undecodable(e: arrow::error::ArrowError) -> Error {
    Error::new(
        &codes::RECORD_UNPARSABLE,
        format!("cannot decode the Parquet file: {e}"),
    )
}

/// Decodes the leaf columns `columns` (file schema indices) of a Parquet file whose
/// footer was read into `metadata`.
fn decode_parquet_columns(
    file: &FileRef,
    metadata: &ArrowReaderMetadata,
    columns: &[usize],
    batch_size: usize,
) -> Result<Vec<RecordBatch>> {
    let file = file.parquet()?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone());
    let mask = ProjectionMask::roots(builder.parquet_schema(), columns.iter().copied());
    builder
        .with_projection(mask)
        .with_batch_size(batch_size)
        .build()
        .map_err(not_parquet)?
        .map(|b| b.map_err(undecodable))
        .collect()
}

/// Decodes the contract's columns of a Parquet file. A large file's columns are split
/// into two sets of about equal size, decoded on two threads and put back side by side
/// (both readers cut the same batches, as they read the same row groups with the same
/// batch size).
///
/// The parquet crate panics on some malformed footers (an Arrow schema in the key-value
/// metadata with an unknown type id, for one): the file is read as untrusted input.
fn decode_parquet(ctx: &ReadCtx<'_>, file: &FileRef) -> Result<Vec<RecordBatch>> {
    etlantic_core::untrusted::decode(
        || decode_parquet_unguarded(ctx, file),
        |why| {
            Error::new(
                &codes::RECORD_UNPARSABLE,
                format!("cannot read the Parquet file: {why}"),
            )
        },
    )
}

fn decode_parquet_unguarded(ctx: &ReadCtx<'_>, file: &FileRef) -> Result<Vec<RecordBatch>> {
    // The footer is read once; every reader of the file reuses it.
    let reader_metadata =
        ArrowReaderMetadata::load(&file.parquet()?, Default::default()).map_err(not_parquet)?;
    // Read only the contract's columns.
    let file_schema = reader_metadata.schema().clone();
    // Columns the pipeline does not read are left undecoded (and become nulls) when no
    // record-level rule needs their values.
    let wanted: Vec<usize> = ctx
        .decoder
        .schema()
        .fields()
        .iter()
        .filter_map(|f| file_schema.index_of(f.name()).ok())
        .filter(|&i| {
            let f = file_schema.field(i);
            ctx.columns_read.is_none_or(|read| {
                read.contains(f.name()) || !ctx.decoder.may_skip(f.name(), f.data_type())
            })
        })
        .collect();
    let metadata = reader_metadata.metadata().clone();
    // Column sizes are per leaf column: only flat schemas (one leaf per field) split.
    let parallel = wanted.len() >= 2
        && metadata.file_metadata().schema_descr().num_columns() == file_schema.fields().len()
        && metadata.file_metadata().num_rows() >= PARALLEL_DECODE_ROWS
        && std::thread::available_parallelism().is_ok_and(|p| p.get() >= 2);
    if !parallel {
        return decode_parquet_columns(file, &reader_metadata, &wanted, ctx.batch_size);
    }
    // Split by uncompressed size, largest first onto the lighter set.
    let size = |c: usize| -> i64 {
        metadata
            .row_groups()
            .iter()
            .map(|rg| rg.column(c).uncompressed_size())
            .sum()
    };
    let mut by_size = wanted.clone();
    by_size.sort_by_key(|&c| std::cmp::Reverse(size(c)));
    let (mut sets, mut totals) = ([Vec::new(), Vec::new()], [0i64, 0i64]);
    for c in by_size {
        let lighter = usize::from(totals[1] < totals[0]);
        totals[lighter] += size(c);
        sets[lighter].push(c);
    }
    for set in sets.iter_mut() {
        set.sort_unstable();
    }
    let batch_size = ctx.batch_size;
    let (first, second) = std::thread::scope(|scope| {
        let other =
            scope.spawn(|| decode_parquet_columns(file, &reader_metadata, &sets[1], batch_size));
        let first = decode_parquet_columns(file, &reader_metadata, &sets[0], batch_size);
        let second = other.join().unwrap_or_else(|_| {
            Err(Error::new(
                &codes::RECORD_UNPARSABLE,
                "a Parquet decoding thread panicked",
            ))
        });
        (first, second)
    });
    let (first, second) = (first?, second?);
    if first.len() != second.len() {
        return Err(Error::new(
            &codes::RECORD_UNPARSABLE,
            "the column sets of the Parquet file were cut into different batches",
        ));
    }
    first
        .into_iter()
        .zip(second)
        .map(|(a, b)| {
            let mut fields = Vec::with_capacity(wanted.len());
            let mut columns = Vec::with_capacity(wanted.len());
            for &c in &wanted {
                let name = file_schema.field(c).name();
                let (batch, i) = match a.schema().index_of(name) {
                    Ok(i) => (&a, i),
                    Err(_) => (&b, b.schema().index_of(name).map_err(undecodable)?),
                };
                fields.push(batch.schema().field(i).clone());
                columns.push(batch.column(i).clone());
            }
            RecordBatch::try_new(
                std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
                columns,
            )
            .map_err(undecodable)
        })
        .collect()
}

fn read_parquet(ctx: &ReadCtx<'_>, file: &FileRef, rel: &str, out: &mut SourceBatch) -> Result<()> {
    let mut row_base = 0u64;
    for batch in decode_parquet(ctx, file)? {
        let conformed = ctx.decoder.conform_batch(&batch)?;
        // The good rows are the rows between the rejected ones, in order.
        let mut next = 0u64;
        let mut rejected: Vec<usize> = conformed.rejected.iter().map(|(i, _)| *i).collect();
        rejected.sort_unstable();
        rejected.dedup();
        for i in rejected
            .iter()
            .map(|&i| i as u64)
            .chain([batch.num_rows() as u64])
        {
            if i > next {
                let mut first = ctx.position(rel);
                first.row = Some(row_base + next);
                out.origins.push_run(first, i - next);
            }
            next = i + 1;
        }
        for (i, problem) in conformed.rejected {
            let mut pos = ctx.position(rel);
            pos.row = Some(row_base + i as u64);
            out.rejected
                .push(problem.into_rejected(pos, row_as_json(&batch, i)));
        }
        if conformed.batch.num_rows() > 0 {
            out.batches.push(conformed.batch);
        }
        row_base += batch.num_rows() as u64;
    }
    Ok(())
}
