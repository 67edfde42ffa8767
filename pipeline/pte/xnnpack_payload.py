"""Check an XNNPACK delegate's payload before ExecuTorch's runtime sees it.

ExecuTorch's XNNPACK runtime (1.4.1) verifies the payload's flatbuffer and bounds its
header and constant offsets, but then trusts the graph: the external ids of its values
index the delegate call's arguments unchecked, a constant's dims say how many bytes
XNNPACK packs from the constant's data, node parameters reach XNNPACK as they are. A
damaged payload crashes or hangs the process there. This module reads the payload itself
(its own reader of ExecuTorch's schema, `backends/xnnpack/serialization/schema.fbs`, every
offset bounds-checked) and refuses with a `PayloadError` (a ValueError) what contradicts
itself or the program around it:

- header: magic `XH00` at 4, its length, the flatbuffer and constant regions inside the
  payload, in order, the padding between them zero;
- flatbuffer: identifier `XN00`/`XN01`, every table, vtable, vector and string inside the
  flatbuffer and aligned, union types known;
- values: the id of each is its position (as the serializer numbers them), a datatype
  XNNPACK knows, at most six dims, only the external input/output flags, external ids
  0..n-1 with the inputs first, constants pointing at constant data that holds at least
  dims x datatype bytes (in the payload, or named data of the program);
- nodes: every value id a node names exists, inputs are constants, external inputs or
  outputs of earlier nodes, outputs are neither constants nor external inputs, each
  external output is written; shape parameters (permutation, new shape, slice, padding,
  axis) fit their input's rank; only the flags the serializer writes;
- the call: the program's delegate call passes exactly the external values, and each is a
  tensor of the dtype and rank (and, for a static tensor, the shape) the payload declares.

What no structural check sees: a change that keeps all of that consistent (a constant's
bytes, a value re-pointed at another of the same kind, an output clamp); such a file runs
to another answer, and `run_pte`'s sha256 is what catches it.

    payload = read(blob)               # PayloadError when the payload contradicts itself
    check_program_delegates(pte)       # every XNNPACK delegate of a parsed .pte, with its calls
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

BACKEND_ID = "XnnpackBackend"

# Header (ExecuTorch's XNNHeader): 4 bytes unused, magic, then little-endian fields.
HEADER = struct.Struct("<4s4sHIIIQ")  # unused, magic, length, fb offset, fb size, data offset, data size
MAGIC = b"XH00"
IDENTIFIERS = (b"XN00", b"XN01")

INVALID_ID = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID: no value (an absent bias)
NAMED = 0xFFFFFFFFFFFFFFFF  # a constant's offset when its bytes are named data of the program
MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS
MAX_EXTERNS = 4096  # what ExecuTorch's runtime accepts
EXTERNAL_INPUT, EXTERNAL_OUTPUT = 0x1, 0x2  # XNN_VALUE_FLAG_EXTERNAL_*

# XNNDatatype -> (name, bits per element)
DATATYPES = {
    1: ("fp32", 32), 2: ("fp16", 16), 3: ("qint8", 8), 4: ("quint8", 8), 5: ("qint32", 32),
    6: ("qcint8", 8), 7: ("qcint32", 32), 8: ("qcint4", 4), 9: ("qdint8", 8), 10: ("qbint4", 4),
    11: ("qpint8", 8), 12: ("int32", 32), 13: ("pfp32", 32), 14: ("bf16", 16),
}
# The program dtype (ScalarType) an external value of each datatype is passed as.
EXTERNAL_SCALAR_TYPES = {1: {6}, 2: {5}, 14: {15}, 12: {3, 4}, 3: {1}, 4: {0}}

# Node tables: their fields in schema order. "id": a value the node reads, "id?": one it may
# leave INVALID_ID, "out": a value it writes, "dims": a [uint] vector, "u32"/"i32"/"f32":
# scalars. The union's members map onto these tables in schema order (type 1 first).
_NODE2X1 = ("id input1_id", "id input2_id", "out output_id", "u32 flags")
_NODE1X1 = ("id input_id", "out output_id", "u32 flags")
_CONV = tuple(f"u32 {n}" for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "kernel_height", "kernel_width",
    "subsampling_height", "subsampling_width", "dilation_height", "dilation_width", "group_input_channels",
    "group_output_channels", "groups", "adjustment_height", "adjustment_width")) + (
    "id input1_id", "id filter_id", "id? bias_id", "out output_id", "u32 flags")
_POOLING = tuple(f"u32 {n}" for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width",
    "stride_height", "stride_width", "dilation_height", "dilation_width")) + (
    "id input_id", "out output_id", "u32 flags")
_CAT = ("u32 axis", "id input1_id", "id input2_id", "id input3_id", "id input4_id", "out output_id",
        "u32 flags", "id input5_id")
_TABLES = {
    "_XNNNode2x1": _NODE2X1,
    "_XNNNode1x1": _NODE1X1,
    "XNNFullyConnected": ("id input1_id", "id filter_id", "id? bias_id", "out output_id", "u32 flags"),
    "XNNStaticTranspose": ("u32 num_dims", "dims perm", "id input_id", "out output_id", "u32 flags"),
    "_XNNNodeConv": _CONV,
    "XNNStaticResizeBilinear2D": ("u32 new_height", "u32 new_width", "id input_id", "out output_id", "u32 flags"),
    "XNNStaticConstantPad": ("dims pre_paddings", "dims post_paddings", "f32 padding_value", "id input_id",
                             "out output_id", "u32 flags"),
    "_XNNPooling2D": _POOLING,
    "XNNStaticReshape": ("u32 num_dims", "dims new_shape", "id input_id", "out output_id", "u32 flags"),
    "XNNArgMaxPooling2d": tuple(f"u32 {n}" for n in (
        "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width")) + (
        "id input_id", "out output_value_id", "out output_index_id", "u32 flags"),
    "XNNLeakyReLU": ("f32 negative_slope", "id input_id", "out output_id", "u32 flags"),
    "XNNELU": ("f32 alpha", "id input_id", "out output_id", "u32 flags"),
    "_XNNCat": _CAT,
    "XNNStaticSlice": ("u32 num_dims", "dims offsets", "dims sizes", "id input_id", "out output_id", "u32 flags"),
    "XNNScaledDotProductAttention": ("id query_id", "id key_id", "id value_id", "id scale_id", "id mask_id",
                                     "out output_id", "u32 flags"),
}
# XNodeUnion in schema order: (member, table).
NODE_KINDS = (
    ("XNNAdd", "_XNNNode2x1"), ("XNNFullyConnected", "XNNFullyConnected"), ("XNNSoftmax", "_XNNNode1x1"),
    ("XNNSigmoid", "_XNNNode1x1"), ("XNNStaticTranspose", "XNNStaticTranspose"), ("XNNClamp", "_XNNNode1x1"),
    ("XNNConv2d", "_XNNNodeConv"), ("XNNDiv", "_XNNNode2x1"),
    ("XNNStaticResizeBilinear2D", "XNNStaticResizeBilinear2D"), ("XNNStaticConstantPad", "XNNStaticConstantPad"),
    ("XNNAvgPooling2d", "_XNNPooling2D"), ("XNNMinimum", "_XNNNode2x1"), ("XNNDepthwiseConv2d", "_XNNNodeConv"),
    ("XNNMaxPooling2d", "_XNNPooling2D"), ("XNNMultiply", "_XNNNode2x1"), ("XNNSubtract", "_XNNNode2x1"),
    ("XNNFloor", "_XNNNode1x1"), ("XNNConvert", "_XNNNode1x1"), ("XNNGlobalAvgPooling2d", "_XNNNode1x1"),
    ("XNNStaticReshape", "XNNStaticReshape"), ("XNNArgMaxPooling2d", "XNNArgMaxPooling2d"),
    ("XNNSquareRoot", "_XNNNode1x1"), ("XNNCeiling", "_XNNNode1x1"), ("XNNHardswish", "_XNNNode1x1"),
    ("XNNLeakyReLU", "XNNLeakyReLU"), ("XNNMaximum", "_XNNNode2x1"), ("XNNNegate", "_XNNNode1x1"),
    ("XNNSquare", "_XNNNode1x1"), ("XNNELU", "XNNELU"), ("XNNAbs", "_XNNNode1x1"), ("XNNPReLU", "_XNNNode2x1"),
    ("XNNConcatenate2", "_XNNCat"), ("XNNConcatenate3", "_XNNCat"), ("XNNConcatenate4", "_XNNCat"),
    ("XNNStaticSlice", "XNNStaticSlice"), ("XNNScaledDotProductAttention", "XNNScaledDotProductAttention"),
    ("XNNBatchMatrixMultiply", "_XNNNode2x1"), ("XNNConcatenate5", "_XNNCat"),
    ("XNNConvTranspose2d", "_XNNNodeConv"), ("XNNReciprocalSquareRoot", "_XNNNode1x1"), ("XNNLog", "_XNNNode1x1"),
    ("XNNGelu", "_XNNNode1x1"), ("XNNTanh", "_XNNNode1x1"), ("XNNExp", "_XNNNode1x1"), ("XNNSin", "_XNNNode1x1"),
    ("XNNCopy", "_XNNNode1x1"), ("XNNCos", "_XNNNode1x1"),
)
# The flags ExecuTorch's serializer writes on a node (every other node: 0).
# (transposed weights, keep dims, align corners).
NODE_FLAGS = {"XNNFullyConnected": 0x1, "XNNAvgPooling2d": 0x40, "XNNGlobalAvgPooling2d": 0x40,
              "XNNStaticResizeBilinear2D": 0x8}
# XQuantParams union members in schema order, each with its fields.
QUANT_KINDS = (
    ("PerChannelQuant", ("floats scale", "i32 channel_dim", "u32 scale_buffer_idx", "u32 num_scales")),
    ("PerTensorQuant", ("f32 scale", "i32 zero_point")),
    ("PerTokenDynamicQuant", ("i32 num_nonbatch_dims",)),
    ("PerChannelGroupQuant", ("floats scale", "i32 channel_dim", "i32 group_size", "halves scale_bf16",
                              "u32 scale_buffer_idx", "u32 num_scales")),
)
_CAT_INPUTS = {"XNNConcatenate2": 2, "XNNConcatenate3": 3, "XNNConcatenate4": 4, "XNNConcatenate5": 5}


class PayloadError(ValueError):
    """An XNNPACK payload that contradicts itself or its program; the message says where."""


@dataclass(frozen=True)
class Value:
    """A value of the XNNPACK graph as the payload declares it."""

    id: int
    datatype: int
    dims: tuple[int, ...]
    constant: int  # index into the payload's constant table; 0: not a constant
    external_id: int
    flags: int
    quantization: str | None = None


@dataclass(frozen=True)
class Node:
    kind: str
    reads: tuple[int, ...]  # value ids, INVALID_ID where an optional input is absent
    writes: tuple[int, ...]
    params: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Constant:
    offset: int
    size: int
    key: str | None  # named data of the program, or None: bytes in the payload


@dataclass(frozen=True)
class Payload:
    values: list[Value]
    nodes: list[Node]
    constants: list[Constant]
    num_externs: int
    constant_data_size: int  # bytes of constant data in the payload itself

    @property
    def inputs(self) -> list[Value]:
        """External inputs, by external id (the call's first arguments)."""
        return sorted((v for v in self.values if v.flags & EXTERNAL_INPUT), key=lambda v: v.external_id)

    @property
    def outputs(self) -> list[Value]:
        return sorted((v for v in self.values if v.flags & EXTERNAL_OUTPUT), key=lambda v: v.external_id)


# -- the flatbuffer ---------------------------------------------------------------------------------


class _Flatbuffer:
    """A flatbuffer in `data[start:start+size]`; every read bounds- and alignment-checked."""

    def __init__(self, data: bytes, start: int, size: int, trace: list | None = None) -> None:
        self.data, self.start, self.size, self.trace = data, start, size, trace

    def read(self, fmt: str, at: int, what: str):
        width = struct.calcsize(fmt)
        if not 0 <= at <= self.size - width:
            raise PayloadError(f"{what} at byte {at} lies outside the flatbuffer ({self.size} bytes)")
        if at % min(width, 8):
            raise PayloadError(f"{what} at byte {at} is not aligned to {width}")
        if self.trace is not None:
            self.trace.append((self.start + at, width, what))
        return struct.unpack_from("<" + fmt, self.data, self.start + at)[0]

    def target(self, at: int, what: str) -> int:
        """Where the offset stored at `at` points."""
        return at + self.read("I", at, what)

    def table(self, at: int, what: str) -> _Table:
        return _Table(self, at, what)

    def vector(self, at: int, width: int, what: str) -> tuple[int, int]:
        """(first element, length) of the vector at `at`."""
        length = self.read("I", at, f"{what} length")
        first = at + 4
        if length > (self.size - first) // max(width, 1):
            raise PayloadError(f"{what}: {length} elements run past the flatbuffer ({self.size} bytes)")
        if width == 8 and first % 8:
            raise PayloadError(f"{what} at byte {first} is not aligned to 8")
        return first, length


class _Table:
    def __init__(self, fb: _Flatbuffer, at: int, what: str) -> None:
        self.fb, self.at, self.what = fb, at, what
        vtable = at - fb.read("i", at, f"{what} vtable offset")
        self.vtable_size = fb.read("H", vtable, f"{what} vtable size")
        self.size = fb.read("H", vtable + 2, f"{what} size")
        if self.vtable_size < 4 or self.vtable_size % 2 or vtable + self.vtable_size > fb.size:
            raise PayloadError(f"{what}: vtable of {self.vtable_size} bytes at {vtable} is corrupt")
        if self.size < 4 or at + self.size > fb.size:
            raise PayloadError(f"{what}: table of {self.size} bytes at {at} runs past the flatbuffer")
        self.vtable = vtable

    def slot(self, index: int, width: int, name: str) -> int | None:
        """The field's position, or None when it is absent."""
        entry = 4 + 2 * index
        if entry >= self.vtable_size:
            return None
        offset = self.fb.read("H", self.vtable + entry, f"{self.what}.{name} slot")
        if offset == 0:
            return None
        if offset < 4 or offset + width > self.size:
            raise PayloadError(f"{self.what}.{name}: field at {offset} lies outside its table of {self.size} bytes")
        return self.at + offset

    def scalar(self, index: int, fmt: str, name: str, default=0):
        at = self.slot(index, struct.calcsize(fmt), name)
        return default if at is None else self.fb.read(fmt, at, f"{self.what}.{name}")

    def child(self, index: int, name: str) -> _Table | None:
        at = self.slot(index, 4, name)
        return None if at is None else self.fb.table(self.fb.target(at, f"{self.what}.{name}"), f"{self.what}.{name}")

    def numbers(self, index: int, fmt: str, name: str) -> list | None:
        at = self.slot(index, 4, name)
        if at is None:
            return None
        what = f"{self.what}.{name}"
        width = struct.calcsize(fmt)
        first, length = self.fb.vector(self.fb.target(at, what), width, what)
        if self.fb.trace is not None:
            self.fb.trace.extend((self.fb.start + first + k * width, width, f"{what}[{k}]") for k in range(length))
        return list(struct.unpack_from(f"<{length}{fmt}", self.fb.data, self.fb.start + first))

    def tables(self, index: int, name: str) -> list[_Table] | None:
        at = self.slot(index, 4, name)
        if at is None:
            return None
        what = f"{self.what}.{name}"
        first, length = self.fb.vector(self.fb.target(at, what), 4, what)
        return [self.fb.table(self.fb.target(first + 4 * i, f"{what}[{i}]"), f"{what}[{i}]") for i in range(length)]

    def string(self, index: int, name: str) -> str | None:
        at = self.slot(index, 4, name)
        if at is None:
            return None
        what = f"{self.what}.{name}"
        first, length = self.fb.vector(self.fb.target(at, what), 1, what)
        if first + length >= self.fb.size or self.fb.data[self.fb.start + first + length] != 0:
            raise PayloadError(f"{what}: string of {length} bytes is not terminated inside the flatbuffer")
        if self.fb.trace is not None:
            self.fb.trace.append((self.fb.start + first, length + 1, f"{what} text"))
        raw = bytes(self.fb.data[self.fb.start + first : self.fb.start + first + length])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PayloadError(f"{what}: string {raw[:40]!r} is not UTF-8") from None


# -- reading ----------------------------------------------------------------------------------------


def read(blob: bytes, trace: list | None = None) -> Payload:
    """The payload's graph, checked for everything a payload must agree with by itself
    (not yet with the program that calls it: `check_call`). PayloadError otherwise.

    With `trace`, (offset in the payload, bytes, field) of every flatbuffer field and
    vector length read is appended to it: where a field lies, to aim damage at it."""
    data = bytes(blob)
    if len(data) < HEADER.size:
        raise PayloadError(f"{len(data)} bytes, shorter than the {HEADER.size}-byte XNNPACK header")
    _, magic, length, fb_offset, fb_size, data_offset, data_size = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PayloadError(f"header magic {magic!r}, expected {MAGIC!r}")
    if length != HEADER.size:
        raise PayloadError(f"header length {length}, expected {HEADER.size}")
    if not HEADER.size <= fb_offset <= len(data) or not 8 <= fb_size <= len(data) - fb_offset:
        raise PayloadError(f"flatbuffer of {fb_size} bytes at {fb_offset} lies outside the {len(data)}-byte payload")
    if fb_offset % 8:
        raise PayloadError(f"flatbuffer offset {fb_offset} is not 8-byte aligned")
    if not fb_offset + fb_size <= data_offset <= len(data) or data_size > len(data) - data_offset:
        raise PayloadError(f"constant data of {data_size} bytes at {data_offset} overlaps the flatbuffer "
                           f"(bytes {fb_offset}-{fb_offset + fb_size}) or runs past the {len(data)}-byte payload")
    if any(data[HEADER.size:fb_offset]) or any(data[fb_offset + fb_size:data_offset]):
        raise PayloadError("padding between header, flatbuffer and constant data is not zero")
    identifier = data[fb_offset + 4 : fb_offset + 8]
    if identifier not in IDENTIFIERS:
        raise PayloadError(f"flatbuffer identifier {identifier!r}, expected one of {IDENTIFIERS}")
    fb = _Flatbuffer(data, fb_offset, fb_size, trace)
    graph = fb.table(fb.target(0, "root offset"), "graph")
    return _graph(graph, data_size)


def _graph(graph: _Table, data_size: int) -> Payload:
    graph.string(0, "version")
    node_tables = graph.tables(1, "xnodes")
    value_tables = graph.tables(2, "xvalues")
    if node_tables is None or value_tables is None:
        raise PayloadError("the graph has no nodes or no values")
    num_externs = graph.scalar(3, "I", "num_externs")
    input_ids = graph.numbers(4, "I", "input_ids") or []
    output_ids = graph.numbers(5, "I", "output_ids") or []
    if graph.slot(6, 4, "constant_buffer") is not None:
        raise PayloadError("the graph keeps constants in the deprecated constant_buffer")
    constants = [_constant(t, i, data_size) for i, t in enumerate(graph.tables(8, "constant_data") or [])]
    values = [_value(t, i) for i, t in enumerate(value_tables)]
    nodes = [_node(t, i) for i, t in enumerate(node_tables)]
    payload = Payload(values, nodes, constants, num_externs, data_size)
    _check_values(payload, input_ids, output_ids)
    _check_nodes(payload)
    return payload


def _constant(table: _Table, i: int, data_size: int) -> Constant:
    offset = table.scalar(0, "Q", "offset")
    size = table.scalar(1, "Q", "size")
    key = table.string(2, "named_key")
    if i == 0:  # the placeholder of "no constant": never read
        return Constant(offset, size, key)
    if key is not None:  # present, even empty, it is what ExecuTorch's runtime looks up
        if not key or offset != NAMED:
            raise PayloadError(f"constant {i} names data {key[:80]!r} and has offset {offset}")
        return Constant(offset, size, key)
    if (offset > data_size or size > data_size - offset):
        raise PayloadError(f"constant {i}: {size} bytes at {offset} run past the payload's {data_size} bytes "
                           "of constant data")
    return Constant(offset, size, None)


def _value(table: _Table, i: int) -> Value:
    what = f"value {i}"
    kind = table.scalar(0, "B", "xvalue_union_type")
    body = table.child(1, "xvalue_union")
    if kind not in (1, 2) or body is None:
        raise PayloadError(f"{what}: value kind {kind} is not a tensor (1) or quantized tensor (2)")
    quantization = None
    if kind == 2:
        quant_kind = body.scalar(1, "B", "quant_params_type")
        params = body.child(2, "quant_params")
        if not 1 <= quant_kind <= len(QUANT_KINDS) or params is None:
            raise PayloadError(f"{what}: quantization kind {quant_kind} is unknown")
        quantization = QUANT_KINDS[quant_kind - 1][0]
        quant = _fields(params, QUANT_KINDS[quant_kind - 1][1])
        body = body.child(0, "tensor_value")
        if body is None:
            raise PayloadError(f"{what}: a quantized value without its tensor")
    body.what = what
    datatype = body.scalar(0, "h", "datatype")
    num_dims = body.scalar(1, "I", "num_dims")
    dims = body.numbers(2, "I", "dims") or []
    value = Value(id=body.scalar(6, "I", "id_out"), datatype=datatype, dims=tuple(dims),
                  constant=body.scalar(3, "I", "constant_buffer_idx"), external_id=body.scalar(4, "I", "external_id"),
                  flags=body.scalar(5, "I", "flags"), quantization=quantization)
    if value.id != i:
        raise PayloadError(f"{what} has id {value.id} (values are numbered in order)")
    if datatype not in DATATYPES:
        raise PayloadError(f"{what}: datatype {datatype} is not one XNNPACK knows")
    if body.scalar(7, "h", "dq_datatype") not in (0, 3):
        raise PayloadError(f"{what}: dynamic quantization to datatype {body.scalar(7, 'h', 'dq_datatype')}")
    if len(dims) > MAX_DIMS or num_dims != len(dims):
        raise PayloadError(f"{what}: {num_dims} dims declared, {len(dims)} given (at most {MAX_DIMS})")
    if value.flags & ~(EXTERNAL_INPUT | EXTERNAL_OUTPUT) or value.flags == EXTERNAL_INPUT | EXTERNAL_OUTPUT:
        raise PayloadError(f"{what}: flags 0x{value.flags:x} (only external input 0x1 or output 0x2)")
    if quantization in ("PerChannelQuant", "PerChannelGroupQuant"):
        channel = quant["channel_dim"]
        if not 0 <= channel < len(dims):
            raise PayloadError(f"{what}: quantization channel {channel} of a {len(dims)}-dim tensor")
        scales = len(quant["scale"] or []) or quant["num_scales"]
        if quantization == "PerChannelQuant" and scales != dims[channel]:
            raise PayloadError(f"{what}: {scales} scales for {dims[channel]} channels")
    return value


def _fields(table: _Table, layout: tuple[str, ...]) -> dict:
    out = {}
    for index, spec in enumerate(layout):
        kind, name = spec.split()
        if kind in ("id", "id?", "out", "u32"):
            out[name] = table.scalar(index, "I", name)
        elif kind == "i32":
            out[name] = table.scalar(index, "i", name)
        elif kind == "f32":
            out[name] = table.scalar(index, "f", name)
        elif kind == "dims":
            out[name] = table.numbers(index, "I", name)
        elif kind == "floats":
            out[name] = table.numbers(index, "f", name)
        elif kind == "halves":
            out[name] = table.numbers(index, "H", name)
    return out


def _node(table: _Table, i: int) -> Node:
    kind = table.scalar(0, "B", "xnode_union_type")
    body = table.child(1, "xnode_union")
    if not 1 <= kind <= len(NODE_KINDS) or body is None:
        raise PayloadError(f"node {i}: node kind {kind} is unknown")
    name, layout_name = NODE_KINDS[kind - 1]
    layout = _TABLES[layout_name]
    body.what = f"node {i} ({name})"
    params = _fields(body, layout)
    clamp = table.child(3, "output_min_max")
    if clamp is not None:
        low, high = clamp.scalar(0, "f", "output_min"), clamp.scalar(1, "f", "output_max")
        if not low <= high:  # NaN too; any other clamp is XNNPACK's to take as it is
            raise PayloadError(f"node {i} ({name}): output clamp [{low}, {high}]")
    reads, writes = [], []
    for spec in layout:
        role, field_name = spec.split()
        if role == "out":
            writes.append(params[field_name])
        elif role in ("id", "id?"):
            index = int(field_name[5]) if field_name.startswith("input") and field_name[5:6].isdigit() else 0
            if name in _CAT_INPUTS and index > _CAT_INPUTS[name]:
                continue  # a concatenation of k inputs leaves the others unused
            if role == "id?" and params[field_name] == INVALID_ID:
                continue
            reads.append(params[field_name])
    return Node(name, tuple(reads), tuple(writes), params)


# -- consistency ------------------------------------------------------------------------------------


def _check_values(payload: Payload, input_ids: list[int], output_ids: list[int]) -> None:
    values, constants = payload.values, payload.constants
    n_in, n_out = len(payload.inputs), len(payload.outputs)
    if payload.num_externs > MAX_EXTERNS or payload.num_externs != n_in + n_out:
        raise PayloadError(f"{payload.num_externs} external values declared, {n_in} inputs and {n_out} outputs flagged")
    externals = [v.external_id for v in payload.inputs + payload.outputs]
    if externals != list(range(n_in + n_out)):
        raise PayloadError(f"external ids {externals} are not the inputs then the outputs, 0..{n_in + n_out - 1}")
    if sorted(input_ids) != sorted(v.id for v in payload.inputs) or \
            sorted(output_ids) != sorted(v.id for v in payload.outputs):
        raise PayloadError(f"the graph lists inputs {input_ids} and outputs {output_ids}, its values are flagged "
                           f"{[v.id for v in payload.inputs]} and {[v.id for v in payload.outputs]}")
    for v in values:
        if not v.flags and v.external_id != INVALID_ID:
            raise PayloadError(f"value {v.id}: external id {v.external_id} on a value that is not external")
        if v.constant:
            if v.flags:
                raise PayloadError(f"value {v.id}: a constant flagged external")
            if v.constant >= len(constants):
                raise PayloadError(f"value {v.id}: constant {v.constant} of {len(constants)} does not exist")
            need = constant_bytes(v)
            have = constants[v.constant].size
            if need > have:
                raise PayloadError(f"value {v.id}: dims {list(v.dims)} of {DATATYPES[v.datatype][0]} need {need} "
                                   f"bytes, its constant {v.constant} holds {have}")


def constant_bytes(v: Value) -> int:
    """The bytes XNNPACK reads from a constant value's data."""
    return math.ceil(math.prod(v.dims) * DATATYPES[v.datatype][1] / 8)


def _check_nodes(payload: Payload) -> None:
    values = payload.values
    ready = {v.id for v in values if v.constant or v.flags & EXTERNAL_INPUT}
    written = set()
    for i, node in enumerate(payload.nodes):
        what = f"node {i} ({node.kind})"
        for j in node.reads + node.writes:
            if j >= len(values):
                raise PayloadError(f"{what}: value {j} of {len(values)} does not exist")
        for j in node.reads:
            if j not in ready:
                raise PayloadError(f"{what} reads value {j}, which no earlier node writes")
        for j in node.writes:
            v = values[j]
            if v.constant or v.flags & EXTERNAL_INPUT or j in written:
                raise PayloadError(f"{what} writes value {j}, a constant, an input or a value already written")
            ready.add(j)
            written.add(j)
        _check_params(what, node, values)
        _check_dims(what, node, values)
    for v in payload.outputs:
        if v.id not in written:
            raise PayloadError(f"external output value {v.id} is never written")


def _check_params(what: str, node: Node, values: list[Value]) -> None:
    p = node.params
    flags = p.get("flags", 0)
    if flags & ~NODE_FLAGS.get(node.kind, 0):
        raise PayloadError(f"{what}: flags 0x{flags:x}")
    rank = len(values[node.reads[0]].dims) if node.reads else 0
    if node.kind == "XNNStaticTranspose":
        perm = p["perm"] or []
        if sorted(perm) != list(range(rank)) or p["num_dims"] != rank:
            raise PayloadError(f"{what}: permutation {perm} ({p['num_dims']} dims) of a {rank}-dim input")
    elif node.kind == "XNNStaticReshape":
        shape = p["new_shape"] or []
        if p["new_shape"] is None or p["num_dims"] != len(shape) or len(shape) > MAX_DIMS:
            raise PayloadError(f"{what}: new shape {shape} ({p['num_dims']} dims)")
    elif node.kind == "XNNStaticSlice":
        offsets, sizes = p["offsets"] or [], p["sizes"] or []
        if not len(offsets) == len(sizes) == p["num_dims"] == rank:
            raise PayloadError(f"{what}: offsets {offsets}, sizes {sizes} of a {rank}-dim input")
    elif node.kind == "XNNStaticConstantPad":
        pre, post = p["pre_paddings"] or [], p["post_paddings"] or []
        if not len(pre) == len(post) == rank:
            raise PayloadError(f"{what}: paddings {pre}, {post} of a {rank}-dim input")
    elif node.kind in _CAT_INPUTS:
        if not p["axis"] < rank:
            raise PayloadError(f"{what}: axis {p['axis']} of {rank}-dim inputs")
    elif node.kind == "XNNFullyConnected":
        filter_dims = values[p["filter_id"]].dims
        if len(filter_dims) != 2:
            raise PayloadError(f"{what}: filter of dims {list(filter_dims)}, not a matrix")
        channels = filter_dims[0] if flags & 0x1 else filter_dims[1]
        outputs = filter_dims[1] if flags & 0x1 else filter_dims[0]
        if rank < 1 or values[p["input1_id"]].dims[-1] != channels:
            raise PayloadError(f"{what}: input of dims {list(values[p['input1_id']].dims)} against a filter of "
                               f"{channels} input channels")
        if p["bias_id"] != INVALID_ID and values[p["bias_id"]].dims != (outputs,):
            raise PayloadError(f"{what}: bias of dims {list(values[p['bias_id']].dims)} for {outputs} outputs")
    elif node.kind in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNAvgPooling2d",
                       "XNNMaxPooling2d", "XNNArgMaxPooling2d"):
        for name in ("kernel_height", "kernel_width", "subsampling_height", "subsampling_width",
                     "pooling_height", "pooling_width", "dilation_height", "dilation_width", "groups"):
            if name in p and p[name] == 0 and not (node.kind == "XNNArgMaxPooling2d" and name.startswith("dilation")):
                raise PayloadError(f"{what}: {name} 0")


