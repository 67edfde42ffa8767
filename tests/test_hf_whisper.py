"""Transcripts from a Hugging Face Whisper directory: the whole `WhisperForConditionalGeneration`
(save_pretrained, safetensors) with its tokenizer vocabulary (vocab.json + added_tokens.json, or
tokenizer.json) decodes like a CTranslate2 one; a damaged vocabulary or decoder weight is refused
naming the file or weight; an encoder-only directory still gives no transcripts. Models are the
tiny Whispers of tests/support, their weights random: the text is gibberish, the agreement of
eager and delegated tokens is what counts."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import WhisperForConditionalGeneration

from pipeline import models
from pipeline.evaluation.transcripts import WhisperDecoder, decoder_of
from pipeline.models import CheckpointError
from pipeline.models.audio import shipped_utterances
from pipeline.models.checkpoint import Checkpoint, StoredTensor, files_sha256, read_checkpoint
from pipeline.models.vocabulary import read_vocabulary
from pipeline.models.whisper import FAMILY, TIMESTAMPS, plan_whole
from support.ctranslate2_files import listening_whisper
from support.hf_whisper_files import (whisper_tokens, write_encoder_only, write_inner_model, write_tokenizer_json,
                                      write_vocab_json, write_whole)


@pytest.fixture(scope="module")
def whole():
    return listening_whisper()


@pytest.fixture(scope="module")
def tokens(whole):
    return whisper_tokens(whole.config.vocab_size)


@pytest.fixture(scope="module")
def directory(whole, tokens, tmp_path_factory):
    """The whole tiny Whisper saved with vocab.json and added_tokens.json."""
    return write_whole(tmp_path_factory.mktemp("hf") / "whisper", whole, tokens)


@pytest.fixture
def copy(directory, tmp_path):
    """A fresh copy of `directory`, free to damage."""
    return Path(shutil.copytree(directory, tmp_path / "whisper"))


def one_utterance() -> list[str]:
    return [str(shipped_utterances()[0][0])]


def reference(whole, tokens, spec) -> list[list[int]]:
    """The greedy tokens of the in-memory model that was saved, from the spec's encoder output."""
    with torch.no_grad():
        hidden = spec.module(*spec.example_inputs)
    return WhisperDecoder.of(whole, tokens).decode(hidden)


# --- the decoder of a whole directory ------------------------------------------------------

def test_the_accuracy_report_transcribes_a_whole_directory(directory, whole, tokens, tmp_path):
    from pipeline.evaluation.runner import report_main

    out = tmp_path / "reports"
    args = ["whisper", "--checkpoint", str(directory), "--audio", one_utterance()[0], "--output-dir", str(out)]
    assert report_main("accuracy", "", args) == 0
    data = json.loads((out / "whisper-custom.accuracy.json").read_text())
    assert data["verdict"] == "pass" and data["weights"]["format"] == "huggingface"
    section = data["transcripts"]
    assert section["identical"] and len(section["utterances"]) == 1
    row = section["utterances"][0]
    assert row["tokens_eager"] == row["tokens_delegated"] and row["tokens_eager"]
    assert row["text_eager"] == row["text_delegated"] and row["text_eager"].startswith("w")
    assert section["decode"].startswith("greedy, at most 4 tokens, prompt <|startoftranscript|><|notimestamps|>")
    # The decoder is the directory's: eager's tokens are those of the model that was saved.
    spec = models.build("whisper", checkpoint=directory, audio=one_utterance())
    assert row["tokens_eager"] == reference(whole, tokens, spec)[0]


