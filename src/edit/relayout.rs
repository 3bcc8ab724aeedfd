//! Size-changing commits: a complete new file written beside the original with ExecuTorch's
//! layout rules, parsed back and checked, fsynced, renamed over the original, and the
//! directory fsynced. Mode and owner are kept.
//!
//! Invariants: segment order and the file's own segment alignment are kept; segments that did
//! not change are copied byte for byte (in the kernel, with `copy_file_range`); the original
//! is untouched until the final rename, so a failure at any step leaves it as it was; the new
//! file is unnamed (`O_TMPFILE`) until it is complete, durable and checked, then linked under
//! a name nobody can plant ahead of it (`.<name>.ptefs-new.<16 random hex digits>`, never
//! replacing what has it, see `beside`) and renamed over the model, only while the model's
//! name still names the mounted file. Where the directory has no unnamed files (or this
//! process cannot name one), the new file is created under such a name from the start.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::beside::{name_for, Beside, NAME_MAX};
use super::plan::{Change, Owner};
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::generated::{ptd_fb, pte_fb};
use crate::format::layout::FileIndex;
use crate::format::range::ByteRange;
use crate::format::writer::{
    pack_flat_tensor, pack_program, place_segments, power_of_two_of, ptd_program_region,
    pte_program_region,
};
use crate::format::{Kind, Model, ModelFile};

/// ExecuTorch's default segment alignment, used when a file gives no better evidence.
const DEFAULT_SEGMENT_ALIGNMENT: u64 = 128;
const MAX_ALIGNMENT: u64 = 1 << 16;

/// Room kept at the end of a new file's name for its random digits (`beside::create_unique`).
const MAX_UNIQUE_TAIL: usize = 16;

/// `.<name>.ptefs-new.`: how the names of new files of model `name` start (cut so that
/// the unique tail always fits).
pub(super) fn temp_prefix(model_name: &OsStr) -> Vec<u8> {
    let mut prefix = name_for(model_name, ".ptefs-new.").into_vec();
    prefix.truncate(NAME_MAX - MAX_UNIQUE_TAIL);
    prefix
}

/// New files of an interrupted re-layout of `path` left in its directory.
pub fn leftovers(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Vec::new();
    };
    let prefix = temp_prefix(name);
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().as_bytes().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// The segment alignment a file was written with: the largest power of two dividing the
/// segment base and every non-zero segment offset (ExecuTorch's 128 when offsets say nothing).
pub fn segment_alignment(base: u64, relative_offsets: &[u64]) -> u64 {
    let nonzero: Vec<u64> = relative_offsets
        .iter()
        .copied()
        .filter(|&o| o > 0)
        .collect();
    if nonzero.is_empty() {
        let b = power_of_two_of(base);
        return if b == 0 {
            DEFAULT_SEGMENT_ALIGNMENT
        } else {
            b.min(DEFAULT_SEGMENT_ALIGNMENT)
        };
    }
    let mut a = MAX_ALIGNMENT;
    for v in nonzero.into_iter().chain((base > 0).then_some(base)) {
        a = a.min(power_of_two_of(v));
    }
    a.max(1)
}

/// Where one segment of the new file comes from.
enum SegmentSource<'a> {
    Old(ByteRange),
    New(Source<'a>),
    /// An old segment followed by new pieces, each after zero padding (constant buffers
    /// appended to the constant segment).
    Extended {
        old: ByteRange,
        tail: Vec<(u64, Source<'a>)>,
    },
}

/// Rewrites file `file` of `model` with `change` applied. `watcher` is told before the new
/// file takes the model's name, and may still abandon the commit.
pub fn rewrite(
    model: &Model, file: FileIndex, change: &Change, watcher: &dyn super::FileWatcher,
) -> Result<()> {
    let new = prepare(model, file, change)?;
    replace_model(&new.beside, &new.name, &new.file, new.model, watcher)
}

/// A new file of a re-layout, written, checked and durable beside the model under a name of
/// its own (`.<name>.ptefs-new.<random>`), not yet renamed over it.
pub struct Prepared<'a> {
    beside: Beside<'a>,
    model: &'a ModelFile,
    /// Its name in the model's directory.
    pub name: std::ffi::OsString,
    file: File,
}

