// Probe: the smallest subgroup size any invocation of a 256-thread workgroup sees.
@group(0) @binding(0) var<storage, read_write> smallest: atomic<u32>;

@compute @workgroup_size(256)
fn main(@builtin(subgroup_size) lanes: u32) {
    atomicMin(&smallest, lanes);
}
