"""The delegate blob: round trips, refusals of truncated/foreign/newer/corrupt blobs, preprocess errors."""

import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from pipeline import blob
from pipeline.blob import CONSTANT, INPUT, DelegateBlob, LayerNormParams, Operand, decode, encode


def make_blob(shape=(4, 3), weight=CONSTANT, bias=CONSTANT, outputs=(0, 1, 2), eps=1e-5, dtype="float32",
              affine_dtype=None, op="native_layer_norm") -> DelegateBlob:
    rng = np.random.default_rng(0)
    next_index = iter(range(1, 3))
    operands = {r: Operand(s, next(next_index) if s == INPUT else None) for r, s in (("weight", weight), ("bias", bias))}
    params = LayerNormParams(shape, eps, 0, operands["weight"], operands["bias"], outputs,
                             1 + sum(o.source == INPUT for o in operands.values()), dtype, affine_dtype, op)
    values = {r: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for r in operands}
    constants = {r: _stored(values[r], params.affine_dtype) for r, o in operands.items() if o.source == CONSTANT}
    return DelegateBlob(params, constants)


def _stored(t: torch.Tensor, dtype: str) -> np.ndarray:
    """`t` as the blob holds a constant of `dtype` (bfloat16 as its bits)."""
    if dtype == "bfloat16":
        return t.bfloat16().view(torch.int16).numpy().view(np.uint16)
    return t.to(getattr(torch, dtype)).numpy()


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


@pytest.mark.parametrize("dtype, affine_dtype", [("float16", None), ("bfloat16", None), ("float16", "float32"),
                                                 ("bfloat16", "float32")])
@pytest.mark.parametrize("shape", [(3,), (4, 3), (8,)])
def test_round_trip_half_dtypes(dtype, affine_dtype, shape):
    original = make_blob(shape=shape, dtype=dtype, affine_dtype=affine_dtype)
    data = encode(original)
    decoded = decode(data)
    assert decoded.params == original.params
    assert decoded.params.affine_dtype == (affine_dtype or dtype)
    codes = {"float32": 0, "float16": 1, "bfloat16": 2}
    assert struct.unpack_from("<I", data, 44)[0] == codes[dtype]
    assert struct.unpack_from("<I", data, 100)[0] == codes[affine_dtype or dtype]
    itemsize = 4 if affine_dtype == "float32" else 2
    assert struct.unpack_from("<I", data, 24)[0] == 2 * ((np.prod(shape) * itemsize + 15) // 16 * 16)
    for role, arr in original.constants.items():
        assert decoded.constants[role].dtype == blob.CONSTANT_ARRAYS[decoded.params.affine_dtype]
        np.testing.assert_array_equal(decoded.constants[role], arr)


@pytest.mark.parametrize("dtype, affine_dtype, message", [
    ("float64", None, "dtype must be one of"),
    ("float32", "float16", "affine_dtype must be float32"),
    ("float16", "bfloat16", "affine_dtype must be float16 or float32"),
])
def test_params_refuse_dtypes_aten_refuses(dtype, affine_dtype, message):
    with pytest.raises(ValueError, match=message):
        LayerNormParams((4,), 1e-5, weight=Operand(CONSTANT), dtype=dtype, affine_dtype=affine_dtype)
    with pytest.raises(ValueError, match="affine_dtype must be float16 for dtype float16 without weight or bias"):
        LayerNormParams((4,), 1e-5, dtype="float16", affine_dtype="float32")


def test_constants_must_be_held_in_the_affine_dtype():
    half = make_blob(shape=(4,), dtype="float16")
    with pytest.raises(ValueError, match="weight constant must be float16"):
        DelegateBlob(half.params, {r: a.astype(np.float32) for r, a in half.constants.items()})


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


@pytest.mark.parametrize("eps", [-0.5, -0.0, float("inf"), float("-inf"), float("nan"), -1e300, 5e-324])
def test_every_eps_aten_takes_round_trips_bit_for_bit(eps):
    decoded = decode(encode(make_blob(eps=eps)))
    assert struct.pack("<d", decoded.params.eps) == struct.pack("<d", eps)


def test_layout_matches_format_version_4():
    data = encode(make_blob(shape=(1, 3)))
    magic, version, header_size, bom, p_off, p_size, d_off, d_size, total, crc, reserved = struct.unpack_from(
        "<4sHHIIIIIIII", data
    )
    assert (magic, version, header_size, bom, reserved) == (b"WGLN", 4, 40, 0x01020304, 0)
    assert (p_off, p_size, d_off, d_size, total) == (40, 64 + 8 * 2, 128, 16 + 16, 160) and total == len(data)
    assert crc == zlib.crc32(data[40:])
    op, dtype, eps, input_index, arguments, *rest = struct.unpack_from("<IIdIIIIIIIIIIII", data, 40)
    assert (op, dtype, eps, input_index, arguments) == (1, 0, 1e-5, 0, 1)
    assert rest == [1, 0, 1, 0, 3, 0, 1, 2, 2, 0]  # weight, bias, outputs, ndim, affine dtype
    assert struct.unpack_from("<qq", data, 104) == (1, 3)
    assert data[120:128] == bytes(8) and data[140:144] == bytes(4) and data[156:160] == bytes(4)


def test_truncated_and_extended_blobs_are_refused():
    data = encode(make_blob())
    for cut in range(len(data)):
        with pytest.raises(ValueError, match="truncated"):
            decode(data[:cut])
    with pytest.raises(ValueError, match="total_size"):
        decode(data + bytes(16))


def test_every_single_bit_flip_is_refused():
    data = encode(make_blob(shape=(1, 3)))  # header, params, params padding, two padded constants
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ValueError, match="delegate blob"):
            decode(bytes(flipped))


