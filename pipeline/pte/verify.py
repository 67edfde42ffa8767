"""Check a parsed program before anything runs it: its structure, its constants, and its shapes.

ExecuTorch's format has no checksum over the program, so a damaged file is caught by what
it must be consistent with:

- structure: every field of the schema present with its type (a flatbuffer read without
  a verifier turns damage into missing tables and wrong types);
- indices: every value, operator, delegate, jump and arena an instruction or tensor names
  exists; tensors lie within their planned arena; lists refer to earlier values;
- constants: the constant segment's offsets rise, and each constant fills its slot as the
  serializer lays it out (its bytes rounded up to the segment's alignment);
- shapes and dtypes: every instruction is run once on meta tensors (no data, no work), in
  file order, and what each operator and delegate produces must be what the file declares
  for its outputs — a flipped size, dtype, argument index or shape argument shows here;
  and a constant an operator reads has the dtype of one of its other tensors (type
  promotion would hide one re-declared as another dtype).

What stays undetectable without a checksum: a change that keeps every shape and dtype
consistent (a scalar argument such as `alpha`, an argument or output re-pointed to another
tensor of the same shape and dtype, constant data). `run_pte` and `--pte` reports catch
those through the sha256 the export's coverage file records.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
import warnings
from collections.abc import Callable, Sequence
from functools import cache

import torch
from executorch.exir import schema

from pipeline.pte import operators

# The largest file a tensor could describe: sizes beyond it are damage, not a model.
MAX_NUMEL = 2**48
# How far a planned arena may reach past its last tensor (the planner's alignment padding).
ARENA_SLACK = 4096
# Operator arguments whose dtype is their own whatever the data's (ATen's names for them).
OWN_DTYPE_ARGUMENTS = frozenset({"index", "indices", "exponent"})


class CheckError(ValueError):
    """The program contradicts itself; the message says where."""


# -- structure --------------------------------------------------------------------------------


def check_structure(program: schema.Program) -> None:
    """Every field present with its declared type, all the way down; CheckError otherwise."""
    _checker(schema.Program)(program, "program")


Checker = Callable[[object, str], None]


@cache
def _checker(tp) -> Checker:
    """A function that checks a value against schema type `tp` (built once per type)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        options = [t for t in typing.get_args(tp) if t is not type(None)]
        optional = len(options) < len(typing.get_args(tp))
        checks = [(_accepts(t), _checker(t)) for t in options]

        def check_union(obj, path):
            if obj is None and optional:
                return
            for accepts, check in checks:
                if accepts(obj):
                    check(obj, path)
                    return
            raise CheckError(f"{path} is {_kind(obj)}, expected {_name(tp)}")
        return check_union
    if origin is list:
        (item,) = typing.get_args(tp)
        if item in (int, float, bool):
            accepts = _accepts(item)

            def check_scalars(obj, path):
                if not isinstance(obj, list):
                    raise CheckError(f"{path} is {_kind(obj)}, expected a list")
                if not all(map(accepts, obj)):
                    bad = next(i for i, v in enumerate(obj) if not accepts(v))
                    raise CheckError(f"{path}[{bad}] is {_kind(obj[bad])}, expected {_name(item)}")
            return check_scalars
        check_item = _checker(item)

        def check_list(obj, path):
            if not isinstance(obj, list):
                raise CheckError(f"{path} is {_kind(obj)}, expected a list")
            for i, v in enumerate(obj):
                check_item(v, f"{path}[{i}]")
        return check_list
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, vars(schema))
        # Built lazily: the schema's types refer to each other.
        names = [f.name for f in dataclasses.fields(tp)]
        fields: list[tuple[str, Checker]] = []

        def check_dataclass(obj, path):
            if type(obj) is not tp:
                raise CheckError(f"{path} is {_kind(obj)}, expected {tp.__name__}")
            if not fields:
                fields.extend((name, _checker(hints[name])) for name in names)
            for name, check in fields:
                check(getattr(obj, name), f"{path}.{name}")
        return check_dataclass
    accepts = _accepts(tp)

    def check_leaf(obj, path):
        if not accepts(obj):
            raise CheckError(f"{path} is {_kind(obj)}, expected {_name(tp)}")
    return check_leaf


@cache
def _accepts(tp) -> Callable[[object], bool]:
    if tp is int:
        return lambda v: type(v) is int
    if tp is float:
        return lambda v: type(v) is float or type(v) is int
    if tp is bool:
        return lambda v: type(v) is bool
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        members = tp._value2member_map_
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v in members
    if typing.get_origin(tp) is list:
        return lambda v: isinstance(v, list)
    if typing.get_origin(tp) is typing.Union:
        options = [_accepts(t) for t in typing.get_args(tp)]
        return lambda v: any(a(v) for a in options)
    if tp is type(None):
        return lambda v: v is None
    return lambda v: isinstance(v, tp)


