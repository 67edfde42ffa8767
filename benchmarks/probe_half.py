"""Half precision on the H200: does a row of float16 want more values a thread?

A half V (4 values) is one 8-byte load where a float32 V is 16 bytes, so with the float32
rule (4-7 V a thread) a thread has half the bytes in flight and the kernel takes about as
long in float16 as in float32 (benchmarks/NOTES.md). This times, per model shape and
interleaved, the product's float16 choice against 1/2 and 1/4 of its threads per row
(2x and 4x the values a thread), and stores through WGSL's pack2x16float, each checked
against torch in float64 first, beside
torch eager and torch.compile at float16 and the float32 product.

    OUT=dir python benchmarks/probe_half.py   # dir/half_probe.json
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
from pipeline.benchmark import parse_shapes, time_kernel, time_torch, time_torch_compiled
from pipeline.runtime.device import gpu
from pipeline.wgsl.config import MIN_WORKGROUP

kernel = importlib.import_module("pipeline.runtime.launch")  # the module, not the function


@dataclass(frozen=True)
class NativePack(kernel.KernelConfig):
    """float16 stores with WGSL's pack2x16float (one conversion instruction where the GPU
    has one) instead of half.wgsl's integer round-to-nearest-even: the spec leaves its
    rounding to the implementation, so the probe also counts outputs whose bits differ."""

    def source(self, g) -> str:
        source = super().source(g)
        old = "fn pack_pair(v: vec2<f32>) -> u32 {\n    return half_bits(v.x) | (half_bits(v.y) << 16u);\n}"
        if source.count(old) != 1:
            raise RuntimeError("native_pack: half.wgsl's pack_pair moved")
        return source.replace(old, "fn pack_pair(v: vec2<f32>) -> u32 {\n    return pack2x16float(v);\n}")


def variants(width: int, subgroup_size: int) -> dict:
    product = kernel.choose_config(width, True, True, subgroup_size, "float16")
    found = {"product": product}
    found["native_pack"] = NativePack(**{k: getattr(product, k) for k in product.__dataclass_fields__})
    for name, divisor in (("threads_half", 2), ("threads_quarter", 4)):
        threads = product.threads_per_row // divisor
        if product.hold and threads >= 1:
            found[name] = replace(product, threads_per_row=threads, hold=math.ceil(product.row_vecs / threads),
                                  workgroup=max(MIN_WORKGROUP, threads))
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
    g = gpu()
    out_dir = os.environ.get("OUT", ".")
    results = []
    for rows, width in parse_shapes(sys.argv[1] if len(sys.argv) > 1 else "model"):
        configs = variants(width, g.subgroup_size)
        checks = {name: check(min(rows, 4096), width, c) for name, c in configs.items()}
        ratios = {name: r for name, (r, _) in checks.items()}
        differing = {name: d for name, (_, d) in checks.items()}
        ok = {name: r <= 1.25 for name, r in ratios.items()}
        timed = [c for name, c in configs.items() if ok[name]]
        rounds = [time_kernel(rows, width, timed, repeats=200, dtype="float16")[0],
                  time_kernel(rows, width, timed[::-1], repeats=200, dtype="float16")[0][::-1]]
        us = {name: round(sorted(r[i][0] for r in rounds)[0], 2)
              for i, name in enumerate(n for n in configs if ok[n])}
        row = {"rows": rows, "width": width, "us": us, "error_vs_eager": ratios, "bits_differing": differing,
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
