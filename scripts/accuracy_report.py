"""Accuracy report: is the delegated model still numerically the model?

Runs eager float32, eager float64 and the delegated program on the same inputs; the
verdict passes iff outputs are finite and the delegated max error vs float64 is at
most 2x eager float32's.
    python scripts/accuracy_report.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
    python scripts/accuracy_report.py --pte FILE [--runtime {python,executorch}] [--output-dir DIR]

With --pte FILE --runtime executorch the file runs in ExecuTorch's runtime and is held
against the same model exported with the same CPU backend and no WebGPU delegate, run
there: relative L2 against float64 at most 1.1x the reference's, max abs at most 1.5x,
every LayerNorm delegate call bit-identical to the Python runtime's (eager's errors beside).
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
    _interrupts.run(lambda: report_main("accuracy", __doc__))
