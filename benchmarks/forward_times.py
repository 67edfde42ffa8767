"""Forward time of the three default models: eager PyTorch, the program `pipeline.lower`
returns (the serialized program, run in memory) and the same program loaded from its
`.pte` (`pipeline.load`), its forward broken down by what its steps run; plus the file's
size, the load time and what loading adds to peak memory, each load in a fresh process.

    python benchmarks/forward_times.py --json benchmarks/results/forward-times.json
    python benchmarks/forward_times.py --before /tmp/old    # also an earlier checkout's
    python benchmarks/forward_times.py --checkpoints DIR    # the Hugging Face directories DIR/<model>

With `--before DIR` (a checkout of an earlier commit, e.g. `git worktree add /tmp/old
<commit>`) each model is also lowered, saved and loaded by that checkout, in a process of
its own that runs one forward whenever this one asks and reports its time; its file gets
the same load probe, run by that checkout.

Eager, the in-memory program, the loaded program and the earlier checkout's are timed in
turn within each repeat (a machine whose load drifts moves them together); medians after a
warm-up. The breakdown comes from
separate timed calls (`program(*inputs, timings=...)`), medians per part:
`layer_norm_delegates` (the WebGPU delegate calls, host to host), `matmuls` (addmm, mm,
bmm, convolution), `copies` (the plan's copy-shaped ops: permute/expand/view/... `_copy`,
clones, dim-order copies), `other_kernels` (everything else the plan runs), and
`interpreter`: the timed call's wall time less its steps' (input checks and copies, the
step loop, output copies, and the timing itself).

Run in an older checkout (where `pipeline.lower` returned the fx interpreter over the edge
program) it times that instead and skips the file columns: that is how the "in-memory
executor before" column was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

LOAD_PROBE = """
import sys, time, torch, pipeline
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
inputs = torch.load(sys.argv[2])
before = status('VmRSS:')
start = time.perf_counter()
program = pipeline.load(sys.argv[1])
seconds = time.perf_counter() - start
loaded = status('VmHWM:') - before, status('VmRSS:') - before
program(*inputs)
print(seconds, *loaded, status('VmHWM:') - before, status('VmRSS:') - before)
"""

MATMULS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::convolution", "aten::linear")
PARTS = ("layer_norm_delegates", "matmuls", "copies", "other_kernels", "interpreter")


def part(label: str) -> str:
    """Which part of the breakdown a step of this label belongs to."""
    name = label.split(".")[0]
    if label == "delegate":
        return "layer_norm_delegates"
    if name in MATMULS:
        return "matmuls"
    if name.endswith("_copy") or name in ("aten::clone", "dim_order_ops::_clone_dim_order"):
        return "copies"
    return "other_kernels"


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _medians_in_turn(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median of the seconds each function returns, the functions called in turn within each repeat."""
    for fn in fns.values():
        fn()  # warm-up: pipelines compiled, pages touched
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(fn())
    return {name: statistics.median(t) for name, t in times.items()}


def breakdown(program, inputs: tuple, repeats: int) -> dict[str, float]:
    """Median seconds per part of the program's forward (see the module docstring)."""
    per_call: list[dict[str, float]] = []
    for _ in range(repeats):
        timings: list[tuple[str, float]] = []
        wall = _timed(lambda: program(*inputs, timings=timings))
        parts = dict.fromkeys(PARTS, 0.0)
        for label, seconds in timings:
            parts[part(label)] += seconds
        parts["interpreter"] = wall - sum(parts.values())
        per_call.append(parts)
    return {name: statistics.median(p[name] for p in per_call) for name in PARTS}


BEFORE_PROBE = """
import sys, time, torch, pipeline
spec = pipeline.models.build(sys.argv[1], **({"checkpoint": sys.argv[4]} if len(sys.argv) > 4 else {}))
pipeline.lower(spec.module, spec.example_inputs, spec.dynamic_shapes).save(sys.argv[2])
program = pipeline.load(sys.argv[2])
inputs = torch.load(sys.argv[3])
print('ready', len(getattr(program, 'step_labels', ())), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    program(*inputs)
    print(time.perf_counter() - start, flush=True)
"""


def _checkout_env(checkout: Path) -> dict[str, str]:
    """The environment that runs `checkout`'s pipeline, its native libraries its own."""
    return {**os.environ, "PYTHONPATH": str(checkout), "PIPELINE_NATIVE_BUILD_DIR": str(checkout / "build" / "native")}


class Before:
    """Model `name` lowered, saved to `path` and loaded by an earlier checkout, in a process
    of its own: calling it runs one forward there and returns that forward's seconds."""

    def __init__(self, checkout: Path, name: str, path: Path, inputs: Path, checkpoint: Path | None = None) -> None:
        self.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=checkout, check=True).stdout.strip()
        probe = [name, str(path.resolve()), str(inputs.resolve())]
        probe += [str(checkpoint.resolve())] if checkpoint else []
        self.process = subprocess.Popen([sys.executable, "-c", BEFORE_PROBE, *probe],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=checkout,
                                        env=_checkout_env(checkout))
        ready, _, steps = self.process.stdout.readline().partition(" ")
        if ready != "ready":
            raise RuntimeError(f"{checkout}: the earlier checkout did not lower and load {name}")
        self.steps = int(steps)  # 0 where that checkout does not label its steps

    def __call__(self) -> float:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def _load_probe(path: Path, inputs: Path, checkout: Path | None = None) -> dict:
    """Load time and memory (bytes over the process before loading) right after the load
    and after a first forward, in a fresh process (of `checkout`'s pipeline if given)."""
    probe = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(path.resolve()), str(inputs.resolve())],
                           capture_output=True, text=True, check=True,
                           **({} if checkout is None else {"cwd": checkout, "env": _checkout_env(checkout)}))
    seconds, *sizes = probe.stdout.split()
    keys = ("load_peak_added_bytes", "load_rss_added_bytes", "forward_peak_added_bytes", "forward_rss_added_bytes")
    return {"load_s": float(seconds), **dict(zip(keys, map(int, sizes)))}


