"""ExecuTorch's bundled programs (its devtools' BundledProgram: a program, the inputs of a
method and the outputs it should give), read and checked before ExecuTorch's runtime sees one.

ExecuTorch's bundled-program calls (1.4.1) do not verify the flatbuffer: a truncated bundle
crashes the process there. `read` reads every field those calls read, with the classes flatc
generates from the installed schema (`pipeline.pte.flatc`; each read is bounds-checked, so
damage fails here), and refuses with a PteError a bundle that is not one: another file's
identifier, a method other than `forward`, no test case, a value that is not a tensor, a tensor
whose dtype ExecuTorch does not know, whose dimension order is not one, or whose bytes are not
its sizes times its element size. The program inside is checked as any `.pte` is
(`pipeline.native.NativeBundle`).

    bundle = read(data, source)   # program, inputs and expected outputs of forward's first case
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from types import ModuleType

import torch

from pipeline.pte import flatc
from pipeline.pte.file import PteError

SCHEMA_PACKAGE = "executorch.devtools.bundled_program.serialize"
SCHEMA = "bundled_program_schema.fbs"
METHOD = "forward"  # the method read and run (pipeline.native.NativeBundle)
TEST_CASE = 0  # and its test case


@dataclass(frozen=True)
class Bundle:
    program: bytes
    inputs: tuple[torch.Tensor, ...]
    expected: list[torch.Tensor]


def schema() -> ModuleType:
    """The bundled program's flatbuffer classes, generated from the installed schema."""
    return flatc.generated(SCHEMA_PACKAGE, SCHEMA)


def read(data: bytes, source: str = "<bytes>") -> Bundle:
    """The program of bundle `data` and forward's first test case. PteError when it is not a
    bundled program or is damaged; `source` names it in the message."""
    s = schema()
    if len(data) < 8 or not s.BundledProgram.BundledProgramBufferHasIdentifier(data, 0):
        raise PteError(f"{source}: not a bundled program (identifier {bytes(data[4:8])!r})")
    try:
        root = s.BundledProgramT.InitFromPackedBuf(data, 0)
    except (struct.error, ValueError, IndexError, TypeError) as exc:
        raise PteError(f"{source}: damaged bundled program ({exc})") from None
    suites = {_text(suite.methodName, source): suite for suite in root.methodTestSuites or [] if suite}
    if METHOD not in suites:
        raise PteError(f"{source}: the bundle tests no method {METHOD!r} (it tests {sorted(suites)})")
    cases = suites[METHOD].testCases or []
    if len(cases) <= TEST_CASE or cases[TEST_CASE] is None:
        raise PteError(f"{source}: the bundle has no test case for {METHOD!r}")
    case = cases[TEST_CASE]
    if root.program is None or len(root.program) == 0:
        raise PteError(f"{source}: the bundle holds no program")
    return Bundle(bytes(root.program),
                  tuple(_tensor(v, f"{source}: input {i}", s) for i, v in enumerate(case.inputs or [])),
                  [_tensor(v, f"{source}: expected output {i}", s) for i, v in enumerate(case.expectedOutputs or [])])


def _text(name, source: str) -> str:
    try:
        return name.decode() if isinstance(name, bytes) else str(name)
    except UnicodeDecodeError:
        raise PteError(f"{source}: a method name is not UTF-8") from None


def _tensor(value, what: str, s: ModuleType) -> torch.Tensor:
    """A bundled value as the tensor it holds (a copy, laid out as its dimension order says)."""
    from executorch.exir.schema import ScalarType
    from executorch.exir.tensor import get_scalar_type

    if value is None or value.valType != s.ValueUnion.Tensor or value.val is None:
        raise PteError(f"{what} is not a tensor")
    t = value.val
    try:
        dtype = get_scalar_type(ScalarType(t.scalarType))
    except (ValueError, KeyError):
        raise PteError(f"{what}: dtype {t.scalarType} is not one ExecuTorch knows") from None
    sizes = [int(n) for n in (t.sizes if t.sizes is not None else [])]
    order = [int(d) for d in (t.dimOrder if t.dimOrder is not None else [])]
    if any(n < 0 for n in sizes) or sorted(order) != list(range(len(sizes))):
        raise PteError(f"{what}: sizes {sizes} with dimension order {order}")
    data = bytes(t.data) if t.data is not None else b""
    if len(data) != math.prod(sizes) * dtype.itemsize:
        raise PteError(f"{what}: {len(data)} bytes for sizes {sizes} of {dtype}")
    stored = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return stored.reshape([sizes[d] for d in order]).permute([order.index(d) for d in range(len(sizes))]).contiguous()
