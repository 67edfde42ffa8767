"""Forward time of the three default models: eager PyTorch, the program `pipeline.lower`
returns (the serialized program, run in memory) and the same program loaded from its
`.pte`; plus the load time and what loading adds to peak memory, each load in a fresh
process.

    python benchmarks/forward_times.py --json benchmarks/results/forward-times.json

Run in an older checkout (where `pipeline.lower` returned the fx interpreter over the edge
program) it times that instead and skips the file columns: that is how the "in-memory
executor before" column was measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LOAD_PROBE = """
import sys, time, pipeline, pipeline.executor
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = status('VmRSS:')
start = time.perf_counter()
program = pipeline.load(sys.argv[1])
seconds = time.perf_counter() - start
print(seconds, status('VmHWM:') - before, status('VmRSS:') - before)
"""


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: pipelines compiled, pages touched
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, repeats: int, folder: Path) -> dict:
    import pipeline

    spec = pipeline.models.build(name)
    inputs = spec.example_inputs
    row = {"model": name, "variant": spec.variant}
    with torch.no_grad():
        row["eager_s"] = _median_seconds(lambda: spec.module(*inputs), repeats)
    program = pipeline.lower(spec.module, inputs, spec.dynamic_shapes)
    row["in_memory_s"] = _median_seconds(lambda: program(*inputs), repeats)
    if not hasattr(pipeline, "load"):
        return row
    path = folder / f"{name}.pte"
    program.save(path)
    loaded = pipeline.load(path)
    row["loaded_file_s"] = _median_seconds(lambda: loaded(*inputs), repeats)
    row["pte_bytes"] = path.stat().st_size
    probe = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(path)], capture_output=True, text=True, check=True)
    seconds, peak_added, rss_added = probe.stdout.split()
    row["load_s"] = float(seconds)
    row["load_peak_added_bytes"] = int(peak_added)
    row["load_rss_added_bytes"] = int(rss_added)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bart,florence2,whisper")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            print(f"[{name}] measuring ...", file=sys.stderr, flush=True)
            rows.append(measure(name, args.repeats, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        from pipeline.runtime import device_info

        result = {"command": " ".join(sys.argv), "torch_threads": torch.get_num_threads(),
                  "adapter": device_info()["adapter"], "rows": rows}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