/// Writes the new file of `file` of `model` with `change` applied, and names it beside the
/// model; nothing replaces the model yet.
pub fn prepare<'a>(model: &'a Model, file: FileIndex, change: &Change) -> Result<Prepared<'a>> {
    let mf = &model.files[file];
    // Same-size writes alone keep the layout: the file is copied with them in place.
    if let Change::OwnBytes { own, patches } = change {
        if own.is_empty() {
            return super::copy::of_patches(mf, patches);
        }
    }
    let plan = match &mf.kind {
        Kind::Pte(pte) => plan_pte(mf, pte, change)?,
        Kind::Ptd(ptd) => plan_ptd(ptd, change)?,
    };
    let beside = Beside::of(mf)?;
    beside.check_model_named()?;
    // The whole new file is written before the old one goes (and a mount keeps the old one
    // open until it maps the new one).
    beside.need_room(
        plan.base.saturating_add(plan.data_size),
        &format!(
            "re-laying {} out writes a new file of the whole model beside it",
            mf.path.display()
        ),
    )?;
    let prefix = temp_prefix(beside.model_name());
    if let Some(out) = beside.create_unnamed()? {
        let shown = format!("the new (unnamed) file beside {}", mf.path.display());
        let out = write_checked(mf, out, &shown, &plan)?;
        if let Some(name) = beside.link_unique(&out, &prefix)? {
            return Ok(Prepared {
                beside,
                model: mf,
                name,
                file: out,
            });
        }
    }
    let (out, name) = beside.create_unique(&prefix)?;
    let shown = beside.shown(&name);
    match write_checked(mf, out, &shown, &plan) {
        Ok(file) => Ok(Prepared {
            beside,
            model: mf,
            name,
            file,
        }),
        Err(e) => {
            let _ = beside.remove(&name);
            Err(e)
        }
    }
}

impl<'a> Prepared<'a> {
    /// A new file `file` of `model`, complete, durable and named `name` beside it.
    pub(super) fn new(
        beside: Beside<'a>, model: &'a ModelFile, name: std::ffi::OsString, file: File,
    ) -> Prepared<'a> {
        Prepared {
            beside,
            model,
            name,
            file,
        }
    }

    /// The new file's inode and size.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let meta = self
            .file
            .metadata()
            .map_err(io(format!("stat {}", self.beside.shown(&self.name))))?;
        Ok((meta.ino(), meta.len()))
    }

    /// Makes the new file's name durable (fsync of the directory).
    pub fn sync_name(&self) -> Result<()> {
        self.beside.sync()
    }

    /// Tells `watcher` the new file is about to replace the model: an error abandons it.
    pub fn announce(&self, watcher: &dyn super::FileWatcher) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(io(format!("stat {}", self.beside.shown(&self.name))))?;
        watcher.replacing(&self.model.path, &meta)
    }

    /// Renames the new file over the model (once its name still names the mounted file)
    /// and makes the rename durable.
    pub fn replace(self) -> Result<()> {
        self.beside.replace_model(&self.name)
    }

    /// Renames the new file over the model once `watcher` agrees (`rewrite` does this for
    /// a re-layout it prepared); the new file's name is removed if that fails.
    pub fn put_in_place(self, watcher: &dyn super::FileWatcher) -> Result<()> {
        replace_model(&self.beside, &self.name, &self.file, self.model, watcher)
    }

    /// Removes the new file's name: the model stays as it was.
    pub fn abandon(self) {
        let _ = self.beside.remove(&self.name);
    }
}

/// Writes the new file into `out` (created empty), makes it durable and parses it back;
/// returns it.
fn write_checked(mf: &ModelFile, out: File, shown: &str, plan: &NewLayout) -> Result<File> {
    let out = write_new_file(mf, out, shown, plan)?;
    let kept = out.try_clone().map_err(io(format!("duplicate {shown}")))?;
    check_new_file(mf, out, shown, plan)?;
    Ok(kept)
}

/// Renames `name`, the new file `new`, over the model once `watcher` agrees; the name is
/// removed if that fails.
fn replace_model(
    beside: &Beside, name: &OsStr, new: &File, mf: &ModelFile, watcher: &dyn super::FileWatcher,
) -> Result<()> {
    let result = new
        .metadata()
        .map_err(io(format!("stat {}", beside.shown(name))))
        .and_then(|meta| watcher.replacing(&mf.path, &meta))
        .and_then(|_| beside.replace_model(name));
    if result.is_err() {
        let _ = beside.remove(name);
    }
    result
}

