"""Coverage audit: does every LayerNorm of the model reach the WGSL kernel?

Counts the LayerNorm/GroupNorm calls eager PyTorch makes, the LayerNorm ops of the
lowered program and the delegated ones; verdict "complete" iff all three agree.
    python scripts/coverage_audit.py {bart,florence2,whisper,all} [--variant V] [--output-dir DIR]
"""

from __future__ import annotations

import sys

from pipeline.evaluation.runner import report_main

if __name__ == "__main__":
    sys.exit(report_main("coverage", __doc__))
