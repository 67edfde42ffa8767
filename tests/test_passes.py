"""group_norm reframe: GroupNorm as view -> LayerNorm without affine -> view -> per-channel affine."""

import pytest
import torch
from torch import nn
from torch.export import Dim

from pipeline.passes import group_norm_as_layer_norm, native_group_norm_as_layer_norm, reframe_group_norm

aten = torch.ops.aten
CASES = [  # (N, C, spatial, G)
    (2, 6, (5, 7), 1),
    (2, 6, (5, 7), 6),
    (3, 9, (11,), 3),
    (1, 12, (3, 3, 2), 4),
    (2, 10, (), 5),
]


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


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
