//! A text file read in large blocks on a thread of its own while the caller decodes the
//! previous block: as lines (JSON lines) or as a byte stream that keeps the text of the
//! record being parsed (CSV, whose records can span lines).

use super::input::FileRef;
use etlantic_core::diagnostics::Result;
use etlantic_core::storage::io_error;
use std::io::Read;

/// The size of one block read ahead.
const BLOCK: usize = 4 << 20;

/// The blocks of a file, in order (see [`with_blocks`]).
pub(crate) struct Blocks {
    source: BlockSource,
}

enum BlockSource {
    /// A file of at most one block, read whole.
    One(Option<Vec<u8>>),
    /// Blocks sent by the reader thread.
    Ahead(std::sync::mpsc::Receiver<Result<Vec<u8>>>),
}

impl Blocks {
    /// The next block, or `None` at the end of the file.
    pub(crate) fn next_block(&mut self) -> Result<Option<Vec<u8>>> {
        match &mut self.source {
            BlockSource::One(block) => Ok(block.take()),
            BlockSource::Ahead(rx) => match rx.recv() {
                Ok(block) => block.map(Some),
                Err(_) => Ok(None),
            },
        }
    }
}

/// Where the reader thread takes blocks from.
enum Reader {
    File(std::fs::File),
    /// An object read by ranges; `next` is the offset of the next block.
    Object {
        storage: std::sync::Arc<dyn etlantic_core::storage::Storage>,
        name: String,
        size: u64,
        next: u64,
    },
}

impl Reader {
    /// The next block (empty at the end).
    fn block(&mut self, at: &str) -> Result<Vec<u8>> {
        match self {
            Reader::File(file) => {
                let mut block = Vec::with_capacity(BLOCK);
                file.take(BLOCK as u64)
                    .read_to_end(&mut block)
                    .map_err(|e| io_error("read", at, e))?;
                Ok(block)
            }
            Reader::Object {
                storage,
                name,
                size,
                next,
            } => {
                let len = (*size - *next).min(BLOCK as u64);
                let block = storage.read_range(name, *next, len)?;
                *next += len;
                Ok(block)
            }
        }
    }
}

