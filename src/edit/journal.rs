//! Crash-safe in-place writes: the new bytes of every changed range go to one checksummed
//! journal beside the file (`begin`), written into an unnamed file (with direct I/O where the
//! file system allows: nothing reads it unless a crash interrupts the commit), fsynced, and
//! only then given its name; then the bytes go into the file through its descriptor
//! (fsynced), then the journal's name is removed (`Journaled::finish`). At mount, or by
//! `ptefs recover`, a whole journal is replayed and a torn one discarded, so after a crash at
//! any moment the file holds entirely the old or entirely the new bytes of every range of a
//! commit.
//!
//! Journal layout (little-endian): magic `PTEFSJ02`, u64 file size, u64 range count, per
//! range u64 offset and u64 length, then the bytes of every range in order, then a CRC-32 of
//! everything before it. (`PTEFSJ01`, one range, is the layout of earlier versions and is
//! still replayed.) Ranges are sorted and disjoint, each inside the file and inside one range
//! an in-place commit writes (a segment or an inline payload); so a journal of `n` bytes
//! holds at most `(n - 28) / 16` ranges, and never more than the file has bytes.
//!
//! Invariants: the journal is created with `O_EXCL | O_NOFOLLOW` (see `beside`) and removed
//! if writing it fails; at mount a journal is replayed only if it is a regular file owned by
//! the model's owner that nobody else may write (mode bits and ACL, judged on the descriptor
//! it is then read through, see `trust`), exactly as long as its header declares (its size
//! from `fstat`), for a file of the model's size, covering only ranges an in-place commit
//! may write, with a matching checksum; any other journal refuses the mount, is logged as an
//! error naming it and why, and is left where it is. Checking and replaying read the journal
//! front to back through fixed windows (`window`): the memory they need does not grow with
//! the journal, its range count or any number in it, and all arithmetic on its numbers is
//! checked. The checksum is verified before a byte of the model is written; a replay reads
//! every range again, checks it again and writes only bytes the model does not already
//! hold, then fsyncs the model, and only then removes the journal: a crash during a replay
//! leaves the journal for the next one. A journal whose name cannot be removed after its
//! replay (immutable) makes the recovery fail saying so: replayed again, it writes nothing
//! while the model still holds its bytes.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::beside::{name_for, Beside};
use super::trust;
use super::window::Window;
use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::range::ByteRange;
use crate::format::ModelFile;

const MAGIC: &[u8; 8] = b"PTEFSJ02";
const MAGIC_V1: &[u8; 8] = b"PTEFSJ01";
/// The journal of one file of a commit of several (`group`).
const MAGIC_V3: &[u8; 8] = b"PTEFSJ03";
/// Magic, file size, range count.
const HEADER_LEN: u64 = 24;
/// Magic, file size, range count, member index, group record length.
const HEADER_LEN_V3: u64 = 40;
const RANGE_LEN: u64 = 16;
const CRC_LEN: u64 = 4;

/// `.<name>.ptefs-journal`: the journal of file `name`.
pub fn journal_name(model_name: &OsStr) -> OsString {
    name_for(model_name, ".ptefs-journal")
}

/// The journal's path beside `path`.
pub fn journal_path(path: &Path) -> PathBuf {
    path.with_file_name(journal_name(path.file_name().unwrap_or_default()))
}

/// One range of a commit: its offset in the file and its new bytes.
pub type RangeWrite<'a> = (u64, Source<'a>);

/// This journal's place in a commit of several files: its member index and the group
/// record (`group::Record`, encoded), the same bytes in every member's journal.
pub type Membership<'a> = (u64, &'a [u8]);

fn encode_header(file_len: u64, writes: &[RangeWrite], group: Option<Membership>) -> Vec<u8> {
    let group_len = group.map_or(0, |(_, g)| g.len());
    let mut h =
        Vec::with_capacity((HEADER_LEN_V3 + RANGE_LEN * writes.len() as u64) as usize + group_len);
    h.extend_from_slice(if group.is_some() { MAGIC_V3 } else { MAGIC });
    h.extend_from_slice(&file_len.to_le_bytes());
    h.extend_from_slice(&(writes.len() as u64).to_le_bytes());
    if let Some((member, record)) = group {
        h.extend_from_slice(&member.to_le_bytes());
        h.extend_from_slice(&(record.len() as u64).to_le_bytes());
        h.extend_from_slice(record);
    }
    for (offset, bytes) in writes {
        h.extend_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&bytes.len().to_le_bytes());
    }
    h
}

/// Checks that `writes` are sorted, disjoint ranges inside a file of `file_len` bytes.
fn check_ranges(writes: &[RangeWrite], file_len: u64, shown: &str) -> Result<()> {
    let mut end_of_previous = 0;
    for (offset, bytes) in writes {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= file_len)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "write of {} bytes at {offset} reaches past the end of {shown} ({file_len} bytes)",
                    bytes.len()
                ))
            })?;
        if *offset < end_of_previous {
            return Err(Error::invalid(format!(
                "overlapping or unsorted ranges in one commit of {shown} (at {offset})"
            )));
        }
        end_of_previous = end;
    }
    Ok(())
}

/// Replaces the bytes of every range of `writes` (sorted, disjoint) in `model`'s file, which
/// must still be as long as it was mapped and still be named by its path. `exclusive()` is
/// held from the first byte written into the file until it is durable.
pub fn write_in_place<G>(
    model: &ModelFile, writes: &[RangeWrite], exclusive: impl FnOnce() -> G,
) -> Result<()> {
    begin(model, writes)?.finish(exclusive)
}

/// A commit whose journal is written and durable beside the model, and whose bytes are not
/// in the model yet. `finish` writes them and removes the journal; dropping it instead leaves
/// the journal in place, as a crash at that moment would, for `recover` to replay.
pub struct Journaled<'a> {
    model: &'a ModelFile,
    writes: &'a [RangeWrite<'a>],
    target: &'a File,
    beside: Beside<'a>,
    name: OsString,
    journal: Journal,
}

