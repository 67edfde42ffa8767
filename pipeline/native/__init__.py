"""The native WebGPUBackend: our delegate blobs run by ExecuTorch's own C++ runtime.

    import pipeline.native
    pipeline.native.register()          # builds if needed, then registers "WebGPUBackend"
    program = pipeline.native.load("model.pte")
    outputs = program(*inputs)          # a list of tensors, as ExecuTorch's runtime returns

The backend (C++ in this folder) decodes the same blob as `pipeline.blob`, runs the same
WGSL files with the same configuration rule as `pipeline.runtime`, and is built against
the executorch and wgpu wheels when the package installs (`pipeline.native.build`); with
PIPELINE_WEBGPU=dawn its Dawn build runs instead, on dawn-python's Dawn.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

from pipeline.blob import BACKEND_ID

__all__ = ["NativeProgram", "check_blob", "decode_layouts", "load", "register", "shipped_layouts", "wgsl_source"]

_REASON_BYTES = 512
# Numbers a layouts entry comes back as (BackendLibrary.cpp's entries_out).
_ENTRY_NUMBERS = 11

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def _start_threadpool_quietly() -> None:
    """Creates ExecuTorch's threadpool (XNNPACK's delegates run on it) with stderr pointed at
    /dev/null: creating it, ExecuTorch logs from C++ each /sys file cpuinfo could not read
    (ARM identification files, on any machine) and "CPU info and manual query on # of cpus
    dont match", five lines that say nothing about the program."""
    from executorch.extension.pybindings import _portable_lib

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            _portable_lib._threadpool_get_thread_count()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def wgpu_native_global() -> None:
    """wgpu-native, which wgpu-py loads privately, made global: it resolves the wgpu builds'
    calls (neither records where the wheel keeps it)."""
    from wgpu.backends.wgpu_native import _ffi

    ctypes.CDLL(_ffi.lib_path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)


def library() -> ctypes.CDLL:
    """The backend library loaded into this process (built first if out of date): its Dawn
    build where PIPELINE_WEBGPU is dawn when first asked for. One per process: both register
    the one name, WebGPUBackend.

    Raises pipeline.native.build.BuildError when it cannot be built (no compiler, wheels
    missing) or does not load, saying why; RuntimeError where Dawn's library cannot be bound.
    """
    global _lib
    with _lock:
        if _lib is None:
            # Imported here: `python -m pipeline.native.build` must not find it imported.
            from pipeline.native.build import BuildError, build
            from pipeline.environment import implementation

            dawn = implementation() == "dawn"
            path = build(dawn=dawn)
            # Our library links against _portable_lib and the registry it uses (by soname): load
            # them the way executorch.runtime does first, so that one registry is shared.
            import executorch.extension.pybindings.portable_lib  # noqa: F401

            if not dawn:
                wgpu_native_global()

            _start_threadpool_quietly()
            try:
                lib = ctypes.CDLL(os.fspath(path))
            except OSError as exc:
                raise BuildError(f"{path} does not load ({exc}); rebuild it against the installed wheels with "
                                 "`python -m pipeline.native.build --force`") from exc
            lib.pipeline_webgpu_register.restype = ctypes.c_int
            lib.pipeline_webgpu_probe.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            lib.pipeline_webgpu_probe.restype = ctypes.c_int
            lib.pipeline_webgpu_subgroup_size.restype = ctypes.c_int
            lib.pipeline_webgpu_pack2x16float.restype = ctypes.c_int
            lib.pipeline_webgpu_binding_limit.restype = ctypes.c_uint64
            lib.pipeline_webgpu_wgsl_source.argtypes = [
                ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
            ]
            lib.pipeline_webgpu_wgsl_source.restype = ctypes.c_longlong
            lib.pipeline_webgpu_decode_layouts.argtypes = [
                ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
            ]
            lib.pipeline_webgpu_decode_layouts.restype = ctypes.c_longlong
            lib.pipeline_webgpu_shipped_layouts.argtypes = [
                ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_char_p,
                ctypes.c_size_t,
            ]
            lib.pipeline_webgpu_shipped_layouts.restype = ctypes.c_longlong
            lib.pipeline_webgpu_check_blob.argtypes = [
                ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
            ]
            lib.pipeline_webgpu_check_blob.restype = ctypes.c_int
            lib.pipeline_bundle_open.argtypes = [
                ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
            ]
            lib.pipeline_bundle_open.restype = ctypes.c_void_p
            lib.pipeline_bundle_run.argtypes = [
                ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_size_t,
            ]
            lib.pipeline_bundle_run.restype = ctypes.c_int
            lib.pipeline_bundle_verify.argtypes = [ctypes.c_void_p, ctypes.c_double]
            lib.pipeline_bundle_verify.restype = ctypes.c_int
            lib.pipeline_bundle_outputs.argtypes = [ctypes.c_void_p]
            lib.pipeline_bundle_outputs.restype = ctypes.c_longlong
            lib.pipeline_bundle_output.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
            lib.pipeline_bundle_output.restype = ctypes.c_longlong
            lib.pipeline_bundle_close.argtypes = [ctypes.c_void_p]
            if dawn:
                bind_dawn(lib.pipeline_webgpu_bind, lib.pipeline_webgpu_probe)
            _lib = lib
        return _lib


