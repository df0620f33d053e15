//! Cache hits answered on the REST front's thread, without the GIL.
//!
//! `HitCache` mirrors the L1's entries (`feature_store.serving.hits.NativeHits` keeps it in
//! step with `cache.LRUCache`): per (group, entity key) the entry's values JSON and gRPC
//! records, whichever it has made (the Python entry's own bytes objects, held, not copied:
//! an entry loaded for one API makes the other's on first use), its present pattern, its
//! write time and its expiry. A `POST /v1/features/get` in the common form (one group's
//! features, ids of the entity's type, no bypass) whose every entity is a fresh entry is
//! answered here from those bytes, as are gRPC's and Feast's lookups of one group, and
//! lookups over several groups of one entity (a form's `Part`s: each group's values
//! picked from its entries, gathered in `Cells`, written as Feast's columns or as rows,
//! `Rows`). With the L1 compact (`CACHE_FORM=compact`) an entry holds its packed values
//! instead, and each answer writes the values' JSON or gRPC records from them, as Python's
//! `GroupCodec` does. A request of a known form with entries missing or expired (or without
//! its API's answer bytes yet) sends Python those keys alone (`Looked::Missing`): Python
//! loads them into the L1, through its policy, and the front answers from the mirror
//! (`Hits::replay`). Any other request (an id Python would refuse, a form not seen yet, a
//! malformed body, keys that did not load) goes to Python as before, which answers it and
//! stays the one place where errors, misses and the cache's policy are decided.
//!
//! The policy stays Python's: a hit here on an entry inside its refresh window (refresh
//! ahead, XFetch, an announced batch write) and a sample of hits (shadow checks) are noted
//! for Python, which runs the same `Refresher.on_hit` and `ShadowChecker.sample` a hit in
//! Python would. A form is learned from Python's own answer to it: the head of the answer
//! and how an id becomes a key are Python's bytes, not rebuilt here.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use once_cell::race::OnceBox;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::{
    age_at, age_of, grpc_age, grpc_id, json_age, json_i64, json_str, json_value, packed_picks,
    proto_value, put_varint, read_varint, status_code, status_json, write_grpc_row, write_packed,
    write_packed_picks, write_row, write_values, GrpcId, Shape, Writer, MISSING_VALUE,
};

/// A Python bytes object held by the mirror, readable without the GIL: one pointer. The
/// mirror drops entries only inside methods Python calls (with the GIL), and pyo3 defers a
/// decref made without it to the next time it is held.
struct Held(Py<PyBytes>);

impl Held {
    fn new(object: &Bound<'_, PyBytes>) -> Self {
        Held(object.clone().unbind())
    }

    fn bytes(&self) -> &[u8] {
        let object = self.0.as_ptr();
        // SAFETY: the `Py` keeps the object alive while it is read, and neither its size nor its
        // contents (`ob_sval`, inline in the object) ever change; no reference count or
        // other interpreter state is touched, so the GIL is not needed
        unsafe {
            let len = usize::try_from(ffi::Py_SIZE(object)).unwrap_or(0);
            let data = std::ptr::addr_of!((*object.cast::<ffi::PyBytesObject>()).ob_sval);
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        }
    }
}

/// One mirrored entry: 64 bytes besides its key (the bytes are the Python entry's), and
/// the ends of its JSON's elements once a lookup has split it (`json_spans`).
struct Hit {
    // the values as JSON (REST), once a load or a REST answer made them; with
    // `Hits::compact`, packed (empty for none), and each answer writes its JSON or gRPC
    // records from them
    values: Option<Held>,
    wire: Option<Held>, // as gRPC records, once a load or a gRPC answer made them
    present: Held,
    written: i64, // the group's last write (unix seconds); NOT_WRITTEN for none (`written_at`)
    expires: u64, // `Hits::ticks`
    notice_at: u64, // `Hits::ticks`: from here on a hit is noted for Python (once per load)
    negative: bool,
    noticed: AtomicBool,
    // where each element of the JSON `values` ends, found by the first hit that splits
    // them (a lookup of some features, Feast's columns) and kept for the next ones: about
    // 100 bytes for the standard shape. Empty: the JSON is past u16 offsets or not an
    // array (split on each hit). A pointer in the entry (8 bytes; a OnceCell took 24):
    // every cached entity has the slot, few have the ends.
    ends: OnceBox<Box<[u16]>>,
}

// Every cached entity has one, in a hash table that grows by doubling: its size is most
// of what the mirror costs per entity (MIRROR_ENTRY in serving/hits.py).
const _: () = assert!(std::mem::size_of::<Hit>() <= 64);

/// `Hit::written` of a group without a stored write time: an Option took 16 bytes. Stored
/// write times are never negative (`layout.decode_timestamp` reads digits only).
const NOT_WRITTEN: i64 = i64::MIN;

impl Hit {
    fn written_at(&self) -> Option<i64> {
        (self.written != NOT_WRITTEN).then_some(self.written)
    }

    /// Where each element of the entry's JSON `values` starts and ends, into `out`: from
    /// the ends a hit before this one found, or found now and kept. None where `values` is
    /// not a JSON array (Python answers).
    fn json_spans(&self, values: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
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

/// The APIs whose lookups are answered here: this one's REST and gRPC, and Feast's
/// `/get-online-features` (its column-shaped answer: `Cells`).
pub const REST: u8 = 0;
pub const GRPC: u8 = 1;
pub const FEAST: u8 = 2;
const APIS: usize = 3;

/// A request form Python answered: everything an answer needs besides the entries.
struct Form {
    // the groups that answer it: one, but for lookups over several groups of one entity
    // (REST's and gRPC's, Feast's over several views)
    parts: Vec<Part>,
    // over several groups: per value of a row (REST, gRPC) or column of the answer (Feast),
    // the part that writes it and its place there; empty: the parts' in turn
    // (`column_order`)
    order: Vec<(usize, usize)>,
    // REST: `{"entity_type":..,"features":..,"types":..,"results":[`; gRPC: the response's
    // entity_type and features fields
    head: Vec<u8>,
    prefix: Vec<u8>, // the entity's key prefix and separator: key = prefix + id
    int_ids: bool,
}

/// One group of a form: its entries' key tag (a planned form's: the read of its lookups,
/// `GroupRead`, which all its parts share), its max_age, the features answered, and its
/// name in a row's "ages".
struct Part {
    group: u16,
    max_age: Option<i64>,
    // hits of some of the group's features: their indices in the group, in the answer's
    // order (`Picked`); None: all of them, in the group's order
    picks: Option<Vec<usize>>,
    label: Vec<u8>, // as JSON (REST), as it is (gRPC)
}

impl Part {
    /// This part's cells of an answer of `api` (`several`: of a form over several groups
    /// whose rows are written from cells, in another order than the groups' in turn):
    /// Feast's columns, one per feature answered (those picked, else the `read` values its
    /// read reads of the group), and those REST and gRPC rows; None for the rows of one
    /// group's, or of several in turn (`JoinedRow`).
    fn columns(&self, api: u8, read: Option<usize>, several: bool, rows: usize) -> Option<Cells> {
        let stamped = api == FEAST;
        if !stamped && !several {
            return None;
        }
        // (hits of a form over several groups, and Feast's, always pick from the L1's
        // entries; a planned form reads its features: `read`, how many)
        let width = match (&self.picks, read) {
            (Some(picks), _) => picks.len(),
            (None, Some(read)) => read,
            (None, None) => return None,
        };
        Some(Cells::new(width, stamped, api == GRPC, rows))
    }
}

impl Form {
    /// The form's first group: its one, but for a form over several groups (a planned
    /// form's read is named by each of its parts).
    fn part(&self) -> &Part {
        &self.parts[0]
    }

    /// One entity's row of an answer of `api` from its values' answer bytes (REST: its JSON
    /// array, after a comma unless `first`; gRPC: its records).
    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
        api: u8,
        first: bool,
        id: &Id<'_>,
        values: &[u8],
        present: &[u8],
        written_at: Option<i64>,
        now: i64,
    ) {
        if api == REST {
            if !first {
                out.push(b',');
            }
            let id = |o: &mut Vec<u8>| id.json(o);
            let (max_age, label) = (self.part().max_age, &self.part().label);
            write_row(
                out, id, values, present, written_at, false, now, max_age, label,
            );
        } else {
            let (id, max_age, label) = (id.grpc(), self.part().max_age, &self.part().label);
            write_grpc_row(
                out, scratch, id, values, present, written_at, false, now, max_age, label,
            );
        }
    }
}

#[derive(Default)]
struct Served {
    seconds: [Vec<f64>; APIS], // each answer's time, for the request histogram, per API
    entities: [u64; APIS],
    direct: [u64; APIS], // of the answers, planned reads read on the front's own connections
    loaded: [u64; APIS], // of the answers, hits once Python loaded the lookup's missing keys
    hits: u64,
    negative_hits: u64,
    refresh: Vec<Vec<u8>>, // keys hit inside their refresh window
    shadow: Vec<Vec<u8>>,  // keys sampled for a shadow check
}

const MAX_FORMS: usize = 1024;
const MAX_NOTED: usize = 100_000; // per drain: Python drains every few tens of ms

/// How a planned read reads its groups, one command per id: its fields' RESP (each
/// group's features, then its freshness field), the reply's shape, its values' types (as
/// `GroupCodec`'s, every group's in turn), and where each group's lie (`Split`). A compact
/// cache's entries are read with their group's whole read.
struct GroupRead {
    fields: Vec<u8>,
    shape: Shape,
    types: Vec<(u8, u32)>,
    splits: Vec<Split>,
}

/// One group's share of a reply to a read: its values' types, its stored values, its
/// stored write time.
type GroupReply<'s, 'a> = (&'s [(u8, u32)], &'s [Option<&'a [u8]>], Option<&'a [u8]>);

/// One group's share of a read: its values' first slot in a reply and first type, and
/// how many; its write time in the slot after them.
#[derive(Clone, Copy)]
struct Split {
    slot: usize,
    first_type: usize,
    count: usize,
}

impl GroupRead {
    /// The read of `fields` (their RESP made here), as many values of each group in turn as
    /// `counts` says, each group's followed by its write time. None where the counts do
    /// not add up to the fields and the types.
    fn new(
        fields: Vec<Vec<u8>>,
        whole: bool,
        types: Vec<(u8, u32)>,
        counts: &[usize],
    ) -> Option<Self> {
        let values: usize = counts.iter().sum();
        if values != types.len() || values + counts.len() != fields.len() || counts.is_empty() {
            return None;
        }
        let (mut slot, mut first_type) = (0, 0);
        let splits = counts
            .iter()
            .map(|&count| {
                let split = Split {
                    slot,
                    first_type,
                    count,
                };
                slot += count + 1;
                first_type += count;
                split
            })
            .collect();
        let mut resp = Vec::new();
        for field in &fields {
            resp.push(b'$');
            json_i64(&mut resp, field.len() as i64);
            resp.extend_from_slice(b"\r\n");
            resp.extend_from_slice(field);
            resp.extend_from_slice(b"\r\n");
        }
        Some(GroupRead {
            fields: resp,
            shape: Shape::new(fields, whole),
            types,
            splits,
        })
    }

    /// Group `k`'s values' types, its stored values in a reply's `slots`, and its write
    /// time's slot there.
    fn group<'s, 'a>(
        &'s self,
        k: usize,
        slots: &'s [Option<&'a [u8]>],
    ) -> Option<GroupReply<'s, 'a>> {
        let Split {
            slot,
            first_type,
            count,
        } = *self.splits.get(k)?;
        let types = self.types.get(first_type..first_type + count)?;
        let stored = slots.get(slot..slot + count)?;
        Some((types, stored, *slots.get(slot + count)?))
    }
}

/// An id of a planned read, kept until its answer is written.
enum OwnedId {
    Int(i64),
    Str(String),
}

impl OwnedId {
    fn id(&self) -> Id<'_> {
        match self {
            OwnedId::Int(n) => Id::Int(*n),
            OwnedId::Str(s) => Id::Str(s),
        }
    }
}

