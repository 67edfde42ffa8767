"""The WebGPU runtime: runs the native_layer_norm kernel on wgpu or Dawn (PIPELINE_WEBGPU).

Imports wgpu or dawn-python, numpy and torch only (never ExecuTorch or transformers), so
it runs on a GPU host that has PyTorch and a WebGPU implementation but not ExecuTorch.
"""

from pipeline.runtime import native_call
from pipeline.runtime.device import IMPLEMENTATION_ENV, Stats, device_info, gpu, implementation
from pipeline.runtime.launch import native_layer_norm
from pipeline.runtime.webgpu import ADAPTER_ENV

__all__ = ["ADAPTER_ENV", "IMPLEMENTATION_ENV", "device_info", "implementation", "native_layer_norm",
           "reset_stats", "stats"]


def stats() -> dict[str, int]:
    """Counters since start (or the last `reset_stats()`): dispatches, bytes moved, ...;
    those of delegate calls made in C++ (native_call) included."""
    counts = gpu().stats.as_dict()
    for key, value in native_call.counters().items():
        counts[key] += value
    return counts


def reset_stats() -> None:
    gpu().stats = Stats()
    native_call.reset_counters()
