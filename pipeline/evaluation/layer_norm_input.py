"""What a delegated LayerNorm's input holds, and how the kernel does on exactly that input.

A trained model's LayerNorm inputs hold rows far from their mean in standard deviations
(Whisper tiny.en's final LayerNorm: |x| up to 623, a row 16.7 standard deviations out)
where the zoo's seeded random weights stay under 6.3: such rows are where a LayerNorm
kernel loses precision first. For each delegate call this measures, in float64, the statistics of the input rows
and the error of the delegate's output against float64 LayerNorm of the same input, beside
eager's (aten's native_layer_norm at the input's dtype) on the same input: the kernel
alone, with no upstream difference in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline.evaluation.metrics import max_abs_error

# A row this many of its standard deviations from its mean (or its mean that far from zero)
# is an outlier, marked in the reports. The most possible at width n is sqrt(n - 1).
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


@dataclass
class LayerNormInput:
    """One delegate call's input rows and the errors on exactly that input (max abs against
    float64 LayerNorm of the same input, weights and eps): the delegate's, eager's beside it,
    over all rows and on the outlier row alone."""

    stats: RowStats
    delegated_vs_fp64: float | None  # None when the delegate does not return the normalized output
    eager_fp32_vs_fp64: float  # aten's native_layer_norm at the input's dtype
    outlier_row_delegated_vs_fp64: float | None
    outlier_row_eager_fp32_vs_fp64: float | None


def _norm(op: str, x: torch.Tensor, shape: list[int], weight, bias, eps: float) -> torch.Tensor:
    """aten's output of the delegate's norm (`op`, a blob's) at x's dtype."""
    if op == "rms_norm":
        return torch.ops.aten.rms_norm(x, shape, weight, eps)
    return torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)[0]


def check_layer_norm_input(delegate, args: Sequence[torch.Tensor],
                           outputs: Sequence[torch.Tensor | None]) -> LayerNormInput:
    """The input statistics and same-input errors of one call of `delegate` (a
    `pipeline.runtime.delegate.LayerNormDelegate`) with `args` that returned `outputs`."""
    x, shape, weight, bias, eps = delegate.layer_norm_arguments(*args)
    stats = row_stats(x, math.prod(shape))
    out_at = delegate.params.outputs.index(0) if 0 in delegate.params.outputs else None
    got = None if out_at is None or out_at >= len(outputs) else outputs[out_at]

    def wide(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().to(torch.float64)

    with torch.no_grad():
        exact = _norm(delegate.params.op, wide(x), list(shape), wide(weight), wide(bias), eps)
        eager = _norm(delegate.params.op, x.detach(), list(shape), weight, bias, eps)
    check = LayerNormInput(stats, None, max_abs_error(eager, exact), None, None)
    if got is not None and got.numel() == exact.numel():
        check.delegated_vs_fp64 = max_abs_error(got, exact)
    if stats.outlier_row is not None:
        def row(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1, stats.width)[stats.outlier_row]

        check.outlier_row_eager_fp32_vs_fp64 = max_abs_error(row(eager), row(exact))
        if check.delegated_vs_fp64 is not None:
            check.outlier_row_delegated_vs_fp64 = max_abs_error(row(got), row(exact))
    return check
