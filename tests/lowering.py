"""The shared `lower_and_compare` helper: lower a module, run it, hold it against eager."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

import pipeline
from pipeline import runtime

TOLERANCE = 2e-4


def assert_same_outputs(got, want, atol: float = TOLERANCE) -> None:
    """Same pytree structure, dtypes and shapes; values within `atol`."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec, f"output structure {got_spec} != eager {want_spec}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}: {g.dtype} {g.shape} vs {w.dtype} {w.shape}"
        err = (g.double() - w.double()).abs().max().item() if w.numel() else 0.0
        assert err <= atol, f"output {i}: max abs error {err:.3g} > {atol}"


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
