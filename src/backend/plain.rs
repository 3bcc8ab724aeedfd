//! Float32 views of tensors stored as plain little-endian elements: program constants,
//! `.ptd` tensors, float constants of a payload that need no scales, and the tensors of a
//! safetensors checkpoint. They dequantize through the same [`Dequantize`] trait as the
//! backends' quantized constants, so whoever compares or measures values reads every tensor
//! the same way.
//!
//! Invariants: a [`PlainLayout`] reads exactly `numel × element size` bytes and no scales;
//! its element count never overflows (checked when it is made); conversion is exact for
//! every type a float32 holds exactly (bool, 8- and 16-bit integers, half, bfloat16, float),
//! and rounds to nearest for the others (32- and 64-bit integers, double).

use super::float16::{bf16_to_f32, f16_to_f32};
use super::view::{self, Dequantize, QuantError};

/// An element type whose values a float32 can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
}

impl Element {
    /// The element type of an ExecuTorch scalar type (docs/formats.md#scalar-types); None for
    /// quantized, complex, packed and 8-bit float types.
    pub fn of_scalar_type(scalar_type: i8) -> Option<Element> {
        Some(match scalar_type {
            0 => Element::U8,
            1 => Element::I8,
            2 => Element::I16,
            3 => Element::I32,
            4 => Element::I64,
            5 => Element::F16,
            6 => Element::F32,
            7 => Element::F64,
            11 => Element::Bool,
            15 => Element::BF16,
            27 => Element::U16,
            28 => Element::U32,
            29 => Element::U64,
            _ => return None,
        })
    }

    /// The element type of a safetensors dtype name.
    pub fn of_safetensors(dtype: &str) -> Option<Element> {
        Some(match dtype {
            "F64" => Element::F64,
            "F32" => Element::F32,
            "F16" => Element::F16,
            "BF16" => Element::BF16,
            "I64" => Element::I64,
            "I32" => Element::I32,
            "I16" => Element::I16,
            "I8" => Element::I8,
            "U64" => Element::U64,
            "U32" => Element::U32,
            "U16" => Element::U16,
            "U8" => Element::U8,
            "BOOL" => Element::Bool,
            _ => return None,
        })
    }

    /// The element type of a little-endian (or byte-sized) NumPy `descr`, as payload
    /// constants give theirs; `|V2` is bfloat16.
    pub fn of_npy_descr(descr: &str) -> Option<Element> {
        Some(match descr {
            "<f8" => Element::F64,
            "<f4" => Element::F32,
            "<f2" => Element::F16,
            "|V2" => Element::BF16,
            "<i8" => Element::I64,
            "<i4" => Element::I32,
            "<i2" => Element::I16,
            "|i1" => Element::I8,
            "<u8" => Element::U64,
            "<u4" => Element::U32,
            "<u2" => Element::U16,
            "|u1" => Element::U8,
            "|b1" => Element::Bool,
            _ => return None,
        })
    }

    /// The safetensors name of the type: `"F32"`.
    pub fn name(self) -> &'static str {
        match self {
            Element::F64 => "F64",
            Element::F32 => "F32",
            Element::F16 => "F16",
            Element::BF16 => "BF16",
            Element::I64 => "I64",
            Element::I32 => "I32",
            Element::I16 => "I16",
            Element::I8 => "I8",
            Element::U64 => "U64",
            Element::U32 => "U32",
            Element::U16 => "U16",
            Element::U8 => "U8",
            Element::Bool => "BOOL",
        }
    }

    /// Bytes of one element.
    pub fn size(self) -> u64 {
        match self {
            Element::F64 | Element::I64 | Element::U64 => 8,
            Element::F32 | Element::I32 | Element::U32 => 4,
            Element::F16 | Element::BF16 | Element::I16 | Element::U16 => 2,
            Element::I8 | Element::U8 | Element::Bool => 1,
        }
    }

    /// Converts the elements in `bytes` (a whole number of them, `out.len()` of them).
    fn convert(self, bytes: &[u8], out: &mut [f32]) {
        macro_rules! each {
            ($n:literal, $f:expr) => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact($n)) {
                    let b: [u8; $n] = b.try_into().expect("chunks of the element size");
                    *o = $f(b);
                }
            };
        }
        match self {
            Element::F64 => each!(8, |b| f64::from_le_bytes(b) as f32),
            Element::F32 => each!(4, f32::from_le_bytes),
            Element::F16 => each!(2, |b| f16_to_f32(u16::from_le_bytes(b))),
            Element::BF16 => each!(2, |b| bf16_to_f32(u16::from_le_bytes(b))),
            Element::I64 => each!(8, |b| i64::from_le_bytes(b) as f32),
            Element::I32 => each!(4, |b| i32::from_le_bytes(b) as f32),
            Element::I16 => each!(2, |b| f32::from(i16::from_le_bytes(b))),
            Element::I8 => each!(1, |b: [u8; 1]| f32::from(b[0] as i8)),
            Element::U64 => each!(8, |b| u64::from_le_bytes(b) as f32),
            Element::U32 => each!(4, |b| u32::from_le_bytes(b) as f32),
            Element::U16 => each!(2, |b| f32::from(u16::from_le_bytes(b))),
            Element::U8 => each!(1, |b: [u8; 1]| f32::from(b[0])),
            Element::Bool => each!(1, |b: [u8; 1]| f32::from(u8::from(b[0] != 0))),
        }
    }
}

/// A tensor of `shape` stored as consecutive elements of one type, in memory order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainLayout {
    pub element: Element,
    shape: Vec<u64>,
    numel: u64,
    nbytes: u64,
}

