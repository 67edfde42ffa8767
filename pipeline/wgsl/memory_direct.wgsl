// Rows read from and written to global memory in place, V at a time.

@group(0) @binding(0) var<storage, read> x: array<V>;
@group(0) @binding(3) var<storage, read_write> out: array<V>;

// Where the row's V values start.
fn row_base(row: u32, tid: u32) -> u32 {
    return row * ROW_VECS;
}

fn read_value(at: u32) -> V {
    return x[at];
}

fn write_value(at: u32, y: V) {
    out[at] = y;
}

fn stage_in(group: u32, tid: u32) {}

fn stage_out(group: u32, tid: u32) {}
