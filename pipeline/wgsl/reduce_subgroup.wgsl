// Row sums with subgroup shuffles. With ROW_IN_SUBGROUP (THREADS_PER_ROW <= SUBGROUP_SIZE)
// a row's threads sit in one subgroup and a butterfly of additions sums them without
// barriers. Otherwise each subgroup sums its part, and the parts meet in workgroup memory
// behind one barrier, where each subgroup sums them with another butterfly.
//
// SUBGROUP_SIZE (prelude) is the smallest subgroup size the device probe saw, a constant:
// every shuffle below sits in control flow that depends on constants only, which Tint's
// uniformity analysis can prove (a size read from the subgroup_size builtin into a private
// variable it cannot), and the unused butterfly levels fold away. Like the row layout, it
// takes subgroups to be runs of SUBGROUP_SIZE consecutive invocations (a larger subgroup
// holds whole runs): lane = tid % SUBGROUP_SIZE.

// One slot of parts per step, so that a row's second sum never writes over parts its
// first is still reading.
var<workgroup> partial: array<vec2<f32>, 2 * WORKGROUP>;

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

fn row_sum(value: vec2<f32>, tid: u32, lane: u32, step: u32) -> vec2<f32> {
    if (ROW_IN_SUBGROUP) {
        return butterfly(value, THREADS_PER_ROW);
    }
    let slot = step * WORKGROUP;
    let sum = butterfly(value, SUBGROUP_SIZE);
    let subgroup_lane = tid % SUBGROUP_SIZE;
    if (subgroup_lane == 0u) {
        partial[slot + tid / SUBGROUP_SIZE] = sum;
    }
    workgroupBarrier();
    // Every subgroup of the row sums the row's parts itself, in the same order in every
    // subgroup, so all of the row's threads get the same sum: lane j takes the parts j,
    // j + span, j + 2 span, ... and a butterfly over `span` lanes adds them up.
    let first = slot + (tid / THREADS_PER_ROW) * SUBGROUP_PARTS;
    var total = partial[first + subgroup_lane % PARTS_SPAN];
    for (var k = PARTS_SPAN; k < SUBGROUP_PARTS; k += PARTS_SPAN) {
        total += partial[first + subgroup_lane % PARTS_SPAN + k];
    }
    return butterfly(total, PARTS_SPAN);
}

// A row's subgroups (where it spans several) and the lanes that sum their parts.
const SUBGROUP_PARTS: u32 = max(THREADS_PER_ROW / SUBGROUP_SIZE, 1u);
const PARTS_SPAN: u32 = min(SUBGROUP_PARTS, SUBGROUP_SIZE);

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    normalize_rows(tid, group, groups);
}
