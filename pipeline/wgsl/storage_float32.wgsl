// float32 x, weight, bias and out: one V per array element, read and written as is.

@group(0) @binding(0) var<storage, read> x: array<V>;
@group(0) @binding(1) var<storage, read> weight: array<V>;
@group(0) @binding(2) var<storage, read> bias: array<V>;
@group(0) @binding(3) var<storage, read_write> out: array<V>;

fn read_x(at: u32) -> V {
    return x[at];
}

fn read_weight(at: u32) -> V {
    return weight[at];
}

fn read_bias(at: u32) -> V {
    return bias[at];
}

fn write_out(at: u32, y: V) {
    out[at] = y;
}
