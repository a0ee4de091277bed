//! The lines of a text file, read in large blocks on a thread of their own while the
//! caller decodes the lines of the previous block.

use crate::fsutil::io_error;
use etlantic_core::diagnostics::Result;
use std::io::Read;
use std::path::Path;

/// The size of one block read ahead.
const BLOCK: usize = 4 << 20;

/// Calls `line(number, bytes)` for every line of the file at `path`, in order, numbered
/// from 1, without its `\n` (nor a `\r` before it), the UTF-8 byte order mark of the
/// first line removed. A last line without a newline is a line.
///
/// Files larger than one block are read by a second thread, at most two blocks ahead, so
/// memory stays bounded and reading overlaps decoding.
pub(crate) fn for_each_line(
    path: &Path,
    mut line: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut file = std::fs::File::open(path).map_err(|e| io_error("open", path, e))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut lines = Splitter::default();
    if size <= BLOCK as u64 {
        let mut bytes = Vec::with_capacity(size as usize);
        file.read_to_end(&mut bytes)
            .map_err(|e| io_error("read", path, e))?;
        lines.block(&bytes, &mut line)?;
        return lines.finish(&mut line);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(2);
        scope.spawn(move || loop {
            let mut block = Vec::with_capacity(BLOCK);
            match (&mut file).take(BLOCK as u64).read_to_end(&mut block) {
                Ok(0) => return,
                Ok(_) => {
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
        for block in rx {
            let block = block.map_err(|e| io_error("read", path, e))?;
            lines.block(&block, &mut line)?;
        }
        lines.finish(&mut line)
    })
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
        let mut seen = 0u64;
        for_each_line(&path, |number, bytes| {
            seen += 1;
            assert_eq!(number, seen);
            assert_eq!(bytes, format!("{{\"n\":{number}}}").as_bytes());
            Ok(())
        })
        .expect("read");
        assert_eq!(seen, n);
    }
}