/// The new file: its program region, then each segment at its offset from the base, then
/// same-size patches at their new places.
struct NewLayout<'a> {
    /// Header and flatbuffer, up to where padding before the segments starts.
    head: Vec<u8>,
    /// `segment_base_offset`.
    base: u64,
    /// Per segment, where its bytes come from.
    sources: Vec<SegmentSource<'a>>,
    /// Per segment, its offset from `base`.
    offsets: Vec<u64>,
    /// `segment_data_size`: where the last segment ends, from `base` (an empty segment
    /// placed last still counts its aligned offset).
    data_size: u64,
    /// Bytes written over the copied segments: (offset in the new file, bytes).
    patches: Vec<(u64, Source<'a>)>,
}

fn segment_sources<'a>(
    segments: &[ByteRange], change: &'a Change,
) -> Result<Vec<SegmentSource<'a>>> {
    let mut sources: Vec<SegmentSource> = segments.iter().map(|r| SegmentSource::Old(*r)).collect();
    if let Change::Segment { index, data } = change {
        let slot = sources.get_mut(*index).ok_or_else(|| {
            Error::invalid(format!(
                "segment {index} does not exist ({} segments)",
                segments.len()
            ))
        })?;
        *slot = SegmentSource::New(*data);
    }
    Ok(sources)
}

fn source_len(s: &SegmentSource) -> u64 {
    match s {
        SegmentSource::Old(r) => r.len(),
        SegmentSource::New(d) => d.len(),
        SegmentSource::Extended { old, tail } => {
            tail.iter().fold(old.len(), |n, (pad, d)| n + pad + d.len())
        }
    }
}

/// Segment order by original position (ties by index), as ExecuTorch placed them; segments
/// added by the change come last, in the order they were added.
fn original_order(segments: &[ByteRange], total: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&i| (segments[i].start(), i));
    order.extend(segments.len()..total);
    order
}

fn new_offsets(
    segments: &[ByteRange], sources: &[SegmentSource], alignment: u64,
) -> Result<(Vec<u64>, u64)> {
    let sizes: Vec<u64> = sources.iter().map(source_len).collect();
    let offsets = place_segments(&sizes, &original_order(segments, sizes.len()), alignment)
        .ok_or_else(|| Error::invalid("segment layout overflows 64 bits"))?;
    let data_size = offsets
        .iter()
        .zip(&sizes)
        .map(|(o, s)| o + s)
        .max()
        .unwrap_or(0);
    Ok((offsets, data_size))
}

fn plan_pte<'a>(
    mf: &ModelFile, pte: &crate::format::pte::Pte, change: &'a Change,
) -> Result<NewLayout<'a>> {
    let flat = ByteRange::new(0, pte.header.program_size())
        .ok_or_else(|| Error::invalid("the program's size overflows"))?;
    let flat = mf.read(flat)?;
    // Verified when the file was opened; a full unpack keeps every field, inline bytes too.
    let root = flatbuffers::root_with_opts::<pte_fb::Program>(
        &crate::format::pte::verifier_options(),
        &flat,
    )
    .map_err(|e| Error::invalid(format!("re-reading the program failed: {e}")))?;
    let mut program = root.unpack();
    let base = pte.header.segment_base_offset();
    let rel: Vec<u64> = pte.segments.iter().map(|r| r.start() - base).collect();
    let alignment = segment_alignment(base, &rel);
    // Inline vectors keep the alignment they had (16 unless the file was exported with more).
    let inline_alignment = pte
        .inline_delegate_data
        .iter()
        .chain(&pte.inline_constants)
        .flatten()
        .filter(|r| !r.is_empty())
        .map(|r| power_of_two_of(r.start()).clamp(16, 4096))
        .min()
        .unwrap_or(16);
    if let Change::InlineDelegate { index, data } = change {
        let slot = program
            .backend_delegate_data
            .as_mut()
            .and_then(|v| v.get_mut(*index))
            .ok_or_else(|| {
                Error::invalid(format!("inline delegate data {index} does not exist"))
            })?;
        slot.data = Some(data.clone());
    }
    let mut sources = segment_sources(&pte.segments, change)?;
    if let Change::OwnBytes { own, .. } = change {
        for (owner, data) in own {
            give_own_bytes_pte(&mut program, &mut sources, pte, owner, data.source())?;
        }
    }
    let (offsets, data_size) = new_offsets(&pte.segments, &sources, alignment)?;
    let segs = program.segments.get_or_insert_with(Vec::new);
    segs.resize_with(sources.len(), Default::default);
    for (i, s) in segs.iter_mut().enumerate() {
        s.offset = offsets[i];
        s.size = source_len(&sources[i]);
    }
    let patches = placed_patches(change, &pte.segments, &sources, &offsets)?;
    let fb = pack_program(&program, inline_alignment);
    let (head, base) = pte_program_region(
        &fb,
        inline_alignment,
        alignment,
        data_size,
        pte.header.extended.is_some(),
    );
    Ok(NewLayout {
        head,
        base,
        sources,
        offsets,
        data_size,
        patches,
    })
}

