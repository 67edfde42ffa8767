// Row sums with subgroup shuffles; the entry point lives here because it needs the
// subgroup builtins (naga takes them once the device has the `subgroup` feature; Tint once
// the module says `enable subgroups;`, which the runtime writes for it).
// With ROW_IN_SUBGROUP (THREADS_PER_ROW <= the probe's subgroup size) a row's threads sit
// in one subgroup and a butterfly of additions sums them without barriers. Otherwise each
// subgroup sums its part, and the parts meet in workgroup memory behind one barrier, where
// each subgroup sums them with another butterfly.
//
// Every shuffle must sit in control flow that Tint's uniformity analysis proves uniform.
// The subgroup size comes down from the entry point's subgroup_size builtin as a parameter
// (`lanes`), which it proves uniform; a private variable holding it, it cannot. A constant
// (the probe's size) would do for Tint too, but on the H200 it made rows of several
// subgroups 1-6% slower than the builtin (docs/measurements.md, "wgpu and Dawn").

// One slot of parts per step, so that a row's second sum never writes over parts its
// first is still reading.
var<workgroup> partial: array<vec2<f32>, 2 * WORKGROUP>;
// The invocation's lane in its subgroup: it only indexes `partial`, never decides a shuffle.
var<private> subgroup_lane: u32;

// The sum over each `span` lanes (a power of two, at most 128, the largest subgroup), in
// every one of them: addition commutes, so both lanes of a pair get the same bits. The
// levels are written out rather than looped over: with `span` a constant the unused ones
// fold away, and no loop bookkeeping sits between the shuffles.
fn butterfly(value: vec2<f32>, span: u32) -> vec2<f32> {
    var sum = value;
    if (span > 1u) { sum += subgroupShuffleXor(sum, 1u); }
    if (span > 2u) { sum += subgroupShuffleXor(sum, 2u); }
    if (span > 4u) { sum += subgroupShuffleXor(sum, 4u); }
    if (span > 8u) { sum += subgroupShuffleXor(sum, 8u); }
    if (span > 16u) { sum += subgroupShuffleXor(sum, 16u); }
    if (span > 32u) { sum += subgroupShuffleXor(sum, 32u); }
    if (span > 64u) { sum += subgroupShuffleXor(sum, 64u); }
    return sum;
}

fn row_sum(value: vec2<f32>, tid: u32, lane: u32, step: u32, lanes: u32) -> vec2<f32> {
    if (ROW_IN_SUBGROUP) {
        return butterfly(value, THREADS_PER_ROW);
    }
    let slot = step * WORKGROUP;
    let sum = butterfly(value, lanes);
    if (subgroup_lane == 0u) {
        partial[slot + tid / lanes] = sum;
    }
    workgroupBarrier();
    // Every subgroup of the row sums the row's parts itself, in the same order in every
    // subgroup, so all of the row's threads get the same sum: lane j takes the parts j,
    // j + span, j + 2 span, ... and a butterfly over `span` lanes adds them up.
    // Where the probe's subgroups are so small that a row has more parts than a subgroup
    // has lanes (PARTS_TREE: 4 or 8 lanes, rows of up to 256 threads), the parts first
    // halve in a tree in workgroup memory until `span` remain, so that no part is added
    // after a long run of others (16 in sequence at 4 lanes took a mean at 1e4 2 ulp off).
    // Elsewhere the tree is not compiled: its loop, never run, made rows of 8 parts 1-3%
    // slower on the H200 (docs/measurements.md, "wgpu and Dawn").
    let row_parts = THREADS_PER_ROW / lanes;
    let first = slot + (tid / THREADS_PER_ROW) * row_parts;
    let span = min(row_parts, lanes);
    var parts = row_parts;
    if (PARTS_TREE) {
        for (; parts > span; parts = parts / 2u) {
            if (lane < parts / 2u) {
                partial[first + lane] += partial[first + lane + parts / 2u];
            }
            workgroupBarrier();
        }
    }
    var total = partial[first + subgroup_lane % span];
    for (var k = span; k < parts; k += span) {
        total += partial[first + subgroup_lane % span + k];
    }
    return butterfly(total, span);
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(subgroup_size) lanes: u32,
    @builtin(subgroup_invocation_id) lane_in_subgroup: u32,
) {
    subgroup_lane = lane_in_subgroup;
    normalize_rows(tid, group, groups, lanes);
}
