//! The serving data plane's hot loops: stored feature values (the bytes Redis returns) to
//! the bytes of answers, without a Python object per value.
//!
//! The reference for every function here is `feature_store/serialization/answers.py`; the
//! property tests in `tests/unit/test_native.py` assert byte-identical output. This code
//! takes only the canonical forms the writers produce. Anything else (a value another
//! writer stored in a form Python also reads, or corrupt data) raises `ValueError`, and the
//! caller answers that value with the Python reference, which also owns every error
//! message. So the native path can be faster, never different.

mod front;
mod hits;

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
const FLOAT_LIST: u8 = 6;
const INT_LIST: u8 = 7;

/// `s` seconds from Python as a Duration, saturating: NaN and negatives are zero, and
/// anything past a year (the settings' bound) is a year, where `Duration::from_secs_f64`
/// would panic on overflow and `Instant + Duration` past the clock's range.
pub(crate) fn seconds(s: f64) -> std::time::Duration {
    const YEAR: f64 = 365.0 * 24.0 * 3600.0;
    // NaN fails `s > 0.0`, +inf is past the year
    std::time::Duration::from_secs_f64(if s > 0.0 { s.min(YEAR) } else { 0.0 })
}

/// The packed form of a group's stored values: per feature a varint of its length plus
/// one (0 for no value), then the bytes. One byte of length for a value under 127 bytes.
fn pack_value(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0),
        Some(v) => {
            put_varint(out, v.len() as u64 + 1);
            out.extend_from_slice(v);
        }
    }
}

/// A value the native path does not take; the Python reference answers it.
struct Fallback;

type Native<T> = Result<T, Fallback>;

fn fallback(index: usize) -> PyErr {
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
fn read_varint(data: &[u8], pos: &mut usize) -> Native<u64> {
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

fn floats(payload: &[u8]) -> impl Iterator<Item = f32> + '_ {
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
fn layout(out: &mut Vec<u8>, shortest: &str) {
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
fn json_i64(out: &mut Vec<u8>, x: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(x).as_bytes());
}

/// A JSON string as orjson escapes it: `"`, `\` and control characters only.
fn json_str(out: &mut Vec<u8>, s: &str) {
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

fn py_value(py: Python<'_>, type_code: u8, dim: u32, data: &[u8]) -> Native<PyObject> {
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

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7F) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

const MISSING_VALUE: &[u8] = b"\x12\x00"; // FeatureRow.values: a Value with no kind set

fn varint_len(n: u64) -> usize {
    (64 - (n | 1).leading_zeros() as usize + 6) / 7
}

/// `outer, length, inner, length, body`: a record holding one record, lengths computed
/// rather than the payloads written aside.
fn nested(out: &mut Vec<u8>, outer: u8, inner: u8, body: &[u8]) {
    let len = body.len() as u64;
    out.push(outer);
    put_varint(out, 1 + varint_len(len) as u64 + len);
    out.push(inner);
    put_varint(out, len);
    out.extend_from_slice(body);
}

/// One `FeatureRow.values` record (field 2) holding a `Value`. A stored FloatList or
/// IntList is, once checked, the bytes of the Value's own list field: copied as it is.
fn proto_value(out: &mut Vec<u8>, type_code: u8, dim: u32, data: &[u8]) -> Native<()> {
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

struct Packed<'a> {
    data: &'a [u8],
    pos: usize,
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

/// The values of a packed list of `count`; None when `raw` is not one.
fn packed_values(raw: &[u8], count: usize) -> Option<Vec<Option<&[u8]>>> {
    let values: Vec<Option<&[u8]>> = Packed { data: raw, pos: 0 }.collect();
    (values.len() == count).then_some(values)
}

fn unpack(raw: &[u8], count: usize) -> PyResult<Vec<Option<&[u8]>>> {
    packed_values(raw, count)
        .ok_or_else(|| PyValueError::new_err("not a packed value list of this group"))
}

/// One feature group's value types, and what the serving path makes of its stored values.
#[pyclass(frozen, module = "feature_store._native")]
struct GroupCodec {
    types: Vec<(u8, u32)>, // (type code, embedding dimension or 0)
}

/// How one stored value is written into an answer: `json_value` or `proto_value`.
type Writer = fn(&mut Vec<u8>, u8, u32, &[u8]) -> Native<()>;

type Loaded<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

impl GroupCodec {
    /// Each packed value written on its own by `write` (`missing` for none).
    fn parts<'py>(
        &self,
        py: Python<'py>,
        raw: &[u8],
        missing: &[u8],
        write: Writer,
    ) -> PyResult<Bound<'py, PyList>> {
        let values = unpack(raw, self.types.len())?;
        let mut parts = Vec::with_capacity(values.len());
        let mut buf = Vec::with_capacity(256);
        for (i, (value, &(type_code, dim))) in values.iter().zip(&self.types).enumerate() {
            buf.clear();
            match value {
                None => buf.extend_from_slice(missing),
                Some(data) => write(&mut buf, type_code, dim, data).map_err(|_| fallback(i))?,
            }
            parts.push(PyBytes::new(py, &buf));
        }
        PyList::new(py, parts)
    }

    /// The answer `loaded` makes, from the packed values.
    fn answer<'py>(
        &self,
        py: Python<'py>,
        raw: &[u8],
        proto: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let values = unpack(raw, self.types.len())?;
        let mut out = Vec::with_capacity(2 * raw.len() + 2);
        let mut present = Vec::with_capacity(values.len());
        write_values(
            &self.types,
            values.iter().copied(),
            proto,
            &mut out,
            &mut present,
            None,
        )
        .map_err(fallback)?;
        Ok(PyBytes::new(py, &out))
    }

    /// `(packed, present, answer)`: `answer` is the values' JSON array, or with `proto`
    /// their `FeatureRow.values` records joined (what `proto` makes of the packed bytes).
    fn loaded<'py>(
        &self,
        py: Python<'py>,
        values: &[Option<&[u8]>],
        proto: bool,
    ) -> PyResult<Loaded<'py>> {
        // the answer is about the stored size (floats' text copied, integers' lists twice
        // theirs, embeddings' three times): sized so that it is rarely grown
        let size: usize = values.iter().map(|v| v.map_or(1, |d| d.len() + 1)).sum();
        let mut raw = Vec::with_capacity(size + values.len());
        let mut answer = Vec::with_capacity(2 * size + 16);
        let mut present = Vec::with_capacity(self.types.len());
        write_values(
            &self.types,
            values.iter().copied(),
            proto,
            &mut answer,
            &mut present,
            Some(&mut raw),
        )
        .map_err(fallback)?;
        Ok((
            PyBytes::new(py, &raw),
            PyBytes::new(py, &present),
            PyBytes::new(py, &answer),
        ))
    }
}

