//! Checked byte ranges: the one place where file-supplied offsets become slice bounds.

use super::FormatError;

/// A byte range `[start, start + len)` inside a file, known to lie within it.
///
/// Invariant: `start + len` does not overflow: ranges are made only by `checked_range`,
/// `ByteRange::new` (which checks it) and `prefix` (which shortens one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ByteRange {
    start: u64,
    len: u64,
}

impl ByteRange {
    /// `[start, start + len)`, or None when its end overflows.
    pub fn new(start: u64, len: u64) -> Option<ByteRange> {
        start.checked_add(len).map(|_| ByteRange { start, len })
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// `len` bytes from `offset` into this range, clamped to its end.
    pub fn slice_from(&self, offset: u64, len: u64) -> ByteRange {
        let offset = offset.min(self.len);
        ByteRange {
            start: self.start + offset,
            len: len.min(self.len - offset),
        }
    }

    /// The first `len` bytes of this range (all of it when it is shorter).
    pub fn prefix(&self, len: u64) -> ByteRange {
        ByteRange {
            start: self.start,
            len: len.min(self.len),
        }
    }

    pub fn as_usize(&self) -> std::ops::Range<usize> {
        self.start as usize..self.end() as usize
    }
}

/// `base + offset .. + len`, checked for overflow and against `limit` (exclusive end bound).
pub fn checked_range(
    what: &str, base: u64, offset: u64, len: u64, limit: u64,
) -> Result<ByteRange, FormatError> {
    let start = base.checked_add(offset).ok_or_else(|| {
        FormatError::new(format!(
            "{what}: offset {offset} plus base {base} overflows 64 bits"
        ))
    })?;
    let end = start.checked_add(len).ok_or_else(|| {
        FormatError::new(format!(
            "{what}: start {start} plus size {len} overflows 64 bits"
        ))
    })?;
    if end > limit {
        return Err(FormatError::new(format!(
            "{what}: bytes {start}..{end} reach past the end at {limit} (expected end <= {limit}, found {end})"
        )));
    }
    Ok(ByteRange { start, len })
}

pub fn align_up(value: u64, alignment: u64) -> Option<u64> {
    if alignment <= 1 {
        return Some(value);
    }
    let rem = value % alignment;
    if rem == 0 {
        Some(value)
    } else {
        value.checked_add(alignment - rem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_overflow_and_out_of_bounds() {
        assert!(checked_range("x", u64::MAX, 1, 0, u64::MAX).is_err());
        assert!(checked_range("x", 0, u64::MAX, 1, u64::MAX).is_err());
        assert!(checked_range("x", 10, 5, 6, 20).is_err());
        let r = checked_range("x", 10, 5, 5, 20).unwrap();
        assert_eq!((r.start, r.end()), (15, 20));
    }

    #[test]
    fn aligns() {
        assert_eq!(align_up(0, 128), Some(0));
        assert_eq!(align_up(1, 128), Some(128));
        assert_eq!(align_up(128, 128), Some(128));
        assert_eq!(align_up(5, 1), Some(5));
        assert_eq!(align_up(u64::MAX, 16), None);
    }
}
