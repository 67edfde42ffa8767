// Row statistics merged through workgroup memory, for adapters without subgroup operations:
// a tree over the THREADS_PER_ROW threads of each row, log2(THREADS_PER_ROW) barriers.

var<workgroup> partial: array<vec3<f32>, WORKGROUP>;

fn row_stats(local: vec3<f32>, tid: u32, lane: u32) -> vec3<f32> {
    partial[tid] = local;
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            partial[tid] = merge(partial[tid], partial[tid + stride]);
        }
        workgroupBarrier();
    }
    return partial[tid - lane];
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    normalize_rows(tid, group, groups);
}
