"""The census's child process: one row through the stages, bounded in memory and niced.

`child` is what the census's pool forks for each row; by hand, the same for one row:
    python -m pipeline.census.worker NAME --progress FILE --result FILE [--memory GB]

Appends each stage's name to the progress file as it starts (a line, flushed and synced),
so that the parent knows the stage of a child that hangs, crashes or is killed, and writes
the row's record (JSON) to the result file at the end. Exit status 0 whenever the record
was written, whatever the stages found.

For the census's own tests, PIPELINE_CENSUS_FAULT="NAME:STAGE:ACTION[,...]" makes the row
NAME hang (ACTION "hang") or die of SIGSEGV ("crash") as it enters STAGE.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import time

from pipeline.census.stages import CONTROLS

FAULT_ENV = "PIPELINE_CENSUS_FAULT"
NICENESS = 10
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _limit_memory(gigabytes: float) -> None:
    """Address space capped at `gigabytes` (RLIMIT_AS): past it allocations fail (MemoryError,
    or the library's own out-of-memory error) instead of the machine swapping or the OOM killer
    picking a process."""
    limit = int(gigabytes * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _faults(name: str, faults: str | None) -> dict[str, str]:
    """{stage: action} that `faults` (PIPELINE_CENSUS_FAULT's form) asks of row `name`."""
    found = {}
    for entry in filter(None, (faults or "").split(",")):
        row, stage, action = entry.rsplit(":", 2)
        if row == name:
            found[stage] = action
    return found


def work(name: str, progress_path: str, result_path: str, memory_gb: float | None = None,
         verbose: bool = False, faults: str | None = None, control: str = "first") -> None:
    """Row `name` through the stages in this process; its record to `result_path`. `faults`:
    PIPELINE_CENSUS_FAULT's value as the census started; `control`: when the control runs
    (`pipeline.census.stages.CONTROLS`)."""
    if memory_gb is not None:
        _limit_memory(memory_gb)
    os.nice(NICENESS)
    started = time.perf_counter()
    faults = _faults(name, faults)
    progress = open(progress_path, "a", buffering=1)

    def enter(stage: str) -> None:
        progress.write(json.dumps({"stage": stage, "t": round(time.perf_counter() - started, 3)}) + "\n")
        progress.flush()
        os.fsync(progress.fileno())
        action = faults.get(stage)
        if action == "hang":
            while True:
                time.sleep(60)
        elif action == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)

    from pipeline import cli

    cli.quiet_dependencies(verbose)
    from pipeline.census.stages import Census

    record = Census(name, enter, control=control).run()
    record["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    record["process_seconds"] = round(time.perf_counter() - started, 3)
    tmp = f"{result_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, default=str)
    os.replace(tmp, result_path)
    progress.close()


def _die_with_parent() -> None:
    """SIGKILL when the fork server ends (it ends with the census's process, however that
    ends), so that no row outlives the census."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: a row may outlive a census killed outright
        pass


def child(name: str, progress_path: str, result_path: str, log_path: str, memory_gb: float | None,
          threads: int | None, faults: str | None, control: str = "first") -> None:
    """`work` as a child forked by the pool: in a session of its own (a timeout kills all of
    it), its output to `log_path`, `threads` for torch's CPU kernels."""
    os.setsid()
    _die_with_parent()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # torch.fx's interpreter draws tqdm bars, and tqdm's default lock is a named semaphore,
    # which a row killed at its timeout would leave behind: a thread lock does here.
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    work(name, progress_path, result_path, memory_gb, faults=faults, control=control)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("--progress", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--memory", type=float, default=None, help="address-space limit in GiB")
    parser.add_argument("--control", choices=CONTROLS, default="first")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    work(args.name, args.progress, args.result, args.memory, args.verbose, os.environ.get(FAULT_ENV), args.control)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
