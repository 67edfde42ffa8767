"""How large a LayerNorm error the ExecuTorch-runtime rule's error ratios can see: eager
whisper with every LayerNorm output perturbed by up to +-U float32 ulps (uniform, seeded),
its relative L2 and max abs error against float64 as U grows.

    python benchmarks/layer_norm_error_sensitivity.py [MODEL [VARIANT]]   # default: whisper tiny

Read with the file's reference error (run_pte --runtime executorch prints it): a ratio limit
of L over a reference error R admits an added error of sqrt(L^2 - 1) x R.
"""

import sys

import torch

import pipeline
from pipeline.evaluation.eager import run_eager, to_float64
from pipeline.evaluation.metrics import compare, flatten_output

name = sys.argv[1] if len(sys.argv) > 1 else "whisper"
variant = sys.argv[2] if len(sys.argv) > 2 else ("tiny" if name == "whisper" else None)
spec = pipeline.models.build(name, variant=variant)
model, inputs = spec.module.eval(), spec.example_inputs
exact = flatten_output(run_eager(*to_float64(model, inputs), keep_tensors=False).outputs)


def run(ulps: int) -> dict:
    generator = torch.Generator().manual_seed(1)

    def perturb(module, args, out):
        return out * (1 + ulps * 2.0**-23 * (2 * torch.rand(out.shape, generator=generator) - 1))

    hooks = [m.register_forward_hook(perturb) for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    try:
        with torch.no_grad():
            return compare(flatten_output(model(*inputs)), exact)
    finally:
        for hook in hooks:
            hook.remove()


base = run(0)
print(f"{name}-{spec.variant}, LayerNorm outputs off by up to +-U ulps; errors against float64")
print("U    rel L2     added rel L2   max abs")
for ulps in (0, 1, 2, 4, 8, 16, 32):
    c = run(ulps)
    added = max(c["rel_l2"] ** 2 - base["rel_l2"] ** 2, 0.0) ** 0.5
    print(f"{ulps:<4} {c['rel_l2']:.3g}   {added:.3g}       {c['max_abs']:.3g}")
