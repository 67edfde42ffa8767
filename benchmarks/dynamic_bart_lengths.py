"""The dynamic bart-base file at lengths other than the example's (128): its error against
float64 beside eager float32's, the accuracy rule of the reports.

    python scripts/export_model.py bart --dynamic --output-dir out
    python benchmarks/dynamic_bart_lengths.py out/bart-base-dynamic.pte
"""

import sys

import torch

import pipeline
from pipeline.evaluation.eager import run_eager, to_float64
from pipeline.evaluation.metrics import compare, flatten_output

spec = pipeline.models.build("bart", dynamic=True)
prog = pipeline.load(sys.argv[1])
ids, states = spec.example_inputs
for length in (1, 17, 64, 200):
    x = (torch.randint(0, 50000, (1, length), generator=torch.Generator().manual_seed(length)), states)
    got = flatten_output(prog(*x))
    ref = flatten_output(run_eager(*to_float64(spec.module, x), keep_tensors=False).outputs)
    eager = flatten_output(run_eager(spec.module, x, keep_tensors=False).outputs)
    g, e = compare(got, ref)["max_abs"], compare(eager, ref)["max_abs"]
    print(f"length {length}: file vs fp64 {g:.3g}, eager fp32 vs fp64 {e:.3g}, ratio {g/e:.2f}")
