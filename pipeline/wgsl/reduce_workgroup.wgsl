// Row sums through workgroup memory, for adapters without subgroup operations: a tree
// over the THREADS_PER_ROW slots of each row, log2(THREADS_PER_ROW) barriers.

var<workgroup> partial: array<vec2<f32>, WORKGROUP>;

// Every thread of the workgroup must call this (it holds barriers).
fn row_sum(value: vec2<f32>, tid: u32, lane: u32) -> vec2<f32> {
    partial[tid] = value;
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            partial[tid] = partial[tid] + partial[tid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[tid - lane];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    normalize_rows(tid, group, groups);
}
