"""Run the native_layer_norm kernel on model shapes and print its agreement with PyTorch."""

from __future__ import annotations

import sys

import torch

import pipeline
from pipeline.runtime.benchmark import MODEL_SHAPES


def main() -> int:
    info = pipeline.runtime.device_info()
    print(f"adapter: {info['adapter']} ({info['backend']})")
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for rows, width in MODEL_SHAPES[:6]:
        x = torch.randn(rows, width, generator=gen)
        w, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
        out, _, _ = pipeline.layer_norm(x, [width], w, b)
        err = (out - torch.nn.functional.layer_norm(x, (width,), w, b)).abs().max().item()
        worst = max(worst, err)
        print(f"{rows:>6} x {width:<5} max |kernel - torch| = {err:.2e}")
    print(f"dispatches: {pipeline.runtime.stats()['dispatches']}, worst error {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