def _kind(obj: object) -> str:
    return "missing" if obj is None else f"a {type(obj).__name__} ({str(obj)[:40]})"


def _name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


# -- indices, arenas and constants --------------------------------------------------------------


def check_plan(plan: schema.ExecutionPlan) -> None:
    """Every index the plan holds points at something that exists, of the kind it must be."""
    n = len(plan.values)
    arenas = plan.non_const_buffer_sizes
    if any(size < 0 for size in arenas):
        raise CheckError(f"planned memory sizes {list(arenas)} are negative")
    for i, ev in enumerate(plan.values):
        val = ev.val
        if isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
            kind = schema.Int if isinstance(val, schema.IntList) else schema.Tensor
            for j in val.items:
                if j == -1 and isinstance(val, schema.OptionalTensorList):
                    continue
                if not 0 <= j < i:
                    raise CheckError(f"value {i}: list item {j} is not an earlier value")
                if not isinstance(plan.values[j].val, kind):
                    raise CheckError(f"value {i}: list item {j} is a {type(plan.values[j].val).__name__}, "
                                     f"not a {kind.__name__}")
        elif isinstance(val, schema.Tensor):
            _check_tensor(i, val, arenas)
    for what, ids in (("input", plan.inputs), ("output", plan.outputs)):
        for j in ids:
            if not 0 <= j < n:
                raise CheckError(f"program {what} value {j} of {n} does not exist")
    chains = plan.chains
    if len(chains) != 1:
        raise CheckError(f"{len(chains)} chains; one is supported")
    instructions = chains[0].instructions
    for pc, instruction in enumerate(instructions):
        a = instruction.instr_args
        if isinstance(a, schema.KernelCall):
            ids = a.args
            if not 0 <= a.op_index < len(plan.operators):
                raise CheckError(f"instruction {pc}: operator {a.op_index} of {len(plan.operators)} does not exist")
        elif isinstance(a, schema.DelegateCall):
            ids = a.args
            if not 0 <= a.delegate_index < len(plan.delegates):
                raise CheckError(f"instruction {pc}: delegate {a.delegate_index} of {len(plan.delegates)} "
                                 "does not exist")
        elif isinstance(a, schema.MoveCall):
            ids = [a.move_from, a.move_to]
        elif isinstance(a, schema.JumpFalseCall):
            ids = [a.cond_value_index]
            if not 0 <= a.destination_instruction <= len(instructions):
                raise CheckError(f"instruction {pc}: jump to {a.destination_instruction} lies outside the chain")
        else:
            ids = [a.value_index]
        for j in ids:
            if not 0 <= j < n:
                raise CheckError(f"instruction {pc}: value {j} of {n} does not exist")
    for i, op in enumerate(plan.operators):
        if not op.name.isprintable() or not op.overload.isprintable() or "::" not in op.name:
            raise CheckError(f"operator {i} has a malformed name {op.name!r}.{op.overload!r}")
    _check_memory_plan(plan)


def _planned(plan: schema.ExecutionPlan) -> dict[int, tuple[int, int, int]]:
    """value -> (arena, first byte, end) of each tensor in planned memory."""
    placed = {}
    for j, ev in enumerate(plan.values):
        t = ev.val
        if isinstance(t, schema.Tensor) and t.allocation_info is not None:
            a = t.allocation_info
            start = a.memory_offset_low | (a.memory_offset_high << 32)
            nbytes = math.prod(t.sizes) * operators.DTYPES[int(t.scalar_type)].itemsize
            placed[j] = (a.memory_id, start, start + nbytes)
    return placed


def _check_memory_plan(plan: schema.ExecutionPlan) -> None:
    """Arenas no larger than what is placed in them, and no two tensors that are live at
    once overlapping in them, unless they are the same bytes seen twice (as a static
    reshape is: the same start and size)."""
    placed = _planned(plan)
    reach = [0] * len(plan.non_const_buffer_sizes)
    for arena, _, end in placed.values():
        reach[arena] = max(reach[arena], end)
    for arena, size in enumerate(plan.non_const_buffer_sizes):
        if arena and size > reach[arena] + ARENA_SLACK:
            raise CheckError(f"planned memory {arena} is {size} bytes, its tensors reach {reach[arena]}")
    live = _lifetimes(plan, set(placed))
    active: list[tuple[int, int]] = []  # (value, last instruction), in planned memory now
    for j in sorted(live, key=lambda v: live[v][0]):
        first, last = live[j]
        arena, start, end = placed[j]
        if start == end:
            continue
        active = [(k, k_last) for k, k_last in active if k_last >= first]
        for k, _ in active:
            k_arena, k_start, k_end = placed[k]
            if k_arena == arena and k_start < end and start < k_end and (k_start, k_end) != (start, end):
                raise CheckError(f"values {k} and {j} are live at once and overlap in planned memory {arena} "
                                 f"(bytes {k_start}-{k_end} and {start}-{end})")
        active.append((j, last))