_UNARY = {"XNNSoftmax", "XNNSigmoid", "XNNClamp", "XNNFloor", "XNNConvert", "XNNSquareRoot", "XNNCeiling",
          "XNNHardswish", "XNNNegate", "XNNSquare", "XNNAbs", "XNNReciprocalSquareRoot", "XNNLog", "XNNGelu",
          "XNNTanh", "XNNExp", "XNNSin", "XNNCopy", "XNNCos", "XNNLeakyReLU", "XNNELU", "XNNPReLU"}
_BINARY = {"XNNAdd", "XNNDiv", "XNNMinimum", "XNNMultiply", "XNNSubtract", "XNNMaximum"}


def _check_dims(what: str, node: Node, values: list[Value]) -> None:
    """The dims a node's output declares are what the node makes of its inputs' dims (XNNPACK
    plans its memory by the declared ones). Nodes without a rule here (convolutions,
    pooling, resizing, attention) keep what they declare."""
    try:
        made = _output_dims(node, [values[j].dims for j in node.reads])
    except PayloadError as exc:
        raise PayloadError(f"{what}: inputs of dims {[list(values[j].dims) for j in node.reads]} {exc}") from None
    if made is None:
        return
    out = values[node.writes[0]].dims
    if len(made) != len(out) or any(m is not None and m != o for m, o in zip(made, out)):
        raise PayloadError(f"{what} makes dims {[m if m is not None else '?' for m in made]} of inputs "
                           f"{[list(values[j].dims) for j in node.reads]}; its output value {node.writes[0]} "
                           f"declares {list(out)}")


