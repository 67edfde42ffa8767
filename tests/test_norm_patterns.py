"""match_norms: every form export gives an RMSNorm or a hand-written LayerNorm becomes one
norm op computing the same function; near misses are left alone and reported; coverage
counts norms by kind."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.cohere.modeling_cohere import CohereLayerNorm
from transformers.models.deberta.modeling_deberta import DebertaLayerNorm
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextUnweightedRMSNorm
from transformers.models.hy_v4.modeling_hy_v4 import HYV4UnweightedRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

from pipeline.aot.lowering import lower_to_edge
from pipeline.aot.passes import HAND_WRITTEN, KIND_KEY, RMS_NORM, match_norms
from pipeline.models.hf import from_config

aten = torch.ops.aten
WIDTH = 16
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


class FunctionalRMSNorm(nn.Module):
    def forward(self, x):
        return F.rms_norm(x, [WIDTH])


class FusedRMSNorm(nn.Module):
    """aten._fused_rms_norm, as CUDA and MPS export F.rms_norm, its rstd used too."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x):
        out, rstd = aten._fused_rms_norm.default(x, [WIDTH], self.weight, 1e-6)
        return out, rstd


class VarLayerNorm(nn.Module):
    """LayerNorm by torch.var (biased) and 1 / sqrt, with weight and bias."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))
        self.bias = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5) * self.weight + self.bias


class MomentsLayerNorm(nn.Module):
    """LayerNorm with the variance as mean(x^2) - mean(x)^2, over the last two dims, no affine."""

    def forward(self, x):
        mean = x.mean((-2, -1), keepdim=True)
        var = (x * x).mean((-2, -1), keepdim=True) - mean.pow(2)
        return (x - mean) * torch.rsqrt(var + 1e-5)


def _seeded(module: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


FORMS = {
    # name: (module factory, kind, norm op the pass leaves)
    "nn.RMSNorm": (lambda: nn.RMSNorm(WIDTH, eps=1e-6), RMS_NORM, aten.rms_norm.default),
    "F.rms_norm": (FunctionalRMSNorm, RMS_NORM, aten.rms_norm.default),
    "_fused_rms_norm": (FusedRMSNorm, RMS_NORM, aten.rms_norm.default),
    "LlamaRMSNorm": (lambda: LlamaRMSNorm(WIDTH, eps=1e-6), RMS_NORM, aten.rms_norm.default),
    "GemmaRMSNorm": (lambda: GemmaRMSNorm(WIDTH, eps=1e-6), RMS_NORM, aten.rms_norm.default),
    "T5LayerNorm": (lambda: T5LayerNorm(WIDTH, eps=1e-6), RMS_NORM, aten.rms_norm.default),
    "Olmo2RMSNorm": (lambda: Olmo2RMSNorm(WIDTH, eps=1e-6), RMS_NORM, aten.rms_norm.default),
    # x * rsqrt(...).to(x.dtype): the factor cast, not the normalized value
    "Glm5NextTextUnweightedRMSNorm": (lambda: Glm5NextTextUnweightedRMSNorm(eps=1e-6), RMS_NORM,
                                      aten.rms_norm.default),
    "CohereLayerNorm": (lambda: CohereLayerNorm(WIDTH, eps=1e-5), HAND_WRITTEN, aten.native_layer_norm.default),
    "DebertaLayerNorm": (lambda: DebertaLayerNorm(WIDTH, eps=1e-7), HAND_WRITTEN, aten.native_layer_norm.default),
    "var LayerNorm": (VarLayerNorm, HAND_WRITTEN, aten.native_layer_norm.default),
    "moments LayerNorm": (MomentsLayerNorm, HAND_WRITTEN, aten.native_layer_norm.default),
}
# Forms that compute in their input's dtype: eager in half is less accurate than the op,
# which computes in float32; held against eager float32, rounded.
IN_INPUT_DTYPE = {"var LayerNorm", "moments LayerNorm"}
STATS = {aten.rsqrt.default, aten.sqrt.default, aten.mean.dim, aten.var.correction, aten.pow.Tensor_Scalar}


def _export(module: nn.Module, x: torch.Tensor):
    return torch.export.export(module, (x,))


def _calls(ep, targets) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target in targets]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", list(FORMS))
def test_form_becomes_one_norm_op(form, dtype):
    make, kind, op = FORMS[form]
    module = _seeded(make()).to(dtype).eval()
    x = torch.randn(2, 5, WIDTH, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = module(x)
    if form in IN_INPUT_DTYPE:
        expected = copy.deepcopy(module).float()(x.float()).to(dtype)
    ep, found = match_norms(_export(module, x))
    norms = _calls(ep, {op})
    assert len(norms) == 1 and norms[0].meta[KIND_KEY] == kind
    assert list(found.made.values()) == [kind] and found.left == []
    if form != "_fused_rms_norm":  # whose rstd, an output here, is computed beside the op
        assert not _calls(ep, STATS)
    x_arg, eps = norms[0].args[0], norms[0].args[-1]
    assert x_arg.meta["val"].dtype == dtype and isinstance(eps, float)  # the input before its upcast
    got = ep.module()(x)
    # The op rounds a half result once where a chain may round twice: one unit in the last place.
    tol = torch.finfo(dtype).eps * (8 if dtype == torch.float32 else 1)
    for g, e in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, expected))):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=tol, atol=tol)


class ScaledLinear(nn.Module):
    """HY-V4's hyper-connection mix: a linear of the rows scaled by their 1 / rms."""

    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.mix = nn.Linear(WIDTH, 6, bias=bias)
        self.input_norm = HYV4UnweightedRMSNorm(eps=1e-6)

    def forward(self, x):
        return self.mix(x) * self.input_norm(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rsqrt_scaling_a_linear_becomes_a_norm_before_it(dtype):
    module = _seeded(ScaledLinear()).to(dtype).eval()
    x = torch.randn(2, 5, WIDTH, generator=torch.Generator().manual_seed(1)).to(dtype)
    ep, found = match_norms(_export(module, x))
    [norm] = _calls(ep, {aten.rms_norm.default})
    assert list(found.made.values()) == [RMS_NORM] and found.left == [] and not _calls(ep, STATS)
    [linear] = _calls(ep, {aten.linear.default})
    assert linear.args[0] is norm and norm.args[0].meta["val"].dtype == dtype and norm.args[2] is None
    # The same function up to rounding: against float64, within 2x eager's error.
    exact = copy.deepcopy(module).double()(x.double())
    got, eager = ep.module()(x), module(x)
    assert got.dtype == eager.dtype == dtype
    err = lambda t: (t.double() - exact).abs().max().item()  # noqa: E731
    assert err(got) <= 2 * err(eager) + torch.finfo(dtype).eps


class EpsOutside(nn.Module):
    def forward(self, x):
        return x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + 1e-6)


