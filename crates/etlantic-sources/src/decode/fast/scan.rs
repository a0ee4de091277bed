//! The JSON scanner of the fast path: strict RFC 8259, as serde_json reads it. It walks
//! a record's bytes in place (keys, strings with their simple escapes decoded, number
//! tokens, skipped values) and gives up, with `None`, wherever serde_json must decide.

use super::plain_int;

pub(super) struct Scan<'a> {
    pub(super) b: &'a [u8],
    pub(super) i: usize,
}

/// A number token as it appears in the text.
pub(super) struct Number<'a> {
    text: &'a [u8],
    /// No fraction and no exponent.
    integral: bool,
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

impl Number<'_> {
    /// The token as an `i64` when it is an integer of at most 18 digits (`-0` is left to
    /// serde_json, which reads it as the float `-0.0`).
    pub(super) fn int(&self) -> Option<i64> {
        if !self.integral || self.text == b"-0" {
            return None;
        }
        plain_int(self.text)
    }

    /// The token as an `f64`, exactly as serde_json reads it. Integers and decimals of at
    /// most 15 digits with a power of ten up to 22 are computed with one exact
    /// multiplication or division (correctly rounded, so every correct parser agrees);
    /// the rest goes through serde_json itself.
    pub(super) fn float(&self) -> Option<f64> {
        if self.integral {
            if let Some(v) = self.int() {
                return Some(v as f64);
            }
        }
        let t = self.text;
        let (neg, mut i) = if t.first() == Some(&b'-') {
            (true, 1)
        } else {
            (false, 0)
        };
        let mut mantissa: u64 = 0;
        let mut digits = 0;
        let mut frac = 0i32;
        let mut dot = false;
        while i < t.len() {
            match t[i] {
                d @ b'0'..=b'9' => {
                    mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
                    digits += 1;
                    if dot {
                        frac += 1;
                    }
                }
                b'.' => dot = true,
                _ => break,
            }
            i += 1;
        }
        let mut exp: i32 = 0;
        if i < t.len() {
            // An exponent: `e` or `E`, a sign, digits (the grammar was checked).
            let e = std::str::from_utf8(&t[i + 1..]).ok()?;
            exp = match e.parse::<i32>() {
                Ok(x) => x,
                Err(_) => return self.serde_float(),
            };
        }
        let exp = exp.checked_sub(frac)?;
        if digits > 15 || exp.unsigned_abs() > 22 {
            return self.serde_float();
        }
        let f = mantissa as f64;
        let f = if exp >= 0 {
            f * POW10[exp as usize]
        } else {
            f / POW10[(-exp) as usize]
        };
        Some(if neg { -f } else { f })
    }

    fn serde_float(&self) -> Option<f64> {
        serde_json::from_slice::<f64>(self.text).ok()
    }
}

impl<'a> Scan<'a> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub(super) fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    pub(super) fn ws(&mut self) {
        let skipped = self.b[self.i..]
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        self.i += skipped;
    }

    /// The bytes of a string from the scan position up to its closing quote or its first
    /// escape (`Some((length, at_quote))`), checked: no control character, and UTF-8 (the
    /// scanner reads bytes; only inside strings may they be other than ASCII).
    pub(super) fn segment(&self) -> Option<(usize, bool)> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        // Whether some byte of `w` is zero, or below `n` (n <= 0x80): exact as an "any".
        let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
        let rest = &self.b[self.i..];
        let mut k = 0;
        let mut ascii = true;
        loop {
            // Eight bytes at a time while none is a quote, a backslash, a control
            // character or non-ASCII: most strings are short ASCII, and this finds their
            // end in a few steps without setting up a vector search.
            while let Some(chunk) = rest.get(k..k + 8) {
                let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                let special = below(w ^ (ONES * u64::from(b'"')), 1)
                    | below(w ^ (ONES * u64::from(b'\\')), 1)
                    | below(w, 0x20)
                    | (w & HIGHS);
                if special != 0 {
                    break;
                }
                k += 8;
            }
            // Byte by byte through the word that stopped the loop (or the last bytes).
            let stop = (k + 8).min(rest.len());
            while k < stop {
                match rest[k] {
                    b'"' | b'\\' => {
                        if !ascii && std::str::from_utf8(&rest[..k]).is_err() {
                            return None;
                        }
                        return Some((k, rest[k] == b'"'));
                    }
                    c if c < 0x20 => return None,
                    c => ascii &= c < 0x80,
                }
                k += 1;
            }
            if k >= rest.len() {
                return None;
            }
        }
    }

    pub(super) fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// A string without escapes (a key), from past its opening quote: its bytes.
    pub(super) fn plain_string_body(&mut self) -> Option<&'a [u8]> {
        let (len, at_quote) = self.segment()?;
        if !at_quote {
            return None;
        }
        let start = self.i;
        self.i += len + 1;
        Some(&self.b[start..start + len])
    }

    /// A string value: its bytes, with the escapes `\" \\ \/ \b \f \n \r \t` decoded into
    /// `buf` when there are any. `\u` escapes (and surrogate pairs) are left to serde_json.
    pub(super) fn string<'s>(&mut self, buf: &'s mut Vec<u8>) -> Option<&'s [u8]>
    where
        'a: 's,
    {
        if self.next()? != b'"' {
            return None;
        }
        let (len, at_quote) = self.segment()?;
        let start = self.i;
        self.i += len + 1;
        if at_quote {
            return Some(&self.b[start..start + len]);
        }
        // Escapes: the string is decoded into `buf`, segment by segment.
        buf.clear();
        buf.extend_from_slice(&self.b[start..start + len]);
        loop {
            buf.push(match self.next()? {
                b'"' => b'"',
                b'\\' => b'\\',
                b'/' => b'/',
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                _ => return None,
            });
            let (len, at_quote) = self.segment()?;
            buf.extend_from_slice(&self.b[self.i..self.i + len]);
            self.i += len + 1;
            if at_quote {
                return Some(buf.as_slice());
            }
        }
    }

    /// A number token, its grammar checked: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    pub(super) fn number(&mut self) -> Option<Number<'a>> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.i += 1;
            integral = false;
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        Some(Number {
            text: &self.b[start..self.i],
            integral,
        })
    }

    fn digits(&mut self) {
        let n = self.b[self.i..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        self.i += n;
    }

    /// Skips one value, checking it as serde_json would (nested at most 64 deep here;
    /// deeper values are left to serde_json and its own limit).
    pub(super) fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > 64 {
            return None;
        }
        match self.peek()? {
            b'"' => {
                // Checked as a value is (`\u` escapes, which may be lone surrogates, are
                // left to serde_json); decoded only when it has escapes.
                self.string(&mut Vec::new())?;
            }
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    let mut ignored = Vec::new();
                    self.string(&mut ignored)?;
                    self.ws();
                    if self.next()? != b':' {
                        return None;
                    }
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => break,
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => break,
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true").then_some(())?,
            b'f' => self.literal(b"false").then_some(())?,
            b'n' => self.literal(b"null").then_some(())?,
            _ => {
                let n = self.number()?;
                // serde_json refuses numbers beyond f64's range.
                if !n.integral && !n.float()?.is_finite() {
                    return None;
                }
                if n.integral && n.text.len() > 300 {
                    return None;
                }
            }
        }
        Some(())
    }
}
