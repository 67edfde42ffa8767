"""Inputs, signals and files that once reached past the runtimes' checks.

Self-contained: its models, fixtures and helpers are its own.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeline
from pipeline.native import build as native_build


@pytest.fixture(scope="module")
def native(gpu_info):
    """pipeline.native with the backend registered and a device; a skip only when no
    compiler exists."""
    try:
        native_build.find_compiler()
    except native_build.BuildError as exc:
        pytest.skip(str(exc))
    module = importlib.import_module("pipeline.native")
    available, reason = module.device()
    assert available, f"the native backend finds no device although wgpu does: {reason}"
    module.register()
    return module


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _assert_within_one_ulp(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32, what
    ulp = torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs()
    assert ((got - want).abs() - ulp).max().item() <= 0, f"{what}: the runtimes differ by more than one ulp"


# Defect 5: strided inputs in ExecuTorch's runtime


class ImageModel(nn.Module):
    """A 4-D input (channels-last applies): GroupNorm (no affine) and a LayerNorm over its
    last dim, each output a LayerNorm delegate's."""

    def __init__(self) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(2, 4, affine=False)
        self.norm = nn.LayerNorm(6)
        with torch.no_grad():
            for p in self.norm.parameters():
                p.normal_()

    def forward(self, x):
        return self.group_norm(x), self.norm(x * 2)


class SequenceModel(nn.Module):
    """A 3-D and a 2-D input, each through a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.norm_2d = nn.LayerNorm(8, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_()

    def forward(self, x, y):
        return self.norm(x), self.norm_2d(y)


def _overlapping(t: torch.Tensor) -> torch.Tensor:
    """A tensor of t's shape whose rows overlap in memory (each starts one element after
    the previous)."""
    shape = list(t.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 3, -1, -1):
        strides[d] = sum((shape[k] - 1) * strides[k] for k in range(d + 1, len(shape))) + 1
    span = sum((s - 1) * st for s, st in zip(shape, strides)) + 1
    return torch.randn(span).as_strided(shape, strides)


def _strided_kinds(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs of t's shape and dtype in every kind of layout a caller may hand over."""
    kinds = {
        "transposed": t.transpose(-1, -2).contiguous().transpose(-1, -2),
        "sliced": torch.cat([t, t], dim=-1)[..., ::2],
        "offset": torch.cat([t.flatten(), t.flatten()])[t.numel():].view(t.shape),
        "expanded": t[..., :1, :].expand(t.shape),
        "overlapping": _overlapping(t),
        "parameter": nn.Parameter(t.clone()),
        "requires_grad": t.clone().requires_grad_(),
        "transposed_requires_grad": t.transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(),
    }
    if t.dim() == 4:
        kinds["channels_last"] = t.contiguous(memory_format=torch.channels_last)
        kinds["channels_last_parameter"] = nn.Parameter(t.contiguous(memory_format=torch.channels_last))
    return kinds


@pytest.fixture(scope="module")
def strided_programs(native, tmp_path_factory):
    """(name, path, example inputs) of a program with a 4-D input and one with 3-D and 2-D inputs."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("strided")
    found = []
    for name, model, inputs in (("image", ImageModel(), (torch.randn(2, 4, 3, 6),)),
                                ("sequence", SequenceModel(), (torch.randn(3, 5, 8), torch.randn(4, 8)))):
        prog = pipeline.lower(model.eval(), inputs)
        assert prog.coverage.delegated == prog.coverage.total == 2
        prog.save(out / f"{name}.pte")
        found.append((name, out / f"{name}.pte", inputs))
    return found


def _runs(native, path):
    from pipeline.native.trace import TracedProgram

    traced = TracedProgram(path, capture=True)
    return {"python": pipeline.load(path), "executorch": native.load(path), "executorch_traced": traced}, traced


def test_strided_inputs_run_alike_in_both_runtimes(native, strided_programs):
    for name, path, example in strided_programs:
        runs, traced = _runs(native, path)
        try:
            for position, x in enumerate(example):
                for kind, given in _strided_kinds(x).items():
                    inputs = list(example)
                    inputs[position] = given
                    dense = [t.detach().clone(memory_format=torch.contiguous_format) for t in inputs]
                    outputs = {}
                    for runtime, program in runs.items():
                        what = f"{name} input {position} {kind} in the {runtime} runtime"
                        want = list(program(*dense))
                        got = list(program(*inputs))
                        assert len(got) == len(want), what
                        for i, (g, w) in enumerate(zip(got, want)):
                            assert g.shape == w.shape and torch.equal(_bits(g), _bits(w)), \
                                f"{what}: output {i} differs from the contiguous input's"
                        outputs[runtime] = got
                    for i, (g, w) in enumerate(zip(outputs["executorch"], outputs["python"])):
                        _assert_within_one_ulp(g, w, f"{name} input {position} {kind} output {i}")
                    for i, (g, w) in enumerate(zip(outputs["executorch_traced"], outputs["executorch"])):
                        assert torch.equal(_bits(g), _bits(w)), f"{name} {kind}: traced output {i} differs"
                    assert given.requires_grad == (kind.endswith(("parameter", "requires_grad")))
        finally:
            traced.close()


def test_strided_input_in_the_executorch_verdict_path(native, strided_programs):
    from pipeline.evaluation.executorch_verdict import run_in_executorch

    name, path, (x,) = strided_programs[0]
    want = run_in_executorch(path.read_bytes(), (x,))
    got = run_in_executorch(path.read_bytes(), (x.contiguous(memory_format=torch.channels_last),))
    assert all(torch.equal(_bits(g), _bits(w)) for g, w in zip(got, want))


def test_caller_tensor_is_left_as_it_was(native, strided_programs):
    _, path, (x,) = strided_programs[0]
    given = nn.Parameter(x.contiguous(memory_format=torch.channels_last))
    before = given.detach().clone()
    native.load(path)(given)
    assert given.is_contiguous(memory_format=torch.channels_last) and given.requires_grad
    assert given.grad is None and torch.equal(given.detach(), before)


# Defect 4: Ctrl-C during a GPU wait


# Runs pipeline.layer_norm in a loop (its wait for the GPU in Python). It survives `handled`
# interrupts (printing "interrupted" for each), checks that its results and a delegate's
# (its call in C++ on wgpu) still match torch's, then loops with no handler: the next
# interrupt ends it with a traceback.
_INTERRUPTED_LOOP = """
import sys, torch, pipeline
from pipeline.benchmark import layer_norm_delegate