/// Stored values (`None`: none) of these types as their answer: a JSON array, or with
/// `proto` their `FeatureRow.values` records joined; one byte per value into `present` (1
/// stored, 0 none); with `raw`, their packed form too. Err(i): value i is one the native
/// core does not take (the Python reference answers it).
pub(crate) fn write_values<'v>(
    types: &[(u8, u32)],
    values: impl IntoIterator<Item = Option<&'v [u8]>>,
    proto: bool,
    answer: &mut Vec<u8>,
    present: &mut Vec<u8>,
    mut raw: Option<&mut Vec<u8>>,
) -> Result<(), usize> {
    let (write, missing): (Writer, &[u8]) = if proto {
        (proto_value, MISSING_VALUE)
    } else {
        answer.push(b'[');
        (json_value, b"null")
    };
    for (i, (&(type_code, dim), value)) in types.iter().zip(values).enumerate() {
        if i > 0 && !proto {
            answer.push(b',');
        }
        match value {
            None => {
                if let Some(raw) = raw.as_deref_mut() {
                    pack_value(raw, None);
                }
                answer.extend_from_slice(missing);
                present.push(0);
            }
            Some(data) => {
                write(answer, type_code, dim, data).map_err(|_| i)?;
                if let Some(raw) = raw.as_deref_mut() {
                    pack_value(raw, Some(data));
                }
                present.push(1);
            }
        }
    }
    if !proto {
        answer.push(b']');
    }
    Ok(())
}

/// The answer `write_values` makes of packed values (`raw`; empty for an entity with
/// none: every value missing), with `present` as scratch. Err: a value the native core
/// does not take, or `raw` is not a packed value list of `types` (`answer` then holds
/// part of one). The values are read as they are written, without a list of them: a
/// compact cache's hits come here once per entity.
pub(crate) fn write_packed(
    types: &[(u8, u32)],
    raw: &[u8],
    proto: bool,
    answer: &mut Vec<u8>,
    present: &mut Vec<u8>,
) -> Result<(), usize> {
    present.clear();
    if raw.is_empty() {
        let none = std::iter::repeat(None).take(types.len());
        return write_values(types, none, proto, answer, present, None);
    }
    let mut items = Packed { data: raw, pos: 0 };
    let mut count = 0;
    let counted = items.by_ref().inspect(|_| count += 1);
    write_values(types, counted, proto, answer, present, None)?;
    if count != types.len() || items.pos != raw.len() {
        return Err(0);
    }
    Ok(())
}

/// `write_packed` of the values at `picks` alone, in that order (`types` are theirs; the
/// group has `count`): a compact entry's answer to a lookup of some of its features. None
/// where `raw` is not `count` packed values or a value does not write.
pub(crate) fn write_packed_picks(
    types: &[(u8, u32)],
    count: usize,
    raw: &[u8],
    picks: &[usize],
    proto: bool,
    answer: &mut Vec<u8>,
    present: &mut Vec<u8>,
) -> Option<()> {
    present.clear();
    let values = packed_picks(raw, count, Some(picks))?;
    write_values(types, values, proto, answer, present, None).ok()
}

/// A compact entry's stored values (`raw`: `count` packed values, empty where the entity
/// has none), those at `picks` alone where given, in that order. None where `raw` is not
/// `count` packed values or a pick is past them.
pub(crate) fn packed_picks<'a>(
    raw: &'a [u8],
    count: usize,
    picks: Option<&[usize]>,
) -> Option<Vec<Option<&'a [u8]>>> {
    let slots = if raw.is_empty() {
        vec![None; count]
    } else {
        packed_values(raw, count)?
    };
    match picks {
        None => Some(slots),
        Some(picks) => picks.iter().map(|&fi| slots.get(fi).copied()).collect(),
    }
}

#[pymethods]
impl GroupCodec {
    #[new]
    fn new(types: Vec<(u8, u32)>) -> Self {
        GroupCodec { types }
    }

