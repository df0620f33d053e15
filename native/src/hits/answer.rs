//! The rows of a lookup over several groups (`JoinedRow`: the groups' values in turn;
//! `Rows`: in another order, from each group's cells), and the answer closed
//! (`close_answer`).

use super::asked::Id;
use super::cells::{write_columns, Cells, RowStatus};
use super::form::Form;
use super::{FEAST, GRPC};
use crate::codecs::put_varint;
use crate::rows::{age_at, age_of, grpc_age, grpc_id, json_age, status_code, status_json};

/// The rows of a lookup over several groups whose values are the groups' in turn (a form
/// without an `order`: all of the entity's features, whole groups, a group's features
/// then another's), written as each entity's groups come, in the form's order: a group's
/// values copied whole after the one before (its JSON array's elements, its records), and
/// their statuses and the group's age kept until the row closes after the last. Its bytes
/// are those `Rows` writes from cells, for the other orders.
#[derive(Default)]
pub(super) struct JoinedRow {
    row: Vec<u8>,      // gRPC: the row's record so far
    statuses: Vec<u8>, // REST: `,"present"` and the like; gRPC: the status codes
    ages: Vec<u8>,     // REST: `"group":age` joined by commas; gRPC: the `ages` records
    any: bool,         // REST: a value written in the row so far
}

impl JoinedRow {
    /// One for the rows of `api`'s answers of `form`, where they are written joined.
    pub(super) fn of(api: u8, form: &Form) -> Option<Self> {
        (api != FEAST && form.parts.len() > 1 && form.order.is_empty()).then(JoinedRow::default)
    }

    /// Part `p`'s values of an entity (`first`: the lookup's first; `values`: their answer
    /// bytes, REST's a JSON array, as `Form::row` takes them), after those of the parts
    /// before. None where REST's values are not an array (never: an entry's are).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
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
pub(super) struct Rows<'c> {
    parts: &'c [&'c Cells],
    form: &'c Form,
    order: &'c [(usize, usize)],
    now: i64,
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Status {
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
pub(super) fn close_answer(
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
