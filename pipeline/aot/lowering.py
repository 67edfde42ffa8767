"""`lower()`: export a module, reframe group norms, delegate every LayerNorm, fold
constants, serialize.

What `lower` returns runs the serialized program — the same bytes `save` writes — so
every test and report exercises the artifact. Coverage is counted on the edge program
(where the partitioner's reasons are known) and must agree with what the file holds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.lowered_backend_module import LoweredBackendModule
from executorch.exir.passes.constant_prop_pass import constant_prop_pass, get_default_skip_targets_no_quant
from torch.export import ExportedProgram

from pipeline.aot.preprocess import WebGPUBackend
from pipeline.aot.preprocess import NATIVE_LAYER_NORM, NORM_OPS
from pipeline.interpreter.program import Coverage, Program
from pipeline.pte.file import PteFile
from pipeline.aot.partitioner import LayerNormPartitioner
from pipeline.aot.passes import linears_over_rows, reframe_group_norm

# A group norm counts as a LayerNorm: the reframe makes one of each at the top level; one
# the reframe does not reach (inside control flow) stays a group norm.
_EXPORTED_LAYER_NORMS = (torch.ops.aten.layer_norm.default, torch.ops.aten.native_layer_norm.default,
                         torch.ops.aten.group_norm.default, torch.ops.aten.native_group_norm.default)
_EDGE_GROUP_NORM = exir_ops.edge.aten.native_group_norm.default
_CALL_DELEGATE = torch.ops.higher_order.executorch_call_delegate
# Folding leaves these to run: LayerNorms (delegated, or left out and counted as missed),
# delegate calls, and broadcasts, whose result holds their input many times over
# (Florence-2's window attention expands weights to every window: its file would grow from
# 364 to 554 MB). ExecuTorch's default adds `full` (a constant of any size from one scalar).
_NOT_FOLDED = {NATIVE_LAYER_NORM, _EDGE_GROUP_NORM, _CALL_DELEGATE,
               exir_ops.edge.aten.expand_copy.default, exir_ops.edge.aten.repeat.default,
               *get_default_skip_targets_no_quant()}


def count_layer_norms(program: ExportedProgram) -> int:
    """LayerNorm ops (aten.layer_norm or aten.native_layer_norm, and group norms not
    reframed) in an exported graph, those in the branches and bodies of control flow
    included."""
    return sum(1 for _, gm in _graphs(program.graph_module) for n in gm.graph.nodes
               if n.op == "call_function" and n.target in _EXPORTED_LAYER_NORMS)


def dead_layer_norms(program: ExportedProgram) -> list[tuple[str, str]]:
    """The top-level LayerNorms of an exported graph whose value reaches no output, as
    (node, module path): lowering removes them as dead code, so they run nowhere, neither
    delegated nor missed."""
    graph = program.graph_module.graph
    live: set[torch.fx.Node] = set()
    pending = [n for n in graph.nodes if n.op == "output"]
    while pending:
        node = pending.pop()
        if node not in live:
            live.add(node)
            pending.extend(node.all_input_nodes)
    dead = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target in _EXPORTED_LAYER_NORMS and n not in live:
            stack = n.meta.get("nn_module_stack") or {}
            dead.append((n.name, list(stack.values())[-1][0] if stack else ""))
    return dead


def _graphs(gm: torch.fx.GraphModule, name: str = "") -> list[tuple[str, torch.fx.GraphModule]]:
    """`gm` and the subgraphs its control flow calls (torch.cond branches, map bodies, ...),
    recursively, each with the name of the top-level subgraph it lies in ("" for `gm`); a
    delegate's own graph is not one of them."""
    found = [(name, gm)]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            sub = getattr(gm, node.target, None)
            if isinstance(sub, torch.fx.GraphModule) and not isinstance(sub, LoweredBackendModule):
                found.extend(_graphs(sub, name or node.target))
    return found


def _delegate_nodes(edge: EdgeProgramManager) -> list[tuple[str, LoweredBackendModule]]:
    gm = edge.exported_program().graph_module
    return [(n.args[0].target, getattr(gm, n.args[0].target))
            for n in gm.graph.nodes if n.op == "call_function" and n.target is _CALL_DELEGATE]


def _coverage(edge: EdgeProgramManager, total: int, rejected: Sequence[tuple[str, str]],
              dead: list[tuple[str, str]]) -> Coverage:
    gm = edge.exported_program().graph_module
    delegated = sum(
        1
        for _, lowered in _delegate_nodes(edge)
        if lowered.backend_id == WebGPUBackend.__name__
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function" and n.target in NORM_OPS
    )
    reasons = dict(rejected)
    not_delegated = [
        (n.name, reasons.get(n.name, "not tagged by the partitioner"))
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == NATIVE_LAYER_NORM
    ]
    # The partitioner sees the top-level graph only: LayerNorms inside control flow stay out.
    not_delegated += [
        (f"{n.name} (in {sub_name})", "inside control flow (torch.cond/map): the partitioner does not "
         "delegate into control-flow subgraphs; it runs on the CPU")
        for sub_name, sub in _graphs(gm)[1:]
        for n in sub.graph.nodes
        if n.op == "call_function" and n.target in (NATIVE_LAYER_NORM, _EDGE_GROUP_NORM)
    ]
    not_delegated += [
        (n.name, "a group norm the reframe did not reach; it runs on the CPU")
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == _EDGE_GROUP_NORM
    ]
    missing = total - delegated - len(not_delegated)
    if missing > 0:
        not_delegated.append(
            ("exported graph", f"{missing} LayerNorm(s) did not reach the edge program as native_layer_norm")
        )
    return Coverage(total=total, delegated=delegated, not_delegated=not_delegated, dead=dead)


