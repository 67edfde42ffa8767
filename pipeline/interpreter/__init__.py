"""Our runtime: interprets a `.pte`'s execution plan in Python.

    program = load("model.pte")     # read, check (pipeline.pte), then ready to run
    outputs = program(*inputs)      # delegate calls on WebGPU (pipeline.runtime), the rest on torch ops
"""

from pipeline.interpreter.program import Coverage, LayerNormSite, Program, load

__all__ = ["Coverage", "LayerNormSite", "Program", "load"]