def _output_dims(node: Node, dims: list[tuple[int, ...]]) -> list[int | None] | None:
    """A node's output dims from its inputs' (None where any size is allowed), or None
    when there is no rule for it; PayloadError when the inputs do not fit the node."""
    p, kind = node.params, node.kind
    if kind in _UNARY:
        return list(dims[0])
    if kind in _BINARY:
        return _broadcast(dims[0], dims[1])
    if kind == "XNNFullyConnected":
        filter_dims = dims[1]
        return [*dims[0][:-1], filter_dims[1] if p["flags"] & 0x1 else filter_dims[0]]
    if kind == "XNNBatchMatrixMultiply":
        a, b = dims[0], dims[1]
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            raise PayloadError("do not multiply")
        return [*_broadcast(a[:-2], b[:-2]), a[-2], b[-1]]
    if kind == "XNNStaticTranspose":
        return [dims[0][k] for k in p["perm"]]
    if kind == "XNNStaticReshape":
        shape = p["new_shape"]
        if 0 in shape:  # a size XNNPACK infers
            return [d or None for d in shape]
        if math.prod(shape) != math.prod(dims[0]):
            raise PayloadError(f"do not reshape to {shape}")
        return list(shape)
    if kind == "XNNStaticSlice":
        return [s or None for s in p["sizes"]]
    if kind == "XNNStaticConstantPad":
        return [d + a + b for d, a, b in zip(dims[0], p["pre_paddings"], p["post_paddings"])]
    if kind in _CAT_INPUTS:
        axis, first = p["axis"], dims[0]
        if any(len(d) != len(first) or any(x != y for k, (x, y) in enumerate(zip(d, first)) if k != axis)
               for d in dims):
            raise PayloadError(f"do not concatenate along axis {axis}")
        return [sum(d[axis] for d in dims) if k == axis else first[k] for k in range(len(first))]
    return None


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> list[int]:
    out = []
    for k in range(1, max(len(a), len(b)) + 1):
        x = a[-k] if k <= len(a) else 1
        y = b[-k] if k <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise PayloadError("do not broadcast")
        out.append(y if x == 1 else x)
    return out[::-1]


