//! The rendered bytes of generated text files, kept within a fixed budget.
//!
//! Rendering is deterministic (`render`), so an evicted text renders to the same bytes when
//! it is read again; only its length is kept for good (in the node, for `stat`). Eviction is
//! CLOCK (second chance): entries are queued in insertion order, a hit marks an entry, and
//! the oldest unmarked one goes first.
//!
//! A text larger than the whole budget is not counted against it: it is kept alone in a
//! separate slot, so that reading it in many small requests renders it once, and dropped
//! when another such text takes the slot or when it has not been read for [`OVERSIZE_IDLE`].
//! The memory held is thus at most the budget plus the largest text being read.
//!
//! A text is rendered by one thread at a time: others asking for it meanwhile wait for that
//! rendering (the kernel sends concurrent reads of one file, and two renderings of a 1 GB
//! `program.json` would double the peak).
//!
//! A text larger than the budget that can be rendered a window at a time (`program.json`,
//! `flat_tensor.json`: `render::windowed`) is never kept: its marks are, for the last
//! [`MARKED_KEPT`] such texts (about 1/1000 of each text's size), and each read renders its
//! window from them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::render::Marked;
use super::Ino;

/// Bytes of rendered text a tree keeps (plus one text larger than this while it is read).
pub const TEXT_CACHE_BUDGET: usize = 64 << 20;

/// How long a text larger than the budget is kept after its last read.
pub const OVERSIZE_IDLE: Duration = Duration::from_secs(30);

/// How many texts' marks are kept.
pub const MARKED_KEPT: usize = 4;

/// Bytes charged per entry on top of its text (map slot, queue slot, `Arc` header), so that
/// many tiny texts are bounded too.
const ENTRY_OVERHEAD: usize = 64;

#[derive(Debug)]
struct Entry {
    text: Arc<[u8]>,
    referenced: bool,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Ino, Entry>,
    /// Inodes in insertion order (each at most once).
    queue: VecDeque<Ino>,
    /// Charged bytes of the entries in `map`.
    bytes: usize,
    /// A text larger than the budget, and when it was last used.
    oversize: Option<(Ino, Arc<[u8]>, Instant)>,
    /// Texts being rendered now.
    rendering: HashSet<Ino>,
}

#[derive(Debug)]
pub struct TextCache {
    budget: usize,
    inner: Mutex<Inner>,
    /// Signalled when a rendering ends.
    rendered: Condvar,
    /// The marks of the last texts rendered by windows, newest last.
    marked: Mutex<VecDeque<(Ino, Arc<Marked>)>>,
}

fn cost(text: &[u8]) -> usize {
    text.len() + ENTRY_OVERHEAD
}

impl TextCache {
    pub fn new(budget: usize) -> TextCache {
        TextCache {
            budget,
            inner: Mutex::new(Inner::default()),
            rendered: Condvar::new(),
            marked: Mutex::new(VecDeque::new()),
        }
    }

    /// The marks of `ino`, if they are kept.
    pub fn marked(&self, ino: Ino) -> Option<Arc<Marked>> {
        let kept = self.marked.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().find(|(i, _)| *i == ino).map(|(_, m)| m.clone())
    }

