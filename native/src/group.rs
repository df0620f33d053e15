//! A feature group's values at once: `GroupCodec` turns one entity's stored values (a
//! reply, or the packed form the compact L1 keeps) into its answer bytes, present pattern
//! and Python values, and writes the rows and Feast's columns of picked features.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::codecs::{
    fallback, json_i64, json_value, pack_value, packed_values, proto_value, py_value, unpack,
    Native, Packed, MISSING_VALUE,
};
use crate::rows::{age_of, json_id, status_json};
use crate::time::unix_seconds;

/// One feature group's value types, and what the serving path makes of its stored values.
#[pyclass(frozen, module = "feature_store._native")]
pub(crate) struct GroupCodec {
    types: Vec<(u8, u32)>, // (type code, embedding dimension or 0)
}

/// How one stored value is written into an answer: `json_value` or `proto_value`.
pub(crate) type Writer = fn(&mut Vec<u8>, u8, u32, &[u8]) -> Native<()>;

pub(crate) type Loaded<'py> = (
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
        // (a match, not let-else: the crate builds with Rust 1.63)
        let freshness = match (values.len() == count, items.next()) {
            (true, Some(freshness)) => freshness,
            _ => {
                return Err(PyValueError::new_err(
                    "the read has fewer values than the group",
                ))
            }
        };
        let freshness = match freshness {
            None => None,
            Some(ts) => Some(match unix_seconds(ts) {
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
    /// `feature_store.serving.api.rest_api._picked_rows`.
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
    /// written without a Python object per value (`serving/api/feast_api.py`).
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