# -- the program around it --------------------------------------------------------------------------


def check_call(payload: Payload, args: list) -> None:
    """The delegate call's values (the program's schema values, inputs then outputs) are the
    payload's external values, of the dtype and rank it declares; PayloadError otherwise."""
    from executorch.exir import schema

    externals = payload.inputs + payload.outputs
    if len(args) != len(externals):
        raise PayloadError(f"the call passes {len(args)} values, the payload takes {len(payload.inputs)} inputs "
                           f"and {len(payload.outputs)} outputs")
    for k, (v, arg) in enumerate(zip(externals, args)):
        role = "input" if v.flags & EXTERNAL_INPUT else "output"
        if not isinstance(arg, schema.Tensor):
            raise PayloadError(f"the call's value {k} ({role}) is a {type(arg).__name__}, not a tensor")
        if int(arg.scalar_type) not in EXTERNAL_SCALAR_TYPES.get(v.datatype, ()):
            raise PayloadError(f"the call's value {k} ({role}) has dtype {arg.scalar_type!r}, the payload declares "
                               f"{DATATYPES[v.datatype][0]}")
        sizes = list(arg.sizes)
        dims = v.dims if sizes or v.dims != (1,) else ()  # a 0-dim tensor is 1 element to XNNPACK
        static = arg.shape_dynamism == schema.TensorShapeDynamism.STATIC
        if len(sizes) != len(dims) or (static and tuple(sizes) != dims):
            raise PayloadError(f"the call's value {k} ({role}) has sizes {sizes}, the payload declares "
                               f"{list(v.dims)}")


