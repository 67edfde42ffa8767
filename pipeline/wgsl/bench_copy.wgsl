// Benchmark reference, not a LayerNorm: the plainest vec4 copy, so that the kernel's
// bandwidth can be held against what a WGSL kernel moves on the same adapter.

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = id.x + id.y * groups.x * 256u;
    if (i < arrayLength(&dst)) {
        dst[i] = src[i];
    }
}
