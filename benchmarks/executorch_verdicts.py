"""The ExecuTorch-runtime verdict (run_pte.py --runtime executorch) of the default models,
exported with XNNPACK or portable kernels.

    python benchmarks/executorch_verdicts.py [--runs whisper:xnnpack,bart:portable,...] [--out-dir DIR] [--json FILE]
        [--checkpoints DIR]

Each run exports the model (`export_model`, the file one ships; a file already in
--out-dir with its coverage file is reused; with --checkpoints DIR, each model is read from
the Hugging Face directory DIR/<model> and exported anew) and runs it with `run_artifact(...,
runtime="executorch", repeats=1)`: its error against float64 next to the same export
without our delegate, eager's beside, and each LayerNorm delegate call against the Python
runtime's. The JSON (written atomically after every run) keeps the verdicts whole.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline import models
from pipeline.evaluation.artifact import ArtifactError, read_artifact, run_artifact
from pipeline.aot.export import export_model
from pipeline.ioutil import write_json_atomic

DEFAULT_RUNS = "whisper:xnnpack,bart:xnnpack,florence2:xnnpack,whisper:portable,bart:portable"


def exported(pte: Path) -> bool:
    """Whether `pte` and its coverage file are a pair an earlier export wrote."""
    try:
        read_artifact(pte)
    except (ArtifactError, FileNotFoundError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=DEFAULT_RUNS)
    parser.add_argument("--out-dir", default="out/verdicts")
    parser.add_argument("--json", default=None)
    parser.add_argument("--checkpoints", type=Path, metavar="DIR", help="the models' Hugging Face directories, DIR/<model>")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = {"command": "python benchmarks/executorch_verdicts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "results": []}
    failed = 0
    for run in args.runs.split(","):
        name, cpu_backend = run.split(":")
        stem = f"{name}-{models.default_variant(name)}" + ("-xnnpack" if cpu_backend == "xnnpack" else "")
        pte = Path(args.out_dir) / f"{stem}.pte"
        started = time.perf_counter()
        if args.checkpoints is None and exported(pte):
            say(f"{stem}: reusing {pte}")
        else:  # a checkpoint's file is named by its variant, known once it is read
            checkpoint = args.checkpoints / name if args.checkpoints else None
            pte = Path(export_model(name, checkpoint=checkpoint, output_dir=args.out_dir, cpu_backend=cpu_backend,
                                    progress=say)["pte"])
            stem = pte.stem
        export_seconds = time.perf_counter() - started
        started = time.perf_counter()
        result = run_artifact(pte, runtime="executorch", repeats=1, progress=say)
        verdict = result["executorch_verdict"]
        row = {"model": name, "variant": result["variant"], "cpu_backend": cpu_backend, "pte": str(pte),
               "export_seconds": round(export_seconds, 1), "verdict_seconds": round(time.perf_counter() - started, 1),
               "forward_seconds": result["seconds_per_run"], "passed": verdict["passed"], "verdict": verdict}
        report["results"].append(row)
        failed += not verdict["passed"]
        same = sum(r["identical"] for r in verdict["layer_norms"])
        print(f"{stem}: {'pass' if verdict['passed'] else 'FAIL ' + verdict['why']}; file/reference rel L2 "
              f"{verdict['rel_l2_ratio']:.3f}x, max abs {verdict['max_abs_ratio']:.3f}x; file/eager rel L2 "
              f"{verdict['file_vs_fp64']['rel_l2'] / verdict['eager_vs_fp64']['rel_l2']:.2f}x, max abs "
              f"{verdict['file_vs_fp64']['max_abs'] / verdict['eager_vs_fp64']['max_abs']:.2f}x; LayerNorms "
              f"bit-identical {same}/{len(verdict['layer_norms'])}", flush=True)
        if args.json:
            write_json_atomic(args.json, report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
