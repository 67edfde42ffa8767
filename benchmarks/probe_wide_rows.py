"""Where the time goes on wide rows (H200): affine vs no-affine pipelines, and the full row merge vs
the in-subgroup butterfly alone (wrong statistics for rows wider than a subgroup: timing only).

    python benchmarks/probe_wide_rows.py   # OUT=dir for probe.json
"""
import json, os
from dataclasses import replace
from pipeline.runtime.benchmark import time_kernel
from pipeline.runtime.native_layer_norm import choose_config
from pipeline.runtime.device import gpu
g = gpu()
out = []
for rows, width in [(4096, 3072), (8192, 1024), (4096, 1024), (73728, 128), (1500, 1280)]:
    aff = choose_config(width, True, True, g.subgroup_size)
    none = choose_config(width, False, False, g.subgroup_size)
    cfgs = [aff, none, replace(aff, row_in_subgroup=True), replace(none, row_in_subgroup=True)]
    t_aff, _ = time_kernel(rows, width, [aff, cfgs[2]], affine=True, repeats=200)
    t_none, _ = time_kernel(rows, width, [none, cfgs[3]], affine=False, repeats=200)
    r = {"rows": rows, "width": width, "affine": t_aff[0][0], "affine_butterfly_only": t_aff[1][0],
         "none": t_none[0][0], "none_butterfly_only": t_none[1][0]}
    print(r, flush=True)
    out.append(r)
json.dump(out, open(os.environ["OUT"] + "/probe.json", "w"), indent=1)
