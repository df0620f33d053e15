//! gRPC's answers read into the log's columns: the protobuf wire format of a
//! GetFeaturesResponse, field by field.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{Col, BOOL, F64, I64, LIST_F32, LIST_I64, STR};
use crate::codecs::{read_varint, Fallback, Native};

pub(super) fn proto_value(v: &[u8], col: &mut Col) -> Native<()> {
    if v.is_empty() {
        col.null();
        return Ok(());
    }
    let mut p = 0;
    let (field, wire) = tag(v, &mut p)?;
    match (field, wire, col.kind) {
        (1, 1, F64) => {
            let bytes = v.get(p..p + 8).ok_or(Fallback)?;
            let mut raw = [0u8; 8];
            raw.copy_from_slice(bytes);
            col.f64s.push(f64::from_le_bytes(raw));
            p += 8;
        }
        (2, 0, I64) => col.i64s.push(read_varint(v, &mut p)? as i64),
        (3, 0, BOOL) => col.i64s.push((read_varint(v, &mut p)? != 0) as i64),
        (4, 2, STR) => {
            let s = len_slice(v, &mut p)?;
            std::str::from_utf8(s).map_err(|_| Fallback)?;
            col.bytes.extend_from_slice(s);
            col.end();
        }
        (5, 2, LIST_F32) | (6, 2, LIST_I64) => {
            let list = len_slice(v, &mut p)?;
            let mut q = 0;
            while q < list.len() {
                match tag(list, &mut q)? {
                    (1, 2) => {
                        let packed = len_slice(list, &mut q)?;
                        if col.kind == LIST_F32 {
                            if packed.len() % 4 != 0 {
                                return Err(Fallback);
                            }
                            col.f32s.extend(
                                packed
                                    .chunks_exact(4)
                                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                            );
                        } else {
                            let mut r = 0;
                            while r < packed.len() {
                                col.i64s.push(read_varint(packed, &mut r)? as i64);
                            }
                        }
                    }
                    _ => return Err(Fallback),
                }
            }
            col.end();
        }
        _ => return Err(Fallback),
    }
    if p != v.len() {
        return Err(Fallback);
    }
    col.valid.push(true);
    Ok(())
}

/// Where a GetFeaturesResponse's rows start: its entity type and feature names before
/// them are its form (the serving log's key for it).
#[pyfunction]
pub fn grpc_head(answer: &[u8]) -> PyResult<usize> {
    let mut pos = 0;
    let fail = |_| PyValueError::new_err("not a GetFeaturesResponse");
    while pos < answer.len() {
        let start = pos;
        let (field, wire) = tag(answer, &mut pos).map_err(fail)?;
        if field != 1 && field != 2 {
            return Ok(start);
        }
        skip_field(answer, &mut pos, wire).map_err(fail)?;
    }
    Ok(answer.len())
}

pub(super) fn tag(data: &[u8], pos: &mut usize) -> Native<(u64, u8)> {
    let key = read_varint(data, pos)?;
    Ok((key >> 3, (key & 7) as u8))
}

pub(super) fn len_slice<'a>(data: &'a [u8], pos: &mut usize) -> Native<&'a [u8]> {
    let n = read_varint(data, pos)? as usize;
    let out = data
        .get(*pos..pos.checked_add(n).ok_or(Fallback)?)
        .ok_or(Fallback)?;
    *pos += n;
    Ok(out)
}

pub(super) fn skip_field(data: &[u8], pos: &mut usize, wire: u8) -> Native<()> {
    match wire {
        0 => {
            read_varint(data, pos)?;
        }
        1 => *pos += 8,
        2 => {
            len_slice(data, pos)?;
        }
        5 => *pos += 4,
        _ => return Err(Fallback),
    }
    if *pos > data.len() {
        return Err(Fallback);
    }
    Ok(())
}
