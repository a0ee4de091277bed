//! The quarantine output: rejected records as JSON lines.
//!
//! Each [`RejectedRecord`] becomes one line
//!
//! ```json
//! {"code":"ETL702","reason":"field `amount`: expected a number (Float64), got a string \"abc\"","field":"amount","position":{"asset":"orders","file":"data/orders.jsonl","line":5},"raw":"{\"amount\":\"abc\"}","run_id":"r-1","batch_id":3}
//! ```
//!
//! appended to the file (created with its parent directories) and flushed durably
//! (`fsync`) before [`QuarantineWriter::write`] returns. `field` is `null` for a record
//! that did not parse; `batch_id` is `null` in batch runs. The streaming runtime adds its
//! `query_id`, and when it replays a micro-batch after a crash it skips the records that
//! the crashed attempt already wrote for that `(query_id, batch_id)`, so each record is
//! quarantined once.
//!
//! A crash in the middle of an append can leave a torn last line (no newline). Such a
//! line was never reported as written (a write returns only after `fsync`), so
//! [`QuarantineWriter::open`] cuts it off, as the checkpoint logs cut their torn tails,
//! and [`read_quarantine`] ignores it; the replayed batch writes the record again.
//!
//! # On an object store
//!
//! An object store cannot append. A quarantine at `s3://bucket/prefix/quarantine.jsonl`
//! is a prefix of JSON-lines objects instead, one per write (a micro-batch's rejects):
//! `s3://bucket/prefix/quarantine.jsonl/<epoch ms>-<writer>-<n>.jsonl`, each created
//! whole with a conditional put, so there is no torn tail and no object is ever
//! rewritten. [`read_quarantine_at`] reads them in name order (the order they were
//! written in). A write costs one `PUT`; a replayed micro-batch lists and reads the
//! prefix once to skip what its crashed attempt wrote.

use crate::secrets::Scrubber;
use etlantic_core::data::RejectedRecord;
use etlantic_core::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use etlantic_core::profile::OnError;
use etlantic_core::storage::{self, io_error, AppendFile, Location, Storage, StorageOptions};
use etlantic_core::uri::BindingUri;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Appends rejected records to a JSON-lines file (or, on an object store, writes an
/// object of them per write; see the [module docs](self)).
#[derive(Debug)]
pub struct QuarantineWriter {
    location: Location,
    output: Output,
}

#[derive(Debug)]
enum Output {
    /// A JSON-lines file, appended and synced.
    File(Box<dyn AppendFile>),
    /// A prefix of an object store: an object per write.
    Objects {
        storage: Arc<dyn Storage>,
        /// This writer's part of the object names (unique among writers).
        writer: String,
        /// Objects written so far.
        written: u64,
    },
}

/// The storage of the directory of `path` (see [`etlantic_core::storage::open`]) and the
/// file's name in it.
fn located(path: &Path) -> (Arc<dyn Storage>, String) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (storage::open(dir), name)
}

fn io(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("cannot {what} quarantine file `{}`: {e}", path.display()),
    )
}

