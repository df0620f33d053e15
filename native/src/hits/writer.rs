//! One lookup's answer written from the L1's entries, entity by entity (`HitWriter`),
//! some features picked from an entry's answer bytes (`Picked`).

use std::sync::Arc;

use super::answer::{close_answer, JoinedRow};
use super::asked::Id;
use super::cells::Cells;
use super::entry::Hit;
use super::form::{Form, GroupRead};
use super::split::value_records;
use super::{Map, FEAST, GRPC};
use crate::group::{packed_picks, write_packed, write_packed_picks};

/// Writes one lookup's answer from the L1's entries, entity by entity (`entity`), then
/// closes it (`finish`): rows of this API's REST or gRPC answer, or Feast's columns.
pub(super) struct HitWriter<'f> {
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
    pub(super) fn new(
        api: u8,
        form: &'f Form,
        reads: Option<&Map<u16, Arc<GroupRead>>>,
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

    /// Entity `i`'s part of the answer, from its entry of the form's part `p`; `stale`:
    /// an expired entry served because Redis is failing, its values marked stale (rows of
    /// one group only). None where the entry's bytes are not what they should be, or it is
    /// stale in another form (Python answers).
    pub(super) fn entity(
        &mut self,
        out: &mut Vec<u8>,
        i: usize,
        id: &Id<'_>,
        p: usize,
        hit: &Hit,
        stale: bool,
    ) -> Option<()> {
        let (api, form, now) = (self.api, self.form, self.now);
        let part = form.parts.get(p)?;
        let writer = self.parts.get_mut(p)?;
        if stale && (writer.columns.is_some() || self.joined.is_some()) {
            return None;
        }
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
        form.row(
            out,
            row,
            api,
            i == 0,
            id,
            values,
            present,
            written_at,
            stale,
            now,
        );
        Some(())
    }

    /// The answer closed (`close_answer`; `ids`, the lookup's).
    pub(super) fn finish(&self, out: &mut Vec<u8>, ids: &[Id<'_>]) -> Option<()> {
        let cells: Vec<&Cells> = self
            .parts
            .iter()
            .filter_map(|p| p.columns.as_ref())
            .collect();
        close_answer(self.api, self.form, &cells, ids, self.now, out)
    }
}

/// Some of an entry's values, picked from its answer bytes for a form that asks for some of
/// the group's features: those values (REST: a JSON array; gRPC: their `FeatureRow.values`
/// records) and their present pattern, as `GroupCodec.picked_rows` and
/// `wire.picked_values` write them from the packed values (a compact entry's are written
/// picked, `write_packed_picks`).
#[derive(Default)]
pub(super) struct Picked {
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
