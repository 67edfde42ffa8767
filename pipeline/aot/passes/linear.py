"""Linear over rows: a linear whose input has rank >= 3 becomes contiguous clone ->
view(-1, K) -> 2-D linear -> view back.

Why: `torch.export` keeps scaled_dot_product_attention fused, so the
`.transpose(1, 2).contiguous()` that follows it in transformers' attention is recorded on
a tensor that already looks contiguous, as no op at all. `to_edge` then decomposes the
attention, and the linear after it receives a transposed (non-contiguous) rank-3 input:
edge decomposes that linear into `expand_copy(weight.T)` + `bmm`, and XNNPACK's linear
rule rebuilds a linear with a 3-D weight from it and fails ("t() expects a tensor with <=
2 dimensions"). A real clone (an `aten.clone` with contiguous memory format, which
survives to the file; `.contiguous()` alone is dropped) followed by a 2-D linear gives
every backend the plain matrix multiply the model means. The clone copies the input once;
the views are free.
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram

aten = torch.ops.aten


def _leading_size(graph: torch.fx.Graph, x: torch.fx.Node, dim: int, size) -> object:
    """`size` (dim `dim` of x) as a view argument: an int, or a sym_size node for a symbolic size."""
    if isinstance(size, int):
        return size
    node = graph.call_function(aten.sym_size.int, (x, dim))
    node.meta["val"] = size
    return node


def _like(new: torch.fx.Node, old: torch.fx.Node, val) -> torch.fx.Node:
    """`new` takes `old`'s provenance (stack trace, module stack) and its own value."""
    new.meta.update({k: v for k, v in old.meta.items() if k not in ("val", "tensor_meta")})
    new.meta["val"] = val
    return new


def linears_over_rows(ep: ExportedProgram) -> ExportedProgram:
    """Rewrite, in place, every `aten.linear` of `ep` whose input has rank >= 3 as a
    contiguous clone of the input, `view(-1, K)`, a 2-D linear and a view back to the
    input's leading dims. Linears of rank 1 or 2 are left alone. Returns `ep`.
    """
    graph = ep.graph_module.graph
    linears = [n for n in graph.nodes if n.op == "call_function" and n.target == aten.linear.default
               and n.args[0].meta["val"].dim() >= 3]
    if not linears:
        return ep
    fake_mode = detect_fake_mode([n.args[0].meta["val"] for n in linears])
    for node in linears:
        x, weight = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        x_val, w_val = x.meta["val"], weight.meta["val"]
        in_features, out_features = w_val.shape[-1], w_val.shape[0]
        with graph.inserting_before(node), fake_mode:
            lead = [_leading_size(graph, x, d, s) for d, s in enumerate(x_val.shape[:-1])]
            clone = _like(graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format}),
                          node, aten.clone.default(x_val, memory_format=torch.contiguous_format))
            rows = _like(graph.call_function(aten.view.default, (clone, [-1, in_features])),
                         node, aten.view.default(clone.meta["val"], [-1, in_features]))
            linear = _like(graph.call_function(aten.linear.default, (rows, weight, bias)), node,
                           aten.linear.default(rows.meta["val"], w_val, None if bias is None else bias.meta["val"]))
            out = _like(graph.call_function(aten.view.default, (linear, [*lead, out_features])),
                        node, aten.view.default(linear.meta["val"], [*x_val.shape[:-1], out_features]))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    graph.lint()
    ep.graph_module.recompile()
    return ep
