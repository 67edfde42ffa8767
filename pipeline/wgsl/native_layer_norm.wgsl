// native_layer_norm: out, mean and rstd of every row of a row-major (rows, width) tensor
// in one launch, matching aten.native_layer_norm for float32.
//
// The runtime prepends the pipeline's constants (see pipeline/runtime/native_layer_norm.py):
//   alias V                 vec4<f32> when a row or a block of rows spans whole vec4s, else
//                           f32 (one load = one V)
//   alias A                 weight and bias elements: V, or f32 for blocks of rows
//   fn as_v(vec4<f32>) -> V the vec4 itself, or its .x where V is f32
//   const VEC: u32          components in one V (4 or 1)
//   const WORKGROUP: u32    threads per workgroup
//   const ROWS_PER_BLOCK    1, or the rows (2 or 4) of a block for widths not a multiple of 4
//   const THREADS_PER_ROW   threads sharing one row (one block of rows), a power of two
//                           dividing WORKGROUP
//   const HAS_WEIGHT, HAS_BIAS: bool
//   const ROW_IN_SUBGROUP: bool all threads of a row share one subgroup (subgroup reduction)
//   const WIDTH: u32        elements per row (a pipeline serves one width: with the row's
//                           length known, bounds checks on whole rows fold away)
//   const ROW_VECS: u32     V values per row (per block: WIDTH * ROWS_PER_BLOCK / VEC)
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
// Blocks of rows (ROWS_PER_BLOCK > 1), for widths not a multiple of 4: 4 rows of an odd
// width, or 2 of a width = 2 mod 4, start on a vec4 boundary and span whole vec4s, so the
// block is held, loaded and stored in vec4s like a row of a width that is a multiple of 4.
// Component j of the block's vec4 i is element 4i + j of the block, in its row
// (4i + j) / WIDTH; statistics are summed per row (row k of the block in component k of a
// vec4) in a corrected two-pass over the whole row: sums, then the sums of deviations
// and of their squares about the first means. Weight and bias are read per element.
// Never E[x^2] - E[x]^2.

struct Params {
    rows: u32,  // rows in this launch
    eps: f32,
    // A quiet NaN from the host: drivers may fold NaN-producing arithmetic in the shader.
    nan: f32,
}

@group(0) @binding(0) var<storage, read> x: array<V>;
@group(0) @binding(1) var<storage, read> weight: array<A>;
@group(0) @binding(2) var<storage, read> bias: array<A>;
@group(0) @binding(3) var<storage, read_write> out: array<V>;
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

const BLOCKS_PER_WORKGROUP: u32 = WORKGROUP / THREADS_PER_ROW;
// Workgroup memory of the reductions (reduce_*.wgsl): (count, mean, M2) triples for rows,
// three rounds of per-row sums for blocks of rows; one slot for the path not taken.
const TRIPLE_SLOTS: u32 = select(1u, WORKGROUP, ROWS_PER_BLOCK == 1u);
const SUM_SLOTS: u32 = select(1u, 3u * WORKGROUP, ROWS_PER_BLOCK > 1u);

fn is_finite(value: f32) -> bool {
    return (bitcast<u32>(value) & 0x7f800000u) != 0x7f800000u;
}

fn hsum(v: V) -> f32 {
    // vec4<f32>(v) splats a scalar, so only .x is meaningful when VEC == 1.
    let w = vec4<f32>(v);
    return select(w.x, w.x + w.y + w.z + w.w, VEC == 4u);
}

// (count, mean, M2) of two disjoint parts of a row, combined. Every thread that merges a
// pair passes the same part as `a`, so all of them get bitwise-equal statistics.
fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    let share = select(0.0, b.x / n, n > 0.0);
    let delta = b.y - a.y;
    return vec3<f32>(n, a.y + delta * share, a.z + b.z + delta * delta * a.x * share);
}

