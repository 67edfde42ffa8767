"""The kernel's RMSNorm (aten.rms_norm) against a float64 reference, with eager's error as the
yardstick: at most twice eager's, the same non-finite pattern, on every row path."""

import pytest
import torch

from pipeline.runtime import launch
from support.gpu import use_row_path
from support.grids import REDUCTIONS, all_pairs

pytestmark = pytest.mark.usefixtures("gpu_info")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Scalar, vec2 and vec4 loads; rows held by one thread, by a subgroup, by several; streamed.
WIDTHS = [1, 2, 3, 5, 7, 128, 768, 1023, 2304, 4096, 4097]


@pytest.fixture(params=REDUCTIONS)
def reduction(request, monkeypatch):
    """Each of the kernel's row paths in turn (support.gpu.use_row_path)."""
    return use_row_path(request.param, monkeypatch)


def assert_rms_close(x, weight=None, eps=1e-6, factor=2.0):
    """The kernel's rms_norm of `x` over its last dim: aten's dtype and shape, its NaN
    pattern, and an error from float64 (of the same inputs) at most `factor` x eager's."""
    width = x.shape[-1]
    ours = launch.rms_norm(x, [width], weight, eps)
    eager = torch.rms_norm(x, [width], weight, eps)
    truth = torch.rms_norm(x.double(), [width], None if weight is None else weight.double(), eps)
    assert ours.dtype == eager.dtype and ours.shape == eager.shape
    assert torch.equal(torch.isnan(ours), torch.isnan(eager)), "NaN pattern differs from aten's"
    finite = torch.isfinite(truth) & torch.isfinite(eager)
    if finite.any():
        err = (ours.double() - truth)[finite].abs().max().item()
        eager_err = (eager.double() - truth)[finite].abs().max().item()
        assert err <= factor * eager_err + 1e-30, f"error {err:.3g} vs float64, eager {eager_err:.3g}"
    return ours


@pytest.mark.parametrize("dtype,width,weight,reduction", all_pairs(DTYPES, WIDTHS, [None, "same", "float32"],
                                                                   REDUCTIONS), indirect=["reduction"])
def test_dtypes_widths_and_weights(dtype, width, weight, reduction):
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(9, width, generator=gen) * 2 + 0.5).to(dtype)
    w = torch.randn(width, generator=gen)
    w = None if weight is None else w.to(dtype if weight == "same" else torch.float32)
    assert_rms_close(x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [3, 768, 4097])
def test_rows_of_large_magnitude_and_squares_past_float16(dtype, width, reduction):
    # Rows of 300 (whose squares pass float16's 65504: the statistic is float32's), of 3e4, and
    # of mean 1e3 with a small spread.
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(3, width, generator=gen)
    x[0] = x[0] * 3 + 300
    x[1] = x[1] * 1e3 + 3e4
    x[2] = x[2] * 1e-2 + 1e3
    assert_rms_close(x.to(dtype), torch.randn(width, generator=gen).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 3, 768, 4097])
def test_constant_and_zero_rows(dtype, width, reduction):
    x = torch.tensor([0.0, 1.0, -7.5, 1e4]).repeat_interleave(width).reshape(4, width).to(dtype)
    ours = assert_rms_close(x)
    assert torch.equal(ours[0], torch.zeros(width, dtype=dtype))  # 0 * rsqrt(eps)
    # eps 0: a zero row is 0 * inf, NaN as in aten; the others exactly +-1.
    ours = assert_rms_close(x, eps=0.0)
    assert torch.isnan(ours[0]).all() and torch.equal(ours[1:].abs(), torch.ones(3, width, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 3, 768, 4097])
def test_nan_and_inf_rows_are_aten_s(dtype, width, reduction):
    # A NaN makes its row NaN; an infinity makes mean(x^2) inf and rstd 0: out 0, NaN at the
    # infinities (inf * 0). So does a float32 row whose squares pass float32's range.
    x = torch.randn(5, width, generator=torch.Generator().manual_seed(width))
    x[0, width // 2] = float("nan")
    x[1, -1] = float("inf")
    x[2, 0] = float("-inf")
    x[3] = 3e19 if dtype != torch.float16 else 6e4
    assert_rms_close(x.to(dtype), torch.randn(width).to(dtype))


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5, 1e30, -1e-3, float("inf"), float("nan"), None])
def test_every_eps_as_aten_takes_it(eps, reduction):
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1)) * 1e-2
    ours = launch.rms_norm(x, [96], None, eps)
    eager = torch.rms_norm(x, [96], None, eps)
    assert torch.equal(torch.isnan(ours), torch.isnan(eager))
    assert torch.allclose(ours[~ours.isnan()], eager[~eager.isnan()], rtol=1e-5, atol=1e-6)


def test_more_rows_than_one_grid_dimension(reduction):
    x = torch.randn(70_001, 3, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    assert_rms_close(x, torch.randn(3).to(torch.float16))


def test_normalized_over_several_dims_and_bad_arguments():
    x = torch.randn(2, 3, 4, 5)
    assert torch.allclose(launch.rms_norm(x, [4, 5], None, 1e-6), torch.rms_norm(x, [4, 5], None, 1e-6), atol=1e-6)
    with pytest.raises(ValueError, match="normalized_shape"):
        launch.rms_norm(x, [4], None, 1e-6)
    with pytest.raises(ValueError, match="weight must have shape"):
        launch.rms_norm(x, [5], torch.ones(4), 1e-6)