def bind_dawn(bind, open_device) -> None:
    """A Dawn build's calls bound to dawn-python's library through its `bind` entry point
    (the process's copy: dawn-python loads it privately), then its device opened by
    `open_device(reason, capacity)` while SwiftShader is offered to the Vulkan loader, as the
    Python runtime's Dawn device is opened. RuntimeError with the library's reason."""
    from pipeline.environment import with_swiftshader
    from pipeline.native.build import dawn_library

    bind.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    bind.restype = ctypes.c_int
    reason = ctypes.create_string_buffer(_REASON_BYTES)
    if not bind(str(dawn_library()).encode(), reason, _REASON_BYTES):
        raise RuntimeError(reason.value.decode(errors="replace"))
    with with_swiftshader():
        open_device(reason, _REASON_BYTES)


def register() -> None:
    """Make ExecuTorch's runtime in this process able to run our files. Idempotent.

    After it, `executorch.runtime.Runtime.get().backend_registry.registered_backend_names`
    lists "WebGPUBackend". Raises BuildError if the backend cannot be built, RuntimeError if
    registration fails.
    """
    error = library().pipeline_webgpu_register()
    if error != 0:
        raise RuntimeError(f"registering {BACKEND_ID} failed: executorch error 0x{error:x}")


def device() -> tuple[bool, str]:
    """(available, adapter name or the reason there is none), as the backend sees it."""
    reason = ctypes.create_string_buffer(_REASON_BYTES)
    ok = library().pipeline_webgpu_probe(reason, _REASON_BYTES)
    return bool(ok), reason.value.decode(errors="replace")


def subgroup_size() -> int:
    """The subgroup size the backend's kernels use (0: none); -1 without a device."""
    return library().pipeline_webgpu_subgroup_size()


def pack2x16float() -> int:
    """1 when the backend's float16 stores use pack2x16float (its device probe passed), 0
    when not; -1 without a device."""
    return library().pipeline_webgpu_pack2x16float()


