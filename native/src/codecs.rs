//! One stored value at a time: the canonical stored forms (float texts, decimal ints,
//! protobuf float lists, Snappy-compressed varint lists) read and written as JSON, as
//! `FeatureRow.values` records, or as Python objects, and float features' stored texts.
//! Anything not canonical is a `Fallback`: the Python reference answers it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

// Type codes: feature_store.serialization.answers.TYPE_CODES
const FLOAT: u8 = 0;
const DOUBLE: u8 = 1;
const INT: u8 = 2;
const BOOL: u8 = 3;
const STRING: u8 = 4;
const EMBEDDING: u8 = 5;
pub(crate) const FLOAT_LIST: u8 = 6;
pub(crate) const INT_LIST: u8 = 7;

/// The packed form of a group's stored values: per feature a varint of its length plus
/// one (0 for no value), then the bytes. One byte of length for a value under 127 bytes.
pub(crate) fn pack_value(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0),
        Some(v) => {
            put_varint(out, v.len() as u64 + 1);
            out.extend_from_slice(v);
        }
    }
}

/// A value the native path does not take; the Python reference answers it.
pub(crate) struct Fallback;

pub(crate) type Native<T> = Result<T, Fallback>;

pub(crate) fn fallback(index: usize) -> PyErr {
    PyValueError::new_err(index)
}

// --- reading stored values -------------------------------------------------------------

/// The powers of ten the quick path divides by, each exact as a float64.
const EXACT_POWERS_OF_TEN: [f64; 19] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18,
];

/// Stored float text as Python's `float()` reads it, for the forms the writers produce:
/// `-?digits(.digits)?([eE][+-]?digits)?`, `nan`, `inf`, `-inf`.
///
/// A plain decimal of at most 19 digits (at most 18 after the point) that make an integer
/// of at most 2^53 (every text the writers store for a float32, and most for a float64) is
/// that integer divided by a power of ten, both exact as float64: one correctly rounded
/// division gives the nearest float64, as Python's does (Clinger's fast path, without the
/// general parser's setup: a compact cache's gRPC hits read every float this way).
fn parse_float(text: &[u8]) -> Native<f64> {
    match text {
        b"0" => return Ok(0.0), // most stored floats
        b"nan" => return Ok(f64::NAN),
        b"inf" => return Ok(f64::INFINITY),
        b"-inf" => return Ok(f64::NEG_INFINITY),
        _ => {}
    }
    let negative = text.first() == Some(&b'-');
    let mut i = usize::from(negative);
    let mut mantissa = 0u64; // the digits before any exponent (wraps past 19 of them)
    let digits = |i: &mut usize, mantissa: &mut u64| {
        let start = *i;
        while *i < text.len() && text[*i].is_ascii_digit() {
            *mantissa = mantissa
                .wrapping_mul(10)
                .wrapping_add(u64::from(text[*i] - b'0'));
            *i += 1;
        }
        *i - start
    };
    let whole = digits(&mut i, &mut mantissa);
    if whole == 0 {
        return Err(Fallback);
    }
    let mut fraction = 0;
    if i < text.len() && text[i] == b'.' {
        i += 1;
        fraction = digits(&mut i, &mut mantissa);
        if fraction == 0 {
            return Err(Fallback);
        }
    }
    let plain = i == text.len();
    if !plain && (text[i] == b'e' || text[i] == b'E') {
        i += 1;
        if i < text.len() && (text[i] == b'+' || text[i] == b'-') {
            i += 1;
        }
        if digits(&mut i, &mut 0) == 0 {
            return Err(Fallback);
        }
    }
    if i != text.len() {
        return Err(Fallback);
    }
    if plain && whole + fraction <= 19 && mantissa <= 1 << 53 {
        let x = mantissa as f64 / EXACT_POWERS_OF_TEN[fraction];
        return Ok(if negative { -x } else { x });
    }
    // only ASCII digits and signs are left: valid UTF-8, and a number Rust reads exactly
    // as Python does (both round correctly)
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or(Fallback)
}

/// Canonical decimal int64 text: `0`, or `-?[1-9][0-9]*` within range.
fn parse_int(text: &[u8]) -> Native<i64> {
    let body = text.strip_prefix(b"-").unwrap_or(text);
    let canonical = match body {
        [b'0'] => text.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return Err(Fallback);
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or(Fallback)
}

/// A protobuf varint; only the minimal encoding, as every protobuf writer makes it.
pub(crate) fn read_varint(data: &[u8], pos: &mut usize) -> Native<u64> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *data.get(*pos).ok_or(Fallback)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(Fallback); // more than 64 bits
        }
        value |= u64::from(byte & 0x7F) << shift;
        if byte & 0x80 == 0 {
            if byte == 0 && shift > 0 {
                return Err(Fallback); // not minimal
            }
            return Ok(value);
        }
    }
    Err(Fallback)
}

