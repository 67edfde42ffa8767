"""The device layer: one WebGPU device per process over one of two implementations,
chosen by PIPELINE_WEBGPU - wgpu (wgpu-native, shader compiler naga; the default) or dawn
(Dawn through dawn-python, compiler Tint: what ExecuTorch's WebGPU backend and Chromium
run). Each lives in a small file of its own (wgpu_impl.py, dawn_impl.py) behind the same
few operations: buffers, pipelines, bind groups, command encoding, submit, read-back and
timestamp queries. Above them nothing knows which one runs. Here: the shader files as
the chosen compiler takes them, pipeline and buffer caches, the device probes, counters.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline import wgsl
from pipeline.environment import (F16_PACK_ENV, IMPLEMENTATION_ENV, IMPLEMENTATIONS, LAYOUTS_ENV, LAYOUTS_NONE,
                                  SUBGROUPS_ENV, implementation)
from pipeline.runtime.webgpu import Pipeline
from pipeline.wgsl import layouts as layouts_file
from pipeline.wgsl.config import THREADED_COPY_BYTES

# Buffer usages, as WebGPU numbers them (wgpu and webgpu.h alike).
MAP_READ, COPY_SRC, COPY_DST, UNIFORM, STORAGE_USAGE, QUERY_RESOLVE = 0x1, 0x4, 0x8, 0x40, 0x80, 0x200
STORAGE = STORAGE_USAGE | COPY_DST | COPY_SRC
UNIFORM_BUFFER = UNIFORM | COPY_DST
MAP_WRITE = 0x2
STAGING = MAP_READ | COPY_DST
UPLOAD_STAGING = MAP_WRITE | COPY_SRC
# Copies between host arrays and mapped memory of at least THREADED_COPY_BYTES (the C++
# launch's threshold too) run over torch's CPU threads where the machine has cores to spare
# (THREADED_COPIES): one thread's memcpy is what a multi-MB call waited on
# (docs/measurements.md, "The host path").
THREADED_COPIES = len(os.sched_getaffinity(0)) >= 4


def _forked() -> None:
    # torch's OpenMP workers do not survive a fork: a forked child's first parallel copy hung.
    global THREADED_COPIES
    THREADED_COPIES = False


os.register_at_fork(after_in_child=_forked)


def _padded(size: int) -> int:
    """Bytes of a buffer for `size`: bindings and copies want 4-byte multiples, at least 16."""
    return max(16, (size + 15) // 16 * 16)


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
    impl: Any  # wgpu_impl.Device or dawn_impl.Device
    stats: Stats = field(default_factory=Stats)
    pipelines: dict[tuple, Pipeline] = field(default_factory=dict)
    buffers: dict[tuple[str, int], Any] = field(default_factory=dict)
    # Bind groups by pipeline and buffers: a launch whose buffers are those of an earlier one
    # binds them again without a new bind group. Dropped with any buffer they hold.
    bind_groups: dict[tuple, Any] = field(default_factory=dict)
    # Constants kept on the device for as long as their tensor lives (`resident`), and the
    # buffers of tensors gone since the last launch, destroyed by the next.
    residents: dict[int, Any] = field(default_factory=dict)
    retired: list = field(default_factory=list)
    # What the kernel's Params buffer holds: (buffer, rows, eps) of the last write.
    params_written: tuple = ()
    subgroup_size: int = 0  # smallest subgroup size seen; 0 when subgroups are not used
    pack2x16float: bool = False  # pack2x16float rounds as aten does (f16_pack_probe.wgsl)
    # The layouts tuned on this device: the table PIPELINE_LAYOUTS names, or, unset, the one
    # shipped for this adapter and implementation (None: the rule's everywhere).
    layouts: layouts_file.Layouts | None = None
    # Held for a whole launch (uploads, dispatch, read-back): the buffer pool and the
    # staging buffer's mapping are shared, so launches from several threads take turns.
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def files(self) -> wgsl.ShaderFiles:
        return wgsl.ShaderFiles(self.impl.compiler)

    @property
    def limits(self) -> dict[str, int]:
        return self.impl.limits

    @property
    def features(self) -> frozenset[str]:
        return self.impl.features

    def buffer(self, role: str, size: int, usage: int) -> Any:
        """A buffer of at least `size` bytes for `role`, reused across calls of that size."""
        size = _padded(size)
        key = (role, size)
        buf = self.buffers.get(key)
        if buf is None:
            # Keep one buffer per role: a new size replaces the old one.
            for old in [k for k in self.buffers if k[0] == role]:
                self._drop(self.buffers.pop(old))
            buf = self.impl.buffer(size, usage, role)
            self.buffers[key] = buf
            self.stats.buffers_allocated += 1
        return buf

    def _drop(self, buf: Any) -> None:
        """Destroy `buf` and forget the bind groups that hold it."""
        for key in [k for k in self.bind_groups if any(b is buf for b in k[1])]:
            del self.bind_groups[key]
        self.impl.destroy(buf)

    def resident(self, t: Any, data) -> Any:
        """A storage buffer holding `data()`, the bytes of the constant tensor `t`, uploaded
        the first time and kept until `t` is garbage collected (the caller promises that
        `t` never changes: a delegate's weight and bias). Call with the lock held, after
        `release_retired` (an id of a tensor gone may have been taken by a new one)."""
        known = self.residents.get(id(t))
        if known is not None:
            return known
        data = data()
        buf = self.impl.buffer(_padded(data.nbytes), STORAGE, "resident")
        self.upload(buf, data)
        self.stats.buffers_allocated += 1
        self.residents[id(t)] = buf
        # Runs wherever the tensor dies (perhaps inside a launch): it only queues the buffer.
        weakref.finalize(t, self.retired.append, id(t))
        return buf

    def release_retired(self) -> None:
        """Destroy the resident buffers of tensors garbage collected since the last launch
        (with the lock held)."""
        while self.retired:
            buf = self.residents.pop(self.retired.pop(), None)
            if buf is not None:
                self._drop(buf)

    def bind_group(self, pipeline: Pipeline, buffers: list[Any]) -> Any:
        """The bind group of `buffers` for `pipeline`, made once for each set of buffers."""
        key = (id(pipeline), tuple(buffers))
        group = self.bind_groups.get(key)
        if group is None:
            group = self.bind_groups[key] = self.impl.bind_group(pipeline, buffers)
        return group

    def upload(self, buf: Any, data: np.ndarray, offset: int = 0) -> None:
        """Write `data` to `buf` through the queue (the implementation copies it on this thread)."""
        self.impl.write(buf, data, offset)
        self.stats.bytes_uploaded += data.nbytes

    def upload_staged(self, encoder: Any, buf: Any, data: np.ndarray) -> None:
        """Write `data` (uint8, a multiple of 4 bytes) to `buf` through a MAP_WRITE staging
        buffer: copied into its mapping here (over threads when large), and from there into
        `buf` by a copy recorded in `encoder`. Call with the lock held."""
        staging = self.buffer("upload", data.nbytes, UPLOAD_STAGING)
        with mapping(self.impl, staging, data.nbytes, write=True) as mapped:
            copy_bytes(mapped, data)
        encoder.copy(staging, 0, buf, 0, data.nbytes)
        self.stats.bytes_uploaded += data.nbytes

    def read(self, staging: Any, size: int, into) -> None:
        """Map `staging` (MAP_READ) once the GPU is done with it and copy its first `size`
        bytes straight into the (offset, uint8 array) pairs of `into` (one copy each, over
        threads when large)."""
        with mapping(self.impl, staging, size) as mapped:
            for offset, dest in into:
                copy_bytes(dest, mapped[offset: offset + dest.size])
        self.stats.bytes_read_back += size

    def pipeline(self, key: tuple, code: str, bindings: list[str] | None, label: str) -> Pipeline:
        """The pipeline cached under `key`, compiled from `code` the first time."""
        known = self.pipelines.get(key)
        if known is None:
            known = self.pipelines[key] = self.impl.pipeline(code, bindings, label)
            self.stats.pipelines_compiled += 1
        return known


def copy_bytes(dest: np.ndarray, src: np.ndarray) -> None:
    """`dest[...] = src` for uint8 arrays of one size; large ones over torch's CPU threads
    where there are 4 cores or more. On the H200 host (16 cores) torch's threads took a
    12.6 MB call from 3.0 to 1.6 ms, where a pool of Python threads running numpy copies
    gained less than its wake-ups cost below 8 MB; on a busy 2-core machine torch's OpenMP
    workers, which spin, took 12 ms for a 2.3 MB copy that numpy makes in 77 µs. Never in
    a forked child (see _forked)."""
    if THREADED_COPIES and dest.nbytes >= THREADED_COPY_BYTES:
        torch.from_numpy(dest).copy_(torch.from_numpy(src))
    else:
        np.copyto(dest, src)


@contextlib.contextmanager
def mapping(impl: Any, buffer: Any, size: int, write: bool = False):
    """The first `size` bytes of `buffer` mapped (MAP_READ, or MAP_WRITE with `write`) as a
    uint8 array, for the `with` block only: the buffer is unmapped after it (a map that
    raises, an interrupted wait included, has left it unmapped already)."""
    mapped = impl.map(buffer, size, write)
    try:
        yield mapped
    finally:
        impl.unmap(buffer)


def read_bytes(impl: Any, staging: Any, size: int) -> bytes:
    """The first `size` bytes of the MAP_READ buffer `staging` of device `impl`, as bytes."""
    with mapping(impl, staging, size) as mapped:
        return mapped.tobytes()


_gpus: dict[str, Gpu] = {}
# Devices opened and probed whose layouts table was refused: the next call takes the same
# device, so that a refused table never opens more than one per implementation and process.
_refused: dict[str, Gpu] = {}
_lock = threading.Lock()


def _open_device(name: str) -> Any:
    if name == "dawn":
        from pipeline.runtime import dawn_impl

        return dawn_impl.Device()
    from pipeline.runtime import wgpu_impl

    return wgpu_impl.Device()


def gpu() -> Gpu:
    """The device of the implementation PIPELINE_WEBGPU names, created on its first use
    with the adapter's buffer limits and probed (one per implementation and process)."""
    name = implementation()
    with _lock:
        if name not in _gpus:
            table = _tuned_layouts()  # a table that cannot be read opens no device
            g = _refused.pop(name, None) or _opened(name)
            adapter = g.impl.info["adapter"]
            if table is not None:
                try:
                    table.check_device(adapter, g.impl.name)
                except layouts_file.LayoutsError:
                    _refused[name] = g
                    raise
            elif not os.environ.get(LAYOUTS_ENV):
                table = layouts_file.shipped_for(adapter, g.impl.name)
            g.layouts = table
            _gpus[name] = g
        return _gpus[name]


def _opened(name: str) -> Gpu:
    g = Gpu(impl=_open_device(name))
    if "subgroups" in g.features and os.environ.get(SUBGROUPS_ENV, "1") != "0":
        g.subgroup_size = _probe_subgroup_size(g)
    if os.environ.get(F16_PACK_ENV, "1") != "0":
        g.pack2x16float = _probe_f16_pack(g)
    return g


def _tuned_layouts() -> layouts_file.Layouts | None:
    """The table PIPELINE_LAYOUTS names (LayoutsError for a file that cannot be read: not a
    regular file, or larger than LAYOUTS_MAX_BYTES; or whose binary twin is missing or not
    its own, as the C++ backend refuses it), or None where it is unset or `none`; checked
    against the device by the caller."""
    path = os.environ.get(LAYOUTS_ENV, "")
    return layouts_file.read(path, twin=True) if path and path != LAYOUTS_NONE else None


def _run_probe(g: Gpu, shader: str, contents: list[np.ndarray], groups: int, read: int,
               subgroups: bool = False) -> bytes:
    """Run one probe shader once over `groups` workgroups: binding i is a storage buffer
    holding `contents[i]`; returns the bytes of binding `read` afterwards."""
    impl = g.impl
    buffers = [impl.buffer(data.nbytes, STORAGE) for data in contents]
    for buffer, data in zip(buffers, contents):
        impl.write(buffer, data)
    code = g.files.module(wgsl.source(shader), subgroups)
    pipeline = g.pipeline((shader,), code, None, shader)
    staging = impl.buffer(buffers[read].size, STAGING)
    encoder = impl.encoder()
    encoder.compute(pipeline, [(impl.bind_group(pipeline, buffers), (groups, 1))])
    encoder.copy(buffers[read], 0, staging, 0, staging.size)
    impl.submit(encoder)
    data = read_bytes(impl, staging, staging.size)
    for buffer in (*buffers, staging):
        impl.destroy(buffer)
    return data


def _probe_subgroup_size(g: Gpu) -> int:
    """Run subgroup_size.wgsl once: the kernel sizes its shuffle reductions by this."""
    result = _run_probe(g, "subgroup_size.wgsl", [np.array([0xFFFFFFFF], dtype=np.uint32)], 1, 0, subgroups=True)
    size = int(np.frombuffer(result, dtype=np.uint32)[0])
    return size if 0 < size <= 256 and size & (size - 1) == 0 else 0


def _probe_f16_pack(g: Gpu) -> bool:
    """Run f16_pack_probe.wgsl on `wgsl.f16_pack_cases()`: True when every value came back as
    aten rounds it, NaN as a NaN."""
    values = wgsl.f16_pack_cases()
    packed = _run_probe(g, "f16_pack_probe.wgsl", [values, np.zeros(values.size, dtype=np.uint16)],
                        (values.size // 2 + 63) // 64, 1)
    return wgsl.pack_matches_aten(values, np.frombuffer(packed, dtype=np.uint16))


def device_info() -> dict[str, object]:
    """The implementation and its shader compiler, adapter name, backend, type, enabled
    features, the probes' findings and the limits the kernel relies on."""
    g = gpu()
    return {
        **g.impl.info,
        "implementation": g.impl.name,
        "shader_compiler": g.impl.compiler,
        "features": sorted(g.features),
        "subgroup_size": g.subgroup_size,
        "pack2x16float": g.pack2x16float,
        "layouts": None if g.layouts is None else {"file": g.layouts.source, "entries": len(g.layouts.entries)},
        "limits": dict(g.limits),
    }