/// The Redis commands of one lookup without the L1 (`Hits::plan`), and what writing its
/// answer from their replies needs (`Hits::render`).
pub struct Plan {
    api: u8,
    form: Arc<Form>,
    read: Arc<GroupRead>,
    ids: Vec<OwnedId>,
    started: Instant,
    pub command: Vec<u8>,
    pub count: usize,
}

/// What a lookup found in the mirror.
pub enum Looked {
    /// every entity a fresh entry: the answer
    Answer(Vec<u8>),
    /// some missing, expired or (gRPC) without records: Python loads them, then `replay`
    Missing(Missing),
}

/// The keys (group index and Redis key, sorted, each once) a lookup found missing.
pub struct Missing {
    pub keys: Vec<Vec<u8>>,
    started: Instant,
}

pub struct Hits {
    /// without the L1: lookups are planned (`plan`), never looked up in `entries`
    pub planning: bool,
    /// entries hold their packed values only (`CACHE_FORM=compact`)
    compact: bool,
    reads: RwLock<HashMap<u16, Arc<GroupRead>>>,
    entries: RwLock<HashMap<Box<[u8]>, Hit>>,
    base: Instant, // `ticks` count from here
    forms: RwLock<HashMap<Vec<u8>, Arc<Form>>>,
    served: Mutex<Served>,
    shadow_below: u64, // a hit is sampled when a random u64 is below this
    rng: AtomicU64,
    max_ids: usize,
    max_string_id: usize,
}

/// The key of a form: the API, and the request's entity type, features and groups as sent.
fn form_key(api: u8, entity: &str, features: &[&str], groups: &[&str]) -> Vec<u8> {
    let mut key = Vec::with_capacity(64);
    key.push(api);
    key.extend_from_slice(entity.as_bytes());
    for (mark, names) in [(1u8, features), (2u8, groups)] {
        for name in names {
            key.push(mark);
            key.extend_from_slice(name.as_bytes());
        }
    }
    key
}

fn cache_key(out: &mut Vec<u8>, group: u16, prefix: &[u8], id: &Id<'_>) {
    out.clear();
    out.extend_from_slice(&group.to_be_bytes());
    out.extend_from_slice(prefix);
    match id {
        Id::Int(n) => json_i64(out, *n), // the digits of Python's f"{prefix}:{n}"
        Id::Str(s) => out.extend_from_slice(s.as_bytes()),
    }
}