impl QuarantineWriter {
    /// Opens `path` for appending, creating it and its parent directories, and cuts off a
    /// torn last line (see the [module docs](self)).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        Self::open_at(&Location::Local(path.into()), &StorageOptions::default())
    }

    /// Opens the quarantine at `location`: a local file as [`QuarantineWriter::open`]
    /// does, or a prefix of an object store (writes nothing yet).
    pub fn open_at(location: &Location, options: &StorageOptions) -> Result<Self> {
        let output = match location {
            Location::Local(path) => {
                let (dir, name) = located(path);
                let mut file = dir.append(&name)?;
                cut_torn_tail(dir.as_ref(), &name, file.as_mut())?;
                Output::File(file)
            }
            Location::Remote(_) => Output::Objects {
                storage: storage::open_location(location, options)?,
                writer: uuid::Uuid::new_v4().simple().to_string(),
                written: 0,
            },
        };
        Ok(QuarantineWriter {
            location: location.clone(),
            output,
        })
    }

    /// Opens the quarantine output named by a profile (`file://<path>`, a relative path
    /// resolved against `root`, or `s3://bucket/prefix/name.jsonl`).
    pub fn from_uri(uri: &str, root: &Path, options: &StorageOptions) -> Result<Self> {
        Self::open_at(&quarantine_location(uri, root)?, options)
    }

    /// Where it writes.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// One record's JSON line (without its newline): `code`, `reason`, `field`,
    /// `position`, `raw`, `run_id` and `batch_id` in that order, then `query_id` when
    /// one is given. Serialised straight from the record, with no JSON value between.
    pub fn line(
        record: &RejectedRecord,
        run_id: &str,
        batch_id: Option<u64>,
        query_id: Option<&str>,
    ) -> String {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            code: &'a str,
            reason: &'a str,
            field: Option<&'a str>,
            position: &'a etlantic_core::data::SourcePosition,
            raw: &'a str,
            run_id: &'a str,
            batch_id: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            query_id: Option<&'a str>,
        }
        serde_json::to_string(&Line {
            code: &record.code,
            reason: &record.reason,
            field: record.field.as_deref(),
            position: &record.position,
            raw: &record.raw,
            run_id,
            batch_id,
            query_id,
        })
        .expect("a quarantine line serialises")
    }

    /// Appends `records` and makes them durable; returns how many were written.
    pub fn write(
        &mut self,
        run_id: &str,
        batch_id: Option<u64>,
        records: &[RejectedRecord],
    ) -> Result<usize> {
        let lines: Vec<String> = records
            .iter()
            .map(|r| Self::line(r, run_id, batch_id, None))
            .collect();
        self.write_text_lines(&lines)
    }

    /// Appends lines made by [`QuarantineWriter::line`] (one JSON object each, without
    /// newline) and makes them durable; returns how many were written.
    pub fn write_text_lines(&mut self, lines: &[String]) -> Result<usize> {
        if lines.is_empty() {
            return Ok(0);
        }
        let mut buf = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            buf.push_str(l);
            buf.push('\n');
        }
        match &mut self.output {
            Output::File(file) => {
                file.write(buf.as_bytes())?;
                file.sync()?;
            }
            Output::Objects {
                storage,
                writer,
                written,
            } => {
                let now = chrono::Utc::now().timestamp_millis();
                let name = format!("{now:013}-{writer}-{:06}.jsonl", *written);
                if !storage.put_if_absent(&name, buf.as_bytes())? {
                    return Err(io_error(
                        "write",
                        &storage.display(&name),
                        "an object of that name exists (written by another writer)",
                    ));
                }
                *written += 1;
            }
        }
        Ok(lines.len())
    }
}

/// The location a profile's quarantine URI names (`file://` resolved against `root`, or
/// an object store's); `ETL505` for other schemes.
pub fn quarantine_location(uri: &str, root: &Path) -> Result<Location> {
    let parsed = BindingUri::parse(uri)?;
    if parsed.scheme != "file" && !storage::OBJECT_SCHEMES.contains(&parsed.scheme.as_str()) {
        return Err(Error::new(
            &codes::FORMAT_UNSUPPORTED,
            format!(
                "quarantine output `{}` must be a file:// URI or an object store's (s3://)",
                parsed.redacted()
            ),
        ));
    }
    Location::of_binding(&parsed, root)
}

/// Reads the quarantine at `location` back: a local file as
/// [`read_quarantine_if_any`], or every object under an object-store prefix, in name
/// order. A quarantine that was never written has no records.
pub fn read_quarantine_at(location: &Location, options: &StorageOptions) -> Result<Vec<Value>> {
    let storage = match location {
        Location::Local(path) => return read_quarantine_if_any(path),
        Location::Remote(_) => storage::open_location(location, options)?,
    };
    let mut out = Vec::new();
    for (name, _) in storage.list_files("")? {
        if !name.ends_with(".jsonl") {
            continue;
        }
        let at = storage.display(&name);
        let bytes = storage.read(&name)?.unwrap_or_default();
        out.extend(parse_lines(&bytes, &at)?);
    }
    Ok(out)
}

