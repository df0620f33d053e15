//! RESP2 replies, straight from the socket's bytes: a pipelined read's replies scanned and
//! split per entity (`Shape`: HMGET of some fields, or HGETALL matched to the group's
//! fields), without a Python object per value.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::codecs::pack_value;

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
pub(crate) type Resp<T> = Result<T, Protocol>;

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
pub(crate) fn resp_scan(buf: &[u8], mut pos: usize, count: usize) -> PyResult<(usize, usize)> {
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
pub(crate) struct ReadPlan {
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
pub(crate) fn resp_split<'py>(
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
