// Row statistics merged through workgroup memory, for adapters without subgroup operations:
// a tree over the THREADS_PER_ROW threads of each row, log2(THREADS_PER_ROW) barriers.

// Two regions, so that consecutive calls (part 0, 1, 0, ...) need no barrier between them.
var<workgroup> partial: array<vec3<f32>, 2 * WORKGROUP>;

fn row_stats(local: vec3<f32>, tid: u32, lane: u32, part: u32) -> vec3<f32> {
    let at = part * WORKGROUP + tid;
    partial[at] = local;
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            partial[at] = merge(partial[at], partial[at + stride]);
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
    normalize_rows(tid, group, groups);
}