/// The packed field 1 of FloatList / IntList: empty, or one `0x0a len payload` record.
fn packed_payload(data: &[u8]) -> Native<&[u8]> {
    if data.is_empty() {
        return Ok(data);
    }
    if data[0] != 0x0A {
        return Err(Fallback);
    }
    let mut pos = 1;
    let len = read_varint(data, &mut pos)?;
    if len == 0 || len != (data.len() - pos) as u64 {
        return Err(Fallback);
    }
    Ok(&data[pos..])
}

/// A stored FloatList's packed payload (little-endian float32s), checked: `dim` values
/// (any number for 0), and no signalling NaN. A signalling NaN turns quiet when Python
/// widens it to a double: only the reference knows which bits come back, so it answers
/// those.
fn float_payload(data: &[u8], dim: u32) -> Native<&[u8]> {
    let payload = packed_payload(data)?;
    if payload.len() % 4 != 0 || (dim != 0 && payload.len() / 4 != dim as usize) {
        return Err(Fallback);
    }
    if floats(payload).any(|x| x.is_nan() && x.to_bits() & 0x0040_0000 == 0) {
        return Err(Fallback);
    }
    Ok(payload)
}

pub(crate) fn floats(payload: &[u8]) -> impl Iterator<Item = f32> + '_ {
    payload
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// A stored IntList (Snappy-compressed protobuf) decompressed: its protobuf bytes.
fn int_list_plain(data: &[u8]) -> Native<Vec<u8>> {
    snap::raw::Decoder::new()
        .decompress_vec(data)
        .map_err(|_| Fallback)
}

/// Each value of an IntList's packed payload to `each`; Err at a varint that is not
/// minimal or holds more than 64 bits.
fn int_values(payload: &[u8], mut each: impl FnMut(i64)) -> Native<()> {
    let mut pos = 0;
    while pos < payload.len() {
        each(read_varint(payload, &mut pos)? as i64);
    }
    Ok(())
}

// --- writing JSON ----------------------------------------------------------------------

/// A finite nonzero decimal: sign, significant digits (no leading or trailing zeros) and
/// the exponent of its first digit (value = d.ddd x 10^exp).
struct Decimal {
    negative: bool,
    buf: [u8; 40],
    len: usize,
    exp: i32,
}

impl Decimal {
    /// From any decimal text (ryu's output): `-1.25e-7`, `0.001`, `300.0`. None for zero.
    fn parse(shortest: &str) -> Option<Decimal> {
        let text = shortest.as_bytes();
        let (negative, text) = match text.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, text),
        };
        let (mantissa, exponent) = match text.iter().position(|&c| c == b'e') {
            Some(i) => (&text[..i], parse_exponent(&text[i + 1..])),
            None => (text, 0),
        };
        let point = mantissa
            .iter()
            .position(|&c| c == b'.')
            .unwrap_or(mantissa.len());
        let mut all = [0u8; 40];
        let mut n = 0;
        for &c in mantissa.iter().filter(|&&c| c != b'.') {
            if n < all.len() {
                all[n] = c;
                n += 1;
            }
        }
        let leading = all[..n].iter().take_while(|&&d| d == b'0').count();
        let mut end = n;
        while end > leading && all[end - 1] == b'0' {
            end -= 1;
        }
        if end == leading {
            return None;
        }
        let mut buf = [0u8; 40];
        buf[..end - leading].copy_from_slice(&all[leading..end]);
        Some(Decimal {
            negative,
            buf,
            len: end - leading,
            exp: exponent + point as i32 - 1 - leading as i32,
        })
    }

    fn digits(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Plain notation: `0.000ddd` for a negative exponent, else digits with the point
    /// after exp + 1 of them (zeros added), and `whole` after a whole number (".0" or "").
    fn plain(&self, out: &mut Vec<u8>, whole: &[u8]) {
        let digits = self.digits();
        if self.exp < 0 {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-self.exp - 1) as usize, b'0');
            out.extend_from_slice(digits);
            return;
        }
        let point = self.exp as usize + 1;
        if digits.len() <= point {
            out.extend_from_slice(digits);
            out.resize(out.len() + point - digits.len(), b'0');
            out.extend_from_slice(whole);
        } else {
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        }
    }

    /// The number with its sign: plain notation for exponents in `plain` (`whole` after a
    /// whole number), scientific notation otherwise (`plus` before a positive exponent).
    fn write(&self, out: &mut Vec<u8>, plain: std::ops::Range<i32>, whole: &[u8], plus: &[u8]) {
        if self.negative {
            out.push(b'-');
        }
        if plain.contains(&self.exp) {
            self.plain(out, whole);
        } else {
            self.scientific(out, plus);
        }
    }

    /// Scientific notation `d.ddde<sign>exp`; `plus` is what a positive exponent gets.
    fn scientific(&self, out: &mut Vec<u8>, plus: &[u8]) {
        let digits = self.digits();
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.extend_from_slice(if self.exp < 0 { b"-" } else { plus });
        json_i64(out, i64::from(self.exp.unsigned_abs()));
    }
}

