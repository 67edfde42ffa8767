"""Plot effective GB/s by shape from a bench_layer_norm.py JSON (kernel, torch eager, torch.compile
where the JSON has it, WGSL copy); with --host-path, the wall time from host tensors to host
tensors by shape instead (a delegate's call, pipeline.layer_norm, the CUDA round trip, torch on
the CPU, and the kernel alone), on a log scale.

    python scripts/plot_bench.py benchmarks/results/h200-nvidia-vulkan.json benchmarks/results/h200-nvidia-vulkan.png
    python scripts/plot_bench.py --host-path benchmarks/results/h200-host-path.json benchmarks/results/h200-host-path.png
"""

from __future__ import annotations

import argparse
import io
import json
import sys

if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()

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
    parser.add_argument("--host-path", action="store_true", help="plot the host-path columns (bench --host-path)")
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
    implementation = data.get("implementation", "wgpu")
    if args.host_path:
        if not all("call_us" in r for r in rows):
            print(f"plot_bench: {args.results} has no host-path columns (bench_layer_norm.py --host-path)",
                  file=sys.stderr)
            return 1
        series = {
            f"delegate call ({implementation})": [r["call_us"] for r in rows],
            f"pipeline.layer_norm ({implementation})": [r.get("layer_norm_us") or 0 for r in rows],
            f"CUDA round trip ({torch_device})": [r.get("cuda_roundtrip_us") or 0 for r in rows],
            "torch CPU": [r["torch_cpu_us"] for r in rows],
            "kernel alone": [r["wgpu_us"] for r in rows],
        }
        return _bars(args.png, series, labels, "microseconds, host tensors to host tensors (log)",
                     f"LayerNorm host to host on {data.get('adapter', '?')}, {data.get('dtype', 'float32')}", log=True)
    series = {
        f"native_layer_norm ({implementation})": [r["wgpu_gbps"] for r in rows],
        f"torch layer_norm ({torch_device})": [r["torch_gbps"] for r in rows],
    }
    if any(r.get("compiled_gbps") for r in rows):
        series[f"torch.compile layer_norm ({torch_device})"] = [r.get("compiled_gbps") or 0 for r in rows]
    series["WGSL copy (floor)"] = [
        effective_gbps(r["rows"], r["width"], r["wgsl_copy_us"], itemsize) if r.get("wgsl_copy_us") else 0
        for r in rows]
    return _bars(args.png, series, labels, "effective GB/s (read + write)",
                 f"LayerNorm on {data.get('adapter', '?')} ({data.get('backend', '')}), {data.get('dtype', 'float32')}")

def _bars(png: str, series: dict[str, list[float]], labels: list[str], ylabel: str, title: str,
          log: bool = False) -> int:
    """Grouped bars, one group per shape, written atomically to `png`."""
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(series)
    for n, (name, values) in enumerate(series.items()):
        ax.bar([i + (n - (len(series) - 1) / 2) * width for i in range(len(labels))], values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(png, buf.getvalue())
    print(f"wrote {png}")
    return 0

if __name__ == "__main__":
    _interrupts.run(main)
