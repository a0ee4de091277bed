//! Checks the framing of Arrow IPC bytes read from a checkpoint before Arrow's reader
//! decodes them.
//!
//! Arrow's IPC reader trusts the lengths it reads: a damaged file whose block, message or
//! compressed-buffer length is huge makes it allocate that much (an abort, not an error),
//! and a negative one makes it panic. Checkpoint files are read after crashes and power
//! cuts, so every length is checked against the bytes actually there first: the file's
//! footer, each block's offset and lengths, each message's metadata (with the flatbuffer
//! verifier) and body length, each buffer's range within its body and, for compressed
//! bodies, each buffer's declared uncompressed length (LZ4 frames expand at most about
//! 255 times). What passes can still be wrong, and Arrow's validation of the decoded
//! arrays reports that as an error; what fails is `ETL801`.
//!
//! Arrow's reader also panics on some metadata it cannot convert (an unknown type id, an
//! integer of another bit width, a list without its child); checking all of that here
//! would repeat the reader, so [`decode`] runs it under `catch_unwind` and turns such a
//! panic into `ETL801` as well.

use super::records::corrupt_log as corrupt;
use arrow::ipc::{root_as_footer, root_as_message, Block, MessageHeader};
use etlantic_core::diagnostics::Result;
use std::io::{Read, Seek, SeekFrom};

const MAGIC: &[u8; 6] = b"ARROW1";
const CONTINUATION: [u8; 4] = [0xff; 4];
/// The largest expansion of one LZ4 frame, with room for its headers.
const MAX_LZ4_EXPANSION: u64 = 256;
const LZ4_SLACK: u64 = 1024;

/// Checks an Arrow IPC file (`path` names it in errors) whose `len` bytes `reader` reads.
pub(crate) fn check_file<R: Read + Seek>(reader: &mut R, len: u64, path: &str) -> Result<()> {
    let bad = |what: String| corrupt(path, format!("not a whole Arrow IPC file: {what}"));
    if len < 16 {
        return Err(bad(format!("{len} bytes")));
    }
    let mut head = [0u8; 6];
    read_at(reader, 0, &mut head, path)?;
    let mut tail = [0u8; 10];
    read_at(reader, len - 10, &mut tail, path)?;
    if &head != MAGIC || &tail[4..] != MAGIC {
        return Err(bad("no ARROW1 magic".into()));
    }
    let footer_len = i32::from_le_bytes(tail[..4].try_into().expect("4 bytes"));
    if footer_len <= 0 || footer_len as u64 > len - 16 {
        return Err(bad(format!("footer length {footer_len}")));
    }
    let mut footer = vec![0u8; footer_len as usize];
    read_at(reader, len - 10 - footer_len as u64, &mut footer, path)?;
    let footer = root_as_footer(&footer).map_err(|e| bad(format!("footer: {e}")))?;
    let end_of_blocks = len - 10 - footer_len as u64;
    let blocks: Vec<Block> = footer
        .recordBatches()
        .into_iter()
        .flatten()
        .chain(footer.dictionaries().into_iter().flatten())
        .copied()
        .collect();
    for block in blocks {
        let (offset, meta_len, body_len) =
            (block.offset(), block.metaDataLength(), block.bodyLength());
        if offset < 8 || meta_len < 8 || body_len < 0 {
            return Err(bad(format!(
                "block at {offset} of {meta_len} + {body_len} bytes"
            )));
        }
        let (offset, meta_len, body_len) = (offset as u64, meta_len as u64, body_len as u64);
        if offset
            .checked_add(meta_len)
            .and_then(|m| m.checked_add(body_len))
            .is_none_or(|end| end > end_of_blocks)
        {
            return Err(bad(format!(
                "block at {offset} of {meta_len} + {body_len} bytes past the data"
            )));
        }
        let mut meta = vec![0u8; meta_len as usize];
        read_at(reader, offset, &mut meta, path)?;
        let message = match meta[..4] == CONTINUATION {
            true => &meta[8..],
            false => &meta[4..],
        };
        check_message(reader, message, offset + meta_len, body_len, path)?;
    }
    Ok(())
}

/// Checks Arrow IPC stream bytes (the state log's payloads; `path` names their file).
pub(crate) fn check_stream(bytes: &[u8], path: &str) -> Result<()> {
    let bad = |what: String| corrupt(path, format!("not a whole Arrow IPC stream: {what}"));
    let mut cursor = std::io::Cursor::new(bytes);
    let mut at = 0usize;
    loop {
        let Some(prefix) = bytes.get(at..at + 4) else {
            return Err(bad(format!("it ends at {at} without an end marker")));
        };
        let (meta_len, start) = if prefix == CONTINUATION {
            let Some(len) = bytes.get(at + 4..at + 8) else {
                return Err(bad(format!("a message length cut at {at}")));
            };
            (i32::from_le_bytes(len.try_into().expect("4 bytes")), at + 8)
        } else {
            (
                i32::from_le_bytes(prefix.try_into().expect("4 bytes")),
                at + 4,
            )
        };
        if meta_len == 0 {
            return Ok(());
        }
        if meta_len < 0 || start + meta_len as usize > bytes.len() {
            return Err(bad(format!("a message of {meta_len} bytes at {at}")));
        }
        let message = &bytes[start..start + meta_len as usize];
        let body_start = (start + meta_len as usize) as u64;
        let body_len = root_as_message(message)
            .map_err(|e| bad(format!("message at {at}: {e}")))?
            .bodyLength();
        if body_len < 0 || body_start + body_len as u64 > bytes.len() as u64 {
            return Err(bad(format!("a body of {body_len} bytes at {body_start}")));
        }
        check_message(&mut cursor, message, body_start, body_len as u64, path)?;
        at = (body_start + body_len as u64) as usize;
    }
}

