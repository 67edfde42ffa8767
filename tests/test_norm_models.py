"""Every norm of a transformer on the kernel: tiny llama, qwen2, gemma, phi3 and t5 (RMSNorms)
and cohere (hand-written LayerNorms) lowered with every norm delegated and run in our runtime
and in ExecuTorch's with the native backend; each RMSNorm form export gives a model in one
delegate of its own; the RMSNorm kernel on Dawn. Errors are held against float64 with eager
at the same dtype as the yardstick: at most twice eager's."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import pipeline
from pipeline import runtime
from pipeline.aot.passes import HAND_WRITTEN, RMS_NORM
from pipeline.blob import CONSTANT
from pipeline.evaluation import evaluate_accuracy, flatten_output
from pipeline.evaluation.executorch_verdict import layer_norm_identity
from pipeline.models.hf import from_config, tiny_config
from pipeline.native.trace import TracedProgram
from pipeline.pte.file import PteFile
from pipeline.runtime import device as runtime_device
from pipeline.runtime import launch
from support.gpu import REQUIRE_GPU_ENV, use_merge_path
from support.grids import full_grid

pytestmark = pytest.mark.usefixtures("gpu_info")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# model_type: (norm kind, norms in one layer's model, the delegates' op). A decoder layer has
# two RMSNorms, t5's encoder layer two and its decoder layer three; each stack one more at
# its end. Cohere's layer has one LayerNorm (attention and MLP in parallel).
MODELS = {
    "llama": (RMS_NORM, 3, "rms_norm"),
    "qwen2": (RMS_NORM, 3, "rms_norm"),
    "gemma": (RMS_NORM, 3, "rms_norm"),  # x * (1 + weight)
    "phi3": (RMS_NORM, 3, "rms_norm"),
    "t5": (RMS_NORM, 2 + 1 + 3 + 1, "rms_norm"),  # T5LayerNorm
    "cohere": (HAND_WRITTEN, 1 + 1, "native_layer_norm"),  # CohereLayerNorm: mean, variance, rsqrt
}
CASES = [(m, str(d)[6:]) for m in MODELS if m != "cohere" for d in DTYPES] + [("cohere", "float32")]
# One of each class: each RMSNorm form (llama's, which qwen2 and phi3 copy line for line;
# gemma's; t5's) in float32, where its casts are no-ops, and in a half dtype, where they are
# not; each half dtype on two forms; every model. Every case under `make test-kernel-full`.
KEPT = {("llama", "float32"), ("llama", "bfloat16"), ("qwen2", "float16"), ("phi3", "bfloat16"),
        ("gemma", "float32"), ("gemma", "float16"), ("t5", "float32"), ("t5", "bfloat16"), ("cohere", "float32")}
CASE_PARAMS = [pytest.param(m, d, id=f"{m}-{d}") for m, d in CASES if full_grid() or (m, d) in KEPT]


def _one_layer(model_type: str):
    """tiny_config's model (width 64, 4 heads, 512 tokens) with one layer, t5 one per stack:
    the fewest that hold every norm of a layer."""
    config = tiny_config(model_type)
    for key in ("num_hidden_layers", "num_layers", "num_decoder_layers"):
        if hasattr(config, key):
            setattr(config, key, 1)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:1]
    return config


def _assert_same_bits(got, want, what: str) -> None:
    """The tensors of `got` and `want` (nested outputs or lists) alike in dtype, shape and bits."""
    got, want = tree_leaves(got), tree_leaves(want)
    assert len(got) == len(want), f"{what}: {len(got)} tensors, {len(want)} expected"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: tensor {i} is {g.dtype} {list(g.shape)}"
        assert torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)), \
            f"{what}: tensor {i} differs"


@pytest.mark.parametrize("model_type, dtype", CASE_PARAMS)
def test_tiny_model_delegates_every_norm_in_both_runtimes(native_runtime, tmp_path, model_type, dtype):
    kind, norms, op = MODELS[model_type]
    spec = from_config(_one_layer(model_type), dtype=dtype)
    inputs = spec.example_inputs
    program = pipeline.lower(spec.module, inputs)
    assert program.coverage.kinds == {kind: {"total": norms, "delegated": norms}}, program.coverage
    assert program.coverage.complete and [d.params.op for d in program.delegates] == [op] * norms

    # Our runtime: inside eager's envelope; the saved file runs to the same bits.
    report = evaluate_accuracy(spec.module, inputs, program)
    assert report.passed, report.as_dict()["accuracy"]
    path = tmp_path / f"{model_type}-{dtype}.pte"
    program.save(path)
    calls = []  # copied: the program's planned memory is reused by later steps

    def record(name, args, out):
        calls.append(([t.clone() for t in args], [t.clone() for t in out]))

    loaded = pipeline.load(path)(*inputs, on_delegate=record)
    _assert_same_bits(loaded, report.outputs["delegated"], "pipeline.load")

    # ExecuTorch's runtime: every norm call gives our runtime's bits for the same inputs. Its
    # CPU kernels are not torch's (linears, softmax and SiLU round otherwise), so only the
    # first norm, after the embedding, sees the same inputs in both runtimes, and the whole
    # outputs are as accurate as those kernels make them (docs/design.md, accuracy in
    # ExecuTorch's runtime): finite here.
    with TracedProgram(path, capture=True) as traced:
        outputs = traced(*inputs)
        captured = traced.captured_calls()
    identity = layer_norm_identity(PteFile.read(path), captured)
    assert [row["identical"] for row in identity] == [True] * norms, identity
    first_args, first_out = calls[0]
    _assert_same_bits(captured[0], [*first_args, *first_out], "the first norm call across runtimes")
    assert torch.isfinite(flatten_output(outputs)).all()


# Each RMSNorm form in one delegate of its own

WIDTH = 24


class FunctionalRMSNorm(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, [WIDTH], self.weight, self.eps)


class NormsBetweenLinears(nn.Module):
    """F.rms_norm (aten.rms_norm), nn.RMSNorm, and LlamaRMSNorm (Hugging Face's chain and
    its casts), each between two Linears and told apart by its eps."""

    EPS = (1e-5, 1e-6, 1e-7)

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(WIDTH, WIDTH)
        functional, module, llama = self.EPS
        self.norms = nn.ModuleList([FunctionalRMSNorm(functional), nn.RMSNorm(WIDTH, eps=module),
                                    LlamaRMSNorm(WIDTH, eps=llama)])
        self.linears = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in self.norms)
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.normal_()

    def forward(self, x):
        x = self.first(x)
        outputs = []
        for norm, linear in zip(self.norms, self.linears):
            x = linear(norm(x))
            outputs.append(x)
        return tuple(outputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_rms_norm_form_is_one_delegate_between_cpu_ops(dtype):
    torch.manual_seed(0)
    module = NormsBetweenLinears().to(dtype).eval()
    x = (torch.randn(2, 5, WIDTH) * 3).to(dtype)
    program = pipeline.lower(module, (x,))
    assert program.coverage.kinds == {RMS_NORM: {"total": 3, "delegated": 3}} and program.coverage.complete
    assert [d.params.op for d in program.delegates] == ["rms_norm"] * 3
    assert [d.params.eps for d in program.delegates] == pytest.approx(NormsBetweenLinears.EPS, rel=1e-6)
    assert all(d.params.weight.source == CONSTANT for d in program.delegates)
    # One delegate per norm, a Linear on each side, no piece of a norm (its statistics, its
    # casts, its weight's multiply) left on the CPU.
    steps = program.step_labels
    between = " ".join(steps).split("delegate")
    assert len(between) == 4 and all("aten::addmm.out" in ops for ops in between), steps
    assert set(steps) <= {"delegate", "aten::addmm.out", "aten::view_copy.out"}, steps
    report = evaluate_accuracy(module, (x,), program)
    assert report.passed, report.as_dict()["accuracy"]


# The RMSNorm kernel on Dawn


@pytest.fixture
def dawn(monkeypatch) -> runtime_device.Gpu:
    """Dawn's device for the test (the process's default stays wgpu)."""
    monkeypatch.setenv(runtime_device.IMPLEMENTATION_ENV, "dawn")
    try:
        return runtime_device.gpu()
    except RuntimeError as exc:
        if os.environ.get(REQUIRE_GPU_ENV) == "1":
            raise
        pytest.skip(f"no Dawn adapter: {exc}")


def _hard_rows(width: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of spread 2 about 0.5, of 300 (squares past float16's range), constant -7.5,
    zero, and one holding a NaN."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(5, width, generator=gen)
    x[0] = x[0] * 2 + 0.5
    x[1] = x[1] * 3 + 300
    x[2] = -7.5
    x[3] = 0.0
    x[4, width // 2] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("path", ["subgroup", "workgroup"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_on_dawn(monkeypatch, dawn, dtype, path):
    if path == "subgroup" and not dawn.subgroup_size and os.environ.get(REQUIRE_GPU_ENV) == "1":
        pytest.fail(f"Dawn adapter {dawn.impl.info['adapter']!r} has no subgroups")
    use_merge_path(path, monkeypatch)
    before = runtime.stats()["dispatches"]
    # A row held by one thread (7, not a multiple of 4), by a subgroup, by several subgroups.
    for i, width in enumerate((7, 384, 1023)):
        x = _hard_rows(width, dtype)
        weight = torch.randn(width, generator=torch.Generator().manual_seed(1)).to(dtype) if i != 1 else None
        ours = launch.rms_norm(x, [width], weight, 1e-6)
        eager = torch.rms_norm(x, [width], weight, 1e-6)
        truth = torch.rms_norm(x.double(), [width], None if weight is None else weight.double(), 1e-6)
        assert ours.dtype == dtype and ours.shape == x.shape
        assert torch.isnan(ours[4]).all() and torch.isfinite(ours[:4]).all(), f"width {width}: NaN pattern"
        assert torch.equal(ours[3], torch.zeros(width, dtype=dtype)), f"width {width}: zero row"
        err = (ours[:4].double() - truth[:4]).abs().max().item()
        eager_err = (eager[:4].double() - truth[:4]).abs().max().item()
        assert err <= 2 * eager_err, f"width {width}: error {err:.3g} vs float64, eager {eager_err:.3g}"
    assert runtime.stats()["dispatches"] - before == 3
    assert runtime.device_info()["implementation"] == "dawn"
