"""Constant folding: which instructions of a plan compute the same values on every forward
(everything they read is a constant) and can run once, when the program is loaded.

`to_executorch` leaves such work in the plan: every linear's weight is `permute_copy`'d to
[in, out] before its `addmm`, position ids are `arange`d and embedded, constant masks are
built. Run once, their outputs become constants of the program: the same kernels on the
same bytes, so the values are bit-identical to what each forward computed.

A folded instruction's outputs get memory of their own: their planned bytes are reused by
later instructions. A value that reads those bytes under another name (a static reshape
is a second value over the same bytes, with no instruction of its own) is bound to that
memory too. Which write a read sees is found by walking the chain: the last instruction
that wrote the value's bytes. An instruction stays in the chain when that is not plain —
an output read where a later write covers it, a name that reads a folded write at one
point and another write at another, a read over parts of several writes — and so does
everything in a chain with jumps (what reads what then depends on the run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from executorch.exir import schema

from pipeline.pte import operators, verify

# LayerNorms left to CPU kernels are what coverage counts as missed: they stay visible.
_KEEP = ("aten::native_layer_norm", "aten::layer_norm", "aten::native_group_norm", "aten::group_norm")


@dataclass(frozen=True)
class Fold:
    """What to run at load: `instructions` (chain indices, in order) and the planned tensors
    they write (`outputs`), each of which gets memory of its own; `aliases` maps a value
    that reads a folded output's bytes under another name to that output."""

    instructions: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    aliases: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Write:
    pc: int
    value: int
    span: tuple[int, int, int]  # arena, first byte, end


def plan_fold(plan: schema.ExecutionPlan, delegates: verify.Delegates, budget: int) -> Fold:
    """The instructions of `plan` that read only constants, with at most `budget` bytes of
    outputs between them (the first ones in chain order), and how their outputs are bound.
    `plan` has passed verify's checks."""
    instructions = plan.chains[0].instructions
    if any(isinstance(i.instr_args, schema.JumpFalseCall) for i in instructions):
        return Fold()
    access = [verify.accesses(plan, i.instr_args, delegates) for i in instructions]
    if any(a is None for a in access):
        return Fold()
    writers = Counter(j for _, writes in access for j in set(writes))
    placed = verify.planned(plan)
    blocked: set[int] = set()
    while True:
        folded = _constant_instructions(plan, access, writers, placed, budget, blocked)
        conflicts, aliases = _bindings(plan, access, writers, placed, folded)
        if not conflicts:
            outputs = tuple(j for pc in folded for j in dict.fromkeys(access[pc][1]) if j in placed)
            return Fold(tuple(folded), outputs, aliases)
        blocked |= conflicts  # each round leaves at least one more instruction in the chain


def _constant_instructions(plan, access, writers: Counter, placed: dict, budget: int,
                           blocked: set[int]) -> dict[int, list[int]]:
    """pc -> values it writes, for each instruction that can run once at load."""
    inputs = set(plan.inputs)
    made: set[int] = set()
    known: dict[int, bool] = {}

    def constant(j: int) -> bool:
        if j in made:
            return True
        if writers[j] or j in inputs:
            return False
        if j not in known:
            val = plan.values[j].val
            if isinstance(val, schema.Tensor):
                known[j] = val.allocation_info is None and val.data_buffer_idx > 0
            elif isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
                known[j] = all(k == -1 or constant(k) for k in val.items)
            else:
                known[j] = True  # a scalar, string or list of them, fixed in the file
        return known[j]

    folded: dict[int, list[int]] = {}
    spent = 0
    for pc, instruction in enumerate(plan.chains[0].instructions):
        a = instruction.instr_args
        if pc in blocked or not isinstance(a, schema.KernelCall) or not _pure(plan.operators[a.op_index]):
            continue
        reads, writes = access[pc]
        writes = list(dict.fromkeys(writes))
        if not all(constant(j) for j in reads):
            continue
        if any(writers[j] != 1 or j in inputs or not _writable(plan.values[j].val) for j in writes):
            continue
        cost = sum(placed[j][2] - placed[j][1] for j in writes if j in placed)
        if spent + cost > budget:
            continue
        spent += cost
        folded[pc] = writes
        made.update(writes)
    return folded


def _pure(op: schema.Operator) -> bool:
    """Whether the operator's outputs depend on its inputs alone (no random draws) and it
    is not a LayerNorm (those stay where coverage sees them)."""
    if op.name in _KEEP:
        return False
    overload = operators.find_overload(op.name, op.overload)
    return overload is None or torch.Tag.nondeterministic_seeded not in overload.tags


def _writable(val) -> bool:
    # Planned memory or a value the kernel sets (a view, a size); never a file constant.
    return not isinstance(val, schema.Tensor) or val.data_buffer_idx == 0


def _bindings(plan, access, writers: Counter, placed: dict,
              folded: dict[int, list[int]]) -> tuple[set[int], dict[int, int]]:
    """Walk the chain with the fold: (instructions whose outputs cannot be bound plainly,
    value -> folded output it reads under another name)."""
    owner = {j: pc for pc, writes in folded.items() for j in writes}
    inputs = set(plan.inputs)
    writes_by_arena: dict[int, list[_Write]] = {}
    for j in plan.inputs:
        if j in placed:
            _record(writes_by_arena, _Write(-1, j, placed[j]))
    aliases: dict[int, int] = {}
    unfolded_reads: set[int] = set()  # names read where a write outside the fold is seen
    conflicts: set[int] = set()
    end = len(access)
    reads_at = [(pc, reads) for pc, (reads, _) in enumerate(access)] + [(end, list(plan.outputs))]
    for pc, reads in reads_at:
        for r in reads:
            if r not in placed or placed[r][1] == placed[r][2]:
                continue
            arena, start, stop = placed[r]
            seen = [w for w in writes_by_arena.get(arena, ()) if w.span[1] < stop and start < w.span[2]]
            if not seen:
                continue  # read before any write: verify refuses that in a chain without jumps
            last = seen[-1]
            sources = [last] if last.span[1] <= start and stop <= last.span[2] else seen
            from_fold = {w.pc for w in sources if w.pc in folded}
            if r in owner:
                if sources != [last] or last.value != r:
                    conflicts |= from_fold | {owner[r]}
            elif not from_fold:
                unfolded_reads.add(r)
                if r in aliases:
                    conflicts.add(owner[aliases[r]])
            elif sources == [last] and last.span == placed[r] and writers[r] == 0 and r not in inputs \
                    and r not in unfolded_reads and aliases.get(r, last.value) == last.value:
                aliases[r] = last.value
            else:
                conflicts |= from_fold
        if pc < end:
            for j in dict.fromkeys(access[pc][1]):
                if j in placed:
                    _record(writes_by_arena, _Write(pc, j, placed[j]))
    return conflicts, aliases


def _record(writes_by_arena: dict[int, list[_Write]], write: _Write) -> None:
    """Add `write` to its arena's visible writes (in order), dropping those it covers."""
    arena, start, stop = write.span
    visible = writes_by_arena.setdefault(arena, [])
    visible[:] = [w for w in visible if not (start <= w.span[1] and w.span[2] <= stop)]
    visible.append(write)
