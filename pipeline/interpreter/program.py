"""`Program`: runs a serialized ExecuTorch program (`.pte` bytes) in Python.

Follows ExecuTorch's method.cpp: values are parsed in order (tensors become views of
the planned memory arenas or of the file's constant segment), delegates are initialised
in order, then each call copies the inputs into planned memory and runs the chain:
`KernelCall` through `pipeline.pte.operators`, `DelegateCall` through our WebGPU
runtime with the decoded blob, `MoveCall`, `JumpFalseCall` and `FreeCall` as ExecuTorch
defines them. Tensors that share planned memory share it here too (static reshapes
are values at the same offset), so the file's memory plan is what runs.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from executorch.exir import schema

from pipeline import blob
from pipeline.ioutil import write_bytes_atomic
from pipeline.pte import inputs as _inputs
from pipeline.pte import operators, verify
from pipeline.pte.file import PteError, PteFile
from pipeline.runtime.delegate import LayerNormDelegate

MAX_INSTRUCTIONS = 10_000_000  # ExecuTorch's cap on one run
MAX_CHECKED_SHAPES = 1024  # input shapes of a dynamic program remembered as checked
# Operators that are a LayerNorm left outside the delegate (what coverage counts as missed).
_LAYER_NORM_OPS = ("aten::native_layer_norm", "aten::layer_norm", "aten::native_group_norm", "aten::group_norm")


@dataclass
class Coverage:
    """How many norms of the program were delegated.

    `total` counts the norms that run: LayerNorms, GroupNorms (reframed as LayerNorms),
    RMSNorms and LayerNorms written by hand, and the chains that look like a norm and stay on
    the CPU (each in `not_delegated` with its reason). `kinds` holds, where the program was
    lowered in this process, {kind: {"total": n, "delegated": d}} for each kind found. `dead`
    lists, as (node, module path), the norms of the exported graph whose output nothing uses,
    which lowering removes as dead code (known only to the process that lowered the
    program). Complete: every norm found is delegated."""

    total: int
    delegated: int
    not_delegated: list[tuple[str, str]] = field(default_factory=list)
    dead: list[tuple[str, str]] = field(default_factory=list)
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    # Chains that look like a norm and stay on the CPU, as (node, reason); in not_delegated too.
    norm_like: list[tuple[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.delegated == self.total and not self.not_delegated

    def kinds_line(self) -> str:
        """Delegated of total by kind, e.g. "RMSNorm 5/5, hand-written LayerNorm 0/3"; "" when not known."""
        return ", ".join(f"{kind} {c['delegated']}/{c['total']}" for kind, c in self.kinds.items())


@dataclass(frozen=True)
class LayerNormSite:
    """One LayerNorm of the program, in execution order: a delegate or a CPU kernel call."""

    name: str  # the delegate's name (see Program.delegate_names) or "instruction N"
    delegated: bool
    delegate: LayerNormDelegate | None = None
    operator: str = "aten::native_layer_norm"

    @property
    def rms(self) -> bool:
        """An RMSNorm's delegate (a CPU kernel call counts as a LayerNorm)."""
        return self.delegated and self.delegate.params.op == "rms_norm"


