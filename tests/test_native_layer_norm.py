"""The native_layer_norm kernel against a float64 reference, with eager float32 as the yardstick."""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import runtime, wgsl
from pipeline.wgsl.config import (EACH_HELD_VALUE, MAX_HOLD, MAX_THREADS_PER_ROW, STREAM_UNROLL, WIDE_LAUNCH_THREADS,
                                  written_out)
from pipeline.runtime import device as runtime_device
from pipeline.runtime.launch import pack_params
from support.gpu import missing_subgroups, use_merge_path, use_row_path
from support.grids import AFFINE, REDUCTIONS, WIDTHS, all_pairs, thinned
from support.reference import ATEN, assert_close_to_reference, reference

pytestmark = pytest.mark.usefixtures("gpu_info")
kernel = importlib.import_module("pipeline.runtime.launch")


def make_affine(shape, has_weight, has_bias, gen):
    weight = torch.randn(shape, generator=gen) if has_weight else None
    bias = torch.randn(shape, generator=gen) if has_bias else None
    return weight, bias


F16_STORES = ["native_pack", "integer_rounding"]


@pytest.fixture(params=REDUCTIONS)
def reduction(request, monkeypatch):
    """Each of the kernel's row paths in turn (support.gpu.use_row_path)."""
    return use_row_path(request.param, monkeypatch)


# Tests that choose no `reduction` of their own, on both merge paths.
ON_BOTH_PATHS = pytest.mark.parametrize("reduction", ["subgroup", "workgroup"], indirect=True)


# The wide grids meet every pair of their values (each width every path and affine form,
# ...) rather than every combination: support.grids.all_pairs.
@pytest.mark.parametrize("width,rows,affine,reduction", all_pairs(WIDTHS, [1, 7], AFFINE, REDUCTIONS),
                         indirect=["reduction"])
def test_widths_rows_affine(width, rows, affine, reduction):
    has_weight, has_bias = affine
    gen = torch.Generator().manual_seed(width * 10 + rows)
    x = torch.randn(rows, width, generator=gen) * 2 + 0.5
    weight, bias = make_affine((width,), has_weight, has_bias, gen)
    assert_close_to_reference(x, (width,), weight, bias)


# More than 65,535 rows: each width held and streamed, merged by subgroups and by workgroup
# memory, each path at a narrow width (64 rows a workgroup) and a wider one (4 or 2); the whole
# grid under `make test-kernel-full`.
@pytest.mark.parametrize("width,reduction", thinned([1, 3, 128, 384], REDUCTIONS, keep=[
    (1, "subgroup"), (1, "streamed-workgroup"), (3, "workgroup"), (3, "streamed"), (128, "streamed"),
    (128, "workgroup"), (384, "streamed-workgroup"), (384, "subgroup")]), indirect=["reduction"])
