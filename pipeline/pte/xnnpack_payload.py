"""Check an XNNPACK delegate's payload before ExecuTorch's runtime sees it.

ExecuTorch's XNNPACK runtime (1.4.1) verifies the payload's flatbuffer and bounds its
header and constant offsets, but then trusts the graph: the external ids of its values
index the delegate call's arguments unchecked, a constant's dims say how many bytes
XNNPACK packs from the constant's data, node parameters reach XNNPACK as they are. A
damaged payload crashes or hangs the process there. This module reads the payload with the
flatbuffer classes flatc generates from the schema that runtime is built with (the installed
`backends/xnnpack/serialization/runtime_schema.fbs`; `schema()`), and refuses with a
`PayloadError` (a ValueError) what contradicts itself or the program around it:

- header (ExecuTorch's `XNNHeader`): the flatbuffer and constant regions inside the payload,
  in order, the flatbuffer 8-byte aligned, the padding between them zero;
- flatbuffer: one of the schemas' identifiers, every field the generated classes read
  inside it, its strings UTF-8 (ExecuTorch's runtime logs them; what else its structure
  must satisfy, ExecuTorch's verifier checks);
- values: tensors or quantized tensors, the id of each its position (as the serializer
  numbers them), a datatype XNNPACK knows, at most six dims, only the external input/output
  flags, external ids 0..n-1 with the inputs first, constants pointing at constant data
  that holds at least dims x datatype bytes (in the payload, or named data of the program);
- nodes: of a kind the schema knows; every value id a node names exists, inputs are
  constants, external inputs or outputs of earlier nodes, outputs are neither constants nor
  external inputs, each external output is written; shape parameters (permutation, new
  shape, slice, padding, axis) fit their input's rank, and the dims a node's output declares
  are what it makes of its inputs'; only the flags the serializer writes;
- the call: the program's delegate call passes exactly the external values, and each is a
  tensor of the dtype and rank (and, for a static tensor, the shape) the payload declares.

What no structural check sees: a change that keeps all of that consistent (a constant's
bytes, a value re-pointed at another of the same kind, an output clamp); such a file runs
to another answer, and `run_pte`'s sha256 is what catches it.

    payload = read(blob)               # PayloadError when the payload contradicts itself
    check_program_delegates(pte)       # every XNNPACK delegate of a parsed .pte, with its calls
"""

from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass, field
from importlib.resources import files
from types import ModuleType

from pipeline.pte import flatc

BACKEND_ID = "XnnpackBackend"
SCHEMA_PACKAGE = "executorch.backends.xnnpack.serialization"
# The schema ExecuTorch's XNNPACK runtime is built with, and the one its serializer writes.
RUNTIME_SCHEMA, WRITTEN_SCHEMA = "runtime_schema.fbs", "schema.fbs"

INVALID_ID = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID: no value (an absent bias)
NAMED = 0xFFFFFFFFFFFFFFFF  # a constant's offset when its bytes are named data of the program
MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS
MAX_EXTERNS = 4096  # what ExecuTorch's runtime accepts
EXTERNAL_INPUT, EXTERNAL_OUTPUT = 0x1, 0x2  # XNN_VALUE_FLAG_EXTERNAL_*
VALUE_KINDS = ("XNNTensorValue", "XNNQuantizedTensorValue")

# Bits an element of each XNNPACK datatype takes (the schema's XNNDatatype names them).
DATATYPE_BITS = {"fp32": 32, "fp16": 16, "qint8": 8, "quint8": 8, "qint32": 32, "qcint8": 8, "qcint32": 32,
                 "qcint4": 4, "qdint8": 8, "qbint4": 4, "qpint8": 8, "int32": 32, "pfp32": 32, "bf16": 16}
