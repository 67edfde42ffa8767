"""The device over Dawn (shader compiler Tint), through dawn-python's ctypes bindings of
webgpu.h: the WebGPU that ExecuTorch's WebGPU backend and Chromium run.

The same few operations as wgpu_impl.py. Every object creation that can fail validation
runs inside an error scope, and its message becomes the exception's; shader modules are
checked through their compilation info, warnings included.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
from pydawn import webgpu as w

from pipeline.environment import with_swiftshader
from pipeline.runtime.webgpu import ADAPTER_ENV, Pipeline, no_adapter_help

NAME = "dawn"
COMPILER = "tint"

WHOLE_SIZE = 0xFFFFFFFFFFFFFFFF
# How long one wait blocks in Dawn before Python runs again (to raise a pending signal).
_WAIT_SLICE_NS = 50_000_000
_FEATURES = {"subgroups": w.WGPUFeatureName_Subgroups, "timestamp-query": w.WGPUFeatureName_TimestampQuery}
_BINDING_TYPES = {"read-only-storage": w.WGPUBufferBindingType_ReadOnlyStorage,
                  "storage": w.WGPUBufferBindingType_Storage, "uniform": w.WGPUBufferBindingType_Uniform}
_BACKENDS = {w.WGPUBackendType_Vulkan: "Vulkan", w.WGPUBackendType_Metal: "Metal",
             w.WGPUBackendType_D3D12: "D3D12", w.WGPUBackendType_D3D11: "D3D11",
             w.WGPUBackendType_OpenGL: "OpenGL", w.WGPUBackendType_OpenGLES: "OpenGLES",
             w.WGPUBackendType_Null: "Null"}
_ADAPTER_TYPES = {w.WGPUAdapterType_DiscreteGPU: "DiscreteGPU", w.WGPUAdapterType_IntegratedGPU: "IntegratedGPU",
                  w.WGPUAdapterType_CPU: "CPU"}
# Our limit names (wgpu's) and webgpu.h's.
_LIMITS = {"max-buffer-size": "maxBufferSize", "max-storage-buffer-binding-size": "maxStorageBufferBindingSize",
           "max-compute-workgroup-storage-size": "maxComputeWorkgroupStorageSize",
           "max-compute-invocations-per-workgroup": "maxComputeInvocationsPerWorkgroup",
           "max-compute-workgroup-size-x": "maxComputeWorkgroupSizeX"}


def _text(view) -> str:
    return ctypes.string_at(view.data, view.length).decode("utf-8", "replace") if view.data else ""


def _view(text: str, keep: list) -> w.WGPUStringView:
    """A WGPUStringView of `text`; its bytes live as long as `keep`."""
    data = ctypes.create_string_buffer(text.encode("utf-8"))
    keep.append(data)
    view = w.WGPUStringView()
    view.data = ctypes.cast(data, ctypes.POINTER(ctypes.c_char))
    view.length = len(data.raw) - 1
    return view


class _Handle:
    """A Dawn object, released when the Python object goes."""

    def __init__(self, ptr, release) -> None:
        if not ptr:
            raise RuntimeError("Dawn returned no object")
        self.ptr = ptr
        self._release = release

    def __del__(self) -> None:
        if self.ptr:
            self._release(self.ptr)
            self.ptr = None


class Buffer(_Handle):
    def __init__(self, ptr, size: int) -> None:
        super().__init__(ptr, w.wgpuBufferRelease)
        self.size = size

    def destroy(self) -> None:
        if self.ptr:
            w.wgpuBufferDestroy(self.ptr)


class Device:
    """One Dawn adapter and device with the limits and features the kernel can use."""

    name = NAME
    compiler = COMPILER

    def __init__(self) -> None:
        self._keep: list = []  # callbacks and strings Dawn may still call or read
        self._errors: list[str] = []  # reported outside any error scope, raised at the next submit
        desc = w.WGPUInstanceDescriptor()
        desc.features.timedWaitAnyEnable = True
        with with_swiftshader():
            self.instance = w.wgpuCreateInstance(desc)
            self.adapter = self._request_adapter()
        info = w.WGPUAdapterInfo()
        w.wgpuAdapterGetInfo(self.adapter, info)
        self.info = {
            "adapter": _text(info.device) or _text(info.description) or "unknown",
            "backend": _BACKENDS.get(info.backendType, str(info.backendType)),
            "adapter_type": _ADAPTER_TYPES.get(info.adapterType, "Unknown"),
            "driver": _text(info.description),
        }
        wanted = os.environ.get(ADAPTER_ENV, "").strip().lower()
        if wanted and wanted not in self.info["adapter"].lower():
            raise RuntimeError(f"{ADAPTER_ENV}={wanted!r} matches no adapter; Dawn offers: {self.info['adapter']}")
        if info.backendType == w.WGPUBackendType_Null:
            raise RuntimeError(no_adapter_help(NAME))
        self.features = frozenset(ours for ours, theirs in _FEATURES.items()
                                  if w.wgpuAdapterHasFeature(self.adapter, theirs))
        self.device = self._request_device()
        self.queue = w.wgpuDeviceGetQueue(self.device)
        supported = w.WGPUSupportedLimits()
        w.wgpuDeviceGetLimits(self.device, supported)
        self.limits = {ours: int(getattr(supported.limits, theirs)) for ours, theirs in _LIMITS.items()}

    # -- set-up
    def _wait(self, future) -> None:
        """Wait for `future` in slices: Python runs between them, so a signal (Ctrl-C) that
        arrives while the GPU works is raised here, in this thread, within a slice."""
        wait = w.WGPUFutureWaitInfo()
        wait.future = future
        status = w.WGPUWaitStatus_TimedOut
        while status == w.WGPUWaitStatus_TimedOut:
            status = w.wgpuInstanceWaitAny(self.instance, 1, wait, _WAIT_SLICE_NS)
        if status != w.WGPUWaitStatus_Success:
            raise RuntimeError(f"waiting on Dawn failed: {w.WGPUWaitStatus__enumvalues.get(status, status)}")

    def _await(self, info_type, start, convert):
        """Start an asynchronous Dawn call whose callback info is `info_type` (`start` takes
        the info and returns the future), wait for it, and return `convert` of the callback's
        arguments, applied inside the callback (strings and structs it gets live no longer)."""
        got: list = []
        raised: list[BaseException] = []

        def answer(*args) -> None:
            try:
                got.append(convert(*args))
            except BaseException as exc:  # a signal handled here: ctypes would print and drop it
                raised.append(exc)

        info = info_type()
        info.mode = w.WGPUCallbackMode_WaitAnyOnly
        info.callback = type(info.callback)(answer)
        future = start(info)
        try:
            self._wait(future)
        except BaseException:
            self._keep.append(info.callback)  # Dawn may still call it, when the call is cancelled
            raise
        if raised:
            raise raised[0]
        if not got:
            # The callback was stopped on entry, before its `try`: by a signal's handler
            # (ctypes printed what it raised). Raised here, in the waiting code, instead.
            raise KeyboardInterrupt("interrupted while Dawn's callback ran")
        return got[0]

    def _request_adapter(self):
        options = w.WGPURequestAdapterOptions()
        options.powerPreference = w.WGPUPowerPreference_HighPerformance
        status, adapter, message = self._await(
            w.WGPURequestAdapterCallbackInfo, lambda info: w.wgpuInstanceRequestAdapterF(self.instance, options, info),
            lambda status, adapter, message, *_: (status, adapter, _text(message)))
        if status != w.WGPURequestAdapterStatus_Success or not adapter:
            raise RuntimeError(f"{no_adapter_help(NAME)} ({message})")
        return adapter

    def _request_device(self):
        keep = self._keep
        desc = w.WGPUDeviceDescriptor()
        # Timestamps at full resolution (Dawn quantizes them unless told otherwise).
        toggles = w.WGPUDawnTogglesDescriptor()
        toggles.chain.sType = w.WGPUSType_DawnTogglesDescriptor
        name = ctypes.create_string_buffer(b"timestamp_quantization")
        names = (ctypes.POINTER(ctypes.c_char) * 1)(ctypes.cast(name, ctypes.POINTER(ctypes.c_char)))
        toggles.disabledToggleCount = 1
        toggles.disabledToggles = names
        keep += [toggles, name, names]
        desc.nextInChain = ctypes.cast(ctypes.pointer(toggles), ctypes.POINTER(w.struct_WGPUChainedStruct))
        features = (w.WGPUFeatureName * len(self.features))(*[_FEATURES[f] for f in sorted(self.features)])
        desc.requiredFeatureCount = len(self.features)
        desc.requiredFeatures = ctypes.cast(features, ctypes.POINTER(w.WGPUFeatureName))
        supported = w.WGPUSupportedLimits()
        w.wgpuAdapterGetLimits(self.adapter, supported)
        required = w.WGPURequiredLimits()
        required.limits = supported.limits
        desc.requiredLimits = ctypes.pointer(required)
        lost = w.WGPUDeviceLostCallbackInfo2()
        lost.mode = w.WGPUCallbackMode_AllowSpontaneous
        lost.callback = type(lost.callback)(lambda *_: None)  # a lost device fails its next call's error scope
        errors = w.WGPUUncapturedErrorCallbackInfo2()
        errors.callback = type(errors.callback)(self._uncaptured)
        desc.deviceLostCallbackInfo2 = lost
        desc.uncapturedErrorCallbackInfo2 = errors
        keep += [features, required, lost.callback, errors.callback]
        status, device, message = self._await(
            w.WGPURequestDeviceCallbackInfo, lambda info: w.wgpuAdapterRequestDeviceF(self.adapter, desc, info),
            lambda status, device, message, *_: (status, device, _text(message)))
        if status != w.WGPURequestDeviceStatus_Success:
            raise RuntimeError(f"Dawn refused a device on {self.info['adapter']}: {message}")
        return device

    def _uncaptured(self, _device, kind, message, _a, _b) -> None:
        # Only reachable for work outside an error scope (submissions): kept for the next check.
        self._errors.append(_text(message))

    def _scoped(self, what: str, make):
        """`make()` inside validation, out-of-memory and internal error scopes: the object,
        or a RuntimeError with Dawn's message."""
        for kind in (w.WGPUErrorFilter_Validation, w.WGPUErrorFilter_OutOfMemory, w.WGPUErrorFilter_Internal):
            w.wgpuDevicePushErrorScope(self.device, kind)
        made = make()
        messages = []
        for _ in range(3):
            messages += self._pop_error()
        if messages:
            raise RuntimeError(f"Dawn: {what} failed: {' / '.join(messages)}")
        return made

    def _pop_error(self) -> list[str]:
        status, kind, message = self._await(
            w.WGPUPopErrorScopeCallbackInfo, lambda info: w.wgpuDevicePopErrorScopeF(self.device, info),
            lambda status, kind, message, *_: (status, kind, _text(message).strip()))
        return [message] if status == w.WGPUPopErrorScopeStatus_Success and kind != w.WGPUErrorType_NoError else []

    # -- buffers
    def buffer(self, size: int, usage: int, label: str = "") -> Buffer:
        keep: list = []
        desc = w.WGPUBufferDescriptor()
        desc.label = _view(label, keep)
        desc.size = size
        desc.usage = usage
        return Buffer(self._scoped(f"buffer {label!r} of {size} bytes", lambda: w.wgpuDeviceCreateBuffer(self.device, desc)),
                      size)

    def destroy(self, buffer: Buffer) -> None:
        buffer.destroy()

    def write(self, buffer: Buffer, data: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(data)
        w.wgpuQueueWriteBuffer(self.queue, buffer.ptr, offset, ctypes.c_void_p(data.ctypes.data), data.nbytes)

    def map(self, buffer: Buffer, size: int, write: bool = False) -> np.ndarray:
        """The first `size` bytes of a MAP_READ (or, `write`, MAP_WRITE) buffer as a uint8
        array over its mapping, once the GPU is done with the buffer; valid until `unmap`."""
        mode = w.WGPUMapMode_Write if write else w.WGPUMapMode_Read
        try:
            status, message = self._await(
                w.WGPUBufferMapCallbackInfo2, lambda info: w.wgpuBufferMapAsync2(buffer.ptr, mode, 0, size, info),
                lambda status, message, *_: (status, _text(message)))
            if status != w.WGPUMapAsyncStatus_Success:
                raise RuntimeError(f"Dawn: mapping a buffer failed: {message}")
            # Dawn gives a read mapping only through the const call; the array is only read then.
            get = w.wgpuBufferGetMappedRange if write else w.wgpuBufferGetConstMappedRange
            pointer = get(buffer.ptr, 0, size)
            return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_uint8)), (size,))
        except BaseException:
            # Raised (KeyboardInterrupt too) with the buffer unmapped: the caller does not unmap it.
            if w.wgpuBufferGetMapState(buffer.ptr) != w.WGPUBufferMapState_Unmapped:
                w.wgpuBufferUnmap(buffer.ptr)
            raise

    def unmap(self, buffer: Buffer) -> None:
        w.wgpuBufferUnmap(buffer.ptr)

    # -- pipelines
    def _module(self, code: str, label: str) -> tuple[_Handle, list[str]]:
        """The shader module and Tint's messages on it (errors and warnings)."""
        keep: list = []
        wgsl = w.WGPUShaderModuleWGSLDescriptor()
        wgsl.chain.sType = w.WGPUSType_ShaderSourceWGSL
        wgsl.code = _view(code, keep)
        desc = w.WGPUShaderModuleDescriptor()
        desc.label = _view(label, keep)
        desc.nextInChain = ctypes.cast(ctypes.pointer(wgsl), ctypes.POINTER(w.struct_WGPUChainedStruct))
        w.wgpuDevicePushErrorScope(self.device, w.WGPUErrorFilter_Validation)
        module = _Handle(w.wgpuDeviceCreateShaderModule(self.device, desc), w.wgpuShaderModuleRelease)
        scope = self._pop_error()

        def messages_of(status, info, *_) -> list[str]:
            if status != w.WGPUCompilationInfoRequestStatus_Success or not info:
                return []
            kinds = w.WGPUCompilationMessageType__enumvalues
            return [f"{kinds.get(m.type, '').rsplit('_', 1)[-1].lower()} at {m.lineNum}:{m.linePos}: {_text(m.message)}"
                    for m in info.contents.messages[: info.contents.messageCount]]

        messages = self._await(w.WGPUCompilationInfoCallbackInfo2,
                               lambda info: w.wgpuShaderModuleGetCompilationInfo2(module.ptr, info), messages_of)
        return module, messages or [f"error: {m}" for m in scope]

    def compile_messages(self, code: str) -> list[str]:
        """Tint's errors and warnings for a module (empty when it compiles cleanly)."""
        return self._module(code, "check")[1]

    def pipeline(self, code: str, bindings: list[str] | None, label: str) -> Pipeline:
        """A compute pipeline of `code`'s `main`: with an explicit layout of `bindings`
        (binding i the i-th) or, with None, the module's own."""
        module, messages = self._module(code, label)
        errors = [m for m in messages if m.startswith("error")]
        if errors:
            raise RuntimeError("Tint: " + " / ".join(errors))
        keep: list = []
        layout = None
        pipeline_layout = None
        if bindings is not None:
            entries = (w.WGPUBindGroupLayoutEntry * len(bindings))()
            for i, kind in enumerate(bindings):
                entries[i].binding = i
                entries[i].visibility = w.WGPUShaderStage_Compute
                entries[i].buffer.type = _BINDING_TYPES[kind]
            desc = w.WGPUBindGroupLayoutDescriptor()
            desc.entryCount = len(bindings)
            desc.entries = entries
            layout = _Handle(self._scoped("bind group layout", lambda: w.wgpuDeviceCreateBindGroupLayout(self.device, desc)),
                             w.wgpuBindGroupLayoutRelease)
            layouts = (w.WGPUBindGroupLayout * 1)(layout.ptr)
            pdesc = w.WGPUPipelineLayoutDescriptor()
            pdesc.bindGroupLayoutCount = 1
            pdesc.bindGroupLayouts = layouts
            pipeline_layout = _Handle(self._scoped("pipeline layout", lambda: w.wgpuDeviceCreatePipelineLayout(self.device, pdesc)),
                                      w.wgpuPipelineLayoutRelease)
        desc = w.WGPUComputePipelineDescriptor()
        desc.label = _view(label, keep)
        if pipeline_layout is not None:
            desc.layout = pipeline_layout.ptr
        desc.compute.module = module.ptr
        desc.compute.entryPoint = _view("main", keep)
        pipeline = _Handle(self._scoped(f"compute pipeline {label}", lambda: w.wgpuDeviceCreateComputePipeline(self.device, desc)),
                           w.wgpuComputePipelineRelease)
        if layout is None:
            layout = _Handle(w.wgpuComputePipelineGetBindGroupLayout(pipeline.ptr, 0), w.wgpuBindGroupLayoutRelease)
        return Pipeline(pipeline, layout)

    def bind_group(self, pipeline: Pipeline, buffers: list[Buffer]) -> _Handle:
        entries = (w.WGPUBindGroupEntry * len(buffers))()
        for i, buffer in enumerate(buffers):
            entries[i].binding = i
            entries[i].buffer = buffer.ptr
            entries[i].offset = 0
            entries[i].size = WHOLE_SIZE
        desc = w.WGPUBindGroupDescriptor()
        desc.layout = pipeline.layout.ptr
        desc.entryCount = len(buffers)
        desc.entries = entries
        group = _Handle(self._scoped("bind group", lambda: w.wgpuDeviceCreateBindGroup(self.device, desc)),
                        w.wgpuBindGroupRelease)
        group.buffers = buffers  # the buffers live as long as a bind group that holds them
        return group

    # -- commands
    def encoder(self) -> Encoder:
        return Encoder(_Handle(w.wgpuDeviceCreateCommandEncoder(self.device, w.WGPUCommandEncoderDescriptor()),
                               w.wgpuCommandEncoderRelease))

    def submit(self, encoder: Encoder) -> None:
        commands = _Handle(w.wgpuCommandEncoderFinish(encoder.encoder.ptr, w.WGPUCommandBufferDescriptor()),
                           w.wgpuCommandBufferRelease)
        w.wgpuQueueSubmit(self.queue, 1, (w.WGPUCommandBuffer * 1)(commands.ptr))
        if self._errors:
            failed, self._errors = self._errors, []
            raise RuntimeError(f"Dawn: submission failed: {' / '.join(failed)}")

    def query_set(self, count: int) -> _Handle:
        desc = w.WGPUQuerySetDescriptor()
        desc.type = w.WGPUQueryType_Timestamp
        desc.count = count
        return _Handle(self._scoped("query set", lambda: w.wgpuDeviceCreateQuerySet(self.device, desc)),
                       w.wgpuQuerySetRelease)


