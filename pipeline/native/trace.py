"""What the native backend records about its delegate calls in ExecuTorch's runtime.

    from pipeline.native.trace import TracedProgram
    with TracedProgram("model.pte", etdump=True, capture=True) as program:
        outputs = program(*inputs)
        program.write_etdump("model.etdp")    # ExecuTorch's Inspector reads it
        calls = program.captured_calls()      # each WebGPU delegate call's tensors

ETDump: the program is loaded with ExecuTorch's ETDump generator (`enable_etdump`), which
the runtime hands to every delegate call; the backend adds one profiling event per call,
named "native_layer_norm #K" (K: the call's index within its forward) with the metadata
"rows=R width=W dtype=D timing=T" (`parse_metadata`). T is gpu where the adapter has
timestamp queries: the event spans the GPU time of the call's compute passes. Otherwise T
is wall: wall time, host to host (upload, launch and read-back, the delegate's cost).

The executorch 1.4.1 wheel's runtime (`_portable_lib`) is built without event tracing
(EXECUTORCH_ENABLE_EVENT_TRACER off): its Method records no events of its own (no
operator or delegate-call events, no "Execute" block, no chain or instruction ids), though
its ETDump generator works and reaches the backends. So on that runtime the file holds the
backend's events only, one block per forward that the backend opens itself (an event
outside a block aborts ETDumpGen); `runtime_records_events` finds out which kind of
runtime this is, on the program being loaded. XNNPACK's delegates record nothing there
either (none of their events appear in the dump).

Tracing switches are process-wide: one TracedProgram at a time.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import torch

from pipeline.native import NativeProgram, library

# ExecuTorch ScalarType codes (runtime/core/portable_type/scalar_type.h) of the dtypes a
# LayerNorm delegate sees.
_DTYPES = {3: torch.int32, 4: torch.int64, 5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool,
           15: torch.bfloat16}
_MAX_DIMS = 16


def _lib() -> ctypes.CDLL:
    lib = library()
    if not getattr(lib, "_trace_ready", False):
        lib.pipeline_webgpu_trace_configure.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.pipeline_webgpu_trace_configure.restype = None
        lib.pipeline_webgpu_trace_begin_run.restype = None
        lib.pipeline_webgpu_trace_calls.restype = ctypes.c_longlong
        lib.pipeline_webgpu_trace_args.argtypes = [ctypes.c_longlong]
        lib.pipeline_webgpu_trace_args.restype = ctypes.c_longlong
        lib.pipeline_webgpu_trace_arg.argtypes = [
            ctypes.c_longlong, ctypes.c_longlong, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
        ]
        lib.pipeline_webgpu_trace_arg.restype = ctypes.c_longlong
        lib._trace_ready = True
    return lib


def configure(capture: bool = False, etdump: bool = False, open_blocks: bool = False) -> None:
    """Switch the backend's recording on or off; drops what it captured before."""
    _lib().pipeline_webgpu_trace_configure(int(capture), int(etdump), int(open_blocks))


def captured_calls() -> list[list[torch.Tensor | None]]:
    """Every captured delegate call, in call order: its arguments (inputs, then outputs)
    as tensors (None for an argument that is not a tensor)."""
    lib = _lib()
    calls = []
    for call in range(lib.pipeline_webgpu_trace_calls()):
        args = []
        for arg in range(lib.pipeline_webgpu_trace_args(call)):
            scalar_type, ndim = ctypes.c_int(), ctypes.c_int()
            sizes = (ctypes.c_int64 * _MAX_DIMS)()
            nbytes = lib.pipeline_webgpu_trace_arg(call, arg, ctypes.byref(scalar_type), ctypes.byref(ndim), sizes,
                                                   _MAX_DIMS, None, 0)
            if scalar_type.value < 0:
                args.append(None)
                continue
            if scalar_type.value not in _DTYPES or ndim.value > _MAX_DIMS:
                raise RuntimeError(f"captured call {call} argument {arg}: scalar type {scalar_type.value}, "
                                   f"rank {ndim.value} not supported")
            tensor = torch.empty(list(sizes[:ndim.value]), dtype=_DTYPES[scalar_type.value])
            if tensor.numel() * tensor.element_size() != nbytes:
                raise RuntimeError(f"captured call {call} argument {arg}: {nbytes} bytes for shape "
                                   f"{list(tensor.shape)}")
            lib.pipeline_webgpu_trace_arg(call, arg, ctypes.byref(scalar_type), ctypes.byref(ndim), sizes, _MAX_DIMS,
                                          ctypes.c_void_p(tensor.data_ptr()), nbytes)
            args.append(tensor)
        calls.append(args)
    return calls


def parse_metadata(raw: list[str | bytes]) -> dict[str, list]:
    """The Inspector's `delegate_metadata_parser` for our events: the raw metadata of an
    event's runs -> {"rows": [...], "width": [...], "dtype": [...], "timing": [...]}."""
    parsed: dict[str, list] = {}
    for item in raw:
        text = item.decode() if isinstance(item, (bytes, bytearray)) else str(item)
        for field in text.split():
            key, _, value = field.partition("=")
            parsed.setdefault(key, []).append(int(value) if value.isdigit() else value)
    return parsed


def runtime_records_events(program) -> bool:
    """Whether ExecuTorch's runtime records ETDump events itself (built with event
    tracing): such a runtime has already opened a block and recorded its load events in
    `program` (an `executorch.runtime.Program` loaded with ETDump on, its method loaded).
    Writing the ETDump finds out: the wheel's runtime has nothing to write (and logs a line
    saying so, which is silenced here)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.etdp"
        with _stderr_silenced():
            program._program.write_etdump_result_to_file(str(path), None)
        return path.exists() and path.stat().st_size > 0


class _stderr_silenced:
    """Redirects the process's file descriptor 2 (C++ logs) to /dev/null for a block."""

    def __enter__(self):
        import sys

        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


class TracedProgram:
    """A `.pte` loaded as `pipeline.native.load` loads it (checked first), with the
    backend's recording on: an ETDump event per delegate call (`etdump`), each call's
    tensors copied (`capture`). Use as a context manager, or call `close()`: recording is
    switched off there."""

    def __init__(self, path: str | os.PathLike | bytes, etdump: bool = False, capture: bool = False,
                 method: str = "forward", source: str | None = None) -> None:
        self.native = NativeProgram(path, method, enable_etdump=etdump, source=source)
        self.etdump = etdump
        self.runtime_records = runtime_records_events(self.native.program) if etdump else False
        configure(capture=capture, etdump=etdump, open_blocks=etdump and not self.runtime_records)

    def __call__(self, *inputs) -> list:
        _lib().pipeline_webgpu_trace_begin_run()
        return self.native(*inputs)

    def captured_calls(self) -> list[list[torch.Tensor | None]]:
        return captured_calls()

    def write_etdump(self, path: str | os.PathLike) -> Path:
        """Write the ETDump of the runs so far to `path` (atomically); after it a new run
        starts a new dump. Raises RuntimeError when there is nothing to write."""
        if not self.etdump:
            raise RuntimeError("loaded without etdump=True")
        from pipeline.ioutil import write_bytes_atomic

        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / "run.etdp"
            with _stderr_silenced():
                self.native.program._program.write_etdump_result_to_file(str(scratch), None)
            if not scratch.exists():
                raise RuntimeError("the ETDump is empty: no delegate call of this backend ran")
            write_bytes_atomic(Path(path), scratch.read_bytes())
        return Path(path)

    def close(self) -> None:
        configure()

    def __enter__(self) -> TracedProgram:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
