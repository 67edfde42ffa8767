"""group_norm reframe: GroupNorm as a LayerNorm over each group, so the LayerNorm kernel runs it.

GroupNorm(G) over x of shape (N, C, *spatial) normalizes each of the N*G groups of
C/G * prod(spatial) values. That is a LayerNorm without affine over the last dim of
x viewed as (N, G, C/G * HxW); the per-channel affine follows as a broadcast mul/add.

A half (float16/bfloat16) x keeps its dtype through the LayerNorm; the affine then runs
in float32 and is rounded back once, so the output is rounded twice (LayerNorm, affine)
where aten's GroupNorm rounds once. With float32 weight and bias (aten's mixed case)
mean and rstd come back as float32, as aten returns them; they hold the LayerNorm's half
values then.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from pipeline.errors import ArgumentError

aten = torch.ops.aten


def native_group_norm_as_layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    N: int,
    C: int,
    HxW: int,
    group: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_group_norm via aten.native_layer_norm; mean and rstd keep their (N, G) shape."""
    group_width = C // group * HxW
    rows = aten.reshape.default(x, [N, group, group_width])
    out, mean, rstd = aten.native_layer_norm.default(rows, [group_width], None, None, eps)
    out = aten.reshape.default(out, list(x.shape))
    # Per-channel affine: (C,) broadcast over the spatial dims of (N, C, *spatial); in
    # float32 for a half x, rounded back once.
    channel_shape = [C] + [1] * (x.dim() - 2)
    half = x.dtype in (torch.float16, torch.bfloat16) and (weight is not None or bias is not None)
    if half:
        out = aten._to_copy.default(out, dtype=torch.float32)
    for t, op in ((weight, aten.mul.Tensor), (bias, aten.add.Tensor)):
        if t is not None:
            t = aten._to_copy.default(t, dtype=torch.float32) if half and t.dtype != torch.float32 else t
            out = op(out, aten.reshape.default(t, channel_shape))
    if half:
        out = aten._to_copy.default(out, dtype=x.dtype)
    stats_dtype = next((t.dtype for t in (weight, bias) if t is not None), x.dtype)
    if stats_dtype != mean.dtype:
        mean = aten._to_copy.default(mean, dtype=stats_dtype)
        rstd = aten._to_copy.default(rstd, dtype=stats_dtype)
    return out, aten.reshape.default(mean, [N, group]), aten.reshape.default(rstd, [N, group])


def group_norm_as_layer_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> torch.Tensor:
    """aten.group_norm (what torch.export keeps for nn.GroupNorm) via the LayerNorm reframe."""
    # What aten refuses here with RuntimeError (export refuses it first).
    if x.dim() < 2:
        raise ArgumentError(f"group_norm input must have at least 2 dims (N, C, ...), got {list(x.shape)}")
    N, C = x.shape[0], x.shape[1]
    if C % num_groups:
        raise ArgumentError(f"group_norm channels {C} are not divisible by num_groups {num_groups}")
    HxW = 1
    for d in x.shape[2:]:
        HxW = HxW * d
    return native_group_norm_as_layer_norm(x, weight, bias, N, C, HxW, num_groups, eps)[0]


GROUP_NORM_DECOMPOSITIONS = {
    aten.group_norm.default: group_norm_as_layer_norm,
    aten.native_group_norm.default: native_group_norm_as_layer_norm,
}


def reframe_group_norm(ep: ExportedProgram) -> ExportedProgram:
    """Rewrite every group norm of `ep` as view -> native_layer_norm (no affine) -> view -> affine.

    Uses the exporter's own decomposition mechanism with a table holding only the group
    norm entries, so every other op of the program is left as it was.
    """
    # Re-tracing is the costly part of lowering small models; skip it when there is nothing to do.
    if not any(n.op == "call_function" and n.target in GROUP_NORM_DECOMPOSITIONS for n in ep.graph.nodes):
        return ep
    return ep.run_decompositions(GROUP_NORM_DECOMPOSITIONS)