@pytest.mark.parametrize("shards", [None, "20KB"], ids=["single", "sharded"])
def test_the_decoder_is_the_saved_model_at_the_specs_dtype(whole, tokens, tmp_path, shards):
    directory = write_whole(tmp_path / "whisper", whole, tokens, max_shard_size=shards)
    assert (directory / "model.safetensors.index.json").exists() == (shards is not None)
    spec = models.build("whisper", checkpoint=directory, audio=one_utterance())
    assert spec.checkpoint_tokens == tokens
    decoder = decoder_of(spec)
    assert decoder.tokens == tokens and decoder.prompt == (1, 2) and decoder.end == 0
    state = decoder.model.state_dict()
    for key, value in whole.state_dict().items():
        assert torch.equal(state[key], value), key
    model = decoder.model
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # tied, as saved
    assert decoder.decode(spec.module(*spec.example_inputs).detach()) == reference(whole, tokens, spec)

    half = decoder_of(models.build("whisper", checkpoint=directory, audio=one_utterance(), dtype="float16"))
    assert half.dtype == torch.float16 and all(p.dtype == torch.float16 for p in half.model.parameters())


def test_tokenizer_json_gives_the_same_vocabulary(whole, tokens, tmp_path):
    directory = write_whole(tmp_path / "whisper", whole, tokens, form="tokenizer")
    assert not (directory / "vocab.json").exists()
    spec = models.build("whisper", checkpoint=directory, audio=one_utterance())
    assert spec.checkpoint_tokens == tokens
    assert decoder_of(spec).decode(spec.module(*spec.example_inputs).detach()) == reference(whole, tokens, spec)


