"""The evaluator: coverage audit and accuracy report of a lowered program against eager PyTorch.

    audit = audit_coverage(module, example_inputs, program)   # eager calls vs graph ops vs delegated
    report = evaluate_accuracy(module, inputs, program)       # delegated vs eager fp32 vs eager fp64
"""

from pipeline.evaluation.accuracy import AccuracyReport, LayerNormError, evaluate_accuracy, run_delegated
from pipeline.evaluation.coverage import CoverageAudit, audit_coverage, match_calls, program_records
from pipeline.evaluation.eager import EagerRun, NormCall, NormCallRecorder, run_eager, to_float64
from pipeline.evaluation.graph import LayerNormRecord, layer_norm_records
from pipeline.evaluation.metrics import compare, flatten_output
from pipeline.evaluation.runner import run_reports

__all__ = [
    "AccuracyReport",
    "CoverageAudit",
    "EagerRun",
    "LayerNormError",
    "LayerNormRecord",
    "NormCall",
    "NormCallRecorder",
    "audit_coverage",
    "compare",
    "evaluate_accuracy",
    "flatten_output",
    "layer_norm_records",
    "match_calls",
    "program_records",
    "run_delegated",
    "run_eager",
    "run_reports",
    "to_float64",
]
