// native_layer_norm: out, mean and rstd of every row of a row-major (rows, width) tensor
// in one launch, matching aten.native_layer_norm for float32, float16 and bfloat16 rows
// (statistics in f32 whatever the dtype; each output value rounded once to its dtype).
// With RMS, the same rows give aten.rms_norm's out: x * rsqrt(mean(x^2) + eps) * weight.
//
// The runtime prepends the pipeline's constants (see pipeline/runtime/launch.py):
//   alias V                 vec4<f32> when width % 4 == 0, vec2<f32> when width % 2 == 0,
//                           else f32 (one load = one V: loads as wide as rows stay aligned)
//   const VEC: u32          components in one V (4, 2 or 1)
//   fn hsum(v: V) -> f32    the sum of v's components, in order
//   fn first_value(v: V) -> f32  v's first component
//   const WORKGROUP: u32    threads per workgroup
//   const THREADS_PER_ROW   threads sharing one row, a power of two dividing WORKGROUP
//   const HAS_WEIGHT, HAS_BIAS: bool
//   const ROW_IN_SUBGROUP: bool all threads of a row share one subgroup (subgroup reduction)
//   const WIDTH: u32        elements per row (a pipeline serves one width: with the row's
//                           length known, bounds checks on whole rows fold away)
//   const ROW_VECS: u32     V values per row (WIDTH / VEC)
//   const HOLD: u32         0: rows streamed; k > 0: each thread holds k values of its row
//   const STEP: u32         streamed rows: values a thread loads in one loop step
//   const WRITE_STATS: bool mean and rstd stored (a caller that uses only out does without)
//   const RMS: bool         RMSNorm: the row is not centred (its frame's first value, mean_d
//                           and the mean's correction are 0), M2 is the sum of x^2, and the
//                           row's statistics are rms_norm's (finish_row); no bias, no stats
// and writes out the lines marked `// each held value` HOLD times, those marked `// each held
// value, weight and bias with x` HOLD times where its config's late_affine is false and
// those marked `... at the store` where it is true (config.py), those marked `// each held
// value, squares after the mean` HOLD times where its squares_with_correction is false and
// those marked `... squares with the correction` where it is true (and the lines marked
// `// squares with the correction` then once), those marked `// each plain value` HOLD
// times where its plain_two_pass is true (and then the frame's held lines none: the call
// marked `// plain rows` is written instead of the one marked `// rows in their frame`), or
// where its wide_words is also true those marked `// each 16-byte word` HOLD / 2 times (and
// the call marked `// plain rows in 16-byte words` instead of the plain rows' ones), and
// those marked `// each step value` STEP times, K (and the suffix _K of names) becoming 0,
// 1, ...: loops over a private array, which Naga bounds with a counter of its own, were
// measured much slower than the same statements written out (docs/measurements.md, "How the
// kernel got here").
//
// Statistics in the row's frame: each value x enters them as d = x * scale - first * scale,
// `first` the row's first value and `scale` 1, or 2^-8 where |first| >= 1 (row_frame); the
// row's mean is first + mean(d) / scale and its M2 is M2(d) / scale^2, both scalings exact
// (unframed). Taken of x itself, the statistics went wrong three ways:
// - a constant row has every d exactly 0, so its mean is its value, its M2 exactly 0 and
//   its output exactly 0 (+ bias) whatever its split over threads; eps = 0 then gives rstd
//   inf and out NaN, as aten does. The threads' means of x weighed by count / width,
//   inexact where a row does not split evenly, took a constant row of 1e10 at width 2049
//   one ulp off its value: out +-1.
// - a row of large mean and small spread is summed as small values: summed as x, streamed
//   rows' means came out up to 109x aten's error from float64, out 46x and rstd 17x (mean
//   -3e4, sd 1e-3; benchmarks/streamed_rows.py).
// - d stays below float32's limit, and so do the sums and means of d a thread takes (of at
//   most 32 values held, or means): a finite row's mean stays finite wherever |first| >= 1
//   (x's own sums took a row of 3e38s to inf and its mean to NaN). Only M2, of squares,
//   can overflow, and the row's out and rstd are then NaN (clamp_m2, finish_row).
// Each thread first takes the mean of its own share of d; the row's first sum, of mean x
// count / width over its threads (row_mean), gives mean_d. Its second sums (mean - mean_d)
// x count / width and the squares of d - mean_d over the threads: the first is what the
// first sum's roundings left out of mean_d (added back, it keeps the mean's error at the
// mean's own scale where first lies far from it; summed from the threads' means, its
// rounding errors are independent from thread to thread) and corrects M2 about mean_d
// (m2_about):
// - held rows (the row fits: at most 8 values for each of 256 threads): the thread loads its
//   share once into registers, weight and bias with it (or, where it holds 20 values or
//   more, at the store: late_affine in config.py), and takes its mean in a corrected
//   two-pass; its squares (in that second pass for half rows) and the output come from the
//   registers. Held half rows of a launch that stores no mean and rstd take a plain
//   two-pass instead (normalize_plain).
// - streamed rows: the thread walks its strided share, merging every V's exact (count,
//   mean, M2) into its own (Welford, by pairwise merges, the mean compensated); its squares
//   are M2 + count x (mean - mean_d)^2; then the thread walks its share again, re-reading
//   x (mostly from L2), to write the output.
// Never E[x^2] - E[x]^2. Each sum over the row's threads is one butterfly of additions
// (row_sum). A constant row gives its value as the mean and an M2 of exactly 0 however a
// compiler contracts the arithmetic (the H200's did, into a nonzero M2, when M2 came from
// the threads' means of x): its d are all 0.
//
// Why sums and not one pairwise merge of the threads' (count, mean, M2) (Chan et al.): a
// merge costs each thread a division and a dozen more instructions at each butterfly
// level, a sum a shuffle and an add. On the H200 the sums are 1% faster in float32 and 4%
// in float16 over the model shapes (up to 13%), and rstd comes out 2-4x closer to float64
// (docs/measurements.md).

