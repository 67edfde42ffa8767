"""The kernel against aten.native_layer_norm on rows either side of the held/streamed
boundary, on both reduction paths (tests/test_streamed_rows.py holds the bounds). Prints, per
dtype, row kind and path, the kernel's worst error against float64 over aten's, for out / mean
/ rstd (rows of 16, widths 5-8196), then constant rows that once went wrong.

    python benchmarks/streamed_rows.py [--dtypes float32,float16,bfloat16] [--held 5,100,...] [--streamed 2049,...]

Only pipeline.layer_norm is used, so the same script measures an older checkout too: put
that checkout's `pipeline` first on PYTHONPATH.
"""
import argparse

import torch

import pipeline
from pipeline.runtime.device import gpu

ATEN = torch.ops.aten.native_layer_norm.default
EPS = 1e-5
HELD = [5, 100, 2047, 2048, 3000, 4094, 4096, 8192]
STREAMED = [2049, 4097, 4098, 8193, 8196]
LARGE_MEAN = {
    torch.float32: [(1e6, 0.1), (1e4, 1e-2), (-3e4, 1e-3), (1e18, 1e12)],
    torch.float16: [(1000.0, 1.0), (-3000.0, 4.0)],
    torch.bfloat16: [(1e4, 64.0), (-3e5, 4096.0)],
}


def error(got: torch.Tensor, truth: torch.Tensor) -> float:
    return (got.double() - truth).abs().max().item()


def ratios(x: torch.Tensor) -> list[float]:
    width = x.shape[-1]
    ours = pipeline.layer_norm(x, [width], None, None, EPS)
    eager = ATEN(x, [width], None, None, EPS)
    truth = ATEN(x.double(), [width], None, None, EPS)
    return [error(o, t) / max(error(e, t), 1e-300) for o, e, t in zip(ours, eager, truth)]


def widths(text: str) -> list[int]:
    return [int(width) for width in text.split(",")]


def dtypes(text: str) -> list[torch.dtype]:
    known = {str(dtype)[6:]: dtype for dtype in LARGE_MEAN}
    try:
        return [known[name] for name in text.split(",")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(known)}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", type=dtypes, default=list(LARGE_MEAN),
                        help="the dtypes whose large-mean rows are measured (default float32,float16,bfloat16)")
    parser.add_argument("--held", type=widths, default=HELD, help="widths of held rows")
    parser.add_argument("--streamed", type=widths, default=STREAMED, help="widths of streamed rows")
    args = parser.parse_args()
    g = gpu()
    paths = [("subgroup", g.subgroup_size)] * bool(g.subgroup_size) + [("workgroup", 0)]
    print("worst kernel error / aten error vs float64 (out / mean / rstd)")
    for path, size in paths:
        saved, g.subgroup_size = g.subgroup_size, size
        try:
            for dtype in args.dtypes:
                for center, spread in LARGE_MEAN[dtype]:
                    line = f"  {path:9s} {str(dtype)[6:]:8s} mean {center:g} sd {spread:g}:"
                    for name, kind_widths in (("held", args.held), ("streamed", args.streamed)):
                        worst = [0.0, 0.0, 0.0]
                        for width in kind_widths:
                            gen = torch.Generator().manual_seed(width)
                            x = (torch.randn(16, width, generator=gen, dtype=torch.float64) * spread + center).to(dtype)
                            worst = [max(w, r) for w, r in zip(worst, ratios(x))]
                        line += f"  {name} " + "/".join(f"{r:.2f}" for r in worst)
                    print(line)
        finally:
            g.subgroup_size = saved
    print("constant rows (kernel | aten):")
    examples = [("constant 1e10", 2049, 1e10, EPS), ("constant 33", 3000, 33.0, EPS),
                ("constant 1e10, eps 0", 4097, 1e10, 0.0), ("constant 3e38", 2049, 3e38, EPS),
                ("constant 3e38", 8196, 3e38, EPS)]
    for name, width, value, eps in examples:
        x = torch.full((1, width), value)
        out, mean, rstd = pipeline.layer_norm(x, [width], None, None, eps)
        e_out, e_mean, e_rstd = ATEN(x, [width], None, None, eps)
        print(f"  {name:20s} width {width}: max|out| {out.abs().max().item():.3g} mean {mean.item():.9g} "
              f"rstd {rstd.item():.6g} | max|out| {e_out.abs().max().item():.3g} mean {e_mean.item():.9g} "
              f"rstd {e_rstd.item():.6g}")


if __name__ == "__main__":
    main()