/// Buffers start at multiples of this within a constant or mutable segment: the largest
/// power of two dividing every non-zero offset (ExecuTorch's 16 when they say nothing; more
/// padding than a mutable segment needs is harmless).
fn buffer_alignment(offsets: &[u64]) -> u64 {
    offsets
        .iter()
        .filter(|&&o| o > 0)
        .map(|&o| power_of_two_of(o))
        .min()
        .unwrap_or(16)
        .clamp(16, MAX_ALIGNMENT)
}

/// Appends `data` as a new buffer of the segment that `table` describes (the constant
/// segment, or the mutable initial states), after padding to the table's alignment; returns
/// the new buffer's index.
fn append_buffer<'a>(
    table: &mut pte_fb::SubsegmentOffsetsT, sources: &mut [SegmentSource<'a>], old_count: usize,
    data: Source<'a>,
) -> Result<usize> {
    let seg = table.segment_index as usize;
    if seg >= old_count {
        return Err(Error::invalid(format!(
            "buffer segment {seg} does not exist (the file has {old_count})"
        )));
    }
    let offsets = table.offsets.get_or_insert_with(Vec::new);
    let align = buffer_alignment(offsets);
    let slot = &mut sources[seg];
    if let SegmentSource::Old(r) = slot {
        *slot = SegmentSource::Extended {
            old: *r,
            tail: Vec::new(),
        };
    }
    let len = source_len(slot);
    let SegmentSource::Extended { tail, .. } = slot else {
        return Err(Error::invalid(format!(
            "segment {seg} holds buffers and is replaced in the same commit"
        )));
    };
    let at = crate::format::range::align_up(len, align)
        .ok_or_else(|| Error::invalid(format!("segment {seg} overflows")))?;
    tail.push((at - len, data));
    // An empty table still has its placeholder at index 0.
    if offsets.is_empty() {
        offsets.push(0);
    }
    offsets.push(at);
    Ok(offsets.len() - 1)
}

