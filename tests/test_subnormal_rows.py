"""float32 rows of subnormal values: where the kernel's excess error over eager comes from.

Measured on lavapipe (README, "Subnormal rows"): the driver keeps subnormals (WGSL would let
it flush them), and the excess is the kernel's own arithmetic. A row's mean is the sum over
its threads of (thread mean x count / width); in the subnormal range every one of those
terms rounds on the fixed grid of 2^-149 (an absolute error, not a relative one), so the
mean is off by several units where eager's single sum and division is off by one or two.
Such a row's squares underflow to 0, so rstd is 1/sqrt(eps) = 316 and every unit of the
mean's error is 316 units of the output's. These tests hold that account to the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pipeline

pytestmark = pytest.mark.usefixtures("gpu_info")

UNIT = 2.0**-149  # the smallest float32 subnormal: errors here are counted in it
EPS = 1e-5

PROBE = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> s: array<f32>;
@group(0) @binding(2) var<storage, read_write> times_one: array<f32>;
@group(0) @binding(3) var<storage, read_write> divided: array<f32>;
@group(0) @binding(4) var<storage, read_write> summed: array<f32>;
@group(0) @binding(5) var<storage, read_write> product: array<f32>;

@compute @workgroup_size(1)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    times_one[i] = x[i] * s[0];
    divided[i] = x[i] / s[1];
    summed[i] = x[i] + x[i];
    product[i] = s[2] * s[2];
}
"""


def test_the_driver_keeps_float32_subnormals(gpu_info):
    """Arithmetic on subnormal inputs, and normal inputs whose result is subnormal, come
    back as IEEE float32 computes them (no flush to zero) on this adapter."""
    from wgpu.utils.compute import compute_with_buffers

    if "llvmpipe" not in gpu_info["adapter"].lower() and "lavapipe" not in gpu_info["adapter"].lower():
        pytest.skip(f"measured on lavapipe; adapter {gpu_info['adapter']!r} may flush subnormals")
    x = (np.array([1, 3, 1000, 2**22, 2**23 - 1], dtype=np.float64) * UNIT).astype(np.float32)
    s = np.array([1.0, 7.0, 2.0**-70], dtype=np.float32)
    n = len(x)
    got = compute_with_buffers({0: x, 1: s}, {2: (n, "f"), 3: (n, "f"), 4: (n, "f"), 5: (n, "f")}, PROBE, n=n)
    with np.errstate(under="ignore"):
        assert np.array_equal(np.array(got[2], dtype=np.float32), x)
        assert np.array_equal(np.array(got[4], dtype=np.float32), x + x)
        assert np.array(got[5], dtype=np.float32)[0] == np.float32(2.0**-140)
        # Division rounds within one unit (a reciprocal and a multiply), not to zero.
        assert np.abs(np.array(got[3], dtype=np.float64) - x / 7.0).max() <= UNIT


def _rows(width: int, seed: int) -> torch.Tensor:
    k = torch.randint(0, 2**23, (32, width), generator=torch.Generator().manual_seed(seed))
    return (k.double() * UNIT).float()


def _kernel_keeps_subnormals() -> bool:
    """Whether the kernel's arithmetic keeps subnormals on this adapter: lavapipe does; the
    H200's driver flushes them to zero, which WGSL allows."""
    return bool(pipeline.layer_norm(torch.full((1, 4), UNIT), [4], eps=EPS)[1].item() != 0)


@pytest.mark.parametrize("width", [768, 4099])
def test_subnormal_row_error_is_the_means_rounding_times_rstd(width):
    x = _rows(width, width)
    out, mean, rstd = pipeline.layer_norm(x, [width], eps=EPS)
    if not _kernel_keeps_subnormals():
        # Flushed, every value is 0: so are the mean and out, and rstd is 1/sqrt(eps).
        assert torch.all(mean == 0) and torch.all(out == 0), (mean.abs().max(), out.abs().max())
        return
    eager_out, eager_mean, _ = torch.ops.aten.native_layer_norm(x, [width], None, None, EPS)
    want = torch.nn.functional.layer_norm(x.double(), [width], eps=EPS)
    want_mean = x.double().mean(-1, keepdim=True)

    def units(t, ref):
        return ((t.double() - ref).abs().max() / UNIT).item()

    out_err, eager_err = units(out, want), units(eager_out, want)
    mean_err, eager_mean_err = units(mean, want_mean), units(eager_mean, want_mean)
    # The squares underflow: rstd is 1/sqrt(eps) for every row, in both, to WGSL's precision
    # of a square root and a division (lavapipe rounds it correctly, the H200 one ulp off).
    want_rstd = torch.tensor(EPS, dtype=torch.float32).rsqrt()
    assert torch.all((rstd - want_rstd).abs() <= 2 * torch.finfo(torch.float32).eps * want_rstd)
    # The kernel's mean is off by a few units of the grid (eager's by one or two) ...
    assert eager_mean_err <= 2 and mean_err <= 16, (mean_err, eager_mean_err)
    # ... and that is the output's error: at most (mean error + 1) x rstd, the 1 for the
    # output's own rounding and the row values'.
    bound = (mean_err + 1) * float(rstd[0])
    assert out_err <= bound, (f"width {width}: out error {out_err:.0f} units (eager {eager_err:.0f}) is more "
                              f"than the mean's {mean_err:.1f} units explain ({bound:.0f})")


def test_the_same_rows_in_the_normal_range_match_eager():
    """Scaled by 2^100 (no subnormals anywhere), the kernel is as close to float64 as eager."""
    x = _rows(4099, 4099) * 2.0**100
    out, _, _ = pipeline.layer_norm(x, [4099], eps=EPS)
    eager = torch.nn.functional.layer_norm(x, [4099], eps=EPS)
    want = torch.nn.functional.layer_norm(x.double(), [4099], eps=EPS)
    assert (out.double() - want).abs().max() <= 2 * (eager.double() - want).abs().max()
