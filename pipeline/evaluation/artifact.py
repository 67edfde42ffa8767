"""An exported file and what it was made from: the `.pte` beside its `.coverage.json`.

The coverage file names the `.pte`'s sha256; readers check it, so a pair left mismatched
(an interrupted export, a file copied over another) is refused, never misread. A command
reads the `.pte` once (`read_artifact_file`): the bytes it hashed are the bytes it runs,
so a file replaced while it builds the model cannot run in their place.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from pipeline.ioutil import open_torch_file, read_regular, sha256_regular


class ArtifactError(ValueError):
    """A `.pte` and its `.coverage.json` do not belong together, or the pair is incomplete."""


# A coverage file is a few kB (florence2-base's 23 kB): one larger than this is not an export's.
COVERAGE_MAX_BYTES = 16 << 20


# What readers take from a coverage file: key -> (JSON types it may have, required).
SUMMARY_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "pte_sha256": ((str,), True),
    "model": ((str,), True),
    "variant": ((str,), True),
    "checkpoint": ((str, type(None)), False),
    "checkpoint_sha256": ((str, type(None)), False),
    "seed": ((int,), False),
    "dynamic": ((bool,), False),
    "dtype": ((str,), False),
    "cpu_backend": ((str,), False),
    "pte_bytes": ((int,), False),
    "audio": ((list, type(None)), False),
    "audio_sha256": ((str, type(None)), False),
    "hf": ((str, type(None)), False),
    "task": ((str, type(None)), False),
    "inputs": ((str, type(None)), False),
    "inputs_sha256": ((str, type(None)), False),
}


def _check_is_file(path: str | os.PathLike) -> None:
    """ArtifactError saying what `path` is when it is not a regular file (a folder, a socket,
    a loop of links); FileNotFoundError or PermissionError as the OS says."""
    from pipeline.pte.file import PteError, check_path

    try:
        check_path(path)
    except PteError as exc:
        raise ArtifactError(str(exc)) from None


def coverage_path_of(pte_path: str | os.PathLike) -> Path:
    """`<stem>.coverage.json` beside `<stem>.pte`."""
    path = Path(pte_path)
    return path.with_name(path.name.removesuffix(".pte") + ".coverage.json")


def read_artifact(pte_path: str | os.PathLike) -> dict[str, Any]:
    """The export summary written beside `pte_path`, checked to describe exactly that file
    (`read_artifact_file`, for a caller that does not run the file itself).

    Raises ArtifactError when the coverage file is missing, unreadable, or names another
    `.pte` (a hash that differs: the pair was mismatched, e.g. by an interrupted export).
    """
    from pipeline.pte.file import PteError

    try:
        return read_artifact_file(pte_path)[0]
    except PteError as exc:  # what the path is (a folder, a pipe): the reports' kind of error
        raise ArtifactError(str(exc)) from None


def read_artifact_file(pte_path: str | os.PathLike) -> tuple[dict[str, Any], bytes]:
    """(export summary, bytes) of the `.pte` at `pte_path`, read once: the summary is
    checked against exactly the bytes returned, which are what the caller runs
    (`program_loader`), never a later read of the path. Raises ArtifactError as
    `read_artifact` does, PteError for what is not a regular file, OSError as the OS does.
    A file of another size than the summary names is refused before it is read."""
    from pipeline.pte.file import check_path

    check_path(pte_path)
    try:
        summary = _read_summary(pte_path)
    except ArtifactError:
        read_pte(pte_path)  # what is wrong with the file itself, if anything, is said first
        raise
    size = summary.get("pte_bytes")
    found = os.stat(pte_path)
    if isinstance(size, int) and stat.S_ISREG(found.st_mode) and found.st_size != size:
        raise ArtifactError(f"{coverage_path_of(pte_path)} describes another file than {pte_path} "
                            f"({size} bytes, the file {found.st_size}); export again")
    data = read_pte(pte_path)
    _check_digest(summary, pte_path, hashlib.sha256(data).hexdigest())
    _check_checkpoint_record(summary, coverage_path_of(pte_path))
    return summary, data


def _read_summary(pte_path: str | os.PathLike) -> dict[str, Any]:
    summary_path = coverage_path_of(pte_path)
    try:
        # Only a regular file, and no more of it than an export writes: a named pipe is not waited on.
        summary = json.loads(read_regular(summary_path, COVERAGE_MAX_BYTES))
    except FileNotFoundError:
        raise ArtifactError(f"{summary_path} not found: the model, variant and seed of {pte_path} are unknown") from None
    except RecursionError:
        raise ArtifactError(f"{summary_path} unreadable: JSON nested too deep") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{summary_path} unreadable: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("pte_sha256"), str):
        raise ArtifactError(f"{summary_path} names no .pte hash: not written by this version of export_model")
    for key, (kinds, required) in SUMMARY_FIELDS.items():
        if key not in summary:
            if required:
                raise ArtifactError(f"{summary_path} has no {key!r}: not a coverage file written by export_model")
            continue
        value = summary[key]
        if type(value) not in kinds or (type(value) is int and value < 0):
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ArtifactError(f"{summary_path}: {key!r} is {json.dumps(value)[:60]}, expected {expected}"
                                f"{' (not negative)' if int in kinds else ''}: not a coverage file written by "
                                "export_model")
    return summary


def _check_digest(summary: dict[str, Any], pte_path: str | os.PathLike, digest: str) -> None:
    if summary["pte_sha256"] != digest:
        raise ArtifactError(f"{coverage_path_of(pte_path)} describes another file than {pte_path} (sha256 differs); "
                            "export again")


def _check_checkpoint_record(summary: dict[str, Any], source: str | os.PathLike) -> None:
    """A summary naming a checkpoint names it by absolute path with the sha256 of its files
    (what `models.build` checks it against): a relative path would name another directory
    from elsewhere, and a path alone whatever the directory holds now."""
    checkpoint = summary.get("checkpoint")
    if checkpoint is None:
        return
    if not isinstance(checkpoint, str) or not os.path.isabs(checkpoint):
        raise ArtifactError(f"{source}: checkpoint {checkpoint!r} is not an absolute path; export again")
    digest = summary.get("checkpoint_sha256")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise ArtifactError(f"{source}: names checkpoint {checkpoint} without the sha256 of its files "
                            "(written by an older export_model); export again")


def read_pte(pte_path: str | os.PathLike) -> bytes:
    """The bytes of the `.pte` at `pte_path`, read once into this process's memory."""
    from pipeline.pte.file import read_private

    return read_private(pte_path)


