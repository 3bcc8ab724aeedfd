//! Staged content: the bytes an open file holds until they are committed (a writer's copy of
//! a tree file) or for as long as it lives (a scratch file).
//!
//! Invariants: the first `SPILL_AT` bytes live in memory, as long as all the staged content
//! of the mount stays within its `Spill::budget`; beyond either, the content moves to an
//! unnamed temporary file (`O_TMPFILE`, in the model's directory, else in `$TMPDIR`), so a
//! multi-GiB write, or many writers at once, need neither their size in RAM nor a daemon
//! that grows. Every byte of memory a `Staged` holds is charged to the budget and given
//! back when it spills or is dropped. Every size is checked against the file's limit before
//! anything is allocated, and memory is reserved fallibly, so a request can fail with EFBIG
//! or ENOMEM but never abort the daemon. Content grows only while the model's file system
//! has room for what that size needs (`Room`: the staged bytes that spill, and the new file
//! a re-layout writes), else ENOSPC (docs/writes.md#sizes-and-free-space). An upload onto a
//! `weights.safetensors` that can stream (`fs::stream`) keeps only its header here and its
//! other bytes in a new copy of the model, whose buffers are charged to the budget too;
//! whatever needs its content as bytes (a read, a write out of order, a truncate, a commit
//! that cannot take the copy) turns it back into spilled content first.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stream::{Start, Stream};
use crate::edit::Source;
use crate::error::{Error, Result};

/// Staged content beyond this size spills to a temporary file.
pub const SPILL_AT: u64 = 64 << 20;

/// How much staged content of one mount may live in memory at once, all handles together.
pub const MEMORY_BUDGET: u64 = 128 << 20;

/// Buffers at least this large are kept for the next writer once their content is dropped.
const SPARE_FROM: usize = 2 << 20;

/// What the staged content of a mount may take on disk (docs/writes.md#sizes-and-free-space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimits {
    /// The largest size a blob, a delegate payload or a scratch file may be given
    /// (`--max-file-size`); None: as large as the file system's free space allows.
    pub max_file_size: Option<u64>,
    /// Scratch files one user may have at once (`fs::scratch`).
    pub scratch_files_per_user: usize,
    /// Bytes the scratch files of one user may hold together; None: twice the model's
    /// files and 1 GiB, which an editor's copy of any file of the model fits.
    pub scratch_bytes_per_user: Option<u64>,
}

impl Default for SizeLimits {
    fn default() -> SizeLimits {
        SizeLimits {
            max_file_size: None,
            scratch_files_per_user: SCRATCH_FILES_PER_USER,
            scratch_bytes_per_user: None,
        }
    }
}

/// Scratch files one user may have at once: editors make a few (a swap file, a backup, the
/// file they save before renaming it), never hundreds.
pub const SCRATCH_FILES_PER_USER: usize = 256;

/// Where staged content spills, and the memory all of a mount's staged content shares.
pub struct Spill {
    /// Where spill files go first (the model's directory), if open.
    dir: Option<Arc<File>>,
    budget: u64,
    in_memory: AtomicU64,
    /// What staged content may take on disk.
    pub limits: SizeLimits,
    /// The last large buffer given back, empty, for the next large write, and when it was
    /// given back. Replacing a 64 MiB tensor into fresh memory spent more time having the
    /// kernel zero new pages than copying the bytes; a kept buffer's pages are there
    /// already. Its pages are the kernel's to take back when memory runs short
    /// (`MADV_FREE`), and it is freed once unused for `SPARE_KEPT_FOR`.
    spare: std::sync::Mutex<Option<(Vec<u8>, Instant)>>,
}

/// How long an unused spare buffer is kept.
pub const SPARE_KEPT_FOR: Duration = Duration::from_secs(10);

impl Spill {
    pub fn new(dir: Option<Arc<File>>, budget: u64) -> Arc<Spill> {
        Spill::limited(dir, budget, SizeLimits::default())
    }

    pub fn limited(dir: Option<Arc<File>>, budget: u64, limits: SizeLimits) -> Arc<Spill> {
        Arc::new(Spill {
            dir,
            budget,
            in_memory: AtomicU64::new(0),
            limits,
            spare: Default::default(),
        })
    }

