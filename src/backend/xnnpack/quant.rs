//! Dequantizing XNNPACK constants to float32, and re-quantizing float32 back.
//!
//! The value of element `e` is what the runtime computes with. Rules by datatype (sources:
//! `XNNCompiler.cpp` of ExecuTorch for zero points and scale types, `node_visitor.py` of the
//! 1.5.1 wheel for how the exporter packs 4-bit weights, XNNPACK `src/packing.c` and
//! `src/tensor.c` for nibble order and the checks on scales and zero points):
//!
//! - `fp32`: the float itself. `fp16`: IEEE half widened. `bf16`: the upper half of a float32.
//! - `qint8` / `quint8` (`PerTensorQuant`): `(q - zero_point) × scale`.
//! - `qint32` (`PerTensorQuant`, bias): `(q - zero_point) × scale`; XNNPACK requires
//!   `zero_point == 0`.
//! - `qcint8`, `qcint32` (`PerChannelQuant`): `q × scale[c]`, `c` the index along
//!   `channel_dim`, fp32 scales (inline `scale`, or `scale_buffer_idx`'s blob read as fp32);
//!   zero point 0.
//! - `qcint4` (`PerChannelQuant`): `(nibble - 8) × scale[c]`, fp32 scales as for `qcint8`;
//!   zero point 8 (`XNNCompiler.cpp`). Each row (last dimension) is packed on its own, two
//!   elements per byte, the even element in the low nibble; an odd row ends with a padding
//!   nibble of 8 (`node_visitor.py`, `convert_to_qc4w`; XNNPACK's qc4w packers read the low
//!   nibble first).
//! - `qbint4` (`PerChannelGroupQuant`, dims `[out, in]`, `channel_dim` 0): `(nibble - 8) ×
//!   scale[o][i / group_size]` with the same packing, bfloat16 scales shaped `[out, in /
//!   group_size]` (docs/formats.md#dequantization-rules, checked against the checkpoint).
//!   Inline fp32 scales are first converted to bfloat16 the way the runtime does (×1.00389105,
//!   truncate).
//!
//! Re-quantizing is symmetric and rounds to nearest (ties to even), clamped to the type's
//! range. Fresh scales are `max|w| / qmax` per channel or per group (qmax 7 for 4-bit, 127
//! for 8-bit, 2³¹−1 for 32-bit), so no in-range value clips; per-tensor types keep their zero
//! point and take `max|w| / min(qmax − zp, zp − qmin)`. Each scale is rounded to its stored
//! dtype first and the weights are quantized with that stored value, so dequantizing the
//! result reproduces it. A channel or group whose stored scale need not change keeps it (its
//! values all zero, or their largest magnitude already its top step), so an int32 bias that
//! follows it keeps its bytes. XNNPACK refuses scales that are not positive normal floats,
//! so an all-zero channel or group without such a scale gets scale 1, and tiny ones at least
//! `f32::MIN_POSITIVE`.
//! Non-finite inputs are refused, and so are values that scales kept as stored cannot
//! represent (more than half a step beyond the range). Which writes get fresh scales is
//! `placed::ScalePlan`'s rule; an int32 bias that follows a filter's scales is rescaled by
//! [`QuantLayout::rescale_int32`].

use super::datatype::{element_count, Datatype};
use super::graph::{QuantParams, ScaleDtype, XnnValue};
use crate::backend::float16::{
    bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, runtime_f32_to_bf16,
};

use crate::backend::view;
pub use crate::backend::view::QuantError;

/// How elements map to scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// fp32, fp16, bf16.
    Float,
    /// One scale (the `PerTensorQuant.scale` field) and a zero point.
    PerTensor { zero_point: i32 },
    /// Element `e` uses scale `(e / inner) % channels`.
    PerChannel { channels: u64, inner: u64 },
    /// Element `(o, i)` of `[rows, cols]` uses scale `o × cols / group + i / group`.
    Blockwise { cols: u64, group: u64 },
}

/// Everything needed to (de)quantize one constant: datatype, shape, scheme and scale storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantLayout {
    pub datatype: Datatype,
    pub dims: Vec<u32>,
    scheme: Scheme,
    scale_dtype: ScaleDtype,
    scale_count: u64,
    numel: u64,
    data_nbytes: u64,
    /// Elements per 4-bit row (the last dimension); `u64::MAX` for other types.
    row_len: u64,
}

/// Lowest and highest stored integer of a quantized type.
fn int_range(dt: Datatype) -> (i64, i64) {
    match dt {
        Datatype::QUINT8 => (0, 255),
        Datatype::QINT8 | Datatype::QCINT8 => (-128, 127),
        Datatype::QCINT4 | Datatype::QBINT4 => (-8, 7),
        _ => (i64::from(i32::MIN), i64::from(i32::MAX)),
    }
}

/// Largest magnitude a fresh symmetric scale maps to.
fn symmetric_qmax(dt: Datatype) -> f32 {
    match dt {
        Datatype::QCINT4 | Datatype::QBINT4 => 7.0,
        Datatype::QINT8 | Datatype::QCINT8 | Datatype::QUINT8 => 127.0,
        _ => i32::MAX as f32,
    }
}

