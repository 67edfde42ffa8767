"""Forward time of the default models in ExecuTorch's C++ runtime (LayerNorms on the native
WebGPUBackend, the rest on portable kernels or XNNPACK) against eager PyTorch, and its outputs
against eager's.

    python benchmarks/executorch_runtime.py [--models bart,florence2,whisper]
        [--cpu-backends portable,xnnpack] [--repeats N] [--json FILE] [--checkpoints DIR] [--save DIR]
    python benchmarks/executorch_runtime.py --files DIR [--repeats N] [--json FILE]

Each file is lowered as `pipeline.lower` does (portable) or as `export_model.py
--cpu-backend xnnpack` does, saved, loaded with `pipeline.native.load`, run once to warm up (shader
compilation, XNNPACK set-up) and then timed `--repeats` times; eager is timed the same way
under torch.no_grad. The models are the families' default builds (seeded weights), or with
--checkpoints DIR the Hugging Face directories DIR/<model>. Prints one line per run and writes the JSON (median seconds, and the
largest absolute difference from eager's outputs).

--save DIR keeps each file in DIR as ExecuTorch's bundled program (`<model>-<cpu backend>.bpte`:
the program, the model's inputs and eager's outputs).
--files DIR runs such bundles where the models cannot be built (no transformers, another torch):
ExecuTorch's runtime takes the inputs from the bundle and checks its outputs against eager's
there (its bundled-program check, within ATOL_EAGER), so no torch tensor crosses into ExecuTorch,
and a host whose torch is not the one ExecuTorch's wheel was built against runs them too. Each
run's outputs are also measured against eager's and, for a portable file, against the Python
runtime's (`pipeline.load`) on the same device, within ATOL_RUNTIMES: the bounds the test suite
holds the two runtimes to. The exit status is 1 when one does not hold. The backend's
implementation is PIPELINE_WEBGPU's.
"""

from __future__ import annotations

import argparse
import math
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
from pipeline.environment import implementation
from pipeline.evaluation.metrics import max_abs_error
from pipeline.ioutil import write_bytes_atomic, write_json_atomic

ATOL_EAGER = 1e-4  # ExecuTorch's runtime against eager float32 (tests/test_dawn.py's bound)
ATOL_RUNTIMES = 1e-5  # ExecuTorch's runtime against the Python runtime, both on the device
BUNDLE_SUFFIX = ".bpte"


def lower_to_file(spec, cpu_backend: str, path: Path) -> float:
    """Lower `spec`'s model for `cpu_backend` into `path`; returns seconds."""
    started = time.perf_counter()
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
    ran on (cores, processor, the backend's adapter and implementation, torch's threads);
    None, said on stderr, when the backend finds no device."""
    pipeline.native.register()
    available, adapter = pipeline.native.device()
    if not available:
        print(f"no device for the native backend: {adapter}", file=sys.stderr)
        return None
    return {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "adapter": adapter, "implementation": implementation(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads()}


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    """(first call, later calls) in seconds, and what the last call returned."""
    started = time.perf_counter()
    result = fn()
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return first, times, result


def listed(outputs) -> list:
    """A method's outputs as a list (ExecuTorch's runtime gives one; eager may give a tensor)."""
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def max_abs(got, want) -> float:
    """The largest absolute difference between two methods' outputs; inf where their number,
    shapes or dtypes differ, NaN where a value is NaN in one and not the other."""
    got, want = listed(got), listed(want)
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return math.inf
        both_nan = g.isnan() & w.isnan()
        difference = max_abs_error(g.masked_fill(both_nan, 0), w.masked_fill(both_nan, 0))
        if math.isnan(difference):
            return math.nan
        worst = max(worst, difference)
    return worst


def timed_row(program, inputs: tuple, repeats: int, **fields) -> tuple[dict, list]:
    """A report row for `program` on `inputs` (its timings after `fields`) and its outputs."""
    first, later, outputs = timed(lambda: program(*inputs), repeats)
    row = {**fields,
           "executorch_first_seconds": round(first, 3),
           "executorch_seconds": round(statistics.median(later), 3),
           "repeats": repeats}
    return row, outputs


def write_report(report: dict, path: Path | None) -> None:
    """The report so far, to `path` (after every row: a long run keeps what it measured)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, report)


def write_bundle(pte: Path, inputs: tuple, eager: list, path: Path) -> None:
    """ExecuTorch's bundled program at `path`: the file `pte`, its inputs and eager's outputs."""
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    from pipeline.pte.bundle import METHOD

    case = MethodTestCase(inputs=[t.clone() for t in inputs], expected_outputs=[t.clone() for t in eager])
    bundled = BundledProgram(None, [MethodTestSuite(METHOD, [case])], pte_file_path=str(pte))
    write_bytes_atomic(path, serialize_from_bundled_program_to_flatbuffer(bundled))