def wgsl_source(width: int, has_weight: bool, has_bias: bool, subgroup_size: int, dtype: str = "float32",
                affine_dtype: str | None = None, pack2x16float: bool = False, rows: int = 0,
                write_stats: bool = True, compiler: str = "naga", layouts: str | None = None,
                rms: bool = False) -> str:
    """The WGSL module the backend compiles for this configuration (no device needed), as
    `compiler` ("naga" or "tint") takes it; `affine_dtype` (of weight and bias) defaults to
    `dtype`; `rows` is the launch's (0: the rule by width alone); `layouts`, a layouts
    file's text (handed to the backend as its binary twin) whose layout the launch takes
    where it has one; `rms`, an RMSNorm's."""
    from pipeline.blob import DTYPE_CODES
    from pipeline.wgsl.layouts import parse

    lib = library()
    table = None if layouts is None else parse(layouts).binary(layouts.encode())
    args = (width, int(has_weight), int(has_bias), subgroup_size, DTYPE_CODES[dtype], DTYPE_CODES[affine_dtype or dtype],
            int(pack2x16float), rows, int(write_stats), int(rms), int(compiler == "tint"), table, len(table or b""))
    size = lib.pipeline_webgpu_wgsl_source(*args, None, 0)
    if size < 0:
        raise ValueError(f"no WGSL for width={width!r}")
    out = ctypes.create_string_buffer(size + 1)
    lib.pipeline_webgpu_wgsl_source(*args, out, size + 1)
    return out.raw[:size].decode()


def decode_layouts(data: bytes, source: str = "<layouts>", text: bytes | None = None) -> tuple[str, str, dict]:
    """The table the backend reads from `data`, a layouts table's binary twin (refused unless
    written from `text`, where given): its adapter, implementation and entries (as
    `shipped_layouts` gives them); ValueError with the backend's reason where it refuses it."""
    lib = library()
    names = ctypes.create_string_buffer(_REASON_BYTES)
    args = (data, len(data), source.encode(), text, len(text or b""))
    entries = _entries(lambda out, capacity: lib.pipeline_webgpu_decode_layouts(*args, out, capacity, names,
                                                                                  _REASON_BYTES))
    if entries is None:
        raise ValueError(names.value.decode(errors="replace"))
    adapter, _, implementation = names.value.decode().partition("\n")
    return adapter, implementation, entries


def shipped_layouts(adapter: str, implementation: str) -> tuple[str, dict[tuple, tuple]] | None:
    """The table the backend ships for `adapter` through `implementation`, or None: its source,
    and for each launch (dtype, affine_dtype, weight, bias, stats, width, rows, norm; dtypes
    and norm as names) its threads per row, workgroup and words, as compiled into the library."""
    lib = library()
    key = (adapter.encode(), implementation.encode())
    source = ctypes.create_string_buffer(_REASON_BYTES)
    entries = _entries(lambda out, capacity: lib.pipeline_webgpu_shipped_layouts(*key, out, capacity, source,
                                                                                   _REASON_BYTES))
    return None if entries is None else (source.value.decode(), entries)


def _entries(call) -> dict[tuple, tuple] | None:
    """The entries `call(out, capacity)` writes, _ENTRY_NUMBERS numbers each (it returns their
    count: called once for it, then to fill), or None where it returns -1."""
    from pipeline.blob import DTYPE_CODES
    from pipeline.wgsl.layouts import NORMS

    count = call(None, 0)
    if count < 0:
        return None
    numbers = (ctypes.c_uint64 * (_ENTRY_NUMBERS * count))()
    call(numbers, len(numbers))
    names = {code: name for name, code in DTYPE_CODES.items()}
    entries = {}
    for at in range(0, len(numbers), _ENTRY_NUMBERS):
        dtype, affine_dtype, weight, bias, stats, width, rows, rms, threads, workgroup, words = numbers[
            at: at + _ENTRY_NUMBERS]
        launch = (names[dtype], names[affine_dtype], bool(weight), bool(bias), bool(stats), width, rows,
                  NORMS[rms])
        entries[launch] = (threads, workgroup, bool(words))
    return entries


def check_blob(blob: bytes) -> str | None:
    """None when the backend accepts `blob`, else its reason for refusing it."""
    reason = ctypes.create_string_buffer(_REASON_BYTES)
    data = bytes(blob)
    ok = library().pipeline_webgpu_check_blob(data, len(data), reason, _REASON_BYTES)
    return None if ok else reason.value.decode(errors="replace")


