// Benchmark reference, not a LayerNorm: the plainest vec4 copy, so that the kernel's
// bandwidth can be held against what a WGSL kernel moves on the same adapter. `order` is
// shared by every launch of a batch, so each waits for the one before, as the kernel's
// launches wait on their shared mean and rstd; its one write is the copy's only extra.

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> order: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = id.x + id.y * groups.x * 256u;
    if (i < arrayLength(&dst)) {
        dst[i] = src[i];
    }
    if (i == 0u) {
        order[0] = 1u;
    }
}
