//! Float32 views of payload constants (`values/<id>.f32.npy`): dequantized per read, for any
//! window of elements, and the streaming of a float32 array written to one.
//!
//! Invariants: a view reads only the byte ranges it names, which lie inside their files; a
//! read whose bytes no longer fit the view's layout fails (EIO) instead of reading short;
//! a written array is read in windows of bounded size, never whole.

use std::fmt;
use std::sync::Arc;

use crate::content::Source;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::{npy, Model};

/// Why a constant cannot be (de)quantized as asked; the message starts with what the
/// constant is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError {
    message: String,
}

impl QuantError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        QuantError {
            message: message.into(),
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for QuantError {}

/// How a backend's constant dequantizes to float32: its shape, how many bytes of data and
/// scales it reads, and the conversion itself.
pub trait Dequantize: Send + Sync + fmt::Debug {
    /// The view's shape, in elements.
    fn shape(&self) -> Vec<u64>;
    /// Elements of the view (the product of `dims`).
    fn numel(&self) -> u64;
    /// Bytes of stored data the view reads.
    fn data_nbytes(&self) -> u64;
    /// Bytes of scales the view reads (0 when it needs none).
    fn scale_nbytes(&self) -> u64;
    /// How the stored values map to floats, in words (`"groups of 32, bf16 scales"`,
    /// `"per channel, fp32 scales"`); None for float and plain integer types, which need no
    /// scales.
    fn scheme(&self) -> Option<String>;
    /// Dequantizes elements `first .. first + out.len()` (row-major) into `out`; `data` and
    /// `scales` hold at least `data_nbytes` and `scale_nbytes` bytes.
    fn dequantize(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> std::result::Result<(), QuantError>;
    /// The quantization step of elements `first .. first + out.len()` into `out`: how far
    /// apart the values the storage can hold are around each element, the scale of an
    /// integer element, the spacing of a float format at the element's value
    /// ([`float_spacing`]). Quantizing a float32 source puts the stored value within about
    /// half a step of it (docs/names.md#noise).
    fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> std::result::Result<(), QuantError>;
    /// The integer grid behind a quantized layout's values, for statistics
    /// (docs/tree.md#histograms); None for float layouts.
    fn grid(&self) -> Option<Grid> {
        None
    }
    /// Calls `f(start, len, scale)` for consecutive runs of elements `first..end` that share
    /// one scale (`scale` < `Grid::scales`). Only asked of layouts with a grid.
    fn scale_runs(&self, first: u64, end: u64, f: &mut dyn FnMut(u64, usize, usize)) {
        f(first, (end - first) as usize, 0)
    }
    /// Scale `index` as the runtime reads it; `scales` holds at least `scale_nbytes` bytes.
    fn scale(&self, scales: &[u8], index: usize) -> f32 {
        let _ = (scales, index);
        1.0
    }
}

/// How a quantized layout's values lie on a grid: element `e` is `q × scale[s(e)]`, `q` a
/// stored integer minus the zero point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// The lowest and highest `q` (stored range minus zero point): values there are clipped
    /// by the quantization. None where the range is so wide that clipping means nothing
    /// (32-bit integers).
    pub levels: Option<(i64, i64)>,
    /// The zero point subtracted from stored integers.
    pub zero_point: i64,
    /// Scale indices `scale_runs` can give (some may be padding no element uses).
    pub scales: usize,
    /// What one scale covers: `"tensor"`, `"channel"` or `"group"`.
    pub unit: &'static str,
}

/// A binary float format: bits of fraction, and the exponent of its smallest normal value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloatFormat {
    pub fraction: i32,
    pub min_exp: i32,
}

pub const FLOAT32: FloatFormat = FloatFormat {
    fraction: 23,
    min_exp: -126,
};
pub const FLOAT16: FloatFormat = FloatFormat {
    fraction: 10,
    min_exp: -14,
};
pub const BFLOAT16: FloatFormat = FloatFormat {
    fraction: 7,
    min_exp: -126,
};

