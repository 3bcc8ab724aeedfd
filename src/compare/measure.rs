//! How much two paired tensors differ: their stored bytes compared directly, and, when the
//! bytes differ, their values dequantized to float32 and compared (docs/commands.md#diff).
//!
//! Invariants: bytes are read in windows of at most [`BYTES_WINDOW`] per side and given back
//! after use (`Side::release`), values are dequantized in windows of [`VALUES_WINDOW`]
//! elements, so memory stays bounded whatever the tensors' sizes; values are dequantized
//! only for pairs whose bytes differ or cannot be compared byte for byte; sums are kept in
//! f64; elements where either side is not finite are counted apart, never summed.

use std::borrow::Cow;

use crate::backend::FloatView;
use crate::catalog::tensors::Tensor;
use crate::error::{Error, Result};
use crate::format::layout::Location;

use super::names::Named;
use super::side::Side;
use crate::names::view::gather;
use crate::names::IndexMap;

/// Bytes compared at a time, per side.
pub const BYTES_WINDOW: u64 = 4 << 20;
/// Elements dequantized at a time, per side.
pub const VALUES_WINDOW: usize = 1 << 16;

/// What differs between two tensors' descriptions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub dtype: bool,
    pub shape: bool,
    pub scheme: bool,
    pub dim_order: bool,
}

impl Changes {
    pub fn of(a: &Tensor, b: &Tensor) -> Changes {
        Changes {
            dtype: a.dtype != b.dtype,
            shape: a.shape != b.shape,
            scheme: a.scheme != b.scheme,
            dim_order: a.dim_order != b.dim_order,
        }
    }

    pub fn any(&self) -> bool {
        self.dtype || self.shape || self.scheme || self.dim_order
    }

    /// The names of what changed, as the JSON report lists them.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.dtype, "dtype"),
            (self.shape, "shape"),
            (self.scheme, "scheme"),
            (self.dim_order, "dim_order"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// Differences of values, computed on float32 values in f64.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Elements compared (both finite).
    pub elements: u64,
    /// Elements where either value is not finite (NaN or infinite), left out of the sums.
    pub nonfinite: u64,
    pub max_abs: f64,
    pub mean_abs: f64,
    /// Cosine similarity of the two value vectors; None when one of them is all zeros.
    pub cosine: Option<f64>,
    /// Normalized mean squared error, Σ(a − b)² / Σb² (B is the reference); None when B is
    /// all zeros.
    pub nmse: Option<f64>,
}

/// What comparing a pair found.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub changes: Changes,
    /// Stored bytes (data and scales) that differ, when both sides store the same number of
    /// bytes the same way; None otherwise.
    pub bytes_differ: Option<u64>,
    /// Bytes compared byte for byte (per side).
    pub bytes_compared: u64,
    pub metrics: Option<Metrics>,
    /// Why the values were not compared, when they differ and were not.
    pub note: Option<String>,
}

impl Measured {
    /// Same description and same bytes.
    pub fn identical(&self) -> bool {
        !self.changes.any() && self.bytes_differ == Some(0)
    }
}

/// Compares tensor `a` of side `sa` with tensor `b` of side `sb`.
pub fn measure(sa: &Side, a: &Tensor, sb: &Side, b: &Tensor) -> Result<Measured> {
    measure_named(sa, a, None, sb, b, None)
}

/// `measure`, for tensors a name map names (`na`, `nb`): their values are compared in the
/// checkpoint's order, each side's transform undone (docs/commands.md#names-in-a-diff).
pub fn measure_named(
    sa: &Side, a: &Tensor, na: Option<&Named>, sb: &Side, b: &Tensor, nb: Option<&Named>,
) -> Result<Measured> {
    if na.is_some() || nb.is_some() {
        return measure_by_name(sa, a, na, sb, b, nb);
    }
    let changes = Changes::of(a, b);
    let same_storage = !changes.dtype
        && !changes.scheme
        && a.data.range.len() == b.data.range.len()
        && a.scales.map(|s| s.range.len()) == b.scales.map(|s| s.range.len());
    let mut out = Measured {
        changes,
        bytes_differ: None,
        bytes_compared: 0,
        metrics: None,
        note: None,
    };
    if same_storage {
        let mut differ = count_differing(sa, &a.data, sb, &b.data)?;
        if let (Some(x), Some(y)) = (&a.scales, &b.scales) {
            differ += count_differing(sa, x, sb, y)?;
        }
        out.bytes_differ = Some(differ);
        out.bytes_compared = a.nbytes();
        if differ == 0 && !changes.shape && !changes.dim_order {
            return Ok(out);
        }
        if differ == 0 {
            out.note = Some("same bytes, described differently".to_string());
            return Ok(out);
        }
    }
    match (&a.view, &b.view) {
        (Some(_), Some(_)) if changes.dim_order => {
            out.note = Some("the dimensions are in another order in memory".to_string());
        }
        (Some(va), Some(vb)) if va.layout.shape() == vb.layout.shape() => {
            out.metrics = Some(values(sa, va, sb, vb)?);
        }
        (Some(_), Some(_)) => {
            out.note = Some("shapes differ: values not compared".to_string());
        }
        (None, _) => out.note = Some(no_view(a)),
        (_, None) => out.note = Some(no_view(b)),
    }
    Ok(out)
}

