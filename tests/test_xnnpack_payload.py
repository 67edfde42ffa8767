"""XNNPACK payloads are checked before ExecuTorch's runtime sees them
(`pipeline.pte.xnnpack_payload`): the files we export pass, damaged payloads are
refused with a reason, and a sweep of damaged payloads never crashes ExecuTorch's runtime
(each case in a worker process, so a crash fails the case, not the run)."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from pipeline.pte import xnnpack_payload as xp
from pipeline.pte.file import PteError, PteFile
from support.damage import sweep
from support.inputs import randn
from support.models import SmallBlock  # a linear, an affine LayerNorm, a GroupNorm


@pytest.fixture(scope="module")
def xnnpack_file(tmp_path_factory):
    """The block lowered with XNNPACK: a payload with a linear and its named weights, one
    with reshapes, a clamp and a scalar input, between two WebGPU LayerNorms."""
    from pipeline.aot.lowering import lower_to_edge

    folder = tmp_path_factory.mktemp("xnnpack")
    inputs = (randn(2, 5, 12), randn(2, 6, 7, seed=1))
    edge, coverage = lower_to_edge(SmallBlock().eval(), inputs, None, "xnnpack")
    assert coverage.complete
    path = folder / "small-xnnpack.pte"
    path.write_bytes(edge.to_executorch().buffer)
    torch.save(inputs, folder / "inputs.pt")
    return path, folder / "inputs.pt"


def _payloads(pte: PteFile) -> dict[int, bytes]:
    return {i: pte.delegate_bytes(d) for i, d in enumerate(pte.plan.delegates) if d.id == xp.BACKEND_ID}


# -- the schema ------------------------------------------------------------------------------------

# The fields each kind of node table has that the checks read (beside its value ids and flags).
READ_FIELDS = {
    "XNNStaticTransposeT": {"num_dims", "perm"},
    "XNNStaticReshapeT": {"num_dims", "new_shape"},
    "XNNStaticSliceT": {"num_dims", "offsets", "sizes"},
    "XNNStaticConstantPadT": {"pre_paddings", "post_paddings"},
    "_XNNCatT": {"axis", "input1_id", "input5_id"},
    "XNNFullyConnectedT": {"input1_id", "filter_id", "bias_id", "output_id", "flags"},
    "_XNNNodeConvT": {"kernel_height", "kernel_width", "subsampling_height", "subsampling_width", "dilation_height",
                      "dilation_width", "groups"},
    "_XNNPooling2DT": {"pooling_height", "pooling_width", "dilation_height", "dilation_width"},
    "PerChannelQuantT": {"channel_dim", "scale", "num_scales"},
    "PerChannelGroupQuantT": {"channel_dim", "scale", "num_scales"},
}


def test_the_checks_name_only_what_the_installed_schema_declares():
    s = xp.schema()  # generated from the installed runtime_schema.fbs
    kinds = set(xp._names(s.XNodeUnion).values())
    assert set(xp.NODE_FLAGS) | set(xp.CONCATENATIONS) | xp._UNARY | xp._BINARY <= kinds
    assert set(xp.VALUE_KINDS) <= set(xp._names(s.XValueUnion).values())
    datatypes = set(xp._names(s.XNNDatatype, "xnn_datatype_").values()) - {"invalid"}
    assert set(xp.DATATYPE_BITS) == datatypes  # the size of every datatype the schema has
    assert set(xp.EXTERNAL_SCALAR_TYPES) <= datatypes
    for table, fields in READ_FIELDS.items():
        assert fields <= set(xp._fields(getattr(s, table)())), table
    assert xp.identifiers() == (b"XN01", b"XN00")


# -- valid files ---------------------------------------------------------------------------------


def test_an_exported_xnnpack_file_passes(xnnpack_file):
    pte = PteFile.read(xnnpack_file[0])
    payloads = _payloads(pte)
    assert len(payloads) == 2
    kinds = {n.kind for blob in payloads.values() for n in xp.read(blob).nodes}
    assert {"XNNFullyConnected", "XNNStaticReshape", "XNNClamp", "XNNMultiply"} <= kinds
    xp.check_program_delegates(pte)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["whisper", "florence2", "bart"])
def test_the_models_xnnpack_files_pass(model, tmp_path):
    import pipeline
    from pipeline.aot.lowering import lower_to_edge

    spec = pipeline.models.build(model, variant="tiny" if model == "whisper" else None)
    edge, _ = lower_to_edge(spec.module.eval(), spec.example_inputs, spec.dynamic_shapes, "xnnpack")
    pte = PteFile(edge.to_executorch().buffer, model)
    assert _payloads(pte)
    xp.check_program_delegates(pte)


# -- damage aimed at one field -------------------------------------------------------------------


def _header(blob: bytes):
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    return XNNHeader.from_bytes(blob[:XNNHeader.EXPECTED_LENGTH])


def _facts(payload: xp.Payload) -> dict[str, float]:
    """Every number the reader decodes, by where it lies ("value 5.external_id"); kinds and
    datatypes as the numbers the flatbuffer holds."""
    s = xp.schema()
    codes = {name: code for table in (s.XValueUnion, s.XNodeUnion) for code, name in xp._names(table).items()}
    codes.update({name: code for code, name in xp._names(s.XNNDatatype, "xnn_datatype_").items()})

    def code(name: str) -> int:
        return codes[name] if name in codes else int(name)

    out = {"graph.num_externs": payload.num_externs}
    out.update({f"graph.input_ids[{k}]": j for k, j in enumerate(payload.input_ids)})
    out.update({f"graph.output_ids[{k}]": j for k, j in enumerate(payload.output_ids)})
    for i, c in enumerate(payload.constants):
        out[f"constant {i}.offset"], out[f"constant {i}.size"] = c.offset, c.size
    for i, v in enumerate(payload.values):
        out[f"value {i}.kind"] = code(v.kind)
        if v.datatype:
            out[f"value {i}.datatype"] = code(v.datatype)
            out.update({f"value {i}.{name}": getattr(v, name)
                        for name in ("id", "num_dims", "constant", "external_id", "flags")})
            out.update({f"value {i}.dims[{k}]": d for k, d in enumerate(v.dims)})
    for i, n in enumerate(payload.nodes):
        out[f"node {i}.kind"] = code(n.kind)
        for name, x in n.params.items():
            out.update({f"node {i}.{name}[{k}]": y for k, y in enumerate(x)} if isinstance(x, list) else
                       {f"node {i}.{name}": x})
        if n.clamp is not None:
            out[f"node {i}.output_min"], out[f"node {i}.output_max"] = n.clamp
    return out


def _probe(blob: bytes, bit=lambda at: 0) -> dict[int, set[str] | str]:
    """Each byte of the flatbuffer whose bit `bit(at)` flipped changes what the reader decodes:
    at -> the facts changed, or the reader's refusal."""
    base = _facts(xp.decode(blob))
    header = _header(blob)
    found = {}
    for at in range(header.flatbuffer_offset, header.flatbuffer_offset + header.flatbuffer_size):
        damaged = bytearray(blob)
        damaged[at] ^= 1 << bit(at)
        try:
            facts = _facts(xp.decode(bytes(damaged)))
        except xp.PayloadError as exc:
            found[at] = str(exc)
            continue
        changed = {k for k in base.keys() | facts.keys() if base.get(k) != facts.get(k)}
        if changed:
            found[at] = changed
    return found


