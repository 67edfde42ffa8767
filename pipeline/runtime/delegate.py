"""Run a WebGPU delegate blob: decode once, then each call launches the native_layer_norm kernel
(a LayerNorm's, or an RMSNorm's).

The call crosses into C++ once (native_call: the native backend's launch, built without
ExecuTorch, for wgpu or for Dawn); with PIPELINE_NATIVE_CALL=0 it launches from Python
(native_layer_norm). Same WGSL, same configuration, the same bits either way.
Shares only `pipeline.blob` with the ahead-of-time side; never imports ExecuTorch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline import blob as blob_format
from pipeline.runtime import device, native_call
from pipeline.runtime.launch import _STORED, DTYPES, binding_limit, check_arguments, native_layer_norm, rms_norm


class LayerNormDelegate:
    """One decoded delegate. Row counts (and dynamic normalized dims) come from the input at
    each call, so any leading shape (a dynamic sequence length, a new batch size) runs."""

    def __init__(self, processed_bytes: bytes) -> None:
        decoded = blob_format.decode(processed_bytes)
        self.params = decoded.params
        # decode() returns fresh, writable arrays: no copy needed.
        self._constants = {role: _tensor(arr, self.params.affine_dtype) for role, arr in decoded.constants.items()}
        native = native_call.available()
        if self.params.width is not None:  # a row wider than a binding cannot run here: refused now
            limit = native_call.binding_limit() if native else binding_limit(device.gpu())
            if limit:  # 0: the library has no device, and opening the delegate says why
                self.params.check_fits(limit)
        self._native = native_call.NativeCall(processed_bytes) if native else None

    def _operand(self, role: str, args: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        op = getattr(self.params, role)
        if op.source == blob_format.CONSTANT:
            return self._constants[role]
        if op.source == blob_format.INPUT:
            return args[op.index]
        return None

    def layer_norm_arguments(self, *args: torch.Tensor) -> tuple:
        """(x, normalized_shape, weight, bias, eps) of a call with `args`: what
        aten.native_layer_norm takes to compute the same LayerNorm."""
        p = self.params
        if len(args) != p.arguments:
            raise ValueError(f"delegate expects {p.arguments} inputs, got {len(args)}")
        x = args[p.input_index]
        return x, p.resolve(tuple(x.shape)), self._operand("weight", args), self._operand("bias", args), p.eps

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The delegate's outputs (a subset of out, mean, rstd, in the blob's order)."""
        p = self.params
        if len(args) != p.arguments:
            raise ValueError(f"delegate expects {p.arguments} inputs, got {len(args)}")
        x = args[p.input_index]
        if self._native is not None:
            return self._call_native(x, args)
        # mean and rstd are computed on the GPU either way; stored and read back only if returned.
        # Weight and bias from the blob are the delegate's own constants: kept on the device.
        resident = all(getattr(p, role).source != blob_format.INPUT for role in ("weight", "bias"))
        if p.op == "rms_norm":
            return (rms_norm(x, p.resolve(tuple(x.shape)), self._operand("weight", args), p.eps, resident=resident),)
        results = native_layer_norm(
            x, p.resolve(tuple(x.shape)), self._operand("weight", args), self._operand("bias", args), p.eps,
            stats=p.stats, resident=resident,
        )
        return tuple(results[i] for i in p.outputs)

    def _call_native(self, x: torch.Tensor, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        p = self.params
        weight, bias = self._operand("weight", args), self._operand("bias", args)
        # The library's kernel is compiled for the blob's dtypes: anything else is refused.
        for name, t, dtype in (("input", x, p.dtype), ("weight", weight, p.affine_dtype), ("bias", bias, p.affine_dtype)):
            if isinstance(t, torch.Tensor) and t.dtype != DTYPES[dtype]:
                raise ValueError(f"the delegate was exported for {dtype} {name}, got {t.dtype}")
        shape, _ = check_arguments(x, p.resolve(tuple(x.shape)), weight, bias, p.eps)
        width = math.prod(shape)
        lead = tuple(x.shape[: x.dim() - len(shape)])
        rows = math.prod(lead)
        x = x.detach().contiguous().cpu()
        out = _empty(x.shape, x.dtype)
        mean = _empty((rows,), torch.float32) if p.stats else None
        rstd = _empty((rows,), torch.float32) if p.stats else None
        if rows:
            # Constant weight and bias are the library's already; input-sourced ones go with x.
            given = [_host(t) if getattr(p, role).source == blob_format.INPUT else None
                     for role, t in (("weight", weight), ("bias", bias))]
            self._native(x, rows, width, *given, out, mean, rstd)
        results = [out]
        if p.stats:
            # mean and rstd come back in float32; a half dtype rounds them once, as aten does.
            stat_shape = lead + (1,) * len(shape)
            results += [s.to(DTYPES[p.affine_dtype]).reshape(stat_shape) for s in (mean, rstd)]
        return tuple(results[i] for i in p.outputs)


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor from numpy's allocator, which asks the kernel for huge
    pages for large arrays: on the H200 host a fresh 50 MB torch.empty took 2,073 µs to
    fill, numpy's 878 µs (glibc maps allocations past 32 MB anew, page by page)."""
    return torch.from_numpy(np.empty(shape, _STORED[dtype])).view(dtype)


def _host(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().contiguous().cpu()


def _tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """A decoded constant as a tensor of `dtype` (bfloat16 arrives as its bits)."""
    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)
