// float16 or bfloat16 x and out with an odd width (V is f32): rows start in the middle
// of a u32 every other row, so values are addressed one by one, and the two halves of an
// out word, which may belong to two threads (or two rows), are written with atomics: each
// thread clears and sets only its own 16 bits. Weight and bias start every row at 0; the
// prelude's param_at reads value `at` from its word (half pairs, or float32 words).

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> weight: array<PW>;
@group(0) @binding(2) var<storage, read> bias: array<PW>;
@group(0) @binding(3) var<storage, read_write> out: array<atomic<u32>>;

// The word of a 16-bit value `at` of a half array, or of a 32-bit one.
fn word_of(at: u32, half: bool) -> u32 {
    return select(at, at >> 1u, half);
}

fn read_x(at: u32) -> f32 {
    return unpack_pair(x[at >> 1u])[at & 1u];
}

fn read_weight(at: u32) -> f32 {
    return param_at(weight[word_of(at, PARAMS_HALF)], at);
}

fn read_bias(at: u32) -> f32 {
    return param_at(bias[word_of(at, PARAMS_HALF)], at);
}

fn write_out(at: u32, y: f32) {
    let shift = (at & 1u) * 16u;
    atomicAnd(&out[at >> 1u], ~(0xffffu << shift));
    atomicOr(&out[at >> 1u], half_bits(y) << shift);
}