def _lifetimes(plan: schema.ExecutionPlan, tensors: set[int]) -> dict[int, tuple[int, int]]:
    """value -> (first, last) instruction that names it, directly or in a list; program
    inputs live from the start, outputs to the end, and values named inside a loop (a
    backward jump) for the whole loop."""
    in_lists: dict[int, list[int]] = {}
    for i, ev in enumerate(plan.values):
        if isinstance(ev.val, (schema.TensorList, schema.OptionalTensorList)):
            for j in ev.val.items:
                in_lists.setdefault(i, []).append(j)
    instructions = plan.chains[0].instructions
    end = len(instructions)
    live: dict[int, list[int]] = {}

    def touch(j: int, pc: int) -> None:
        for k in [j, *in_lists.get(j, ())]:
            if k in tensors:
                span = live.setdefault(k, [pc, pc])
                span[0], span[1] = min(span[0], pc), max(span[1], pc)

    loops = []
    for pc, instruction in enumerate(instructions):
        for j in _named(instruction.instr_args):
            touch(j, pc)
        a = instruction.instr_args
        if isinstance(a, schema.JumpFalseCall) and a.destination_instruction <= pc:
            loops.append((a.destination_instruction, pc))
    for j in plan.inputs:
        touch(j, -1)
    for j in plan.outputs:
        touch(j, end)
    for start, stop in loops:
        for span in live.values():
            if span[0] <= stop and span[1] >= start:
                span[0], span[1] = min(span[0], start), max(span[1], stop)
    return {j: (span[0], span[1]) for j, span in live.items()}


def _named(a) -> list[int]:
    if isinstance(a, (schema.KernelCall, schema.DelegateCall)):
        return list(a.args)
    if isinstance(a, schema.MoveCall):
        return [a.move_from, a.move_to]
    if isinstance(a, schema.JumpFalseCall):
        return [a.cond_value_index]
    return [a.value_index]


def _check_tensor(i: int, t: schema.Tensor, arenas: list[int]) -> None:
    dtype = operators.DTYPES.get(int(t.scalar_type))
    if dtype is None:
        raise CheckError(f"value {i}: tensor dtype {t.scalar_type!r} is not supported")
    sizes = list(t.sizes)
    if any(s < 0 for s in sizes) or math.prod(sizes) > MAX_NUMEL:
        raise CheckError(f"value {i}: tensor sizes {sizes} are not a tensor's")
    if sorted(t.dim_order) != list(range(len(sizes))):
        raise CheckError(f"value {i}: dim_order {list(t.dim_order)} does not fit sizes {sizes}")
    if t.storage_offset != 0:
        raise CheckError(f"value {i}: storage offset {t.storage_offset} (tensors start at their data)")
    a = t.allocation_info
    if a is not None:
        offset = a.memory_offset_low | (a.memory_offset_high << 32)
        nbytes = math.prod(sizes) * dtype.itemsize
        if not 0 < a.memory_id < len(arenas) or offset + nbytes > arenas[a.memory_id]:
            raise CheckError(f"value {i}: {nbytes} bytes at {offset} of arena {a.memory_id} lie outside "
                             f"the planned memory {list(arenas)}")
        if offset % dtype.itemsize:
            raise CheckError(f"value {i}: offset {offset} is not aligned to {dtype}")