/// The first half of `write_in_place`: checks the ranges and the file, then writes the
/// journal and makes it durable under its name (nothing has the name if that fails).
pub fn begin<'a>(model: &'a ModelFile, writes: &'a [RangeWrite<'a>]) -> Result<Journaled<'a>> {
    begin_member(model, writes, None)
}

/// `begin`, for one file of a commit of several when `group` is given: its journal also
/// holds the group record (docs/formats.md#journal-file-layout).
pub fn begin_member<'a>(
    model: &'a ModelFile, writes: &'a [RangeWrite<'a>], group: Option<Membership>,
) -> Result<Journaled<'a>> {
    let shown = model.path.display().to_string();
    let file_len = model.len();
    check_ranges(writes, file_len, &shown)?;
    let target = model
        .file
        .as_ref()
        .filter(|_| model.writable)
        .ok_or_else(|| Error::new(libc::EACCES, format!("{shown} was not opened for writing")))?;
    let beside = Beside::of(model)?;
    beside.check_model_named()?;
    let now = target
        .metadata()
        .map_err(|e| Error::io(format!("stat {shown}"), e))?
        .len();
    if now != file_len {
        return Err(Error::new(
            libc::EIO,
            format!("{shown} changed size behind ptefs (expected {file_len} bytes, found {now}); not writing"),
        ));
    }

    let name = journal_name(beside.model_name());
    let header = encode_header(file_len, writes, group);
    let journal_len = writes
        .iter()
        .map(|(_, b)| b.len())
        .fold(header.len() as u64 + CRC_LEN, u64::saturating_add);
    beside.need_room(
        journal_len,
        &format!("an in-place commit into {shown} first writes its journal beside it"),
    )?;
    let journal = Journal::write(&beside, &name, &header, writes)?;
    Ok(Journaled {
        model,
        writes,
        target,
        beside,
        name,
        journal,
    })
}

