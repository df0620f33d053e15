//! `HitCache`, the mirror as Python holds it: forms learned from Python's answers, reads
//! defined, entries put and discarded as the L1 changes, and what was served drained.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use once_cell::race::OnceBox;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::entry::{Held, Hit, BATCH_NOTICE, NOT_WRITTEN, OUTDATED};
use super::form::{column_order, form_widths, Form, GroupRead, Part};
use super::{
    form_key, Hits, Key, Loading, Looked, Map, Missing, Served, APIS, FEAST, GRPC, MAX_FORMS, REST,
};
use crate::front::redis::FrontRedis;
use crate::windows::WindowSpec;

/// An aggregated group's share of a read, from Python: tile ms, longest window ms, each
/// field's values int64, its aggregates (function, field or -1, window ms, n, type code),
/// and the aggregates read.
type WindowShare = (
    i64,
    i64,
    Vec<bool>,
    Vec<(u8, i64, i64, usize, u8)>,
    Vec<usize>,
);

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
/// checks; and the front's own loads (`Loads`).
pub(super) type Drained = (
    [(Vec<f64>, u64, u64, u64); APIS],
    u64,
    u64,
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
    Loads,
);

/// The misses the front loaded itself since the last drain: keys missed, of them those that
/// waited for another lookup's load, keys stored, round trips, entries evicted, entries served
/// stale; the keys of Python's entries its loads replaced (Python drops its own copy); its
/// own entries it refreshed ahead of their expiry, and after their group's batch write; and
/// the keys it loaded and did not store (the admission refused them: `load::admitted`).
pub(super) type Loads = (u64, u64, u64, u64, u64, u64, Vec<Vec<u8>>, u64, u64, u64);

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
                reads: RwLock::new(Map::default()),
                entries: RwLock::new(Map::default()),
                base: Instant::now(),
                forms: RwLock::new(Map::default()),
                served: Mutex::new(Served::default()),
                shadow_below: (fraction * u64::MAX as f64) as u64,
                rng: AtomicU64::new(seed),
                max_ids,
                max_string_id,
                loading: once_cell::sync::OnceCell::new(),
                owned: Mutex::new(Default::default()),
                flights: Mutex::new(Map::default()),
                due: Mutex::new(Vec::new()),
                has_due: AtomicBool::new(false),
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
    /// do not add up to the fields and the types. `windows`: per group, None, or an
    /// aggregated group's layout (tile ms, longest window ms, each field's values int64,
    /// its aggregates) and the aggregates read: its one field is its tiles (`windows`).
    #[pyo3(signature = (read, fields, whole, types, counts=None, windows=None))]
    fn define_read(
        &self,
        read: u16,
        fields: Vec<Vec<u8>>,
        whole: bool,
        types: Vec<(u8, u32)>,
        counts: Option<Vec<usize>>,
        windows: Option<Vec<Option<WindowShare>>>,
    ) -> PyResult<()> {
        let counts = counts.unwrap_or_else(|| vec![types.len()]);
        let windows = windows
            .unwrap_or_default()
            .into_iter()
            .map(|share| {
                share
                    .map(|(tile_ms, longest_ms, ints, aggregates, picks)| {
                        let spec = WindowSpec::from_py(tile_ms, longest_ms, ints, aggregates)?;
                        Ok((Arc::new(spec), picks))
                    })
                    .transpose()
            })
            .collect::<PyResult<Vec<_>>>()?;
        let defined = GroupRead::new(fields, whole, types, &counts, windows).ok_or_else(|| {
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
            PyBytes::new(py, &plan.commands.command),
            plan.commands.count,
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
        let after = |s: f64| self.hits.ticks(now + crate::time::seconds(s));
        let mut old = Vec::with_capacity(items.len());
        let hits: Vec<(Key, Hit)> = items
            .into_iter()
            .map(
                |(key, values, wire, present, written_at, negative, ttl, notice_in)| {
                    let hit = Hit {
                        values: values.as_ref().map(Held::new),
                        wire: wire.as_ref().map(Held::new),
                        raw: None,
                        present: Held::new(&present),
                        written: written_at.unwrap_or(NOT_WRITTEN),
                        negative,
                        fault: false,
                        expires: after(ttl),
                        notice_at: after(notice_in.min(ttl)),
                        noticed: AtomicBool::new(false),
                        visited: AtomicBool::new(false),
                        shadowed: AtomicBool::new(false),
                        ends: OnceBox::new(),
                    };
                    (Key::new(key.as_bytes()), hit)
                },
            )
            .collect();
        {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            for (key, hit) in hits {
                if let Some(replaced) = entries.get(key.as_slice()) {
                    self.hits.forget_own(&key, replaced);
                }
                old.push(entries.insert(key, hit));
            }
        }
        drop(old); // their bytes objects are released here, with the GIL
    }

    /// Python found the data of the entity at `key` broken and keeps that for `ttl`
    /// seconds: the fronts hand its lookups to Python (which answers the fault) instead of
    /// loading it again.
    fn put_fault(&self, key: &[u8], ttl: f64) {
        let now = Instant::now();
        let expires = self.hits.ticks(now + crate::time::seconds(ttl));
        let hit = Hit {
            values: None,
            wire: None,
            raw: None,
            present: Held::Own(Box::default()),
            written: NOT_WRITTEN,
            negative: true,
            fault: true,
            expires,
            notice_at: expires,
            noticed: AtomicBool::new(false),
            visited: AtomicBool::new(false),
            shadowed: AtomicBool::new(false),
            ends: OnceBox::new(),
        };
        let old = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            if let Some(replaced) = entries.get(key) {
                self.hits.forget_own(key, replaced);
            }
            entries.insert(key.into(), hit)
        };
        drop(old);
    }

    fn discard(&self, key: &[u8]) {
        let old = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            entries.remove(key)
        };
        if let Some(hit) = &old {
            self.hits.forget_own(key, hit);
        }
        self.hits.disown(Some(key));
        drop(old);
    }

    fn clear(&self) {
        let old = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            let old = std::mem::take(&mut *entries);
            self.hits.forget_all_own();
            old
        };
        self.hits.disown(None);
        drop(old);
    }

    /// Every entry due for reload, as when invalidations may have been missed (Python's
    /// `LRUCache.expire_all`): the front's own entries expire where they are, so that a
    /// lookup loads them again and, if Redis fails, is answered with them stale (as
    /// Python's expired entries are); Python's are dropped (Python keeps them, expired).
    /// Loads in flight are not stored.
    fn expire_all(&self) {
        let now = self.hits.ticks(Instant::now());
        let old: Vec<Hit> = {
            let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
            let mut pythons = Vec::new();
            for (key, hit) in entries.iter_mut() {
                if hit.own() {
                    hit.expires = hit.expires.min(now);
                } else {
                    pythons.push(key.clone());
                }
            }
            pythons
                .iter()
                .filter_map(|key| entries.remove(key))
                .collect()
        };
        self.hits.disown(None);
        drop(old); // their bytes objects are released here, with the GIL
    }

    /// Load the misses of the fronts' lookups on their own Redis connections (`load.rs`),
    /// with these settings: the TTLs in seconds (a negative TTL of 0: missing entities are
    /// not kept), the jitter (a share: a TTL varies by +- half of it), the last share of a
    /// TTL in which a hit is noted for a refresh, the bounds of the entries loaded so (bytes,
    /// entries), the seconds a lookup waits for another's load of its keys, and the seconds
    /// past its expiry an entry is served stale when Redis fails on a load. Every
    /// group's whole read must be defined (`define_read`, read = group index). Set once:
    /// False the second time.
    #[allow(clippy::too_many_arguments)]
    fn load_misses(
        &self,
        ttl: f64,
        negative_ttl: f64,
        jitter: f64,
        refresh_ahead: f64,
        max_bytes: usize,
        max_entries: usize,
        wait: f64,
        max_stale: f64,
    ) -> bool {
        self.hits.set_loading(Loading {
            ttl,
            negative_ttl,
            jitter: if jitter.is_finite() {
                jitter.clamp(0.0, 2.0)
            } else {
                0.0
            },
            refresh_ahead: if refresh_ahead.is_finite() {
                refresh_ahead.clamp(0.0, 1.0)
            } else {
                0.0
            },
            max_bytes: max_bytes.into(),
            max_entries: max_entries.into(),
            wait: crate::time::seconds(wait),
            max_stale,
        })
    }

    /// New bounds of the entries the fronts loaded themselves (bytes, entries): what the
    /// cache's bounds leave of Python's own entries.
    fn bound(&self, max_bytes: usize, max_entries: usize) {
        self.hits.bound(max_bytes, max_entries);
    }

    /// The entries the fronts loaded themselves: how many, and the bytes they count for.
    fn own_size(&self) -> (usize, usize) {
        self.hits.own_size()
    }

    /// The entry the fronts loaded themselves at `key`, for Python to adopt: its packed
    /// values (None: negative), values JSON and gRPC records (None: not made), present
    /// pattern, write time, and the seconds it stays fresh (negative: expired that long).
    /// None where the entry there is not the fronts' own.
    #[allow(clippy::type_complexity)]
    fn adopt<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
    ) -> Option<(
        Option<Bound<'py, PyBytes>>,
        Option<Bound<'py, PyBytes>>,
        Option<Bound<'py, PyBytes>>,
        Bound<'py, PyBytes>,
        Option<i64>,
        f64,
    )> {
        let now = self.hits.ticks(Instant::now());
        let entries = self.hits.entries.read().unwrap_or_else(|e| e.into_inner());
        let hit = entries.get(key).filter(|hit| hit.own())?;
        let bytes = |held: &Option<Held>| held.as_ref().map(|h| PyBytes::new(py, h.bytes()));
        let raw = if hit.negative {
            None
        } else if self.hits.compact {
            bytes(&hit.values)
        } else {
            Some(bytes(&hit.raw)?)
        };
        let values = if self.hits.compact {
            None
        } else {
            bytes(&hit.values)
        };
        let left = if hit.expires >= now {
            (hit.expires - now) as f64 / 1e9
        } else {
            -((now - hit.expires) as f64 / 1e9)
        };
        Some((
            raw,
            values,
            bytes(&hit.wire),
            PyBytes::new(py, hit.present.bytes()),
            hit.written_at(),
            left,
        ))
    }

    /// The keys (group index, 2 bytes, then the Redis key) of the entries of group `group`
    /// the fronts loaded themselves.
    fn own_keys<'py>(&self, py: Python<'py>, group: u16) -> Vec<Bound<'py, PyBytes>> {
        let prefix = group.to_be_bytes();
        let entries = self.hits.entries.read().unwrap_or_else(|e| e.into_inner());
        entries
            .iter()
            .filter(|(key, hit)| key.starts_with(&prefix) && hit.own())
            .map(|(key, _)| PyBytes::new(py, key))
            .collect()
    }

    /// A batch write of `group` was announced: every entry of Python's is noted on its next
    /// hit, for Python's policy; every one of the front's own is outdated (`OUTDATED`), read
    /// again by the front on its next hit or when Python's sweep queues it
    /// (`refresh_outdated`).
    fn notice_group(&self, group: u16) {
        let prefix = group.to_be_bytes();
        let mut entries = self.hits.entries.write().unwrap_or_else(|e| e.into_inner());
        for (key, hit) in entries.iter_mut() {
            if key.starts_with(&prefix) {
                hit.notice_at = if hit.own() { OUTDATED } else { BATCH_NOTICE };
                *hit.noticed.get_mut() = false;
            }
        }
    }

    /// Have `front` read again those of `keys` (group index, 2 bytes, then the Redis key)
    /// that are the fronts' own entries outdated by their group's batch write and not
    /// queued yet (Python's sweep, at its pace): stored as a refresh is, counted as a batch
    /// write's once stored. How many were queued.
    fn refresh_outdated(&self, keys: Vec<Vec<u8>>, front: &FrontRedis) -> usize {
        let queued = self.hits.queue_outdated(&keys);
        if queued > 0 {
            front.refresh(&self.hits);
        }
        queued
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
            (
                s.misses,
                s.deduplicated,
                s.keys_loaded,
                s.round_trips,
                s.evictions,
                s.stale_serves,
                s.replaced,
                s.refreshed,
                s.generation_refreshed,
                s.passed,
            ),
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
            Looked::Missing(missing) => Some(missing.keys.iter().map(|k| k.to_vec()).collect()),
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
            keys: keys.iter().map(|k| Key::new(k)).collect(),
            absent: Vec::new(),
            started: Instant::now(),
        };
        let out = self.hits.replay(
            body,
            api_of(grpc, feast),
            &missing,
            None,
            &Default::default(),
        )?;
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
