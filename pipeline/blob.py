"""The WebGPU delegate blob: the one contract between `preprocess` and the runtime.

Imports only the standard library and numpy, so both the ahead-of-time side (which has
ExecuTorch) and the runtime side (which has wgpu) can load it.

Layout, all little-endian:

    header   32 bytes  magic, format version, byte-order mark, section offsets and sizes
    params   UTF-8 JSON of `LayerNormParams` (eps, normalized_shape, operand sources)
    data     raw float32 constants (weight, bias), each 16-byte aligned

One blob describes one `native_layer_norm`: the partitioner makes one partition per
LayerNorm. Row counts are not stored; the runtime reads them from the input tensor. A
normalized dim stored as DYNAMIC (-1) is read from the input too: that is how a
weight-less LayerNorm over a dynamic length (a GroupNorm reframed over a dynamic time
or spatial dim) runs at any size.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"WGLN"
VERSION = 1
BYTE_ORDER_MARK = 0x01020304
HEADER = struct.Struct("<4sHHIIIIII")  # magic, version, header size, BOM, params/data (offset, size), total size
ALIGN = 16

DYNAMIC = -1  # a normalized dim taken from the input at run time
NONE = "none"
CONSTANT = "constant"
INPUT = "input"
OUTPUT_NAMES = ("out", "mean", "rstd")


@dataclass(frozen=True)
class Header:
    """Where each section of a blob lies; offsets are from the start of the blob."""

    version: int
    params_offset: int
    params_size: int
    data_offset: int
    data_size: int
    total_size: int

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC, self.version, HEADER.size, BYTE_ORDER_MARK,
            self.params_offset, self.params_size, self.data_offset, self.data_size,
            self.total_size,
        )

    @classmethod
    def unpack(cls, blob: bytes) -> Header:
        if len(blob) < HEADER.size:
            raise ValueError(f"delegate blob truncated: {len(blob)} bytes, the header alone is {HEADER.size}")
        magic, version, header_size, bom, p_off, p_size, d_off, d_size, total = HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise ValueError(f"not a WebGPU delegate blob: magic {magic!r}, expected {MAGIC!r}")
        if bom != BYTE_ORDER_MARK:
            raise ValueError(f"delegate blob byte-order mark {bom:#010x} is not little-endian {BYTE_ORDER_MARK:#010x}")
        if version > VERSION:
            raise ValueError(f"delegate blob format version {version} is newer than this runtime's {VERSION}")
        if version < 1 or header_size != HEADER.size:
            raise ValueError(f"delegate blob header corrupt: version {version}, header size {header_size}")
        header = cls(version, p_off, p_size, d_off, d_size, total)
        if len(blob) < total:
            raise ValueError(f"delegate blob truncated: {len(blob)} bytes of {total}")
        for name, off, size in (("params", p_off, p_size), ("data", d_off, d_size)):
            if off < HEADER.size or off + size > total:
                raise ValueError(f"delegate blob {name} section [{off}, {off + size}) lies outside the blob")
        return header


@dataclass(frozen=True)
class Operand:
    """Where a weight or bias comes from: absent, a constant in the blob, or a delegate input."""

    source: str = NONE
    index: int | None = None  # the delegate argument index, for source == INPUT

    def __post_init__(self) -> None:
        if self.source not in (NONE, CONSTANT, INPUT):
            raise ValueError(f"operand source must be one of none/constant/input, got {self.source!r}")
        if (self.source == INPUT) != isinstance(self.index, int) or (self.index is not None and self.index < 0):
            raise ValueError(f"operand index {self.index!r} does not fit source {self.source!r}")


@dataclass(frozen=True)
class LayerNormParams:
    """What is fixed about one native_layer_norm: everything but the row count."""

    normalized_shape: tuple[int, ...]
    eps: float
    input_index: int = 0  # which delegate argument is x
    weight: Operand = field(default_factory=Operand)
    bias: Operand = field(default_factory=Operand)
    outputs: tuple[int, ...] = (0,)  # which of (out, mean, rstd) the delegate returns, in order
    # Delegate arguments in all: x, input weight/bias, and sizes of dynamic dims, which the
    # partition receives as inputs too (the runtime reads those from x instead).
    arguments: int = 1

    def __post_init__(self) -> None:
        shape = self.normalized_shape
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and (d >= 1 or d == DYNAMIC)
                                 for d in shape):
            raise ValueError(f"normalized_shape must be non-empty positive ints or {DYNAMIC}, got {shape!r}")
        if DYNAMIC in shape and (self.weight.source != NONE or self.bias.source != NONE):
            raise ValueError(f"normalized_shape {list(shape)} has a dynamic dim, which only a LayerNorm "
                             "without weight and bias can have")
        if not isinstance(self.eps, float) or not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps must be a finite non-negative float, got {self.eps!r}")
        if not isinstance(self.input_index, int) or self.input_index < 0:
            raise ValueError(f"input_index must be a non-negative int, got {self.input_index!r}")
        if not self.outputs or any(o not in (0, 1, 2) for o in self.outputs):
            raise ValueError(f"outputs must be indices into (out, mean, rstd), got {self.outputs!r}")
        indices = [self.input_index] + [op.index for op in (self.weight, self.bias) if op.source == INPUT]
        if not isinstance(self.arguments, int) or len(set(indices)) != len(indices) or max(indices) >= self.arguments:
            raise ValueError(f"delegate argument indices {indices} must be distinct and below {self.arguments!r}")

    def resolve(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """normalized_shape with dynamic dims read from the trailing dims of `input_shape`."""
        trailing = tuple(input_shape[len(input_shape) - len(self.normalized_shape):])
        if len(trailing) != len(self.normalized_shape) or any(
            d != DYNAMIC and d != t for d, t in zip(self.normalized_shape, trailing)
        ):
            raise ValueError(f"input shape {list(input_shape)} does not end in normalized_shape "
                             f"{list(self.normalized_shape)}")
        return trailing


@dataclass(frozen=True)
class DelegateBlob:
    """A decoded blob: the op's parameters and its constant weight/bias (float32, normalized_shape)."""

    params: LayerNormParams
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for role in ("weight", "bias"):
            wanted = getattr(self.params, role).source == CONSTANT
            if wanted != (role in self.constants):
                raise ValueError(f"{role}: params say source {getattr(self.params, role).source!r}, "
                                 f"constants {'lack' if wanted else 'hold'} it")
            if wanted:
                arr = self.constants[role]
                if arr.dtype != np.float32 or arr.shape != self.params.normalized_shape:
                    raise ValueError(f"{role} constant must be float32 {list(self.params.normalized_shape)}, "
                                     f"got {arr.dtype} {list(arr.shape)}")
        if set(self.constants) - {"weight", "bias"}:
            raise ValueError(f"unknown constants {sorted(set(self.constants) - {'weight', 'bias'})}")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def encode(blob: DelegateBlob) -> bytes:
    """Serialize `blob`; `decode(encode(b)) == b` up to array identity."""
    p = blob.params
    data = bytearray()
    constants = {}
    for role in ("weight", "bias"):
        if role in blob.constants:
            raw = np.ascontiguousarray(blob.constants[role], dtype="<f4").tobytes()
            constants[role] = {"offset": len(data), "size": len(raw)}
            data += raw + bytes(_align(len(raw)) - len(raw))
    params = json.dumps({
        "op": "native_layer_norm",
        "normalized_shape": list(p.normalized_shape),
        # repr round-trips a float64 exactly.
        "eps": repr(p.eps),
        "input_index": p.input_index,
        "weight": {"source": p.weight.source, "index": p.weight.index},
        "bias": {"source": p.bias.source, "index": p.bias.index},
        "outputs": list(p.outputs),
        "arguments": p.arguments,
        "constants": constants,
    }, sort_keys=True).encode()
    params_offset = HEADER.size
    data_offset = _align(params_offset + len(params))
    total = data_offset + len(data)
    header = Header(VERSION, params_offset, len(params), data_offset, len(data), total)
    return header.pack() + params + bytes(data_offset - params_offset - len(params)) + bytes(data)


