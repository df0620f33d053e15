//! Request forms Python answered (`Form`, its `Part`s, one per group) and the reads of
//! planned lookups (`GroupRead`): what an answer needs besides the entities' values.

use std::sync::Arc;

use super::asked::Id;
use super::cells::Cells;
use super::{Map, FEAST, GRPC, REST};
use crate::codecs::json_i64;
use crate::resp::Shape;
use crate::rows::{write_grpc_row, write_row};
use crate::windows::{self, WindowSpec};

/// A request form Python answered: everything an answer needs besides the entries.
pub(super) struct Form {
    // the groups that answer it: one, but for lookups over several groups of one entity
    // (REST's and gRPC's, Feast's over several views)
    pub(super) parts: Vec<Part>,
    // over several groups: per value of a row (REST, gRPC) or column of the answer (Feast),
    // the part that writes it and its place there; empty: the parts' in turn
    // (`column_order`)
    pub(super) order: Vec<(usize, usize)>,
    // REST: `{"entity_type":..,"features":..,"types":..,"results":[`; gRPC: the response's
    // entity_type and features fields
    pub(super) head: Vec<u8>,
    pub(super) prefix: Vec<u8>, // the entity's key prefix and separator: key = prefix + id
    pub(super) int_ids: bool,
}

/// One group of a form: its entries' key tag (a planned form's: the read of its lookups,
/// `GroupRead`, which all its parts share), its max_age, the features answered, and its
/// name in a row's "ages".
pub(super) struct Part {
    pub(super) group: u16,
    pub(super) max_age: Option<i64>,
    // hits of some of the group's features: their indices in the group, in the answer's
    // order (`Picked`); None: all of them, in the group's order
    pub(super) picks: Option<Vec<usize>>,
    pub(super) label: Vec<u8>, // as JSON (REST), as it is (gRPC)
}

impl Part {
    /// This part's cells of an answer of `api` (`several`: of a form over several groups
    /// whose rows are written from cells, in another order than the groups' in turn):
    /// Feast's columns, one per feature answered (those picked, else the `read` values its
    /// read reads of the group), and those REST and gRPC rows; None for the rows of one
    /// group's, or of several in turn (`JoinedRow`).
    pub(super) fn columns(
        &self,
        api: u8,
        read: Option<usize>,
        several: bool,
        rows: usize,
    ) -> Option<Cells> {
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
    pub(super) fn part(&self) -> &Part {
        &self.parts[0]
    }

    /// One entity's row of an answer of `api` from its values' answer bytes (REST: its JSON
    /// array, after a comma unless `first`; gRPC: its records).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn row(
        &self,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
        api: u8,
        first: bool,
        id: &Id<'_>,
        values: &[u8],
        present: &[u8],
        written_at: Option<i64>,
        served_stale: bool,
        now: i64,
    ) {
        if api == REST {
            if !first {
                out.push(b',');
            }
            let id = |o: &mut Vec<u8>| id.json(o);
            let (max_age, label) = (self.part().max_age, &self.part().label);
            write_row(
                out,
                id,
                values,
                present,
                written_at,
                served_stale,
                now,
                max_age,
                label,
            );
        } else {
            let (id, max_age, label) = (id.grpc(), self.part().max_age, &self.part().label);
            write_grpc_row(
                out,
                scratch,
                id,
                values,
                present,
                written_at,
                served_stale,
                now,
                max_age,
                label,
            );
        }
    }
}

/// How a planned read reads its groups, one command per id: its fields' RESP (each
/// group's features, then its freshness field), the reply's shape, its values' types (as
/// `GroupCodec`'s, every group's in turn), and where each group's lie (`Split`). A compact
/// cache's entries are read with their group's whole read.
pub(super) struct GroupRead {
    pub(super) fields: Vec<u8>,
    pub(super) shape: Shape,
    pub(super) types: Vec<(u8, u32)>,
    pub(super) splits: Vec<Split>,
    /// per group: an aggregated group's layout and the aggregates its values are (its one
    /// slot holds its tiles, answered at the time of the read: `windows`)
    pub(super) windows: Vec<Option<Windowed>>,
}

/// A group's write time in unix seconds (None: none stored).
pub(super) type WriteTime = Option<i64>;

/// An aggregated group's share of a read: its layout, and which aggregates are read.
pub(super) type Windowed = (Arc<WindowSpec>, Vec<usize>);

