// Probe: pack2x16float of each pair of `values`, as this adapter computes it. WGSL leaves
// that conversion's rounding (and values past float16's range) to the implementation; the
// runtime stores float16 outputs with it only where it rounded every probe value as aten
// does (to nearest, ties to even, past 65504 to infinity, NaN to NaN).
@group(0) @binding(0) var<storage, read> values: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> packed: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&packed)) {
        packed[id.x] = pack2x16float(values[id.x]);
    }
}
