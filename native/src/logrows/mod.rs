//! The serving log's rows, column by column, from the answers' bytes: REST's JSON and
//! gRPC's protobuf read straight into Arrow's buffers (values, validity bitmaps, offsets),
//! which Python wraps as arrays without a Python object per value.
//!
//! The reference is `feature_store/serving/feature_log/rows.py` (`Part`, `AnswerRows`); the property
//! tests in `tests/unit/test_native_logrows.py` assert the same tables. An answer this code
//! does not read (a form it was not written for) raises `ValueError` and leaves the columns
//! as they were; the caller reads that answer with the reference.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::codecs::{read_varint, Fallback, Native};

mod json;
mod wire;

use json::{json_value, whole, Json};
pub use wire::grpc_head;
use wire::{len_slice, proto_value, skip_field, tag};

// the column kinds, as Python numbers them (feature_log/rows.py, NATIVE_KINDS)
const F64: u8 = 0;
const I64: u8 = 1;
const BOOL: u8 = 2;
const STR: u8 = 3;
const LIST_F32: u8 = 4;
const LIST_I64: u8 = 5;

// statuses, as gRPC's enum numbers them (and served.STATUSES)
const PRESENT: u8 = 1;
const MISSING: u8 = 2;
const STALE: u8 = 3;
const ERROR: u8 = 4;

/// One column: validity per row, and the values of its kind.
#[derive(Default)]
struct Col {
    kind: u8,
    valid: Vec<bool>,
    f64s: Vec<f64>,
    i64s: Vec<i64>,
    f32s: Vec<f32>,
    bytes: Vec<u8>,
    offsets: Vec<i32>, // strings and lists: one per row, after the first 0
}

impl Col {
    fn new(kind: u8) -> Self {
        Col {
            kind,
            offsets: vec![0],
            ..Col::default()
        }
    }

    fn null(&mut self) {
        self.valid.push(false);
        match self.kind {
            F64 => self.f64s.push(0.0),
            I64 | BOOL => self.i64s.push(0),
            _ => self.end(),
        }
    }

    /// Close a string's or a list's row.
    fn end(&mut self) {
        let end = match self.kind {
            STR => self.bytes.len(),
            LIST_F32 => self.f32s.len(),
            _ => self.i64s.len(),
        };
        self.offsets.push(end as i32);
    }

    fn truncate(&mut self, rows: usize) {
        self.valid.truncate(rows);
        match self.kind {
            F64 => self.f64s.truncate(rows),
            I64 | BOOL => self.i64s.truncate(rows),
            _ => {
                self.offsets.truncate(rows + 1);
                let end = self.offsets[rows] as usize;
                match self.kind {
                    STR => self.bytes.truncate(end),
                    LIST_F32 => self.f32s.truncate(end),
                    _ => self.i64s.truncate(end),
                }
            }
        }
    }
}

/// Rows of one form (an entity type and the features answered), as columns.
#[pyclass(module = "feature_store._native")]
pub struct LogColumns {
    kinds: Vec<u8>,
    group_names: Vec<String>, // as the answers' ages name them
    rows: usize,
    request_ids: Col,
    served_at: Vec<i64>,
    apis: Vec<u8>,
    sources: Vec<u8>,
    ids: Col,
    values: Vec<Col>,
    statuses: Vec<Vec<u8>>,
    stamps: Vec<Col>, // per group: its event time (unix seconds)
}

/// A column as Python takes it: its kind, validity (Arrow's bitmap), offsets (i32 LE)
/// and values (LE: f64, i64, f32; strings' UTF-8; bools as Arrow's bitmap).
type Buffers<'py> = (
    u8,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

