"""Graph passes that run on the ExportedProgram before lowering."""

from pipeline.aot.passes.group_norm import (
    GROUP_NORM_DECOMPOSITIONS,
    group_norm_as_layer_norm,
    native_group_norm_as_layer_norm,
    reframe_group_norm,
)
from pipeline.aot.passes.linear import linears_over_rows

__all__ = [
    "GROUP_NORM_DECOMPOSITIONS",
    "group_norm_as_layer_norm",
    "linears_over_rows",
    "native_group_norm_as_layer_norm",
    "reframe_group_norm",
]