class Program:
    """A serialized program, ready to run: `program(*inputs)` returns what the module returns.

    `coverage` counts the file's LayerNorms: one per WebGPU delegate, plus LayerNorm
    operators left to CPU operators. `save(path)` writes the same bytes that run.
    """

    def __init__(self, pte: PteFile, *, coverage: Coverage | None = None,
                 delegate_names: list[str] | None = None, edge=None) -> None:
        self._pte = pte
        self.edge = edge  # the EdgeProgramManager when lowered in this process, else None
        plan = pte.plan
        self._plan = plan
        self._dynamic = any(
            isinstance(v.val, schema.Tensor) and v.val.shape_dynamism != schema.TensorShapeDynamism.STATIC
            for v in plan.values
        )
        self._arenas = [torch.empty(0, dtype=torch.uint8)] + [
            torch.empty(size, dtype=torch.uint8) for size in plan.non_const_buffer_sizes[1:]
        ]
        self._values = self._initial_values()
        self._delegates = self._init_delegates()
        names = delegate_names or [f"delegate_{i}" for i in range(len(self._delegates))]
        if len(names) != len(self._delegates):
            raise ValueError(f"{len(names)} delegate names for {len(self._delegates)} delegates")
        self.delegate_names = names
        self._steps, self.layer_norm_sites = self._init_chain()
        try:
            verify.check_shapes(plan, self._shape_rules())
        except verify.CheckError as exc:
            raise self._fail(str(exc)) from None
        # What each step of the chain runs: "operator.overload", "delegate", "move", "jump", "free".
        self.step_labels = tuple(_label(plan, i.instr_args) for i in plan.chains[0].instructions)
        self.coverage = coverage if coverage is not None else self._file_coverage()
        try:
            self._in_spec, self._out_spec = _inputs.specs(plan)
        except _inputs.SignatureError as exc:
            raise self._fail(str(exc)) from None
        # A dynamic program's input shapes are checked by shape propagation once each.
        self._checked_shapes: set[tuple] = set()
        self._ranges: dict[int, dict[int, tuple[int, int]]] | None = None
        # One set of values and planned memory: calls from several threads take turns.
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | os.PathLike) -> Program:
        """Read and check the `.pte` at `path`; raises PteError for anything it cannot run."""
        return cls(PteFile.read(path))

    @property
    def delegates(self) -> tuple[LayerNormDelegate, ...]:
        """The decoded delegates, in the plan's order; each knows its blob's `params`."""
        return tuple(self._delegates)

    @property
    def num_delegates(self) -> int:
        return len(self._delegates)

    @property
    def buffer(self) -> bytes:
        """The program's bytes: what `save` writes."""
        return bytes(self._pte.data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the program (`.pte`) atomically."""
        write_bytes_atomic(path, self._pte.data)

    # -- loading -------------------------------------------------------------------------

    def _fail(self, what: str) -> PteError:
        return PteError(f"{self._pte.source}: {what}")

    def _initial_values(self) -> list:
        values: list = []
        with warnings.catch_warnings():
            # Constants view the program's immutable bytes; kernels never write them.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            for i, ev in enumerate(self._plan.values):
                values.append(self._value(i, ev.val, values))
        return values

    def _value(self, i: int, val, values: list):
        plain = verify.plain_value(val, values)  # list items are earlier values (verify.check_plan)
        if plain is not NotImplemented:
            return plain
        if isinstance(val, schema.Tensor):
            return self._tensor(i, val)
        raise self._fail(f"value {i}: unsupported value type {type(val).__name__}")

    def _tensor(self, i: int, t: schema.Tensor) -> torch.Tensor | None:
        # dtype, dim order and place in planned memory are checked (verify.check_plan).
        dtype = operators.DTYPES[int(t.scalar_type)]
        sizes = list(t.sizes)
        numel = math.prod(sizes)
        nbytes = numel * dtype.itemsize
        info = t.extra_tensor_info
        if info is not None and info.location == schema.TensorDataLocation.EXTERNAL:
            raise self._fail(f"value {i}: tensor data in an external file (.ptd) is not supported")
        if t.allocation_info is not None:
            if t.data_buffer_idx > 0:
                raise self._fail(f"value {i}: mutable tensors with initial data are not supported")
            a = t.allocation_info
            offset = a.memory_offset_low | (a.memory_offset_high << 32)
            return _strided(self._arenas[a.memory_id][offset : offset + nbytes].view(dtype), sizes, list(t.dim_order))
        if t.data_buffer_idx == 0:
            return None  # no memory of its own: set by the caller (an input) or by a view op
        buffer, offset = self._pte.constant(t.data_buffer_idx, nbytes)
        flat = torch.frombuffer(buffer, dtype=dtype, count=numel, offset=offset) if numel else (
            torch.empty(0, dtype=dtype))
        return _strided(flat, sizes, list(t.dim_order))

    def _init_delegates(self) -> list[LayerNormDelegate]:
        delegates = []
        for i, d in enumerate(self._plan.delegates):
            if d.id != blob.BACKEND_ID:
                raise self._fail(f"delegate {i} is for backend {d.id!r}; this runtime runs only {blob.BACKEND_ID}")
            if d.compile_specs:
                raise self._fail(f"delegate {i}: {blob.BACKEND_ID} takes no compile specs, got "
                                 f"{[s.key for s in d.compile_specs]}")
            try:
                delegates.append(LayerNormDelegate(self._pte.delegate_bytes(d)))
            except ValueError as exc:
                raise self._fail(f"delegate {i}: {exc}") from None
        return delegates

    def _init_chain(self) -> tuple[list[Callable], list[LayerNormSite]]:
        # Indices (values, operators, delegates, jumps) are checked (verify.check_plan).
        plan = self._plan
        steps: list[Callable] = []
        sites: list[LayerNormSite] = []
        missing = set()
        instructions = plan.chains[0].instructions
        for pc, instruction in enumerate(instructions):
            a = instruction.instr_args
            if isinstance(a, schema.KernelCall):
                ids = list(a.args)
                op = plan.operators[a.op_index]
                name = f"{op.name}.{op.overload}" if op.overload else op.name
                kernel = operators.resolve(op.name, op.overload, self._dynamic)
                if kernel is None:
                    missing.add(name)
                    continue
                if op.name in _LAYER_NORM_OPS:
                    sites.append(LayerNormSite(f"instruction {pc}", False, operator=op.name))
                steps.append(self._kernel_step(kernel, ids))
            elif isinstance(a, schema.DelegateCall):
                ids = list(a.args)
                delegate = self._delegates[a.delegate_index]
                n_in, n_out = delegate.params.arguments, len(delegate.params.outputs)
                if len(ids) != n_in + n_out:
                    raise self._fail(f"instruction {pc}: delegate {a.delegate_index} takes {n_in} inputs and "
                                     f"{n_out} outputs, the call passes {len(ids)} values")
                sites.append(LayerNormSite(self.delegate_names[a.delegate_index], True, delegate))
                steps.append(self._delegate_step(a.delegate_index, ids[:n_in], ids[n_in:]))
            elif isinstance(a, schema.MoveCall):
                steps.append(_move_step(a.move_from, a.move_to))
            elif isinstance(a, schema.JumpFalseCall):
                steps.append(_jump_step(a.cond_value_index, a.destination_instruction))
            else:  # FreeCall: the schema's instructions are these five (verify.check_structure)
                steps.append(_free_step(a.value_index))
        if missing:
            raise self._fail(f"operators with no kernel here: {', '.join(sorted(missing))}")
        return steps, sites

    def _kernel_step(self, kernel, ids: list[int]) -> Callable:
        # Lists whose items are values that can change (sizes, rebound tensors) are
        # gathered again before each use.
        plan_values = self._plan.values
        lists = [(j, plan_values[j].val) for j in ids
                 if isinstance(plan_values[j].val, (schema.IntList, schema.TensorList, schema.OptionalTensorList))]

        if not lists:
            def step(values, hook):
                kernel(values, ids)
        else:
            def step(values, hook):
                for j, val in lists:
                    values[j] = verify.gather(val, values)
                kernel(values, ids)
        return step

    def _delegate_step(self, index: int, in_ids: list[int], out_ids: list[int]) -> Callable:
        delegate = self._delegates[index]
        name = self.delegate_names[index]

        def step(values, hook):
            inputs = [values[j] for j in in_ids]
            results = delegate(*inputs)
            for j, result in zip(out_ids, results):
                out = values[j]
                if out is None:
                    values[j] = result
                else:
                    operators.resized(out, result.shape).copy_(result)
            if hook is not None:
                hook(name, tuple(inputs), tuple(results))
        return step

    def _shape_rules(self) -> verify.Delegates:
        return verify.Delegates({i: d.params for i, d in enumerate(self._delegates)})

    def _file_coverage(self) -> Coverage:
        delegated = sum(1 for s in self.layer_norm_sites if s.delegated)
        left = [(s.name, f"{s.operator} runs on the CPU, outside the WebGPU delegate")
                for s in self.layer_norm_sites if not s.delegated]
        kinds: dict[str, dict[str, int]] = {}
        for s in self.layer_norm_sites:
            # A file tells an RMSNorm from a LayerNorm; GroupNorms and LayerNorms written by
            # hand ran as LayerNorms and count as such.
            kind = "RMSNorm" if s.rms else "LayerNorm"
            entry = kinds.setdefault(kind, {"total": 0, "delegated": 0})
            entry["total"] += 1
            entry["delegated"] += int(s.delegated)
        return Coverage(total=len(self.layer_norm_sites), delegated=delegated, not_delegated=left, kinds=kinds)

    # -- running -------------------------------------------------------------------------

    def __call__(self, *args, on_delegate: Callable[[str, tuple, tuple], None] | None = None,
                 timings: list[tuple[str, float]] | None = None):
        """Run the program; returns outputs structured like `module(*inputs)`.

        `on_delegate(name, inputs, outputs)` is called after each delegate ran, `name`
        being one of `delegate_names` (the evaluator compares each delegated LayerNorm's
        output with eager's through it). `timings`, a list, receives (label, seconds) for
        each step of the chain the call runs, label as in `step_labels`: the call's
        breakdown (timing costs about a microsecond a step).
        """
        plan = self._plan
        flat = _inputs.checked(plan, self._in_spec, args)
        values = self._values
        with self._lock, torch.no_grad():
            if self._dynamic:
                self._check_dynamic_shapes(flat)
            for j, given in zip(plan.inputs, flat):
                self._set_input(j, given, values)
            self._run(values, on_delegate, timings)
            outputs = [_output(values[j]) for j in plan.outputs]
        if self._out_spec is None:
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return pytree.tree_unflatten(outputs, self._out_spec)

    def _set_input(self, j: int, given, values: list) -> None:
        declared = self._plan.values[j].val
        if not isinstance(declared, schema.Tensor):
            return
        slot = values[j]
        if slot is None or declared.allocation_info is None:
            values[j] = given.detach()
        else:
            operators.resized(slot, given.shape).copy_(given)

    def _check_dynamic_shapes(self, flat: list) -> None:
        """A shape the program has not run at yet: within the sizes it was exported for
        (known when lowered in this process), and one it can run at, by shape propagation
        (a size the export's range excludes can fail deep inside, or run wrongly)."""
        shapes = tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in flat)
        if shapes in self._checked_shapes:
            return
        for k, shape in enumerate(shapes):
            for dim, (least, most) in self._dynamic_ranges().get(k, {}).items():
                if shape is not None and not least <= shape[dim] <= most:
                    raise ValueError(f"input {k} has size {shape[dim]} in dim {dim}; the program was exported for "
                                     f"sizes {least} to {most} there")
        try:
            verify.check_shapes(self._plan, self._shape_rules(), [None if s is None else list(s) for s in shapes])
        except verify.CheckError as exc:
            raise ValueError(f"inputs of shapes {[list(s) for s in shapes if s is not None]}: the program cannot "
                             f"run at these sizes ({exc})") from None
        if len(self._checked_shapes) >= MAX_CHECKED_SHAPES:
            self._checked_shapes.clear()
        self._checked_shapes.add(shapes)

    def _dynamic_ranges(self) -> dict[int, dict[int, tuple[int, int]]]:
        """input -> dim -> (least, most) size of each dynamic dim, from the exported program
        (only a program lowered in this process has it: a file records upper bounds alone)."""
        if self._ranges is None:
            self._ranges = {} if self.edge is None else _export_ranges(self.edge.exported_program())
        return self._ranges

    def _run(self, values: list, hook, timings: list[tuple[str, float]] | None) -> None:
        steps, labels, clock = self._steps, self.step_labels, time.perf_counter
        pc, n, executed = 0, len(steps), 0
        while pc < n:
            if timings is None:
                jump = steps[pc](values, hook)
            else:
                start = clock()
                jump = steps[pc](values, hook)
                timings.append((labels[pc], clock() - start))
            pc = pc + 1 if jump is None else jump
            executed += 1
            if executed > MAX_INSTRUCTIONS:
                raise RuntimeError(f"{self._pte.source}: more than {MAX_INSTRUCTIONS} instructions ran; "
                                   "the program does not terminate")


def load(path: str | os.PathLike) -> Program:
    """Load the `.pte` at `path` for running: `program(*inputs)`, `program.coverage`.

    Raises PteError (a ValueError) naming the problem for a file that is not a regular
    file or not a program, is truncated or corrupt, contradicts itself (shapes, dtypes,
    planned memory: `pipeline.pte.verify`), holds a delegate of another backend or an
    operator without a kernel here; OSError as the OS reports a missing or unreadable file.
    The file is read once: changing it afterwards does not reach the program.
    """
    return Program.load(path)


def _label(plan: schema.ExecutionPlan, a) -> str:
    if isinstance(a, schema.KernelCall):
        op = plan.operators[a.op_index]
        return f"{op.name}.{op.overload}" if op.overload else op.name
    if isinstance(a, schema.DelegateCall):
        return "delegate"
    return {schema.MoveCall: "move", schema.JumpFalseCall: "jump"}.get(type(a), "free")


def _strided(flat: torch.Tensor, sizes: list[int], dim_order: list[int]) -> torch.Tensor:
    """A tensor of `sizes` laid out in `dim_order` (outermost first) over `flat`."""
    if dim_order == sorted(dim_order):
        return flat.view(sizes)
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= sizes[d]
    return flat.as_strided(sizes, strides)


def _export_ranges(exported) -> dict[int, dict[int, tuple[int, int]]]:
    """input -> dim -> (least, most) for each dim of a user input that is a symbol with a
    range in the exported program."""
    ranges = exported.range_constraints
    user = set(exported.graph_signature.user_inputs)
    found: dict[int, dict[int, tuple[int, int]]] = {}
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name in user]
    for k, node in enumerate(placeholders):
        val = node.meta.get("val")
        for dim, size in enumerate(getattr(val, "shape", ())):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if expr is not None and expr in ranges:
                bounds = ranges[expr]
                upper = int(bounds.upper) if bounds.upper.is_finite else 2**63 - 1
                found.setdefault(k, {})[dim] = (int(bounds.lower), upper)
    return found


def _output(value):
    # Planned memory is reused by the next call: hand out copies.
    return value.clone() if isinstance(value, torch.Tensor) else value


def _move_step(src: int, dst: int) -> Callable:
    def step(values, hook):
        values[dst] = values[src]
    return step


def _jump_step(cond: int, destination: int) -> Callable:
    def step(values, hook):
        c = values[cond]
        truth = bool(c.all()) if isinstance(c, torch.Tensor) else bool(c)
        return None if truth else destination
    return step


def _free_step(value: int) -> Callable:
    def step(values, hook):
        values[value] = None
    return step