impl Journaled<'_> {
    /// The second half of `write_in_place`: writes the ranges into the model and fsyncs it,
    /// then removes the journal. If writing fails, the journal keeps its name for the next
    /// recovery.
    pub fn finish<G>(self, exclusive: impl FnOnce() -> G) -> Result<()> {
        self.apply(exclusive)?;
        self.retire()
    }

    /// Writes the ranges into the model and makes them durable; the journal keeps its name.
    pub fn apply<G>(&self, exclusive: impl FnOnce() -> G) -> Result<()> {
        if self.writes.is_empty() {
            // A re-laid-out file's journal in a commit of several: nothing goes in place.
            return Ok(());
        }
        let shown = self.model.path.display();
        {
            let _readers_wait = exclusive();
            let mut result = Ok(());
            let mut buf = Vec::new();
            for (offset, bytes) in self.writes {
                result = bytes.write_to(self.target, *offset, &mut buf);
                if result.is_err() {
                    break;
                }
            }
            let written = result.and_then(|_| self.target.sync_data());
            // These bytes are ptefs's own: what the file looks like now is known, before
            // readers go on (see `ModelFile::changed_behind`).
            self.model.restamp();
            written.map_err(|e| {
                Error::io(
                    format!("write {} range(s) into {shown}", self.writes.len()),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// Removes the journal's name: the commit is durable.
    pub fn retire(self) -> Result<()> {
        self.journal.retire(&self.beside, &self.name)
    }

    /// Removes the journal's name before a byte of the model was written: the commit is
    /// abandoned.
    pub fn abandon(self) -> Result<()> {
        self.beside.remove(&self.name)?;
        self.beside.sync()
    }
}

/// A whole, durable journal under its name.
struct Journal {
    file: File,
}

impl Journal {
    /// Writes the journal of `writes` and makes it durable under `name`: written into an
    /// unnamed file, made durable, then named, so no torn journal ever has the name; where
    /// the file system has no unnamed files, written into a file created under `name`, which
    /// is removed again if writing fails.
    fn write(
        beside: &Beside, name: &OsStr, header: &[u8], writes: &[RangeWrite],
    ) -> Result<Journal> {
        let context = |e: Error| e.context(format!("journal {}", beside.shown(name)));
        // Where no unnamed file can be made, the named file below says why it cannot either.
        if let Some(file) = beside.create_unnamed().ok().flatten() {
            write_journal(&file, header, writes).map_err(context)?;
            if beside.link(&file, name).map_err(context)? {
                if let Err(e) = beside.sync() {
                    let _ = beside.remove(name);
                    return Err(context(e));
                }
                return Ok(Journal { file });
            }
        }
        let file = beside.create(name)?;
        let written = write_journal(&file, header, writes).and_then(|_| beside.sync());
        if let Err(e) = written {
            // A torn journal must not stay behind (it would only be discarded at the next
            // mount, and until then `ptefs check` reports it).
            let _ = beside.remove(name);
            return Err(context(e));
        }
        Ok(Journal { file })
    }

    /// Removes the journal's name once the commit is durable. The file itself is closed on
    /// another thread: freeing its blocks is the slow part of removing it, and nothing needs
    /// to wait for it (with no thread to be had, it is closed here).
    fn retire(self, beside: &Beside, name: &OsStr) -> Result<()> {
        beside.remove(name)?;
        let file = self.file;
        let _ = std::thread::Builder::new()
            .name("ptefs-journal-close".into())
            .spawn(move || drop(file));
        Ok(())
    }
}

/// Writes the journal into the empty file `j` and makes its bytes durable. The bytes go
/// straight to the disk when the file system allows (nothing reads them unless a crash
/// interrupts the commit, so a copy in the page cache would be wasted work: measured, the
/// swap of a 64 MiB tensor took 1.8x less time), else through the page cache, from the
/// start again.
fn write_journal(j: &File, header: &[u8], writes: &[RangeWrite]) -> Result<()> {
    let io = |e| Error::io("write", e);
    match write_direct(j, header, writes) {
        Ok(()) => {}
        // A direct attempt writes a prefix of the same bytes: the rewrite covers it.
        Err(e) if super::direct::unsupported(&e) => {
            write_buffered(j, header, writes).map_err(io)?
        }
        Err(e) => return Err(io(e)),
    }
    // Data and size; the file's times need not be durable.
    j.sync_data().map_err(|e| Error::io("fsync", e))
}

fn write_direct(j: &File, header: &[u8], writes: &[RangeWrite]) -> std::io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    let mut w = super::direct::DirectWriter::new(j)?;
    w.append(Source::Memory(header), Some(&mut crc))?;
    for (_, bytes) in writes {
        w.append(*bytes, Some(&mut crc))?;
    }
    w.append(Source::Memory(&crc.finalize().to_le_bytes()), None)?;
    w.finish().map(|_| ())
}

fn write_buffered(j: &File, header: &[u8], writes: &[RangeWrite]) -> std::io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(header);
    j.write_all_at(header, 0)?;
    let mut at = header.len() as u64;
    // One pass over each range: what is checksummed is what is written.
    let mut buf = Vec::new();
    for (_, bytes) in writes {
        bytes.for_each_chunk(&mut buf, |chunk| {
            crc.update(chunk);
            j.write_all_at(chunk, at)?;
            at += chunk.len() as u64;
            Ok(())
        })?;
    }
    j.write_all_at(&crc.finalize().to_le_bytes(), at)
}

/// What `recover` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    None,
    Replayed {
        ranges: usize,
        bytes: u64,
    },
    Discarded(String),
    /// A commit of several files had written every file's journal: all of them were
    /// finished, each one a sentence.
    GroupFinished(Vec<String>),
    /// A commit of several files whose journals were not all whole (it never reached the
    /// point where its files change, or it was removing them once done): this file's
    /// journal was discarded, for the reason given.
    GroupDiscarded(String),
}

/// Bytes of a journal read at a time when it is checked, and of its data and of the model
/// each when it is replayed: what checking or replaying a journal holds in memory, whatever
/// its size.
const WINDOW: usize = 2 << 20;
/// Bytes of the range table read at a time during a replay (beside the data's window).
const TABLE_WINDOW: usize = 64 << 10;

/// A whole journal's layout, read from its header and checked against its size and
/// checksum. Its ranges are never held: a replay reads them from the file again.
pub(super) struct Layout {
    /// The model file's size the journal was written for.
    pub(super) file_len: u64,
    /// For one file of a commit of several: its member index and the group record.
    pub(super) group: Option<(u64, Vec<u8>)>,
    /// Where the range table starts (after the header).
    table_start: u64,
    pub(super) ranges: u64,
    /// Where the bytes of the first range start (after the table).
    data_start: u64,
    /// The bytes of all ranges.
    pub(super) data_len: u64,
    /// The checksum stored at its end.
    crc: u32,
}

/// The ranges of one journal, judged one after the other: each inside the model file, after
/// the end of the one before (sorted, disjoint), and inside one range an in-place commit
/// writes. Holds nothing per range of the journal.
pub(super) struct RangeRules {
    file_len: u64,
    /// The ranges an in-place commit writes, sorted by start, each with the furthest end of
    /// it and those before it: a range is inside one of them exactly when the last one that
    /// starts at or before it reaches its end.
    writable: Vec<(u64, u64)>,
    /// The index of the next range.
    next: u64,
    end_of_previous: u64,
}

impl RangeRules {
    pub(super) fn new(file_len: u64, writable: &[ByteRange]) -> RangeRules {
        let mut sorted = writable.to_vec();
        sorted.sort_by_key(|r| r.start());
        let mut reach = 0;
        let writable = sorted
            .iter()
            .map(|r| {
                reach = reach.max(r.end());
                (r.start(), reach)
            })
            .collect();
        RangeRules {
            file_len,
            writable,
            next: 0,
            end_of_previous: 0,
        }
    }

    /// Checks the next range, `len` bytes at `offset`, whose entry is at byte `at` of the
    /// journal.
    fn check(&mut self, offset: u64, len: u64, at: u64) -> std::result::Result<ByteRange, String> {
        let k = self.next;
        let entry = format!(
            "range {k} (journal bytes {at}..{})",
            at.saturating_add(RANGE_LEN)
        );
        let file_len = self.file_len;
        let r = ByteRange::new(offset, len)
            .filter(|r| r.end() <= file_len)
            .ok_or_else(|| {
                format!("{entry}: {len} bytes at {offset} end past the end of the model file (expected at most {file_len} bytes from the start)")
            })?;
        if offset < self.end_of_previous {
            return Err(format!(
                "{entry}: {len} bytes at {offset} start before the end of range {} at {}: expected sorted, disjoint ranges",
                k - 1,
                self.end_of_previous
            ));
        }
        let last = self.writable.partition_point(|&(start, _)| start <= offset);
        let covered = last
            .checked_sub(1)
            .is_some_and(|i| self.writable[i].1 >= r.end());
        if !covered {
            return Err(format!(
                "{entry}: {len} bytes at {offset} cover bytes no in-place commit writes (outside every segment and inline payload)"
            ));
        }
        self.end_of_previous = r.end();
        self.next += 1;
        Ok(r)
    }
}

/// Why a journal is not replayed.
enum Verdict {
    /// Written by an interrupted commit that did not finish writing it: discard it.
    Torn(String),
    /// Not something a commit of this file can have written: leave it and refuse.
    Untrusted(String),
}

/// A failed read of a journal: one that ended early changed under the reader (it was
/// measured first) and is torn; any other failure leaves it alone.
fn read_failed(e: std::io::Error) -> Verdict {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Verdict::Torn("it changed while being read".into())
    } else {
        Verdict::Untrusted(format!("cannot read it: {e}"))
    }
}