def _delegate_names(edge: EdgeProgramManager, pte: PteFile) -> list[str]:
    """The edge graph's `lowered_module_N` name of each delegate of the file, by plan index.

    Delegate calls run in graph order; each pairing is checked on the blob bytes, so a
    report can never attribute one LayerNorm's output to another.
    """
    plan = pte.plan
    nodes = _delegate_nodes(edge)
    calls = [i.instr_args.delegate_index for c in plan.chains for i in c.instructions
             if hasattr(i.instr_args, "delegate_index")]
    if len(calls) != len(nodes) or sorted(calls) != list(range(len(plan.delegates))):
        raise RuntimeError(f"the serialized program calls delegates {calls}; the edge graph has {len(nodes)}")
    names = [""] * len(calls)
    for index, (name, lowered) in zip(calls, nodes):
        if pte.delegate_bytes(plan.delegates[index]) != lowered.processed_bytes:
            raise RuntimeError(f"delegate {index} of the serialized program is not the edge graph's {name}")
        names[index] = name
    return names


def fold_constants(edge: EdgeProgramManager) -> EdgeProgramManager:
    """Compute once, at export, what the graph computes from constants alone (each linear's
    weight transpose, position ids and their embeddings): each such value becomes a
    constant of the program, and what it was computed from leaves the file when nothing
    else reads it. Every runtime then gets the folded program. Ops that draw random numbers
    and those in `_NOT_FOLDED` stay in the graph. In place; returns `edge`."""
    program = edge.exported_program()
    random = {n.target for n in program.graph.nodes if n.op == "call_function"
              and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())}
    # The edge program keeps dim orders: a folded output gets the dim-order clone.
    constant_prop_pass(program, custom_skip_targets=_NOT_FOLDED | random, _skip_dim_order=False)
    return edge


def lower_exported(exported: ExportedProgram, partitioners: list) -> EdgeProgramManager:
    """The edge program of `exported` with `partitioners` applied, constants folded: what
    `to_executorch` serializes."""
    return fold_constants(to_edge_transform_and_lower(exported, partitioner=partitioners))


CPU_BACKENDS = ("portable", "xnnpack")


def export_for_cpu_backend(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
                           cpu_backend: str = "portable") -> tuple[ExportedProgram, list]:
    """`torch.export` with our graph passes, and the partitioners of `cpu_backend` (none
    for portable) to run after ours: what `lower_to_edge` lowers, and, without our
    partitioner, the same program with no WebGPU delegate (the reference of a file run in
    ExecuTorch's runtime)."""
    if cpu_backend not in CPU_BACKENDS:
        raise ValueError(f"cpu_backend must be one of {', '.join(CPU_BACKENDS)}, got {cpu_backend!r}")
    exported = reframe_group_norm(torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes))
    if cpu_backend == "portable":
        return exported, []
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    # XNNPACK's linear rule fails on a linear whose input edge's decompositions left
    # non-contiguous (Florence-2's window attention): give it 2-D linears.
    return linears_over_rows(exported), [XnnpackPartitioner()]


def lower_to_edge(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
                  cpu_backend: str = "portable") -> tuple[EdgeProgramManager, Coverage]:
    """Export, reframe group norms, delegate every supported LayerNorm to WebGPU, fold
    constants; with `cpu_backend="xnnpack"` XNNPACK's partitioner takes what it can of the
    rest first (the file one would deploy: LayerNorms on WebGPU, the rest on XNNPACK, for
    ExecuTorch's runtime). Returns the edge program and its coverage."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}")
    exported, cpu_partitioners = export_for_cpu_backend(module, example_inputs, dynamic_shapes, cpu_backend)
    dead = dead_layer_norms(exported)
    total = count_layer_norms(exported) - len(dead)
    partitioner = LayerNormPartitioner()
    edge = lower_exported(exported, [partitioner, *cpu_partitioners])
    coverage = _coverage(edge, total, partitioner.rejected, dead)
    for name, lowered in _delegate_nodes(edge):
        if lowered.backend_id != WebGPUBackend.__name__ and any(
                n.op == "call_function" and n.target == NATIVE_LAYER_NORM for n in lowered.original_module.graph.nodes):
            raise RuntimeError(f"{name}: a LayerNorm landed in a {lowered.backend_id} partition")
    return edge, coverage


def lower(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None) -> Program:
    """Export `module` on `example_inputs`, delegate every supported LayerNorm to WebGPU,
    serialize, and return the serialized program ready to run.

    `dynamic_shapes` is passed to torch.export; a program exported with a dynamic
    dimension runs at any size in its range. The module is exported as it is (call
    `.eval()` first for inference).
    """
    edge, coverage = lower_to_edge(module, example_inputs, dynamic_shapes)
    # to_executorch rewrites the edge graph in place (out variants, memory planning); work
    # on a copy so `edge` keeps the delegates' original graphs for the evaluator.
    pte = PteFile(copy.deepcopy(edge).to_executorch().buffer, "<lowered program>")
    program = Program(pte, coverage=coverage, delegate_names=_delegate_names(edge, pte), edge=edge)
    in_file = program.layer_norm_sites
    if sum(s.delegated for s in in_file) != coverage.delegated:
        raise RuntimeError(f"the serialized program holds {sum(s.delegated for s in in_file)} delegated "
                           f"LayerNorms, the edge program {coverage.delegated}")
    return program
