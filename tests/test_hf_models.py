"""pipeline.models.hf: any transformers architecture as a ModelSpec, from a shrunk config or
a Hugging Face directory (safetensors, sharded, PyTorch pickles, or no weights at all)."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

from pipeline.models import CheckpointError, from_hf
from pipeline.models.checkpoint import files_sha256
from pipeline.models.hf import base_architectures, example_inputs, from_config, tasks, tiny_config, towers


def _bert_config() -> BertConfig:
    return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      vocab_size=100, max_position_embeddings=64)


def _saved(directory, model_class=BertForMaskedLM, seed: int = 3):
    """A seeded model saved with save_pretrained (safetensors), and the model."""
    torch.manual_seed(seed)
    model = model_class(_bert_config()).eval()
    model.save_pretrained(directory)
    return model


def _reference(model, spec) -> tuple[torch.Tensor, ...]:
    """What the saved model itself computes for the spec's inputs, flattened as the spec's module is."""
    with torch.no_grad():
        output = model(**dict(zip(spec.input_names, spec.example_inputs)))
    return tuple(v for v in output.values() if isinstance(v, torch.Tensor))


def _run(spec) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return spec.module(*spec.example_inputs)


def test_base_architectures_are_sorted_model_types():
    names = base_architectures()
    assert names == sorted(set(names))
    assert {"bert", "gpt2", "t5", "vit", "whisper", "clip"} <= set(names)


def test_tiny_config_shrinks_and_recurses():
    bert = tiny_config("bert")
    assert (bert.hidden_size, bert.num_hidden_layers, bert.num_attention_heads) == (64, 2, 4)
    assert bert.vocab_size <= 1000 and bert.max_position_embeddings <= 128
    clip = tiny_config("clip")
    assert clip.vision_config.hidden_size <= 64 and clip.vision_config.num_hidden_layers == 2
    assert clip.vision_config.image_size % clip.vision_config.patch_size == 0
    resnet = tiny_config("resnet")
    assert max(resnet.hidden_sizes) <= 64 and max(resnet.depths) <= 2
    assert len(resnet.depths) == len(resnet.hidden_sizes)


def test_tiny_config_refuses_an_unknown_model_type():
    with pytest.raises(ValueError, match="no-such-model"):
        tiny_config("no-such-model")


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "bart", "vit", "whisper", "clip"])
def test_tiny_models_build_and_run(model_type):
    spec = from_config(tiny_config(model_type))
    assert (spec.name, spec.variant, spec.checkpoint, spec.dynamic_shapes) == (model_type, "custom", None, None)
    assert spec.input_names == spec.module.input_names and len(spec.input_names) == len(spec.example_inputs)
    outputs = _run(spec)
    assert outputs and all(isinstance(t, torch.Tensor) for t in outputs)
    again = from_config(tiny_config(model_type))
    for a, b in zip(outputs, _run(again), strict=True):
        assert torch.equal(a, b)


def test_inputs_follow_the_modality():
    assert from_config(tiny_config("whisper")).input_names == ("input_features", "decoder_input_ids")
    assert from_config(tiny_config("vit")).input_names == ("pixel_values",)
    assert {"input_ids", "pixel_values"} <= set(from_config(tiny_config("clip")).input_names)
    assert "bbox" in from_config(tiny_config("layoutlm")).input_names


def test_a_tiny_model_exports():
    spec = from_config(tiny_config("bert"))
    program = torch.export.export(spec.module, spec.example_inputs, strict=False)
    for a, b in zip(program.module()(*spec.example_inputs), _run(spec), strict=True):
        torch.testing.assert_close(a, b)


def test_mixture_of_experts_export_without_histc():
    # transformers' default experts (grouped_mm) count tokens per expert with aten.histc, which
    # ExecuTorch's edge dialect refuses; models are built with its batched matmuls instead
    # (pipeline.models.hf.EXPERTS).
    from executorch.exir import to_edge_transform_and_lower

    spec = from_config(tiny_config("mixtral"))
    exported = torch.export.export(spec.module, spec.example_inputs)
    assert not any("histc" in str(n.target) for n in exported.graph.nodes)
    to_edge_transform_and_lower(exported)
    assert spec.module.model.config._experts_implementation == "batched_mm"


def test_task_picks_the_model_class():
    spec = from_config(tiny_config("bert"), task="masked-lm", name="tiny-bert", dtype="bfloat16")
    assert type(spec.module.model).__name__ == "BertForMaskedLM" and spec.name == "tiny-bert"
    assert spec.module.model.dtype == torch.bfloat16
    assert "causal-lm" in tasks() and "image-classification" in tasks()
    with pytest.raises(ValueError, match="task 'no-such-task'"):
        from_config(tiny_config("bert"), task="no-such-task")
    with pytest.raises(ValueError, match="has no such model"):
        from_config(tiny_config("vit"), task="causal-lm")
    with pytest.raises(ValueError, match="dtype must be one of"):
        from_config(tiny_config("bert"), dtype="float64")


def test_towers_are_the_media_encoders():
    spec = from_config(tiny_config("clip"))
    found = towers(spec)
    assert [t.name for t in found] == ["clip.vision_model"]
    (tower,) = found
    assert tower.input_names == ("pixel_values",)
    # The tower holds the spec's own weights.
    assert torch.equal(_run(tower)[0], spec.module.model.vision_model(tower.example_inputs[0]).last_hidden_state)
    assert [t.name for t in towers(from_config(tiny_config("blip")))] == ["blip.vision_model"]
    # One-tower models have none; nor is Whisper's encoder one: the spec's own inputs reach it.
    assert towers(from_config(tiny_config("bert"))) == [] and towers(from_config(tiny_config("whisper"))) == []


def test_example_inputs_name_what_they_cannot_build():
    class Mystery(torch.nn.Module):
        main_input_name = "input_ids"

        def forward(self, input_ids, query_embeds):
            return input_ids

    with pytest.raises(ValueError, match=r"query_embeds.*--inputs FILE\.pt"):
        example_inputs(Mystery(), _bert_config())


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin", "sharded-bin"])
def test_from_hf_reads_weights_as_saved(tmp_path, layout):
    model = _saved(tmp_path)
    if layout == "sharded":
        (tmp_path / "model.safetensors").unlink()
        model.save_pretrained(tmp_path, max_shard_size="40KB")
        assert (tmp_path / "model.safetensors.index.json").exists()
    elif layout.endswith("bin"):
        state = load_file(tmp_path / "model.safetensors")
        (tmp_path / "model.safetensors").unlink()
        if layout == "bin":
            torch.save(state, tmp_path / "pytorch_model.bin")
        else:
            names = sorted(state)
            halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
            for file, keys in halves.items():
                torch.save({k: state[k] for k in keys}, tmp_path / file)
            index = {"weight_map": {k: file for file, keys in halves.items() for k in keys}}
            (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    spec = from_hf(tmp_path)
    assert (spec.variant, spec.checkpoint_format, spec.checkpoint) == ("hf", "huggingface", str(tmp_path.resolve()))
    assert type(spec.module.model).__name__ == "BertForMaskedLM" and spec.checkpoint_weights == "float32"
    assert re.fullmatch(r"[0-9a-f]{64}", spec.checkpoint_sha256)
    for a, b in zip(_run(spec), _reference(model, spec), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_from_hf_hashes_config_and_weights(tmp_path):
    _saved(tmp_path)
    spec = from_hf(tmp_path)
    files = (tmp_path / "config.json", tmp_path / "model.safetensors")
    assert spec.checkpoint_sha256 == files_sha256(tmp_path.resolve(), tuple(p.resolve() for p in files))


def test_from_hf_reads_a_task_checkpoint_as_its_base_model(tmp_path):
    model = _saved(tmp_path, BertForSequenceClassification)  # its BERT has the pooler the base model has
    spec = from_hf(tmp_path, task="base")
    assert type(spec.module.model).__name__ == "BertModel"
    torch.testing.assert_close(_run(spec)[0], _reference(model.bert, spec)[0], rtol=0, atol=0)


def test_from_hf_without_weights_is_seeded_random(tmp_path):
    _bert_config().save_pretrained(tmp_path)
    spec = from_hf(tmp_path, seed=5)
    assert (spec.variant, spec.checkpoint, spec.checkpoint_sha256) == ("hf-random", None, None)
    for a, b in zip(_run(spec), _run(from_hf(tmp_path, seed=5)), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(_run(spec)[0], _run(from_hf(tmp_path, seed=6))[0])


@pytest.mark.parametrize("damage, message", [
    ("missing-dir", "not a directory"),
    ("no-config", "no config.json"),
    ("corrupt-config", "config.json is unreadable"),
    ("config-not-object", "not a JSON object"),
    ("unknown-model-type", r"model_type 'no-such-model' is unknown to the installed transformers \d"),
    ("missing-key", r"missing \(1\): .*bert\.encoder\.layer\.0\.output\.dense\.weight"),
    ("unexpected-key", r"unexpected \(1\): extra\.weight"),
    ("wrong-shape", r"wrong shape \(1\): bert\.pooler"),
    ("corrupt-safetensors", "model.safetensors is unreadable"),
    ("corrupt-bin", "pytorch_model.bin is unreadable"),
    ("absent-shard", "shard\\(s\\) listed but absent: model-00002"),
])
def test_from_hf_refuses_unusable_directories(tmp_path, damage, message):
    directory = tmp_path / "model"
    model = _saved(directory, BertModel if damage == "wrong-shape" else BertForMaskedLM)
    weights = directory / "model.safetensors"
    config = directory / "config.json"
    if damage == "missing-dir":
        directory = tmp_path / "absent"
    elif damage == "no-config":
        config.unlink()
    elif damage == "corrupt-config":
        config.write_text('{"model_type": "bert",')
    elif damage == "config-not-object":
        config.write_text("[1, 2]")
    elif damage == "unknown-model-type":
        config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "no-such-model"}))
    elif damage in ("missing-key", "unexpected-key"):
        state = load_file(weights)
        if damage == "missing-key":
            del state["bert.encoder.layer.0.output.dense.weight"]
        else:
            state["extra.weight"] = torch.zeros(2)
        save_file(state, weights, metadata={"format": "pt"})
    elif damage == "wrong-shape":
        # A base model's weights with a bigger pooler under a config that says 32 wide.
        state = {f"bert.{k}": v for k, v in load_file(weights).items()}
        state["bert.pooler.dense.weight"] = torch.zeros(48, 32)
        save_file(state, weights, metadata={"format": "pt"})
    elif damage == "corrupt-safetensors":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "corrupt-bin":
        weights.unlink()
        (directory / "pytorch_model.bin").write_bytes(b"not a pickle")
    elif damage == "absent-shard":
        weights.unlink()
        model.save_pretrained(directory, max_shard_size="40KB")
        sorted(directory.glob("model-*.safetensors"))[1].unlink()
    with pytest.raises(CheckpointError, match=message) as caught:
        from_hf(directory)
    assert str(directory) in str(caught.value)


@pytest.mark.parametrize("index", ["model.safetensors.index.json", "pytorch_model.bin.index.json"])
def test_a_shard_index_is_read_once_and_hashed_as_parsed(tmp_path, monkeypatch, index):
    # Before: read again, whole and as any file, for the hash (a file swapped in between was hashed unchecked).
    from pathlib import Path

    from pipeline.models import checkpoint

    model = _saved(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    if index.startswith("model"):
        model.save_pretrained(tmp_path, max_shard_size="40KB")
    else:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        names = sorted(state)
        halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
        for file, keys in halves.items():
            torch.save({k: state[k] for k in keys}, tmp_path / file)
        (tmp_path / index).write_text(json.dumps({"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    reads, bounded = [], checkpoint.read_regular
    monkeypatch.setattr(checkpoint, "read_regular", lambda path, limit: reads.append(Path(path).name) or bounded(path, limit))
    whole = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: pytest.fail(f"{path} read whole") if path.name == index
                        else whole(path))
    spec = from_hf(tmp_path)
    assert reads.count(index) == 1
    files = sorted([tmp_path / "config.json", tmp_path / index, *tmp_path.glob("*-of-*")])
    assert spec.checkpoint_sha256 == files_sha256(tmp_path, tuple(files))


@pytest.mark.parametrize("value, dtype, message", [(float("nan"), "float32", "holds nan: weights are finite"),
                                                    (1e5, "float16", "holds inf as float16: weights are finite")])
def test_from_hf_refuses_a_weight_that_is_not_finite_by_name(tmp_path, value, dtype, message):
    _saved(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["bert.encoder.layer.0.output.dense.weight"][0, 0] = value
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"bert\.encoder\.layer\.0\.output\.dense\.weight {message}"):
        from_hf(tmp_path, dtype=dtype)


def test_inputs_file_overrides_the_built_inputs(tmp_path):
    config = _bert_config()
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.save({"input_ids": ids}, tmp_path / "named.pt")
    spec = from_config(config, inputs=tmp_path / "named.pt")
    assert spec.input_names == ("input_ids",) and torch.equal(spec.example_inputs[0], ids)
    torch.save((ids, torch.ones_like(ids)), tmp_path / "ordered.pt")
    spec = from_config(config, inputs=tmp_path / "ordered.pt")
    assert spec.input_names == ("input_ids", "attention_mask")
    _run(spec)


@pytest.mark.parametrize("held, message", [
    (None, "no such file"),
    (b"garbage", "unreadable"),
    ({"no_such_input": torch.zeros(1)}, "takes no 'no_such_input'"),
    ({"input_ids": [1, 2]}, "input_ids is not a tensor"),
    ({}, "not a dict"),
    (torch.zeros(2), "not a dict"),
    (tuple(torch.zeros(1) for _ in range(40)), "40 tensors"),
])
def test_inputs_file_refuses_bad_files(tmp_path, held, message):
    path = tmp_path / "inputs.pt"
    if isinstance(held, bytes):
        path.write_bytes(held)
    elif held is not None:
        torch.save(held, path)
    with pytest.raises(ValueError, match=message) as caught:
        from_config(_bert_config(), inputs=path)
    assert str(path) in str(caught.value)


def test_from_hf_tokenizes_with_the_directory_tokenizer(tmp_path):
    from transformers import BertTokenizer

    _saved(tmp_path)
    words = ["the", "quick", "brown", "fox", "a", "layer", "norm", "on", "graphics", "card", "."]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizer(str(vocab)).save_pretrained(tmp_path)
    spec = from_hf(tmp_path)
    ids = spec.example_inputs[spec.input_names.index("input_ids")]
    assert ids[:, 0].tolist() == [2, 2] and (ids[0] == 1).sum() < ids.shape[1] // 2  # [CLS], mostly known words
    _run(spec)


@pytest.mark.parametrize("kind, message", [("fifo", r"is not a regular file \(a named pipe\)"),
                                           ("folder", r"is not a regular file \(a directory\)"),
                                           ("device", r"is not a regular file \(a character device\)"),
                                           ("large", "is unreadable: larger than")])
@pytest.mark.parametrize("name", ["tokenizer.json", "spm.model"])
def test_from_hf_refuses_a_tokenizer_file_that_is_special_or_too_large(tmp_path, kind, message, name):
    # Before: transformers passed over a named pipe or folder as absent and tokenized from the
    # other files, and read a file of any size whole. spm.model (DeBERTa-v2's vocabulary, one of
    # the names transformers' tokenizer classes read) was not checked at all.
    import os

    from transformers import BertTokenizer

    from pipeline.models.hf import TOKENIZER_MAX_BYTES
    from support.waits import within

    _saved(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox"]) + "\n")
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    target = tmp_path / name
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    elif kind == "device":
        target.symlink_to("/dev/zero")
    else:
        with open(target, "wb") as f:
            f.truncate(TOKENIZER_MAX_BYTES + 1)
    with within(60), pytest.raises(CheckpointError, match=f"{name} {message}"):
        from_hf(tmp_path)


def test_from_hf_reads_float32_weights_whatever_dtype_the_config_names(tmp_path):
    model = _saved(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dtype": "bfloat16"}))
    spec = from_hf(tmp_path)
    assert spec.module.model.dtype == torch.float32
    for a, b in zip(_run(spec), _reference(model, spec), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_attention_is_sdpa_where_the_class_takes_it():
    assert from_config(tiny_config("bert")).module.model.config._attn_implementation == "sdpa"
    # Gemma 2 refuses SDPA (its soft-capped attention): eager.
    assert from_config(tiny_config("gemma2")).module.model.config._attn_implementation == "eager"


def test_patch_grid_vision_towers_get_patches_and_grids():
    spec = from_config(tiny_config("qwen2_vl"))
    (tower,) = towers(spec)
    assert tower.name == "qwen2_vl.visual" and tower.input_names == ("hidden_states", "grid_thw")
    patches, grid = tower.example_inputs
    assert patches.shape[0] == int(grid.prod(dim=1).sum())
    assert _run(tower)


def test_a_checkpoint_saved_under_renamed_keys_loads_as_transformers_loads_it(tmp_path):
    # transformers saves ViT under its older names (encoder.layer.N.attention...) and renames
    # them on load; from_hf reads such a directory through that loader, equal to it.
    import transformers

    torch.manual_seed(3)
    transformers.ViTModel(tiny_config("vit")).save_pretrained(tmp_path / "vit")
    spec = from_hf(tmp_path / "vit")
    reference = transformers.ViTModel.from_pretrained(tmp_path / "vit").eval()
    with torch.no_grad():
        got = spec.module(*spec.example_inputs)[0]
        want = reference(pixel_values=spec.example_inputs[0]).last_hidden_state
    assert spec.variant == "hf" and spec.checkpoint_sha256 and torch.equal(got, want)