struct Params {
    rows: u32,  // rows in this launch
    eps: f32,
    // A quiet NaN from the host: drivers may fold NaN-producing arithmetic in the shader.
    nan: f32,
    // 0 from the host, a value no compiler can see (opaque).
    zero: u32,
}

// Bindings 0-3 (x, weight, bias, out) and their accessors read_x, read_weight, read_bias
// and write_out come from the storage file of the tensors' dtypes (storage_float32.wgsl,
// storage_half.wgsl, storage_half_odd.wgsl): the kernel computes in f32 whatever is stored.
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

const ROWS_PER_WORKGROUP: u32 = WORKGROUP / THREADS_PER_ROW;
// Every thread of a row holds as many of its values (dead threads read the last row): its
// mean weighs 1 / THREADS_PER_ROW in the row's, a power of two, so scaling is exact.
const EVEN_SPLIT: bool = ROW_VECS % THREADS_PER_ROW == 0u;
const EVEN_SHARE: f32 = 1.0 / f32(THREADS_PER_ROW);
const INV_WIDTH: f32 = 1.0 / f32(WIDTH);

fn is_finite(value: f32) -> bool {
    return (bitcast<u32>(value) & 0x7f800000u) != 0x7f800000u;
}

// v, as no compiler can prove it to be: its bits xor the host's 0. The H200's compiler
// folds (a - (a + b)) + b to 0, and with it what the sum a + b dropped in rounding (Fast2Sum,
// Knuth's two-sum); a sum passed through here keeps that. Without it the merges' low part
// was lost on the H200: forced-streamed half rows of mean 0 came out 2.3-5.7x eager's error
// in their float32 mean (docs/measurements.md, "Accuracy on the H200").
fn opaque(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) ^ params.zero);
}