def _field(blob: bytes, key: str) -> int:
    """Where in the payload the number `key` lies: the byte whose two lowest bits, each flipped,
    flip the same bits of `key` (not a vtable's entry, which moves it), changing least else."""
    base = _facts(xp.decode(blob))

    def flipped(at: int, bit: int) -> float | None:
        damaged = bytearray(blob)
        damaged[at] ^= 1 << bit
        try:
            return _facts(xp.decode(bytes(damaged))).get(key)
        except xp.PayloadError:
            return None

    hits = [(len(changed), at) for at, changed in _probe(blob).items()
            if isinstance(changed, set) and key in changed
            and flipped(at, 0) == int(base[key]) ^ 1 and flipped(at, 1) == int(base[key]) ^ 2]
    if not hits:
        raise LookupError(key)
    return min(hits)[1]


def _with(blob: bytes, key: str, value: int) -> bytes:
    """`blob` with the number `key` set to `value` (its bytes above `value`'s being 0)."""
    at = _field(blob, key)
    raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "little")
    return blob[:at] + raw + blob[at + len(raw):]


def _linear(pte: PteFile) -> tuple[int, bytes]:
    return next((i, b) for i, b in _payloads(pte).items()
                if any(n.kind == "XNNFullyConnected" for n in xp.read(b).nodes))


