//! A model file on a web server or in an object store (`https://`, `s3://`, `gs://`,
//! `az://`, ...), read lazily by ranges: opening it asks for its size and version; every
//! read fetches only the blocks it needs that are neither in memory nor in the block cache
//! on disk, plus a read-ahead for sequential readers that grows as they go on.
//!
//! The network runs on a small tokio runtime owned by this module (the rest of the crate is
//! synchronous): a reader's thread waits for its own blocks only, so a stalled request holds
//! up the readers of those bytes and no others.
//!
//! Invariants: bytes come only from the version of the object that was opened (its size,
//! ETag and Last-Modified; `store`), and once the object is seen to have changed every
//! later read fails saying so; memory is bounded (`MEMORY` of blocks in memory, at most
//! `MAX_AHEAD` read-ahead fetches in flight, `MAX_WINDOW` of read-ahead per reader, and a
//! demanded read of at most its own blocks); no message holds a secret of the URL.
//! The user contract is docs/remote.md.

pub mod address;
pub mod blocks;
pub mod disk;
pub mod store;

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};

pub use address::{is_remote, Address};
use blocks::Table;
use disk::DiskCache;
use store::{FetchError, Object, Version};

use super::ByteSource;

/// The unit of fetching and caching: a request never spans two blocks.
pub const BLOCK: u64 = 4 << 20;
/// What opening a file reads with its version: what the parser reads first
/// (`format::model`'s first read), so a file whose flatbuffer fits is opened in one request.
const FIRST_READ: u64 = 4096;
/// Bytes of blocks kept in memory (per object).
const MEMORY: usize = 64 << 20;
/// The read-ahead of a reader that just started, and the most it grows to.
const FIRST_WINDOW: u64 = BLOCK;
const MAX_WINDOW: u64 = 32 << 20;
/// Read-ahead fetches in flight at once (per object); demanded reads do not wait for these.
const MAX_AHEAD: usize = 8;
/// Readers followed for read-ahead at once (per object).
const STREAMS: usize = 16;
/// How far from where a reader stopped its next read may start and still count as
/// sequential (the kernel sends a sequential reader's requests slightly out of order).
const NEAR: u64 = 2 << 20;

/// How remote objects are read; one set per process (`configure`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The block cache's directory; `None`: no cache on disk.
    pub cache_dir: Option<PathBuf>,
    /// Bytes the cache directory may hold (0: no cache on disk).
    pub cache_size: u64,
    /// How long a connection or a read may stall before it is retried.
    pub timeout: Duration,
    /// Retries of a failed request (with exponential backoff) before the read fails.
    pub retries: usize,
}

/// `name` (a URL) as it may be shown: without user information, query or fragment.
pub fn shown(name: &str) -> String {
    Address::parse(name).map(|a| a.shown).unwrap_or_else(|_| {
        let bare = name.split(['?', '#']).next().unwrap_or_default();
        match bare.split_once("://") {
            // Whatever precedes an `@` of the host part is user information.
            Some((scheme, rest)) => {
                let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let host = host.rsplit('@').next().unwrap_or_default();
                format!("{scheme}://{host}{path}")
            }
            None => bare.to_string(),
        }
    })
}

/// The cache directory when none is named: `$XDG_CACHE_HOME/ptefs`, else `~/.cache/ptefs`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    std::env::var_os("XDG_CACHE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".cache"))
        })
        .map(|d| d.join("ptefs"))
}

/// Default size of the cache on disk.
pub const DEFAULT_CACHE_SIZE: u64 = 4 << 30;

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            cache_dir: default_cache_dir(),
            cache_size: DEFAULT_CACHE_SIZE,
            timeout: Duration::from_secs(30),
            retries: 3,
        }
    }
}

fn settings_cell() -> &'static RwLock<Settings> {
    static SETTINGS: OnceLock<RwLock<Settings>> = OnceLock::new();
    SETTINGS.get_or_init(|| RwLock::new(Settings::default()))
}

/// Sets how the objects opened from now on are read.
pub fn configure(settings: Settings) {
    *settings_cell().write().unwrap_or_else(|e| e.into_inner()) = settings;
}