class NativeProgram:
    """A `.pte` (a path, or its bytes) loaded in ExecuTorch's runtime; call it with the
    method's inputs. The ExecuTorch Program is kept alive with the method: dropping it
    first crashes ExecuTorch's runtime.

    ExecuTorch's runtime trusts much of a file (an operator index, a string's encoding):
    damage it does not check can crash the process. So the file is read once into memory
    and checked by the Python runtime's reader first (framing, structure, indices, planned
    memory, constants, and every instruction's shapes and dtypes, our delegates' blobs
    decoded); ExecuTorch's runtime then loads those same bytes, never the file, so
    truncating or overwriting the file later cannot reach it. Raises PteError (a
    ValueError) for what the checks refuse, OSError as the OS reports, RuntimeError for
    what ExecuTorch's runtime refuses (its error code in the message); `source` names
    bytes in those messages (a file already read). Inputs are checked
    as the Python runtime checks them (structure, dtype, shape, dense CPU tensors) before
    ExecuTorch's runtime sees them, and it takes what the Python runtime takes: a strided
    input (channels-last, transposed, expanded, overlapping) or one that requires grad (a
    Parameter) is passed as a detached copy laid out as the program declares it.
    """

    def __init__(self, path: str | os.PathLike | bytes, method: str = "forward", *,
                 enable_etdump: bool = False, source: str | None = None) -> None:
        from pipeline.pte.file import PteError, PteFile

        if isinstance(path, (bytes, bytearray, memoryview)):
            self.path = None
            pte = PteFile(bytes(path), source or "<bytes>")
        else:
            self.path = Path(path)
            pte = PteFile.read(self.path)
        self._in_spec = _checked(pte, method)
        self._plan = pte.plan
        from executorch.runtime import Runtime

        try:
            self.program = Runtime.get().load_program(pte.data, enable_etdump=enable_etdump)
            self.method = self.program.load_method(method)
        except RuntimeError as exc:
            raise PteError(f"{pte.source}: ExecuTorch's runtime refused the program: {exc}") from None

    def __call__(self, *inputs) -> list:
        """The method's outputs, a list as ExecuTorch's runtime returns it (tensors copied
        out, so a later call does not overwrite them)."""
        from executorch.exir import schema

        from pipeline.pte import inputs as checks

        plan = self._plan
        flat = checks.checked(plan, self._in_spec, inputs)
        for k, j in enumerate(plan.inputs):
            declared = plan.values[j].val
            if isinstance(declared, schema.Tensor):
                flat[k] = checks.laid_out(declared, flat[k])
        outputs = self.method.execute(flat)
        return [o.clone() if hasattr(o, "clone") else o for o in outputs]


