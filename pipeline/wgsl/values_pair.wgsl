// A V of eight values, for half rows whose width is a multiple of 8: one 16-byte load
// (a vec4<u32> of half pairs) held as two vec4<f32>, so a half row moves as many bytes a
// load as a float32 row. WGSL has no operators on structs: the kernel's arithmetic on V
// (values_vector.wgsl) is spelled out here on both halves.

struct Pair {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn splat(s: f32) -> V {
    return Pair(vec4<f32>(s), vec4<f32>(s));
}

// (sum of d, sum of d^2) over v's components, d = component - center.
fn deviation(v: V, center: f32) -> vec2<f32> {
    let lo = v.lo - vec4<f32>(center);
    let hi = v.hi - vec4<f32>(center);
    let s = lo + hi;
    let q = lo * lo + hi * hi;
    return vec2<f32>(s.x + s.y + s.z + s.w, q.x + q.y + q.z + q.w);
}

// v normalized with the row's (mean, rstd), then scaled by w and shifted by b where the
// pipeline has them. NaN throughout for a non-finite row.
fn normalized(v: V, mean_rstd: vec2<f32>, w: V, b: V) -> V {
    var lo = (v.lo - vec4<f32>(mean_rstd.x)) * mean_rstd.y;
    var hi = (v.hi - vec4<f32>(mean_rstd.x)) * mean_rstd.y;
    if (HAS_WEIGHT) {
        lo = lo * w.lo;
        hi = hi * w.hi;
    }
    if (HAS_BIAS) {
        lo = lo + b.lo;
        hi = hi + b.hi;
    }
    return Pair(lo, hi);
}
