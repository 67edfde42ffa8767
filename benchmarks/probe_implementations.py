"""The kernel on both WebGPU implementations, same run (H200): wgpu (naga) before and after
the change that made the kernel valid for Tint, Dawn (Tint), each implementation's own WGSL
copy of the same bytes, and torch.compile.

Per model shape, at one dtype, interleaved (each measured twice, A B C C B A, the mean kept):
- wgpu_before  wgpu, the module built with the subgroup reduction file of an earlier commit
               (`--previous DIR`: its pipeline/wgsl/reduce_subgroup.wgsl; the subgroup size read
               from the builtin into a private variable, which Tint refuses)
- wgpu         wgpu, the product (the subgroup size passed down from the builtin)
- dawn         Dawn, the product (with `enable subgroups;`)
- wgpu_copy, dawn_copy   bench_copy.wgsl on each implementation
- compiled, eager        torch.compile and eager F.layer_norm at that dtype (CUDA graphs)
Every kernel is first checked against float64 on a sample of the shape's rows on both
implementations.

    mkdir -p .previous-wgsl && git show 320db8d:pipeline/wgsl/reduce_subgroup.wgsl > .previous-wgsl/reduce_subgroup.wgsl
    OUT=dir python benchmarks/probe_implementations.py --previous .previous-wgsl --dtype float32
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch

from pipeline.benchmark import (MODEL_SHAPES, parse_shapes, time_copy, time_kernel, time_torch,
                                time_torch_compiled)
from pipeline.runtime import device as runtime_device
from pipeline.wgsl import ShaderFiles

kernel = importlib.import_module("pipeline.runtime.launch")


@dataclass(frozen=True)
class _FilesFrom(ShaderFiles):
    """Today's files, but those present in `directory`."""

    directory: Path = Path()

    def shader_source(self, name: str) -> str:
        other = self.directory / name
        return other.read_text() if other.is_file() else super().shader_source(name)


@dataclass(frozen=True)
class FromDirectory(kernel.KernelConfig):
    """A configuration whose module takes the files found in `directory` over today's."""

    directory: Path = Path()

    def source(self, files: ShaderFiles) -> str:
        return super().source(_FilesFrom(files.compiler, self.directory))


def use(name: str) -> runtime_device.Gpu:
    os.environ[runtime_device.IMPLEMENTATION_ENV] = name
    return runtime_device.gpu()


def check(rows: int, width: int, dtype: str) -> dict:
    """Max error of out against float64 over eager's at `dtype`, on each implementation,
    for up to 512 of the shape's rows (the host path is not what is timed here)."""
    rows = min(rows, 512)
    gen = torch.Generator().manual_seed(rows + width)
    kind = kernel.DTYPES[dtype]
    x = (torch.randn(rows, width, generator=gen) * 3 + torch.randn(rows, 1, generator=gen) * 30).to(kind)
    w, b = torch.randn(width, generator=gen).to(kind), torch.randn(width, generator=gen).to(kind)
    truth = torch.nn.functional.layer_norm(x.double(), (width,), w.double(), b.double())
    eager = (torch.nn.functional.layer_norm(x, (width,), w, b).double() - truth).abs().max().item()
    ratios = {}
    for name in ("wgpu", "dawn"):
        use(name)
        out = kernel.native_layer_norm(x, (width,), w, b, stats=False)[0]
        ratios[name] = round((out.double() - truth).abs().max().item() / max(eager, 1e-30), 3)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--previous", type=Path, required=True)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="also time wgpu with the kernel files in DIR (repeatable)")
    parser.add_argument("--dtype", default="float32", choices=list(kernel.DTYPES))
    parser.add_argument("--shapes", default="model")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    variants = {"wgpu_before": args.previous, **{v.split("=")[0]: Path(v.split("=")[1]) for v in args.variant}}
    shapes = parse_shapes(args.shapes) if args.shapes != "model" else MODEL_SHAPES
    out = Path(os.environ.get("OUT", "."))
    info = {name: runtime_device.device_info() for name in ("wgpu", "dawn") if use(name)}
    print(json.dumps(info, indent=1), flush=True)
    results = []
    started = time.time()
    for rows, width in shapes:
        row = {"rows": rows, "width": width, "mbytes": round(rows * width * kernel.DTYPES[args.dtype].itemsize / 1e6, 2),
               "error_vs_eager": check(rows, width, args.dtype)}

        def kernel_us(name: str, directory: Path | None = None) -> float:
            g = use(name)
            config = kernel.device_config(g, width, True, True, args.dtype, rows=rows, write_stats=False)
            if directory is not None:
                config = FromDirectory(**{f: getattr(config, f) for f in kernel.KernelConfig.__dataclass_fields__},
                                       directory=directory)
            if directory is None or "uniform" not in directory.name:
                return time_kernel(rows, width, [config], repeats=args.repeats, dtype=args.dtype)[0][0][0]
            # The subgroup size in the uniform Params' fourth word (the struct's padding until now).
            packed = kernel.pack_params(rows, 1e-5)
            packed[3] = g.subgroup_size
            with mock.patch("pipeline.benchmark.pack_params", lambda *_: packed):
                return time_kernel(rows, width, [config], repeats=args.repeats, dtype=args.dtype)[0][0][0]

        def copy_us(name: str) -> float | None:
            use(name)
            return time_copy(rows, width, repeats=args.repeats, itemsize=kernel.DTYPES[args.dtype].itemsize)

        runs = {**{key: (lambda d=d: kernel_us("wgpu", d)) for key, d in variants.items()},
                **{key + "_dawn": (lambda d=d: kernel_us("dawn", d)) for key, d in variants.items() if key != "wgpu_before"},
                "wgpu": lambda: kernel_us("wgpu"),
                "dawn": lambda: kernel_us("dawn"), "wgpu_copy": lambda: copy_us("wgpu"),
                "dawn_copy": lambda: copy_us("dawn")}
        order = list(runs) + list(reversed(runs))
        times: dict[str, list[float]] = {k: [] for k in runs}
        for key in order:
            t = runs[key]()
            if t is not None:
                times[key].append(t)
        for key, values in times.items():
            row[key + "_us"] = round(sum(values) / len(values), 2) if values else None
        row["compiled_us"] = time_torch_compiled(rows, width, repeats=args.repeats, dtype=args.dtype)
        row["eager_us"] = time_torch(rows, width, repeats=args.repeats, dtype=args.dtype)[0]
        results.append(row)
        print(json.dumps(row), f"{time.time() - started:.0f} s", flush=True)
        # Written after every shape: what was measured comes back even if the call is cut short.
        doc = {"dtype": args.dtype, "devices": info, "torch": torch.__version__, "results": results}
        (out / f"implementations-{args.dtype}.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
