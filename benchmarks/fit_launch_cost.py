"""Split each timed column of a bench_layer_norm.py result into a rate and a fixed cost per
launch: time = fixed + effective bytes / rate, least squares over the shapes of at least
--min-mb MB of input whose width is a multiple of 4 (where the WGSL copy was timed too).

    python benchmarks/fit_launch_cost.py benchmarks/results/h200-tuned/h200-wgpu-bench-float32.json
"""
import argparse
import json

import numpy as np

COLUMNS = {"wgsl_copy_us": "WGSL copy", "wgpu_us": "kernel", "torch_copy_us": "torch copy", "torch_us": "torch layer_norm"}


def fit(results: list[dict], column: str) -> tuple[float, float, float, int]:
    """(rate in TB/s, fixed µs, largest residual µs, shapes used) for one column."""
    used = [r for r in results if r.get(column) is not None]
    if len(used) < 2:
        raise ValueError(f"{column}: need at least two shapes, have {len(used)}")
    mb = np.array([2 * r["mbytes"] for r in used])  # input read once + output written once
    us = np.array([r[column] for r in used])
    design = np.vstack([mb, np.ones_like(mb)]).T
    (per_mb, fixed), *_ = np.linalg.lstsq(design, us, rcond=None)
    return 1 / per_mb, fixed, float(np.abs(design @ [per_mb, fixed] - us).max()), len(used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", help="a JSON file written by scripts/bench_layer_norm.py --json")
    parser.add_argument("--min-mb", type=float, default=9.0, help="smallest input in MB to fit (default 9)")
    parser.add_argument("--min-width", type=int, default=0, help="narrowest row to fit (default all)")
    args = parser.parse_args()
    with open(args.result) as f:
        results = json.load(f)["results"]
    chosen = [r for r in results
              if r["width"] % 4 == 0 and r["mbytes"] >= args.min_mb and r["width"] >= args.min_width]
    for column, name in COLUMNS.items():
        rate, fixed, residual, n = fit(chosen, column)
        print(f"{name:17s} rate {rate:5.2f} TB/s  fixed {fixed:5.2f} us/launch  "
              f"(largest residual {residual:.2f} us, {n} shapes)")


if __name__ == "__main__":
    main()
