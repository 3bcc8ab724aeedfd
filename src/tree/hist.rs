//! The histogram picture of a tensor's values (`<value>.hist.svg`, docs/tree.md#histograms):
//! where the values come from, and the two passes over them.
//!
//! Values are read as reads read them: a plan tensor's or a data file key's bytes by their
//! scalar type, a payload constant through its backend's view (`Payload::value_view`: the
//! dequantized values, or the floats of a float32 constant). Each pass walks the tensor in
//! windows of [`WINDOW`] elements, so memory stays bounded whatever its size: bytes of a
//! mapped file are slices of the mapping, and a source that is not mapped is read window by
//! window (a payload view reads its constant's bytes at once, as reads of its `.f32.npy` do).
//!
//! Invariants: the picture is a pure function of the tensor's bytes and its tree path; the
//! same file's bytes always give the same picture; a tensor whose bytes no longer fit its
//! type fails with EIO rather than showing part of it.

use super::{HistOf, Ino, Tree};
use crate::backend::FloatView;
use crate::error::{Error, Result};
use crate::format::layout::Location;
use crate::format::range::ByteRange;
use crate::format::scalar_type;
use crate::picture::hist::{self, Histogram, QuantInfo};
use crate::picture::stats::{Bins, Moments, QuantTally};

/// Elements per window of a pass.
pub const WINDOW: usize = 1 << 16;

/// Where a histogram's values come from.
pub enum Values {
    /// Elements of ExecuTorch scalar type `scalar_type`, stored at `location`.
    Plain {
        location: Location,
        scalar_type: i8,
        numel: u64,
    },
    /// A backend's view of a payload constant.
    View(FloatView),
    /// Name i of the named views, in its checkpoint's dtype.
    Named(usize),
}

/// Whether tensors of ExecuTorch scalar type `t` get a histogram: those whose elements are
/// numbers ptefs converts (integers, bool, half, bfloat16, float, double).
pub fn has_histogram(t: i8) -> bool {
    matches!(t, 0..=7 | 11 | 15 | 27..=29)
}

fn half(b: [u8; 2]) -> f64 {
    f64::from(crate::backend::float16::f16_to_f32(u16::from_le_bytes(b)))
}

/// Decodes little-endian elements of scalar type `t` (one of `has_histogram`'s) into `out`.
fn decode(t: i8, bytes: &[u8], out: &mut Vec<f64>) {
    out.clear();
    macro_rules! each {
        ($n:literal, $f:expr) => {
            out.extend(bytes.chunks_exact($n).map(|c| {
                let a: [u8; $n] = c.try_into().expect("chunks of $n");
                $f(a)
            }))
        };
    }
    match t {
        0 => each!(1, |a: [u8; 1]| f64::from(a[0])),
        1 => each!(1, |a: [u8; 1]| f64::from(a[0] as i8)),
        2 => each!(2, |a| f64::from(i16::from_le_bytes(a))),
        3 => each!(4, |a| f64::from(i32::from_le_bytes(a))),
        4 => each!(8, |a| i64::from_le_bytes(a) as f64),
        5 => each!(2, half),
        6 => each!(4, |a| f64::from(f32::from_le_bytes(a))),
        7 => each!(8, f64::from_le_bytes),
        11 => each!(1, |a: [u8; 1]| f64::from(u8::from(a[0] != 0))),
        15 => each!(2, |a: [u8; 2]| f64::from(f32::from_bits(
            u32::from(u16::from_le_bytes(a)) << 16
        ))),
        27 => each!(2, |a| f64::from(u16::from_le_bytes(a))),
        28 => each!(4, |a| f64::from(u32::from_le_bytes(a))),
        29 => each!(8, |a| u64::from_le_bytes(a) as f64),
        _ => {}
    }
}

fn eio(e: impl std::fmt::Display) -> Error {
    Error::new(libc::EIO, e.to_string())
}

/// The values of histogram `of`, and what they are (`"FLOAT[3,4]"`), if it has any.
pub fn values(tree: &Tree, of: HistOf) -> Option<(Values, String)> {
    let model = &*tree.model;
    let plain = |location: Location, shape: &crate::format::layout::TensorShape| {
        let elem = scalar_type::element_size(shape.scalar_type)?;
        let sizes: Vec<String> = shape.sizes.iter().map(i32::to_string).collect();
        Some((
            Values::Plain {
                location,
                scalar_type: shape.scalar_type,
                numel: location.range.len() / elem,
            },
            format!(
                "{}[{}]",
                scalar_type::display(shape.scalar_type),
                sizes.join(",")
            ),
        ))
    };
    match of {
        HistOf::Value(p, i) => {
            let t = model.value_tensor(p, i)?;
            plain(t.location?, &t.shape)
        }
        HistOf::Named(f, k) => {
            let blob = model.ptd_blobs.get(f)?.as_ref()?.get(k)?;
            plain(*blob.location.as_ref().ok()?, blob.tensor.as_deref()?)
        }
        HistOf::Payload(p, j, k) => {
            let dec = tree.catalog.payloads.get(p, j)?;
            let view = dec.value_view(model, k)?;
            let what = dec.payload.constant(k)?.what;
            let how = if view.layout.grid().is_some() {
                "dequantized"
            } else {
                "as the runtime reads it"
            };
            Some((Values::View(view), format!("{what}, {how}")))
        }
        HistOf::Name(i) => {
            let views = tree.names.as_ref()?;
            let s = views.names.get(i)?.shown.as_ref()?;
            let dims: Vec<String> = s.shape.iter().map(u64::to_string).collect();
            Some((
                Values::Named(i),
                format!(
                    "{}[{}] from {} ({})",
                    s.float.name(),
                    dims.join(","),
                    s.stored.what,
                    s.transform
                ),
            ))
        }
    }
}

