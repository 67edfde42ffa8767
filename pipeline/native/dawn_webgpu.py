"""dawn_webgpu.h: the declarations of Dawn's C API that the native libraries' Dawn build
compiles against, generated at build time from dawn-python's ctypes bindings
(`pydawn.webgpu`), which describe the very library dawn-python ships (it ships no C header).

Declared are the WGPU names pipeline/native's sources use and the calls in CALLS, with what
they need in turn: handles, the types and constants of enums and flags (their integer types,
as ctypes keeps them), structs (padding left to the compiler), callback types, and a
WGPUProc<symbol> function-pointer type per call (every call is bound by dlsym). Names the
sources use that Dawn lacks (wgpu-native's own) are left out; where the Dawn path uses one,
the compiler says so. Each struct's size and field offsets are asserted equal to ctypes', so a
wrong declaration fails the build.

ctypes keeps no const: pointers are declared to const (what the C++ hands Dawn converts to
them), but for void pointers outside a call's parameters, the user data Dawn hands back.

Importing pydawn.webgpu loads dawn-python's library (ctypes.CDLL at import), so the header is
generated where dawn-python is installed, as the Dawn build needs anyway.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from types import ModuleType

SOURCE_DIR = Path(__file__).resolve().parent
HEADER_NAME = "dawn_webgpu.h"
# Every call the C++ makes on Dawn, by the name it calls (wgpu-native's, without "wgpu").
CALLS = (
    "AdapterGetInfo", "AdapterGetLimits", "AdapterHasFeature", "AdapterInfoFreeMembers", "AdapterRelease",
    "BindGroupLayoutRelease", "BindGroupRelease", "BufferDestroy", "BufferGetConstMappedRange",
    "BufferGetMappedRange", "BufferRelease", "BufferUnmap", "CommandBufferRelease",
    "CommandEncoderBeginComputePass", "CommandEncoderCopyBufferToBuffer", "CommandEncoderFinish",
    "CommandEncoderRelease", "CommandEncoderResolveQuerySet", "ComputePassEncoderDispatchWorkgroups",
    "ComputePassEncoderEnd", "ComputePassEncoderRelease", "ComputePassEncoderSetBindGroup",
    "ComputePassEncoderSetPipeline", "ComputePipelineGetBindGroupLayout", "ComputePipelineRelease",
    "CreateInstance", "DeviceCreateBindGroup", "DeviceCreateBindGroupLayout", "DeviceCreateBuffer",
    "DeviceCreateCommandEncoder", "DeviceCreateComputePipeline", "DeviceCreatePipelineLayout",
    "DeviceCreateQuerySet", "DeviceCreateShaderModule", "DeviceGetLimits", "DeviceGetQueue",
    "DevicePushErrorScope", "InstanceProcessEvents", "InstanceWaitAny", "PipelineLayoutRelease",
    "QuerySetRelease", "QueueSubmit", "QueueWriteBuffer", "ShaderModuleRelease",
    "InstanceRequestAdapter", "AdapterRequestDevice", "BufferMapAsync", "DevicePopErrorScope",
)
# The calls bound to Dawn's "2" symbols, which take the callback-info structs that
# wgpu-native's plain calls take.
SECOND_CALLS = ("InstanceRequestAdapter", "AdapterRequestDevice", "BufferMapAsync", "DevicePopErrorScope")
_NAME = re.compile(r"\bWGPU\w+")
_CONSTANT = re.compile(r"(WGPU[A-Za-z0-9]+)_\w+")


class DeclarationError(RuntimeError):
    """dawn-python's bindings lack something the C++ needs, or hold what C cannot declare."""


def calls() -> list[tuple[str, str]]:
    """Each call's name in the C++ and the symbol bound to it."""
    return [(name, name + ("2" if name in SECOND_CALLS else "")) for name in CALLS]