class Encoder:
    """Commands recorded for one submission."""

    def __init__(self, encoder: _Handle) -> None:
        self.encoder = encoder
        self._keep: list = []  # bind groups and buffers the commands use, until submitted

    def compute(self, pipeline: Pipeline, launches, timestamps: tuple | None = None) -> None:
        """One compute pass: each (bind group, (x, y) workgroups) of `launches` in order;
        `timestamps` (query set, i) writes queries i and i + 1 at the pass's start and end."""
        desc = w.WGPUComputePassDescriptor()
        if timestamps is not None:
            queries, at = timestamps
            writes = w.WGPUComputePassTimestampWrites()
            writes.querySet = queries.ptr
            writes.beginningOfPassWriteIndex = at
            writes.endOfPassWriteIndex = at + 1
            desc.timestampWrites = ctypes.pointer(writes)
        compute = w.wgpuCommandEncoderBeginComputePass(self.encoder.ptr, desc)
        w.wgpuComputePassEncoderSetPipeline(compute, pipeline.pipeline.ptr)
        bound = None
        for bind_group, groups in launches:
            if bind_group is not bound:
                w.wgpuComputePassEncoderSetBindGroup(compute, 0, bind_group.ptr, 0, None)
                bound = bind_group
                self._keep.append(bind_group)
            x, y = groups
            w.wgpuComputePassEncoderDispatchWorkgroups(compute, x, y, 1)
        w.wgpuComputePassEncoderEnd(compute)
        w.wgpuComputePassEncoderRelease(compute)

    def copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, size: int) -> None:
        w.wgpuCommandEncoderCopyBufferToBuffer(self.encoder.ptr, src.ptr, src_offset, dst.ptr, dst_offset, size)

    def clear(self, buffer: Buffer) -> None:
        w.wgpuCommandEncoderClearBuffer(self.encoder.ptr, buffer.ptr, 0, WHOLE_SIZE)

    def resolve(self, queries: _Handle, count: int, dst: Buffer) -> None:
        w.wgpuCommandEncoderResolveQuerySet(self.encoder.ptr, queries.ptr, 0, count, dst.ptr, 0)
