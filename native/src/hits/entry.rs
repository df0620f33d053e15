//! One L1 entry (`Hit`, 144 bytes besides its key): the bytes objects of an entry Python
//! loaded, held without copies, or bytes of its own (an entry a front loaded), its write
//! time, expiry and refresh notice, and what Python's policy reads of it (`cost`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use once_cell::race::OnceBox;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::split::json_elements;

/// An entry's bytes: a Python bytes object held without a copy (an entry Python loaded:
/// its own objects), or bytes of the entry's own (one the front loaded, `load.rs`), readable
/// without the GIL either way. The cache drops Python's only inside methods Python calls
/// (with the GIL), and pyo3 defers a decref made without it to the next time it is held.
pub(super) enum Held {
    Python(Py<PyBytes>),
    Own(Box<[u8]>),
}

/// Where a bytes object's contents start, from the object's address: `ob_sval`'s offset
/// in `PyBytesObject`, which the stable ABI the extension is built for (abi3) does not
/// name. Found by `Held::new` (with the GIL) from `PyBytes_AsString`, before any `Held` of
/// Python's exists to be read; it is the same for every bytes object of the interpreter.
static CONTENTS_AT: AtomicUsize = AtomicUsize::new(0);

impl Held {
    pub(super) fn new(object: &Bound<'_, PyBytes>) -> Self {
        let start = object.as_bytes().as_ptr() as usize;
        CONTENTS_AT.store(start - object.as_ptr() as usize, Ordering::Relaxed);
        Held::Python(object.clone().unbind())
    }

    pub(super) fn bytes(&self) -> &[u8] {
        let object = match self {
            Held::Own(bytes) => return bytes,
            Held::Python(object) => object.as_ptr(),
        };
        // SAFETY: the `Py` keeps the object alive while it is read, and neither its size
        // (`ob_size`: a `PyVarObject`'s, which the stable ABI fixes) nor its contents
        // (inline in the object, at `CONTENTS_AT`, set when this `Held` was made) ever
        // change; no reference count or other interpreter state is touched, so the GIL is
        // not needed
        unsafe {
            let len = usize::try_from(ffi::Py_SIZE(object)).unwrap_or(0);
            let data = object.cast::<u8>().add(CONTENTS_AT.load(Ordering::Relaxed));
            std::slice::from_raw_parts(data, len)
        }
    }

    /// The bytes it takes: its contents, and a Python object's header (CPython 3.11's
    /// `PyBytesObject`: 33 bytes; `BYTES_OBJECT` in serving/l1/cache.py).
    pub(super) fn size(&self) -> usize {
        self.bytes().len() + if self.own() { 0 } else { 33 }
    }

    /// Whether these are the entry's own bytes (the front loaded it).
    pub(super) fn own(&self) -> bool {
        matches!(self, Held::Own(_))
    }
}

/// One entry: 136 bytes besides its key and bytes (a Python entry's own, or its own), and
/// the ends of its JSON's elements once a lookup has split it (`json_spans`).
pub(super) struct Hit {
    // the values as JSON (REST), once a load or a REST answer made them; with
    // `Hits::compact`, packed (empty for none), and each answer writes its JSON or gRPC
    // records from them
    pub(super) values: Option<Held>,
    pub(super) wire: Option<Held>, // as gRPC records, once a load or a gRPC answer made them
    // the values packed (a reload compares them; Python answers from them: `HitCache::entry`);
    // None for Python's (its entry holds them) and in a compact cache (`values` are them)
    pub(super) raw: Option<Held>,
    pub(super) present: Held,
    pub(super) written: i64, // the group's last write (unix seconds); NOT_WRITTEN for none (`written_at`)
    pub(super) expires: u64, // `Hits::ticks`
    pub(super) loaded: u64,  // `Hits::ticks`: when it was read from Redis
    pub(super) notice_at: u64, // `Hits::ticks`: from here on a hit is noted for Python (once per load)
    pub(super) negative: bool,
    // Python found the entity's data broken (its cached fault): the front does not load it
    pub(super) fault: bool,
    pub(super) noticed: AtomicBool,
    // hit since the eviction's hand last passed it (an entry the front loaded: `load.rs`)
    pub(super) visited: AtomicBool,
    // drawn for a shadow check since it was loaded: a check per entry per load at most
    pub(super) shadowed: AtomicBool,
    // how long its load took, in units of COST_UNIT seconds (saturating): XFetch's delta,
    // for Python's policy (an entry a front loaded: 0)
    pub(super) cost: u16,
    // where each element of the JSON `values` ends, found by the first hit that splits
    // them (a lookup of some features, Feast's columns) and kept for the next ones: about
    // 100 bytes for the standard shape. Empty: the JSON is past u16 offsets or not an
    // array (split on each hit). A pointer in the entry (8 bytes; a OnceCell took 24):
    // every cached entity has the slot, few have the ends.
    pub(super) ends: OnceBox<Box<[u16]>>,
}

// Every cached entity has one, in a hash table that grows by doubling: its size is most
// of what the table costs per entity (`bounds::ENTRY`).
const _: () = assert!(std::mem::size_of::<Hit>() <= 144);

/// `Hit::cost`'s unit: 10 µs, so that two bytes hold loads of up to 0.65 s.
const COST_UNIT: f64 = 1e-5;

/// A load's time in seconds as `Hit::cost` holds it.
pub(super) fn cost_units(seconds: f64) -> u16 {
    let units = (seconds / COST_UNIT).round();
    if units.is_finite() && units > 0.0 {
        units.min(f64::from(u16::MAX)) as u16
    } else {
        0
    }
}

