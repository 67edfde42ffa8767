"""Outputs compared bit for bit: a written file's run against the program that wrote it
(`pipeline.aot.export`), and the runs the evaluation and the tests set side by side."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree


def same_outputs(got, want) -> bool:
    """Bit for bit: same structure, dtypes, shapes and values (NaN equal to NaN)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if got_spec != want_spec:
        return False
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not (isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape
                    and torch.equal(g.view(torch.uint8) if g.dtype.is_floating_point else g,
                                    w.view(torch.uint8) if w.dtype.is_floating_point else w)):
                return False
        elif g != w:
            return False
    return True