# The program dtypes (ExecuTorch's ScalarType) an external value of each datatype is passed as.
EXTERNAL_SCALAR_TYPES = {"fp32": {6}, "fp16": {5}, "bf16": {15}, "int32": {3, 4}, "qint8": {1}, "quint8": {0}}
# The flags ExecuTorch's serializer writes on a node (every other node: 0).
# (transposed weights, keep dims, align corners).
NODE_FLAGS = {"XNNFullyConnected": 0x1, "XNNAvgPooling2d": 0x40, "XNNGlobalAvgPooling2d": 0x40,
              "XNNStaticResizeBilinear2D": 0x8}
# A concatenation of k inputs leaves its other input fields unused.
CONCATENATIONS = {"XNNConcatenate2": 2, "XNNConcatenate3": 3, "XNNConcatenate4": 4, "XNNConcatenate5": 5}
# Value ids a node may leave INVALID_ID.
OPTIONAL_INPUTS = ("bias_id",)


class PayloadError(ValueError):
    """An XNNPACK payload that contradicts itself or its program; the message says where."""


@dataclass(frozen=True)
class Value:
    """A value of the XNNPACK graph as the payload declares it."""

    id: int
    kind: str  # a member of the schema's XValueUnion, or its number where the schema has none
    datatype: str  # XNNDatatype without its prefix ("fp32"), or its number where the schema has none
    dims: tuple[int, ...]
    num_dims: int
    constant: int  # index into the payload's constant table; 0: not a constant
    external_id: int
    flags: int
    dq_datatype: str = "invalid"
    quantization: str | None = None
    quant: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Node:
    kind: str  # a member of the schema's XNodeUnion, or its number where the schema has none
    reads: tuple[int, ...]  # value ids, in the schema's field order
    writes: tuple[int, ...]
    params: dict = field(default_factory=dict, compare=False)  # the node table's fields, by schema name
    clamp: tuple[float, float] | None = None


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
    input_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    constant_buffer: bool = False  # constants in the deprecated flatbuffer-held buffers
    version: str | None = None

    @property
    def inputs(self) -> list[Value]:
        """External inputs, by external id (the call's first arguments)."""
        return sorted((v for v in self.values if v.flags & EXTERNAL_INPUT), key=lambda v: v.external_id)

    @property
    def outputs(self) -> list[Value]:
        return sorted((v for v in self.values if v.flags & EXTERNAL_OUTPUT), key=lambda v: v.external_id)


# -- the generated reader ---------------------------------------------------------------------------


def schema() -> ModuleType:
    """XNNPACK's flatbuffer classes, generated from the installed schema ExecuTorch's XNNPACK
    runtime is built with; once a process."""
    return flatc.generated(SCHEMA_PACKAGE, RUNTIME_SCHEMA)


@functools.cache
def identifiers() -> tuple[bytes, ...]:
    """The flatbuffer identifiers of the installed schemas (written and read)."""
    found = []
    for name in (WRITTEN_SCHEMA, RUNTIME_SCHEMA):
        text = (files(SCHEMA_PACKAGE) / name).read_text()
        found += [m.encode() for m in re.findall(r'^\s*file_identifier\s+"(\w{4})"\s*;', text, re.M)]
    return tuple(found)


def _names(enum: type, prefix: str = "") -> dict[int, str]:
    """A generated enum or union: number -> name (its prefix taken off)."""
    return {v: k.removeprefix(prefix) for k, v in vars(enum).items() if isinstance(v, int) and not k.startswith("_")}


def _snake(name: str) -> str:
    """The schema's field name of a generated attribute (input1Id -> input1_id)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _fields(table) -> dict:
    """A generated object's fields by schema name, vectors as lists."""
    out = {}
    for name, value in vars(table).items():
        if value is not None and hasattr(value, "tolist"):
            value = value.tolist()
        out[_snake(name)] = value
    return out


