"""Damaged-file sweeps: run many damaged copies of a `.pte` through a runtime, each case in a
worker process, so that a crash (a signal) is recorded against the case that caused it
instead of taking the test run down.

    outcomes = sweep("python", pte_path, inputs_path, cases)   # {case: outcome}

A case is text:
    flip OFFSET BIT        one bit of the file flipped
    set OFFSET HEX         bytes at OFFSET replaced
    cut SIZE               the first SIZE bytes kept
    random SEED SIZE       random bytes with the `.pte` identifier at 4..8
    garbage SEED SIZE      random bytes
    zeros SIZE             zero bytes with the `.pte` identifier at 4..8
    fifo                   a named pipe where the file should be
    truncated-while-loaded the file loaded, then cut to half, then the program called
    overwritten-while-loaded  the file loaded, then overwritten in place with other bytes
An outcome is "same" (loads and runs to the intact file's outputs, bit for bit),
"different", "refused-load ERROR MESSAGE" / "refused-call ERROR MESSAGE", or "crash SIGNAL"
(a case taking more than 60 s ends as "crash SIGALRM"). The worker is this file:
`python damage.py worker RUNTIME PTE INPUTS`, cases on stdin, an outcome line per case.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the checkout, whose pipeline the worker imports
CASE_SECONDS = 60


def damage(data: bytes, case: str) -> bytes:
    kind, *args = case.split()
    if kind == "flip":
        offset, bit = (int(a) for a in args)
        out = bytearray(data)
        out[offset] ^= 1 << bit
        return bytes(out)
    if kind == "set":
        offset, replacement = int(args[0]), bytes.fromhex(args[1])
        return data[:offset] + replacement + data[offset + len(replacement):]
    if kind == "cut":
        return data[: int(args[0])]
    if kind in ("random", "garbage"):
        seed, size = (int(a) for a in args)
        out = bytearray(random.Random(seed).randbytes(size))
        if kind == "random" and size >= 8:
            out[4:8] = b"ET12"
        return bytes(out)
    if kind == "zeros":
        out = bytearray(int(args[0]))
        out[4:8] = b"ET12"
        return bytes(out)
    raise ValueError(case)


def sweep(runtime: str, pte: Path, inputs: Path, cases: list[str], timeout: float = 600) -> dict[str, str]:
    """Each case's outcome; a worker that dies is replaced and its case recorded as a crash."""
    outcomes: dict[str, str] = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pending = list(cases)
    while pending:
        with tempfile.TemporaryFile("w+") as feed:
            feed.write("".join(f"{c}\n" for c in pending))
            feed.seek(0)
            proc = subprocess.run([sys.executable, str(HERE / "damage.py"), "worker", runtime, str(pte), str(inputs)],
                                  stdin=feed, capture_output=True, text=True, env=env, timeout=timeout)
        done = [line.removeprefix("outcome ") for line in proc.stdout.splitlines() if line.startswith("outcome ")]
        if not done and "worker ready" not in proc.stdout:
            raise RuntimeError(f"the damage worker did not start: {proc.stderr[-2000:]}")
        outcomes.update(zip(pending, done))
        pending = pending[len(done):]
        if pending:
            died = f"crash {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else \
                f"crash exit {proc.returncode}: {proc.stderr[-300:]}"
            outcomes[pending.pop(0)] = died
    return outcomes


def _run(load, path: Path, inputs, reference) -> str:
    try:
        program = load(path)
    except Exception as exc:  # the outcome names what was raised
        return f"refused-load {type(exc).__name__} {' '.join(str(exc).split())[:300]}"
    return _call(program, inputs, reference)


def _call(program, inputs, reference) -> str:
    from pipeline.outputs import same_outputs

    try:
        outputs = program(*inputs)
    except Exception as exc:
        return f"refused-call {type(exc).__name__} {' '.join(str(exc).split())[:300]}"
    return "same" if same_outputs(outputs, reference) else "different"


def _changed_while_loaded(load, path: Path, data: bytes, inputs, reference, how: str) -> str:
    path.write_bytes(data)
    program = load(path)
    with open(path, "r+b") as f:
        if how == "truncated-while-loaded":
            f.truncate(len(data) // 2)
        else:
            f.write(bytes(b ^ 0x5A for b in data))
    return _call(program, inputs, reference)


def _worker(runtime: str, pte: str, inputs_path: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch

    from pipeline.evaluation.artifact import runtime_loader

    load = runtime_loader(runtime)
    inputs = torch.load(inputs_path)
    data = Path(pte).read_bytes()
    reference = load(pte)(*inputs)
    print("worker ready", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for line in sys.stdin:
            case = line.strip()
            path = Path(folder) / f"case-{abs(hash(case))}.pte"
            signal.alarm(CASE_SECONDS)
            if case == "fifo":
                os.mkfifo(path)
                outcome = _run(load, path, inputs, reference)
            elif case.endswith("-while-loaded"):
                outcome = _changed_while_loaded(load, path, data, inputs, reference, case)
            else:
                path.write_bytes(damage(data, case))
                outcome = _run(load, path, inputs, reference)
            signal.alarm(0)
            path.unlink()
            print(f"outcome {outcome}", flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(*sys.argv[2:5])
