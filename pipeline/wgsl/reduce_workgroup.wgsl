// Row sums through workgroup memory, for adapters without subgroup operations: a tree over
// the THREADS_PER_ROW threads of each row, log2(THREADS_PER_ROW) barriers.

// One slot per step, so that a row's second sum never writes over its first's result
// while a thread of the row may still be reading it.
var<workgroup> partial: array<vec2<f32>, 2 * WORKGROUP>;

// `lanes` (the subgroup size on the subgroup path) is 0 here and unused.
fn row_sum(value: vec2<f32>, tid: u32, lane: u32, step: u32, lanes: u32) -> vec2<f32> {
    let at = step * WORKGROUP + tid;
    partial[at] = value;
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            partial[at] = partial[at] + partial[at + stride];
        }
        workgroupBarrier();
    }
    return partial[at - lane];
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    normalize_rows(tid, group, groups, 0u);
}
