"""Rows on both sides of every held/streamed boundary, on both reduction paths, in float32,
float16 and bfloat16: constant rows exactly (out 0 + bias, the value as
the mean), rows of large mean and small spread within 2x eager float32's error against
float64, and eps = 0 and values near float32's limit giving NaN / inf where
aten.native_layer_norm does and finite values where it is finite.

The streamed rows (wider than 8 loads for each of 256 threads) once took the row's mean as
a sum of the threads' means weighted by count / width, inexact where a row does not split
evenly, and summed x itself: a constant row of 1e10 at width 2049 came out +-1, 33 at 3000
(a held row of an uneven split) 1.2e-3, rows of mean 1e6 had 2-3x eager's error, eps = 0
gave finite values, and a row of 3e38s a NaN mean.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

import pipeline

pytestmark = pytest.mark.usefixtures("gpu_info")
kernel = importlib.import_module("pipeline.wgsl.config")
ATEN = torch.ops.aten.native_layer_norm.default
EPS = 1e-5
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

# Rows are held while they fit 8 loads for each of 256 threads, streamed beyond: rows of
# scalar loads stream from 2049, of vec2 loads (width % 4 == 2) from 4098, of vec4 from 8196.
HELD = [5, 100, 2047, 2048, 3000, 4094, 4096, 8192]
STREAMED = [2049, 4097, 4098, 8193, 8196]
WIDTHS = sorted(HELD + STREAMED)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Per dtype, values that the dtype holds exactly: odd mantissas (3c is inexact in float32:
# 1e10, 0.1), the largest finite values, a float32 subnormal, zero.
CONSTANTS = {
    torch.float32: [3.25, -1e4, 33.0, 1e10, 0.1, 3e38, -3e38, FLOAT32_MAX, -FLOAT32_MAX, 1e-40, 0.0],
    torch.float16: [3.25, -1e4, 33.0, 0.1, 65504.0, -65504.0, 6e-8, 0.0],
    torch.bfloat16: [3.25, -1e4, 33.0, 1e10, 0.1, 3e38, -3e38, float(torch.finfo(torch.bfloat16).max), 0.0],
}
# (mean, standard deviation) of rows drawn in float64 and rounded to the dtype.
LARGE_MEAN = {
    torch.float32: [(1e6, 0.1), (1e4, 1e-2), (-3e4, 1e-3), (1e18, 1e12)],
    torch.float16: [(1000.0, 1.0), (-3000.0, 4.0)],
    torch.bfloat16: [(1e4, 64.0), (-3e5, 4096.0)],
}




def same_mean(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-equal means, except that a subnormal mean may come back 0: WGSL lets a device
    flush subnormals (the H200's Vulkan driver does; lavapipe keeps them)."""
    flushed = (want.float().abs() < torch.finfo(torch.float32).tiny) & (got == 0)
    return np.array_equal(got[~flushed].float().numpy(), want[~flushed].float().numpy())


def constant_rows(dtype: torch.dtype, width: int) -> torch.Tensor:
    values = torch.tensor(CONSTANTS[dtype], dtype=torch.float64).to(dtype)
    return values[:, None].expand(len(values), width).contiguous()


