// Naga takes subgroup builtins once the device has the `subgroup` feature (no enable directive).
// Row sums with subgroup operations; the entry point lives here because it needs the
// subgroup builtins. With ROW_IN_SUBGROUP (THREADS_PER_ROW <= the subgroup size) a row's
// threads sit in one subgroup and a butterfly of shuffles sums them without barriers.
// Otherwise each subgroup sums its part and the parts meet in workgroup memory.

var<workgroup> partial: array<vec2<f32>, WORKGROUP>;
var<private> subgroup_lanes: u32;
var<private> subgroup_lane: u32;

fn row_sum(value: vec2<f32>, tid: u32, lane: u32) -> vec2<f32> {
    var total = value;
    if (ROW_IN_SUBGROUP) {
        for (var mask = 1u; mask < THREADS_PER_ROW; mask = mask * 2u) {
            total += subgroupShuffleXor(total, mask);
        }
        return total;
    }
    total = subgroupAdd(total);
    let per_row = THREADS_PER_ROW / subgroup_lanes;
    let first = (tid / THREADS_PER_ROW) * per_row;
    if (subgroup_lane == 0u) {
        partial[tid / subgroup_lanes] = total;
    }
    workgroupBarrier();
    total = vec2<f32>(0.0, 0.0);
    for (var i = 0u; i < per_row; i++) {
        total += partial[first + i];
    }
    workgroupBarrier();
    return total;
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