def build_and_run(args, report: dict) -> int:
    """Lower each model for each CPU backend, run it in ExecuTorch's runtime beside eager."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            spec = pipeline.models.build(name, checkpoint=args.checkpoints / name if args.checkpoints else None)
            model = spec.module.eval()
            with torch.no_grad():
                _, eager_times, eager = timed(lambda: model(*spec.example_inputs), args.repeats)
            eager, eager_seconds = listed(eager), statistics.median(eager_times)
            for cpu_backend in args.cpu_backends.split(","):
                path = Path(tmp) / f"{name}-{cpu_backend}.pte"
                lower_seconds = lower_to_file(spec, cpu_backend, path)
                row, got = timed_row(pipeline.native.load(path), spec.example_inputs, args.repeats,
                                     model=name, variant=spec.variant, cpu_backend=cpu_backend,
                                     pte_bytes=path.stat().st_size, lower_seconds=round(lower_seconds, 2))
                row.update(eager_seconds=round(eager_seconds, 3),
                           ratio_to_eager=round(row["executorch_seconds"] / eager_seconds, 2),
                           max_abs_vs_eager=max_abs(got, eager))
                report["results"].append(row)
                print(f"{name} {cpu_backend}: executorch {row['executorch_seconds']} s "
                      f"(first {row['executorch_first_seconds']} s), eager {row['eager_seconds']} s, "
                      f"x{row['ratio_to_eager']}, max abs vs eager {row['max_abs_vs_eager']:.3g}", flush=True)
                write_report(report, args.json)
                if args.save:
                    args.save.mkdir(parents=True, exist_ok=True)
                    write_bundle(path, spec.example_inputs, eager, args.save / f"{path.stem}{BUNDLE_SUFFIX}")
    return 0


def run_files(args, report: dict) -> int:
    """Run the bundles `--save` kept: ExecuTorch's runtime, driven from C++ (pipeline.native.
    NativeBundle), checks each against eager's outputs, and its outputs are measured against
    them and the Python runtime's."""
    from pipeline.interpreter import Program
    from pipeline.pte.file import PteFile

    paths = sorted(args.files.glob(f"*-*{BUNDLE_SUFFIX}"))
    if not paths:
        print(f"executorch_runtime: no <model>-<cpu backend>{BUNDLE_SUFFIX} in {args.files}", file=sys.stderr)
        return 1
    failed = 0
    for path in paths:
        model, cpu_backend = path.stem.rsplit("-", 1)
        bundle = pipeline.native.NativeBundle(path.read_bytes(), str(path))
        program, inputs, eager = bundle.program, bundle.inputs, bundle.expected
        first = bundle.run()
        later = [bundle.run() for _ in range(args.repeats)]
        got = bundle.outputs()
        row = {"model": model, "cpu_backend": cpu_backend, "pte_bytes": len(program),
               "executorch_first_seconds": round(first, 3),
               "executorch_seconds": round(statistics.median(later), 3), "repeats": args.repeats,
               "executorch_check": bundle.check(ATOL_EAGER),
               "max_abs_vs_eager": max_abs(got, eager)}
        passed = row["executorch_check"] and row["max_abs_vs_eager"] <= ATOL_EAGER
        said = (f"ExecuTorch's check {'held' if row['executorch_check'] else 'missed'}, "
                f"max abs vs eager {row['max_abs_vs_eager']:.3g}")
        if cpu_backend == "portable":  # the Python runtime runs no XNNPACK delegate
            python_runtime = Program(PteFile(program, f"{path}: its program"))
            row["max_abs_vs_python_runtime"] = max_abs(got, python_runtime(*inputs))
            passed = passed and row["max_abs_vs_python_runtime"] <= ATOL_RUNTIMES
            said += f", vs the Python runtime {row['max_abs_vs_python_runtime']:.3g}"
        row["passed"] = passed
        failed += not passed
        report["results"].append(row)
        print(f"{path.name}: executorch {row['executorch_seconds']} s (first {row['executorch_first_seconds']} s), "
              f"{said}: {'passed' if passed else 'FAILED'}", flush=True)
        write_report(report, args.json)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bart,florence2,whisper")
    parser.add_argument("--cpu-backends", default="portable,xnnpack")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--checkpoints", type=Path, metavar="DIR", help="the models' Hugging Face directories, DIR/<model>")
    parser.add_argument("--save", type=Path, metavar="DIR", help="keep each file with its inputs and eager's outputs in DIR (bundled programs)")
    parser.add_argument("--files", type=Path, metavar="DIR", help="run the bundles --save kept in DIR (no model is built)")
    args = parser.parse_args(argv)
    if args.files is not None and (args.save or args.checkpoints):
        parser.error("argument --files: not with --save or --checkpoints")

    machine = native_machine()
    if machine is None:
        return 1
    report = {
        "machine": machine,
        "command": "python benchmarks/executorch_runtime.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "results": [],
    }
    return run_files(args, report) if args.files is not None else build_and_run(args, report)


if __name__ == "__main__":
    sys.exit(main())
