// native_layer_norm: out, mean and rstd of every row of a row-major (rows, width) tensor
// in one launch, matching aten.native_layer_norm for float32, float16 and bfloat16 rows
// (statistics in f32 whatever the dtype; each output value rounded once to its dtype).
//
// The runtime prepends the pipeline's constants (see pipeline/runtime/native_layer_norm.py):
//   alias V                 vec4<f32> when width % 4 == 0, vec2<f32> when width % 2 == 0,
//                           else f32 (one load = one V: loads as wide as rows stay aligned)
//   const VEC: u32          components in one V (4, 2 or 1)
//   fn hsum(v: V) -> f32    the sum of v's components, in order
//   const WORKGROUP: u32    threads per workgroup
//   const THREADS_PER_ROW   threads sharing one row, a power of two dividing WORKGROUP
//   const HAS_WEIGHT, HAS_BIAS: bool
//   const ROW_IN_SUBGROUP: bool all threads of a row share one subgroup (subgroup reduction)
//   const WIDTH: u32        elements per row (a pipeline serves one width: with the row's
//                           length known, bounds checks on whole rows fold away)
//   const ROW_VECS: u32     V values per row (WIDTH / VEC)
//   const HOLD: u32         0: rows streamed; k > 0: each thread holds k values of its row
//   const STEP: u32         streamed rows: values a thread loads in one loop step
// and writes out the lines marked `// each held value` HOLD times and those marked
// `// each step value` STEP times, K (and the suffix _K of names) becoming 0, 1, ...:
// loops over a private array, which Naga bounds with a counter of its own, were measured
// much slower than the same statements written out (benchmarks/NOTES.md, v4).
//
// Held rows (the row fits: at most 8 values for each of 256 threads): each thread loads
// its share once into registers, weight and bias with it, and takes a corrected two-pass
// (count, mean, M2) of it; the row's threads merge their triples pairwise (Chan et al.) in
// one reduction, and the output comes from the registers.
// Streamed rows: each thread walks its strided share twice, first merging every V's exact
// (count, mean, M2) into its own (Welford, by pairwise merges), then, after the same row
// merge, re-reading x (mostly from L2) to write the output.
// Never E[x^2] - E[x]^2.

struct Params {
    rows: u32,  // rows in this launch
    eps: f32,
    // A quiet NaN from the host: drivers may fold NaN-producing arithmetic in the shader.
    nan: f32,
}

// Bindings 0-3 (x, weight, bias, out) and their accessors read_x, read_weight, read_bias
// and write_out come from the storage file of the tensors' dtypes (storage_float32.wgsl,
// storage_half.wgsl, storage_half_odd.wgsl): the kernel computes in f32 whatever is stored.
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

const ROWS_PER_WORKGROUP: u32 = WORKGROUP / THREADS_PER_ROW;

fn is_finite(value: f32) -> bool {
    return (bitcast<u32>(value) & 0x7f800000u) != 0x7f800000u;
}

// A corrected M2 that rounding took below zero becomes 0; NaN and inf (squares past
// float32's range) stay, so the row gives NaN like aten rather than a finite wrong rstd.
// Tested on bits: `max(0.0, NaN)` is 0 on GPUs, and compilers may assume finite floats.
fn clamp_m2(m2: f32) -> f32 {
    return select(m2, 0.0, is_finite(m2) && (bitcast<u32>(m2) & 0x80000000u) != 0u);
}

// (count, mean, M2) of two disjoint parts of a row, combined. Every thread that merges a
// pair passes the same part as `a`, so all of them get bitwise-equal statistics.
fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    let share = select(0.0, b.x / n, n > 0.0);
    let delta = b.y - a.y;
    return vec3<f32>(n, a.y + delta * share, a.z + b.z + delta * delta * a.x * share);
}

// The entry point `main` and `row_stats(local, tid, lane)` (the merged (count, mean, M2) of
// the row's threads, given to each of them; called once by every thread of the workgroup,
// it may hold barriers) come from reduce_subgroup.wgsl or reduce_workgroup.wgsl.
fn normalize_rows(tid: u32, group: vec3<u32>, groups: vec3<u32>) {
    // Rows past 65,535 workgroups come through the y dimension of the grid.
    let row = (group.x + group.y * groups.x) * ROWS_PER_WORKGROUP + tid / THREADS_PER_ROW;
    if (HOLD > 0u) {
        normalize_held(tid, row);
    } else {
        normalize_streamed(tid, row);
    }
}

// (count, mean, M2) of one V, exact.
fn value_stats(v: V) -> vec3<f32> {
    let m = hsum(v) / f32(VEC);
    let d = v - V(m);
    return vec3<f32>(f32(VEC), m, hsum(d * d));
}