/// A finite float as orjson writes it: the shortest round-trip digits, plain notation for
/// decimal exponents -5..=15 (with ".0" on whole numbers), else `1.5e-7` / `1e+16`.
/// `shortest` is ryu's output for the same digits, in ryu's own layout.
pub(crate) fn layout(out: &mut Vec<u8>, shortest: &str) {
    let negative = shortest.starts_with('-');
    match Decimal::parse(shortest) {
        None => out.extend_from_slice(if negative { b"-0.0" } else { b"0.0" }),
        Some(d) => d.write(out, -5..16, b".0", b"+"),
    }
}

/// A float feature's stored text, as `feature_store.serialization.codecs.encode_float32`
/// writes it (the reference): the float32 nearest `x`, as its shortest decimal, plain for
/// decimal exponents -4..=15 (whole numbers without a point), else `1.5e-7` / `1e20`;
/// `0` / `-0` for zero and for what underflows to it; `nan`, `inf`, `-inf`. False where
/// `x` rounds past the largest float32, which the reference refuses.
fn storage_f32(out: &mut Vec<u8>, x: f64) -> bool {
    if x.is_nan() {
        out.extend_from_slice(b"nan");
        return true;
    }
    if x.is_infinite() {
        out.extend_from_slice(if x > 0.0 { b"inf" } else { b"-inf" });
        return true;
    }
    let f = x as f32;
    if f.is_infinite() {
        return false;
    }
    if f == 0.0 {
        out.extend_from_slice(if x.is_sign_negative() { b"-0" } else { b"0" });
        return true;
    }
    match Decimal::parse(ryu::Buffer::new().format_finite(f)) {
        None => out.extend_from_slice(if f.is_sign_negative() { b"-0" } else { b"0" }),
        Some(d) => d.write(out, -4..16, b"", b""),
    }
    true
}

fn parse_exponent(text: &[u8]) -> i32 {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    let value = digits.iter().fold(0i32, |v, &d| {
        v.saturating_mul(10).saturating_add(i32::from(d - b'0'))
    });
    if negative {
        -value
    } else {
        value
    }
}

/// Stored float text that is already what orjson writes for the float64 it reads as:
/// `0.ddd` (at most four zeros after the point) or `ddd.ddd`, no trailing zero, at most 15
/// significant digits (so the text is the shortest round trip of its double: no other
/// decimal of 15 digits or fewer reads as the same double), or a whole number, which takes
/// ".0". Most stored floats are: they are copied without a parse. Others return false.
fn json_float_text(out: &mut Vec<u8>, text: &[u8]) -> bool {
    match text {
        b"0" => out.extend_from_slice(b"0.0"),
        b"-0" => out.extend_from_slice(b"-0.0"),
        _ => {
            let body = text.strip_prefix(b"-").unwrap_or(text);
            let point = body.iter().position(|&c| c == b'.');
            let (int_part, frac) = match point {
                Some(i) => (&body[..i], &body[i + 1..]),
                None => (body, &b""[..]),
            };
            let digits_ok = int_part.iter().all(u8::is_ascii_digit)
                && frac.iter().all(u8::is_ascii_digit)
                && !int_part.is_empty();
            if !digits_ok {
                return false;
            }
            let significant = if int_part == b"0" {
                let zeros = frac.iter().take_while(|&&c| c == b'0').count();
                if point.is_none() || zeros > 4 || zeros == frac.len() {
                    return false;
                }
                frac.len() - zeros
            } else {
                if int_part[0] == b'0' || int_part.len() > 16 {
                    return false;
                }
                int_part.len() + frac.len()
            };
            let bad_fraction = point.is_some() && matches!(frac.last(), None | Some(b'0'));
            if significant > 15 || bad_fraction {
                return false;
            }
            out.extend_from_slice(text);
            if point.is_none() {
                out.extend_from_slice(b".0");
            }
        }
    }
    true
}

