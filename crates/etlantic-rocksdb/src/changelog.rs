//! A version's changelog: the writes of one micro-batch, in order — what a commit makes
//! durable on the critical path (Spark's RocksDB changelog checkpointing).
//!
//! Format of `changelog/<version>.log`:
//!
//! ```text
//! "ETLSCL01"                8 bytes, the format
//! base + 1                  u64 LE: the version it applies to (0: the empty state)
//! zstd frame of records:
//!   1 klen key vlen value   put        (lengths u32 LE)
//!   2 klen key              delete
//!   3 flen from tlen to     delete of the range from..to
//!   0 version base count crc the end: u64 LE ×3 (base as in the header), CRC-32 of the
//!                           records before it
//! ```
//!
//! The header stays uncompressed so that a restore finds the chain of changelogs back to
//! a snapshot by reading 16 bytes of each, and downloads each whole only to replay it.
//! A changelog whose end is missing, or whose version, count or checksum disagree, is
//! refused (`ETL801`), never applied in part.

use crate::{engine, io};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::storage::Storage;
use etlantic_runtime::state_store::StoreWrite;
use rocksdb::{WriteBatch, WriteOptions, DB};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"ETLSCL01";
const HEADER_LEN: u64 = 16;
const PUT: u8 = 1;
const DELETE: u8 = 2;
const DELETE_RANGE: u8 = 3;
const END: u8 = 0;

/// Where version `version`'s changelog is in the store's part of the checkpoint.
pub(crate) fn changelog_path(version: u64) -> String {
    format!("changelog/{version}.log")
}

/// The version in a changelog's name (`<version>.log`).
pub(crate) fn version_of(name: &str) -> Option<u64> {
    name.strip_suffix(".log")?.parse().ok()
}

/// The changelog of the writes since the last commit, kept in a local file until the
/// commit uploads it.
pub(crate) struct ChangelogWriter {
    path: PathBuf,
    base: Option<u64>,
    out: zstd::stream::write::Encoder<'static, BufWriter<File>>,
    crc: crc32fast::Hasher,
    records: u64,
}

impl ChangelogWriter {
    /// Starts the changelog of the writes applied to version `base` (`None`: the empty
    /// state) in `path`, replacing what it held.
    pub(crate) fn create(path: &Path, base: Option<u64>) -> Result<Self> {
        let file = File::create(path).map_err(|e| io("create", path, e))?;
        let mut file = BufWriter::with_capacity(1 << 20, file);
        file.write_all(MAGIC)
            .and_then(|()| file.write_all(&base.map_or(0, |b| b + 1).to_le_bytes()))
            .map_err(|e| io("write", path, e))?;
        // Level 1: the commit waits for this; the SSTs behind it compress again.
        let out = zstd::stream::write::Encoder::new(file, 1).map_err(|e| io("write", path, e))?;
        Ok(ChangelogWriter {
            path: path.to_path_buf(),
            base,
            out,
            crc: crc32fast::Hasher::new(),
            records: 0,
        })
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        self.crc.update(bytes);
        self.out
            .write_all(bytes)
            .map_err(|e| io("write", &self.path, e))
    }

    fn emit_field(&mut self, bytes: &[u8]) -> Result<()> {
        let len = u32::try_from(bytes.len()).map_err(|_| {
            engine(
                "write",
                format!("a key or value of {} bytes (at most 4 GiB)", bytes.len()),
            )
        })?;
        self.emit(&len.to_le_bytes())?;
        self.emit(bytes)
    }

    /// Records `write`.
    pub(crate) fn record(&mut self, write: &StoreWrite) -> Result<()> {
        match write {
            StoreWrite::Put(k, v) => {
                self.emit(&[PUT])?;
                self.emit_field(k)?;
                self.emit_field(v)?;
            }
            StoreWrite::Delete(k) => {
                self.emit(&[DELETE])?;
                self.emit_field(k)?;
            }
            StoreWrite::DeleteRange(from, to) => {
                self.emit(&[DELETE_RANGE])?;
                self.emit_field(from)?;
                self.emit_field(to)?;
            }
        }
        self.records += 1;
        Ok(())
    }

    /// Ends the changelog as version `version`'s; returns its file and size.
    pub(crate) fn finish(mut self, version: u64) -> Result<(PathBuf, u64)> {
        let crc = self.crc.clone().finalize();
        let mut end = vec![END];
        end.extend_from_slice(&version.to_le_bytes());
        end.extend_from_slice(&self.base.map_or(0, |b| b + 1).to_le_bytes());
        end.extend_from_slice(&self.records.to_le_bytes());
        end.extend_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&end)
            .map_err(|e| io("write", &self.path, e))?;
        let file = self
            .out
            .finish()
            .map_err(|e| io("write", &self.path, e))?
            .into_inner()
            .map_err(|e| io("write", &self.path, e.error()))?;
        let size = file
            .metadata()
            .map_err(|e| io("stat", &self.path, e))?
            .len();
        Ok((self.path, size))
    }
}

fn corrupt(storage: &dyn Storage, path: &str, why: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::CHECKPOINT_CORRUPT,
        format!("the state changelog {} {why}", storage.display(path)),
    )
}