class MeanOverOtherDim(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)


class SharedIntermediate(nn.Module):
    def forward(self, x):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * rstd, rstd


class UnbiasedVariance(nn.Module):
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5)


class OtherInput(nn.Module):
    def forward(self, x, y):
        return y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


NEAR_MISSES = {
    "eps outside the rsqrt": (EpsOutside, "eps is not added"),
    "mean over dim 1 of 3": (MeanOverOtherDim, "not the trailing ones"),
    "an intermediate reused": (SharedIntermediate, "also used by"),
    "unbiased variance": (UnbiasedVariance, "unbiased"),
    "another tensor scaled": (OtherInput, "not the x of its statistics"),
    "a linear with a bias scaled": (lambda: ScaledLinear(bias=True), "not the x of its statistics"),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_near_miss_is_left_and_reported(case):
    make, words = NEAR_MISSES[case]
    module = make()
    inputs = tuple(torch.randn(2, 5, WIDTH, generator=torch.Generator().manual_seed(i)) for i in range(2))
    inputs = inputs[:1] if case != "another tensor scaled" else inputs
    ep = torch.export.export(module, inputs)
    before = [n.target for n in ep.graph.nodes]
    ep, found = match_norms(ep)
    assert found.made == {} and [n.target for n in ep.graph.nodes] == before
    [(node, reason)] = found.near_misses
    assert node.startswith("rsqrt") and words in reason


class PlainRMSNorm(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_match_the_kernel_cannot_run_is_left_with_its_reason():
    module = PlainRMSNorm()
    ep, found = match_norms(_export(module, torch.randn(2, WIDTH, dtype=torch.float64)))
    assert found.made == {} and not _calls(ep, {aten.rms_norm.default})
    [(_, reason)] = found.near_misses
    assert "float64" in reason


def _tiny_llama(dtype: str = "float32"):
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    return from_config(config, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_llama_coverage_counts_its_rms_norms(dtype):
    spec = _tiny_llama(dtype)
    _, coverage = lower_to_edge(spec.module, spec.example_inputs)
    layers = spec.config.num_hidden_layers
    assert coverage.kinds == {RMS_NORM: {"total": 2 * layers + 1, "delegated": 2 * layers + 1}}
    assert coverage.complete and coverage.total == 2 * layers + 1
    assert coverage.kinds_line() == f"RMSNorm {2 * layers + 1}/{2 * layers + 1}"


def test_rms_norm_the_kernel_cannot_run_is_counted_not_delegated():
    module = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.RMSNorm(WIDTH), nn.LayerNorm(WIDTH)).double()
    _, coverage = lower_to_edge(module, (torch.randn(2, WIDTH, dtype=torch.float64),))
    assert coverage.kinds == {"LayerNorm": {"total": 1, "delegated": 0}, RMS_NORM: {"total": 1, "delegated": 0}}
    assert (coverage.total, coverage.delegated, coverage.complete) == (2, 0, False)
    assert all("float64" in reason for _, reason in coverage.not_delegated) and len(coverage.not_delegated) == 2


def test_near_miss_counts_against_coverage():
    module = nn.Sequential(nn.Linear(WIDTH, WIDTH), EpsOutside(), CohereLayerNorm(WIDTH))
    _, coverage = lower_to_edge(module, (torch.randn(2, WIDTH),))
    assert coverage.kinds == {RMS_NORM: {"total": 1, "delegated": 0}, HAND_WRITTEN: {"total": 1, "delegated": 1}}
    [(node, reason)] = coverage.not_delegated
    assert not coverage.complete and "eps is not added" in reason
