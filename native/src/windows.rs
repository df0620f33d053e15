//! Window aggregations answered from an entity's stored tiles at the time of a read: the
//! reference is `feature_store/windows.py` (`decode_state` and `answer`), and
//! `tests/unit/test_native_windows.py` asserts equal answers.
//!
//! The state is `<version>|` then, little-endian: format (u8, 1), the newest event (i64
//! ms), the offsets applied (u16 count, then i32 partition and i64 offset each), the tiles
//! (u32 count; each: index i64, events u32, newest event i64 ms, fields u8, one byte per
//! field of the parts present (1 stats, 2 min and max, 4 newest values), then per field
//! its parts: values u32 and sum f64; min f64 and max f64; u16 count and that many
//! (time i64, value i64 or f64) newest first). Tiles come in index order.
//!
//! Each aggregate's answer is written as a plain group's stored value (decimal int text,
//! float64 text, a Snappy IntList, a FloatList), so the group's codecs and answer writers
//! take it from there unchanged.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::codecs::{json_i64, put_varint, FLOAT_LIST, INT_LIST};

pub const COUNT: u8 = 0;
pub const SUM: u8 = 1;
pub const MEAN: u8 = 2;
pub const MIN: u8 = 3;
pub const MAX: u8 = 4;
pub const LAST_N: u8 = 5;

const STATS: u8 = 1;
const LOHI: u8 = 2;
const LAST: u8 = 4;
const FORMAT: u8 = 1;

/// One aggregate: its function, the field it reads (None: count counts events), its
/// window, its last_n depth, and the type of its answer (`TYPE_CODES`).
#[derive(Clone, Debug)]
pub struct Aggregate {
    pub function: u8,
    pub field: Option<usize>,
    pub window_ms: i64,
    pub n: usize,
    pub type_code: u8,
}

/// An aggregated group's layout, as `windows.Layout` has it.
#[derive(Clone, Debug)]
pub struct WindowSpec {
    pub tile_ms: i64,
    pub longest_ms: i64,
    pub ints: Vec<bool>,
    pub aggregates: Vec<Aggregate>,
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.data.get(self.at..self.at + n)?;
        self.at += n;
        Some(out)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Every aggregate's answer as stored bytes (None: no value), and the newest event in the
/// longest window (ms).
pub type Answered = (Vec<Option<Vec<u8>>>, Option<i64>);

/// What one aggregate gathers over the tiles in its window.
#[derive(Clone)]
struct Gathered<'a> {
    count: i64,
    sum: f64,
    lo: Option<f64>,
    hi: Option<f64>,
    /// each tile's newest values (their bytes), oldest tile first
    lasts: Vec<(&'a [u8], bool)>,
}

/// Every aggregate's answer at `now_ms` as stored bytes (None: no value), and the newest
/// event in the longest window. None where the state is not one this reads (Python
/// answers, and names the fault).
pub fn answer(spec: &WindowSpec, data: &[u8], now_ms: i64) -> Option<Answered> {
    let bar = data.iter().position(|&b| b == b'|')?;
    if bar == 0 || !data[..bar].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut r = Reader {
        data: &data[bar + 1..],
        at: 0,
    };
    if r.u8()? != FORMAT {
        return None;
    }
    r.i64()?;
    let offsets = r.u16()? as usize;
    r.take(12 * offsets)?;
    let tiles = r.u32()?;
    let tile_ms = spec.tile_ms;
    let current = now_ms.div_euclid(tile_ms);
    let firsts: Vec<i64> = spec
        .aggregates
        .iter()
        .map(|a| (now_ms - a.window_ms).div_euclid(tile_ms))
        .collect();
    let longest = (now_ms - spec.longest_ms).div_euclid(tile_ms);
    let width = spec.ints.len();
    let mut gathered = vec![
        Gathered {
            count: 0,
            sum: 0.0,
            lo: None,
            hi: None,
            lasts: Vec::new()
        };
        spec.aggregates.len()
    ];
    let mut newest: Option<i64> = None;
    // each field's parts in the tile being read
    let mut stats: Vec<Option<(u32, f64)>> = vec![None; width];
    let mut lohi: Vec<Option<(f64, f64)>> = vec![None; width];
    let mut lasts: Vec<Option<&[u8]>> = vec![None; width];
    for _ in 0..tiles {
        let index = r.i64()?;
        let count = r.u32()?;
        let tile_newest = r.i64()?;
        if r.u8()? as usize != width {
            return None;
        }
        let masks = r.take(width)?;
        for (j, &mask) in masks.iter().enumerate() {
            stats[j] = if mask & STATS != 0 {
                Some((r.u32()?, r.f64()?))
            } else {
                None
            };
            lohi[j] = if mask & LOHI != 0 {
                Some((r.f64()?, r.f64()?))
            } else {
                None
            };
            lasts[j] = if mask & LAST != 0 {
                let k = r.u16()? as usize;
                Some(r.take(16 * k)?)
            } else {
                None
            };
        }
        if index > current {
            continue; // later tiles: past the read's current one (tiles are in order)
        }
        if index > longest && newest.map_or(true, |n| tile_newest > n) {
            newest = Some(tile_newest);
        }
        for (i, a) in spec.aggregates.iter().enumerate() {
            if index <= firsts[i] {
                continue;
            }
            let g = &mut gathered[i];
            let j = match a.field {
                None => {
                    g.count += i64::from(count);
                    continue;
                }
                Some(j) => j,
            };
            match a.function {
                MIN | MAX => {
                    if let Some((lo, hi)) = lohi[j] {
                        if a.function == MIN {
                            g.lo = Some(g.lo.map_or(lo, |x| if lo < x { lo } else { x }));
                        } else {
                            g.hi = Some(g.hi.map_or(hi, |x| if hi > x { hi } else { x }));
                        }
                    }
                }
                LAST_N => {
                    if let Some(last) = lasts[j] {
                        if !last.is_empty() {
                            g.lasts.push((last, spec.ints[j]));
                        }
                    }
                }
                _ => {
                    if let Some((n, sum)) = stats[j] {
                        if n > 0 {
                            g.count += i64::from(n);
                            g.sum += sum;
                        }
                    }
                }
            }
        }
    }
    if r.at != r.data.len() {
        return None;
    }
    let values = spec
        .aggregates
        .iter()
        .zip(&gathered)
        .map(|(a, g)| stored(a, g))
        .collect();
    Some((values, newest))
}

/// An aggregate's answer as a plain group stores a value of its type.
fn stored(a: &Aggregate, g: &Gathered<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match a.function {
        COUNT => json_i64(&mut out, g.count),
        SUM => float_text(&mut out, g.sum),
        MEAN => {
            if g.count == 0 {
                return None;
            }
            float_text(&mut out, g.sum / g.count as f64)
        }
        MIN => float_text(&mut out, g.lo?),
        MAX => float_text(&mut out, g.hi?),
        _ => {
            // the newest tile's values first, each tile's newest first
            let mut picked: Vec<(&[u8], bool)> = Vec::with_capacity(a.n);
            'tiles: for (last, int) in g.lasts.iter().rev() {
                for pair in last.chunks_exact(16) {
                    if picked.len() == a.n {
                        break 'tiles;
                    }
                    picked.push((&pair[8..], *int));
                }
            }
            if picked.is_empty() {
                return None;
            }
            let mut payload = Vec::with_capacity(picked.len() * 9);
            for (bytes, int) in picked {
                let raw: [u8; 8] = bytes.try_into().ok()?;
                if a.type_code == INT_LIST {
                    let v = if int {
                        i64::from_le_bytes(raw)
                    } else {
                        f64::from_le_bytes(raw) as i64
                    };
                    put_varint(&mut payload, v as u64);
                } else if a.type_code == FLOAT_LIST {
                    let v = if int {
                        i64::from_le_bytes(raw) as f64
                    } else {
                        f64::from_le_bytes(raw)
                    };
                    payload.extend_from_slice(&(v as f32).to_le_bytes());
                } else {
                    return None;
                }
            }
            let mut message = vec![0x0A];
            put_varint(&mut message, payload.len() as u64);
            message.extend_from_slice(&payload);
            if a.type_code == FLOAT_LIST {
                return Some(message);
            }
            return snap::raw::Encoder::new().compress_vec(&message).ok();
        }
    }
    Some(out)
}