rows, width, handled = map(int, sys.argv[1:])
torch.manual_seed(0)
x, weight, bias = torch.randn(rows, width), torch.randn(width), torch.randn(width)
want = torch.nn.functional.layer_norm(x, [width], weight, bias)
delegate = layer_norm_delegate(weight, bias)
calls = [lambda: pipeline.layer_norm(x, [width], weight, bias)[0], lambda: delegate(x)[0]]

def check():
    for call in calls:
        assert torch.allclose(call(), want, atol=1e-4), "wrong result after an interrupt"

def until_interrupted():
    try:
        while True:
            calls[0]()
    except KeyboardInterrupt:
        return

check()
print("ready", flush=True)
for _ in range(handled):
    until_interrupted()
    print("interrupted", flush=True)
check()
print("checked", flush=True)
while True:
    calls[0]()
"""


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.strip())
    into.put(None)


def _expect(lines: queue.Queue, wanted: str, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {wanted!r} within {seconds} s of {what}: the wait hangs") from None
        if line is None:
            raise AssertionError(f"the process ended before {wanted!r} ({what})")
        if line == wanted:
            return


@pytest.mark.parametrize("implementation, rows", [("wgpu", 4096), ("dawn", 256)])
def test_interrupts_end_gpu_waits(gpu_info, tmp_path, implementation, rows):
    if implementation == "dawn":
        pytest.importorskip("pydawn")
        if not Path("/usr/lib/chromium/vk_swiftshader_icd.json").is_file() and os.environ.get("PIPELINE_REQUIRE_GPU") != "1":
            pytest.skip("no SwiftShader for Dawn")
    script = tmp_path / "loop.py"
    script.write_text(_INTERRUPTED_LOOP)
    env = {**os.environ, "PIPELINE_WEBGPU": implementation, "PYTHONUNBUFFERED": "1"}
    # A test run started in the background inherits SIGINT ignored, and so would the loop
    # (Python then installs no handler): it starts with the default, as from a terminal.
    process = subprocess.Popen([sys.executable, str(script), str(rows), "4096", "3"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()
    try:
        _expect(lines, "ready", 120, "the start")
        for k in range(3):
            time.sleep(random.uniform(0.1, 0.5))
            process.send_signal(signal.SIGINT)
            _expect(lines, "interrupted", 60, f"SIGINT {k + 1}")
        _expect(lines, "checked", 60, "the check after the interrupts")
        time.sleep(random.uniform(0.1, 0.5))
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code in (-signal.SIGINT, 130), f"status {code}: {''.join(errors)[-2000:]}"
    assert "KeyboardInterrupt" in "".join(errors)


def test_interrupt_caught_in_the_map_callback_is_raised_and_the_device_stays_usable(gpu_info, monkeypatch):
    from pipeline.runtime import device

    monkeypatch.setenv(device.IMPLEMENTATION_ENV, "wgpu")
    impl = device.gpu().impl
    x = torch.randn(64, 256)
    want = pipeline.layer_norm(x, [256])[0]
    # What the callback's error handler keeps when a signal is handled inside the callback.
    impl._caught.append(KeyboardInterrupt("inside the callback"))
    with pytest.raises(KeyboardInterrupt, match="inside the callback"):
        pipeline.layer_norm(x, [256])
    assert torch.equal(pipeline.layer_norm(x, [256])[0], want)


# Defect 1: the bytes hashed are the bytes run


class TwoNorms(nn.Module):
    """The exported model: a Linear and two LayerNorms."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.norm_2 = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm_2(self.norm(self.linear(x)) * 3)


