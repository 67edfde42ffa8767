"""`lower()`: export a module, reframe group norms, delegate every LayerNorm, and run the result.

The lowered program is interpreted here, node by node: non-delegated ops run eagerly
on the CPU, and each `executorch_call_delegate` runs its decoded blob through
`pipeline.runtime` — never the delegate's original graph, which would be a silent
CPU fallback.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from pipeline.backend import WebGPUBackend
from pipeline.backend.webgpu import NATIVE_LAYER_NORM
from pipeline.ioutil import write_bytes_atomic
from pipeline.partitioner import LayerNormPartitioner
from pipeline.passes import reframe_group_norm
from pipeline.runtime.delegate import LayerNormDelegate

_EXPORTED_LAYER_NORMS = (torch.ops.aten.layer_norm.default, torch.ops.aten.native_layer_norm.default)
_CALL_DELEGATE = torch.ops.higher_order.executorch_call_delegate


@dataclass
class Coverage:
    """How many LayerNorms of the exported graph (group-norm reframes included) were delegated."""

    total: int
    delegated: int
    not_delegated: list[tuple[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.delegated == self.total and not self.not_delegated


class _DelegatingInterpreter(torch.fx.Interpreter):
    """Runs the lowered graph eagerly, sending each delegate call to its decoded blob."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        delegates: dict[int, LayerNormDelegate],
        on_delegate: Callable[[str, tuple, tuple], None] | None = None,
    ) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.delegates = delegates
        self.on_delegate = on_delegate

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        if self.on_delegate is not None and n.op == "call_function" and n.target is _CALL_DELEGATE:
            self.on_delegate(n.args[0].target, self.fetch_args_kwargs_from_env(n)[0][1:], result)
        return result

    def call_function(self, target, args, kwargs):
        if target is _CALL_DELEGATE:
            lowered, *inputs = args
            return self.delegates[id(lowered)](*inputs)
        return super().call_function(target, args, kwargs)


class LoweredProgram:
    """A module lowered with every supported LayerNorm in a WebGPU delegate.

    Call it like the module; `coverage` says what was delegated; `save` writes the `.pte`;
    `edge` is the EdgeProgramManager.
    """

    def __init__(self, edge: EdgeProgramManager, coverage: Coverage) -> None:
        self.edge = edge
        self.coverage = coverage
        self._program: ExportedProgram = edge.exported_program()
        gm = self._program.graph_module
        # Decode every blob once, up front: a corrupt blob fails here, not mid-inference.
        self._delegates: dict[int, LayerNormDelegate] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is _CALL_DELEGATE:
                lowered = getattr(gm, node.args[0].target)
                if lowered.backend_id != WebGPUBackend.__name__:
                    raise ValueError(f"{node.name}: delegate for backend {lowered.backend_id!r} cannot run here")
                self._delegates[id(lowered)] = LayerNormDelegate(lowered.processed_bytes)
        sig = self._program.graph_signature
        self._state = {**self._program.state_dict, **self._program.constants}
        self._input_kinds = [(spec.kind, spec.target) for spec in sig.input_specs]
        self._output_kinds = [(spec.kind, spec.target) for spec in sig.output_specs]

    @property
    def delegates(self) -> tuple[LayerNormDelegate, ...]:
        """The decoded delegates, in graph order; each knows its blob's `params`."""
        return tuple(self._delegates.values())

    @property
    def num_delegates(self) -> int:
        return len(self._delegates)

    def __call__(self, *inputs, on_delegate: Callable[[str, tuple, tuple], None] | None = None):
        """Run the program; returns outputs structured like `module(*inputs)`.

        `on_delegate(name, inputs, outputs)` is called after each delegate ran, `name` being
        its `lowered_module_N` attribute in the edge graph (the evaluator compares each
        delegated LayerNorm's output with eager's through it).
        """
        call_spec = self._program.call_spec
        flat, spec = pytree.tree_flatten((inputs, {}))
        if call_spec.in_spec is not None and spec != call_spec.in_spec:
            raise TypeError(f"inputs do not match the exported signature: got {spec}, expected {call_spec.in_spec}")
        # The exporter's own check of dtypes, static dims and dynamic dims' ranges.
        try:
            self._program._check_input_constraints(pytree.tree_flatten_with_path((inputs, {}))[0])
        except RuntimeError as exc:
            raise ValueError(f"inputs outside what the program was exported for: {exc}") from exc
        user = iter(flat)
        args = []
        for kind, target in self._input_kinds:
            if kind == InputKind.USER_INPUT:
                args.append(next(user))
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                args.append(self._state[target])
            else:
                raise NotImplementedError(f"exported input kind {kind.name} is not supported")
        with torch.no_grad():
            # A fresh interpreter per call: it keeps per-run state, so calls stay independent.
            interpreter = _DelegatingInterpreter(self._program.graph_module, self._delegates, on_delegate)
            results = interpreter.run(*args, enable_io_processing=False)
        outputs = []
        for (kind, target), value in zip(self._output_kinds, results):
            if kind == OutputKind.BUFFER_MUTATION:
                self._state[target] = value
            elif kind == OutputKind.USER_OUTPUT:
                outputs.append(value)
            else:
                raise NotImplementedError(f"exported output kind {kind.name} is not supported")
        if call_spec.out_spec is None:
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return pytree.tree_unflatten(outputs, call_spec.out_spec)

    def save(self, path: str | os.PathLike) -> None:
        """Write the ExecuTorch program (`.pte`) atomically."""
        # to_executorch rewrites the edge graph in place (out variants, memory planning);
        # work on a copy so `edge` and this program's own graph stay runnable.
        write_bytes_atomic(path, copy.deepcopy(self.edge).to_executorch().buffer)


def count_layer_norms(program: ExportedProgram) -> int:
    """LayerNorm ops (aten.layer_norm or aten.native_layer_norm) in an exported graph."""
    return sum(1 for n in program.graph.nodes if n.op == "call_function" and n.target in _EXPORTED_LAYER_NORMS)


def _coverage(edge: EdgeProgramManager, total: int, rejected: Sequence[tuple[str, str]]) -> Coverage:
    program = edge.exported_program()
    gm = program.graph_module
    delegated = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _CALL_DELEGATE:
            lowered: LoweredBackendModule = getattr(gm, node.args[0].target)
            delegated += sum(
                1 for n in lowered.original_module.graph.nodes if n.op == "call_function" and n.target == NATIVE_LAYER_NORM
            )
    reasons = dict(rejected)
    not_delegated = [
        (n.name, reasons.get(n.name, "not tagged by the partitioner"))
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == NATIVE_LAYER_NORM
    ]
    missing = total - delegated - len(not_delegated)
    if missing > 0:
        not_delegated.append(
            ("exported graph", f"{missing} LayerNorm(s) did not reach the edge program as native_layer_norm")
        )
    return Coverage(total=total, delegated=delegated, not_delegated=not_delegated)


def lower(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None) -> LoweredProgram:
    """Export `module` on `example_inputs`, delegate every supported LayerNorm to WebGPU.

    `dynamic_shapes` is passed to torch.export; a program exported with a dynamic
    dimension runs at any size in its range. The module is exported as it is (call
    `.eval()` first for inference).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}")
    exported = reframe_group_norm(torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes))
    total = count_layer_norms(exported)
    partitioner = LayerNormPartitioner()
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    return LoweredProgram(edge, _coverage(edge, total, partitioner.rejected))
