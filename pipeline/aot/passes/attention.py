"""A contiguous copy before each view of an attention output, so that ExecuTorch's edge
lowering keeps that view valid.

`torch.export` records `scaled_dot_product_attention`'s output with the strides of the fused
kernel, under which `out.transpose(1, 2).reshape(b, s, h * d)` is already contiguous: the
model's `.contiguous()` leaves no node. At `to_edge`, the attention decomposes into matmuls
and a softmax whose output has other strides, that reshape stays a view of a transposed
tensor, and a later `view` of it fails ("Cannot view a tensor with shape [2, 8, 64] and
strides (64, 128, 1)"): GPT-2's `Conv1D` flattens its input with `x.view(-1, x.size(-1))`, so
ExecuTorch alone cannot lower GPT-2 at a batch above 1. The copy is the `.contiguous()` the
model wrote; a `reshape` in the view's place would not do, as ExecuTorch turns reshapes back
into views by export's strides before it decomposes the attention.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

_ATTENTION = (torch.ops.aten.scaled_dot_product_attention.default,)
# Ops that rearrange their input's elements without computing on them: a view among their
# results still depends on the attention output's strides.
_LAYOUT = {
    torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default,
    torch.ops.aten.transpose.int, torch.ops.aten.permute.default, torch.ops.aten.unsqueeze.default,
    torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims, torch.ops.aten.expand.default,
    torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
}


def contiguous_attention_views(program: ExportedProgram) -> ExportedProgram:
    """`program` (changed in place) with a contiguous clone before every `aten.view` that
    reaches an attention output through layout ops alone; the same values. Which of those
    views would fail depends on how ExecuTorch's decompositions order the attention's and
    the reshapes' (a contiguous attention output alone does not tell), so each gets its copy:
    a copy of an attention output a view, where eager's `.contiguous()` is often free."""
    graph = program.graph_module.graph
    seen: set[torch.fx.Node] = set()
    frontier = [n for n in graph.nodes if n.op == "call_function" and n.target in _ATTENTION]
    views = []
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in seen or user.op != "call_function" or user.target not in _LAYOUT:
                continue
            seen.add(user)
            if user.target is torch.ops.aten.view.default:
                views.append(user)
            else:
                frontier.append(user)  # past a view its copy is contiguous
    for view in views:
        source = view.args[0]
        with graph.inserting_before(view):
            copy = graph.call_function(torch.ops.aten.clone.default, (source,),
                                       {"memory_format": torch.contiguous_format})
        copy.meta = {**source.meta, "val": source.meta["val"].clone(memory_format=torch.contiguous_format)}
        view.replace_input_with(source, copy)
    if views:
        program.graph_module.recompile()
    return program