impl QuantLayout {
    /// The layout of `value`, or why the runtime would not accept (or could not dequantize)
    /// its datatype, quantization parameters and dims together.
    pub fn for_value(value: &XnnValue) -> Result<QuantLayout, QuantError> {
        let dt = value.datatype;
        let desc = value.describe();
        let numel = element_count(&value.dims)
            .ok_or_else(|| QuantError::new(format!("{desc}: element count overflows 64 bits")))?;
        let data_nbytes = dt
            .nbytes(&value.dims)
            .map_err(|e| QuantError::new(e.message()))?;
        // Runs never cross a 4-bit row; other types have no rows.
        let row_len = if dt.is_4bit() {
            value.dims.last().map_or(1, |&d| u64::from(d))
        } else {
            u64::MAX
        };
        let refuse = |why: String| Err(QuantError::new(format!("{desc}: {why}")));
        let mut layout = QuantLayout {
            datatype: dt,
            dims: value.dims.clone(),
            scheme: Scheme::Float,
            scale_dtype: ScaleDtype::F32,
            scale_count: 0,
            numel,
            data_nbytes,
            row_len,
        };
        let channel_dim = |cd: i32| -> Result<usize, QuantError> {
            usize::try_from(cd)
                .ok()
                .filter(|&c| c < value.dims.len())
                .ok_or_else(|| {
                    QuantError::new(format!(
                        "{desc}: channel_dim {cd} is not a dimension (expected 0..{})",
                        value.dims.len()
                    ))
                })
        };
        match (dt, &value.quant) {
            (Datatype::FP32 | Datatype::FP16 | Datatype::BF16, None) => {}
            (
                Datatype::QINT8 | Datatype::QUINT8 | Datatype::QINT32,
                Some(QuantParams::PerTensor {
                    scale, zero_point, ..
                }),
            ) => {
                let (lo, hi) = match dt {
                    Datatype::QINT32 => (0, 0),
                    _ => int_range(dt),
                };
                if !(lo..=hi).contains(&i64::from(*zero_point)) {
                    return refuse(format!(
                        "zero point {zero_point} outside {lo}..={hi}, which XNNPACK requires"
                    ));
                }
                if !(scale.is_normal() && *scale > 0.0) {
                    return refuse(format!(
                        "per-tensor scale {scale} is not a positive normal float (XNNPACK refuses it)"
                    ));
                }
                layout.scheme = Scheme::PerTensor {
                    zero_point: *zero_point,
                };
                layout.scale_count = 1;
            }
            (
                Datatype::QCINT8 | Datatype::QCINT32 | Datatype::QCINT4,
                Some(QuantParams::PerChannel {
                    channel_dim: cd,
                    scales,
                    ..
                }),
            ) => {
                let cd = channel_dim(*cd)?;
                if numel == 0 {
                    // Nothing to dequantize, and a zero dimension beside a huge channel
                    // count would have callers allocate scales for no element.
                    return refuse("no elements to match scales to".into());
                }
                let channels = u64::from(value.dims[cd]);
                let inner = element_count(&value.dims[cd + 1..]).unwrap_or(u64::MAX);
                let Some(scales) = scales else {
                    return refuse("no scales (neither inline nor a scale buffer)".into());
                };
                if scales.inline && scales.count < channels {
                    return refuse(format!(
                        "{} inline scales for {channels} channels",
                        scales.count
                    ));
                }
                layout.scheme = Scheme::PerChannel { channels, inner };
                layout.scale_dtype = scales.dtype;
                layout.scale_count = channels;
            }
            (
                Datatype::QBINT4,
                Some(QuantParams::PerChannelGroup {
                    channel_dim: cd,
                    group_size,
                    scales,
                    ..
                }),
            ) => {
                if value.dims.len() != 2 || *cd != 0 {
                    return refuse(format!(
                        "blockwise quantization needs dims [out, in] and channel_dim 0, found {} dims and channel_dim {cd}",
                        value.dims.len()
                    ));
                }
                let (rows, cols) = (u64::from(value.dims[0]), u64::from(value.dims[1]));
                if numel == 0 {
                    return refuse("no elements to match scales to".into());
                }
                let group = u64::try_from(*group_size).unwrap_or(0);
                if group == 0 || cols % group != 0 {
                    return refuse(format!(
                        "group_size {group_size} does not divide the {cols} input channels"
                    ));
                }
                let Some(scales) = scales else {
                    return refuse("no scales (neither inline nor a scale buffer)".into());
                };
                let expected = rows * (cols / group);
                if scales.count != expected {
                    return refuse(format!(
                        "{} scales declared, the runtime requires out × in / group_size = {expected}",
                        scales.count
                    ));
                }
                layout.scheme = Scheme::Blockwise { cols, group };
                layout.scale_dtype = scales.dtype;
                layout.scale_count = expected;
            }
            (Datatype::QDINT8 | Datatype::QPINT8, _)
            | (_, Some(QuantParams::PerTokenDynamic { .. })) => {
                return refuse(
                    "dynamically quantized at run time: there are no stored values".into(),
                )
            }
            (_, quant) => {
                let q = quant.as_ref().map_or("no quantization parameters", |q| {
                    q.type_name().unwrap_or("unknown quantization parameters")
                });
                return refuse(format!(
                    "datatype {} with {q} is not a combination the runtime dequantizes",
                    dt.display()
                ));
            }
        }
        Ok(layout)
    }

    /// The layout of a constant that gets a dequantized float32 view (`values/<id>.f32.npy`,
    /// docs/tree.md#xnnpack-delegates): quantized, fp16 and bf16 constants the runtime can
    /// dequantize.
    pub fn for_f32_view(value: &XnnValue) -> Option<QuantLayout> {
        if value.constant.is_none() || value.datatype == Datatype::FP32 {
            return None;
        }
        QuantLayout::for_value(value).ok()
    }

    /// Elements of the tensor (the `.f32.npy` holds this many float32).
    pub fn numel(&self) -> u64 {
        self.numel
    }

    /// Bytes of the stored data.
    pub fn data_nbytes(&self) -> u64 {
        self.data_nbytes
    }

    /// Bytes of the scales this layout reads and writes (0 for float types). For
    /// `PerTensorQuant` they are the 4 bytes of its `scale` field in the payload.
    pub fn scale_nbytes(&self) -> u64 {
        self.scale_count * self.scale_dtype.size()
    }

    pub fn scale_dtype(&self) -> Option<ScaleDtype> {
        (self.scale_count > 0).then_some(self.scale_dtype)
    }

    fn describe(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(u32::to_string).collect();
        format!("{}[{}]", self.datatype.display(), dims.join(","))
    }

    fn check_len(
        &self, what: &str, found: usize, expected: u64, exact: bool,
    ) -> Result<(), QuantError> {
        let ok = if exact {
            found as u64 == expected
        } else {
            found as u64 >= expected
        };
        if ok {
            return Ok(());
        }
        Err(QuantError::new(format!(
            "{}: {what} has {found} bytes, expected {}{expected}",
            self.describe(),
            if exact { "" } else { "at least " }
        )))
    }

    /// Refuses `found` values of something given one per scale, unless there are as many.
    fn check_per_scale(&self, what: &str, found: usize) -> Result<(), QuantError> {
        if found as u64 == self.scale_count {
            return Ok(());
        }
        Err(QuantError::new(format!(
            "{}: {found} {what} given, expected one per scale ({})",
            self.describe(),
            self.scale_count
        )))
    }

    /// The runs of elements `first..end` that share one scale and one 4-bit row.
    fn runs(&self, first: u64, end: u64) -> Runs {
        Runs::new(self, first, end)
    }

    /// Scale `index`, as the runtime reads it. `scales` was checked to be long enough.
    #[inline]
    fn scale_at(&self, scales: &[u8], index: usize) -> f32 {
        match self.scale_dtype {
            ScaleDtype::F32 => f32_le(scales, index),
            ScaleDtype::Bf16 => bf16_to_f32(u16::from_le_bytes([
                scales[2 * index],
                scales[2 * index + 1],
            ])),
            ScaleDtype::F32RoundedToBf16 => bf16_to_f32(runtime_f32_to_bf16(f32_le(scales, index))),
        }
    }

