"""CTranslate2 Whisper directories: read as the whole Whisper model, every weight
where the Hugging Face model has it; int8/int16 dequantized; anything else refused by name with
bounded memory. The files are tiny models these tests write (tests/support/ctranslate2_files)."""

import os
import struct
import tracemalloc

import pytest
import torch

from pipeline import models
from pipeline.models import CheckpointError, ctranslate2
from pipeline.models import checkpoint as checkpoint_reader
from pipeline.models.ctranslate2 import holds_ctranslate2, load_state, read_ctranslate2, whole_model
from support.ctranslate2_files import (
    convert,
    ct2_variables,
    model_bin,
    string,
    tiny_whisper,
    variable_bytes,
    write_ct2,
    write_side_files,
)
from support.lowering import lower_and_compare
from support.waits import within


@pytest.fixture(scope="module")
def model():
    return tiny_whisper()


@pytest.fixture
def write(model, tmp_path):
    """write(variables=None, aliases=None, **model_bin args) -> a directory holding them."""
    def make(variables=None, aliases=None, data: bytes | None = None, **kwargs):
        directory = tmp_path / "ct2"
        directory.mkdir(exist_ok=True)
        if data is None:
            base, base_aliases = ct2_variables(model)
            data = model_bin(base if variables is None else variables,
                             base_aliases if aliases is None else aliases, **kwargs)
        (directory / "model.bin").write_bytes(data)
        write_side_files(directory, model.config.vocab_size)
        return directory
    return make


def refused(directory, pattern: str) -> str:
    with pytest.raises(CheckpointError, match=pattern) as info:
        read_ctranslate2(directory)
    message = str(info.value)
    assert message.startswith(f"checkpoint {directory}: "), message
    return message


def held(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


# --- what is read --------------------------------------------------------------------------

def test_float32_round_trip_is_the_model_bit_for_bit(model, tmp_path):
    directory = write_ct2(tmp_path / "m", model)
    assert holds_ctranslate2(directory)
    checkpoint = read_ctranslate2(directory)
    assert checkpoint.weights == "float32"
    state = load_state(checkpoint)
    want = held(model)
    assert state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)
    loaded = whole_model(checkpoint)
    assert loaded.config.tie_word_embeddings and loaded.proj_out.weight is loaded.model.decoder.embed_tokens.weight
    mel = torch.randn(1, 8, 3000)
    ids = torch.tensor([[1, 2, 5]])
    with torch.no_grad():
        assert torch.equal(loaded(input_features=mel, decoder_input_ids=ids).logits,
                           model(input_features=mel, decoder_input_ids=ids).logits)
    assert checkpoint.tokens[:2] == ("<|endoftext|>", "<|startoftranscript|>")
    assert (checkpoint.config.eos_token_id, checkpoint.config.decoder_start_token_id) == (0, 1)
    assert checkpoint.config.suppress_tokens == [2] and checkpoint.alignment_heads == ((0, 1),)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_weights_are_read_as_stored(model, tmp_path, dtype):
    checkpoint = read_ctranslate2(write_ct2(tmp_path / "m", model, dtype))
    assert checkpoint.weights == str(dtype).removeprefix("torch.")
    state = load_state(checkpoint)
    assert all(torch.equal(state[k], v.to(dtype).float()) for k, v in held(model).items())


@pytest.mark.parametrize("quantize", ["int8", "int16"])
def test_quantized_weights_are_dequantized_and_said_so(model, tmp_path, quantize):
    checkpoint = read_ctranslate2(write_ct2(tmp_path / "m", model, torch.float16, quantize))
    assert checkpoint.weights == f"dequantized {quantize}, float16"
    assert "dequantized" in checkpoint.description
    state = load_state(checkpoint)
    stored = convert(ct2_variables(model)[0], torch.float16, quantize)
    q, scale = stored["encoder/conv1/weight"], stored["encoder/conv1/weight_scale"]
    rows = scale[:, None, None] if quantize == "int8" else scale
    assert torch.equal(state["model.encoder.conv1.weight"], q.float() / rows)
    for key, want in held(model).items():
        step = 1 / 127 if quantize == "int8" else 2.0**-10
        assert (state[key] - want).abs().max() <= want.abs().max() * step, key
    spec = models.build("whisper", checkpoint=checkpoint.directory)
    assert spec.checkpoint_weights == f"dequantized {quantize}, float16"