/// Checks one message's metadata and the buffers of its body (`body_len` bytes at
/// `body_start` of `reader`).
fn check_message<R: Read + Seek>(
    reader: &mut R,
    message: &[u8],
    body_start: u64,
    body_len: u64,
    path: &str,
) -> Result<()> {
    let bad = |what: String| corrupt(path, format!("an Arrow IPC message is damaged: {what}"));
    let message = root_as_message(message).map_err(|e| bad(e.to_string()))?;
    if message.bodyLength() < 0 || message.bodyLength() as u64 > body_len {
        return Err(bad(format!("body length {}", message.bodyLength())));
    }
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        _ => None,
    };
    let Some(batch) = batch else {
        return Ok(());
    };
    if batch.length() < 0 {
        return Err(bad(format!("{} rows", batch.length())));
    }
    for node in batch.nodes().into_iter().flatten() {
        if node.length() < 0 || node.null_count() < 0 || node.null_count() > node.length() {
            return Err(bad(format!(
                "a column of {} rows with {} nulls",
                node.length(),
                node.null_count()
            )));
        }
    }
    let compressed = batch.compression().is_some();
    for buffer in batch.buffers().into_iter().flatten() {
        let (offset, length) = (buffer.offset(), buffer.length());
        if offset < 0
            || length < 0
            || (offset as u64)
                .checked_add(length as u64)
                .is_none_or(|end| end > body_len)
        {
            return Err(bad(format!("a buffer at {offset} of {length} bytes")));
        }
        if !compressed || length == 0 {
            continue;
        }
        if length < 8 {
            return Err(bad(format!("a compressed buffer of {length} bytes")));
        }
        let mut size = [0u8; 8];
        read_at(reader, body_start + offset as u64, &mut size, path)?;
        let size = i64::from_le_bytes(size);
        let bound = (length as u64 - 8) * MAX_LZ4_EXPANSION + LZ4_SLACK;
        if size != -1 && (size < 0 || size as u64 > bound) {
            return Err(bad(format!(
                "a buffer of {length} compressed bytes declares {size} bytes"
            )));
        }
    }
    Ok(())
}

/// Runs `read` — Arrow's IPC reader on checked bytes — and turns a panic of the reader
/// into `ETL801` for `path` (see the module docs).
pub(crate) fn decode<T>(path: &str, read: impl FnOnce() -> Result<T>) -> Result<T> {
    etlantic_core::untrusted::decode(read, |why| {
        corrupt(path, format!("Arrow's IPC reader failed: {why}"))
    })
}

fn read_at<R: Read + Seek>(reader: &mut R, at: u64, buf: &mut [u8], path: &str) -> Result<()> {
    reader
        .seek(SeekFrom::Start(at))
        .and_then(|_| reader.read_exact(buf))
        .map_err(|e| {
            corrupt(
                path,
                format!("cannot read {} bytes at {at}: {e}", buf.len()),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
    use arrow::ipc::CompressionType;
    use std::sync::Arc;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("a"); 500])),
                Arc::new(Int64Array::from((0..500).collect::<Vec<i64>>())),
            ],
        )
        .unwrap()
    }

    fn options() -> IpcWriteOptions {
        IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::LZ4_FRAME))
            .unwrap()
    }

    /// What the writer wrote passes; every truncation and a few thousand byte changes are
    /// refused or pass — never a panic or an abort — and what passes Arrow reads without
    /// panicking.
    #[test]
    fn written_files_and_streams_pass_and_damage_never_aborts() {
        let b = batch();
        let mut file = Vec::new();
        {
            let mut w =
                FileWriter::try_new_with_options(&mut file, &b.schema(), options()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
        }
        let mut stream = Vec::new();
        {
            let mut w =
                StreamWriter::try_new_with_options(&mut stream, &b.schema(), options()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
        }
        let path = "x.arrow";
        check_file(&mut std::io::Cursor::new(&file), file.len() as u64, path).unwrap();
        check_stream(&stream, path).unwrap();
        let read_file = |bytes: &[u8]| {
            if check_file(&mut std::io::Cursor::new(bytes), bytes.len() as u64, path).is_ok() {
                let _ = decode(path, || {
                    if let Ok(r) =
                        arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
                    {
                        r.for_each(drop);
                    }
                    Ok(())
                });
            }
        };
        let read_stream = |bytes: &[u8]| {
            if check_stream(bytes, path).is_ok() {
                let _ = decode(path, || {
                    if let Ok(r) =
                        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
                    {
                        r.for_each(drop);
                    }
                    Ok(())
                });
            }
        };
        for cut in 0..file.len() {
            read_file(&file[..cut]);
        }
        for cut in 0..stream.len() {
            read_stream(&stream[..cut]);
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let (mut f, mut s) = (file.clone(), stream.clone());
            let (i, j, v) = (
                state as usize % f.len(),
                (state >> 20) as usize % s.len(),
                (state >> 40) as u8,
            );
            f[i] = v;
            s[j] = v;
            read_file(&f);
            read_stream(&s);
        }
        // The lengths Arrow would allocate blindly are refused.
        let mut huge = file.clone();
        let footer_len =
            i32::from_le_bytes(huge[huge.len() - 10..huge.len() - 6].try_into().unwrap());
        let at = huge.len() - 10;
        huge[at..at + 4].copy_from_slice(&(footer_len + 1_000_000).to_le_bytes());
        assert_eq!(
            check_file(&mut std::io::Cursor::new(&huge), huge.len() as u64, path)
                .unwrap_err()
                .code(),
            "ETL801"
        );
    }
}
