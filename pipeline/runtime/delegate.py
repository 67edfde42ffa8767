"""Run a WebGPU delegate blob: decode once, then each call launches the native_layer_norm kernel.

Shares only `pipeline.blob` with the ahead-of-time side; never imports ExecuTorch.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline import blob as blob_format
from pipeline.runtime.native_layer_norm import native_layer_norm


class LayerNormDelegate:
    """One decoded delegate. Row counts (and dynamic normalized dims) come from the input at
    each call, so any leading shape (a dynamic sequence length, a new batch size) runs."""

    def __init__(self, processed_bytes: bytes) -> None:
        decoded = blob_format.decode(processed_bytes)
        self.params = decoded.params
        # decode() returns fresh, writable arrays: no copy needed.
        self._constants = {role: _tensor(arr, self.params.affine_dtype) for role, arr in decoded.constants.items()}

    def _operand(self, role: str, args: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        op = getattr(self.params, role)
        if op.source == blob_format.CONSTANT:
            return self._constants[role]
        if op.source == blob_format.INPUT:
            return args[op.index]
        return None

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The delegate's outputs (a subset of out, mean, rstd, in the blob's order)."""
        p = self.params
        if len(args) != p.arguments:
            raise ValueError(f"delegate expects {p.arguments} inputs, got {len(args)}")
        x = args[p.input_index]
        # mean and rstd are computed on the GPU either way; stored and read back only if returned.
        # Weight and bias from the blob are the delegate's own constants: kept on the device.
        resident = all(getattr(p, role).source != blob_format.INPUT for role in ("weight", "bias"))
        results = native_layer_norm(
            x, p.resolve(tuple(x.shape)), self._operand("weight", args), self._operand("bias", args), p.eps,
            stats=any(i != 0 for i in p.outputs), resident=resident,
        )
        return tuple(results[i] for i in p.outputs)


def _tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """A decoded constant as a tensor of `dtype` (bfloat16 arrives as its bits)."""
    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)