// The normalized values y of a row whose rstd r is NaN (a NaN or inf in the row) as NaN,
// tested on bits. y = e * r is NaN there only as long as no compiler folds e: at width 1
// the mean of d is d itself, and e = d - mean_d, then 0 * r, fold to 0 where NaN is assumed
// away (lavapipe; the H200 through wgpu and Dawn), which gave the bias for a NaN row. Wider
// rows need no test (nothing folds there; the select cost 0.9% on the H200) and, WIDTH a
// constant, have none.
fn nan_row(y: V, r: f32) -> V {
    if (WIDTH != 1u) {
        return y;
    }
    return select(y, V(r), (bitcast<u32>(r) & 0x7fffffffu) > 0x7f800000u);
}

// A corrected M2 that rounding took below zero becomes 0; NaN and inf (squares past
// float32's range) stay, so the row gives NaN like aten rather than a finite wrong rstd.
// Tested on bits: `max(0.0, NaN)` is 0 on GPUs, and compilers may assume finite floats.
fn clamp_m2(m2: f32) -> f32 {
    return select(m2, 0.0, is_finite(m2) && (bitcast<u32>(m2) & 0x80000000u) != 0u);
}

// (count, mean, M2, low) of a streamed thread's share so far merged with the (count,
// mean, M2) of a disjoint part: the mean is y + w, w gathering what rounding y drops at
// each step (Fast2Sum), so that the share's mean of d holds more than y's precision.
fn merge(a: vec4<f32>, b: vec3<f32>) -> vec4<f32> {
    let n = a.x + b.x;
    let share = select(0.0, b.x / n, n > 0.0);
    let delta = (b.y - a.y) - a.w;
    let step = delta * share;
    let mean = opaque(a.y + step);
    return vec4<f32>(n, mean, a.z + b.z + delta * delta * a.x * share, a.w + ((a.y - mean) + step));
}

// The entry point `main` and `row_sum(value, tid, lane, step, lanes)` (the sum of `value`
// over the row's threads, the same bits given to each of them; called by every thread of the
// workgroup once per step, 0 then 1, it may hold barriers) come from reduce_subgroup.wgsl or
// reduce_workgroup.wgsl. `lanes`, the subgroup size from the entry point's builtin (0 on the
// workgroup-memory path), is passed down as a parameter so that Tint can prove the shuffles'
// control flow uniform.
fn normalize_rows(tid: u32, group: vec3<u32>, groups: vec3<u32>, lanes: u32) {
    // Rows past 65,535 workgroups come through the y dimension of the grid.
    let row = (group.x + group.y * groups.x) * ROWS_PER_WORKGROUP + tid / THREADS_PER_ROW;
    if (HOLD > 0u) {
        normalize_held(tid, row, lanes);  // rows in their frame
        normalize_plain(tid, row, lanes);  // plain rows
        normalize_wide(tid, row, lanes);  // plain rows in 16-byte words
    } else {
        normalize_streamed(tid, row, lanes);
    }
}

// (first * scale, scale) of the row at `base`, `first` its first value (see the header):
// 2^-8 keeps any value's d, and the sums and means of at most 32 of them, under float32's
// limit; rows starting below 1 keep a scale of 1, so that their squares and subnormals are
// not pushed further toward underflow. Threads past the last row read the last row's.
fn row_frame(base: u32) -> vec2<f32> {
    if (RMS) {
        return vec2<f32>(0.0, 1.0);
    }
    let first = first_value(read_x(base));
    let scale = select(1.0, 1.0 / 256.0, abs(first) >= 1.0);
    return vec2<f32>(first * scale, scale);
}

// d = v * scale - first * scale, zeros past the row's end.
fn framed(v: V, in_row: bool, frame: vec2<f32>) -> V {
    return select(V(0.0), v * frame.y - V(frame.x), in_row);
}