/// Gives one tensor of the program bytes of its own: a named-data entry a new segment;
/// constant values a new buffer appended to the constant segment (or, in files from before
/// the constant segment, to the inline constant buffers); mutable values a new buffer of the
/// initial states the runtime reads (`mutable_data_segments[0]`).
fn give_own_bytes_pte<'a>(
    program: &mut pte_fb::ProgramT, sources: &mut Vec<SegmentSource<'a>>,
    pte: &crate::format::pte::Pte, owner: &Owner, data: Source<'a>,
) -> Result<()> {
    let (mutable, values) = match owner {
        Owner::Key { index } => {
            let segment =
                u32::try_from(sources.len()).map_err(|_| Error::invalid("too many segments"))?;
            let entry = program
                .named_data
                .as_mut()
                .and_then(|v| v.get_mut(*index))
                .ok_or_else(|| Error::invalid(format!("named data {index} does not exist")))?;
            entry.segment_index = segment;
            sources.push(SegmentSource::New(data));
            return Ok(());
        }
        Owner::Buffer { mutable, values } => (*mutable, values),
    };
    let old_count = pte.segments.len();
    let index = if mutable {
        let table = program
            .mutable_data_segments
            .as_mut()
            .and_then(|t| t.first_mut())
            .ok_or_else(|| Error::invalid("the program has no mutable data segment"))?;
        append_buffer(table, sources, old_count, data)?
    } else {
        match program
            .constant_segment
            .as_deref_mut()
            .filter(|c| c.offsets.as_ref().is_some_and(|o| !o.is_empty()))
        {
            Some(table) => append_buffer(table, sources, old_count, data)?,
            None => {
                let buffers = program.constant_buffer.get_or_insert_with(Vec::new);
                buffers.push(pte_fb::BufferT {
                    storage: Some(data.head(data.len())?),
                });
                buffers.len() - 1
            }
        }
    };
    let index = u32::try_from(index).map_err(|_| Error::invalid("too many buffers"))?;
    for &(plan, value) in values {
        let tensor = program
            .execution_plan
            .as_mut()
            .and_then(|p| p.get_mut(plan))
            .and_then(|p| p.values.as_mut())
            .and_then(|v| v.get_mut(value))
            .and_then(|v| match &mut v.val {
                pte_fb::KernelTypesT::Tensor(t) => Some(t),
                _ => None,
            })
            .ok_or_else(|| {
                Error::invalid(format!("value {value} of plan {plan} is not a tensor"))
            })?;
        tensor.data_buffer_idx = index;
    }
    Ok(())
}

/// Where the change's same-size patches go in the new file: each lies inside one old
/// segment, which moved as a whole.
fn placed_patches<'a>(
    change: &'a Change<'a>, old: &[ByteRange], sources: &[SegmentSource], offsets: &[u64],
) -> Result<Vec<(u64, Source<'a>)>> {
    let Change::OwnBytes { patches, .. } = change else {
        return Ok(Vec::new());
    };
    let mut placed = Vec::with_capacity(patches.len());
    for (range, data) in patches {
        let seg = old
            .iter()
            .enumerate()
            .find(|(i, r)| {
                r.start() <= range.start()
                    && range.end() <= r.end()
                    && matches!(
                        sources[*i],
                        SegmentSource::Old(_) | SegmentSource::Extended { .. }
                    )
            })
            .map(|(i, r)| (i, r.start()));
        let Some((i, start)) = seg else {
            return Err(Error::invalid(format!(
                "bytes {}..{} are not inside a segment the commit keeps",
                range.start(),
                range.end()
            )));
        };
        placed.push((offsets[i] + (range.start() - start), data.source()));
    }
    Ok(placed)
}

fn plan_ptd<'a>(ptd: &crate::format::ptd::Ptd, change: &'a Change) -> Result<NewLayout<'a>> {
    let mut ft: ptd_fb::FlatTensorT = ptd.flat_tensor.clone();
    let base = ptd.header.segment_base_offset;
    let rel: Vec<u64> = ptd.segments.iter().map(|r| r.start() - base).collect();
    let alignment = segment_alignment(base, &rel);
    let mut sources = segment_sources(&ptd.segments, change)?;
    if let Change::OwnBytes { own, .. } = change {
        for (owner, data) in own {
            let Owner::Key { index } = *owner else {
                return Err(Error::invalid("a .ptd has no program buffers"));
            };
            let segment =
                u32::try_from(sources.len()).map_err(|_| Error::invalid("too many segments"))?;
            let entry = ft
                .named_data
                .as_mut()
                .and_then(|v| v.get_mut(index))
                .ok_or_else(|| Error::invalid(format!("named data {index} does not exist")))?;
            entry.segment_index = segment;
            sources.push(SegmentSource::New(data.source()));
        }
    }
    let (offsets, data_size) = new_offsets(&ptd.segments, &sources, alignment)?;
    let segs = ft.segments.get_or_insert_with(Vec::new);
    segs.resize_with(sources.len(), Default::default);
    for (i, s) in segs.iter_mut().enumerate() {
        s.offset = offsets[i];
        s.size = source_len(&sources[i]);
    }
    let patches = placed_patches(change, &ptd.segments, &sources, &offsets)?;
    let fb = pack_flat_tensor(&ft);
    let (head, base) = ptd_program_region(&fb, alignment, data_size);
    Ok(NewLayout {
        head,
        base,
        sources,
        offsets,
        data_size,
        patches,
    })
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