def build_for_artifact(summary: dict[str, Any], audio: str | list[str] | None = None):
    """The zoo model (module and example inputs) an exported file was made from.

    From a checkpoint only if its files still hash to what the export recorded
    (CheckpointError otherwise, before the module is built); its example inputs from the
    audio the export recorded, checked by hash (ArtifactError), unless `audio` names other
    WAV files to take instead."""
    from pipeline import models

    checkpoint = summary.get("checkpoint")
    _check_checkpoint_record(summary, "export summary")
    if summary.get("hf") is not None:
        return _build_hf(summary, audio)
    recorded = audio is None
    audio = summary.get("audio") if recorded else audio
    if recorded and audio is not None and not (audio and all(isinstance(p, str) and os.path.isabs(p) for p in audio)):
        raise ArtifactError(f"export summary: audio {json.dumps(audio)[:80]} is not a list of absolute paths")
    spec = models.build(summary["model"], variant=None if checkpoint else summary["variant"], checkpoint=checkpoint,
                        seed=summary.get("seed", 0), dynamic=summary.get("dynamic", False),
                        dtype=summary.get("dtype", "float32"),
                        checkpoint_sha256=summary.get("checkpoint_sha256") if checkpoint else None, audio=audio)
    if recorded and "audio_sha256" in summary and spec.audio_sha256 != summary["audio_sha256"]:
        raise ArtifactError(f"export summary: the inputs' audio has sha256 {spec.audio_sha256}, the export's "
                            f"{summary['audio_sha256']}: the audio changed since; export again")
    return spec