fn settings() -> Settings {
    settings_cell()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The runtime the network runs on, started on first use (after a daemon forked: threads
/// do not survive a fork).
fn runtime() -> io::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ptefs-net")
        .enable_all()
        .build()?;
    Ok(RUNTIME.get_or_init(|| r))
}

/// A fetch in flight, which any number of readers may wait for: its bytes (offset, bytes)
/// or why it failed.
type Pending = Shared<BoxFuture<'static, Result<(u64, Bytes), Arc<str>>>>;

/// The fetches in flight of each block, with their ranges.
type InFlight = HashMap<u64, Vec<(Range<u64>, Pending)>>;

/// A sequential reader being followed: where its last read ended, and its read-ahead.
#[derive(Clone, Copy)]
struct Stream {
    next: u64,
    window: u64,
    used: u64,
}

struct Inner {
    object: Object,
    version: Version,
    disk: Option<DiskCache>,
    table: Mutex<Table>,
    /// Fetches in flight: block → (range, fetch).
    inflight: Mutex<InFlight>,
    ahead: AtomicUsize,
    streams: Mutex<(Vec<Stream>, u64)>,
    /// Why the object can no longer be read (it changed on the server).
    changed: OnceLock<String>,
    requests: AtomicU64,
    fetched: AtomicU64,
}

/// Blocks being written to the cache on disk, by every remote object of the process.
static WRITING: AtomicUsize = AtomicUsize::new(0);

/// Waits (a few seconds at most) until the blocks fetched so far are in the cache on disk:
/// a command or a daemon calls it before it exits, so the next one finds them.
pub fn flush() {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while WRITING.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A remote object, read by ranges.
pub struct RemoteSource {
    inner: Arc<Inner>,
    runtime: &'static tokio::runtime::Runtime,
}

/// Where a remote model opened: the URL as shown, its file name, its bytes.
pub struct Opened {
    pub shown: String,
    pub file_name: String,
    pub source: RemoteSource,
}

/// Opens the object `name` names (a URL `is_remote` accepts): asks for its size and
/// version, and opens its block cache. Errors never quote the URL's secrets.
pub fn open(name: &str) -> Result<Opened, String> {
    let address = Address::parse(name)?;
    let settings = settings();
    let runtime = runtime().map_err(|e| format!("cannot start the network runtime: {e}"))?;
    let shown = address.shown.clone();
    let file_name = address.file_name();
    let object = Object::new(address, &settings)?;
    let deadline = settings.timeout.saturating_mul(4);
    // The first bytes and the version in one request (a HEAD when that fails).
    let (version, first) = runtime
        .block_on(async {
            tokio::time::timeout(deadline, async {
                match object.first(FIRST_READ).await? {
                    Some((v, b)) => Ok::<_, String>((v, Some(b))),
                    None => Ok((object.head().await?, None)),
                }
            })
            .await
        })
        .map_err(|_| format!("no answer within {deadline:?}"))??;
    let disk = match (&settings.cache_dir, settings.cache_size) {
        (Some(dir), size) if size > 0 => match DiskCache::open(dir, size, &version.key(&shown)) {
            Ok(d) => Some(d),
            Err(e) => {
                log::warn!("no block cache on disk: {e}");
                None
            }
        },
        _ => None,
    };
    log::info!(
        "{shown}: {} bytes, ETag {}, last modified {}{}",
        version.size,
        version.etag.as_deref().unwrap_or("(none)"),
        version.last_modified,
        disk.as_ref()
            .map(|_| String::new())
            .unwrap_or_else(|| ", no cache on disk".into())
    );
    let mut table = Table::new(MEMORY);
    let fetched = first.as_ref().map_or(0, |b| b.len() as u64);
    if let Some(b) = first.filter(|b| !b.is_empty()) {
        table.insert(0, 0, b);
    }
    Ok(Opened {
        shown,
        file_name,
        source: RemoteSource {
            inner: Arc::new(Inner {
                object,
                version,
                disk,
                table: Mutex::new(table),
                inflight: Mutex::new(HashMap::new()),
                ahead: AtomicUsize::new(0),
                streams: Mutex::new((Vec::new(), 0)),
                changed: OnceLock::new(),
                requests: AtomicU64::new(1),
                fetched: AtomicU64::new(fetched),
            }),
            runtime,
        },
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn eio(message: impl Into<String>) -> io::Error {
    io::Error::other(message.into())
}

impl Inner {
    fn len(&self) -> u64 {
        self.version.size
    }

    /// The read-ahead of the reader whose read is `range`: grows while its reads follow
    /// each other.
    fn window(&self, range: &Range<u64>) -> u64 {
        let mut guard = lock(&self.streams);
        let (streams, tick) = &mut *guard;
        *tick += 1;
        let near = |s: &Stream| range.start.abs_diff(s.next) <= NEAR;
        if let Some(s) = streams.iter_mut().find(|s| near(s)) {
            s.window = (s.window * 2).min(MAX_WINDOW);
            s.next = s.next.max(range.end);
            s.used = *tick;
            return s.window;
        }
        let s = Stream {
            next: range.end,
            window: FIRST_WINDOW,
            used: *tick,
        };
        if streams.len() < STREAMS {
            streams.push(s);
        } else if let Some(old) = streams.iter_mut().min_by_key(|s| s.used) {
            *old = s;
        }
        FIRST_WINDOW
    }

    /// Starts fetching `span` of block `block` (what memory does not hold of it), first
    /// from the cache on disk; the fetch puts its bytes in memory and on disk.
    fn start(
        self: &Arc<Self>, runtime: &tokio::runtime::Runtime, block: u64, span: Range<u64>,
        ahead: bool,
    ) -> Pending {
        let inner = self.clone();
        let key = span.clone();
        // Registered before the task can end: the task removes its own entry, and an entry
        // left behind would hand its result (an error too) to every later reader.
        let mut inflight = lock(&self.inflight);
        let task = runtime.spawn(async move {
            let result = inner.fetch(block, span.clone()).await;
            {
                let mut inflight = lock(&inner.inflight);
                if let Some(list) = inflight.get_mut(&block) {
                    list.retain(|(r, _)| *r != span);
                    if list.is_empty() {
                        inflight.remove(&block);
                    }
                }
            }
            if ahead {
                inner.ahead.fetch_sub(1, Ordering::Relaxed);
            }
            result
        });
        let pending: Pending = async move {
            task.await
                .unwrap_or_else(|e| Err(Arc::from(format!("the fetch stopped: {e}"))))
        }
        .boxed()
        .shared();
        inflight
            .entry(block)
            .or_default()
            .push((key, pending.clone()));
        drop(inflight);
        pending
    }

    async fn fetch(
        self: &Arc<Self>, block: u64, span: Range<u64>,
    ) -> Result<(u64, Bytes), Arc<str>> {
        if let Some(m) = self.changed.get() {
            return Err(Arc::from(m.as_str()));
        }
        if self.disk.is_some() {
            let inner = self.clone();
            let found = tokio::task::spawn_blocking(move || inner.disk.as_ref()?.get(block))
                .await
                .ok()
                .flatten();
            if let Some(extents) = found {
                let mut table = lock(&self.table);
                for (s, b) in extents {
                    table.insert(block, s, b);
                }
                if let Some(bytes) = table.get(block).and_then(|e| blocks::covering(e, &span)) {
                    return Ok((span.start, bytes));
                }
            }
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.object.fetch(span.clone(), &self.version).await {
            Ok(bytes) => {
                self.fetched
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let extents = lock(&self.table).insert(block, span.start, bytes.clone());
                if self.disk.is_some() {
                    let inner = self.clone();
                    WRITING.fetch_add(1, Ordering::SeqCst);
                    tokio::task::spawn_blocking(move || {
                        if let Some(d) = &inner.disk {
                            if let Err(e) = d.put(block, &extents) {
                                log::debug!("block cache: {e}");
                            }
                        }
                        WRITING.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                Ok((span.start, bytes))
            }
            Err(FetchError::Changed(m)) => {
                log::error!("{m}");
                let _ = self.changed.set(m.clone());
                Err(Arc::from(m))
            }
            Err(FetchError::Failed(m)) => {
                // The log names the URL; the error is given with it by the caller.
                let m = format!("bytes {}..{}: {m}", span.start, span.end);
                log::error!("{}: {m}", self.object.address.shown);
                Err(Arc::from(m))
            }
        }
    }
}

impl RemoteSource {
    /// Requests made (the first asked for the size and version) and bytes fetched so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.inner.requests.load(Ordering::Relaxed),
            self.inner.fetched.load(Ordering::Relaxed),
        )
    }

    /// Bytes `range`, and the read-ahead up to `limit` (at most `MAX_WINDOW` past the read)
    /// when `limit` is given.
    fn get(&self, range: Range<u64>, limit: Option<u64>) -> io::Result<Vec<u8>> {
        let inner = &self.inner;
        if let Some(m) = inner.changed.get() {
            return Err(eio(m.clone()));
        }
        if range.start > range.end || range.end > inner.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {}..{} lie outside the {} bytes of the file",
                    range.start,
                    range.end,
                    inner.len()
                ),
            ));
        }
        let n = usize::try_from(range.end - range.start)
            .map_err(|_| eio(format!("a read of {} bytes", range.end - range.start)))?;
        let mut out = vec![0u8; n];
        if n == 0 {
            return Ok(out);
        }
        // Where fetching stops: the read's end, or past it by the reader's read-ahead
        // (rounded up to a block, never past `limit`, the end of the file it reads).
        let ahead_end = match limit {
            Some(limit) => {
                let w = inner.window(&range);
                let end = range
                    .end
                    .saturating_add(w)
                    .div_ceil(BLOCK)
                    .saturating_mul(BLOCK);
                end.min(limit).min(inner.len()).max(range.end)
            }
            None => range.end,
        };
        let mut filled = vec![false; ((range.end - 1) / BLOCK - range.start / BLOCK + 1) as usize];
        for round in 0..8 {
            let mut waits = Vec::new();
            let first = range.start / BLOCK;
            for block in first..=(ahead_end - 1) / BLOCK {
                let block_range = block * BLOCK..((block + 1) * BLOCK).min(inner.len());
                let clip =
                    |r: &Range<u64>| r.start.max(block_range.start)..r.end.min(block_range.end);
                let demand = clip(&range);
                let demanded = demand.start < demand.end;
                if demanded && filled[(block - first) as usize] {
                    continue;
                }
                let span = clip(&(range.start..ahead_end));
                let need = if demanded {
                    demand.clone()
                } else {
                    span.clone()
                };
                {
                    let mut table = lock(&inner.table);
                    if let Some(extents) = table.get(block) {
                        if let Some(bytes) = blocks::covering(extents, &need) {
                            if demanded {
                                let at = (demand.start - range.start) as usize;
                                out[at..at + bytes.len()].copy_from_slice(&bytes);
                                filled[(block - first) as usize] = true;
                            }
                            continue;
                        }
                    }
                }
                let fetching = {
                    let inflight = lock(&inner.inflight);
                    inflight.get(&block).and_then(|list| {
                        list.iter()
                            .find(|(r, _)| r.start <= need.start && need.end <= r.end)
                            .map(|(_, p)| p.clone())
                    })
                };
                match fetching {
                    Some(p) if demanded => waits.push(p),
                    // A read-ahead already under way.
                    Some(_) => {}
                    None if demanded => {
                        let missing = {
                            let mut table = lock(&inner.table);
                            match table.get(block) {
                                Some(e) => blocks::missing(e, &span),
                                None => span.clone(),
                            }
                        };
                        // What memory holds at either end of the span is not fetched
                        // again: the next round reads the demand from memory.
                        if missing.start < missing.end {
                            waits.push(inner.start(self.runtime, block, missing, false));
                        }
                    }
                    None if round == 0 => {
                        if inner.ahead.fetch_add(1, Ordering::Relaxed) >= MAX_AHEAD {
                            inner.ahead.fetch_sub(1, Ordering::Relaxed);
                            continue;
                        }
                        let missing = {
                            let mut table = lock(&inner.table);
                            match table.get(block) {
                                Some(e) => blocks::missing(e, &span),
                                None => span.clone(),
                            }
                        };
                        if missing.start < missing.end {
                            drop(inner.start(self.runtime, block, missing, true));
                        } else {
                            inner.ahead.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    None => {}
                }
            }
            if waits.is_empty() {
                if filled.iter().all(|f| *f) {
                    return Ok(out);
                }
                continue;
            }
            let results = self.runtime.block_on(futures_util::future::join_all(waits));
            for r in results {
                let (start, bytes) = r.map_err(|e| eio(e.to_string()))?;
                // Copy what the fetch holds of the read; a block is filled once a fetch
                // covers all the read wants of it.
                let end = start + bytes.len() as u64;
                for block in start / BLOCK..=(end.max(start + 1) - 1) / BLOCK {
                    if block < first || block > (range.end - 1) / BLOCK {
                        continue;
                    }
                    let block_range = block * BLOCK..((block + 1) * BLOCK).min(inner.len());
                    let demand = range.start.max(block_range.start)..range.end.min(block_range.end);
                    if start <= demand.start && demand.end <= end {
                        let from = (demand.start - start) as usize;
                        let at = (demand.start - range.start) as usize;
                        let len = (demand.end - demand.start) as usize;
                        out[at..at + len].copy_from_slice(&bytes[from..from + len]);
                        filled[(block - first) as usize] = true;
                    }
                }
            }
            if filled.iter().all(|f| *f) {
                return Ok(out);
            }
        }
        Err(eio(format!(
            "{}: bytes {}..{} could not be kept in memory long enough to be read",
            inner.object.address.shown, range.start, range.end
        )))
    }
}

impl ByteSource for RemoteSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn mapped(&self) -> Option<&[u8]> {
        None
    }

    fn read(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        self.get(range, None).map(Cow::Owned)
    }

    fn read_within(&self, range: Range<u64>, limit: u64) -> io::Result<Cow<'_, [u8]>> {
        self.get(range, Some(limit)).map(Cow::Owned)
    }

    fn fetched_on_demand(&self) -> bool {
        true
    }
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        flush();
        let (requests, bytes) = self.stats();
        log::info!(
            "{}: {requests} requests, {bytes} bytes fetched",
            self.inner.object.address.shown
        );
    }
}
