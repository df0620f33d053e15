//! Planned reads: a lookup without the L1 as its Redis commands (`Hits::plan`, as
//! `roundtrip.pack` writes them), and its answer written from Redis's replies
//! (`Hits::render`).

use std::sync::Arc;
use std::time::Instant;

use super::answer::{close_answer, JoinedRow};
use super::asked::{Asked, Id};
use super::cells::Cells;
use super::form::{Form, GroupRead};
use super::{Hits, FEAST, GRPC};
use crate::codecs::json_i64;
use crate::group::write_values;
use crate::time::{unix_now, unix_now_ms, unix_seconds};

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

/// Redis commands, one per key, as one pipeline's bytes.
pub struct Commands {
    pub command: Vec<u8>,
    pub count: usize,
    /// each command's key, as its range in `command` (a cluster routes it by its slot)
    pub keys: Vec<(usize, usize)>,
    /// where each command starts in `command`
    pub starts: Vec<usize>,
}

impl Commands {
    pub(super) fn with_capacity(keys: usize) -> Self {
        Commands {
            command: Vec::with_capacity(keys * 64),
            count: 0,
            keys: Vec::with_capacity(keys),
            starts: Vec::with_capacity(keys),
        }
    }
}

/// Append the command of `read` for the entity at Redis key `key` (an HGETALL, or an HMGET
/// of its fields), as `roundtrip.pack` writes it.
pub(super) fn push_command(commands: &mut Commands, read: &GroupRead, key: &[u8]) {
    let command = &mut commands.command;
    commands.starts.push(command.len());
    if read.shape.whole {
        command.extend_from_slice(b"*2\r\n$7\r\nHGETALL\r\n$");
    } else {
        command.push(b'*');
        json_i64(command, read.shape.count as i64 + 2);
        command.extend_from_slice(b"\r\n$5\r\nHMGET\r\n$");
    }
    json_i64(command, key.len() as i64);
    command.extend_from_slice(b"\r\n");
    commands
        .keys
        .push((command.len(), command.len() + key.len()));
    command.extend_from_slice(key);
    command.extend_from_slice(b"\r\n");
    if !read.shape.whole {
        command.extend_from_slice(&read.fields);
    }
    commands.count += 1;
}

/// The Redis commands of one lookup without the L1 (`Hits::plan`), and what writing its
/// answer from their replies needs (`Hits::render`).
pub struct Plan {
    api: u8,
    form: Arc<Form>,
    read: Arc<GroupRead>,
    ids: Vec<OwnedId>,
    started: Instant,
    pub commands: Commands,
}

impl Hits {
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
        let mut commands = Commands::with_capacity(ids.len());
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
            push_command(&mut commands, &read, &key);
        }
        Some(Plan {
            api: asked.api,
            form,
            read,
            ids: owned,
            started: asked.started,
            commands,
        })
    }

    /// The answer to a planned lookup from Redis's replies to its commands (`buf`, all of
    /// them and nothing else). None where Python answers instead: an error reply (a key
    /// holding another type), a value or write time the native core does not read (Python
    /// names the fault, or reads the form only its reference reads).
    pub fn render(&self, plan: &Plan, buf: &[u8], direct: bool) -> Option<Vec<u8>> {
        let (form, read, api) = (&plan.form, &plan.read, plan.api);
        let now = unix_now();
        // an aggregated group's answer at the time of the read (its tiles' values, owned)
        let now_ms = unix_now_ms();
        let mut answered: Vec<Option<Vec<u8>>> = Vec::new();
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
                    let refs: Vec<Option<&[u8]>>;
                    let (types, stored, written_at) = if read.windowed(k) {
                        let (types, written_at) =
                            read.answered(k, &slots, now_ms, &mut answered)?;
                        refs = answered.iter().map(|v| v.as_deref()).collect();
                        (types, &refs[..], written_at)
                    } else {
                        let (types, stored, written_at) = read.group(k, &slots)?;
                        (types, stored, write_time(written_at)?)
                    };
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
                            out, &mut row, api, first, &id, &values, &present, written_at, false,
                            now,
                        ),
                    }
                }
                continue;
            }
            for (k, (cells, part)) in cells.iter_mut().zip(&form.parts).enumerate() {
                let refs: Vec<Option<&[u8]>>;
                let (types, stored, written_at) = if read.windowed(k) {
                    let (types, written_at) = read.answered(k, &slots, now_ms, &mut answered)?;
                    refs = answered.iter().map(|v| v.as_deref()).collect();
                    (types, &refs[..], written_at)
                } else {
                    let (types, stored, written_at) = read.group(k, &slots)?;
                    (types, stored, write_time(written_at)?)
                };
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
pub(super) fn write_time(stored: Option<&[u8]>) -> Option<Option<i64>> {
    match stored {
        Some(text) => Some(Some(unix_seconds(text)?)),
        None => Some(None),
    }
}
