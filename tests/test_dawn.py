"""The kernel on Dawn (compiler Tint), the WebGPU that ExecuTorch's backend and Chromium run:
every class of launch held against float64 and against wgpu's result of the same launch,
the device probes, and a program's delegates, all in this process beside wgpu.

On a machine without a GPU Dawn runs on SwiftShader (set-up installs it); under
PIPELINE_REQUIRE_GPU=1 (CI) a missing Dawn adapter or one without subgroups fails rather
than skips, as wgpu's does.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline import runtime
from pipeline.native import build as native_build
from pipeline.native import dawn_webgpu
from pipeline.runtime import delegate as delegate_module
from pipeline.runtime import device as runtime_device
from pipeline.runtime import native_call
from pipeline.wgsl.config import STREAM_UNROLL
from support.delegates import DTYPES, bits, make_delegate
from support.gpu import REQUIRE_GPU_ENV
from support.grids import AFFINE, thinned
from support.lowering import lower_and_compare
from support.reference import assert_close_to_reference
from support.scripts import ROOT

kernel = importlib.import_module("pipeline.runtime.launch")
pytestmark = pytest.mark.usefixtures("gpu_info")

DTYPE_PAIRS = [(torch.float32, None), (torch.float16, None), (torch.float16, torch.float32),
               (torch.bfloat16, None), (torch.bfloat16, torch.float32)]
# One width of each class: scalar, vec2 and vec4 loads; rows held by one thread, by a
# subgroup, by several subgroups; rows streamed (wider than 8 values x 256 threads).
CLASS_WIDTHS = [7, 6, 384, 1023, 1024, 4097, 4098, 8192]
REDUCTIONS = ["subgroup", "workgroup", "streamed"]
# How far Dawn's results may lie from wgpu's, in ulp at the row's scale. WGSL leaves x / y
# (2.5 ulp) and inverse square roots (2 ulp) inexact, and drivers may fuse a multiply and an
# add or not: SwiftShader's and lavapipe's results lie up to 3 ulp apart over this grid (2
# failed it), each as close to float64 as eager.
ULPS_BETWEEN_IMPLEMENTATIONS = 3


def _use(monkeypatch, name: str) -> runtime_device.Gpu:
    monkeypatch.setenv(runtime_device.IMPLEMENTATION_ENV, name)
    return runtime_device.gpu()


@pytest.fixture
def dawn(monkeypatch) -> runtime_device.Gpu:
    """Dawn's device for the test (the process's default stays wgpu)."""
    try:
        return _use(monkeypatch, "dawn")
    except RuntimeError as exc:
        if os.environ.get(REQUIRE_GPU_ENV) == "1":
            raise
        pytest.skip(f"no Dawn adapter: {exc}")


def _reduction(monkeypatch, g: runtime_device.Gpu, path: str) -> None:
    """Force `path` on `g` (and the kernel's rule): shuffles, workgroup memory, or streamed rows."""
    if path == "subgroup" and not g.subgroup_size:
        if os.environ.get(REQUIRE_GPU_ENV) == "1":
            pytest.fail(f"{g.impl.name} adapter {g.impl.info['adapter']!r} has no subgroups")
        pytest.skip("adapter has no subgroup operations")
    if path == "workgroup":
        monkeypatch.setattr(g, "subgroup_size", 0)
    if path == "streamed":
        chosen = kernel.choose_config
        monkeypatch.setattr(kernel, "choose_config", lambda *a, **k: dataclasses.replace(
            chosen(*a, **k), hold=0, unroll=STREAM_UNROLL))


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference between a and b in units in the last place of their dtype at the
    scale of b's row (its largest magnitude): two implementations of the same arithmetic
    differ by that much, however small a value of the row is. NaNs must sit at the same
    places (and count 0); a NaN against a number is infinitely far."""
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return float("inf")
    eps = torch.finfo(a.dtype).eps
    a, b = a.double().masked_fill(nan_a, 0), b.double().masked_fill(nan_b, 0)
    scale = b.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    ulp = eps * torch.exp2(torch.floor(torch.log2(scale)))
    return float(((a - b).abs() / ulp).max()) if a.numel() else 0.0


def test_device_info_names_dawn_and_tint(dawn):
    info = runtime.device_info()
    assert info["implementation"] == "dawn" and info["shader_compiler"] == "tint"
    assert info["adapter"] and info["backend"] and "timestamp-query" in info["features"]


def test_unknown_implementation_is_refused(monkeypatch):
    monkeypatch.setenv(runtime_device.IMPLEMENTATION_ENV, "webgl")
    with pytest.raises(RuntimeError, match="PIPELINE_WEBGPU='webgl'.*wgpu, dawn"):
        runtime_device.gpu()


def test_probes_run_on_dawn(dawn):
    # The probes ran when the device was made; they run again here and agree.
    assert runtime_device._probe_subgroup_size(dawn) == dawn.subgroup_size
    assert dawn.subgroup_size & (dawn.subgroup_size - 1) == 0
    assert runtime_device._probe_f16_pack(dawn) == dawn.pack2x16float
    if os.environ.get(REQUIRE_GPU_ENV) == "1":
        assert dawn.subgroup_size > 0, "CI's Dawn adapter must have subgroups: both reduction paths run"


# Every dtype meets every width and path, every width every path (a Tint compile each on
# SwiftShader); the whole product under `make test-kernel-full`.
@pytest.mark.parametrize("dtypes, width, path", thinned(DTYPE_PAIRS, CLASS_WIDTHS, REDUCTIONS))
def test_every_class_matches_float64_and_wgpu(monkeypatch, dawn, dtypes, width, path):
    dtype, affine_dtype = dtypes
    # Affine variants and stats on/off rotate over the widths, so each dtype and path meets all.
    has_weight, has_bias = AFFINE[CLASS_WIDTHS.index(width) % 4]
    stats = CLASS_WIDTHS.index(width) % 3 != 2
    # Rows near zero: where the two adapters' subgroups differ in size (SwiftShader 4, lavapipe
    # 8), the sums run in another order and the row's mean may differ by an ulp, which a
    # large mean would carry into every output (test_hard_rows_on_dawn holds those to float64).
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(9, width, generator=gen) * 3 + 0.5).to(dtype)
    weight = torch.randn(width, generator=gen).to(affine_dtype or dtype) if has_weight else None
    bias = torch.randn(width, generator=gen).to(affine_dtype or dtype) if has_bias else None
    results = {}
    for name in ("wgpu", "dawn"):
        g = _use(monkeypatch, name)
        with monkeypatch.context() as m:
            _reduction(m, g, path)
            results[name] = kernel.native_layer_norm(x, [width], weight, bias, 1e-5, stats=stats,
                                                     poison=float("nan"))
    for i, (ours, theirs) in enumerate(zip(results["dawn"], results["wgpu"])):
        if ours is None:
            assert theirs is None and not stats
            continue
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        ulps = _ulps(ours, theirs)
        assert ulps <= ULPS_BETWEEN_IMPLEMENTATIONS, f"output {i}: Dawn and wgpu differ by {ulps:.2f} ulp"
    truth = torch.ops.aten.native_layer_norm.default(
        x.double(), [width], None if weight is None else weight.double(), None if bias is None else bias.double(), 1e-5)
    eager = torch.ops.aten.native_layer_norm.default(x, [width], weight, bias, 1e-5)
    err = (results["dawn"][0].double() - truth[0]).abs().max().item()
    eager_err = (eager[0].double() - truth[0]).abs().max().item()
    ulp = torch.finfo(dtype).eps * truth[0].abs().max().item()
    assert err <= 2 * eager_err + 2 * ulp, f"Dawn's out: {err:.3g} from float64, eager {eager_err:.3g}"


@pytest.mark.parametrize("path", REDUCTIONS)
def test_hard_rows_on_dawn(monkeypatch, dawn, path):
    # Large mean and small variance, a constant row, NaN and infinities, a width that is not
    # a multiple of 4, against float64 with eager float32 as the yardstick.
    _reduction(monkeypatch, dawn, path)
    width = 1023
    x = torch.randn(8, width, dtype=torch.float64)
    x[0] = 1e4 + x[0] * 1e-3
    x[1] = -1e4
    x = x.float()
    assert_close_to_reference(x, (width,), torch.randn(width), torch.randn(width))
    x[2, 5], x[3, 0], x[4, -1] = float("nan"), float("inf"), float("-inf")
    out, mean, rstd = pipeline.layer_norm(x, (width,))
    assert torch.isnan(out[2:5]).all() and torch.isfinite(out[[0, 1, 5, 6, 7]]).all()
    assert torch.equal(out[1], torch.zeros(width)) and rstd[1].item() == pytest.approx(1 / 1e-5**0.5, rel=1e-6)


def test_more_rows_than_one_grid_dimension_on_dawn(dawn):
    x = torch.randn(70_001, 7)
    assert_close_to_reference(x, (7,), torch.randn(7), torch.randn(7))


def test_program_runs_its_delegates_on_dawn(monkeypatch, dawn, tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.LayerNorm(20), torch.nn.GELU(),
                                 torch.nn.Linear(20, 6), torch.nn.LayerNorm(6, bias=False))
    prog = lower_and_compare(module, (torch.randn(3, 12),), [(torch.randn(3, 12),)], layer_norms=2)
    prog.save(tmp_path / "m.pte")
    before = runtime.stats()["dispatches"]
    loaded = pipeline.load(tmp_path / "m.pte")
    x = torch.randn(3, 12)
    torch.testing.assert_close(loaded(x), prog(x), rtol=0, atol=0)
    assert runtime.stats()["dispatches"] - before == 4  # two delegates, two calls: all on Dawn
    assert runtime.device_info()["implementation"] == "dawn"


def test_dawn_declarations_cover_every_bound_call_and_hold_ctypes_layouts(tmp_path):
    # dawn_webgpu.h, generated from dawn-python's ctypes bindings: a WGPUProc type for every call
    # the C++ binds, and it compiles, its static_asserts holding each struct to ctypes' layout.
    pytest.importorskip("pydawn")
    text = dawn_webgpu.header()
    for name, symbol in dawn_webgpu.calls():
        assert f"(*WGPUProc{symbol})(" in text and f"X({name}, {symbol})" in text, name
    assert text.count("static_assert(sizeof(") == text.count("\nstruct ")
    try:
        compiler = native_build.find_compiler()
    except native_build.BuildError as exc:
        pytest.skip(str(exc))
    header = tmp_path / dawn_webgpu.HEADER_NAME
    header.write_text(text)
    run = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", "-x", "c++", str(header)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]


def test_dawn_declarations_refuse_a_call_dawn_lacks(monkeypatch):
    pytest.importorskip("pydawn")
    monkeypatch.setattr(dawn_webgpu, "CALLS", (*dawn_webgpu.CALLS, "DeviceTeleport"))
    with pytest.raises(dawn_webgpu.DeclarationError, match="WGPUProcDeviceTeleport"):
        dawn_webgpu.header()


# Delegates on Dawn call through the C++ library's Dawn build (libpipeline_layer_norm_dawn.so:
# the same sources against Dawn's C API), as they call the wgpu build on wgpu. Scalar,
# vec2 and vec4 rows, a row streamed, hard rows; the device reads PIPELINE_WGPU_SUBGROUPS once,
# so the workgroup-memory path runs these again in a process of its own.
LIBRARY_CASES = [("float32", 7, 5), ("float16", 64, 768), ("bfloat16", 33, 1023), ("float32", 9, 3000),
                 ("float16", 6, 4098)]


@pytest.mark.parametrize("dtype, rows, width", LIBRARY_CASES)
def test_delegates_call_the_dawn_library_with_the_python_launch_s_bits(monkeypatch, dawn, dtype, rows, width):
    native_call.library()  # raises, saying why, where the Dawn build cannot be had
    data, _ = make_delegate(width, dtype, outputs=(0, 1, 2))
    native = delegate_module.LayerNormDelegate(data)
    assert native._native is not None, "the Dawn call library did not open the delegate"
    with monkeypatch.context() as m:
        m.setenv(native_call.NATIVE_CALL_ENV, "0")
        python = delegate_module.LayerNormDelegate(data)
    gen = torch.Generator().manual_seed(rows + width)
    x = torch.randn(rows, width, generator=gen) * 3
    if rows >= 5:  # a large mean with a small variance, a constant row, NaN, infinity
        x[1] = 1e4 + torch.randn(width, generator=gen) * 1e-2
        x[2] = 7.0
        x[3, width // 2] = float("nan")
        x[4, 0] = float("inf")
    x = x.to(DTYPES[dtype])
    for i, (a, b) in enumerate(zip(native(x), python(x), strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(bits(a), bits(b)), f"output {i}: the Dawn library differs from the Python launch"


def test_the_dawn_library_runs_on_the_python_runtime_s_device(dawn):
    assert native_call.device_name() == dawn.impl.info["adapter"]
    assert native_call.subgroup_size() == dawn.subgroup_size
    if os.environ.get(runtime_device.SUBGROUPS_ENV) == "0":
        assert native_call.subgroup_size() == 0


def test_the_dawn_library_on_the_workgroup_memory_path(dawn):
    if os.environ.get(runtime_device.SUBGROUPS_ENV) == "0":
        pytest.skip("this process is the workgroup-memory run")
    env = {**os.environ, runtime_device.SUBGROUPS_ENV: "0"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(Path(__file__).relative_to(ROOT)), "-k", "dawn_library and not workgroup_memory"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.returncode == 0 and " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-4000:]


def test_executorch_runtime_runs_the_dawn_backend_with_the_python_launch_s_bits(dawn, tmp_path):
    # The backend library's Dawn build (libpipeline_webgpu_dawn.so) registered in ExecuTorch's
    # runtime: a process of its own, since a process registers one WebGPUBackend, the one its
    # PIPELINE_WEBGPU names when first asked.
    code = f"""
import os, torch
from torch import nn
import pipeline, pipeline.native

class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.odd = nn.LayerNorm(128), nn.LayerNorm(15)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_()

    def forward(self, x, y):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x * 2, [128], self.norm.weight, self.norm.bias, 1e-5)
        return self.norm(x), out, mean, rstd, self.odd(y)

