//! Bulk updates (docs/writes.md#bulk-updates-through-weightssafetensors): a safetensors file
//! naming any subset of a model file's tensors becomes one commit of every range whose bytes
//! change.
//!
//! Invariants: the update is parsed strictly before anything else (`format::safetensors`),
//! and its header is read only when its declared length is within what the file's tensors
//! can need (`HeaderBound`), so a hostile header costs memory in proportion to the model,
//! not to the upload; every tensor it names must exist with the same dtype and shape, or be
//! a quantized payload constant given as F32, F16 or BF16 values of its float32 view's shape
//! (re-quantized as a `.f32.npy` write is, docs/writes.md#float-values-for-quantized-constants);
//! one mismatch refuses the whole update, naming every mismatch (the first
//! `MISMATCHES_SHOWN` spelled out, the others counted); unchanged tensors are not written;
//! two tensors of one update never write the same bytes; the changed ranges of one file go
//! into one journal and one in-place write (`journal`), so after a crash the file holds
//! entirely the old or entirely the new set.
//!
//! `plan_items` is the planning every update shares: bulk updates by stored name here, and
//! updates by checkpoint name (`names::update`).

use std::collections::HashMap;

use super::float::{body_writes, float_target};
use super::plan::Plan;
use crate::catalog::Catalog;
use crate::content::{Bytes, Source, Write};
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::safetensors::{self, Entry, Header, HeaderBound, TensorInfo};
use crate::format::sharing::TensorId;
use crate::quote;

pub use super::float::FloatTarget;

/// At most this many mismatches are spelled out in a refusal.
pub const MISMATCHES_SHOWN: usize = 20;

/// What an update changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    pub bytes: u64,
}

/// Headers at least this large are followed by giving freed memory back to the system.
const TRIM_FROM: u64 = 1 << 20;

/// Reads and strictly parses the safetensors header of `update`, refusing it from its
/// first 8 bytes when it declares more than `bound`.
pub fn read_header(update: Source, bound: &HeaderBound) -> Result<Header> {
    let hlen = safetensors::header_len(&update.head(8)?, update.len(), Some(bound))?;
    let head = update.head(hlen)?;
    let parsed = safetensors::parse(&head, update.len());
    drop(head);
    if parsed.is_err() {
        give_back_memory(hlen);
    }
    Ok(parsed?)
}

/// After a header of `header_len` bytes was dropped: returns the heap's free memory to the
/// system. The allocator keeps what a large header's many small allocations freed, and a
/// daemon that refused an update should not stay that much larger.
fn give_back_memory(header_len: u64) {
    if header_len < TRIM_FROM {
        return;
    }
    // SAFETY: takes only the size to keep; glibc locks its arenas itself.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0)
    };
}

/// Where a tensor an update names that does not fit may be meant to go instead (another
/// `weights.safetensors` of the mount), said after its mismatch: given the tensor and the
/// entry of that name here, if any.
pub type Hint<'h> = &'h dyn Fn(&TensorInfo, Option<&Entry>) -> Option<String>;

/// New content of one tensor of the model.
#[derive(Debug)]
pub enum Content<'a> {
    /// Bytes in the stored dtype, for the range at `location` that tensor `of` shows.
    Stored {
        location: Location,
        of: Option<TensorId>,
        bytes: Bytes<'a>,
    },
    /// Little-endian float32 values of a quantized payload constant's float view:
    /// re-quantized, with fresh scales, as a `.f32.npy` write is.
    Float {
        target: FloatTarget,
        body: Bytes<'a>,
    },
}

/// One tensor an update changes: `name` is how the summary and refusals call it.
#[derive(Debug)]
pub struct Item<'a> {
    pub name: String,
    pub content: Content<'a>,
}

/// Whether update dtype `dtype` gives float values that a float32 view takes.
pub fn is_float_dtype(dtype: &str) -> bool {
    matches!(dtype, "F32" | "F16" | "BF16")
}