def test_more_rows_than_one_grid_dimension(width, reduction):
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(70_001, width, generator=gen)
    weight, bias = make_affine((width,), True, True, gen)
    assert_close_to_reference(x, (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [3, 128, 766])
def test_workgroups_past_the_x_limit_go_through_y(width, monkeypatch, reduction):
    monkeypatch.setattr(kernel, "MAX_GRID_X", 7)
    x = torch.randn(5001, width)
    assert kernel.grid(5001, kernel.choose_config(width, True, True))[1] > 1
    assert_close_to_reference(x, (width,), torch.randn(width), torch.randn(width))


@ON_BOTH_PATHS
def test_launches_split_at_the_binding_limit(monkeypatch, reduction):
    g = runtime_device.gpu()
    monkeypatch.setitem(g.limits, "max-storage-buffer-binding-size", 4096 * 10)
    before = runtime.stats()["dispatches"]
    x = torch.randn(100, 1024)
    assert_close_to_reference(x, (1024,))
    assert runtime.stats()["dispatches"] - before == 10


@ON_BOTH_PATHS
@pytest.mark.parametrize("shape", [(4, 8), (3, 5, 7), (2, 96)])
@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
def test_multi_dim_normalized_shape(shape, has_weight, has_bias, reduction):
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn((2, 3) + shape, generator=gen)
    weight, bias = make_affine(shape, has_weight, has_bias, gen)
    out, mean, rstd = assert_close_to_reference(x, shape, weight, bias)
    assert mean.shape == (2, 3) + (1,) * len(shape)


@pytest.mark.parametrize("width", [5, 128, 768, 1023, 4097])
def test_large_mean_small_variance(width, reduction):
    gen = torch.Generator().manual_seed(width)
    x = 1e4 + 1e-2 * torch.randn(16, width, generator=gen)
    weight, bias = make_affine((width,), True, True, gen)
    assert_close_to_reference(x, (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [1, 3, 768, 4097])
def test_constant_rows(width, reduction):
    x = torch.full((5, width), 3.25)
    x[1] = -1e4
    bias = torch.linspace(-1, 1, width)
    out, mean, rstd = pipeline.layer_norm(x, [width], None, bias, eps=1e-5)
    assert torch.equal(out, bias.expand(5, width))
    assert torch.equal(mean.flatten(), x[:, 0])
    assert torch.allclose(rstd, torch.full_like(rstd, 1e-5 ** -0.5), rtol=1e-6)


@pytest.mark.parametrize("width", [3, 6, 128, 1023, 4097])
def test_nan_and_inf_rows(width, reduction):
    x = torch.randn(6, width)
    x[1, width // 2] = float("nan")
    x[2, 0] = float("inf")
    x[3, -1] = float("-inf")
    x[4, 0], x[4, -1] = float("inf"), float("-inf")
    out, mean, rstd = assert_close_to_reference(x, (width,), torch.randn(width), torch.randn(width))
    assert torch.isnan(out[1:5]).all() and torch.isfinite(out[[0, 5]]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width", [1, 2, 3, 768])
@pytest.mark.parametrize("has_weight,has_bias", [(False, False), (True, True)])
def test_half_rows_out_alone_with_nan_or_inf_give_nan(dtype, width, has_weight, has_bias, reduction):
    # The delegate's launch (no mean and rstd stored) of half rows: a row holding a NaN or an
    # inf is NaN throughout, as aten's; at width 1 it had come out as the bias (or -0.0).
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(6, width, generator=gen).to(dtype)
    x[0, 0], x[1, -1], x[2, 0] = float("nan"), float("inf"), float("-inf")
    x[4] = 2.5  # constant
    w, b = make_affine((width,), has_weight, has_bias, gen)
    w, b = (None if t is None else t.to(dtype) for t in (w, b))
    out, _, _ = kernel.native_layer_norm(x, [width], w, b, stats=False)
    want = ATEN(x, [width], w, b, 1e-5)[0]
    assert torch.equal(out.isnan(), want.isnan()) and out[:3].isnan().all(), out
    if width == 1:  # every finite row is exactly 0 (+0.0, float64's) then the bias
        exact = torch.zeros(3, 1, dtype=dtype) if b is None else b.expand(3, 1)
        assert torch.equal(out[3:].view(torch.int16), exact.view(torch.int16)), out


@pytest.fixture(scope="module")
def width_1_programs():
    """(module, pipeline.lower of it) for nn.LayerNorm(1) in float16 and bfloat16, with and
    without weight and bias: the delegate's launch stores no mean and rstd."""
    programs = {}
    for dtype in (torch.float16, torch.bfloat16):
        for affine in (True, False):
            module = torch.nn.LayerNorm(1, elementwise_affine=affine).to(dtype).eval()
            if affine:
                with torch.no_grad():
                    module.weight.fill_(2.0)
                    module.bias.fill_(0.5)
            program = pipeline.lower(module, (torch.zeros(5, 1, dtype=dtype),))
            assert program.num_delegates == 1
            programs[dtype, affine] = module, program
    return programs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_a_lowered_half_layer_norm_of_width_1_gives_nan_for_nan_and_inf_rows(width_1_programs, dtype, affine,
                                                                             reduction):
    # The reproduction through `lower`: NaN and inf rows had come out as the bias (or -0.0).
    module, program = width_1_programs[dtype, affine]
    x = torch.tensor([[float("nan")], [float("inf")], [float("-inf")], [3.0], [-0.0]], dtype=dtype)
    out, want = program(x), module(x).detach()
    assert out[:3].isnan().all() and torch.equal(out.isnan(), want.isnan()), out
    assert torch.equal(out[3:].view(torch.int16), want[3:].view(torch.int16)), out


def near_float32_limit(width: int, gen: torch.Generator) -> torch.Tensor:
    """Rows whose squared deviations (and some sums) overflow float32 though every value is finite."""
    big = torch.finfo(torch.float32).max
    rows = [torch.randn(16, width, generator=gen) * scale for scale in (1e19, 1e30, 1e37)]
    rows.append((torch.rand(8, width, generator=gen) * 2 - 1) * big)
    spike = torch.zeros(4, width)
    spike[:, 0] = torch.tensor([1e30, -1e30, 3e38, 1e20])
    rows.append(spike)
    ramp = torch.linspace(-1, 1, width).expand(4, width) * torch.tensor([[1e20], [1e30], [1e38], [big]])
    rows.append(ramp)
    return torch.cat(rows).clamp(-big, big)


@pytest.mark.parametrize("width", list(range(1, 65)) + [768, 1023, 4096])
def test_overflow_gives_nan_or_the_true_value(width, reduction):
    """Never a finite wrong value: each row is either right (against float64) or, like aten,
    NaN in out and rstd (its mean then right or non-finite)."""
    gen = torch.Generator().manual_seed(width)
    x = near_float32_limit(width, gen)
    out, mean, rstd = (t.double().reshape(len(x), -1) for t in pipeline.layer_norm(x, (width,)))
    t_out, t_mean, t_rstd = (t.reshape(len(x), -1) for t in reference(x, (width,), None, None, 1e-5))
    for r in range(len(x)):
        mean_ok = (mean[r] - t_mean[r]).abs().item() <= 1e-5 * x[r].abs().max().item()
        if torch.isnan(rstd[r]).all():
            assert torch.isnan(out[r]).all(), f"row {r}: rstd NaN but out not"
            assert mean_ok or not torch.isfinite(mean[r]).all(), f"row {r}: finite wrong mean {mean[r]}"
            continue
        assert mean_ok, f"row {r}: mean {mean[r].item():.6g}, true {t_mean[r].item():.6g}"
        assert torch.allclose(rstd[r], t_rstd[r], rtol=1e-4, atol=0), f"row {r}: rstd {rstd[r]}, true {t_rstd[r]}"
        assert torch.allclose(out[r], t_out[r], rtol=1e-3, atol=1e-3), f"row {r}: out wrong"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("stats", [True, False])
def test_rows_whose_squares_pass_float32s_range_are_nan(dtype, stats, reduction):
    # Documented in docs/design.md (the kernel's numerics outside the rule): aten gives these
    # rows rstd 0 and out = bias; the kernel gives NaN throughout, never a finite wrong value.
    width = 768
    base = torch.randn(4, width, generator=torch.Generator().manual_seed(7))
    base = base / base.abs().amax(dim=1, keepdim=True)
    x = (base * torch.tensor([[1e17], [1e19], [1e30], [1.0]])).to(dtype)
    w, b = torch.full((width,), 2.0, dtype=dtype), torch.full((width,), 0.25, dtype=dtype)
    out, _, rstd = kernel.native_layer_norm(x, [width], w, b, stats=stats)
    assert out[1:3].isnan().all() and torch.isfinite(out[[0, 3]]).all(), out
    if stats:
        assert rstd[1:3].isnan().all() and torch.isfinite(rstd[[0, 3]]).all(), rstd
    aten_out, _, aten_rstd = ATEN(x, [width], w, b, 1e-5)
    assert aten_rstd[1].item() == 0 and (aten_out[1] == 0.25).all()  # aten's answer, which the kernel does not give


@pytest.mark.parametrize("width", [1, 6, 7, 128, 766, 1280, 4097, 4098])
def test_every_output_element_is_written(width, reduction):
    x = torch.randn(301, width)
    out, mean, rstd = runtime.native_layer_norm(x, [width], None, None, 1e-5, poison=float("nan"))
    assert torch.isfinite(out).all() and torch.isfinite(mean).all() and torch.isfinite(rstd).all()
    assert_close_to_reference(x, (width,))


@ON_BOTH_PATHS
def test_non_contiguous_input(reduction):
    x = torch.randn(64, 3, 96).transpose(0, 1)
    assert not x.is_contiguous()
    assert_close_to_reference(x, (96,), torch.randn(96), torch.randn(96))
    assert_close_to_reference(torch.randn(96, 40).t(), (96,))


@ON_BOTH_PATHS
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(1, 300),
    width=st.integers(1, 2100),
    has_weight=st.booleans(),
    has_bias=st.booleans(),
    loc=st.sampled_from([0.0, 1.0, -50.0, 1e3]),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    eps=st.sampled_from([1e-5, 1e-6, 1e-12, 0.1]),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_shapes_and_values(rows, width, has_weight, has_bias, loc, scale, eps, seed, reduction):
    gen = torch.Generator().manual_seed(seed)
    x = loc + scale * torch.randn(rows, width, generator=gen)
    weight, bias = make_affine((width,), has_weight, has_bias, gen)
    assert_close_to_reference(x, (width,), weight, bias, eps)


THREADS_CODE = """
import threading, torch, pipeline
aten = torch.ops.aten.native_layer_norm.default
pipeline.layer_norm(torch.randn(4, 768), (768,))  # warm: the pool's buffers exist
wrong = []
def work(seed):
    gen = torch.Generator().manual_seed(seed)
    for i in range(6):
        width = (768, 384, 5)[(seed + i) % 3]
        x = torch.randn(512, width, generator=gen) * (seed + 1)
        w = torch.randn(width, generator=gen)
        got = pipeline.layer_norm(x, (width,), w, None)
        want = aten(x, [width], w, None, 1e-5)
        wrong.extend((seed, i) for o, e in zip(got, want) if not torch.allclose(o, e, rtol=1e-4, atol=1e-4))
threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not wrong, wrong
print("threads ok")
"""


@ON_BOTH_PATHS
def test_many_threads_at_once_get_correct_results(reduction):
    # In a child process: sharing the buffer pool without the lock aborted the process.
    env = {**os.environ, runtime_device.SUBGROUPS_ENV: "0"} if reduction == "workgroup" else None
    run = subprocess.run([sys.executable, "-c", THREADS_CODE], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0 and "threads ok" in run.stdout, run.stderr[-2000:]


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [333, 768])
def test_threaded_copies_and_staged_upload_give_the_same_bits(width, monkeypatch, reduction):
    # The large-call path on a small input: the input through the mapped staging buffer, both
    # copies over torch's threads.
    x = torch.randn(1001, width) * 5 + 3
    w, b = torch.randn(width), torch.randn(width)
    want = kernel.native_layer_norm(x, (width,), w, b)
    monkeypatch.setattr(runtime_device, "THREADED_COPIES", True)
    monkeypatch.setattr(runtime_device, "THREADED_COPY_BYTES", 1000)
    monkeypatch.setattr(kernel, "STAGED_UPLOAD_BYTES", 1000)
    got = kernel.native_layer_norm(x, (width,), w, b)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert_close_to_reference(x, (width,), w, b)


def test_threaded_copies_work_after_fork(monkeypatch):
    # A child forked after torch's threads have copied still copies, on one thread (the
    # delegate's call may run in a forked worker; torch's threads hung there).
    code = ("import os, numpy as np\n"
            "from pipeline.runtime import device as d\n"
            "d.THREADED_COPIES, d.THREADED_COPY_BYTES = True, 100\n"
            "s = np.arange(1_000_003, dtype=np.uint64).view(np.uint8); t = np.zeros_like(s); d.copy_bytes(t, s)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    u = np.zeros_like(s); d.copy_bytes(u, s); os._exit(0 if np.array_equal(u, s) else 3)\n"
            "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), np.array_equal(t, s))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "child 0 True", run.stderr[-2000:]


@ON_BOTH_PATHS
def test_stats_show_gpu_work(reduction):
    before = runtime.stats()
    pipeline.layer_norm(torch.randn(10, 64), [64])
    after = runtime.stats()
    assert after["dispatches"] == before["dispatches"] + 1
    assert after["bytes_uploaded"] - before["bytes_uploaded"] >= 10 * 64 * 4
    assert after["bytes_read_back"] - before["bytes_read_back"] >= 10 * 64 * 4 + 2 * 10 * 4


@ON_BOTH_PATHS
def test_pipelines_and_buffers_are_reused(reduction):
    x = torch.randn(33, 200)
    pipeline.layer_norm(x, [200])
    before = runtime.stats()
    pipeline.layer_norm(x + 1, [200])
    after = runtime.stats()
    assert after["pipelines_compiled"] == before["pipelines_compiled"]
    assert after["buffers_allocated"] == before["buffers_allocated"]


@ON_BOTH_PATHS
def test_an_eps_past_float32_gives_rstd_0_without_a_warning(reduction):
    import warnings

    x = torch.randn(3, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, mean, rstd = pipeline.layer_norm(x, [16], eps=1e300)
    eager = ATEN(x, [16], None, None, 1e300)
    assert torch.equal(rstd, eager[2]) and torch.equal(rstd, torch.zeros_like(rstd))


@ON_BOTH_PATHS
def test_bind_groups_are_reused_and_dropped_with_their_buffers(reduction):
    g = runtime_device.gpu()
    x = torch.randn(33, 200)
    pipeline.layer_norm(x, [200])
    known = dict(g.bind_groups)
    pipeline.layer_norm(x + 1, [200])
    assert g.bind_groups == known  # the same buffers: no new bind group
    pipeline.layer_norm(torch.randn(5000, 200), [200])  # larger: the pool replaces x's buffer
    assert not any(key in g.bind_groups for key in known), "a bind group outlived its buffer"


@ON_BOTH_PATHS
def test_resident_weights_are_uploaded_once_and_freed_with_their_tensor(reduction):
    import gc

    g = runtime_device.gpu()
    x, w, b = torch.randn(8, 96), torch.randn(96), torch.randn(96)
    truth = pipeline.layer_norm(x, [96], w, b)[0]
    out = runtime.native_layer_norm(x, [96], w, b, stats=False, resident=True)[0]
    before = runtime.stats()
    again = runtime.native_layer_norm(x, [96], w, b, stats=False, resident=True)[0]
    after = runtime.stats()
    assert torch.equal(out, truth) and torch.equal(again, truth)
    # Only x travels: weight and bias stay on the device, and the params (rows, eps) are
    # those of the call before.
    assert after["bytes_uploaded"] - before["bytes_uploaded"] == x.numel() * 4
    third = runtime.native_layer_norm(x, [96], w, b, 1e-3, stats=False, resident=True)[0]
    assert after["bytes_uploaded"] + x.numel() * 4 + kernel.PARAMS_BYTES == runtime.stats()["bytes_uploaded"]
    assert torch.equal(third, pipeline.layer_norm(x, [96], w, b, 1e-3)[0])
    assert id(w) in g.residents and id(b) in g.residents
    held = len(g.residents)
    del w, b
    gc.collect()
    runtime.native_layer_norm(x, [96], None, None, stats=False)  # the next launch frees them
    assert len(g.residents) == held - 2


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.randn(4, 8).double(), [8]), "input must be float32"),
        ((torch.randn(4, 8).to(torch.int32), [8]), "input must be float32, float16 or bfloat16"),
        ((torch.randn(4, 8).half(), [8], torch.randn(8).bfloat16()), "weight must be"),
        ((torch.randn(4, 8), [8], torch.randn(8).half()), "weight must be"),
        ((torch.randn(4, 8).half(), [8], torch.randn(8).half(), torch.randn(8)), "bias must have weight's dtype"),
        ((torch.randn(4, 8), [7]), "normalized_shape"),
        ((torch.randn(4, 8), [4, 8, 1]), "normalized_shape"),
        ((torch.randn(4, 8), []), "normalized_shape"),
        ((torch.randn(4, 8), [8], torch.randn(7)), "weight must have shape"),
        ((torch.randn(4, 8), [8], None, torch.randn(8).double()), "bias must be float32"),
        ((torch.randn(4, 0), [0]), "normalized_shape"),
    ],
)
def test_bad_arguments_name_the_argument(args, match):
    with pytest.raises(ValueError, match=match) as raised:
        pipeline.layer_norm(*args)
    assert_raised_like_aten(raised.value, *args)


# The kinds of error aten's Python binding raises.
ERROR_KINDS = (TypeError, OverflowError, ValueError, RuntimeError)


def assert_raised_like_aten(ours: Exception, x, normalized_shape, weight=None, bias=None, eps=1e-5) -> None:
    """Where aten refuses the arguments too, `ours` is of its kind of error (ArgumentError is
    both the ValueError we raise and aten's RuntimeError)."""
    try:
        torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
    except ERROR_KINDS as aten:
        kind = next(k for k in ERROR_KINDS if isinstance(aten, k))
        assert isinstance(ours, kind), f"aten raises {type(aten).__name__} ({aten}), we raise {ours!r}"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"eps": 10**400}, OverflowError, "eps 1000.* does not fit in a float"),
        ({"eps": -(10**400)}, ValueError, "eps -1000.* does not fit in a float"),
        ({"eps": True}, TypeError, "eps must be a real number"),
        ({"eps": "1e-5"}, TypeError, "eps must be a real number"),
        ({"normalized_shape": (16.7,)}, TypeError, "normalized_shape must hold ints"),
        ({"normalized_shape": (True,)}, TypeError, "normalized_shape must hold ints"),
        ({"normalized_shape": 16}, TypeError, "normalized_shape must be a sequence"),
        ({"normalized_shape": "16"}, TypeError, "normalized_shape must be a sequence"),
        ({"x": torch.randn(4, 16, device="meta")}, ValueError, "input must be a dense tensor with data"),
        ({"x": torch.randn(4, 16).to_sparse()}, ValueError, "input must be a dense tensor"),
        ({"weight": torch.randn(16, device="meta")}, ValueError, "weight must be a dense tensor"),
        ({"bias": [0.0] * 16}, TypeError, "bias must be a torch.Tensor or None"),
    ],
)
def test_argument_errors_are_value_or_type_errors_naming_the_argument(kwargs, error, match):
    args = {"x": torch.randn(4, 16), "normalized_shape": (16,)} | kwargs
    with pytest.raises(error, match=match) as raised:
        pipeline.layer_norm(**args)
    assert isinstance(raised.value, (ValueError, TypeError))
    assert_raised_like_aten(raised.value, **args)  # aten takes eps=True (as 1.0) and meta tensors


