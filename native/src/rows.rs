//! An entity's row of an answer: its values, their statuses (present, missing, stale) and
//! its groups' ages, as REST's JSON and as gRPC's `FeatureRow` records.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::codecs::{json_i64, json_str, nested, put_varint, varint_len, MISSING_VALUE};

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
/// as for `rest_rows`. The reference is the per-row loop of
/// `feature_store.serving.api.grpc_server.FeatureServicer.answer` (`serving/api/wire.py`).
#[pyfunction]
#[pyo3(signature = (ids, rows, now, max_age, group))]
pub(crate) fn grpc_rows<'py>(
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
/// (`feature_store.serving.api.grpc_server._answer_rows`). `row` is scratch space.
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
/// (`feature_store.serving.api.rest_api._whole_group_rows`). `served_stale`: answered from an
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
pub(crate) fn json_id(out: &mut Vec<u8>, id: &Bound<'_, PyAny>) -> PyResult<()> {
    match id.extract::<i64>() {
        Ok(n) => json_i64(out, n),
        Err(_) => json_str(out, id.downcast::<pyo3::types::PyString>()?.to_str()?),
    }
    Ok(())
}

/// The rows of a REST answer for all of one group's features, joined by commas: per
/// entity `{"id":..,"values":..,"statuses":..,"ages":{group:age}}`. `rows` holds each
/// entity's one `(entry, served_stale)`; the values are the entry's JSON, made at load.
/// The reference is `feature_store.serving.api.rest_api._whole_group_rows`.
#[pyfunction]
#[pyo3(signature = (ids, rows, now, max_age, group_json))]
pub(crate) fn rest_rows<'py>(
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