    /// `(packed, present, answer)` of a reply's first len(types) values (see `loaded`).
    /// `present` has one byte per feature: 1 for a value, 0 for none.
    #[pyo3(signature = (reply, proto = false))]
    fn load<'py>(
        &self,
        py: Python<'py>,
        reply: &Bound<'py, PyList>,
        proto: bool,
    ) -> PyResult<Loaded<'py>> {
        if reply.len() < self.types.len() {
            return Err(PyValueError::new_err(
                "the reply has fewer values than the group",
            ));
        }
        let items: Vec<Bound<'py, PyAny>> = reply.iter().take(self.types.len()).collect();
        let mut values = Vec::with_capacity(items.len());
        for item in &items {
            values.push(if item.is_none() {
                None
            } else {
                Some(item.downcast::<PyBytes>()?.as_bytes())
            });
        }
        self.loaded(py, &values, proto)
    }

    /// The same from a packed read (`resp_split`): the group's values start at item
    /// `first`, and the item after them is the group's freshness field, returned too: as
    /// its unix seconds where it is a write time `layout.decode_timestamp` takes, as its
    /// bytes otherwise (Python's reference then names what is wrong with it).
    #[pyo3(signature = (packed, first, proto = false))]
    fn load_packed<'py>(
        &self,
        py: Python<'py>,
        packed: &[u8],
        first: usize,
        proto: bool,
    ) -> PyResult<(Loaded<'py>, Option<Bound<'py, PyAny>>)> {
        let count = self.types.len();
        let mut items = Packed {
            data: packed,
            pos: 0,
        }
        .skip(first);
        let values: Vec<Option<&[u8]>> = items.by_ref().take(count).collect();
        let (true, Some(freshness)) = (values.len() == count, items.next()) else {
            return Err(PyValueError::new_err(
                "the read has fewer values than the group",
            ));
        };
        let freshness = match freshness {
            None => None,
            Some(ts) => Some(match hits::unix_seconds(ts) {
                Some(seconds) => seconds.into_pyobject(py)?.into_any(),
                None => PyBytes::new(py, ts).into_any(),
            }),
        };
        Ok((self.loaded(py, &values, proto)?, freshness))
    }
    /// The reply's first len(types) values as Python objects (None for none), as the
    /// codecs' `fast_decode` makes them: the store client's read.
    fn values<'py>(
        &self,
        py: Python<'py>,
        reply: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        if reply.len() < self.types.len() {
            return Err(PyValueError::new_err(
                "the reply has fewer values than the group",
            ));
        }
        let mut out: Vec<PyObject> = Vec::with_capacity(self.types.len());
        for (i, &(type_code, dim)) in self.types.iter().enumerate() {
            let item = reply.get_item(i)?;
            if item.is_none() {
                out.push(py.None());
                continue;
            }
            let bytes = item.downcast::<PyBytes>()?;
            let value = py_value(py, type_code, dim, bytes.as_bytes()).map_err(|_| fallback(i))?;
            out.push(value);
        }
        PyList::new(py, out)
    }

    /// Each value's JSON (`null` for none), for answers that pick some features.
    fn json_parts<'py>(&self, py: Python<'py>, raw: &[u8]) -> PyResult<Bound<'py, PyList>> {
        self.parts(py, raw, b"null", json_value)
    }

    /// The rows of a REST answer that picks some of this group's features (`picks`: their
    /// indices, in the answer's order), joined by commas: per entity
    /// `{"id":..,"values":[..],"statuses":[..],"ages":{group:age}}`, the values written
    /// from each entry's packed values. `rows` holds each entity's one `(entry,
    /// served_stale)`, none of them a fault entry. The reference is
    /// `feature_store.serving.rest_api._picked_rows`.
    #[pyo3(signature = (ids, rows, now, max_age, group_json, picks))]
    #[allow(clippy::too_many_arguments)]
    fn picked_rows<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyList>,
        rows: &Bound<'py, PyList>,
        now: i64,
        max_age: Option<i64>,
        group_json: &[u8],
        picks: Vec<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let count = self.types.len();
        if picks.iter().any(|&fi| fi >= count) {
            return Err(PyValueError::new_err("a feature index past the group's"));
        }
        let mut out = Vec::with_capacity(rows.len() * (64 + picks.len() * 24));
        for (i, (id, row)) in ids.iter().zip(rows.iter()).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let (entry, served_stale): (Bound<'py, PyAny>, bool) = row.get_item(0)?.extract()?;
            let raw = entry.getattr(pyo3::intern!(py, "raw"))?;
            let written_at: Option<i64> =
                entry.getattr(pyo3::intern!(py, "written_at"))?.extract()?;
            let values = match raw.downcast::<PyBytes>() {
                Ok(raw) => Some(unpack(raw.as_bytes(), count)?),
                Err(_) => None, // nothing stored
            };
            let (age, stale) = age_of(written_at, served_stale, now, max_age);
            out.extend_from_slice(b"{\"id\":");
            json_id(&mut out, &id)?;
            out.extend_from_slice(b",\"values\":[");
            for (k, &fi) in picks.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                match values.as_ref().and_then(|v| v[fi]) {
                    None => out.extend_from_slice(b"null"),
                    Some(data) => {
                        let (type_code, dim) = self.types[fi];
                        json_value(&mut out, type_code, dim, data).map_err(|_| fallback(fi))?
                    }
                }
            }
            out.extend_from_slice(b"],\"statuses\":[");
            for (k, &fi) in picks.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                let present = values.as_ref().and_then(|v| v[fi]).is_some();
                out.extend_from_slice(status_json(u8::from(present), stale));
            }
            out.extend_from_slice(b"],\"ages\":{");
            out.extend_from_slice(group_json);
            out.push(b':');
            match age {
                Some(a) => json_i64(&mut out, a),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b"}}");
        }
        Ok(PyBytes::new(py, &out))
    }

    /// Feast's answer columns of one group, one per feature index in `picks`:
    /// `{"values":[..],"statuses":[..],"event_timestamps":[..]}` over the rows. A row is
    /// its packed values (None: the entity has nothing of the group), its status and its
    /// event time (JSON strings, `statuses` and `stamps`); a value the row lacks is `null`
    /// with status `"NULL_VALUE"`. One call per group and request: the answer's bulk,
    /// written without a Python object per value (`serving/feast_api.py`).
    fn feast_columns<'py>(
        &self,
        py: Python<'py>,
        raws: Vec<Option<Bound<'py, PyBytes>>>,
        statuses: Vec<Bound<'py, PyBytes>>,
        stamps: Vec<Bound<'py, PyBytes>>,
        picks: Vec<usize>,
    ) -> PyResult<Bound<'py, PyList>> {
        let count = self.types.len();
        if statuses.len() != raws.len() || stamps.len() != raws.len() {
            return Err(PyValueError::new_err("one status and one time per row"));
        }
        if picks.iter().any(|&fi| fi >= count) {
            return Err(PyValueError::new_err("a feature index past the group's"));
        }
        let mut rows: Vec<Option<Vec<Option<&[u8]>>>> = Vec::with_capacity(raws.len());
        for raw in &raws {
            rows.push(match raw {
                Some(raw) => Some(unpack(raw.as_bytes(), count)?),
                None => None,
            });
        }
        let mut times = Vec::with_capacity(stamps.len() * 24);
        for (row, stamp) in stamps.iter().enumerate() {
            if row > 0 {
                times.push(b',');
            }
            times.extend_from_slice(stamp.as_bytes());
        }
        let mut columns = Vec::with_capacity(picks.len());
        let mut out = Vec::with_capacity(256 + raws.len() * 40);
        for &fi in &picks {
            let (type_code, dim) = self.types[fi];
            out.clear();
            out.extend_from_slice(b"{\"values\":[");
            for (row, values) in rows.iter().enumerate() {
                if row > 0 {
                    out.push(b',');
                }
                match values.as_ref().and_then(|v| v[fi]) {
                    None => out.extend_from_slice(b"null"),
                    Some(data) => {
                        json_value(&mut out, type_code, dim, data).map_err(|_| fallback(fi))?
                    }
                }
            }
            out.extend_from_slice(b"],\"statuses\":[");
            for (row, (values, status)) in rows.iter().zip(&statuses).enumerate() {
                if row > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(match values {
                    Some(v) if v[fi].is_none() => b"\"NULL_VALUE\"".as_slice(),
                    _ => status.as_bytes(),
                });
            }
            out.extend_from_slice(b"],\"event_timestamps\":[");
            out.extend_from_slice(&times);
            out.extend_from_slice(b"]}");
            columns.push(PyBytes::new(py, &out));
        }
        PyList::new(py, columns)
    }

    /// The values' JSON array (what `load` makes as the answer).
    fn json<'py>(&self, py: Python<'py>, raw: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        self.answer(py, raw, false)
    }

    /// Every value's `FeatureRow.values` record, joined (a whole-group gRPC answer).
    fn proto<'py>(&self, py: Python<'py>, raw: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        self.answer(py, raw, true)
    }

    /// Each value's `FeatureRow.values` record, for answers that pick some features.
    fn proto_parts<'py>(&self, py: Python<'py>, raw: &[u8]) -> PyResult<Bound<'py, PyList>> {
        self.parts(py, raw, MISSING_VALUE, proto_value)
    }
}

