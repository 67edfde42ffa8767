"""What the model zoo hands to the export pipeline, and how a model family plugs into it."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig


class CheckpointError(ValueError):
    """A `checkpoint=` directory that cannot be used: missing, broken, or of another model family."""


@dataclass
class ModelSpec:
    """A model ready for `pipeline.lower`: the module, inputs to trace it with, and where it came from.

    `dynamic_shapes` is None (static export) or a `torch.export` spec, one entry per
    example input, in the same order.
    """

    name: str
    variant: str
    module: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: tuple[dict[int, Any] | None, ...] | None
    config: PretrainedConfig
    # The checkpoint directory (absolute, symlinks resolved) and the sha256 of its files
    # (`pipeline.models.checkpoint.files_sha256`); None for seeded random weights.
    checkpoint: str | None = None
    checkpoint_sha256: str | None = None
    # Its format ("huggingface" or "ctranslate2") and how its weights were stored and read
    # ("float16", "dequantized int8, float32", ...); None for seeded random weights.
    checkpoint_format: str | None = None
    checkpoint_weights: str | None = None
    # The vocabulary by token id of a checkpoint that holds the whole model with it (a
    # CTranslate2 Whisper; a Hugging Face one with its decoder and tokenizer files): what its
    # decoder's transcripts are read in. None otherwise.
    checkpoint_tokens: tuple[str, ...] | None = None
    # The WAV files (absolute paths) whose log-mel are the example inputs, and the sha256 of
    # the bytes decoded (`pipeline.models.audio.read_wavs`); None for synthetic inputs.
    audio: tuple[str, ...] | None = None
    audio_sha256: str | None = None
    # The forward parameter name of each example input, in order (`pipeline.models.hf`'s
    # modules take them positionally); None where the module's own signature says it.
    input_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer vocabulary read from a checkpoint directory beside its weights."""

    tokens: tuple[str, ...]  # by token id: 0 to the model's vocab_size - 1, each once
    # The files it was read from (absolute, inside the directory) and their bytes as read:
    # the checkpoint's sha256 covers these bytes, the ones the tokens came from.
    files: dict[Path, bytes]


@dataclass(frozen=True)
class ConfigInt:
    """A config field the built module depends on: an int, or a list of ints (one per stage).

    key: its path in config.json ("d_model", "vision_config.depths"). Each value is at least
    `minimum` and, when `below` names another field (or is a number), less than it, entry by
    entry for lists. `repeats` marks a count of repeated blocks (layers, a stage's depth).
    """

    key: str
    minimum: int = 1
    below: str | int | None = None
    repeats: bool = False


@dataclass(frozen=True)
class ModelFamily:
    """One registry entry: how to build a family's module and its inputs from a config.

    `weight_aliases` lists, for a module state-dict key, other checkpoint keys that hold the
    same tensor (tied embeddings are saved once, under the tying model's name).
    """

    name: str
    variants: tuple[str, ...]
    default_variant: str
    model_type: str
    config_class: type[PretrainedConfig]
    make_module: Callable[[PretrainedConfig], torch.nn.Module]
    make_inputs: Callable[[PretrainedConfig, dict[str, Any], int], tuple[torch.Tensor, ...]]
    # The config fields that fix the architecture; a checkpoint matching a variant on all of
    # them is reported under that variant's name.
    signature: Callable[[PretrainedConfig], tuple]
    hidden_size: Callable[[PretrainedConfig], int]
    make_dynamic_shapes: Callable[[PretrainedConfig], tuple[dict[int, Any] | None, ...]] | None = None
    weight_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # What a checkpoint's config is checked for before anything is built
    # (`pipeline.models.sizes`): the fields that size the module, and (heads, width) pairs
    # of them where the heads must divide the width.
    sizes: tuple[ConfigInt, ...] = ()
    divides: tuple[tuple[str, str], ...] = ()
    # The tokenizer vocabulary of a checkpoint that holds the whole model (whisper: its decoder,
    # which turns the encoder output into token ids): (directory, "checkpoint DIR" for
    # messages, its config, the names of its tensors) -> the vocabulary, hashed with the
    # checkpoint's files, or None where the checkpoint is not whole or holds no vocabulary files.
    read_vocabulary: Callable[[Path, str, PretrainedConfig, Collection[str]], Vocabulary | None] | None = None
