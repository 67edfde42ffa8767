"""Where the gap to a copy goes (H200): the chosen kernel; without the row merge (each
thread's own statistics: wrong results, timing only); without weight and bias; both; without
the mean and rstd stores; and the held path's loads and stores with nothing between them (a
copy in the kernel's pattern); against the plain WGSL copy of the same bytes.

    OUT=dir python benchmarks/probe_gap_to_copy.py [SHAPES [OUTPUTS]]   # dir/gap_probe.json
SHAPES as bench_layer_norm.py's --shapes (default five large ones), OUTPUTS rotating (default)
or shared (pipeline/benchmark.py).
"""
import json, os, sys
from dataclasses import dataclass, replace
from pipeline.benchmark import parse_shapes, time_kernel, time_copy
from pipeline.runtime.launch import choose_config, KernelConfig
from pipeline.runtime.device import gpu
from probe_waves import _edit  # benchmarks/, the script's own directory


@dataclass(frozen=True)
class NoMerge(KernelConfig):
    """Each thread's own sums stand for the row's (wrong results; timing only)."""

    def source(self, g):
        head = "-> vec2<f32> {\n    if (ROW_IN_SUBGROUP) {"
        return _edit(super().source(g), head, "-> vec2<f32> {\n    return value;\n    if (ROW_IN_SUBGROUP) {")


@dataclass(frozen=True)
class HeldCopy(KernelConfig):
    """The held path's loads and stores with nothing between them: x stored straight back."""

    def source(self, g):
        s = super().source(g)
        s = _edit(s, "    let stats = vec2<f32>(mean_row, corrected_m2(row_sum(dev, tid, lane, 1u)));\n",
                  "    let stats = vec2<f32>(0.0, 0.0);\n")
        return _edit(s, "    let mean_rstd = finish_row(row, lane, stats);\n    store_out(base, i_0",
                     "    let mean_rstd = vec2<f32>(0.0, 1.0);\n    store_out(base, i_0")


shapes = parse_shapes(sys.argv[1] if len(sys.argv) > 1 else "1024x1024,1500x1024,4096x3072,8192x1024,73728x128")
outputs = sys.argv[2] if len(sys.argv) > 2 else "rotating"
g = gpu()
res = []
for rows, width in shapes:
    d = choose_config(width, True, True, g.subgroup_size)
    n = choose_config(width, False, False, g.subgroup_size)
    f = {k: getattr(d, k) for k in d.__dataclass_fields__}
    fn = {k: getattr(n, k) for k in n.__dataclass_fields__}
    cfgs = {"default": d, "no_stats": replace(d, write_stats=False), "no_merge": NoMerge(**f), "no_affine": n, "no_affine_no_merge": NoMerge(**fn),
            "held_copy": HeldCopy(**fn)}
    t, _ = time_kernel(rows, width, list(cfgs.values()), repeats=200, outputs=outputs)
    r = {"rows": rows, "width": width, "outputs": outputs, **{k: round(v[0], 2) for k, v in zip(cfgs, t)},
         "wgsl_copy": round(time_copy(rows, width, repeats=200, outputs=outputs), 2)}
    print(r, flush=True)
    res.append(r)
json.dump(res, open(os.environ.get("OUT", "/tmp") + f"/gap_probe_{outputs}.json", "w"), indent=1)