/// The tensor `source` holds, of safetensors dtype `dtype` (F32, F16 or BF16), as
/// little-endian float32 bytes: borrowed when they are already.
pub fn float32_body<'a>(dtype: &str, source: Source<'a>) -> Result<Bytes<'a>> {
    let (size, widen): (u64, fn([u8; 2]) -> f32) = match dtype {
        "F32" => return Ok(Bytes::Staged(source)),
        "F16" => (2, |b| {
            crate::backend::float16::f16_to_f32(u16::from_le_bytes(b))
        }),
        "BF16" => (2, |b| {
            crate::backend::float16::bf16_to_f32(u16::from_le_bytes(b))
        }),
        other => {
            return Err(Error::invalid(format!(
                "{other} values cannot be read as float32"
            )))
        }
    };
    let n = source.len() / size;
    let mut out =
        Vec::with_capacity(usize::try_from(n * 4).map_err(|_| Error::invalid("too large"))?);
    let mut carry: Option<u8> = None;
    let mut buf = Vec::new();
    source
        .for_each_chunk(&mut buf, |mut chunk| {
            if let Some(first) = carry.take() {
                if let Some((&second, rest)) = chunk.split_first() {
                    out.extend_from_slice(&widen([first, second]).to_le_bytes());
                    chunk = rest;
                }
            }
            let whole = chunk.len() / 2 * 2;
            for b in chunk[..whole].chunks_exact(2) {
                out.extend_from_slice(&widen([b[0], b[1]]).to_le_bytes());
            }
            if whole < chunk.len() {
                carry = Some(chunk[whole]);
            }
            Ok(())
        })
        .map_err(|e| Error::io("read the update", e))?;
    Ok(Bytes::Owned(out))
}

/// What an update tensor is for an entry it names.
#[derive(Debug)]
pub enum Fit<'e> {
    /// The same dtype and shape: its bytes.
    Bytes(&'e Entry),
    /// Float values of the float32 view of the quantized constant the entry holds.
    Float(&'e Entry, FloatTarget),
}

/// Keys of named data by file, read once when a float update needs them.
struct Keys<'c> {
    catalog: &'c Catalog,
    by_file: Vec<Option<Vec<String>>>,
}

impl Keys<'_> {
    fn float_target(&mut self, e: &Entry) -> Option<FloatTarget> {
        let TensorId::Key { file, index } = e.of else {
            return None;
        };
        let (file, index) = (file as usize, index as usize);
        let model = &*self.catalog.model;
        if self.by_file.len() < model.files.len() {
            self.by_file.resize(model.files.len(), None);
        }
        let keys = self.by_file[file].get_or_insert_with(|| {
            model
                .named_data_keys(file)
                .into_iter()
                .map(str::to_string)
                .collect()
        });
        float_target(self.catalog, keys.get(index)?)
    }
}

/// Matches the tensors `header` names against `entries` (a file's `weights.safetensors`);
/// returns, for each tensor of the update, the entry it updates and how, or every mismatch
/// (each followed by what `hint` says of it).
pub fn match_entries<'e>(
    catalog: &Catalog, header: &Header, entries: &'e [Entry], hint: Option<Hint>,
) -> Result<Vec<Fit<'e>>> {
    let by_name: HashMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut keys = Keys {
        catalog,
        by_file: Vec::new(),
    };
    let mut matched = Vec::with_capacity(header.tensors.len());
    let mut problems = Vec::new();
    let mut n = 0;
    for t in &header.tensors {
        let found = by_name.get(t.name.as_str()).copied();
        let mut problem = match found {
            None => format!("{}: no such tensor in this file", quote::name(&t.name)),
            Some(e) if e.dtype == t.dtype && e.shape == t.shape => {
                matched.push(Fit::Bytes(e));
                continue;
            }
            Some(e) => {
                let float = is_float_dtype(t.dtype)
                    .then(|| keys.float_target(e))
                    .flatten();
                match float {
                    Some(f) if f.shape == t.shape => {
                        matched.push(Fit::Float(e, f));
                        continue;
                    }
                    Some(f) => format!(
                        "{}: expected {}{:?} (or float values of shape {:?}), found {}{:?}",
                        quote::name(&t.name),
                        e.dtype,
                        e.shape,
                        f.shape,
                        t.dtype,
                        t.shape
                    ),
                    None => format!(
                        "{}: expected {}{:?}, found {}{:?}",
                        quote::name(&t.name),
                        e.dtype,
                        e.shape,
                        t.dtype,
                        t.shape
                    ),
                }
            }
        };
        if let Some(more) = hint.and_then(|h| h(t, found)) {
            problem.push_str(&format!(" ({more})"));
        }
        n += 1;
        // Only those shown are spelled out: a header of many strangers must not make a
        // message as large as itself.
        if problems.len() < MISMATCHES_SHOWN {
            problems.push(problem);
        }
    }
    if n == 0 {
        return Ok(matched);
    }
    let mut message = format!(
        "the update names {n} tensor(s) that do not fit, so nothing was written: {}",
        problems.join("; ")
    );
    if n > MISMATCHES_SHOWN {
        message.push_str(&format!("; and {} more", n - MISMATCHES_SHOWN));
    }
    Err(Error::invalid(message))
}

