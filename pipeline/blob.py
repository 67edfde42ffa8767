"""The WebGPU delegate blob: the one contract between `preprocess` and the runtime.

Imports only the standard library and numpy, so both the ahead-of-time side (which has
ExecuTorch) and the runtime side (which has wgpu) can load it.

Format version 4, all integers little-endian; a blob is exactly `total_size` bytes:

    header   40 bytes at 0     magic b"WGLN", version 4, header size 40, byte-order mark
                               0x01020304, params (offset, size), data (offset, size),
                               total size, CRC-32 of everything after the header, reserved 0
    params   64 + 8*ndim bytes op (1 native_layer_norm, 2 rms_norm), dtype of x and out, eps (f64),
             at 40               input index, argument count, weight and bias (source, index),
                               outputs (count, 3 slots), ndim, affine dtype, then ndim i64 dims
    padding  zeros up to the next multiple of 16
    data     the constant weight, then the constant bias (those present) in the affine
             dtype, row-major, each taking its width*itemsize bytes rounded up to 16 (zero padded)

Dtype codes: 0 float32, 1 float16, 2 bfloat16 (its bits: the top half of a float32's).
The affine dtype is that of weight and bias, and of mean and rstd as aten returns them:
x's dtype, or float32 when x is half and weight or bias is float32 (aten's mixed case);
with neither weight nor bias it is x's dtype. An rms_norm (aten.rms_norm) has no bias and
returns out alone; its weight follows the same dtype rule. Version 3 is version 4 with op 1
only: its files still load. Version 2 (float32 only, the affine dtype field a zero pad) is
refused: re-export.

Every field but eps (any float64, as aten takes it) has one valid value or a checked
range, and the CRC covers params, padding and data, so a blob that decodes is the blob
that was encoded; anything else is a ValueError naming the field. The byte-level
contract (shared with the C++ backend) is written out in `docs/blob_format.md`.

One blob describes one norm, a `native_layer_norm` or an `rms_norm`: the partitioner makes
one partition per norm. Row counts are not stored; the runtime reads them from the input tensor. A
normalized dim stored as DYNAMIC (-1) is read from the input too: that is how a
weight-less LayerNorm over a dynamic length (a GroupNorm reframed over a dynamic time
or spatial dim) runs at any size.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"WGLN"
VERSION = 4
# The oldest version this runtime reads: version 3's blobs are version 4's of op 1.
OLDEST_VERSION = 3
BYTE_ORDER_MARK = 0x01020304
# The sections' fields in order, as struct formats: what this module packs and unpacks, and
# what the C++ backend's decoder reads (its offsets are generated from these at build time).
HEADER_FIELDS = (("magic", "4s"), ("version", "H"), ("header_size", "H"), ("bom", "I"), ("params_offset", "I"),
                 ("params_size", "I"), ("data_offset", "I"), ("data_size", "I"), ("total_size", "I"),
                 ("checksum", "I"), ("reserved", "I"))
PARAMS_FIELDS = (("op", "I"), ("dtype", "I"), ("eps", "d"), ("input_index", "I"), ("arguments", "I"),
                 ("weight_source", "I"), ("weight_index", "I"), ("bias_source", "I"), ("bias_index", "I"),
                 ("n_outputs", "I"), ("outputs", "3I"), ("ndim", "I"), ("affine_dtype", "I"))
HEADER = struct.Struct("<" + "".join(fmt for _, fmt in HEADER_FIELDS))
PARAMS = struct.Struct("<" + "".join(fmt for _, fmt in PARAMS_FIELDS))  # the ndim dims follow
DIM = struct.Struct("<q")
ALIGN = 16
MAX_NDIM = 16
U32_MAX = 2**32 - 1

OP_NATIVE_LAYER_NORM = 1
OP_RMS_NORM = 2
# The norm each blob runs, by its op code (`LayerNormParams.op`).
OP_CODES = {"native_layer_norm": OP_NATIVE_LAYER_NORM, "rms_norm": OP_RMS_NORM}
# The delegate id of our blobs in a program: the name of the backend class that wrote them
# (pipeline.aot.preprocess.WebGPUBackend), as ExecuTorch records it.
BACKEND_ID = "WebGPUBackend"
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# How constants of each dtype are held as numpy arrays (numpy has no bfloat16: its bits).
CONSTANT_ARRAYS = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "bfloat16": np.dtype("<u2")}

DYNAMIC = -1  # a normalized dim taken from the input at run time
NONE = "none"
CONSTANT = "constant"
INPUT = "input"
SOURCE_CODES = {NONE: 0, CONSTANT: 1, INPUT: 2}
OUTPUT_NAMES = ("out", "mean", "rstd")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Header:
    """Where each section of a blob lies; offsets are from the start of the blob."""

    version: int
    params_offset: int
    params_size: int
    data_offset: int
    data_size: int
    total_size: int
    checksum: int

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC, self.version, HEADER.size, BYTE_ORDER_MARK,
            self.params_offset, self.params_size, self.data_offset, self.data_size,
            self.total_size, self.checksum, 0,
        )

    @classmethod
    def unpack(cls, blob: bytes) -> Header:
        """The header's fields, after the checks that need no other section: identity,
        version, fixed sizes, and that the blob is exactly `total_size` bytes."""
        # Identity and version come first, so a foreign or older blob is named as such
        # even when it is shorter than this version's header.
        if len(blob) >= 4 and blob[:4] != MAGIC:
            raise ValueError(f"not a WebGPU delegate blob: magic {blob[:4]!r}, expected {MAGIC!r}")
        if len(blob) >= 12 and struct.unpack_from("<I", blob, 8)[0] != BYTE_ORDER_MARK:
            bom = struct.unpack_from("<I", blob, 8)[0]
            raise ValueError(f"delegate blob bom {bom:#010x} is not little-endian {BYTE_ORDER_MARK:#010x}")
        if len(blob) >= 6:
            version = struct.unpack_from("<H", blob, 4)[0]
            if version > VERSION:
                raise ValueError(f"delegate blob format version {version} is newer than this runtime's "
                                 f"{VERSION}: update the runtime")
            if version < OLDEST_VERSION:
                raise ValueError(f"delegate blob format version {version} is older than this runtime's "
                                 f"{VERSION} (it reads {OLDEST_VERSION} and up): re-export the model")
        if len(blob) < HEADER.size:
            raise ValueError(f"delegate blob truncated: {len(blob)} bytes, the header alone is {HEADER.size}")
        (_, version, header_size, _, p_off, p_size, d_off, d_size, total, checksum,
         reserved) = HEADER.unpack_from(blob)
        if header_size != HEADER.size:
            raise ValueError(f"delegate blob header_size {header_size}, expected {HEADER.size}")
        if reserved != 0:
            raise ValueError(f"delegate blob reserved {reserved:#x}, expected 0")
        if p_off != HEADER.size:
            raise ValueError(f"delegate blob params_offset {p_off}, expected {HEADER.size}")
        if len(blob) < total:
            raise ValueError(f"delegate blob truncated: {len(blob)} bytes of total_size {total}")
        if len(blob) > total:
            raise ValueError(f"delegate blob is {len(blob)} bytes, its total_size says {total}")
        return cls(version, p_off, p_size, d_off, d_size, total, checksum)


@dataclass(frozen=True)
class Operand:
    """Where a weight or bias comes from: absent, a constant in the blob, or a delegate input."""

    source: str = NONE
    index: int | None = None  # the delegate argument index, for source == INPUT

    def __post_init__(self) -> None:
        if self.source not in SOURCE_CODES:
            raise ValueError(f"operand source must be one of none/constant/input, got {self.source!r}")
        if self.source == INPUT:
            if not _is_int(self.index) or not 0 <= self.index <= U32_MAX:
                raise ValueError(f"operand index must be a u32 for source 'input', got {self.index!r}")
        elif self.index is not None:
            raise ValueError(f"operand index must be None for source {self.source!r}, got {self.index!r}")


@dataclass(frozen=True)
class LayerNormParams:
    """What is fixed about one norm, a native_layer_norm or (`op` "rms_norm") an rms_norm:
    everything but the row count."""

    normalized_shape: tuple[int, ...]
    eps: float
    input_index: int = 0  # which delegate argument is x
    weight: Operand = field(default_factory=Operand)
    bias: Operand = field(default_factory=Operand)
    outputs: tuple[int, ...] = (0,)  # which of (out, mean, rstd) the delegate returns, in order
    # Delegate arguments in all: x, input weight/bias, and sizes of dynamic dims, which the
    # partition receives as inputs too (the runtime reads those from x instead).
    arguments: int = 1
    dtype: str = "float32"  # of x and out
    # Of weight, bias, mean and rstd: dtype, or float32 with a half dtype and weight or
    # bias present (aten's mixed case). None: the same as dtype.
    affine_dtype: str | None = None
    op: str = "native_layer_norm"  # a key of OP_CODES

    def __post_init__(self) -> None:
        if self.op not in OP_CODES:
            raise ValueError(f"op must be one of {sorted(OP_CODES)}, got {self.op!r}")
        if self.op == "rms_norm" and (self.bias.source != NONE or self.outputs != (0,)):
            raise ValueError(f"an rms_norm has no bias and returns out alone, got bias source "
                             f"{self.bias.source!r} and outputs {self.outputs!r}")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_CODES)}, got {self.dtype!r}")
        if self.affine_dtype is None:
            object.__setattr__(self, "affine_dtype", self.dtype)
        affine_present = self.weight.source != NONE or self.bias.source != NONE
        allowed = {self.dtype, "float32"} if affine_present else {self.dtype}
        if self.affine_dtype not in allowed:
            raise ValueError(f"affine_dtype must be {' or '.join(sorted(allowed))} for dtype {self.dtype} "
                             f"{'with' if affine_present else 'without'} weight or bias, got {self.affine_dtype!r}")
        shape = self.normalized_shape
        if not isinstance(shape, tuple) or not 1 <= len(shape) <= MAX_NDIM or not all(
            _is_int(d) and (1 <= d < 2**63 or d == DYNAMIC) for d in shape
        ):
            raise ValueError(f"normalized_shape (dims) must be 1 to {MAX_NDIM} positive i64 ints or "
                             f"{DYNAMIC}, got {shape!r}")
        if DYNAMIC in shape and (self.weight.source != NONE or self.bias.source != NONE):
            raise ValueError(f"normalized_shape (dims) {list(shape)} has a dynamic dim, which only a "
                             "LayerNorm without weight and bias can have")
        if DYNAMIC not in shape and math.prod(shape) * 4 > U32_MAX:
            raise ValueError(f"normalized_shape (dims) {list(shape)}: a row of {math.prod(shape)} "
                             "floats does not fit in u32 bytes")
        # Any float64, as aten takes it: a negative or NaN eps gives NaN where var + eps < 0.
        if not isinstance(self.eps, float):
            raise ValueError(f"eps must be a float, got {self.eps!r}")
        if not _is_int(self.arguments) or not 1 <= self.arguments <= U32_MAX:
            raise ValueError(f"arguments must be a u32 of at least 1, got {self.arguments!r}")
        if not _is_int(self.input_index) or not 0 <= self.input_index < self.arguments:
            raise ValueError(f"input_index must be below arguments {self.arguments}, got {self.input_index!r}")
        if not isinstance(self.outputs, tuple) or not 1 <= len(self.outputs) <= 3 or any(
            not _is_int(o) or o not in (0, 1, 2) for o in self.outputs
        ):
            raise ValueError(f"outputs must be 1 to 3 indices into (out, mean, rstd), got {self.outputs!r}")
        indices = [self.input_index] + [op.index for op in (self.weight, self.bias) if op.source == INPUT]
        if len(set(indices)) != len(indices) or max(indices) >= self.arguments:
            raise ValueError(f"delegate argument indices {indices} (input_index, weight_index, bias_index) "
                             f"must be distinct and below arguments {self.arguments}")

    @property
    def stats(self) -> bool:
        """Whether the delegate returns mean or rstd, so that its launch stores them."""
        return any(i != 0 for i in self.outputs)

    @property
    def width(self) -> int | None:
        """Floats in one row; None when a dim is dynamic."""
        return None if DYNAMIC in self.normalized_shape else math.prod(self.normalized_shape)

    def check_fits(self, limit: int) -> None:
        """ValueError unless one row of x (static width) fits a binding of `limit` bytes,
        the adapter's most (a row is one launch's unit)."""
        width = self.width
        if width is not None and width * DTYPE_BYTES[self.dtype] > limit:
            raise ValueError(f"a row of {width} values ({width * DTYPE_BYTES[self.dtype]} bytes of {self.dtype}) "
                             f"exceeds this adapter's binding limit of {limit} bytes: the delegate cannot run here")

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
    """A decoded blob: the op's parameters and its constant weight/bias (normalized_shape, in
    CONSTANT_ARRAYS[params.affine_dtype]: float32, float16, or bfloat16 bits as uint16)."""

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
                kind = CONSTANT_ARRAYS[self.params.affine_dtype]
                if arr.dtype != kind or arr.shape != self.params.normalized_shape:
                    raise ValueError(f"{role} constant must be {kind} ({self.params.affine_dtype}) "
                                     f"{list(self.params.normalized_shape)}, got {arr.dtype} {list(arr.shape)}")
        if set(self.constants) - {"weight", "bias"}:
            raise ValueError(f"unknown constants {sorted(set(self.constants) - {'weight', 'bias'})}")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def encode(blob: DelegateBlob) -> bytes:
    """Serialize `blob`; `decode(encode(b)) == b` up to array identity."""
    p = blob.params
    outputs = list(p.outputs) + [0] * (3 - len(p.outputs))
    params = PARAMS.pack(
        OP_CODES[p.op], DTYPE_CODES[p.dtype], p.eps, p.input_index, p.arguments,
        SOURCE_CODES[p.weight.source], p.weight.index or 0,
        SOURCE_CODES[p.bias.source], p.bias.index or 0,
        len(p.outputs), *outputs, len(p.normalized_shape), DTYPE_CODES[p.affine_dtype],
    ) + b"".join(DIM.pack(d) for d in p.normalized_shape)
    data = bytearray()
    for role in ("weight", "bias"):
        if role in blob.constants:
            raw = np.ascontiguousarray(blob.constants[role], dtype=CONSTANT_ARRAYS[p.affine_dtype]).tobytes()
            data += raw + bytes(_align(len(raw)) - len(raw))
    data_offset = _align(HEADER.size + len(params))
    body = params + bytes(data_offset - HEADER.size - len(params)) + bytes(data)
    header = Header(VERSION, HEADER.size, len(params), data_offset, len(data), data_offset + len(data),
                    zlib.crc32(body))
    return header.pack() + body


def decode(blob: bytes | bytearray | memoryview) -> DelegateBlob:
    """Parse and validate a blob; raises ValueError naming the field on a truncated, foreign,
    older, newer or corrupt one."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    header = Header.unpack(blob)
    # The CRC first: past it, any rule broken is an encoder's fault, not a damaged blob.
    crc = zlib.crc32(blob[HEADER.size :])
    if crc != header.checksum:
        raise ValueError(f"delegate blob checksum {header.checksum:#010x} does not match its contents "
                         f"({crc:#010x}): the blob is damaged")
    if header.total_size < HEADER.size + PARAMS.size:
        raise ValueError(f"delegate blob truncated: total_size {header.total_size} leaves no room for params")
    (op, dtype, eps, input_index, arguments, w_source, w_index, b_source, b_index, n_outputs,
     *outputs, ndim, affine_dtype) = PARAMS.unpack_from(blob, HEADER.size)
    _check_params_fields(header.version, op, dtype, affine_dtype, n_outputs, outputs, ndim)
    if header.params_size != PARAMS.size + DIM.size * ndim:
        raise ValueError(f"delegate blob params_size {header.params_size}, expected "
                         f"{PARAMS.size + DIM.size * ndim} for ndim {ndim}")
    params_end = HEADER.size + header.params_size
    if header.data_offset != _align(params_end):
        raise ValueError(f"delegate blob data_offset {header.data_offset}, expected {_align(params_end)}")
    if header.data_offset > header.total_size:
        raise ValueError(f"delegate blob truncated: total_size {header.total_size} ends before data_offset")
    if any(blob[params_end : header.data_offset]):
        raise ValueError("delegate blob padding after the params is not zero")
    dims = tuple(DIM.unpack_from(blob, PARAMS.size + HEADER.size + DIM.size * i)[0] for i in range(ndim))
    params = LayerNormParams(
        normalized_shape=dims,
        eps=eps,
        input_index=input_index,
        weight=_operand("weight", w_source, w_index),
        bias=_operand("bias", b_source, b_index),
        outputs=tuple(outputs[:n_outputs]),
        arguments=arguments,
        dtype=_DTYPE_NAMES[dtype],
        affine_dtype=_DTYPE_NAMES[affine_dtype],
        op=_OP_NAMES[op],
    )
    roles = [role for role in ("weight", "bias") if getattr(params, role).source == CONSTANT]
    kind = CONSTANT_ARRAYS[params.affine_dtype]
    stride = _align(params.width * kind.itemsize) if roles else 0
    if header.data_size != stride * len(roles):
        raise ValueError(f"delegate blob data_size {header.data_size}, expected {stride * len(roles)} "
                         f"for constants {roles or 'none'}")
    if header.total_size != header.data_offset + header.data_size:
        raise ValueError(f"delegate blob total_size {header.total_size}, expected data_offset + data_size "
                         f"= {header.data_offset + header.data_size}")
    arrays = {}
    for i, role in enumerate(roles):
        start = header.data_offset + i * stride
        end = start + params.width * kind.itemsize
        if any(blob[end : start + stride]):
            raise ValueError(f"delegate blob padding after the {role} constant is not zero")
        arr = np.frombuffer(blob, dtype=kind, count=params.width, offset=start)
        arrays[role] = arr.astype(kind.newbyteorder("=")).reshape(params.normalized_shape)
    return DelegateBlob(params, arrays)