/// The version changelog `version` applies to (`None`: the empty state), read from its
/// header; `None` when there is no such changelog.
pub(crate) fn base_of(storage: &dyn Storage, version: u64) -> Result<Option<Option<u64>>> {
    let path = changelog_path(version);
    let Some(size) = storage.size(&path)? else {
        return Ok(None);
    };
    if size < HEADER_LEN {
        return Err(corrupt(storage, &path, "is cut short"));
    }
    let header = storage.read_range(&path, 0, HEADER_LEN)?;
    if &header[..8] != MAGIC {
        return Err(corrupt(storage, &path, "is not a changelog"));
    }
    let base = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    Ok(Some(base.checked_sub(1)))
}

/// Reads an object by ranges, so that a changelog of any size replays in bounded memory.
struct RangedRead<'a> {
    storage: &'a dyn Storage,
    path: &'a str,
    at: u64,
    size: u64,
}

impl Read for RangedRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = (buf.len() as u64).min(self.size - self.at);
        if len == 0 {
            return Ok(0);
        }
        let bytes = self
            .storage
            .read_range(self.path, self.at, len)
            .map_err(std::io::Error::other)?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        self.at += bytes.len() as u64;
        Ok(bytes.len())
    }
}

/// Reads the records of a changelog's zstd frame, checking them as they come.
struct Records<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    records: u64,
}

impl<R: Read> Records<R> {
    fn bytes(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut out = vec![0; n];
        self.input.read_exact(&mut out)?;
        Ok(out)
    }

    fn checked(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        // Read as far as the input goes, not allocated up front: a damaged length meets
        // the end of the input instead of allocating gigabytes.
        let mut out = Vec::new();
        (&mut self.input).take(n as u64).read_to_end(&mut out)?;
        if out.len() != n {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.crc.update(&out);
        Ok(out)
    }

    fn field(&mut self) -> std::io::Result<Vec<u8>> {
        let len = u32::from_le_bytes(self.checked(4)?.try_into().expect("4 bytes"));
        self.checked(len as usize)
    }
}

/// Applies version `version`'s changelog to `db`, in write batches of a few MiB (without
/// RocksDB's write-ahead log, as every write of the store).
pub(crate) fn replay(storage: &dyn Storage, version: u64, db: &DB) -> Result<()> {
    let path = changelog_path(version);
    let size = storage
        .size(&path)?
        .ok_or_else(|| corrupt(storage, &path, "is missing"))?;
    let bad = |e: std::io::Error| corrupt(storage, &path, format_args!("cannot be read: {e}"));
    let mut raw = RangedRead {
        storage,
        path: &path,
        at: 0,
        size,
    };
    let mut header = [0u8; HEADER_LEN as usize];
    raw.read_exact(&mut header).map_err(bad)?;
    let base = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let input = std::io::BufReader::with_capacity(
        4 << 20,
        zstd::stream::read::Decoder::with_buffer(std::io::BufReader::with_capacity(4 << 20, raw))
            .map_err(bad)?,
    );
    let mut records = Records {
        input,
        crc: crc32fast::Hasher::new(),
        records: 0,
    };
    let mut opts = WriteOptions::default();
    opts.disable_wal(true);
    let mut batch = WriteBatch::default();
    loop {
        let tag = records.bytes(1).map_err(bad)?[0];
        if tag == END {
            break;
        }
        records.crc.update(&[tag]);
        match tag {
            PUT => {
                let (k, v) = (records.field().map_err(bad)?, records.field().map_err(bad)?);
                batch.put(k, v);
            }
            DELETE => batch.delete(records.field().map_err(bad)?),
            DELETE_RANGE => {
                let (from, to) = (records.field().map_err(bad)?, records.field().map_err(bad)?);
                batch.delete_range(from, to);
            }
            other => {
                return Err(corrupt(
                    storage,
                    &path,
                    format_args!("has a record of kind {other}"),
                ))
            }
        }
        records.records += 1;
        if batch.size_in_bytes() >= 4 << 20 {
            db.write_opt(std::mem::take(&mut batch), &opts)
                .map_err(|e| engine("replay", e))?;
        }
    }
    let end = records.bytes(28).map_err(bad)?;
    let said_version = u64::from_le_bytes(end[..8].try_into().expect("8 bytes"));
    let said_base = u64::from_le_bytes(end[8..16].try_into().expect("8 bytes"));
    let said_records = u64::from_le_bytes(end[16..24].try_into().expect("8 bytes"));
    let said_crc = u32::from_le_bytes(end[24..].try_into().expect("4 bytes"));
    if said_version != version
        || said_base != base
        || said_records != records.records
        || said_crc != records.crc.clone().finalize()
    {
        return Err(corrupt(
            storage,
            &path,
            format_args!(
                "does not check out (version {said_version}, {said_records} records and checksum {said_crc:08x} stated; {} records read)",
                records.records
            ),
        ));
    }
    let mut rest = [0u8; 1];
    if records.input.read(&mut rest).map_err(bad)? != 0 {
        return Err(corrupt(storage, &path, "goes on after its end"));
    }
    db.write_opt(batch, &opts).map_err(|e| engine("replay", e))
}