/// Two tensors paired by checkpoint name: bytes compared when both store them alike and
/// in the same order, values compared in the checkpoint's order.
fn measure_by_name(
    sa: &Side, a: &Tensor, na: Option<&Named>, sb: &Side, b: &Tensor, nb: Option<&Named>,
) -> Result<Measured> {
    let changes = Changes::of(a, b);
    let mut out = Measured {
        changes,
        bytes_differ: None,
        bytes_compared: 0,
        metrics: None,
        note: None,
    };
    // Bytes compare element for element when both sides keep the elements in one order.
    let same_order = match (na, nb) {
        (Some(x), Some(y)) => x.transform == y.transform && x.shape == y.shape,
        (Some(n), None) | (None, Some(n)) => n.map.is_identity(),
        (None, None) => true,
    };
    if !changes.any()
        && same_order
        && a.data.range.len() == b.data.range.len()
        && a.scales.map(|s| s.range.len()) == b.scales.map(|s| s.range.len())
    {
        let mut differ = count_differing(sa, &a.data, sb, &b.data)?;
        if let (Some(x), Some(y)) = (&a.scales, &b.scales) {
            differ += count_differing(sa, x, sb, y)?;
        }
        out.bytes_differ = Some(differ);
        out.bytes_compared = a.nbytes();
        if differ == 0 {
            return Ok(out);
        }
    }
    // The checkpoint's shape of each side: a name's, or the tensor's own.
    let shape_a = na.map_or(&a.shape, |n| &n.shape);
    let shape_b = nb.map_or(&b.shape, |n| &n.shape);
    match (&a.view, &b.view) {
        (Some(va), Some(vb)) if shape_a == shape_b => {
            let numel: u64 = shape_a.iter().product();
            if va.layout.numel() != numel || vb.layout.numel() != numel {
                out.note = Some("the named tensor's elements do not fit its view".to_string());
            } else {
                out.metrics = Some(values_mapped(
                    sa,
                    va,
                    na.map(|n| &n.map),
                    sb,
                    vb,
                    nb.map(|n| &n.map),
                )?);
            }
        }
        (Some(_), Some(_)) => {
            out.note = Some("the checkpoint shapes differ: values not compared".to_string());
        }
        (None, _) => out.note = Some(no_view(a)),
        (_, None) => out.note = Some(no_view(b)),
    }
    Ok(out)
}

fn no_view(t: &Tensor) -> String {
    format!("{} has no float view: values not compared", t.dtype)
}

/// Bytes that differ between two ranges of equal length, read in windows.
pub(super) fn count_differing(sa: &Side, a: &Location, sb: &Side, b: &Location) -> Result<u64> {
    let len = a.range.len();
    let mut differ = 0u64;
    let mut at = 0u64;
    while at < len {
        let n = BYTES_WINDOW.min(len - at);
        let wa = Location {
            file: a.file,
            range: a.range.slice_from(at, n),
        };
        let wb = Location {
            file: b.file,
            range: b.range.slice_from(at, n),
        };
        {
            let x = sa.read(&wa)?;
            let y = sb.read(&wb)?;
            if x != y {
                differ += x.iter().zip(y.iter()).filter(|(p, q)| p != q).count() as u64;
            }
        }
        sa.release(&wa);
        sb.release(&wb);
        at += n;
    }
    Ok(differ)
}

/// A view's data and scales, read.
type ViewBytes<'s> = (Cow<'s, [u8]>, Cow<'s, [u8]>);