#[pymethods]
impl LogColumns {
    /// `kinds`: per feature answered, its column kind; `group_names`: the groups whose
    /// event times the rows carry, as the answers' ages name them; `int_ids`: the entity
    /// type's ids are integers.
    #[new]
    fn new(kinds: Vec<u8>, group_names: Vec<String>, int_ids: bool) -> PyResult<Self> {
        if kinds.iter().any(|&k| k > LIST_I64) {
            return Err(PyValueError::new_err("an unknown column kind"));
        }
        Ok(LogColumns {
            values: kinds.iter().map(|&k| Col::new(k)).collect(),
            statuses: kinds.iter().map(|_| Vec::new()).collect(),
            stamps: group_names.iter().map(|_| Col::new(I64)).collect(),
            kinds,
            group_names,
            rows: 0,
            request_ids: Col::new(STR),
            served_at: Vec::new(),
            apis: Vec::new(),
            sources: Vec::new(),
            ids: Col::new(if int_ids { I64 } else { STR }),
        })
    }

    #[getter]
    fn rows(&self) -> usize {
        self.rows
    }

    /// A REST answer's rows (`POST /v1/features/get`); `sources`: one per row, or one for
    /// all. Raises ValueError (nothing added) for an answer it does not read.
    #[allow(clippy::too_many_arguments)]
    fn add_rest(
        &mut self,
        answer: &[u8],
        request_id: &str,
        served_at_ms: i64,
        now: i64,
        api: u8,
        sources: &[u8],
    ) -> PyResult<usize> {
        let before = self.rows;
        let added = self.rest(answer, now);
        self.commit(before, added, request_id, served_at_ms, api, sources)
    }

    /// A gRPC answer's rows (GetFeaturesResponse), as `add_rest`.
    #[allow(clippy::too_many_arguments)]
    fn add_grpc(
        &mut self,
        answer: &[u8],
        request_id: &str,
        served_at_ms: i64,
        now: i64,
        api: u8,
        sources: &[u8],
    ) -> PyResult<usize> {
        let before = self.rows;
        let added = self.grpc(answer, now);
        self.commit(before, added, request_id, served_at_ms, api, sources)
    }

    /// The columns: request ids, served at, apis, sources, ids, then per feature its
    /// values and its statuses (one byte per row), then per group its event times.
    #[allow(clippy::type_complexity)]
    fn finish<'py>(
        &self,
        py: Python<'py>,
    ) -> (
        Buffers<'py>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Buffers<'py>,
        Vec<(Buffers<'py>, Bound<'py, PyBytes>)>,
        Vec<Buffers<'py>>,
    ) {
        let served: Vec<u8> = self
            .served_at
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        (
            buffers(py, &self.request_ids),
            PyBytes::new(py, &served),
            PyBytes::new(py, &self.apis),
            PyBytes::new(py, &self.sources),
            buffers(py, &self.ids),
            self.values
                .iter()
                .zip(&self.statuses)
                .map(|(c, s)| (buffers(py, c), PyBytes::new(py, s)))
                .collect(),
            self.stamps.iter().map(|c| buffers(py, c)).collect(),
        )
    }
}

/// Bits, least significant first: Arrow's validity and boolean layout.
fn bitmap(bits: impl Iterator<Item = bool>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, bit) in bits.enumerate() {
        if i % 8 == 0 {
            out.push(0);
        }
        if bit {
            *out.last_mut().unwrap_or(&mut 0) |= 1 << (i % 8);
        }
    }
    out
}

fn buffers<'py>(py: Python<'py>, col: &Col) -> Buffers<'py> {
    let valid = bitmap(col.valid.iter().copied());
    let offsets: Vec<u8> = if matches!(col.kind, STR | LIST_F32 | LIST_I64) {
        col.offsets.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        Vec::new()
    };
    let values: Vec<u8> = match col.kind {
        F64 => col.f64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
        BOOL => bitmap(col.i64s.iter().map(|&v| v != 0)),
        STR => col.bytes.clone(),
        LIST_F32 => col.f32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => col.i64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    (
        col.kind,
        PyBytes::new(py, &valid),
        PyBytes::new(py, &offsets),
        PyBytes::new(py, &values),
    )
}

