//! `HitCache`, the worker's L1 as Python holds it: forms learned from Python's answers,
//! reads defined, the entries Python stores and looks at (`store.rs`), and what was served
//! drained.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::flight::PythonLoad;
use super::form::{column_order, form_widths, Form, GroupRead, Part};
use super::store::{PutItem, View};
use super::{
    form_key, Hits, Key, Loading, Looked, Map, Missing, Served, APIS, FEAST, GRPC, MAX_FORMS, REST,
};
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
/// stale; its own entries it refreshed ahead of their expiry, and after their group's batch
/// write; and the keys it loaded and did not store (the admission refused them:
/// `load::admitted`).
pub(super) type Loads = (u64, u64, u64, u64, u64, u64, u64, u64, u64);

/// One worker's L1 (see the module's text), shared with its fronts.
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

    /// Store entries Python loaded (see `store::PutItem`), under one lock (a round trip's),
    /// counted against the bounds with every other entry: how many entries that evicted.
    fn put_many(&self, items: Vec<PutItem<'_>>) -> u64 {
        let (old, evicted) = self.hits.put_python(items);
        drop(old); // their bytes objects are released here, with the GIL
        evicted
    }

    /// Python found the data of the entity at `key` broken and keeps that for `ttl`
    /// seconds (`fault`: its reason and message, as `NativeCache` writes them): the fronts
    /// hand its lookups to Python (which answers the fault) instead of loading it again.
    fn put_fault(&self, key: &[u8], ttl: f64, fault: &Bound<'_, PyBytes>) {
        drop(self.hits.put_fault(key, ttl, fault));
    }

    /// The entry at `key` as Python sees it (`store::View`); `touch`: a hit (the
    /// eviction's second chance). None where there is none.
    #[pyo3(signature = (key, touch=true))]
    fn entry<'py>(&self, py: Python<'py>, key: &[u8], touch: bool) -> Option<View<'py>> {
        self.hits.view(py, key, touch)
    }

    /// Keep the answer bytes Python made on first use for the entry at `key` (its values
    /// JSON, its gRPC records), counted against the bounds; false where there is none.
    #[pyo3(signature = (key, json=None, wire=None))]
    fn add_answers(
        &self,
        key: &[u8],
        json: Option<Bound<'_, PyBytes>>,
        wire: Option<Bound<'_, PyBytes>>,
    ) -> (bool, usize) {
        let (held, evicted) = self.hits.add_answers(key, json.as_ref(), wire.as_ref());
        (held, evicted.len())
    }

    /// Claim the keys (group index, 2 bytes, then the Redis key) a load of Python's is
    /// about to read, so that a front's lookup missing one waits for it (`PythonLoad`);
    /// those a front is loading already are left out (Python reads them all the same).
    fn claim(&self, mut keys: Vec<Vec<u8>>) -> PythonLoad {
        keys.sort_unstable();
        keys.dedup();
        let keys: Vec<Key> = keys.iter().map(|k| Key::new(k)).collect();
        PythonLoad::claim(&self.hits, &keys)
    }

    /// Drop the entry at `key` (an invalidation); a load of it in flight does not store
    /// what it read. Whether there was one.
    fn discard(&self, key: &[u8]) -> bool {
        self.hits.drop_entry(key).is_some()
    }

    /// Drop every entry; loads in flight store nothing.
    fn clear(&self) {
        drop(self.hits.drop_all());
    }

    /// Every entry due for reload, kept for stale-on-error (invalidations may have been
    /// missed); loads in flight are not stored.
    fn expire_all(&self) {
        self.hits.expire_every();
    }

    /// Load the misses of the fronts' lookups on their own Redis connections (`load.rs`),
    /// with these settings: the TTLs in seconds (a negative TTL of 0: missing entities are
    /// not kept), the jitter (a share: a TTL varies by +- half of it), the last share of a
    /// TTL in which a hit is noted for a refresh, the seconds a lookup waits for another's
    /// load of its keys, and the seconds past its expiry an entry is served stale when
    /// Redis fails on a load. Every group's whole read must be defined (`define_read`, read
    /// = group index). Set once: False the second time.
    fn load_misses(
        &self,
        ttl: f64,
        negative_ttl: f64,
        jitter: f64,
        refresh_ahead: f64,
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
            wait: crate::time::seconds(wait),
            max_stale,
        })
    }

    /// The bounds of every entry (bytes, entries), enforced at once: how many that evicted.
    fn bound(&self, max_bytes: usize, max_entries: usize) -> usize {
        let evicted = self.hits.set_bounds(max_bytes, max_entries);
        evicted.len()
    }

    /// The entries: how many, the bytes they are counted for, and how many of them the
    /// fronts loaded themselves.
    fn size(&self) -> (usize, usize, usize) {
        self.hits.size()
    }

    /// The keys (group index, 2 bytes, then the Redis key) of group `group`'s entries,
    /// those stored last first.
    fn keys<'py>(&self, py: Python<'py>, group: u16) -> Vec<Bound<'py, PyBytes>> {
        let keys = self.hits.group_keys(group);
        keys.iter().map(|key| PyBytes::new(py, key)).collect()
    }

    /// A batch write of `group` was announced (`Hits::notice_group`).
    fn notice_group(&self, group: u16) {
        self.hits.notice_group(group);
    }

    /// Note the entry at `key` for Python's policy again in `notice_in` seconds.
    fn notice_again(&self, key: &[u8], notice_in: f64) {
        self.hits.notice_again(key, notice_in);
    }

    /// A shadow check was drawn for the entry at `key`.
    fn mark_shadowed(&self, key: &[u8]) {
        self.hits.mark_shadowed(key);
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
                s.refreshed,
                s.generation_refreshed,
                s.passed,
            ),
        )
    }

    /// The answer the L1 would give to a REST `body`, None where Python answers (for
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