fn non_finite(out: &mut Vec<u8>, nan: bool, positive: bool) {
    out.extend_from_slice(match (nan, positive) {
        (true, _) => b"\"NaN\"".as_slice(),
        (false, true) => b"\"Infinity\"".as_slice(),
        (false, false) => b"\"-Infinity\"".as_slice(),
    });
}

/// ryu's digits in orjson's layout. ryu writes plain notation (`0.001`, `12.5`, `3.0`)
/// for a middle range of exponents, and within orjson's plain range (1e-5 up to 1e16)
/// the two layouts are the same text: copied as it is; anything else is laid out.
fn shortest(out: &mut Vec<u8>, text: &str, magnitude: f64) {
    let bytes = text.as_bytes();
    // bytes: `str::contains` with a char sets up a substring search for a few bytes
    let plain = magnitude < 1e16 && (magnitude >= 1e-5 || magnitude == 0.0);
    if plain && !bytes.contains(&b'e') {
        out.extend_from_slice(bytes);
    } else {
        layout(out, text);
    }
}

fn json_f64(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        shortest(out, ryu::Buffer::new().format_finite(x), x.abs());
    } else {
        non_finite(out, x.is_nan(), x > 0.0);
    }
}

/// A float32 as its shortest float32 decimal (not the 17 digits of the widened double).
fn json_f32(out: &mut Vec<u8>, x: f32) {
    if x.is_finite() {
        shortest(out, ryu::Buffer::new().format_finite(x), f64::from(x.abs()));
    } else {
        non_finite(out, x.is_nan(), x > 0.0);
    }
}

/// An integer's decimal digits (itoa: two digits a step), as JSON and as Python's `str`.
pub(crate) fn json_i64(out: &mut Vec<u8>, x: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(x).as_bytes());
}

/// A JSON string as orjson escapes it: `"`, `\` and control characters only.
pub(crate) fn json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0..=0x1F => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

pub(crate) fn json_value(out: &mut Vec<u8>, type_code: u8, dim: u32, data: &[u8]) -> Native<()> {
    match type_code {
        FLOAT | DOUBLE => {
            if !json_float_text(out, data) {
                json_f64(out, parse_float(data)?);
            }
        }
        INT => json_i64(out, parse_int(data)?),
        BOOL => out.extend_from_slice(match data {
            b"1" => b"true".as_slice(),
            b"0" => b"false".as_slice(),
            _ => return Err(Fallback),
        }),
        STRING => json_str(out, std::str::from_utf8(data).map_err(|_| Fallback)?),
        EMBEDDING | FLOAT_LIST => {
            out.push(b'[');
            for (i, x) in floats(float_payload(data, dim)?).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_f32(out, x);
            }
            out.push(b']');
        }
        INT_LIST => {
            // decompressed on the stack where it fits (a standard list is about 50 bytes)
            let mut stack = [0u8; INT_LIST_STACK];
            let heap: Vec<u8>;
            let len = snap::raw::decompress_len(data).map_err(|_| Fallback)?;
            let plain = if len <= INT_LIST_STACK {
                let done = snap::raw::Decoder::new().decompress(data, &mut stack[..len]);
                if done.ok() != Some(len) {
                    return Err(Fallback);
                }
                &stack[..len]
            } else {
                heap = int_list_plain(data)?;
                &heap[..]
            };
            out.push(b'[');
            let mut first = true;
            int_values(packed_payload(plain)?, |x| {
                if !first {
                    out.push(b',');
                }
                first = false;
                json_i64(out, x);
            })?;
            out.push(b']');
        }
        _ => return Err(Fallback),
    }
    Ok(())
}

/// The largest decompressed int list `json_value` reads from the stack (larger ones: the heap).
const INT_LIST_STACK: usize = 512;

// --- Python objects (the store client) --------------------------------------------------

