// Row statistics merged with subgroup shuffles; the entry point lives here because it needs
// the subgroup builtins (Naga takes them once the device has the `subgroup` feature).
// With ROW_IN_SUBGROUP (THREADS_PER_ROW <= the subgroup size) a row's threads sit in one
// subgroup and a butterfly merges them without barriers. Otherwise each subgroup merges its
// part, and the parts meet in workgroup memory behind one barrier, where each subgroup
// merges them with another butterfly.

var<workgroup> partial: array<vec3<f32>, WORKGROUP>;
var<private> subgroup_lanes: u32;
var<private> subgroup_lane: u32;

// One butterfly level: lanes `mask` apart swap statistics and merge them; the lower lane
// of each pair is `a` on both sides.
fn butterfly_level(stats: vec3<f32>, mask: u32) -> vec3<f32> {
    let other = subgroupShuffleXor(stats, mask);
    let low = (subgroup_lane & mask) == 0u;
    return merge(select(other, stats, low), select(stats, other, low));
}

// Merges the statistics of each `span` lanes (a power of two, at most 128, the largest
// subgroup). The levels are written out rather than looped over: with `span` a constant
// the unused ones fold away, and no loop bookkeeping sits between the shuffles.
fn butterfly(local: vec3<f32>, span: u32) -> vec3<f32> {
    var stats = local;
    if (span > 1u) { stats = butterfly_level(stats, 1u); }
    if (span > 2u) { stats = butterfly_level(stats, 2u); }
    if (span > 4u) { stats = butterfly_level(stats, 4u); }
    if (span > 8u) { stats = butterfly_level(stats, 8u); }
    if (span > 16u) { stats = butterfly_level(stats, 16u); }
    if (span > 32u) { stats = butterfly_level(stats, 32u); }
    if (span > 64u) { stats = butterfly_level(stats, 64u); }
    return stats;
}

fn row_stats(local: vec3<f32>, tid: u32, lane: u32) -> vec3<f32> {
    if (ROW_IN_SUBGROUP) {
        return butterfly(local, THREADS_PER_ROW);
    }
    let merged = butterfly(local, subgroup_lanes);
    if (subgroup_lane == 0u) {
        partial[tid / subgroup_lanes] = merged;
    }
    workgroupBarrier();
    // Every subgroup of the row merges the row's parts itself, in the same order in every
    // subgroup, so all of the row's threads get the same statistics: lane j takes the parts
    // j, j + span, j + 2 span, ... and a butterfly over `span` lanes combines them. Rounding
    // grows with log2(span) + parts / span, not with parts as a serial merge's would.
    let parts = THREADS_PER_ROW / subgroup_lanes;
    let first = (tid / THREADS_PER_ROW) * parts;
    let span = min(parts, subgroup_lanes);
    var stats = partial[first + subgroup_lane % span];
    for (var k = span; k < parts; k += span) {
        stats = merge(stats, partial[first + subgroup_lane % span + k]);
    }
    return butterfly(stats, span);
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(subgroup_size) lanes: u32,
    @builtin(subgroup_invocation_id) lane_in_subgroup: u32,
) {
    subgroup_lanes = lanes;
    subgroup_lane = lane_in_subgroup;
    normalize_rows(tid, group, groups);
}
