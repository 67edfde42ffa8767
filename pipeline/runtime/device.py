"""The wgpu adapter and device, shader and pipeline caches, buffer pool and counters.

One device per process, created on first use. Everything here follows the WebGPU
lifecycle: adapter -> device -> shader module -> pipeline -> buffers -> dispatch ->
read back by mapping (wgpu 0.32.0's on_submitted_work_done_sync is broken).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import wgpu

ADAPTER_ENV = "PIPELINE_WGPU_ADAPTER"
# "0" turns subgroup reductions off (the workgroup-memory path is used, as without the feature).
SUBGROUPS_ENV = "PIPELINE_WGPU_SUBGROUPS"

_NO_ADAPTER_HELP = (
    "wgpu found no GPU adapter. On a machine without a GPU install Mesa's lavapipe "
    "(Vulkan on the CPU): `apt-get install mesa-vulkan-drivers`, or run `make setup`. "
    f"Set {ADAPTER_ENV} to part of an adapter's name to choose among several."
)

# Limits the kernel can use when the adapter offers more than WebGPU's defaults.
_LIMITS_WANTED = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
)
_FEATURES_WANTED = ("timestamp-query", "subgroup")


@dataclass
class Stats:
    """Counters that show what the GPU did; `reset_stats()` zeroes them."""

    dispatches: int = 0
    bytes_uploaded: int = 0
    bytes_read_back: int = 0
    pipelines_compiled: int = 0
    buffers_allocated: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Gpu:
    adapter: wgpu.GPUAdapter
    device: wgpu.GPUDevice
    limits: dict[str, int]
    features: frozenset[str]
    stats: Stats = field(default_factory=Stats)
    shaders: dict[str, str] = field(default_factory=dict)
    pipelines: dict[tuple, tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]] = field(
        default_factory=dict
    )
    buffers: dict[tuple[str, int], wgpu.GPUBuffer] = field(default_factory=dict)
    subgroup_size: int = 0  # smallest subgroup size seen; 0 when subgroups are not used
    # Held for a whole launch (uploads, dispatch, read-back): the buffer pool and the
    # staging buffer's mapping are shared, so launches from several threads take turns.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def buffer(self, role: str, size: int, usage: int) -> wgpu.GPUBuffer:
        """A buffer of at least `size` bytes for `role`, reused across calls of that size."""
        size = max(16, (size + 15) // 16 * 16)  # bindings and copies want 4-byte multiples
        key = (role, size)
        buf = self.buffers.get(key)
        if buf is None:
            # Keep one buffer per role: a new size replaces the old one.
            for old in [k for k in self.buffers if k[0] == role]:
                self.buffers.pop(old).destroy()
            buf = self.device.create_buffer(size=size, usage=usage, label=role)
            self.buffers[key] = buf
            self.stats.buffers_allocated += 1
        return buf

    def upload(self, buf: wgpu.GPUBuffer, data: np.ndarray, offset: int = 0) -> None:
        self.device.queue.write_buffer(buf, offset, data)
        self.stats.bytes_uploaded += data.nbytes

    def read(self, staging: wgpu.GPUBuffer, size: int) -> memoryview:
        """Map `staging` (MAP_READ) and copy out its first `size` bytes; waits for the GPU."""
        staging.map_sync(wgpu.MapMode.READ, 0, size)
        try:
            data = staging.read_mapped(0, size, copy=True)
        finally:
            staging.unmap()
        self.stats.bytes_read_back += size
        return data

    def shader_source(self, name: str) -> str:
        if name not in self.shaders:
            self.shaders[name] = resources.files("pipeline.wgsl").joinpath(name).read_text()
        return self.shaders[name]


_gpu: Gpu | None = None
_lock = threading.Lock()


def _choose_adapter() -> wgpu.GPUAdapter:
    wanted = os.environ.get(ADAPTER_ENV, "").strip().lower()
    if wanted:
        adapters = wgpu.gpu.enumerate_adapters_sync()
        names = [_adapter_name(a) for a in adapters]
        for adapter, name in zip(adapters, names):
            if wanted in name.lower():
                return adapter
        raise RuntimeError(
            f"{ADAPTER_ENV}={wanted!r} matches no adapter; wgpu sees: {', '.join(names) or 'none'}"
        )
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:  # wgpu raises a bare RuntimeError when nothing is found
        raise RuntimeError(_NO_ADAPTER_HELP) from exc
    if adapter is None:
        raise RuntimeError(_NO_ADAPTER_HELP)
    return adapter


def _adapter_name(adapter: wgpu.GPUAdapter) -> str:
    info = adapter.info
    return info.get("device") or info.get("description") or info.get("vendor") or "unknown"


def gpu() -> Gpu:
    """The process's device, created on first use with the adapter's buffer limits."""
    global _gpu
    with _lock:
        if _gpu is None:
            adapter = _choose_adapter()
            limits = {k: adapter.limits[k] for k in _LIMITS_WANTED if k in adapter.limits}
            features = [f for f in _FEATURES_WANTED if f in adapter.features]
            device = adapter.request_device_sync(
                label="pipeline", required_features=features, required_limits=limits
            )
            _gpu = Gpu(
                adapter=adapter,
                device=device,
                limits=dict(device.limits),
                features=frozenset(device.features),
            )
            if "subgroup" in _gpu.features and os.environ.get(SUBGROUPS_ENV, "1") != "0":
                _gpu.subgroup_size = _probe_subgroup_size(_gpu)
        return _gpu


def _probe_subgroup_size(g: Gpu) -> int:
    """Run subgroup_size.wgsl once: the kernel sizes its shuffle reductions by this."""
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    result = g.device.create_buffer(size=4, usage=usage)
    g.device.queue.write_buffer(result, 0, np.array([0xFFFFFFFF], dtype=np.uint32))
    module = g.device.create_shader_module(code=g.shader_source("subgroup_size.wgsl"))
    pipeline = g.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    bind_group = g.device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": result}}]
    )
    encoder = g.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, bind_group)
    compute.dispatch_workgroups(1)
    compute.end()
    g.device.queue.submit([encoder.finish()])
    size = int(np.frombuffer(g.device.queue.read_buffer(result), dtype=np.uint32)[0])
    return size if 0 < size <= 256 and size & (size - 1) == 0 else 0


def device_info() -> dict[str, object]:
    """Adapter name, backend, type, enabled features and the limits the kernel relies on."""
    g = gpu()
    info = g.adapter.info
    return {
        "adapter": _adapter_name(g.adapter),
        "backend": info.get("backend_type", ""),
        "adapter_type": info.get("adapter_type", ""),
        "driver": info.get("description", ""),
        "features": sorted(g.features & set(_FEATURES_WANTED)),
        "subgroup_size": g.subgroup_size,
        "limits": {k: g.limits[k] for k in _LIMITS_WANTED if k in g.limits},
    }


def stats() -> dict[str, int]:
    """Counters since start (or the last `reset_stats()`): dispatches, bytes moved, ..."""
    return gpu().stats.as_dict()


def reset_stats() -> None:
    gpu().stats = Stats()
