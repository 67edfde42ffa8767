"""The model zoo: `bart`, `florence2` and `whisper`, each ready for `pipeline.lower`.

    spec = pipeline.models.build("bart", variant="base", seed=0)
    spec.module(*spec.example_inputs)

Each variant's architecture is the published checkpoint's configuration, embedded as package
data (`configs/<name>-<variant>.json`); weights are seeded random unless `checkpoint=` names
a local Hugging Face directory, or for whisper a CTranslate2 one (`pipeline.models.ctranslate2`).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import torch
from transformers import PretrainedConfig

from pipeline.models import bart, ctranslate2, florence2, whisper
from pipeline.models.audio import audio_paths, shipped_utterances
from pipeline.models.checkpoint import (
    FLOAT_DTYPES,
    config_from_dict,
    load_weights,
    plan_weights,
    read_checkpoint,
    refuse_non_finite_parameters,
)
from pipeline.models.hf import from_hf
from pipeline.models.spec import CheckpointError, ModelFamily, ModelSpec
from pipeline.wgsl import DTYPES

__all__ = ["NAMES", "CheckpointError", "ModelFamily", "ModelSpec", "build", "default_variant", "family", "from_hf",
           "hf_stem", "variants"]

FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (bart.FAMILY, florence2.FAMILY, whisper.FAMILY)}
NAMES: tuple[str, ...] = tuple(FAMILIES)
# A checkpoint whose architecture matches no embedded variant is reported under this name.
CUSTOM_VARIANT = "custom"
# SDPA exports to one aten op per attention and keeps dynamic sequence lengths symbolic.
ATTENTION = "sdpa"


def family(name: str) -> ModelFamily:
    """The registry entry for `name`; ValueError listing the choices when there is none."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(NAMES)}") from None


def variants(name: str) -> tuple[str, ...]:
    """The variants of model `name`, smallest first."""
    return family(name).variants


def default_variant(name: str) -> str:
    return family(name).default_variant


@cache
def _embedded(name: str, variant: str) -> dict[str, Any]:
    text = resources.files("pipeline.models").joinpath("configs", f"{name}-{variant}.json").read_text()
    return json.loads(text)


def embedded_config(name: str, variant: str) -> PretrainedConfig:
    """The published configuration of `name`/`variant` as shipped in the package."""
    fam = family(name)
    _check_variant(fam, variant)
    return config_from_dict(_embedded(name, variant)["config"], fam, f"embedded config {name}-{variant}")


