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
from pipeline.aot.preprocess import NATIVE_LAYER_NORM, NORM_OPS, RMS_NORM
from pipeline.interpreter.program import Coverage, Program
from pipeline.pte.file import PteFile
from pipeline.aot.partitioner import LayerNormPartitioner
from pipeline.aot.passes import NORM_KINDS, RMS_NORM as RMS_KIND, NormMatches, attention_views, \
    contiguous_attention_views, linears_over_rows, match_norms, norm_kind, reframe_group_norm
from pipeline.aot.passes.norms import KIND_KEY, NAME_KEY

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


def count_norms(program: ExportedProgram) -> dict[str, int]:
    """The norms of an exported graph by kind (LayerNorm, GroupNorm, RMSNorm, hand-written
    LayerNorm: `match_norms` marks the last two), those in control flow included."""
    counts = dict.fromkeys(NORM_KINDS, 0)
    for _, gm in _graphs(program.graph_module):
        for n in gm.graph.nodes:
            kind = norm_kind(n)
            if kind is not None:
                counts[kind] += 1
    return counts


def dead_layer_norms(program: ExportedProgram) -> list[tuple[str, str]]:
    """The top-level norms (of every kind) of an exported graph whose value reaches no
    output, as (node, module path): lowering removes them as dead code, so they run nowhere,
    neither delegated nor missed."""
    return [(name, path) for name, path, _ in _dead_norms(program)]


def _dead_norms(program: ExportedProgram) -> list[tuple[str, str, str]]:
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
        kind = norm_kind(n)
        if kind is not None and n not in live:
            stack = n.meta.get("nn_module_stack") or {}
            dead.append((n.name, list(stack.values())[-1][0] if stack else "", kind))
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


def _coverage(edge: EdgeProgramManager, totals: dict[str, int], rejected: Sequence[tuple[str, str]],
              dead: list[tuple[str, str]], matches: NormMatches | None = None) -> Coverage:
    """Coverage of the edge program against `totals`, the norms by kind found in the
    exported graph (dead ones out, the chains `matches` left in)."""
    gm = edge.exported_program().graph_module
    delegated = dict.fromkeys(NORM_KINDS, 0)
    in_delegates = set()
    for _, lowered in _delegate_nodes(edge):
        for n in lowered.original_module.graph.nodes:
            if n.op == "call_function" and n.target in NORM_OPS:
                in_delegates.add(_norm_name(n))
                if lowered.backend_id == WebGPUBackend.__name__:
                    delegated[norm_kind(n)] += 1
    reasons = dict(rejected)
    left: list[tuple[str, str, str]] = []  # (node, reason, kind)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in NORM_OPS:
            left.append((n.name, reasons.get(n.name, reasons.get(_norm_name(n), "not tagged by the partitioner")),
                         norm_kind(n)))
    # An RMSNorm the partitioner did not keep whole is decomposed into CPU ops that carry its name.
    decomposed = {}
    for n in gm.graph.nodes:
        custom = n.meta.get("custom") or {}
        name = custom.get(NAME_KEY)
        if (custom.get(KIND_KEY) == RMS_KIND and name not in in_delegates and n.op == "call_function"
                and n.target not in NORM_OPS and n.target is not _CALL_DELEGATE):
            decomposed.setdefault(name, n)
    left += [(name, reasons.get(name, "decomposed into CPU ops on the way to the edge program: the partitioner "
                                "did not keep aten.rms_norm whole"), RMS_KIND) for name in decomposed]
    # The partitioner sees the top-level graph only: norms inside control flow stay out.
    left += [
        (f"{n.name} (in {sub_name})", "inside control flow (torch.cond/map): the partitioner does not "
         "delegate into control-flow subgraphs; it runs on the CPU", norm_kind(n))
        for sub_name, sub in _graphs(gm)[1:]
        for n in sub.graph.nodes
        if n.op == "call_function" and n.target in (NATIVE_LAYER_NORM, RMS_NORM, _EDGE_GROUP_NORM)
    ]
    left += [
        (n.name, "a group norm the reframe did not reach; it runs on the CPU", "GroupNorm")
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == _EDGE_GROUP_NORM
    ]
    norm_like = [(miss.node, f"a norm-like chain left on the CPU: {miss.reason}", miss.kind)
                 for miss in (matches.left if matches is not None else [])]
    left += norm_like
    kinds = {}
    for kind in NORM_KINDS:
        found = [entry for entry in left if entry[2] == kind]
        missing = totals.get(kind, 0) - delegated[kind] - len(found)
        if missing > 0:
            left.append(("exported graph", f"{missing} {kind}(s) did not reach the edge program as a norm op", kind))
        if totals.get(kind, 0) or delegated[kind] or found:
            kinds[kind] = {"total": totals.get(kind, 0), "delegated": delegated[kind]}
    return Coverage(total=sum(totals.values()), delegated=sum(delegated.values()),
                    not_delegated=[(name, reason) for name, reason, _ in left], dead=dead, kinds=kinds,
                    norm_like=[(name, reason) for name, reason, _ in norm_like])