def patch(data: bytes, offset: int, fmt: str, value, reseal: bool = True) -> bytes:
    """`data` with one field rewritten and, unless `reseal` is False, its checksum made to match."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    if reseal:
        struct.pack_into("<I", out, 32, zlib.crc32(out[40:]))
    return bytes(out)


def old_version_1_blob() -> bytes:
    params = b'{"op": "native_layer_norm", "normalized_shape": [4], "eps": "1e-05"}'
    total = 32 + len(params)
    return struct.pack("<4sHHIIIIII", b"WGLN", 1, 32, 0x01020304, 32, len(params), total, 0, total) + params


def test_older_newer_foreign_and_big_endian_blobs_are_refused():
    data = encode(make_blob())
    for older in (old_version_1_blob(), old_version_1_blob()[:8], patch(data, 4, "<H", 1)):
        with pytest.raises(ValueError, match=r"version 1 is older than this runtime's 4 \(it reads 3 and up\): "
                                             "re-export the model"):
            decode(older)
    # A float32 blob of format version 2 differs from version 3's only in that field.
    with pytest.raises(ValueError, match="version 2 is older than this runtime's 4"):
        decode(patch(data, 4, "<H", 2))
    for newer in (patch(data, 4, "<H", 5), patch(data, 4, "<H", 5)[:12] + bytes(100)):
        with pytest.raises(ValueError, match="version 5 is newer than this runtime's 4"):
            decode(newer)
    with pytest.raises(ValueError, match="not a WebGPU delegate blob"):
        decode(b"XNNP" + data[4:])
    with pytest.raises(ValueError, match="bom .* not little-endian"):
        decode(patch(data, 8, ">I", blob.BYTE_ORDER_MARK))
    with pytest.raises(TypeError, match="blob must be bytes"):
        decode("WGLN")


def test_version_3_files_still_load_and_hold_layer_norms_only():
    # Version 3 is version 4 with op 1 alone; the version lies in the header, outside the CRC.
    data = encode(make_blob())
    old, new = decode(patch(data, 4, "<H", 3)), decode(data)
    assert old.params == new.params and all(np.array_equal(old.constants[r], new.constants[r]) for r in new.constants)
    rms = encode(make_blob(bias=blob.NONE, outputs=(0,), op="rms_norm"))
    with pytest.raises(ValueError, match="op 2, expected 1 \\(native_layer_norm\\) in version 3"):
        decode(patch(rms, 4, "<H", 3))


def test_rms_norm_blobs_round_trip_with_weight_alone_and_out_alone():
    for weight in (CONSTANT, INPUT, blob.NONE):
        made = make_blob(weight=weight, bias=blob.NONE, outputs=(0,), op="rms_norm", dtype="bfloat16",
                         affine_dtype="float32" if weight != blob.NONE else None)
        decoded = decode(encode(made))
        assert decoded.params == made.params and decoded.params.op == "rms_norm"
        assert struct.unpack_from("<I", encode(made), P)[0] == blob.OP_RMS_NORM
    with pytest.raises(ValueError, match="an rms_norm has no bias and returns out alone"):
        make_blob(op="rms_norm", outputs=(0,))
    with pytest.raises(ValueError, match="an rms_norm has no bias and returns out alone"):
        make_blob(bias=blob.NONE, op="rms_norm", outputs=(0, 2))


P = 40  # where the params start
BASE = make_blob(shape=(1, 3))  # constant weight and bias, outputs (0, 1, 2)
INPUTS = make_blob(shape=(1, 3), weight=INPUT, bias=INPUT, outputs=(0,))  # arguments 3, indices 1 and 2
BARE = make_blob(shape=(1, 3), weight=blob.NONE, bias=blob.NONE, outputs=(1,))
HALF = make_blob(shape=(1, 3), dtype="float16")  # float16 x, weight and bias


@pytest.mark.parametrize(
    "base, offset, fmt, value, message",
    [
        (BASE, 6, "<H", 32, "header_size 32"),
        (BASE, 12, "<I", 48, "params_offset 48"),
        (BASE, 16, "<I", 64 + 8 * 3, "params_size 88"),
        (BASE, 20, "<I", 112, "data_offset 112"),  # back into the params
        (BASE, 20, "<I", 144, "data_offset 144"),
        (BASE, 24, "<I", 16, "data_size 16"),
        (BASE, 28, "<I", 144, "total_size says 144"),
        (BASE, 36, "<I", 1, "reserved"),
        (BASE, P + 0, "<I", 3, "op 3"),
        (BASE, P + 0, "<I", 2, "an rms_norm has no bias"),
        (BASE, P + 4, "<I", 3, "dtype 3"),
        (BARE, P + 4, "<I", 1, "affine_dtype must be float16"),  # neither weight nor bias: x's dtype
        (HALF, P + 4, "<I", 0, "affine_dtype must be float32"),  # float32 x with float16 weight
        (HALF, P + 4, "<I", 2, "affine_dtype must be"),  # bfloat16 x with float16 weight
        (BASE, P + 16, "<I", 1, "input_index"),
        (BASE, P + 20, "<I", 0, "arguments"),
        (BASE, P + 24, "<I", 3, "weight_source 3"),
        (BASE, P + 28, "<I", 1, "weight_index 1"),
        (BASE, P + 32, "<I", 7, "bias_source 7"),
        (BASE, P + 36, "<I", 2, "bias_index 2"),
        (BASE, P + 40, "<I", 0, "n_outputs 0"),
        (BASE, P + 40, "<I", 4, "n_outputs 4"),
        (BASE, P + 44, "<I", 3, "outputs"),
        (INPUTS, P + 48, "<I", 1, "outputs"),  # an unused entry not 0
        (BASE, P + 56, "<I", 0, "ndim 0"),
        (BASE, P + 56, "<I", 17, "ndim 17"),
        (BASE, P + 60, "<I", 1, "affine_dtype must be float32"),
        (BASE, P + 60, "<I", 3, "affine_dtype 3"),
        (BASE, P + 64, "<q", 0, "dims"),
        (BASE, P + 64, "<q", -2, "dims"),
        (BASE, P + 64, "<q", -1, "dynamic dim"),  # with constants
        (INPUTS, P + 64, "<q", -1, "dynamic dim"),  # with input weight and bias
        (BARE, P + 64, "<q", 2**30, "does not fit in u32"),
        (BARE, P + 64, "<q", 2**62, "does not fit in u32"),
        (INPUTS, P + 28, "<I", 0, "distinct"),  # weight_index == input_index
        (INPUTS, P + 36, "<I", 1, "distinct"),  # bias_index == weight_index
        (INPUTS, P + 36, "<I", 3, "below arguments 3"),
        (INPUTS, P + 28, "<I", 2**32 - 1, "below arguments 3"),
        (BASE, 120, "<Q", 1, "padding after the params"),
        (BASE, 140, "<I", 1, "padding after the weight"),
        (BASE, 156, "<I", 1, "padding after the bias"),
    ],
)
def test_every_rule_is_refused_naming_the_field(base, offset, fmt, value, message):
    data = encode(base)
    decode(data)
    with pytest.raises(ValueError, match=message):
        decode(patch(data, offset, fmt, value))


def test_checksum_mismatch_is_refused():
    data = encode(make_blob())
    crc = struct.unpack_from("<I", data, 32)[0]
    with pytest.raises(ValueError, match="checksum"):
        decode(patch(data, 32, "<I", crc ^ 1, reseal=False))


def test_garbage_params_are_value_errors():
    rng = np.random.default_rng(0)
    data = encode(make_blob(shape=(2, 3, 4)))
    for trial in range(3000):
        garbage = bytearray(data)
        garbage[P : P + 96] = rng.integers(0, 256, 96, dtype=np.uint8).tobytes()
        if trial % 2:  # keep the counts in range, to reach the later rules
            struct.pack_into("<II", garbage, P + 40, 1 + trial % 3, 0)
            struct.pack_into("<I", garbage, P + 56, 3)
        with pytest.raises(ValueError, match="delegate blob|eps|input_index|arguments|dims|indices|outputs"):
            decode(patch(bytes(garbage), 0, "4s", b"WGLN"))


def test_encode_refuses_params_the_format_cannot_hold():
    with pytest.raises(ValueError, match="dims"):
        LayerNormParams((1,) * 17, 1e-5)
    with pytest.raises(ValueError, match="does not fit in u32"):
        LayerNormParams((2**31,), 1e-5)
    with pytest.raises(ValueError, match="operand index"):
        Operand(INPUT, 2**32)
    with pytest.raises(ValueError, match="eps must be a float"):
        LayerNormParams((4,), 1)
    with pytest.raises(ValueError, match="arguments"):
        LayerNormParams((4,), 1e-5, arguments=2**32)


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


@pytest.mark.parametrize("native", [True, False], ids=["native-call", "python-launch"])
def test_a_delegate_returning_out_alone_has_the_kernel_store_no_mean_and_rstd(gpu_info, monkeypatch, native):
    from pipeline.runtime import delegate as delegate_module
    from pipeline.runtime import native_call

    launched = []
    if native:
        real = native_call.NativeCall.__call__
        monkeypatch.setattr(native_call.NativeCall, "__call__",
                            lambda self, *a: launched.append(a[-2] is not None) or real(self, *a))
    else:
        monkeypatch.setenv(native_call.NATIVE_CALL_ENV, "0")
        real = delegate_module.native_layer_norm
        monkeypatch.setattr(delegate_module, "native_layer_norm",
                            lambda *a, **k: launched.append(k["stats"]) or real(*a, **k))
    x = torch.randn(3, 6)
    for outputs, stats in (((0,), False), ((0, 1), True), ((2,), True)):
        original = make_blob(shape=(6,), outputs=outputs)
        got = delegate_module.LayerNormDelegate(encode(original))(x)
        w, b = (torch.from_numpy(original.constants[r]) for r in ("weight", "bias"))
        want = torch.ops.aten.native_layer_norm.default(x, [6], w, b, 1e-5)
        for value, i in zip(got, outputs):
            torch.testing.assert_close(value, want[i], atol=2e-5, rtol=1e-5)
        assert launched[-1] is stats


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
    from pipeline.aot.preprocess import WebGPUBackend

    with pytest.raises(ValueError, match="exactly one native_layer_norm or rms_norm, got 2"):
        WebGPUBackend.preprocess(edge_program(TwoNorms(), torch.randn(2, 4)), [])
    with pytest.raises(ValueError, match="exactly one native_layer_norm or rms_norm, got 0"):
        WebGPUBackend.preprocess(edge_program(nn.ReLU(), torch.randn(2, 4)), [])
    with pytest.raises(ValueError, match="cannot serialize node"):
        WebGPUBackend.preprocess(edge_program(nn.Sequential(nn.LayerNorm(4), nn.ReLU()), torch.randn(2, 4)), [])


def test_preprocess_serializes_a_single_layer_norm():
    from pipeline.aot.preprocess import describe_partition

    model = nn.LayerNorm((2, 3), eps=1e-6)
    with torch.no_grad():
        model.weight.normal_()
    described = describe_partition(edge_program(model, torch.randn(5, 2, 3)))
    assert described.params.normalized_shape == (2, 3) and described.params.eps == 1e-6
    assert described.params.weight.source == CONSTANT and described.params.outputs == (0,)
    np.testing.assert_array_equal(described.constants["weight"], model.weight.detach().numpy())


def test_blob_names_the_backend_and_dtypes_the_kernel_has():
    from pipeline import wgsl
    from pipeline.aot.preprocess import WebGPUBackend

    assert WebGPUBackend.__name__ == blob.BACKEND_ID
    assert tuple(blob.DTYPE_CODES) == wgsl.DTYPES
