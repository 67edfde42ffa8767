// Probe variant (benchmarks/probe_waves.py), not the product: persistent workgroups for held
// rows. Appended to the product's module (pipeline/wgsl/native_layer_norm.wgsl and its
// reduction file, constants and written-out lines as the runtime builds them), whose own
// `normalize_rows` the probe renames away: this one replaces it and reuses the product's
// helpers (held_in_row, load_x, weight_at, bias_at, finish_row, store_out), and the probe
// copies normalize_held's statistics lines in at HELD_STATISTICS, so each row's arithmetic
// and sums are the product's.
//
// The probe adds
//   const PREFETCH: bool    true: the next rows' x loads are issued before this row's merge
//                           and store; false: after the store (serial, the control)
// and launches a grid of a few workgroups per SM (not one workgroup per ROWS_PER_WORKGROUP
// rows). Each workgroup takes ROWS_PER_WORKGROUP rows at a time, grid-strided; a thread's
// columns are the same in every row, so weight and bias are loaded once per thread.

fn normalize_rows(tid: u32, group: vec3<u32>, groups: vec3<u32>) {
    let lane = tid % THREADS_PER_ROW;
    let stride = groups.x * ROWS_PER_WORKGROUP;
    // The same count in every workgroup, dead rows included: the merges' barriers and
    // shuffles stay in uniform control flow.
    let turns = (params.rows + stride - 1u) / stride;
    var row = group.x * ROWS_PER_WORKGROUP + tid / THREADS_PER_ROW;
    let i_K = lane + K * THREADS_PER_ROW;  // each held value
    let in_K = held_in_row(i_K, K);  // each held value
    let w_K = weight_at(i_K, in_K);  // each held value
    let b_K = bias_at(i_K, in_K);  // each held value
    var v_K = load_x(row * ROW_VECS, i_K, in_K && row < params.rows);  // each held value
    for (var turn = 0u; turn < turns; turn++) {
        let live = row < params.rows;
        let ahead = row + stride;
        var n_K = V(0.0);  // each held value
        if (PREFETCH) {
            n_K = load_x(ahead * ROW_VECS, i_K, in_K && ahead < params.rows);  // each held value
        }
        // This row's statistics: the probe puts normalize_held's own lines here.
        HELD_STATISTICS
        if (live) {
            let mean_rstd = finish_row(row, lane, stats);
            store_out(row * ROW_VECS, i_K, in_K, v_K, mean_rstd, w_K, b_K);  // each held value
        }
        if (!PREFETCH) {
            n_K = load_x(ahead * ROW_VECS, i_K, in_K && ahead < params.rows);  // each held value
        }
        v_K = n_K;  // each held value
        row = ahead;
        // Merges through workgroup memory reuse `partial`: no thread may start the next
        // turn's merge while another still reads this turn's parts.
        if (!ROW_IN_SUBGROUP) {
            workgroupBarrier();
        }
    }
}