// Writes mean and rstd of `row` from its merged statistics; returns (mean, rstd). A row
// holding NaN or an infinity gives NaN out and rstd, like aten, and a mean of +-inf or NaN.
// Tested on bits, since compilers may assume finite floats.
fn finish_row(row: u32, lane: u32, stats: vec3<f32>) -> vec2<f32> {
    let finite = is_finite(stats.y) && is_finite(stats.z);
    let rstd_row = select(params.nan, 1.0 / sqrt(stats.z / f32(WIDTH) + params.eps), finite);
    if (lane == 0u) {
        mean[row] = stats.y;
        rstd[row] = rstd_row;
    }
    return vec2<f32>(stats.y, rstd_row);
}

// The V at index i of the row at `base`, zeros past the row's end or for a dead thread.
fn load_x(base: u32, i: u32, live: bool) -> V {
    if (live && i < ROW_VECS) {
        return read_x(base + i);
    }
    return V(0.0);
}

// (count, mean, M2) of the V at index i, none past the row's end or for a dead thread.
fn stats_at(v: V, i: u32, live: bool) -> vec3<f32> {
    return select(vec3<f32>(0.0), value_stats(v), live && i < ROW_VECS);
}

// Components the V at index i counts for (0 past the row's end or for a dead thread).
fn count_at(i: u32, live: bool) -> f32 {
    return select(0.0, f32(VEC), live && i < ROW_VECS);
}

// (sum of d, sum of d^2) with d = v - center, for the V at index i (zeros when absent).
fn deviation_at(v: V, i: u32, live: bool, center: f32) -> vec2<f32> {
    let d = select(V(0.0), v - V(center), live && i < ROW_VECS);
    return vec2<f32>(hsum(d), hsum(d * d));
}

fn weight_at(i: u32) -> V {
    if (HAS_WEIGHT && i < ROW_VECS) {
        return read_weight(i);
    }
    return V(1.0);
}

fn bias_at(i: u32) -> V {
    if (HAS_BIAS && i < ROW_VECS) {
        return read_bias(i);
    }
    return V(0.0);
}

fn store_out(base: u32, i: u32, v: V, mean_rstd: vec2<f32>, w: V, b: V) {
    if (i < ROW_VECS) {
        var y = (v - V(mean_rstd.x)) * mean_rstd.y;  // NaN throughout for a non-finite row
        if (HAS_WEIGHT) { y = y * w; }
        if (HAS_BIAS) { y = y + b; }
        write_out(base + i, y);
    }
}

fn normalize_held(tid: u32, row: u32) {
    let lane = tid % THREADS_PER_ROW;
    let live = row < params.rows;
    let base = row * ROW_VECS;
    let v_K = load_x(base, lane + K * THREADS_PER_ROW, live);  // each held value
    let w_K = weight_at(lane + K * THREADS_PER_ROW);  // each held value
    let b_K = bias_at(lane + K * THREADS_PER_ROW);  // each held value
    var count = 0.0;
    var sum = 0.0;
    count += count_at(lane + K * THREADS_PER_ROW, live);  // each held value
    sum += hsum(v_K);  // each held value
    let first_mean = select(0.0, sum / count, count > 0.0);
    // Second pass about the first mean, corrected by the rounding of that mean.
    var dev = vec2<f32>(0.0);
    dev += deviation_at(v_K, lane + K * THREADS_PER_ROW, live, first_mean);  // each held value
    let shift = select(0.0, dev.x / count, count > 0.0);
    let local = vec3<f32>(count, first_mean + shift, clamp_m2(dev.y - dev.x * shift));
    // Threads past the last row take part in the merge too; they only skip memory.
    let stats = row_stats(local, tid, lane);
    if (!live) {
        return;
    }
    let mean_rstd = finish_row(row, lane, stats);
    store_out(base, lane + K * THREADS_PER_ROW, v_K, mean_rstd, w_K, b_K);  // each held value
}

fn normalize_streamed(tid: u32, row: u32) {
    let lane = tid % THREADS_PER_ROW;
    let live = row < params.rows;
    let base = row * ROW_VECS;
    var local = vec3<f32>(0.0, 0.0, 0.0);
    for (var at = lane; live && at < ROW_VECS; at += STEP * THREADS_PER_ROW) {
        let v_K = load_x(base, at + K * THREADS_PER_ROW, true);  // each step value
        local = merge(local, stats_at(v_K, at + K * THREADS_PER_ROW, true));  // each step value
    }
    // Threads past the last row take part in the merge too; they only skip memory.
    let stats = row_stats(local, tid, lane);
    if (!live) {
        return;
    }
    let mean_rstd = finish_row(row, lane, stats);
    for (var at = lane; at < ROW_VECS; at += STEP * THREADS_PER_ROW) {
        let v_K = load_x(base, at + K * THREADS_PER_ROW, true);  // each step value
        let i_K = at + K * THREADS_PER_ROW;  // each step value
        store_out(base, i_K, v_K, mean_rstd, weight_at(i_K), bias_at(i_K));  // each step value
    }
}
