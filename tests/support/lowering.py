"""The shared `lower_and_compare` helper: lower a module, run it, hold it against eager."""

from __future__ import annotations

import torch

import pipeline
from pipeline import runtime
from support.reference import assert_same_outputs


def lower_and_compare(
    module: torch.nn.Module,
    example_inputs: tuple,
    fresh_inputs: list[tuple] = (),
    *,
    dynamic_shapes=None,
    layer_norms: int | None = None,
    complete: bool = True,
) -> pipeline.interpreter.Program:
    """Lower `module`, check coverage, and compare against eager on example and fresh inputs.

    `layer_norms` is the number of LayerNorms (GroupNorms included) the model holds;
    with `complete`, every one of them must be delegated. Each call must dispatch the
    kernel at least once per delegated LayerNorm.
    """
    module.eval()
    prog = pipeline.lower(module, example_inputs, dynamic_shapes)
    cov = prog.coverage
    if layer_norms is not None:
        assert cov.total == layer_norms, f"coverage counted {cov.total} LayerNorms, the model has {layer_norms}"
    if complete:
        assert cov.total > 0 and cov.delegated == cov.total and cov.not_delegated == [], cov
    for inputs in (example_inputs, *fresh_inputs):
        before = runtime.stats()["dispatches"]
        got = prog(*inputs)
        assert runtime.stats()["dispatches"] - before >= cov.delegated
        with torch.no_grad():
            want = module(*inputs)
        assert_same_outputs(got, want)
    return prog
