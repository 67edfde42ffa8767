"""LayerNorm delegation of transformer models to a WebGPU (WGSL) kernel via ExecuTorch.

`import pipeline` stays light: ExecuTorch and transformers load only when `lower` or
`models` is first used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from pipeline import runtime

if TYPE_CHECKING:
    from pipeline.interpreter import Program

__all__ = ["layer_norm", "load", "lower", "models", "runtime"]


def layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.ops.aten.native_layer_norm.default` for float32, computed by the WGSL kernel.

    Returns `(out, mean, rstd)` with aten's shapes and dtypes; raises ValueError/TypeError
    naming the bad argument, RuntimeError when no GPU adapter is available.

    Inference only: the outputs never require grad, even when `x`, `weight` or `bias` do
    (no gradient flows back through the kernel). Safe to call from several threads at once;
    their launches take turns on the one device.
    """
    return runtime.native_layer_norm(x, normalized_shape, weight, bias, eps)


def lower(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None) -> Program:
    """Export `module`, delegate every LayerNorm to the WebGPU backend, serialize it, and
    return the serialized program ready to run (the bytes `save` writes)."""
    from pipeline.aot.lowering import lower as _lower

    return _lower(module, example_inputs, dynamic_shapes)


def load(path) -> Program:
    """Load a `.pte` written by `lower(...).save` or `scripts/export_model.py` and run it:
    `program(*inputs)`, `program.coverage`. Raises ValueError for a file it cannot run."""
    from pipeline.interpreter import load as _load

    return _load(path)


def __getattr__(name: str):
    if name == "models":
        import importlib

        return importlib.import_module("pipeline.models")
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