pub(crate) fn py_value(py: Python<'_>, type_code: u8, dim: u32, data: &[u8]) -> Native<PyObject> {
    use pyo3::types::{PyBool, PyFloat, PyString};
    Ok(match type_code {
        FLOAT | DOUBLE => PyFloat::new(py, parse_float(data)?).into_any().unbind(),
        INT => {
            let x = parse_int(data)?;
            x.into_pyobject(py)
                .map_err(|_| Fallback)?
                .into_any()
                .unbind()
        }
        BOOL => {
            let b = match data {
                b"1" => true,
                b"0" => false,
                _ => return Err(Fallback),
            };
            PyBool::new(py, b).to_owned().into_any().unbind()
        }
        STRING => {
            let s = std::str::from_utf8(data).map_err(|_| Fallback)?;
            PyString::new(py, s).into_any().unbind()
        }
        EMBEDDING | FLOAT_LIST => {
            let values: Vec<f64> = floats(float_payload(data, dim)?).map(f64::from).collect();
            PyList::new(py, values)
                .map_err(|_| Fallback)?
                .into_any()
                .unbind()
        }
        INT_LIST => {
            let plain = int_list_plain(data)?;
            let mut values = Vec::new();
            int_values(packed_payload(&plain)?, |x| values.push(x))?;
            PyList::new(py, values)
                .map_err(|_| Fallback)?
                .into_any()
                .unbind()
        }
        _ => return Err(Fallback),
    })
}

// --- writing protobuf (serving.proto FeatureRow.values records) -------------------------

pub(crate) fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7F) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

pub(crate) const MISSING_VALUE: &[u8] = b"\x12\x00"; // FeatureRow.values: a Value with no kind set

pub(crate) fn varint_len(n: u64) -> usize {
    (64 - (n | 1).leading_zeros() as usize + 6) / 7
}

/// `outer, length, inner, length, body`: a record holding one record, lengths computed
/// rather than the payloads written aside.
pub(crate) fn nested(out: &mut Vec<u8>, outer: u8, inner: u8, body: &[u8]) {
    let len = body.len() as u64;
    out.push(outer);
    put_varint(out, 1 + varint_len(len) as u64 + len);
    out.push(inner);
    put_varint(out, len);
    out.extend_from_slice(body);
}

/// One `FeatureRow.values` record (field 2) holding a `Value`. A stored FloatList or
/// IntList is, once checked, the bytes of the Value's own list field: copied as it is.
pub(crate) fn proto_value(out: &mut Vec<u8>, type_code: u8, dim: u32, data: &[u8]) -> Native<()> {
    match type_code {
        FLOAT | DOUBLE => {
            let x = parse_float(data)?;
            out.extend_from_slice(&[0x12, 9, 0x09]); // float_value = 1, fixed64
            out.extend_from_slice(&x.to_le_bytes());
        }
        INT => {
            let x = parse_int(data)? as u64;
            out.extend_from_slice(&[0x12, 1 + varint_len(x) as u8, 0x10]); // int_value = 2
            put_varint(out, x);
        }
        BOOL => out.extend_from_slice(match data {
            b"1" => b"\x12\x02\x18\x01".as_slice(), // bool_value = 3
            b"0" => b"\x12\x02\x18\x00".as_slice(),
            _ => return Err(Fallback),
        }),
        STRING => {
            let s = std::str::from_utf8(data).map_err(|_| Fallback)?;
            nested(out, 0x12, 0x22, s.as_bytes()); // string_value = 4
        }
        EMBEDDING | FLOAT_LIST => {
            float_payload(data, dim)?;
            nested(out, 0x12, 0x2A, data); // float_list_value = 5
        }
        INT_LIST => {
            // decompressed in place (int_list_value = 6), its length read from its header
            let len = snap::raw::decompress_len(data).map_err(|_| Fallback)?;
            let start = out.len();
            out.push(0x12);
            put_varint(out, 1 + varint_len(len as u64) as u64 + len as u64);
            out.push(0x32);
            put_varint(out, len as u64);
            let body = out.len();
            out.resize(body + len, 0);
            let plain = &mut out[body..];
            let decompressed = snap::raw::Decoder::new().decompress(data, plain);
            if decompressed.ok() != Some(len)
                || packed_payload(plain)
                    .and_then(|p| int_values(p, |_| {}))
                    .is_err()
            {
                out.truncate(start);
                return Err(Fallback);
            }
        }
        _ => return Err(Fallback),
    }
    Ok(())
}

// --- the packed form -------------------------------------------------------------------

pub(crate) struct Packed<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Iterator for Packed<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        let head = read_varint(self.data, &mut self.pos).ok()?;
        if head == 0 {
            return Some(None);
        }
        let len = usize::try_from(head - 1).ok()?;
        let value = self.data.get(self.pos..self.pos.checked_add(len)?)?;
        self.pos += len;
        Some(Some(value))
    }
}

