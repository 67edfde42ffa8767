"""The device over wgpu (wgpu-native; shader compiler naga): the default implementation.

The same few operations as dawn_impl.py (pipeline/runtime/device.py says which):
buffers, pipelines, bind groups, command encoding, submit and read back by mapping
(wgpu 0.32.0's on_submitted_work_done_sync is broken).
"""

from __future__ import annotations

import os

import numpy as np
import wgpu
from wgpu.backends.wgpu_native import _api as native

from pipeline.runtime.webgpu import ADAPTER_ENV, Pipeline, no_adapter_help

NAME = "wgpu"
COMPILER = "naga"
_LIMITS_WANTED = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
)
# Our feature names (WebGPU's) and wgpu's.
_FEATURES = {"subgroups": "subgroup", "timestamp-query": "timestamp-query"}


class Device:
    """One wgpu adapter and device with the limits and features the kernel can use."""

    name = NAME
    compiler = COMPILER

    def __init__(self) -> None:
        self.adapter = _choose_adapter()
        limits = {k: self.adapter.limits[k] for k in _LIMITS_WANTED if k in self.adapter.limits}
        wanted = [wgpu_name for wgpu_name in _FEATURES.values() if wgpu_name in self.adapter.features]
        self.device = self.adapter.request_device_sync(label="pipeline", required_features=wanted,
                                                       required_limits=limits)
        self.limits = {k: int(self.device.limits[k]) for k in _LIMITS_WANTED if k in self.device.limits}
        self.features = frozenset(ours for ours, theirs in _FEATURES.items() if theirs in self.device.features)
        info = self.adapter.info
        self.info = {
            "adapter": _adapter_name(self.adapter),
            "backend": info.get("backend_type", ""),
            "adapter_type": info.get("adapter_type", ""),
            "driver": info.get("description", ""),
        }
        # One map request is outstanding at a time (the Gpu's lock): its callback leaves
        # (status, message) in `_mapped`. A signal handled inside the callback raises there,
        # where cffi would print and drop it (and `_mapped` stay empty): `_caught` keeps it
        # for the waiting code to raise (see `map`).
        self._mapped: list[tuple[int, str]] = []
        self._caught: list[BaseException] = []

        def caught(_type, value, _traceback):
            self._caught.append(value)

        @native.ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)", onerror=caught)
        def mapped(status, message, _userdata1, _userdata2):
            ok = status == native.lib.WGPUMapAsyncStatus_Success
            self._mapped.append((status, "" if ok else native.from_c_string_view(message)))

        self._map_callback_function = mapped  # cffi frees a callback with its last reference
        self._map_callback = native.new_struct(
            "WGPUBufferMapCallbackInfo", mode=native.lib.WGPUCallbackMode_AllowProcessEvents, callback=mapped)

    # -- buffers
    def buffer(self, size: int, usage: int, label: str = "") -> wgpu.GPUBuffer:
        return self.device.create_buffer(size=size, usage=usage, label=label)

    def destroy(self, buffer: wgpu.GPUBuffer) -> None:
        buffer.destroy()

    def write(self, buffer: wgpu.GPUBuffer, data: np.ndarray, offset: int = 0) -> None:
        self.device.queue.write_buffer(buffer, offset, data)

    def map(self, buffer: wgpu.GPUBuffer, size: int, write: bool = False) -> np.ndarray:
        """The first `size` bytes of a MAP_READ (or, `write`, MAP_WRITE) buffer as a uint8
        array over its mapping, once the GPU is done with the buffer; valid until `unmap`.

        wgpu's own map_sync (wgpu 0.32) submits an empty command buffer before every read
        mapping and hands the wait to its poll thread: a polling thread that holds the device
        while our map request waits on it, then a thread switch back; on the H200 host that
        was 0.2 ms of a small call's 0.55-0.63 ms. Here the request goes straight to
        wgpu-native and this thread polls until its callback has run (no other thread
        polls: nothing here takes wgpu's poll tokens).

        When it raises (a failed mapping, or KeyboardInterrupt from Ctrl-C during the wait)
        the buffer is left unmapped: the caller does not unmap it.
        """
        done, caught = self._mapped, self._caught
        done.clear()
        mode = native.lib.WGPUMapMode_Write if write else native.lib.WGPUMapMode_Read
        native.libf.wgpuBufferMapAsync(buffer._internal, mode, 0, size, self._map_callback)
        try:
            # Python runs between polls: a signal that arrives while the GPU works is raised
            # here, in this thread, and one that the callback caught is raised after it.
            while not done and not caught:
                native.libf.wgpuDevicePoll(self.device._internal, True, native.ffi.NULL)
            if caught:
                raise caught.pop()
            status, message = done[0]
            if status != native.lib.WGPUMapAsyncStatus_Success:
                raise RuntimeError(f"wgpu: mapping a buffer failed ({status}): {message}")
            pointer = native.libf.wgpuBufferGetMappedRange(buffer._internal, 0, size)
            return np.frombuffer(native.ffi.buffer(pointer, size), dtype=np.uint8)
        except BaseException:
            self._abandon(buffer)
            raise

    def _abandon(self, buffer: wgpu.GPUBuffer) -> None:
        """Leave `buffer` unmapped after its map request raised: a pending mapping is
        cancelled (its callback answers "aborted" at once), a finished one released, the
        device usable. A mapping whose callback was interrupted may have failed: unmapping it
        then is a validation error, which says only that."""
        if self._mapped and self._mapped[0][0] != native.lib.WGPUMapAsyncStatus_Success:
            return
        try:
            native.libf.wgpuBufferUnmap(buffer._internal)
        except wgpu.GPUValidationError:
            if self._mapped:
                raise

    def unmap(self, buffer: wgpu.GPUBuffer) -> None:
        native.libf.wgpuBufferUnmap(buffer._internal)

    # -- pipelines
    def compile_messages(self, code: str) -> list[str]:
        """naga's errors and warnings for a module (empty when it compiles cleanly)."""
        try:
            module = self.device.create_shader_module(code=code)
        except Exception as exc:
            return [f"error: {exc}"]
        # wgpu 0.32 reports no compilation messages beyond errors (an empty list): kept for when it does.
        return [f"message: {m}" for m in module.get_compilation_info_sync()]

    def pipeline(self, code: str, bindings: list[str] | None, label: str) -> Pipeline:
        """A compute pipeline of `code`'s `main`: with an explicit layout of `bindings`
        ("read-only-storage", "storage" or "uniform", binding i the i-th) or, with None, the module's own."""
        module = self.device.create_shader_module(code=code, label=label)
        if bindings is None:
            pipeline = self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": "main"}, label=label)
            return Pipeline(pipeline, pipeline.get_bind_group_layout(0))
        types = {"read-only-storage": wgpu.BufferBindingType.read_only_storage,
                 "storage": wgpu.BufferBindingType.storage, "uniform": wgpu.BufferBindingType.uniform}
        layout = self.device.create_bind_group_layout(entries=[
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": types[t]}}
            for i, t in enumerate(bindings)
        ])
        pipeline = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"}, label=label)
        return Pipeline(pipeline, layout)

    def bind_group(self, pipeline: Pipeline, buffers: list[wgpu.GPUBuffer]) -> wgpu.GPUBindGroup:
        return self.device.create_bind_group(
            layout=pipeline.layout,
            entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)])

    # -- commands
    def encoder(self) -> Encoder:
        return Encoder(self.device.create_command_encoder())

    def submit(self, encoder: Encoder) -> None:
        self.device.queue.submit([encoder.encoder.finish()])

    def query_set(self, count: int) -> wgpu.GPUQuerySet:
        return self.device.create_query_set(type=wgpu.QueryType.timestamp, count=count)