/// Float features' stored texts (`codecs.encode_float32`) of many values: the Spark job's
/// encoder. None where the reference refuses the value (beyond the float32 range).
#[pyfunction]
fn encode_float32_many<'py>(py: Python<'py>, values: Vec<f64>) -> Vec<Option<Bound<'py, PyBytes>>> {
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
fn float32_json<'py>(py: Python<'py>, x: f32) -> Bound<'py, PyBytes> {
    let mut out = Vec::new();
    json_f32(&mut out, x);
    PyBytes::new(py, &out)
}

/// A float64 as JSON, as the answers write float and double features.
#[pyfunction]
fn float64_json<'py>(py: Python<'py>, x: f64) -> Bound<'py, PyBytes> {
    let mut out = Vec::new();
    json_f64(&mut out, x);
    PyBytes::new(py, &out)
}

// --- RESP2 replies, straight from the socket's bytes ------------------------------------

/// A reply that is not RESP: its message (`PyValueError` for Python).
#[derive(Debug)]
pub(crate) struct Protocol(&'static str);

impl From<Protocol> for PyErr {
    fn from(e: Protocol) -> PyErr {
        PyValueError::new_err(format!("RESP protocol error: {}", e.0))
    }
}

/// What the parsers below return: a plain error, not a `PyErr`, so that the hot loops
/// carry two words, not a Python exception's state.
type Resp<T> = Result<T, Protocol>;

/// The line at `pos` (without its CRLF) and the position after it; None if incomplete.
/// A CR inside a line is a protocol error, as hiredis has it (Redis never sends one).
fn resp_line(buf: &[u8], pos: usize) -> Resp<Option<(&[u8], usize)>> {
    let rest = match buf.get(pos..) {
        Some(rest) => rest,
        None => return Ok(None),
    };
    let end = match memchr::memchr(b'\r', rest) {
        Some(end) => end,
        None => return Ok(None),
    };
    match rest.get(end + 1) {
        Some(&b'\n') => Ok(Some((&rest[..end], pos + end + 2))),
        Some(_) => Err(Protocol("a CR inside a line")),
        None => Ok(None), // the CRLF is cut: the rest comes with the next read
    }
}

/// The length line of a bulk string or an array whose type byte is at `pos - 1`
/// (`-?digits`, at most 18 of them, then CRLF; RESP's lengths are far shorter), read in
/// one pass, as there are two of them for every field and value of a reply: the length
/// and the position after the CRLF; None if incomplete.
#[inline(always)]
fn resp_len(buf: &[u8], mut pos: usize) -> Resp<Option<(i64, usize)>> {
    let negative = buf.get(pos) == Some(&b'-');
    pos += usize::from(negative);
    let start = pos;
    let mut value: i64 = 0;
    loop {
        match buf.get(pos) {
            None => return Ok(None),
            Some(&d) if d.is_ascii_digit() => value = value * 10 + i64::from(d - b'0'),
            Some(b'\r') => break,
            Some(_) => return Err(Protocol("not a length")),
        }
        pos += 1;
        if pos - start > 18 {
            return Err(Protocol("not a length"));
        }
    }
    if pos == start {
        return Err(Protocol("not a length"));
    }
    match buf.get(pos + 1) {
        Some(&b'\n') => Ok(Some((if negative { -value } else { value }, pos + 2))),
        Some(_) => Err(Protocol("a CR inside a line")),
        None => Ok(None),
    }
}

/// The position after the reply at `pos`; None when `buf` ends first.
pub(crate) fn resp_skip(buf: &[u8], pos: usize) -> Resp<Option<usize>> {
    let kind = match buf.get(pos) {
        Some(&k) => k,
        None => return Ok(None),
    };
    match kind {
        // bulk string (every field and value); RESP3's verbatim string and bulk error
        b'$' | b'=' | b'!' => {
            let (len, next) = match resp_len(buf, pos + 1)? {
                Some(found) => found,
                None => return Ok(None),
            };
            if len < 0 {
                return Ok(Some(next));
            }
            let end = next + len as usize + 2;
            Ok(if end <= buf.len() { Some(end) } else { None })
        }
        // array; RESP3's set, push, and map (two elements per entry)
        b'*' | b'~' | b'>' | b'%' => {
            let (count, mut next) = match resp_len(buf, pos + 1)? {
                Some(found) => found,
                None => return Ok(None),
            };
            let count = count.max(0) * if kind == b'%' { 2 } else { 1 };
            for _ in 0..count {
                next = match resp_skip(buf, next)? {
                    Some(n) => n,
                    None => return Ok(None),
                };
            }
            Ok(Some(next))
        }
        // simple string, error, integer; RESP3's null, double, boolean, big number
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
            Ok(resp_line(buf, pos + 1)?.map(|(_, next)| next))
        }
        _ => Err(Protocol("unknown reply type")),
    }
}