impl Hits {
    /// A time as nanoseconds since `base`: 8 bytes in a `Hit` where an `Instant` is 16.
    fn ticks(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn next_random(&self) -> u64 {
        // splitmix64 over an atomic counter: one sample per hit, no lock
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The answer to a lookup of `api` (a `POST /v1/features/get` or Feast
    /// `/get-online-features` body, a `GetFeaturesRequest` message) if every entity is a
    /// fresh hit, or the keys Python must load first. A gRPC lookup's entries answer once
    /// they hold their gRPC records (or, compact, can write them); the others', their JSON.
    pub fn answer(&self, api: u8, request: &[u8]) -> Option<Looked> {
        if self.planning {
            return None;
        }
        self.lookup(&Asked::parse(api, request)?, None)
    }

    /// The answer to a lookup whose `missing` keys Python has loaded since `answer` found
    /// them; None (Python answers) where an entry is still not here. The hits counted are
    /// those of the other keys: Python counted the loaded ones.
    pub fn replay(&self, request: &[u8], api: u8, missing: &Missing) -> Option<Vec<u8>> {
        let mut asked = Asked::parse(api, request)?;
        asked.started = missing.started; // the answer's time includes the load
        match self.lookup(&asked, Some(&missing.keys))? {
            Looked::Answer(answer) => Some(answer),
            Looked::Missing(_) => None,
        }
    }

    /// `loaded`: a replay, after Python loaded these keys (sorted).
    fn lookup(&self, asked: &Asked<'_>, loaded: Option<&[Vec<u8>]>) -> Option<Looked> {
        let (api, ids, started) = (asked.api, &asked.ids, asked.started);
        let form = self.form(asked)?;
        let now = unix_now();
        let now_ticks = self.ticks(started);
        let mut out = Vec::with_capacity(form.head.len() + ids.len() * 1300 + 2);
        out.extend_from_slice(&form.head);
        let mut key = Vec::with_capacity(form.prefix.len() + 24);
        let mut writer = if self.compact {
            let reads = self.reads.read().unwrap_or_else(|e| e.into_inner());
            HitWriter::new(api, &form, Some(&reads), now, ids.len())?
        } else {
            HitWriter::new(api, &form, None, now, ids.len())?
        };
        let compact = self.compact;
        let (mut hits, mut negative) = (0u64, 0u64);
        let mut missing: Vec<Vec<u8>> = Vec::new();
        let mut refresh = Vec::new();
        let mut shadow = Vec::new();
        {
            let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
            let mut noted: Vec<(&Hit, Vec<u8>)> = Vec::new();
            // each entity's entry of each of the form's groups (one, but for Feast's lookups
            // over several views)
            let keyed = ids
                .iter()
                .enumerate()
                .flat_map(|(i, id)| form.parts.iter().enumerate().map(move |p| (i, id, p)));
            for (i, id, (p, part)) in keyed {
                cache_key(&mut key, part.group, &form.prefix, id);
                let hit = match entries.get(key.as_slice()) {
                    Some(hit)
                        if now_ticks < hit.expires
                            && (compact
                                || if api == GRPC {
                                    hit.wire.is_some()
                                } else {
                                    hit.values.is_some()
                                }) =>
                    {
                        hit
                    }
                    _ if loaded.is_some() => return None, // gone again: Python answers
                    _ => {
                        missing.push(key.clone());
                        continue;
                    }
                };
                if !missing.is_empty() {
                    continue; // no answer before the load: only what is missing matters
                }
                writer.entity(&mut out, i, id, p, hit)?;
                if let Some(loaded) = loaded {
                    if loaded.binary_search(&key).is_ok() {
                        continue; // counted by Python's load
                    }
                }
                if hit.negative {
                    negative += 1;
                    continue;
                }
                hits += 1;
                if now_ticks >= hit.notice_at && !hit.noticed.load(Ordering::Relaxed) {
                    noted.push((hit, key.clone()));
                }
                if self.shadow_below > 0 && self.next_random() < self.shadow_below {
                    shadow.push(key.clone());
                }
            }
            if !missing.is_empty() {
                missing.sort_unstable();
                missing.dedup();
                return Some(Looked::Missing(Missing {
                    keys: missing,
                    started,
                }));
            }
            for (hit, key) in noted {
                if !hit.noticed.swap(true, Ordering::Relaxed) {
                    refresh.push(key); // once per load, by whichever answer comes first
                }
            }
        }
        writer.finish(&mut out, ids)?;
        let mut served = self.served(api, started, ids.len());
        served.loaded[api as usize] += u64::from(loaded.is_some());
        served.hits += hits;
        served.negative_hits += negative;
        if served.refresh.len() < MAX_NOTED {
            served.refresh.append(&mut refresh);
        }
        if served.shadow.len() < MAX_NOTED {
            served.shadow.append(&mut shadow);
        }
        Some(Looked::Answer(out))
    }
}

/// Writes one lookup's answer from the mirror's entries, entity by entity (`entity`), then
/// closes it (`finish`): rows of this API's REST or gRPC answer, or Feast's columns.
struct HitWriter<'f> {
    api: u8,
    form: &'f Form,
    parts: Vec<PartWriter>, // per part of the form
    now: i64,
    written: Vec<u8>,
    scratch: Vec<u8>,
    row: Vec<u8>,
    spans: Vec<(usize, usize)>, // where each of an entity's values starts and ends
    picked: Picked,
    joined: Option<JoinedRow>, // the rows over several groups in turn
}

/// What a `HitWriter` keeps per part of its form.
struct PartWriter {
    // compact: each answer writes the values from the entry's packed ones (of a pick, the
    // picked alone, of these types)
    read: Option<Arc<GroupRead>>,
    pick_types: Vec<(u8, u32)>,
    columns: Option<Cells>, // Feast's, and the rows' over several groups
}

impl<'f> HitWriter<'f> {
    /// `reads`: in a compact cache, how each group's values are read. None where a pick is
    /// past the group's values, or a Feast form's width is not known (Python answers).
    fn new(
        api: u8,
        form: &'f Form,
        reads: Option<&HashMap<u16, Arc<GroupRead>>>,
        now: i64,
        rows: usize,
    ) -> Option<Self> {
        let mut parts = Vec::with_capacity(form.parts.len());
        let joined = JoinedRow::of(api, form);
        // cells for Feast's columns and for rows over several groups in another order
        let several = form.parts.len() > 1 && joined.is_none();
        for part in &form.parts {
            let read = match reads {
                Some(reads) => Some(Arc::clone(reads.get(&part.group)?)),
                None => None,
            };
            let pick_types = match (&read, &part.picks) {
                (Some(read), Some(picks)) => picks
                    .iter()
                    .map(|&fi| read.types.get(fi).copied())
                    .collect::<Option<Vec<_>>>()?,
                _ => Vec::new(),
            };
            let width = read.as_ref().map(|r| r.types.len());
            let columns = part.columns(api, width, several, rows);
            if (api == FEAST || several) && columns.is_none() {
                return None;
            }
            parts.push(PartWriter {
                read,
                pick_types,
                columns,
            });
        }
        Some(HitWriter {
            api,
            form,
            parts,
            now,
            written: Vec::new(),
            scratch: Vec::new(),
            row: Vec::new(),
            spans: Vec::new(),
            picked: Picked::default(),
            joined,
        })
    }

    /// Entity `i`'s part of the answer, from its entry of the form's part `p`. None where
    /// the entry's bytes are not what they should be (Python answers).
    fn entity(
        &mut self,
        out: &mut Vec<u8>,
        i: usize,
        id: &Id<'_>,
        p: usize,
        hit: &Hit,
    ) -> Option<()> {
        let (api, form, now) = (self.api, self.form, self.now);
        let part = form.parts.get(p)?;
        let writer = self.parts.get_mut(p)?;
        if let (Some(columns), true) = (&mut writer.columns, hit.negative) {
            columns.not_found(id);
            return Some(());
        }
        if let (Some(columns), Some(read)) = (&mut writer.columns, &writer.read) {
            // a compact entry's values straight into Feast's columns, as a planned read's
            // (`stored_row`): no JSON array written to be split again
            let (raw, picks) = (hit.values.as_ref()?.bytes(), part.picks.as_deref());
            let stored = packed_picks(raw, read.types.len(), picks)?;
            let types = if picks.is_some() {
                &writer.pick_types
            } else {
                &read.types
            };
            return columns.stored_row(id, types, &stored, hit.written_at(), now, part.max_age);
        }
        let (picked, written, spans) = (&mut self.picked, &mut self.written, &mut self.spans);
        let mut values = match &writer.read {
            Some(read) => {
                written.clear();
                let (raw, proto) = (hit.values.as_ref()?.bytes(), api == GRPC);
                if let Some(picks) = &part.picks {
                    let (types, count) = (&writer.pick_types, read.types.len());
                    let present = &mut picked.present;
                    write_packed_picks(types, count, raw, picks, proto, written, present)?;
                } else {
                    write_packed(&read.types, raw, proto, written, &mut self.scratch).ok()?;
                }
                written.as_slice()
            }
            None if api == GRPC => hit.wire.as_ref()?.bytes(),
            None => hit.values.as_ref()?.bytes(),
        };
        let (mut present, written_at) = (hit.present.bytes(), hit.written_at());
        // where the values split, for Feast's columns and for picks from answer bytes: an
        // entry's own JSON as the first hit to split it found (`Hit::json_spans`); gRPC
        // records here (a compact entry's are written picked, or into the columns above)
        if writer.read.is_none() && (writer.columns.is_some() || part.picks.is_some()) {
            if api == GRPC {
                value_records(values, spans)?;
            } else {
                hit.json_spans(values, spans)?;
            }
        }
        // Feast's columns pick from the entry's values as they split
        let mut row_picks = None;
        if let Some(picks) = &part.picks {
            if writer.read.is_some() {
                present = &picked.present; // written picked
            } else if writer.columns.is_some() {
                row_picks = Some(picks.as_slice());
            } else {
                picked.pick(api, values, spans, present, picks)?;
                values = &picked.values;
                present = &picked.present;
            }
        }
        if let Some(columns) = &mut writer.columns {
            let max_age = part.max_age;
            return columns.row(
                id, values, spans, present, row_picks, written_at, now, max_age,
            );
        }
        if let Some(joined) = &mut self.joined {
            return joined.add(
                out,
                form,
                api,
                i == 0,
                id,
                p,
                values,
                present,
                written_at,
                now,
            );
        }
        let row = &mut self.row;
        form.row(out, row, api, i == 0, id, values, present, written_at, now);
        Some(())
    }

    /// The answer closed (`close_answer`; `ids`, the lookup's).
    fn finish(&self, out: &mut Vec<u8>, ids: &[Id<'_>]) -> Option<()> {
        let cells: Vec<&Cells> = self
            .parts
            .iter()
            .filter_map(|p| p.columns.as_ref())
            .collect();
        close_answer(self.api, self.form, &cells, ids, self.now, out)
    }
}

impl Hits {
    /// The form learned for this request, if its ids are ones Python would take.
    fn form(&self, asked: &Asked<'_>) -> Option<Arc<Form>> {
        let ids = &asked.ids;
        if ids.is_empty() || ids.len() > self.max_ids {
            return None;
        }
        let key = form_key(asked.api, asked.entity, &asked.features, &asked.groups);
        let form = {
            let forms = self.forms.read().unwrap_or_else(|e| e.into_inner());
            Arc::clone(forms.get(&key)?)
        };
        for id in ids {
            match id {
                Id::Int(_) if form.int_ids => {}
                Id::Str(s) if !form.int_ids && !s.is_empty() && s.len() <= self.max_string_id => {}
                _ => return None, // Python says why
            }
        }
        Some(form)
    }

    /// Count an answer given here (for the request histogram and the entities served).
    fn served(
        &self,
        api: u8,
        started: Instant,
        entities: usize,
    ) -> std::sync::MutexGuard<'_, Served> {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.seconds[api as usize].push(started.elapsed().as_secs_f64());
        served.entities[api as usize] += entities as u64;
        served
    }

    /// The Redis commands of a lookup of `api` without the L1 (the request as for
    /// `answer`): one per id, as `roundtrip.pack` writes them. None where Python answers.
    pub fn plan(&self, api: u8, request: &[u8]) -> Option<Plan> {
        if !self.planning {
            return None;
        }
        self.planned(Asked::parse(api, request)?)
    }

    fn planned(&self, asked: Asked<'_>) -> Option<Plan> {
        let form = self.form(&asked)?;
        let ids = &asked.ids;
        // one read per id, of each part's share (`learn` saw that they share it)
        let read = {
            let reads = self.reads.read().unwrap_or_else(|e| e.into_inner());
            Arc::clone(reads.get(&form.part().group)?)
        };
        if read.splits.len() != form.parts.len() {
            return None;
        }
        let mut command = Vec::with_capacity(ids.len() * (read.fields.len() + 64));
        let mut key = Vec::with_capacity(form.prefix.len() + 24);
        let mut owned = Vec::with_capacity(ids.len());
        for id in ids {
            key.clear();
            key.extend_from_slice(&form.prefix);
            match id {
                Id::Int(n) => {
                    json_i64(&mut key, *n); // the digits of Python's f"{prefix}:{n}"
                    owned.push(OwnedId::Int(*n));
                }
                Id::Str(s) => {
                    key.extend_from_slice(s.as_bytes());
                    owned.push(OwnedId::Str((*s).to_owned()));
                }
            }
            if read.shape.whole {
                command.extend_from_slice(b"*2\r\n$7\r\nHGETALL\r\n$");
            } else {
                command.push(b'*');
                json_i64(&mut command, read.shape.count as i64 + 2);
                command.extend_from_slice(b"\r\n$5\r\nHMGET\r\n$");
            }
            json_i64(&mut command, key.len() as i64);
            command.extend_from_slice(b"\r\n");
            command.extend_from_slice(&key);
            command.extend_from_slice(b"\r\n");
            if !read.shape.whole {
                command.extend_from_slice(&read.fields);
            }
        }
        Some(Plan {
            api: asked.api,
            form,
            read,
            count: ids.len(),
            ids: owned,
            started: asked.started,
            command,
        })
    }

    /// The answer to a planned lookup from Redis's replies to its commands (`buf`, all of
    /// them and nothing else). None where Python answers instead: an error reply (a key
    /// holding another type), a value or write time the native core does not read (Python
    /// names the fault, or reads the form only its reference reads).
    pub fn render(&self, plan: &Plan, buf: &[u8], direct: bool) -> Option<Vec<u8>> {
        let (form, read, api) = (&plan.form, &plan.read, plan.api);
        let now = unix_now();
        // Feast's columns and the rows over several groups in another order than theirs:
        // each part's cells, the answer written from them at the end (Feast's into room
        // `write_columns` makes for them); none for the rows of one group's, or of several
        // in turn (`JoinedRow`), written an entity at a time
        let mut joined = JoinedRow::of(api, form);
        let several = form.parts.len() > 1 && joined.is_none();
        let widths = read.splits.iter().map(|split| Some(split.count));
        let mut cells: Vec<Cells> = (form.parts.iter().zip(widths))
            .map(|(part, width)| part.columns(api, width, several, plan.ids.len()))
            .collect::<Option<_>>()
            .unwrap_or_default();
        let rows = if api == FEAST {
            0
        } else {
            plan.ids.len() * 1300 + 2
        };
        let mut out = Vec::with_capacity(form.head.len() + rows);
        out.extend_from_slice(&form.head);
        let mut slots = Vec::with_capacity(read.shape.count);
        let mut order = Vec::with_capacity(read.shape.count);
        // one entity's answer bytes and present pattern (the rows of one group's; cells
        // take the stored values as they are)
        let (mut values, mut present) = if cells.is_empty() {
            let types = read.types.len();
            (Vec::with_capacity(1400), Vec::with_capacity(types))
        } else {
            (Vec::new(), Vec::new())
        };
        let mut row = Vec::new();
        let mut pos = 0;
        for (i, id) in plan.ids.iter().enumerate() {
            let (error, next) = read.shape.read(buf, pos, &mut slots, &mut order).ok()?;
            if error.is_some() {
                return None;
            }
            pos = next;
            let id = id.id();
            if cells.is_empty() {
                for k in 0..form.parts.len() {
                    let (types, stored, written_at) = read.group(k, &slots)?;
                    let written_at = write_time(written_at)?;
                    values.clear();
                    present.clear();
                    let stored = stored.iter().copied();
                    let proto = api == GRPC;
                    write_values(types, stored, proto, &mut values, &mut present, None).ok()?;
                    let (out, first) = (&mut out, i == 0);
                    match &mut joined {
                        Some(joined) => joined.add(
                            out, form, api, first, &id, k, &values, &present, written_at, now,
                        )?,
                        None => form.row(
                            out, &mut row, api, first, &id, &values, &present, written_at, now,
                        ),
                    }
                }
                continue;
            }
            for (k, (cells, part)) in cells.iter_mut().zip(&form.parts).enumerate() {
                let (types, stored, written_at) = read.group(k, &slots)?;
                let written_at = write_time(written_at)?;
                if written_at.is_none() && stored.iter().all(Option::is_none) {
                    // nothing of what was read: the entity has nothing of the group (see
                    // `Cells`: a read of some fields cannot see the others)
                    cells.not_found(&id);
                } else {
                    cells.stored_row(&id, types, stored, written_at, now, part.max_age)?;
                }
            }
        }
        if pos != buf.len() {
            return None;
        }
        let cells: Vec<&Cells> = cells.iter().collect();
        let ids: Vec<Id<'_>> = plan.ids.iter().map(OwnedId::id).collect();
        close_answer(api, form, &cells, &ids, now, &mut out)?;
        let mut served = self.served(api, plan.started, plan.ids.len());
        served.direct[api as usize] += u64::from(direct);
        drop(served);
        Some(out)
    }
}

/// A stored write time (None: none stored) as unix seconds; None where it is not one the
/// native core reads (Python names the fault).
fn write_time(stored: Option<&[u8]>) -> Option<Option<i64>> {
    match stored {
        Some(text) => Some(Some(unix_seconds(text)?)),
        None => Some(None),
    }
}

/// Some of an entry's values, picked from its answer bytes for a form that asks for some of
/// the group's features: those values (REST: a JSON array; gRPC: their `FeatureRow.values`
/// records) and their present pattern, as `GroupCodec.picked_rows` and
/// `wire.picked_values` write them from the packed values (a compact entry's are written
/// picked, `write_packed_picks`).
#[derive(Default)]
struct Picked {
    values: Vec<u8>,
    present: Vec<u8>,
}

impl Picked {
    /// `spans`: where each value of `values` starts and ends (REST: its JSON array's
    /// elements; gRPC: its records). None where they are not `present.len()` values (they
    /// always are: `write_values` wrote them) or a pick is past them.
    fn pick(
        &mut self,
        api: u8,
        values: &[u8],
        spans: &[(usize, usize)],
        present: &[u8],
        picks: &[usize],
    ) -> Option<()> {
        let rest = api != GRPC;
        if spans.len() != present.len() {
            return None;
        }
        self.values.clear();
        self.present.clear();
        if rest {
            self.values.push(b'[');
        }
        for (k, &fi) in picks.iter().enumerate() {
            let &(start, end) = spans.get(fi)?;
            if k > 0 && rest {
                self.values.push(b',');
            }
            self.values.extend_from_slice(&values[start..end]);
            self.present.push(present[fi]);
        }
        if rest {
            self.values.push(b']');
        }
        Some(())
    }
}

/// One group's values of a lookup gathered an entity at a time (its cells), to be written
/// in another order: Feast's column-shaped answer (`feast_api.answer_json`) of one view's
/// features, or of each view of a lookup over several (`write_columns`), written a column
/// at a time; the rows of REST's and gRPC's lookups over several groups (`Rows`), each
/// row's values taken from each group's cells in the answer's order. Feast's answer has first the join key's
/// column, its ids each "PRESENT" at the epoch; then per feature its value in each row, the
/// row's status and the row's event time. A row's status is "NOT_FOUND" where the entity
/// has nothing of the group (a negative entry; in a planned read of some fields, neither
/// those nor the write time: the others are not read, and this project's writers write the
/// write time with every value), else "OUTSIDE_MAX_AGE" past the group's max_age, else
/// "PRESENT"; a value the row lacks is null with status "NULL_VALUE". A row's statuses
/// are "missing", "stale" and "present" for these (gRPC's codes 2, 3, 1), and its "ages"
/// come from the write times. gRPC's cells are `FeatureRow.values` records.
#[derive(Default)]
struct Cells {
    width: usize,                     // the features answered
    stamped: bool,                    // Feast's: ids and event times kept (rows: write times)
    proto: bool,                      // gRPC's: the cells are values records
    ids: Vec<u8>,                     // the join key's values, joined by commas
    stamps: Vec<u8>,                  // each row's event time, joined by commas
    written: Vec<Option<i64>>,        // rows: each row's write time
    statuses: Vec<RowStatus>,         // each row's status
    values: Vec<u8>,                  // the rows' values' JSON, one row after the other
    cells: Vec<(usize, usize, bool)>, // per row and feature: its JSON's span, NULL_VALUE
    cell_bytes: usize,                // the cells' JSON, a NOT_FOUND row's null each time
    rows: usize,                      // the rows to come: room made for them
}

const EPOCH: &[u8] = b"\"1970-01-01T00:00:00Z\"";
const LAST_STAMP: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z: the reference's strftime agrees up to here

/// A row's status in a group (see `Cells`).
#[derive(Clone, Copy, PartialEq)]
enum RowStatus {
    Present,
    Stale,
    NotFound,
}

impl RowStatus {
    /// As Feast's JSON names it.
    fn feast(self) -> &'static [u8] {
        match self {
            RowStatus::Present => b"\"PRESENT\"",
            RowStatus::Stale => b"\"OUTSIDE_MAX_AGE\"",
            RowStatus::NotFound => b"\"NOT_FOUND\"",
        }
    }
}

impl Cells {
    /// Cells for `rows` rows, room made for them (the values' once the first row's are
    /// known: `id`), so that they are not copied again as they grow.
    fn new(width: usize, stamped: bool, proto: bool, rows: usize) -> Self {
        let (ids, stamps, written) = if stamped {
            (8 * rows, (EPOCH.len() + 1) * rows, 0)
        } else {
            (0, 0, rows)
        };
        Cells {
            width,
            stamped,
            proto,
            ids: Vec::with_capacity(ids),
            stamps: Vec::with_capacity(stamps),
            written: Vec::with_capacity(written),
            statuses: Vec::with_capacity(rows),
            cells: Vec::with_capacity(rows * width),
            rows,
            ..Cells::default()
        }
    }

