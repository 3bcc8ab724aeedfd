//! Elements of the tensors names are learned between (a checkpoint's, by safetensors dtype;
//! a model's dense tensors, by ExecuTorch scalar type or a payload constant's NumPy dtype),
//! read one at a time as `f64`, with the step their format has there. The element types
//! themselves are `backend::plain::Element`, shared with the float32 views.
//!
//! Invariants: `get` reads exactly `size()` bytes at `i × size()`, little-endian, and the
//! caller has checked they are in the slice; every value a float32 can hold converts to
//! `f64` exactly, so comparisons are not blurred by the conversion.

use crate::backend::float16::{bf16_to_f32, f16_to_f32};
pub use crate::backend::plain::Element as Elem;
use crate::backend::{float_spacing, view};

/// What matching reads of an element type beyond what the float32 views read.
pub trait ElemRead {
    /// Element `i` of `bytes`; `bytes` holds at least `(i + 1) × size()` bytes.
    fn get(self, bytes: &[u8], i: usize) -> f64;
    /// The step of this format around `v` (a value it holds): the spacing of a float format
    /// there, 0 for integers (which only match exactly). A float64 is compared in float32,
    /// the precision every stored value is read in.
    fn step(self, v: f32) -> f32;
}

impl ElemRead for Elem {
    #[inline]
    fn get(self, bytes: &[u8], i: usize) -> f64 {
        let n = self.size() as usize;
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

    fn step(self, v: f32) -> f32 {
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
            assert_eq!(bytes.len() as u64, elem.size(), "{elem:?}");
            let mut two = vec![0u8; bytes.len()];
            two.extend_from_slice(&bytes);
            assert_eq!(elem.get(&two, 1), want, "{elem:?}");
            assert_eq!(Elem::of_safetensors(elem.name()), Some(elem));
        }
        assert_eq!(Elem::of_safetensors("F8_E4M3"), None);
        assert_eq!(Elem::of_scalar_type(6), Some(Elem::F32));
        assert_eq!(Elem::of_scalar_type(15), Some(Elem::BF16));
        assert_eq!(Elem::of_npy_descr("|V2"), Some(Elem::BF16));
    }

    #[test]
    fn integers_have_no_step() {
        assert_eq!(Elem::I8.step(3.0), 0.0);
        assert_eq!(Elem::BF16.step(1.0), 2f32.powi(-7));
        assert_eq!(Elem::F64.step(1.0), f32::EPSILON);
    }
}
