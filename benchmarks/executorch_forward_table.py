"""Forward time of the default models, same run: ExecuTorch's runtime with XNNPACK, with
and without our WebGPU delegate, against eager PyTorch and our Python runtime.

    python benchmarks/executorch_forward_table.py [--models bart,florence2,whisper] [--repeats N] [--json FILE]
        [--checkpoints DIR]

Columns, each built from the same model (default variant, seeded weights; with --checkpoints
DIR, the Hugging Face directory DIR/<model>) and run on its example inputs:
- eager: the module under torch.no_grad;
- python runtime: `pipeline.lower` (LayerNorms on WebGPU, the rest on torch's kernels
  through the file's portable ops), run by `pipeline.load`'s interpreter;
- executorch + xnnpack + webgpu: the file `export_model.py --cpu-backend xnnpack` writes,
  in ExecuTorch's runtime with the native backend;
- executorch + xnnpack: the same export without our partitioner (LayerNorms where
  XNNPACK or the portable kernels take them), in ExecuTorch's runtime.
Every column is called once to warm up, then the columns take turns, one call each per
round, for `--repeats` rounds (so a disturbance hits all of them alike); medians are
reported, with each column's error against eager float64 (relative L2, max abs). The JSON
is written (atomically) after every model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import pipeline
import pipeline.native
from pipeline.evaluation.eager import run_eager, to_float64
from pipeline.evaluation.executorch_verdict import reference_buffer
from pipeline.evaluation.metrics import compare, flatten_output
from pipeline.ioutil import write_json_atomic
from pipeline.native.trace import TracedProgram  # with nothing traced: ExecuTorch's runtime as it stands
from executorch_runtime import native_machine  # benchmarks/, the script's own directory

COLUMNS = ("eager", "python runtime", "executorch + xnnpack + webgpu", "executorch + xnnpack")


def build_columns(name: str, say, checkpoint: Path | None = None) -> tuple[object, dict[str, object], dict[str, float]]:
    """The model's spec, a callable per column, and each column's build seconds."""
    from pipeline.aot.lowering import lower_to_edge  # imports ExecuTorch: not before --help

    spec = pipeline.models.build(name, checkpoint=checkpoint)
    model = spec.module.eval()
    calls, seconds = {}, {}

    def eager(*inputs):
        with torch.no_grad():
            return model(*inputs)

    calls["eager"], seconds["eager"] = eager, 0.0
    started = time.perf_counter()
    say(f"{name}: lowering for the python runtime")
    calls["python runtime"] = pipeline.lower(model, spec.example_inputs)
    seconds["python runtime"] = time.perf_counter() - started
    started = time.perf_counter()
    say(f"{name}: lowering with xnnpack and our delegate")
    edge, coverage = lower_to_edge(model, spec.example_inputs, spec.dynamic_shapes, "xnnpack")
    if not coverage.complete:
        raise RuntimeError(f"{name}: {coverage.delegated}/{coverage.total} LayerNorms delegated")
    calls["executorch + xnnpack + webgpu"] = TracedProgram(edge.to_executorch().buffer)
    seconds["executorch + xnnpack + webgpu"] = time.perf_counter() - started
    del edge
    started = time.perf_counter()
    say(f"{name}: lowering with xnnpack alone")
    calls["executorch + xnnpack"] = TracedProgram(reference_buffer(spec, "xnnpack"))
    seconds["executorch + xnnpack"] = time.perf_counter() - started
    return spec, calls, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bart,florence2,whisper")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--checkpoints", type=Path, metavar="DIR", help="the models' Hugging Face directories, DIR/<model>")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    machine = native_machine()
    if machine is None:
        return 1
    report = {
        "command": "python benchmarks/executorch_forward_table.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine,
        "columns": list(COLUMNS),
        "results": [],
    }
    for name in args.models.split(","):
        spec, calls, build_seconds = build_columns(name, say, args.checkpoints / name if args.checkpoints else None)
        inputs = spec.example_inputs
        exact = flatten_output(run_eager(*to_float64(spec.module, inputs), keep_tensors=False).outputs)
        times: dict[str, list[float]] = {c: [] for c in COLUMNS}
        errors = {}
        for column in COLUMNS:  # warm-up: shader compilation, XNNPACK set-up, first-touch of the weights
            say(f"{name}: warm-up {column}")
            c = compare(flatten_output(calls[column](*inputs)), exact)
            errors[column] = {"rel_l2": c["rel_l2"], "max_abs": c["max_abs"]}
        for r in range(args.repeats):
            say(f"{name}: round {r + 1}/{args.repeats}")
            for column in COLUMNS:
                started = time.perf_counter()
                calls[column](*inputs)
                times[column].append(time.perf_counter() - started)
        row = {"model": name, "variant": spec.variant, "repeats": args.repeats,
               "seconds": {c: statistics.median(times[c]) for c in COLUMNS},
               "all_seconds": times, "build_seconds": build_seconds, "vs_fp64": errors}
        report["results"].append(row)
        print(f"{name}-{spec.variant}: " + ", ".join(f"{c} {row['seconds'][c]:.3f} s" for c in COLUMNS), flush=True)
        if args.json:
            write_json_atomic(args.json, report)
        del calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
