"""The executor: lower a module to a serialized program, load a `.pte`, and run either.

    program = lower(module, example_inputs)    # export, delegate every LayerNorm, serialize
    program = load("model.pte")                # the same, from a file
    outputs = program(*inputs)                 # LayerNorms on wgpu, the rest on CPU kernels
"""

from pipeline.executor.lowering import count_layer_norms, lower
from pipeline.executor.program import Coverage, LayerNormSite, Program, load
from pipeline.executor.pte import PteError

__all__ = ["Coverage", "LayerNormSite", "Program", "PteError", "count_layer_norms", "load", "lower"]
