//! REST's answers read into the log's columns: a JSON cursor over an answer as the front
//! writes it, and its numbers parsed exactly (Clinger's fast path where it is exact).

use super::{Col, BOOL, F64, I64, LIST_F32, STR};
use crate::codecs::{Fallback, Native};

/// Powers of ten a double holds exactly.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A decimal's value, the fast way where it is exact: `-?digits(.digits)?` with a mantissa
/// under 2^53 and at most 22 decimals is one division of two exact doubles, which IEEE
/// rounds correctly (Clinger's fast path); None for anything else (the full parse).
fn decimal(text: &[u8]) -> Option<f64> {
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    let mut mantissa: u64 = 0;
    let mut decimals: Option<usize> = None;
    let mut count = 0;
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                if count >= 19 {
                    return None;
                }
                mantissa = mantissa * 10 + u64::from(b - b'0');
                count += 1;
                if let Some(d) = decimals.as_mut() {
                    *d += 1;
                }
            }
            b'.' if decimals.is_none() => decimals = Some(0),
            _ => return None,
        }
    }
    let decimals = decimals.unwrap_or(0);
    if count == 0 || mantissa >= 1 << 53 || decimals > 22 {
        return None;
    }
    let value = mantissa as f64 / POW10[decimals];
    Some(if negative { -value } else { value })
}

/// A number that is whole (an id, an int, an age), as JSON may write it (`5` or `5.0`).
pub(super) fn whole(text: &[u8]) -> Native<i64> {
    if !text.is_empty() && text.len() < 19 && text.iter().all(u8::is_ascii_digit) {
        return Ok(text.iter().fold(0i64, |v, &b| v * 10 + i64::from(b - b'0')));
    }
    let s = std::str::from_utf8(text).map_err(|_| Fallback)?;
    if let Ok(v) = s.parse::<i64>() {
        return Ok(v);
    }
    let f = s.parse::<f64>().map_err(|_| Fallback)?;
    if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
        Ok(f as i64)
    } else {
        Err(Fallback)
    }
}

/// A float as the answers write it: a number, or the text of a non-finite one.
fn float(j: &mut Json<'_>) -> Native<f64> {
    if j.peek() == Some(b'"') {
        return match j.string_slice()? {
            b"NaN" => Ok(f64::NAN),
            b"Infinity" => Ok(f64::INFINITY),
            b"-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(Fallback),
        };
    }
    let text = j.number()?;
    if let Some(value) = decimal(text) {
        return Ok(value);
    }
    std::str::from_utf8(text)
        .map_err(|_| Fallback)?
        .parse::<f64>()
        .map_err(|_| Fallback)
}

pub(super) fn json_value(j: &mut Json<'_>, col: &mut Col) -> Native<()> {
    if j.literal(b"null") {
        col.null();
        return Ok(());
    }
    match col.kind {
        F64 => col.f64s.push(float(j)?),
        I64 => col.i64s.push(whole(j.number()?)?),
        BOOL => {
            let v = if j.literal(b"true") {
                1
            } else if j.literal(b"false") {
                0
            } else {
                return Err(Fallback);
            };
            col.i64s.push(v);
        }
        STR => {
            j.string_into(&mut col.bytes)?;
            col.end();
        }
        _ => {
            j.byte(b'[')?;
            if !j.ends(b']') {
                loop {
                    if col.kind == LIST_F32 {
                        col.f32s.push(float(j)? as f32);
                    } else {
                        col.i64s.push(whole(j.number()?)?);
                    }
                    if j.close(b']')? {
                        break;
                    }
                }
            }
            col.end();
        }
    }
    col.valid.push(true);
    Ok(())
}

