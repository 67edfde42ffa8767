"""The census's run: which rows, each through a pool of worker processes, every record appended to
`census.jsonl` as it comes (a run that stops is resumed from there), then the report."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.census.pool import make_pool, start_fork_server, tower_rows
from pipeline.census.report import write_census_report
from pipeline.census.stages import CONTROLS, STAGES, check_control
from pipeline.cli import say
from pipeline.ioutil import read_regular

JSONL = "census.jsonl"
DEFAULT_OUTPUT_DIR = Path("out/census")
DEFAULT_TIMEOUT = 300.0
DEFAULT_MEMORY_GB = 8.0
# A record is about 2 kB (the full census's 776 rows: 1.5 MB); 64 MiB holds thirty thousand.
JSONL_MAX_BYTES = 64 << 20

# The CI sample: a few of each modality, chosen small and quick (21 rows with their towers:
# 2 to 5 minutes with --jobs 2 on a 2-core machine, docs/usage.md).
SAMPLE = (
    # text encoders
    "bert", "roberta", "distilbert", "albert", "electra",
    # decoders
    "gpt2", "llama", "opt", "bloom", "gpt_neox",
    # encoder-decoders
    "bart", "whisper",
    # vision
    "vit", "deit", "convnext",
    # audio
    "wav2vec2", "hubert",
    # multimodal (their vision towers are rows of their own)
    "clip", "siglip",
)


def read_records(path: str | os.PathLike) -> list[dict]:
    """The records of `census.jsonl`, in order; a last line cut short (a run killed while
    writing it) is left out. NotRegularFile (an OSError) for a path that is not a regular file,
    FileTooLarge for one of more than JSONL_MAX_BYTES."""
    try:
        text = read_regular(path, JSONL_MAX_BYTES).decode()  # a named pipe is refused, not waited on
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def append_record(path: str | os.PathLike, record: dict) -> None:
    """One record as one line, in a single write, flushed and synced: a reader sees whole lines."""
    from pipeline.evaluation.report import json_safe

    data = (json.dumps(json_safe(record), separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        _end_last_line(fd)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _end_last_line(fd: int) -> None:
    """A file whose last line was cut short gets its newline, so that the next line stands alone."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


def all_architectures() -> list[str]:
    from pipeline.models import hf

    return list(hf.base_architectures())


def check_names(names: list[str], known: list[str]) -> None:
    """ValueError naming the rows whose architecture transformers does not have."""
    unknown = [n for n in names if n.partition(".")[0] not in set(known)]
    if unknown:
        raise ValueError(f"unknown architecture(s): {', '.join(unknown)} (not model types of the installed "
                         f"transformers)")


def progress_line(index: int, total: int, record: dict) -> str:
    """`[12/631] gpt2: accuracy ok, 4/4 norms delegated, 6.1 s`."""
    coverage = record.get("coverage")
    norms = f", {coverage['delegated']}/{coverage['total']} norms delegated" if coverage else ""
    seconds = f", {record.get('seconds', 0):.1f} s"
    if record["status"] == "ok":
        skipped = [s for s, e in record["stages"].items() if e["status"] == "skipped"]
        note = f" ({', '.join(skipped)} skipped)" if skipped else ""
        return f"[{index}/{total}] {record['name']}: {STAGES[-1]} ok{note}{norms}{seconds}"
    whose = "ours" if record.get("ours") else "not ours"
    return (f"[{index}/{total}] {record['name']}: {record['status']} at {record['failed_stage']} ({whose}): "
            f"{record['cause']}{norms}{seconds}")


def _native_build() -> None:
    """Build the native library once, before the rows (which would each build it); a failure
    is each row's to report (its native stage skipped, with the reason)."""
    from pipeline.native.build import BuildError, build

    try:
        build()
    except BuildError:
        pass