def test_the_widths_cross_every_path_boundary():
    """Every load width (1, 2 and 4 values) is tested held and streamed, in every dtype."""
    for dtype in ("float32", "float16", "bfloat16"):
        paths = set()
        for width in WIDTHS:
            config = kernel.choose_config(width, False, False, 8, dtype)
            assert (config.hold == 0) == (width in STREAMED), (dtype, width, config)
            paths.add((config.vec, config.hold == 0))
        assert paths == {(vec, streamed) for vec in (1, 2, 4) for streamed in (False, True)}, dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_constant_rows_are_exact(width, dtype, reduction):
    """out exactly 0 (aten's float32 0; aten's half outputs keep residues of its x * rstd -
    mean * rstd, up to 0.08 at -1e4), the value itself as the mean, rstd 1/sqrt(eps): also
    for rows of 3e38 and float32's largest value, where aten's mean is the value too (its
    rstd and out are NaN at widths that are a multiple of its CPU vector length, its first
    Welford merge multiplying an overflowed delta^2 by a count of 0: the kernel gives the
    true values there)."""
    x = constant_rows(dtype, width)
    out, mean, rstd = pipeline.layer_norm(x, [width], None, None, EPS)
    e_out, e_mean, e_rstd = ATEN(x, [width], None, None, EPS)
    assert torch.equal(out, torch.zeros_like(x)), f"out {out.abs().max().item():.3g} off 0"
    assert same_mean(mean.flatten(), x[:, 0]), f"mean {mean.flatten()} vs {x[:, 0]}"
    want = torch.full_like(rstd, EPS ** -0.5)
    if dtype == torch.float32:
        assert torch.allclose(rstd, want, rtol=1e-6, atol=0)
    else:
        assert torch.equal(rstd, want)
    # Where aten is finite, the kernel is, and agrees: out 0 where aten's is, the same mean and rstd.
    assert torch.equal(out[e_out == 0], e_out[e_out == 0])
    assert same_mean(mean[torch.isfinite(e_mean)], e_mean[torch.isfinite(e_mean)])
    finite = torch.isfinite(e_rstd)
    assert torch.allclose(rstd[finite], e_rstd[finite], rtol=1e-6 if dtype == torch.float32 else 0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2047, 2049, 3000, 4098, 8196])