def measure(name: str, repeats: int, folder: Path, before: Path | None = None, checkpoint: Path | None = None) -> dict:
    import pipeline

    spec = pipeline.models.build(name, checkpoint=checkpoint)
    inputs = spec.example_inputs
    # The machine's load (1, 5, 15 minutes) before and after: timings under other work are not comparable.
    row = {"model": name, "variant": spec.variant, "load_average": [os.getloadavg()]}
    program = pipeline.lower(spec.module, inputs, spec.dynamic_shapes)

    def eager() -> float:
        with torch.no_grad():
            return _timed(lambda: spec.module(*inputs))

    def in_memory() -> float:
        return _timed(lambda: program(*inputs))

    if not hasattr(pipeline, "load"):
        row.update(_medians_in_turn({"eager_s": eager, "in_memory_s": in_memory}, repeats))
        return row
    path = folder / f"{name}.pte"
    program.save(path)
    row["pte_bytes"] = path.stat().st_size
    saved = folder / f"{name}.inputs"
    torch.save(inputs, saved)
    loaded = pipeline.load(path)
    fns = {"eager_s": eager, "in_memory_s": in_memory, "loaded_file_s": lambda: _timed(lambda: loaded(*inputs))}
    before_path = folder / f"{name}-before.pte"
    earlier = Before(before, name, before_path, saved, checkpoint) if before is not None else None
    if earlier is not None:
        fns["before_s"] = earlier
    try:
        times = _medians_in_turn(fns, repeats)
    finally:
        if earlier is not None:
            earlier.close()
    row.update(times)
    if earlier is not None:
        row["before_commit"] = earlier.commit
        row["ratio_before"] = times["before_s"] / times["eager_s"]
        row["before_pte_bytes"] = before_path.stat().st_size
        row["before_steps"] = earlier.steps
    row["ratio"] = times["loaded_file_s"] / times["eager_s"]
    row["steps"] = len(loaded.step_labels)
    row["breakdown_s"] = breakdown(loaded, inputs, repeats)
    row["load_average"].append(os.getloadavg())
    if earlier is not None:
        row["load_before"] = _load_probe(before_path, saved, before)
    row["load"] = _load_probe(path, saved)
    return row


def table(rows: list[dict]) -> str:
    """The same-run table, Markdown: one line per model and program, times in ms."""
    ms = lambda s: f"{s * 1e3:,.0f}"  # noqa: E731
    mb = lambda b: f"{b / 1e6:,.0f}"  # noqa: E731
    lines = ["| model | program | file MB | forward ms | x eager | LayerNorm delegates | matmuls | copies "
             "| other kernels | interpreter | steps | load s | load adds to peak MB | peak after a forward MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def loading(load: dict) -> str:
        return f"{load['load_s']:.2f} | {mb(load['load_peak_added_bytes'])} | {mb(load['forward_peak_added_bytes'])}"

    for r in rows:
        model = f"{r['model']}-{r['variant']}"
        lines.append(f"| {model} | eager | | {ms(r['eager_s'])} | 1 | | | | | | | | | |")
        if "before_s" in r:
            lines.append(f"| {model} | {r['before_commit']}, lowered and loaded (before) | {mb(r['before_pte_bytes'])} "
                         f"| {ms(r['before_s'])} | {r['ratio_before']:.2f} | | | | | | {r['before_steps']} "
                         f"| {loading(r['load_before'])} |")
        b = r["breakdown_s"]
        lines.append(f"| {model} | loaded (after) | {mb(r['pte_bytes'])} | {ms(r['loaded_file_s'])} "
                     f"| {r['ratio']:.2f} | " + " | ".join(ms(b[p]) for p in PARTS)
                     + f" | {r['steps']} | {loading(r['load'])} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bart,whisper,florence2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--before", metavar="DIR", type=Path,
                        help="an earlier checkout whose lowering and pipeline.load to time too")
    parser.add_argument("--checkpoints", type=Path, metavar="DIR", help="the models' Hugging Face directories, DIR/<model>")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            print(f"[{name}] measuring ...", file=sys.stderr, flush=True)
            checkpoint = args.checkpoints / name if args.checkpoints else None
            rows.append(measure(name, args.repeats, Path(folder), args.before, checkpoint))
            print(json.dumps(rows[-1]), flush=True)
    if rows and "breakdown_s" in rows[0]:
        print(table(rows))
    if args.json:
        from pipeline.ioutil import write_json_atomic
        from pipeline.runtime import device_info

        write_json_atomic(args.json, {"command": " ".join(sys.argv), "torch_threads": torch.get_num_threads(),
                                      "adapter": device_info()["adapter"], "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