torch.manual_seed(0)
x, y = torch.randn(40, 128) * 4 + 30, torch.randn(3, 5, 15).half()
model = Norms().eval()
model.odd.half()
os.environ["PIPELINE_NATIVE_CALL"] = "0"  # the lowered program's delegates launch from Python
prog = pipeline.lower(model, (x, y))
prog.save({str(tmp_path / "norms.pte")!r})
python = prog(x, y)
available, adapter = pipeline.native.device()
got = pipeline.native.load({str(tmp_path / "norms.pte")!r})(x, y)
print(available, adapter == {dawn.impl.info["adapter"]!r}, prog.coverage.delegated,
      all(torch.equal(g, p) for g, p in zip(got, python, strict=True)))
"""
    env = {**os.environ, runtime_device.IMPLEMENTATION_ENV: "dawn"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.stdout.split()[-4:] == ["True", "True", "3", "True"], run.stderr[-3000:]


def test_the_three_families_files_run_in_executorch_runtime_on_dawn(dawn, checkpoints, exported):
    # bart's, whisper's and florence2's exported files in ExecuTorch's runtime with the Dawn
    # backend (a process of its own: one WebGPUBackend per process), each against eager as
    # test_pte holds the Python runtime, and against the Python runtime on Dawn.
    files = {name: (exported(name).summary["pte"], str(checkpoints[name][0])) for name in ("bart", "whisper", "florence2")}
    code = f"""
import torch, pipeline, pipeline.native
from support.reference import assert_same_outputs
available, adapter = pipeline.native.device()
assert available and adapter == {dawn.impl.info["adapter"]!r}, adapter
listed = lambda out: list(out) if isinstance(out, (list, tuple)) else [out]  # ExecuTorch's runtime gives a list
for name, (pte, checkpoint) in {files!r}.items():
    spec = pipeline.models.build(name, checkpoint=checkpoint, seed=1)
    got = listed(pipeline.native.load(pte)(*spec.example_inputs))
    with torch.no_grad():
        assert_same_outputs(got, listed(spec.module(*spec.example_inputs)), atol=1e-4)
    assert_same_outputs(got, listed(pipeline.load(pte)(*spec.example_inputs)), atol=1e-5)
    print(name, "ok")
"""
    env = {**os.environ, runtime_device.IMPLEMENTATION_ENV: "dawn",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.split() == ["bart", "ok", "whisper", "ok", "florence2", "ok"], \
        run.stderr[-3000:]