def test_build_loads_the_encoder_and_lowers_with_every_layer_norm_delegated(model, tmp_path):
    directory = write_ct2(tmp_path / "m", model, torch.float16)
    spec = models.build("whisper", checkpoint=directory)
    assert (spec.variant, spec.checkpoint_format, spec.checkpoint_weights) == ("custom", "ctranslate2", "float16")
    assert spec.checkpoint == str(directory.resolve()) and spec.checkpoint_sha256 == read_ctranslate2(directory).sha256
    encoder = model.model.encoder
    with torch.no_grad():
        half = {k: v.to(torch.float16).float() for k, v in encoder.state_dict().items()}
        assert all(torch.equal(spec.module.encoder.state_dict()[k], v) for k, v in half.items())
    lower_and_compare(spec.module, spec.example_inputs, layer_norms=3)


def test_links_inside_the_directory_are_followed_and_links_out_refused(model, tmp_path):
    directory = write_ct2(tmp_path / "m", model)
    (directory / "blobs").mkdir()
    (directory / "model.bin").rename(directory / "blobs" / "weights")
    (directory / "model.bin").symlink_to("blobs/weights")
    assert torch.equal(load_state(read_ctranslate2(directory))["model.encoder.conv1.bias"],
                       model.model.encoder.conv1.bias.detach())
    (directory / "vocabulary.txt").rename(tmp_path / "vocabulary.txt")
    (directory / "vocabulary.txt").symlink_to(tmp_path / "vocabulary.txt")
    refused(directory, "vocabulary.txt lies outside the checkpoint directory")


def test_a_changed_checkpoint_is_refused(model, tmp_path):
    directory = write_ct2(tmp_path / "m", model)
    digest = models.build("whisper", checkpoint=directory).checkpoint_sha256
    models.build("whisper", checkpoint=directory, checkpoint_sha256=digest)
    (directory / "vocabulary.txt").write_text((directory / "vocabulary.txt").read_text().replace("t8", "t9x"))
    with pytest.raises(CheckpointError, match="sha256 .* not .* as the export recorded"):
        models.build("whisper", checkpoint=directory, checkpoint_sha256=digest)


def test_config_and_vocabulary_are_hashed_from_the_bytes_parsed(model, tmp_path, monkeypatch):
    # Each is read once: what the digest covers is what was parsed, even if the file changes
    # between the two (here a reader that sees one more space than the disk holds).
    directory = write_ct2(tmp_path / "m", model)
    on_disk = read_ctranslate2(directory)
    assert on_disk.sha256 == checkpoint_reader.files_sha256(on_disk.directory, on_disk.files)
    read = checkpoint_reader.read_small_file
    reads = []

    def spaced(path, where):
        reads.append(path.name)
        return read(path, where) + b" " if path.name == "config.json" else read(path, where)

    for module in (checkpoint_reader, ctranslate2):  # config.json through checkpoint.read_config
        monkeypatch.setattr(module, "read_small_file", spaced)
    parsed = read_ctranslate2(directory)
    assert sorted(reads) == ["config.json", "vocabulary.txt"]
    assert parsed.sha256 != on_disk.sha256
    config = parsed.directory / "config.json"
    held = {config: config.read_bytes() + b" "}
    assert parsed.sha256 == checkpoint_reader.files_sha256(parsed.directory, parsed.files, held)


def test_the_english_only_variant_is_told_from_the_multilingual_one():
    family = models.family("whisper")
    for name in ("tiny", "base", "small", "medium"):
        english, multilingual = (models.embedded_config("whisper", v) for v in (f"{name}.en", name))
        assert english.vocab_size == 51864 and multilingual.vocab_size == 51865
        assert models._matching_variant(family, english) == f"{name}.en"
        assert models._matching_variant(family, multilingual) == name


def test_other_families_refuse_a_ctranslate2_directory(model, tmp_path):
    directory = write_ct2(tmp_path / "m", model)
    with pytest.raises(CheckpointError, match="only whisper is read in that format"):
        models.build("bart", checkpoint=directory)


