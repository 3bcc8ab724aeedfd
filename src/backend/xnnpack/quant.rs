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
//! - `qbint4` (`PerChannelGroupQuant`, dims `[out, in]`, `channel_dim` 0):
//!   `(nibble - 8) × scale[o][i / group_size]` with the same packing, bfloat16 scales shaped
//!   `[out, in / group_size]` (FORMAT.md §9.2a, checked against the checkpoint). Inline fp32
//!   scales are first converted to bfloat16 the way the runtime does (×1.00389105, truncate).
//!
//! Re-quantizing is symmetric and rounds to nearest (ties to even), clamped to the type's
//! range. Fresh scales are `max|w| / qmax` per channel or per group (qmax 7 for 4-bit, 127
//! for 8-bit, 2³¹−1 for 32-bit), so no in-range value clips; per-tensor types keep their zero
//! point and take `max|w| / min(qmax − zp, zp − qmin)`. Each scale is rounded to its stored
//! dtype first and the weights are quantized with that stored value, so dequantizing the
//! result reproduces it. XNNPACK refuses scales that are not positive normal floats, so an
//! all-zero channel or group gets scale 1 and tiny ones at least `f32::MIN_POSITIVE`.
//! Non-finite inputs are refused.

use std::fmt;

use super::datatype::{element_count, Datatype};
use super::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, runtime_f32_to_bf16};
use super::graph::{QuantParams, ScaleDtype, XnnValue};

/// Why a constant cannot be (de)quantized as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError {
    message: String,
}

