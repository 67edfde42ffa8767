"""Hostile checkpoint directories: every one refused with a CheckpointError that names
the file, key or tensor, before anything large is built; an export records which checkpoint
(absolute path, sha256 of its files) and its readers refuse one that changed since.

Self-contained: the checkpoints are the zoo's own modules at tiny sizes, saved with safetensors.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BartConfig, Florence2Config, WhisperConfig

from pipeline import models
from pipeline.evaluation.artifact import ArtifactError, build_for_artifact, read_artifact
from pipeline.models import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "export_model.py"

TINY = {
    "bart": lambda: BartConfig(d_model=32, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64,
                               encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                               vocab_size=128, max_position_embeddings=64),
    "whisper": lambda: WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                                     num_mel_bins=80, max_source_positions=1500),
    "florence2": lambda: Florence2Config(
        vision_config={"embed_dim": [8, 16, 16, 32], "num_heads": [1, 2, 2, 4], "num_groups": [1, 2, 2, 4],
                       "depths": [1, 1, 1, 1], "projection_dim": 32, "window_size": 12},
        text_config={"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
                     "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
                     "decoder_ffn_dim": 64, "vocab_size": 128, "max_position_embeddings": 64},
    ),
}


def write_checkpoint(directory: Path, name: str, state_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A `name` checkpoint of the zoo module at tiny sizes, its weights under `model.` as
    full models save them; returns the saved state."""
    config = TINY[name]()
    module = models.build(name, config=config, seed=1).module
    state = {f"model.{k}": v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    if state_dtype is not None:
        state = {k: v.to(state_dtype) for k, v in state.items()}
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(config.to_json_string())
    save_file(state, directory / "model.safetensors")
    return state


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("originals")
    for name in TINY:
        write_checkpoint(root / name, name)
    return root


@pytest.fixture
def copy_of(originals, tmp_path):
    """copy_of(name) -> a fresh copy of the tiny `name` checkpoint, free to damage."""
    def make(name: str) -> Path:
        directory = tmp_path / f"{name}-ckpt"
        directory.mkdir()
        for f in (originals / name).iterdir():
            (directory / f.name).write_bytes(f.read_bytes())
        return directory
    return make


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("vision_config__"):
            config["vision_config"][key.removeprefix("vision_config__")] = value
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))


def shard(directory: Path, entries: dict[str, str] | None = None, index=None) -> None:
    """Turn the single file into a one-shard checkpoint, the index mapping every tensor to
    `entries.get(name, "shard-1.safetensors")` (or being `index` itself)."""
    names = list(load_file(directory / "model.safetensors"))
    (directory / "model.safetensors").rename(directory / "shard-1.safetensors")
    if index is None:
        index = {"metadata": {}, "weight_map": {n: (entries or {}).get(n, "shard-1.safetensors") for n in names}}
    (directory / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))


def refused(directory: Path, name: str, pattern: str) -> str:
    with pytest.raises(CheckpointError, match=pattern) as info:
        models.build(name, checkpoint=directory)
    message = str(info.value)
    assert message.startswith(f"checkpoint {directory}: "), message
    return message


# --- defect 2: every file read lies inside the checkpoint directory ---------------------------

