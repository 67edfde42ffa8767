// float16 or bfloat16 x and out with an even width: one V (2 or 4 values) is one XW of
// u32 pairs, so rows start on whole words and every thread writes whole words. Weight and
// bias are stored like x or as float32 (PW). The prelude gives the word types and
// x_value / x_word / p_value, the conversions between words and V (half.wgsl's pairs).

@group(0) @binding(0) var<storage, read> x: array<XW>;
@group(0) @binding(1) var<storage, read> weight: array<PW>;
@group(0) @binding(2) var<storage, read> bias: array<PW>;
@group(0) @binding(3) var<storage, read_write> out: array<XW>;

fn read_x(at: u32) -> V {
    return x_value(x[at]);
}

fn read_weight(at: u32) -> V {
    return p_value(weight[at]);
}

fn read_bias(at: u32) -> V {
    return p_value(bias[at]);
}

fn write_out(at: u32, y: V) {
    out[at] = x_word(y);
}
