"""Coverage audit: does every LayerNorm of the model reach the WGSL kernel?

Counts the LayerNorm/GroupNorm calls eager PyTorch makes, the LayerNorm ops of the
lowered program and the delegated ones; verdict "complete" iff all three agree.
    python scripts/coverage_audit.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
"""

from __future__ import annotations



if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()
    import sys

    from pipeline import cli

    cli.quiet_dependencies("--verbose" in sys.argv[1:])  # before the imports below load torchao

from pipeline.evaluation.runner import report_main  # noqa: E402

if __name__ == "__main__":
    _interrupts.run(lambda: report_main("coverage", __doc__))