/// The writes that make `update` (a whole safetensors file) the new content of the tensors
/// it names, among `entries`, and what it changes.
pub fn plan<'a>(
    catalog: &Catalog, entries: &[Entry], update: Source<'a>, hint: Option<Hint>,
) -> Result<(Plan<'a>, Summary)> {
    let header = read_header(update, &HeaderBound::of(entries))?;
    let planned = plan_header(catalog, entries, &header, update, hint);
    let header_len = header.data_start;
    drop(header);
    give_back_memory(header_len);
    planned
}

/// `plan` for an update whose header was read already.
pub fn plan_header<'a>(
    catalog: &Catalog, entries: &[Entry], header: &Header, update: Source<'a>, hint: Option<Hint>,
) -> Result<(Plan<'a>, Summary)> {
    let matched = match_entries(catalog, header, entries, hint)?;
    // Float values are widened one tensor at a time, as the plan takes them.
    let items = header.tensors.iter().zip(matched).map(|(t, fit)| {
        let new = update.slice(header.data_start + t.begin, t.end - t.begin)?;
        let content = match fit {
            Fit::Bytes(e) => Content::Stored {
                location: e.location,
                of: Some(e.of),
                bytes: Bytes::Staged(new),
            },
            Fit::Float(_, target) => Content::Float {
                target,
                body: float32_body(t.dtype, new)?,
            },
        };
        Ok(Item {
            name: t.name.clone(),
            content,
        })
    });
    plan_items(catalog, items)
}

/// The writes that give every item its new content, and what changes: the planning every
/// update shares. Bytes equal to the file's are not written; float values are re-quantized
/// (a refusal names the item); two items that write the same bytes, or bytes that partly
/// overlap, refuse the update.
/// Items are taken one at a time, so that float values made for one (a checkpoint tensor
/// mapped to its stored order) are dropped once re-quantized.
pub fn plan_items<'a>(
    catalog: &Catalog, items: impl IntoIterator<Item = Result<Item<'a>>>,
) -> Result<(Plan<'a>, Summary)> {
    let model = &*catalog.model;
    let mut summary = Summary::default();
    // Each write with the item it comes from.
    let mut writes: Vec<(Write<'a>, usize)> = Vec::new();
    let mut buf = Vec::new();
    let mut names = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let item = item?;
        let candidates: Vec<Write<'a>> = match item.content {
            Content::Stored {
                location,
                of,
                bytes,
            } => vec![Write {
                location,
                bytes,
                of,
            }],
            Content::Float { target, body } => body_writes(
                catalog,
                target.plan,
                target.delegate,
                target.value,
                body.source(),
            )
            .map_err(|e| e.context(quote::name(&item.name)))?,
        };
        let mut changed = 0u64;
        for w in candidates {
            let file = model.files[w.location.file]
                .file
                .as_ref()
                .ok_or_else(|| Error::invalid("the model is not backed by a file"))?;
            // Read through the descriptor, not the mapping: comparing GiBs must not make
            // them resident in the daemon.
            let same = w
                .bytes
                .source()
                .equals_file_range(file, w.location.range.start(), &mut buf)
                .map_err(|err| {
                    Error::io(
                        format!("read {} from the model", quote::name(&item.name)),
                        err,
                    )
                })?;
            if !same {
                changed += w.location.range.len();
                writes.push((w, i));
            }
        }
        if changed > 0 {
            summary.changed.push(item.name.clone());
            summary.bytes += changed;
        } else {
            summary.unchanged.push(item.name.clone());
        }
        names.push(item.name);
    }
    // Tensors on one range are distinct tensors sharing bytes, which the commit keeps
    // apart (`identity`); one tensor written twice, or ranges that only partly overlap,
    // cannot be.
    writes.sort_by_key(|(w, _)| (w.location.file, w.location.range.start()));
    for pair in writes.windows(2) {
        let ((a, i), (b, j)) = (&pair[0], &pair[1]);
        let (la, lb) = (&a.location, &b.location);
        if la.file != lb.file || lb.range.start() >= la.range.end() {
            continue;
        }
        if la != lb {
            return Err(Error::invalid(format!(
                "the update changes {} and {}, whose bytes partly overlap in the model file; update one at a time",
                quote::name(&names[*i]),
                quote::name(&names[*j])
            )));
        }
        if a.of == b.of {
            return Err(Error::invalid(format!(
                "the update writes the same bytes twice, for {} and for {}; give each tensor once",
                quote::name(&names[*i]),
                quote::name(&names[*j])
            )));
        }
    }
    Ok((
        Plan::InPlace {
            writes: writes.into_iter().map(|(w, _)| w).collect(),
        },
        summary,
    ))
}
