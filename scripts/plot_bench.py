"""Plot effective GB/s by shape from a bench_layer_norm.py JSON (kernel, torch eager, torch.compile
where the JSON has it, WGSL copy).

    python scripts/plot_bench.py benchmarks/results/h200-nvidia-vulkan.json benchmarks/results/h200-nvidia-vulkan.png
"""

from __future__ import annotations

import argparse
import io
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline import cli  # noqa: E402
from pipeline.ioutil import check_output_file, write_bytes_atomic  # noqa: E402
from pipeline.benchmark import effective_gbps  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="JSON written by bench_layer_norm.py")
    parser.add_argument("png", help="where to write the plot")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    try:
        check_output_file(args.png)
    except ValueError as exc:
        parser.error(f"argument png: {exc}")
    cli.quiet_dependencies(args.verbose)
    try:
        with open(args.results) as f:
            data = json.load(f)
        rows = [r for r in data["results"] if r["rows"] * r["width"] >= 1024]
    except (OSError, ValueError, KeyError) as exc:
        print(f"plot_bench: cannot read {args.results}: {exc}", file=sys.stderr)
        return 1
    labels = [f"{r['rows']}x{r['width']}" for r in rows]
    itemsize = 4 if data.get("dtype", "float32") == "float32" else 2
    torch_device = data.get("torch_device", "torch")
    series = {
        "native_layer_norm (wgpu)": [r["wgpu_gbps"] for r in rows],
        f"torch layer_norm ({torch_device})": [r["torch_gbps"] for r in rows],
    }
    if any(r.get("compiled_gbps") for r in rows):
        series[f"torch.compile layer_norm ({torch_device})"] = [r.get("compiled_gbps") or 0 for r in rows]
    series["WGSL copy (floor)"] = [
        effective_gbps(r["rows"], r["width"], r["wgsl_copy_us"], itemsize) if r.get("wgsl_copy_us") else 0
        for r in rows]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(series)
    for n, (name, values) in enumerate(series.items()):
        ax.bar([i + (n - (len(series) - 1) / 2) * width for i in range(len(rows))], values, width, label=name)
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("effective GB/s (read + write)")
    ax.set_title(f"LayerNorm on {data.get('adapter', '?')} ({data.get('backend', '')}), {data.get('dtype', 'float32')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(args.png, buf.getvalue())
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