/// `(position, replies)`: how far the complete replies from `pos` reach, and how many
/// there are, up to `count`. A partial reply at the end is left for the next read.
#[pyfunction]
fn resp_scan(buf: &[u8], mut pos: usize, count: usize) -> PyResult<(usize, usize)> {
    let mut done = 0;
    while done < count {
        match resp_skip(buf, pos)? {
            Some(next) => {
                pos = next;
                done += 1;
            }
            None => break,
        }
    }
    Ok((pos, done))
}

/// A bulk string at `pos`: its bytes (None for a null) and the position after it.
#[inline]
fn resp_bulk(buf: &[u8], pos: usize) -> Resp<(Option<&[u8]>, usize)> {
    const NOT_BULK: Protocol = Protocol("expected a bulk string");
    match buf.get(pos) {
        Some(b'$') => {}
        Some(b'_') => {
            // RESP3's null
            let (_, next) = resp_line(buf, pos + 1)?.ok_or(NOT_BULK)?;
            return Ok((None, next));
        }
        _ => return Err(NOT_BULK),
    }
    let (len, next) = resp_len(buf, pos + 1)?.ok_or(NOT_BULK)?;
    if len < 0 {
        return Ok((None, next));
    }
    let end = next + len as usize;
    let value = buf.get(next..end).ok_or(NOT_BULK)?;
    Ok((Some(value), end + 2))
}

