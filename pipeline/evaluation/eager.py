"""Ground truth from eager PyTorch: every LayerNorm/GroupNorm the dispatcher actually runs.

Counting happens below autograd in a TorchDispatchMode, so `nn.LayerNorm`,
`F.layer_norm` and `F.group_norm` calls all count, and modules that are never
called do not. Each call is tagged with the path of the innermost module running
at the time (forward pre/post hooks keep a stack), which is how the delegated side
finds "the same LayerNorm" again.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
LAYER_NORM = _aten.native_layer_norm.default
GROUP_NORM = _aten.native_group_norm.default


@dataclass
class NormCall:
    """One native_layer_norm / native_group_norm call seen at the dispatcher."""

    op: str  # "layer_norm" or "group_norm"
    module_path: str
    input_shape: tuple[int, ...]
    # What the delegated LayerNorm must reproduce: the layer_norm output, or for a
    # group_norm the pre-affine normalized values that its weight-less reframe computes.
    reference: torch.Tensor


@dataclass
class EagerRun:
    outputs: object
    calls: list[NormCall]


class NormCallRecorder(TorchDispatchMode):
    """Records each native_layer_norm / native_group_norm call, tagged with the running module path.

    `run_eager` runs `torch.cond` as plain Python (the branch its predicate takes) so that
    the LayerNorms inside control flow are seen here too.
    """

    def __init__(self, module_stack: list[str] | None = None, keep_tensors: bool = True) -> None:
        super().__init__()
        self.calls: list[NormCall] = []
        self._stack = module_stack if module_stack is not None else [""]
        self._keep = keep_tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is LAYER_NORM or func is GROUP_NORM:
            x = args[0]
            if not self._keep:
                reference = torch.empty(0)
            elif func is LAYER_NORM:
                reference = result[0].detach().clone()
            else:
                reference = _group_normalized(x.detach(), result[1], result[2])
            self.calls.append(
                NormCall(
                    op="layer_norm" if func is LAYER_NORM else "group_norm",
                    module_path=self._stack[-1],
                    input_shape=tuple(x.shape),
                    reference=reference,
                )
            )
        return result


@contextlib.contextmanager
def _plain_cond():
    """`torch.cond` as eager Python: eager torch.cond under a dispatch mode compiles the
    branches, and what they run would not reach the recorder."""
    cond = torch.cond

    def plain(predicate, true_fn, false_fn, operands=()):
        return (true_fn if bool(predicate) else false_fn)(*operands)

    torch.cond = plain
    try:
        yield
    finally:
        torch.cond = cond


def _group_normalized(x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """(x - mean) * rstd per (sample, group), laid out as (N, G, C/G * spatial)."""
    n, g = mean.shape
    grouped = x.reshape(n, g, -1)
    return ((grouped - mean.reshape(n, g, 1)) * rstd.reshape(n, g, 1)).clone()


def run_eager(module: torch.nn.Module, inputs: Sequence, keep_tensors: bool = True) -> EagerRun:
    """Run `module(*inputs)` under no_grad and record every LayerNorm/GroupNorm call.

    `keep_tensors=False` only counts (and tags) the calls, without keeping their outputs.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    stack = [""]

    def enter(name: str):
        def hook(mod, args) -> None:
            stack.append(name)

        return hook

    def leave(mod, args, output) -> None:  # must return None: a value would replace the output
        stack.pop()

    handles = []
    for name, sub in module.named_modules():
        if name:
            handles.append(sub.register_forward_pre_hook(enter(name)))
            handles.append(sub.register_forward_hook(leave))
    recorder = NormCallRecorder(stack, keep_tensors)
    try:
        with torch.no_grad(), _plain_cond(), recorder:
            outputs = module(*inputs)
    finally:
        for h in handles:
            h.remove()
    return EagerRun(outputs=outputs, calls=recorder.calls)


def to_float64(module: torch.nn.Module, inputs: Sequence) -> tuple[torch.nn.Module, tuple]:
    """A float64 copy of `module` (same weights) and of the floating-point `inputs`."""
    return to_dtype(module, inputs, torch.float64)


def to_dtype(module: torch.nn.Module, inputs: Sequence, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple]:
    """A copy of `module` (same weights) and of the floating-point `inputs`, in `dtype`."""
    cast = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return copy.deepcopy(module).to(dtype), cast
