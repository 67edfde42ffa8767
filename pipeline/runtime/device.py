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
# "0" keeps float16 stores on the kernel's integer rounding even where pack2x16float passed its probe.
F16_PACK_ENV = "PIPELINE_WGPU_NATIVE_F16_PACK"

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
    native_f16_pack: bool = False  # pack2x16float rounds as aten does (f16_pack_probe.wgsl)
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
            if os.environ.get(F16_PACK_ENV, "1") != "0":
                _gpu.native_f16_pack = _probe_f16_pack(_gpu)
        return _gpu


def _run_probe(g: Gpu, shader: str, contents: list[np.ndarray], groups: int, read: int) -> bytes:
    """Run one probe shader once over `groups` workgroups: binding i is a storage buffer
    holding `contents[i]`; returns the bytes of binding `read` afterwards."""
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    buffers = [g.device.create_buffer(size=data.nbytes, usage=usage) for data in contents]
    for buffer, data in zip(buffers, contents):
        g.device.queue.write_buffer(buffer, 0, data)
    module = g.device.create_shader_module(code=g.shader_source(shader))
    pipeline = g.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    bind_group = g.device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0),
        entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)],
    )
    encoder = g.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, bind_group)
    compute.dispatch_workgroups(groups)
    compute.end()
    g.device.queue.submit([encoder.finish()])
    return g.device.queue.read_buffer(buffers[read])


def _probe_subgroup_size(g: Gpu) -> int:
    """Run subgroup_size.wgsl once: the kernel sizes its shuffle reductions by this."""
    result = _run_probe(g, "subgroup_size.wgsl", [np.array([0xFFFFFFFF], dtype=np.uint32)], 1, 0)
    size = int(np.frombuffer(result, dtype=np.uint32)[0])
    return size if 0 < size <= 256 and size & (size - 1) == 0 else 0


def f16_pack_cases() -> np.ndarray:
    """float32 values whose float16 rounding the pack probe checks: ties to even in every
    binade's shape, the edges of float16's range (65504, 65519.99, 65520, subnormal
    halves, underflow), infinities, NaN, and seeded random values over the whole range."""
    edges = [0.0, 1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10 + 2**-11, 2049.0, 2051.0, 0.1, 1 / 3,
             65504.0, 65519.99, 65520.0, 1e5, 3.4e38, float("inf"), float("nan"),
             6.103515625e-05, 6.1e-5, 5.9604645e-08, 2.9802322e-08, 2.98e-8, 8.940697e-08, 1e-9]
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(4000) * np.exp2(rng.uniform(-26, 17, 4000))
    values = np.concatenate([edges, np.negative(edges), spread]).astype(np.float32)
    return values if values.size % 2 == 0 else np.append(values, np.float32(0))


def aten_f16_bits(values: np.ndarray) -> np.ndarray:
    """float32 `values` rounded to float16 as aten (and numpy, IEEE) rounds them, as bits."""
    with np.errstate(over="ignore"):
        return values.astype(np.float16).view(np.uint16)


def _probe_f16_pack(g: Gpu) -> bool:
    """Run f16_pack_probe.wgsl on `f16_pack_cases()`: True when every value came back as
    aten rounds it, NaN as a NaN."""
    values = f16_pack_cases()
    packed = _run_probe(g, "f16_pack_probe.wgsl", [values, np.zeros(values.size, dtype=np.uint16)],
                        (values.size // 2 + 63) // 64, 1)
    return pack_matches_aten(values, np.frombuffer(packed, dtype=np.uint16))


def pack_matches_aten(values: np.ndarray, got: np.ndarray) -> bool:
    """Whether float16 bits `got` are `values` rounded as aten (and numpy, IEEE) rounds them."""
    want = aten_f16_bits(values)
    nan = np.isnan(values)
    got_nan = ((got & 0x7C00) == 0x7C00) & ((got & 0x03FF) != 0)
    return bool(np.array_equal(got[~nan], want[~nan]) and got_nan[nan].all())


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
        "native_f16_pack": g.native_f16_pack,
        "limits": {k: g.limits[k] for k in _LIMITS_WANTED if k in g.limits},
    }


def stats() -> dict[str, int]:
    """Counters since start (or the last `reset_stats()`): dispatches, bytes moved, ..."""
    return gpu().stats.as_dict()


def reset_stats() -> None:
    gpu().stats = Stats()