/// The byte ranges histogram `of` reads (what a commit that changes them makes stale).
pub fn sources(tree: &Tree, of: HistOf) -> Vec<Location> {
    match values(tree, of) {
        Some((Values::Plain { location, .. }, _)) => vec![location],
        Some((Values::View(v), _)) => v.sources().collect(),
        Some((Values::Named(i), _)) => tree.names.as_ref().map_or(Vec::new(), |v| v.sources(i)),
        None => Vec::new(),
    }
}

/// Calls `f` on consecutive windows of the values as float64, and, for a quantized view,
/// `run(scale index, scale, values)` for each run sharing one scale.
fn walk(
    tree: &Tree, values: &Values, f: &mut dyn FnMut(&[f64]),
    run: &mut dyn FnMut(usize, f32, &[f32]),
) -> Result<()> {
    let model = &*tree.model;
    let mut buf: Vec<f64> = Vec::with_capacity(WINDOW);
    match values {
        Values::Plain {
            location,
            scalar_type,
            numel,
        } => {
            let elem = scalar_type::element_size(*scalar_type).unwrap_or(1);
            let file = &model.files[location.file];
            let mut first = 0u64;
            while first < *numel {
                let n = (*numel - first).min(WINDOW as u64);
                let range = ByteRange::new(location.range.start() + first * elem, n * elem)
                    .ok_or_else(|| eio("a window of the tensor overflows"))?;
                let bytes = file.read(range).map_err(eio)?;
                decode(*scalar_type, &bytes, &mut buf);
                f(&buf);
                first += n;
            }
        }
        Values::View(view) => {
            let layout = &*view.layout;
            if view.data.range.len() < layout.data_nbytes()
                || view.scales.map_or(0, |l| l.range.len()) < layout.scale_nbytes()
            {
                return Err(eio(format!(
                    "the bytes of this {}-element constant no longer fit its datatype and dims (ptefs check says more)",
                    layout.numel()
                )));
            }
            let data = model.files[view.data.file]
                .read_at(&view.data)
                .map_err(eio)?;
            let scales = match &view.scales {
                Some(l) => model.files[l.file].read_at(l).map_err(eio)?,
                None => std::borrow::Cow::Borrowed(&[][..]),
            };
            let grid = layout.grid().is_some();
            let mut window = vec![0f32; WINDOW];
            let mut first = 0u64;
            while first < layout.numel() {
                let n = (layout.numel() - first).min(WINDOW as u64) as usize;
                let out = &mut window[..n];
                layout
                    .dequantize(&data, &scales, first, out)
                    .map_err(|e| eio(e.message()))?;
                buf.clear();
                buf.extend(out.iter().map(|&v| f64::from(v)));
                f(&buf);
                if grid {
                    let end = first + n as u64;
                    layout.scale_runs(first, end, &mut |start, len, index| {
                        let at = (start - first) as usize;
                        run(index, layout.scale(&scales, index), &out[at..at + len]);
                    });
                }
                first += n as u64;
            }
        }
        Values::Named(i) => {
            let views = tree
                .names
                .as_ref()
                .ok_or_else(|| eio("the named views are gone"))?;
            let numel = views.names[*i].shown.as_ref().map_or(0, |s| s.numel());
            let mut window = vec![0f32; WINDOW];
            let mut first = 0u64;
            while first < numel {
                let n = (numel - first).min(WINDOW as u64) as usize;
                views.read(model, *i, first, &mut window[..n])?;
                buf.clear();
                buf.extend(window[..n].iter().map(|&v| f64::from(v)));
                f(&buf);
                first += n as u64;
            }
        }
    }
    Ok(())
}

/// The picture of histogram `of` for node `ino` ([`hist::HIST_SVG_LEN`] bytes).
pub fn render(tree: &Tree, ino: Ino, of: HistOf) -> Result<Vec<u8>> {
    let (values, what) = values(tree, of).ok_or_else(|| {
        Error::new(
            libc::EIO,
            format!("{}: the values are no longer at hand", tree.path(ino)),
        )
    })?;
    let mut moments = Moments::default();
    let grid = match &values {
        Values::View(v) => v.layout.grid(),
        Values::Plain { .. } | Values::Named(_) => None,
    };
    let mut tally = grid.map(|g| QuantTally::new(g.levels, g.scales));
    walk(
        tree,
        &values,
        &mut |w| moments.observe(w),
        &mut |i, s, v| {
            if let Some(t) = tally.as_mut() {
                t.run(i, s, v)
            }
        },
    )?;
    let mut bins = Bins::new(&moments);
    walk(tree, &values, &mut |w| bins.add(w), &mut |_, _, _| {})?;
    let path = tree.path(ino);
    let title = path.strip_suffix(".hist.svg").unwrap_or(&path);
    let quant = match (&tally, grid) {
        (Some(t), Some(g)) => Some(QuantInfo {
            tally: t,
            unit: g.unit,
            zero_point: g.zero_point,
        }),
        _ => None,
    };
    Ok(hist::svg(&Histogram {
        title,
        what: &what,
        moments: &moments,
        bins: &bins,
        quant,
    })
    .into_bytes())
}
