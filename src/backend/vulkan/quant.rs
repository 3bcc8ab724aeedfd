//! Dequantizing Vulkan constants to float32: the values the exporter's own reference
//! arithmetic computes with, for any window of elements.
//!
//! Rules, each with how it was established (scripts/vulkan-rules checks all of them on the
//! `vk_*` fixtures; docs/formats/vulkan.md has the details):
//!
//! - `FLOAT32`: the float itself. `FLOAT16` (what `force_fp16` makes of float32 constants):
//!   IEEE binary16 widened exactly. Evidence: `VkGraphBuilder.maybe_add_constant_tensor` of
//!   the 1.5.1 wheel stores `tensor.to(effective_dtype).contiguous()`'s bytes unchanged, and
//!   the fixtures' constants equal the checkpoints' tensors (rounded to half) bit for bit.
//! - 4-bit weights of `et_vk.linear_q4gsw` (argument 1; also `et_vk.linear_dq8ca_q4gsw`,
//!   argument 3). The stored tensor is UINT8 `[N, K8 / 2]`, K8 being the input size K padded
//!   with zeros to a multiple of 8; the op's scales argument (2; 5) is a FLOAT32 or FLOAT16
//!   constant `[K / group_size, N']` with N' >= N (N padded to a multiple of 4), and its
//!   group-size argument (3; 6) an `Int`. Element `[n][k]` (k < K = groups × group_size):
//!   `(nibble - 8) × scales[k / group_size][n]`, the nibble of element k being the low half
//!   of byte `[n][k / 2]` when k is even and the high half when it is odd. Evidence:
//!   `pack_4bit_weight_tensor` in the wheel's `backends/vulkan/patterns/weight_packing_utils.py`
//!   (`(odd + 8) << 4 | (even + 8)` after padding the inner dimension to 8),
//!   `make_linear_q4gsw_op` in `patterns/quantized_linear.py` (scales transposed to
//!   `[groups, N]`, zero points dropped: weight-only 4-bit is symmetric), and the op's
//!   reference implementation in `custom_ops_lib.py` (`unpack_4bit_weight_tensor`, then
//!   `dequantize_affine` with zero points 0 over [-8, 7]); the runtime's shaders do the same
//!   (`linear_fp_output_tile_fp_int4_compute.glslh`: `((block >> 4 × col) & 0xF) - 8`, then
//!   multiplied by the scale). On `vk_q4gsw_linear` and `vk_q4gsw_pad` the rule equals
//!   torchao's dequantization of the quantized checkpoint exactly and is within half a scale
//!   step of the float checkpoint; the other nibble order, no offset, or scales read as
//!   `[N, groups]` all disagree.
//!
//! Products are single-precision (`f32` nibble × `f32` scale, a half scale widened first),
//! as in the reference.

use super::datatype::{element_count, Datatype};
use super::graph::{ValueKind, VkGraph, VkTensor, VkValue};
use crate::backend::view;

pub use crate::backend::view::QuantError;

/// Operators that read a 4-bit packed weight: (name, weight, scales, group size argument).
pub const Q4GSW_OPS: [(&str, usize, usize, usize); 2] = [
    ("et_vk.linear_q4gsw.default", 1, 2, 3),
    ("et_vk.linear_dq8ca_q4gsw.default", 3, 5, 6),
];

/// How a constant's bytes map to float32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    Float32,
    Float16,
    /// A 4-bit weight of an `et_vk.*q4gsw` operator (module doc).
    Q4gsw {
        /// The value id of the scales tensor.
        scales: u32,
        /// FLOAT32 or FLOAT16.
        scale_datatype: Datatype,
        group_size: u64,
        /// N: the weight's rows, the outputs.
        rows: u64,
        /// K = groups × group_size: the inputs, without the packing's padding.
        cols: u64,
        /// Bytes per stored row (the weight's second dimension).
        row_bytes: u64,
        /// N': the scales' second dimension.
        scale_cols: u64,
        groups: u64,
    },
}

impl Packing {
    /// `"float32"`, `"float16"` or `"q4gsw"`.
    pub fn name(&self) -> &'static str {
        match self {
            Packing::Float32 => "float32",
            Packing::Float16 => "float16",
            Packing::Q4gsw { .. } => "q4gsw",
        }
    }
}