/// Truncates `name` after its last newline when its last byte is not one (a torn
/// append), and makes the truncation durable. Reads the tail only, a block at a time.
fn cut_torn_tail(dir: &dyn Storage, name: &str, file: &mut dyn AppendFile) -> Result<()> {
    const BLOCK: u64 = 64 * 1024;
    let len = file.len();
    if len == 0 {
        return Ok(());
    }
    let mut end = len;
    // Scan backwards, a block at a time, for the last newline.
    let keep = loop {
        let start = end.saturating_sub(BLOCK);
        let block = dir.read_range(name, start, end - start)?;
        if end == len && block.last() == Some(&b'\n') {
            return Ok(());
        }
        if let Some(i) = block.iter().rposition(|b| *b == b'\n') {
            break start + i as u64 + 1;
        }
        if start == 0 {
            break 0;
        }
        end = start;
    };
    file.truncate(keep)
}

/// Reads a quarantine file back like [`read_quarantine`]; a file that does not exist
/// has no records.
pub fn read_quarantine_if_any(path: impl AsRef<Path>) -> Result<Vec<Value>> {
    let path = path.as_ref();
    let (dir, name) = located(path);
    if dir.size(&name)?.is_none() {
        return Ok(Vec::new());
    }
    read_quarantine(path)
}

/// Reads a quarantine file back (one JSON value per line). A last line without its
/// newline is a torn or unfinished append and is not read; any other line that is not
/// JSON is an error (`ETL706`).
pub fn read_quarantine(path: impl AsRef<Path>) -> Result<Vec<Value>> {
    let path = path.as_ref();
    let (dir, name) = located(path);
    let bytes = dir
        .read(&name)?
        .ok_or_else(|| io("read", path, "it does not exist"))?;
    parse_lines(&bytes, &path.display().to_string())
}

/// The JSON values of the complete lines of `bytes` (read from `at`).
fn parse_lines(bytes: &[u8], at: &str) -> Result<Vec<Value>> {
    // Bytes first: a torn tail may end inside a multi-byte character.
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(i) => &bytes[..=i],
        None => &[],
    };
    let text = std::str::from_utf8(complete).map_err(|e| {
        Error::new(
            &codes::IO_ERROR,
            format!("quarantine file `{at}` is not UTF-8: {e}"),
        )
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("quarantine file `{at}` has a bad line: {e}"),
                )
            })
        })
        .collect()
}

/// Where a run's rejected records go: the profile's quarantine file, every record's
/// reason and position scrubbed of secrets ([`Scrubber`]), under the profile's
/// `on_error` policy. Batch runs and streaming queries write through it alike; the file
/// is opened on first use.
#[derive(Debug)]
pub struct Quarantine {
    location: Location,
    storage_options: StorageOptions,
    writer: Option<QuarantineWriter>,
    scrub: Scrubber,
    run_id: String,
    query_id: Option<String>,
    on_error: OnError,
}

/// Identifies a quarantined record within a micro-batch: its code, reason, field,
/// position and raw text (run ids differ between attempts of the micro-batch).
fn line_key(line: &Value) -> String {
    json!([
        line["code"],
        line["reason"],
        line["field"],
        line["position"],
        line["raw"]
    ])
    .to_string()
}

/// [`line_key`] of the line `record` is written as.
fn record_key(record: &RejectedRecord) -> String {
    json!([
        record.code,
        record.reason,
        record.field,
        record.position,
        record.raw
    ])
    .to_string()
}

