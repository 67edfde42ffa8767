"""Half precision on the H200: does a row of float16 want more values a thread?

A half V (4 values) is one 8-byte load where a float32 V is 16 bytes, so with the float32
rule (4-7 V a thread) a thread has half the bytes in flight and the kernel takes about as
long in float16 as in float32 (benchmarks/NOTES.md). This times, per model shape and
interleaved, the product's float16 choice against 1/2 and 1/4 of its threads per row
(2x and 4x the values a thread), each checked against torch in float64 first, beside
torch eager and torch.compile at float16 and the float32 product.

    OUT=dir python benchmarks/probe_half.py   # dir/half_probe.json
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from unittest import mock

import torch

import pipeline
from pipeline.benchmark import parse_shapes, time_kernel, time_torch, time_torch_compiled
from pipeline.runtime import native_layer_norm as kernel
from pipeline.runtime.device import gpu


def variants(width: int, subgroup_size: int) -> dict:
    product = kernel.choose_config(width, True, True, subgroup_size, "float16")
    found = {"product": product}
    for name, divisor in (("threads_half", 2), ("threads_quarter", 4)):
        threads = product.threads_per_row // divisor
        if product.hold and threads >= 1:
            found[name] = replace(product, threads_per_row=threads, hold=math.ceil(product.row_vecs / threads),
                                  workgroup=max(kernel.MIN_WORKGROUP, threads))
    return found


def check(rows: int, width: int, config) -> float:
    """Max abs error of `config`'s output against float64, over eager float16's."""
    gen = torch.Generator().manual_seed(rows + width)
    x = (torch.randn(rows, width, generator=gen) * 2 + 30).half()
    w, b = torch.randn(width, generator=gen).half(), torch.randn(width, generator=gen).half()
    with mock.patch.object(kernel, "choose_config", lambda *a, **k: config):
        out, _, _ = pipeline.layer_norm(x, (width,), w, b)
    want = torch.nn.functional.layer_norm(x.double(), (width,), w.double(), b.double())
    eager = torch.nn.functional.layer_norm(x.float(), (width,), w.float(), b.float()).half()
    return float((out.double() - want).abs().max() / max(float((eager.double() - want).abs().max()), 1e-30))


def main() -> int:
    g = gpu()
    out_dir = os.environ.get("OUT", ".")
    results = []
    for rows, width in parse_shapes(sys.argv[1] if len(sys.argv) > 1 else "model"):
        configs = variants(width, g.subgroup_size)
        ratios = {name: check(min(rows, 4096), width, c) for name, c in configs.items()}
        ok = {name: r <= 1.25 for name, r in ratios.items()}
        timed = [c for name, c in configs.items() if ok[name]]
        rounds = [time_kernel(rows, width, timed, repeats=200, dtype="float16")[0],
                  time_kernel(rows, width, timed[::-1], repeats=200, dtype="float16")[0][::-1]]
        us = {name: round(sorted(r[i][0] for r in rounds)[0], 2)
              for i, name in enumerate(n for n in configs if ok[n])}
        row = {"rows": rows, "width": width, "us": us, "error_vs_eager": ratios,
               "holds": {name: c.hold for name, c in configs.items()},
               "float32_product_us": round(time_kernel(rows, width, repeats=200)[0][0][0], 2),
               "torch_us": round(time_torch(rows, width, repeats=200, dtype="float16")[0], 2),
               "compiled_us": (lambda t: None if t is None else round(t, 2))(
                   time_torch_compiled(rows, width, repeats=200, dtype="float16"))}
        results.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(out_dir, "half_probe.json"), "w") as f:
        json.dump({"adapter": pipeline.runtime.device_info()["adapter"], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
