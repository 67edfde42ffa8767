"""Accuracy report: is the delegated model still numerically the model?

Runs eager float32, eager float64 and the delegated program on the same inputs; the
verdict passes iff outputs are finite and the delegated max error vs float64 is at
most 2x eager float32's.
    python scripts/accuracy_report.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
"""

from __future__ import annotations

import sys

from pipeline.evaluation.runner import report_main

if __name__ == "__main__":
    sys.exit(report_main("accuracy", __doc__))