def check_constants(program: schema.Program, segment_size: int | None) -> None:
    """The constant segment's offsets rise and each constant exactly fills its slot.

    `segment_size` is the constant segment's size in bytes (None when the program keeps
    its constants inline). The serializer pads each constant to the segment's alignment,
    so a slot is at least the constant's bytes and less than them plus the alignment: a
    tensor re-pointed at another constant, or an offset changed, breaks that.
    """
    if segment_size is None:
        return
    offsets = list(program.constant_segment.offsets)
    if not offsets:
        return
    ends = offsets[1:] + [segment_size]
    for i, (start, end) in enumerate(zip(offsets, ends)):
        if not 0 <= start <= end:
            raise CheckError(f"constant {i} starts at {start}, after the next constant ({end})")
    used: dict[int, int] = {}
    for ev in program.execution_plan[0].values:
        t = ev.val
        if isinstance(t, schema.Tensor) and t.allocation_info is None and t.data_buffer_idx > 0:
            dtype = operators.DTYPES[int(t.scalar_type)]
            nbytes = math.prod(t.sizes) * dtype.itemsize
            used[t.data_buffer_idx] = max(used.get(t.data_buffer_idx, 0), nbytes)
    # The alignment the serializer used: the largest power of two dividing every offset.
    alignment = 1
    nonzero = [o for o in offsets if o]
    if nonzero:
        common = math.gcd(*nonzero)
        alignment = common & -common
    alignment = max(alignment, 1)
    for index, nbytes in used.items():
        if not 0 < index < len(offsets):
            raise CheckError(f"constant {index} of {len(offsets)} does not exist")
        slot = ends[index] - offsets[index]
        if nbytes > slot or (slot >= nbytes + alignment and nbytes):
            raise CheckError(f"constant {index}: a tensor of {nbytes} bytes does not fill its slot of {slot} "
                             f"bytes at {offsets[index]} (alignment {alignment})")


# -- shapes and dtypes ---------------------------------------------------------------------------

class Delegates:
    """What the shape check knows of a program's delegates: WebGPU LayerNorms by their
    blob's params (index -> params); another backend's delegates not at all (their outputs
    stay as the file declares them)."""

    def __init__(self, params: dict[int, object]) -> None:
        self.params = params

    def output_count(self, index: int) -> int | None:
        params = self.params.get(index)
        return None if params is None else len(params.outputs)

    def outputs(self, index: int, args: list) -> list | None:
        """The delegate's outputs as meta tensors for `args` (the call's values: inputs,
        then outputs); CheckError when the inputs do not fit it."""
        params = self.params.get(index)
        return None if params is None else layer_norm_outputs(params, args)