/// The bytes a view reads, checked against what its layout needs.
fn view_bytes<'s>(side: &'s Side, view: &FloatView) -> Result<ViewBytes<'s>> {
    let layout = &*view.layout;
    if view.data.range.len() < layout.data_nbytes()
        || view.scales.map_or(0, |l| l.range.len()) < layout.scale_nbytes()
    {
        return Err(Error::invalid(format!(
            "{}: the bytes of a {}-element tensor do not fit its datatype and dims (ptefs check says more)",
            side.path.display(),
            layout.numel()
        )));
    }
    let data = side.read(&view.data)?;
    let scales = match &view.scales {
        Some(l) => side.read(l)?,
        None => Cow::Borrowed(&[][..]),
    };
    Ok((data, scales))
}

/// Compares the values of two views of the same shape, window by window.
fn values(sa: &Side, va: &FloatView, sb: &Side, vb: &FloatView) -> Result<Metrics> {
    values_mapped(sa, va, None, sb, vb, None)
}

/// Compares the values of two views of as many elements, window by window, each read in
/// the order its index map gives (memory order without one).
fn values_mapped(
    sa: &Side, va: &FloatView, ma: Option<&IndexMap>, sb: &Side, vb: &FloatView,
    mb: Option<&IndexMap>,
) -> Result<Metrics> {
    let numel = va.layout.numel();
    let moved = ma.is_some_and(|m| !m.is_identity()) || mb.is_some_and(|m| !m.is_identity());
    let (mut sum_abs, mut sum_sq, mut dot, mut aa, mut bb) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let (mut max_abs, mut elements, mut nonfinite) = (0f64, 0u64, 0u64);
    let mut wa = vec![0f32; VALUES_WINDOW];
    let mut wb = vec![0f32; VALUES_WINDOW];
    let mut first = 0u64;
    let mut released = [0u64; 2];
    {
        let (da, sa_scales) = view_bytes(sa, va)?;
        let (db, sb_scales) = view_bytes(sb, vb)?;
        while first < numel {
            let n = (VALUES_WINDOW as u64).min(numel - first) as usize;
            let quant = |e: crate::backend::view::QuantError| Error::invalid(e.message());
            let read = |v: &FloatView,
                        data: &[u8],
                        scales: &[u8],
                        map: Option<&IndexMap>,
                        out: &mut [f32]|
             -> Result<()> {
                let one = |at: u64, o: &mut [f32]| {
                    v.layout.dequantize(data, scales, at, o).map_err(quant)
                };
                match map {
                    Some(m) => gather(m, first, out, one),
                    None => one(first, out),
                }
            };
            read(va, &da, &sa_scales, ma, &mut wa[..n])?;
            read(vb, &db, &sb_scales, mb, &mut wb[..n])?;
            for (&x, &y) in wa[..n].iter().zip(&wb[..n]) {
                if !(x.is_finite() && y.is_finite()) {
                    nonfinite += 1;
                    continue;
                }
                let (x, y) = (f64::from(x), f64::from(y));
                let d = x - y;
                let ad = d.abs();
                sum_abs += ad;
                sum_sq += d * d;
                dot += x * y;
                aa += x * x;
                bb += y * y;
                if ad > max_abs {
                    max_abs = ad;
                }
                elements += 1;
            }
            first += n as u64;
            // Give back the bytes this window used, in proportion: values are stored in
            // element order, so what lies before the next window's share is done.
            // Elements in another order are not read in proportion: kept until the end.
            if !moved {
                release_done(sa, &va.data, first, numel, &mut released[0]);
                release_done(sb, &vb.data, first, numel, &mut released[1]);
            }
        }
    }
    for (side, view) in [(sa, va), (sb, vb)] {
        for l in view.sources() {
            side.release(&l);
        }
    }
    Ok(Metrics {
        elements,
        nonfinite,
        max_abs,
        mean_abs: if elements > 0 {
            sum_abs / elements as f64
        } else {
            0.0
        },
        cosine: (aa > 0.0 && bb > 0.0).then(|| dot / (aa.sqrt() * bb.sqrt())),
        nmse: (bb > 0.0).then(|| sum_sq / bb),
    })
}

/// Releases the part of `data` past `released` that holds elements before `done` of
/// `numel`, keeping one window's worth of slack for layouts whose rows are not in
/// proportion, and moves `released` past it.
fn release_done(side: &Side, data: &Location, done: u64, numel: u64, released: &mut u64) {
    let len = data.range.len();
    let upto = (u128::from(len) * u128::from(done) / u128::from(numel.max(1))) as u64;
    let upto = upto.saturating_sub(BYTES_WINDOW);
    if upto > *released {
        side.release(&Location {
            file: data.file,
            range: data.range.slice_from(*released, upto - *released),
        });
        *released = upto;
    }
}
