"""A delegate's call through the C++ library (pipeline.runtime.native_call) against the
same delegate launching from Python: the same bits for every dtype, shape, affine form and
output set, on both reduction paths (the library's device reads PIPELINE_WGPU_SUBGROUPS
once, so the workgroup-memory path runs the kernel's tests again in a child process)."""

import ctypes
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

from pipeline import blob, runtime
from pipeline.native import build as native_build
from pipeline.runtime import delegate as delegate_module
from pipeline.runtime import device as runtime_device
from pipeline.runtime import native_call
from support.delegates import DTYPES, bits, make_delegate
from support.scripts import ROOT

pytestmark = pytest.mark.usefixtures("gpu_info")


def both_ways(data, monkeypatch):
    """The delegate opened in the library, and opened to launch from Python."""
    native = delegate_module.LayerNormDelegate(data)
    assert native._native is not None, "the native call library did not open the delegate"
    with monkeypatch.context() as m:
        m.setenv(native_call.NATIVE_CALL_ENV, "0")
        python = delegate_module.LayerNormDelegate(data)
    assert python._native is None
    return native, python


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(bits(a), bits(b)), f"output {i} differs from the Python launch"


def rows_of_every_kind(rows, width, kind, gen):
    """Random rows, then a large-mean/small-variance row, a constant row, a NaN row, an Inf row."""
    x = torch.randn(rows, width, generator=gen) * 3
    if rows >= 5:
        x[1] = 1e4 + torch.randn(width, generator=gen) * 1e-2
        x[2] = 7.0
        x[3, width // 2] = float("nan")
        x[4, 0] = float("inf")
    return x.to(kind)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rows,width", [(7, 5), (64, 768), (33, 1023), (9, 3000), (70_000, 6)])
def test_same_bits_as_the_python_launch(dtype, rows, width, monkeypatch):
    data, _ = make_delegate(width, dtype, outputs=(0, 1, 2))
    native, python = both_ways(data, monkeypatch)
    x = rows_of_every_kind(rows, width, DTYPES[dtype], torch.Generator().manual_seed(rows + width))
    assert_same(native(x), python(x))


# Every eps aten takes, and those around float32's largest value, where the C++ rounds the
# blob's float64 eps as numpy does (past half an ulp beyond it: inf).
EPS = [-0.5, -1.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e300, -1e300, 3.4028235e38,
       3.4028235677973362e38, 3.4028235677973366e38, -3.4028235677973366e38]


@pytest.mark.parametrize("eps", EPS)
def test_every_eps_gives_the_python_launch_s_bits(eps, monkeypatch):
    data, _ = make_delegate(24, outputs=(0, 1, 2), eps=eps)
    native, python = both_ways(data, monkeypatch)
    # Rows of variance 0.01 to 4, either side of -eps; a constant row.
    x = torch.randn(48, 24, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 2.0, 48)[:, None]
    x[0] = 3.0
    assert_same(native(x), python(x))


@pytest.mark.parametrize("weight,bias", [("input", "input"), ("input", "none"), ("none", "constant"),
                                         ("none", "none")])
@pytest.mark.parametrize("outputs", [(0,), (2, 0), (1,)])
def test_affine_forms_and_output_sets(weight, bias, outputs, monkeypatch):
    data, arguments = make_delegate(384, "float16", weight, bias, outputs)
    native, python = both_ways(data, monkeypatch)
    gen = torch.Generator().manual_seed(3)
    args = [rows_of_every_kind(50, 384, torch.float16, gen).reshape(5, 10, 384)]
    args += [torch.randn(384, generator=gen).half() for _ in range(arguments - 1)]
    assert_same(native(*args), python(*args))
    # A second call with other rows reuses the kept bind group only where it still fits.
    args[0] = args[0][:, :3].contiguous()
    assert_same(native(*args), python(*args))


def test_mixed_precision_float32_affine_with_half_input(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    params = blob.LayerNormParams((96,), 1e-5, 0, blob.Operand(blob.CONSTANT), blob.Operand(blob.INPUT, 1),
                                  (0, 1, 2), 2, dtype="bfloat16", affine_dtype="float32")
    data = blob.encode(blob.DelegateBlob(params, {"weight": torch.randn(96, generator=gen).numpy()}))
    native, python = both_ways(data, monkeypatch)
    x, b = torch.randn(40, 96, generator=gen).bfloat16(), torch.randn(96, generator=gen)
    assert_same(native(x, b), python(x, b))


def test_delegates_share_the_devices_buffers(monkeypatch):
    # A call's buffers are the device's, grown by the largest call: delegates of other sizes
    # in turn, each call's buffers replaced by the other's larger one or reused, the kept bind
    # groups rebuilt whenever the device's buffers changed.
    small, small_py = both_ways(make_delegate(64, outputs=(0, 1, 2), seed=1)[0], monkeypatch)
    large, large_py = both_ways(make_delegate(1000, outputs=(0,), seed=2)[0], monkeypatch)
    gen = torch.Generator().manual_seed(5)
    for delegate, python, rows, width in ((small, small_py, 8, 64), (large, large_py, 600, 1000),
                                          (small, small_py, 9, 64), (large, large_py, 700, 1000),
                                          (small, small_py, 5000, 64), (large, large_py, 3, 1000)):
        x = torch.randn(rows, width, generator=gen) * 3
        assert_same(delegate(x), python(x))


def test_strided_and_empty_inputs(monkeypatch):
    data, _ = make_delegate(64)
    native, python = both_ways(data, monkeypatch)
    x = torch.randn(64, 30).t()  # not contiguous
    assert_same(native(x), python(x))
    empty = torch.randn(0, 64)
    assert_same(native(empty), python(empty))


def test_threaded_copies_over_a_megabyte():
    # The copy pool runs on 4 cores or more; PIPELINE_COPY_THREADS runs it on any machine.
    # Upload and read-back of 1.2 MB over 4 threads, calls of two sizes in turn.
    code = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from support.delegates import make_delegate, bits
from pipeline.runtime.delegate import LayerNormDelegate
data, _ = make_delegate(1000, outputs=(0, 1, 2))
native = LayerNormDelegate(data)
assert native._native is not None
os.environ["PIPELINE_NATIVE_CALL"] = "0"
python = LayerNormDelegate(data)
same = lambda x: all(torch.equal(bits(a), bits(b)) for a, b in zip(native(x), python(x)))
print(all(same(torch.randn(rows, 1000) * 4 + 1) for rows in (300, 700, 300)))
"""
    env = {**__import__("os").environ, "PIPELINE_COPY_THREADS": "4"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.stdout.split() == ["True"], run.stderr[-2000:]


def test_spinning_waits_give_the_same_bits():
    # On a GPU a wait spins on non-blocking polls before it blocks; a CPU adapter (the one
    # tests run on) never spins unless PIPELINE_POLL_SPIN_US says so.
    code = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from support.delegates import make_delegate, bits
from pipeline.runtime.delegate import LayerNormDelegate
data, _ = make_delegate(768, outputs=(0, 2))
native = LayerNormDelegate(data)
os.environ["PIPELINE_NATIVE_CALL"] = "0"
python = LayerNormDelegate(data)
same = lambda x: all(torch.equal(bits(a), bits(b)) for a, b in zip(native(x), python(x)))
print(all(same(torch.randn(rows, 768) * 2 - 1) for rows in (16, 900, 16)))
"""
    env = {**__import__("os").environ, "PIPELINE_POLL_SPIN_US": "300"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.stdout.split() == ["True"], run.stderr[-2000:]


def test_threads_share_one_delegate(monkeypatch):
    data, _ = make_delegate(768, outputs=(0, 2))
    native, python = both_ways(data, monkeypatch)
    inputs = [torch.randn(20 + 7 * i, 768, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    wanted = [python(x) for x in inputs]
    wrong = []

    def work(i):
        for _ in range(5):
            got = native(inputs[i])
            if not all(torch.equal(a, b) for a, b in zip(got, wanted[i])):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_calls_count_in_the_runtime_stats(monkeypatch):
    data, _ = make_delegate(64, outputs=(0, 1))
    native, _ = both_ways(data, monkeypatch)
    runtime.reset_stats()
    native(torch.randn(10, 64))
    counts = runtime.stats()
    assert counts["dispatches"] == 1
    # x alone goes up (weight and bias are resident); out, mean and rstd come back.
    assert counts["bytes_uploaded"] == 10 * 64 * 4 and counts["bytes_read_back"] == 10 * 64 * 4 + 2 * 10 * 4


def test_pipelines_and_buffers_count_in_the_runtime_stats(monkeypatch):
    runtime.reset_stats()
    data, _ = make_delegate(96, outputs=(0, 1))
    native, _ = both_ways(data, monkeypatch)
    native(torch.randn(10, 96))
    first = native_call.counters()  # the library's part of runtime.stats()
    assert first["pipelines_compiled"] >= 1 and first["buffers_allocated"] >= 1
    assert runtime.stats()["buffers_allocated"] >= first["buffers_allocated"]
    runtime.reset_stats()
    native(torch.randn(10, 96))
    again = runtime.stats()
    assert (again["dispatches"], again["pipelines_compiled"], again["buffers_allocated"]) == (1, 0, 0)


def test_wrong_dtype_and_shape_are_refused(monkeypatch):
    data, _ = make_delegate(64, "float16")
    native, _ = both_ways(data, monkeypatch)
    with pytest.raises(ValueError, match="exported for float16 input, got torch.float32"):
        native(torch.randn(3, 64))
    with pytest.raises(ValueError, match="normalized_shape"):
        native(torch.randn(3, 65).half())


def test_a_blob_the_library_refuses_raises_with_its_reason():
    with pytest.raises(RuntimeError, match="opening the delegate on the GPU failed: delegate blob: "):
        native_call.NativeCall(b"not a delegate blob, " * 4)


def test_without_the_library_delegates_warn_once_and_launch_from_python(monkeypatch):
    def refuse(name):
        raise native_build.BuildError("no C++ compiler found (install g++ or set CXX)")

    monkeypatch.setattr(native_call, "_libs", {})
    monkeypatch.setattr(native_call, "_failures", {})
    monkeypatch.setattr(native_call, "_warned", False)
    monkeypatch.setattr(native_call, "_load", refuse)
    data, _ = make_delegate(32)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*launch the kernel from Python"):
        first = delegate_module.LayerNormDelegate(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = delegate_module.LayerNormDelegate(data)
    assert first._native is None and second._native is None
    x = torch.randn(4, 32)
    want = torch.ops.aten.native_layer_norm.default(
        x, [32], *(torch.from_numpy(blob.decode(data).constants[r]) for r in ("weight", "bias")), 1e-5)[0]
    torch.testing.assert_close(first(x)[0], want, atol=2e-5, rtol=1e-5)


def test_the_library_uses_the_devices_reduction_path():
    # On the subgroup run the library's kernels use subgroups of the size wgpu-py's probe
    # found; without subgroups (PIPELINE_WGPU_SUBGROUPS=0) neither does.
    assert native_call.subgroup_size() == runtime_device.gpu().subgroup_size
    if os.environ.get(runtime_device.SUBGROUPS_ENV) == "0":
        assert native_call.subgroup_size() == 0


def test_threaded_copy_size_is_pythons():
    entry = native_call.library().pipeline_layer_norm_threaded_copy_bytes
    entry.restype = ctypes.c_uint64
    assert entry() == runtime_device.THREADED_COPY_BYTES


# The tests whose bits the reduction path decides: the kernel's output for each dtype, shape,
# eps, affine form and output set, and which path the library takes. The others check what
# happens around the kernel (shared buffers, threads, copies, waits, counters, refusals, the
# fallback), which is the same code on either path.
ON_EACH_REDUCTION_PATH = (test_same_bits_as_the_python_launch, test_every_eps_gives_the_python_launch_s_bits,
                          test_affine_forms_and_output_sets, test_mixed_precision_float32_affine_with_half_input,
                          test_strided_and_empty_inputs, test_the_library_uses_the_devices_reduction_path)


def test_the_kernel_tests_above_on_the_workgroup_memory_path():
    # The library's device reads PIPELINE_WGPU_SUBGROUPS once, when a process opens it: the
    # workgroup-memory path (an adapter without subgroups) needs a process of its own.
    env = {**os.environ, runtime_device.SUBGROUPS_ENV: "0"}
    here = Path(__file__).relative_to(ROOT)
    tests = [f"{here}::{test.__name__}" for test in ON_EACH_REDUCTION_PATH]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.returncode == 0 and " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-4000:]
