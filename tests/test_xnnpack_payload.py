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


def _schema(name: str) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """(table -> field names, XNodeUnion members as (member, table)) of an installed .fbs."""
    from importlib.resources import files

    text = files("executorch.backends.xnnpack.serialization").joinpath(name).read_text()
    text = re.sub(r"//[^\n]*", "", text)
    tables = {m[1]: re.findall(r"^\s*(\w+)\s*:", m[2], re.M) for m in re.finditer(r"table (\w+) \{(.*?)\}", text, re.S)}
    union = re.search(r"union XNodeUnion \{(.*?)\}", text, re.S)[1]
    members = []
    for item in union.split(","):
        item = item.strip()
        if item:
            name_, _, table = item.partition(":")
            members.append((name_.strip(), (table or name_).strip()))
    return tables, members


@pytest.mark.parametrize("name", ["schema.fbs", "runtime_schema.fbs"])
def test_the_reader_follows_the_installed_schema(name):
    tables, members = _schema(name)
    assert list(xp.NODE_KINDS) == members
    for table, layout in xp._TABLES.items():
        assert [spec.split()[1] for spec in layout] == tables[table], table
    for member, layout in xp.QUANT_KINDS:
        assert [spec.split()[1] for spec in layout] == tables[member], member
    # The fields read by position (xnnpack_payload reads them by slot).
    assert tables["XNNGraph"][:9] == ["version", "xnodes", "xvalues", "num_externs", "input_ids", "output_ids",
                                      "constant_buffer", "mem_buffer_sizes", "constant_data"]
    assert tables["XNNTensorValue"][:7] == ["datatype", "num_dims", "dims", "constant_buffer_idx", "external_id",
                                            "flags", "id_out"]
    assert tables["ConstantDataOffset"] == ["offset", "size", "named_key"]
    assert tables["XNode"] == ["xnode_union", "debug_handle", "output_min_max"]
    assert tables["XNNQuantizedTensorValue"] == ["tensor_value", "quant_params"]
    if name == "runtime_schema.fbs":  # what ExecuTorch's runtime was built with
        assert tables["XNNTensorValue"][7:] == ["dq_datatype"]


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


def _field(blob: bytes, pattern: str) -> tuple[int, int]:
    """(offset, bytes) in the payload of the first field whose path matches `pattern`."""
    trace: list = []
    xp.read(blob, trace)
    for at, width, what in trace:
        if re.search(pattern, what):
            return at, width
    raise LookupError(pattern)


def _with(blob: bytes, pattern: str, value: int) -> bytes:
    at, width = _field(blob, pattern)
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width]
    return blob[:at] + struct.pack(fmt, value) + blob[at + width:]


def _linear(pte: PteFile) -> tuple[int, bytes]:
    return next((i, b) for i, b in _payloads(pte).items()
                if any(n.kind == "XNNFullyConnected" for n in xp.read(b).nodes))


# (field, new value, what the refusal says): each a change that crashed or hung ExecuTorch's
# runtime in the sweep, or one that no check before this reader would see.
AIMED = {
    "external id past the call": (r"value 5\.external_id$", 9, "external ids"),
    "external id of an output made an input's": (r"value 5\.external_id$", 1, "external ids"),
    "a weight's dims past its data": (r"value 3\.dims\[0\]$", 12 + 64, "need"),
    "a weight's dims far past its data": (r"value 3\.dims\[1\]$", 12 | 1 << 24, "need"),
    "a node reads a value that does not exist": (r"node 1 \(XNNFullyConnected\)\.filter_id$", 3 + 32, "does not exist"),
    "a node reads a value no node wrote": (r"node 1 \(XNNFullyConnected\)\.input1_id$", 5, "no earlier node"),
    "a node writes an input": (r"node 1 \(XNNFullyConnected\)\.output_id$", 2, "writes value 2"),
    "a node kind changed": (r"xnodes\[1\]\.xnode_union_type$", 2 + 64, "node kind"),
    "a value kind changed": (r"xvalues\[3\]\.xvalue_union_type$", 3, "value kind"),
    "a datatype changed": (r"value 3\.datatype$", 33, "datatype"),
    "num_externs": (r"graph\.num_externs$", 4 | 1 << 8, "external values"),
    "flags of a value": (r"value 5\.flags$", 6, "flags"),
    "a reshape's rank": (r"node 0 \(XNNStaticReshape\)\.num_dims$", 3 + 16, "new shape"),
    "an offset into the flatbuffer": (r"graph\.xvalues$", 1 << 20, "outside the flatbuffer"),
    "a vtable": (r"xvalues\[3\] vtable offset$", 1 << 16, "outside the flatbuffer|vtable|table of"),
}


@pytest.mark.parametrize("case", AIMED)
def test_damaged_payload_is_refused(xnnpack_file, case):
    pattern, value, reason = AIMED[case]
    pte = PteFile.read(xnnpack_file[0])
    _, blob = _linear(pte)
    with pytest.raises(xp.PayloadError, match=reason):
        damaged = _with(blob, pattern, value)
        xp.read(damaged)  # by itself, or with the program around it
        payload = xp.read(damaged)
        xp.check_call(payload, [pte.plan.values[j].val for j in _call_args(pte, blob)])


def _call_args(pte: PteFile, blob: bytes) -> list[int]:
    index = next(i for i, b in _payloads(pte).items() if b == blob)
    return next(list(ins.instr_args.args) for ins in pte.plan.chains[0].instructions
                if getattr(ins.instr_args, "delegate_index", None) == index)


@pytest.mark.parametrize("change", ["magic", "header length", "flatbuffer size", "data size", "identifier",
                                    "padding"])
def test_damaged_header_is_refused(xnnpack_file, change):
    _, blob = _linear(PteFile.read(xnnpack_file[0]))
    b = bytearray(blob)
    _, _, _, fb_offset, fb_size, data_offset, _ = xp.HEADER.unpack_from(b)
    if change == "magic":
        b[5] ^= 1
    elif change == "header length":
        b[8] ^= 4
    elif change == "flatbuffer size":
        struct.pack_into("<I", b, 14, fb_size + 1024)
    elif change == "data size":
        struct.pack_into("<Q", b, 22, 1 << 40)
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
    at, _ = _field(blob, r"value 5\.external_id$")
    damaged = bytearray(data)
    damaged[start + at] = 9
    with pytest.raises(PteError, match=r"delegate \d \(XnnpackBackend\): external ids"):
        NativeProgram(bytes(damaged))  # refused before ExecuTorch's runtime (and any build) is reached


# -- the sweep -----------------------------------------------------------------------------------

# What no check sees in a payload (README): an output clamp moved to other finite values.
UNDETECTABLE = r"output_min_max|output_min|output_max"


def _sweep_cases(pte: PteFile) -> dict[str, str]:
    """Single-bit flips over both XNNPACK payloads, case -> the field it hits: one flip in
    every other field the reader reads (vtables, slots, offsets, ids, dims, lengths; the
    low bits of its first byte or of its last, in turn), and every byte of the header."""
    cases = {}
    for i, d in enumerate(pte.plan.delegates):
        if d.id != xp.BACKEND_ID:
            continue
        start = pte.segments[d.processed.index].start
        trace: list = []
        xp.read(pte.delegate_bytes(d), trace)
        fields = sorted({at: (width, what) for at, width, what in trace}.items())
        for k, (at, (width, what)) in enumerate(fields[::2]):
            offset = start + at + (width - 1 if k % 2 else 0)
            cases[f"flip {offset} {k % 3}"] = f"delegate {i} {what}"
        for at in range(xp.HEADER.size):
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