def check_shapes(plan: schema.ExecutionPlan, delegates: Delegates,
                 input_shapes: Sequence[Sequence[int]] | None = None) -> None:
    """Run every instruction once on meta tensors, in file order, and hold each operator's
    and delegate's outputs against the tensors the file declares for them.

    Jumps are not taken: both branches of a `torch.cond` run here, each producing what its
    outputs declare. With `input_shapes` (a dynamic program's inputs), the program's tensor
    inputs take those shapes instead of their upper bounds.
    """
    values: list = []
    for ev in plan.values:
        values.append(_meta_value(ev.val, values))
    shapes = input_shapes if input_shapes is not None else [None] * len(plan.inputs)
    for j, shape in zip(plan.inputs, shapes):
        declared = plan.values[j].val
        if isinstance(declared, schema.Tensor):
            values[j] = _meta_value(declared, values, data=True)
            if shape is not None:
                values[j] = torch.empty(list(shape), dtype=values[j].dtype, device="meta")
    instructions = plan.chains[0].instructions
    # Planned memory holds nothing until an instruction writes it (or the caller, for an
    # input): an instruction that reads a tensor before then is damage. Not checked across
    # a loop (a backward jump), where a later instruction writes what an earlier one reads.
    loops = any(isinstance(i.instr_args, schema.JumpFalseCall) and i.instr_args.destination_instruction <= pc
                for pc, i in enumerate(instructions))
    placed = _planned(plan)
    unread = cache(lambda: _unread(plan, delegates))  # needed only by an output declared empty
    written = _Written(placed)
    written.update(plan.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pc, instruction in enumerate(instructions):
            a = instruction.instr_args
            try:
                if not loops:
                    _check_written(plan, a, written, delegates)
                if isinstance(a, schema.KernelCall):
                    _check_kernel(plan, a, values, unread)
                elif isinstance(a, schema.DelegateCall):
                    _check_delegate(plan, a, values, delegates)
                elif isinstance(a, schema.MoveCall):
                    values[a.move_to] = values[a.move_from]
            except CheckError as exc:
                raise CheckError(f"instruction {pc} {_what(plan, a)}: {exc}") from None
            except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
                raise CheckError(f"instruction {pc} {_what(plan, a)} cannot run on the tensors the program "
                                 f"declares: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    if not loops:
        for j in plan.outputs:
            t = plan.values[j].val
            if isinstance(t, schema.Tensor) and t.allocation_info is not None and j not in written:
                raise CheckError(f"program output {j} is never written")


class _Written:
    """The values written so far, by where they lie in planned memory: a static reshape is
    another value over the same bytes, written when its base is."""

    def __init__(self, placed: dict[int, tuple[int, int, int]]) -> None:
        self.placed = placed
        self.spans: set[tuple[int, int, int]] = set()
        self.values: set[int] = set()

    def update(self, ids) -> None:
        for j in ids:
            self.values.add(j)
            if j in self.placed:
                self.spans.add(self.placed[j])

    def __contains__(self, j: int) -> bool:
        return j in self.values or self.placed.get(j) in self.spans


def _check_written(plan: schema.ExecutionPlan, a, written: _Written, delegates: Delegates) -> None:
    """What instruction `a` reads in planned memory was written before; adds what it writes."""
    if isinstance(a, schema.FreeCall):
        return
    found = accesses(plan, a, delegates)
    if found is None:  # another backend's delegate: which values it writes is its own
        written.update(_items(plan, list(a.args)))
        return
    reads, writes = found
    for j in reads:
        t = plan.values[j].val
        if isinstance(t, schema.Tensor) and t.allocation_info is not None and t.data_buffer_idx == 0 \
                and j not in written:
            raise CheckError(f"reads value {j} before any instruction writes it")
    written.update(writes)


def accesses(plan: schema.ExecutionPlan, a, delegates: Delegates) -> tuple[list[int], list[int]] | None:
    """(values read, values written) by instruction `a`, the tensors of tensor lists
    among them; None for another backend's delegate (what it writes is its own). A
    FreeCall writes its value (it unbinds it)."""
    if isinstance(a, schema.KernelCall):
        op = plan.operators[a.op_index]
        overload = operators.find_overload(op.name, op.overload)
        ids = list(a.args)
        if overload is None:  # ExecuTorch's own primitives: the result is the last value
            outs = {len(ids) - 1}
        else:
            args = overload._schema.arguments
            outs = {i for i, arg in enumerate(args) if arg.alias_info is not None and arg.alias_info.is_write}
            outs |= set(range(len(args), len(ids)))
        reads = [ids[i] for i in range(len(ids)) if i not in outs]
        writes = [ids[i] for i in sorted(outs) if i < len(ids)]
    elif isinstance(a, schema.DelegateCall):
        ids = list(a.args)
        n_out = delegates.output_count(a.delegate_index)
        if n_out is None:
            return None
        reads, writes = ids[: len(ids) - n_out], ids[len(ids) - n_out:]
    elif isinstance(a, schema.MoveCall):
        reads, writes = [a.move_from], [a.move_to]
    elif isinstance(a, schema.JumpFalseCall):
        reads, writes = [a.cond_value_index], []
    else:
        reads, writes = [], [a.value_index]
    return _items(plan, reads), _items(plan, writes)


def _items(plan: schema.ExecutionPlan, ids: list[int]) -> list[int]:
    """`ids` with the tensors of tensor lists among them."""
    out = []
    for j in ids:
        val = plan.values[j].val
        out.append(j)
        if isinstance(val, (schema.TensorList, schema.OptionalTensorList)):
            out.extend(k for k in val.items if k >= 0)
    return out


def _what(plan: schema.ExecutionPlan, a) -> str:
    if isinstance(a, schema.KernelCall):
        op = plan.operators[a.op_index]
        return f"({op.name}.{op.overload})" if op.overload else f"({op.name})"
    if isinstance(a, schema.DelegateCall):
        return f"(delegate {a.delegate_index})"
    return f"({type(a).__name__})"


def _meta_value(val, values: list, data: bool = False):
    if isinstance(val, schema.Tensor):
        if not data and val.allocation_info is None and val.data_buffer_idx == 0:
            return None  # no memory of its own until an instruction (or the caller) sets it
        dtype = operators.DTYPES[int(val.scalar_type)]
        return _meta_tensor(list(val.sizes), list(val.dim_order), dtype)
    plain = plain_value(val, values)
    return None if plain is NotImplemented else plain


def plain_value(val, values: list):
    """A value that is not a tensor, as Python: an int, bool, double, string or None, a list
    of those, or a list of earlier values (gathered from `values`); NotImplemented for a
    tensor or anything else."""
    if isinstance(val, schema.Int):
        return val.int_val
    if isinstance(val, schema.Bool):
        return val.bool_val
    if isinstance(val, schema.Double):
        return float(val.double_val)
    if isinstance(val, schema.String):
        return val.string_val
    if isinstance(val, schema.Null):
        return None
    if isinstance(val, (schema.DoubleList, schema.BoolList)):
        return list(val.items)
    if isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
        return gather(val, values)
    return NotImplemented


def _meta_tensor(sizes: list[int], dim_order: list[int], dtype: torch.dtype) -> torch.Tensor:
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")


def gather(val, values: list) -> list:
    """The items of a list value (IntList, TensorList, OptionalTensorList) from `values`."""
    if isinstance(val, schema.OptionalTensorList):
        return [None if j == -1 else values[j] for j in val.items]
    return [values[j] for j in val.items]


def _check_kernel(plan: schema.ExecutionPlan, a: schema.KernelCall, values: list,
                  unread: Callable[[], frozenset[int]] = frozenset) -> None:
    op = plan.operators[a.op_index]
    ids = list(a.args)
    for j in ids:  # lists of values that instructions change (sizes) are gathered again
        val = plan.values[j].val
        if isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
            values[j] = gather(val, values)
    overload = operators.find_overload(op.name, op.overload)
    functional = _functional(overload) if overload is not None else None
    if overload is not None:
        # Every argument, then the return: one value, a tensor list when there are several.
        # ExecuTorch's emitter passes an out variant's outs as its return even where the
        # schema returns nothing (`split_with_sizes_copy.out(...) -> ()`).
        expected = len(overload._schema.arguments) + (1 if overload._schema.returns or _is_out(overload) else 0)
        if len(ids) != expected:
            raise CheckError(f"{len(ids)} arguments, the operator takes {expected} (its return included)")
        written = [ids[i] for i, arg in enumerate(overload._schema.arguments)
                   if arg.alias_info is not None and arg.alias_info.is_write]
        for j in _items(plan, written):
            if isinstance(plan.values[j].val, schema.Tensor) and values[j] is None:
                raise CheckError(f"writes value {j}, a tensor with no memory (neither planned nor constant)")
    if functional is not None:
        fn, keep, outs = functional
        args = overload._schema.arguments
        vals = [operators.convert(args[i], values[ids[i]]) for i in keep]
        positional = [v for i, v in zip(keep, vals) if not args[i].kwarg_only]
        named = {args[i].name: v for i, v in zip(keep, vals) if args[i].kwarg_only}
        results = _meta_call(fn, positional, named)
        if results is None:
            return  # no meta kernel (a data-dependent operator): its outputs stay as declared
        out_ids = [ids[i] for i in outs]
        if len(outs) == 1 and isinstance(plan.values[out_ids[0]].val, schema.TensorList):
            targets = list(plan.values[out_ids[0]].val.items)
        else:
            targets = out_ids
        if len(results) != len(targets):
            raise CheckError(f"the operator produces {len(results)} tensors, the file declares {len(targets)}")
        for j, got in zip(targets, results):
            if _left_empty(plan, j, got, unread):
                values[j] = torch.empty(list(plan.values[j].val.sizes), dtype=got.dtype, device="meta")
                continue
            _check_declared(plan, j, got)
            values[j] = got
        _check_constant_dtypes(plan, fn, [args[i] for i in keep], [ids[i] for i in keep], vals, results)
        return
    kernel = operators.resolve(op.name, op.overload, True)
    if kernel is None:
        return  # an operator this runtime does not know (another runtime's file): not checked
    try:
        kernel(values, ids)
    except NotImplementedError:
        return
    for j in ids:
        if isinstance(plan.values[j].val, schema.Tensor) and isinstance(values[j], torch.Tensor):
            _check_declared(plan, j, values[j])


def _left_empty(plan: schema.ExecutionPlan, j: int, got: torch.Tensor, unread: Callable[[], frozenset[int]]) -> bool:
    """Whether value `j` is an output the file declares empty and nothing reads: ExecuTorch's
    kernels leave such an output as declared (the statistics of
    `_native_batch_norm_legit_no_training.out`, which exported graphs declare [0])."""
    declared = plan.values[j].val
    return (isinstance(declared, schema.Tensor) and 0 in list(declared.sizes) and got.dim() == len(declared.sizes)
            and got.dtype == operators.DTYPES[int(declared.scalar_type)] and j in unread())


def _unread(plan: schema.ExecutionPlan, delegates: Delegates) -> frozenset[int]:
    """The values no instruction reads and the program does not return."""
    read = set(plan.outputs)
    for instruction in plan.chains[0].instructions:
        found = accesses(plan, instruction.instr_args, delegates)
        if found is None:  # another backend's delegate: all its values may be read
            read.update(_items(plan, list(instruction.instr_args.args)))
        else:
            read.update(found[0])
    return frozenset(set(range(len(plan.values))) - read)


def _is_constant(val) -> bool:
    return isinstance(val, schema.Tensor) and val.allocation_info is None and val.data_buffer_idx > 0


def _check_constant_dtypes(plan: schema.ExecutionPlan, fn, args: list, ids: list[int], vals: list,
                           results: list) -> None:
    """A constant that an operator reads has the dtype of one of the operator's other tensors.

    ExecuTorch's exporter stores a constant in the dtype its operator computes in (it casts
    the inputs of a mixed-dtype add, sub, mul or div itself), and type promotion would hide a
    re-declared one: a float tensor times a constant re-declared int32 or float16 is still
    float, computed from other numbers. So a constant whose dtype none of the call's other
    tensors has is refused when the operator takes it in theirs just as well. An argument
    the operator holds to a dtype of its own (the meta kernel refuses it in theirs: a mask,
    a condition; or by its schema name, an index or an exponent: bloom's ALiBi raises float
    to an int32 constant exponent) keeps it, as does an operator given a `dtype`.
    """
    if any(str(arg.type).rstrip("?") == "ScalarType" and v is not None for arg, v in zip(args, vals)):
        return
    for k, (arg, j) in enumerate(zip(args, ids)):
        if arg.name in OWN_DTYPE_ARGUMENTS:
            continue
        val = plan.values[j].val
        if isinstance(val, schema.Tensor):
            found = [(None, j)] if _is_constant(val) else []
        elif isinstance(val, (schema.TensorList, schema.OptionalTensorList)):
            found = [(m, item) for m, item in enumerate(val.items) if item >= 0 and _is_constant(plan.values[item].val)]
        else:
            continue
        for m, c in found:
            mine = vals[k] if m is None else vals[k][m]
            others = [v for n, v in enumerate(vals) if n != k] + list(results)
            if m is not None:
                others += [v for n, v in enumerate(vals[k]) if n != m]
            dtypes = {t.dtype for t in _tensors(others)}
            if not dtypes or mine.dtype in dtypes:
                continue
            for dtype in sorted(dtypes, key=str):
                swapped = torch.empty_strided(tuple(mine.shape), mine.stride(), dtype=dtype, device="meta")
                trial = list(vals)
                trial[k] = swapped if m is None else [*vals[k][:m], swapped, *vals[k][m + 1:]]
                try:
                    fn(*[v for a, v in zip(args, trial) if not a.kwarg_only],
                       **{a.name: v for a, v in zip(args, trial) if a.kwarg_only})
                except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
                    continue
                raise CheckError(f"reads constant value {c} as {mine.dtype}, a dtype none of its other tensors "
                                 f"has ({', '.join(sorted(map(str, dtypes)))}), where it takes {dtype} alike: "
                                 "a constant is stored in the dtype its operator computes in")


def _tensors(values: list):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(list(v))


# Transformer layers repeat the same operators on the same shapes: results by signature.
_RESULTS: dict[tuple, list[tuple] | None] = {}
_RESULTS_LIMIT = 65536
_UNKNOWN = object()


def _meta_call(fn, positional: list, named: dict) -> list[torch.Tensor] | None:
    """The meta tensors `fn` returns for these arguments; None when it has no meta kernel."""
    try:
        key = (fn, _signature(positional), _signature(list(named.items())))
    except TypeError:  # an argument that cannot be a key: call without the cache
        key = None
    cached = _RESULTS.get(key, _UNKNOWN) if key is not None else _UNKNOWN
    if cached is not _UNKNOWN:
        return None if cached is None else [
            torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in cached]
    try:
        result = fn(*positional, **named)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
    except NotImplementedError:
        results = None
    if key is not None and (results is None or all(isinstance(r, torch.Tensor) for r in results)):
        if len(_RESULTS) >= _RESULTS_LIMIT:
            _RESULTS.clear()
        _RESULTS[key] = None if results is None else [(tuple(r.shape), r.stride(), r.dtype) for r in results]
    return results


def _signature(value) -> object:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    hash(value)
    return (type(value), value)


def _is_out(overload) -> bool:
    """Whether the overload is an out variant: it writes keyword-only arguments."""
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in overload._schema.arguments)


@cache
def _functional(overload) -> tuple[object, list[int], list[int]] | None:
    """For an out-variant overload: the functional overload taking the same arguments but
    the outs, which argument positions it takes, and where the outs are."""
    args = overload._schema.arguments
    outs = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    if not outs:
        return None
    keep = [i for i in range(len(args)) if i not in outs]
    wanted = [(args[i].name, str(args[i].type)) for i in keep]
    packet = getattr(getattr(torch.ops, overload.namespace), overload._schema.name.split("::")[1])
    for name in packet.overloads():
        candidate = getattr(packet, name)
        cargs = candidate._schema.arguments
        if any(a.alias_info is not None for a in cargs):
            continue
        if [(a.name, str(a.type)) for a in cargs] == wanted:
            return candidate, keep, outs
    return None


def _check_declared(plan: schema.ExecutionPlan, j: int, got: torch.Tensor) -> None:
    """Check the tensor an instruction produced against value `j` as the file declares it: its
    dtype, and its shape equal to the declared one (static) or within it (upper bounds)."""
    declared = plan.values[j].val
    if not isinstance(declared, schema.Tensor):
        raise CheckError(f"value {j} receives a tensor but is a {type(declared).__name__}")
    if not isinstance(got, torch.Tensor):
        raise CheckError(f"value {j} is declared a tensor, the instruction makes a {type(got).__name__}")
    dtype = operators.DTYPES[int(declared.scalar_type)]
    bound = list(declared.sizes)
    shape = list(got.shape)
    static = declared.shape_dynamism == schema.TensorShapeDynamism.STATIC
    if got.dtype != dtype or len(shape) != len(bound) or any(
            s != b if static else s > b for s, b in zip(shape, bound)):
        raise CheckError(f"produces {got.dtype} {shape} for value {j}, which the file declares "
                         f"{dtype} {bound}{'' if static else ' (upper bounds)'}")


def _check_delegate(plan: schema.ExecutionPlan, a: schema.DelegateCall, values: list,
                    delegates: Delegates) -> None:
    produced = delegates.outputs(a.delegate_index, [values[j] for j in a.args])
    if produced is None:
        return
    n_out = len(produced)
    out_ids = list(a.args)[len(a.args) - n_out:]
    for j, got in zip(out_ids, produced):
        _check_declared(plan, j, got)
        values[j] = got


def layer_norm_outputs(params, args: list) -> list[torch.Tensor]:
    """What a WebGPU LayerNorm delegate with `params` returns when called with `args`
    (inputs, then outputs), as meta tensors; CheckError when the inputs do not fit it."""
    from pipeline.blob import INPUT

    n_in, n_out = params.arguments, len(params.outputs)
    if len(args) != n_in + n_out:
        raise CheckError(f"the delegate takes {n_in} inputs and {n_out} outputs, the call passes {len(args)} values")
    inputs = args[:n_in]
    x = inputs[params.input_index]
    if not isinstance(x, torch.Tensor):
        raise CheckError(f"its input is a {type(x).__name__}, not a tensor")
    dtype = getattr(torch, params.dtype)
    affine = getattr(torch, params.affine_dtype)
    if x.dtype != dtype:
        raise CheckError(f"its input is {x.dtype}, the delegate was built for {dtype}")
    normalized = params.resolve(tuple(x.shape))
    if not all(d >= 1 for d in normalized):
        raise CheckError(f"it would normalize over {list(normalized)} values of input shape {list(x.shape)}")
    for role in ("weight", "bias"):
        operand = getattr(params, role)
        if operand.source == INPUT:
            t = inputs[operand.index]
            if not isinstance(t, torch.Tensor) or t.dtype != affine or tuple(t.shape) != tuple(normalized):
                raise CheckError(f"its {role} is {_kind(t) if not isinstance(t, torch.Tensor) else t.dtype} "
                                 f"{list(getattr(t, 'shape', []))}, expected {affine} {list(normalized)}")
    stats_shape = list(x.shape[: x.dim() - len(normalized)]) + [1] * len(normalized)
    shapes = (list(x.shape), stats_shape, stats_shape)
    dtypes = (dtype, affine, affine)
    return [torch.empty(shapes[i], dtype=dtypes[i], device="meta") for i in params.outputs]



def check_program(pte, backend_id: str) -> None:
    """A parsed file's shapes and dtypes, for a runtime that runs delegates of other
    backends too (ExecuTorch's): our delegates' blobs are decoded and their outputs
    derived, XNNPACK's payloads checked (`xnnpack_payload`), others' outputs taken as
    declared. CheckError otherwise."""
    from pipeline import blob
    from pipeline.pte import xnnpack_payload

    params = {}
    for i, d in enumerate(pte.plan.delegates):
        if d.id == backend_id:
            try:
                params[i] = blob.decode(pte.delegate_bytes(d)).params
            except ValueError as exc:
                raise CheckError(f"delegate {i}: {exc}") from None
    try:  # XNNPACK's payloads: ExecuTorch's XNNPACK runtime trusts their graph
        xnnpack_payload.check_program_delegates(pte)
    except ValueError as exc:
        raise CheckError(str(exc)) from None
    check_shapes(pte.plan, Delegates(params))
