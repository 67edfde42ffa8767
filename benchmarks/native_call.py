"""A LayerNorm delegate's call from host tensors to host tensors in both runtimes, same run:
one nn.LayerNorm lowered as `pipeline.lower` does and saved, then its forward timed in
ExecuTorch's C++ runtime with the native WebGPUBackend (`pipeline.native.load`) and in our
Python runtime (`pipeline.load`), beside the Python runtime's bare delegate call (`call_us`:
`pipeline.benchmark.layer_norm_delegate`, one crossing into C++ on wgpu), the same call
launched from Python (`python_launch_us`: `native_layer_norm`, resident weight and bias) and
torch on the CPU. Interleaved per shape (A B C D D C B A, the mean of both medians).

    python benchmarks/native_call.py [--shapes 16x768,1500x384,...] [--json FILE]

ExecuTorch's wheel needs the torch it was built with, so this runs where the project is set
up (not on a bare GPU host): here, on lavapipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

import pipeline
import pipeline.native
from executorch_runtime import native_machine  # benchmarks/, the script's own directory
from pipeline.benchmark import layer_norm_delegate, parse_shapes, wall_us
from pipeline.ioutil import write_json_atomic
from pipeline.runtime import native_layer_norm

SHAPES = "16x768,1500x384,1024x768,1500x768,4096x768"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    machine = native_machine()
    if machine is None:
        return 1
    report = {"machine": {**machine, "load_average": os.getloadavg()},
              "command": "python benchmarks/native_call.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rows, width in parse_shapes(args.shapes):
            gen = torch.Generator().manual_seed(rows + width)
            module = torch.nn.LayerNorm(width).eval()
            with torch.no_grad():
                module.weight.copy_(torch.randn(width, generator=gen))
                module.bias.copy_(torch.randn(width, generator=gen))
            x = torch.randn(rows, width, generator=gen)
            path = Path(tmp) / f"ln-{rows}x{width}.pte"
            pipeline.lower(module, (x,)).save(path)
            native, ours = pipeline.native.load(path), pipeline.load(path)
            want = torch.nn.functional.layer_norm(x, (width,), module.weight, module.bias)
            delegate = layer_norm_delegate(module.weight.detach(), module.bias.detach())
            calls = {
                "executorch_us": lambda: native(x)[0],
                "python_runtime_us": lambda: ours(x),
                "call_us": lambda: delegate(x)[0],
                "python_launch_us": lambda: native_layer_norm(x, (width,), module.weight.detach(),
                                                              module.bias.detach(), stats=False, resident=True)[0],
            }
            for name, call in calls.items():
                if not torch.allclose(call(), want, rtol=1e-4, atol=1e-4):
                    raise SystemExit(f"{name} is wrong at {rows}x{width}")
            times = {name: [] for name in calls}
            for order in (list(calls), list(calls)[::-1]):
                for name in order:
                    times[name].append(wall_us(calls[name]))
            row = {"rows": rows, "width": width, "mbytes": round(x.numel() * 4 / 1e6, 2),
                   **{name: round(sum(t) / 2, 1) for name, t in times.items()},
                   "torch_cpu_us": round(wall_us(lambda: module(x)), 1)}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