/// Whether `raw` is the packed form (`pack_value`) of `values`, read without packing them:
/// what a reload of an entry compares (`hits/load.rs`), 50 values an entity of the standard
/// shape, most of them a float's few bytes of text, compared by `same`.
pub(crate) fn packs<'v>(raw: &[u8], values: impl IntoIterator<Item = Option<&'v [u8]>>) -> bool {
    let mut packed = Packed { data: raw, pos: 0 };
    for value in values {
        match (packed.next(), value) {
            (Some(None), None) => {}
            (Some(Some(there)), Some(value))
                if there.len() == value.len() && same(there, value) => {}
            _ => return false,
        }
    }
    packed.next().is_none()
}

/// Whether two slices of the same length are equal: up to 16 bytes in two overlapping
/// words (or two half words, or bytes) read in place, longer ones by `==`. A call to libc's
/// `memcmp` for each of a reload's 50 short values was its largest cost
/// (`benchmarks/l1_misses.py`, a gRPC lookup whose every entity is reloaded).
#[inline]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    debug_assert_eq!(n, b.len());
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap());
    let half = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap());
    match n {
        0 => true,
        1..=3 => a == b,
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

/// The values of a packed list of `count`; None when `raw` is not one.
pub(crate) fn packed_values(raw: &[u8], count: usize) -> Option<Vec<Option<&[u8]>>> {
    let values: Vec<Option<&[u8]>> = Packed { data: raw, pos: 0 }.collect();
    (values.len() == count).then_some(values)
}

pub(crate) fn unpack(raw: &[u8], count: usize) -> PyResult<Vec<Option<&[u8]>>> {
    packed_values(raw, count)
        .ok_or_else(|| PyValueError::new_err("not a packed value list of this group"))
}

/// Float features' stored texts (`codecs.encode_float32`) of many values: the Spark job's
/// encoder. None where the reference refuses the value (beyond the float32 range).
#[pyfunction]
pub(crate) fn encode_float32_many<'py>(
    py: Python<'py>,
    values: Vec<f64>,
) -> Vec<Option<Bound<'py, PyBytes>>> {
    let mut buf = Vec::with_capacity(24);
    values
        .into_iter()
        .map(|x| {
            buf.clear();
            if storage_f32(&mut buf, x) {
                Some(PyBytes::new(py, &buf))
            } else {
                None
            }
        })
        .collect()
}

/// A float32 as JSON, as the answers write embedding elements (for tests and tools).
#[pyfunction]
pub(crate) fn float32_json<'py>(py: Python<'py>, x: f32) -> Bound<'py, PyBytes> {
    let mut out = Vec::new();
    json_f32(&mut out, x);
    PyBytes::new(py, &out)
}

/// A float64 as JSON, as the answers write float and double features.
#[pyfunction]
pub(crate) fn float64_json<'py>(py: Python<'py>, x: f64) -> Bound<'py, PyBytes> {
    let mut out = Vec::new();
    json_f64(&mut out, x);
    PyBytes::new(py, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_tells_the_packed_form_of_values() {
        let values: [Option<&[u8]>; 4] = [
            Some(b"0.25"),
            None,
            Some(b"a longer stored value"),
            Some(b""),
        ];
        let mut raw = Vec::new();
        for v in values {
            pack_value(&mut raw, v);
        }
        assert!(packs(&raw, values));
        assert!(!packs(
            &raw,
            [Some(&b"0.26"[..]), None, values[2], values[3]]
        ));
        assert!(!packs(
            &raw,
            [values[0], Some(&b""[..]), values[2], values[3]]
        ));
        assert!(!packs(&raw, [values[0], values[1], values[2]]));
        // values of every length up to past two words: equal, and one byte changed anywhere
        for len in 0..40usize {
            let value: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut raw = Vec::new();
            pack_value(&mut raw, Some(&value));
            assert!(packs(&raw, [Some(&value[..])]), "length {len}");
            for at in 0..len {
                let mut other = value.clone();
                other[at] ^= 1;
                assert!(!packs(&raw, [Some(&other[..])]), "length {len}, byte {at}");
            }
            assert!(!packs(&raw, [None]));
            let longer = [&value[..], b"x"].concat();
            assert!(!packs(&raw, [Some(&longer[..])]), "length {len}");
        }
        assert!(!packs(
            &raw,
            [values[0], values[1], values[2], values[3], None]
        ));
    }
}
