"""Accuracy report: is the delegated model still numerically the model?

Runs eager float32, eager float64 and the delegated program on the same inputs; the
verdict passes iff outputs are finite and the delegated max error vs float64 is at
most 2x eager float32's.
    python scripts/accuracy_report.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import sys

from pipeline.evaluation.runner import DEFAULT_OUTPUT_DIR, MODEL_NAMES, run_reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=[*MODEL_NAMES, "all"], help="which model, or all of them")
    parser.add_argument("--variant", help="model variant (default: each model's default)")
    parser.add_argument("--output-dir", default=str(DEFAULT_OUTPUT_DIR), help=f"default {DEFAULT_OUTPUT_DIR}")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    args = parser.parse_args(argv)
    try:
        return run_reports("accuracy", args.model, args.variant, args.output_dir, args.seed,
                           progress=lambda line: print(line, flush=True))
    except Exception as exc:  # one line for the user, status 1
        print(f"{parser.prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