// The entry point `main`, `row_stats(local, tid, lane)` (the merged (count, mean, M2) of
// the row's threads, given to each of them) and `row_sums(v, tid, lane, round)` (the sum of
// the block's threads' v, given to each of them) come from reduce_subgroup.wgsl or
// reduce_workgroup.wgsl; every thread of the workgroup calls them (they may hold barriers).
fn normalize_rows(tid: u32, group: vec3<u32>, groups: vec3<u32>) {
    // Rows past 65,535 workgroups come through the y dimension of the grid.
    let block = (group.x + group.y * groups.x) * BLOCKS_PER_WORKGROUP + tid / THREADS_PER_ROW;
    if (ROWS_PER_BLOCK > 1u) {
        normalize_blocks(tid, block);
    } else if (HOLD > 0u) {
        normalize_held(tid, block);
    } else {
        normalize_streamed(tid, block);
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
        return x[base + i];
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

fn weight_at(i: u32) -> A {
    if (HAS_WEIGHT && i < ROW_VECS) {
        return weight[i];
    }
    return A(1.0);
}

fn bias_at(i: u32) -> A {
    if (HAS_BIAS && i < ROW_VECS) {
        return bias[i];
    }
    return A(0.0);
}

fn store_out(base: u32, i: u32, v: V, mean_rstd: vec2<f32>, w: A, b: A) {
    if (i < ROW_VECS) {
        var y = (v - V(mean_rstd.x)) * mean_rstd.y;  // NaN throughout for a non-finite row
        if (HAS_WEIGHT) { y = y * w; }
        if (HAS_BIAS) { y = y + b; }
        out[base + i] = y;
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
    let local = vec3<f32>(count, first_mean + shift, max(0.0, dev.y - dev.x * shift));
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

// Row in the block of each component of the block's vec4 i; ROWS_PER_BLOCK (no row) for
// all four when the vec4 is past the block or starts in a row past the last.
fn rows_in_block(first_row: u32, i: u32) -> vec4<u32> {
    let row = (vec4<u32>(4u * i) + vec4<u32>(0u, 1u, 2u, 3u)) / WIDTH;
    let live = i < ROW_VECS && first_row + row.x < params.rows;
    return select(vec4<u32>(ROWS_PER_BLOCK), row, live);
}

// The block's vec4 i, zeros when `rows` says it is not live. (The block functions speak
// vec4<f32> so that they also compile where V is f32 and they are never called.)
fn load_block(base: u32, i: u32, rows: vec4<u32>) -> vec4<f32> {
    if (rows.x < ROWS_PER_BLOCK) {
        return vec4<f32>(x[base + i]);
    }
    return vec4<f32>(0.0);
}

fn add4(v: vec4<f32>) -> f32 {
    return v.x + v.y + v.z + v.w;
}

// Component k of the result: the sum of the components of v in row k of the block.
// Selected, not multiplied by a mask, so that a NaN stays in its own row.
fn per_row(v: vec4<f32>, rows: vec4<u32>) -> vec4<f32> {
    let none = vec4<f32>(0.0);
    var sums = vec4<f32>(0.0);
    sums.x = add4(select(none, v, rows == vec4<u32>(0u)));
    sums.y = add4(select(none, v, rows == vec4<u32>(1u)));
    if (ROWS_PER_BLOCK > 2u) {
        sums.z = add4(select(none, v, rows == vec4<u32>(2u)));
        sums.w = add4(select(none, v, rows == vec4<u32>(3u)));
    }
    return sums;
}

// Per-row values (component k for row k) spread to the components of a vec4 by their rows.
fn spread(per: vec4<f32>, rows: vec4<u32>) -> vec4<f32> {
    var v = select(vec4<f32>(per.x), vec4<f32>(per.y), rows == vec4<u32>(1u));
    if (ROWS_PER_BLOCK > 2u) {
        v = select(v, vec4<f32>(per.z), rows == vec4<u32>(2u));
        v = select(v, vec4<f32>(per.w), rows == vec4<u32>(3u));
    }
    return v;
}

// An element of weight or bias (A is f32 for blocks; the .x only makes this compile where
// A is a vec4 and blocks are not used).
fn element(a: A) -> f32 {
    return vec4<f32>(a).x;
}

// Weight (or bias, `which` 1) of each component of the block's vec4 i, read per element.
fn affine_in_block(i: u32, which: u32) -> vec4<f32> {
    let c = (vec4<u32>(4u * i) + vec4<u32>(0u, 1u, 2u, 3u)) % WIDTH;
    if (which == 0u) {
        if (!HAS_WEIGHT) { return vec4<f32>(1.0); }
        return vec4<f32>(element(weight[c.x]), element(weight[c.y]), element(weight[c.z]), element(weight[c.w]));
    }
    if (!HAS_BIAS) { return vec4<f32>(0.0); }
    return vec4<f32>(element(bias[c.x]), element(bias[c.y]), element(bias[c.z]), element(bias[c.w]));
}

fn store_block(base: u32, i: u32, rows: vec4<u32>, v: vec4<f32>, mean_rows: vec4<f32>, rstd_rows: vec4<f32>,
               w: vec4<f32>, b: vec4<f32>) {
    if (rows.x < ROWS_PER_BLOCK) {
        var y = (v - spread(mean_rows, rows)) * spread(rstd_rows, rows);
        if (HAS_WEIGHT) { y = y * w; }
        if (HAS_BIAS) { y = y + b; }
        out[base + i] = as_v(y);  // components of rows past the last land in the buffer's padding
    }
}

fn normalize_blocks(tid: u32, block: u32) {
    let lane = tid % THREADS_PER_ROW;
    let first_row = block * ROWS_PER_BLOCK;
    let base = block * ROW_VECS;
    let r_K = rows_in_block(first_row, lane + K * THREADS_PER_ROW);  // each held value
    let v_K = load_block(base, lane + K * THREADS_PER_ROW, r_K);  // each held value
    let w_K = affine_in_block(lane + K * THREADS_PER_ROW, 0u);  // each held value
    let b_K = affine_in_block(lane + K * THREADS_PER_ROW, 1u);  // each held value
    var sum = vec4<f32>(0.0);
    sum += per_row(v_K, r_K);  // each held value
    let first_mean = row_sums(sum, tid, lane, 0u) / f32(WIDTH);
    // Second pass about the first means, corrected by the rounding of those means.
    var dev = vec4<f32>(0.0);
    var dev_sq = vec4<f32>(0.0);
    let d_K = v_K - spread(first_mean, r_K);  // each held value
    dev += per_row(d_K, r_K);  // each held value
    dev_sq += per_row(d_K * d_K, r_K);  // each held value
    let dev_sum = row_sums(dev, tid, lane, 1u);
    let shift = dev_sum / f32(WIDTH);
    let m2 = max(vec4<f32>(0.0), row_sums(dev_sq, tid, lane, 2u) - dev_sum * shift);
    if (first_row >= params.rows) {
        return;
    }
    let mean_rows = first_mean + shift;
    let exponent = vec4<u32>(0x7f800000u);
    let finite = ((bitcast<vec4<u32>>(mean_rows) & exponent) != exponent)
        & ((bitcast<vec4<u32>>(m2) & exponent) != exponent);
    let rstd_rows = select(vec4<f32>(params.nan), 1.0 / sqrt(m2 / f32(WIDTH) + params.eps), finite);
    if (lane == 0u) {
        for (var k = 0u; k < ROWS_PER_BLOCK && first_row + k < params.rows; k++) {
            mean[first_row + k] = mean_rows[k];
            rstd[first_row + k] = rstd_rows[k];
        }
    }
    store_block(base, lane + K * THREADS_PER_ROW, r_K, v_K, mean_rows, rstd_rows, w_K, b_K);  // each held value
}