def test_the_vocabulary_files_are_hashed_and_a_changed_one_is_refused(copy):
    spec = models.build("whisper", checkpoint=copy, audio=one_utterance())
    files = tuple(copy.resolve() / name for name in
                  ("added_tokens.json", "config.json", "model.safetensors", "vocab.json"))
    assert spec.checkpoint_sha256 == files_sha256(copy.resolve(), files)
    vocab = json.loads((copy / "vocab.json").read_text())
    vocab["Ġother"] = vocab.pop("Ġw0")  # still a whole vocabulary, another token at one id
    (copy / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(CheckpointError, match="the checkpoint changed since"):
        decoder_of(spec)


# --- refusals --------------------------------------------------------------------------------

def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


VOCABULARY_DAMAGE = {
    # Two tokens at id 3: the second one named, in the file that names it.
    "duplicate id": ("added_tokens.json", lambda v: v.update({"<|notimestamps|>": 3}),
                     r"added_tokens.json: id 3 is given to '<\|notimestamps\|>' and, in vocab.json, to 'Ġw0'"),
    "gap": ("vocab.json", lambda v: v.pop("Ġw2"),
            r"vocab.json with added_tokens.json: no token for id 5 \(1 of the model's 12 ids have none\)"),
    "id past vocab_size": ("vocab.json", lambda v: v.update({"Ġw8": 12}),
                           r"vocab.json: 'Ġw8' has id 12, outside the model's vocabulary \(ids 0 to 11"),
    "negative id": ("added_tokens.json", lambda v: v.update({"<|notimestamps|>": -1}),
                    r"added_tokens.json: '<\|notimestamps\|>' has id -1, outside"),
    "id not an int": ("vocab.json", lambda v: v.update({"Ġw1": "4"}),
                      r"vocab.json: the id of 'Ġw1' is '4', not an int"),
}


@pytest.mark.parametrize("name", ["vocab.json", "added_tokens.json", "tokenizer.json"])
@pytest.mark.parametrize("kind", ["a named pipe", "a directory"])
def test_a_vocabulary_file_that_is_not_a_regular_file_is_refused_without_waiting(whole, tokens, tmp_path, name,
                                                                                 kind):
    import os

    from support.waits import within

    directory = write_whole(tmp_path / "whisper", whole, tokens, form="tokenizer" if name == "tokenizer.json"
                            else "vocab")
    (directory / name).unlink(missing_ok=True)
    (os.mkfifo if kind == "a named pipe" else os.mkdir)(directory / name)
    with within(20), pytest.raises(CheckpointError, match=rf"{name} is not a regular file \({kind}\)"):
        models.build("whisper", checkpoint=directory, audio=one_utterance())


@pytest.mark.parametrize("damage", VOCABULARY_DAMAGE, ids=list(VOCABULARY_DAMAGE))
def test_a_damaged_vocabulary_is_refused_naming_the_file(copy, damage):
    name, change, message = VOCABULARY_DAMAGE[damage]
    edit_json(copy / name, change)
    with pytest.raises(CheckpointError, match=message):
        models.build("whisper", checkpoint=copy, audio=one_utterance())
    # The reader the transcripts use refuses it too: an error, not a directory without transcripts.
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(copy, FAMILY)


@pytest.mark.parametrize("name, content, message", [
    ("vocab.json", '{"Ġw0": 3,'.encode(), "vocab.json is unreadable"),
    ("added_tokens.json", b"\xff\xfe not text", "added_tokens.json is unreadable"),
    ("vocab.json", '["Ġw0", "Ġw1"]'.encode(), "vocab.json is a list, not a JSON object of token -> id"),
], ids=["truncated", "not-text", "a-list"])
def test_a_vocabulary_file_that_is_not_json_of_its_form_is_refused(copy, name, content, message):
    (copy / name).write_bytes(content)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {copy}: {message}")):
        models.build("whisper", checkpoint=copy, audio=one_utterance())


@pytest.mark.parametrize("change, message", [
    (lambda v: v["added_tokens"][0].update(content=5),
     r"tokenizer.json: added_tokens\[0\]'s content is 5, not a string"),
    (lambda v: v["added_tokens"][1].update(id=0), r"tokenizer.json: id 0 is given to '<\|startoftranscript\|>'"),
    (lambda v: v["model"].update(vocab=[["Ġw0", 0.0]]), "tokenizer.json: model.vocab is a list, not a JSON object"),
    (lambda v: v.pop("model"), "tokenizer.json is not a tokenizer: no model object"),
], ids=["content-not-a-string", "duplicate-id", "vocab-a-list", "no-model"])
def test_a_damaged_tokenizer_json_is_refused_naming_it(copy, tokens, change, message):
    for name in ("vocab.json", "added_tokens.json"):
        (copy / name).unlink()
    write_tokenizer_json(copy, tokens)
    edit_json(copy / "tokenizer.json", change)
    with pytest.raises(CheckpointError, match=message):
        models.build("whisper", checkpoint=copy, audio=one_utterance())


@pytest.mark.parametrize("damage, message", [
    ("missing", "weights missing for model.decoder.layers.0.fc1.weight"),
    ("misshapen", r"model.decoder.layers.0.fc1.weight has shape \(16, 4\), the config implies \(16, 8\)"),
])
def test_a_missing_or_misshapen_decoder_weight_is_refused_naming_it(copy, damage, message):
    state = load_file(copy / "model.safetensors")
    if damage == "missing":
        del state["model.decoder.layers.0.fc1.weight"]
    else:
        state["model.decoder.layers.0.fc1.weight"] = state["model.decoder.layers.0.fc1.weight"][:, :4].contiguous()
    save_file(state, copy / "model.safetensors")
    with pytest.raises(CheckpointError, match=message):
        models.build("whisper", checkpoint=copy, audio=one_utterance())


def test_a_position_table_that_is_not_whispers_window_is_refused_before_building(copy):
    # Before: built, then transformers' "Whisper expects the mel input features to be of length
    # 2000" at the first run; a CTranslate2 directory was already refused so.
    state = load_file(copy / "model.safetensors")
    name = "model.encoder.embed_positions.weight"
    state[name] = state[name][:1000].contiguous()
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "max_source_positions": 1000}))
    with pytest.raises(CheckpointError, match="config.json: max_source_positions is 1000; it must be at least 1500"):
        models.build("whisper", checkpoint=copy, audio=one_utterance())


def test_a_decoder_of_more_heads_than_whisper_takes_is_refused(copy):
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "decoder_attention_heads": 64}))
    with pytest.raises(CheckpointError, match="config.json: decoder_attention_heads is 64; it must be less than 33"):
        models.build("whisper", checkpoint=copy, audio=one_utterance())


# --- no transcripts ---------------------------------------------------------------------------