    /// A missing value's cell: null, or gRPC's value with no kind set.
    fn missing(&self) -> &'static [u8] {
        if self.proto {
            MISSING_VALUE
        } else {
            b"null"
        }
    }

    /// A row begun: its id in the join key's column (Feast's), its status.
    fn id(&mut self, id: &Id<'_>, status: RowStatus) {
        if self.statuses.len() == 1 {
            // the second row: the first's values' size, room for the rest of them
            let rest = self.rows.saturating_sub(1);
            self.values.reserve(self.values.len() * rest);
        }
        if self.stamped {
            if !self.statuses.is_empty() {
                self.ids.push(b',');
                self.stamps.push(b',');
            }
            id.json(&mut self.ids);
        }
        self.statuses.push(status);
    }

    /// The row of an entity with nothing of the group.
    fn not_found(&mut self, id: &Id<'_>) {
        self.id(id, RowStatus::NotFound);
        if self.stamped {
            self.stamps.extend_from_slice(EPOCH);
        } else {
            self.written.push(None);
        }
        let (start, missing) = (self.values.len(), self.missing());
        self.values.extend_from_slice(missing);
        for _ in 0..self.width {
            self.cell(start, start + missing.len(), false);
        }
    }

    /// A row begun: its id, its status (by its write time against the group's max_age)
    /// and its event time (rows: its write time). None where a Feast event time would be
    /// past year 9999.
    fn begin(
        &mut self,
        id: &Id<'_>,
        written_at: Option<i64>,
        now: i64,
        max_age: Option<i64>,
    ) -> Option<()> {
        let stale = matches!((written_at, max_age), (Some(w), Some(m)) if now - w > m);
        self.id(
            id,
            if stale {
                RowStatus::Stale
            } else {
                RowStatus::Present
            },
        );
        match written_at {
            _ if !self.stamped => self.written.push(written_at),
            None => self.stamps.extend_from_slice(EPOCH),
            Some(t) => iso_stamp(&mut self.stamps, t)?,
        }
        Some(())
    }

    /// The row of an entity from its values' JSON array (`spans`: where each element
    /// starts and ends) and present pattern: those answered, or, with `picks`, the
    /// group's, of which `picks` are answered. None where they do not match (Python
    /// answers), or the write time is past year 9999.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        id: &Id<'_>,
        values: &[u8],
        spans: &[(usize, usize)],
        present: &[u8],
        picks: Option<&[usize]>,
        written_at: Option<i64>,
        now: i64,
        max_age: Option<i64>,
    ) -> Option<()> {
        if spans.len() != present.len() {
            return None;
        }
        if picks.map_or(present.len(), <[usize]>::len) != self.width {
            return None;
        }
        self.begin(id, written_at, now, max_age)?;
        let base = self.values.len();
        self.values.extend_from_slice(values);
        for k in 0..self.width {
            let fi = picks.map_or(Some(k), |p| p.get(k).copied())?;
            let (&(start, end), &p) = (spans.get(fi)?, present.get(fi)?);
            self.cell(base + start, base + end, p == 0);
        }
        Some(())
    }

    /// The row of an entity from its stored values, one per feature answered (of these
    /// `types`), each written as JSON straight into its cell: a planned read's reply,
    /// without the JSON array `write_values` would make and `row` would split. None where
    /// a value is one the native core does not take (Python answers), or as `row`.
    fn stored_row(
        &mut self,
        id: &Id<'_>,
        types: &[(u8, u32)],
        stored: &[Option<&[u8]>],
        written_at: Option<i64>,
        now: i64,
        max_age: Option<i64>,
    ) -> Option<()> {
        if types.len() != self.width || stored.len() != self.width {
            return None;
        }
        self.begin(id, written_at, now, max_age)?;
        let (write, missing): (Writer, _) = if self.proto {
            (proto_value, MISSING_VALUE)
        } else {
            (json_value, b"null".as_slice())
        };
        for (&(type_code, dim), value) in types.iter().zip(stored) {
            let start = self.values.len();
            match value {
                None => self.values.extend_from_slice(missing),
                Some(data) => write(&mut self.values, type_code, dim, data).ok()?,
            }
            self.cell(start, self.values.len(), value.is_none());
        }
        Some(())
    }

    fn cell(&mut self, start: usize, end: usize, lacking: bool) {
        self.cells.push((start, end, lacking));
        self.cell_bytes += end - start;
    }

    /// Row `r`'s cell of feature `k`: its JSON's span, and whether the row lacks it.
    fn cell_of(&self, r: usize, k: usize) -> Option<(usize, usize, bool)> {
        if k >= self.width {
            return None;
        }
        self.cells.get(r * self.width + k).copied()
    }

    /// The room what `write_ids` and `write_column` write takes, about (Feast's answer
    /// repeats each row's status and event time per feature).
    fn room(&self) -> usize {
        let rows = self.statuses.len();
        let repeated = rows * b"\"OUTSIDE_MAX_AGE\",".len() + self.stamps.len() + 64;
        self.ids.len() + self.cell_bytes + self.cells.len() + (self.width + 1) * repeated
    }

    /// The join key's column: the rows' ids, each "PRESENT" at the epoch.
    fn write_ids(&self, out: &mut Vec<u8>) {
        let rows = self.statuses.len();
        let each = |out: &mut Vec<u8>, item: &[u8]| {
            for r in 0..rows {
                if r > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(item);
            }
        };
        out.extend_from_slice(b"{\"values\":[");
        out.extend_from_slice(&self.ids);
        out.extend_from_slice(b"],\"statuses\":[");
        each(out, b"\"PRESENT\"");
        out.extend_from_slice(b"],\"event_timestamps\":[");
        each(out, EPOCH);
        out.extend_from_slice(b"]}");
    }

    /// The rows' statuses joined: a feature's own where no row lacks its value.
    fn joined_statuses(&self) -> Vec<u8> {
        let mut statuses = Vec::with_capacity(self.statuses.len() * b"\"OUTSIDE_MAX_AGE\",".len());
        for (r, status) in self.statuses.iter().enumerate() {
            if r > 0 {
                statuses.push(b',');
            }
            statuses.extend_from_slice(status.feast());
        }
        statuses
    }

    /// Feature `k`'s column, after a comma (`statuses`: `joined_statuses`).
    fn write_column(&self, k: usize, statuses: &[u8], out: &mut Vec<u8>) {
        let cells = self.cells.iter().skip(k).step_by(self.width);
        out.extend_from_slice(b",{\"values\":[");
        let mut any_lacking = false;
        for (r, &(start, end, lacking)) in cells.clone().enumerate() {
            if r > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&self.values[start..end]);
            any_lacking |= lacking;
        }
        out.extend_from_slice(b"],\"statuses\":[");
        if any_lacking {
            for (r, (&(_, _, lacking), status)) in cells.zip(&self.statuses).enumerate() {
                if r > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(if lacking {
                    b"\"NULL_VALUE\""
                } else {
                    status.feast()
                });
            }
        } else {
            out.extend_from_slice(statuses);
        }
        out.extend_from_slice(b"],\"event_timestamps\":[");
        out.extend_from_slice(&self.stamps);
        out.extend_from_slice(b"]}");
    }
}

/// Feast's columns of one lookup (`parts`: those of each group it reads, in the form's
/// order, their rows the same ids): the join key's, then each feature's, in `order` (the
/// part and its column, per column of the answer; empty: the parts' columns in turn).
fn write_columns(parts: &[&Cells], order: &[(usize, usize)], out: &mut Vec<u8>) {
    let first = match parts.first() {
        Some(first) => first,
        None => return,
    };
    out.reserve(parts.iter().map(|c| c.room()).sum());
    first.write_ids(out);
    let joined: Vec<Vec<u8>> = parts.iter().map(|c| c.joined_statuses()).collect();
    if order.is_empty() {
        for (columns, statuses) in parts.iter().zip(&joined) {
            for k in 0..columns.width {
                columns.write_column(k, statuses, out);
            }
        }
    } else {
        for &(p, k) in order {
            parts[p].write_column(k, &joined[p], out);
        }
    }
}

/// The rows of a lookup over several groups whose values are the groups' in turn (a form
/// without an `order`: all of the entity's features, whole groups, a group's features
/// then another's), written as each entity's groups come, in the form's order: a group's
/// values copied whole after the one before (its JSON array's elements, its records), and
/// their statuses and the group's age kept until the row closes after the last. Its bytes
/// are those `Rows` writes from cells, for the other orders.
#[derive(Default)]
struct JoinedRow {
    row: Vec<u8>,      // gRPC: the row's record so far
    statuses: Vec<u8>, // REST: `,"present"` and the like; gRPC: the status codes
    ages: Vec<u8>,     // REST: `"group":age` joined by commas; gRPC: the `ages` records
    any: bool,         // REST: a value written in the row so far
}