// (mean, M2) of x from mean_d (the row's first sum) + `correction` and M2 of d.
// first * scale + mean_d is taken with what its rounding drops (Knuth's two-sum), the
// correction added to that, so the mean rounds once at its own scale: where the mean is
// near 0 and first is not, mean_d (~ -first) alone would hold it only to first's ulp.
fn unframed(frame: vec2<f32>, mean_d: f32, correction: f32, m2_d: f32) -> vec2<f32> {
    let sum = opaque(frame.x + mean_d);
    let back = sum - frame.x;
    let dropped = (frame.x - (sum - back)) + (mean_d - back);
    let unscale = 1.0 / frame.y;
    return vec2<f32>((sum + (dropped + correction)) * unscale, m2_d * unscale * unscale);
}

// How the output centres x, as (x * a - b - c) * r, from the row's frame, its centre in d
// (mean_d + correction), its mean and M2, and rstd. A row far from zero (|mean| > 4 std)
// is centred in d = x * scale - first * scale, exact there (each x within 2x of first), at
// the centre in d, which holds far more of the mean than x's own ulp: at 1e4 +- 1e-2 the
// mean's float32 rounding alone is 5% of the spread, and out went 0.2 off where this gives
// 1e-6. Other rows centre x at the mean, whose rounding is small beside their spread and
// which stays right where first is an outlier of the row (d then rounds at first's ulp).
fn centring(frame: vec2<f32>, centre_d: f32, stats: vec2<f32>, rstd_row: f32) -> vec4<f32> {
    let far = stats.x * stats.x * f32(WIDTH) > 16.0 * stats.y;
    return select(vec4<f32>(1.0, stats.x, 0.0, rstd_row),
                  vec4<f32>(frame.y, frame.x, centre_d, rstd_row / frame.y), far);
}

// (count, mean, M2) of one V, exact.
fn value_stats(v: V) -> vec3<f32> {
    if (RMS) {
        return vec3<f32>(f32(VEC), 0.0, hsum(v * v));
    }
    let m = hsum(v) / f32(VEC);
    let d = v - V(m);
    return vec3<f32>(f32(VEC), m, hsum(d * d));
}

// The row's mean from each of its threads' (count, mean) of its share. Called by every
// thread of the workgroup (row_sum may hold barriers), as the second sum is; threads past
// the last row take part with the last row's values.
fn row_mean(count: f32, share_mean: f32, tid: u32, lane: u32, lanes: u32) -> f32 {
    if (RMS) {
        return 0.0;
    }
    return row_sum(vec2<f32>(share_mean * share_of(count), 0.0), tid, lane, 0u, lanes).x;
}

// A thread's weight in its row's mean: count / width, exactly 1 / THREADS_PER_ROW where
// every thread holds as many values.
fn share_of(count: f32) -> f32 {
    return select(count * INV_WIDTH, EVEN_SHARE, EVEN_SPLIT);
}

// A thread's part of the mean's correction, its share's mean less mean_d, weighed: none
// for RMS, whose rows are not centred.
fn correction_part(gap: f32, count: f32) -> f32 {
    return select(gap * share_of(count), 0.0, RMS);
}

// M2 from the row's sum of squared deviations from a center near the mean, corrected by
// `correction`, the mean less the center.
fn m2_about(correction: f32, squares: f32) -> f32 {
    return clamp_m2(squares - correction * (correction * f32(WIDTH)));
}

// Writes mean and rstd of `row` from its (mean, M2) (with WRITE_STATS); returns (mean, rstd). A row holding
// NaN or an infinity gives NaN out and rstd, like aten, and a mean of +-inf or NaN. So does
// var + eps below 0 or NaN (a negative or NaN eps: aten's rsqrt; WGSL's sqrt of a negative is
// indeterminate); +inf (eps inf) gives rstd 0. Tested on bits, since compilers may assume
// finite floats: from +0 up to +inf, and nothing else, the bits lie at or below +inf's.
fn finish_row(row: u32, lane: u32, stats: vec2<f32>) -> vec2<f32> {
    let var_eps = rounded_quotient(stats.y, f32(WIDTH)) + params.eps;
    let finite = is_finite(stats.x) && is_finite(stats.y) && bitcast<u32>(var_eps) <= 0x7f800000u;
    var rstd_row: f32;
    if (RMS) {
        rstd_row = rms_rstd(var_eps);
    } else {
        rstd_row = select(params.nan, refined_rsqrt(var_eps), finite);
    }
    if (WRITE_STATS && lane == 0u) {
        mean[row] = stats.x;
        rstd[row] = rstd_row;
    }
    return vec2<f32>(stats.x, rstd_row);
}