impl PlainLayout {
    /// The layout of `shape` elements of `element`; None when the element count or the byte
    /// size overflows 64 bits.
    pub fn new(element: Element, shape: Vec<u64>) -> Option<PlainLayout> {
        let numel = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let nbytes = numel.checked_mul(element.size())?;
        Some(PlainLayout {
            element,
            shape,
            numel,
            nbytes,
        })
    }
}

impl Dequantize for PlainLayout {
    fn shape(&self) -> Vec<u64> {
        self.shape.clone()
    }

    fn numel(&self) -> u64 {
        self.numel
    }

    fn data_nbytes(&self) -> u64 {
        self.nbytes
    }

    fn scale_nbytes(&self) -> u64 {
        0
    }

    fn scheme(&self) -> Option<String> {
        None
    }

    fn dequantize(
        &self, data: &[u8], _scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        let size = self.element.size();
        let end = first
            .checked_add(out.len() as u64)
            .filter(|&e| e <= self.numel)
            .ok_or_else(|| {
                QuantError::new(format!(
                    "{}: elements {first}..+{} outside its {}",
                    self.element.name(),
                    out.len(),
                    self.numel
                ))
            })?;
        let bytes = usize::try_from(first * size)
            .ok()
            .zip(usize::try_from(end * size).ok())
            .and_then(|(a, b)| data.get(a..b))
            .ok_or_else(|| {
                QuantError::new(format!(
                    "{}: {} bytes hold fewer than the {end} elements asked for",
                    self.element.name(),
                    data.len()
                ))
            })?;
        self.element.convert(bytes, out);
        Ok(())
    }

    /// Integers are a unit apart; floats by the spacing of their format at each value.
    fn steps(
        &self, data: &[u8], scales: &[u8], first: u64, out: &mut [f32],
    ) -> Result<(), QuantError> {
        self.dequantize(data, scales, first, out)?;
        let format = match self.element {
            // A double is read as float32, so its values are as far apart as float32's.
            Element::F64 | Element::F32 => view::FLOAT32,
            Element::F16 => view::FLOAT16,
            Element::BF16 => view::BFLOAT16,
            _ => {
                out.fill(1.0);
                return Ok(());
            }
        };
        for o in out.iter_mut() {
            *o = view::float_spacing(*o, format);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_a_unit_for_integers_and_the_format_spacing_for_floats() {
        let step = |element: Element, bytes: Vec<u8>| {
            let layout = PlainLayout::new(element, vec![1]).unwrap();
            let mut out = [0f32];
            layout.steps(&bytes, &[], 0, &mut out).unwrap();
            out[0]
        };
        assert_eq!(
            step(Element::F32, 1f32.to_le_bytes().to_vec()),
            2f32.powi(-23)
        );
        assert_eq!(
            step(Element::F16, 0x3c00u16.to_le_bytes().to_vec()),
            2f32.powi(-10)
        );
        assert_eq!(
            step(Element::BF16, 0x4000u16.to_le_bytes().to_vec()),
            2f32.powi(-6)
        );
        assert_eq!(step(Element::I8, vec![0x85]), 1.0);
        assert_eq!(step(Element::I64, 5i64.to_le_bytes().to_vec()), 1.0);
    }

    #[test]
    fn converts_every_element_type() {
        let cases: [(Element, Vec<u8>, f32); 13] = [
            (Element::F64, (-2.5f64).to_le_bytes().to_vec(), -2.5),
            (Element::F32, 0.25f32.to_le_bytes().to_vec(), 0.25),
            (Element::F16, 0x3c00u16.to_le_bytes().to_vec(), 1.0),
            (Element::BF16, 0xbf80u16.to_le_bytes().to_vec(), -1.0),
            (Element::I64, (-7i64).to_le_bytes().to_vec(), -7.0),
            (Element::I32, 70000i32.to_le_bytes().to_vec(), 70000.0),
            (Element::I16, (-300i16).to_le_bytes().to_vec(), -300.0),
            (Element::I8, vec![0xff], -1.0),
            (Element::U64, 9u64.to_le_bytes().to_vec(), 9.0),
            (Element::U32, 4_000_000_000u32.to_le_bytes().to_vec(), 4.0e9),
            (Element::U16, 65535u16.to_le_bytes().to_vec(), 65535.0),
            (Element::U8, vec![200], 200.0),
            (Element::Bool, vec![3], 1.0),
        ];
        for (element, bytes, want) in cases {
            let layout = PlainLayout::new(element, vec![1]).unwrap();
            assert_eq!(layout.data_nbytes(), element.size());
            let mut out = [0f32];
            layout.dequantize(&bytes, &[], 0, &mut out).unwrap();
            assert_eq!(out[0], want, "{element:?}");
            assert_eq!(Element::of_safetensors(element.name()), Some(element));
        }
    }

    #[test]
    fn windows_and_refusals() {
        let layout = PlainLayout::new(Element::I16, vec![2, 3]).unwrap();
        let data: Vec<u8> = (0i16..6).flat_map(|v| v.to_le_bytes()).collect();
        let mut out = [0f32; 3];
        layout.dequantize(&data, &[], 2, &mut out).unwrap();
        assert_eq!(out, [2.0, 3.0, 4.0]);
        assert!(layout.dequantize(&data, &[], 4, &mut out).is_err());
        assert!(layout.dequantize(&data[..6], &[], 0, &mut out[..]).is_ok());
        assert!(layout.dequantize(&data[..5], &[], 0, &mut out[..]).is_err());
        assert!(PlainLayout::new(Element::F64, vec![u64::MAX, 2]).is_none());
        assert!(PlainLayout::new(Element::F64, vec![u64::MAX / 4]).is_none());
    }
}
