"""Row statistics against float64 on large-mean rows: the kernel's held and streamed paths
next to eager PyTorch float32, in float32 ulps of the true value (mean: ulps of the mean;
rstd: ulps of rstd; out: max abs error over the max abs true value, in float32 eps). Then,
at widths whose rows a large launch splits over twice the threads (WIDE_LAUNCH_THREADS),
held rows as a small launch and as a large one holds them ("wide_launch").

    python benchmarks/stats_accuracy.py [OUT.json] [--widths 96,384,...] [--wide-widths 128,256,...]
"""
import argparse
import dataclasses
import importlib

import numpy as np
import torch

from pipeline.ioutil import write_json_atomic
from pipeline.runtime.device import device_info
from pipeline.wgsl.config import STREAM_UNROLL

kernel = importlib.import_module("pipeline.runtime.launch")
ATEN = torch.ops.aten.native_layer_norm.default
CASES = [(1.0, 1e-3), (1e4, 1e-2), (-50.0, 1.0)]
WIDTHS = [96, 384, 768, 1024, 1280, 3072, 4097]
WIDE_WIDTHS = [128, 256, 512, 1024, 2048]
chosen = kernel.choose_config


def widths(text: str) -> list[int]:
    return [int(width) for width in text.split(",")]


def streamed(*args, **kwargs):
    return dataclasses.replace(chosen(*args, **kwargs), hold=0, unroll=STREAM_UNROLL)


def wide(*args, **kwargs):
    return chosen(*args, **{**kwargs, "rows": 1 << 30})


def ulps(got: torch.Tensor, truth: torch.Tensor) -> float:
    spacing = np.spacing(truth.float().abs().numpy()).astype(np.float64)
    return float(np.mean(np.abs(got.double().numpy() - truth.numpy()) / spacing))


def measure(widths: list[int], variants: dict, gen: torch.Generator) -> list[dict]:
    rows = []
    for loc, scale in CASES:
        for width in widths:
            x = loc + scale * torch.randn(64, width, generator=gen)
            w, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
            truth = ATEN(x.double(), [width], w.double(), b.double(), 1e-5)
            row = {"loc": loc, "scale": scale, "width": width}
            results = {"eager": ATEN(x, [width], w, b, 1e-5)}
            for name, choose in variants.items():
                kernel.choose_config = choose
                results[name] = kernel.native_layer_norm(x, [width], w, b, 1e-5)
            kernel.choose_config = chosen
            for name, (out, mean, rstd) in results.items():
                out_err = (out.double() - truth[0]).abs().max() / truth[0].abs().max()
                row[name] = {"mean_ulps": round(ulps(mean, truth[1]), 3), "rstd_ulps": round(ulps(rstd, truth[2]), 3),
                             "out_eps": round(float(out_err) / float(np.finfo(np.float32).eps), 2)}
            rows.append(row)
            print(row, flush=True)
    return rows


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    summary = []
    for loc, scale in CASES:
        case = [r for r in rows if (r["loc"], r["scale"]) == (loc, scale)]
        summary.append({"loc": loc, "scale": scale, **{
            name: {key: round(float(np.mean([r[name][key] for r in case])), 3) for key in ("mean_ulps", "rstd_ulps", "out_eps")}
            for name in names}})
        print("mean over widths:", summary[-1])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="?", metavar="OUT.json", help="where to write the results (printed only without it)")
    parser.add_argument("--widths", type=widths, default=WIDTHS, help="held and streamed rows of these widths")
    parser.add_argument("--wide-widths", type=widths, default=WIDE_WIDTHS,
                        help="held rows of these widths as a small and a large launch")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = measure(args.widths, {"held": chosen, "streamed": streamed}, gen)
    summary = summarize(rows, ["eager", "held", "streamed"])
    wide_rows = measure(args.wide_widths, {"held": chosen, "held_wide_launch": wide}, gen)
    wide_summary = summarize(wide_rows, ["eager", "held", "held_wide_launch"])
    if args.json:
        write_json_atomic(args.json, {"adapter": device_info()["adapter"], "summary": summary, "cases": rows,
                                      "wide_launch": {"widths": args.wide_widths, "summary": wide_summary,
                                                      "cases": wide_rows}})


if __name__ == "__main__":
    main()
