"""Plot effective GB/s by shape from a bench_layer_norm.py JSON (kernel, torch eager, torch.compile
where the JSON has it, WGSL copy, and with --ort's columns ONNX Runtime's WebGPU kernel beside
ours launched alone); with --host-path, the wall time from host tensors to host tensors by shape
instead (a delegate's call, pipeline.layer_norm, the CUDA round trip, torch on the CPU, ORT's
session.run where the JSON has it, and the kernel alone), on a log scale; with --accuracy, each
implementation's max abs error against float64 by shape, one panel per kind of row.

    python scripts/plot_bench.py benchmarks/results/h200-tuned/h200-wgpu-bench-float32.json out/h200-wgpu-float32.png
    python scripts/plot_bench.py --host-path benchmarks/results/h200-host-path.json out/h200-host-path.png
    python scripts/plot_bench.py --accuracy benchmarks/results/h200-ort/h200-ort-float32.json out/h200-ort-float32-accuracy.png
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
from pipeline.ioutil import check_output_file, read_regular, write_bytes_atomic  # noqa: E402
from pipeline.benchmark import effective_gbps  # noqa: E402

# A results file is tens of kB; one larger than this is not bench_layer_norm's.
RESULTS_MAX_BYTES = 64 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="JSON written by bench_layer_norm.py")
    parser.add_argument("png", help="where to write the plot")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--host-path", action="store_true", help="plot the host-path columns (bench --host-path)")
    mode.add_argument("--accuracy", action="store_true", help="plot the errors against float64 (bench --accuracy)")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    try:
        check_output_file(args.png)
    except ValueError as exc:
        parser.error(f"argument png: {exc}")
    cli.quiet_dependencies(args.verbose)
    try:
        data = json.loads(read_regular(args.results, RESULTS_MAX_BYTES))  # a named pipe is refused, not waited on
        rows = [r for r in data["results"] if r["rows"] * r["width"] >= 1024]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        print(f"plot_bench: cannot read {args.results}: {exc}", file=sys.stderr)
        return 1
    labels = [f"{r['rows']}x{r['width']}" for r in rows]
    itemsize = 4 if data.get("dtype", "float32") == "float32" else 2
    torch_device = data.get("torch_device", "torch")
    implementation = data.get("implementation", "wgpu")
    if args.accuracy:
        if not all("accuracy" in r for r in rows):
            print(f"plot_bench: {args.results} has no accuracy columns (bench_layer_norm.py --accuracy or --ort)",
                  file=sys.stderr)
            return 1
        return _errors(args.png, rows, labels, data)
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
        if any(r.get("ort_run_us") for r in rows):
            series["ORT WebGPU session.run"] = [r.get("ort_run_us") or 0 for r in rows]
        return _bars(args.png, series, labels, "microseconds, host tensors to host tensors (log)",
                     f"LayerNorm host to host on {data.get('adapter', '?')}, {data.get('dtype', 'float32')}", log=True)
    series = {
        f"native_layer_norm ({implementation})": [r["wgpu_gbps"] for r in rows],
        f"torch layer_norm ({torch_device})": [r["torch_gbps"] for r in rows],
    }
    if any(r.get("compiled_gbps") for r in rows):
        series[f"torch.compile layer_norm ({torch_device})"] = [r.get("compiled_gbps") or 0 for r in rows]
    if any(r.get("ort_kernel_us") for r in rows):
        # ORT's profiler times one run's dispatch alone: beside it, ours launched alone in a pass.
        series[f"native_layer_norm, one launch a pass ({implementation})"] = [
            effective_gbps(r["rows"], r["width"], r["wgpu_isolated_us"], itemsize) for r in rows]
        series["ORT WebGPU LayerNormalization (its profiler)"] = [
            effective_gbps(r["rows"], r["width"], r["ort_kernel_us"], itemsize) if r.get("ort_kernel_us") else 0
            for r in rows]
    series["WGSL copy (floor)"] = [
        effective_gbps(r["rows"], r["width"], r["wgsl_copy_us"], itemsize) if r.get("wgsl_copy_us") else 0
        for r in rows]
    return _bars(args.png, series, labels, "effective GB/s (read + write)",
                 f"LayerNorm on {data.get('adapter', '?')} ({data.get('backend', '')}), {data.get('dtype', 'float32')}")

NAMES = {"ours": "native_layer_norm", "torch": "torch eager", "compiled": "torch.compile", "ort": "ORT WebGPU"}


def _errors(png: str, rows: list[dict], labels: list[str], data: dict) -> int:
    """One panel a kind of row: grouped bars of max abs error (log), hatched to the panel's
    top where an implementation's outputs were not all finite."""
    kinds = list(rows[0]["accuracy"])
    runners = list(rows[0]["accuracy"][kinds[0]])
    fig, axes = plt.subplots(len(kinds), 1, figsize=(12, 3.2 * len(kinds)), squeeze=False)
    width = 0.8 / len(runners)
    described = data.get("accuracy_rows", {})
    for ax, kind in zip(axes[:, 0], kinds):
        errors = [[r["accuracy"][kind][name] for r in rows] for name in runners]
        finite = [e["max_abs"] for errs in errors for e in errs if e["max_abs"]]
        top = max(finite, default=1.0) * 10
        bottom = min(finite, default=1e-8) / 10
        for n, (name, errs) in enumerate(zip(runners, errors)):
            xs = [i + (n - (len(runners) - 1) / 2) * width for i in range(len(labels))]
            values = [top if e["nonfinite"] else (e["max_abs"] or bottom) for e in errs]
            bars = ax.bar(xs, values, width, label=NAMES.get(name, name))
            for bar, e in zip(bars, errs):
                if e["nonfinite"]:
                    bar.set_hatch("//")
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)
        ax.set_xticks(range(len(labels)), labels if ax is axes[-1, 0] else [], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("max abs error")
        ax.set_title(f"rows of {described.get(kind, kind)} (hatched to the top: outputs not finite)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"LayerNorm error against float64, {data.get('dtype', 'float32')}")
    fig.tight_layout()
    return _write(png, fig)


def _write(png: str, fig) -> int:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(png, buf.getvalue())
    print(f"wrote {png}")
    return 0


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
    return _write(png, fig)

if __name__ == "__main__":
    _interrupts.run(main)