/// A cursor over JSON as the answers are written (no whitespace needed, some allowed).
pub(super) struct Json<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Json<'a> {
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.data.get(self.pos) {
            self.pos += 1;
        }
    }

    pub(super) fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.data.get(self.pos).copied()
    }

    pub(super) fn byte(&mut self, b: u8) -> Native<()> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Fallback)
        }
    }

    /// Right after a container opens: whether it is empty (its close consumed).
    pub(super) fn ends(&mut self, close: u8) -> bool {
        if self.peek() == Some(close) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// After a member: `close` ends the container (true), a comma goes on (false).
    pub(super) fn close(&mut self, close: u8) -> Native<bool> {
        match self.peek() {
            Some(b) if b == close => {
                self.pos += 1;
                Ok(true)
            }
            Some(b',') => {
                self.pos += 1;
                Ok(false)
            }
            _ => Err(Fallback),
        }
    }

    pub(super) fn literal(&mut self, word: &[u8]) -> bool {
        self.ws();
        if self.data[self.pos..].starts_with(word) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    pub(super) fn key(&mut self) -> Native<&'a [u8]> {
        let key = self.string_slice()?;
        self.byte(b':')?;
        Ok(key)
    }

    /// A string without escapes, as its bytes (keys, statuses, group names).
    pub(super) fn string_slice(&mut self) -> Native<&'a [u8]> {
        self.byte(b'"')?;
        let start = self.pos;
        while let Some(&b) = self.data.get(self.pos) {
            match b {
                b'"' => {
                    self.pos += 1;
                    return Ok(&self.data[start..self.pos - 1]);
                }
                b'\\' => return Err(Fallback),
                _ => self.pos += 1,
            }
        }
        Err(Fallback)
    }

    /// A string, unescaped, appended to `out` (UTF-8).
    pub(super) fn string_into(&mut self, out: &mut Vec<u8>) -> Native<()> {
        self.byte(b'"')?;
        loop {
            let b = *self.data.get(self.pos).ok_or(Fallback)?;
            self.pos += 1;
            match b {
                b'"' => return Ok(()),
                b'\\' => {
                    let e = *self.data.get(self.pos).ok_or(Fallback)?;
                    self.pos += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let mut c = self.hex4()?;
                            if (0xD800..0xDC00).contains(&c) {
                                // a surrogate pair: \uD83D\uDE00
                                if self.data.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                    return Err(Fallback);
                                }
                                self.pos += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(Fallback);
                                }
                                c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
                            }
                            let ch = char::from_u32(c).ok_or(Fallback)?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return Err(Fallback),
                    }
                }
                b if b < 0x20 => return Err(Fallback),
                b => out.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Native<u32> {
        let digits = self.data.get(self.pos..self.pos + 4).ok_or(Fallback)?;
        let text = std::str::from_utf8(digits).map_err(|_| Fallback)?;
        let v = u32::from_str_radix(text, 16).map_err(|_| Fallback)?;
        self.pos += 4;
        Ok(v)
    }

    /// A number's text.
    pub(super) fn number(&mut self) -> Native<&'a [u8]> {
        self.ws();
        let start = self.pos;
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.data.get(self.pos) {
            self.pos += 1;
        }
        if self.pos == start {
            Err(Fallback)
        } else {
            Ok(&self.data[start..self.pos])
        }
    }

    /// Any value, skipped.
    pub(super) fn skip(&mut self) -> Native<()> {
        match self.peek().ok_or(Fallback)? {
            b'"' => {
                let mut sink = Vec::new();
                self.string_into(&mut sink)
            }
            b'{' => {
                self.pos += 1;
                if self.ends(b'}') {
                    return Ok(());
                }
                loop {
                    self.key_any()?;
                    self.skip()?;
                    if self.close(b'}')? {
                        return Ok(());
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                if self.ends(b']') {
                    return Ok(());
                }
                loop {
                    self.skip()?;
                    if self.close(b']')? {
                        return Ok(());
                    }
                }
            }
            _ => {
                if self.literal(b"null") || self.literal(b"true") || self.literal(b"false") {
                    Ok(())
                } else {
                    self.number().map(|_| ())
                }
            }
        }
    }

    pub(super) fn key_any(&mut self) -> Native<()> {
        let mut sink = Vec::new();
        self.string_into(&mut sink)?;
        self.byte(b':')
    }
}