impl JoinedRow {
    /// One for the rows of `api`'s answers of `form`, where they are written joined.
    fn of(api: u8, form: &Form) -> Option<Self> {
        (api != FEAST && form.parts.len() > 1 && form.order.is_empty()).then(JoinedRow::default)
    }

    /// Part `p`'s values of an entity (`first`: the lookup's first; `values`: their answer
    /// bytes, REST's a JSON array, as `Form::row` takes them), after those of the parts
    /// before. None where REST's values are not an array (never: an entry's are).
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        out: &mut Vec<u8>,
        form: &Form,
        api: u8,
        first: bool,
        id: &Id<'_>,
        p: usize,
        values: &[u8],
        present: &[u8],
        written_at: Option<i64>,
        now: i64,
    ) -> Option<()> {
        let part = form.parts.get(p)?;
        let last = p + 1 == form.parts.len();
        let (age, stale) = age_of(written_at, false, now, part.max_age);
        if api == GRPC {
            if p == 0 {
                self.row.clear();
                self.statuses.clear();
                self.ages.clear();
                grpc_id(&mut self.row, id.grpc());
            }
            self.row.extend_from_slice(values);
            let code = |&flag: &u8| status_code(flag, stale);
            self.statuses.extend(present.iter().map(code));
            if let Some(age) = age {
                grpc_age(&mut self.ages, &part.label, age);
            }
            if last {
                self.row.push(0x1A);
                put_varint(&mut self.row, self.statuses.len() as u64);
                self.row.extend_from_slice(&self.statuses);
                self.row.extend_from_slice(&self.ages);
                out.push(0x1A);
                put_varint(out, self.row.len() as u64);
                out.extend_from_slice(&self.row);
            }
            return Some(());
        }
        if p == 0 {
            if !first {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            id.json(out);
            out.extend_from_slice(b",\"values\":[");
            self.statuses.clear();
            self.ages.clear();
            self.any = false;
        }
        let elements = values.strip_prefix(b"[")?.strip_suffix(b"]")?;
        if !elements.is_empty() {
            if self.any {
                out.push(b',');
            }
            out.extend_from_slice(elements);
            self.any = true;
        }
        for &flag in present {
            self.statuses.push(b',');
            self.statuses.extend_from_slice(status_json(flag, stale));
        }
        if p > 0 {
            self.ages.push(b',');
        }
        json_age(&mut self.ages, &part.label, age);
        if last {
            out.extend_from_slice(b"],\"statuses\":[");
            out.extend_from_slice(self.statuses.get(1..).unwrap_or_default());
            out.extend_from_slice(b"],\"ages\":{");
            out.extend_from_slice(&self.ages);
            out.extend_from_slice(b"}}");
        }
        Some(())
    }
}

/// The rows of a lookup over several groups, from each group's cells (`parts`, in the
/// form's order, their rows the same ids), as the handlers write them
/// (`rest_api._picked_rows`, `grpc_server._answer_rows`): per row its id, the values in
/// the form's `order` (the part and its value there, per value of the row: never the
/// parts' in turn, which `JoinedRow` writes), their statuses, and each group's age under
/// its part's label.
struct Rows<'c> {
    parts: &'c [&'c Cells],
    form: &'c Form,
    order: &'c [(usize, usize)],
    now: i64,
}

#[derive(Clone, Copy, PartialEq)]
enum Status {
    Present,
    Missing,
    Stale,
}

