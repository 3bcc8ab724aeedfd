//! IEEE half and bfloat16 conversions, branch-light so the loops that call them vectorize.

/// bfloat16 is the upper half of a float32: widening is exact.
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Round to nearest, ties to even; NaN stays NaN.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let bits = f.to_bits();
    if f.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// What the XNNPACK runtime makes of an inline fp32 blockwise scale
/// (`XNNCompiler.cpp`, `convertF32TensorToBF16`): scaled by 1.00389105 so that the truncation
/// that follows rounds, then truncated to bfloat16.
#[inline]
pub fn runtime_f32_to_bf16(f: f32) -> u16 {
    // The runtime's literal 1.00389105f is this same float32.
    ((f * 1.003_891_f32).to_bits() >> 16) as u16
}

/// IEEE binary16 to binary32, exact (subnormals, infinities and NaN included).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    const MAGIC: f32 = f32::from_bits(113 << 23);
    const SHIFTED_EXP: u32 = 0x7c00 << 13;
    let mut o = u32::from(h & 0x7fff) << 13;
    let exp = SHIFTED_EXP & o;
    o += (127 - 15) << 23;
    if exp == SHIFTED_EXP {
        // Infinity or NaN: the exponent is all ones in the result too.
        o += (128 - 16) << 23;
    } else if exp == 0 {
        // Zero or subnormal: renormalize through a float subtraction.
        o += 1 << 23;
        o = (f32::from_bits(o) - MAGIC).to_bits();
    }
    f32::from_bits(o | (u32::from(h & 0x8000) << 16))
}

/// IEEE binary32 to binary16, round to nearest, ties to even; overflow gives infinity.
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    const F32_INFINITY: u32 = 255 << 23;
    const F16_OVERFLOW: u32 = (127 + 16) << 23;
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let mut u = f.to_bits();
    let sign = u & 0x8000_0000;
    u ^= sign;
    let o = if u >= F16_OVERFLOW {
        if u > F32_INFINITY {
            0x7e00
        } else {
            0x7c00
        }
    } else if u < (113 << 23) {
        // Result is subnormal or zero: let the float adder do the rounding.
        let v = f32::from_bits(u) + f32::from_bits(DENORM_MAGIC);
        v.to_bits() - DENORM_MAGIC
    } else {
        let mantissa_odd = (u >> 13) & 1;
        // Rebias the exponent (15 - 127) and add the rounding bias.
        u = u
            .wrapping_add(0xc800_0000)
            .wrapping_add(0xfff + mantissa_odd);
        u >> 13
    };
    (o | (sign >> 16)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x3ff != 0);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn half_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        // 1 + 2^-11 is halfway between 1 and the next half: ties to even (1).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 1);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bfloat16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        // Halfway cases go to the even neighbour.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        for b in [0x0080u16, 0x3f80, 0x4049, 0x7f7f, 0xbf80] {
            assert_eq!(f32_to_bf16(bf16_to_f32(b)), b);
            // A value that is already bfloat16 survives the runtime's conversion.
            assert_eq!(runtime_f32_to_bf16(bf16_to_f32(b)), b);
        }
    }
}