/// Checks journal `j` of `size` bytes (its `fstat`) against the model (a file of `file_len`
/// bytes whose in-place writable ranges are `writable`): its header, every range, its
/// length and its checksum, reading it once from front to back through a fixed window.
fn check_journal(
    j: &File, size: u64, file_len: u64, writable: &[ByteRange],
) -> std::result::Result<Layout, Verdict> {
    let torn = |what: String| Verdict::Torn(what);
    let untrusted = |what: String| Verdict::Untrusted(what);
    if size < 8 {
        return Err(torn(format!("{size} bytes, no complete header")));
    }
    // Magic, file size, then the range count (v2) or the one range (v1); v3 then has the
    // member index and the length of the group record.
    let mut head = [0u8; HEADER_LEN_V3 as usize];
    let mut n = 0;
    while n < head.len() {
        match j.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(untrusted(format!("cannot read it: {e}"))),
        }
    }
    let magic = &head[..8];
    let v1 = magic == MAGIC_V1;
    let v3 = magic == MAGIC_V3;
    if magic != MAGIC && !v1 && !v3 {
        return Err(untrusted(format!(
            "it does not start with {} (found {})",
            String::from_utf8_lossy(MAGIC),
            crate::format::header::printable(magic)
        )));
    }
    let header_len = if v1 {
        32
    } else if v3 {
        HEADER_LEN_V3
    } else {
        HEADER_LEN
    };
    if size < header_len || (n as u64) < header_len {
        return Err(torn(format!("{size} bytes, no complete header")));
    }
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    let journal_file_len = u64_at(8);
    // v3: the group record follows the header; it is bounded before it is read.
    let (table_start, group_len) = if v1 {
        (16, 0)
    } else if v3 {
        let group_len = u64_at(32);
        if group_len > super::group::MAX_RECORD {
            return Err(untrusted(format!(
                "its group record declares {group_len} bytes, more than the {} a commit writes",
                super::group::MAX_RECORD
            )));
        }
        let start = HEADER_LEN_V3 + group_len;
        if size < start + CRC_LEN {
            return Err(torn(format!(
                "{size} bytes, shorter than its group record ({group_len} bytes)"
            )));
        }
        (start, group_len)
    } else {
        (HEADER_LEN, 0)
    };
    let ranges = if v1 { 1 } else { u64_at(16) };
    // A file a commit of several re-lays out has a journal without ranges, and may already
    // be the new file: its identity is judged against the group record (`group`).
    let sized = !(v3 && ranges == 0);
    if sized && journal_file_len != file_len {
        return Err(untrusted(format!(
            "it is for a file of {journal_file_len} bytes, the model has {file_len}"
        )));
    }
    // Ranges are disjoint and inside the file: there cannot be more than its bytes.
    if ranges > file_len.max(1) {
        return Err(untrusted(format!(
            "it declares {ranges} ranges for a file of {file_len} bytes"
        )));
    }
    // Nor more than its own size holds entries for: the count is checked against the bytes
    // there are, not trusted.
    let room = size.saturating_sub(table_start + CRC_LEN) / RANGE_LEN;
    if ranges > room {
        return Err(torn(format!(
            "{size} bytes, shorter than its range table ({ranges} ranges; {size} bytes hold at most {room})"
        )));
    }
    let data_start = ranges
        .checked_mul(RANGE_LEN)
        .and_then(|t| t.checked_add(table_start))
        .filter(|&d| d <= size - CRC_LEN)
        .ok_or_else(|| torn(format!("{size} bytes, shorter than its range table")))?;
    let mut w = Window::new(j, 0, size - CRC_LEN, WINDOW);
    let group = if v3 {
        w.skip(HEADER_LEN_V3).map_err(read_failed)?;
        // Bounded above (MAX_RECORD), and the journal has these bytes (its size).
        let mut record = vec![0u8; group_len as usize];
        w.read_exact(&mut record).map_err(read_failed)?;
        Some((u64_at(24), record))
    } else {
        w.skip(table_start).map_err(read_failed)?;
        None
    };
    let mut rules = RangeRules::new(file_len, writable);
    let mut data_len = 0u64;
    for _ in 0..ranges {
        let at = w.position();
        let offset = w.u64().map_err(read_failed)?;
        let len = w.u64().map_err(read_failed)?;
        let r = rules.check(offset, len, at).map_err(untrusted)?;
        // Disjoint ranges inside the file: their sum is at most its size.
        data_len = data_len.checked_add(r.len()).ok_or_else(|| {
            untrusted(format!("its ranges add up to more than {} bytes", u64::MAX))
        })?;
    }
    let declared = data_start
        .checked_add(data_len)
        .and_then(|n| n.checked_add(CRC_LEN))
        .ok_or_else(|| untrusted(format!("it declares more than {} bytes", u64::MAX)))?;
    if size > declared {
        return Err(untrusted(format!(
            "{size} bytes, more than the {declared} its header declares"
        )));
    }
    if size < declared {
        return Err(torn(format!("{size} bytes, expected {declared}")));
    }
    w.skip(data_len).map_err(read_failed)?;
    let mut stored = [0u8; CRC_LEN as usize];
    j.read_exact_at(&mut stored, size - CRC_LEN)
        .map_err(read_failed)?;
    let crc = u32::from_le_bytes(stored);
    if w.crc().finalize() != crc {
        return Err(torn("checksum mismatch".into()));
    }
    Ok(Layout {
        file_len: journal_file_len,
        group,
        table_start,
        ranges,
        data_start,
        data_len,
        crc,
    })
}

