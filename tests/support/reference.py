"""Reference checks: the kernel against aten in float64, a program's outputs against eager."""

from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as pytree

import pipeline

ATEN = torch.ops.aten.native_layer_norm.default


def reference(x, shape, weight, bias, eps):
    """aten.native_layer_norm in float64: the truth both float32 versions are held against."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    return ATEN(x.double(), list(shape), d(weight), d(bias), eps)


def assert_close_to_reference(x, shape, weight=None, bias=None, eps=1e-5, factor=4.0):
    """Kernel error vs float64 must be at most `factor` x eager float32's own error, plus a floor:
    a few ulp of the value, and for `out` one float32 ulp of the row's mean carried through
    rstd and weight (no float32 mean is closer; over a few elements eager can be luckier)."""
    ours = pipeline.layer_norm(x, shape, weight, bias, eps)
    eager = ATEN(x, list(shape), weight, bias, eps)
    truth = reference(x, shape, weight, bias, eps)
    mean_ulp = np.spacing(truth[1].float().abs().numpy()).astype(np.float64) * truth[2].numpy()
    gain = 1.0 if weight is None else max(1.0, weight.abs().max().item())
    finite_rows = np.isfinite(mean_ulp)
    mean_floor = float(mean_ulp[finite_rows].max()) * gain if finite_rows.any() else 0.0
    for name, o, e, t in zip(("out", "mean", "rstd"), ours, eager, truth):
        assert o.dtype == torch.float32 and o.shape == e.shape, name
        # PyTorch's mean of a row holding one infinity is +-inf or NaN depending on where
        # it sits; the kernel must agree on which statistics are non-finite, and on out's NaNs.
        same = torch.isnan if name == "out" else torch.isfinite
        assert torch.equal(same(o), same(e)), f"{name}: non-finite pattern differs from PyTorch"
        finite = torch.isfinite(t)
        if not finite.any():
            continue
        scale = t[finite].abs().max().item()
        err = (o.double() - t)[finite].abs().max().item()
        eager_err = (e.double() - t)[finite].abs().max().item()
        floor = 8 * np.finfo(np.float32).eps * max(scale, 1.0) + (mean_floor if name == "out" else 0.0)
        assert err <= factor * eager_err + floor, (
            f"{name}: error {err:.3g} vs float64, eager float32 {eager_err:.3g} (x{factor} + {floor:.3g})"
        )
    return ours


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


def assert_like_aten(got: torch.Tensor, eager: torch.Tensor, truth: torch.Tensor, what: str,
                     factor: float = 4.0) -> None:
    """One output of the product beside aten's of the same inputs (`eager`) and the float64
    `truth`: aten's dtype and shape, NaN and infinities exactly where aten has them, and an
    error against float64 of at most `factor` x aten's own plus a floor: 8 float32 ulp of the
    output's scale (assert_close_to_reference's), or 2 ulp of a half dtype's (a value may round
    to the other side of a tie, and a GroupNorm's half output is rounded twice: see
    pipeline.aot.passes.group_norm)."""
    assert got.dtype == eager.dtype and got.shape == eager.shape, (
        f"{what}: {got.dtype} {list(got.shape)}, aten's {eager.dtype} {list(eager.shape)}")
    assert torch.equal(got.isnan(), eager.isnan()), f"{what}: NaN where aten has none, or none where it has"
    infinite = eager.isinf()
    assert torch.equal(got.isinf(), infinite) and torch.equal(got[infinite], eager[infinite]), (
        f"{what}: infinities differ from aten's")
    finite = torch.isfinite(truth) & torch.isfinite(eager)
    if not finite.any():
        return
    scale = truth[finite].abs().max().item()
    err = (got.double() - truth)[finite].abs().max().item()
    eager_err = (eager.double() - truth)[finite].abs().max().item()
    ulp = max(8 * torch.finfo(torch.float32).eps, 2 * torch.finfo(eager.dtype).eps)
    floor = ulp * max(scale, 1.0)
    assert err <= factor * eager_err + floor, (
        f"{what}: error {err:.3g} vs float64, aten's {eager_err:.3g} (x{factor} + {floor:.3g})")
