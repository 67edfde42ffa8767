import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline import models
from pipeline.models import CheckpointError
from support.tiny_models import reference_output, tiny_config


def export(spec) -> tuple[int, tuple[int, ...]]:
    """(LayerNorm/GroupNorm ops, output shape) of the graph torch.export produces for `spec`."""
    program = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, strict=False)
    names = ("aten.layer_norm", "aten.native_layer_norm", "aten.group_norm", "aten.native_group_norm")
    count = sum(1 for n in program.graph.nodes if n.op == "call_function" and str(n.target).startswith(names))
    (out,) = program.graph.output_node().args[0]
    return count, tuple(out.meta["val"].shape)


# Smallest published variant: (name, variant, LayerNorms, output shape).
SMALLEST = [
    ("bart", "base", 19, (1, 128, 768)),
    ("florence2", "base", 53, (1, 577, 768)),
    ("whisper", "tiny", 9, (1, 1500, 384)),
]


@pytest.mark.parametrize(("name", "variant", "layer_norms", "out_shape"), SMALLEST)
def test_smallest_variant_exports(name, variant, layer_norms, out_shape):
    spec = models.build(name, variant)
    assert (spec.name, spec.variant, spec.dynamic_shapes) == (name, variant, None)
    assert not spec.module.training
    assert export(spec) == (layer_norms, out_shape)


def test_whisper_base_is_default_with_13_layer_norms():
    spec = models.build("whisper")
    assert spec.variant == "base" and spec.config.d_model == 512
    assert export(spec) == (13, (1, 1500, 512))


def test_bart_dynamic_export_runs_at_other_lengths():
    spec = models.build("bart", config=tiny_config("bart"), dynamic=True)
    program = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, strict=False)
    ids, enc = spec.example_inputs
    short = (ids[:, :37], enc[:, :50])
    assert ids.shape[1] == enc.shape[1] == 64  # the shrunken config's position limit
    with torch.no_grad():
        assert torch.equal(program.module()(*short), spec.module(*short))


def test_embedded_configs_are_the_published_architectures():
    hidden = {name: {v: models.family(name).hidden_size(models.embedded_config(name, v)) for v in models.variants(name)}
              for name in models.NAMES}
    assert hidden == {
        "bart": {"base": 768, "large": 1024},
        "florence2": {"base": 768, "large": 1024},
        "whisper": {"tiny": 384, "tiny.en": 384, "base": 512, "base.en": 512, "small": 768, "small.en": 768,
                    "medium": 1024, "medium.en": 1024, "large-v3": 1280},
    }
    assert models.embedded_config("whisper", "large-v3").num_mel_bins == 128
    assert models.embedded_config("bart", "large").decoder_layers == 12
    assert models.embedded_config("florence2", "large").vision_config.embed_dim == [256, 512, 1024, 2048]


def test_example_inputs_are_realistic_and_seeded():
    pixels, = models.build("florence2", config=tiny_config("florence2")).example_inputs
    assert pixels.shape == (1, 3, 768, 768)
    # ImageNet-normalized pixels of a [0, 1] image stay within these bounds.
    assert -2.2 < pixels.min() < -1.0 and 1.5 < pixels.max() < 2.7
    mel, = models.build("whisper", config=tiny_config("whisper")).example_inputs
    assert mel.shape == (1, 80, 3000)
    # Whisper's log-mel scaling maps to about [-1, 1.5]; the padded tail is the floor.
    assert -1.5 < mel.min() and mel.max() < 2 and mel[..., -1].std() < 1e-6 < mel[..., 100].std()
    a, b, c = (models.build("bart", config=tiny_config("bart"), seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a.example_inputs, b.example_inputs))
    assert not torch.equal(a.example_inputs[0], c.example_inputs[0])
    assert torch.equal(a.module.decoder.layers[0].fc1.weight, b.module.decoder.layers[0].fc1.weight)


@pytest.mark.parametrize("name", models.NAMES)
def test_checkpoint_loads_back_identically(name, checkpoints):
    directory, saved = checkpoints[name]
    spec = models.build(name, checkpoint=directory, seed=123)
    assert spec.variant == "custom" and spec.checkpoint == str(directory)
    with torch.no_grad():
        out = spec.module(*spec.example_inputs)
    assert out.shape[-1] == 32 and out.std() > 0.1
    assert torch.equal(out, reference_output(name, saved, spec.example_inputs))


def test_wrong_family_checkpoint_is_refused(checkpoints):
    with pytest.raises(CheckpointError, match=r"model_type is 'whisper', not 'bart'"):
        models.build("bart", checkpoint=checkpoints["whisper"][0])


def test_checkpoint_of_another_variant_is_refused(checkpoints):
    with pytest.raises(CheckpointError, match="not the requested variant base"):
        models.build("bart", variant="base", checkpoint=checkpoints["bart"][0])


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: [f.unlink() for f in d.iterdir()] and d.rmdir(), "not a directory"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json is unreadable"),
        (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000]),
         "model.safetensors is unreadable"),
        (lambda d: save_file({k: v for k, v in load_file(d / "model.safetensors").items()
                              if "layers.1.fc1" not in k}, d / "model.safetensors"),
         r"weights missing for decoder\.layers\.1\.fc1"),
        (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                              "decoder_ffn_dim": 48})),
         r"has shape \(64, 32\), the config implies \(48, 32\)"),
    ],
    ids=["missing-dir", "no-config", "bad-config", "no-weights", "truncated-weights", "missing-tensor", "wrong-shape"],
)
def test_broken_checkpoint_is_refused(damage, message, checkpoints, tmp_path):
    directory = _copy(checkpoints["bart"][0], tmp_path / "ckpt")
    damage(directory)
    with pytest.raises(CheckpointError, match=message) as info:
        models.build("bart", checkpoint=directory)
    assert str(directory) in str(info.value)


def test_unknown_model_and_variant_list_the_choices():
    with pytest.raises(ValueError, match="unknown model 'gpt2'; choose one of bart, florence2, whisper"):
        models.build("gpt2")
    with pytest.raises(ValueError, match="unknown whisper variant 'huge'; choose one of tiny, tiny.en, base, base.en, "
                       "small, small.en, medium, medium.en, large-v3"):
        models.build("whisper", "huge")
    with pytest.raises(ValueError, match="no dynamic dimension"):
        models.build("whisper", dynamic=True)


# Every published variant, full size: (name, variant, LayerNorms).
ALL_VARIANTS = [
    ("bart", "large", 37),
    ("bart", "base", 19),
    ("florence2", "large", 53),
    ("whisper", "small", 25),
    ("whisper", "medium", 49),
    ("whisper", "large-v3", 65),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "variant", "layer_norms"), ALL_VARIANTS)
def test_every_variant_exports(name, variant, layer_norms):
    # bart with dynamic lengths, the others static.
    spec = models.build(name, variant, dynamic=name == "bart")
    count, out_shape = export(spec)
    assert count == layer_norms and out_shape[-1] == models.family(name).hidden_size(spec.config)


def test_the_cli_knows_the_registry_names():
    from pipeline import cli

    assert cli.MODEL_NAMES == models.NAMES