fn write_zeros(out: &mut File, n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut left = n;
    while left > 0 {
        let k = left.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// Copies `len` bytes at `offset` of `src` to the current end of `dst`, in the kernel when
/// it can, else through a buffer.
fn copy_range(
    src: &File, dst: &mut File, offset: u64, len: u64, dst_offset: u64,
) -> std::io::Result<()> {
    let done = crate::content::copy_in_kernel(src, offset, dst, dst_offset, len)?;
    if done < len {
        return copy_range_buffered(src, dst, offset + done, len - done, dst_offset + done);
    }
    use std::io::{Seek, SeekFrom};
    dst.seek(SeekFrom::Start(dst_offset + len))?;
    Ok(())
}

fn copy_range_buffered(
    src: &File, dst: &mut File, offset: u64, len: u64, dst_offset: u64,
) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    dst.seek(SeekFrom::Start(dst_offset))?;
    let mut buf = vec![0u8; (len.min(8 << 20)) as usize];
    let mut done = 0;
    while done < len {
        let k = (len - done).min(buf.len() as u64) as usize;
        src.read_exact_at(&mut buf[..k], offset + done)?;
        dst.write_all(&buf[..k])?;
        done += k as u64;
    }
    Ok(())
}

/// Writes the new file into `out` (created empty) and returns it, durable.
fn write_new_file(mf: &ModelFile, mut out: File, shown: &str, plan: &NewLayout) -> Result<File> {
    let NewLayout {
        head,
        base,
        sources,
        offsets,
        data_size,
        ..
    } = plan;
    let base = *base;
    let src = mf
        .file
        .as_ref()
        .ok_or_else(|| Error::invalid("the model is not backed by a file"))?;
    out.write_all(head).map_err(io(format!("write {shown}")))?;
    let mut pos = head.len() as u64;
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| (offsets[i], i));
    let mut buf = Vec::new();
    for i in order {
        let at = base + offsets[i];
        let len = source_len(&sources[i]);
        if len == 0 {
            continue;
        }
        write_zeros(&mut out, at - pos).map_err(io(format!("write {shown}")))?;
        match &sources[i] {
            SegmentSource::New(d) => d
                .write_to(&out, at, &mut buf)
                .and_then(|_| out.seek(SeekFrom::Start(at + len)).map(|_| ()))
                .map_err(io(format!("write {shown}")))?,
            SegmentSource::Old(r) => copy_range(src, &mut out, r.start(), r.len(), at)
                .map_err(io(format!("copy segment {i} into {shown}")))?,
            SegmentSource::Extended { old, tail } => {
                copy_range(src, &mut out, old.start(), old.len(), at)
                    .map_err(io(format!("copy segment {i} into {shown}")))?;
                let mut end = at + old.len();
                for (pad, d) in tail {
                    write_zeros(&mut out, *pad)
                        .and_then(|_| d.write_to(&out, end + pad, &mut buf))
                        .and_then(|_| out.seek(SeekFrom::Start(end + pad + d.len())).map(|_| ()))
                        .map_err(io(format!("write {shown}")))?;
                    end += pad + d.len();
                }
            }
        }
        pos = at + len;
    }
    for (at, d) in &plan.patches {
        d.write_to(&out, base + at, &mut buf)
            .map_err(io(format!("write {shown}")))?;
    }
    out.seek(SeekFrom::Start(pos))
        .map_err(io(format!("write {shown}")))?;
    // The file reaches the end its header declares: past an empty segment placed last, and
    // (when there are segment bytes) at least to the segment base.
    let end = if sources.iter().any(|s| source_len(s) > 0) || *data_size > 0 {
        base + data_size
    } else {
        pos
    };
    if pos < end {
        write_zeros(&mut out, end - pos).map_err(io(format!("write {shown}")))?;
    }
    let meta = src
        .metadata()
        .map_err(io(format!("stat {}", mf.path.display())))?;
    // The owner was set at creation; the mode waits until the bytes are complete, and the
    // attributes (an ACL sets the mode's group bits) come after it.
    // SAFETY: a plain system call on an open descriptor.
    unsafe { libc::fchmod(out.as_raw_fd(), meta.mode() & 0o7777) };
    super::attributes::carry(src, &out, shown)?;
    out.sync_all().map_err(io(format!("fsync {shown}")))?;
    Ok(out)
}

