"""The error of half rows' mean, rstd and out from float64, over eager's, with each held
thread's squares taken in the correction pass (squares_with_correction: half rows' rule) and
in a pass after the mean (float32 rows' rule), on both row-merge paths and many seeds: whether
taking the squares with the correction moves any of them, or only perturbs single rows.
`pinned` and `pinned_both` take them with the correction with the share's first mean (and
its correction) passed through opaque: one rounded value in every use, whatever the compiler
folds.

The test it answers: test_half_rows_against_float64 (33 rows of randn, shift 0 or 30), whose
bound is 1.25 x eager's error plus, for mean and rstd, one ulp of their largest value.

    python benchmarks/probe_half_mean.py --json OUT.json [--seeds 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline.runtime.launch as launch  # noqa: E402
from pipeline.ioutil import write_json_atomic  # noqa: E402
from pipeline.runtime.device import device_info, gpu  # noqa: E402
from probe_half_floor import (MergedSquares, PinnedBoth, PinnedSquares, SquaresAfterMean, as_variant,  # noqa: E402
                              launching)

ATEN = torch.ops.aten.native_layer_norm.default
FORMS = {"with_correction": MergedSquares, "after_mean": SquaresAfterMean, "pinned": PinnedSquares,
         "pinned_both": PinnedBoth}


def errors(x, w, b, form, eps=1e-5):
    """(out, mean, rstd) error ratios over eager's, and whether each passes the test's bound."""
    width = x.shape[-1]
    with launching(lambda config: as_variant(FORMS[form], config)):
        ours = launch.native_layer_norm(x, (width,), w, b, eps)
    eager = ATEN(x, [width], w, b, eps)
    truth = ATEN(x.double(), [width], w.double(), b.double(), eps)
    found = {}
    for name, o, e, t in zip(("out", "mean", "rstd"), ours, eager, truth):
        err = (o.double() - t).abs().max().item()
        eager_err = (e.double() - t).abs().max().item()
        tie = 0.0 if name == "out" else float(torch.finfo(o.dtype).eps * t.abs().max())
        found[name] = {"ratio": err / max(eager_err, 1e-30), "passes": err <= 1.25 * eager_err + tie}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    g = gpu()
    paths = ["subgroup", "workgroup"] if g.subgroup_size else ["workgroup"]
    subgroup_size = g.subgroup_size
    results = []
    for path in paths:
        g.subgroup_size = subgroup_size if path == "subgroup" else 0
        for dtype in (torch.float16, torch.bfloat16):
            for affine in (torch.float32, dtype):
                for width in (128, 768, 1024, 3072):
                    for shift in (0.0, 30.0):
                        runs = {form: [] for form in FORMS}
                        for seed in range(args.seeds):
                            gen = torch.Generator().manual_seed(seed * 7919 + width)
                            x = (torch.randn(33, width, generator=gen) * (2.0 if shift else 1.0) + shift).to(dtype)
                            w = (1 + 0.5 * torch.randn(width, generator=gen)).to(affine)
                            b = (0.5 * torch.randn(width, generator=gen)).to(affine)
                            for form in FORMS:
                                runs[form].append(errors(x, w, b, form))
                        row = {"path": path, "dtype": str(dtype)[6:], "affine": str(affine)[6:], "width": width,
                               "shift": shift}
                        for form, found in runs.items():
                            for name in ("out", "mean", "rstd"):
                                ratios = [f[name]["ratio"] for f in found]
                                row[f"{form}.{name}"] = {
                                    "median": round(statistics.median(ratios), 3), "max": round(max(ratios), 3),
                                    "failing": sum(not f[name]["passes"] for f in found)}
                        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                        results.append(row)
    g.subgroup_size = subgroup_size
    write_json_atomic(args.json, {"device": device_info(), "seeds": args.seeds, "results": results})


if __name__ == "__main__":
    main()