# --- what is refused -----------------------------------------------------------------------

def test_another_spec_version_or_revision_is_refused(write):
    refused(write(spec="TransformerSpec"), "holds a TransformerSpec model, not a WhisperSpec")
    refused(write(version=5), "binary version 5")
    refused(write(revision=4), "WhisperSpec revision 4")


def test_unknown_missing_and_misshapen_variables_are_refused(model, write):
    variables, aliases = ct2_variables(model)
    refused(write({**variables, "decoder/layer_0/ffn/linear_2/weight": torch.zeros(2, 2)}),
            "unknown variable decoder/layer_0/ffn/linear_2/weight")
    refused(write(aliases={**aliases, "encoder/extra": "encoder/conv1/bias"}), "unknown variable encoder/extra")
    refused(write({k: v for k, v in variables.items() if k != "decoder/layer_0/attention/linear_2/bias"}),
            "missing variable decoder/layer_0/attention/linear_2/bias")
    refused(write(aliases={}), "missing variable decoder/projection/weight")
    refused(write({**variables, "encoder/layer_0/ffn/linear_1/weight": torch.zeros(16, 8)}),
            r"encoder/layer_0/ffn/linear_1/weight has shape \[16, 8\], .* needs \[8, 16\]")
    refused(write({**variables, "decoder/layer_0/attention/linear_1/weight": torch.zeros(24, 8)}),
            r"attention/linear_1/weight has shape \[24, 8\], .* needs \[16, 8\]")
    refused(write({**variables, "decoder/activation": torch.tensor(0, dtype=torch.int8)}),
            "decoder/activation is 0; Whisper's is GELU")
    refused(write({**variables, "decoder/scale_embeddings": torch.tensor(1, dtype=torch.int8)}),
            "decoder/scale_embeddings is 1")
    refused(write({**variables, "encoder/num_heads": torch.tensor(3, dtype=torch.int16)}),
            "encoder/num_heads is 3; it must divide d_model")


@pytest.mark.parametrize("name,part", [("encoder/layer_0/self_attention/linear_0/bias", slice(8, 16)),
                                       ("decoder/layer_0/self_attention/linear_0/bias", slice(8, 16)),
                                       ("decoder/layer_0/attention/linear_1/bias", slice(0, 8))])
def test_a_nonzero_k_bias_is_refused(model, write, name, part):
    variables, _ = ct2_variables(model)
    bias = variables[name].clone()
    bias[part.start + 3] = 0.5
    checkpoint = read_ctranslate2(write({**variables, name: bias}))
    with pytest.raises(CheckpointError, match=f"{name} holds a nonzero k part .* no bias"):
        load_state(checkpoint, ["model.encoder.conv1.weight"])


def test_dtypes_that_are_not_read_and_bad_scales_are_refused(model, write):
    variables, _ = ct2_variables(model)
    int8 = convert(variables, quantize="int8")
    name = "encoder/layer_0/ffn/linear_0/weight"
    refused(write({**variables, name: variables[name].to(torch.int32)}), f"{name} is int32")
    refused(write({k: v for k, v in int8.items() if k != f"{name}_scale"}), f"missing variable {name}_scale")
    refused(write({**int8, f"{name}_scale": torch.ones(3)}), rf"{name}_scale is a float32 tensor of shape \[3\]")
    refused(write({**variables, f"{name}_scale": torch.ones(16)}), f"unknown variable {name}_scale")


def test_the_vocabulary_and_config_are_checked(model, write):
    directory = write()
    (directory / "vocabulary.txt").write_text("a\nb\n")
    refused(directory, "vocabulary.txt holds 2 tokens, the model's embedding 12")
    (directory / "vocabulary.txt").unlink()
    refused(directory, "no vocabulary.json or vocabulary.txt")
    directory = write()
    (directory / "config.json").write_text('{"suppress_ids": [99]}')
    refused(directory, "config.json: suppress_ids must be a list of token ids from 0 to 11")


def header(count: int) -> bytes:
    return struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<II", 3, count)