class NativeBundle:
    """A bundled program (ExecuTorch devtools' BundledProgram: a program with its inputs and
    the outputs it should give) run in ExecuTorch's runtime from C++ (BundleRunner.cpp): the
    program loaded from memory with its planned buffers, the bundle's inputs set and its
    outputs checked by ExecuTorch's own bundled-program calls. No torch tensor crosses into
    ExecuTorch, so it runs where ExecuTorch's Python bindings cannot take or give one (a torch
    other than the one its wheel was built against: "tensor does not have a device").
    ExecuTorch's bundled-program calls trust the bundle, so it is read and checked here first
    (`pipeline.pte.bundle.read`), its program as NativeProgram checks one and forward's first
    test case (`inputs`, `expected`) against the method's signature; PteError (a ValueError)
    for what the checks refuse, `source` naming the bytes. RuntimeError with ExecuTorch's error
    where one of its calls fails."""

    def __init__(self, data: bytes, source: str = "<bytes>") -> None:
        from pipeline.pte import bundle, inputs
        from pipeline.pte.file import PteError, PteFile

        data = bytes(data)
        read = bundle.read(data, source)
        pte = PteFile(read.program, f"{source}: its program")
        in_spec = _checked(pte, bundle.METHOD)
        try:
            inputs.checked(pte.plan, in_spec, read.inputs)
        except (TypeError, ValueError) as exc:
            raise PteError(f"{source}: the bundle's inputs: {exc}") from None
        if len(read.expected) != len(pte.plan.outputs):
            raise PteError(f"{source}: the bundle expects {len(read.expected)} outputs, the method gives "
                           f"{len(pte.plan.outputs)}")
        self.program, self.inputs, self.expected = read.program, read.inputs, read.expected
        self._lib = library()
        reason = ctypes.create_string_buffer(_REASON_BYTES)
        self._handle = self._lib.pipeline_bundle_open(data, len(data), bundle.METHOD.encode(), bundle.TEST_CASE,
                                                      reason, _REASON_BYTES)
        if not self._handle:
            raise RuntimeError(f"ExecuTorch's runtime refused the bundle: {reason.value.decode(errors='replace')}")

    def run(self) -> float:
        """Set the bundle's inputs and execute the method; the execution's seconds."""
        seconds = ctypes.c_double()
        reason = ctypes.create_string_buffer(_REASON_BYTES)
        if not self._lib.pipeline_bundle_run(self._handle, ctypes.byref(seconds), reason, _REASON_BYTES):
            raise RuntimeError(reason.value.decode(errors="replace"))
        return seconds.value

    def check(self, atol: float) -> bool:
        """ExecuTorch's check of the last run's outputs: every value within `atol` of the bundle's."""
        return bool(self._lib.pipeline_bundle_verify(self._handle, atol))

    def outputs(self) -> list:
        """The last run's outputs, copied out, each with the dtype and shape of the bundle's
        expected output; RuntimeError where their count or sizes differ."""
        import torch

        count = self._lib.pipeline_bundle_outputs(self._handle)
        if count != len(self.expected):
            raise RuntimeError(f"the method gave {count} outputs, the bundle expects {len(self.expected)}")
        got = []
        for i, want in enumerate(self.expected):
            out = torch.empty_like(want, memory_format=torch.contiguous_format)
            nbytes = out.numel() * out.element_size()
            size = self._lib.pipeline_bundle_output(self._handle, i, out.data_ptr(), nbytes)
            if size != nbytes:
                raise RuntimeError(f"output {i}: {size} bytes, the bundle expects {nbytes}")
            got.append(out)
        return got

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.pipeline_bundle_close(self._handle)
            self._handle = None


def _checked(pte, method: str):
    """The input spec of `pte`'s `method` once the program passes the Python runtime's checks
    and its delegates' rows fit the backend's device (our backend registered); PteError if not."""
    from pipeline.pte import inputs
    from pipeline.pte.file import PteError
    from pipeline.pte.verify import CheckError, check_program

    try:
        check_program(pte, BACKEND_ID)
        in_spec, _ = inputs.specs(pte.plan)
    except (CheckError, inputs.SignatureError) as exc:
        raise PteError(f"{pte.source}: {exc}") from None
    if pte.plan.name != method:
        raise PteError(f"{pte.source}: the program has no method {method!r} (its one method is "
                       f"{pte.plan.name!r})")
    register()
    _check_rows_fit(pte)
    return in_spec


def _check_rows_fit(pte) -> None:
    """PteError unless a row of each of our delegates fits a binding on the backend's device
    (ExecuTorch's runtime would report only an error code)."""
    from pipeline import blob
    from pipeline.pte.file import PteError

    limit = library().pipeline_webgpu_binding_limit()
    if not limit:
        return  # no device: ExecuTorch's runtime says so
    for i, d in enumerate(pte.plan.delegates):
        if d.id == BACKEND_ID:
            try:
                blob.decode(pte.delegate_bytes(d)).params.check_fits(limit)
            except ValueError as exc:
                raise PteError(f"{pte.source}: delegate {i}: {exc}") from None


def load(path: str | os.PathLike, method: str = "forward") -> NativeProgram:
    """Load `path` (a .pte) in ExecuTorch's runtime with our backend registered."""
    return NativeProgram(path, method)


