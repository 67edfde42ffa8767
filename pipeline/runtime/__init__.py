"""The WebGPU runtime: runs the native_layer_norm kernel on wgpu or Dawn (PIPELINE_WEBGPU).

Imports wgpu or dawn-python, numpy and torch only (never ExecuTorch or transformers), so
it runs on a GPU host that has PyTorch and a WebGPU implementation but not ExecuTorch.
"""

from pipeline.runtime.device import ADAPTER_ENV, IMPLEMENTATION_ENV, device_info, implementation, reset_stats, stats
from pipeline.runtime.native_layer_norm import native_layer_norm

__all__ = ["ADAPTER_ENV", "IMPLEMENTATION_ENV", "device_info", "implementation", "native_layer_norm",
           "reset_stats", "stats"]