def test_constant_rows_with_a_bias_give_the_bias(width, dtype, reduction):
    x = constant_rows(dtype, width)
    weight = torch.linspace(0.5, 2, width).to(dtype)
    bias = torch.linspace(-1, 1, width).to(dtype)
    out, mean, _ = pipeline.layer_norm(x, [width], weight, bias, EPS)
    assert torch.equal(out, bias.expand_as(x))
    assert same_mean(mean.flatten(), x[:, 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_constant_rows_with_eps_zero_are_nan_like_aten(width, dtype, reduction):
    """Variance exactly 0 and eps 0: rstd inf and out NaN (0 x inf), as aten gives them."""
    x = constant_rows(dtype, width)
    out, mean, rstd = pipeline.layer_norm(x, [width], None, None, 0.0)
    e_out, _, e_rstd = ATEN(x, [width], None, None, 0.0)
    assert torch.equal(torch.isnan(out), torch.isnan(e_out)) and torch.isnan(out).all()
    assert torch.equal(torch.isfinite(rstd), torch.isfinite(e_rstd))
    assert torch.equal(rstd, torch.full_like(rstd, float("inf")))
    assert same_mean(mean.flatten(), x[:, 0])


def _max_error(got: torch.Tensor, truth: torch.Tensor) -> float:
    return (got.double() - truth).abs().max().item()


def _half_ulp(dtype: torch.dtype, value: float) -> float:
    """Half the spacing of `dtype` at `value`: the error of a correctly rounded result."""
    return 0.5 * float(torch.finfo(dtype).eps) * 2.0 ** math.floor(math.log2(value)) if value > 0 else 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_large_mean_rows_within_twice_eagers_error(width, dtype, reduction):
    """Against float64 of the same inputs, out, mean and rstd at most 2x eager's error (at
    the same dtype); mean and rstd may also sit half an ulp of their dtype off the truth
    (correctly rounded, where eager happens to round luckier)."""
    gen = torch.Generator().manual_seed(width)
    for center, spread in LARGE_MEAN[dtype]:
        x = (torch.randn(16, width, generator=gen, dtype=torch.float64) * spread + center).to(dtype)
        ours = pipeline.layer_norm(x, [width], None, None, EPS)
        eager = ATEN(x, [width], None, None, EPS)
        truth = ATEN(x.double(), [width], None, None, EPS)
        for name, o, e, t in zip(("out", "mean", "rstd"), ours, eager, truth):
            assert torch.isfinite(o).all() and o.dtype == e.dtype, name
            err, eager_err = _max_error(o, t), _max_error(e, t)
            half_ulp = 0.0 if name == "out" else _half_ulp(dtype, t.abs().max().item())
            assert err <= 2 * eager_err + half_ulp, (
                f"mean {center:g} sd {spread:g}, {name}: error {err:.3g} vs float64, eager {eager_err:.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_rows_far_from_zero_are_centred_below_their_means_ulp(width, dtype, reduction):
    """Rows far from zero are centred at better than their mean's float32 ulp: out within
    its own dtype's rounding plus a few float32 ulps of float64, where centring x at the
    rounded mean left out up to 0.2 off at 1e4 +- 1e-2 (half an ulp at 1e4 over the spread).
    A row whose first value is an outlier stays within 2x eager's error and half an ulp of
    its largest value (first, far from the mean, is not the centre there: centred at it,
    out was 3-5x eager's error)."""
    gen = torch.Generator().manual_seed(width)
    centres = [(1e4, 1e-2), (1e6, 0.1), (300.0, 1.0)] if dtype == torch.float32 else LARGE_MEAN[dtype]
    for center, spread in centres:
        x = (torch.randn(8, width, generator=gen, dtype=torch.float64) * spread + center).to(dtype)
        out = pipeline.layer_norm(x, [width], None, None, EPS)[0]
        truth = ATEN(x.double(), [width], None, None, EPS)[0]
        top = truth.abs().max().item()
        limit = _half_ulp(dtype, top) + 8 * float(torch.finfo(torch.float32).eps) * top
        assert _max_error(out, truth) <= limit, f"mean {center:g} sd {spread:g}"
    x = torch.randn(8, width, generator=gen, dtype=torch.float64)
    x[:, 0] = 16.0
    x = x.to(dtype)
    out, truth = pipeline.layer_norm(x, [width], None, None, EPS)[0], ATEN(x.double(), [width], None, None, EPS)[0]
    eager_error = _max_error(ATEN(x, [width], None, None, EPS)[0], truth)
    assert _max_error(out, truth) <= 2 * eager_error + _half_ulp(dtype, truth.abs().max().item()), "first an outlier"


@pytest.mark.parametrize("width", WIDTHS)
def test_huge_rows_keep_their_mean(width, reduction):
    """Rows that span float32's range (starting at |x| >= 1: the kernel then takes their
    statistics at 2^-8 of their scale): the mean is right or NaN, never finite and wrong, and
    where M2, and so rstd and out, is past float32 they are NaN, like a row holding NaN (never
    a finite wrong rstd or out). Lavapipe keeps every such mean finite; the H200's driver,
    which contracts the arithmetic into fused multiply-adds, gives NaN for some. aten's mean
    is NaN for most of these rows; where it is finite (rows of one sign), its rstd is 0 and
    its out 0, though float64's rstd is finite (~5e-39) and its out O(1)."""
    gen = torch.Generator().manual_seed(width)
    x = (torch.rand(6, width, generator=gen, dtype=torch.float64) * 2 - 1) * FLOAT32_MAX
    x[:, 0] = torch.tensor([1.0, -1.0, 3e38, -3e38, FLOAT32_MAX, 1e30])
    x[1::2, 1:] = x[1::2, 1:].abs()  # rows of one sign too
    x = x.float()
    out, mean, rstd = pipeline.layer_norm(x, [width], None, None, EPS)
    t_out, t_mean, t_rstd = ATEN(x.double(), [width], None, None, EPS)
    scale = x.double().abs().amax(-1)
    mean_error = (mean.double().flatten() - t_mean.flatten()).abs()
    assert ((mean_error <= 1e-5 * scale) | mean.flatten().isnan()).all(), (mean.flatten(), t_mean.flatten())
    for r in range(len(x)):
        if torch.isnan(rstd[r]).all():
            assert torch.isnan(out[r]).all(), f"row {r}: rstd NaN but out not"
            continue
        assert torch.allclose(rstd[r].double(), t_rstd[r], rtol=1e-4, atol=0), f"row {r}"
        assert torch.allclose(out[r].double(), t_out[r], rtol=1e-3, atol=1e-3), f"row {r}"


def test_subnormal_and_zero_constant_rows_are_exact(reduction):
    """A row of one subnormal value, and of -0.0: the mean is the value (aten's), out 0."""
    for width in (2047, 2049, 8196):
        x = torch.tensor([[2.0**-149], [-3 * 2.0**-149], [-0.0]]).expand(3, width).contiguous()
        out, mean, _ = pipeline.layer_norm(x, [width], None, None, EPS)
        _, e_mean, _ = ATEN(x, [width], None, None, EPS)
        assert torch.equal(out, torch.zeros_like(x))
        assert same_mean(mean.flatten(), e_mean.flatten())