/// Parses the new file back: it must open cleanly and its segments must have the sizes and
/// bytes planned (unchanged segments are compared by size; their bytes were copied verbatim).
fn check_new_file(old: &ModelFile, out: File, shown: &str, plan: &NewLayout) -> Result<()> {
    let sources = &plan.sources;
    let new = ModelFile::from_file(PathBuf::from(shown), out, false).map_err(|e| {
        Error::new(
            libc::EIO,
            format!("the re-laid-out file does not parse back: {e}"),
        )
    })?;
    let segs = match (&new.kind, &old.kind) {
        (Kind::Pte(n), Kind::Pte(_)) => &n.segments,
        (Kind::Ptd(n), Kind::Ptd(_)) => &n.segments,
        _ => return Err(Error::invalid("the re-laid-out file changed kind")),
    };
    if segs.len() != sources.len() {
        return Err(Error::new(
            libc::EIO,
            format!(
                "the re-laid-out file has {} segments, expected {}",
                segs.len(),
                sources.len()
            ),
        ));
    }
    for (i, (r, s)) in segs.iter().zip(sources).enumerate() {
        let bytes = new.read(*r)?;
        let ok = match s {
            SegmentSource::Old(o) => r.len() == o.len(),
            SegmentSource::New(d) => d.equals(&bytes, &mut Vec::new()),
            SegmentSource::Extended { old, tail } => {
                let mut at = old.len() as usize;
                r.len() == source_len(s)
                    && tail.iter().all(|(pad, d)| {
                        at += *pad as usize;
                        let piece = &bytes[at..at + d.len() as usize];
                        at += d.len() as usize;
                        d.equals(piece, &mut Vec::new())
                    })
            }
        };
        if !ok {
            return Err(Error::new(
                libc::EIO,
                format!("the re-laid-out file's segment {i} does not hold the planned bytes"),
            ));
        }
    }
    let base = match &new.kind {
        Kind::Pte(n) => n.header.segment_base_offset(),
        Kind::Ptd(n) => n.header.segment_base_offset,
    };
    for (at, d) in &plan.patches {
        let start = base + at;
        let piece = ByteRange::new(start, d.len())
            .filter(|r| r.end() <= new.len())
            .and_then(|r| new.read(r).ok());
        if !piece.is_some_and(|p| d.equals(p.as_ref(), &mut Vec::new())) {
            return Err(Error::new(
                libc::EIO,
                format!("the re-laid-out file does not hold the bytes written at {start}"),
            ));
        }
    }
    Ok(())
}

/// Removes new files an interrupted re-layout of `path` left behind; returns what it did,
/// one sentence per file. Only regular files owned by the model's owner are removed (a
/// re-layout creates nothing else); anything else with such a name is left alone.
pub fn remove_stale(path: &Path) -> Vec<String> {
    let found = leftovers(path);
    if found.is_empty() {
        return Vec::new();
    }
    let Ok(model) = ModelFile::open(path) else {
        return Vec::new();
    };
    let Ok(beside) = Beside::of(&model) else {
        return Vec::new();
    };
    let owner = model
        .file
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| m.uid());
    let mut said = Vec::new();
    for p in found {
        let name = p.file_name().unwrap_or_default();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !(meta.file_type().is_file() && Some(meta.uid()) == owner) {
            said.push(format!(
                "{}: left alone: it is {}, not a regular file of the model's owner, so not left by a ptefs re-layout (remove it as root if it is not wanted)",
                p.display(),
                super::trust::describe(&meta)
            ));
        } else if beside.remove(name).is_ok() {
            said.push(format!(
                "{}: removed {} left by an interrupted re-layout; the file is unchanged",
                path.display(),
                p.display()
            ));
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_segment_alignment() {
        assert_eq!(segment_alignment(1408, &[0, 128, 1152, 1280]), 128);
        assert_eq!(segment_alignment(1792, &[0]), 128);
        assert_eq!(segment_alignment(4096, &[0, 4096, 8192]), 4096);
        assert_eq!(segment_alignment(320, &[0, 16, 48]), 16);
        assert_eq!(segment_alignment(0, &[]), 128);
    }
}
