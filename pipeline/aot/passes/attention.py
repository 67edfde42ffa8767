"""A contiguous copy before each view of an attention output, for programs that ExecuTorch's
edge lowering cannot lower without it.

`torch.export` records `scaled_dot_product_attention`'s output with the strides of the fused
kernel, under which `out.transpose(1, 2).reshape(b, s, h * d)` is already contiguous: the
model's `.contiguous()` leaves no node. At `to_edge`, the attention decomposes into matmuls
and a softmax whose output has other strides, and a later `view` can fail ("Cannot view a
tensor with shape [2, 8, 64] and strides (64, 128, 1)"): GPT-2's `Conv1D` flattens its input
with `x.view(-1, x.size(-1))`, so ExecuTorch alone cannot lower GPT-2 at a batch above 1.
The copy is the `.contiguous()` the model wrote. A `reshape` in the view's place does not
hold (ExecuTorch turns reshapes back into views by export's strides before it decomposes
the attention); nor do the copies suit every model (wav2vec2's then fail elsewhere), so the
lowering adds them only where ExecuTorch fails without them (`pipeline.aot.lowering`).
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
    reaches an attention output through layout ops alone (the same values)."""
    views = attention_views(program)
    graph = program.graph_module.graph
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


def attention_views(program: ExportedProgram) -> list[torch.fx.Node]:
    """The `aten.view` nodes of `program` that reach an attention output through layout ops
    alone (past such a view, its copy would be contiguous)."""
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
    return views