/// A float64 as text Python's `float()` reads back to the same value.
fn float_text(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(x).as_bytes());
    } else if x.is_nan() {
        out.extend_from_slice(b"nan");
    } else {
        out.extend_from_slice(if x > 0.0 { b"inf" } else { b"-inf" });
    }
}

impl WindowSpec {
    /// From Python's description: (tile ms, longest ms, ints per field, aggregates as
    /// (function, field or -1, window ms, n, type code)).
    pub fn from_py(
        tile_ms: i64,
        longest_ms: i64,
        ints: Vec<bool>,
        aggregates: Vec<(u8, i64, i64, usize, u8)>,
    ) -> PyResult<Self> {
        if tile_ms <= 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a tile is at least 1 ms",
            ));
        }
        let fields = ints.len();
        let aggregates = aggregates
            .into_iter()
            .map(|(function, field, window_ms, n, type_code)| {
                let field = usize::try_from(field).ok();
                if function > LAST_N || field.map_or(function != COUNT, |j| j >= fields) {
                    return Err(pyo3::exceptions::PyValueError::new_err("not an aggregate"));
                }
                Ok(Aggregate {
                    function,
                    field,
                    window_ms,
                    n,
                    type_code,
                })
            })
            .collect::<PyResult<_>>()?;
        Ok(WindowSpec {
            tile_ms,
            longest_ms,
            ints,
            aggregates,
        })
    }
}

/// `windows.answer` for Python: an L1 load's entry made natively.
#[pyclass(frozen, module = "feature_store._native")]
pub struct Windows {
    spec: WindowSpec,
}

#[pymethods]
impl Windows {
    #[new]
    fn new(
        tile_ms: i64,
        longest_ms: i64,
        ints: Vec<bool>,
        aggregates: Vec<(u8, i64, i64, usize, u8)>,
    ) -> PyResult<Self> {
        Ok(Windows {
            spec: WindowSpec::from_py(tile_ms, longest_ms, ints, aggregates)?,
        })
    }

    /// Each aggregate's stored bytes at `now_ms` (None: no value), and the newest event in
    /// the longest window (ms); ValueError where Python must read the state.
    fn answer<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        now_ms: i64,
    ) -> PyResult<(Bound<'py, PyList>, Option<i64>)> {
        let (values, newest) = answer(&self.spec, data, now_ms).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err("not a window state read here")
        })?;
        let items = values
            .iter()
            .map(|v| v.as_deref().map(|b| PyBytes::new(py, b)));
        Ok((PyList::new(py, items)?, newest))
    }
}