@ON_BOTH_PATHS
def test_integer_like_dims_and_eps_are_taken(reduction):
    x = torch.randn(3, 16)
    out = pipeline.layer_norm(x, (np.int64(16),), eps=np.float32(1e-3))[0]
    torch.testing.assert_close(out, ATEN(x, [16], None, None, 1e-3)[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(pipeline.layer_norm(x, torch.Size([16]), eps=0)[0], ATEN(x, [16], None, None, 0.0)[0])


# Every eps aten computes with, the kernel too: negative (NaN where var + eps < 0), zero of
# either sign, infinite (rstd 0), NaN, and past float32's range (+-inf in float32).
EPS_ATEN_TAKES = [-0.5, -1.0, -1e30, -0.0, float("inf"), float("-inf"), float("nan"), 1e300, -1e300]


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("eps", EPS_ATEN_TAKES)
def test_every_eps_aten_takes_gives_aten_s_values(eps, dtype, reduction):
    gen = torch.Generator().manual_seed(0)
    # Rows of variance 0.01 to 4, either side of -eps; a constant row (variance 0).
    x = torch.randn(48, 24, generator=gen) * torch.linspace(0.1, 2.0, 48)[:, None]
    x[0] = 3.0
    weight, bias = make_affine((24,), True, True, gen)
    x, weight, bias = (t.to(dtype) for t in (x, weight, bias))
    check = assert_close_to_reference if dtype == torch.float32 else assert_half_close_to_reference
    out, _, rstd = check(x, (24,), weight, bias, eps)
    nan = rstd.isnan()
    assert torch.equal(nan, ATEN(x, [24], None, None, eps)[2].isnan()) and out[nan.flatten()].isnan().all()
    if eps in (-0.5, -1.0):
        assert nan.any() and not nan.all(), "the rows must lie on both sides of -eps"


@ON_BOTH_PATHS
def test_inputs_that_require_grad_give_detached_outputs(reduction):
    x = torch.randn(3, 16, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(16))
    outputs = pipeline.layer_norm(x, (16,), weight)
    assert not any(t.requires_grad for t in outputs)
    torch.testing.assert_close(outputs[0], ATEN(x, [16], weight, None, 1e-5)[0].detach(), atol=2e-5, rtol=1e-5)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="input"):
        pipeline.layer_norm(np.zeros((2, 4), dtype=np.float32), [4])


def test_a_normalized_shape_nested_thousands_deep_is_a_type_error_not_a_recursion():
    shape = [4]
    for _ in range(5000):
        shape = [shape]
    with pytest.raises(TypeError, match=r"normalized_shape must hold ints, got \[\[\[\[\[\[\[\.\.\.\]"):
        pipeline.layer_norm(torch.randn(2, 4), shape)


@ON_BOTH_PATHS
def test_empty_input(reduction):
    out, mean, rstd = pipeline.layer_norm(torch.randn(0, 16), [16])
    assert out.shape == (0, 16) and mean.shape == (0, 1)


def test_import_leaves_executorch_and_transformers_unloaded():
    code = (
        "import sys, pipeline, pipeline.runtime; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('executorch', 'transformers')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ci_fails_rather_than_skipping_the_subgroup_path():
    without = {"adapter": "llvmpipe", "backend": "OpenGL", "subgroup_size": 0}
    assert "has no subgroup operations" in missing_subgroups(without, {"PIPELINE_REQUIRE_GPU": "1"})
    forced = {"PIPELINE_REQUIRE_GPU": "1", runtime_device.SUBGROUPS_ENV: "0"}
    assert missing_subgroups(without, forced) is None  # the workgroup-path run
    assert missing_subgroups(without, {}) is None  # a developer's machine: skips are fine
    assert missing_subgroups({**without, "subgroup_size": 8}, {"PIPELINE_REQUIRE_GPU": "1"}) is None


def test_device_info(gpu_info):
    assert gpu_info["adapter"] and gpu_info["backend"]
    assert gpu_info["limits"]["max-storage-buffer-binding-size"] > 0


def test_rows_are_held_where_they_fit_and_streamed_beyond():
    held = kernel.choose_config(1024, True, True, 32)
    assert (held.vec, held.width, held.threads_per_row, held.hold) == (4, 1024, 64, 4)
    narrow = kernel.choose_config(7, False, False, 0)
    assert (narrow.vec, narrow.threads_per_row, narrow.hold) == (1, 1, 7)
    # At least MIN_HOLD vec4 a thread in float32 (768 floats: 64 threads x 3), at least
    # MIN_HOLD_NARROW_LOADS scalars or half vec4 (768 halves: 32 threads x 6; 1023 floats: 128
    # threads x 8 scalars, where 1022 floats take 128 threads x 4 vec2).
    assert kernel.choose_config(768, True, True, 32).threads_per_row == 64
    assert kernel.choose_config(768, True, True, 32, "float16").threads_per_row == 32
    assert (kernel.choose_config(1023, True, True, 32).threads_per_row, kernel.choose_config(1022, True, True, 32).threads_per_row) == (128, 128)
    wide = kernel.choose_config(4 * MAX_THREADS_PER_ROW * MAX_HOLD + 4, True, False, 32)
    assert wide.hold == 0 and wide.unroll == STREAM_UNROLL
    assert wide.threads_per_row == MAX_THREADS_PER_ROW


def test_wide_float32_launches_take_twice_the_threads_at_two_loads_each():
    base = kernel.choose_config(1024, True, True, 32)
    assert (base.threads_per_row, base.hold) == (64, 4)
    at = WIDE_LAUNCH_THREADS // 64
    assert kernel.choose_config(1024, True, True, 32, rows=at - 1) == base
    wide = kernel.choose_config(1024, True, True, 32, rows=at)
    assert (wide.threads_per_row, wide.hold, wide.workgroup) == (128, 2, 128)
    # Only float32 rows of exactly 4 vec4 a thread: not 768 floats (64 x 3), not half rows,
    # not scalar rows, not rows already at MAX_THREADS_PER_ROW.
    for width, dtype in ((768, "float32"), (1024, "float16"), (1023, "float32"), (4096, "float32")):
        assert (kernel.choose_config(width, True, True, 32, dtype, rows=1 << 20)
                == kernel.choose_config(width, True, True, 32, dtype))


@pytest.mark.parametrize("width", [128, 1024])
def test_wide_launches_at_twice_the_threads(width, reduction):
    threads = kernel.choose_config(width, True, True, 8).threads_per_row
    rows = WIDE_LAUNCH_THREADS // threads
    assert kernel.choose_config(width, True, True, 8, rows=rows).threads_per_row == 2 * threads
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 20 + 50
    weight, bias = make_affine((width,), True, True, gen)
    assert_close_to_reference(x, (width,), weight, bias)


@pytest.mark.parametrize("width", [7, 768, 4097])
def test_out_alone_stores_no_mean_and_rstd(width, reduction):
    gen = torch.Generator().manual_seed(width)
    x, w, b = torch.randn(37, width, generator=gen) * 3 + 1, torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    whole = kernel.native_layer_norm(x, [width], w, b)
    before = runtime.stats()
    out, mean, rstd = kernel.native_layer_norm(x, [width], w, b, stats=False, poison=float("nan"))
    assert mean is None and rstd is None and torch.equal(out, whole[0])
    assert runtime.stats()["bytes_read_back"] - before["bytes_read_back"] == 37 * width * 4  # out only
    g = runtime_device.gpu()
    assert not kernel.device_config(g, width, True, True, write_stats=False).write_stats
    with pytest.raises(TypeError, match="stats must be a bool"):
        kernel.native_layer_norm(x, [width], stats="no")


def test_loads_are_as_wide_as_the_width_keeps_rows_aligned():
    assert [kernel.choose_config(w, True, True, 32).vec for w in (1024, 766, 1023, 2, 1)] == [4, 2, 1, 2, 1]
    even = kernel.choose_config(766, True, True, 32)
    assert (even.row_vecs, even.threads_per_row, even.hold) == (383, 64, 6)
    assert "alias V = vec2<f32>" in even.prelude()


def test_held_rows_take_one_form_of_their_weight_and_bias_lines():
    late, early = kernel.choose_config(3072, True, True, 32, "bfloat16"), kernel.choose_config(768, True, True, 32)
    assert late.late_affine and not early.late_affine
    # Plain rows load weight and bias with x however many values a thread holds.
    assert not kernel.choose_config(3072, True, True, 32, "float16", write_stats=False).late_affine
    files = wgsl.ShaderFiles("naga")
    for config, absent in ((late, "store_out(base, i_0, in_0, v_0, c, w_0, b_0);"),
                           (early, "store_out(base, i_0, in_0, v_0, c, weight_at(i_0, in_0), bias_at(i_0, in_0));")):
        held = config.source(files).split("fn normalize_held")[1].split("\nfn ")[0]
        assert len(re.findall(r"^    store_out\(", held, re.M)) == config.hold and absent not in held


def test_held_rows_take_one_form_of_their_squares():
    # Half rows in their frame (those that store mean and rstd): the squares come from the
    # correction pass; float32 rows, and half rows whose mean is stored in float32: a pass
    # after the mean.
    files = wgsl.ShaderFiles("naga")
    for dtype, affine, stats, merged in (("bfloat16", None, True, True), ("float16", None, True, True),
                                         ("float16", "float32", True, False), ("bfloat16", "float32", True, False),
                                         ("float32", None, False, False), ("float32", None, True, False)):
        config = kernel.choose_config(1024, True, True, 32, dtype, affine, write_stats=stats)
        assert config.hold and config.squares_with_correction == merged
        held = config.source(files).split("fn normalize_held")[1].split("\nfn ")[0]
        assert len(re.findall(r"^    own \+= e_\d+\.y;$", held, re.M)) == (config.hold if merged else 0)
        assert len(re.findall(r"^    squares \+= deviation_at\(", held, re.M)) == (0 if merged else config.hold)
        assert held.count("squares = (own - count * rest * rest) + count * gap * gap;") == int(merged)


def test_held_rows_take_one_path():
    # Held half rows of a launch that stores no mean and rstd: the plain two-pass
    # (normalize_plain); every other row in its frame (normalize_held, or streamed).
    files = wgsl.ShaderFiles("naga")
    cases = [(1024, "float16", None, True, False), (768, "float16", None, False, True),
             (1023, "float16", "float32", False, True), (1024, "float16", "float32", True, False),
             (1024, "bfloat16", None, False, True), (1023, "bfloat16", "float32", False, True),
             (1024, "bfloat16", None, True, False), (1024, "float32", None, False, False),
             (16384, "float16", None, False, False)]  # width, dtype, affine dtype, stats, plain
    for width, dtype, affine, stats, plain in cases:
        config = kernel.choose_config(width, True, True, 32, dtype, affine, write_stats=stats)
        assert config.plain_two_pass == plain
        source = config.source(files)
        rows = source.split("fn normalize_rows")[1].split("\nfn ")[0]
        assert rows.count("normalize_plain(") == int(plain) and rows.count("normalize_held(") == int(not plain)
        held = source.split("fn normalize_held(")[1].split("\nfn ")[0]
        plain_rows = source.split("fn normalize_plain(")[1].split("\nfn ")[0]
        values = config.hold if plain else 0
        assert len(re.findall(r"^    store_normalized\(", plain_rows, re.M)) == values
        assert len(re.findall(r"^    let d_\d+ = ", plain_rows, re.M)) == values
        if plain:
            assert not re.search(r"^    (let v_\d+|store_out)", held, re.M)


def test_marked_lines_are_written_out_once_per_value():
    source = "fn f() {\n    let v_K = g(lane + K * T);  // each held value\n}"
    assert written_out(source, {EACH_HELD_VALUE: 3}) == (
        "fn f() {\n    let v_0 = g(lane + 0u * T);\n    let v_1 = g(lane + 1u * T);\n"
        "    let v_2 = g(lane + 2u * T);\n}\n"
    )


# Half precision: float16 and bfloat16 rows, read and written as u32 pairs, computed in f32.

HALF_DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(params=F16_STORES)
def f16_store(request, monkeypatch):
    """float16 stores both ways: pack2x16float where the device probe passed it, and the
    kernel's integer rounding (what every other adapter runs)."""
    g = runtime_device.gpu()
    if request.param == "native_pack" and not g.pack2x16float:
        pytest.skip("pack2x16float did not pass the device probe on this adapter")
    if request.param == "integer_rounding":
        monkeypatch.setattr(g, "pack2x16float", False)
    return request.param


def assert_half_close_to_reference(x, shape, weight=None, bias=None, eps=1e-5, factor=1.25):
    """Half `x`: dtypes exactly aten's, and the error vs float64 (of the same half inputs) at
    most `factor` x eager's at the same dtype. Both round once to the output dtype, so out's
    bound is strict; mean and rstd may sit one half ulp the other side of a tie. out is held
    so twice: from a launch that stores mean and rstd, and from one that stores none, as the
    models' delegates launch it (float16 rows then take the plain two-pass)."""
    ours = pipeline.layer_norm(x, shape, weight, bias, eps)
    eager = ATEN(x, list(shape), weight, bias, eps)
    truth = reference(x, shape, weight, bias, eps)
    out_alone = kernel.native_layer_norm(x, shape, weight, bias, eps, stats=False)[0]
    for name, o, e, t in zip(("out", "mean", "rstd", "out alone"), (*ours, out_alone), (*eager, eager[0]),
                             (*truth, truth[0])):
        assert o.dtype == e.dtype and o.shape == e.shape, f"{name}: {o.dtype} {list(o.shape)} vs aten's"
        same = torch.isnan if name.startswith("out") else torch.isfinite
        assert torch.equal(same(o), same(e)), f"{name}: non-finite pattern differs from PyTorch"
        finite = torch.isfinite(t) & torch.isfinite(e)
        if not finite.any():
            continue
        err = (o.double() - t)[finite].abs().max().item()
        eager_err = (e.double() - t)[finite].abs().max().item()
        tie = 0.0 if name.startswith("out") else float(torch.finfo(o.dtype).eps * t[finite].abs().max())
        assert err <= factor * eager_err + tie, f"{name}: error {err:.3g} vs float64, eager {eager_err:.3g}"
    return ours


@pytest.mark.parametrize("dtype,width,shift,affine_dtype,reduction,f16_store",
                         all_pairs(HALF_DTYPES, [6, 384, 768, 1023, 1280], [0.0, 30.0], ["same", torch.float32, None],
                                   REDUCTIONS, F16_STORES), indirect=["reduction", "f16_store"])
def test_half_rows_against_float64(dtype, width, shift, affine_dtype, reduction, f16_store):
    gen = torch.Generator().manual_seed(width + int(shift))
    x = (torch.randn(33, width, generator=gen) * (2.0 if shift else 1.0) + shift).to(dtype)
    weight, bias = make_affine((width,), affine_dtype is not None, affine_dtype is not None, gen)
    if affine_dtype is not None:
        weight, bias = (t.to(dtype if affine_dtype == "same" else affine_dtype) for t in (weight, bias))
    assert_half_close_to_reference(x, (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype,width", [(torch.float32, 1280), (torch.bfloat16, 1280), (torch.bfloat16, 3072)])
def test_rows_whose_weight_and_bias_load_at_the_store(dtype, width, reduction):
    # 20 or more values a thread in their frame: weight and bias load after the row sums
    # (late_affine). Plain float16 rows load them with x.
    config = wgsl.config.choose_config(width, True, True, dtype=str(dtype).removeprefix("torch."))
    assert config.hold and config.late_affine
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(65, width, generator=gen) * 3 + 1).to(dtype)
    weight, bias = (t.to(dtype) for t in make_affine((width,), True, True, gen))
    if dtype == torch.float32:
        assert_close_to_reference(x, (width,), weight, bias)
    else:
        assert_half_close_to_reference(x, (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [128, 768, 3072])
@pytest.mark.parametrize("rows", ["halves_apart", "first_outlier", "far_from_zero"])
def test_half_rows_whose_shares_differ(dtype, width, rows, reduction):
    # Half rows take each thread's squares about its own share's mean and move them to the
    # row's (squares_with_correction): rows whose threads' shares lie far apart, or whose
    # first value (the frame) lies far out, are where that could lose precision.
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(40, width, generator=gen)
    if rows == "halves_apart":
        x[:, width // 2:] += 50.0
    elif rows == "first_outlier":
        x[:, 0] = 1e3
    else:
        x = 3000.0 + 0.5 * x
    weight, bias = (t.to(dtype) for t in make_affine((width,), True, True, gen))
    assert_half_close_to_reference(x.to(dtype), (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [6, 768, 1023, 3072])
@pytest.mark.parametrize("rows", ["at_the_limit", "first_tiny", "first_at_the_limit", "binades_apart", "one_ulp_apart"])
def test_plain_rows_where_differences_are_not_exact(width, rows, reduction):
    # Plain rows (float16) take d = x - first, exact only where x and first lie within 2^12
    # of each other, and squares of d unscaled: rows at float16's limit, and rows whose
    # values lie many binades from their first value or from each other.
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(24, width, generator=gen)
    if rows == "at_the_limit":
        x = torch.where(x > 0, 65504.0, -65504.0)
        x[::3] = 60000.0 + 100 * x[::3].sign()
    elif rows == "first_tiny":
        x = 30000.0 + 16 * x
        x[:, 0] = 1e-3
    elif rows == "first_at_the_limit":
        x = 1e-3 * x
        x[:, 0] = -65504.0
    elif rows == "binades_apart":
        x = x * torch.pow(2.0, torch.randint(-14, 15, (24, width), generator=gen).float())
    else:  # one value a float16 ulp above the rest, far from zero: a mean of x rounds off it
        x = torch.full((24, width), 1000.0)
        x[:, 1] = 1000.5
    weight, bias = (t.to(torch.float16) for t in make_affine((width,), True, True, gen))
    half = x.to(torch.float16)
    assert wgsl.config.choose_config(width, True, True, dtype="float16", write_stats=False).plain_two_pass
    assert_half_close_to_reference(half, (width,), weight, bias)


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [7, 64, 768, 1023, 3072])
def test_plain_bfloat16_rows_past_float32s_range_give_nan_or_the_true_value(width, reduction):
    # bfloat16 values reach float32's range: a plain row's squares (of d = x - first) can
    # overflow. Each row is then NaN in every output, never a finite wrong value.
    assert wgsl.config.choose_config(width, True, True, dtype="bfloat16", write_stats=False).plain_two_pass
    gen = torch.Generator().manual_seed(width)
    x = near_float32_limit(width, gen).to(torch.bfloat16)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # float32's largest rounds to inf
    # Beside them, rows whose squares stay in range: near zero, and of 1e15 or 1e17.
    x = torch.cat([x] + [(torch.randn(8, width, generator=gen) * s).to(torch.bfloat16) for s in (1.0, 1e15)]
                  + [(1e17 * (1 + 0.01 * torch.randn(8, width, generator=gen))).to(torch.bfloat16)])
    out = kernel.native_layer_norm(x, (width,), stats=False)[0].double()
    want = reference(x, (width,), None, None, 1e-5)[0]
    nan_rows = torch.isnan(out).all(dim=1)
    assert nan_rows.any() and not nan_rows[-24:].any()
    assert not torch.isnan(out[~nan_rows]).any()
    assert torch.allclose(out[~nan_rows], want[~nan_rows], rtol=0, atol=2 ** -7 * want[~nan_rows].abs().max())


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [768, 1000])
def test_half_means_of_rows_far_from_their_first_value(dtype, width, reduction):
    # Rows of mean 0 whose values lie far from it: a mean taken as first + mean(x - first)
    # rounds at first's scale, 25x aten's error at width 1000 (why plain rows store none).
    x = torch.tensor([100.0, -100.0]).repeat(6, width // 2)
    x[1], x[2] = x[1] * 0.03, x[2] * 10
    weight, bias = (t.to(dtype) for t in make_affine((width,), True, True, torch.Generator().manual_seed(width)))
    assert_half_close_to_reference(x.to(dtype), (width,), weight, bias)


@pytest.mark.parametrize("dtype,width,affine,reduction,f16_store",
                         all_pairs(HALF_DTYPES, [1, 2, 3, 5, 7, 132, 766, 4097, 4098], AFFINE, REDUCTIONS, F16_STORES),
                         indirect=["reduction", "f16_store"])
def test_half_widths_and_affine(dtype, width, affine, reduction, f16_store):
    has_weight, has_bias = affine
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(7, width, generator=gen) * 2 + 0.5).to(dtype)
    weight, bias = make_affine((width,), has_weight, has_bias, gen)
    weight, bias = (None if t is None else t.to(dtype) for t in (weight, bias))
    assert_half_close_to_reference(x, (width,), weight, bias)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [5, 768, 1023])
def test_half_large_mean_small_variance(dtype, width, reduction):
    gen = torch.Generator().manual_seed(width)
    x = (2048 + 4 * torch.randn(16, width, generator=gen)).to(dtype)
    weight, bias = make_affine((width,), True, True, gen)
    assert_half_close_to_reference(x, (width,), weight.to(dtype), bias.to(dtype))


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [1, 3, 768, 1000, 4097])
def test_half_constant_rows(dtype, width, reduction):
    # 7.25 x 1000 x fl(1/1000) is not 7.25 in float32: a mean of x itself taken so is off.
    x = torch.full((5, width), 3.25, dtype=dtype)
    x[1] = -1e4
    x[2] = 7.25
    bias = torch.linspace(-1, 1, width).to(dtype)
    out, mean, rstd = pipeline.layer_norm(x, [width], None, bias, eps=1e-5)
    assert torch.equal(out, bias.expand(5, width))
    out_alone, _, _ = kernel.native_layer_norm(x, [width], None, bias, eps=1e-5, stats=False)
    assert torch.equal(out_alone, bias.expand(5, width))
    assert torch.equal(mean.flatten(), x[:, 0])
    assert rstd.dtype == dtype and torch.equal(rstd, torch.full_like(rstd, 1e-5 ** -0.5))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [3, 6, 128, 1023])
def test_half_nan_and_inf_rows(dtype, width, reduction, f16_store):
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(6, width, generator=gen)
    x[1, width // 2] = float("nan")
    x[2, 0] = float("inf")
    x[3, -1] = float("-inf")
    x[4, 0], x[4, -1] = float("inf"), float("-inf")
    weight, bias = make_affine((width,), True, True, gen)
    out, _, rstd = assert_half_close_to_reference(x.to(dtype), (width,), weight.to(dtype), bias.to(dtype))
    assert out[1:5].isnan().all() and rstd[1:5].isnan().all() and not out[[0, 5]].isnan().any()


# Every pair of dtype, width and path (support.grids.all_pairs); the whole grid under
# `make test-kernel-full`.
@pytest.mark.parametrize("dtype,width,reduction", thinned(HALF_DTYPES, [3, 128], REDUCTIONS), indirect=["reduction"])
def test_half_more_rows_than_one_grid_dimension(dtype, width, reduction):
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(70_001, width, generator=gen).to(dtype)
    weight, bias = make_affine((width,), True, True, gen)
    assert_half_close_to_reference(x, (width,), weight.to(dtype), bias.to(dtype))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_output_is_rounded_once_to_nearest_even(dtype, reduction, f16_store):
    # Zero rows normalize to exactly 0, so out is the float32 bias rounded to `dtype`:
    # random bit patterns, ties, the largest finite values, overflow, subnormals, NaN.
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (4093,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = [65504.0, 65519.99, 65520.0, 1e-8, 2.98e-8, 2.9802322e-08, 5.96e-8, 6.1e-5, 6.103515625e-05,
             1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 3.3961e38, 3.4e38, float("inf"), float("nan")]
    bias = torch.cat([bits.view(torch.float32), torch.tensor(edges), -torch.tensor(edges)])
    width = bias.numel()  # odd: the atomic half-word stores
    # WGSL lets f32 arithmetic flush subnormals (NVIDIA's drivers do: 0 + b is 0 for a
    # subnormal float32 b), so those may come out as a zero of either sign.
    flushable = (bias.abs() < torch.finfo(torch.float32).tiny) & (bias != 0)
    for w in (width, width - 1):  # and whole u32 pairs
        out, _, _ = pipeline.layer_norm(torch.zeros(3, w, dtype=dtype), [w], None, bias[:w])
        expected = bias[:w].to(dtype).expand(3, w)
        assert torch.equal(out.isnan(), expected.isnan())
        exact = ~expected.isnan() & ~flushable[:w]
        assert torch.equal(out[exact], expected[exact])
        flushed = flushable[:w].expand(3, w)
        assert ((out[flushed] == expected[flushed]) | (out[flushed] == 0)).all()


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_input_is_read_exactly(dtype, reduction):
    # Every finite bit pattern as a row of one: with a float32 weight, mean comes back in
    # float32 and is the value itself.
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    values = values[values.isfinite()].reshape(-1, 1)
    # A device may flush subnormal values to zero (WGSL allows it; the H200's driver does,
    # lavapipe does not): those may come back as a zero of either sign.
    _, mean, _ = pipeline.layer_norm(values, [1], torch.ones(1), None)
    want = values.float()
    flushed = (want.abs() < torch.finfo(torch.float32).tiny) & (mean == 0)
    assert mean.dtype == torch.float32 and torch.equal(mean[~flushed], want[~flushed])


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [3, 6, 1023])
def test_half_every_output_element_is_written(dtype, width, reduction, f16_store):
    x = torch.randn(37, width).to(dtype)
    out, mean, rstd = runtime.native_layer_norm(x, [width], None, None, 1e-5, poison=float("nan"))
    assert not out.isnan().any() and not mean.isnan().any() and not rstd.isnan().any()


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_launches_split_at_the_binding_limit(dtype, monkeypatch, reduction):
    # Odd rows of 2-byte values: every launch but the first starts mid-word in the tensor.
    g = runtime_device.gpu()
    monkeypatch.setitem(g.limits, "max-storage-buffer-binding-size", 1023 * 2 * 9 + 4)
    before = runtime.stats()["dispatches"]
    x = torch.randn(100, 1023).to(dtype)
    assert_half_close_to_reference(x, (1023,), torch.randn(1023).to(dtype), torch.randn(1023).to(dtype))
    assert runtime.stats()["dispatches"] - before == 2 * 12  # 12 a call, with stats and without


def test_pack_probe_refuses_a_conversion_that_does_not_round_as_aten():
    values = wgsl.f16_pack_cases()
    with np.errstate(over="ignore"):
        right = values.astype(np.float16).view(np.uint16)
    assert wgsl.pack_matches_aten(values, right)
    truncated = (values.view(np.uint32) >> 13).astype(np.uint16)  # no rounding at all: garbage bits
    assert not wgsl.pack_matches_aten(values, truncated)
    toward_zero = np.where(right & 1, right - 1, right).astype(np.uint16)  # one ulp off on odd results
    assert not wgsl.pack_matches_aten(values, toward_zero)
    no_nan = right.copy()
    no_nan[np.isnan(values)] = 0x7C00  # NaN packed as infinity
    assert not wgsl.pack_matches_aten(values, no_nan)


def test_half_pipelines_use_no_shader_f16():
    # Core WGSL only: the module compiles on adapters without the `shader-f16` feature.
    for dtype, affine in (("float16", "float16"), ("bfloat16", "float32")):
        for width in (4, 6, 7):
            source = kernel.choose_config(width, True, True, 0, dtype, affine).source(runtime_device.gpu().files)
            assert "enable f16" not in source and "f16>" not in source and " f16" not in source


def test_compensated_sums_pass_through_opaque():
    # The H200's compiler folds (a - (a + b)) + b to 0: the streamed merge's mean and the
    # row's unframed two-sum go through opaque, which xors in the host's 0 (Params.zero).
    text = wgsl.source("native_layer_norm.wgsl")
    assert "let mean = opaque(a.y + step);" in text and "let sum = opaque(frame.x + mean_d);" in text
    assert "bitcast<f32>(bitcast<u32>(v) ^ params.zero)" in text
    assert pack_params(7, 1e-5)[3] == 0


# Plain half rows read in 16-byte words (KernelConfig.wide_words): a tuned layout's choice,
# forced here wherever it fits.


@pytest.fixture
def words(monkeypatch):
    """Launches that store no mean and rstd read their plain half rows in 16-byte words at the
    rule's threads per row, or half as many, where either fits (as a tuned table would
    choose); returns the configs launched so."""
    from pipeline.wgsl.layouts import unusable

    chosen, launched = kernel.choose_config, []

    def in_words(*args, **kwargs):
        config = chosen(*args, **kwargs)
        for threads in (config.threads_per_row, config.threads_per_row // 2):
            workgroup = max(config.workgroup, threads)
            if unusable(config, threads, workgroup, wide_words=True) is None:
                launched.append(config.relaid(threads, workgroup, wide_words=True))
                return launched[-1]
        return config

    monkeypatch.setattr(kernel, "choose_config", in_words)
    return launched


WORDS_WIDTHS = [8, 24, 128, 768, 1024, 3072, 4096]


def words_rows(kind: str, rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, generator=gen)
    if kind == "large_mean":
        return 2048 + 4 * x
    if kind == "far_from_zero":
        return 1e4 + 1e-2 * x
    if kind == "at_the_limit":
        return torch.where(x > 0, 65504.0, -65504.0)
    if kind == "binades_apart":
        return x * torch.pow(2.0, torch.randint(-14, 15, (rows, width), generator=gen).float())
    return 2 * x + 0.5


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", WORDS_WIDTHS)
@pytest.mark.parametrize("kind", ["random", "large_mean", "far_from_zero", "at_the_limit", "binades_apart"])
def test_plain_rows_in_16_byte_words(dtype, width, kind, reduction, words):
    gen = torch.Generator().manual_seed(width)
    x = words_rows(kind, 9, width, gen).to(dtype)
    weight, bias = (t.to(dtype) for t in make_affine((width,), True, True, gen))
    assert_half_close_to_reference(x, (width,), weight, bias)
    assert words and all(c.wide_words and c.width == width for c in words)


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [8, 768])
@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
def test_16_byte_words_with_each_affine_part(dtype, width, has_weight, has_bias, reduction, words):
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(7, width, generator=gen) * 2 + 0.5).to(dtype)
    weight, bias = (None if t is None else t.to(dtype) for t in make_affine((width,), has_weight, has_bias, gen))
    assert_half_close_to_reference(x, (width,), weight, bias)
    assert words


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width", [8, 128, 3072])
def test_16_byte_words_of_constant_nan_and_inf_rows(dtype, width, reduction, words):
    x = torch.full((8, width), 3.25)
    x[1], x[2] = -1e4, 7.25
    x[3, width // 2] = float("nan")
    x[4, 0] = float("inf")
    x[5, -1] = float("-inf")
    x[6, 0], x[6, -1] = float("inf"), float("-inf")
    x[7] = torch.linspace(-3, 3, width)
    bias = torch.linspace(-1, 1, width).to(dtype)
    out = kernel.native_layer_norm(x.to(dtype), [width], None, bias, stats=False)[0]
    assert torch.equal(out[:3], bias.expand(3, width))
    assert out[3:7].isnan().all() and not out[7].isnan().any()
    want = reference(x[7:].to(dtype), (width,), None, bias, 1e-5)[0]
    assert torch.allclose(out[7:].double(), want, rtol=0, atol=2 * torch.finfo(dtype).eps * want.abs().max())
    assert words


@ON_BOTH_PATHS
@pytest.mark.parametrize("width", [8, 128])
def test_16_byte_words_of_bfloat16_rows_past_float32s_range(width, reduction, words):
    gen = torch.Generator().manual_seed(width)
    x = near_float32_limit(width, gen).to(torch.bfloat16)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    x = torch.cat([x, (torch.randn(8, width, generator=gen) * 1e15).to(torch.bfloat16)])
    out = kernel.native_layer_norm(x, (width,), stats=False)[0].double()
    want = reference(x, (width,), None, None, 1e-5)[0]
    nan_rows = torch.isnan(out).all(dim=1)
    assert nan_rows.any() and not nan_rows[-8:].any() and not torch.isnan(out[~nan_rows]).any()
    assert torch.allclose(out[~nan_rows], want[~nan_rows], rtol=0, atol=2 ** -7 * want[~nan_rows].abs().max())
    assert words


@ON_BOTH_PATHS
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_16_byte_words_of_more_rows_than_one_grid_dimension(dtype, reduction, words, monkeypatch):
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(70_001, 8, generator=gen) * 3 + 1).to(dtype)
    weight, bias = (t.to(dtype) for t in make_affine((8,), True, True, gen))
    assert_half_close_to_reference(x, (8,), weight, bias)
    monkeypatch.setattr(kernel, "MAX_GRID_X", 7)  # and workgroups past the x limit, through y
    x = x[:5001].contiguous()
    assert kernel.grid(5001, words[-1])[1] > 1
    assert_half_close_to_reference(x, (8,), weight, bias)
