"""group_norm reframe: GroupNorm as view -> LayerNorm without affine -> view -> per-channel affine."""

import pytest
import torch
from torch import nn
from torch.export import Dim

from pipeline.aot.passes import (
    contiguous_attention_views,
    group_norm_as_layer_norm,
    linears_over_rows,
    native_group_norm_as_layer_norm,
    reframe_group_norm,
)
from support.inputs import randn

aten = torch.ops.aten
CASES = [  # (N, C, spatial, G)
    (2, 6, (5, 7), 1),
    (2, 6, (5, 7), 6),
    (3, 9, (11,), 3),
    (1, 12, (3, 3, 2), 4),
    (2, 10, (), 5),
]


@pytest.mark.parametrize("n, c, spatial, groups", CASES)
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_native_group_norm_decomposition_matches_aten(n, c, spatial, groups, affine):
    x = randn(n, c, *spatial) * 2 + 0.5
    weight = randn(c, seed=1) if affine[0] else None
    bias = randn(c, seed=2) if affine[1] else None
    hxw = 1
    for d in spatial:
        hxw *= d
    got = native_group_norm_as_layer_norm(x, weight, bias, n, c, hxw, groups, 1e-5)
    want = aten.native_group_norm.default(x, weight, bias, n, c, hxw, groups, 1e-5)
    for name, g, w in zip(("out", "mean", "rstd"), got, want):
        assert g.shape == w.shape, f"{name}: {g.shape} vs {w.shape}"
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=name)
    assert got[1].shape == (n, groups)


def test_group_norm_decomposition_rejects_bad_groups():
    with pytest.raises(ValueError, match="not divisible"):
        group_norm_as_layer_norm(randn(2, 6, 4), 4)


def layer_norm_nodes(ep):
    return [n for n in ep.graph.nodes if n.target == aten.native_layer_norm.default]


@pytest.mark.parametrize("n, c, spatial, groups", CASES)
def test_reframe_rewrites_every_group_norm(n, c, spatial, groups):
    model = nn.Sequential(nn.GroupNorm(groups, c), nn.GroupNorm(1, c, affine=False)).eval()
    x = randn(n, c, *spatial)
    ep = reframe_group_norm(torch.export.export(model, (x,)))
    targets = {n.target for n in ep.graph.nodes}
    assert aten.group_norm.default not in targets and aten.native_group_norm.default not in targets
    norms = layer_norm_nodes(ep)
    assert len(norms) == 2
    group_width = c // groups
    for d in spatial:
        group_width *= d
    for node in norms:
        # No affine inside the LayerNorm: the per-channel affine is a separate mul/add.
        assert node.args[2] is None and node.args[3] is None
    assert norms[0].args[1] == [group_width]
    mul_add = [n.target for n in ep.graph.nodes if n.target in (aten.mul.Tensor, aten.add.Tensor)]
    assert mul_add == [aten.mul.Tensor, aten.add.Tensor]  # the first GroupNorm's affine only
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_reframe_keeps_programs_without_group_norm():
    ep = torch.export.export(nn.LayerNorm(8).eval(), (randn(2, 8),))
    assert reframe_group_norm(ep) is ep


def test_reframe_with_dynamic_batch():
    model = nn.GroupNorm(2, 6).eval()
    ep = reframe_group_norm(torch.export.export(model, (randn(2, 6, 5),), dynamic_shapes=({0: Dim("batch", max=8)},)))
    assert layer_norm_nodes(ep)[0].args[1] == [15]
    x = randn(5, 6, 5, seed=3)
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


# Linears over rows: rank >= 3 linear inputs become clone -> view(-1, K) -> 2-D linear -> view


