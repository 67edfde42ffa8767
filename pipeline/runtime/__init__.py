"""The WebGPU runtime: runs the native_layer_norm kernel through wgpu.

Imports wgpu, numpy and torch only (never ExecuTorch or transformers), so it runs on
a GPU host that has PyTorch and wgpu but not ExecuTorch.
"""

from pipeline.runtime.device import ADAPTER_ENV, device_info, reset_stats, stats
from pipeline.runtime.native_layer_norm import native_layer_norm

__all__ = ["ADAPTER_ENV", "device_info", "native_layer_norm", "reset_stats", "stats"]
