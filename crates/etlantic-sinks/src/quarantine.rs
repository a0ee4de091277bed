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

use etlantic_core::data::RejectedRecord;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::uri::BindingUri;
use serde_json::{json, Map, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Appends rejected records to a JSON-lines file.
#[derive(Debug)]
pub struct QuarantineWriter {
    path: PathBuf,
    file: File,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        &codes::IO_ERROR,
        format!("cannot {what} quarantine file `{}`: {e}", path.display()),
    )
}

impl QuarantineWriter {
    /// Opens `path` for appending, creating it and its parent directories, and cuts off a
    /// torn last line (see the [module docs](self)).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", &path, e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| io("open", &path, e))?;
        cut_torn_tail(&file).map_err(|e| io("repair the tail of", &path, e))?;
        Ok(QuarantineWriter { path, file })
    }

    /// Opens the quarantine output named by a profile (`file://<path>`; a relative path
    /// is resolved against `root`). Other schemes are refused (`ETL505`).
    pub fn from_uri(uri: &str, root: &Path) -> Result<Self> {
        let parsed = BindingUri::parse(uri)?;
        if parsed.scheme != "file" {
            return Err(Error::new(
                &codes::FORMAT_UNSUPPORTED,
                format!(
                    "quarantine output `{}` must be a file:// URI",
                    parsed.redacted()
                ),
            ));
        }
        let p = PathBuf::from(&parsed.location);
        Self::open(if p.is_absolute() { p } else { root.join(p) })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One record as its JSON line's value.
    pub fn to_json(record: &RejectedRecord, run_id: &str, batch_id: Option<u64>) -> Value {
        let mut m = Map::new();
        m.insert("code".into(), json!(record.code));
        m.insert("reason".into(), json!(record.reason));
        m.insert("field".into(), json!(record.field));
        m.insert(
            "position".into(),
            serde_json::to_value(&record.position).expect("positions serialise"),
        );
        m.insert("raw".into(), json!(record.raw));
        m.insert("run_id".into(), json!(run_id));
        m.insert("batch_id".into(), json!(batch_id));
        Value::Object(m)
    }

    /// Appends `records` and makes them durable; returns how many were written.
    pub fn write(
        &mut self,
        run_id: &str,
        batch_id: Option<u64>,
        records: &[RejectedRecord],
    ) -> Result<usize> {
        let lines: Vec<Value> = records
            .iter()
            .map(|r| Self::to_json(r, run_id, batch_id))
            .collect();
        self.write_lines(&lines)
    }

    /// Appends lines built with [`QuarantineWriter::to_json`] (possibly with extra members,
    /// e.g. the streaming runtime's `query_id`) and makes them durable; returns how many
    /// were written.
    pub fn write_lines(&mut self, lines: &[Value]) -> Result<usize> {
        if lines.is_empty() {
            return Ok(0);
        }
        let mut buf = String::new();
        for l in lines {
            buf.push_str(&l.to_string());
            buf.push('\n');
        }
        self.file
            .write_all(buf.as_bytes())
            .map_err(|e| io("write", &self.path, e))?;
        self.file.flush().map_err(|e| io("flush", &self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| io("sync", &self.path, e))?;
        Ok(lines.len())
    }
}

/// Truncates `file` after its last newline when its last byte is not one (a torn append),
/// and makes the truncation durable.
fn cut_torn_tail(file: &File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut reader = file;
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    // Scan backwards, a block at a time, for the last newline.
    let keep = loop {
        let start = end.saturating_sub(buf.len() as u64);
        let block = &mut buf[..(end - start) as usize];
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(block)?;
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
    file.set_len(keep)?;
    file.sync_all()
}

/// Reads a quarantine file back (one JSON value per line). A last line without its
/// newline is a torn or unfinished append and is not read; any other line that is not
/// JSON is an error (`ETL706`).
pub fn read_quarantine(path: impl AsRef<Path>) -> Result<Vec<Value>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io("read", path, e))?;
    // Bytes first: a torn tail may end inside a multi-byte character.
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(i) => &bytes[..=i],
        None => &[],
    };
    let text = std::str::from_utf8(complete).map_err(|e| {
        Error::new(
            &codes::IO_ERROR,
            format!("quarantine file `{}` is not UTF-8: {e}", path.display()),
        )
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("quarantine file `{}` has a bad line: {e}", path.display()),
                )
            })
        })
        .collect()
}
