"""Where the census's rows run: each in a process of its own (`pipeline.census.worker.child`,
forked from a server that has imported torch, transformers and ExecuTorch once), bounded in
time and memory, from a local pool of threads (one child each) or as Ray tasks (each task runs
the same child process on its node, so the same bounds hold on the cluster).

`run_row` is the one unit of work: it returns the row's record whatever happens to the child
(a hang is killed at the timeout, a crash recorded with its signal), with the stage the child
was in, read from its progress file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from pipeline.census.stages import OUR_STAGES, split_name
from pipeline.census.worker import FAULT_ENV, child

POLL_SECONDS = 0.1
STDERR_CHARS = 300  # of a crashed child's stderr, its last line

# The children running now, by pid: stopped at once on an interrupt.
_running: dict[int, multiprocessing.process.BaseProcess] = {}
_running_lock = threading.Lock()
_stopping = threading.Event()
_context: multiprocessing.context.BaseContext | None = None


def _fork_server() -> multiprocessing.context.BaseContext:
    """The fork server that each row's process is forked from, started once per process with
    torch, transformers and ExecuTorch imported (`pipeline.census.preload`)."""
    global _context
    with _running_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["pipeline.census.preload"])
            _context = context
        return _context


def start_fork_server() -> None:
    """Start the fork server now (its imports take seconds) rather than at the first row."""
    from multiprocessing import forkserver

    _fork_server()
    forkserver.ensure_running()


def run_row(name: str, timeout: float, memory_gb: float | None, threads: int | None = None,
            faults: str | None = None, control: str = "first") -> dict:
    """Run row `name` in a process of its own; its record, also for a timeout, a crash or a kill.
    `faults`: PIPELINE_CENSUS_FAULT's value in the census's process (`pipeline.census.worker`);
    `control`: when the control runs (`pipeline.census.stages.CONTROLS`)."""
    with tempfile.TemporaryDirectory(prefix="census-") as folder:
        progress, result, log = (str(Path(folder) / f) for f in ("progress.jsonl", "result.json", "output.txt"))
        proc = _fork_server().Process(target=child, args=(name, progress, result, log, memory_gb, threads, faults, control),
                                      name=f"census {name}")
        proc.start()  # the first start waits for the fork server's imports: not the row's time
        started = time.perf_counter()
        with _running_lock:
            _running[proc.pid] = proc
        try:
            timed_out, peak_mb = _wait(proc, timeout)
        finally:
            with _running_lock:
                _running.pop(proc.pid, None)
        seconds = round(time.perf_counter() - started, 3)
        if proc.exitcode == 0 and Path(result).exists() and not timed_out:
            record = json.loads(Path(result).read_text())
            record["seconds"] = seconds
            return record
        return _abnormal(name, proc.exitcode, timed_out, timeout, _progress(Path(progress)), _last_line(Path(log)),
                         seconds, peak_mb)


def _wait(proc, timeout: float) -> tuple[bool, float | None]:
    """(timed out, peak RSS in MB as last seen) of `proc`, killed with its session at `timeout`
    or on stop."""
    deadline = time.monotonic() + timeout
    peak = None
    while True:
        proc.join(POLL_SECONDS)
        if proc.exitcode is not None:
            return False, peak
        peak = _peak_rss_mb(proc.pid) or peak
        if time.monotonic() > deadline or _stopping.is_set():
            _kill(proc)
            proc.join()
            return not _stopping.is_set(), peak


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: its id is the child's pid
    except ProcessLookupError:
        pass
    except PermissionError:  # not yet in its own session
        proc.kill()


def stop_all() -> None:
    """Kill every running child (an interrupt): their rows are not recorded."""
    _stopping.set()
    with _running_lock:
        for proc in list(_running.values()):
            _kill(proc)


def _progress(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            break  # a line cut short by the crash
    return entries


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:STDERR_CHARS] if lines else ""


def _abnormal(name: str, code: int | None, timed_out: bool, timeout: float, progress: list[dict], stderr: str,
              seconds: float, peak_rss_mb: float | None) -> dict:
    """The record of a child that ended without writing one: the stage it was in, and why."""
    stage = progress[-1]["stage"] if progress else None
    stages = {}
    for entry, after in zip(progress, progress[1:]):
        stages[entry["stage"]] = {"status": "ok", "seconds": round(after["t"] - entry["t"], 3)}
    if timed_out:
        kind, cause = "timeout", f"timed out after {timeout:g} s"
    elif code < 0:
        signame = signal.Signals(-code).name
        # SIGKILL that we did not send: the kernel's OOM killer, most likely.
        kind = "oom" if -code == signal.SIGKILL else "crashed"
        cause = f"killed by {signame}" + (f"; output: {stderr}" if stderr else "")
    else:
        kind, cause = "crashed", f"exit status {code}" + (f"; output: {stderr}" if stderr else "")
    if stage is not None:
        stages[stage] = {"status": kind, "seconds": round(seconds - progress[-1]["t"], 3), "cause": cause}
    reached = progress[-2]["stage"] if len(progress) > 1 else None
    return {"name": name, "status": kind, "reached": reached, "failed_stage": stage, "cause": cause,
            "ours": stage in OUR_STAGES, "stages": stages, "seconds": seconds,
            "peak_rss_mb": None if peak_rss_mb is None else round(peak_rss_mb, 1)}


class LocalPool:
    """`jobs` rows at a time, each in its own worker process."""

    def __init__(self, jobs: int, timeout: float, memory_gb: float | None, threads: int | None,
                 control: str = "first") -> None:
        self._executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="census")
        self._args = (timeout, memory_gb, threads, os.environ.get(FAULT_ENV), control)
        self._pending: set[Future] = set()

    def submit(self, name: str) -> None:
        self._pending.add(self._executor.submit(run_row, name, *self._args))

    def __len__(self) -> int:
        return len(self._pending)

    def finished(self) -> Iterator[dict]:
        """The records of the rows that finish next (at least one; blocks)."""
        done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
        for future in done:
            yield future.result()

    def close(self) -> None:
        stop_all()
        self._executor.shutdown(wait=True, cancel_futures=True)


class RayPool:
    """Each row a Ray task (one CPU) running `run_row` on some node of the cluster at
    `address` ("auto", "ray://host:port", ...; "local" starts a private instance here with
    `jobs` CPUs). Every node needs this package installed, as here."""

    def __init__(self, address: str, jobs: int, timeout: float, memory_gb: float | None,
                 control: str = "first") -> None:
        import logging

        import ray

        self._ray = ray
        self._owned = not ray.is_initialized()  # a connection made here is closed here
        if self._owned:
            options = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
            if address == "local":
                ray.init(num_cpus=jobs, **options)
            else:
                ray.init(address=address, **options)
        self._task = ray.remote(num_cpus=1, max_retries=0)(run_row)
        self._args = (timeout, memory_gb, 1, os.environ.get(FAULT_ENV), control)  # a task holds one CPU
        self._pending: list = []

    def submit(self, name: str) -> None:
        self._pending.append(self._task.remote(name, *self._args))

    def __len__(self) -> int:
        return len(self._pending)

    def finished(self) -> Iterator[dict]:
        done, self._pending = self._ray.wait(self._pending, num_returns=1)
        for ref in done:
            yield self._ray.get(ref)

    def close(self) -> None:
        for ref in self._pending:
            self._ray.cancel(ref, force=True)
        if self._owned:
            self._ray.shutdown()


def make_pool(jobs: int, timeout: float, memory_gb: float | None, ray: str | None = None,
              control: str = "first") -> LocalPool | RayPool:
    """A local pool, or with `ray` (an address, "auto" or "local") a Ray one. Locally the
    rows share the CPUs: torch takes CPUs / jobs threads in each, or, where OMP_NUM_THREADS is
    set (other work shares the machine), what torch reads from it."""
    _stopping.clear()
    if ray is None:
        threads = None if "OMP_NUM_THREADS" in os.environ else max(1, (os.cpu_count() or 1) // jobs)
        return LocalPool(jobs, timeout, memory_gb, threads, control)
    return RayPool(ray, jobs, timeout, memory_gb, control)


def tower_rows(record: dict) -> list[str]:
    """The rows a finished row adds: its towers ("clip.vision_model"), not for a tower itself."""
    if split_name(record["name"])[1] is not None:
        return []
    return list(record.get("towers") or [])

