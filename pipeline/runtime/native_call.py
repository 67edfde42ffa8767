"""A delegate's call in one crossing into C++: upload, launch and read-back made by the
native backend's own launch code (pipeline/native: LayerNormLaunch, the same WGSL and
configuration rule), built without ExecuTorch as libpipeline_layer_norm.so.

A call from Python through wgpu-py pays its wrappers and our bookkeeping around some twenty
device operations: 150-250 µs of a small call's 330-450 µs on the H200 host, where one
submit and map cost ~95 µs (docs/measurements.md, "The host path"). Here Python checks the
arguments, makes the output tensors and calls once; the device work runs in C++ with the
GIL released.

The library binds to the wgpu-native that wgpu-py loaded (made global here first), so the
process holds one copy of it. With PIPELINE_WEBGPU=dawn its Dawn build
(libpipeline_layer_norm_dawn.so, the same sources against Dawn's C API) binds every call
to dawn-python's library by dlsym; each implementation has its library and device, and both
may be open in one process. PIPELINE_NATIVE_CALL=0 makes delegates launch from Python
(to compare, or where no C++ compiler can build the library).
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

import torch

from pipeline.runtime import device

NATIVE_CALL_ENV = "PIPELINE_NATIVE_CALL"
_REASON_BYTES = 512

# By implementation (PIPELINE_WEBGPU): its library, or why it cannot be had.
_libs: dict[str, ctypes.CDLL] = {}
_failures: dict[str, str] = {}
_lock = threading.Lock()
# The runtime's stats() for calls made here: launches, pipelines and buffers counted by each
# implementation's library (from a baseline that reset_counters moves), bytes counted by NativeCall.
_LIBRARY_COUNTERS = ("dispatches", "pipelines_compiled", "buffers_allocated")
_opened: set[str] = set()
_baselines: dict[str, dict[str, int]] = {}
_bytes = {"bytes_uploaded": 0, "bytes_read_back": 0}
_warned = False  # that the library is unavailable, once per process


def wanted() -> bool:
    """Whether delegates call through the library: PIPELINE_NATIVE_CALL is not 0."""
    device.implementation()  # an unknown PIPELINE_WEBGPU is refused here too
    return os.environ.get(NATIVE_CALL_ENV, "").strip() != "0"


def library() -> ctypes.CDLL:
    """The call library of the implementation PIPELINE_WEBGPU names, built first if out of
    date (no compiler is needed when it is up to date). Raises RuntimeError saying why it
    cannot be had."""
    name = device.implementation()
    with _lock:
        if name not in _libs and name not in _failures:
            try:
                _libs[name] = _load(name)
            except Exception as exc:  # BuildError, OSError from dlopen, RuntimeError from binding
                _failures[name] = f"{type(exc).__name__}: {exc}"
        if name not in _libs:
            raise RuntimeError(f"the native call library for {name} is unavailable: {_failures[name]}")
        return _libs[name]


def _load(name: str) -> ctypes.CDLL:
    # Imported here: the build module reads the package's sources, which a process that
    # never opens a delegate does not need.
    from pipeline.native.build import build

    dawn = name == "dawn"
    path = build(runtime=True, dawn=dawn)
    if not dawn:
        from pipeline.native import wgpu_native_global

        wgpu_native_global()
    lib = ctypes.CDLL(str(path))
    lib.pipeline_layer_norm_device.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.pipeline_layer_norm_device.restype = ctypes.c_int
    lib.pipeline_layer_norm_layouts.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.pipeline_layer_norm_layouts.restype = ctypes.c_int
    lib.pipeline_layer_norm_subgroup_size.argtypes = []
    lib.pipeline_layer_norm_subgroup_size.restype = ctypes.c_int
    lib.pipeline_layer_norm_open.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.pipeline_layer_norm_open.restype = ctypes.c_void_p
    lib.pipeline_layer_norm_run.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
    ]
    lib.pipeline_layer_norm_run.restype = ctypes.c_int
    lib.pipeline_layer_norm_close.argtypes = [ctypes.c_void_p]
    lib.pipeline_layer_norm_close.restype = None
    lib.pipeline_layer_norm_binding_limit.argtypes = []
    lib.pipeline_layer_norm_binding_limit.restype = ctypes.c_uint64
    lib.pipeline_layer_norm_counters.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    lib.pipeline_layer_norm_counters.restype = None
    if dawn:
        from pipeline.native import bind_dawn

        bind_dawn(lib.pipeline_layer_norm_bind, lib.pipeline_layer_norm_device)
    return lib


def counters() -> dict[str, int]:
    """Launches, pipelines, buffers and bytes of the calls made through the libraries since
    the last reset (zeros before a delegate has been opened)."""
    counts = dict.fromkeys(_LIBRARY_COUNTERS, 0)
    for name in _opened:
        now, base = _library_counters(name), _baselines.get(name, {})
        for k in _LIBRARY_COUNTERS:
            counts[k] += now[k] - base.get(k, 0)
    return {**counts, **_bytes}


def reset_counters() -> None:
    for name in _opened:
        _baselines[name] = _library_counters(name)
    for k in _bytes:
        _bytes[k] = 0


def _library_counters(name: str) -> dict[str, int]:
    values = (ctypes.c_uint64 * len(_LIBRARY_COUNTERS))()
    _libs[name].pipeline_layer_norm_counters(values)
    return dict(zip(_LIBRARY_COUNTERS, values))


def device_name() -> str:
    """The library's adapter. Raises RuntimeError (with wgpu's reason) without one."""
    reason = ctypes.create_string_buffer(_REASON_BYTES)
    if not library().pipeline_layer_norm_device(reason, _REASON_BYTES):
        raise RuntimeError(f"the native call library has no device: {reason.value.decode(errors='replace')}")
    return reason.value.decode(errors="replace")


def device_layouts() -> str | None:
    """Where the layouts table the library's device took comes from (PIPELINE_LAYOUTS's file,
    or the shipped table's place in the package), or None where it takes the rule. Raises
    RuntimeError (with wgpu's reason) without a device."""
    text = ctypes.create_string_buffer(_REASON_BYTES)
    if not library().pipeline_layer_norm_layouts(text, _REASON_BYTES):
        raise RuntimeError(f"the native call library has no device: {text.value.decode(errors='replace')}")
    return text.value.decode(errors="replace") or None


def subgroup_size() -> int:
    """The subgroup size the library's kernels use (0: workgroup-memory merges)."""
    device_name()
    return library().pipeline_layer_norm_subgroup_size()


def available() -> bool:
    """Whether delegates call through the library: wanted() and the library loads; when it
    does not, one warning per process says why the call stays in Python."""
    global _warned
    if not wanted():
        return False
    try:
        library()
    except RuntimeError as exc:
        if not _warned:
            _warned = True
            warnings.warn(f"{exc}; LayerNorm delegates launch the kernel from Python instead (same WebGPU "
                          f"kernel, a slower call). Reinstall the package (it builds the library), or "
                          f"set {NATIVE_CALL_ENV}=0 to choose this.", RuntimeWarning, stacklevel=3)
        return False
    return True


def binding_limit() -> int:
    """The most bytes one binding holds on the library's device (0 without one)."""
    return library().pipeline_layer_norm_binding_limit()


class NativeCall:
    """One delegate opened in the library: its constants on the device, its pipeline compiled."""

    def __init__(self, blob: bytes) -> None:
        self._lib = library()
        reason = ctypes.create_string_buffer(_REASON_BYTES)
        handle = self._lib.pipeline_layer_norm_open(blob, len(blob), reason, _REASON_BYTES)
        if not handle:
            raise RuntimeError(f"opening the delegate on the GPU failed: {reason.value.decode(errors='replace')}")
        self._handle = handle
        _opened.add(device.implementation())

    def __call__(self, x: torch.Tensor, rows: int, width: int, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, out: torch.Tensor, mean: torch.Tensor | None,
                 rstd: torch.Tensor | None) -> None:
        """Normalizes contiguous CPU `x` ((rows, width) values of the blob's dtype) into `out`,
        and float32 `mean`/`rstd` unless None; `weight`/`bias` only where they are inputs."""
        reason = ctypes.create_string_buffer(_REASON_BYTES)
        ok = self._lib.pipeline_layer_norm_run(
            self._handle, x.data_ptr(), rows, width, _pointer(weight), _pointer(bias), out.data_ptr(),
            _pointer(mean), _pointer(rstd), reason, _REASON_BYTES)
        if not ok:
            raise RuntimeError(f"the LayerNorm delegate's GPU call failed: {reason.value.decode(errors='replace')}")
        _bytes["bytes_uploaded"] += x.nbytes + sum(t.nbytes for t in (weight, bias) if t is not None)
        _bytes["bytes_read_back"] += out.nbytes + sum(t.nbytes for t in (mean, rstd) if t is not None)

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.pipeline_layer_norm_close(handle)


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
