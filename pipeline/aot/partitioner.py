"""LayerNormPartitioner: one WebGPU partition per norm the kernel can run: each
native_layer_norm, and each rms_norm, which it keeps from decomposing on the way to the edge
program (`ops_to_not_decompose`)."""

from __future__ import annotations

import logging
import math
import operator

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from pipeline.aot.preprocess import WebGPUBackend
from pipeline.aot.preprocess import NORM_OPS, norm_args
from pipeline.wgsl import DTYPES

logger = logging.getLogger(__name__)

# WebGPU's guaranteed maxStorageBufferBindingSize: one row must fit in one binding on any adapter.
MAX_ROW_BYTES = 128 * 1024 * 1024
TAG_PREFIX = "webgpu_layer_norm_"
KERNEL_DTYPES = tuple(getattr(torch, name) for name in DTYPES)
# aten's RMSNorm as export gives it (F.rms_norm, nn.RMSNorm, and the chains the norm pass
# matches): kept whole for the partitioner where the kernel runs it.
ATEN_RMS_NORM = torch.ops.aten.rms_norm.default


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why the WGSL kernel cannot run this norm node (native_layer_norm or rms_norm), or None
    when it can."""
    x, shape, weight, bias, eps = norm_args(node)
    x_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(x_val, torch.Tensor):
        return "input has no tensor metadata"
    if x_val.dtype not in KERNEL_DTYPES:
        return f"input dtype {x_val.dtype}; the kernel takes float32, float16 and bfloat16"
    if not isinstance(shape, (list, tuple)) or not shape:
        return f"normalized_shape {shape!r} is not a non-empty list"
    static = all(type(d) is int for d in shape)
    # A dynamic normalized dim is read from the input at run time; weight and bias would need
    # that length fixed (a reframed GroupNorm has neither).
    if not static and (weight is not None or bias is not None):
        return f"normalized_shape {list(shape)} is not static and the LayerNorm has weight or bias"
    if static and any(d < 1 for d in shape):
        return f"normalized_shape {list(shape)} has non-positive dims"
    # Symbolic dims arrive as nodes computing a size; compare their expressions.
    dims = [str(d.meta.get("val")) if isinstance(d, torch.fx.Node) else str(d) for d in shape]
    if x_val.dim() < len(shape) or [str(d) for d in x_val.shape[x_val.dim() - len(shape):]] != dims:
        return f"normalized_shape {dims} does not match input shape {list(x_val.shape)}"
    if static and math.prod(shape) * 4 > MAX_ROW_BYTES:
        return f"a row of {math.prod(shape) * 4} bytes exceeds WebGPU's guaranteed binding size of {MAX_ROW_BYTES}"
    for role, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        val = t.meta.get("val") if isinstance(t, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            return f"{role} is not a tensor"
        # aten's rule, which the kernel follows: x's dtype, or float32 with a half x.
        if val.dtype not in (x_val.dtype, torch.float32):
            return f"{role} dtype {val.dtype} with input dtype {x_val.dtype}; the kernel takes x's dtype or float32"
        if tuple(val.shape) != tuple(shape):
            return f"{role} shape {list(val.shape)} differs from normalized_shape {list(shape)}"
    if weight is not None and bias is not None and weight.meta["val"].dtype != bias.meta["val"].dtype:
        return f"weight dtype {weight.meta['val'].dtype} differs from bias dtype {bias.meta['val'].dtype}"
    # Any number, as aten takes it (negative, inf and NaN included): the kernel gives what aten
    # gives, NaN where var + eps < 0.
    if not isinstance(eps, (int, float)):
        return f"eps {eps!r} is not a number"
    return None


class LayerNormPartitioner(Partitioner):
    """Tags every native_layer_norm and rms_norm the kernel supports for `WebGPUBackend`, one
    partition each.

    The LayerNorm's getitem outputs and its constant weight/bias (parameters, buffers or
    lifted constants used by no other node) join its partition, so the blob carries them.
    Refused LayerNorms are logged and kept in `rejected` as (node name, reason).
    """

    def __init__(self) -> None:
        self.delegation_spec = DelegationSpec(WebGPUBackend.__name__, [])
        self.rejected: list[tuple[str, str]] = []
        # RMSNorms the kernel cannot run, found before decomposition (where they are decomposed).
        self.rejected_rms: list[tuple[str, str]] = []
        super().__init__()

    def ops_to_not_decompose(self, ep: ExportedProgram):
        """aten.rms_norm, kept whole where the kernel runs it (each one kept must be tagged,
        which `partition` does); the others decompose for the CPU, their reasons in
        `rejected_rms`."""
        self.rejected_rms = []

        def keep(node: torch.fx.Node) -> bool:
            if node.op != "call_function" or node.target != ATEN_RMS_NORM:
                return False
            reason = unsupported_reason(node)
            if reason is not None:
                logger.warning("RMSNorm %s not delegated to WebGPU: %s", node.name, reason)
                self.rejected_rms.append((node.name, reason))
            return reason is None

        return [ATEN_RMS_NORM], keep

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag `exported_program` (an edge program) in place; `rejected` lists what was refused."""
        self.rejected = list(self.rejected_rms)
        tags: dict[str, DelegationSpec] = {}
        for node in exported_program.graph.nodes:
            if node.op != "call_function" or node.target not in NORM_OPS:
                continue
            reason = unsupported_reason(node)
            if reason is not None:
                logger.warning("%s %s not delegated to WebGPU: %s", NORM_OPS[node.target], node.name, reason)
                self.rejected.append((node.name, reason))
                continue
            tag = f"{TAG_PREFIX}{len(tags)}"
            tags[tag] = self.delegation_spec
            node.meta["delegation_tag"] = tag
            for user in node.users:
                if user.target is operator.getitem:
                    user.meta["delegation_tag"] = tag
            _tag_constants(exported_program, node, tag)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


def _tag_constants(exported_program: ExportedProgram, node: torch.fx.Node, tag: str) -> None:
    """Put weight/bias constants used only by `node` into its partition."""
    sig = exported_program.graph_signature
    kinds = {spec.arg.name: spec.kind for spec in sig.input_specs}
    mutated = set(sig.buffers_to_mutate.values())
    constant_kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    _, _, weight, bias, _ = norm_args(node)
    for t in (weight, bias):
        if (
            isinstance(t, torch.fx.Node)
            and t.op == "placeholder"
            and kinds.get(t.name) in constant_kinds
            and sig.inputs_to_buffers.get(t.name) not in mutated
            and all(user is node for user in t.users)
        ):
            t.meta["delegation_tag"] = tag
