//! Element types of the tensors names are learned between: a checkpoint's (by safetensors
//! dtype) and a model's dense tensors (by ExecuTorch scalar type, or a payload constant's
//! NumPy dtype), read one element at a time as `f64`, with the step their format has there.
//!
//! Invariants: `get` reads exactly `size()` bytes at `i × size()`, little-endian, and the
//! caller has checked they are in the slice; every value a float32 can hold converts to
//! `f64` exactly, so comparisons are not blurred by the conversion.

use crate::backend::float16::{bf16_to_f32, f16_to_f32};
use crate::backend::{float_spacing, view};

/// The element type of a dense tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
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

impl Elem {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            Elem::F64 | Elem::I64 | Elem::U64 => 8,
            Elem::F32 | Elem::I32 | Elem::U32 => 4,
            Elem::F16 | Elem::BF16 | Elem::I16 | Elem::U16 => 2,
            Elem::I8 | Elem::U8 | Elem::Bool => 1,
        }
    }

    /// The safetensors spelling (`"F32"`), which the report and the map use for every
    /// tensor.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F64 => "F64",
            Elem::F32 => "F32",
            Elem::F16 => "F16",
            Elem::BF16 => "BF16",
            Elem::I64 => "I64",
            Elem::I32 => "I32",
            Elem::I16 => "I16",
            Elem::I8 => "I8",
            Elem::U64 => "U64",
            Elem::U32 => "U32",
            Elem::U16 => "U16",
            Elem::U8 => "U8",
            Elem::Bool => "BOOL",
        }
    }

    /// The element type of a safetensors dtype; None for the types no value is compared
    /// in (8-bit and smaller floats, complex).
    pub fn from_safetensors(dtype: &str) -> Option<Elem> {
        Some(match dtype {
            "F64" => Elem::F64,
            "F32" => Elem::F32,
            "F16" => Elem::F16,
            "BF16" => Elem::BF16,
            "I64" => Elem::I64,
            "I32" => Elem::I32,
            "I16" => Elem::I16,
            "I8" => Elem::I8,
            "U64" => Elem::U64,
            "U32" => Elem::U32,
            "U16" => Elem::U16,
            "U8" => Elem::U8,
            "BOOL" => Elem::Bool,
            _ => return None,
        })
    }

    /// The element type of an ExecuTorch scalar type (docs/formats.md); None for the
    /// quantized and complex ones.
    pub fn from_scalar_type(scalar_type: i8) -> Option<Elem> {
        Some(match scalar_type {
            0 => Elem::U8,
            1 => Elem::I8,
            2 => Elem::I16,
            3 => Elem::I32,
            4 => Elem::I64,
            5 => Elem::F16,
            6 => Elem::F32,
            7 => Elem::F64,
            11 => Elem::Bool,
            15 => Elem::BF16,
            27 => Elem::U16,
            28 => Elem::U32,
            29 => Elem::U64,
            _ => return None,
        })
    }

    /// The element type of a little-endian (or byte-sized) NumPy `descr`, as payload
    /// constants give theirs; `|V2` is bfloat16.
    pub fn from_npy_descr(descr: &str) -> Option<Elem> {
        Some(match descr {
            "<f8" => Elem::F64,
            "<f4" => Elem::F32,
            "<f2" => Elem::F16,
            "|V2" => Elem::BF16,
            "<i8" => Elem::I64,
            "<i4" => Elem::I32,
            "<i2" => Elem::I16,
            "|i1" => Elem::I8,
            "<u8" => Elem::U64,
            "<u4" => Elem::U32,
            "<u2" => Elem::U16,
            "|u1" => Elem::U8,
            "|b1" => Elem::Bool,
            _ => return None,
        })
    }

    /// Element `i` of `bytes`; `bytes` holds at least `(i + 1) × size()` bytes.
    #[inline]
    pub fn get(self, bytes: &[u8], i: usize) -> f64 {
        let n = self.size();
        let b = &bytes[i * n..(i + 1) * n];
        match self {
            Elem::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
            Elem::F32 => f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes"))),
            Elem::F16 => f64::from(f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
            Elem::BF16 => f64::from(bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
            Elem::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Elem::I32 => f64::from(i32::from_le_bytes(b.try_into().expect("4 bytes"))),
            Elem::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            Elem::I8 => f64::from(b[0] as i8),
            Elem::U64 => u64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Elem::U32 => f64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))),
            Elem::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            Elem::U8 => f64::from(b[0]),
            Elem::Bool => f64::from(u8::from(b[0] != 0)),
        }
    }

    /// The step of this format around `v` (a value it holds): the spacing of a float
    /// format there, 0 for integers (which only match exactly). A float64 is compared in
    /// float32, the precision every stored value is read in.
    pub fn step(self, v: f32) -> f32 {
        match self {
            Elem::F64 | Elem::F32 => float_spacing(v, view::FLOAT32),
            Elem::F16 => float_spacing(v, view::FLOAT16),
            Elem::BF16 => float_spacing(v, view::BFLOAT16),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_type_little_endian() {
        let cases: [(Elem, Vec<u8>, f64); 13] = [
            (Elem::F64, 1.5f64.to_le_bytes().to_vec(), 1.5),
            (Elem::F32, (-2.25f32).to_le_bytes().to_vec(), -2.25),
            (Elem::F16, 0x3c00u16.to_le_bytes().to_vec(), 1.0),
            (Elem::BF16, 0xbf80u16.to_le_bytes().to_vec(), -1.0),
            (Elem::I64, (-7i64).to_le_bytes().to_vec(), -7.0),
            (Elem::I32, (-70000i32).to_le_bytes().to_vec(), -70000.0),
            (Elem::I16, (-300i16).to_le_bytes().to_vec(), -300.0),
            (Elem::I8, vec![0xff], -1.0),
            (Elem::U64, 9u64.to_le_bytes().to_vec(), 9.0),
            (Elem::U32, 70000u32.to_le_bytes().to_vec(), 70000.0),
            (Elem::U16, 65535u16.to_le_bytes().to_vec(), 65535.0),
            (Elem::U8, vec![200], 200.0),
            (Elem::Bool, vec![3], 1.0),
        ];
        for (elem, bytes, want) in cases {
            assert_eq!(bytes.len(), elem.size(), "{elem:?}");
            let mut two = vec![0u8; elem.size()];
            two.extend_from_slice(&bytes);
            assert_eq!(elem.get(&two, 1), want, "{elem:?}");
            assert_eq!(Elem::from_safetensors(elem.name()), Some(elem));
        }
        assert_eq!(Elem::from_safetensors("F8_E4M3"), None);
        assert_eq!(Elem::from_scalar_type(6), Some(Elem::F32));
        assert_eq!(Elem::from_scalar_type(15), Some(Elem::BF16));
        assert_eq!(Elem::from_npy_descr("|V2"), Some(Elem::BF16));
    }

    #[test]
    fn integers_have_no_step() {
        assert_eq!(Elem::I8.step(3.0), 0.0);
        assert_eq!(Elem::BF16.step(1.0), 2f32.powi(-7));
        assert_eq!(Elem::F64.step(1.0), f32::EPSILON);
    }
}
