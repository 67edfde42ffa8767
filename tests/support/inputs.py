"""Seeded tensors and parameters: the same values on every run and machine."""

from __future__ import annotations

import torch
from torch import nn


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine parameters too, so a dropped weight or bias cannot pass unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return module.eval()