impl<'c> Rows<'c> {
    fn new(parts: &'c [&'c Cells], form: &'c Form, now: i64) -> Self {
        Rows {
            parts,
            form,
            order: &form.order,
            now,
        }
    }

    /// Row `r`'s values in the answer's order: each one's part, its span in that part's
    /// `values`, and its status. None where a part lacks the row or the cell (never:
    /// `HitWriter::entity` gives each part each row).
    fn values(&self, r: usize) -> impl Iterator<Item = Option<(usize, usize, usize, Status)>> + '_ {
        self.order.iter().map(move |&(p, k)| {
            let cells = *self.parts.get(p)?;
            let (start, end, lacking) = cells.cell_of(r, k)?;
            let status = match (lacking, *cells.statuses.get(r)?) {
                (true, _) | (_, RowStatus::NotFound) => Status::Missing,
                (false, RowStatus::Stale) => Status::Stale,
                (false, RowStatus::Present) => Status::Present,
            };
            Some((p, start, end, status))
        })
    }

    /// Row `r`'s values written one after the other (`comma`: joined by commas, as JSON),
    /// each run of them that lies so in its part's `values` copied at once (a group's
    /// features asked for in its order, from an entry's JSON or records), and their
    /// statuses given to `status` in turn.
    fn write_values(
        &self,
        r: usize,
        comma: bool,
        out: &mut Vec<u8>,
        mut status: impl FnMut(Status),
    ) -> Option<()> {
        let gap = usize::from(comma);
        let mut run: Option<(usize, usize, usize)> = None; // part, start, end
        let mut first = true;
        let mut flush = |run: (usize, usize, usize), out: &mut Vec<u8>| -> Option<()> {
            if comma && !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(self.parts[run.0].values.get(run.1..run.2)?);
            Some(())
        };
        for value in self.values(r) {
            let (p, start, end, value_status) = value?;
            status(value_status);
            run = match run {
                Some((q, from, to))
                    if q == p
                        && start == to + gap
                        && (!comma || self.parts[p].values.get(to) == Some(&b',')) =>
                {
                    Some((q, from, end))
                }
                Some(done) => {
                    flush(done, out)?;
                    Some((p, start, end))
                }
                None => Some((p, start, end)),
            };
        }
        if let Some(done) = run {
            flush(done, out)?;
        }
        Some(())
    }

    /// Row `r`'s age of each group (None: not known), with the group's label.
    fn ages(&self, r: usize) -> impl Iterator<Item = Option<(&'c [u8], Option<i64>)>> + '_ {
        let now = self.now;
        self.parts
            .iter()
            .zip(&self.form.parts)
            .map(move |(cells, part)| {
                let written = *cells.written.get(r)?;
                Some((&part.label[..], age_at(written, now)))
            })
    }

    /// REST's rows: `{"id":..,"values":[..],"statuses":[..],"ages":{..}}`, joined by commas.
    fn write_json(&self, ids: &[Id<'_>], out: &mut Vec<u8>) -> Option<()> {
        let mut statuses = Vec::with_capacity(self.order.len() * 10);
        for (r, id) in ids.iter().enumerate() {
            if r > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            id.json(out);
            statuses.clear();
            out.extend_from_slice(b",\"values\":[");
            self.write_values(r, true, out, |status| {
                statuses.extend_from_slice(match status {
                    Status::Present => b",\"present\"".as_slice(),
                    Status::Missing => b",\"missing\"",
                    Status::Stale => b",\"stale\"",
                })
            })?;
            out.extend_from_slice(b"],\"statuses\":[");
            out.extend_from_slice(statuses.get(1..).unwrap_or_default());
            out.extend_from_slice(b"],\"ages\":{");
            for (p, age) in self.ages(r).enumerate() {
                let (label, age) = age?;
                if p > 0 {
                    out.push(b',');
                }
                json_age(out, label, age);
            }
            out.extend_from_slice(b"}}");
        }
        Some(())
    }

    /// gRPC's rows: per row a `GetFeaturesResponse.rows` record (field 3) of a `FeatureRow`:
    /// its id, its values records, its packed statuses (PRESENT 1, MISSING 2, STALE 3), and
    /// one `ages` map entry per group whose age is known (as `write_grpc_row`).
    fn write_grpc(&self, ids: &[Id<'_>], out: &mut Vec<u8>) -> Option<()> {
        let mut row = Vec::new();
        let mut codes = Vec::with_capacity(self.order.len());
        for (r, id) in ids.iter().enumerate() {
            row.clear();
            codes.clear();
            grpc_id(&mut row, id.grpc());
            self.write_values(r, false, &mut row, |status| {
                codes.push(match status {
                    Status::Present => 1,
                    Status::Missing => 2,
                    Status::Stale => 3,
                })
            })?;
            row.push(0x1A);
            put_varint(&mut row, codes.len() as u64);
            row.extend_from_slice(&codes);
            for age in self.ages(r) {
                if let (label, Some(age)) = age? {
                    grpc_age(&mut row, label, age);
                }
            }
            out.push(0x1A);
            put_varint(out, row.len() as u64);
            out.extend_from_slice(&row);
        }
        Some(())
    }
}

/// End the answer of `api` begun with its form's head, from the `cells` gathered of each
/// part (none: the rows of one group's, written already): the rows over several groups
/// (`ids`, the lookup's), or Feast's columns (`write_columns`); then the closing brackets
/// of a JSON answer.
fn close_answer(
    api: u8,
    form: &Form,
    cells: &[&Cells],
    ids: &[Id<'_>],
    now: i64,
    out: &mut Vec<u8>,
) -> Option<()> {
    if api == FEAST {
        write_columns(cells, &form.order, out);
    } else if !cells.is_empty() {
        let rows = Rows::new(cells, form, now);
        match api {
            GRPC => rows.write_grpc(ids, out)?,
            _ => rows.write_json(ids, out)?,
        }
    }
    if api != GRPC {
        out.extend_from_slice(b"]}");
    }
    Some(())
}

/// A write time as Feast's event timestamp, `"%Y-%m-%dT%H:%M:%SZ"` in UTC, as
/// `feast_api._timestamp` writes it (`time.strftime` of `time.gmtime`); None outside
/// 1970 to 9999.
fn iso_stamp(out: &mut Vec<u8>, t: i64) -> Option<()> {
    if !(0..=LAST_STAMP).contains(&t) {
        return None;
    }
    let (days, secs) = (t / 86_400, t % 86_400);
    // the civil date of a day count (H. Hinnant's `civil_from_days`)
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3_600, secs % 3_600 / 60, secs % 60);
    // each part as two digits (the year as two pairs), without `write!`'s formatter:
    // one stamp per row answered
    let mut text = *b"\"0000-00-00T00:00:00Z\"";
    for (at, n) in [
        (1, year / 100),
        (3, year % 100),
        (6, month),
        (9, day),
        (12, h),
        (15, m),
        (18, s),
    ] {
        text[at] = b'0' + (n / 10) as u8;
        text[at + 1] = b'0' + (n % 10) as u8;
    }
    out.extend_from_slice(&text);
    Some(())
}

/// Where each `FeatureRow.values` record of `wire` (tag 0x12, length, payload) starts and
/// ends, its tag included. None if `wire` is not such records alone.
fn value_records(wire: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
    out.clear();
    let mut pos = 0;
    while pos < wire.len() {
        let start = pos;
        if wire[pos] != 0x12 {
            return None;
        }
        pos += 1;
        let len = usize::try_from(read_varint(wire, &mut pos).ok()?).ok()?;
        pos = pos.checked_add(len).filter(|&end| end <= wire.len())?;
        out.push((start, pos));
    }
    Some(())
}

/// What a byte is to `json_elements`: nothing (0), a comma (1), an opening (2) or closing
/// (3) bracket or brace, a quote (4).
static JSON_CLASSES: [u8; 256] = {
    let mut classes = [0u8; 256];
    classes[b',' as usize] = 1;
    classes[b'[' as usize] = 2;
    classes[b'{' as usize] = 2;
    classes[b']' as usize] = 3;
    classes[b'}' as usize] = 3;
    classes[b'"' as usize] = 4;
    classes
};

/// Where each element of the JSON array `json` starts and ends (commas and brackets
/// excluded), strings and nested arrays or objects kept whole. None if `json` is not an
/// array. One table lookup per byte outside strings: a hit of some features splits its
/// entry's JSON (about 1.2 KB of the standard shape) once per answer.
fn json_elements(json: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
    out.clear();
    if json.len() < 2 || json[0] != b'[' || json[json.len() - 1] != b']' {
        return None;
    }
    let end = json.len() - 1;
    if end == 1 {
        return Some(()); // []
    }
    let inner = &json[..end];
    let (mut depth, mut start, mut i) = (0usize, 1, 1);
    while i < end {
        match JSON_CLASSES[usize::from(inner[i])] {
            0 => {
                while i + 1 < end && JSON_CLASSES[usize::from(inner[i + 1])] == 0 {
                    i += 1; // a number's digits, a literal's letters
                }
            }
            1 => {
                if depth == 0 {
                    out.push((start, i));
                    start = i + 1;
                }
            }
            2 => {
                // an array of numbers (an embedding, a list) whole, at memchr's pace: it ends
                // at the first bracket when neither a quote nor a bracket nor a brace is in it
                let rest = &inner[i + 1..];
                match memchr::memchr3(b'"', b'[', b']', rest) {
                    Some(k) if inner[i] == b'[' && rest[k] == b']' => {
                        if memchr::memchr2(b'{', b'}', &rest[..k]).is_some() {
                            depth += 1;
                        } else {
                            i += k + 1; // its closing bracket
                        }
                    }
                    _ => depth += 1,
                }
            }
            3 => depth = depth.checked_sub(1)?,
            _ => {
                // a string, to its closing quote (None: it does not close)
                i += 1;
                loop {
                    match *inner.get(i)? {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
            }
        }
        i += 1;
    }
    if depth != 0 {
        return None;
    }
    out.push((start, end));
    Some(())
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A stored write time in whole seconds, as `layout.decode_timestamp` reads it (digits, at
/// most one decimal point and nine digits after it, up to 2**40); None for anything else.
pub(crate) fn unix_seconds(text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let (whole, fraction) = match text.iter().position(|&c| c == b'.') {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    if !digits(whole) || fraction.map_or(false, |f| !digits(f) || f.len() > 9) {
        return None;
    }
    let value: u64 = std::str::from_utf8(whole).ok()?.parse().ok()?;
    (value <= 1 << 40).then_some(value as i64)
}

/// A form's `order` as its answers take it (see `Form`; `widths`: how many values each
/// part answers, where known): empty where the answer's values are the parts' in turn.
/// None where it cannot be answered here: an order over a part of a width not known, or
/// one that does not name each of their values once.
fn column_order(
    widths: &[Option<usize>],
    order: Option<Vec<usize>>,
) -> Option<Vec<(usize, usize)>> {
    let order = match order {
        Some(order) => order,
        None => return Some(Vec::new()),
    };
    // each column's part and its column there, the parts' columns in turn
    let mut places = Vec::new();
    for (p, width) in widths.iter().enumerate() {
        places.extend((0..(*width)?).map(|k| (p, k)));
    }
    let mut seen = vec![false; places.len()];
    let mut out = Vec::with_capacity(order.len());
    for &place in &order {
        if std::mem::replace(seen.get_mut(place)?, true) {
            return None;
        }
        out.push(places[place]);
    }
    if out.len() != places.len() {
        return None;
    }
    if order.iter().enumerate().all(|(i, &place)| i == place) {
        out.clear();
    }
    Some(out)
}

/// How many values each of a form's parts answers, where known: its picks (hits: an entry
/// holds its whole group), or, for a planned form (`reads`, those defined), its share of
/// the read its parts share (`GroupRead::splits`, one per part).
fn form_widths(parts: &[Part], reads: Option<&HashMap<u16, Arc<GroupRead>>>) -> Vec<Option<usize>> {
    let shared = reads.and_then(|reads| {
        let read = reads.get(&parts.first()?.group)?;
        let one_read = parts
            .iter()
            .all(|p| p.group == parts[0].group && p.picks.is_none());
        (one_read && read.splits.len() == parts.len()).then_some(read)
    });
    let width = |(k, part): (usize, &Part)| match (&part.picks, shared) {
        (Some(picks), _) => Some(picks.len()),
        (None, Some(read)) => Some(read.splits[k].count),
        (None, None) => None,
    };
    parts.iter().enumerate().map(width).collect()
}

/// One part of a form `HitCache::learn` learns (see there).
type PartItem = (u16, Option<i64>, Option<Vec<usize>>, Vec<u8>);

/// One entry `HitCache::put_many` stores (see there).
type PutItem<'py> = (
    Bound<'py, PyBytes>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
    Option<i64>,
    bool,
    f64,
    f64,
);

/// What Python drains: per API (REST, gRPC, Feast) the answers' times, the entities answered and
/// how many of the answers were read on the front's own connections; hit and negative-hit
/// counts; the keys hit in their refresh window and sampled for shadow
/// checks.
type Drained = (
    [(Vec<f64>, u64, u64, u64); APIS],
    u64,
    u64,
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
);

/// The mirror of one worker's L1 (see the module's text), shared with its REST front.
#[pyclass(frozen, module = "feature_store._native")]
pub struct HitCache {
    pub(crate) hits: Arc<Hits>,
}

#[pymethods]
impl HitCache {
    #[new]
    #[pyo3(signature = (max_ids, max_string_id, shadow_fraction, seed=0, planning=false, compact=false))]
    fn new(
        max_ids: usize,
        max_string_id: usize,
        shadow_fraction: f64,
        seed: u64,
        planning: bool,
        compact: bool,
    ) -> Self {
        let fraction = if shadow_fraction.is_finite() {
            shadow_fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        HitCache {
            hits: Arc::new(Hits {
                planning,
                compact,
                reads: RwLock::new(HashMap::new()),
                entries: RwLock::new(HashMap::new()),
                base: Instant::now(),
                forms: RwLock::new(HashMap::new()),
                served: Mutex::new(Served::default()),
                shadow_below: (fraction * u64::MAX as f64) as u64,
                rng: AtomicU64::new(seed),
                max_ids,
                max_string_id,
            }),
        }
    }

    /// Learn a request form of `api` (0 REST, 1 gRPC, 2 Feast) from Python's answer to it
    /// (see `Form`). `parts`: the groups answering it (one, but for lookups over several
    /// groups of one entity), each as (its key tag, its max_age, the indices of the
    /// features it answers, in the answer's order, when not all of the group's: a Feast
    /// form's hits and a form over several groups always, and its name in a row's "ages":
    /// as JSON for REST, as it is for gRPC). `order`: where the answer's values (REST,
    /// gRPC) or columns (Feast) are not the parts' in turn: per value or column, its place among
    /// them. A Feast form's entity is its join key, and its groups its flags (see
    /// `Asked::feast`). False when full, or when the parts or the order are not ones this
    /// answers.
    #[pyo3(signature = (api, entity, features, groups, parts, head, prefix, int_ids, order=None))]
    #[allow(clippy::too_many_arguments)]
    fn learn(
        &self,
        api: u8,
        entity: &str,
        features: Vec<String>,
        groups: Vec<String>,
        parts: Vec<PartItem>,
        head: Vec<u8>,
        prefix: Vec<u8>,
        int_ids: bool,
        order: Option<Vec<usize>>,
    ) -> bool {
        if usize::from(api) >= APIS || parts.is_empty() {
            return false;
        }
        let parts: Vec<Part> = parts
            .into_iter()
            .map(|(group, max_age, picks, label)| Part {
                group,
                max_age,
                picks,
                label,
            })
            .collect();
        let reads = self.hits.reads.read().unwrap_or_else(|e| e.into_inner());
        let widths = form_widths(&parts, self.hits.planning.then_some(&*reads));
        drop(reads);
        // Feast's columns over several views need each view's width (the rows over several
        // groups in turn do not: `JoinedRow`; in another order, `column_order` does)
        if parts.len() > 1 && api == FEAST && widths.iter().any(Option::is_none) {
            return false;
        }
        let order = match column_order(&widths, order) {
            Some(order) => order,
            None => return false,
        };
        let features: Vec<&str> = features.iter().map(String::as_str).collect();
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        let key = form_key(api, entity, &features, &groups);
        let mut forms = self.hits.forms.write().unwrap_or_else(|e| e.into_inner());
        if forms.len() >= MAX_FORMS && !forms.contains_key(&key) {
            return false;
        }
        forms.insert(
            key,
            Arc::new(Form {
                parts,
                order,
                head,
                prefix,
                int_ids,
            }),
        );
        true
    }

    /// How read `read` reads for planned lookups (and a compact cache's entries of group
    /// `read`): its fields (each group's features, then its freshness field), whether it is
    /// read with HGETALL, its values' types, and `counts`, how many values of each group
    /// it reads (None: one group's, all of `types`). A planned lookup over several groups
    /// of one entity reads them all with one command per id. ValueError where the counts
    /// do not add up to the fields and the types.
    #[pyo3(signature = (read, fields, whole, types, counts=None))]
    fn define_read(
        &self,
        read: u16,
        fields: Vec<Vec<u8>>,
        whole: bool,
        types: Vec<(u8, u32)>,
        counts: Option<Vec<usize>>,
    ) -> PyResult<()> {
        let counts = counts.unwrap_or_else(|| vec![types.len()]);
        let defined = GroupRead::new(fields, whole, types, &counts).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "a read's fields are each group's values and its write time",
            )
        })?;
        let mut reads = self.hits.reads.write().unwrap_or_else(|e| e.into_inner());
        reads.insert(read, Arc::new(defined));
        Ok(())
    }

    /// The commands (and their count) of a planned REST `body`, and the answer written
    /// from `replies` to them (for tests); with `grpc`, of a `GetFeaturesRequest`; with
    /// `feast`, of a Feast `/get-online-features` body.
    #[pyo3(signature = (body, replies=None, grpc=false, feast=false))]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        replies: Option<&[u8]>,
        grpc: bool,
        feast: bool,
    ) -> Option<(Bound<'py, PyBytes>, usize, Option<Bound<'py, PyBytes>>)> {
        let plan = self.hits.plan(api_of(grpc, feast), body)?;
        let answer = replies.and_then(|r| self.hits.render(&plan, r, false));
        Some((
            PyBytes::new(py, &plan.command),
            plan.count,
            answer.map(|a| PyBytes::new(py, &a)),
        ))
    }

    /// Store entries, under one lock (a round trip's): per item its key (group index, 2
    /// bytes big-endian, then the Redis key), values (JSON, or packed in a compact cache;
    /// None: not made yet), gRPC records (None: not made yet), present pattern and
    /// write time, whether it is negative, and that it is fresh for `ttl` seconds from now,
    /// noted for Python from `notice_in` seconds.
    fn put_many(&self, items: Vec<PutItem<'_>>) {
        let now = Instant::now();
        let after = |s: f64| self.hits.ticks(now + crate::seconds(s));
        let mut old = Vec::with_capacity(items.len());
        let hits: Vec<(Box<[u8]>, Hit)> = items
            .into_iter()
            .map(
                |(key, values, wire, present, written_at, negative, ttl, notice_in)| {
                    let hit = Hit {
                        values: values.as_ref().map(Held::new),
                        wire: wire.as_ref().map(Held::new),
                        present: Held::new(&present),
                        written: written_at.unwrap_or(NOT_WRITTEN),
                        negative,
                        expires: after(ttl),
                        notice_at: after(notice_in.min(ttl)),
                        noticed: AtomicBool::new(false),
                        ends: OnceBox::new(),
                    };
                    (Box::<[u8]>::from(key.as_bytes()), hit)
                },
            )
            .collect();
        {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            for (key, hit) in hits {
                old.push(entries.insert(key, hit));
            }
        }
        drop(old); // their bytes objects are released here, with the GIL
    }

    fn discard(&self, key: &[u8]) {
        let old = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            entries.remove(key)
        };
        drop(old);
    }

    fn clear(&self) {
        let old = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *entries)
        };
        drop(old);
    }

    /// Note every entry of `group` on its next hit (a batch write was announced).
    fn notice_group(&self, group: u16) {
        let now = self.hits.ticks(Instant::now());
        let prefix = group.to_be_bytes();
        let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
        for (key, hit) in entries.iter_mut() {
            if key.starts_with(&prefix) {
                hit.notice_at = now;
                *hit.noticed.get_mut() = false;
            }
        }
    }

    fn __len__(&self) -> usize {
        self.hits
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Everything served since the last drain (see `Drained`).
    fn drain(&self) -> Drained {
        let mut served = self.hits.served.lock().unwrap_or_else(|e| e.into_inner());
        let s = std::mem::take(&mut *served);
        let [rest, grpc, feast] = s.seconds;
        (
            [
                (rest, s.entities[0], s.direct[0], s.loaded[0]),
                (grpc, s.entities[1], s.direct[1], s.loaded[1]),
                (feast, s.entities[2], s.direct[2], s.loaded[2]),
            ],
            s.hits,
            s.negative_hits,
            s.refresh,
            s.shadow,
        )
    }

    /// The answer this mirror would give to a REST `body`, None where Python answers (for
    /// tests); with `grpc`, to a `GetFeaturesRequest` message; with `feast`, to a Feast
    /// `/get-online-features` body.
    #[pyo3(signature = (body, grpc=false, feast=false))]
    fn answer<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        grpc: bool,
        feast: bool,
    ) -> Option<Bound<'py, PyBytes>> {
        match self.hits.answer(api_of(grpc, feast), body)? {
            Looked::Answer(out) => Some(PyBytes::new(py, &out)),
            Looked::Missing(_) => None,
        }
    }

    /// The keys Python would be asked to load before the front answers `body` (for tests):
    /// None where it answers at once or hands the request to Python.
    #[pyo3(signature = (body, grpc=false, feast=false))]
    fn missing(&self, body: &[u8], grpc: bool, feast: bool) -> Option<Vec<Vec<u8>>> {
        match self.hits.answer(api_of(grpc, feast), body)? {
            Looked::Answer(_) => None,
            Looked::Missing(missing) => Some(missing.keys),
        }
    }

    /// The answer to `body` once `keys` were loaded (for tests; see `Hits::replay`).
    #[pyo3(signature = (body, keys, grpc=false, feast=false))]
    fn replay<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        mut keys: Vec<Vec<u8>>,
        grpc: bool,
        feast: bool,
    ) -> Option<Bound<'py, PyBytes>> {
        keys.sort_unstable();
        let missing = Missing {
            keys,
            started: Instant::now(),
        };
        let out = self.hits.replay(body, api_of(grpc, feast), &missing)?;
        Some(PyBytes::new(py, &out))
    }
}