/// One group's share of a reply to a read: its values' types, its stored values, its
/// stored write time.
pub(super) type GroupReply<'s, 'a> = (&'s [(u8, u32)], &'s [Option<&'a [u8]>], Option<&'a [u8]>);

/// One group's share of a read: its values' first slot in a reply and first type, and
/// how many; its write time in the slot after them.
#[derive(Clone, Copy)]
pub(super) struct Split {
    slot: usize,
    first_type: usize,
    pub(super) count: usize,
}

impl GroupRead {
    /// The read of `fields` (their RESP made here), as many values of each group in turn as
    /// `counts` says, each group's followed by its write time. None where the counts do
    /// not add up to the fields and the types.
    pub(super) fn new(
        fields: Vec<Vec<u8>>,
        whole: bool,
        types: Vec<(u8, u32)>,
        counts: &[usize],
        windows: Vec<Option<Windowed>>,
    ) -> Option<Self> {
        let windows = if windows.is_empty() {
            vec![None; counts.len()]
        } else {
            windows
        };
        let values: usize = counts.iter().sum();
        // a plain group's values and write time; an aggregated group's one slot, its tiles
        let slots: usize = (counts.iter().zip(&windows))
            .map(|(count, w)| if w.is_some() { 1 } else { count + 1 })
            .sum();
        if values != types.len() || slots != fields.len() || counts.is_empty() {
            return None;
        }
        if windows.len() != counts.len()
            || (counts.iter().zip(&windows)).any(|(&count, w)| {
                w.as_ref().map_or(false, |(spec, picks)| {
                    picks.len() != count || picks.iter().any(|&a| a >= spec.aggregates.len())
                })
            })
        {
            return None;
        }
        let (mut slot, mut first_type) = (0, 0);
        let splits = (counts.iter().zip(&windows))
            .map(|(&count, w)| {
                let split = Split {
                    slot,
                    first_type,
                    count,
                };
                slot += if w.is_some() { 1 } else { count + 1 };
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
            windows,
        })
    }

    /// Whether group `k` is an aggregated group (its values are answered from its tiles).
    pub(super) fn windowed(&self, k: usize) -> bool {
        matches!(self.windows.get(k), Some(Some(_)))
    }

    /// Aggregated group `k`'s values' types and its write time (unix seconds: its newest
    /// event in its windows), its values answered at `now_ms` from its tiles in a reply's
    /// `slots` into `answered`, as a plain group stores them. None where Python answers.
    pub(super) fn answered(
        &self,
        k: usize,
        slots: &[Option<&[u8]>],
        now_ms: i64,
        answered: &mut Vec<Option<Vec<u8>>>,
    ) -> Option<(&[(u8, u32)], WriteTime)> {
        let Split {
            slot,
            first_type,
            count,
        } = *self.splits.get(k)?;
        let (spec, picks) = self.windows.get(k)?.as_ref()?;
        let types = self.types.get(first_type..first_type + count)?;
        answered.clear();
        let newest = match *slots.get(slot)? {
            Some(state) => {
                let (values, newest) = windows::answer(spec, state, now_ms)?;
                answered.extend(picks.iter().map(|&a| values[a].clone()));
                newest
            }
            None => {
                answered.extend(picks.iter().map(|_| None));
                None
            }
        };
        Some((types, newest.map(|ms| ms.div_euclid(1000))))
    }

    /// Group `k`'s values' types, its stored values in a reply's `slots`, and its write
    /// time's slot there.
    pub(super) fn group<'s, 'a>(
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

/// A form's `order` as its answers take it (see `Form`; `widths`: how many values each
/// part answers, where known): empty where the answer's values are the parts' in turn.
/// None where it cannot be answered here: an order over a part of a width not known, or
/// one that does not name each of their values once.
pub(super) fn column_order(
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
pub(super) fn form_widths(
    parts: &[Part],
    reads: Option<&Map<u16, Arc<GroupRead>>>,
) -> Vec<Option<usize>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let joined = GroupRead::new(fields, false, vec![(0, 0); 3], &[1, 2], vec![]).unwrap();
        let one = GroupRead::new(
            ["a", "t1"].map(field).to_vec(),
            false,
            vec![(0, 0)],
            &[1],
            vec![],
        );
        let reads: Map<u16, Arc<GroupRead>> = [(7, Arc::new(joined)), (8, Arc::new(one.unwrap()))]
            .into_iter()
            .collect();
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
        assert!(GroupRead::new(
            ["a", "b"].map(field).to_vec(),
            false,
            vec![(0, 0)],
            &[2],
            vec![]
        )
        .is_none());
    }
}
