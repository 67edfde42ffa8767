// float16 or bfloat16 x, weight, bias and out read and written in 16-byte words: eight
// values, two V, a word (KernelConfig.wide_words: plain rows whose width is a multiple of
// 8, weight and bias in the rows' dtype). The plain rows' path (normalize_wide) loads and
// stores whole words; read_x and its kin give the V at a V's index, half of a word, for the
// row's first value and the kernel's other paths. The prelude gives the word types and
// conversions of V (half.wgsl's pairs).

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> bias: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<u32>>;

// The word's first four values, and its last four.
fn lo_of(q: vec4<u32>) -> V {
    return x_value(q.xy);
}

fn hi_of(q: vec4<u32>) -> V {
    return x_value(q.zw);
}

fn half_of(q: vec4<u32>, at: u32) -> V {
    return select(lo_of(q), hi_of(q), (at & 1u) != 0u);
}

fn read_x(at: u32) -> V {
    return half_of(x[at >> 1u], at);
}

fn read_weight(at: u32) -> V {
    return half_of(weight[at >> 1u], at);
}

fn read_bias(at: u32) -> V {
    return half_of(bias[at >> 1u], at);
}

fn write_out(at: u32, y: V) {
    let w = x_word(y);
    let k = (at & 1u) * 2u;
    out[at >> 1u][k] = w.x;
    out[at >> 1u][k + 1u] = w.y;
}

// Word j of x, weight and bias; absent weight and bias give zeros (their placeholder
// binding is never read) and are not used (`affine`).
fn x_words(j: u32) -> vec4<u32> {
    return x[j];
}

fn weight_words(j: u32) -> vec4<u32> {
    if (HAS_WEIGHT) {
        return weight[j];
    }
    return vec4<u32>(0u);
}

fn bias_words(j: u32) -> vec4<u32> {
    if (HAS_BIAS) {
        return bias[j];
    }
    return vec4<u32>(0u);
}

fn write_out_words(j: u32, lo: V, hi: V) {
    out[j] = vec4<u32>(x_word(lo), x_word(hi));
}
