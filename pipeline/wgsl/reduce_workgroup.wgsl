// Row statistics merged through workgroup memory, for adapters without subgroup operations:
// a tree over the THREADS_PER_ROW threads of each row, log2(THREADS_PER_ROW) barriers (and
// the same tree adds the per-row sums of blocks of rows).

var<workgroup> partial: array<vec3<f32>, TRIPLE_SLOTS>;
var<workgroup> sums: array<vec4<f32>, SUM_SLOTS>;

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

// The sum of v over the block's threads, for reduction `round` (0-2: each round has its own
// workgroup memory, so no barrier is needed between rounds).
fn row_sums(v: vec4<f32>, tid: u32, lane: u32, round: u32) -> vec4<f32> {
    let at = round * WORKGROUP + tid;
    sums[at] = v;
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            sums[at] += sums[at + stride];
        }
        workgroupBarrier();
    }
    return sums[at - lane];
}

@compute @workgroup_size(WORKGROUP)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    normalize_rows(tid, group, groups);
}