/// The API the test helpers' flags name.
fn api_of(grpc: bool, feast: bool) -> u8 {
    match (grpc, feast) {
        (true, _) => GRPC,
        (false, true) => FEAST,
        (false, false) => REST,
    }
}

// --- the request's form: a narrow JSON reading, anything else is Python's --------------

/// A lookup as asked, over REST or gRPC: what its form and its answer need of it.
struct Asked<'a> {
    api: u8,
    started: Instant,
    entity: &'a str,
    ids: Vec<Id<'a>>,
    features: Vec<&'a str>,
    groups: Vec<&'a str>,
}

impl<'a> Asked<'a> {
    /// A lookup of `api` as the front received it.
    fn parse(api: u8, request: &'a [u8]) -> Option<Self> {
        match api {
            REST => Self::rest(request),
            GRPC => Self::grpc(request),
            FEAST => Self::feast(request),
            _ => None,
        }
    }

    /// A Feast `/get-online-features` body in the form answered here (`FeastBody`). Its
    /// form is its join key, its feature references (or its feature service) and its
    /// flags, which stand in the form's groups, named as the body names them.
    fn feast(body: &'a [u8]) -> Option<Self> {
        let started = Instant::now();
        let request: FeastBody<'a> = serde_json::from_slice(body).ok()?;
        let mut groups = Vec::new();
        let features = match request.service {
            Some(service) => {
                groups.push("feature_service");
                vec![service]
            }
            None => request.features,
        };
        if request.full_feature_names {
            groups.push("full_feature_names");
        }
        if request.with_views {
            groups.push("include_feature_view_version_metadata");
        }
        Some(Asked {
            api: FEAST,
            started,
            entity: request.join_key,
            ids: request.ids,
            features,
            groups,
        })
    }

    /// A `POST /v1/features/get` body in the form answered here; not one that bypasses the
    /// cache (Python checks the key's role).
    fn rest(body: &'a [u8]) -> Option<Self> {
        let started = Instant::now();
        let request: GetBody<'a> = serde_json::from_slice(body).ok()?;
        if request.bypass_cache {
            return None;
        }
        Some(Asked {
            api: REST,
            started,
            entity: request.entity_type,
            ids: request.ids,
            features: request.features,
            groups: request.groups,
        })
    }
}

enum Id<'a> {
    Int(i64),
    Str(&'a str),
}

impl Id<'_> {
    /// As JSON: an int's digits, a string quoted (as orjson).
    fn json(&self, out: &mut Vec<u8>) {
        match self {
            Id::Int(n) => json_i64(out, *n),
            Id::Str(s) => json_str(out, s),
        }
    }

    fn grpc(&self) -> GrpcId<'_> {
        match self {
            Id::Int(n) => GrpcId::Int(*n),
            Id::Str(s) => GrpcId::Str(s),
        }
    }
}

struct GetBody<'a> {
    entity_type: &'a str,
    ids: Vec<Id<'a>>,
    features: Vec<&'a str>,
    groups: Vec<&'a str>,
    bypass_cache: bool,
}

struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a form the front answers")
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl<'de> Visitor<'de> for IdVisitor {
            type Value = Id<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an int64 or a string without escapes")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Id<'de>, E> {
                Ok(Id::Int(n))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Id<'de>, E> {
                i64::try_from(n)
                    .map(Id::Int)
                    .map_err(|_| E::custom(Refused))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Id<'de>, E> {
                Ok(Id::Str(s))
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

/// The fields of the fast form, each once; an unknown, repeated or differently typed field
/// (null included), a string with escapes, a number with a fraction: not this form.
impl<'de: 'a, 'a> Deserialize<'de> for GetBody<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BodyVisitor;
        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = GetBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a lookup request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GetBody<'de>, A::Error> {
                let (mut entity, mut ids, mut features, mut groups, mut bypass) =
                    (None, None, None, None, None);
                while let Some(name) = map.next_key::<&'de str>()? {
                    let fresh = match name {
                        "entity_type" => entity.replace(map.next_value::<&'de str>()?).is_none(),
                        "ids" => ids.replace(map.next_value::<Vec<Id<'de>>>()?).is_none(),
                        "features" => features
                            .replace(map.next_value::<Names<'de>>()?.0)
                            .is_none(),
                        "groups" => groups.replace(map.next_value::<Names<'de>>()?.0).is_none(),
                        "bypass_cache" => bypass.replace(map.next_value::<bool>()?).is_none(),
                        _ => false,
                    };
                    if !fresh {
                        return Err(de::Error::custom(Refused));
                    }
                }
                Ok(GetBody {
                    entity_type: entity.ok_or_else(|| de::Error::custom(Refused))?,
                    ids: ids.ok_or_else(|| de::Error::custom(Refused))?,
                    features: features.unwrap_or_default(),
                    groups: groups.unwrap_or_default(),
                    bypass_cache: bypass.unwrap_or(false),
                })
            }
        }
        d.deserialize_map(BodyVisitor)
    }
}

/// A Feast `/get-online-features` body (`feast_api.parse_read`) in the form answered here:
/// one entity column (its ids as in `GetBody`), the features as `features` (strings
/// without escapes) or `feature_service` (which wins, as in Python), the two flags as
/// booleans, each field once. Other fields are skipped, as Python ignores them.
struct FeastBody<'a> {
    join_key: &'a str,
    ids: Vec<Id<'a>>,
    features: Vec<&'a str>,
    service: Option<&'a str>,
    full_feature_names: bool,
    with_views: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for FeastBody<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BodyVisitor;
        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = FeastBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Feast lookup request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FeastBody<'de>, A::Error> {
                let (mut entities, mut features, mut service) = (None, None, None);
                let (mut full, mut views) = (None, None);
                while let Some(name) = map.next_key::<&'de str>()? {
                    let fresh = match name {
                        "entities" => entities.replace(map.next_value::<Column<'de>>()?).is_none(),
                        "features" => features
                            .replace(map.next_value::<Names<'de>>()?.0)
                            .is_none(),
                        "feature_service" => service
                            .replace(map.next_value::<Option<&'de str>>()?)
                            .is_none(),
                        "full_feature_names" => full.replace(map.next_value::<bool>()?).is_none(),
                        "include_feature_view_version_metadata" => {
                            views.replace(map.next_value::<bool>()?).is_none()
                        }
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                            true
                        }
                    };
                    if !fresh {
                        return Err(de::Error::custom(Refused));
                    }
                }
                let Column(join_key, ids) = entities.ok_or_else(|| de::Error::custom(Refused))?;
                Ok(FeastBody {
                    join_key,
                    ids,
                    features: features.unwrap_or_default(),
                    service: service.flatten(),
                    full_feature_names: full.unwrap_or(false),
                    with_views: views.unwrap_or(false),
                })
            }
        }
        d.deserialize_map(BodyVisitor)
    }
}

/// Feast's `entities` of one column: its join key and ids.
struct Column<'a>(&'a str, Vec<Id<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Column<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ColumnVisitor;
        impl<'de> Visitor<'de> for ColumnVisitor {
            type Value = Column<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of one join key's ids")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Column<'de>, A::Error> {
                let Some(join_key) = map.next_key::<&'de str>()? else {
                    return Err(de::Error::custom(Refused));
                };
                let ids = map.next_value::<Vec<Id<'de>>>()?;
                if map.next_key::<&'de str>()?.is_some() {
                    return Err(de::Error::custom(Refused)); // several entities: Python's
                }
                Ok(Column(join_key, ids))
            }
        }
        d.deserialize_map(ColumnVisitor)
    }
}

/// An array of strings without escapes.
struct Names<'a>(Vec<&'a str>);

impl<'de: 'a, 'a> Deserialize<'de> for Names<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NamesVisitor;
        impl<'de> Visitor<'de> for NamesVisitor {
            type Value = Names<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Names<'de>, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<&'de str>()? {
                    names.push(name);
                }
                Ok(Names(names))
            }
        }
        d.deserialize_seq(NamesVisitor)
    }
}