    /// Keeps `buffer` (its content dropped) as the spare, if it is larger than the one kept.
    fn keep_spare(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() < SPARE_FROM {
            return;
        }
        buffer.clear();
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare
            .as_ref()
            .is_some_and(|(kept, _)| kept.capacity() >= buffer.capacity())
        {
            return;
        }
        let (start, len) = whole_pages(&buffer);
        // SAFETY: advice on whole pages inside the buffer's own allocation, whose bytes
        // (length 0) nothing reads before writing them again.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_FREE) };
        *spare = Some((buffer, Instant::now()));
    }

    /// Frees the spare buffer if it has not been used for `kept_for`.
    pub fn free_idle_spare(&self, kept_for: Duration) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= kept_for)
        {
            *spare = None;
        }
    }

    /// The spare, if it suits a buffer of `capacity` bytes (not more than twice as large).
    fn take_spare(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.as_ref()?.0.capacity() > capacity.saturating_mul(2) {
            return None;
        }
        spare.take().map(|(buffer, _)| buffer)
    }

    /// Takes `bytes` from the budget, or says there is not that much left.
    fn charge(&self, bytes: u64) -> bool {
        self.in_memory
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.budget)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        let _ = self
            .in_memory
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// The capacity of the spare buffer, if one is kept.
    #[cfg(test)]
    fn spare_capacity(&self) -> Option<usize> {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        spare.as_ref().map(|(b, _)| b.capacity())
    }

    /// Bytes of staged content in memory now.
    #[cfg(test)]
    pub fn in_memory(&self) -> u64 {
        self.in_memory.load(Ordering::Acquire)
    }
}

enum Buffer {
    Memory(Vec<u8>),
    Spilled {
        file: File,
        len: u64,
    },
    /// An upload streamed into a new copy of the model (`fs::stream`): its header in
    /// memory (charged as memory content is), the rest in the copy.
    Streamed {
        header: Vec<u8>,
        stream: Box<Stream>,
    },
}

/// What content of a file needs on disk when it grows, beyond its own staged bytes: for a
/// blob or a delegate payload, the new file a commit of another size writes (a re-layout of
/// the whole model file).
#[derive(Clone, Default)]
pub struct Room {
    pub relayout: Option<Relayout>,
}

/// The model file a commit of another size re-lays out.
#[derive(Clone)]
pub struct Relayout {
    /// Its directory, where the new file goes, and that directory for messages.
    pub dir: Arc<File>,
    pub place: String,
    /// Its size, and the size the content has in it now.
    pub file_len: u64,
    pub current: u64,
}

/// The content of one open file, with the limit its size may not exceed.
pub struct Staged {
    buffer: Buffer,
    /// The largest size this content may take (what the file it becomes can hold).
    limit: u64,
    /// What the limit is, for messages ("FLOAT[3,4] holds 48 bytes").
    limit_reason: String,
    spill: Arc<Spill>,
    /// The memory charged to `spill`'s budget: the capacity of the in-memory buffer.
    charged: u64,
    /// What growing needs on disk besides the staged bytes.
    room: Room,
    /// Where an upload may stream to once its header is in (`fs::stream`); None once it
    /// streams, or cannot.
    stream_to: Option<Start>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.spill.give_back(self.charged);
        match &mut self.buffer {
            Buffer::Memory(v) | Buffer::Streamed { header: v, .. } => {
                self.spill.keep_spare(std::mem::take(v))
            }
            Buffer::Spilled { .. } => {}
        }
    }
}