/// `Hit::cost` in seconds.
pub(super) fn cost_seconds(units: u16) -> f64 {
    f64::from(units) * COST_UNIT
}

/// `Hit::notice_at` of an entry of Python's whose group's batch write was announced
/// (`notice_group`): its next hit is noted for Python's policy (which reloads it if it was
/// read before the write), never refreshed by the front on its own.
pub(super) const BATCH_NOTICE: u64 = 0;

/// `Hit::notice_at` of an entry of the front's own whose group's batch write was announced
/// (`notice_group`): outdated, so its next hit has the front read it again, unless Python's
/// sweep has queued it first (`Hits::queue_outdated`). An entry stored since (loaded,
/// refreshed) has a notice time of its own again: it is read after the write.
pub(super) const OUTDATED: u64 = 1;

/// `Hit::written` of a group without a stored write time: an Option took 16 bytes. Stored
/// write times are never negative (`layout.decode_timestamp` reads digits only).
pub(super) const NOT_WRITTEN: i64 = i64::MIN;

impl Hit {
    /// Whether a front loaded it (its bytes are its own): the fronts refresh it themselves,
    /// where Python's policy refreshes an entry Python stored.
    pub(super) fn own(&self) -> bool {
        self.present.own() && !self.fault
    }

    /// Ask the processor to bring into its caches the bytes a reload of this entry of the
    /// front's own reads once Redis has answered (`load.rs`): its packed values, compared
    /// with those read, and `api`'s answer bytes, copied into the answer where they are the
    /// same. An entry not hit lately is out of the caches (a large cache is larger than
    /// they are), and those reads stalled on memory at the reload, where the L1 off makes
    /// no such read; asked while the lookup's round trip is under way, they do not.
    pub(super) fn prefetch(&self, api: u8, compact: bool) {
        let answer = if api == super::GRPC {
            &self.wire
        } else {
            &self.values
        };
        let held = if compact {
            [&self.values, &None]
        } else {
            [&self.raw, answer]
        };
        for bytes in held.into_iter().flatten() {
            prefetch(bytes.bytes());
        }
    }

    /// Whether a load made it to answer its lookup only, without the packed values a stored
    /// entry of the front's own keeps (`load.rs`: not stored).
    pub(super) fn thin(&self, compact: bool) -> bool {
        !compact && !self.negative && self.raw.is_none() && self.present.own()
    }

    /// The bytes it holds besides its fixed size (a Python object's with its header).
    pub(super) fn held_bytes(&self) -> usize {
        let len = |h: &Option<Held>| h.as_ref().map_or(0, Held::size);
        len(&self.values) + len(&self.wire) + len(&self.raw) + self.present.size()
    }

    pub(super) fn written_at(&self) -> Option<i64> {
        (self.written != NOT_WRITTEN).then_some(self.written)
    }

    /// Where each element of the entry's JSON `values` starts and ends, into `out`: from
    /// the ends a hit before this one found, or found now and kept. None where `values` is
    /// not a JSON array (Python answers).
    pub(super) fn json_spans(&self, values: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
        let ends = self
            .ends
            .get_or_init(|| Box::new(element_ends(values).unwrap_or_default()));
        if ends.is_empty() {
            return json_elements(values, out); // (an entry's JSON always has elements)
        }
        spans_of_ends(ends, out);
        Some(())
    }
}

/// Where each element of the JSON array `json` ends (`json_elements`), kept in two bytes
/// each; None past u16 offsets, or where `json` is not an array.
fn element_ends(json: &[u8]) -> Option<Box<[u16]>> {
    u16::try_from(json.len()).ok()?;
    let mut spans = Vec::new();
    json_elements(json, &mut spans)?;
    Some(spans.iter().map(|&(_, end)| end as u16).collect())
}

/// The spans `json_elements` finds, from their ends (`element_ends`): the first element
/// starts after the bracket, each other after the comma that ends the one before.
fn spans_of_ends(ends: &[u16], out: &mut Vec<(usize, usize)>) {
    out.clear();
    let mut start = 1;
    for &end in ends {
        out.push((start, usize::from(end)));
        start = usize::from(end) + 1;
    }
}

/// Ask the processor to bring `bytes` into its caches, without waiting for them: a hint
/// (on x86-64; elsewhere nothing), which changes no result.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes.len()).step_by(64) {
        // SAFETY: a prefetch reads nothing the program sees and faults on no address (SSE,
        // which every x86-64 processor has); the address is inside `bytes` anyway
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(line).cast::<i8>());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_ends_give_the_spans_json_elements_finds() {
        let long = format!("[{}1]", "1,".repeat(40_000));
        for json in [
            r#"[]"#,
            r#"[1]"#,
            r#"[1.5,null,"a,]b",[1,2,3],{"k":[4]},true]"#,
            r#"[[0.25,-1e-07],[],"",null]"#,
            long.as_str(),
        ] {
            let (mut split, mut derived) = (Vec::new(), Vec::new());
            json_elements(json.as_bytes(), &mut split).unwrap();
            match element_ends(json.as_bytes()) {
                Some(ends) => spans_of_ends(&ends, &mut derived),
                None => {
                    assert!(json.len() > usize::from(u16::MAX), "{json}");
                    continue;
                }
            }
            assert_eq!(derived, split, "{json}");
        }
        assert!(element_ends(long.as_bytes()).is_none());
        assert!(element_ends(b"{1}").is_none());
    }
}