/// The distance between `v` (a value of `format`, widened to float32) and the next larger
/// value of `format` in magnitude: `2^(max(exponent(v), min_exp) - fraction)`, subnormals
/// and zero spaced as the smallest normals are.
pub fn float_spacing(v: f32, format: FloatFormat) -> f32 {
    let bits = v.to_bits() & 0x7fff_ffff;
    // A float32 subnormal (or zero) is below every normal exponent.
    let exp = if bits >= 0x0080_0000 {
        (bits >> 23) as i32 - 127
    } else {
        -127
    };
    // 2^e as a float32: normal down to 2^-126, subnormal down to 2^-149.
    let e = exp.max(format.min_exp) - format.fraction;
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (e + 149).max(0))
    }
}

/// A constant's float32 view, placed in the model: the layout, and where its bytes and
/// scales are.
#[derive(Debug, Clone)]
pub struct FloatView {
    pub layout: Arc<dyn Dequantize>,
    pub data: Location,
    /// None when the layout reads no scales.
    pub scales: Option<Location>,
}

impl FloatView {
    /// The `.npy` header of the view: float32, shaped like the constant.
    pub fn npy_header(&self) -> Vec<u8> {
        npy::header_from_dims("<f4", self.layout.shape().into_iter())
    }

    /// Whether the bytes at hand hold what the view reads: at least the data and scale bytes
    /// its layout needs. A view that is not backed (dims far larger than the constant's
    /// bytes, from a damaged or crafted payload) could only fail every read.
    pub fn backed(&self) -> bool {
        self.data.range.len() >= self.layout.data_nbytes()
            && self.scales.map_or(0, |l| l.range.len()) >= self.layout.scale_nbytes()
    }

    /// The byte ranges of the model files the view is computed from.
    pub fn sources(&self) -> impl Iterator<Item = Location> + '_ {
        std::iter::once(self.data).chain(self.scales)
    }
}

/// Bytes `[offset, offset + size)` of a float32 view: its `.npy` header, then the
/// dequantized values, computed only for the elements the window covers.
pub fn read_f32(
    model: &Model, view: &FloatView, header: &[u8], offset: u64, size: u32,
) -> Result<Vec<u8>> {
    let layout = &*view.layout;
    let total = header.len() as u64 + layout.numel() * 4;
    let start = offset.min(total);
    let end = offset.saturating_add(u64::from(size)).min(total);
    // A window that starts inside a float is dequantized from that float's first byte.
    let mut out = Vec::with_capacity((end - start) as usize + 8);
    let h = header.len() as u64;
    if start < h {
        out.extend_from_slice(&header[start as usize..end.min(h) as usize]);
    }
    if end > h {
        let (a, b) = (start.max(h) - h, end - h);
        let (first, last) = (a / 4, b.div_ceil(4));
        let bytes = |l: &Location| {
            model.files[l.file]
                .read_at(l)
                .map_err(|e| Error::new(libc::EIO, e.to_string()))
        };
        if view.data.range.len() < layout.data_nbytes()
            || view.scales.map_or(0, |l| l.range.len()) < layout.scale_nbytes()
        {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "the bytes of this {}-element view no longer fit its datatype and dims (ptefs check says more)",
                    layout.numel()
                ),
            ));
        }
        let data = bytes(&view.data)?;
        let scales = match &view.scales {
            Some(l) => bytes(l)?,
            None => std::borrow::Cow::Borrowed(&[][..]),
        };
        let mut values = vec![0f32; (last - first) as usize];
        layout
            .dequantize(&data, &scales, first, &mut values)
            .map_err(|e| Error::new(libc::EIO, e.message()))?;
        // Whole floats straight into the reply; a window that starts or ends inside a float
        // drops the bytes outside it.
        let at = out.len();
        out.resize(at + 4 * values.len(), 0);
        for (o, v) in out[at..].chunks_exact_mut(4).zip(&values) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        let skip = (a - first * 4) as usize;
        out.truncate(at + skip + (b - a) as usize);
        if skip > 0 {
            out.drain(at..at + skip);
        }
    }
    Ok(out)
}

/// Float32 values a float write converts at a time: the whole array is never held, so
/// writing the view of a filter of any size costs a few hundred KiB beyond the stored bytes.
pub const WINDOW: usize = 1 << 16;