    /// Dequantizes elements `first .. first + out.len()` (row-major) into `out`, so a window
    /// of a `.f32.npy` costs only its own elements. `data` holds the stored bytes, `scales`
    /// the bytes of the scale blob, inline scale vector or per-tensor scale field (empty for
    /// float types).
    pub fn dequantize(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        self.check_len("data", data.len(), self.data_nbytes, false)?;
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        let last = first.checked_add(out.len() as u64);
        if last.is_none_or(|last| last > self.numel) {
            return Err(QuantError::new(format!(
                "{}: elements {first}..{} requested, the tensor has {}",
                self.describe(),
                first.saturating_add(out.len() as u64),
                self.numel
            )));
        }
        let end = first + out.len() as u64;
        for run in self.runs(first, end) {
            let scale = if self.scale_count > 0 {
                self.scale_at(scales, run.scale)
            } else {
                1.0
            };
            let pos = (run.start - first) as usize;
            self.dequantize_run(data, run.start, scale, &mut out[pos..pos + run.len]);
        }
        Ok(())
    }

    /// The quantization step of elements `first .. first + out.len()`: the absolute scale
    /// of each quantized element, the spacing of its format around a float element.
    pub fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        // Checks the request as a read does, and gives float elements their values.
        self.dequantize(data, scales, first, out)?;
        if self.scale_count > 0 {
            for run in self.runs(first, first + out.len() as u64) {
                let step = self.scale_at(scales, run.scale).abs();
                let pos = (run.start - first) as usize;
                out[pos..pos + run.len].fill(step);
            }
            return Ok(());
        }
        let format = match self.datatype {
            Datatype::FP16 => view::FLOAT16,
            Datatype::BF16 => view::BFLOAT16,
            _ => view::FLOAT32,
        };
        for o in out.iter_mut() {
            *o = view::float_spacing(*o, format);
        }
        Ok(())
    }

    /// Elements `e .. e + out.len()`, all with `scale` and within one 4-bit row.
    #[inline]
    fn dequantize_run(&self, data: &[u8], e: u64, scale: f32, out: &mut [f32]) {
        let e = e as usize;
        let n = out.len();
        match self.datatype {
            Datatype::FP32 => {
                for (o, b) in out.iter_mut().zip(data[4 * e..4 * (e + n)].chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Datatype::FP16 => {
                for (o, b) in out.iter_mut().zip(data[2 * e..2 * (e + n)].chunks_exact(2)) {
                    *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Datatype::BF16 => {
                for (o, b) in out.iter_mut().zip(data[2 * e..2 * (e + n)].chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Datatype::QINT8 | Datatype::QCINT8 => {
                let zero = self.zero_point() as f32;
                for (o, &q) in out.iter_mut().zip(&data[e..e + n]) {
                    *o = (f32::from(q as i8) - zero) * scale;
                }
            }
            Datatype::QUINT8 => {
                let zero = self.zero_point() as f32;
                for (o, &q) in out.iter_mut().zip(&data[e..e + n]) {
                    *o = (f32::from(q) - zero) * scale;
                }
            }
            Datatype::QINT32 | Datatype::QCINT32 => {
                let zero = i64::from(self.zero_point());
                for (o, b) in out.iter_mut().zip(data[4 * e..4 * (e + n)].chunks_exact(4)) {
                    let q = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    *o = (i64::from(q) - zero) as f32 * scale;
                }
            }
            _ => {
                // 4-bit: the run lies within one row.
                let row_len = self.row_len as usize;
                let row_bytes = row_len.div_ceil(2);
                let (row, col) = (e / row_len, e % row_len);
                let bytes = &data[row * row_bytes..(row + 1) * row_bytes];
                dequantize_nibbles(bytes, col, scale, out);
            }
        }
    }

    fn zero_point(&self) -> i32 {
        match self.scheme {
            Scheme::PerTensor { zero_point } => zero_point,
            _ => 0,
        }
    }

    /// Re-quantizes `input` (every element, row-major) with fresh scales computed from it:
    /// writes the stored bytes to `data_out` (exactly `data_nbytes()`) and the scales, in
    /// their stored dtype, to `scales_out` (exactly `scale_nbytes()`). A scale `scales_out`
    /// holds on entry is kept where it need not change (zeros never are).
    ///
    /// Biases (`qint32`, `qcint32`) live in XNNPACK's accumulator domain, whose scale is the
    /// input's scale times the filter's: give them [`Self::requantize_with_scales`] unless
    /// those scales change together.
    pub fn requantize(
        &self, input: &[f32], data_out: &mut [u8], scales_out: &mut [u8],
    ) -> Result<(), QuantError> {
        self.check_requantize(input, data_out)?;
        self.check_len("scales_out", scales_out.len(), self.scale_nbytes(), true)?;
        if self.scales_contiguous() {
            return self.requantize_in_one_pass(input, data_out, scales_out);
        }
        let mut largest = vec![0u32; self.scale_count as usize];
        self.largest_in_window(0, input, &mut largest)?;
        self.store_fresh_scales(&largest, scales_out)?;
        self.fill_padding(data_out);
        self.encode_window(0, input, data_out, scales_out)
    }

    /// Re-quantizes `input` with the scales already stored (`scales`, as for
    /// [`Self::dequantize`]). A value those scales cannot represent (beyond the type's range
    /// by more than half a step) is refused, not clamped: clamping would silently store
    /// another weight than the one written.
    pub fn requantize_with_scales(
        &self, input: &[f32], data_out: &mut [u8], scales: &[u8],
    ) -> Result<(), QuantError> {
        self.check_requantize(input, data_out)?;
        self.check_window(0, input, scales)?;
        self.fill_padding(data_out);
        self.encode_window(0, input, data_out, scales)
    }

    // Streaming: the same work on windows of elements, so that a caller never holds more
    // than a window of float32 values (a 4-bit filter's view is 8 times its bytes). Fresh
    // scales take two passes: `largest_in_window` over every window, `store_fresh_scales`,
    // then `encode_window` over every window; stored scales take one (`check_window`, then
    // `encode_window`).

    /// A buffer for the stored bytes the windows are encoded into: `data_nbytes()` bytes,
    /// holding the padding nibble (8) that ends odd 4-bit rows.
    pub fn blank_data(&self) -> Vec<u8> {
        let mut data = vec![0u8; self.data_nbytes as usize];
        self.fill_padding(&mut data);
        data
    }

    /// The end of the window of `len` elements from `first`, or why it is not a window of
    /// this tensor.
    fn window_end(&self, first: u64, len: usize) -> Result<u64, QuantError> {
        first
            .checked_add(len as u64)
            .filter(|&end| end <= self.numel)
            .ok_or_else(|| {
                QuantError::new(format!(
                    "{}: elements {first}..{} given, the tensor has {}",
                    self.describe(),
                    first.saturating_add(len as u64),
                    self.numel
                ))
            })
    }

    /// Folds the window `input` (elements `first..`) into `largest`: per scale, the bits of
    /// the largest magnitude (non-negative floats order as their bits). Non-finite values
    /// are refused.
    pub fn largest_in_window(
        &self, first: u64, input: &[f32], largest: &mut [u32],
    ) -> Result<(), QuantError> {
        let end = self.window_end(first, input.len())?;
        self.check_per_scale("maxima", largest.len())?;
        if self.scale_count == 0 {
            return self.check_finite(first, input);
        }
        for run in self.runs(first, end) {
            let at = (run.start - first) as usize;
            let bits = self.largest_of(run.start, &input[at..at + run.len])?;
            largest[run.scale] = largest[run.scale].max(bits);
        }
        Ok(())
    }

    /// Stores the fresh scale of each largest magnitude (`largest_in_window` over every
    /// element) in the stored dtype, as [`Self::requantize`] computes them.
    pub fn store_fresh_scales(
        &self, largest: &[u32], scales_out: &mut [u8],
    ) -> Result<(), QuantError> {
        self.check_len("scales_out", scales_out.len(), self.scale_nbytes(), true)?;
        self.check_per_scale("maxima", largest.len())?;
        let divisor = self.fresh_scale_divisor();
        for (index, &bits) in largest.iter().enumerate() {
            self.store_fresh_scale(scales_out, index, bits, divisor);
        }
        Ok(())
    }

    /// Refuses the first element of the window that is not finite, or that `scales` cannot
    /// represent: beyond the type's range by more than half a step (or at all, with a scale
    /// that is not a positive finite float).
    pub fn check_window(&self, first: u64, input: &[f32], scales: &[u8]) -> Result<(), QuantError> {
        let end = self.window_end(first, input.len())?;
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        self.check_finite(first, input)?;
        if self.scale_count == 0 {
            return Ok(());
        }
        let (lo, hi) = int_range(self.datatype);
        let (lo, hi) = (lo as f64 - 0.5, hi as f64 + 0.5);
        let zero = f64::from(self.zero_point());
        for run in self.runs(first, end) {
            let scale = self.scale_at(scales, run.scale);
            let at = (run.start - first) as usize;
            for (k, &v) in input[at..at + run.len].iter().enumerate() {
                let q = f64::from(v) / f64::from(scale) + zero;
                if !(lo..=hi).contains(&q) {
                    return Err(QuantError::new(format!(
                        "{}: element {} ({v}) is not representable with its stored scale {scale}{}: \
                         it would be {q:.1}, outside {}..={}",
                        self.describe(),
                        run.start + k as u64,
                        if zero != 0.0 {
                            format!(" and zero point {zero}")
                        } else {
                            String::new()
                        },
                        lo + 0.5,
                        hi - 0.5
                    )));
                }
            }
        }
        Ok(())
    }

    /// Quantizes the window `input` (elements `first..`) with `scales` into `data_out` (a
    /// [`Self::blank_data`] buffer), clamping to the type's range; the other nibble of a
    /// byte the window shares with its neighbour is kept.
    pub fn encode_window(
        &self, first: u64, input: &[f32], data_out: &mut [u8], scales: &[u8],
    ) -> Result<(), QuantError> {
        let end = self.window_end(first, input.len())?;
        self.check_len("data_out", data_out.len(), self.data_nbytes, true)?;
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        for run in self.runs(first, end) {
            let at = (run.start - first) as usize;
            let scale = if self.scale_count > 0 {
                self.scale_at(scales, run.scale)
            } else {
                1.0
            };
            self.encode_run(
                &input[at..at + run.len],
                run.start as usize,
                scale,
                data_out,
            )?;
        }
        Ok(())
    }

    /// The `scale_nbytes()` bytes of `scales` as the values the runtime computes with, one
    /// per channel or group (one for per-tensor parameters, none for float types).
    pub fn scale_values(&self, scales: &[u8]) -> Result<Vec<f32>, QuantError> {
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        Ok((0..self.scale_count as usize)
            .map(|i| self.scale_at(scales, i))
            .collect())
    }

    /// Stores `values` (one per scale) into `out` in the stored scale dtype, each rounded
    /// the way [`Self::requantize`] rounds fresh scales.
    pub fn store_scale_values(&self, values: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
        self.check_len("scales_out", out.len(), self.scale_nbytes(), true)?;
        self.check_per_scale("scales", values.len())?;
        for (i, &v) in values.iter().enumerate() {
            self.store_scale(out, i, v);
        }
        Ok(())
    }

    /// Rescales a stored int32 bias (`qint32`, `qcint32`) whose unit follows a filter's
    /// scales: the element of channel `c` (its scale index) becomes `round(q × ratios[c])`,
    /// ties to even, computed in double precision. A result outside the int32 range is
    /// refused, naming the element.
    pub fn rescale_int32(
        &self, data: &[u8], ratios: &[f64], out: &mut [u8],
    ) -> Result<(), QuantError> {
        if !matches!(self.datatype, Datatype::QINT32 | Datatype::QCINT32) {
            return Err(QuantError::new(format!(
                "{}: only int32 biases are rescaled",
                self.describe()
            )));
        }
        self.check_len("data", data.len(), self.data_nbytes, false)?;
        self.check_len("data_out", out.len(), self.data_nbytes, true)?;
        self.check_per_scale("ratios", ratios.len())?;
        for run in self.runs(0, self.numel) {
            let ratio = ratios[run.scale];
            for e in run.start as usize..run.start as usize + run.len {
                let b = &data[4 * e..4 * e + 4];
                let q = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let r = (f64::from(q) * ratio).round_ties_even();
                if !(f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&r) {
                    return Err(QuantError::new(format!(
                        "{}: element {e} ({q}) rescaled by {ratio} is {r}, outside the int32 range",
                        self.describe()
                    )));
                }
                out[4 * e..4 * e + 4].copy_from_slice(&(r as i32).to_le_bytes());
            }
        }
        Ok(())
    }

    fn check_requantize(&self, input: &[f32], data_out: &[u8]) -> Result<(), QuantError> {
        if input.len() as u64 != self.numel {
            return Err(QuantError::new(format!(
                "{}: {} values given, the tensor has {} elements",
                self.describe(),
                input.len(),
                self.numel
            )));
        }
        self.check_len("data_out", data_out.len(), self.data_nbytes, true)
    }

    /// The bits of the largest magnitude of `values` (elements `start..` of the tensor), or
    /// the refusal of its first non-finite value.
    #[inline]
    fn largest_of(&self, start: u64, values: &[f32]) -> Result<u32, QuantError> {
        let bits = max_abs_bits(values);
        if bits >= f32::INFINITY.to_bits() {
            self.check_finite(start, values)?;
        }
        Ok(bits)
    }

    /// Refuses the first non-finite value of `input`, elements `first..` of the tensor.
    fn check_finite(&self, first: u64, input: &[f32]) -> Result<(), QuantError> {
        if max_abs_bits(input) < f32::INFINITY.to_bits() {
            return Ok(());
        }
        let (i, v) = input
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
            .unwrap_or((0, &f32::NAN));
        Err(QuantError::new(format!(
            "{}: element {} is {v}; only finite values can be quantized",
            self.describe(),
            first + i as u64
        )))
    }

    /// Whether each scale covers exactly one run of `segment`: groups, and channels of a
    /// tensor whose channel dimension is outermost (a filter `[out, in]`).
    fn scales_contiguous(&self) -> bool {
        match self.scheme {
            Scheme::Blockwise { .. } => true,
            Scheme::PerChannel { channels, inner } => {
                channels.checked_mul(inner) == Some(self.numel) && inner <= self.row_len
            }
            Scheme::Float | Scheme::PerTensor { .. } => false,
        }
    }

    /// Fresh scales and stored values in one pass over `input`, each run read once while it
    /// is in cache: for layouts whose scales each cover one contiguous run.
    fn requantize_in_one_pass(
        &self, input: &[f32], data_out: &mut [u8], scales_out: &mut [u8],
    ) -> Result<(), QuantError> {
        self.fill_padding(data_out);
        self.requantize_window(0, input, data_out, scales_out)
    }

    /// The elements one scale covers when each covers one contiguous run (a group, or a
    /// channel of a tensor whose channel dimension is outermost): windows of a multiple of
    /// it are re-quantized with fresh scales one at a time by [`Self::requantize_window`].
    pub fn scale_span(&self) -> Option<u64> {
        match self.scheme {
            _ if !self.scales_contiguous() => None,
            Scheme::Blockwise { group, .. } => Some(group),
            Scheme::PerChannel { inner, .. } => Some(inner),
            Scheme::Float | Scheme::PerTensor { .. } => None,
        }
    }

    /// Re-quantizes the window `input` (elements `first..`) with fresh scales computed from
    /// it, into `data_out` (a [`Self::blank_data`] buffer) and `scales_out`: the one-pass
    /// form of [`Self::requantize`] for layouts with a [`Self::scale_span`]. The window
    /// starts on a span boundary and ends on one (or at the last element).
    pub fn requantize_window(
        &self, first: u64, input: &[f32], data_out: &mut [u8], scales_out: &mut [u8],
    ) -> Result<(), QuantError> {
        let end = self.window_end(first, input.len())?;
        self.check_len("data_out", data_out.len(), self.data_nbytes, true)?;
        self.check_len("scales_out", scales_out.len(), self.scale_nbytes(), true)?;
        let aligned = self
            .scale_span()
            .is_some_and(|span| first % span == 0 && (end % span == 0 || end == self.numel));
        if !aligned {
            return Err(QuantError::new(format!(
                "{}: elements {first}..{end} are not whole runs of one scale each",
                self.describe()
            )));
        }
        let divisor = self.fresh_scale_divisor();
        for run in self.runs(first, end) {
            let at = (run.start - first) as usize;
            let values = &input[at..at + run.len];
            let largest = self.largest_of(run.start, values)?;
            self.store_fresh_scale(scales_out, run.scale, largest, divisor);
            let stored = self.scale_at(scales_out, run.scale);
            self.encode_run(values, run.start as usize, stored, data_out)?;
        }
        Ok(())
    }

    /// What the largest magnitude under one scale is divided by to give that scale.
    fn fresh_scale_divisor(&self) -> f32 {
        match self.scheme {
            Scheme::PerTensor { zero_point } => {
                let (lo, hi) = int_range(self.datatype);
                let (up, down) = (hi - i64::from(zero_point), i64::from(zero_point) - lo);
                // Symmetric about the zero point, unless it sits at one end of the range.
                let room = if up > 0 && down > 0 {
                    up.min(down)
                } else {
                    up.max(down)
                };
                room.max(1) as f32
            }
            _ => symmetric_qmax(self.datatype),
        }
    }

    /// Rows of odd length end with the padding nibble the exporter writes (8).
    fn fill_padding(&self, data_out: &mut [u8]) {
        if self.datatype.is_4bit() && self.row_len % 2 == 1 {
            data_out.fill(0x88);
        }
    }

    /// Stores the scale for a largest magnitude of `largest_bits`. Rounding it to the stored
    /// dtype may round up; near `f32::MAX` the largest quantized value times that scale would
    /// then dequantize to infinity, so such a scale is stored one step lower instead (the
    /// largest values then clamp, losing far less than half a step).
    ///
    /// The scale `out` holds on entry (the stored one, when the caller put it there; zeros
    /// otherwise) is kept when it need not change: when XNNPACK accepts it and the values
    /// under it are all zero, or their largest magnitude is its top step (`divisor` steps,
    /// within half a step). The values then quantize with it as well as with a fresh one,
    /// and an int32 bias that follows this scale keeps its bytes (see `placed::ScalePlan`).
    fn store_fresh_scale(&self, out: &mut [u8], index: usize, largest_bits: u32, divisor: f32) {
        if self.scale_need_not_change(out, index, largest_bits, divisor) {
            return;
        }
        self.store_scale(out, index, fresh_scale(largest_bits, divisor));
        let stored = self.scale_at(out, index);
        if (stored * divisor).is_finite() {
            return;
        }
        match self.scale_dtype {
            ScaleDtype::F32 => {
                let lower = f32::from_bits(stored.to_bits() - 1);
                out[4 * index..4 * index + 4].copy_from_slice(&lower.to_le_bytes());
            }
            ScaleDtype::Bf16 | ScaleDtype::F32RoundedToBf16 => {
                let lower = bf16_to_f32(f32_to_bf16(stored) - 1);
                self.store_scale(out, index, lower);
            }
        }
    }

    /// Whether scale `index` as `out` holds it can stay for values whose largest magnitude
    /// has the bits `largest_bits` (see `store_fresh_scale`).
    fn scale_need_not_change(
        &self, out: &[u8], index: usize, largest_bits: u32, divisor: f32,
    ) -> bool {
        let prior = self.scale_at(out, index);
        if scale_refusal(prior).is_some() {
            return false;
        }
        if largest_bits == 0 {
            return true;
        }
        let steps = f64::from(f32::from_bits(largest_bits)) / f64::from(prior);
        steps.round() == f64::from(divisor)
    }

    /// Stores `scale` rounded to the stored dtype, so that reading it back gives the value
    /// the weights are quantized with.
    fn store_scale(&self, out: &mut [u8], index: usize, scale: f32) {
        match self.scale_dtype {
            ScaleDtype::F32 => out[4 * index..4 * index + 4].copy_from_slice(&scale.to_le_bytes()),
            ScaleDtype::Bf16 => {
                out[2 * index..2 * index + 2].copy_from_slice(&f32_to_bf16(scale).to_le_bytes())
            }
            ScaleDtype::F32RoundedToBf16 => {
                // A bfloat16 value written as fp32 survives the runtime's conversion unchanged.
                let exact = bf16_to_f32(f32_to_bf16(scale));
                out[4 * index..4 * index + 4].copy_from_slice(&exact.to_le_bytes())
            }
        }
    }

    fn encode_run(
        &self, run: &[f32], e: usize, scale: f32, out: &mut [u8],
    ) -> Result<(), QuantError> {
        let n = run.len();
        let inverse = 1.0 / scale;
        match self.datatype {
            Datatype::FP32 => {
                for (o, v) in out[4 * e..4 * (e + n)].chunks_exact_mut(4).zip(run) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            Datatype::FP16 => {
                for (i, (o, &v)) in out[2 * e..2 * (e + n)]
                    .chunks_exact_mut(2)
                    .zip(run)
                    .enumerate()
                {
                    let h = f32_to_f16(v);
                    if h & 0x7c00 == 0x7c00 {
                        return Err(QuantError::new(format!(
                            "{}: element {} ({v}) is beyond the largest half float (65504)",
                            self.describe(),
                            e + i
                        )));
                    }
                    o.copy_from_slice(&h.to_le_bytes());
                }
            }
            Datatype::BF16 => {
                for (i, (o, &v)) in out[2 * e..2 * (e + n)]
                    .chunks_exact_mut(2)
                    .zip(run)
                    .enumerate()
                {
                    let b = f32_to_bf16(v);
                    if b & 0x7f80 == 0x7f80 {
                        return Err(QuantError::new(format!(
                            "{}: element {} ({v}) rounds beyond the largest bfloat16",
                            self.describe(),
                            e + i
                        )));
                    }
                    o.copy_from_slice(&b.to_le_bytes());
                }
            }
            Datatype::QINT8 | Datatype::QCINT8 | Datatype::QUINT8 => {
                let (lo, hi) = int_range(self.datatype);
                let zero = self.zero_point() as f32;
                let (lo, hi) = (lo as f32, hi as f32);
                for (o, &v) in out[e..e + n].iter_mut().zip(run) {
                    *o = round_clamped(v * inverse + zero, lo, hi) as u8;
                }
            }
            Datatype::QINT32 | Datatype::QCINT32 => {
                // Wide integers: round in double precision, saturating at the i32 range.
                let zero = f64::from(self.zero_point());
                for (o, &v) in out[4 * e..4 * (e + n)].chunks_exact_mut(4).zip(run) {
                    let q = (f64::from(v) / f64::from(scale) + zero).round_ties_even() as i32;
                    o.copy_from_slice(&q.to_le_bytes());
                }
            }
            _ => {
                let row_len = self.row_len as usize;
                let row_bytes = row_len.div_ceil(2);
                let (row, col) = (e / row_len, e % row_len);
                let bytes = &mut out[row * row_bytes..(row + 1) * row_bytes];
                encode_nibbles(run, inverse, col, bytes);
            }
        }
        Ok(())
    }
}

/// Why XNNPACK refuses scale `value` (`xnn_define_*_quantized_tensor` require positive
/// normal floats), or None when it accepts it.
pub fn scale_refusal(value: f32) -> Option<&'static str> {
    if value.is_nan() {
        Some("not a number")
    } else if value.is_infinite() {
        Some("infinite")
    } else if value == 0.0 {
        Some("zero")
    } else if value < 0.0 {
        Some("negative")
    } else if !value.is_normal() {
        Some("a subnormal float")
    } else {
        None
    }
}

/// A float as a message shows it: exponent notation when a decimal would be long.
fn shown(v: f32) -> String {
    let a = v.abs();
    if v.is_finite() && a != 0.0 && !(1e-4..1e6).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The first scale in `bytes` (scales stored as `dtype`, at most `count` of them: those the
/// graph declares and the bytes hold) that XNNPACK refuses, as a message naming its index
/// and value: "scale 2 is 0 (zero)". The value checked is the one the runtime computes with
/// (inline blockwise fp32 scales after their conversion to bfloat16).
pub fn first_refused_scale(dtype: ScaleDtype, bytes: &[u8], count: u64) -> Option<String> {
    let size = dtype.size() as usize;
    let n = (bytes.len() / size).min(usize::try_from(count).unwrap_or(usize::MAX));
    (0..n).find_map(|i| {
        let at = &bytes[i * size..(i + 1) * size];
        let (stored, used) = match dtype {
            ScaleDtype::F32 => {
                let v = f32::from_le_bytes([at[0], at[1], at[2], at[3]]);
                (v, v)
            }
            ScaleDtype::Bf16 => {
                let v = bf16_to_f32(u16::from_le_bytes([at[0], at[1]]));
                (v, v)
            }
            ScaleDtype::F32RoundedToBf16 => {
                let v = f32::from_le_bytes([at[0], at[1], at[2], at[3]]);
                (v, bf16_to_f32(runtime_f32_to_bf16(v)))
            }
        };
        let why = scale_refusal(used)?;
        Some(if stored.to_bits() == used.to_bits() {
            format!("scale {i} is {} ({why})", shown(stored))
        } else {
            format!(
                "scale {i} is {}, which the runtime converts to bfloat16 {} ({why})",
                shown(stored),
                shown(used)
            )
        })
    })
}

/// `largest / divisor` as a scale XNNPACK accepts: positive and normal (1 for all zeros).
fn fresh_scale(largest_bits: u32, divisor: f32) -> f32 {
    if largest_bits == 0 {
        return 1.0;
    }
    (f32::from_bits(largest_bits) / divisor).max(f32::MIN_POSITIVE)
}

/// Elements `start .. start + len`, which all use scale `scale` and lie in one 4-bit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    start: u64,
    len: usize,
    scale: usize,
}

/// Walks a range of elements run by run. Positions inside the current channel, group and
/// row are carried from run to run, so only the start costs divisions: a `qbint4` group is
/// 32 elements, and a division per group would cost as much as quantizing it.
struct Runs {
    e: u64,
    end: u64,
    /// Length of the span one scale covers (`inner`, the group, or everything).
    span: u64,
    in_span: u64,
    /// Scale index and how it advances at the end of a span.
    scale: u64,
    scales_per_cycle: u64,
    /// For blockwise layouts: scales per row, and the first scale of the current row.
    row_len: u64,
    in_row: u64,
    row_scale_base: u64,
    blockwise: bool,
}

impl Runs {
    fn new(layout: &QuantLayout, first: u64, end: u64) -> Runs {
        let row_len = layout.row_len;
        let in_row = first % row_len;
        let mut runs = Runs {
            e: first,
            end,
            span: u64::MAX,
            in_span: first,
            scale: 0,
            scales_per_cycle: 1,
            row_len,
            in_row,
            row_scale_base: 0,
            blockwise: false,
        };
        match layout.scheme {
            Scheme::Float | Scheme::PerTensor { .. } => {}
            Scheme::PerChannel { channels, inner } => {
                runs.span = inner;
                runs.in_span = first % inner;
                runs.scale = (first / inner) % channels;
                runs.scales_per_cycle = channels;
            }
            Scheme::Blockwise { cols, group } => {
                // A 4-bit row is a row of the filter: groups never cross it.
                runs.blockwise = true;
                runs.span = group;
                runs.in_span = in_row % group;
                runs.row_scale_base = (first / cols) * (cols / group);
                runs.scale = in_row / group;
                runs.scales_per_cycle = cols / group;
            }
        }
        runs
    }
}

impl Iterator for Runs {
    type Item = Run;

    #[inline]
    fn next(&mut self) -> Option<Run> {
        if self.e >= self.end {
            return None;
        }
        let len = (self.span - self.in_span)
            .min(self.row_len - self.in_row)
            .min(self.end - self.e);
        let run = Run {
            start: self.e,
            len: len as usize,
            scale: (self.row_scale_base + self.scale) as usize,
        };
        self.e += len;
        self.in_span += len;
        if self.in_span == self.span {
            self.in_span = 0;
            self.scale += 1;
            if self.scale == self.scales_per_cycle {
                self.scale = 0;
            }
        }
        self.in_row += len;
        if self.in_row == self.row_len {
            self.in_row = 0;
            if self.blockwise {
                self.row_scale_base += self.scales_per_cycle;
                self.scale = 0;
            }
        }
        Some(run)
    }
}

fn f32_le(bytes: &[u8], index: usize) -> f32 {
    let b = &bytes[4 * index..4 * index + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The largest `|x|` as float bits; at least `f32::INFINITY.to_bits()` when any `x` is not
/// finite. Integer lanes, so the loop vectorizes without reassociating float math.
#[inline]
fn max_abs_bits(xs: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut acc = [0u32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = (*a).max(x.to_bits() & 0x7fff_ffff);
        }
    }
    let mut m = acc.into_iter().max().unwrap_or(0);
    for x in tail {
        m = m.max(x.to_bits() & 0x7fff_ffff);
    }
    m
}

/// `1.5 × 2²³`: adding it to a float of magnitude below 2²² leaves the nearest integer
/// (ties to even) in the low mantissa bits, without a float-to-int conversion.
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// `round_ties_even(x)` clamped to `[lo, hi]`, for `|lo|, |hi| < 2²²`.
#[inline]
fn round_clamped(x: f32, lo: f32, hi: f32) -> i32 {
    let c = x.max(lo).min(hi);
    ((c + ROUNDING_MAGIC).to_bits() as i32).wrapping_sub(ROUNDING_MAGIC.to_bits() as i32)
}

/// The two elements of each byte, `nibble - 8`: index by byte, low (even) element first.
static NIBBLE_PAIRS: [[f32; 2]; 256] = {
    let mut t = [[0.0f32; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [(b & 15) as f32 - 8.0, (b >> 4) as f32 - 8.0];
        b += 1;
    }
    t
};

/// `out[k] = (nibble(col + k) - 8) × scale` over one packed row, the even element of each
/// byte in its low nibble.
#[inline]
fn dequantize_nibbles(row: &[u8], col: usize, scale: f32, out: &mut [f32]) {
    let mut out = out;
    let mut byte = col / 2;
    if col % 2 == 1 {
        if let Some((first, rest)) = std::mem::take(&mut out).split_first_mut() {
            *first = NIBBLE_PAIRS[usize::from(row[byte])][1] * scale;
            out = rest;
            byte += 1;
        }
    }
    let pairs = out.len() / 2;
    let (body, tail) = out.split_at_mut(2 * pairs);
    for (o, &b) in body.chunks_exact_mut(2).zip(&row[byte..byte + pairs]) {
        let p = NIBBLE_PAIRS[usize::from(b)];
        o[0] = p[0] * scale;
        o[1] = p[1] * scale;
    }
    if let Some(last) = tail.first_mut() {
        *last = NIBBLE_PAIRS[usize::from(row[byte + pairs])][0] * scale;
    }
}

/// Nibble of `x × inverse`, rounded and clamped to −8..=7, plus the zero point 8.
#[inline]
fn nibble(x: f32, inverse: f32) -> u8 {
    (round_clamped(x * inverse, -8.0, 7.0) + 8) as u8
}

/// Packs `run` into one row from element `col`, keeping the other nibble of shared bytes.
#[inline]
fn encode_nibbles(run: &[f32], inverse: f32, col: usize, row: &mut [u8]) {
    let mut run = run;
    let mut byte = col / 2;
    if col % 2 == 1 {
        if let Some((&first, rest)) = run.split_first() {
            row[byte] = (row[byte] & 0x0f) | (nibble(first, inverse) << 4);
            run = rest;
            byte += 1;
        }
    }
    let pairs = run.len() / 2;
    let out = &mut row[byte..byte + pairs];
    // Blocks of 16 elements: quantize into lanes first, then pair them, so both loops
    // vectorize (one strided loop doing both does not).
    const BLOCK: usize = 16;
    let blocks = run.len() / BLOCK;
    for (o, x) in out.chunks_exact_mut(BLOCK / 2).zip(run.chunks_exact(BLOCK)) {
        let mut q = [0u8; BLOCK];
        for (q, &x) in q.iter_mut().zip(x) {
            *q = nibble(x, inverse);
        }
        for (o, q) in o.iter_mut().zip(q.chunks_exact(2)) {
            *o = q[0] | (q[1] << 4);
        }
    }
    let done = blocks * BLOCK / 2;
    for (o, x) in out[done..].iter_mut().zip(run[2 * done..].chunks_exact(2)) {
        *o = nibble(x[0], inverse) | (nibble(x[1], inverse) << 4);
    }
    if let Some(&last) = run.get(2 * pairs) {
        let b = &mut row[byte + pairs];
        *b = (*b & 0xf0) | nibble(last, inverse);
    }
}

impl crate::backend::view::Dequantize for QuantLayout {
    fn shape(&self) -> Vec<u64> {
        self.dims.iter().map(|&d| u64::from(d)).collect()
    }

    fn numel(&self) -> u64 {
        self.numel
    }

    fn data_nbytes(&self) -> u64 {
        self.data_nbytes
    }

    fn scale_nbytes(&self) -> u64 {
        QuantLayout::scale_nbytes(self)
    }

    fn scheme(&self) -> Option<String> {
        let scales = self.scale_dtype.name();
        match self.scheme {
            Scheme::Float => None,
            Scheme::PerTensor { zero_point } => {
                Some(format!("per tensor, zero point {zero_point}"))
            }
            Scheme::PerChannel { .. } => Some(format!("per channel, {scales} scales")),
            Scheme::Blockwise { group, .. } => Some(format!("groups of {group}, {scales} scales")),
        }
    }

    fn dequantize(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        QuantLayout::dequantize(self, data, scales, first, out)
    }

    fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        QuantLayout::steps(self, data, scales, first, out)
    }

    fn grid(&self) -> Option<crate::backend::view::Grid> {
        let (zero_point, unit) = match self.scheme {
            Scheme::Float => return None,
            Scheme::PerTensor { zero_point } => (i64::from(zero_point), "tensor"),
            Scheme::PerChannel { .. } => (0, "channel"),
            Scheme::Blockwise { .. } => (0, "group"),
        };
        let levels = match self.datatype {
            Datatype::QINT32 | Datatype::QCINT32 => None,
            dt => {
                let (lo, hi) = int_range(dt);
                let offset = if dt.is_4bit() { 0 } else { zero_point };
                Some((lo - offset, hi - offset))
            }
        };
        Some(crate::backend::view::Grid {
            levels,
            zero_point: if self.datatype.is_4bit() {
                8
            } else {
                zero_point
            },
            scales: usize::try_from(self.scale_count).ok()?,
            unit,
        })
    }

    fn scale_runs(&self, first: u64, end: u64, f: &mut dyn FnMut(u64, usize, usize)) {
        for run in self.runs(first, end) {
            f(run.start, run.len, run.scale);
        }
    }

    fn scale(&self, scales: &[u8], index: usize) -> f32 {
        self.scale_at(scales, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::blob::BlobRef;
    use crate::backend::xnnpack::graph::ScaleRef;

    fn layout(datatype: Datatype, dims: &[u32], quant: Option<QuantParams>) -> QuantLayout {
        let value = XnnValue {
            id: 0,
            index: 0,
            quantized: quant.is_some(),
            datatype,
            num_dims: dims.len() as u32,
            dims: dims.to_vec(),
            constant_buffer_idx: 1,
            external_id: u32::MAX,
            flags: 0,
            dq_datatype: Datatype::INVALID,
            quant,
            constant: None,
            used_by: Vec::new(),
        };
        QuantLayout::for_value(&value).unwrap()
    }

    fn scales(dtype: ScaleDtype, count: u64) -> Option<ScaleRef> {
        Some(ScaleRef {
            bytes: BlobRef::Payload {
                offset: 0,
                size: count * dtype.size(),
            },
            dtype,
            count,
            inline: false,
        })
    }

    /// The scale of element `e` and where its 4-bit row ends, by division.
    fn reference(l: &QuantLayout, e: u64) -> (usize, u64) {
        let scale = match l.scheme {
            Scheme::Float | Scheme::PerTensor { .. } => 0,
            Scheme::PerChannel { channels, inner } => (e / inner) % channels,
            Scheme::Blockwise { cols, group } => (e / cols) * (cols / group) + (e % cols) / group,
        };
        (scale as usize, e / l.row_len)
    }

    #[test]
    fn int32_biases_rescale_per_channel_and_refuse_overflow() {
        let l = layout(
            Datatype::QCINT32,
            &[3],
            Some(QuantParams::PerChannel {
                scale: None,
                channel_dim: 0,
                scale_buffer_idx: 1,
                num_scales: 3,
                scales: scales(ScaleDtype::F32, 3),
            }),
        );
        let data: Vec<u8> = [10i32, -7, 1 << 29]
            .iter()
            .flat_map(|q| q.to_le_bytes())
            .collect();
        let mut out = vec![0u8; 12];
        l.rescale_int32(&data, &[2.0, 0.5, 1.0], &mut out).unwrap();
        let got: Vec<i32> = out
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // -3.5 rounds to the even -4.
        assert_eq!(got, [20, -4, 1 << 29]);
        let e = l
            .rescale_int32(&data, &[1.0, 1.0, 4.0], &mut out)
            .unwrap_err();
        assert!(e.message().contains("element 2"), "{e}");
        assert!(e.message().contains("outside the int32 range"), "{e}");
        assert!(l.rescale_int32(&data, &[1.0], &mut out).is_err());
    }

    #[test]
    fn runs_cover_every_element_with_its_scale() {
        let per_channel = |cd: i32, n: u64| {
            Some(QuantParams::PerChannel {
                scale: None,
                channel_dim: cd,
                scale_buffer_idx: 1,
                num_scales: n as u32,
                scales: scales(ScaleDtype::F32, n),
            })
        };
        let layouts = [
            layout(Datatype::QCINT4, &[3, 5], per_channel(0, 3)),
            layout(Datatype::QCINT4, &[3, 5], per_channel(1, 5)),
            layout(Datatype::QCINT4, &[2, 3, 4], per_channel(0, 2)),
            layout(Datatype::QCINT8, &[2, 3, 4], per_channel(1, 3)),
            layout(Datatype::QCINT32, &[7], per_channel(0, 7)),
            layout(
                Datatype::QBINT4,
                &[3, 96],
                Some(QuantParams::PerChannelGroup {
                    scale: None,
                    channel_dim: 0,
                    group_size: 32,
                    scale_buffer_idx: 1,
                    num_scales: 9,
                    scales: scales(ScaleDtype::Bf16, 9),
                }),
            ),
            layout(Datatype::FP16, &[4, 4], None),
        ];
        for l in &layouts {
            for first in 0..l.numel {
                for end in first..=l.numel {
                    let mut e = first;
                    for run in l.runs(first, end) {
                        assert_eq!(run.start, e, "{l:?}");
                        assert!(run.len > 0);
                        let (scale, row) = reference(l, e);
                        for k in e..e + run.len as u64 {
                            assert_eq!(reference(l, k), (scale, row), "{l:?} element {k}");
                        }
                        assert_eq!(run.scale, scale, "{l:?} from {first}");
                        e += run.len as u64;
                    }
                    assert_eq!(e, end);
                }
            }
        }
    }
}