class Encoder:
    """Commands recorded for one submission."""

    def __init__(self, encoder: wgpu.GPUCommandEncoder) -> None:
        self.encoder = encoder

    def compute(self, pipeline: Pipeline, launches, timestamps: tuple | None = None) -> None:
        """One compute pass: each (bind group, (x, y) workgroups) of `launches` in order;
        `timestamps` (query set, i) writes queries i and i + 1 at the pass's start and end."""
        writes = None
        if timestamps is not None:
            queries, at = timestamps
            writes = {"query_set": queries, "beginning_of_pass_write_index": at, "end_of_pass_write_index": at + 1}
        compute = self.encoder.begin_compute_pass(timestamp_writes=writes)
        compute.set_pipeline(pipeline.pipeline)
        bound = None
        for bind_group, groups in launches:
            if bind_group is not bound:
                compute.set_bind_group(0, bind_group)
                bound = bind_group
            compute.dispatch_workgroups(*groups)
        compute.end()

    def copy(self, src, src_offset: int, dst, dst_offset: int, size: int) -> None:
        self.encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size)

    def clear(self, buffer) -> None:
        self.encoder.clear_buffer(buffer)

    def resolve(self, queries, count: int, dst) -> None:
        self.encoder.resolve_query_set(queries, 0, count, dst, 0)


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
        raise RuntimeError(no_adapter_help(NAME)) from exc
    if adapter is None:
        raise RuntimeError(no_adapter_help(NAME))
    return adapter


def _adapter_name(adapter: wgpu.GPUAdapter) -> str:
    info = adapter.info
    return info.get("device") or info.get("description") or info.get("vendor") or "unknown"