# (field, new value, what the refusal says): each a change that crashed or hung ExecuTorch's
# runtime in the sweep, or one that no check before this reader would see.
AIMED = {
    "external id past the call": ("value 5.external_id", 9, "external ids"),
    "external id of an output made an input's": ("value 5.external_id", 1, "external ids"),
    "a weight's dims past its data": ("value 3.dims[0]", 12 + 64, "need"),
    "a weight's dims far past its data": ("value 3.dims[1]", 12 | 1 << 24, "need"),
    "a node reads a value that does not exist": ("node 1.filter_id", 3 + 32, "does not exist"),
    "a node reads a value no node wrote": ("node 1.input1_id", 5, "no earlier node"),
    "a node writes an input": ("node 1.output_id", 2, "writes value 2"),
    "a node kind changed": ("node 1.kind", 2 + 64, "node kind"),
    "a value kind changed": ("value 3.kind", 3, "value kind"),
    "a datatype changed": ("value 3.datatype", 33, "datatype"),
    "num_externs": ("graph.num_externs", 4 | 1 << 8, "external values"),
    "flags of a value": ("value 5.flags", 6, "flags"),
    "a reshape's rank": ("node 0.num_dims", 3 + 16, "new shape"),
}


@pytest.mark.parametrize("case", AIMED)
def test_damaged_payload_is_refused(xnnpack_file, case):
    key, value, reason = AIMED[case]
    pte = PteFile.read(xnnpack_file[0])
    _, blob = _linear(pte)
    with pytest.raises(xp.PayloadError, match=reason):
        damaged = _with(blob, key, value)
        xp.read(damaged)  # by itself, or with the program around it
        payload = xp.read(damaged)
        xp.check_call(payload, [pte.plan.values[j].val for j in _call_args(pte, blob)])


@pytest.mark.parametrize("where", ["the root offset", "the root table's vtable offset"])
def test_an_offset_out_of_the_flatbuffer_is_refused(xnnpack_file, where):
    _, blob = _linear(PteFile.read(xnnpack_file[0]))
    start = _header(blob).flatbuffer_offset
    at = start if where == "the root offset" else start + struct.unpack_from("<I", blob, start)[0]
    damaged = blob[:at] + struct.pack("<I", 1 << 20) + blob[at + 4:]
    with pytest.raises(xp.PayloadError, match="outside the .*-byte flatbuffer"):
        xp.read(damaged)


def _call_args(pte: PteFile, blob: bytes) -> list[int]:
    index = next(i for i, b in _payloads(pte).items() if b == blob)
    return next(list(ins.instr_args.args) for ins in pte.plan.chains[0].instructions
                if getattr(ins.instr_args, "delegate_index", None) == index)


@pytest.mark.parametrize("change", ["magic", "header length", "flatbuffer size", "data size", "identifier",
                                    "padding"])
def test_damaged_header_is_refused(xnnpack_file, change):
    _, blob = _linear(PteFile.read(xnnpack_file[0]))
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    b = bytearray(blob)
    header = _header(blob)
    fb_offset, fb_size = header.flatbuffer_offset, header.flatbuffer_size
    if change == "magic":
        b[XNNHeader.MAGIC_OFFSET.start + 1] ^= 1
    elif change == "header length":
        b[XNNHeader.HEADER_SIZE_OFFSET.start] ^= 4
    elif change == "flatbuffer size":
        struct.pack_into("<I", b, XNNHeader.FLATBUFFER_SIZE_OFFSET.start, fb_size + 1024)
    elif change == "data size":
        struct.pack_into("<Q", b, XNNHeader.CONSTANT_DATA_SIZE_OFFSET.start, 1 << 40)
    elif change == "identifier":
        b[fb_offset + 4] ^= 2
    else:
        b[fb_offset - 1] = 7
    with pytest.raises(xp.PayloadError):
        xp.read(bytes(b))