/// The whole pages inside `buffer`'s allocation: their start and length.
fn whole_pages(buffer: &Vec<u8>) -> (usize, usize) {
    const PAGE: usize = 4096;
    let start = (buffer.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (buffer.as_ptr() as usize + buffer.capacity()) / PAGE * PAGE;
    (start, end.saturating_sub(start))
}

/// An unnamed file for spilled content: `O_TMPFILE` in `dir`, else in the temporary
/// directory. Nobody else can open it, and it disappears with its descriptor.
fn unnamed_file(dir: Option<&File>) -> Result<File> {
    let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
    if let Some(dir) = dir {
        // SAFETY: a valid directory descriptor and a constant C string.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c".".as_ptr(), flags, 0o600) };
        if fd >= 0 {
            // SAFETY: a descriptor just opened and owned here alone.
            return Ok(unsafe { File::from_raw_fd(fd) });
        }
    }
    let tmp = std::env::temp_dir();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags_tmpfile()
        .open(&tmp)
        .map_err(|e| Error::io(format!("create a temporary file in {}", tmp.display()), e))
}

/// `O_TMPFILE` for `OpenOptions`.
trait TmpFile {
    fn custom_flags_tmpfile(&mut self) -> &mut Self;
}

impl TmpFile for std::fs::OpenOptions {
    fn custom_flags_tmpfile(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .mode(0o600)
    }
}

impl Staged {
    /// Empty content that may grow to `limit` bytes.
    pub fn new(limit: u64, limit_reason: impl Into<String>, spill: Arc<Spill>) -> Staged {
        Staged {
            buffer: Buffer::Memory(Vec::new()),
            limit,
            limit_reason: limit_reason.into(),
            spill,
            charged: 0,
            room: Room::default(),
            stream_to: None,
        }
    }

    /// This content, streamed into a new copy of the model when it turns out to be an
    /// upload that can be (`fs::stream`).
    pub fn streaming(mut self, start: Start) -> Staged {
        self.stream_to = Some(start);
        self
    }

    /// The stream this content goes to, if it streams.
    pub fn stream_mut(&mut self) -> Option<&mut Stream> {
        match &mut self.buffer {
            Buffer::Streamed { stream, .. } => Some(stream),
            _ => None,
        }
    }

    /// Starts streaming once the in-memory content holds the whole header of an upload
    /// that can stream; the bytes past the header go to the copy. An upload that cannot
    /// stays as it is, and is not looked at again.
    fn try_stream(&mut self) -> Result<()> {
        if self.stream_to.is_none() {
            return Ok(());
        }
        let Buffer::Memory(v) = &mut self.buffer else {
            self.stream_to = None;
            return Ok(());
        };
        let Some(n) = v
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        else {
            return Ok(());
        };
        let Some(header_len) = n.checked_add(8).filter(|&h| h <= SPILL_AT) else {
            self.stream_to = None;
            return Ok(());
        };
        if (v.len() as u64) < header_len {
            return Ok(());
        }
        let start = self.stream_to.take().expect("checked above");
        let head = header_len as usize;
        // The copy's buffers count as staged memory: with too many uploads at once, the
        // next is staged.
        if !self.spill.charge(crate::edit::copy::MEMORY) {
            return Ok(());
        }
        let mut stream = match Stream::begin(&start, &v[..head]) {
            Ok(Some(stream)) => stream,
            other => {
                if let Err(e) = other {
                    log::debug!("staged, not streamed: {e}");
                }
                self.spill.give_back(crate::edit::copy::MEMORY);
                return Ok(());
            }
        };
        self.charged += crate::edit::copy::MEMORY;
        if v.len() > head {
            if !stream.takes(header_len, (v.len() - head) as u64) {
                self.charged -= crate::edit::copy::MEMORY;
                self.spill.give_back(crate::edit::copy::MEMORY);
                return Ok(());
            }
            stream.write(&v[head..])?;
            v.truncate(head);
        }
        log::debug!(
            "an upload of {} bytes is streamed into a new copy of the model",
            stream.total()
        );
        let header = std::mem::take(v);
        self.buffer = Buffer::Streamed {
            header,
            stream: Box::new(stream),
        };
        Ok(())
    }

    /// Turns streamed content back into staged content (in a temporary file), read back
    /// from the copy, which is then given up.
    pub fn unstream(&mut self) -> Result<()> {
        let Buffer::Streamed { header, stream } = &mut self.buffer else {
            return Ok(());
        };
        self.spill.free_idle_spare(Duration::ZERO);
        let file = unnamed_file(self.spill.dir.as_deref())?;
        file.write_all_at(header, 0)
            .map_err(|e| Error::io("write staged content to a temporary file", e))?;
        stream.received_data(|at, chunk| {
            file.write_all_at(chunk, at)
                .map_err(|e| Error::io("write staged content to a temporary file", e))
        })?;
        let len = stream.received();
        let _ = stream.take_copy();
        self.buffer = Buffer::Spilled { file, len };
        self.spill.give_back(std::mem::take(&mut self.charged));
        Ok(())
    }

    /// This content, needing `room` on disk to grow.
    pub fn needing(mut self, room: Room) -> Staged {
        self.room = room;
        self
    }

    /// Refuses growth to `len` bytes when the file system cannot hold what that size needs:
    /// the growth of the staged bytes, when they are (or are about to be) on disk, and for
    /// a blob or a payload the new file of a re-layout (ENOSPC, naming the numbers).
    fn check_room(&self, len: u64) -> Result<()> {
        let old = self.len();
        if len <= old {
            return Ok(());
        }
        let on_disk = len > SPILL_AT || matches!(self.buffer, Buffer::Spilled { .. });
        let staged = if on_disk { len - old } else { 0 };
        let (dir, place, relayout) = match &self.room.relayout {
            // Content no larger than the file's is checked at its commit, which knows the
            // new file's size; staging refuses only what the file system can never take.
            Some(r) if len > r.current => (
                Some(&r.dir),
                r.place.as_str(),
                Some(r.file_len.saturating_sub(r.current).saturating_add(len)),
            ),
            _ => (self.spill.dir.as_ref(), "the staging directory", None),
        };
        let need = staged.saturating_add(relayout.unwrap_or(0));
        let Some(dir) = dir.filter(|_| need > 0) else {
            return Ok(());
        };
        let why = match relayout {
            Some(new_file) => format!(
                "content of {len} bytes needs its staged copy and the {new_file}-byte new file its commit writes (a re-layout)"
            ),
            None => format!("{len} bytes of staged content need their staged copy"),
        };
        crate::edit::need_room(dir, place, need, &why)
    }

    /// Makes the in-memory buffer able to hold `capacity` bytes, charging the budget for
    /// all the memory it then holds; false (nothing changed) when the budget or the
    /// allocator cannot give it.
    fn make_room(&mut self, capacity: u64) -> bool {
        let Buffer::Memory(v) = &mut self.buffer else {
            return false;
        };
        let Ok(wanted) = usize::try_from(capacity) else {
            return false;
        };
        let held = capacity.max(v.capacity() as u64);
        let extra = held.saturating_sub(self.charged);
        if !self.spill.charge(extra) {
            return false;
        }
        if wanted > v.capacity() && v.try_reserve_exact(wanted - v.len()).is_err() {
            self.spill.give_back(extra);
            return false;
        }
        self.charged += extra;
        true
    }

    /// Makes room in memory for content of `len` bytes, spilling when memory for them is
    /// not to be had. Buffers grow by at least half, so small writes do not reallocate
    /// each time.
    fn room_for(&mut self, len: u64) -> Result<()> {
        let Buffer::Memory(v) = &self.buffer else {
            return Ok(());
        };
        if len <= v.capacity() as u64 {
            return Ok(());
        }
        let generous = (v.capacity() as u64)
            .saturating_add(v.capacity() as u64 / 2)
            .clamp(len, SPILL_AT.min(self.limit).max(len));
        if generous >= SPARE_FROM as u64 {
            // A writer that did not say its size (a growing `weights.safetensors`) makes a
            // large buffer of its own: the spare would only add to the peak.
            self.spill.free_idle_spare(Duration::ZERO);
        }
        if !self.make_room(generous) && !self.make_room(len) {
            self.spill()?;
        }
        Ok(())
    }

    /// Grows the in-memory content to `len` bytes (zeros), spilling when memory for them
    /// is not to be had.
    fn grow(&mut self, len: u64) -> Result<()> {
        self.room_for(len)?;
        if let Buffer::Memory(v) = &mut self.buffer {
            if len > v.len() as u64 {
                v.resize(len as usize, 0);
            }
        }
        Ok(())
    }

    /// Reserves room for `capacity` bytes in memory (when they would not spill), so the
    /// writes that fill a replaced file do not reallocate. A large buffer is the spare one
    /// when that is at most twice as large, and asks for transparent huge pages: touching
    /// 64 MiB of new 4 KiB pages costs more than copying the bytes into them.
    pub fn reserve(&mut self, capacity: u64) {
        if capacity > SPILL_AT.min(self.limit) {
            return;
        }
        let fresh = matches!(&self.buffer, Buffer::Memory(v) if v.capacity() == 0);
        if fresh && capacity >= SPARE_FROM as u64 {
            if let Some(spare) = self.spill.take_spare(capacity as usize) {
                self.buffer = Buffer::Memory(spare);
            }
        }
        if !self.make_room(capacity) {
            if let Buffer::Memory(v) = &mut self.buffer {
                if fresh {
                    // Not charged: back to where it was kept.
                    self.spill.keep_spare(std::mem::take(v));
                }
            }
            return;
        }
        if let Buffer::Memory(v) = &self.buffer {
            if capacity >= SPARE_FROM as u64 {
                let (start, len) = whole_pages(v);
                // SAFETY: advice on whole pages inside the buffer's own allocation; it
                // changes how they are backed, never their contents.
                unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
            }
        }
    }

    pub fn len(&self) -> u64 {
        match &self.buffer {
            Buffer::Memory(v) => v.len() as u64,
            Buffer::Spilled { len, .. } => *len,
            Buffer::Streamed { stream, .. } => stream.received(),
        }
    }

    fn check_size(&self, size: u64) -> Result<()> {
        if size > self.limit {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{} bytes cannot fit: {} (at most {} bytes)",
                    size, self.limit_reason, self.limit
                ),
            ));
        }
        Ok(())
    }

    /// Moves the content to a temporary file, giving its memory back. The spare buffer is
    /// freed too: content this large will not fit it, and memory is short or about to be.
    fn spill(&mut self) -> Result<()> {
        let Buffer::Memory(v) = &self.buffer else {
            return Ok(());
        };
        self.spill.free_idle_spare(Duration::ZERO);
        let file = unnamed_file(self.spill.dir.as_deref())?;
        file.write_all_at(v, 0)
            .map_err(|e| Error::io("write staged content to a temporary file", e))?;
        let len = v.len() as u64;
        self.buffer = Buffer::Spilled { file, len };
        self.spill.give_back(std::mem::take(&mut self.charged));
        Ok(())
    }

    /// Writes `data` at `offset`, growing the content with zeros.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset.checked_add(data.len() as u64).ok_or_else(|| {
            Error::new(libc::EFBIG, format!("a write at offset {offset} overflows"))
        })?;
        self.check_size(end)?;
        if let Buffer::Streamed { stream, .. } = &mut self.buffer {
            if stream.takes(offset, data.len() as u64) {
                return stream.write(data);
            }
            // Anything but the next bytes of the upload: staged as usual from here on.
            self.unstream()?;
        }
        self.check_room(end)?;
        if end > SPILL_AT {
            self.spill()?;
        }
        self.room_for(end)?;
        match &mut self.buffer {
            // Appending, as writers mostly do, copies once (no zeros first).
            Buffer::Memory(v) if offset == v.len() as u64 => v.extend_from_slice(data),
            Buffer::Memory(v) => {
                if end > v.len() as u64 {
                    v.resize(end as usize, 0);
                }
                v[offset as usize..end as usize].copy_from_slice(data);
            }
            Buffer::Spilled { file, len } => {
                file.write_all_at(data, offset)
                    .map_err(|e| Error::io("write staged content", e))?;
                *len = (*len).max(end);
            }
            Buffer::Streamed { .. } => unreachable!("unstreamed above"),
        }
        self.try_stream()
    }

    /// Truncates or extends the content to `size` bytes.
    pub fn set_len(&mut self, size: u64) -> Result<()> {
        if size == self.len() {
            return Ok(());
        }
        self.unstream()?;
        self.stream_to = None;
        self.check_size(size)?;
        self.check_room(size)?;
        if size > SPILL_AT {
            self.spill()?;
        }
        self.grow(size)?;
        match &mut self.buffer {
            Buffer::Memory(v) => v.truncate(size as usize),
            Buffer::Spilled { file, len } => {
                file.set_len(size)
                    .map_err(|e| Error::io("resize staged content", e))?;
                *len = size;
            }
            Buffer::Streamed { .. } => unreachable!("unstreamed above"),
        }
        Ok(())
    }

    /// `[offset, offset + size)`, clamped to the end. Streamed content is staged first.
    pub fn read(&mut self, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.unstream()?;
        let len = self.len();
        let start = offset.min(len);
        let end = offset.saturating_add(size as u64).min(len);
        match &self.buffer {
            Buffer::Memory(v) => Ok(v[start as usize..end as usize].to_vec()),
            Buffer::Spilled { file, .. } => {
                let mut out = vec![0u8; (end - start) as usize];
                file.read_exact_at(&mut out, start)
                    .map_err(|e| Error::io("read staged content", e))?;
                Ok(out)
            }
            Buffer::Streamed { .. } => Err(Error::new(libc::EIO, "streamed content")),
        }
    }

    /// All the content, for a commit: read from memory, or from the spill file in bounded
    /// chunks (never mapped, so committing GiBs does not grow the daemon). Streamed content
    /// is staged first.
    pub fn source(&mut self) -> Result<Source<'_>> {
        self.unstream()?;
        Ok(match &self.buffer {
            Buffer::Memory(v) => Source::Memory(v),
            Buffer::Spilled { file, len } => Source::File {
                file,
                offset: 0,
                len: *len,
            },
            Buffer::Streamed { .. } => return Err(Error::new(libc::EIO, "streamed content")),
        })
    }

    /// Whether the content lives in a temporary file.
    #[cfg(test)]
    pub fn spilled(&self) -> bool {
        matches!(self.buffer, Buffer::Spilled { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unbounded() -> Arc<Spill> {
        Spill::new(None, u64::MAX)
    }

    #[test]
    fn writers_together_stay_within_the_memory_budget() {
        let spill = Spill::new(None, 10 << 20);
        let mut all: Vec<Staged> = (0..4)
            .map(|_| Staged::new(u64::MAX, "", spill.clone()))
            .collect();
        for s in &mut all {
            for i in 0..4u64 {
                s.write_at(i << 20, &[7; 1 << 20]).unwrap();
            }
        }
        assert!(spill.in_memory() <= 10 << 20, "{}", spill.in_memory());
        assert!(!all[0].spilled());
        assert!(all[3].spilled());
        for s in &mut all {
            assert_eq!(s.len(), 4 << 20);
            assert_eq!(s.read((3 << 20) + 5, 3).unwrap(), [7, 7, 7]);
        }
        drop(all);
        assert_eq!(spill.in_memory(), 0);
    }

    #[test]
    fn refuses_sizes_beyond_the_limit_before_allocating() {
        let mut s = Staged::new(48, "FLOAT[3,4] holds 48 bytes", unbounded());
        assert_eq!(s.write_at(1 << 40, b"x").unwrap_err().errno(), libc::EFBIG);
        assert_eq!(s.set_len(1 << 40).unwrap_err().errno(), libc::EFBIG);
        assert_eq!(
            s.write_at(u64::MAX, b"xy").unwrap_err().errno(),
            libc::EFBIG
        );
        s.write_at(40, &[1; 8]).unwrap();
        assert_eq!(s.len(), 48);
        assert!(!s.spilled());
    }

    #[test]
    fn spills_past_the_threshold_and_reads_back() {
        let mut s = Staged::new(u64::MAX, "", unbounded());
        s.write_at(0, b"head").unwrap();
        s.write_at(SPILL_AT + 10, b"tail").unwrap();
        assert!(s.spilled());
        assert_eq!(s.len(), SPILL_AT + 14);
        assert_eq!(s.read(0, 4).unwrap(), b"head");
        assert_eq!(s.read(SPILL_AT + 10, 100).unwrap(), b"tail");
        let all = s.source().unwrap();
        assert_eq!(all.head(4).unwrap(), b"head");
        assert_eq!(all.len(), SPILL_AT + 14);
        s.set_len(2).unwrap();
        assert_eq!(s.source().unwrap().head(10).unwrap(), b"he");
    }

    fn buffer_ptr(s: &Staged) -> *const u8 {
        match &s.buffer {
            Buffer::Memory(v) => v.as_ptr(),
            Buffer::Spilled { .. } | Buffer::Streamed { .. } => panic!("not in memory"),
        }
    }

    fn content(s: &mut Staged) -> Vec<u8> {
        s.read(0, u32::MAX).unwrap()
    }

    #[test]
    fn a_large_buffer_is_kept_for_the_next_writer_and_charged_while_used() {
        let spill = Spill::new(None, 64 << 20);
        let size = 4u64 << 20;
        let mut first = Staged::new(size, "test", spill.clone());
        first.reserve(size);
        first.write_at(0, &vec![0xAB; size as usize]).unwrap();
        let buffer = buffer_ptr(&first);
        drop(first);
        assert_eq!(spill.in_memory(), 0);
        assert_eq!(spill.spare_capacity(), Some(size as usize));

        // The next writer of a like size gets it, charged; its old bytes never show.
        let mut second = Staged::new(size, "test", spill.clone());
        second.reserve(size);
        assert_eq!(buffer_ptr(&second), buffer);
        assert_eq!(spill.in_memory(), size);
        assert_eq!(spill.spare_capacity(), None);
        second.write_at(1 << 20, b"late").unwrap();
        let mut want = vec![0u8; (1 << 20) + 4];
        want[1 << 20..].copy_from_slice(b"late");
        assert_eq!(content(&mut second), want);
        // Appends, overwrites and writes past the end agree with a plain vector.
        second.write_at(want.len() as u64, b"next").unwrap();
        want.extend_from_slice(b"next");
        second.write_at(2, b"xy").unwrap();
        want[2..4].copy_from_slice(b"xy");
        second.write_at(want.len() as u64 + 3, b"z").unwrap();
        want.extend_from_slice(&[0, 0, 0, b'z']);
        assert_eq!(content(&mut second), want);
        drop(second);
        assert_eq!(spill.in_memory(), 0);

        // A writer whose content grows large without the spare frees it, and so does one
        // whose content spills.
        let mut large = Staged::new(SPILL_AT + 1, "test", spill.clone());
        large.write_at(0, &[1; 1 << 20]).unwrap();
        assert_eq!(spill.spare_capacity(), Some(size as usize));
        large.write_at(1 << 20, &[2; 2 << 20]).unwrap();
        assert_eq!(spill.spare_capacity(), None);
        drop(large);
        let mut again = Staged::new(size, "test", spill.clone());
        again.reserve(size);
        drop(again);
        assert_eq!(spill.spare_capacity(), Some(size as usize));
        let mut large = Staged::new(SPILL_AT + 1, "test", spill.clone());
        large.set_len(SPILL_AT + 1).unwrap();
        assert!(large.spilled());
        assert_eq!(spill.spare_capacity(), None);
        drop(large);
        let mut again = Staged::new(size, "test", spill.clone());
        again.reserve(size);
        again.write_at(0, b"x").unwrap();
        drop(again);
        assert_eq!(spill.spare_capacity(), Some(size as usize));

        // A writer of a much smaller file does not take it, nor keeps it from being freed
        // as idle.
        let kept_at = spill.spare.lock().unwrap().as_ref().unwrap().1;
        let mut small = Staged::new(size / 2 - 1, "test", spill.clone());
        small.reserve(size / 2 - 1);
        small.write_at(0, b"small").unwrap();
        assert_eq!(spill.spare_capacity(), Some(size as usize));
        drop(small);
        assert_eq!(spill.spare.lock().unwrap().as_ref().unwrap().1, kept_at);
        spill.free_idle_spare(Duration::from_secs(3600));
        assert_eq!(spill.spare_capacity(), Some(size as usize));
        spill.free_idle_spare(Duration::ZERO);
        assert_eq!(spill.spare_capacity(), None);
    }
}