// rms_norm's rsqrt(mean(x^2) + eps), as aten computes it in float32: a row whose squares
// pass float32's range or hold an infinity has mean(x^2) inf and rstd 0 (out 0, NaN at the
// infinities: inf * 0); NaN, and a mean + eps below 0 (a negative eps), give NaN. Tested on
// bits, as in finish_row.
fn rms_rstd(ms_eps: f32) -> f32 {
    let bits = bitcast<u32>(ms_eps);
    return select(select(params.nan, refined_rsqrt(ms_eps), bits < 0x7f800000u), 0.0, bits == 0x7f800000u);
}

// 1 / sqrt(v) for v >= 0, correctly rounded but within about 1/1000 ulp of a tie. WGSL
// allows sqrt and division 2.5 ulp each, and NVIDIA's Vulkan driver takes that room: an
// rms_norm constant row's out (+-1 less eps's share) came 1-2 ulp off, over twice eager's
// error. The estimate r, cut to its top 12 significant bits so that r^2 is exact, gives the
// exact residual e = 1 - v r^2; the series 1 + e/2 + 3e^2/8 + 5e^3/16 then restores r. Where
// r^2 could leave float32's normal range, r stands.
fn refined_rsqrt(v: f32) -> f32 {
    let r = 1.0 / sqrt(v);
    let r_hi = top_12_bits(r);
    let e = exact_residual(1.0, v, r_hi * r_hi);
    let refined = r_hi + r_hi * (e * (0.5 + e * (0.375 + e * 0.3125)));
    return select(r, refined, v >= 0x1p-100f && v <= 0x1p100f);
}

// a / b for b > 0, correctly rounded but near a tie, as refined_rsqrt is and for its reason:
// NVIDIA's division of a constant rms_norm row's sum of squares by its width (43200 / 768)
// came an ulp off 56.25, and so its out one ulp off eager's. q plus the exact residual
// (a - q b) / b rounds once. Outside 2^-100 <= |a| <= 2^100 q stands.
fn rounded_quotient(a: f32, b: f32) -> f32 {
    let q = a / b;
    return select(q, q + exact_residual(a, q, b) / b, abs(a) >= 0x1p-100f && abs(a) <= 0x1p100f);
}

// a - x y, exact where x y lies within 2x of a and its halves' products stay normal: x and y
// split into 12-bit halves make four exact products, without fma (which WGSL does not
// promise fused); the first difference is exact (Sterbenz), the rest are small beside it.
fn exact_residual(a: f32, x: f32, y: f32) -> f32 {
    let x_hi = top_12_bits(x);
    let x_lo = x - x_hi;
    let y_hi = top_12_bits(y);
    let y_lo = y - y_hi;
    return (((a - x_hi * y_hi) - x_hi * y_lo) - x_lo * y_hi) - x_lo * y_lo;
}

// `a` with its significand cut to 12 bits (sign, exponent and the top 11 stored bits kept):
// products of two such values are exact in float32.
fn top_12_bits(a: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(a) & 0xfffff000u);
}

// Whether the K-th held value of a thread, at index i, lies in the row: only the last can
// fall past its end (HOLD is ROW_VECS / THREADS_PER_ROW rounded up), and with K a literal
// the test folds away for the others.
fn held_in_row(i: u32, k: u32) -> bool {
    return k + 1u < HOLD || i < ROW_VECS;
}

// The V at index i of the row at `base`, zeros past the row's end.
fn load_x(base: u32, i: u32, in_row: bool) -> V {
    if (in_row) {
        return read_x(base + i);
    }
    return V(0.0);
}