/// Everything needed to dequantize one constant: its packing, the shape of the float32
/// view, and the byte counts the data and scales must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantLayout {
    pub packing: Packing,
    shape: Vec<u64>,
    numel: u64,
    data_nbytes: u64,
    scale_nbytes: u64,
}

fn tensor_of(graph: &VkGraph, id: u32) -> Option<&VkTensor> {
    graph.value(id).and_then(VkValue::tensor)
}

/// The layout of `weight` as the 4-bit weight of `graph.chain[op]`, or why not.
fn q4gsw_layout(
    graph: &VkGraph, weight: &VkValue, w: &VkTensor, args: &[u32],
    (name, wi, si, gi): (&str, usize, usize, usize),
) -> Result<QuantLayout, QuantError> {
    let refuse = |why: String| {
        Err(QuantError::new(format!(
            "%{} read by {name}: {why}",
            weight.id
        )))
    };
    if args.get(wi) != Some(&weight.id) {
        return refuse(format!("not its argument {wi}"));
    }
    let (Some(&s_id), Some(&g_id)) = (args.get(si), args.get(gi)) else {
        return refuse(format!(
            "the call has {} arguments, expected more than {gi}",
            args.len()
        ));
    };
    if w.datatype != Datatype::UINT8 || w.dims.len() != 2 {
        return refuse(format!(
            "a packed weight is uint8[N,K/2], found {}",
            w.describe()
        ));
    }
    let Some(s) = tensor_of(graph, s_id).filter(|s| s.constant.is_some()) else {
        return refuse(format!("its scales %{s_id} are not a constant tensor"));
    };
    if !matches!(s.datatype, Datatype::FLOAT32 | Datatype::FLOAT16) || s.dims.len() != 2 {
        return refuse(format!(
            "scales %{s_id} are float32 or float16 [groups,N], found {}",
            s.describe()
        ));
    }
    let group_size = match graph.value(g_id).map(|v| &v.kind) {
        Some(ValueKind::Int(g)) if *g > 0 => *g as u64,
        _ => return refuse(format!("its group size %{g_id} is not a positive Int")),
    };
    let (rows, row_bytes) = (u64::from(w.dims[0]), u64::from(w.dims[1]));
    let (groups, scale_cols) = (u64::from(s.dims[0]), u64::from(s.dims[1]));
    let cols = groups
        .checked_mul(group_size)
        .filter(|&k| k > 0 && k <= 2 * row_bytes)
        .ok_or_else(|| {
            QuantError::new(format!(
                "%{} read by {name}: {groups} groups of {group_size} inputs do not fit rows of {row_bytes} bytes (two inputs a byte)",
                weight.id
            ))
        })?;
    if rows > scale_cols {
        return refuse(format!(
            "scales %{s_id} cover {scale_cols} outputs, the weight has {rows}"
        ));
    }
    let overflow = || {
        QuantError::new(format!(
            "%{} read by {name}: sizes overflow 64 bits",
            weight.id
        ))
    };
    let numel = rows.checked_mul(cols).ok_or_else(overflow)?;
    let elem = s.datatype.element_size().unwrap_or(4);
    let scale_nbytes = groups
        .checked_mul(scale_cols)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(overflow)?;
    let layout = QuantLayout {
        packing: Packing::Q4gsw {
            scales: s_id,
            scale_datatype: s.datatype,
            group_size,
            rows,
            cols,
            row_bytes,
            scale_cols,
            groups,
        },
        shape: vec![rows, cols],
        numel,
        // Two u32 values: the product fits.
        data_nbytes: rows * row_bytes,
        scale_nbytes,
    };
    Ok(layout)
}