def run_census(
    names: list[str] | None = None,
    output_dir: str | os.PathLike = DEFAULT_OUTPUT_DIR,
    jobs: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    memory_gb: float | None = DEFAULT_MEMORY_GB,
    ray: str | None = None,
    fresh: bool = False,
    progress: Callable[[str], None] = say,
    control: str = "first",
) -> int:
    """Census `names` (model types, or "model_type.tower"; default: every architecture of the
    installed transformers) and the towers they have, each in its own worker process bounded by
    `timeout` seconds and `memory_gb`, `jobs` at a time locally or as tasks of the Ray cluster
    at `ray` ("auto", an address, or "local"). Rows already in OUTPUT_DIR/census.jsonl are
    not run again (`fresh` starts over). Writes census.json, .md and .html under `output_dir`
    and returns the exit status: 1 when some row failed in one of our stages, else 0.
    `control` "on-failure" runs the control only where a verdict needs it
    (`pipeline.census.stages`): the same failures ours, a quarter less time where rows pass."""
    check_control(control)  # here, not in each row's process
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / JSONL
    if fresh:
        jsonl.unlink(missing_ok=True)
    rows = list(dict.fromkeys(names if names is not None else all_architectures()))
    done = {r["name"]: r for r in read_records(jsonl)}
    for record in list(done.values()):
        rows += [t for t in tower_rows(record) if t not in rows]
    todo = [n for n in rows if n not in done]
    progress(f"census: {len(rows)} rows, {len(rows) - len(todo)} already in {jsonl}, {len(todo)} to run "
             f"({'Ray ' + ray if ray else f'{jobs} local job(s)'}, {timeout:g} s and "
             f"{'no limit' if memory_gb is None else f'{memory_gb:g} GiB'} each)")
    started = time.perf_counter()
    if todo and ray is None:
        start_fork_server()  # its imports go on while the library is checked
    if todo and ray in (None, "local"):
        _native_build()
    pool = make_pool(jobs, timeout, memory_gb, ray, control) if todo else None
    ran = 0
    try:
        for name in todo:
            pool.submit(name)
        while pool is not None and len(pool):
            for record in pool.finished():
                append_record(jsonl, record)
                done[record["name"]] = record
                ran += 1
                for tower in tower_rows(record):
                    if tower not in rows:
                        rows.append(tower)
                        pool.submit(tower)
                progress(progress_line(len([n for n in rows if n in done]), len(rows), record))
    finally:
        if pool is not None:
            pool.close()  # on an interrupt, the rows still running are killed
    wall = time.perf_counter() - started
    records = [done[n] for n in rows if n in done]
    paths = write_census_report(out, records, population=len(rows), jobs=jobs, ray=ray, wall_seconds=wall,
                                ran=ran)
    progress(f"census: wrote {', '.join(str(p) for p in paths)}")
    ours = [r for r in records if r.get("ours")]
    if ours:
        print(f"census: {len(ours)} failure(s) in our stages: "
              + ", ".join(f"{r['name']} ({r['failed_stage']})" for r in ours), file=sys.stderr)
    return 1 if ours else 0


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def census_main(description: str, argv: list[str] | None = None) -> int:
    """The command line of scripts/census.py: parse, check, run the census; exit status 0, 1
    (a failure in our stages), 2 (bad usage)."""
    import argparse

    from pipeline import cli
    from pipeline.ioutil import check_output_dir

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="architectures (model types, or a tower: clip.vision_model); default: all of them")
    parser.add_argument("--only", type=_names, default=[], metavar="A,B,C", help="the same, comma-separated")
    parser.add_argument("--sample", action="store_true", help=f"the CI sample ({len(SAMPLE)} architectures of every "
                        "modality, and their towers)")
    parser.add_argument("--jobs", type=cli.positive_int, default=1, metavar="N", help="rows at a time (default 1)")
    parser.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds a row may take (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--memory", type=_positive_float, default=DEFAULT_MEMORY_GB, metavar="GB",
                        help=f"GiB of address space a row's process may take (default {DEFAULT_MEMORY_GB:g})")
    parser.add_argument("--output-dir", default=str(DEFAULT_OUTPUT_DIR), metavar="DIR",
                        help=f"default {DEFAULT_OUTPUT_DIR}")
    parser.add_argument("--fresh", action="store_true", help=f"start over (default: resume from {JSONL})")
    parser.add_argument("--ray", metavar="ADDRESS", help="run each row as a task of this Ray cluster ('auto', "
                        "an address, or 'local' for a private instance with --jobs CPUs); needs the census extra")
    parser.add_argument("--control", choices=CONTROLS, default="first",
                        help="when ExecuTorch alone lowers each row (the control): first, in its place (default), "
                        "or on-failure, only where a verdict needs it (the same failures ours; less time where rows pass)")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    names = [*args.names, *args.only]
    if args.sample and names:
        parser.error("argument --sample: not with names (the sample is its own list)")
    try:
        check_output_dir(args.output_dir)
    except ValueError as exc:
        parser.error(f"argument --output-dir: {exc}")
    if args.ray is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            parser.error("argument --ray: ray is not installed (pip install -e '.[census]')")
    cli.quiet_dependencies(args.verbose)
    if args.sample:
        names = list(SAMPLE)
    try:
        if names:
            check_names(names, all_architectures())
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return run_census(names or None, args.output_dir, args.jobs, args.timeout, args.memory, args.ray, args.fresh,
                          control=args.control)
    except Exception as exc:  # one line for the user, status 1
        print(f"{parser.prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