class WindowAttention(nn.Module):
    """Florence-2's window attention in small: qkv, heads, fused attention, the
    `.transpose(1, 2).contiguous()` torch.export records as nothing, proj, then a LayerNorm."""

    def __init__(self, channels: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, 5)  # rank 2 below: stays as it is

    def forward(self, x):
        windows, tokens, channels = x.shape
        qkv = self.qkv(x).reshape(windows, tokens, 3, self.heads, channels // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3).transpose(1, 2).contiguous()
        y = self.norm(self.proj(attended.view(windows, tokens, channels)))
        return y, self.head(y[:, 0])


def linear_inputs(ep) -> list[int]:
    return [n.args[0].meta["val"].dim() for n in ep.graph.nodes if n.target == aten.linear.default]


def test_linears_over_rows_rewrites_rank_3_inputs_only():
    model = WindowAttention().eval()
    x = randn(8, 9, 32)
    ep = linears_over_rows(torch.export.export(model, (x,)))
    assert linear_inputs(ep) == [2, 2, 2]
    clones = [n for n in ep.graph.nodes if n.target == aten.clone.default]
    assert len(clones) == 2 and all(n.kwargs["memory_format"] == torch.contiguous_format for n in clones)
    for got, want in zip(ep.module()(x), model(x)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_linears_over_rows_keeps_programs_without_such_linears():
    ep = torch.export.export(nn.Linear(8, 4).eval(), (randn(3, 8),))
    before = [n.target for n in ep.graph.nodes]
    assert linears_over_rows(ep) is ep and [n.target for n in ep.graph.nodes] == before


def test_linears_over_rows_with_dynamic_leading_dims():
    model = nn.Sequential(nn.Linear(6, 4, bias=False), nn.GELU(), nn.Linear(4, 3)).eval()
    dims = {0: Dim("batch", max=8), 1: Dim("length", max=32)}
    ep = linears_over_rows(torch.export.export(model, (randn(2, 5, 6),), dynamic_shapes=(dims,)))
    assert linear_inputs(ep) == [2, 2]
    for shape in [(1, 1, 6), (7, 19, 6)]:
        x = randn(*shape, seed=4)
        torch.testing.assert_close(ep.module()(x), model(x), atol=1e-6, rtol=1e-6)


def test_linears_over_rows_lets_xnnpack_take_window_attention():
    """With our LayerNorm partitioner first, XNNPACK's ConvertToLinearPass fails on the
    window attention's proj (a 3-D weight); after the rewrite it lowers, every LayerNorm on
    WebGPU and the linears on XNNPACK."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from pipeline.aot.partitioner import LayerNormPartitioner

    model = WindowAttention().eval()
    x = randn(8, 9, 32)
    with pytest.raises(Exception, match="ConvertToLinearPass"):
        to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                    partitioner=[LayerNormPartitioner(), XnnpackPartitioner()])
    edge = to_edge_transform_and_lower(linears_over_rows(torch.export.export(model, (x,))),
                                       partitioner=[LayerNormPartitioner(), XnnpackPartitioner()])
    gm = edge.exported_program().graph_module
    backends = sorted(getattr(gm, n.target).backend_id for n in gm.graph.nodes
                      if n.op == "get_attr" and n.target.startswith("lowered_module"))
    assert "WebGPUBackend" in backends and "XnnpackBackend" in backends
    left = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("linear" in t or "addmm" in t or "native_layer_norm" in t for t in left), left


class _Gpt2(nn.Module):
    """GPT-2's base model, one tiny layer: its Conv1D flattens the attention's output with
    `x.view(-1, x.size(-1))`."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        torch.manual_seed(0)
        self.model = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).eval()

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


def test_contiguous_attention_views_let_gpt2_lower_at_batch_2():
    """ExecuTorch alone fails on GPT-2 at a batch above 1 (its decomposed attention leaves a
    view of a transposed tensor); with a copy before each view of the attention output it
    lowers, and the copies change no value. Where ExecuTorch stops failing, the pass can go."""
    from executorch.exir import to_edge_transform_and_lower

    import pipeline
    from pipeline.evaluation import evaluate_accuracy

    model = _Gpt2()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="Cannot view a tensor"):
        to_edge_transform_and_lower(torch.export.export(model, (ids,)))
    exported = contiguous_attention_views(torch.export.export(model, (ids,)))
    copies = [n for n in exported.graph.nodes if n.target is aten.clone.default]
    assert len(copies) == 1 and all(u.target is aten.view.default for c in copies for u in c.users)
    to_edge_transform_and_lower(exported)
    program = pipeline.lower(model, (ids,))
    assert program.coverage.complete and program.coverage.delegated == 3  # ln_1, ln_2, ln_f
    assert evaluate_accuracy(model, (ids,), program).passed


def test_contiguous_attention_views_keep_programs_whose_attention_is_not_viewed():
    class Attention(nn.Module):
        def forward(self, q):
            out = nn.functional.scaled_dot_product_attention(q, q, q)
            return out.transpose(1, 2).reshape(2, 8, -1) * 2.0

    exported = torch.export.export(Attention(), (randn(2, 4, 8, 16),))
    before = [str(n.target) for n in exported.graph.nodes]
    assert [str(n.target) for n in contiguous_attention_views(exported).graph.nodes] == before