impl QuantLayout {
    /// The layout of `value` (a tensor of `graph`), or why it has none: FLOAT32 and FLOAT16
    /// tensors as they are, and a UINT8 tensor that the first `et_vk.*q4gsw` call reading
    /// it as its weight, with consistent scales and group size, makes a 4-bit weight.
    pub fn for_value(graph: &VkGraph, value: &VkValue) -> Result<QuantLayout, QuantError> {
        let Some(t) = value.tensor() else {
            return Err(QuantError::new(format!(
                "%{} is a {}, not a tensor",
                value.id,
                value.type_name()
            )));
        };
        let float = |packing: Packing, size: u64| -> Result<QuantLayout, QuantError> {
            let numel = element_count(&t.dims).ok_or_else(|| {
                QuantError::new(format!(
                    "%{} {}: element count overflows 64 bits",
                    value.id,
                    t.describe()
                ))
            })?;
            Ok(QuantLayout {
                packing,
                shape: t.dims.iter().map(|&d| u64::from(d)).collect(),
                numel,
                data_nbytes: numel.checked_mul(size).ok_or_else(|| {
                    QuantError::new(format!(
                        "%{} {}: byte size overflows 64 bits",
                        value.id,
                        t.describe()
                    ))
                })?,
                scale_nbytes: 0,
            })
        };
        match t.datatype {
            Datatype::FLOAT32 => return float(Packing::Float32, 4),
            Datatype::FLOAT16 => return float(Packing::Float16, 2),
            _ => {}
        }
        let mut first_error = None;
        for use_ in &value.used_by {
            let Some(call) = graph.chain.get(use_.op) else {
                continue;
            };
            let Some(&op) = Q4GSW_OPS.iter().find(|o| o.0 == call.name) else {
                continue;
            };
            if use_.arg != op.1 {
                continue;
            }
            match q4gsw_layout(graph, value, t, call.args(), op) {
                Ok(layout) => return Ok(layout),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or_else(|| {
            QuantError::new(format!(
                "%{} {}: no established packing (float16, or a weight of {})",
                value.id,
                t.describe(),
                Q4GSW_OPS.map(|o| o.0).join(" or ")
            ))
        }))
    }

    /// The layout of a constant that gets a dequantized float32 view (`values/<id>.f32.npy`):
    /// FLOAT16 constants and 4-bit weights whose bytes (and scales' bytes) have the size
    /// the graph records for them.
    pub fn for_f32_view(graph: &VkGraph, value: &VkValue) -> Option<QuantLayout> {
        QuantLayout::for_values(graph, value).filter(|l| l.packing != Packing::Float32)
    }

    /// The layout of the values a constant stands for (docs/tree.md#histograms): its float32
    /// view, or a FLOAT32 constant as it is, when the sizes match.
    pub fn for_values(graph: &VkGraph, value: &VkValue) -> Option<QuantLayout> {
        let size = value.constant()?.size();
        let layout = QuantLayout::for_value(graph, value).ok()?;
        let sizes_match = match layout.packing {
            Packing::Float32 | Packing::Float16 => size == layout.data_nbytes,
            Packing::Q4gsw { scales, .. } => {
                size == layout.data_nbytes
                    && graph
                        .value(scales)
                        .and_then(VkValue::constant)
                        .is_some_and(|c| c.size() == layout.scale_nbytes)
            }
        };
        sizes_match.then_some(layout)
    }

    /// Shape of the float32 view: the tensor's dims, or `[N, K]` for a 4-bit weight.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Elements of the float32 view.
    pub fn numel(&self) -> u64 {
        self.numel
    }

    /// Bytes of the stored data.
    pub fn data_nbytes(&self) -> u64 {
        self.data_nbytes
    }

    /// Bytes of the scales tensor this layout reads (0 without one).
    pub fn scale_nbytes(&self) -> u64 {
        self.scale_nbytes
    }

    /// The value id of the scales tensor, for 4-bit weights.
    pub fn scales(&self) -> Option<u32> {
        match self.packing {
            Packing::Q4gsw { scales, .. } => Some(scales),
            _ => None,
        }
    }

    fn check_len(&self, what: &str, found: usize, expected: u64) -> Result<(), QuantError> {
        if found as u64 >= expected {
            return Ok(());
        }
        Err(QuantError::new(format!(
            "{} layout: {what} has {found} bytes, expected at least {expected}",
            self.packing.name()
        )))
    }

    /// Dequantizes elements `first .. first + out.len()` (row-major over [`shape`]) into
    /// `out`, so a window of a `.f32.npy` costs only its own elements. `data` holds the
    /// stored bytes, `scales` the scales tensor's bytes (empty for float types).
    ///
    /// [`shape`]: QuantLayout::shape
    pub fn dequantize(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        self.check_len("data", data.len(), self.data_nbytes)?;
        self.check_len("scales", scales.len(), self.scale_nbytes)?;
        let end = first
            .checked_add(out.len() as u64)
            .filter(|&end| end <= self.numel)
            .ok_or_else(|| {
                QuantError::new(format!(
                    "{} layout: elements {first}..{} requested, the tensor has {}",
                    self.packing.name(),
                    first.saturating_add(out.len() as u64),
                    self.numel
                ))
            })?;
        // Every index below is < numel, whose bytes the checks above found in data/scales.
        let (first, end) = (first as usize, end as usize);
        match self.packing {
            Packing::Float32 => {
                for (o, b) in out.iter_mut().zip(data[4 * first..4 * end].chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Packing::Float16 => {
                for (o, b) in out.iter_mut().zip(data[2 * first..2 * end].chunks_exact(2)) {
                    *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Packing::Q4gsw {
                scale_datatype,
                group_size,
                cols,
                row_bytes,
                scale_cols,
                ..
            } => {
                let scale_at = |i: usize| match scale_datatype {
                    Datatype::FLOAT16 => {
                        f16_to_f32(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]))
                    }
                    _ => f32::from_le_bytes([
                        scales[4 * i],
                        scales[4 * i + 1],
                        scales[4 * i + 2],
                        scales[4 * i + 3],
                    ]),
                };
                let (cols, row_bytes) = (cols as usize, row_bytes as usize);
                let (group_size, scale_cols) = (group_size as usize, scale_cols as usize);
                for (o, e) in out.iter_mut().zip(first..end) {
                    let (n, k) = (e / cols, e % cols);
                    let byte = data[n * row_bytes + k / 2];
                    let nibble = if k % 2 == 0 { byte & 0xf } else { byte >> 4 };
                    let scale = scale_at((k / group_size) * scale_cols + n);
                    *o = (f32::from(nibble) - 8.0) * scale;
                }
            }
        }
        Ok(())
    }
}

impl QuantLayout {
    /// The quantization step of elements `first .. first + out.len()`: the absolute scale
    /// of a 4-bit element, the spacing of its format around a float element.
    pub fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        // Checks the request as a read does, and gives float elements their values.
        self.dequantize(data, scales, first, out)?;
        match self.packing {
            Packing::Float32 => out
                .iter_mut()
                .for_each(|o| *o = view::float_spacing(*o, view::FLOAT32)),
            Packing::Float16 => out
                .iter_mut()
                .for_each(|o| *o = view::float_spacing(*o, view::FLOAT16)),
            Packing::Q4gsw {
                scale_datatype,
                group_size,
                cols,
                scale_cols,
                ..
            } => {
                let (cols, group_size) = (cols as usize, group_size as usize);
                for (o, e) in out.iter_mut().zip(first as usize..) {
                    let (n, k) = (e / cols, e % cols);
                    let i = (k / group_size) * scale_cols as usize + n;
                    let scale = match scale_datatype {
                        Datatype::FLOAT16 => {
                            f16_to_f32(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]))
                        }
                        _ => f32::from_le_bytes([
                            scales[4 * i],
                            scales[4 * i + 1],
                            scales[4 * i + 2],
                            scales[4 * i + 3],
                        ]),
                    };
                    *o = scale.abs();
                }
            }
        }
        Ok(())
    }
}

/// IEEE binary16 to binary32, exact (subnormals, infinities and NaN included).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal: man × 2^-24 (0x3380_0000), exact in binary32.
        (0, _) => {
            let magnitude = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -magnitude } else { magnitude };
        }
        (31, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_widens_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        // Every finite half against its value computed from the fields.
        for h in 0..=u16::MAX {
            let (s, e, m) = (h >> 15, (h >> 10) & 0x1f, h & 0x3ff);
            if e == 31 {
                continue;
            }
            let mag = if e == 0 {
                f64::from(m) * 2f64.powi(-24)
            } else {
                (1.0 + f64::from(m) / 1024.0) * 2f64.powi(i32::from(e) - 15)
            };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(f64::from(f16_to_f32(h)), want, "{h:#06x}");
        }
    }
}