/// Whether two field names are the same: the project's are 4 bytes (xxh32), compared as
/// one word rather than through `memcmp`.
#[inline]
fn same_field(a: &[u8], b: &[u8]) -> bool {
    match (<&[u8; 4]>::try_from(a), <&[u8; 4]>::try_from(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What a read's reply holds: an HGETALL's field/value pairs (looked up by field), or an
/// HMGET's values in field order.
pub(crate) struct Shape {
    pub(crate) whole: bool,
    pub(crate) count: usize,
    fields: Vec<Vec<u8>>,
    index: std::collections::HashMap<Vec<u8>, usize>,
}

/// No field of the read at this place of an HGETALL reply (`Shape::read`'s `order`).
const ELSEWHERE: usize = usize::MAX;

impl Shape {
    pub(crate) fn new(fields: Vec<Vec<u8>>, whole: bool) -> Self {
        let count = fields.len();
        let index = fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i))
            .collect();
        Shape {
            whole,
            count,
            fields,
            index,
        }
    }

    /// The reply at `pos` (complete, per `resp_scan`; RESP2 or RESP3): its values in field
    /// order into `slots` (None for none), or its message when it is an error reply; and
    /// the position after it.
    ///
    /// `order` remembers, per place in an HGETALL reply, which field was there: the hashes
    /// one job wrote list their fields in one order, so the next reply's field at that
    /// place is compared with it before the field is looked up.
    pub(crate) fn read<'a>(
        &self,
        buf: &'a [u8],
        mut pos: usize,
        slots: &mut Vec<Option<&'a [u8]>>,
        order: &mut Vec<usize>,
    ) -> Resp<(Option<&'a [u8]>, usize)> {
        const CUT: Protocol = Protocol("a reply is cut short");
        match buf.get(pos) {
            Some(b'-') => {
                let (line, next) = resp_line(buf, pos + 1)?.ok_or(CUT)?;
                return Ok((Some(line), next));
            }
            Some(b'*') | Some(b'%') => {}
            _ => return Err(Protocol("expected an array")),
        }
        // RESP3 answers HGETALL with a map: its length counts pairs, not elements
        let pairs = buf[pos] == b'%';
        let (n, next) = resp_len(buf, pos + 1)?.ok_or(CUT)?;
        let n = n.max(0) as usize * if pairs { 2 } else { 1 };
        pos = next;
        slots.clear();
        slots.resize(self.count, None);
        if self.whole {
            for place in 0..n / 2 {
                let (field, after) = resp_bulk(buf, pos)?;
                let (value, after) = resp_bulk(buf, after)?;
                pos = after;
                let field = match field {
                    Some(field) => field,
                    None => continue,
                };
                // (another plan's order may be in `order`: compared, never trusted)
                let seen = order.get(place).copied().unwrap_or(ELSEWHERE);
                let i = if self
                    .fields
                    .get(seen)
                    .map_or(false, |f| same_field(f, field))
                {
                    seen
                } else {
                    let i = self.index.get(field).copied().unwrap_or(ELSEWHERE);
                    if order.len() <= place {
                        order.resize(place + 1, ELSEWHERE);
                    }
                    order[place] = i;
                    i
                };
                if i != ELSEWHERE {
                    slots[i] = value;
                }
            }
        } else {
            if n != self.count {
                return Err(Protocol("HMGET reply length"));
            }
            for slot in slots.iter_mut() {
                let (value, after) = resp_bulk(buf, pos)?;
                *slot = value;
                pos = after;
            }
        }
        Ok((None, pos))
    }
}

/// What one read asks for: the fields, in the order the loader wants their values, and
/// whether the command was an HGETALL (field/value pairs in the hash's order) or an HMGET
/// (values in field order).
#[pyclass(frozen, module = "feature_store._native")]
struct ReadPlan {
    shape: Shape,
}

#[pymethods]
impl ReadPlan {
    #[new]
    fn new(fields: Vec<Vec<u8>>, whole: bool) -> Self {
        ReadPlan {
            shape: Shape::new(fields, whole),
        }
    }
}

/// The replies in `buf` (complete, per `resp_scan`; RESP2 or RESP3), one per plan: the read's values
/// packed in field order (as `answers.pack` packs them), or an error reply's message (str).
#[pyfunction]
fn resp_split<'py>(
    py: Python<'py>,
    buf: &[u8],
    plans: Vec<PyRef<'py, ReadPlan>>,
) -> PyResult<Vec<PyObject>> {
    let mut out = Vec::with_capacity(plans.len());
    let mut pos = 0;
    let mut slots: Vec<Option<&[u8]>> = Vec::new();
    let mut order = Vec::new();
    for plan in &plans {
        let (error, next) = plan.shape.read(buf, pos, &mut slots, &mut order)?;
        pos = next;
        if let Some(message) = error {
            out.push(
                String::from_utf8_lossy(message)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            );
            continue;
        }
        let size: usize = slots.iter().map(|v| 3 + v.map_or(0, <[u8]>::len)).sum();
        let mut packed = Vec::with_capacity(size);
        for &value in &slots {
            pack_value(&mut packed, value);
        }
        out.push(PyBytes::new(py, &packed).into_any().unbind());
    }
    Ok(out)
}

// --- REST answers ----------------------------------------------------------------------

/// A group's age in an answer at `now` (unix seconds): None without a write time, and
/// never negative (a write time ahead of this clock is age 0).
pub(crate) fn age_at(written_at: Option<i64>, now: i64) -> Option<i64> {
    written_at.map(|w| (now - w).max(0))
}

/// A group's age in an answer (`age_at`) and whether its values are stale: served from an
/// expired entry because Redis failed (`served_stale`), or written more than `max_age`
/// ago.
pub(crate) fn age_of(
    written_at: Option<i64>,
    served_stale: bool,
    now: i64,
    max_age: Option<i64>,
) -> (Option<i64>, bool) {
    let age = age_at(written_at, now);
    let stale = served_stale || matches!((age, max_age), (Some(a), Some(m)) if a > m);
    (age, stale)
}