_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
_OP_NAMES = {code: name for name, code in OP_CODES.items()}


def _check_params_fields(version: int, op: int, dtype: int, affine_dtype: int, n_outputs: int,
                         outputs: list[int], ndim: int) -> None:
    """The params fields that have no counterpart in `LayerNormParams` (codes, counts)."""
    ops = {OP_NATIVE_LAYER_NORM} if version == 3 else set(_OP_NAMES)
    if op not in ops:
        expected = " or ".join(f"{code} ({_OP_NAMES[code]})" for code in sorted(ops))
        raise ValueError(f"delegate blob op {op}, expected {expected} in version {version}")
    for name, code in (("dtype", dtype), ("affine_dtype", affine_dtype)):
        if code not in _DTYPE_NAMES:
            raise ValueError(f"delegate blob {name} {code}, expected 0 (float32), 1 (float16) or 2 (bfloat16)")
    if not 1 <= n_outputs <= 3:
        raise ValueError(f"delegate blob n_outputs {n_outputs}, expected 1 to 3")
    if any(o not in (0, 1, 2) for o in outputs[:n_outputs]) or any(outputs[n_outputs:]):
        raise ValueError(f"delegate blob outputs {outputs} for n_outputs {n_outputs}: used entries must be "
                         "0 (out), 1 (mean) or 2 (rstd), unused ones 0")
    if not 1 <= ndim <= MAX_NDIM:
        raise ValueError(f"delegate blob ndim {ndim}, expected 1 to {MAX_NDIM}")


def _operand(role: str, source: int, index: int) -> Operand:
    names = {code: name for name, code in SOURCE_CODES.items()}
    if source not in names:
        raise ValueError(f"delegate blob {role}_source {source}, expected 0 (none), 1 (constant) or 2 (input)")
    if source != SOURCE_CODES[INPUT] and index != 0:
        raise ValueError(f"delegate blob {role}_index {index} must be 0 for {role}_source {source}")
    return Operand(names[source], index if names[source] == INPUT else None)
