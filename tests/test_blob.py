"""The delegate blob: round trips, refusals of truncated/foreign/newer/corrupt blobs, preprocess errors."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from pipeline import blob
from pipeline.blob import CONSTANT, INPUT, DelegateBlob, LayerNormParams, Operand, decode, encode


def make_blob(shape=(4, 3), weight=CONSTANT, bias=CONSTANT, outputs=(0, 1, 2), eps=1e-5) -> DelegateBlob:
    rng = np.random.default_rng(0)
    next_index = iter(range(1, 3))
    operands = {r: Operand(s, next(next_index) if s == INPUT else None) for r, s in (("weight", weight), ("bias", bias))}
    constants = {r: rng.standard_normal(shape).astype(np.float32) for r, op in operands.items() if op.source == CONSTANT}
    arguments = 1 + sum(op.source == INPUT for op in operands.values())
    params = LayerNormParams(shape, eps, 0, operands["weight"], operands["bias"], outputs, arguments)
    return DelegateBlob(params, constants)


@pytest.mark.parametrize("weight", [blob.NONE, CONSTANT, INPUT])
@pytest.mark.parametrize("bias", [blob.NONE, CONSTANT, INPUT])
def test_round_trip_every_operand_source(weight, bias):
    original = make_blob(weight=weight, bias=bias)
    decoded = decode(encode(original))
    assert decoded.params == original.params
    assert decoded.constants.keys() == original.constants.keys()
    for role, arr in original.constants.items():
        np.testing.assert_array_equal(decoded.constants[role], arr)
        assert decoded.constants[role].dtype == np.float32


def test_round_trip_dynamic_dims_and_extra_arguments():
    params = LayerNormParams((blob.DYNAMIC, 4), 1e-5, input_index=1, outputs=(0, 1, 2), arguments=2)
    decoded = decode(encode(DelegateBlob(params)))
    assert decoded.params == params
    assert decoded.params.resolve((3, 7, 4)) == (7, 4)
    with pytest.raises(ValueError, match="does not end in normalized_shape"):
        decoded.params.resolve((3, 7, 5))


def test_dynamic_dims_refuse_weight_and_bias():
    with pytest.raises(ValueError, match="without weight and bias"):
        LayerNormParams((blob.DYNAMIC,), 1e-5, weight=Operand(INPUT, 1), arguments=2)


@pytest.mark.parametrize("shape, eps, outputs", [((1,), 1e-12, (0,)), ((7,), 1 / 3, (2, 0)), ((2, 3, 5), 0.0, (1,))])
def test_round_trip_shapes_eps_and_outputs(shape, eps, outputs):
    original = make_blob(shape=shape, eps=eps, outputs=outputs)
    decoded = decode(encode(original))
    assert decoded.params == original.params and decoded.params.eps == eps  # exact, not rounded
    assert decoded.constants["weight"].shape == shape


def test_header_is_little_endian_and_aligned():
    data = encode(make_blob())
    assert data[:4] == blob.MAGIC
    assert struct.unpack_from("<H", data, 4)[0] == blob.VERSION
    header = blob.Header.unpack(data)
    assert header.total_size == len(data) and header.data_offset % blob.ALIGN == 0


def test_truncated_blobs_are_refused():
    data = encode(make_blob())
    for cut in range(len(data)):
        with pytest.raises(ValueError, match="truncated"):
            decode(data[:cut])


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_foreign_newer_and_big_endian_blobs_are_refused():
    data = encode(make_blob())
    with pytest.raises(ValueError, match="not a WebGPU delegate blob"):
        decode(b"XNNP" + data[4:])
    with pytest.raises(ValueError, match="newer"):
        decode(patch(data, 4, "<H", blob.VERSION + 1))
    with pytest.raises(ValueError, match="little-endian"):
        decode(patch(data, 8, ">I", blob.BYTE_ORDER_MARK))
    with pytest.raises(TypeError, match="blob must be bytes"):
        decode("WGLN")


def rewrite_params(data: bytes, edit) -> bytes:
    """Re-encode with the params JSON edited (offsets recomputed by a fresh header)."""
    header = blob.Header.unpack(data)
    doc = json.loads(data[header.params_offset : header.params_offset + header.params_size])
    edit(doc)
    params = json.dumps(doc).encode()
    consts = data[header.data_offset : header.data_offset + header.data_size]
    data_offset = (blob.HEADER.size + len(params) + 15) // 16 * 16
    new = blob.Header(blob.VERSION, blob.HEADER.size, len(params), data_offset, len(consts), data_offset + len(consts))
    return new.pack() + params + bytes(data_offset - blob.HEADER.size - len(params)) + consts


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(op="conv"), "op is not native_layer_norm"),
        (lambda d: d.pop("eps"), "params corrupt"),
        (lambda d: d.update(normalized_shape=[0, 3]), "normalized_shape"),
        (lambda d: d.update(outputs=[3]), "outputs"),
        (lambda d: d["weight"].update(source="input", index=4), "argument indices"),
        (lambda d: d["constants"]["bias"].update(offset=10_000), "does not fit"),
        (lambda d: d["constants"].pop("bias"), "bias"),
        (lambda d: d.update(constants=[1]), "not a table"),
        (lambda d: d["constants"].update(gamma=d["constants"]["bias"]), "unknown constants"),
    ],
)
def test_corrupt_params_are_refused(edit, message):
    with pytest.raises(ValueError, match=message):
        decode(rewrite_params(encode(make_blob()), edit))


def test_garbage_params_are_refused():
    data = bytearray(encode(make_blob()))
    data[blob.HEADER.size] = 0xFF
    with pytest.raises(ValueError, match="params corrupt"):
        decode(bytes(data))


def test_section_outside_the_blob_is_refused():
    data = encode(make_blob())
    with pytest.raises(ValueError, match="outside the blob"):
        decode(patch(data, 20, "<I", len(data)))


def test_blob_and_delegate_runner_do_not_import_executorch():
    code = (
        "import sys, pipeline.blob, pipeline.runtime.delegate; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('executorch', 'transformers')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_delegate_runner_refuses_bad_blobs_and_arguments(gpu_info):
    from pipeline.runtime.delegate import LayerNormDelegate

    with pytest.raises(ValueError, match="truncated"):
        LayerNormDelegate(encode(make_blob())[:40])
    original = make_blob(shape=(6,), weight=INPUT, bias=CONSTANT, outputs=(0, 2))
    delegate = LayerNormDelegate(encode(original))
    x, w = torch.randn(3, 6), torch.randn(6)
    out, rstd = delegate(x, w)
    bias = torch.from_numpy(original.constants["bias"])
    want = torch.ops.aten.native_layer_norm.default(x, [6], w, bias, 1e-5)
    torch.testing.assert_close(out, want[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(rstd, want[2], atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="expects 2 inputs"):
        delegate(x)


def edge_program(module, *inputs):
    from executorch.exir import to_edge

    return to_edge(torch.export.export(module.eval(), inputs)).exported_program()


class TwoNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.LayerNorm(4), nn.LayerNorm(4)

    def forward(self, x):
        return self.b(self.a(x) + 1)


def test_preprocess_raises_on_what_it_cannot_serialize():
    from pipeline.backend import WebGPUBackend

    with pytest.raises(ValueError, match="exactly one native_layer_norm, got 2"):
        WebGPUBackend.preprocess(edge_program(TwoNorms(), torch.randn(2, 4)), [])
    with pytest.raises(ValueError, match="exactly one native_layer_norm, got 0"):
        WebGPUBackend.preprocess(edge_program(nn.ReLU(), torch.randn(2, 4)), [])
    with pytest.raises(ValueError, match="cannot serialize node"):
        WebGPUBackend.preprocess(edge_program(nn.Sequential(nn.LayerNorm(4), nn.ReLU()), torch.randn(2, 4)), [])


def test_preprocess_serializes_a_single_layer_norm():
    from pipeline.backend.webgpu import describe_partition

    model = nn.LayerNorm((2, 3), eps=1e-6)
    with torch.no_grad():
        model.weight.normal_()
    described = describe_partition(edge_program(model, torch.randn(5, 2, 3)))
    assert described.params.normalized_shape == (2, 3) and described.params.eps == 1e-6
    assert described.params.weight.source == CONSTANT and described.params.outputs == (0,)
    np.testing.assert_array_equal(described.constants["weight"], model.weight.detach().numpy())
