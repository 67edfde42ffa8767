// float16 and bfloat16 values, two to a u32 (the first in the low 16 bits, as in memory),
// converted to and from f32 in core WGSL: no `shader-f16` feature needed. The prelude's
// HALF says which: 1 float16, 2 bfloat16.
//
// Reading is exact: unpack2x16float for float16, and a bfloat16 is the top half of an
// f32's bits. Writing rounds to nearest, ties to even, overflow to infinity and NaN to a
// quiet NaN, in integer arithmetic: pack2x16float leaves both the rounding direction and
// values past float16's range to the implementation, and the output must be rounded once,
// as aten rounds it, on every adapter. Where the device probe (f16_pack_probe.wgsl) saw
// pack2x16float round exactly so, PACK2X16FLOAT stores float16 with it instead: one
// conversion instruction, 25-36% faster on the H200 (docs/measurements.md).

fn unpack_pair(word: u32) -> vec2<f32> {
    if (HALF == 2u) {
        return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
    }
    return unpack2x16float(word);
}

fn pack_pair(v: vec2<f32>) -> u32 {
    if (HALF == 2u) {
        return bfloat16_pair(v);
    }
    if (PACK2X16FLOAT) {
        return pack2x16float(v);
    }
    return float16_bits(v.x) | (float16_bits(v.y) << 16u);
}

// The 16 bits of `v` rounded to the pipeline's half dtype: the first of a pair.
fn half_bits(v: f32) -> u32 {
    return pack_pair(vec2<f32>(v, 0.0)) & 0xffffu;
}

// Both values rounded to bfloat16, the first in the low 16 bits. Adding 0x7fff plus the kept
// part's lowest bit rounds ties to even; a carry into the exponent is the correct rounding,
// up to infinity. A NaN keeps its sign and top payload and is set quiet. In vector
// operations, the NaN test a select and the second value's bits kept in place: the same
// bits as a value at a time, 1% faster over the model shapes on the H200, up to 2.3%
// (docs/measurements.md, "bfloat16 against the copy").
fn bfloat16_pair(v: vec2<f32>) -> u32 {
    let bits = bitcast<vec2<u32>>(v);
    let rounded = bits + vec2<u32>(0x7fffu) + ((bits >> vec2<u32>(16u)) & vec2<u32>(1u));
    let nan = (bits & vec2<u32>(0x7fffffffu)) > vec2<u32>(0x7f800000u);
    let kept = select(rounded, bits | vec2<u32>(0x00400000u), nan);
    return (kept.x >> 16u) | (kept.y & 0xffff0000u);
}

fn float16_bits(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    let sign = (bits >> 16u) & 0x8000u;
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return sign | 0x7e00u;  // NaN
    }
    if (magnitude >= 0x477ff000u) {
        return sign | 0x7c00u;  // 65520 and up round to infinity
    }
    if (magnitude >= 0x38800000u) {
        // Normal in float16 (2^-14 and up): rebias the exponent by 127 - 15, drop 13
        // mantissa bits rounding ties to even; a carry moves into the exponent correctly.
        let rebiased = magnitude - 0x38000000u;
        return sign | ((rebiased + 0x0fffu + ((rebiased >> 13u) & 1u)) >> 13u);
    }
    // Subnormal or zero: a count of 2^-24 steps, exact in f32 up to the rounding, which
    // WGSL's round() does to nearest even; 1024 steps is the smallest normal, 0x0400.
    return sign | u32(round(bitcast<f32>(magnitude) * 16777216.0));
}