// (count, mean, M2) of the V v, none past the row's end.
fn stats_at(v: V, in_row: bool) -> vec3<f32> {
    return select(vec3<f32>(0.0), value_stats(v), in_row);
}

// Components a V counts for: 0 past the row's end.
fn count_at(in_row: bool) -> f32 {
    return select(0.0, f32(VEC), in_row);
}

// (sum of d, sum of d^2) with d = v - center, zeros past the row's end.
fn deviation_at(v: V, in_row: bool, center: f32) -> vec2<f32> {
    let d = select(V(0.0), v - V(center), in_row);
    return vec2<f32>(hsum(d), hsum(d * d));
}

fn weight_at(i: u32, in_row: bool) -> V {
    if (HAS_WEIGHT && in_row) {
        return read_weight(i);
    }
    return V(1.0);
}

fn bias_at(i: u32, in_row: bool) -> V {
    if (HAS_BIAS && in_row) {
        return read_bias(i);
    }
    return V(0.0);
}

// c: the row's centring (a, b, c, r), the output (x * a - b - c) * r (`centring`).
fn store_out(base: u32, i: u32, in_row: bool, v: V, c: vec4<f32>, w: V, b: V) {
    store_normalized(base, i, in_row, ((v * c.x - V(c.y)) - V(c.z)) * c.w, w, b);
}

// normalized: the normalized values, NaN throughout for a non-finite row.
fn store_normalized(base: u32, i: u32, in_row: bool, normalized: V, w: V, b: V) {
    if (in_row) {
        write_out(base + i, affine(normalized, w, b));
    }
}

// The output of normalized values y: y * w + b, of the parts the launch has.
fn affine(y: V, w: V, b: V) -> V {
    var found = y;
    if (HAS_WEIGHT) { found = found * w; }
    if (HAS_BIAS) { found = found + b; }
    return found;
}

// The first row of a launch's row `row`: threads past the last row read the last row
// instead, so that no load needs a guard; they take part in the row sums and never store.
fn row_base(row: u32) -> u32 {
    return min(row, params.rows - 1u) * ROW_VECS;
}

fn normalize_held(tid: u32, row: u32, lanes: u32) {
    let lane = tid % THREADS_PER_ROW;
    let base = row_base(row);
    let frame = row_frame(base);
    let i_K = lane + K * THREADS_PER_ROW;  // each held value
    let in_K = held_in_row(i_K, K);  // each held value
    let v_K = load_x(base, i_K, in_K);  // each held value
    let w_K = weight_at(i_K, in_K);  // each held value, weight and bias with x
    let b_K = bias_at(i_K, in_K);  // each held value, weight and bias with x
    var count = 0.0;
    var sum = 0.0;
    count += count_at(in_K);  // each held value
    sum += hsum(framed(v_K, in_K, frame));  // each held value
    let first_mean = select(0.0, sum / count, count > 0.0);
    // The share's mean of d: the first, corrected by the sum of the deviations from it.
    var shift = 0.0;
    var own = 0.0;  // squares with the correction
    let e_K = deviation_at(framed(v_K, in_K, frame), in_K, first_mean);  // each held value
    shift += e_K.x;  // each held value
    own += e_K.y;  // each held value, squares with the correction
    let rest = select(0.0, shift / count, count > 0.0);
    let mean_d = row_mean(count, first_mean + rest, tid, lane, lanes);
    // The second sums: the share's mean less mean_d, weighed, and its squares of d - mean_d:
    // taken in a pass after mean_d, or (squares_with_correction in config.py) from the
    // squares about the share's own first mean, moved to its corrected mean and then to
    // mean_d (Chan et al.), one pass over the values fewer.
    let gap = (first_mean - mean_d) + rest;
    var squares = 0.0;
    squares += deviation_at(framed(v_K, in_K, frame), in_K, mean_d).y;  // each held value, squares after the mean
    squares = (own - count * rest * rest) + count * gap * gap;  // squares with the correction
    let sums = row_sum(vec2<f32>(correction_part(gap, count), squares), tid, lane, 1u, lanes);
    let stats = unframed(frame, mean_d, sums.x, m2_about(sums.x, sums.y));
    if (row >= params.rows) {
        return;
    }
    let c = centring(frame, mean_d + sums.x, stats, finish_row(row, lane, stats).y);
    store_out(base, i_K, in_K, v_K, c, w_K, b_K);  // each held value, weight and bias with x
    store_out(base, i_K, in_K, v_K, c, weight_at(i_K, in_K), bias_at(i_K, in_K));  // each held value, weight and bias at the store
}

