"""The WebGPU ExecuTorch backend: `preprocess` turns a LayerNorm partition into a delegate blob."""

from pipeline.backend.webgpu import WebGPUBackend

__all__ = ["WebGPUBackend"]