impl Quarantine {
    /// The quarantine at `location` (a file, or an object-store prefix reached with
    /// `storage_options`) of a run (`run_id`) of a query (`query_id`, `None` in a batch
    /// run), failing instead of writing when `on_error` says so.
    pub fn new(
        location: Location,
        storage_options: StorageOptions,
        scrub: Scrubber,
        run_id: &str,
        query_id: Option<&str>,
        on_error: OnError,
    ) -> Self {
        Quarantine {
            location,
            storage_options,
            writer: None,
            scrub,
            run_id: run_id.to_string(),
            query_id: query_id.map(str::to_string),
            on_error,
        }
    }

    /// Where it writes.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// What this query already quarantined for `batch_id` (a key per record → count): a
    /// replayed micro-batch skips these, so each record is quarantined once.
    pub fn written_for(&self, batch_id: u64) -> Result<HashMap<String, usize>> {
        let mut out = HashMap::new();
        let Some(query_id) = &self.query_id else {
            return Ok(out);
        };
        for line in read_quarantine_at(&self.location, &self.storage_options)? {
            if line["query_id"].as_str() == Some(query_id.as_str())
                && line["batch_id"].as_u64() == Some(batch_id)
            {
                *out.entry(line_key(&line)).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// Writes `records` of micro-batch `batch_id` (`None` in a batch run), skipping those
    /// in `already` (see [`Quarantine::written_for`]; counted down as they are met).
    ///
    /// With `follow_on_error`, records that break their contract stop the run instead
    /// (`ETL705`, naming the first 20) when `on_error` is `fail`; records a quality
    /// rule's `quarantine` policy routed here, and late rows, are written either way.
    /// Returns how many records were written.
    pub fn write(
        &mut self,
        records: &[RejectedRecord],
        batch_id: Option<u64>,
        already: &mut HashMap<String, usize>,
        follow_on_error: bool,
    ) -> Result<u64> {
        if records.is_empty() {
            return Ok(0);
        }
        let contract_breaks = records.iter().any(|r| r.code != codes::LATE_EVENT.code);
        if follow_on_error && contract_breaks && self.on_error == OnError::Fail {
            return Err(self.scrub.error(Error(self.failure(records, batch_id))));
        }
        let mut lines = Vec::with_capacity(records.len());
        for r in records {
            let r = self.scrub.record(r.clone());
            // Only a replayed micro-batch has lines of a crashed attempt to skip.
            if !already.is_empty() {
                if let Some(n) = already.get_mut(&record_key(&r)).filter(|n| **n > 0) {
                    *n -= 1;
                    continue;
                }
            }
            lines.push(QuarantineWriter::line(
                &r,
                &self.run_id,
                batch_id,
                self.query_id.as_deref(),
            ));
        }
        if lines.is_empty() {
            return Ok(0);
        }
        if self.writer.is_none() {
            self.writer = Some(QuarantineWriter::open_at(
                &self.location,
                &self.storage_options,
            )?);
        }
        let writer = self.writer.as_mut().expect("opened above");
        writer.write_text_lines(&lines).map(|n| n as u64)
    }

    /// The `ETL705` error of records that broke their contract under `on_error: fail`.
    fn failure(&self, records: &[RejectedRecord], batch_id: Option<u64>) -> Diagnostics {
        let mut d = Diagnostics::new();
        let within = batch_id
            .map(|b| format!(" in micro-batch {b}"))
            .unwrap_or_default();
        d.push(Diagnostic::new(
            &codes::BAD_RECORDS_FAIL,
            format!(
                "{} record(s) broke their contract{within} and the policy is `fail`",
                records.len()
            ),
        ));
        for r in records.iter().take(20) {
            let mut diag = Diagnostic::new(
                codes::lookup(&r.code).unwrap_or(&codes::RECORD_UNPARSABLE),
                format!("{}: {}", r.position, r.reason),
            );
            if let Some(f) = &r.position.file {
                diag = diag.in_file(f.clone());
            }
            if let Some(l) = r.position.line {
                diag = diag.on_line(l);
            }
            d.push(diag);
        }
        d
    }
}