@pytest.mark.parametrize("data,pattern", [
    (header(0xFFFFFFFF), "declares 4294967295 variables, more than"),
    (header(1) + string("a") + struct.pack("<B", 255) + b"\0" * 16, "a has rank 255"),
    (header(1) + string("a") + struct.pack("<B2IBI", 2, 65536, 65536, 0, 0), "declares 0 bytes for a float32"),
    (header(1) + string("a") + struct.pack("<B2IBI", 2, 65536, 8192, 0, 1 << 31) + b"\0" * 64,
     "truncated: a's data needs 2147483648 bytes"),
    (header(1) + struct.pack("<H", 65535) + b"x" * 100, "variable 0's name at byte 26 has a length of 65535"),
    (header(1) + string("a") + struct.pack("<B1IBI", 1, 1, 9, 4) + b"\0" * 4, "a has dtype id 9"),
    (header(1) + string("a") + struct.pack("<B1IBI", 1, 0, 0, 0), r"a has shape \[0\]: an empty tensor"),
    (header(0) + struct.pack("<I", 0xFFFFFFFF), "declares 4294967295 aliases"),
    (header(0) + struct.pack("<I", 1) + string("x") + string("y"), "alias x names y, which it does not hold"),
    (header(0) + struct.pack("<I", 0) + b"junk", "4 bytes follow its last alias"),
    (header(1) + struct.pack("<H", 3) + b"a\xffb" + b"\0" * 16, "variable 0's name at byte 28 is not a NUL-terminated string"),
])
def test_a_hostile_header_is_refused_before_anything_is_allocated(write, data, pattern):
    directory = write(data=data)
    tracemalloc.start()
    try:
        refused(directory, pattern)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_duplicated_variable_is_refused(model, write):
    variables, aliases = ct2_variables(model)
    data = model_bin(variables, aliases)
    # One more copy of the first variable, the count raised to match.
    name = min(variables)
    data = header(len(variables) + 1) + variable_bytes(name, variables[name]) + data[len(header(0)):]
    refused(write(data=data), f"{name} is declared twice")


