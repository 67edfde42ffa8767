"""Coverage audit: the norms of the lowered program by kind, held against eager PyTorch.

LayerNorms and GroupNorms are held against the calls eager PyTorch made; RMSNorms and
hand-written LayerNorms, which eager runs as plain ops, against what `match_norms` found in
the exported graph. Chains that look like a norm and stay on the CPU are listed with their
reason."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from pipeline.aot.passes.norms import GROUP_NORM, HAND_WRITTEN, KIND_KEY, LAYER_NORM, NAME_KEY, NORM_KINDS, \
    RMS_NORM, norm_kind
from pipeline.evaluation.eager import NormCall, run_eager
from pipeline.evaluation.graph import (LayerNormRecord, file_records, is_delegate_call, is_layer_norm,
                                       layer_norm_records, module_path)

# A record's origin for each kind; eager calls are recorded as the first two.
ORIGINS = {LAYER_NORM: "layer_norm", GROUP_NORM: "group_norm", RMS_NORM: "rms_norm",
           HAND_WRITTEN: "hand_written_layer_norm"}
KINDS = {origin: kind for kind, origin in ORIGINS.items()}
# Kinds eager PyTorch runs as one op, so the audit can count its calls.
EAGER_KINDS = (LAYER_NORM, GROUP_NORM)


@dataclass
class CoverageAudit:
    """Verdict "complete" iff eager calls == graph ops == delegated (and the program agrees)."""

    model: str
    variant: str | None
    eager_calls: int
    eager_by_op: dict[str, int]
    graph_ops: int
    delegated: int
    layer_norms: list[LayerNormRecord]
    # Eager calls with no LayerNorm op at that module in the graph: "path (op)".
    missing_from_graph: list[str] = field(default_factory=list)
    # Eager calls whose output nothing uses, which lowering removed as dead code: "path (op)".
    # They run nowhere in the program and are not counted in eager_calls.
    dead_code: list[str] = field(default_factory=list)
    # The lowered program's own counts, when they disagree with ours.
    notes: list[str] = field(default_factory=list)
    # Chains that look like a norm and stay on the CPU: "node: reason".
    norm_like: list[str] = field(default_factory=list)

    @property
    def found_by_pattern(self) -> int:
        """Norms eager runs as plain ops (RMSNorm, hand-written LayerNorm), found in the graph
        by pattern."""
        return sum(1 for r in self.layer_norms if KINDS.get(r.origin) not in EAGER_KINDS)

    @property
    def complete(self) -> bool:
        return (self.eager_calls + self.found_by_pattern == self.graph_ops == self.delegated
                and not self.notes and not self.norm_like)

    def by_kind(self) -> dict[str, dict[str, int | None]]:
        """{kind: {"eager": calls (None for kinds eager runs as plain ops), "graph": ops,
        "delegated": n}} for each kind present."""
        kinds: dict[str, dict[str, int | None]] = {}
        for origin, n in self.eager_by_op.items():
            kinds.setdefault(KINDS.get(origin, origin), {"eager": 0, "graph": 0, "delegated": 0})["eager"] = n
        for rec in self.layer_norms:
            kind = KINDS.get(rec.origin, rec.origin)
            entry = kinds.setdefault(kind, {"eager": 0 if kind in EAGER_KINDS else None, "graph": 0, "delegated": 0})
            entry["graph"] += 1
            entry["delegated"] += int(rec.delegated)
        return {kind: kinds[kind] for kind in sorted(kinds, key=lambda k: (NORM_KINDS + (k,)).index(k))}

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "variant": self.variant,
            "verdict": "complete" if self.complete else "incomplete",
            "coverage": {
                "eager_calls": self.eager_calls,
                "eager_by_op": self.eager_by_op,
                "graph_ops": self.graph_ops,
                "delegated": self.delegated,
                "found_by_pattern": self.found_by_pattern,
                "by_kind": self.by_kind(),
            },
            "norm_like": self.norm_like,
            "missing_from_graph": self.missing_from_graph,
            "dead_code": self.dead_code,
            "notes": self.notes,
            "layer_norms": [r.as_dict() for r in self.layer_norms],
        }


def program_records(program, calls: Sequence[NormCall] = ()) -> list[LayerNormRecord]:
    """Every LayerNorm of a program, in execution order: from its edge graph when it was
    lowered in this process, else from the file, attributed to `calls` by order."""
    if program.edge is None:
        return file_records(program, calls)
    gm = program.edge.exported_program().graph_module
    reasons = dict(program.coverage.not_delegated)
    layer_norms = iter(layer_norm_records(gm, reasons))
    records = []
    for node, delegate in _norm_nodes(gm):
        if is_layer_norm(node):
            rec = next(layer_norms)
            if norm_kind(node) == HAND_WRITTEN:
                rec.origin = ORIGINS[HAND_WRITTEN]
            records.append(rec)
        else:
            records.append(_rms_record(node, delegate, reasons))
    return records + _decomposed_rms_records(gm, records, reasons)


def _norm_nodes(gm: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.Node, str | None]]:
    """Each norm op of an edge graph with the delegate that runs it (None: not delegated),
    in the order `layer_norm_records` walks them."""
    for node in gm.graph.nodes:
        if _is_norm_op(node):
            yield node, None
        elif node.op == "get_attr":
            sub = getattr(gm, node.target, None)
            if isinstance(sub, torch.fx.GraphModule) and not hasattr(sub, "backend_id"):
                yield from _norm_nodes(sub)
        elif is_delegate_call(node):
            name = node.args[0].target
            for inner in getattr(gm, name).original_module.graph.nodes:
                if _is_norm_op(inner):
                    yield inner, name


def _is_norm_op(node: torch.fx.Node) -> bool:
    """native_layer_norm or rms_norm: what a WebGPU delegate runs."""
    return is_layer_norm(node) or (node.op == "call_function" and norm_kind(node) == RMS_NORM)


def _rms_record(node: torch.fx.Node, delegate: str | None, reasons: dict[str, str]) -> LayerNormRecord:
    x, shape, weight, eps = (list(node.args) + [None] * 4)[:4]
    position = None
    if delegate is not None:  # where the delegate returns it: its graph's outputs
        output = next(n for n in node.graph.nodes if n.op == "output").args[0]
        outputs = list(output) if isinstance(output, (list, tuple)) else [output]
        position = outputs.index(node) if node in outputs else None
    return LayerNormRecord(
        module_path=module_path(node),
        input_shape=[int(d) if isinstance(d, int) else str(d) for d in x.meta["val"].shape],
        row_width=math.prod(int(d) for d in shape),
        affine="weight" if weight is not None else "none",
        origin=ORIGINS[RMS_NORM],
        eps=float(eps) if eps is not None else torch.finfo(x.meta["val"].dtype).eps,
        delegated=delegate is not None,
        reason="" if delegate is not None else reasons.get(node.name, "left in the edge graph (no reason recorded)"),
        node=node.name,
        delegate=delegate,
        delegate_output_index=position,
    )


def _decomposed_rms_records(gm: torch.fx.GraphModule, records: list[LayerNormRecord],
                            reasons: dict[str, str]) -> list[LayerNormRecord]:
    """The RMSNorms to_edge decomposed into CPU ops: found by the name `match_norms` gave
    them, which their ops carry."""
    seen = {r.node for r in records}
    found: dict[str, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        custom = node.meta.get("custom") or {}
        if custom.get(KIND_KEY) == RMS_NORM and node.op == "call_function" and not is_delegate_call(node):
            found.setdefault(custom.get(NAME_KEY), node)
    return [LayerNormRecord(module_path=module_path(node), input_shape=[], row_width=0, affine="?",
                            origin=ORIGINS[RMS_NORM], eps=math.nan, delegated=False,
                            reason=reasons.get(name, "decomposed into CPU ops"), node=name)
            for name, node in found.items() if name not in seen and norm_kind(node) is None]


def match_calls(
    records: Sequence[LayerNormRecord], calls: Sequence[NormCall]
) -> tuple[list[NormCall | None], list[NormCall]]:
    """Pair each graph LayerNorm with the eager call at the same module and the same origin.

    The k-th op at a module pairs with the k-th call there (a module may run twice).
    Returns the call for each record (None when eager made no such call) and the
    eager calls left over.
    """
    pending: dict[tuple[str, str], list[NormCall]] = {}
    for call in calls:
        pending.setdefault((call.module_path, call.op), []).append(call)
    matched = []
    for rec in records:
        queue = pending.get((rec.module_path, rec.origin))
        matched.append(queue.pop(0) if queue else None)
    leftover = [c for queue in pending.values() for c in queue]
    return matched, leftover


def audit_coverage(
    module: torch.nn.Module,
    example_inputs: Sequence,
    program,
    model: str = "",
    variant: str | None = None,
    run: bool = False,
) -> CoverageAudit:
    """Hold what eager `module(*example_inputs)` runs against the lowered `program`'s LayerNorms.

    With `run`, the program is called on the example inputs too: a program that cannot run
    delegates nothing, so its failure is a note and the verdict is not complete."""
    eager = run_eager(module, example_inputs, keep_tensors=False)
    audit = coverage_of(eager.calls, program_records(program, eager.calls), program, model, variant)
    if run:
        try:
            program(*example_inputs)
        except Exception as exc:  # whatever stops it, the verdict says so
            audit.notes.append(f"the program cannot run on the example inputs: {type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}")
    return audit


def coverage_of(
    calls: Sequence[NormCall],
    records: Sequence[LayerNormRecord],
    program,
    model: str = "",
    variant: str | None = None,
) -> CoverageAudit:
    """The audit from eager calls already recorded and the program's LayerNorm records."""
    _, leftover = match_calls(records, calls)
    # A leftover call at a module whose LayerNorm lowering removed as dead code is that one.
    dead_at = Counter(path for _, path in program.coverage.dead)
    dead, missing = [], []
    for call in leftover:
        if dead_at[call.module_path] > 0:
            dead_at[call.module_path] -= 1
            dead.append(call)
        else:
            missing.append(call)
    ran = [c for c in calls if all(c is not d for d in dead)]
    delegated = sum(r.delegated for r in records)
    notes = []
    reported = program.coverage
    norm_like = reported.norm_like
    if (reported.total, reported.delegated) != (len(records) + len(norm_like), delegated):
        notes.append(
            f"the program reports {reported.delegated}/{reported.total} delegated, "
            f"the graph shows {delegated}/{len(records) + len(norm_like)}"
        )
    return CoverageAudit(
        model=model,
        variant=variant,
        eager_calls=len(ran),
        eager_by_op=dict(Counter(c.op for c in ran)),
        graph_ops=len(records),
        delegated=delegated,
        layer_norms=list(records),
        missing_from_graph=[f"{c.module_path or '<root>'} ({c.op})" for c in missing],
        dead_code=[f"{c.module_path or '<root>'} ({c.op})" for c in dead],
        notes=notes,
        norm_like=[f"{node}: {reason}" for node, reason in norm_like],
    )
