"""Half precision on the H200: how wide a load, and how many loads a thread?

The product reads half rows 8 values (16 bytes, one vec4<u32>) a load where the width is a
multiple of 8, so a half thread holds as many bytes in flight as a float32 one. Its
predecessor read 4 values (8 bytes) a load with the float32 rule's thread counts: half the
bytes in flight a thread, and float16 took 70-78% of a WGSL copy's speed where float32
takes 80-94% (benchmarks/NOTES.md). This times, per model shape and interleaved, the
product against that predecessor and against the product with 2x and 1/2 its threads per
row, each checked against float64 and for bit-identity with the product first, beside
torch eager and torch.compile at float16, the WGSL copy of the same bytes and the float32
product.

    OUT=dir python benchmarks/probe_half.py [SHAPES]   # dir/half_probe.json
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from dataclasses import dataclass, replace
from unittest import mock

import torch

import pipeline
from pipeline.benchmark import parse_shapes, time_copy, time_kernel, time_torch, time_torch_compiled
from pipeline.runtime.device import gpu

kernel = importlib.import_module("pipeline.runtime.native_layer_norm")  # the module, not the function
DTYPE = "float16"


@dataclass(frozen=True)
class FourValueLoads(kernel.KernelConfig):
    """The previous product: 4 half values (8 bytes) a load, the float32 rule's threads."""

    @property
    def vec(self) -> int:
        return 4


def _threads(config, threads: int):
    return replace(config, threads_per_row=threads, hold=math.ceil(config.row_vecs / threads),
                   workgroup=max(kernel.MIN_WORKGROUP, threads))


def variants(width: int) -> dict:
    g = gpu()
    product = kernel.device_config(g, width, True, True, DTYPE)
    found = {"product": product}
    if product.vec == 8:
        # The predecessor's rule is the float32 rule at the same width (4-value loads).
        rule = kernel.choose_config(width, True, True, g.subgroup_size)
        fields = {k: getattr(product, k) for k in product.__dataclass_fields__}
        fields.update({k: getattr(rule, k) for k in ("threads_per_row", "workgroup", "hold", "unroll")})
        found["four_value_loads"] = FourValueLoads(**fields)
    for name, factor in (("threads_x2", 2.0), ("threads_half", 0.5)):
        threads = int(product.threads_per_row * factor)
        if product.hold and 1 <= threads <= 1024 and math.ceil(product.row_vecs / threads) <= 2 * kernel.MAX_HOLD:
            found[name] = _threads(product, threads)
    return found


def check(rows: int, width: int, config) -> tuple[float, int]:
    """Max abs error of `config`'s output against float64 over eager float16's, and how
    many outputs differ in their bits from the product's."""
    gen = torch.Generator().manual_seed(rows + width)
    x = (torch.randn(rows, width, generator=gen) * 2 + 30).half()
    w, b = torch.randn(width, generator=gen).half(), torch.randn(width, generator=gen).half()
    with mock.patch.object(kernel, "choose_config", lambda *a, **k: config):
        out, _, _ = pipeline.layer_norm(x, (width,), w, b)
    reference, _, _ = pipeline.layer_norm(x, (width,), w, b)
    differing = int((out.view(torch.int16) != reference.view(torch.int16)).sum())
    want = torch.nn.functional.layer_norm(x.double(), (width,), w.double(), b.double())
    eager = torch.nn.functional.layer_norm(x.float(), (width,), w.float(), b.float()).half()
    ratio = float((out.double() - want).abs().max() / max(float((eager.double() - want).abs().max()), 1e-30))
    return ratio, differing


def main() -> int:
    out_dir = os.environ.get("OUT", ".")
    results = []
    for rows, width in parse_shapes(sys.argv[1] if len(sys.argv) > 1 else "model"):
        configs = variants(width)
        checks = {name: check(min(rows, 4096), width, c) for name, c in configs.items()}
        ratios = {name: r for name, (r, _) in checks.items()}
        differing = {name: d for name, (_, d) in checks.items()}
        ok = {name: r <= 1.25 for name, r in ratios.items()}
        names = [n for n in configs if ok[n]]
        timed = [configs[n] for n in names]
        rounds = [time_kernel(rows, width, timed, repeats=200, dtype=DTYPE)[0],
                  time_kernel(rows, width, timed[::-1], repeats=200, dtype=DTYPE)[0][::-1]]
        us = {name: round(sorted(r[i][0] for r in rounds)[0], 2) for i, name in enumerate(names)}
        compiled = time_torch_compiled(rows, width, repeats=200, dtype=DTYPE)
        copy = time_copy(rows, width, repeats=200, itemsize=2)
        row = {"rows": rows, "width": width, "us": us, "rounds": {n: [r[i][0] for r in rounds] for i, n in enumerate(names)},
               "error_vs_eager": ratios, "bits_differing": differing,
               "configs": {n: {"vec": c.vec, "threads_per_row": c.threads_per_row, "hold": c.hold,
                               "workgroup": c.workgroup} for n, c in configs.items()},
               "wgsl_copy_us": None if copy is None else round(copy, 2),
               "float32_product_us": round(time_kernel(rows, width, repeats=200)[0][0][0], 2),
               "torch_us": round(time_torch(rows, width, repeats=200, dtype=DTYPE)[0], 2),
               "compiled_us": None if compiled is None else round(compiled, 2)}
        results.append(row)
        print(json.dumps({k: row[k] for k in ("rows", "width", "us", "wgsl_copy_us", "compiled_us", "torch_us",
                                              "error_vs_eager", "bits_differing")}), flush=True)
        with open(os.path.join(out_dir, "half_probe.json"), "w") as f:
            json.dump({"adapter": pipeline.runtime.device_info()["adapter"], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