def _norm_name(node: torch.fx.Node) -> str | None:
    """The name `match_norms` gave a norm node, which it keeps through to_edge."""
    return (node.meta.get("custom") or {}).get(NAME_KEY)


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


def to_edge(exported: ExportedProgram, partitioners: list) -> EdgeProgramManager:
    """ExecuTorch's `to_edge_transform_and_lower` of `exported` with `partitioners`; where it
    cannot view a decomposed attention's output (GPT-2's and its kin's, at a batch above 1),
    once more with a copy before each view of an attention output
    (`contiguous_attention_views`, which changes `exported`)."""
    try:
        return to_edge_transform_and_lower(exported, partitioner=partitioners)
    except ValueError as exc:
        if "Cannot view a tensor" not in str(exc) or not attention_views(exported):
            raise
    return to_edge_transform_and_lower(contiguous_attention_views(exported), partitioner=partitioners)


def lower_exported(exported: ExportedProgram, partitioners: list) -> EdgeProgramManager:
    """The edge program of `exported` with `partitioners` applied (`to_edge`), constants
    folded: what `to_executorch` serializes."""
    return fold_constants(to_edge(exported, partitioners))


CPU_BACKENDS = ("portable", "xnnpack")


def export_for_cpu_backend(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
                           cpu_backend: str = "portable") -> tuple[ExportedProgram, list]:
    """`torch.export` with our graph passes, and the partitioners of `cpu_backend` (none
    for portable) to run after ours: what `lower_to_edge` lowers, and, without our
    partitioner, the same program with no WebGPU delegate (the reference of a file run in
    ExecuTorch's runtime)."""
    exported, partitioners, _ = _export(module, example_inputs, dynamic_shapes, cpu_backend)
    return exported, partitioners


def _export(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes,
            cpu_backend: str) -> tuple[ExportedProgram, list, NormMatches]:
    if cpu_backend not in CPU_BACKENDS:
        raise ValueError(f"cpu_backend must be one of {', '.join(CPU_BACKENDS)}, got {cpu_backend!r}")
    exported = reframe_group_norm(torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes))
    exported, matches = match_norms(exported)
    if cpu_backend == "portable":
        return exported, [], matches
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    # XNNPACK's linear rule fails on a linear whose input edge's decompositions left
    # non-contiguous (Florence-2's window attention): give it 2-D linears.
    return linears_over_rows(exported), [XnnpackPartitioner()], matches


def lower_to_edge(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
                  cpu_backend: str = "portable") -> tuple[EdgeProgramManager, Coverage]:
    """Export, reframe group norms, match RMSNorms and hand-written LayerNorms into one op
    each, delegate every supported norm to WebGPU, fold constants; with
    `cpu_backend="xnnpack"` XNNPACK's partitioner takes what it can of the rest first (the
    file one would deploy: norms on WebGPU, the rest on XNNPACK, for ExecuTorch's runtime).
    Returns the edge program and its coverage."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}")
    exported, cpu_partitioners, matches = _export(module, example_inputs, dynamic_shapes, cpu_backend)
    dead = _dead_norms(exported)
    totals = count_norms(exported)
    for _, _, kind in dead:
        totals[kind] -= 1
    for miss in matches.left:
        totals[miss.kind] += 1
    partitioner = LayerNormPartitioner()
    edge = lower_exported(exported, [partitioner, *cpu_partitioners])
    coverage = _coverage(edge, totals, partitioner.rejected, [(name, path) for name, path, _ in dead], matches)
    for name, lowered in _delegate_nodes(edge):
        if lowered.backend_id != WebGPUBackend.__name__ and any(
                n.op == "call_function" and n.target in NORM_OPS for n in lowered.original_module.graph.nodes):
            raise RuntimeError(f"{name}: a norm landed in a {lowered.backend_id} partition")
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