def check_named_data(payload: Payload, sizes: dict[str, int]) -> None:
    """Each constant named in the payload exists in the program's named data (`sizes`: key ->
    bytes) with the bytes its values read."""
    for v in payload.values:
        if v.constant:
            c = payload.constants[v.constant]
            if c.key is None:
                continue
            if c.key not in sizes:
                raise PayloadError(f"value {v.id}: its constant names data {c.key[:80]!r}, which the program lacks")
            if constant_bytes(v) > sizes[c.key]:
                raise PayloadError(f"value {v.id}: dims {list(v.dims)} need {constant_bytes(v)} bytes, its named "
                                   f"data holds {sizes[c.key]}")


def check_program_delegates(pte) -> None:
    """Every XNNPACK delegate of a parsed `.pte` (pipeline.pte.file.PteFile): its payload,
    its named data, and each call of it. PayloadError naming the delegate otherwise."""
    plan = pte.plan
    if not any(d.id == BACKEND_ID for d in plan.delegates):
        return
    named = {}
    for entry in pte.program.named_data or []:
        if 0 <= entry.segment_index < len(pte.segments):
            named[entry.key] = pte.segments[entry.segment_index].size
    calls: dict[int, list[list[int]]] = {}
    for chain in plan.chains:
        for instruction in chain.instructions:
            a = instruction.instr_args
            if hasattr(a, "delegate_index"):
                calls.setdefault(a.delegate_index, []).append(list(a.args))
    for i, d in enumerate(plan.delegates):
        if d.id != BACKEND_ID:
            continue
        try:
            payload = read(pte.delegate_bytes(d))
            check_named_data(payload, named)
            for args in calls.get(i, []):
                check_call(payload, [plan.values[j].val for j in args])
        except PayloadError as exc:
            raise PayloadError(f"delegate {i} ({BACKEND_ID}): {exc}") from None