@pytest.fixture
def outside(originals, tmp_path):
    """A valid bart weights file outside the checkpoint directory (`../elsewhere/w.safetensors`)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "w.safetensors").write_bytes((originals / "bart" / "model.safetensors").read_bytes())
    return elsewhere / "w.safetensors"


@pytest.mark.parametrize("entry", ["../elsewhere/w.safetensors", "ABSOLUTE", "/etc/passwd"])
def test_a_shard_outside_the_directory_is_refused(copy_of, outside, entry):
    directory = copy_of("bart")
    entry = str(outside) if entry == "ABSOLUTE" else entry
    shard(directory, {"model.decoder.layers.0.fc1.weight": entry})
    message = refused(directory, "bart", "model.safetensors.index.json entry .* lies outside the checkpoint directory")
    assert repr(entry) in message


@pytest.mark.parametrize("link", ["model.safetensors", "config.json", "shard-1.safetensors",
                                  "model.safetensors.index.json"])
def test_a_link_out_of_the_directory_is_refused(copy_of, outside, tmp_path, link):
    directory = copy_of("bart")
    if link.startswith(("shard", "model.safetensors.index")):
        shard(directory)
    target = tmp_path / "elsewhere" / link
    if not target.exists():
        target.write_bytes((directory / link).read_bytes())
    (directory / link).unlink()
    (directory / link).symlink_to(target)
    refused(directory, "bart", f"{link}'? lies outside the checkpoint directory")


def test_links_inside_the_directory_are_followed(copy_of):
    directory = copy_of("bart")
    (directory / "blobs").mkdir()
    (directory / "model.safetensors").rename(directory / "blobs" / "weights")
    (directory / "model.safetensors").symlink_to(Path("blobs") / "weights")
    assert models.build("bart", checkpoint=directory).checkpoint == str(directory.resolve())


# --- defect 11: a malformed shard index ---------------------------------------------------

@pytest.mark.parametrize(
    ("index", "message"),
    [
        ([1, 2], "not a JSON object with a weight_map"),
        ('"weights"', "not a JSON object with a weight_map"),
        ({"weight_map": ["shard-1.safetensors"]}, "weight_map is list, not an object"),
        ({"weight_map": {"model.decoder.layernorm_embedding.weight": 5}},
         r"weight_map\['model.decoder.layernorm_embedding.weight'\] is 5, not a file name"),
        ({"weight_map": {"model.decoder.layernorm_embedding.weight": None}}, r"is None, not a file name"),
        ({"weight_map": {"model.decoder.no_such.weight": "shard-1.safetensors"}},
         "places model.decoder.no_such.weight in shard-1.safetensors, which does not hold it"),
        ({"weight_map": {"x": ""}}, "entry '' lies outside the checkpoint directory"),
        ({"weight_map": {"x": "a\0b"}}, "cannot be resolved"),
    ],
    ids=["list", "string", "map-list", "entry-int", "entry-null", "name-not-in-shard", "entry-empty", "entry-nul"],
)
def test_a_malformed_index_is_refused(copy_of, index, message):
    directory = copy_of("bart")
    shard(directory, index=index)
    refused(directory, "bart", "model.safetensors.index.json.*" + message)


# --- defect 8: only float weights are read --------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64, torch.bool, torch.complex64])
def test_non_float_weights_are_refused(copy_of, dtype):
    directory = copy_of("bart")
    state = load_file(directory / "model.safetensors")
    state["model.decoder.layers.0.fc1.weight"] = state["model.decoder.layers.0.fc1.weight"].to(dtype)
    save_file(state, directory / "model.safetensors")
    name = str(dtype).removeprefix("torch.")
    refused(directory, "bart", rf"model\.decoder\.layers\.0\.fc1\.weight is {name}; only float32, float16, "
                               r"bfloat16, float64 weights are read")


@pytest.mark.parametrize("value, dtype, message", [
    (float("nan"), "float32", "holds nan: weights are finite"),
    (float("-inf"), "float32", "holds -inf: weights are finite"),
    (1e5, "float16", "holds inf as float16: weights are finite"),  # past float16's range once cast
])
def test_a_weight_that_is_not_finite_is_refused_by_name(copy_of, value, dtype, message):
    # Before: built and exported with exit 0, a model whose outputs are not numbers.
    directory = copy_of("bart")
    state = load_file(directory / "model.safetensors")
    state["model.decoder.layers.0.fc1.weight"][1, 2] = value
    save_file(state, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"model\.decoder\.layers\.0\.fc1\.weight {message}"):
        models.build("bart", checkpoint=directory, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_weights_of_any_width_are_read(tmp_path, dtype):
    saved = write_checkpoint(tmp_path / "ckpt", "bart", state_dtype=dtype)
    module = models.build("bart", checkpoint=tmp_path / "ckpt").module
    assert torch.equal(module.decoder.layers[0].fc1.weight, saved["model.decoder.layers.0.fc1.weight"].float())


# --- defects 3, 8, 11: a config is checked, by type and range, against the weights present ----

CONFIGS = [
        # Sizes below 1 (before: a module with no layers, ZeroDivisionError, RuntimeError).
        ("whisper", {"encoder_layers": 0}, "encoder_layers is 0; it must be at least 1"),
        ("whisper", {"encoder_layers": -1}, "encoder_layers is -1; it must be at least 1"),
        ("whisper", {"d_model": 0}, "d_model is 0; it must be at least 1"),
        ("whisper", {"d_model": -1}, "d_model is -1; it must be at least 1"),
        ("whisper", {"encoder_attention_heads": 0}, "encoder_attention_heads is 0; it must be at least 1"),
        ("bart", {"decoder_ffn_dim": 0}, "decoder_ffn_dim is 0; it must be at least 1"),
        ("bart", {"vocab_size": 0}, "vocab_size is 0; it must be at least 1"),
        ("whisper", {"encoder_attention_heads": 3},
         r"encoder_attention_heads is 3; it must be a divisor of d_model \(32\)"),
        # What Whisper's inputs and memory allow (before: transformers' message at the first run,
        # a score matrix of heads x 1500 x 1500 a layer).
        ("whisper", {"max_source_positions": 3000}, "max_source_positions is 3000; it must be less than 1501"),
        ("whisper", {"encoder_attention_heads": 64}, "encoder_attention_heads is 64; it must be less than 33"),
        # Other value kinds than int (before: StrictDataclassFieldValidationError).
        ("whisper", {"encoder_layers": "2"}, "Field 'encoder_layers' expected int, got str"),
        ("whisper", {"encoder_layers": 2.0}, "Field 'encoder_layers' expected int, got float"),
        ("whisper", {"encoder_layers": None}, "Field 'encoder_layers' expected int, got NoneType"),
        ("bart", {"decoder_layers": True}, "Field 'decoder_layers' expected int, got bool"),
        # Sizes beyond what the checkpoint holds (before: the whole module built, then MemoryError
        # or RuntimeError).
        ("whisper", {"encoder_layers": 1_000_000},
         "encoder_layers is 1000000, more than the .* weights the checkpoint"),
        ("whisper", {"encoder_layers": 100},
         "encoder_layers is 100: 100 repeated blocks, more than the .* tensors the checkpoint holds"),
        ("whisper", {"d_model": 1_000_000_000}, "d_model is 1000000000, more than the .* weights the checkpoint"),
        ("bart", {"decoder_ffn_dim": 4096}, (r"its sizes \(d_model=32, decoder_layers=2, .*decoder_ffn_dim=4096.*\) "
                                             "make a module of .* weights, more than the .* the checkpoint holds")),
        # Fewer layers than the checkpoint holds (before: the rest silently left out).
        ("bart", {"decoder_layers": 1}, (r"its sizes \(d_model=32, decoder_layers=1, .*\) leave 26 of the "
                                         r"checkpoint's decoder weights without a place in the module: "
                                         r"model\.decoder\.layers\.1\.")),
        # Token ids outside the vocabulary (before: AssertionError, or an export failing later).
        ("bart", {"pad_token_id": 128}, r"pad_token_id is 128; it must be less than vocab_size \(128\)"),
        ("bart", {"decoder_start_token_id": -1}, "decoder_start_token_id is -1; it must be at least 0"),
        # What transformers cannot build at all (before: KeyError).
        ("bart", {"activation_function": "nope"}, "no bart module can be built from it: KeyError: 'nope'"),
        # transformers makes a label per num_labels while it parses (before: a minute per 3 million).
        ("bart", {"num_labels": 10**9}, "num_labels is 1000000000; it must be an int from 0 to"),
        # Per-stage lists (before: ZeroDivisionError, IndexError, a window padding the image without bound).
        ("florence2", {"vision_config__num_heads": [0, 2, 2, 4]}, r"vision_config\.num_heads\[0\] is 0"),
        ("florence2", {"vision_config__num_groups": [1, 2, 3, 4]},
         r"vision_config\.num_groups\[2\] is 3; it must be a divisor of vision_config\.embed_dim\[2\] \(16\)"),
        ("florence2", {"vision_config__depths": [1, 1, 1]},
         "vision_config.depths has 3 entries, vision_config.embed_dim has 4"),
        ("florence2", {"vision_config__depths": []}, "vision_config.depths is an empty list"),
        ("florence2", {"vision_config__patch_padding": [7, 1, 1, 1]},
         r"patch_padding\[0\] is 7; it must be less than vision_config\.patch_size\[0\] \(7\)"),
        ("florence2", {"vision_config__window_size": 1000}, "window_size is 1000; it must be less than 769"),
]


@pytest.mark.parametrize(("name", "changes", "message"), CONFIGS,
                         ids=[f"{name}-{'-'.join(f'{k}={v!r:.12}' for k, v in changes.items())}"
                              for name, changes, _ in CONFIGS])
def test_a_hostile_config_is_refused_before_building(copy_of, name, changes, message):
    directory = copy_of(name)
    edit_config(directory, **changes)
    refused(directory, name, "config.json" + ".*" + message)


def test_the_florence2_window_bound_is_the_image_size():
    from pipeline.models import florence2

    for variant in models.variants("florence2"):
        assert models._embedded("florence2", variant)["preprocessor"]["image_size"] == florence2.IMAGE_SIZE


@pytest.mark.parametrize("which", ["config.json", "index"])
def test_deeply_nested_json_is_refused(copy_of, which):
    # Before: RecursionError from the parser (or from copying the parsed value).
    directory = copy_of("bart")
    if which == "index":
        shard(directory, index='{"weight_map": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}")
        refused(directory, "bart", "model.safetensors.index.json is unreadable: nested deeper than 32 levels")
    else:
        text = (directory / "config.json").read_text().rstrip()[:-1]
        for depth in (40, 100_000):  # parsed, then copied recursively; beyond the parser's recursion
            (directory / "config.json").write_text(text + ', "x": ' + "[" * depth + "]" * depth + "}")
            refused(directory, "bart", "config.json is unreadable: nested deeper than 32 levels")


def test_an_oversized_or_special_config_file_is_refused(copy_of):
    directory = copy_of("bart")
    edit_config(directory, padding="x" * (17 << 20))
    refused(directory, "bart", r"config.json is unreadable: larger than 16777216 bytes")
    (directory / "config.json").unlink()
    os.mkfifo(directory / "config.json")  # read without waiting for a writer
    refused(directory, "bart", "config.json is not a regular file")


# --- defect 8: an export names its checkpoint by absolute path and the sha256 of its files ----

def test_the_spec_names_the_checkpoint_absolutely_with_its_digest(copy_of, monkeypatch):
    directory = copy_of("bart")
    monkeypatch.chdir(directory.parent)
    spec = models.build("bart", checkpoint=directory.name)
    assert spec.checkpoint == str(directory.resolve())
    assert len(spec.checkpoint_sha256) == 64
    assert models.build("bart", checkpoint=directory).checkpoint_sha256 == spec.checkpoint_sha256
    # Any byte of the weights or the config changes it.
    weights = bytearray((directory / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (directory / "model.safetensors").write_bytes(bytes(weights))
    changed = models.build("bart", checkpoint=directory).checkpoint_sha256
    edit_config(directory, dropout=0.2)
    assert len({spec.checkpoint_sha256, changed, models.build("bart", checkpoint=directory).checkpoint_sha256}) == 3


def test_a_checkpoint_that_changed_since_the_export_is_refused(copy_of):
    directory = copy_of("bart")
    spec = models.build("bart", checkpoint=directory)
    summary = {"model": "bart", "variant": spec.variant, "seed": 0, "checkpoint": spec.checkpoint,
               "checkpoint_sha256": spec.checkpoint_sha256}
    assert build_for_artifact(summary).checkpoint_sha256 == spec.checkpoint_sha256
    edit_config(directory, dropout=0.2)
    with pytest.raises(CheckpointError, match=f"sha256 is [0-9a-f]{{64}}, not {spec.checkpoint_sha256} as the "
                                              "export recorded: the checkpoint changed since; export again"):
        build_for_artifact(summary)
    for record in ({"checkpoint_sha256": None}, {"checkpoint": directory.name}):
        with pytest.raises(ArtifactError, match="export again"):
            build_for_artifact({**summary, **record})


def test_files_changed_between_hash_and_load_are_refused(copy_of):
    from pipeline.models.checkpoint import load_weights, plan_weights, read_checkpoint

    directory = copy_of("bart")
    family = models.family("bart")
    checkpoint = read_checkpoint(directory, family)
    plan = plan_weights(checkpoint, family)
    edit_config(directory, dropout=0.2)
    module = family.make_module(checkpoint.config)
    with pytest.raises(CheckpointError, match="its files changed while they were read; nothing was built"):
        load_weights(module, checkpoint, plan)


@pytest.fixture(scope="module")
def cli():
    spec = importlib.util.spec_from_file_location("export_model_cli", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_records_the_checkpoint_and_its_readers_check_it(cli, copy_of, monkeypatch, capsys):
    directory = copy_of("bart")
    monkeypatch.chdir(directory.parent)
    assert cli.main(["bart", "--checkpoint", directory.name, "--output-dir", "out"]) == 0, capsys.readouterr().err
    pte = directory.parent / "out" / "bart-custom.pte"
    summary = read_artifact(pte)
    assert summary["checkpoint"] == str(directory.resolve())
    assert summary["checkpoint_sha256"] == models.build("bart", checkpoint=directory).checkpoint_sha256
    monkeypatch.chdir(pte.parent)  # from elsewhere the record still names the same checkpoint
    assert build_for_artifact(read_artifact(pte.name)).checkpoint == str(directory.resolve())
    edit_config(directory, dropout=0.2)
    with pytest.raises(CheckpointError, match="the checkpoint changed since; export again"):
        build_for_artifact(read_artifact(pte))

    coverage = pte.with_name("bart-custom.coverage.json")
    for record, message in (({"checkpoint": directory.name}, "is not an absolute path"),
                            ({"checkpoint_sha256": None}, "without the sha256 of its files")):
        coverage.write_text(json.dumps({**summary, **record}))
        with pytest.raises(ArtifactError, match=message):
            read_artifact(pte)


# --- the script: exit status 1 and one line ----------------------------------------------

def test_the_script_exits_1_with_one_line(copy_of, tmp_path):
    directory = copy_of("whisper")
    edit_config(directory, encoder_layers=1_000_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(SCRIPT), "whisper", "--checkpoint", str(directory),
                             "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                            timeout=300, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"export_model: checkpoint {directory}: config.json: encoder_layers is 1000000"), last
    assert not (tmp_path / "out").exists()


def test_the_script_refuses_a_shard_outside_the_directory(cli, copy_of, outside, capsys, tmp_path):
    directory = copy_of("bart")
    shard(directory, {"model.decoder.layers.0.fc1.weight": "../elsewhere/w.safetensors"})
    assert cli.main(["bart", "--checkpoint", str(directory), "--output-dir", str(tmp_path / "out")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"export_model: checkpoint {directory}: model.safetensors.index.json entry "
                    f"'../elsewhere/w.safetensors' lies outside the checkpoint directory ({outside.resolve()})")


@pytest.mark.parametrize("name", models.NAMES)
def test_every_published_architecture_passes_the_checks(name):
    # Their full checkpoints are not here: the headers such a file would have, from the module
    # built on the meta device (no memory).
    from pipeline.models.checkpoint import Checkpoint, StoredTensor, plan_weights
    from pipeline.models.sizes import check_sizes

    family = models.family(name)
    for variant in models.variants(name):
        config = models.embedded_config(name, variant)
        config._attn_implementation = "sdpa"
        with torch.device("meta"):
            state = family.make_module(config).state_dict()
        tensors = {f"model.{k}": StoredTensor(Path("model.safetensors"), tuple(v.shape), "BF16")
                   for k, v in state.items()}
        check_sizes(config, family, variant, len(tensors), sum(t.numel for t in tensors.values()))
        checkpoint = Checkpoint("published", Path("."), config, tensors, (), "", ())
        assert plan_weights(checkpoint, family) == {k: f"model.{k}" for k in state}