/// What a journal beside a model file holds, found without changing anything.
#[derive(Debug, PartialEq, Eq)]
pub enum Pending {
    /// A whole journal, which `recover` (or a mount) replays; `group` names the other
    /// files of its commit when it changed several (empty otherwise).
    Whole {
        ranges: usize,
        bytes: u64,
        group: Vec<PathBuf>,
    },
    /// A journal whose writing was interrupted, which `recover` discards.
    Torn(String),
}

/// A journal read and judged against the model file it sits beside.
pub(super) enum Found {
    Whole { layout: Layout, journal: File },
    Torn(String),
}

/// The advice every refusal of a journal ends with.
pub(super) const LEFT_IN_PLACE: &str =
    "it was left in place (remove it as root if it is not from an interrupted ptefs commit)";

/// Reads the journal of `model` (known as `path`) through `beside`, if there is one. An
/// error is a refusal: the journal is not one this file's commits can have written.
pub(super) fn examine(path: &Path, model: &ModelFile, beside: &Beside) -> Result<Option<Found>> {
    let name = journal_name(beside.model_name());
    let shown = beside.shown(&name);
    let refuse = |why: String| {
        Error::new(
            libc::EPERM,
            format!("{shown}: not replayed: {why}; {LEFT_IN_PLACE}"),
        )
        .with_level(log::Level::Error)
    };
    let Some(j) = beside
        .open_existing(&name)
        .map_err(|e| refuse(e.message().to_string()))?
    else {
        return Ok(None);
    };
    let meta = j
        .metadata()
        .map_err(|e| Error::io(format!("stat {shown}"), e))?;
    if !meta.file_type().is_file() {
        return Err(refuse(format!(
            "it is not a regular file (it is {})",
            trust::describe(&meta)
        )));
    }
    let model_meta = model
        .file
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .ok_or_else(|| Error::new(libc::EIO, format!("cannot stat {}", path.display())))?;
    if meta.uid() != model_meta.uid() {
        return Err(refuse(format!(
            "it belongs to uid {}, the model to uid {} (ptefs gives a journal to the model's owner)",
            meta.uid(),
            model_meta.uid()
        )));
    }
    if let Some(why) = trust::others_may_write(&j, &meta) {
        return Err(refuse(format!(
            "{why}, and a journal is replayed only when its owner alone may write it"
        )));
    }
    let file_len = model.len();
    match check_journal(&j, meta.len(), file_len, &model.writable_ranges()) {
        Ok(layout) => Ok(Some(Found::Whole { layout, journal: j })),
        Err(Verdict::Untrusted(why)) => Err(refuse(why)),
        Err(Verdict::Torn(why)) => Ok(Some(Found::Torn(format!("torn journal: {why}")))),
    }
}

/// The journal beside `path`, judged as `recover` would judge it, without writing: `None`
/// when there is none, an error when `recover` would refuse it (naming it and why).
pub fn pending(path: &Path) -> Result<Option<Pending>> {
    if std::fs::symlink_metadata(journal_path(path)).is_err() {
        return Ok(None);
    }
    let model = ModelFile::open(path)
        .map_err(|e| Error::from(e).context("cannot check the journal of an interrupted commit"))?;
    let beside = Beside::of(&model)?;
    Ok(match examine(path, &model, &beside)? {
        None => None,
        Some(Found::Torn(why)) => Some(Pending::Torn(why)),
        Some(Found::Whole { layout, .. }) => Some(Pending::Whole {
            ranges: usize::try_from(layout.ranges).unwrap_or(usize::MAX),
            bytes: layout.data_len,
            group: super::group::others(&beside, &layout)?,
        }),
    })
}

/// Replays or discards a journal left beside `path` by an interrupted commit, or refuses
/// (an error naming the journal and why) when it is not one this file's commits wrote.
///
/// A replay is itself crash-safe: the journal keeps its name until the model's new bytes
/// are durable, so a replay a crash interrupted is replayed again, which writes the same
/// bytes. A journal whose name cannot be removed after its replay (`chattr +i`) is an error
/// that says so; replayed again, it writes nothing, since the model already holds its bytes.
pub fn recover(path: &Path) -> Result<Recovery> {
    if std::fs::symlink_metadata(journal_path(path)).is_err() {
        return Ok(Recovery::None);
    }
    let model = ModelFile::open_writable(path)
        .map_err(|e| Error::from(e).context("cannot check the journal of an interrupted commit"))?;
    let beside = Beside::of(&model)?;
    let name = journal_name(beside.model_name());
    let shown = beside.shown(&name);
    let (layout, journal) = match examine(path, &model, &beside)? {
        None => return Ok(Recovery::None),
        Some(Found::Torn(why)) => return discard(&beside, &name, why),
        Some(Found::Whole { layout, journal }) if layout.group.is_some() => {
            return super::group::recover(path, &model, &beside, layout, journal)
        }
        Some(Found::Whole { layout, journal }) => (layout, journal),
    };
    let target = model
        .file
        .as_ref()
        .filter(|_| model.writable)
        .ok_or_else(|| {
            Error::new(
                libc::EACCES,
                format!("{} cannot be opened for writing", path.display()),
            )
        })?;
    let rules = RangeRules::new(model.len(), &model.writable_ranges());
    let wrote = replay(&journal, &layout, rules, target)
        .map_err(|e| e.context(format!("replay {shown} into {}", path.display())))?;
    target
        .sync_data()
        .map_err(|e| Error::io(format!("fsync {}", path.display()), e))?;
    let ranges = usize::try_from(layout.ranges).unwrap_or(usize::MAX);
    match beside.remove(&name) {
        Ok(()) => {}
        // Removed by someone else meanwhile: the replay is durable all the same.
        Err(e) if e.errno() == libc::ENOENT => {}
        Err(e) => {
            return Err(unremovable(
                path, &beside, &shown, &journal, &layout, wrote, e,
            ))
        }
    }
    beside.sync()?;
    Ok(Recovery::Replayed {
        ranges,
        bytes: layout.data_len,
    })
}