/// Calls `f` with the blocks of `file`. Files larger than one block are read by a
/// second thread, at most two blocks ahead, so memory stays bounded and reading overlaps
/// decoding (an object is read one ranged request per block).
pub(crate) fn with_blocks<T>(
    file: &FileRef,
    f: impl FnOnce(&mut Blocks) -> Result<T>,
) -> Result<T> {
    let at = file.display();
    let (size, mut reader) = match file {
        FileRef::Local(path) => {
            let file = std::fs::File::open(path).map_err(|e| io_error("open", &at, e))?;
            (
                file.metadata().map(|m| m.len()).unwrap_or(0),
                Reader::File(file),
            )
        }
        FileRef::Object {
            storage,
            name,
            size,
        } => {
            let size = FileRef::object_size(storage.as_ref(), name, *size)?;
            let reader = Reader::Object {
                storage: storage.clone(),
                name: name.clone(),
                size,
                next: 0,
            };
            (size, reader)
        }
    };
    if size <= BLOCK as u64 {
        // One read of a file that may have grown meanwhile: a file reads to its end, an
        // object the size it had (the caller notices the change).
        let bytes = match &mut reader {
            Reader::File(file) => {
                let mut bytes = Vec::with_capacity(size as usize);
                file.read_to_end(&mut bytes)
                    .map_err(|e| io_error("read", &at, e))?;
                bytes
            }
            object => object.block(&at)?,
        };
        let mut blocks = Blocks {
            source: BlockSource::One(Some(bytes)),
        };
        return f(&mut blocks);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(2);
        let at = &at;
        scope.spawn(move || loop {
            match reader.block(at) {
                Ok(block) if block.is_empty() => return,
                Ok(block) => {
                    if tx.send(Ok(block)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        });
        // Dropping the receiver on an early return stops the reader at its next send.
        let mut blocks = Blocks {
            source: BlockSource::Ahead(rx),
        };
        f(&mut blocks)
    })
}

/// Calls `line(number, bytes)` for every line of the file at `path`, in order, numbered
/// from 1, without its `\n` (nor a `\r` before it), the UTF-8 byte order mark of the
/// first line removed. A last line without a newline is a line.
pub(crate) fn for_each_line(
    file: &FileRef,
    mut line: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    with_blocks(file, |blocks| {
        let mut lines = Splitter::default();
        while let Some(block) = blocks.next_block()? {
            lines.block(&block, &mut line)?;
        }
        lines.finish(&mut line)
    })
}

/// The bytes of a file (without a UTF-8 byte order mark) as a [`Read`], block by block,
/// keeping every byte from a mark on: a parser reading through it can still get the text
/// of the record it is parsing, however many blocks that record spans.
pub(crate) struct MarkedRead<'b> {
    blocks: &'b mut Blocks,
    /// The bytes from the mark on (what was read, and what is still to be read).
    kept: Vec<u8>,
    /// The position in the file (after the byte order mark) of `kept[0]`.
    base: u64,
    /// How many bytes of `kept` were handed out.
    handed: usize,
    first: bool,
    /// The error reading the file met, kept whole (the parser sees only its text).
    failed: Option<etlantic_core::diagnostics::Error>,
}

impl<'b> MarkedRead<'b> {
    pub(crate) fn new(blocks: &'b mut Blocks) -> Self {
        MarkedRead {
            blocks,
            kept: Vec::new(),
            base: 0,
            handed: 0,
            first: true,
            failed: None,
        }
    }

    /// The error reading the file met, if it met one.
    pub(crate) fn take_error(&mut self) -> Option<etlantic_core::diagnostics::Error> {
        self.failed.take()
    }

    /// Forgets the bytes before position `at` (they are not asked for again).
    pub(crate) fn mark(&mut self, at: u64) {
        let cut = (at.saturating_sub(self.base) as usize).min(self.handed);
        // Compacting only once the forgotten part is large keeps the copying linear.
        if cut >= BLOCK / 2 || cut == self.kept.len() {
            self.kept.drain(..cut);
            self.base += cut as u64;
            self.handed -= cut;
        }
    }

    /// The bytes between positions `start` and `end`, which must be after the mark and
    /// handed out already (clamped to what is kept).
    pub(crate) fn text(&self, start: u64, end: u64) -> &[u8] {
        let end = (end.saturating_sub(self.base) as usize).min(self.handed);
        let start = (start.saturating_sub(self.base) as usize).min(end);
        &self.kept[start..end]
    }
}

impl Read for MarkedRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.handed == self.kept.len() {
            let block = match self.blocks.next_block() {
                Ok(block) => block,
                Err(e) => {
                    let text = e.to_string();
                    self.failed = Some(e);
                    return Err(std::io::Error::other(text));
                }
            };
            let Some(block) = block else {
                return Ok(0);
            };
            let mut bytes = &block[..];
            if std::mem::take(&mut self.first) {
                bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
            }
            if self.kept.is_empty() && self.handed == 0 {
                self.kept = if bytes.len() == block.len() {
                    block
                } else {
                    bytes.to_vec()
                };
            } else {
                self.kept.extend_from_slice(bytes);
            }
        }
        let n = buf.len().min(self.kept.len() - self.handed);
        buf[..n].copy_from_slice(&self.kept[self.handed..self.handed + n]);
        self.handed += n;
        Ok(n)
    }
}

/// Cuts blocks into lines, carrying a line cut by the end of a block over to the next.
#[derive(Default)]
struct Splitter {
    carry: Vec<u8>,
    number: u64,
}

impl Splitter {
    fn emit(
        &mut self,
        bytes: &[u8],
        line: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.number += 1;
        let mut bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if self.number == 1 {
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        }
        line(self.number, bytes)
    }