/// A value's status in a REST answer, from its present flag and its group's staleness.
pub(crate) fn status_json(present: u8, stale: bool) -> &'static [u8] {
    match (present, stale) {
        (0, _) => b"\"missing\"",
        (_, false) => b"\"present\"",
        (_, true) => b"\"stale\"",
    }
}

/// A value's status in a gRPC answer (PRESENT 1, MISSING 2, STALE 3; 0 for a flag that is
/// neither 0 nor 1).
pub(crate) fn status_code(present: u8, stale: bool) -> u8 {
    match (present, stale) {
        (0, _) => 2,
        (1, false) => 1,
        (1, true) => 3,
        _ => 0,
    }
}

fn statuses_json(out: &mut Vec<u8>, present: &[u8], stale: bool) {
    out.push(b'[');
    for (i, &p) in present.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(status_json(p, stale));
    }
    out.push(b']');
}

/// The rows of a gRPC answer for all of one group's features: per entity a
/// `GetFeaturesResponse.rows` record (field 3) of a `FeatureRow` holding the id, the
/// entry's values records (`wire`, made before the call by `wire.entry_values`, or here
/// when the entry does not keep them), the packed statuses and the group's age. `rows` is
/// as for `rest_rows`. The reference is the per-row loop of `feature_store.serving.grpc_server.FeatureServicer.answer` (`serving/wire.py`).
#[pyfunction]
#[pyo3(signature = (ids, rows, now, max_age, group))]
fn grpc_rows<'py>(
    py: Python<'py>,
    ids: &Bound<'py, PyList>,
    rows: &Bound<'py, PyList>,
    now: i64,
    max_age: Option<i64>,
    group: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(rows.len() * 1200);
    let mut row = Vec::with_capacity(1200);
    for (id, item) in ids.iter().zip(rows.iter()) {
        let (entry, served_stale): (Bound<'py, PyAny>, bool) = item.get_item(0)?.extract()?;
        let written_at: Option<i64> = entry.getattr(pyo3::intern!(py, "written_at"))?.extract()?;
        let mut wire = entry.getattr(pyo3::intern!(py, "wire"))?;
        let present = entry.getattr(pyo3::intern!(py, "present"))?;
        if wire.is_none() {
            // not kept (a compact cache): made from the packed values, as `entry_values` does
            let raw = entry.getattr(pyo3::intern!(py, "raw"))?;
            wire = if raw.is_none() {
                let count = present.downcast::<PyBytes>()?.as_bytes().len();
                PyBytes::new(py, &MISSING_VALUE.repeat(count)).into_any()
            } else {
                entry
                    .getattr(pyo3::intern!(py, "fmt"))?
                    .call_method1("proto", (raw,))?
            };
        }
        let int_id = id.extract::<i64>().ok();
        let text = match int_id {
            Some(_) => "",
            None => id.downcast::<pyo3::types::PyString>()?.to_str()?,
        };
        write_grpc_row(
            &mut out,
            &mut row,
            match int_id {
                Some(n) => GrpcId::Int(n),
                None => GrpcId::Str(text),
            },
            wire.downcast::<PyBytes>()?.as_bytes(),
            present.downcast::<PyBytes>()?.as_bytes(),
            written_at,
            served_stale,
            now,
            max_age,
            group,
        );
    }
    Ok(PyBytes::new(py, &out))
}

pub(crate) enum GrpcId<'a> {
    Int(i64),
    Str(&'a str),
}

/// One `GetFeaturesResponse.rows` record (field 3) of a whole-group answer: a `FeatureRow`
/// of the id, the entry's values records (`wire`), the packed statuses and the group's age
/// (`feature_store.serving.grpc_server._answer_rows`). `row` is scratch space.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_grpc_row(
    out: &mut Vec<u8>,
    row: &mut Vec<u8>,
    id: GrpcId<'_>,
    wire: &[u8],
    present: &[u8],
    written_at: Option<i64>,
    served_stale: bool,
    now: i64,
    max_age: Option<i64>,
    group: &[u8],
) {
    let (age, stale) = age_of(written_at, served_stale, now, max_age);
    row.clear();
    grpc_id(row, id);
    row.extend_from_slice(wire);
    // FeatureRow.statuses = 3, packed: PRESENT 1, MISSING 2, STALE 3
    row.push(0x1A);
    put_varint(row, present.len() as u64);
    row.extend(present.iter().map(|&p| status_code(p, stale)));
    if let Some(age) = age {
        grpc_age(row, group, age);
    }
    out.push(0x1A);
    put_varint(out, row.len() as u64);
    out.extend_from_slice(row);
}

/// `FeatureRow.id` = 1, an EntityId: int_id = 1 (varint) or string_id = 2.
pub(crate) fn grpc_id(row: &mut Vec<u8>, id: GrpcId<'_>) {
    match id {
        GrpcId::Int(n) => {
            row.extend_from_slice(&[0x0A, 1 + varint_len(n as u64) as u8, 0x08]);
            put_varint(row, n as u64);
        }
        GrpcId::Str(text) => nested(row, 0x0A, 0x12, text.as_bytes()),
    }
}

