"""LayerNorm delegate blobs made directly (no export), for the delegate's call paths."""

from __future__ import annotations

import numpy as np
import torch

from pipeline import blob

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def blob_array(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def make_delegate(width, dtype="float32", weight="constant", bias="constant", outputs=(0,), eps=1e-5, seed=0,
                  op="native_layer_norm"):
    """A delegate blob and its constants; input-sourced weight/bias come as arguments 1, 2;
    `op` "rms_norm" with bias "none" for an RMSNorm's."""
    gen = torch.Generator().manual_seed(seed)
    kind = DTYPES[dtype]
    constants, arguments, ops = {}, 1, {}
    for role, source in (("weight", weight), ("bias", bias)):
        if source == "constant":
            constants[role] = blob_array((torch.randn(width, generator=gen) * 2).to(kind))
            ops[role] = blob.Operand(blob.CONSTANT)
        elif source == "input":
            ops[role] = blob.Operand(blob.INPUT, arguments)
            arguments += 1
        else:
            ops[role] = blob.Operand()
    params = blob.LayerNormParams((width,), eps, 0, ops["weight"], ops["bias"], outputs, arguments, dtype=dtype,
                                  op=op)
    return blob.encode(blob.DelegateBlob(params, constants)), arguments


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)