    fn block(
        &mut self,
        block: &[u8],
        line: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut rest = block;
        if !self.carry.is_empty() {
            match memchr::memchr(b'\n', rest) {
                Some(end) => {
                    let mut carried = std::mem::take(&mut self.carry);
                    carried.extend_from_slice(&rest[..end]);
                    self.emit(&carried, line)?;
                    rest = &rest[end + 1..];
                }
                None => {
                    self.carry.extend_from_slice(rest);
                    return Ok(());
                }
            }
        }
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', rest) {
            self.emit(&rest[start..end], line)?;
            start = end + 1;
        }
        self.carry.extend_from_slice(&rest[start..]);
        Ok(())
    }

    fn finish(mut self, line: &mut impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        if !self.carry.is_empty() {
            let carried = std::mem::take(&mut self.carry);
            self.emit(&carried, line)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(blocks: &[&[u8]]) -> Vec<(u64, String)> {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        let mut f = |n: u64, b: &[u8]| {
            out.push((n, String::from_utf8_lossy(b).into_owned()));
            Ok(())
        };
        for b in blocks {
            s.block(b, &mut f).expect("split");
        }
        s.finish(&mut f).expect("finish");
        out
    }

    #[test]
    fn lines_cut_by_blocks_are_joined() {
        let whole = split(&[b"\xEF\xBB\xBFa\r\nbc\n\nlast"]);
        let cut = split(&[b"\xEF\xBB\xBFa\r", b"\nb", b"c\n", b"\nla", b"st"]);
        let expected: Vec<(u64, String)> = vec![
            (1, "a".into()),
            (2, "bc".into()),
            (3, String::new()),
            (4, "last".into()),
        ];
        assert_eq!(whole, expected);
        assert_eq!(cut, expected);
        assert_eq!(split(&[b"x\n"]), vec![(1, "x".into())]);
        assert_eq!(split(&[b"", b"x", b"", b"y"]), vec![(1, "xy".into())]);
    }

    /// Blocks as the reader thread would send them.
    fn blocks_of(parts: &[&[u8]]) -> Blocks {
        let (tx, rx) = std::sync::mpsc::sync_channel(parts.len());
        for p in parts {
            tx.send(Ok(p.to_vec())).expect("send");
        }
        Blocks {
            source: BlockSource::Ahead(rx),
        }
    }

    #[test]
    fn a_marked_read_keeps_the_text_of_a_record_across_blocks() {
        let parts: [&[u8]; 4] = [b"\xEF\xBB\xBFa,b\n\"x", b"y\nz", b"\",2\nlast,", b"3"];
        let mut blocks = blocks_of(&parts);
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .buffer_capacity(3)
            .from_reader(MarkedRead::new(&mut blocks));
        let mut record = csv::ByteRecord::new();
        let mut texts = Vec::new();
        loop {
            let next = reader.position().byte();
            reader.get_mut().mark(next);
            if !reader.read_byte_record(&mut record).expect("csv") {
                break;
            }
            let start = record.position().expect("position").byte();
            let text = reader.get_ref().text(start, reader.position().byte());
            texts.push((
                record.position().expect("position").line(),
                String::from_utf8_lossy(text).into_owned(),
                record
                    .iter()
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .collect::<Vec<_>>(),
            ));
        }
        assert_eq!(
            texts,
            vec![
                (
                    1,
                    "a,b\n".to_string(),
                    vec!["a".to_string(), "b".to_string()]
                ),
                (
                    2,
                    "\"xy\nz\",2\n".to_string(),
                    vec!["xy\nz".to_string(), "2".to_string()]
                ),
                (
                    4,
                    "last,3".to_string(),
                    vec!["last".to_string(), "3".to_string()]
                ),
            ]
        );
        assert!(reader.get_mut().take_error().is_none());
    }

    #[test]
    fn a_marked_read_forgets_what_is_before_the_mark() {
        let big = vec![b'x'; BLOCK];
        let mut blocks = blocks_of(&[&big, b"tail"]);
        let mut read = MarkedRead::new(&mut blocks);
        let mut buf = vec![0u8; BLOCK];
        assert_eq!(read.read(&mut buf).expect("read"), BLOCK);
        read.mark(BLOCK as u64 - 2);
        assert_eq!(read.kept.len(), 2, "the forgotten bytes are let go");
        assert_eq!(read.read(&mut buf).expect("read"), 4);
        assert_eq!(read.text(BLOCK as u64 - 2, BLOCK as u64 + 4), b"xxtail");
        assert_eq!(read.read(&mut buf).expect("read"), 0);
    }

    #[test]
    fn large_files_are_read_on_a_second_thread_in_order() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("big.jsonl");
        let mut text = String::new();
        let mut n = 0u64;
        while text.len() <= 2 * BLOCK + 17 {
            n += 1;
            text.push_str(&format!("{{\"n\":{n}}}\n"));
        }
        std::fs::write(&path, &text).expect("write");
        // As a local file, and as an object read by ranged requests.
        let object = FileRef::Object {
            storage: std::sync::Arc::new(etlantic_core::storage::LocalStorage::new(dir.path())),
            name: "big.jsonl".into(),
            size: None,
        };
        for file in [FileRef::Local(path.clone()), object] {
            let mut seen = 0u64;
            for_each_line(&file, |number, bytes| {
                seen += 1;
                assert_eq!(number, seen);
                assert_eq!(bytes, format!("{{\"n\":{number}}}").as_bytes());
                Ok(())
            })
            .expect("read");
            assert_eq!(seen, n, "{file:?}");
        }
    }
}