impl<'a> Asked<'a> {
    /// A `GetFeaturesRequest` (serving.proto) in the form answered here: each field in its
    /// wire type, the entity type once, ids of one kind, strings in UTF-8, no bypass, no
    /// other field. Anything else is Python's, which parses it with protobuf.
    fn grpc(data: &'a [u8]) -> Option<Self> {
        let mut request = Asked {
            api: GRPC,
            started: Instant::now(),
            entity: "",
            ids: Vec::new(),
            features: Vec::new(),
            groups: Vec::new(),
        };
        let (mut entity_seen, mut ints, mut strings) = (false, false, false);
        let mut pos = 0;
        while pos < data.len() {
            let tag = read_varint(data, &mut pos).ok()?;
            match tag {
                0x0A | 0x1A | 0x22 | 0x2A => {
                    let len = read_varint(data, &mut pos).ok()? as usize;
                    let end = pos.checked_add(len).filter(|&e| e <= data.len())?;
                    let text = std::str::from_utf8(&data[pos..end]).ok()?;
                    pos = end;
                    match tag {
                        0x0A if !entity_seen => {
                            entity_seen = true;
                            request.entity = text;
                        }
                        0x1A => {
                            strings = true;
                            request.ids.push(Id::Str(text));
                        }
                        0x22 => request.features.push(text),
                        0x2A => request.groups.push(text),
                        _ => return None,
                    }
                }
                0x12 => {
                    // int_ids, packed
                    let len = read_varint(data, &mut pos).ok()? as usize;
                    let end = pos.checked_add(len).filter(|&e| e <= data.len())?;
                    while pos < end {
                        request
                            .ids
                            .push(Id::Int(read_varint(data, &mut pos).ok()? as i64));
                    }
                    if pos != end {
                        return None;
                    }
                    ints = true;
                }
                0x10 => {
                    // one int_id, unpacked
                    request
                        .ids
                        .push(Id::Int(read_varint(data, &mut pos).ok()? as i64));
                    ints = true;
                }
                0x30 => {
                    if read_varint(data, &mut pos).ok()? != 0 {
                        return None; // bypass_cache: Python checks the key's role
                    }
                }
                _ => return None,
            }
        }
        if ints && strings {
            return None;
        }
        Some(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Option<GetBody<'_>> {
        serde_json::from_str(body).ok()
    }

    #[test]
    fn json_elements_are_split_at_the_top_level_commas() {
        let split = |json: &[u8]| {
            let mut at = Vec::new();
            json_elements(json, &mut at).map(|()| {
                at.iter()
                    .map(|&(s, e)| String::from_utf8(json[s..e].to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(split(b"[]"), Some(vec![]));
        assert_eq!(split(b"[1.5]"), Some(vec!["1.5".to_owned()]));
        assert_eq!(
            split(br#"[null,[1,2,[3]],"a,\"]b",{"k":[1,2]},-4]"#),
            Some(
                ["null", "[1,2,[3]]", r#""a,\"]b""#, r#"{"k":[1,2]}"#, "-4"]
                    .map(str::to_owned)
                    .to_vec()
            )
        );
        assert_eq!(split(b"[1,2"), None);
        assert_eq!(split(b"[1,]]"), None);
        assert_eq!(split(br#"["a]"#), None);
        assert_eq!(
            split(br#"["a\\",1]"#),
            Some([r#""a\\""#, "1"].map(str::to_owned).to_vec())
        );
        assert_eq!(split(br#"["a\"]"#), None);
        assert_eq!(
            split(br#"[[1.5,-2e-7],[],["]",3],[[4]],[{"a":[5]}],[{]]"#),
            None // the last one does not close
        );
        assert_eq!(
            split(br#"[[1.5,-2e-7],[],["]",3],[[4]],[{"a":[5]}],7]"#),
            Some(
                [
                    "[1.5,-2e-7]",
                    "[]",
                    r#"["]",3]"#,
                    "[[4]]",
                    r#"[{"a":[5]}]"#,
                    "7"
                ]
                .map(str::to_owned)
                .to_vec()
            )
        );
        assert_eq!(split(br#"["a\]"#), None);
        assert_eq!(split(b"1,2"), None);
    }

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

    #[test]
    fn value_records_are_split_whole() {
        let split = |wire: &[u8]| {
            let mut at = Vec::new();
            value_records(wire, &mut at).map(|()| at)
        };
        assert_eq!(split(b""), Some(vec![]));
        assert_eq!(
            split(b"\x12\x00\x12\x02\x08\x01\x12\x01\x0A"),
            Some(vec![(0, 2), (2, 6), (6, 9)])
        );
        assert_eq!(split(b"\x12\x05\x08"), None); // past the end
        assert_eq!(split(b"\x1A\x00"), None); // another field
    }

    #[test]
    fn the_fast_form_only() {
        let b = parse(r#"{"entity_type":"user","ids":[1,-2,"x"],"groups":["g"]}"#).unwrap();
        assert_eq!(b.entity_type, "user");
        assert_eq!(b.ids.len(), 3);
        assert_eq!(b.groups, vec!["g"]);
        assert!(b.features.is_empty() && !b.bypass_cache);
        for refused in [
            r#"{"entity_type":"user"}"#,
            r#"{"entity_type":"user","ids":[1],"feature":["a"]}"#,
            r#"{"entity_type":"user","ids":[1],"ids":[2]}"#,
            r#"{"entity_type":"user","ids":[1.0]}"#,
            r#"{"entity_type":"user","ids":[18446744073709551615]}"#,
            r#"{"entity_type":"us\u0065r","ids":[1]}"#,
            r#"{"entity_type":"user","ids":[1],"features":null}"#,
            r#"[1]"#,
        ] {
            assert!(parse(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn a_forms_column_order() {
        let two = [Some(2), Some(3)];
        // per column of the answer: its part and its column there
        assert_eq!(
            column_order(&two, Some(vec![2, 0, 4, 1, 3])),
            Some(vec![(1, 0), (0, 0), (1, 2), (0, 1), (1, 1)])
        );
        // the parts' columns in turn: no order kept
        assert_eq!(column_order(&two, Some(vec![0, 1, 2, 3, 4])), Some(vec![]));
        assert_eq!(column_order(&two, None), Some(vec![]));
        // each column once, none past them, all of them
        assert_eq!(column_order(&two, Some(vec![0, 0, 2, 3, 4])), None);
        assert_eq!(column_order(&two, Some(vec![0, 1, 2, 3, 5])), None);
        assert_eq!(column_order(&two, Some(vec![0, 1, 2, 3])), None);
        // a part of a width not known: no order over it
        assert_eq!(column_order(&[Some(2), None], Some(vec![0, 1, 2])), None);
        assert_eq!(column_order(&[None], None), Some(vec![]));
    }

    #[test]
    fn a_forms_widths() {
        let part = |group: u16, width: Option<usize>| Part {
            group,
            max_age: None,
            picks: width.map(|w| (0..w).collect()),
            label: Vec::new(),
        };
        let field = |name: &str| name.as_bytes().to_vec();
        let fields = ["a", "t1", "b", "c", "t2"].map(field).to_vec();
        let joined = GroupRead::new(fields, false, vec![(0, 0); 3], &[1, 2]).unwrap();
        let one = GroupRead::new(["a", "t1"].map(field).to_vec(), false, vec![(0, 0)], &[1]);
        let reads = HashMap::from([(7, Arc::new(joined)), (8, Arc::new(one.unwrap()))]);
        // hits: each part's picks (an entry holds its whole group)
        let hits = [part(0, Some(2)), part(1, None)];
        assert_eq!(form_widths(&hits, None), vec![Some(2), None]);
        // planned: each part's share of the one read they share
        let planned = [part(7, None), part(7, None)];
        assert_eq!(form_widths(&planned, Some(&reads)), vec![Some(1), Some(2)]);
        assert_eq!(form_widths(&planned[..1], Some(&reads)), vec![None]);
        assert_eq!(form_widths(&[part(8, None)], Some(&reads)), vec![Some(1)]);
        let mixed = [part(7, None), part(8, None)];
        assert_eq!(form_widths(&mixed, Some(&reads)), vec![None, None]);
        // a read the counts do not add up for is not defined
        assert!(
            GroupRead::new(["a", "b"].map(field).to_vec(), false, vec![(0, 0)], &[2]).is_none()
        );
    }

    #[test]
    fn the_feast_form_only() {
        let asked = |body: &'static str| Asked::feast(body.as_bytes());
        let a = asked(
            r#"{"features":["v:a","v:b"],"entities":{"k":[1,2]},"project":{"x":[1,"]"]},
                "full_feature_names":true}"#,
        )
        .unwrap();
        assert_eq!((a.api, a.entity, a.ids.len()), (FEAST, "k", 2));
        assert_eq!(a.features, vec!["v:a", "v:b"]);
        assert_eq!(a.groups, vec!["full_feature_names"]);
        // a service wins over the features, as in Python; a null one is none
        let a = asked(r#"{"features":["v:a"],"feature_service":"s","entities":{"k":["x"]}}"#);
        let a = a.unwrap();
        assert_eq!((a.features, a.groups), (vec!["s"], vec!["feature_service"]));
        let a = asked(r#"{"features":["v:a"],"feature_service":null,"entities":{"k":[1]}}"#);
        assert_eq!(a.unwrap().features, vec!["v:a"]);
        for refused in [
            r#"{"features":["v:a"]}"#,
            r#"{"features":["v:a"],"entities":{}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1],"j":[2]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1]},"entities":{"k":[1]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1.5]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1]},"full_feature_names":null}"#,
            r#"{"features":["v:\u0061"],"entities":{"k":[1]}}"#,
        ] {
            assert!(asked(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn event_times_as_strftime_writes_them() {
        let stamp = |t: i64| {
            let mut out = Vec::new();
            iso_stamp(&mut out, t).map(|()| String::from_utf8(out).unwrap())
        };
        for (t, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (951_868_799, "2000-02-29T23:59:59Z"),
            (1_709_164_800, "2024-02-29T00:00:00Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
            (LAST_STAMP, "9999-12-31T23:59:59Z"),
        ] {
            assert_eq!(
                stamp(t).as_deref(),
                Some(format!("\"{text}\"").as_str()),
                "{t}"
            );
        }
        assert_eq!(stamp(-1), None);
        assert_eq!(stamp(LAST_STAMP + 1), None);
    }

    #[test]
    fn write_times_as_the_reference_reads_them() {
        assert_eq!(unix_seconds(b"1700000000"), Some(1_700_000_000));
        assert_eq!(unix_seconds(b"1700000000.123456789"), Some(1_700_000_000));
        assert_eq!(unix_seconds(b"1099511627776"), Some(1 << 40));
        for refused in [
            &b""[..],
            b"1099511627777",
            b"-1",
            b"1.",
            b".5",
            b"1.2.3",
            b"1.1234567890",
            b" 1",
            b"1e9",
            b"99999999999999999999999",
        ] {
            assert_eq!(unix_seconds(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn the_grpc_form_only() {
        // entity_type "u", int_ids [1, -1] packed, groups ["g"]
        let mut m = vec![0x0A, 1, b'u', 0x12, 11, 1];
        m.extend_from_slice(&[0xFF; 9]);
        m.push(0x01);
        m.extend_from_slice(&[0x2A, 1, b'g']);
        let r = Asked::grpc(&m).unwrap();
        assert_eq!(r.entity, "u");
        assert!(matches!(r.ids[..], [Id::Int(1), Id::Int(-1)]));
        assert_eq!(r.groups, vec!["g"]);
        for refused in [
            vec![0x0A, 1, b'u', 0x0A, 1, b'v'], // entity_type twice
            vec![0x10, 1, 0x1A, 1, b'a'],       // int and string ids
            vec![0x30, 1],                      // bypass_cache
            vec![0x38, 1],                      // an unknown field
            vec![0x0A, 5, b'u'],                // cut short
            vec![0x0A, 1, 0xFF],                // not UTF-8
        ] {
            assert!(Asked::grpc(&refused).is_none(), "{refused:?}");
        }
    }
}
