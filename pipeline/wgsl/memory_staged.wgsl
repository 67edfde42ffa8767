// Rows of an odd width staged through workgroup memory (V is f32). A workgroup's rows, a
// multiple of 4 of them, start on a vec4 boundary and fill whole vec4s: they come in as
// aligned vec4 loads and go out as aligned vec4 stores, and the rows' threads read and
// write single values of the copy in workgroup memory. The vec4 lines marked
// `// each staged vec4` are written out STAGE_STEPS times (K becoming 0, 1, ...) so that
// all of a thread's loads are in flight at once.

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const STAGE_VEC4S: u32 = WORKGROUP / THREADS_PER_ROW * WIDTH / 4u;
var<workgroup> stage: array<vec4<f32>, STAGE_VEC4S>;

// Where the row's values start in the workgroup's copy.
fn row_base(row: u32, tid: u32) -> u32 {
    return (tid / THREADS_PER_ROW) * WIDTH;
}

fn read_value(at: u32) -> V {
    return stage[at / 4u][at % 4u];
}

fn write_value(at: u32, y: V) {
    stage[at / 4u][at % 4u] = y;
}

// The workgroup's vec4 j, zeros past the tensor's last (whose tail the buffer rounds up to).
fn load_staged(first: u32, j: u32) -> vec4<f32> {
    if (j < STAGE_VEC4S && 4u * (first + j) < params.rows * WIDTH) {
        return x[first + j];
    }
    return vec4<f32>(0.0);
}

fn keep_staged(j: u32, v: vec4<f32>) {
    if (j < STAGE_VEC4S) {
        stage[j] = v;
    }
}

fn write_staged(first: u32, j: u32) {
    if (j < STAGE_VEC4S && 4u * (first + j) < params.rows * WIDTH) {
        out[first + j] = stage[j];
    }
}

fn stage_in(group: u32, tid: u32) {
    let first = group * STAGE_VEC4S;
    let v_K = load_staged(first, tid + K * WORKGROUP);  // each staged vec4
    keep_staged(tid + K * WORKGROUP, v_K);  // each staged vec4
    workgroupBarrier();
}

fn stage_out(group: u32, tid: u32) {
    workgroupBarrier();
    let first = group * STAGE_VEC4S;
    write_staged(first, tid + K * WORKGROUP);  // each staged vec4
}