def _decoded(what: str, size: int, read):
    """`read()`, its failures as the damaged flatbuffer they come from."""
    try:
        return read()
    except struct.error:
        raise PayloadError(f"{what}: a field lies outside the {size}-byte flatbuffer") from None
    except TypeError as exc:  # flatbuffers' own check of an offset: it left 0..2^32
        if not str(exc).startswith("bad number"):
            raise
        raise PayloadError(f"{what}: an offset points outside the {size}-byte flatbuffer") from None
    except (ValueError, IndexError, OverflowError) as exc:
        raise PayloadError(f"{what} does not decode with XNNPACK's schema: {' '.join(str(exc).split())[:200]}") \
            from None


# -- reading ----------------------------------------------------------------------------------------


def read(blob: bytes) -> Payload:
    """The payload's graph, checked for everything a payload must agree with by itself
    (not yet with the program that calls it: `check_call`). PayloadError otherwise."""
    payload = decode(blob)
    _check_graph(payload)
    _check_values(payload)
    _check_nodes(payload)
    return payload


def decode(blob: bytes) -> Payload:
    """The payload as its header and flatbuffer declare it, checked only where it cannot be
    read (PayloadError): what `read` checks, this does not."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    data = bytes(blob)
    size = XNNHeader.EXPECTED_LENGTH
    if len(data) < size:
        raise PayloadError(f"{len(data)} bytes, shorter than the {size}-byte XNNPACK header")
    try:
        header = XNNHeader.from_bytes(data[:size])
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    fb_offset, fb_size = header.flatbuffer_offset, header.flatbuffer_size
    data_offset, data_size = header.constant_data_offset, header.constant_data_size
    if not size <= fb_offset <= len(data) or not 8 <= fb_size <= len(data) - fb_offset:
        raise PayloadError(f"flatbuffer of {fb_size} bytes at {fb_offset} lies outside the {len(data)}-byte payload")
    if fb_offset % 8:
        raise PayloadError(f"flatbuffer offset {fb_offset} is not 8-byte aligned")
    if not fb_offset + fb_size <= data_offset <= len(data) or data_size > len(data) - data_offset:
        raise PayloadError(f"constant data of {data_size} bytes at {data_offset} overlaps the flatbuffer "
                           f"(bytes {fb_offset}-{fb_offset + fb_size}) or runs past the {len(data)}-byte payload")
    if any(data[size:fb_offset]) or any(data[fb_offset + fb_size:data_offset]):
        raise PayloadError("padding between header, flatbuffer and constant data is not zero")
    fb = data[fb_offset:fb_offset + fb_size]
    if fb[4:8] not in identifiers():
        raise PayloadError(f"flatbuffer identifier {fb[4:8]!r}, expected one of {identifiers()}")
    return _graph(schema(), fb, data_size)


def _graph(s: ModuleType, fb: bytes, data_size: int) -> Payload:
    size = len(fb)
    graph = _decoded("graph", size, lambda: s.XNNGraph.GetRootAs(fb, 0))
    lengths = _decoded("graph", size, lambda: (
        None if graph.XnodesIsNone() else graph.XnodesLength(),
        None if graph.XvaluesIsNone() else graph.XvaluesLength(),
        graph.ConstantDataLength()))
    if lengths[0] is None or lengths[1] is None:
        raise PayloadError("the graph has no nodes or no values")
    top = _decoded("graph", size, lambda: dict(
        version=None if graph.Version() is None else graph.Version().decode("utf-8"),
        num_externs=graph.NumExterns(),
        input_ids=tuple(int(j) for j in graph.InputIdsAsNumpy()) if not graph.InputIdsIsNone() else (),
        output_ids=tuple(int(j) for j in graph.OutputIdsAsNumpy()) if not graph.OutputIdsIsNone() else (),
        constant_buffer=not graph.ConstantBufferIsNone()))
    constants = [_decoded(f"constant {i}", size, lambda i=i: _constant(s.ConstantDataOffsetT.InitFromObj(
        graph.ConstantData(i)))) for i in range(lengths[2])]
    values = [_decoded(f"value {i}", size, lambda i=i: _value(s, s.XValueT.InitFromObj(graph.Xvalues(i))))
              for i in range(lengths[1])]
    nodes = [_decoded(f"node {i}", size, lambda i=i: _node(s, s.XNodeT.InitFromObj(graph.Xnodes(i))))
             for i in range(lengths[0])]
    return Payload(values, nodes, constants, constant_data_size=data_size, **top)


def _constant(c) -> Constant:
    key = None if c.namedKey is None else c.namedKey.decode("utf-8")
    return Constant(c.offset, c.size, key)


def _value(s: ModuleType, v) -> Value:
    kinds = _names(s.XValueUnion)
    kind = kinds.get(v.xvalueUnionType, str(v.xvalueUnionType))
    body, quantization, quant = v.xvalueUnion, None, {}
    if kind == "XNNQuantizedTensorValue" and body is not None:
        quantization = _names(s.XNNQuantParams).get(body.quantParamsType, str(body.quantParamsType))
        quant = _fields(body.quantParams) if body.quantParams is not None else {}
        body = body.tensorValue
    if kind not in VALUE_KINDS or body is None:  # datatype "": no tensor to read
        return Value(id=-1, kind=kind, datatype="", dims=(), num_dims=0, constant=0, external_id=INVALID_ID, flags=0)
    datatypes = _names(s.XNNDatatype, "xnn_datatype_")
    t = _fields(body)
    return Value(id=t["id_out"], kind=kind, datatype=datatypes.get(t["datatype"], str(t["datatype"])),
                 dims=tuple(t["dims"] or ()), num_dims=t["num_dims"], constant=t["constant_buffer_idx"],
                 external_id=t["external_id"], flags=t["flags"],
                 dq_datatype=datatypes.get(t["dq_datatype"], str(t["dq_datatype"])), quantization=quantization,
                 quant=quant)


def _node(s: ModuleType, n) -> Node:
    kind = _names(s.XNodeUnion).get(n.xnodeUnionType, str(n.xnodeUnionType))
    clamp = None if n.outputMinMax is None else (n.outputMinMax.outputMin, n.outputMinMax.outputMax)
    if n.xnodeUnion is None:
        return Node(kind, (), (), {}, clamp)
    params = _fields(n.xnodeUnion)
    reads, writes = [], []
    for name, value in params.items():
        if not name.endswith("_id"):
            continue
        if name.startswith("output"):
            writes.append(value)
            continue
        number = re.fullmatch(r"input(\d)_id", name)
        if kind in CONCATENATIONS and number and int(number[1]) > CONCATENATIONS[kind]:
            continue
        if name in OPTIONAL_INPUTS and value == INVALID_ID:
            continue
        reads.append(value)
    return Node(kind, tuple(reads), tuple(writes), params, clamp)


# -- consistency ------------------------------------------------------------------------------------


def _check_graph(payload: Payload) -> None:
    if payload.constant_buffer:
        raise PayloadError("the graph keeps constants in the deprecated constant_buffer")
    for i, c in enumerate(payload.constants):
        if i == 0:  # the placeholder of "no constant": never read
            continue
        if c.key is not None:  # present, even empty, it is what ExecuTorch's runtime looks up
            if not c.key or c.offset != NAMED:
                raise PayloadError(f"constant {i} names data {c.key[:80]!r} and has offset {c.offset}")
        elif c.offset > payload.constant_data_size or c.size > payload.constant_data_size - c.offset:
            raise PayloadError(f"constant {i}: {c.size} bytes at {c.offset} run past the payload's "
                               f"{payload.constant_data_size} bytes of constant data")
    for i, v in enumerate(payload.values):
        _check_value(f"value {i}", i, v)


def _check_value(what: str, i: int, v: Value) -> None:
    if v.kind not in VALUE_KINDS:
        raise PayloadError(f"{what}: value kind {v.kind} is not a tensor or a quantized tensor")
    if not v.datatype:
        raise PayloadError(f"{what}: a {v.kind} without its tensor")
    if v.kind == "XNNQuantizedTensorValue" and (v.quantization in (None, "NONE") or not v.quant):
        raise PayloadError(f"{what}: quantization kind {v.quantization} is unknown")
    if v.id != i:
        raise PayloadError(f"{what} has id {v.id} (values are numbered in order)")
    if v.datatype not in DATATYPE_BITS:
        raise PayloadError(f"{what}: datatype {v.datatype} is not one XNNPACK knows")
    if v.dq_datatype not in ("invalid", "qint8"):
        raise PayloadError(f"{what}: dynamic quantization to datatype {v.dq_datatype}")
    if len(v.dims) > MAX_DIMS or v.num_dims != len(v.dims):
        raise PayloadError(f"{what}: {v.num_dims} dims declared, {len(v.dims)} given (at most {MAX_DIMS})")
    if v.flags & ~(EXTERNAL_INPUT | EXTERNAL_OUTPUT) or v.flags == EXTERNAL_INPUT | EXTERNAL_OUTPUT:
        raise PayloadError(f"{what}: flags 0x{v.flags:x} (only external input 0x1 or output 0x2)")
    if v.quantization in ("PerChannelQuant", "PerChannelGroupQuant"):
        channel = v.quant["channel_dim"]
        if not 0 <= channel < len(v.dims):
            raise PayloadError(f"{what}: quantization channel {channel} of a {len(v.dims)}-dim tensor")
        scales = len(v.quant["scale"] or []) or v.quant["num_scales"]
        if v.quantization == "PerChannelQuant" and scales != v.dims[channel]:
            raise PayloadError(f"{what}: {scales} scales for {v.dims[channel]} channels")


def _check_values(payload: Payload) -> None:
    values, constants = payload.values, payload.constants
    n_in, n_out = len(payload.inputs), len(payload.outputs)
    if payload.num_externs > MAX_EXTERNS or payload.num_externs != n_in + n_out:
        raise PayloadError(f"{payload.num_externs} external values declared, {n_in} inputs and {n_out} outputs flagged")
    externals = [v.external_id for v in payload.inputs + payload.outputs]
    if externals != list(range(n_in + n_out)):
        raise PayloadError(f"external ids {externals} are not the inputs then the outputs, 0..{n_in + n_out - 1}")
    if sorted(payload.input_ids) != sorted(v.id for v in payload.inputs) or \
            sorted(payload.output_ids) != sorted(v.id for v in payload.outputs):
        raise PayloadError(f"the graph lists inputs {list(payload.input_ids)} and outputs {list(payload.output_ids)}, "
                           f"its values are flagged {[v.id for v in payload.inputs]} and "
                           f"{[v.id for v in payload.outputs]}")
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
                raise PayloadError(f"value {v.id}: dims {list(v.dims)} of {v.datatype} need {need} "
                                   f"bytes, its constant {v.constant} holds {have}")


def constant_bytes(v: Value) -> int:
    """The bytes XNNPACK reads from a constant value's data."""
    return math.ceil(math.prod(v.dims) * DATATYPE_BITS[v.datatype] / 8)


def _check_nodes(payload: Payload) -> None:
    values = payload.values
    ready = {v.id for v in values if v.constant or v.flags & EXTERNAL_INPUT}
    written = set()
    for i, node in enumerate(payload.nodes):
        what = f"node {i} ({node.kind})"
        if not node.params:
            raise PayloadError(f"node {i}: node kind {node.kind} is unknown")
        if node.clamp is not None and not node.clamp[0] <= node.clamp[1]:
            # NaN too; any other clamp is XNNPACK's to take as it is
            raise PayloadError(f"{what}: output clamp [{node.clamp[0]}, {node.clamp[1]}]")
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
    elif node.kind in CONCATENATIONS:
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
    if kind in CONCATENATIONS:
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
                               f"{v.datatype}")
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
