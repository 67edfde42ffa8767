"""Find every LayerNorm in a lowered program: the ones left in the edge graph and the
ones inside each delegate.

A delegated LayerNorm lives in a LoweredBackendModule's `original_module` graph; the
edge graph holds an `executorch_call_delegate` node whose first argument is a
`get_attr` of that module (`lowered_module_N`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

DELEGATE_CALL = "executorch_call_delegate"


@dataclass
class LayerNormRecord:
    """One native_layer_norm op of the lowered program, in execution order."""

    module_path: str
    input_shape: list[int | str]
    row_width: int
    affine: str  # "weight+bias", "weight", "bias" or "none"
    origin: str  # "layer_norm" or "group_norm" (a reframed GroupNorm)
    eps: float
    delegated: bool
    reason: str  # why it is not delegated; "" when it is
    node: str  # the node's name in its graph
    delegate: str | None = None  # the lowered_module_N attribute that runs it
    # Where the op's output sits among the delegate's flattened outputs (None: not an output).
    delegate_output_index: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def is_layer_norm(node: torch.fx.Node) -> bool:
    """A call of aten.native_layer_norm.default, as an aten or an edge-dialect op."""
    return node.op == "call_function" and _op_name(node.target) == "aten::native_layer_norm"


def is_delegate_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") == DELEGATE_CALL


def _op_name(target) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name
    op = getattr(target, "_op", None)  # exir's EdgeOpOverload wraps the aten overload
    return op._schema.name if op is not None else ""


def layer_norm_records(
    graph_module: torch.fx.GraphModule, not_delegated: dict[str, str] | None = None
) -> list[LayerNormRecord]:
    """Every native_layer_norm of `graph_module` (an edge program's), delegated or not.

    `not_delegated` maps a node name to the reason the partitioner gave for leaving it
    out (the lowered program's `coverage.not_delegated`).
    """
    reasons = not_delegated or {}
    records: list[LayerNormRecord] = []
    for node in graph_module.graph.nodes:
        if is_layer_norm(node):
            reason = reasons.get(node.name, "left in the edge graph (no reason recorded)")
            records.append(_record(node, delegated=False, reason=reason))
        elif node.op == "get_attr" and _is_subgraph(getattr(graph_module, node.target, None)):
            # A control-flow subgraph (torch.cond branch): its LayerNorms are not delegated.
            inner = {name.split(" (in ")[0]: reason for name, reason in reasons.items()
                     if name.endswith(f" (in {node.target})")}
            records.extend(layer_norm_records(getattr(graph_module, node.target), inner))
        elif is_delegate_call(node):
            name = node.args[0].target
            lowered = getattr(graph_module, name)
            records.extend(delegated_records(name, lowered.original_module.graph_module))
    return records


def _is_subgraph(module) -> bool:
    # A delegate (LoweredBackendModule, which has a backend_id) is not a control-flow subgraph.
    return isinstance(module, torch.fx.GraphModule) and not hasattr(module, "backend_id")


def delegated_records(delegate: str, graph_module: torch.fx.GraphModule) -> list[LayerNormRecord]:
    """The LayerNorms inside one delegate's original graph, with their output positions."""
    positions = _output_leaf_positions(graph_module)
    records = []
    for node in graph_module.graph.nodes:
        if is_layer_norm(node):
            rec = _record(node, delegated=True, reason="")
            rec.delegate = delegate
            rec.delegate_output_index = positions.get(node.name)
            records.append(rec)
    return records


def _output_leaf_positions(graph_module: torch.fx.GraphModule) -> dict[str, int]:
    """Map a LayerNorm node name to the flat index of its normalized output among the graph's outputs.

    A LayerNorm node returned whole contributes three leaves (out, mean, rstd); a
    `getitem(ln, 0)` contributes one.
    """
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    values = output.args[0]
    values = values if isinstance(values, (list, tuple)) else [values]
    positions: dict[str, int] = {}
    index = 0
    for value in values:
        if isinstance(value, torch.fx.Node) and is_layer_norm(value):
            positions.setdefault(value.name, index)
        elif (
            isinstance(value, torch.fx.Node)
            and value.op == "call_function"
            and value.target is operator.getitem
            and isinstance(value.args[0], torch.fx.Node)
            and is_layer_norm(value.args[0])
            and value.args[1] == 0
        ):
            positions.setdefault(value.args[0].name, index)
        index += _leaf_count(value)
    return positions


def _leaf_count(value) -> int:
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
    if isinstance(val, (list, tuple)):
        return sum(_leaf_count(v) for v in val)
    return 1


def file_records(program, calls: Sequence) -> list[LayerNormRecord]:
    """Every LayerNorm of a program loaded from a file (no edge graph), in execution order.

    A file does not name the modules its LayerNorms came from. The i-th LayerNorm of the
    file (RMSNorms aside, which eager runs as plain ops) is paired with the i-th
    eager call (`calls`, as NormCallRecorder saw them) when their shapes agree, and takes that
    call's module path and origin; otherwise it stays unattributed (module path "?").
    """
    reasons = dict(program.coverage.not_delegated)
    records = []
    pending = iter(calls)
    for site in program.layer_norm_sites:
        # Eager records LayerNorm and GroupNorm calls only: an RMSNorm takes none.
        call = None if site.rms else next(pending, None)
        if site.delegated:
            p = site.delegate.params
            affine = _affine(p.weight.source != "none", p.bias.source != "none")
            shape, eps = list(p.normalized_shape), p.eps
            position = p.outputs.index(0) if 0 in p.outputs else None
        else:
            affine, shape, eps, position = "?", [], math.nan, None
        if call is not None and not _fits(call, shape):
            call = None
        width = math.prod(shape) if shape and min(shape) > 0 else 0
        if call is not None and width == 0:
            width = _call_width(call, len(shape))
        records.append(LayerNormRecord(
            module_path=call.module_path if call is not None else "?",
            input_shape=list(call.input_shape) if call is not None else [],
            row_width=width,
            affine=affine,
            origin="rms_norm" if site.rms else call.op if call is not None else "layer_norm",
            eps=eps,
            delegated=site.delegated,
            reason=reasons.get(site.name, ""),
            node=site.name,
            delegate=site.name if site.delegated else None,
            delegate_output_index=position,
        ))
    return records


def _fits(call, normalized_shape: list[int]) -> bool:
    """Whether an eager call can be the LayerNorm with this normalized shape (-1: any size)."""
    if not normalized_shape:
        return True
    dims = list(call.input_shape)
    if call.op == "group_norm":  # (N, C, *): a group's row is 1/G of a sample's values
        return min(normalized_shape) < 0 or math.prod(dims[1:]) % math.prod(normalized_shape) == 0
    tail = dims[len(dims) - len(normalized_shape):]
    return len(tail) == len(normalized_shape) and all(d in (-1, t) for d, t in zip(normalized_shape, tail))


def _call_width(call, ndim: int) -> int:
    dims = list(call.input_shape)
    return math.prod(dims[len(dims) - ndim:]) if call.op == "layer_norm" else 0


def _affine(has_weight: bool, has_bias: bool) -> str:
    return {(True, True): "weight+bias", (True, False): "weight", (False, True): "bias"}.get(
        (has_weight, has_bias), "none")


def _record(node: torch.fx.Node, delegated: bool, reason: str) -> LayerNormRecord:
    x, shape, weight, bias, eps = (list(node.args) + [None] * 5)[:5]
    input_shape = [_dim(d) for d in x.meta["val"].shape]
    return LayerNormRecord(
        module_path=module_path(node),
        input_shape=input_shape,
        row_width=math.prod(int(d) for d in shape),
        affine=_affine(weight is not None, bias is not None),
        origin=origin(node),
        eps=float(eps),
        delegated=delegated,
        reason=reason,
        node=node.name,
    )


def _dim(d) -> int | str:
    return int(d) if isinstance(d, int) else str(d)  # a symbolic (dynamic) dim stays by name


def module_path(node: torch.fx.Node) -> str:
    """The innermost module that called this op, as a dotted path ('' for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    return list(stack.values())[-1][0]


def origin(node: torch.fx.Node) -> str:
    """'group_norm' when the op is a reframed GroupNorm, else 'layer_norm'.

    A reframe keeps the group_norm's node metadata: its original aten op, its source
    function, or the GroupNorm module that ran it.
    """
    original = node.meta.get("original_aten")
    if original is not None and "group_norm" in str(original):
        return "group_norm"
    sources = node.meta.get("source_fn_stack") or []
    if sources and "group_norm" in _source_name(sources[-1]).lower():
        return "group_norm"
    stack = node.meta.get("nn_module_stack") or {}
    # The innermost module's class, e.g. "torch.nn.modules.normalization.GroupNorm".
    if stack and str(list(stack.values())[-1][1]).rsplit(".", 1)[-1].strip("'>") == "GroupNorm":
        return "group_norm"
    return "layer_norm"


def _source_name(source) -> str:
    fn = source[1] if isinstance(source, (list, tuple)) and len(source) > 1 else source
    return getattr(fn, "__name__", str(fn))
