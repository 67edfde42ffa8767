"""Coverage audit: eager LayerNorm/GroupNorm calls vs LayerNorm ops in the lowered graph vs delegated."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pipeline.evaluation.eager import NormCall, run_eager
from pipeline.evaluation.graph import LayerNormRecord, file_records, layer_norm_records


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

    @property
    def complete(self) -> bool:
        return self.eager_calls == self.graph_ops == self.delegated and not self.notes

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
            },
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
    return layer_norm_records(program.edge.exported_program().graph_module, dict(program.coverage.not_delegated))


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
    if (reported.total, reported.delegated) != (len(records), delegated):
        notes.append(
            f"the program reports {reported.delegated}/{reported.total} delegated, "
            f"the graph shows {delegated}/{len(records)}"
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
    )
