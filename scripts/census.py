"""Census: every architecture of the installed transformers, built tiny with random weights, through
each stage (build, eager, export, ExecuTorch alone as the control, our partitioner, preprocess,
Python runtime, native runtime, coverage, accuracy), each in its own process; where each stops
and why, ours or not. Records go to OUTPUT_DIR/census.jsonl as they come (a second run resumes),
the report to census.json, .md and .html. Exit status 1 when a row fails in one of our stages.
    python scripts/census.py [NAME ...] [--only A,B] [--sample] [--jobs N] [--timeout S] [--memory GB]
        [--output-dir DIR] [--fresh] [--ray ADDRESS] [--control {first,on-failure}]
"""

from __future__ import annotations


if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()
    import sys

    from pipeline import cli

    cli.quiet_dependencies("--verbose" in sys.argv[1:])  # before the imports below load torchao

from pipeline.census.run import census_main  # noqa: E402

if __name__ == "__main__":
    _interrupts.run(lambda: census_main(__doc__))