/// Writes every range of the checked journal `j` into `target`, reading the table and the
/// data again through windows, each range checked again as it is read; a byte the model
/// already holds is not written. Returns whether anything was written.
pub(super) fn replay(
    j: &File, layout: &Layout, mut rules: RangeRules, target: &File,
) -> Result<bool> {
    let read = |e| Error::io("read", e);
    let mut table = Window::new(j, 0, layout.data_start, TABLE_WINDOW);
    table.skip(layout.table_start).map_err(read)?;
    let data_end = layout.data_start.saturating_add(layout.data_len);
    let mut data = Window::new(j, layout.data_start, data_end, WINDOW);
    let mut current = vec![
        0u8;
        usize::try_from(layout.data_len)
            .unwrap_or(usize::MAX)
            .clamp(1, WINDOW)
    ];
    let changed = |why: String| {
        Error::new(libc::EIO, format!("it changed since it was checked: {why}"))
            .with_level(log::Level::Error)
    };
    let mut wrote = false;
    for _ in 0..layout.ranges {
        let at = table.position();
        let offset = table.u64().map_err(read)?;
        let len = table.u64().map_err(read)?;
        let r = rules.check(offset, len, at).map_err(changed)?;
        let mut done = 0;
        while done < r.len() {
            let chunk = data.take(r.len() - done).map_err(read)?;
            let here = r.start() + done;
            let now = &mut current[..chunk.len()];
            target
                .read_exact_at(now, here)
                .map_err(|e| Error::io(format!("read {} bytes at {here}", chunk.len()), e))?;
            if now != chunk {
                target
                    .write_all_at(chunk, here)
                    .map_err(|e| Error::io(format!("write {} bytes at {here}", chunk.len()), e))?;
                wrote = true;
            }
            done += chunk.len() as u64;
        }
    }
    let mut crc = table.crc();
    crc.combine(&data.crc());
    if crc.finalize() != layout.crc {
        return Err(changed("its checksum no longer matches".into()));
    }
    Ok(wrote)
}

/// The error of a recovery that replayed journal `j` (named `shown`) into `path` but could
/// not remove it (`e`): what was done, why the name stays, how to remove it, and what a
/// replay of it next time does.
pub(super) fn unremovable(
    path: &Path, beside: &Beside, shown: &str, j: &File, layout: &Layout, wrote: bool, e: Error,
) -> Error {
    let model = path.display();
    let what = format!("{} bytes in {} range(s)", layout.data_len, layout.ranges);
    let done = if wrote {
        format!("{model}: finished an interrupted commit from its journal ({what})")
    } else {
        format!("{model}: already held every byte of its journal ({what}), so it was replayed before; nothing was written")
    };
    let dir = path.parent().unwrap_or(Path::new("/")).display();
    let (why, fix) = match (
        trust::unremovable_flag(j),
        trust::unremovable_flag(beside.dir()),
    ) {
        (Some(flag), _) => (
            format!("it is {flag}"),
            format!("`chattr -{} {shown}`, then remove it", flag_letter(flag)),
        ),
        (None, Some(flag)) => (
            format!("its directory is {flag}"),
            format!("`chattr -{} {dir}`, then remove {shown}", flag_letter(flag)),
        ),
        (None, None) => (e.message().to_string(), format!("remove {shown} as root")),
    };
    Error::new(
        libc::EPERM,
        format!("{done}; but the journal cannot be removed ({why}): {fix}. Until it is gone, `ptefs recover`, apply and read-write mounts replay it again and stop here: that writes nothing while {model} holds its bytes, but would undo a later change of those bytes made without ptefs"),
    )
    .with_level(log::Level::Error)
}

/// The `chattr` letter of a flag `trust::unremovable_flag` names.
fn flag_letter(flag: &str) -> char {
    if flag == "immutable" {
        'i'
    } else {
        'a'
    }
}

