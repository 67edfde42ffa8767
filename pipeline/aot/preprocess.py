"""WebGPUBackend.preprocess: one norm's partition (a native_layer_norm or an rms_norm) -> a
`pipeline.blob` delegate blob."""

from __future__ import annotations

import operator

import numpy as np
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from pipeline import blob as blob_format

NATIVE_LAYER_NORM = exir_ops.edge.aten.native_layer_norm.default
# An RMSNorm reaches the edge program whole where the partitioner keeps it from decomposing.
RMS_NORM = exir_ops.edge.aten.rms_norm.default
# The blob's op of each norm the backend serializes.
NORM_OPS = {NATIVE_LAYER_NORM: "native_layer_norm", RMS_NORM: "rms_norm"}


class WebGPUBackend(BackendDetails):
    """Serializes a partition holding exactly one norm (native_layer_norm or rms_norm) for the WGSL kernel."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        """Return the blob; raises ValueError on any partition it cannot serialize exactly."""
        if compile_specs:
            raise ValueError(f"WebGPUBackend takes no compile specs, got {[s.key for s in compile_specs]}")
        return PreprocessResult(processed_bytes=blob_format.encode(describe_partition(edge_program)))


def describe_partition(edge_program: ExportedProgram) -> blob_format.DelegateBlob:
    """The blob contents for `edge_program`: its one norm, where each operand comes from."""
    graph = edge_program.graph
    norms = [n for n in graph.nodes if n.op == "call_function" and n.target in NORM_OPS]
    if len(norms) != 1:
        raise ValueError(f"WebGPUBackend partitions hold exactly one native_layer_norm or rms_norm, got {len(norms)}")
    norm = norms[0]
    op = NORM_OPS[norm.target]
    for node in graph.nodes:
        known = node.op in ("placeholder", "output") or node is norm or (
            node.op == "call_function" and node.target is operator.getitem and node.args[0] is norm
        )
        if not known:
            raise ValueError(f"WebGPUBackend cannot serialize node {node.name} ({node.op} {node.target})")

    # Delegate arguments are the partition's user inputs, in placeholder order.
    sig = edge_program.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    user_inputs = [n for n in graph.nodes if n.op == "placeholder" and kinds[n.name].kind == InputKind.USER_INPUT]
    arg_index = {n: i for i, n in enumerate(user_inputs)}

    x, shape, weight, bias, eps = norm_args(norm)
    if x not in arg_index:
        raise ValueError(f"{norm.name}: input {x.name} must be a runtime input of the partition")
    # Symbolic dims (a dynamic length) are read from the input at run time.
    shape = tuple(int(d) if isinstance(d, int) else blob_format.DYNAMIC for d in shape)

    dtype = _dtype_name(x, f"{norm.name} input")
    affine_dtype = dtype
    operands: dict[str, blob_format.Operand] = {}
    constants: dict[str, np.ndarray] = {}
    for role, node in (("weight", weight), ("bias", bias)):
        if node is not None:
            affine_dtype = _dtype_name(node, f"{norm.name} {role}")
        if node is None:
            operands[role] = blob_format.Operand()
        elif node in arg_index:
            operands[role] = blob_format.Operand(blob_format.INPUT, arg_index[node])
        elif node.op == "placeholder":
            constants[role] = _constant(edge_program, kinds[node.name], shape, f"{norm.name} {role}")
            operands[role] = blob_format.Operand(blob_format.CONSTANT)
        else:
            raise ValueError(f"{norm.name}: {role} {node.name} is neither an input nor a constant")

    outputs = []
    for out in graph.output_node().args[0]:
        if op == "rms_norm" and out is norm:
            outputs.append(0)
        elif isinstance(out, torch.fx.Node) and out.target is operator.getitem and out.args[0] is norm:
            outputs.append(int(out.args[1]))
        else:
            raise ValueError(f"{norm.name}: partition output {out} is not an output of the norm")
    params = blob_format.LayerNormParams(
        normalized_shape=shape,
        eps=float(eps),
        input_index=arg_index[x],
        weight=operands["weight"],
        bias=operands["bias"],
        outputs=tuple(outputs),
        arguments=len(user_inputs),
        dtype=dtype,
        affine_dtype=affine_dtype,
        op=op,
    )
    return blob_format.DelegateBlob(params, constants)


DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _dtype_name(node: torch.fx.Node, what: str) -> str:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype not in DTYPE_NAMES:
        raise ValueError(f"{what}: dtype {getattr(val, 'dtype', None)} is not float32, float16 or bfloat16")
    return DTYPE_NAMES[val.dtype]


def layer_norm_args(node: torch.fx.Node) -> tuple:
    """(x, normalized_shape, weight, bias, eps) of a native_layer_norm node, defaults filled in."""
    args = list(node.args) + [None] * (5 - len(node.args))
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    for i, name in enumerate(names):
        if name in node.kwargs:
            args[i] = node.kwargs[name]
    return tuple(args)


def norm_args(node: torch.fx.Node) -> tuple:
    """(x, normalized_shape, weight, bias, eps) of a native_layer_norm node, or of an
    rms_norm node (aten's or the edge's) with bias None and eps, where not given, aten's
    default: the machine epsilon of x's dtype."""
    if node.target not in (RMS_NORM, torch.ops.aten.rms_norm.default):
        return layer_norm_args(node)
    args = list(node.args) + [None] * (4 - len(node.args))
    for i, name in enumerate(("input", "normalized_shape", "weight", "eps")):
        if name in node.kwargs:
            args[i] = node.kwargs[name]
    x, shape, weight, eps = args
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if eps is None and isinstance(val, torch.Tensor) and val.is_floating_point():
        eps = torch.finfo(val.dtype).eps
    return x, shape, weight, None, eps


def _constant(edge_program: ExportedProgram, spec, shape: tuple[int, ...], what: str) -> np.ndarray:
    if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
        tensor = edge_program.state_dict.get(spec.target)
        if tensor is None:
            tensor = edge_program.constants.get(spec.target)
    elif spec.kind == InputKind.CONSTANT_TENSOR:
        tensor = edge_program.constants.get(spec.target)
    else:
        raise ValueError(f"{what}: input kind {spec.kind.name} cannot be carried in the blob")
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: no tensor stored for {spec.target}")
    if tensor.dtype not in DTYPE_NAMES or tuple(tensor.shape) != shape:
        raise ValueError(f"{what}: must be float32, float16 or bfloat16 {list(shape)}, "
                         f"got {tensor.dtype} {list(tensor.shape)}")
    tensor = tensor.detach().cpu().contiguous()
    # numpy has no bfloat16: the blob carries its bits.
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16).copy()
    return tensor.numpy().copy()
