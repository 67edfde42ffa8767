"""Coverage audit: does every LayerNorm of the model reach the WGSL kernel?

Counts the LayerNorm/GroupNorm calls eager PyTorch makes, the LayerNorm ops of the
lowered program and the delegated ones; verdict "complete" iff all three agree.
    python scripts/coverage_audit.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
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
        return run_reports("coverage", args.model, args.variant, args.output_dir, args.seed,
                           progress=lambda line: print(line, flush=True))
    except Exception as exc:  # one line for the user, status 1
        print(f"{parser.prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
