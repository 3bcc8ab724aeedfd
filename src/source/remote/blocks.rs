//! The bytes of a remote object held in memory: for each block of `BLOCK` bytes, the
//! extents of it fetched so far, merged; the least recently used blocks are dropped past a
//! byte limit.
//!
//! Invariants: a block's extents are sorted, never overlap nor touch (touching ones are
//! merged), are non-empty and lie inside their block; the table never holds more than its
//! limit plus one block.

use std::collections::HashMap;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

use super::BLOCK;

/// The extents of one block: (offset in the object, bytes).
pub type Extents = Vec<(u64, Bytes)>;

/// Adds `bytes` at `start` to `extents`, merging it with the extents it overlaps or
/// touches (its own bytes win where they overlap: both came from the same version).
pub fn insert(extents: &mut Extents, start: u64, bytes: Bytes) {
    if bytes.is_empty() {
        return;
    }
    let mut lo = start;
    let mut hi = start + bytes.len() as u64;
    let mut parts = vec![(start, bytes)];
    extents.retain(|(s, b)| {
        let e = s + b.len() as u64;
        if e < lo || *s > hi {
            return true;
        }
        parts.push((*s, b.clone()));
        false
    });
    if parts.len() > 1 {
        for (s, b) in &parts {
            lo = lo.min(*s);
            hi = hi.max(s + b.len() as u64);
        }
        let mut merged = BytesMut::zeroed((hi - lo) as usize);
        // The new bytes last, so they win.
        for (s, b) in parts.iter().skip(1).chain(parts.iter().take(1)) {
            let at = (s - lo) as usize;
            merged[at..at + b.len()].copy_from_slice(b);
        }
        parts = vec![(lo, merged.freeze())];
    }
    let part = parts.pop().expect("one part");
    let at = extents.partition_point(|(s, _)| *s < part.0);
    extents.insert(at, part);
}

/// The bytes of `range` when one extent holds all of them.
pub fn covering(extents: &Extents, range: &Range<u64>) -> Option<Bytes> {
    extents.iter().find_map(|(s, b)| {
        let e = s + b.len() as u64;
        (*s <= range.start && range.end <= e)
            .then(|| b.slice((range.start - s) as usize..(range.end - s) as usize))
    })
}

/// The part of `range` to fetch: `range` without the start and the end that extents
/// already hold (what lies between is fetched again: one request, not several).
pub fn missing(extents: &Extents, range: &Range<u64>) -> Range<u64> {
    let (mut start, mut end) = (range.start, range.end);
    for (s, b) in extents {
        let e = s + b.len() as u64;
        if *s <= start && start < e {
            start = e.min(end);
        }
    }
    for (s, b) in extents.iter().rev() {
        let e = s + b.len() as u64;
        if *s < end && end <= e {
            end = (*s).max(start);
        }
    }
    start..end.max(start)
}

/// The blocks held in memory.
pub struct Table {
    blocks: HashMap<u64, (Extents, u64)>,
    bytes: usize,
    limit: usize,
    tick: u64,
}

impl Table {
    pub fn new(limit: usize) -> Table {
        Table {
            blocks: HashMap::new(),
            bytes: 0,
            limit,
            tick: 0,
        }
    }

    /// The extents of block `block`, marked used.
    pub fn get(&mut self, block: u64) -> Option<&Extents> {
        self.tick += 1;
        let tick = self.tick;
        self.blocks.get_mut(&block).map(|(e, t)| {
            *t = tick;
            &*e
        })
    }

    /// Adds `bytes` at `start` to block `block`; returns the block's extents after it,
    /// then drops the least recently used other blocks while over the limit.
    pub fn insert(&mut self, block: u64, start: u64, bytes: Bytes) -> Extents {
        debug_assert_eq!(start / BLOCK, block);
        self.tick += 1;
        let tick = self.tick;
        let entry = self
            .blocks
            .entry(block)
            .or_insert_with(|| (Vec::new(), tick));
        let before: usize = entry.0.iter().map(|(_, b)| b.len()).sum();
        insert(&mut entry.0, start, bytes);
        entry.1 = tick;
        let after: usize = entry.0.iter().map(|(_, b)| b.len()).sum();
        let extents = entry.0.clone();
        self.bytes = self.bytes - before + after;
        while self.bytes > self.limit && self.blocks.len() > 1 {
            let oldest = self
                .blocks
                .iter()
                .filter(|(k, _)| **k != block)
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k);
            let Some(k) = oldest else { break };
            if let Some((e, _)) = self.blocks.remove(&k) {
                self.bytes -= e.iter().map(|(_, b)| b.len()).sum::<usize>();
            }
        }
        extents
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(fill: u8, len: usize) -> Bytes {
        Bytes::from(vec![fill; len])
    }

    #[test]
    fn extents_merge_when_they_touch_or_overlap() {
        let mut e = Extents::new();
        insert(&mut e, 10, b(1, 10));
        insert(&mut e, 40, b(2, 10));
        assert_eq!(e.len(), 2);
        insert(&mut e, 20, b(3, 20));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, 10);
        assert_eq!(e[0].1.len(), 40);
        assert_eq!(
            &e[0].1[..],
            &[[1u8; 10], [3; 10], [3; 10], [2; 10]].concat()[..]
        );
        assert_eq!(covering(&e, &(15..45)).unwrap().len(), 30);
        assert!(covering(&e, &(5..15)).is_none());
    }

    #[test]
    fn missing_trims_what_is_held_at_either_end() {
        let mut e = Extents::new();
        insert(&mut e, 0, b(0, 100));
        insert(&mut e, 200, b(0, 100));
        assert_eq!(missing(&e, &(50..250)), 100..200);
        assert_eq!(missing(&e, &(0..100)), 100..100);
        assert_eq!(missing(&e, &(100..150)), 100..150);
        assert_eq!(missing(&e, &(250..400)), 300..400);
        assert_eq!(missing(&e, &(0..300)), 100..200);
    }

    #[test]
    fn the_table_drops_the_least_recently_used_blocks() {
        let mut t = Table::new(250);
        t.insert(0, 0, b(0, 100));
        t.insert(1, BLOCK, b(1, 100));
        assert!(t.get(0).is_some());
        t.insert(2, 2 * BLOCK, b(2, 100));
        assert!(t.get(1).is_none());
        assert!(t.get(0).is_some() && t.get(2).is_some());
        assert_eq!(t.bytes(), 200);
    }
}