def _build_hf(summary: dict[str, Any], audio) -> Any:
    """The Hugging Face directory's model an export recorded, rebuilt only from the same
    files: its weights (the sha256 of config and weights) and its inputs file, if it had one."""
    from pipeline import models

    hf, inputs = summary["hf"], summary.get("inputs")
    if audio is not None:
        raise ArtifactError(f"export summary: {hf} is a Hugging Face directory; audio= is for whisper exports")
    for key, path in (("hf", hf), ("inputs", inputs)):
        if path is not None and not os.path.isabs(path):
            raise ArtifactError(f"export summary: {key} {path!r} is not an absolute path; export again")
    if inputs is not None:
        try:
            digest = sha256_regular(inputs)
        except OSError as exc:
            raise ArtifactError(f"export summary: the inputs file {inputs} cannot be read: {exc}") from None
        if digest != summary.get("inputs_sha256"):
            raise ArtifactError(f"export summary: the inputs file {inputs} changed since the export; export again")
    spec = models.from_hf(hf, task=summary.get("task"), seed=summary.get("seed", 0),
                          dtype=summary.get("dtype", "float32"), inputs=inputs)
    if spec.checkpoint_sha256 != summary.get("checkpoint_sha256"):
        had = "weights" if summary.get("checkpoint_sha256") else "no weights"
        raise models.CheckpointError(f"{hf}: its files changed since the export (which read {had} there); "
                                     "export again")
    return spec


RUNTIMES = ("python", "executorch")


def runtime_loader(runtime: str = "python"):
    """`load(path)` of a runtime: ours in Python (`pipeline.load`), or ExecuTorch's own C++
    runtime with the native WebGPU backend registered (`pipeline.native.load`)."""
    if runtime == "python":
        from pipeline.interpreter import load

        return load
    if runtime == "executorch":
        from pipeline import native

        return native.load
    raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


def program_loader(runtime: str = "python"):
    """`load(data, source)` of a runtime: a program from a file's bytes `data` (read once by
    the caller), `source` naming the file in errors; the runtime is imported here."""
    if runtime == "python":
        from pipeline.interpreter.program import Program
        from pipeline.pte.file import PteFile

        return lambda data, source: Program(PteFile(data, source))
    if runtime == "executorch":
        from pipeline.native import NativeProgram

        return lambda data, source: NativeProgram(data, source=source)
    raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


def read_inputs(path: str | os.PathLike) -> tuple:
    """A user's inputs: a tensor, or a tuple/list of them, saved with torch.save."""
    try:
        with open_torch_file(path) as f:  # no named pipe waited on, no archive inflated
            value = torch.load(f, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path}: not a torch.save file of tensors: {' '.join(str(exc).split())[:200]}") from None
    inputs = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError(f"{path}: holds {[type(t).__name__ for t in inputs]}; expected tensors")
    return inputs


