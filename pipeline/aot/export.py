"""Build a zoo model, lower it with every LayerNorm delegated, write the `.pte` and its coverage.

The library side of `scripts/export_model.py`; `import pipeline.aot.export` stays light (the
model zoo and ExecuTorch load on the first export).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.ioutil import json_bytes, sha256_regular, write_files_atomic, write_json_atomic
from pipeline.outputs import same_outputs


class IncompleteDelegationError(RuntimeError):
    """Some LayerNorm of the model would run outside the WebGPU delegate."""


class ArtifactCheckError(RuntimeError):
    """The written `.pte`, loaded back and run, does not reproduce the program that wrote it."""


def reproduces(path: Path, example_inputs: tuple, expected, load: Callable | None = None) -> Callable[[str], None]:
    """A check for a program written to a temp file on its way to `path`: loaded back with
    `load` (default `pipeline.load`) and run on `example_inputs`, it gives `expected` bit
    for bit, or ArtifactCheckError."""
    if load is None:
        from pipeline.interpreter import Program

        load = Program.load

    def check(written: str) -> None:
        if not same_outputs(load(written)(*example_inputs), expected):
            raise ArtifactCheckError(f"{path.name}: the written file, loaded back, does not reproduce the "
                                     "program's outputs bit for bit; nothing was written")
    return check


def export_model(
    name: str | None,
    variant: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    output_dir: str | os.PathLike = "out",
    seed: int = 0,
    dynamic: bool = False,
    progress: Callable[[str], None] | None = None,
    cpu_backend: str = "portable",
    dtype: str = "float32",
    audio: str | list[str] | None = None,
    hf: str | os.PathLike | None = None,
    task: str | None = None,
    inputs: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Export model `name` to `<output_dir>/<name>-<variant>.pte` with its `.coverage.json`;
    with `hf` (and `name` None), the Hugging Face directory `hf` (any architecture the
    installed transformers knows: `pipeline.models.from_hf`, its class chosen by `task`, its
    example inputs replaced by the file `inputs`) to `<output_dir>/<directory name>.pte`.

    Returns the coverage summary that was written. Raises ValueError for a bad name,
    variant or checkpoint (CheckpointError), and IncompleteDelegationError when a LayerNorm
    is left out of the delegate: then only the coverage file is written, so the gap can be
    read, and no `.pte` that would quietly run a LayerNorm on the CPU.

    The file is checked before it takes its name: loaded back and run on the example
    inputs, it must reproduce the in-memory program bit for bit (ArtifactCheckError
    otherwise). The coverage file names the `.pte`'s sha256, so a pair left mismatched by
    an interrupted export is refused by its readers (`read_artifact`); with a checkpoint, its
    absolute path and the sha256 of its files, so a checkpoint changed since is refused when
    the model is rebuilt (`build_for_artifact`).

    `cpu_backend="xnnpack"` puts what is not a LayerNorm on XNNPACK: such a file runs in
    ExecuTorch's runtime (`pipeline.native`), which then does the check above.

    `audio` (whisper): WAV files whose log-mel are the example inputs (default with a
    checkpoint: the utterances the package ships); the coverage file records the files named
    here and the sha256 of the inputs' audio, so a rebuild from the file feeds the same speech.
    """
    from pipeline import models
    from pipeline.interpreter import Program
    from pipeline.models.hf import width as hf_width
    from pipeline.aot.lowering import lower_to_edge
    from pipeline.pte.file import PteFile

    say = progress or (lambda line: None)
    start = time.perf_counter()

    def stage(text: str) -> None:
        say(f"[{time.perf_counter() - start:6.1f}s] {text}")

    if (name is None) == (hf is None):
        raise ValueError("give a model name or hf= (one of them)")
    if hf is not None:
        if variant is not None or checkpoint is not None or dynamic or audio is not None:
            raise ValueError("hf= takes no variant, checkpoint, dynamic or audio: the directory is the model")
        stage(f"building the Hugging Face model in {hf}")
        spec = models.from_hf(hf, task=task, seed=seed, dtype=dtype, inputs=inputs)
        name = spec.name
        stage(f"built {type(spec.module.model).__name__} ({spec.name}): "
              + ("weights from the directory" if spec.checkpoint else f"no weights in the directory: seeded random "
                 f"weights, seed {seed}") + f"; inputs {', '.join(spec.input_names)}"
              + (f" from {inputs}" if inputs is not None else ""))
    else:
        if task is not None or inputs is not None:
            raise ValueError("task= and inputs= are for hf= directories")
        if checkpoint is not None:
            stage(f"building {name} from checkpoint {checkpoint}")
        else:
            stage(f"building {name} {variant or models.default_variant(name)} (seeded random weights, seed {seed})")
        spec = models.build(name, variant=variant, checkpoint=checkpoint, seed=seed, dynamic=dynamic, dtype=dtype,
                            audio=audio)
    shapes = ", ".join("x".join(map(str, t.shape)) for t in spec.example_inputs)
    stage(f"lowering {name}-{spec.variant}: torch.export ({shapes}{', dynamic' if dynamic else ''}), "
          "LayerNorm partitioning, WebGPU delegate")
    edge, coverage = lower_to_edge(spec.module, spec.example_inputs, spec.dynamic_shapes, cpu_backend)
    out_dir = Path(output_dir)
    # A dynamic export gets its own files: it must not replace the static one.
    stem = ((models.hf_stem(hf) if hf is not None else f"{name}-{spec.variant}") + ("-dynamic" if dynamic else "") + ("" if dtype == "float32" else f"-{dtype}")
            + ("-xnnpack" if cpu_backend == "xnnpack" else ""))
    pte_path = out_dir / f"{stem}.pte"
    coverage_path = out_dir / f"{stem}.coverage.json"
    summary: dict[str, Any] = {
        "model": name,
        "variant": spec.variant,
        # Absolute, with the sha256 of its files: readers rebuild from this checkpoint and no other.
        "checkpoint": spec.checkpoint,
        "checkpoint_sha256": spec.checkpoint_sha256,
        "checkpoint_format": spec.checkpoint_format,
        "checkpoint_weights": spec.checkpoint_weights,
        # The WAV files given (absolute; None: the model's default inputs) and the sha256 of
        # the audio the example inputs were made from (None: no audio).
        "audio": None if audio is None else list(spec.audio),
        "audio_sha256": spec.audio_sha256,
        # A Hugging Face directory (absolute; None for the zoo's names), the task that chose its
        # class, and the file its inputs came from (absolute, with its sha256; None: built).
        "hf": None if hf is None else os.path.realpath(hf),
        "task": task,
        "inputs": None if inputs is None else os.path.realpath(inputs),
        "inputs_sha256": None if inputs is None else sha256_regular(inputs),
        "input_names": None if spec.input_names is None else list(spec.input_names),
        "seed": seed,
        "dynamic": dynamic,
        "dtype": dtype,
        "cpu_backend": cpu_backend,
        "parameters": sum(p.numel() for p in spec.module.parameters()),
        "hidden_size": models.family(name).hidden_size(spec.config) if hf is None else hf_width(spec.config),
        "example_input_shapes": [list(t.shape) for t in spec.example_inputs],
        "layer_norm_ops": coverage.total,  # every norm found, of every kind (see norm_kinds)
        "delegated": coverage.delegated,
        "norm_kinds": coverage.kinds,
        "not_delegated": [{"node": node, "reason": reason} for node, reason in coverage.not_delegated],
        "pte": None,
        "pte_bytes": None,
        "pte_sha256": None,
        "export_seconds": None,
    }
    if not coverage.complete:
        summary["export_seconds"] = round(time.perf_counter() - start, 2)
        write_json_atomic(coverage_path, summary)
        first = summary["not_delegated"][0] if summary["not_delegated"] else None
        cause = f"; first: {first['node']} ({first['reason']})" if first else ""
        raise IncompleteDelegationError(
            f"{stem}: only {coverage.delegated}/{coverage.total} norms delegated{cause}; see {coverage_path}"
        )

    # The edge program is not needed after this: serialize it in place.
    buffer = edge.to_executorch().buffer
    if cpu_backend == "portable":
        stage("running the program on the example inputs")
        expected, load = Program(PteFile(buffer, "<lowered program>"))(*spec.example_inputs), None
    else:
        from pipeline import native

        stage("running the program in ExecuTorch's runtime on the example inputs")
        expected, load = native.load(buffer)(*spec.example_inputs), native.load
    stage(f"writing {pte_path}, loading it back and checking it reproduces that run")
    summary["pte"] = str(pte_path)
    summary["pte_bytes"] = len(buffer)
    summary["pte_sha256"] = hashlib.sha256(buffer).hexdigest()

    def coverage_bytes() -> bytes:  # once the .pte is written and checked
        summary["export_seconds"] = round(time.perf_counter() - start, 2)
        return json_bytes(summary)

    # The .pte and its coverage file take their names together, once both are written in
    # full (the .pte checked): a full disk leaves no .pte without its coverage file, and
    # the previous pair as it was.
    write_files_atomic([(pte_path, buffer, reproduces(pte_path, spec.example_inputs, expected, load)),
                        (coverage_path, coverage_bytes, None)])
    summary["coverage_json"] = str(coverage_path)
    stage("done")
    return summary