def test_a_whisper_model_save_transcribes_like_the_whole_model(whole, tokens, tmp_path):
    # `WhisperModel.save_pretrained`: the weights without `model.`, the output projection
    # (tied to the token embedding) not saved; transformers reads it as the whole model.
    directory = write_inner_model(tmp_path / "whisper", whole, tokens)
    assert not any(name.startswith("model.") for name in load_file(directory / "model.safetensors"))
    spec = models.build("whisper", checkpoint=directory, audio=one_utterance())
    assert spec.checkpoint_tokens == tokens
    decoder = decoder_of(spec)
    state = decoder.model.state_dict()
    assert all(torch.equal(state[key], value) for key, value in whole.state_dict().items())
    assert decoder.decode(spec.module(*spec.example_inputs).detach()) == reference(whole, tokens, spec)


def test_a_whisper_model_save_with_weights_its_config_has_no_place_for_is_refused(whole, tokens, tmp_path):
    directory = write_inner_model(tmp_path / "whisper", whole, tokens)
    # A decoder layer more than the config's: saved without `model.`, it must not pass unused.
    state = load_file(directory / "model.safetensors")
    extra = f"decoder.layers.{whole.config.decoder_layers}.fc1.weight"
    state[extra] = state["decoder.layers.0.fc1.weight"].clone()
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"without a place in the module: {re.escape(extra)}"):
        models.build("whisper", checkpoint=directory, audio=one_utterance())


def test_the_decoder_weights_decide_an_encoder_only_directory_gives_none(whole, tokens, directory, tmp_path):
    encoder_only = write_encoder_only(tmp_path / "encoder", whole, tokens)
    spec = models.build("whisper", checkpoint=encoder_only, audio=one_utterance())
    assert spec.checkpoint_tokens is None and decoder_of(spec) is None
    # Its vocabulary is not read, nor hashed: the digest is that of the files it had before.
    root = encoder_only.resolve()
    assert spec.checkpoint_sha256 == files_sha256(root, (root / "config.json", root / "model.safetensors"))
    # The same vocabulary beside the whole model's weights gives the decoder.
    assert decoder_of(models.build("whisper", checkpoint=directory, audio=one_utterance())) is not None


def test_a_whole_directory_without_vocabulary_files_gives_none(whole, tmp_path):
    directory = write_whole(tmp_path / "whisper", whole, None)
    spec = models.build("whisper", checkpoint=directory, audio=one_utterance())
    assert spec.checkpoint_tokens is None and decoder_of(spec) is None


@pytest.mark.parametrize("variant", FAMILY.variants)
def test_every_published_whole_whisper_passes_the_checks(variant):
    # Their checkpoints are not here: the headers save_pretrained would write (the output
    # projection, tied to the token embedding, left out), from the model built on the meta device.
    config = models.embedded_config("whisper", variant)
    with torch.device("meta"):
        state = WhisperForConditionalGeneration(config).state_dict()
    saved = {k: StoredTensor(Path("model.safetensors"), tuple(v.shape), "F16") for k, v in state.items()
             if k != "proj_out.weight"}
    checkpoint = Checkpoint("published", Path("."), config, saved, (), "", ())
    plan = plan_whole(checkpoint)
    assert plan == {k: k for k in saved} | {"proj_out.weight": "model.decoder.embed_tokens.weight"}


# --- tokenizer files saved before Whisper's timestamp tokens ---------------------------------

def test_tokenizer_files_without_the_timestamps_are_completed_by_them(tmp_path):
    tokens = whisper_tokens(20)
    write_vocab_json(tmp_path, tokens)
    read = read_vocabulary(tmp_path, "checkpoint X", len(tokens) + len(TIMESTAMPS), TIMESTAMPS)
    assert read.tokens == tokens + TIMESTAMPS
    assert (read.tokens[len(tokens)], read.tokens[-1]) == ("<|0.00|>", "<|30.00|>")


def test_a_vocabulary_short_of_more_than_the_timestamps_is_refused(tmp_path):
    tokens = whisper_tokens(20)
    write_vocab_json(tmp_path, tokens[:-1])
    with pytest.raises(CheckpointError, match=r"no token for id 19 \(1502 of the model's 1521 ids have none\)"):
        read_vocabulary(tmp_path, "checkpoint X", len(tokens) + len(TIMESTAMPS), TIMESTAMPS)