/// One `FeatureRow.ages` (= 4) map entry: the group's name (key = 1) and its age (value = 2).
pub(crate) fn grpc_age(row: &mut Vec<u8>, group: &[u8], age: i64) {
    let (key, value) = (group.len() as u64, age as u64);
    row.push(0x22);
    put_varint(
        row,
        1 + varint_len(key) as u64 + key + 1 + varint_len(value) as u64,
    );
    row.push(0x0A);
    put_varint(row, key);
    row.extend_from_slice(group);
    row.push(0x10);
    put_varint(row, value);
}

/// One row of a whole-group REST answer: `{"id":..,"values":..,"statuses":..,"ages":{group:age}}`
/// (`feature_store.serving.rest_api._whole_group_rows`). `served_stale`: answered from an
/// expired entry because Redis failed; values written more than `max_age` ago are stale too.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_row(
    out: &mut Vec<u8>,
    id: impl FnOnce(&mut Vec<u8>),
    values: &[u8],
    present: &[u8],
    written_at: Option<i64>,
    served_stale: bool,
    now: i64,
    max_age: Option<i64>,
    group_json: &[u8],
) {
    let (age, stale) = age_of(written_at, served_stale, now, max_age);
    out.extend_from_slice(b"{\"id\":");
    id(out);
    out.extend_from_slice(b",\"values\":");
    out.extend_from_slice(values);
    out.extend_from_slice(b",\"statuses\":");
    statuses_json(out, present, stale);
    out.extend_from_slice(b",\"ages\":{");
    json_age(out, group_json, age);
    out.extend_from_slice(b"}}");
}

/// One group's entry in a row's "ages": its name (as JSON) and its age, null where unknown.
pub(crate) fn json_age(out: &mut Vec<u8>, group_json: &[u8], age: Option<i64>) {
    out.extend_from_slice(group_json);
    out.push(b':');
    match age {
        Some(a) => json_i64(out, a),
        None => out.extend_from_slice(b"null"),
    }
}

/// An entity id as JSON: an int's digits (as `b"%d"`), a string quoted (as orjson).
fn json_id(out: &mut Vec<u8>, id: &Bound<'_, PyAny>) -> PyResult<()> {
    match id.extract::<i64>() {
        Ok(n) => json_i64(out, n),
        Err(_) => json_str(out, id.downcast::<pyo3::types::PyString>()?.to_str()?),
    }
    Ok(())
}

/// The rows of a REST answer for all of one group's features, joined by commas: per
/// entity `{"id":..,"values":..,"statuses":..,"ages":{group:age}}`. `rows` holds each
/// entity's one `(entry, served_stale)`; the values are the entry's JSON, made at load.
/// The reference is `feature_store.serving.app._whole_group_rows`.
#[pyfunction]
#[pyo3(signature = (ids, rows, now, max_age, group_json))]
fn rest_rows<'py>(
    py: Python<'py>,
    ids: &Bound<'py, PyList>,
    rows: &Bound<'py, PyList>,
    now: i64,
    max_age: Option<i64>,
    group_json: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(rows.len() * 1600);
    for (i, (id, row)) in ids.iter().zip(rows.iter()).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let (entry, served_stale): (Bound<'py, PyAny>, bool) = row.get_item(0)?.extract()?;
        let mut json = entry.getattr(pyo3::intern!(py, "json"))?;
        if json.is_none() {
            // loaded for a gRPC answer (spec.GroupSpec.entry), or in a compact cache: made
            // from the packed values
            let raw = entry.getattr(pyo3::intern!(py, "raw"))?;
            json = entry
                .getattr(pyo3::intern!(py, "fmt"))?
                .call_method1("json", (raw,))?;
        }
        let present = entry.getattr(pyo3::intern!(py, "present"))?;
        let written_at: Option<i64> = entry.getattr(pyo3::intern!(py, "written_at"))?.extract()?;
        let int_id = id.extract::<i64>().ok();
        let text = match int_id {
            Some(_) => "",
            None => id.downcast::<pyo3::types::PyString>()?.to_str()?,
        };
        write_row(
            &mut out,
            |o| match int_id {
                Some(n) => json_i64(o, n),
                None => json_str(o, text),
            },
            json.downcast::<PyBytes>()?.as_bytes(),
            present.downcast::<PyBytes>()?.as_bytes(),
            written_at,
            served_stale,
            now,
            max_age,
            group_json,
        );
    }
    Ok(PyBytes::new(py, &out))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GroupCodec>()?;
    m.add_class::<ReadPlan>()?;
    m.add_class::<front::grpc::GrpcFront>()?;
    m.add_class::<front::grpc::GrpcCall>()?;
    m.add_class::<front::rest::RestFront>()?;
    m.add_class::<front::rest::RestCall>()?;
    m.add_class::<hits::HitCache>()?;
    m.add_class::<front::redis::FrontRedis>()?;
    m.add_function(wrap_pyfunction!(front::auth::key_role, m)?)?;
    m.add_function(wrap_pyfunction!(resp_scan, m)?)?;
    m.add_function(wrap_pyfunction!(resp_split, m)?)?;
    m.add_function(wrap_pyfunction!(rest_rows, m)?)?;
    m.add_function(wrap_pyfunction!(grpc_rows, m)?)?;
    m.add_function(wrap_pyfunction!(encode_float32_many, m)?)?;
    m.add_function(wrap_pyfunction!(float32_json, m)?)?;
    m.add_function(wrap_pyfunction!(float64_json, m)?)?;
    Ok(())
}