def run_artifact(
    pte_path: str | os.PathLike,
    inputs_path: str | os.PathLike | None = None,
    runtime: str = "python",
    repeats: int = 3,
    progress=lambda line: None,
    etdump: str | os.PathLike | None = None,
    audio: str | list[str] | None = None,
) -> dict[str, Any]:
    """Run an exported file: its model's example inputs (from the `.coverage.json` beside
    it) or a user's (`inputs_path`), timed over `repeats` runs, compared with eager at the
    file's dtype and float64 when the model is known. Returns what was measured; `passed` is
    False when the outputs are not finite or their error against float64 exceeds twice eager's.

    In ExecuTorch's runtime the error is held against the same model run there without our
    delegate instead (`pipeline.evaluation.executorch_verdict`, under "executorch_verdict"),
    and `etdump` names a file to write the timed runs' ETDump to (an event per LayerNorm
    delegate call, for ExecuTorch's Inspector).

    `audio` (whisper): run the log-mel of these WAV files instead of the recorded inputs (as
    many as the file's batch). A file of a whole-model checkpoint also decodes each utterance
    from eager's and the file's encoder output: under "transcripts", and `passed` is False when
    the tokens differ (`pipeline.evaluation.transcripts`).
    """
    import time

    from pipeline.evaluation.accuracy import ENVELOPE
    from pipeline.evaluation.eager import run_eager, to_float64
    from pipeline.evaluation.metrics import compare, flatten_output

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if etdump is not None and runtime != "executorch":
        raise ValueError("etdump needs runtime='executorch'")
    if audio is not None and inputs_path is not None:
        raise ValueError("pass inputs_path or audio, not both")
    try:  # before its coverage file is looked for
        _check_is_file(pte_path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{pte_path} not found") from None
    # Read once: what is hashed is what runs, whatever happens to the file meanwhile.
    if inputs_path is None or coverage_path_of(pte_path).exists():
        summary, data = read_artifact_file(pte_path)
    else:
        summary, data = None, read_pte(pte_path)
    spec = None
    if summary is not None:
        progress(f"building {summary['model']}-{summary['variant']} (seed {summary.get('seed', 0)}) for its inputs "
                 "and eager reference")
        spec = build_for_artifact(summary, audio)
    elif audio is not None:
        raise ValueError(f"audio: {coverage_path_of(pte_path)} not found: the model of {pte_path} is unknown")
    inputs = read_inputs(inputs_path) if inputs_path is not None else spec.example_inputs
    progress(f"loading {pte_path} ({runtime} runtime)")
    load = program_loader(runtime)  # imports the runtime first: the timing is of the load alone
    if etdump is not None:
        from pipeline.native.trace import TracedProgram

        def load(data, source):
            return TracedProgram(data, etdump=True, source=source)
    start = time.perf_counter()
    program = load(data, str(pte_path))
    load_seconds = time.perf_counter() - start
    times = []
    for i in range(repeats):
        progress(f"run {i + 1}/{repeats}")
        start = time.perf_counter()
        outputs = program(*inputs)
        times.append(time.perf_counter() - start)
    if etdump is not None:
        program.write_etdump(etdump)
        program.close()
    result: dict[str, Any] = {
        "pte": str(pte_path),
        "runtime": runtime,
        "load_seconds": load_seconds,
        "seconds_per_run": sorted(times)[len(times) // 2],
        "output_shapes": [list(t.shape) for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)],
        "finite": bool(torch.isfinite(flatten_output(outputs)).all()),
    }
    if etdump is not None:
        result["etdump"] = str(etdump)
    if spec is not None:
        dtype = summary.get("dtype", "float32")
        progress(f"running eager {dtype} and float64")
        same_dtype = run_eager(spec.module, inputs, keep_tensors=False).outputs
        fp64 = run_eager(*to_float64(spec.module, inputs), keep_tensors=False).outputs
        reference = flatten_output(fp64)
        got = compare(flatten_output(outputs), reference)
        eager = compare(flatten_output(same_dtype), reference)
        result.update(
            model=summary["model"], variant=summary["variant"], dtype=dtype,
            max_abs_vs_eager=compare(flatten_output(outputs), flatten_output(same_dtype))["max_abs"],
            max_abs_vs_fp64=got["max_abs"], eager_max_abs_vs_fp64=eager["max_abs"], envelope=ENVELOPE,
        )
        result["passed"] = result["finite"] and got["max_abs"] <= ENVELOPE * eager["max_abs"]
        compared = {"delegated": outputs, "eager": same_dtype, "fp64": fp64}
        if runtime == "executorch":
            from pipeline.evaluation.executorch_verdict import evaluate_in_executorch

            verdict = evaluate_in_executorch(pte_path, summary, spec, inputs, progress, eager=(same_dtype, fp64),
                                             data=data)
            result.update(executorch_verdict=verdict, passed=verdict["passed"])
        if inputs_path is None:
            from pipeline.evaluation.transcripts import transcripts_for

            transcripts = transcripts_for(spec, compared, progress=progress)
            if transcripts is not None:
                result.update(transcripts=transcripts, passed=result["passed"] and transcripts["identical"])
    else:
        result["passed"] = result["finite"]
    return result
