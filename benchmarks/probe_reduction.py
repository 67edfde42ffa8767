"""Row statistics by sums over the row's threads instead of one pairwise merge of their
(count, mean, M2) (H200).

A pairwise merge of triples costs each thread a division and a dozen more instructions at
each butterfly level, a butterfly of additions a shuffle and an add. This times, per model
shape, in float32 and float16, interleaved:
- product          the sums (pipeline/wgsl/native_layer_norm.wgsl's row_mean and row_sum)
- merge_reduction  the same configuration built from the kernel files of an earlier commit
                   (`--previous DIR`: its pipeline/wgsl/ files; the merge until 652e851)
- late_affine      the product with weight and bias loaded after the row statistics
                   (probe_waves.py's), fewer registers held across the sums
- staged_W256      float32: the product with weight and bias copied once per 256-thread
                   workgroup into workgroup memory (probe_waves.py's)
each first checked against float64, beside the WGSL copy of the same bytes, torch eager
and torch.compile at that dtype.

    mkdir -p /tmp/prev && git archive 652e851 pipeline/wgsl | tar -x -C /tmp/prev
    cp -r /tmp/prev/pipeline/wgsl benchmarks/previous-wgsl   # carried to a GPU host untracked
    OUT=dir python benchmarks/probe_reduction.py --previous benchmarks/previous-wgsl [--shapes model]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch

import pipeline
from pipeline.benchmark import parse_shapes, time_copy, time_kernel, time_torch, time_torch_compiled
from pipeline.runtime.device import device_info, gpu
from probe_implementations import FromDirectory  # benchmarks/, the script's own directory
from probe_waves import LateAffine, StagedAffine

kernel = importlib.import_module("pipeline.runtime.launch")  # the module, not the function


PREVIOUS_DIR = Path()


def check(rows: int, width: int, dtype: str, config) -> dict:
    """out's, mean's and rstd's max error against float64 over eager's at the same dtype
    plus a floor (rows of their own offset and scale, random weight and bias): the kernel
    tests' rule passes at most 4. out's floor holds one float32 ulp of the row's mean
    carried through rstd and weight, the error any float32 mean brings."""
    gen = torch.Generator().manual_seed(rows + width)
    kind = kernel.DTYPES[dtype]
    x = (torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 20
         + torch.randn(rows, 1, generator=gen) * 30).to(kind)
    w, b = torch.randn(width, generator=gen).to(kind), torch.randn(width, generator=gen).to(kind)
    with mock.patch.object(kernel, "choose_config", lambda *a, **k: config):
        ours = pipeline.layer_norm(x, (width,), w, b)
    eager = torch.ops.aten.native_layer_norm.default(x, [width], w, b, 1e-5)
    truth = torch.ops.aten.native_layer_norm.default(x.double(), [width], w.double(), b.double(), 1e-5)
    mean_ulp = float((torch.finfo(torch.float32).eps * truth[1].abs() * truth[2]).max()) * float(w.abs().max())
    ratios = {}
    for name, o, e, t in zip(("out", "mean", "rstd"), ours, eager, truth):
        floor = 4 * torch.finfo(torch.float32).eps * float(t.abs().max()) + (mean_ulp if name == "out" else 0.0)
        err = float((o.double() - t).abs().max())
        ratios[name] = round(err / (float((e.double() - t).abs().max()) + floor), 3)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--previous", required=True, type=Path, help="an earlier commit's pipeline/wgsl/ files")
    parser.add_argument("--shapes", default="model")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    global PREVIOUS_DIR
    PREVIOUS_DIR = args.previous
    if not (PREVIOUS_DIR / kernel.SHADER).is_file():
        parser.error(f"--previous: no {kernel.SHADER} in {PREVIOUS_DIR}")
    g = gpu()
    path = os.path.join(os.environ.get("OUT", "."), "reduction_probe.json")
    doc = {"device": device_info(), "torch_device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "results": []}
    for dtype in args.dtypes.split(","):
        itemsize = kernel.DTYPES[dtype].itemsize
        for rows, width in parse_shapes(args.shapes):
            product = kernel.device_config(g, width, True, True, dtype)
            fields = {k: getattr(product, k) for k in product.__dataclass_fields__}
            # The same configuration, its module built from the kernel files of an earlier commit.
            configs = {"product": product, "merge_reduction": FromDirectory(**fields, directory=PREVIOUS_DIR)}
            if product.hold:
                configs["late_affine"] = LateAffine(**fields)
                staged = StagedAffine(**{**fields, "workgroup": max(256, product.threads_per_row)})
                if dtype == "float32" and staged.workgroup_bytes <= g.limits["max-compute-workgroup-storage-size"]:
                    configs["staged_W256"] = staged
            checks = {n: check(min(rows, 4096), width, dtype, c) for n, c in configs.items()}
            ok = [n for n in configs if max(checks[n].values()) <= 4.0]
            timed = [configs[n] for n in ok]
            rounds = [time_kernel(rows, width, timed, repeats=args.repeats, dtype=dtype)[0],
                      time_kernel(rows, width, timed[::-1], repeats=args.repeats, dtype=dtype)[0][::-1]]
            us = {n: round(min(r[i][0] for r in rounds), 3) for i, n in enumerate(ok)}
            copy = time_copy(rows, width, repeats=args.repeats, itemsize=itemsize)
            compiled = time_torch_compiled(rows, width, repeats=args.repeats, dtype=dtype)
            row = {"dtype": dtype, "rows": rows, "width": width, "us": us,
                   "rounds": {n: [round(r[i][0], 3) for r in rounds] for i, n in enumerate(ok)},
                   "checks": checks, "wgsl_copy_us": None if copy is None else round(copy, 3),
                   "compiled_us": None if compiled is None else round(compiled, 3),
                   "torch_us": round(time_torch(rows, width, repeats=args.repeats, dtype=dtype)[0], 3)}
            doc["results"].append(row)
            print(json.dumps({k: row[k] for k in ("dtype", "rows", "width", "us", "wgsl_copy_us", "compiled_us",
                                                  "torch_us")}), flush=True)
            with open(path + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