def test_truncation_at_any_offset_is_refused(model, write):
    variables, aliases = ct2_variables(model)
    data = model_bin(convert(variables, torch.float16), aliases)
    # Every offset of the first 4 kB (the header and the first variables), then a spread.
    cuts = sorted({*range(0, 4096, 11), *range(4096, len(data), len(data) // 97 or 1), len(data) - 1})
    for cut in cuts:
        directory = write(data=data[:cut])
        # A count is held against the bytes left first: a cut after it says so.
        with pytest.raises(CheckpointError,
                           match=r"model.bin is truncated|model.bin: declares \d+ (variables|aliases), more than"):
            read_ctranslate2(directory)


def test_files_that_are_not_regular_are_refused_saying_what_they_are(write, tmp_path):
    directory = write()
    os.mkfifo(directory / "tokenizer.json")  # hashed with the rest: opened without waiting for a writer
    with within(20):
        refused(directory, r"tokenizer.json is not a regular file \(a named pipe\)")
    os.unlink(directory / "tokenizer.json")
    (directory / "tokenizer.json").mkdir()
    refused(directory, r"tokenizer.json is not a regular file \(a directory\)")
    os.rmdir(directory / "tokenizer.json")
    for make, kind in ((os.mkfifo, "a named pipe"), (os.mkdir, "a directory")):
        path = directory / "model.bin"
        path.unlink() if not path.is_dir() else path.rmdir()
        make(path)  # there, so not "no model.bin"
        with within(20):
            refused(directory, rf"model.bin is not a regular file \({kind}\)")


def test_aliases_do_not_make_a_matrix_serve_twice(model, write):
    variables, aliases = ct2_variables(model)
    # A second encoder layer built of the first one's variables: every name an alias.
    layer = {name.replace("layer_0", "layer_1"): name for name in variables if name.startswith("encoder/layer_0/")}
    refused(write(variables, {**aliases, **layer}),
            "encoder/layer_1/.* names encoder/layer_0/.*, which already serves as encoder/layer_0/")
    # The tied output projection is the one matrix that serves twice.
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    read_ctranslate2(write(variables, aliases))


def test_heads_and_positions_are_bounded_by_what_whisper_takes(model, write):
    variables, _ = ct2_variables(model)
    wide = {**variables, "encoder/conv1/weight": torch.zeros(64, 8, 3)}  # only the count matters here
    refused(write({**wide, "encoder/num_heads": torch.tensor(64, dtype=torch.int16)}),
            "encoder/num_heads is 64; at most 32 are read")
    positions = variables["encoder/position_encodings/encodings"][:1000]
    refused(write({**variables, "encoder/position_encodings/encodings": positions}),
            "encoder/position_encodings/encodings has 1000 rows; Whisper's encoder takes 1500 positions")


def test_a_config_error_is_raised_once_with_no_cause(write):
    directory = write()
    (directory / "config.json").write_text('{"suppress_ids_begin": [99]}')
    message = refused(directory, "config.json: suppress_ids_begin must be a list of token ids")
    assert "valid Whisper config" not in message


@pytest.mark.parametrize("name,change,pattern", [
    ("decoder/position_encodings/encodings", lambda v: None, "missing variable decoder/position_encodings/encodings"),
    ("encoder/layer_0/ffn/linear_0/weight", lambda v: v[None],
     r"encoder/layer_0/ffn/linear_0/weight has shape \[1, 16, 8\]; a Whisper model's has 2 dims"),
])
def test_a_variable_read_for_the_config_is_refused_once_with_no_cause(model, write, name, change, pattern):
    # Before: wrapped again as "its shapes make no valid Whisper config: checkpoint ...", the
    # first CheckpointError its cause.
    variables, _ = ct2_variables(model)
    changed = change(variables[name])
    directory = write({k: v for k, v in variables.items() if k != name} | ({} if changed is None else {name: changed}))
    with pytest.raises(CheckpointError, match=pattern) as info:
        read_ctranslate2(directory)
    assert str(info.value).count(f"checkpoint {directory}") == 1, info.value
    assert info.value.__cause__ is None


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf")])
def test_a_scale_that_is_zero_or_not_finite_is_refused_by_name(model, write, value):
    variables, aliases = ct2_variables(model)
    int8 = convert(variables, quantize="int8")
    name = "encoder/layer_0/ffn/linear_0/weight"
    scale = int8[f"{name}_scale"].clone()
    scale[3] = value
    checkpoint = read_ctranslate2(write({**int8, f"{name}_scale": scale}, aliases))
    with pytest.raises(CheckpointError, match=f"{name}_scale holds {value}: a int8 weight is divided by finite"):
        load_state(checkpoint)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_weight_that_is_not_finite_is_refused_by_name(model, write, value):
    variables, aliases = ct2_variables(model)
    name = "encoder/layer_0/ffn/linear_1/weight"
    weight = variables[name].clone()
    weight[0, 1] = value
    checkpoint = read_ctranslate2(write({**variables, name: weight.to(torch.float16)}, aliases))
    with pytest.raises(CheckpointError, match=f"{name} holds {value}: weights are finite"):
        load_state(checkpoint)


# --- the scripts ---------------------------------------------------------------------------

def test_the_accuracy_report_reads_a_ctranslate2_checkpoint_and_says_so(model, tmp_path, capsys):
    import json

    from pipeline.evaluation.runner import report_main

    directory = write_ct2(tmp_path / "m", model, torch.float32, "int8")
    out = tmp_path / "reports"
    assert report_main("accuracy", "", ["whisper", "--checkpoint", str(directory), "--output-dir", str(out)]) == 0
    data = json.loads((out / "whisper-custom.accuracy.json").read_text())
    assert data["weights"] == {"checkpoint": str(directory.resolve()), "sha256": read_ctranslate2(directory).sha256,
                               "format": "ctranslate2", "stored": "dequantized int8, float32"}
    assert "(ctranslate2, dequantized int8, float32 weights;" in (out / "whisper-custom.accuracy.md").read_text()
    with pytest.raises(SystemExit) as exit_info:
        report_main("accuracy", "", ["all", "--checkpoint", str(directory)])
    assert exit_info.value.code == 2
    assert "argument --checkpoint: for one model" in capsys.readouterr().err
