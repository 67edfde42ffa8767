"""Accuracy: the delegated program against eager float32 and eager float64 (same weights).

Verdict: outputs finite and delegated-vs-float64 max error <= 2 x eager-float32-vs-float64
max error, i.e. delegation stays inside float32 eager's own error envelope.

Each delegated LayerNorm also carries its input as the delegate received it
(`layer_norm_input`): the statistics of its rows (max |x|, the largest |x - mean| / std
and |mean| / std of a row, the smallest row std) and the delegate's error against float64
LayerNorm of that same input beside eager's, over all rows and on the outlier row.

A half-precision model (float16, bfloat16) is held against eager at its own dtype: the
`eager_fp32_*` figures are then eager at that dtype (`dtype` says which), and
`eager_float32_vs_fp64_max_abs` gives float32 eager's error with the same (half) weights
and inputs beside them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from pipeline.evaluation.coverage import CoverageAudit, coverage_of, match_calls, program_records
from pipeline.evaluation.eager import run_eager, to_dtype, to_float64
from pipeline.evaluation.layer_norm_input import OUTLIER_SIGMAS, LayerNormInput, check_layer_norm_input
from pipeline.evaluation.metrics import compare, flatten_output, max_abs_error

ENVELOPE = 2.0


@dataclass
class LayerNormError:
    """One delegated LayerNorm's output against eager's at the same module."""

    module_path: str
    node: str
    delegate: str | None
    origin: str
    row_width: int
    delegated_vs_fp64: float | None  # max abs error; None when not captured
    delegated_vs_fp32: float | None
    eager_fp32_vs_fp64: float | None
    note: str = ""
    input: LayerNormInput | None = None  # None when the delegate's call was not seen


@dataclass
class AccuracyReport:
    model: str
    variant: str | None
    delegated_vs_fp64: dict
    eager_fp32_vs_fp64: dict
    layer_norms: list[LayerNormError] = field(default_factory=list)
    # The coverage audit of the same eager float32 run (not part of `as_dict`).
    coverage: CoverageAudit | None = None
    dtype: str = "float32"  # of the module and inputs, and so of the eager run held against
    eager_float32_vs_fp64: dict | None = None  # for a half dtype: float32 eager, same weights
    # The outputs compared (not part of `as_dict`): "eager", "fp64", "delegated", and for a
    # half dtype "eager_float32".
    outputs: dict | None = None

    @property
    def worst_layer_norm(self) -> LayerNormError | None:
        measured = [e for e in self.layer_norms if e.delegated_vs_fp64 is not None]
        return max(measured, key=lambda e: _nan_high(e.delegated_vs_fp64), default=None)

    @property
    def passed(self) -> bool:
        d, e = self.delegated_vs_fp64, self.eager_fp32_vs_fp64
        return bool(d["finite"]) and d["max_abs"] <= ENVELOPE * e["max_abs"]

    def as_dict(self) -> dict:
        worst = self.worst_layer_norm
        return {
            "model": self.model,
            "variant": self.variant,
            "verdict": "pass" if self.passed else "fail",
            "accuracy": {
                "delegated_vs_fp64_max_abs": self.delegated_vs_fp64["max_abs"],
                "eager_fp32_vs_fp64_max_abs": self.eager_fp32_vs_fp64["max_abs"],
                "envelope": ENVELOPE,
                "dtype": self.dtype,
                "eager_float32_vs_fp64_max_abs": (None if self.eager_float32_vs_fp64 is None
                                                  else self.eager_float32_vs_fp64["max_abs"]),
                "cosine": self.delegated_vs_fp64["cosine"],
                "sqnr_db": self.delegated_vs_fp64["sqnr_db"],
                "worst_layer_norm": None if worst is None else {
                    "module_path": worst.module_path,
                    "node": worst.node,
                    "max_abs": worst.delegated_vs_fp64,
                },
                "delegated_vs_fp64": self.delegated_vs_fp64,
                "eager_fp32_vs_fp64": self.eager_fp32_vs_fp64,
            },
            "layer_norm_inputs": self.input_summary(),
            "layer_norms": [asdict(e) for e in self.layer_norms],
        }

    def input_summary(self) -> dict:
        """The largest of each LayerNorm input statistic over all LayerNorms, where it is, and
        how many LayerNorms have an outlier row (more than OUTLIER_SIGMAS)."""
        stats = [(e.module_path, e.input.stats) for e in self.layer_norms if e.input is not None]
        summary: dict = {"outlier_sigmas": OUTLIER_SIGMAS, "outlier_layer_norms": sum(s.outlier for _, s in stats)}
        for key in ("max_abs", "max_dev_over_std", "max_mean_over_std"):
            found = [(getattr(s, key), path) for path, s in stats if getattr(s, key) is not None]
            value, path = max(found, key=lambda f: _nan_high(f[0]), default=(None, None))
            summary[key], summary[f"{key}_at"] = value, path
        return summary


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x


def run_delegated(program, inputs: Sequence, on_call: Callable[[str, tuple, tuple], None] | None = None,
                  ) -> tuple[object, dict[str, list[torch.Tensor]]]:
    """Run the lowered program, capturing each delegate's flattened outputs by delegate name;
    `on_call(name, inputs, outputs)`, when given, sees each delegate call as it happens.

    Relies on the executor's hook: `program(*inputs, on_delegate=fn)` calls
    `fn(name, inputs, outputs)` after each delegate ran, `name` being one of the
    program's `delegate_names`.
    """
    captured: dict[str, list[torch.Tensor]] = {}

    def on_delegate(name: str, args: Sequence, outputs: object) -> None:
        captured[name] = [t.detach().clone() for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        if on_call is not None:
            on_call(name, tuple(args), tuple(outputs))

    with torch.no_grad():
        outputs = program(*inputs, on_delegate=on_delegate)
    return outputs, captured


def evaluate_accuracy(
    module: torch.nn.Module,
    inputs: Sequence,
    program,
    model: str = "",
    variant: str | None = None,
) -> AccuracyReport:
    """Run eager (at the module's dtype: float32, float16 or bfloat16), eager float64 and
    `program` on `inputs`; compare outputs and LayerNorms."""
    fp32 = run_eager(module, inputs)
    fp64 = run_eager(*to_float64(module, inputs))
    # Measured during the run: the inputs need not be kept.
    delegates = dict(zip(program.delegate_names, program.delegates))
    seen: dict[str, LayerNormInput] = {}

    def measure(name: str, args: tuple, outputs: tuple) -> None:
        seen[name] = check_layer_norm_input(delegates[name], args, outputs)

    delegated_out, captured = run_delegated(program, inputs, measure)

    reference = flatten_output(fp64.outputs)
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    report = AccuracyReport(
        model=model,
        variant=variant,
        delegated_vs_fp64=compare(flatten_output(delegated_out), reference),
        eager_fp32_vs_fp64=compare(flatten_output(fp32.outputs), reference),
        dtype=str(dtype).removeprefix("torch."),
    )
    report.outputs = {"eager": fp32.outputs, "fp64": fp64.outputs, "delegated": delegated_out}
    if dtype != torch.float32:
        single = run_eager(*to_dtype(module, inputs, torch.float32)).outputs
        report.eager_float32_vs_fp64 = compare(flatten_output(single), reference)
        report.outputs["eager_float32"] = single
    records = program_records(program, fp32.calls)
    report.coverage = coverage_of(fp32.calls, records, program, model, variant)
    calls32, _ = match_calls(records, fp32.calls)
    calls64, _ = match_calls(records, fp64.calls)
    for rec, c32, c64 in zip(records, calls32, calls64):
        if not rec.delegated:
            continue
        err = LayerNormError(rec.module_path, rec.node, rec.delegate, rec.origin, rec.row_width, None, None, None)
        outputs = captured.get(rec.delegate, [])
        err.input = seen.get(rec.delegate)
        if c32 is None or c64 is None:
            err.note = "no eager call at this module"
        elif rec.delegate_output_index is None or rec.delegate_output_index >= len(outputs):
            err.note = "output not visible outside its delegate"
        else:
            got = outputs[rec.delegate_output_index]
            if got.numel() != c64.reference.numel():
                err.note = f"shape {list(got.shape)} vs eager {list(c64.reference.shape)}"
            else:
                err.delegated_vs_fp64 = max_abs_error(got, c64.reference)
                err.delegated_vs_fp32 = max_abs_error(got, c32.reference)
                err.eager_fp32_vs_fp64 = max_abs_error(c32.reference, c64.reference)
        report.layer_norms.append(err)
    return report
