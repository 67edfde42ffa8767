// What the kernel computes on one V when V is f32, vec2<f32> or vec4<f32>: WGSL's own
// operators (values_pair.wgsl spells the same out for a V of eight half values).

fn splat(s: f32) -> V {
    return V(s);
}

// (sum of d, sum of d^2) over v's components, d = component - center.
fn deviation(v: V, center: f32) -> vec2<f32> {
    let d = v - V(center);
    return vec2<f32>(hsum(d), hsum(d * d));
}

// v normalized with the row's (mean, rstd), then scaled by w and shifted by b where the
// pipeline has them. NaN throughout for a non-finite row.
fn normalized(v: V, mean_rstd: vec2<f32>, w: V, b: V) -> V {
    var y = (v - V(mean_rstd.x)) * mean_rstd.y;
    if (HAS_WEIGHT) { y = y * w; }
    if (HAS_BIAS) { y = y + b; }
    return y;
}