def header() -> str:
    """dawn_webgpu.h for the WGPU names pipeline/native's sources use and the calls in CALLS."""
    from pydawn import webgpu

    sources = sorted([*SOURCE_DIR.glob("*.h"), *SOURCE_DIR.glob("*.cpp")])
    names = {name for path in sources for name in _NAME.findall(path.read_text())}
    return _Declarations(webgpu).header(names | {f"WGPUProc{symbol}" for _, symbol in calls()})


def _is_function(t) -> bool:
    return isinstance(t, type) and issubclass(t, ctypes._CFuncPtr)


def _is_struct(t) -> bool:
    return isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Union)) and hasattr(t, "_fields_")


class _Declarations:
    """What one bindings module declares, and the C text of the part asked for."""

    def __init__(self, webgpu: ModuleType):
        self.webgpu = webgpu
        items = [(name, value) for name, value in vars(webgpu).items() if name.startswith("WGPU")]
        # The integer types of enums and flags and their constants (WGPUFeatureName_Subgroups).
        self.scalars = {name: t for name, t in items if isinstance(t, type) and issubclass(t, ctypes._SimpleCData)}
        self.constants = {name: value for name, value in items if isinstance(value, int)
                          and (m := _CONSTANT.fullmatch(name)) and m.group(1) in self.scalars}
        # Handles: pointers to opaque structs (WGPUDevice = POINTER(struct_WGPUDeviceImpl)).
        self.handles = {t: name for name, t in items if isinstance(t, type) and issubclass(t, ctypes._Pointer)
                        and not hasattr(t._type_, "_fields_")}
        self.functions = {name: t for name, t in items if _is_function(t)}
        self.structs = {t.__name__.removeprefix("struct_"): t for _, t in items if _is_struct(t)}
        self.wanted_scalars: set[str] = set()
        self.wanted_constants: set[str] = set()
        self.wanted_handles: set[str] = set()
        self.wanted_functions: dict[str, type] = {}
        self.wanted_structs: dict[str, type] = {}

    def header(self, names: set[str]) -> str:
        for name in sorted(names):
            self._want_name(name)
        missing = sorted(f"WGPUProc{symbol}" for _, symbol in calls()
                         if f"WGPUProc{symbol}" not in self.wanted_functions)
        if missing:
            raise DeclarationError(f"dawn-python's bindings declare no {', '.join(missing)}")
        functions = {name: self._function(name, t) for name, t in sorted(self.wanted_functions.items())}
        structs = self._struct_order()
        return "".join([
            "// Generated by pipeline/native/dawn_webgpu.py from dawn-python's ctypes bindings\n"
            "// (pydawn.webgpu) of the library it ships; do not edit.\n",
            "#pragma once\n\n#include <cstddef>\n#include <cstdint>\n\n",
            "// Handles.\n",
            *(f"typedef struct {name}Impl* {name};\n" for name in sorted(self.wanted_handles)),
            "\n// The integer types of enums and flags, and the constants used.\n",
            *(f"typedef {self._type(self.scalars[name])} {name};\n" for name in sorted(self.wanted_scalars)),
            *(f"constexpr {_CONSTANT.fullmatch(name).group(1)} {name} = 0x{self.constants[name]:X};\n"
              for name in sorted(self.wanted_constants)),
            "\n// Structs, defined after the callbacks and calls.\n",
            *(f"typedef struct {name} {name};\n" for name in structs),
            "\n// Callbacks and calls.\n",
            *(f"{text}\n" for text in functions.values()),
            *(self._struct(name) for name in structs),
            "// Layouts as dawn-python's ctypes has them.\n",
            *(self._asserts(name) for name in structs),
            "\n// Each call's name in the C++ and the symbol bound to it.\n#define PIPELINE_DAWN_CALLS(X) \\\n",
            " \\\n".join(f"  X({name}, {symbol})" for name, symbol in calls()), "\n",
        ])

    # What a name or a type needs declared.
    def _want_name(self, name: str) -> None:
        if name in self.constants:
            self.wanted_constants.add(name)
            self.wanted_scalars.add(_CONSTANT.fullmatch(name).group(1))
        elif name in self.scalars:
            self.wanted_scalars.add(name)
        elif name in self.structs:
            self._want(self.structs[name])
        elif name in self.functions:
            self.wanted_functions[name] = self.functions[name]
            self._want(self.functions[name])
        elif name in self.handles.values():
            self.wanted_handles.add(name)

    def _want(self, t) -> None:
        if t is None or t in self.handles:
            if t is not None:
                self.wanted_handles.add(self.handles[t])
        elif _is_struct(t):
            name = t.__name__.removeprefix("struct_")
            if name not in self.wanted_structs:
                self.wanted_structs[name] = t
                for field in t._fields_:
                    self._want(field[1])
        elif _is_function(t):
            name = self._function_name(t)
            if name not in self.wanted_functions:
                self.wanted_functions[name] = t
            for part in (t._restype_, *t._argtypes_):
                self._want(part)
        elif issubclass(t, (ctypes._Pointer, ctypes.Array)):
            self._want(t._type_)

    def _function_name(self, t) -> str:
        """A named callback type of `t`'s signature (one already declared where there is one)."""
        names = [name for name, f in self.functions.items() if f is t]
        if not names:
            raise DeclarationError(f"dawn-python's bindings name no callback type {t}")
        declared = [name for name in names if name in self.wanted_functions]
        return (declared or sorted(names, key=lambda n: (n.startswith("WGPUProc"), n)))[0]

    # C text.
    def _type(self, t, call: bool = False) -> str:
        """`t` in C; `call`: as a call's parameter, where even void pointers are to const."""
        if t is None:
            return "void"
        if t in self.handles:
            return self.handles[t]
        if _is_struct(t):
            return t.__name__.removeprefix("struct_")
        if _is_function(t):
            return self._function_name(t)
        if issubclass(t, ctypes._Pointer):
            return f"{self._type(t._type_, call)} const*"
        code = getattr(t, "_type_", None)
        if code == "P":
            return "void const*" if call else "void*"
        if code == "z":
            return "char const*"
        if code in ("c", "f", "d", "?"):
            return {"c": "char", "f": "float", "d": "double", "?": "bool"}[code]
        if isinstance(code, str) and code in "bBhHiIlLqQ":
            return f"{'u' if code.isupper() else ''}int{8 * ctypes.sizeof(t)}_t"
        raise DeclarationError(f"no C type for {t}")

    def _function(self, name: str, t) -> str:
        call = name.startswith("WGPUProc")
        args = ", ".join(self._type(a, call) for a in t._argtypes_) or "void"
        return f"typedef {self._type(t._restype_)} (*{name})({args});"

    def _struct(self, name: str) -> str:
        t = self.wanted_structs[name]
        if issubclass(t, ctypes.Union) or any(len(field) > 2 for field in t._fields_):
            raise DeclarationError(f"{name} is a union or has bit fields")
        lines = []
        for field_name, field_type in t._fields_:
            if field_name.startswith("PADDING_"):
                continue
            if issubclass(field_type, ctypes.Array):
                lines.append(f"  {self._type(field_type._type_)} {field_name}[{field_type._length_}];\n")
            else:
                lines.append(f"  {self._type(field_type)} {field_name};\n")
        return f"struct {name} {{\n{''.join(lines)}}};\n\n"

    def _asserts(self, name: str) -> str:
        t = self.wanted_structs[name]
        lines = [f"static_assert(sizeof({name}) == {ctypes.sizeof(t)}, \"{name}\");\n"]
        lines += [f"static_assert(offsetof({name}, {field[0]}) == {getattr(t, field[0]).offset}, "
                  f"\"{name}.{field[0]}\");\n" for field in t._fields_ if not field[0].startswith("PADDING_")]
        return "".join(lines)

    def _struct_order(self) -> list[str]:
        """The structs wanted, each after those it holds by value."""
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            for field in self.wanted_structs[name]._fields_:
                held = field[1]._type_ if issubclass(field[1], ctypes.Array) else field[1]
                if _is_struct(held):
                    visit(held.__name__.removeprefix("struct_"))
            order.append(name)

        for name in sorted(self.wanted_structs):
            visit(name)
        return order