/// Calls `f(first, values)` for consecutive windows of `size` little-endian float32 values
/// of `body` (a whole number of them; the last window may be shorter), `first` being the
/// index of the window's first value.
pub fn for_each_window(
    body: Source, size: usize, mut f: impl FnMut(u64, &[f32]) -> Result<()>,
) -> Result<()> {
    let mut buf = Vec::new();
    let mut window: Vec<f32> = Vec::with_capacity(size);
    // The bytes of a value split between two chunks.
    let mut carry: Vec<u8> = Vec::with_capacity(4);
    let mut first = 0u64;
    let mut failed = None;
    let mut flush = |window: &mut Vec<f32>, first: &mut u64| -> Result<()> {
        f(*first, window)?;
        *first += window.len() as u64;
        window.clear();
        Ok(())
    };
    let read = body.for_each_chunk(&mut buf, |mut chunk| {
        let mut step = || -> Result<()> {
            if !carry.is_empty() {
                let take = (4 - carry.len()).min(chunk.len());
                carry.extend_from_slice(&chunk[..take]);
                chunk = &chunk[take..];
                if carry.len() == 4 {
                    window.push(f32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
                    carry.clear();
                }
            }
            let whole = chunk.len() / 4 * 4;
            for b in chunk[..whole].chunks_exact(4) {
                window.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                if window.len() == size {
                    flush(&mut window, &mut first)?;
                }
            }
            carry.extend_from_slice(&chunk[whole..]);
            Ok(())
        };
        step().map_err(|e| {
            failed = Some(e);
            std::io::Error::other("stopped")
        })
    });
    if let Some(e) = failed {
        return Err(e);
    }
    read.map_err(|e| Error::io("read the staged array", e))?;
    if !window.is_empty() {
        flush(&mut window, &mut first)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn spacing_of_each_format() {
        assert_eq!(float_spacing(1.0, FLOAT32), f32::EPSILON);
        assert_eq!(float_spacing(-1.5, FLOAT32), f32::EPSILON);
        assert_eq!(float_spacing(1.0, FLOAT16), 2f32.powi(-10));
        assert_eq!(float_spacing(1.0, BFLOAT16), 2f32.powi(-7));
        assert_eq!(float_spacing(1000.0, FLOAT16), 0.5);
        // Zero and subnormals are spaced as the smallest normal numbers.
        assert_eq!(float_spacing(0.0, FLOAT32), 2f32.powi(-149));
        assert_eq!(float_spacing(0.0, FLOAT16), 2f32.powi(-24));
        assert_eq!(float_spacing(2f32.powi(-20), FLOAT16), 2f32.powi(-24));
        assert_eq!(float_spacing(1e-40, BFLOAT16), 2f32.powi(-133));
        assert_eq!(float_spacing(3e38, FLOAT32), 2f32.powi(127 - 23));
        // Every binary32 exponent against the definition.
        for exp in -149..=127 {
            let v = 2f64.powi(exp) as f32;
            let want = 2f64.powi(exp.max(-126) - 23) as f32;
            assert_eq!(float_spacing(v, FLOAT32), want, "2^{exp}");
        }
    }

    /// Windows come out in order and whole, however the values straddle the source's
    /// chunks (8 MiB reads of a file, here from an offset that is not a multiple of 4).
    #[test]
    fn windows_cover_every_value_across_chunks() {
        let n = (crate::content::CHUNK / 4) * 2 + WINDOW + 5;
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let memory: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[9, 9, 9]).unwrap();
        file.write_all(&memory).unwrap();
        let source = Source::File {
            file: &file,
            offset: 3,
            len: 4 * n as u64,
        };
        for source in [source, Source::Memory(&memory)] {
            let mut seen = Vec::new();
            for_each_window(source, WINDOW, |first, w| {
                assert_eq!(first, seen.len() as u64);
                assert!(w.len() <= WINDOW);
                seen.extend_from_slice(w);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, values);
        }
        // An error from a window stops the walk and is returned as it is.
        let e = for_each_window(Source::Memory(&memory), WINDOW, |first, _| {
            if first > 0 {
                return Err(Error::invalid("stop here"));
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.message(), "stop here");
    }
}
