"""Error metrics between an output and its reference, computed in float64."""

from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_leaves


def flatten_output(output: object) -> torch.Tensor:
    """All floating-point tensors of a (nested) model output, flattened and joined, as float64."""
    leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise ValueError("output has no floating-point tensors to compare")
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in leaves])


def compare(actual: torch.Tensor, reference: torch.Tensor) -> dict[str, float | bool]:
    """max abs error, relative L2 error, cosine similarity, SQNR (dB) of `actual` against `reference`.

    SQNR = 10·log10(‖reference‖² / ‖actual − reference‖²); +inf when they are equal.
    """
    a = actual.detach().reshape(-1).to(torch.float64)
    r = reference.detach().reshape(-1).to(torch.float64)
    if a.shape != r.shape:
        raise ValueError(f"actual has {a.numel()} elements, reference has {r.numel()}")
    finite = bool(torch.isfinite(a).all())
    diff = a - r
    signal = float(r.square().sum())
    noise = float(diff.square().sum())
    norms = float(a.norm()) * float(r.norm())
    return {
        "max_abs": float(diff.abs().max()) if a.numel() else 0.0,
        "rel_l2": math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else math.inf),
        "cosine": float(a @ r) / norms if norms > 0 else (1.0 if noise == 0 else 0.0),
        "sqnr_db": _sqnr(signal, noise),
        "finite": finite,
    }


def max_abs_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """`compare(actual, reference)["max_abs"]` alone, at a fraction of the cost."""
    if actual.numel() != reference.numel():
        raise ValueError(f"actual has {actual.numel()} elements, reference has {reference.numel()}")
    if not actual.numel():
        return 0.0
    diff = actual.detach().reshape(-1).to(torch.float64) - reference.detach().reshape(-1).to(torch.float64)
    return float(diff.abs_().max())


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