// Held half rows of a launch that stores no mean and rstd (plain_two_pass in config.py):
// the textbook two-pass in d = x - first, the row sum of d giving mean_d, the
// sum of (d - mean_d)^2 giving M2, and the output (d - mean_d) * rstd. Half values need
// nothing more of the frame:
// - x - first is exact in f32 wherever x and first lie within 2^12 of each other (float16:
//   11 bits each; bfloat16: 2^16, 8 bits), so a row far from zero is centred in exact
//   differences, as the frame's far rows are; where they lie further apart, the row's
//   spread is as large as its values.
// - a constant row has every d exactly 0: mean its value, M2 0, out 0 + bias (a mean taken
//   as sum(x) * (1 / width) is not: 7.25 at width 1000).
// - no difference of float16 values (at most 2^17) squared, nor a sum of 2^13 such squares,
//   reaches float32's limit: no scale. bfloat16 rows whose squares pass it give NaN, as in
//   the frame, which does not scale them either.
// mean_d's rounding moves M2 only in the second order, so M2 needs no correction; the mean
// itself, first + mean_d, rounds at first's scale, which is why launches that store the mean
// keep rows in their frame (the rule and its measurements: config.py).
// The mean of d of a plain row from each thread's sum of its d (0 for RMS, not centred).
fn plain_mean(sum: f32, tid: u32, lane: u32, lanes: u32) -> f32 {
    if (RMS) {
        return 0.0;
    }
    return row_sum(vec2<f32>(sum, 0.0), tid, lane, 0u, lanes).x * INV_WIDTH;
}

fn normalize_plain(tid: u32, row: u32, lanes: u32) {
    let lane = tid % THREADS_PER_ROW;
    let base = row_base(row);
    // A row of one value: opaque, so that no compiler folds x - first (one value read twice)
    // to a zero of another sign than aten's +0. WIDTH is a constant: the test folds away.
    var first = first_value(read_x(base));
    if (WIDTH == 1u) {
        first = opaque(first);
    }
    if (RMS) {
        first = 0.0;
    }
    let i_K = lane + K * THREADS_PER_ROW;  // each plain value
    let in_K = held_in_row(i_K, K);  // each plain value
    let d_K = select(V(0.0), load_x(base, i_K, in_K) - V(first), in_K);  // each plain value
    let w_K = weight_at(i_K, in_K);  // each plain value
    let b_K = bias_at(i_K, in_K);  // each plain value
    var sum = 0.0;
    sum += hsum(d_K);  // each plain value
    let mean_d = plain_mean(sum, tid, lane, lanes);
    let e_K = select(V(0.0), d_K - V(mean_d), in_K);  // each plain value
    var squares = 0.0;
    squares += hsum(e_K * e_K);  // each plain value
    let m2 = clamp_m2(row_sum(vec2<f32>(squares, 0.0), tid, lane, 1u, lanes).x);
    if (row >= params.rows) {
        return;
    }
    let r = finish_row(row, lane, vec2<f32>(first + mean_d, m2)).y;
    store_normalized(base, i_K, in_K, nan_row(e_K * r, r), w_K, b_K);  // each plain value
}