class OneNorm(nn.Module):
    """What replaces the file: the same signature, one LayerNorm, other outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.linear(x)) * 7


@pytest.fixture(scope="module")
def swapped_files(gpu_info, tmp_path_factory):
    """(spec, exported .pte bytes, other .pte bytes): the file a command is given, with its
    coverage file, and a file of another model with the same inputs."""
    torch.manual_seed(0)
    spec = types.SimpleNamespace(name="twonorms", variant="small", module=TwoNorms().eval(),
                                 example_inputs=(torch.randn(4, 16),), dynamic_shapes=None, checkpoint=None)
    out = tmp_path_factory.mktemp("swap")
    pipeline.lower(spec.module, spec.example_inputs).save(out / "exported.pte")
    pipeline.lower(OneNorm().eval(), spec.example_inputs).save(out / "other.pte")
    return spec, (out / "exported.pte").read_bytes(), (out / "other.pte").read_bytes()


def _swap_while_building(monkeypatch, tmp_path, swapped_files) -> Path:
    """A .pte and its coverage file in tmp_path; building its model (the step between the
    hash check and the load) replaces the .pte with another program."""
    import pipeline.evaluation.artifact

    spec, exported, other = swapped_files
    pte = tmp_path / "twonorms-small.pte"
    pte.write_bytes(exported)
    (tmp_path / "twonorms-small.coverage.json").write_text(json.dumps(
        {"model": "twonorms", "variant": "small", "seed": 0, "cpu_backend": "portable",
         "pte_sha256": hashlib.sha256(exported).hexdigest()}))

    def build(summary, audio=None):
        replacement = tmp_path / "replacement.pte"
        replacement.write_bytes(other)
        os.replace(replacement, pte)
        return spec

    monkeypatch.setattr(pipeline.evaluation.artifact, "build_for_artifact", build)
    return pte


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_run_pte_runs_the_bytes_it_hashed(native, monkeypatch, tmp_path, swapped_files, runtime):
    from pipeline.evaluation.artifact import run_artifact

    pte = _swap_while_building(monkeypatch, tmp_path, swapped_files)
    result = run_artifact(pte, runtime=runtime, repeats=1)
    assert pte.read_bytes() == swapped_files[2], "the file was not replaced: the test tests nothing"
    assert result["max_abs_vs_eager"] < 1e-4, "the replaced file ran, not the one whose hash was checked"
    if runtime == "python":
        assert result["passed"]
    else:  # the verdict's ratios are noise on so small a model: its errors and calls say which file ran
        verdict = result["executorch_verdict"]
        assert verdict["file_vs_fp64"]["max_abs"] < 1e-4 and len(verdict["layer_norms"]) == 2


@pytest.mark.parametrize("kind, runtime", [("coverage", "python"), ("accuracy", "python"),
                                           ("accuracy", "executorch")])
def test_reports_on_a_file_run_the_bytes_they_hashed(native, monkeypatch, tmp_path, swapped_files, kind, runtime):
    from pipeline.evaluation import runner

    pte = _swap_while_building(monkeypatch, tmp_path, swapped_files)
    status = runner.run_reports(kind, None, output_dir=tmp_path / "reports", pte=pte, runtime=runtime,
                                progress=lambda line: None)
    assert pte.read_bytes() == swapped_files[2], "the file was not replaced: the test tests nothing"
    stem = f"twonorms-small.pte.{'executorch.' if runtime == 'executorch' else ''}{kind}"
    data = json.loads((tmp_path / "reports" / f"{stem}.json").read_text())
    assert data["program"]["pte_sha256"] == hashlib.sha256(swapped_files[1]).hexdigest()
    if runtime == "executorch":  # as in run_pte: its errors and calls say which file ran
        verdict = data["accuracy"]
        assert verdict["file_vs_fp64"]["max_abs"] < 1e-4 and len(verdict["layer_norms"]) == 2, \
            "the replaced file ran, not the one whose hash was checked"
        return
    assert status == 0, f"the verdict failed: the replaced file ran ({data.get('verdict')})"
    if kind == "coverage":
        assert data["coverage"]["delegated"] == 2
