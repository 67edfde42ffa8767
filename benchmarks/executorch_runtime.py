"""Forward time of the default models in ExecuTorch's C++ runtime (LayerNorms on the native
WebGPUBackend, the rest on portable kernels or XNNPACK) against eager PyTorch.

    python benchmarks/executorch_runtime.py [--models bart,florence2,whisper]
        [--cpu-backends portable,xnnpack] [--repeats N] [--json FILE]

Each file is lowered as `pipeline.lower` does (portable) or as `export_model.py
--cpu-backend xnnpack` does, saved, loaded with `pipeline.native.load`, run once to warm up (shader
compilation, XNNPACK set-up) and then timed `--repeats` times; eager is timed the same way
under torch.no_grad. Prints one line per run and writes the JSON (median seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import pipeline
import pipeline.native


def lower_to_file(name: str, cpu_backend: str, path: Path) -> float:
    """Lower the default build of `name` for `cpu_backend` into `path`; returns seconds."""
    started = time.perf_counter()
    spec = pipeline.models.build(name)
    model = spec.module.eval()
    if cpu_backend == "portable":
        pipeline.lower(model, spec.example_inputs).save(path)
    else:
        from pipeline.aot.lowering import lower_to_edge

        # As export_model --cpu-backend xnnpack lowers (the linear rewrite included).
        edge, _ = lower_to_edge(model, spec.example_inputs, None, "xnnpack")
        path.write_bytes(edge.to_executorch().buffer)
    return time.perf_counter() - started


def native_machine() -> dict | None:
    """The native backend registered in ExecuTorch's runtime, and the machine a benchmark
    ran on (cores, processor, the backend's adapter, torch's threads); None, said on stderr,
    when the backend finds no device."""
    pipeline.native.register()
    available, adapter = pipeline.native.device()
    if not available:
        print(f"no device for the native backend: {adapter}", file=sys.stderr)
        return None
    return {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "adapter": adapter, "torch_threads": torch.get_num_threads()}


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    """(first call, later calls) in seconds."""
    started = time.perf_counter()
    fn()
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return first, times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bart,florence2,whisper")
    parser.add_argument("--cpu-backends", default="portable,xnnpack")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    machine = native_machine()
    if machine is None:
        return 1
    report = {
        "machine": machine,
        "command": "python benchmarks/executorch_runtime.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            spec = pipeline.models.build(name)
            model = spec.module.eval()
            with torch.no_grad():
                _, eager = timed(lambda: model(*spec.example_inputs), args.repeats)
            for cpu_backend in args.cpu_backends.split(","):
                path = Path(tmp) / f"{name}-{cpu_backend}.pte"
                lower_seconds = lower_to_file(name, cpu_backend, path)
                program = pipeline.native.load(path)
                first, later = timed(lambda: program(*spec.example_inputs), args.repeats)
                row = {
                    "model": name,
                    "variant": spec.variant,
                    "cpu_backend": cpu_backend,
                    "pte_bytes": path.stat().st_size,
                    "lower_seconds": round(lower_seconds, 2),
                    "executorch_first_seconds": round(first, 3),
                    "executorch_seconds": round(statistics.median(later), 3),
                    "eager_seconds": round(statistics.median(eager), 3),
                    "ratio_to_eager": round(statistics.median(later) / statistics.median(eager), 2),
                    "repeats": args.repeats,
                }
                report["results"].append(row)
                print(f"{name} {cpu_backend}: executorch {row['executorch_seconds']} s "
                      f"(first {row['executorch_first_seconds']} s), eager {row['eager_seconds']} s, "
                      f"x{row['ratio_to_eager']}", flush=True)
                if args.json:  # after every row: a long run keeps what it measured
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
