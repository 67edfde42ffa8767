"""Error metrics between an output and its reference, and the statistics of a LayerNorm's
input rows; all computed in float64."""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


# A row this many of its standard deviations from its mean (or with its mean that far from
# zero) is an outlier: random weights stay under 4, trained models reach 17 (the most
# possible at width n is sqrt(n - 1)). The reports highlight it.
OUTLIER_SIGMAS = 8.0


@dataclass
class RowStats:
    """What a LayerNorm's input rows (the groups it normalizes) hold, in float64.

    std is a row's population standard deviation, without eps. A constant row (std 0) has
    no ratio: it is counted in `constant_rows` and left out of the two ratios, which are
    None when no row has a spread. A row holding inf or NaN is counted in `nonfinite_rows`
    and left out of all but `max_abs`.
    """

    rows: int
    width: int
    max_abs: float | None  # largest |x|
    max_dev_over_std: float | None  # largest |x - mean| / std of a row
    max_mean_over_std: float | None  # largest |mean| / std of a row
    min_row_std: float | None  # smallest std of a finite row
    constant_rows: int
    nonfinite_rows: int
    outlier_row: int | None  # the row of max_dev_over_std

    @property
    def outlier(self) -> bool:
        return any(r is not None and r > OUTLIER_SIGMAS for r in (self.max_dev_over_std, self.max_mean_over_std))


def row_stats(x: torch.Tensor, width: int) -> RowStats:
    """The statistics of `x` taken as rows of `width` consecutive elements."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if not isinstance(width, int) or isinstance(width, bool) or width < 0 or (
            x.numel() and (width == 0 or x.numel() % width)):
        raise ValueError(f"width must divide x's {x.numel()} elements, got {width!r}")
    if x.numel() == 0:
        return RowStats(0, width, None, None, None, None, 0, 0, None)
    rows = x.detach().reshape(-1, width).to(torch.float64)
    n = rows.shape[0]
    # Two passes over the rows (variance and mean; min and max), the rest on per-row values.
    var, mean = torch.var_mean(rows, dim=1, correction=0)
    low, high = torch.aminmax(rows, dim=1)
    std = var.sqrt()
    finite = torch.isfinite(mean)  # a float64 sum of float32 or half values overflows only by inf in the row
    spread = finite & (std > 0)
    stats = RowStats(n, width, float(torch.maximum(high, -low).max()), None, None,
                     float(std[finite].min()) if bool(finite.any()) else None,
                     int((finite & (std == 0)).sum()), n - int(finite.sum()), None)
    if bool(spread.any()):
        index = spread.nonzero().squeeze(1)
        ratio = torch.maximum(high[index] - mean[index], mean[index] - low[index]) / std[index]
        worst = int(ratio.argmax())
        stats.max_dev_over_std, stats.outlier_row = float(ratio[worst]), int(index[worst])
        stats.max_mean_over_std = float((mean[index].abs() / std[index]).max())
    return stats