def test_named_data_too_small_for_its_weight_is_refused(xnnpack_file):
    pte = PteFile.read(xnnpack_file[0])
    _, blob = _linear(pte)
    payload = xp.read(blob)
    sizes = {c.key: c.size for c in payload.constants[1:]}
    xp.check_named_data(payload, sizes)
    weight = max(payload.constants[1:], key=lambda c: c.size)
    with pytest.raises(xp.PayloadError, match="named data holds"):
        xp.check_named_data(payload, {**sizes, weight.key: weight.size - 4})
    with pytest.raises(xp.PayloadError, match="program lacks"):
        xp.check_named_data(payload, {k: v for k, v in sizes.items() if k != weight.key})


def test_a_call_that_passes_other_values_is_refused(xnnpack_file):
    pte = PteFile.read(xnnpack_file[0])
    _, blob = _linear(pte)
    payload = xp.read(blob)
    args = [pte.plan.values[j].val for j in _call_args(pte, blob)]
    xp.check_call(payload, args)
    with pytest.raises(xp.PayloadError, match="passes 3 values"):
        xp.check_call(payload, args[:-1])  # an argument list cut short (it hung the runtime)
    with pytest.raises(xp.PayloadError, match="sizes"):
        xp.check_call(payload, [args[1], args[0], *args[2:]])


def test_the_native_loader_refuses_a_damaged_payload(xnnpack_file):
    from pipeline.native import NativeProgram

    data = xnnpack_file[0].read_bytes()
    pte = PteFile(data, "x")
    index, blob = _linear(pte)
    start = pte.segments[pte.plan.delegates[index].processed.index].start
    at = _field(blob, "value 5.external_id")
    damaged = bytearray(data)
    damaged[start + at] = 9
    with pytest.raises(PteError, match=r"delegate \d \(XnnpackBackend\): external ids"):
        NativeProgram(bytes(damaged))  # refused before ExecuTorch's runtime (and any build) is reached


# -- the sweep -----------------------------------------------------------------------------------

# What no check sees in a payload (README): an output clamp moved to other finite values.
UNDETECTABLE = r"output_min_max|output_min|output_max"


def _sweep_cases(pte: PteFile) -> dict[str, str]:
    """Single-bit flips over both XNNPACK payloads, case -> what it changes: one flip in every
    fourth byte whose flip changes what the reader decodes (its bit turning with the byte), and
    every byte of the header."""
    cases = {}
    for i, d in enumerate(pte.plan.delegates):
        if d.id != xp.BACKEND_ID:
            continue
        start = pte.segments[d.processed.index].start
        blob = pte.delegate_bytes(d)
        found = _probe(blob, bit=lambda at: at % 3)
        for at in sorted(found)[::4]:
            what = found[at] if isinstance(found[at], str) else ", ".join(sorted(found[at])[:4])
            cases[f"flip {start + at} {at % 3}"] = f"delegate {i} {what}"
        for at in range(_header(blob).flatbuffer_offset):
            cases[f"flip {start + at} {at % 8}"] = f"delegate {i} header byte {at}"
    return cases


def test_damaged_payload_sweep_never_crashes_executorch(xnnpack_file):
    from pipeline.native import build

    try:
        build.build()
    except build.BuildError as exc:
        pytest.skip(str(exc))
    path, inputs = xnnpack_file
    cases = _sweep_cases(PteFile.read(path))
    got = sweep("executorch", path, inputs, list(cases))
    kinds: dict[str, int] = {}
    for case, where in cases.items():
        outcome = got[case]
        assert not outcome.startswith("crash"), f"{case} ({where}): {outcome}"
        if outcome.startswith("refused"):
            assert outcome.startswith(("refused-load PteError", "refused-call")), f"{case} ({where}): {outcome}"
        elif outcome == "different":
            assert re.search(UNDETECTABLE, where), f"{case} ({where}) runs to another answer"
        kinds[outcome.split(" ")[0]] = kinds.get(outcome.split(" ")[0], 0) + 1
    assert kinds.get("refused-load", 0) > len(cases) // 2, kinds