def decode(blob: bytes | bytearray | memoryview) -> DelegateBlob:
    """Parse and validate a blob; raises ValueError on a truncated, foreign, newer or corrupt one."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    header = Header.unpack(blob)
    raw = blob[header.params_offset : header.params_offset + header.params_size]
    try:
        doc = json.loads(raw.decode())
        if doc.pop("op") != "native_layer_norm":
            raise ValueError("op is not native_layer_norm")
        constants = doc.pop("constants")
        params = LayerNormParams(
            normalized_shape=tuple(doc["normalized_shape"]),
            eps=float(doc["eps"]),
            input_index=doc["input_index"],
            weight=Operand(**doc["weight"]),
            bias=Operand(**doc["bias"]),
            outputs=tuple(doc["outputs"]),
            arguments=doc["arguments"],
        )
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"delegate blob params corrupt: {exc}") from exc
    if not isinstance(constants, dict) or not all(isinstance(loc, dict) for loc in constants.values()):
        raise ValueError(f"delegate blob params corrupt: constants {constants!r} is not a table")
    width = math.prod(params.normalized_shape)
    arrays = {}
    for role, loc in constants.items():
        off, size = loc.get("offset"), loc.get("size")
        if not isinstance(off, int) or size != width * 4 or off < 0 or off + size > header.data_size:
            raise ValueError(f"delegate blob {role} constant at {off} of {size} bytes does not fit "
                             f"{header.data_size} data bytes or {width} floats")
        start = header.data_offset + off
        arr = np.frombuffer(blob, dtype="<f4", count=width, offset=start)
        arrays[role] = arr.astype(np.float32).reshape(params.normalized_shape)
    return DelegateBlob(params, arrays)
