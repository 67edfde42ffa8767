"""Graph passes that run on the ExportedProgram before lowering."""

from pipeline.aot.passes.attention import attention_views, contiguous_attention_views
from pipeline.aot.passes.group_norm import (
    GROUP_NORM_DECOMPOSITIONS,
    group_norm_as_layer_norm,
    native_group_norm_as_layer_norm,
    reframe_group_norm,
)
from pipeline.aot.passes.linear import linears_over_rows
from pipeline.aot.passes.norms import (
    GROUP_NORM,
    HAND_WRITTEN,
    KIND_KEY,
    LAYER_NORM,
    NORM_KINDS,
    RMS_NORM,
    LeftNorm,
    NormMatches,
    match_norms,
    norm_kind,
)

__all__ = [
    "GROUP_NORM",
    "GROUP_NORM_DECOMPOSITIONS",
    "HAND_WRITTEN",
    "KIND_KEY",
    "LAYER_NORM",
    "LeftNorm",
    "NORM_KINDS",
    "NormMatches",
    "RMS_NORM",
    "attention_views",
    "contiguous_attention_views",
    "group_norm_as_layer_norm",
    "linears_over_rows",
    "match_norms",
    "native_group_norm_as_layer_norm",
    "norm_kind",
    "reframe_group_norm",
]
