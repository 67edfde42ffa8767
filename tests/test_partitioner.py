"""LayerNormPartitioner: one partition per supported LayerNorm, reasons for every refusal."""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from pipeline.aot.preprocess import NATIVE_LAYER_NORM
from pipeline.aot.partitioner import TAG_PREFIX, LayerNormPartitioner
from pipeline.aot.passes import reframe_group_norm


def edge_program(module, inputs, dynamic_shapes=None):
    from executorch.exir import to_edge

    ep = reframe_group_norm(torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes))
    return to_edge(ep).exported_program()


class Mixed(nn.Module):
    """Affine, weight-only, no-affine, group-norm and shared-parameter LayerNorms."""

    def __init__(self) -> None:
        super().__init__()
        self.affine = nn.LayerNorm(8)
        self.weight_only = nn.LayerNorm(8, bias=False)
        self.plain = nn.LayerNorm(8, elementwise_affine=False)
        self.group = nn.GroupNorm(2, 4)
        self.shared = nn.Parameter(torch.ones(8))

    def forward(self, x):
        y = self.plain(self.weight_only(self.affine(x)))
        y = F.layer_norm(F.layer_norm(y, (8,), self.shared), (8,), self.shared)
        return self.group(y.view(2, 4, 2, 4))


def test_one_partition_per_layer_norm_with_its_outputs_and_constants():
    program = edge_program(Mixed(), (torch.randn(2, 4, 8),))
    partitioner = LayerNormPartitioner()
    result = partitioner.partition(program)
    norms = [n for n in program.graph.nodes if n.target == NATIVE_LAYER_NORM]
    assert len(norms) == 6 and partitioner.rejected == []
    tags = [n.meta["delegation_tag"] for n in norms]
    assert sorted(tags) == sorted(result.partition_tags) and len(set(tags)) == 6
    assert all(t.startswith(TAG_PREFIX) for t in tags)
    assert {spec.backend_id for spec in result.partition_tags.values()} == {"WebGPUBackend"}
    for norm in norms:
        assert all(u.meta.get("delegation_tag") == norm.meta["delegation_tag"] for u in norm.users)
    tagged = {n.name for n in program.graph.nodes if n.op == "placeholder" and "delegation_tag" in n.meta}
    # Constants used by one LayerNorm travel in its blob; the shared one and the
    # group norm's (used by the mul/add, not the LayerNorm) stay outside.
    assert tagged == {"p_affine_weight", "p_affine_bias", "p_weight_only_weight"}


@pytest.mark.parametrize("dtype, reason", [(torch.float64, "input dtype torch.float64")])
def test_layer_norms_of_other_dtypes_are_refused_with_a_reason(dtype, reason, caplog):
    model = nn.LayerNorm(8).to(dtype)
    program = edge_program(model, (torch.randn(3, 8, dtype=dtype),))
    partitioner = LayerNormPartitioner()
    with caplog.at_level(logging.WARNING, logger="pipeline.aot.partitioner"):
        result = partitioner.partition(program)
    assert result.partition_tags == {}
    assert not any("delegation_tag" in n.meta for n in program.graph.nodes)
    [(name, why)] = partitioner.rejected
    assert reason in why and name in caplog.text and why in caplog.text


# Every eps aten computes with: negative (NaN where var + eps < 0), zero of either sign,
# subnormal, infinite (rstd 0), NaN, past float32's range.
EPS_ATEN_TAKES = [-0.5, -1e30, 0.0, -0.0, 5e-324, 1e-5, float("inf"), float("-inf"), float("nan"), 1e300, 2]


def test_every_eps_aten_takes_is_taken():
    class EveryEps(nn.Module):
        def forward(self, x, w):
            outs = [F.layer_norm(x, (8,), w, None, eps) for eps in EPS_ATEN_TAKES]
            return outs + [F.group_norm(x.view(2, 4, 2, 4), 2, eps=eps) for eps in EPS_ATEN_TAKES]

    program = edge_program(EveryEps(), (torch.randn(2, 4, 8), torch.randn(8)))
    partitioner = LayerNormPartitioner()
    result = partitioner.partition(program)
    assert partitioner.rejected == [] and len(result.partition_tags) == 2 * len(EPS_ATEN_TAKES)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_norms_are_taken(dtype):
    # aten's mixed case (half x, float32 weight and bias) never gets here: the edge
    # dialect's verifier refuses operators with mismatched input dtypes.
    model = nn.LayerNorm(8).to(dtype)
    program = edge_program(model, (torch.randn(3, 8, dtype=dtype),))
    partitioner = LayerNormPartitioner()
    result = partitioner.partition(program)
    assert len(result.partition_tags) == 1 and partitioner.rejected == []


def test_dynamic_normalized_shape_is_taken_without_affine_only():
    # GroupNorm over a dynamic length normalizes rows whose width is only known at run time;
    # the reframed LayerNorm has no weight or bias, so the runtime can read the width.
    program = edge_program(nn.GroupNorm(2, 4), (torch.randn(2, 4, 6),), dynamic_shapes=({2: Dim("length", min=2, max=32)},))
    partitioner = LayerNormPartitioner()
    assert len(partitioner.partition(program).partition_tags) == 1 and partitioner.rejected == []

    class AffineOverDynamic(nn.Module):
        def forward(self, x, w):
            return torch.native_layer_norm(x, [x.shape[-1]], w, None, 1e-5)[0]

    x, w = torch.randn(2, 6), torch.randn(6)
    length = Dim("length", min=2, max=32)
    program = edge_program(AffineOverDynamic(), (x, w), dynamic_shapes=({1: length}, {0: length}))
    partitioner.partition(program)
    [(_, why)] = partitioner.rejected
    assert "not static and the LayerNorm has weight" in why


def test_rejections_reset_per_partition_call():
    partitioner = LayerNormPartitioner()
    partitioner.partition(edge_program(nn.LayerNorm(4).double(), (torch.randn(2, 4, dtype=torch.float64),)))
    partitioner.partition(edge_program(nn.LayerNorm(4), (torch.randn(2, 4),)))
    assert partitioner.rejected == []
