"""A model's output error against float64 in ExecuTorch's runtime WITHOUT our delegate
(portable kernels; XNNPACK), next to eager float32's: the floor that ExecuTorch's own CPU
kernels set for any file run there.

    python benchmarks/executorch_reference_error.py [MODEL [VARIANT]]   # default: whisper tiny
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

import pipeline
from pipeline.evaluation.eager import run_eager, to_float64
from pipeline.evaluation.metrics import compare, flatten_output

name = sys.argv[1] if len(sys.argv) > 1 else "whisper"
variant = sys.argv[2] if len(sys.argv) > 2 else ("tiny" if name == "whisper" else None)
spec = pipeline.models.build(name, variant=variant)
print(f"{name}-{spec.variant}")
inputs = spec.example_inputs
reference = flatten_output(run_eager(*to_float64(spec.module, inputs), keep_tensors=False).outputs)
eager = compare(flatten_output(run_eager(spec.module, inputs, keep_tensors=False).outputs), reference)["max_abs"]
print(f"eager float32 vs float64: {eager:.3g}")
for name, partitioners in (("portable", []), ("xnnpack", [XnnpackPartitioner()])):
    buffer = to_edge_transform_and_lower(torch.export.export(spec.module, inputs),
                                         partitioner=partitioners).to_executorch().buffer
    program = Runtime.get().load_program(buffer)  # kept alive while its method runs
    outputs = program.load_method("forward").execute(list(inputs))
    error = compare(flatten_output(outputs), reference)["max_abs"]
    print(f"ExecuTorch {name}, no WebGPU delegate, vs float64: {error:.3g} ({error / eager:.2f}x eager)")