impl LogColumns {
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        before: usize,
        added: Native<usize>,
        request_id: &str,
        served_at_ms: i64,
        api: u8,
        sources: &[u8],
    ) -> PyResult<usize> {
        let n = match added {
            Ok(n) if sources.len() == 1 || sources.len() == n => n,
            _ => {
                self.rollback(before);
                return Err(PyValueError::new_err("an answer this reader does not read"));
            }
        };
        for i in 0..n {
            self.request_ids.valid.push(true);
            self.request_ids
                .bytes
                .extend_from_slice(request_id.as_bytes());
            self.request_ids.end();
            self.served_at.push(served_at_ms);
            self.apis.push(api);
            self.sources.push(if sources.len() == 1 {
                sources[0]
            } else {
                sources[i]
            });
        }
        self.rows = before + n;
        Ok(n)
    }

    fn rollback(&mut self, rows: usize) {
        self.ids.truncate(rows);
        for c in self.values.iter_mut().chain(self.stamps.iter_mut()) {
            c.truncate(rows);
        }
        for s in &mut self.statuses {
            s.truncate(rows);
        }
    }

    fn rest(&mut self, answer: &[u8], now: i64) -> Native<usize> {
        let mut j = Json {
            data: answer,
            pos: 0,
        };
        let mut added = 0;
        j.byte(b'{')?;
        loop {
            let key = j.key()?;
            if key == b"results" {
                j.byte(b'[')?;
                if !j.ends(b']') {
                    loop {
                        self.rest_row(&mut j, now)?;
                        added += 1;
                        if j.close(b']')? {
                            break;
                        }
                    }
                }
            } else {
                j.skip()?;
            }
            if j.close(b'}')? {
                return Ok(added);
            }
        }
    }

    fn rest_row(&mut self, j: &mut Json<'_>, now: i64) -> Native<()> {
        let (mut id, mut values, mut statuses, mut ages) = (false, false, false, false);
        let width = self.kinds.len();
        j.byte(b'{')?;
        loop {
            match j.key()? {
                b"id" if !id => {
                    id = true;
                    if self.ids.kind == I64 {
                        let v = j.number()?;
                        self.ids.i64s.push(whole(v)?);
                    } else {
                        j.string_into(&mut self.ids.bytes)?;
                        self.ids.end();
                    }
                    self.ids.valid.push(true);
                }
                b"values" if !values => {
                    values = true;
                    j.byte(b'[')?;
                    for f in 0..width {
                        if f > 0 {
                            j.byte(b',')?;
                        }
                        let col = &mut self.values[f];
                        json_value(j, col)?;
                    }
                    j.byte(b']')?;
                }
                b"statuses" if !statuses => {
                    statuses = true;
                    j.byte(b'[')?;
                    for f in 0..width {
                        if f > 0 {
                            j.byte(b',')?;
                        }
                        let code = match j.string_slice()? {
                            b"present" => PRESENT,
                            b"missing" => MISSING,
                            b"stale" => STALE,
                            b"error" => ERROR,
                            _ => return Err(Fallback),
                        };
                        self.statuses[f].push(code);
                    }
                    j.byte(b']')?;
                }
                b"ages" if !ages => {
                    ages = true;
                    let mut seen = vec![None; self.group_names.len()];
                    j.byte(b'{')?;
                    if !j.ends(b'}') {
                        loop {
                            let name = j.string_slice()?;
                            j.byte(b':')?;
                            let age = if j.literal(b"null") {
                                None
                            } else {
                                Some(whole(j.number()?)?)
                            };
                            if let Some(g) =
                                self.group_names.iter().position(|n| n.as_bytes() == name)
                            {
                                seen[g] = age;
                            }
                            if j.close(b'}')? {
                                break;
                            }
                        }
                    }
                    for (col, age) in self.stamps.iter_mut().zip(seen) {
                        match age {
                            Some(a) => {
                                col.valid.push(true);
                                col.i64s.push(now - a);
                            }
                            None => col.null(),
                        }
                    }
                }
                _ => return Err(Fallback), // another field, or one twice
            }
            if j.close(b'}')? {
                break;
            }
        }
        if id && values && statuses && ages {
            Ok(())
        } else {
            Err(Fallback)
        }
    }

    fn grpc(&mut self, answer: &[u8], now: i64) -> Native<usize> {
        let mut pos = 0;
        let mut added = 0;
        while pos < answer.len() {
            let (field, wire) = tag(answer, &mut pos)?;
            match (field, wire) {
                (3, 2) => {
                    let row = len_slice(answer, &mut pos)?;
                    self.grpc_row(row, now)?;
                    added += 1;
                }
                _ => skip_field(answer, &mut pos, wire)?,
            }
        }
        Ok(added)
    }

    fn grpc_row(&mut self, row: &[u8], now: i64) -> Native<()> {
        let width = self.kinds.len();
        let mut pos = 0;
        let (mut id, mut values, mut statuses) = (false, 0usize, 0usize);
        let mut ages = vec![None; self.group_names.len()];
        while pos < row.len() {
            let (field, wire) = tag(row, &mut pos)?;
            match (field, wire) {
                (1, 2) if !id => {
                    id = true;
                    let e = len_slice(row, &mut pos)?;
                    let mut p = 0;
                    let (f, w) = tag(e, &mut p)?;
                    match (f, w, self.ids.kind) {
                        (1, 0, I64) => self.ids.i64s.push(read_varint(e, &mut p)? as i64),
                        (2, 2, STR) => {
                            let s = len_slice(e, &mut p)?;
                            std::str::from_utf8(s).map_err(|_| Fallback)?;
                            self.ids.bytes.extend_from_slice(s);
                            self.ids.end();
                        }
                        _ => return Err(Fallback),
                    }
                    if p != e.len() {
                        return Err(Fallback);
                    }
                    self.ids.valid.push(true);
                }
                (2, 2) if values < width => {
                    let v = len_slice(row, &mut pos)?;
                    proto_value(v, &mut self.values[values])?;
                    values += 1;
                }
                (3, 2) => {
                    let packed = len_slice(row, &mut pos)?;
                    let mut p = 0;
                    while p < packed.len() {
                        if statuses >= width {
                            return Err(Fallback);
                        }
                        let code = read_varint(packed, &mut p)?;
                        self.statuses[statuses].push(if code <= 4 { code as u8 } else { 0 });
                        statuses += 1;
                    }
                }
                (3, 0) if statuses < width => {
                    let code = read_varint(row, &mut pos)?;
                    self.statuses[statuses].push(if code <= 4 { code as u8 } else { 0 });
                    statuses += 1;
                }
                (4, 2) => {
                    let entry = len_slice(row, &mut pos)?;
                    let (mut p, mut key, mut value) = (0, &b""[..], 0i64);
                    while p < entry.len() {
                        match tag(entry, &mut p)? {
                            (1, 2) => key = len_slice(entry, &mut p)?,
                            (2, 0) => value = read_varint(entry, &mut p)? as i64,
                            (_, w) => skip_field(entry, &mut p, w)?,
                        }
                    }
                    if let Some(g) = self.group_names.iter().position(|n| n.as_bytes() == key) {
                        ages[g] = Some(value);
                    }
                }
                _ => skip_field(row, &mut pos, wire)?,
            }
        }
        if !id || values != width || statuses != width {
            return Err(Fallback);
        }
        for (col, age) in self.stamps.iter_mut().zip(ages) {
            match age {
                Some(a) => {
                    col.valid.push(true);
                    col.i64s.push(now - a);
                }
                None => col.null(),
            }
        }
        Ok(())
    }
}