def build(
    name: str,
    variant: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    seed: int = 0,
    dynamic: bool = False,
    config: PretrainedConfig | None = None,
    dtype: str = "float32",
    checkpoint_sha256: str | None = None,
    audio: Sequence[str | os.PathLike] | None = None,
) -> ModelSpec:
    """Build model `name` in eval mode with example inputs for export.

    variant: one of `variants(name)`; default the family's default. With `checkpoint`, the
        variant is read from the checkpoint's architecture (`variant`, if given, must match).
    checkpoint: a local Hugging Face directory (config.json + safetensors) of this family,
        or for whisper a CTranslate2 directory (model.bin, config.json, vocabulary: the whole
        model, read by `pipeline.models.ctranslate2`); CheckpointError (a ValueError) names
        the directory and the cause when it cannot be used. Its files must lie inside it, its
        config's sizes (a CTranslate2 model's shapes) must describe exactly the weights it
        holds; all of this is checked before the module is built. A Hugging Face whisper
        directory that holds the whole model (decoder weights) and its tokenizer files is
        read with its vocabulary, and its decoder's weights are checked too. The spec records
        its format and how its weights were stored (`checkpoint_format`, `checkpoint_weights`)
        and the vocabulary of a whole whisper (`checkpoint_tokens`).
    seed: seeds the random weights (when there is no checkpoint) and the example inputs.
    dynamic: export with dynamic sequence lengths (only models that have one: bart).
    config: build this config instead of an embedded one (for shrunken test models); the
        spec's variant is then `custom`.
    dtype: float32, float16 or bfloat16: the module (weights made in float32, then cast)
        and its floating-point example inputs are cast to it.
    checkpoint_sha256: with `checkpoint`, the sha256 its files must have (the spec's
        `checkpoint_sha256` of an earlier build, as an export records it); CheckpointError
        when they differ.
    audio: whisper only: WAV files (any rate and channel count) whose log-mel, one batch row
        each, are the example inputs. Default: with a checkpoint, the utterances the package
        ships (`pipeline.models.audio.shipped_utterances`); without one, a synthetic chirp.
        The spec records the files (`audio`, absolute paths) and the sha256 of their bytes.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    fam = family(name)
    if variant is not None:
        _check_variant(fam, variant)
    if dynamic and fam.make_dynamic_shapes is None:
        raise ValueError(f"dynamic=True: {name} has no dynamic dimension (only bart does)")
    if checkpoint is not None and config is not None:
        raise ValueError("pass either checkpoint= or config=, not both")
    if checkpoint_sha256 is not None and checkpoint is None:
        raise ValueError("checkpoint_sha256= needs checkpoint=")
    if audio is not None and name != "whisper":
        raise ValueError(f"audio=: only whisper takes speech, not {name}")

    stored = _read(checkpoint, fam, checkpoint_sha256) if checkpoint is not None else None
    if stored is not None:
        config = stored.config
        matched = _matching_variant(fam, config)
        if variant is not None and matched != variant:
            raise CheckpointError(
                f"{stored.shown}: its architecture is {name} {matched}, not the requested variant {variant}"
            )
        variant = matched
    elif config is not None:
        config = copy.deepcopy(config)  # the attention choice below must not leak into the caller's
        variant = CUSTOM_VARIANT
    else:
        variant = variant or fam.default_variant
        config = embedded_config(name, variant)
    config._attn_implementation = ATTENTION
    ct2 = isinstance(stored, ctranslate2.CTranslate2Checkpoint)
    plan = plan_weights(stored, fam) if stored is not None and not ct2 else None
    if plan is not None and stored.tokens is not None:
        # A whole whisper: its decoder is checked now, as a CTranslate2 one's is, though only
        # the transcripts load it (`whisper.whole_model`).
        whisper.plan_whole(stored)

    torch.manual_seed(seed)
    module = fam.make_module(config)
    if ct2:
        # The zoo's module is the model's encoder; the file's decoder was read and checked
        # with it (its weights are not loaded here: `ctranslate2.whole_model` loads them).
        state = ctranslate2.load_state(stored, [f"model.{key}" for key in module.state_dict()])
        module.load_state_dict({key.removeprefix("model."): value for key, value in state.items()}, strict=True)
    elif stored is not None:
        load_weights(module, stored, plan)
    module.eval().to(getattr(torch, dtype))
    if stored is not None and dtype != "float32":  # read as float32 and checked finite there
        refuse_non_finite_parameters(module, stored.shown, dtype, plan)

    preprocessor = _embedded(name, variant if variant != CUSTOM_VARIANT else fam.default_variant).get("preprocessor", {})
    if audio is None and stored is not None and name == "whisper":
        audio = [path for path, _ in shipped_utterances()]
    if audio is not None:
        files = audio_paths(audio)
        inputs, heard = whisper.speech_inputs(config, preprocessor, files)
    else:
        files, heard, inputs = None, None, fam.make_inputs(config, preprocessor, seed)
    return ModelSpec(
        name=name,
        variant=variant,
        module=module,
        example_inputs=tuple(cast_inputs(inputs, dtype)),
        dynamic_shapes=fam.make_dynamic_shapes(config) if dynamic else None,
        config=config,
        checkpoint=str(stored.directory) if stored is not None else None,
        checkpoint_sha256=stored.sha256 if stored is not None else None,
        checkpoint_format=None if stored is None else ctranslate2.FORMAT if ct2 else "huggingface",
        checkpoint_weights=None if stored is None else stored.weights if ct2 else ", ".join(
            sorted({FLOAT_DTYPES[stored.tensors[name].dtype] for name in plan.values()})),
        checkpoint_tokens=None if stored is None else stored.tokens,
        audio=files,
        audio_sha256=heard,
    )


def _read(checkpoint: str | os.PathLike, fam: ModelFamily, sha256: str | None):
    """The checkpoint directory read in its format, recognised by what it holds."""
    if not ctranslate2.holds_ctranslate2(checkpoint):
        return read_checkpoint(checkpoint, fam, sha256)
    if fam.name != "whisper":
        raise CheckpointError(f"checkpoint {checkpoint}: a CTranslate2 directory ({ctranslate2.MODEL_FILE}); "
                              f"only whisper is read in that format, {fam.name} from Hugging Face directories")
    return ctranslate2.read_ctranslate2(checkpoint, sha256)


def cast_inputs(inputs, dtype: str):
    """The floating-point tensors of `inputs` cast to `dtype`; others (token ids) as they are."""
    return [x.to(getattr(torch, dtype)) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def _check_variant(fam: ModelFamily, variant: str) -> None:
    if variant not in fam.variants:
        raise ValueError(f"unknown {fam.name} variant {variant!r}; choose one of {', '.join(fam.variants)}")


def _matching_variant(fam: ModelFamily, config: PretrainedConfig) -> str:
    signature = fam.signature(config)
    for variant in fam.variants:
        if fam.signature(embedded_config(fam.name, variant)) == signature:
            return variant
    return CUSTOM_VARIANT


def hf_stem(directory: str | os.PathLike) -> str:
    """The name a Hugging Face directory's files and reports take: its own name, with what a
    file name cannot hold replaced ("bert-base-uncased" for ~/models/bert-base-uncased/)."""
    name = os.path.basename(os.path.normpath(os.path.abspath(directory)))
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "model"
