"""What the report scripts do: build each model, lower it, evaluate, write files, summarise."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import torch

from pipeline import cli
from pipeline.evaluation.accuracy import evaluate_accuracy
from pipeline.evaluation.coverage import audit_coverage
from pipeline.evaluation.render import (
    accuracy_html,
    accuracy_line,
    accuracy_markdown,
    coverage_html,
    coverage_line,
    coverage_markdown,
)
from pipeline.evaluation.report import write_report
from pipeline.ioutil import check_output_dir

DEFAULT_OUTPUT_DIR = Path("out/reports")


def cpu_name() -> str:
    """The CPU and the instruction set torch's kernels dispatch to on it: eager's errors
    against float64 move with them (the same tree gave eager float16 0.518 and 0.0772 on two
    machines, docs/measurements.md, "The trained Whisper in `make reports`")."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, torch's kernels {torch.backends.cpu.get_cpu_capability()}"


def environment(seed: int) -> dict:
    """Adapter, backend, WebGPU implementation, CPU, seed and the versions of what the result
    depends on."""
    from pipeline import runtime

    info = runtime.device_info()
    versions = {}
    for package in ("torch", "executorch", "transformers", "wgpu", "dawn-python", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {"adapter": info["adapter"], "backend": info["backend"], "implementation": info["implementation"],
            "shader_compiler": info["shader_compiler"], "cpu": cpu_name(), "seed": seed, "versions": versions}


def resolve_models(name: str) -> list[str]:
    """`all` or one model name; ValueError naming the argument otherwise."""
    if name == "all":
        return list(cli.MODEL_NAMES)
    if name not in cli.MODEL_NAMES:
        raise ValueError(f"model must be one of {', '.join(cli.MODEL_NAMES)} or 'all', got {name!r}")
    return [name]


def _build_and_lower(name: str | None, variant: str | None, seed: int, dtype: str = "float32", checkpoint=None,
                     audio=None, hf=None, task=None, inputs=None):
    import pipeline

    torch.manual_seed(seed)
    if hf is not None:
        spec = pipeline.models.from_hf(hf, task=task, seed=seed, dtype=dtype, inputs=inputs)
    else:
        spec = pipeline.models.build(name, variant=variant, seed=seed, dtype=dtype, checkpoint=checkpoint,
                                     audio=audio)
    program = pipeline.lower(spec.module, spec.example_inputs, spec.dynamic_shapes)
    return spec, program


def _stem(model: str, variant: str | None, kind: str, dtype: str = "float32") -> str:
    name = f"{model}-{variant}" if variant else model
    return f"{name}{'' if dtype == 'float32' else '-' + dtype}.{kind}"


def weights_of(spec) -> dict:
    """Where the model's weights came from, for a report: a checkpoint (absolute path, the
    sha256 of its files, its format, how its weights were stored) or seeded random ones."""
    if spec.checkpoint is None:
        return {"checkpoint": None}
    return {"checkpoint": spec.checkpoint, "sha256": spec.checkpoint_sha256, "format": spec.checkpoint_format,
            "stored": spec.checkpoint_weights}


def coverage_for(spec, program, seed: int, run: bool = False) -> dict:
    """The coverage audit of one built model and its lowered program, as a report dict; with
    `run` (a program read from a file), the program must also run on the example inputs."""
    audit = audit_coverage(spec.module, spec.example_inputs, program, model=spec.name, variant=spec.variant, run=run)
    return _coverage_data(spec, audit, seed)


def _coverage_data(spec, audit, seed: int) -> dict:
    env = environment(seed)
    return {**audit.as_dict(), "weights": weights_of(spec), "inputs": inputs_of(spec), "adapter": env["adapter"],
            "environment": env}


def accuracy_for(spec, program, seed: int, progress: Callable[[str], None] = lambda line: None,
                 coverage: list | None = None) -> dict:
    """The accuracy report (with the coverage counts of its own eager run) of one built model,
    as a report dict. A whole Whisper (a checkpoint with its decoder) also decodes each
    utterance from eager's and the program's encoder output: the verdict fails when the
    tokens differ (`pipeline.evaluation.transcripts`). `coverage`, a list, receives the
    coverage audit of the same eager run as `coverage_for` would make it (one eager run and
    one lowering for both reports)."""
    from pipeline.evaluation.transcripts import transcripts_for

    report = evaluate_accuracy(spec.module, spec.example_inputs, program, model=spec.name, variant=spec.variant)
    if coverage is not None:
        coverage.append(_coverage_data(spec, report.coverage, seed))
    env = environment(seed)
    data = {**report.as_dict(), "coverage": report.coverage.as_dict()["coverage"], "weights": weights_of(spec),
            "inputs": inputs_of(spec), "adapter": env["adapter"], "environment": env}
    transcripts = transcripts_for(spec, report.outputs, progress=progress)
    if transcripts is not None:
        data["transcripts"] = transcripts
        if not transcripts["identical"]:
            data["verdict"] = "fail"
    return data


def inputs_of(spec) -> dict:
    """What the example inputs are, for a report: WAV files (with the sha256 of their bytes)
    or the model's synthetic inputs."""
    if getattr(spec, "audio", None) is None:  # synthetic inputs (or a spec made by hand)
        return {"audio": None}
    return {"audio": list(spec.audio), "audio_sha256": spec.audio_sha256}


def _build_and_load(pte: str | Path):
    from pipeline.evaluation.artifact import build_for_artifact, program_loader, read_artifact_file

    # Read once: the bytes hashed are the bytes loaded, however long the model takes to build.
    summary, pte_bytes = read_artifact_file(pte)
    torch.manual_seed(summary.get("seed", 0))
    spec = build_for_artifact(summary)
    return summary, spec, program_loader("python")(pte_bytes, str(pte))


def run_reports(
    kind: str,
    model: str | None,
    variant: str | None = None,
    output_dir: str | Path = DEFAULT_OUTPUT_DIR,
    seed: int = 0,
    progress: Callable[[str], None] = print,
    pte: str | Path | None = None,
    dtype: str = "float32",
    runtime: str = "python",
    checkpoint: str | Path | None = None,
    audio: str | list[str] | None = None,
    with_coverage: bool = False,
    hf: str | Path | None = None,
    task: str | None = None,
    inputs: str | Path | None = None,
) -> int:
    """Run the coverage audit (`kind="coverage"`) or accuracy report (`"accuracy"`) for `model` or `all`,
    or for the exported file `pte` (its model, variant and seed from the `.coverage.json` beside it).
    `checkpoint`: build `model` (one, not `all`) from this checkpoint directory (Hugging Face, or
    CTranslate2 for whisper) instead of seeded random weights. `audio` (whisper; "A.wav,B.wav"
    or a list): the example inputs are the log-mel of these files (by default, with a checkpoint,
    the utterances the package ships); a whole-model checkpoint's transcripts are checked.

    `hf` (with `model` None): the Hugging Face directory's model instead (`pipeline.models.from_hf`,
    its class chosen by `task`, its example inputs replaced by the file `inputs`); reports are
    named after the directory.

    `dtype` (float32, float16, bfloat16) casts the model and its inputs; the accuracy verdict
    then holds the program against eager at that dtype, both against float64.

    `with_coverage` (accuracy, in the Python runtime): also writes the coverage audit of the same
    eager run and lowering or file, as `kind="coverage"` would; its verdict counts too.

    `runtime="executorch"` (accuracy of a `pte` only) runs the file in ExecuTorch's runtime
    and holds it against the same model exported with the same CPU backend and no WebGPU
    delegate, run there (`pipeline.evaluation.executorch_verdict`): STEM.pte.executorch.accuracy.*.

    Writes MODEL[-VARIANT][-DTYPE].KIND.{json,md,html} (STEM.pte.KIND.* for a file) under
    `output_dir`, prints one summary line per model, and returns the exit status: 0 when
    every verdict passes, 1 otherwise.
    """
    if kind not in ("coverage", "accuracy"):
        raise ValueError(f"kind must be 'coverage' or 'accuracy', got {kind!r}")
    if with_coverage and (kind != "accuracy" or runtime != "python"):
        raise ValueError("with_coverage is for the accuracy report in the Python runtime (not coverage, not "
                         "runtime='executorch')")
    if runtime == "executorch":
        if kind != "accuracy" or pte is None:
            raise ValueError("runtime='executorch' is for the accuracy report of a file (pte)")
        return _executorch_accuracy(pte, output_dir, progress)
    if runtime != "python":
        raise ValueError(f"runtime must be 'python' or 'executorch', got {runtime!r}")
    if checkpoint is not None and (pte is not None or model == "all"):
        raise ValueError("checkpoint= is for one model, not for 'all' nor with pte= (the file names its own)")
    if audio is not None and (pte is not None or model != "whisper"):
        raise ValueError("audio= is for whisper, not with pte= (the file's export names its inputs)")
    if hf is not None and (model is not None or pte is not None or checkpoint is not None or audio is not None):
        raise ValueError("hf= is the model: not with a model name, pte=, checkpoint= or audio=")
    names = [None] if pte is not None or hf is not None else resolve_models(model)
    from pipeline.models import hf_stem
    lines, failed = [], []
    report_dtype = "float32" if pte is not None else dtype  # a file's reports are named after the file alone
    for name in names:
        if pte is not None:
            progress(f"[{pte}] building its model for the eager reference, loading the file ...")
            summary, spec, program = _build_and_load(pte)
            name, seed = spec.name, summary.get("seed", 0)
            report_name, report_variant = f"{Path(pte).name.removesuffix('.pte')}.pte", None
        elif hf is not None:
            progress(f"[{hf}] building the Hugging Face model and lowering ...")
            spec, program = _build_and_lower(None, None, seed, dtype, hf=hf, task=task, inputs=inputs)
            name = spec.name
            if spec.checkpoint is None:
                progress(f"[{name}] no weights in {hf}: seeded random weights, seed {seed}")
            report_name, report_variant = hf_stem(hf), None
        else:
            progress(f"[{name}] building and lowering ...")
            spec, program = _build_and_lower(name, variant, seed, dtype, checkpoint, audio)
            report_name, report_variant = name, spec.variant
        stem = _stem(report_name, report_variant, kind, report_dtype)
        progress(f"[{name}] evaluating {kind} ...")
        audits: list | None = [] if with_coverage else None
        if kind == "coverage":
            data = coverage_for(spec, program, seed, run=pte is not None)
            markdown, page, line, ok = (coverage_markdown(data), coverage_html(data), coverage_line(data),
                                        data["verdict"] == "complete")
        else:
            data = accuracy_for(spec, program, seed, progress, coverage=audits)
            markdown, page, line, ok = (accuracy_markdown(data), accuracy_html(data), accuracy_line(data),
                                        data["verdict"] == "pass")
        data["program"] = {"source": "lowered in this run"} if pte is None else {
            "source": "file", "pte": str(pte), "pte_sha256": summary["pte_sha256"]}
        paths = write_report(output_dir, stem, data, markdown, page)
        progress(f"[{name}] wrote {', '.join(str(p) for p in paths)}")
        lines.append(line)
        if not ok:
            failed.append(name)
        if audits:
            audit = {**audits[0], "program": data["program"]}
            paths = write_report(output_dir, _stem(report_name, report_variant, "coverage", report_dtype), audit,
                                 coverage_markdown(audit), coverage_html(audit))
            progress(f"[{name}] wrote {', '.join(str(p) for p in paths)}")
            lines.append(coverage_line(audit))
            if audit["verdict"] != "complete":
                failed.append(f"{name} (coverage)")
    env = environment(seed)
    progress("")
    progress(f"{kind} on {env['adapter']} ({env['backend']}), seed {seed}")
    for line in lines:
        progress(line)
    if failed:
        print(f"{kind}: verdict failed for {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _executorch_accuracy(pte: str | Path, output_dir: str | Path, progress: Callable[[str], None]) -> int:
    """The accuracy report of `pte` run in ExecuTorch's runtime; returns the exit status."""
    from pipeline.evaluation.artifact import build_for_artifact, read_artifact_file
    from pipeline.evaluation import executorch_verdict

    summary, pte_bytes = read_artifact_file(pte)  # the bytes hashed are the bytes run
    progress(f"[{pte}] building its model for the eager reference ...")
    torch.manual_seed(summary.get("seed", 0))
    spec = build_for_artifact(summary)
    from pipeline.evaluation.transcripts import transcripts_for, verdict_line

    outputs: dict = {}
    verdict = executorch_verdict.evaluate_in_executorch(pte, summary, spec, progress=progress, data=pte_bytes,
                                                        outputs=outputs)
    transcripts = transcripts_for(spec, outputs, progress=progress)
    if transcripts is not None and not transcripts["identical"]:
        verdict["passed"] = False
        verdict["why"] = "; ".join(filter(None, [verdict["why"], verdict_line(transcripts)]))
    env = environment(summary.get("seed", 0))
    data = {"model": spec.name, "variant": spec.variant, "verdict": "pass" if verdict["passed"] else "fail",
            "runtime": "executorch", "accuracy": verdict, "weights": weights_of(spec), "inputs": inputs_of(spec),
            "adapter": env["adapter"], "environment": env,
            "program": {"source": "file", "pte": str(pte), "pte_sha256": summary["pte_sha256"]}}
    if transcripts is not None:
        data["transcripts"] = transcripts
    stem = f"{Path(pte).name.removesuffix('.pte')}.pte.executorch.accuracy"
    paths = write_report(output_dir, stem, data, executorch_verdict.report_markdown(data),
                         executorch_verdict.report_html(data))
    progress(f"[{spec.name}] wrote {', '.join(str(p) for p in paths)}")
    progress("")
    progress(f"accuracy in ExecuTorch's runtime on {env['adapter']} ({env['backend']}), seed {summary.get('seed', 0)}")
    progress(executorch_verdict.report_line(data))
    if not verdict["passed"]:
        print(f"accuracy: verdict failed for {spec.name}: {verdict['why']}", file=sys.stderr)
    return 0 if verdict["passed"] else 1


def report_main(kind: str, description: str, argv: list[str] | None = None) -> int:
    """The command line of scripts/coverage_audit.py ("coverage") and accuracy_report.py
    ("accuracy"): parse arguments, run the reports, one line on stderr on failure."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", choices=[*cli.MODEL_NAMES, "all"],
                        help="which model, or all of them (none with --pte)")
    parser.add_argument("--pte", metavar="FILE", help="report on this exported file instead of a fresh lowering "
                        "(its model, variant and seed come from the .coverage.json beside it)")
    parser.add_argument("--variant", help="model variant (default: each model's default)")
    parser.add_argument("--checkpoint", metavar="DIR", help="build the model from this local checkpoint: a Hugging "
                        "Face directory (config.json + safetensors) or, for whisper, a CTranslate2 one (model.bin)")
    parser.add_argument("--output-dir", default=str(DEFAULT_OUTPUT_DIR), help=f"default {DEFAULT_OUTPUT_DIR}")
    parser.add_argument("--seed", type=cli.seed, default=0, help="seed of weights and inputs, 0 to 2**64 - 1 (default 0)")
    if kind == "accuracy":
        parser.add_argument("--runtime", choices=("python", "executorch"), default="python",
                            help="with --pte: run the file in our Python runtime (default) or in ExecuTorch's "
                            "runtime, held against the same model exported without the WebGPU delegate")
    if kind == "accuracy":
        parser.add_argument("--with-coverage", action="store_true",
                            help="also write the coverage audit of the same eager run and lowering or file (what "
                            "coverage_audit.py writes for the model or --pte FILE; its verdict counts too)")
    parser.add_argument("--audio", metavar="A.wav[,B.wav]", type=cli.audio_files, help="whisper: the log-mel of these WAV files (any rate "
                        "and channel count) as the inputs, one batch row each (default with --checkpoint: the "
                        "utterances the package ships); a checkpoint with its decoder transcribes them")
    cli.add_hf(parser)
    cli.add_dtype(parser)
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    if args.hf is not None and args.pte is not None:
        parser.error("argument --hf: not with --pte (the file names its model)")
    if args.audio is not None and (args.pte is not None or args.model != "whisper"):
        parser.error("argument --audio: for whisper, not with --pte (the file's export names its inputs)")
    if (args.model is None) == (args.pte is None and args.hf is None):
        parser.error("give a model, --hf DIR or --pte FILE (one of them)")
    if args.pte is not None and args.dtype != "float32":
        parser.error("argument --dtype: not allowed with --pte (the file's dtype is used)")
    if args.pte is not None and args.variant is not None:
        parser.error("argument --variant: not allowed with --pte (the file's variant is used)")
    if args.checkpoint is not None and (args.pte is not None or args.model == "all"):
        parser.error("argument --checkpoint: for one model, not with all or --pte (the file names its checkpoint)")
    runtime = getattr(args, "runtime", "python")
    with_coverage = getattr(args, "with_coverage", False)
    if with_coverage and runtime == "executorch":
        parser.error("argument --with-coverage: not with --runtime executorch (run coverage_audit.py --pte)")
    if runtime == "executorch" and args.pte is None:
        parser.error("argument --runtime: executorch needs --pte FILE")
    try:
        check_output_dir(args.output_dir)
    except ValueError as exc:
        parser.error(f"argument --output-dir: {exc}")
    cli.quiet_dependencies(args.verbose)
    cli.check_hf(parser, args)
    if args.variant is not None:
        from pipeline import models

        for name in resolve_models(args.model):
            if args.variant not in models.variants(name):
                parser.error(f"argument --variant: invalid choice for {name}: {args.variant!r} "
                             f"(choose from {', '.join(models.variants(name))})")
    try:
        return run_reports(kind, args.model, args.variant, args.output_dir, args.seed,
                           progress=cli.print_progress, pte=args.pte, dtype=args.dtype, runtime=runtime,
                           checkpoint=args.checkpoint, audio=args.audio, with_coverage=with_coverage,
                           hf=args.hf, task=args.task, inputs=args.inputs)
    except Exception as exc:  # one line for the user, status 1
        print(f"{parser.prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