impl QuantError {
    fn new(message: impl Into<String>) -> Self {
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
        let data_nbytes = dt.nbytes(&value.dims).map_err(QuantError::new)?;
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
        &self,
        what: &str,
        found: usize,
        expected: u64,
        exact: bool,
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

    /// Elements from `e` that share one scale (and one 4-bit row), and that scale's index.
    #[inline]
    fn segment(&self, e: u64) -> (u64, u64) {
        let (len, index) = match self.scheme {
            Scheme::Float | Scheme::PerTensor { .. } => (u64::MAX, 0),
            Scheme::PerChannel { channels, inner } => (inner - e % inner, (e / inner) % channels),
            Scheme::Blockwise { cols, group } => {
                let (row, col) = (e / cols, e % cols);
                (group - col % group, row * (cols / group) + col / group)
            }
        };
        (len.min(self.row_len - e % self.row_len), index)
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
        &self,
        data: &[u8],
        scales: &[u8],
        first: u64,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        self.check_len("data", data.len(), self.data_nbytes, false)?;
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        let end = first.checked_add(out.len() as u64);
        if end.is_none_or(|end| end > self.numel) {
            return Err(QuantError::new(format!(
                "{}: elements {first}..{} requested, the tensor has {}",
                self.describe(),
                first.saturating_add(out.len() as u64),
                self.numel
            )));
        }
        let mut e = first;
        let mut pos = 0usize;
        while pos < out.len() {
            let (len, index) = self.segment(e);
            let n = (out.len() - pos).min(usize::try_from(len).unwrap_or(usize::MAX));
            let scale = if self.scale_count > 0 {
                self.scale_at(scales, index as usize)
            } else {
                1.0
            };
            self.dequantize_run(data, e, scale, &mut out[pos..pos + n]);
            e += n as u64;
            pos += n;
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
    /// their stored dtype, to `scales_out` (exactly `scale_nbytes()`).
    ///
    /// Biases (`qint32`, `qcint32`) live in XNNPACK's accumulator domain, whose scale is the
    /// input's scale times the filter's: give them [`Self::requantize_with_scales`] unless
    /// those scales change together.
    pub fn requantize(
        &self,
        input: &[f32],
        data_out: &mut [u8],
        scales_out: &mut [u8],
    ) -> Result<(), QuantError> {
        self.check_requantize(input, data_out)?;
        self.check_len("scales_out", scales_out.len(), self.scale_nbytes(), true)?;
        if self.scale_count > 0 {
            self.write_fresh_scales(input, scales_out)?;
        }
        self.encode(input, data_out, scales_out)
    }

    /// Re-quantizes `input` with the scales already stored (`scales`, as for
    /// [`Self::dequantize`]), clamping what they cannot represent.
    pub fn requantize_with_scales(
        &self,
        input: &[f32],
        data_out: &mut [u8],
        scales: &[u8],
    ) -> Result<(), QuantError> {
        self.check_requantize(input, data_out)?;
        self.check_len("scales", scales.len(), self.scale_nbytes(), false)?;
        self.encode(input, data_out, scales)
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
        self.check_len("data_out", data_out.len(), self.data_nbytes, true)?;
        if max_abs_bits(input) >= f32::INFINITY.to_bits() {
            let (i, v) = input
                .iter()
                .enumerate()
                .find(|(_, v)| !v.is_finite())
                .unwrap_or((0, &f32::NAN));
            return Err(QuantError::new(format!(
                "{}: element {i} is {v}; only finite values can be quantized",
                self.describe()
            )));
        }
        Ok(())
    }

    /// Computes each scale from the largest magnitude it covers and stores it.
    fn write_fresh_scales(&self, input: &[f32], scales_out: &mut [u8]) -> Result<(), QuantError> {
        let count = self.scale_count as usize;
        let divisor = match self.scheme {
            Scheme::PerTensor { zero_point } => {
                let (lo, hi) = int_range(self.datatype);
                let (up, down) = (hi - i64::from(zero_point), i64::from(zero_point) - lo);
                let room = if up > 0 && down > 0 {
                    up.min(down)
                } else {
                    up.max(down)
                };
                room.max(1) as f32
            }
            _ => symmetric_qmax(self.datatype),
        };
        // Largest |w| per scale, as the bits of a non-negative float (which order as floats).
        let mut largest = vec![0u32; count];
        let mut e = 0u64;
        while e < self.numel {
            let (len, index) = self.segment(e);
            let n = len.min(self.numel - e) as usize;
            let run = &input[e as usize..e as usize + n];
            largest[index as usize] = largest[index as usize].max(max_abs_bits(run));
            e += n as u64;
        }
        for (index, &bits) in largest.iter().enumerate() {
            let raw = f32::from_bits(bits) / divisor;
            let scale = if bits == 0 {
                1.0
            } else {
                raw.max(f32::MIN_POSITIVE)
            };
            self.store_scale(scales_out, index, scale);
        }
        Ok(())
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

    /// Writes every element of `input` quantized with the stored `scales`.
    fn encode(&self, input: &[f32], data_out: &mut [u8], scales: &[u8]) -> Result<(), QuantError> {
        if self.datatype.is_4bit() {
            // Rows of odd length end with the padding nibble the exporter writes (8).
            data_out.fill(0x88);
        }
        let mut e = 0u64;
        while e < self.numel {
            let (len, index) = self.segment(e);
            let n = len.min(self.numel - e) as usize;
            let run = &input[e as usize..e as usize + n];
            let scale = if self.scale_count > 0 {
                self.scale_at(scales, index as usize)
            } else {
                1.0
            };
            self.encode_run(run, e as usize, scale, data_out)?;
            e += n as u64;
        }
        Ok(())
    }

    fn encode_run(
        &self,
        run: &[f32],
        e: usize,
        scale: f32,
        out: &mut [u8],
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
    for (o, x) in row[byte..byte + pairs].iter_mut().zip(run.chunks_exact(2)) {
        *o = nibble(x[0], inverse) | (nibble(x[1], inverse) << 4);
    }
    if let Some(&last) = run.get(2 * pairs) {
        let b = &mut row[byte + pairs];
        *b = (*b & 0xf0) | nibble(last, inverse);
    }
}