    /// Keeps the marks of `ino`, dropping the oldest beyond `MARKED_KEPT`.
    pub fn keep_marked(&self, ino: Ino, marked: Arc<Marked>) {
        let mut kept = self.marked.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|(i, _)| *i != ino);
        kept.push_back((ino, marked));
        while kept.len() > MARKED_KEPT {
            kept.pop_front();
        }
    }

    /// The text of `ino`: cached, or made by `render` (in this thread, or in another one that
    /// was already rendering it), then cached.
    pub fn get_or_render(&self, ino: Ino, render: impl FnOnce() -> Arc<[u8]>) -> Arc<[u8]> {
        match self.try_get_or_render(ino, || Ok::<_, std::convert::Infallible>(render())) {
            Ok(text) => text,
            Err(never) => match never {},
        }
    }

    /// `get_or_render` for a rendering that can fail: a failure is returned and not kept,
    /// and a waiter then renders for itself.
    pub fn try_get_or_render<E>(
        &self, ino: Ino, render: impl FnOnce() -> Result<Arc<[u8]>, E>,
    ) -> Result<Arc<[u8]>, E> {
        let mut inner = self.lock();
        loop {
            if let Some(text) = Self::lookup(&mut inner, ino) {
                return Ok(text);
            }
            if inner.rendering.insert(ino) {
                break;
            }
            inner = self.rendered.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
        drop(inner);
        // Whatever happens to the rendering, the waiters are woken and try themselves.
        struct Done<'a>(&'a TextCache, Ino);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.lock().rendering.remove(&self.1);
                self.0.rendered.notify_all();
            }
        }
        let _done = Done(self, ino);
        let text = render()?;
        self.insert(ino, text.clone());
        Ok(text)
    }

    /// Forgets the text of `ino` (its source bytes changed).
    pub fn remove(&self, ino: Ino) {
        let mut inner = self.lock();
        if let Some(entry) = inner.map.remove(&ino) {
            inner.bytes -= cost(&entry.text);
            inner.queue.retain(|&q| q != ino);
        }
        if inner.oversize.as_ref().is_some_and(|(o, _, _)| *o == ino) {
            inner.oversize = None;
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, ino: Ino) -> Option<Arc<[u8]>> {
        Self::lookup(&mut self.lock(), ino)
    }

    fn lookup(inner: &mut Inner, ino: Ino) -> Option<Arc<[u8]>> {
        let now = Instant::now();
        if let Some((o, text, used)) = &mut inner.oversize {
            if *o == ino {
                *used = now;
                return Some(text.clone());
            }
            if now.duration_since(*used) > OVERSIZE_IDLE {
                inner.oversize = None;
            }
        }
        let entry = inner.map.get_mut(&ino)?;
        entry.referenced = true;
        Some(entry.text.clone())
    }

    /// Keeps `text` as the rendering of `ino`, evicting older entries to stay within budget.
    pub fn insert(&self, ino: Ino, text: Arc<[u8]>) {
        let mut inner = self.lock();
        if cost(&text) > self.budget {
            inner.oversize = Some((ino, text, Instant::now()));
            return;
        }
        if inner.map.contains_key(&ino) {
            // Rendered twice at once: both renderings are equal.
            return;
        }
        let need = cost(&text);
        while inner.bytes + need > self.budget {
            let Some(victim) = inner.queue.pop_front() else {
                break;
            };
            let Some(entry) = inner.map.get_mut(&victim) else {
                continue;
            };
            if entry.referenced {
                entry.referenced = false;
                inner.queue.push_back(victim);
                continue;
            }
            let cost = cost(&entry.text);
            inner.map.remove(&victim);
            inner.bytes -= cost;
        }
        inner.bytes += need;
        inner.queue.push_back(ino);
        inner.map.insert(
            ino,
            Entry {
                text,
                referenced: false,
            },
        );
    }

    /// Bytes charged to the budget now (texts and per-entry overhead).
    pub fn charged(&self) -> usize {
        self.lock().bytes
    }

    /// Number of cached texts, the oversize one included.
    pub fn len(&self) -> usize {
        let inner = self.lock();
        inner.map.len() + usize::from(inner.oversize.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, fill: u8) -> Arc<[u8]> {
        vec![fill; n].into()
    }

    #[test]
    fn stays_within_budget_and_evicts_unused_first() {
        let cache = TextCache::new(10 * (100 + ENTRY_OVERHEAD));
        for ino in 1..=10 {
            cache.insert(ino, text(100, ino as u8));
        }
        assert_eq!(cache.len(), 10);
        assert_eq!(cache.charged(), cache.budget());
        // A hit protects 1 from the next eviction: 2 goes instead.
        assert_eq!(cache.get(1).unwrap()[0], 1);
        cache.insert(11, text(100, 11));
        assert!(cache.get(1).is_some());
        assert!(cache.get(2).is_none());
        assert!(cache.get(11).is_some());
        for ino in 12..1000 {
            cache.insert(ino, text(1 + ino as usize % 150, 0));
            assert!(cache.charged() <= cache.budget(), "after {ino}");
        }
        // Many tiny texts are bounded by their overhead too.
        for ino in 1000..100_000 {
            cache.insert(ino, text(0, 0));
        }
        assert!(cache.charged() <= cache.budget());
        assert!(cache.len() <= cache.budget() / ENTRY_OVERHEAD + 1);
    }

    #[test]
    fn one_rendering_at_a_time_per_text() {
        let cache = Arc::new(TextCache::new(1 << 20));
        let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (cache, renders) = (cache.clone(), renders.clone());
                std::thread::spawn(move || {
                    cache.get_or_render(7, || {
                        renders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                        text(10, 7)
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(&*t.join().unwrap(), &[7; 10]);
        }
        assert_eq!(renders.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn a_text_larger_than_the_budget_is_kept_alone_and_replaced() {
        let cache = TextCache::new(1000);
        cache.insert(1, text(500, 1));
        cache.insert(2, text(5000, 2));
        assert_eq!(cache.get(2).unwrap().len(), 5000);
        // The small one stays: the big one is not charged to the budget.
        assert!(cache.get(1).is_some());
        assert_eq!(cache.charged(), 500 + ENTRY_OVERHEAD);
        cache.insert(3, text(6000, 3));
        assert!(cache.get(2).is_none());
        assert_eq!(cache.get(3).unwrap().len(), 6000);
    }
}