fn discard(beside: &Beside, name: &OsStr, why: String) -> Result<Recovery> {
    beside.remove(name)?;
    beside.sync()?;
    Ok(Recovery::Discarded(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real model file (the fixture) copied into a temporary directory.
    fn model_copy() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pte");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear.pte");
        std::fs::copy(src, &p).unwrap();
        (dir, p)
    }

    fn journal_bytes(file_len: u64, writes: &[RangeWrite]) -> Vec<u8> {
        let mut j = encode_header(file_len, writes, None);
        for (_, b) in writes {
            j.extend_from_slice(&b.head(b.len()).unwrap());
        }
        let sum = crc32fast::hash(&j);
        j.extend_from_slice(&sum.to_le_bytes());
        j
    }

    fn segment(p: &Path) -> ByteRange {
        ModelFile::open(p).unwrap().writable_ranges()[0]
    }

    #[test]
    fn in_place_write_leaves_no_journal() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let model = ModelFile::open_writable(&p).unwrap();
        let before = std::fs::read(&p).unwrap();
        write_in_place(&model, &[(seg.start(), Source::Memory(&[7u8; 4]))], || ()).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(
            &got[seg.start() as usize..seg.start() as usize + 4],
            &[7u8; 4]
        );
        assert_eq!(got.len(), before.len());
        assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
        assert_eq!(recover(&p).unwrap(), Recovery::None);
    }

    #[test]
    fn whole_journal_is_replayed_and_torn_one_discarded() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let new = [9u8; 4];
        let j = journal_bytes(len, &[(seg.start(), Source::Memory(&new))]);
        for cut in 0..j.len() {
            std::fs::write(journal_path(&p), &j[..cut]).unwrap();
            assert!(
                matches!(recover(&p).unwrap(), Recovery::Discarded(_)),
                "cut {cut}"
            );
            assert_eq!(std::fs::read(&p).unwrap(), original);
            assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
        }
        std::fs::write(journal_path(&p), &j).unwrap();
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Replayed {
                ranges: 1,
                bytes: 4
            }
        );
        let s = seg.start() as usize;
        assert_eq!(&std::fs::read(&p).unwrap()[s..s + 4], &new);
        assert!(std::fs::symlink_metadata(journal_path(&p)).is_err());
    }

    #[test]
    fn untrusted_journals_refuse_and_stay() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let jp = journal_path(&p);
        let refused = |why: &str| {
            let e = recover(&p).unwrap_err();
            assert!(e.message().contains(why), "{e}");
            assert!(std::fs::symlink_metadata(&jp).is_ok(), "{why}: removed");
            assert_eq!(std::fs::read(&p).unwrap(), original, "{why}: replayed");
            let _ = std::fs::remove_file(&jp);
        };
        // The header of the file itself: not a range any commit writes.
        std::fs::write(&jp, journal_bytes(len, &[(0, Source::Memory(&[0u8; 8]))])).unwrap();
        refused("no in-place commit writes");
        // Longer than declared.
        let mut long = journal_bytes(len, &[(seg.start(), Source::Memory(&[1u8; 4]))]);
        long.extend_from_slice(&[0; 100]);
        std::fs::write(&jp, long).unwrap();
        refused("more than");
        // Another file size.
        std::fs::write(
            &jp,
            journal_bytes(len + 1, &[(seg.start(), Source::Memory(&[1u8; 4]))]),
        )
        .unwrap();
        refused("the model has");
        // Not ours.
        std::fs::write(&jp, b"something else entirely").unwrap();
        refused("does not start with");
        // World-writable.
        std::fs::write(
            &jp,
            journal_bytes(len, &[(seg.start(), Source::Memory(&[1u8; 4]))]),
        )
        .unwrap();
        std::fs::set_permissions(&jp, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        refused("anyone may write");
        // A link to another file, and a FIFO (which must not hang the mount).
        std::os::unix::fs::symlink("/dev/zero", &jp).unwrap();
        refused("symbolic link");
        let c = std::ffi::CString::new(jp.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        refused("not a regular file");
    }

    #[test]
    fn bad_ranges_are_refused_naming_the_range_where_it_is_and_what_was_expected() {
        let (_d, p) = model_copy();
        let s = segment(&p).start();
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let jp = journal_path(&p);
        let four = [1u8; 4];
        let refused = |writes: &[RangeWrite], says: &str| {
            std::fs::write(&jp, journal_bytes(len, writes)).unwrap();
            let e = recover(&p).unwrap_err();
            assert!(e.message().contains(says), "{e}");
            assert_eq!(e.level(), log::Level::Error);
            assert!(jp.exists());
            assert_eq!(std::fs::read(&p).unwrap(), original);
            std::fs::remove_file(&jp).unwrap();
        };
        refused(
            &[(s + 8, Source::Memory(&four)), (s, Source::Memory(&four))],
            &format!("range 1 (journal bytes 40..56): 4 bytes at {s} start before the end of range 0 at {}: expected sorted, disjoint ranges", s + 12),
        );
        refused(
            &[(s, Source::Memory(&[1; 8])), (s + 4, Source::Memory(&four))],
            &format!("range 1 (journal bytes 40..56): 4 bytes at {} start before the end of range 0 at {}", s + 4, s + 8),
        );
        refused(
            &[(len - 2, Source::Memory(&four))],
            &format!("range 0 (journal bytes 24..40): 4 bytes at {} end past the end of the model file (expected at most {len} bytes from the start)", len - 2),
        );
        refused(
            &[(u64::MAX - 1, Source::Memory(&four))],
            &format!(
                "4 bytes at {} end past the end of the model file",
                u64::MAX - 1
            ),
        );
    }

    #[test]
    fn a_range_count_the_journal_cannot_hold_is_torn() {
        let (_d, p) = model_copy();
        let s = segment(&p).start();
        let len = std::fs::metadata(&p).unwrap().len();
        let mut j = journal_bytes(len, &[(s, Source::Memory(&[1; 4]))]);
        // Declares 50 ranges: 24 + 50 * 16 + 4 bytes at least, and it has 48.
        j[16..24].copy_from_slice(&50u64.to_le_bytes());
        std::fs::write(journal_path(&p), &j).unwrap();
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Discarded(
                "torn journal: 48 bytes, shorter than its range table (50 ranges; 48 bytes hold at most 1)".into()
            )
        );
    }

    #[test]
    fn a_journal_the_model_already_holds_is_replayed_without_writing() {
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let held = &original[seg.as_usize()];
        std::fs::write(
            journal_path(&p),
            journal_bytes(len, &[(seg.start(), Source::Memory(held))]),
        )
        .unwrap();
        let before = std::fs::metadata(&p).unwrap().modified().unwrap();
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Replayed {
                ranges: 1,
                bytes: seg.len()
            }
        );
        assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), before);
        assert_eq!(std::fs::read(&p).unwrap(), original);
        assert!(!journal_path(&p).exists());
    }

    /// Sets POSIX ACL `name` (access or default) of `path` to `entries` (tag, perm, id);
    /// false when the file system has no ACLs.
    fn set_acl(path: &Path, name: &std::ffi::CStr, entries: &[(u16, u16, u32)]) -> bool {
        let mut raw = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            raw.extend_from_slice(&tag.to_le_bytes());
            raw.extend_from_slice(&perm.to_le_bytes());
            raw.extend_from_slice(&id.to_le_bytes());
        }
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C strings and a buffer of the given length.
        let rc =
            unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), raw.as_ptr().cast(), raw.len(), 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "setxattr: {e}");
            return false;
        }
        true
    }

    /// A named user's entry of an ACL, under mask `mask`: rw for uid 54321.
    fn acl_with_named_writer(mask: u16) -> [(u16, u16, u32); 5] {
        [
            (0x01, 6, u32::MAX),
            (0x02, 6, 54321),
            (0x04, 0, u32::MAX),
            (0x10, mask, u32::MAX),
            (0x20, 0, u32::MAX),
        ]
    }

    #[test]
    fn journals_others_may_write_through_group_bits_or_an_acl_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, p) = model_copy();
        let seg = segment(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let original = std::fs::read(&p).unwrap();
        let jp = journal_path(&p);
        let new = [3u8; 4];
        let journal = journal_bytes(len, &[(seg.start(), Source::Memory(&new))]);
        let write = |mode: u32| {
            let _ = std::fs::remove_file(&jp);
            std::fs::write(&jp, &journal).unwrap();
            std::fs::set_permissions(&jp, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let refused = |says: &str| {
            let e = recover(&p).unwrap_err();
            assert!(e.message().contains(says), "{e}");
            assert!(e.message().contains("it was left in place (remove it as root if it is not from an interrupted ptefs commit)"), "{e}");
            assert_eq!(e.level(), log::Level::Error);
            assert!(jp.exists());
            assert_eq!(std::fs::read(&p).unwrap(), original);
        };
        let gid = std::fs::metadata(&p).unwrap().gid();
        write(0o620);
        refused(&format!("its group (gid {gid}) may write it (mode 620), and a journal is replayed only when its owner alone may write it"));
        write(0o600);
        if !set_acl(&jp, c"system.posix_acl_access", &acl_with_named_writer(6)) {
            eprintln!("no ACLs on this file system: not tested");
            return;
        }
        refused("its access ACL lets uid 54321 write it (mode 660)");
        // The same entry under a mask that takes write away: only the owner may write.
        write(0o600);
        assert!(set_acl(
            &jp,
            c"system.posix_acl_access",
            &acl_with_named_writer(0)
        ));
        assert!(matches!(recover(&p).unwrap(), Recovery::Replayed { .. }));
        let s = seg.start() as usize;
        assert_eq!(&std::fs::read(&p).unwrap()[s..s + 4], &new);
    }

    /// A directory whose default ACL lets another user write what is created in it: the
    /// journal of a commit there gets that entry under a mask without write (its mode is
    /// 0600), so it is still trusted.
    #[test]
    fn a_journal_under_a_default_acl_is_still_trusted() {
        let (d, p) = model_copy();
        if !set_acl(
            d.path(),
            c"system.posix_acl_default",
            &acl_with_named_writer(6),
        ) {
            eprintln!("no ACLs on this file system: not tested");
            return;
        }
        let seg = segment(&p);
        let model = ModelFile::open_writable(&p).unwrap();
        let new = [4u8; 4];
        let writes = [(seg.start(), Source::Memory(&new))];
        drop(begin(&model, &writes).unwrap());
        assert!(journal_path(&p).exists());
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Replayed {
                ranges: 1,
                bytes: 4
            }
        );
        let s = seg.start() as usize;
        assert_eq!(&std::fs::read(&p).unwrap()[s..s + 4], &new);
    }

    #[test]
    fn a_planted_journal_name_blocks_the_commit_and_is_not_written() {
        let (d, p) = model_copy();
        let seg = segment(&p);
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, journal_path(&p)).unwrap();
        let model = ModelFile::open_writable(&p).unwrap();
        let before = std::fs::read(&p).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[7u8; 4]))], || ()).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST, "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&p).unwrap(), before);
    }

    #[test]
    fn refuses_when_the_file_was_replaced_or_changed_size() {
        let (d, p) = model_copy();
        let seg = segment(&p);
        let model = ModelFile::open_writable(&p).unwrap();
        // Same size, other file, renamed over the model's name.
        let other = d.path().join("other");
        std::fs::copy(&p, &other).unwrap();
        std::fs::rename(&other, &p).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[1u8; 4]))], || ()).unwrap_err();
        assert_eq!(e.errno(), libc::ESTALE, "{e}");
        let model = ModelFile::open_writable(&p).unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.set_len(model.len() + 10).unwrap();
        let e =
            write_in_place(&model, &[(seg.start(), Source::Memory(&[1u8; 4]))], || ()).unwrap_err();
        assert!(e.message().contains("changed size"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any bytes where a journal would be: recovery never panics, never writes outside
        /// the ranges a commit may write, and removes only journals it replayed or found
        /// torn.
        #[test]
        fn any_journal_bytes_are_replayed_discarded_or_refused(
            flips in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 0..6),
            cut in proptest::option::of(0usize..200),
            garbage in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)),
        ) {
            let (_d, p) = model_copy();
            let seg = segment(&p);
            let len = std::fs::metadata(&p).unwrap().len();
            let original = std::fs::read(&p).unwrap();
            let mut j = match garbage {
                Some(g) => g,
                None => journal_bytes(len, &[(seg.start(), Source::Memory(&[5u8; 4]))]),
            };
            for (at, x) in flips {
                if let Some(b) = j.get_mut(at) {
                    *b ^= x;
                }
            }
            if let Some(c) = cut {
                j.truncate(c);
            }
            std::fs::write(journal_path(&p), &j).unwrap();
            let result = recover(&p);
            let now = std::fs::read(&p).unwrap();
            let present = std::fs::symlink_metadata(journal_path(&p)).is_ok();
            match result {
                Ok(Recovery::Replayed { .. }) => {
                    proptest::prop_assert!(!present);
                    for (i, (a, b)) in original.iter().zip(&now).enumerate() {
                        if a != b {
                            proptest::prop_assert!(seg.start() <= i as u64 && (i as u64) < seg.end());
                        }
                    }
                }
                Ok(_) => {
                    proptest::prop_assert!(!present);
                    proptest::prop_assert_eq!(&now, &original);
                }
                Err(_) => {
                    proptest::prop_assert!(present);
                    proptest::prop_assert_eq!(&now, &original);
                }
            }
        }
    }
}
