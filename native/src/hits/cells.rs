//! One group's values of a lookup gathered entity by entity (`Cells`), for answers written
//! in another order than the entries': Feast's columns, and rows over several groups.

use super::asked::Id;
use crate::codecs::{json_value, proto_value, MISSING_VALUE};
use crate::group::Writer;
use crate::time::iso_stamp;

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
pub(super) struct Cells {
    width: usize,                         // the features answered
    stamped: bool,                        // Feast's: ids and event times kept (rows: write times)
    proto: bool,                          // gRPC's: the cells are values records
    ids: Vec<u8>,                         // the join key's values, joined by commas
    stamps: Vec<u8>,                      // each row's event time, joined by commas
    pub(super) written: Vec<Option<i64>>, // rows: each row's write time
    pub(super) statuses: Vec<RowStatus>,  // each row's status
    pub(super) values: Vec<u8>,           // the rows' values' JSON, one row after the other
    cells: Vec<(usize, usize, bool)>,     // per row and feature: its JSON's span, NULL_VALUE
    cell_bytes: usize,                    // the cells' JSON, a NOT_FOUND row's null each time
    rows: usize,                          // the rows to come: room made for them
}

const EPOCH: &[u8] = b"\"1970-01-01T00:00:00Z\"";

/// A row's status in a group (see `Cells`).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum RowStatus {
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
    pub(super) fn new(width: usize, stamped: bool, proto: bool, rows: usize) -> Self {
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
    pub(super) fn not_found(&mut self, id: &Id<'_>) {
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
    pub(super) fn row(
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
    pub(super) fn stored_row(
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
    pub(super) fn cell_of(&self, r: usize, k: usize) -> Option<(usize, usize, bool)> {
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
pub(super) fn write_columns(parts: &[&Cells], order: &[(usize, usize)], out: &mut Vec<u8>) {
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