// Plain rows read and written in 16-byte words (wide_words in config.py): normalize_plain's
// two-pass, each thread taking whole words of eight half values (two V), K * THREADS_PER_ROW
// + lane of its row, so that none lies past the row's end and nothing is tested. Weight and
// bias come in words too. The H200 loads a plain half row 16 bytes at a time 2-3.4% faster
// at some model shapes and up to 2.5% slower at others, so a tuned layout chooses it
// (docs/measurements.md, "Layouts tuned on the device").
fn normalize_wide(tid: u32, row: u32, lanes: u32) {
    let lane = tid % THREADS_PER_ROW;
    let base = row_base(row);
    let first = select(first_value(read_x(base)), 0.0, RMS);
    let words = base / 2u;
    let i_K = lane + K * THREADS_PER_ROW;  // each 16-byte word
    let q_K = x_words(words + i_K);  // each 16-byte word
    let w_K = weight_words(i_K);  // each 16-byte word
    let b_K = bias_words(i_K);  // each 16-byte word
    let lo_K = lo_of(q_K) - V(first);  // each 16-byte word
    let hi_K = hi_of(q_K) - V(first);  // each 16-byte word
    var sum = 0.0;
    sum += hsum(lo_K) + hsum(hi_K);  // each 16-byte word
    let mean_d = plain_mean(sum, tid, lane, lanes);
    let e_lo_K = lo_K - V(mean_d);  // each 16-byte word
    let e_hi_K = hi_K - V(mean_d);  // each 16-byte word
    var squares = 0.0;
    squares += hsum(e_lo_K * e_lo_K) + hsum(e_hi_K * e_hi_K);  // each 16-byte word
    let m2 = clamp_m2(row_sum(vec2<f32>(squares, 0.0), tid, lane, 1u, lanes).x);
    if (row >= params.rows) {
        return;
    }
    let r = finish_row(row, lane, vec2<f32>(first + mean_d, m2)).y;
    let y_lo_K = affine(nan_row(e_lo_K * r, r), lo_of(w_K), lo_of(b_K));  // each 16-byte word
    let y_hi_K = affine(nan_row(e_hi_K * r, r), hi_of(w_K), hi_of(b_K));  // each 16-byte word
    write_out_words(words + i_K, y_lo_K, y_hi_K);  // each 16-byte word
}

fn normalize_streamed(tid: u32, row: u32, lanes: u32) {
    let lane = tid % THREADS_PER_ROW;
    let base = row_base(row);
    let frame = row_frame(base);
    // (count, mean, M2, the mean's low part) of the thread's d.
    var local = vec4<f32>(0.0);
    for (var at = lane; at < ROW_VECS; at += STEP * THREADS_PER_ROW) {
        let i_K = at + K * THREADS_PER_ROW;  // each step value
        let in_K = i_K < ROW_VECS;  // each step value
        let v_K = load_x(base, i_K, in_K);  // each step value
        local = merge(local, stats_at(framed(v_K, in_K, frame), in_K));  // each step value
    }
    let mean_d = row_mean(local.x, local.y + local.w, tid, lane, lanes);
    // The second sums: the share's mean less mean_d, weighed, and its squares of d - mean_d.
    let gap = (local.y - mean_d) + local.w;
    let sums = row_sum(vec2<f32>(correction_part(gap, local.x), local.z + local.x * gap * gap), tid, lane, 1u,
                       lanes);
    let stats = unframed(frame, mean_d, sums.x, m2_about(sums.x, sums.y));
    if (row >= params.rows) {
        return;
    }
    let c = centring(frame, mean_d + sums.x, stats, finish_row(row, lane, stats).y);
    for (var at = lane; at < ROW_VECS; at += STEP * THREADS_PER_ROW) {
        let i_K = at + K * THREADS_PER_ROW;  // each step value
        let in_K = i_K < ROW_VECS;  // each step value
        let v_K = load_x(base, i_K, in_K);  // each step value
        store_out(base, i_K, in_K, v_K, c, weight_at(i_K, in_K), bias_at(i_K, in_K));  // each step value
    }
}
