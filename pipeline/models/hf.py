"""Any architecture the installed transformers knows, as a `ModelSpec` ready for `pipeline.lower`.

    spec = from_config(tiny_config("clip"))           # seeded random weights, variant "custom"
    spec = from_hf("path/to/bert-base-uncased")       # a Hugging Face directory as users hold it
    spec.module(*spec.example_inputs)

`tiny_config` shrinks a model_type's own default config by the names of its fields (widths,
layers, heads, vocabularies, image sizes, per-stage lists, sub-configs), `example_inputs` builds
inputs from the model's forward signature and config, and the spec's module takes them
positionally and returns a flat tuple of tensors. Variants: "custom" for `from_config`, "hf"
for a directory whose weights were loaded, "hf-random" for one that holds none (its spec has
`checkpoint=None`: seeded random weights). Over the whole installed zoo about two thirds of
the base architectures build, run eagerly and export from their tiny configs; the rest fail
mostly on config fields tied by rules their names do not show (conv channel plans, state-space
sizes, input feature widths), forward arguments no signature explains (video frames, tracking
sessions, query embeddings), data-dependent branches at export, and optional libraries
(timm, natten, detectron2, torchaudio).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import PretrainedConfig
from transformers.utils import ModelOutput

from pipeline.ioutil import open_regular, open_torch_file
from pipeline.models.checkpoint import (
    CONFIG,
    FLOAT_DTYPES,
    OTHER_DTYPES,
    SHARD_INDEX,
    SINGLE_FILE,
    _check_label_counts,
    _header,
    _weight_map,
    checkpoint_root,
    file_error,
    file_identity,
    files_sha256,
    inside,
    parse_json,
    read_config,
    read_small_file,
    refuse_non_finite_parameters,
    some,
)
from pipeline.models.spec import CheckpointError, ModelSpec
from pipeline.wgsl import DTYPES

__all__ = ["base_architectures", "example_inputs", "from_config", "from_hf", "tasks", "tiny_config", "towers"]

BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
FORMAT = "huggingface"
# Variants: a config given in code; a directory's weights loaded; a directory without weights.
CUSTOM_VARIANT = "custom"
HF_VARIANT = "hf"
RANDOM_VARIANT = "hf-random"
# Example inputs: a batch of two short sequences.
# The tokenizer files transformers reads from a directory: each one present must be a regular
# file of at most TOKENIZER_MAX_BYTES (Gemma's tokenizer.json, 33 MB, is the largest we know).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "chat_template.jinja", "chat_template.json")
TOKENIZER_MAX_BYTES = 64 << 20

BATCH = 2
SEQUENCE = 8
WAVEFORM = 4000  # samples: a dozen frames after wav2vec2's 320-sample feature stride
FRAMES = 64  # feature frames of filter-bank inputs that fix no length of their own

# tiny_config's targets by kind of field; values are only ever shrunk, never grown.
TARGETS = {
    "width": 64, "ffn": 128, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "rotary_dim": 8,
    "vocab": 512, "positions": 128, "image": 64, "patch": 8, "experts": 4, "top_k": 2, "one": 1, "rank": 32,
    "groups": 2, "groups_width": 8, "queries": 16, "window": 2,
}
STAGE_HEADS = 2  # per-stage head lists: 2 divides every scaled stage width (multiples of 8)
STAGE_WIDTH_STEP = 8
# Windows counted in patches (Swin's 7 to 24) shrink; larger ones count pixels (Qwen2.5-VL's 112)
# and stay, since patches shrink with the image.
WINDOW_IN_PATCHES = 32

# Field name -> its kind; the first pattern that matches wins, so the specific ones (head
# dims, rotary dims, positions) come before the generic widths. Fields that match none keep
# their value, as do those _KEEP names (input geometry, strides, windows, labels).
_KEEP = re.compile(r"(^|_)(num_channels|in_channels|input_channels|num_mel_bins|mel_bins|feature_size|"
                   r"input_feat_per_channel|num_labels|sampling_rate|sample_rate|kernel_size|stride|"
                   r"chunk_size|sliding_window|num_frames|tubelet_size|num_feat_extract_layers)$|"
                   r"^_|feature_layers?$|_token$|"
                   r"feature_layer|layer_idx|layer_index|_index_end$|_start_layer")
_KINDS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(pattern), kind) for pattern, kind in (
    (r"(^|_)(max_)?(\w+_)?positions?(_embeddings)?$|^n_positions$|^n_ctx$|^max_seq_len$", "positions"),
    (r"rotary(_emb)?_dim$", "rotary_dim"),
    (r"(^|_)(head_dim|d_kv|dim_head|d_head|kv_channels|attention_head_size|head_size|d_rel)$", "head_dim"),
    (r"(key_value_heads|kv_heads)$", "kv_heads"),
    (r"(^|_)(n_head|n_heads|num_heads|heads|attention_heads|num_attention_heads)$", "heads"),
    (r"(^|_)(num_experts|num_local_experts|n_routed_experts|moe_num_experts)$", "experts"),
    (r"(experts_per_tok|moe_topk|^top_k|moe_k)$", "top_k"),
    (r"^(n_group|topk_group|n_shared_experts|num_shared_experts)$", "one"),
    (r"(^|_)(num_\w*layers|n_layers?|layers|depths?|\w+_layers|\w+_depth|num_self_attends_per_block)$", "layers"),
    (r"(intermediate_size|ffn_dim|(^|_)d_ff|ffn_hidden_size|d_inner|mlp_dim|linear_units|feed_forward_size|"
     r"intermediate_dim|mlp_hidden_size|dim_feedforward|_ffn_size)$", "ffn"),
    (r"_rank$", "rank"),
    (r"vocab_size$", "vocab"),
    (r"(^|_)(image_size|img_size|input_size|resolution)$", "image"),
    (r"(^|_)patch_size$", "patch"),
    (r"^(num_groups|norm_num_groups|resnet_groups|num_norm_groups)$", "groups"),
    (r"groups_width$", "groups_width"),
    # Windows of patches (Swin-like) fit the last stage's grid of a 64-pixel image.
    (r"^window_size$", "window"),
    (r"^num_(queries|latents|query_tokens|detection_tokens|denoising)$", "queries"),
    (r"(hidden_size|hidden_sizes|_dim|_dims|^dim|^dims|d_model|n_embd|embed_dim|embedding_size|hidden_dim|"
     r"(^|_)width|_channels|d_latents)$", "width"),
))
# Int lists of these names count layers per stage; other int lists named for layers list layer indices.
_STAGE_COUNTS = re.compile(r"^(depths?|\w*_depths?|num_\w*layers|layers|n_layers|\w*encoder_layers|\w*decoder_layers)$")
_TOKEN_ID = re.compile(r"(_id|_ids|_index)$")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "width")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads",
              "encoder_attention_heads", "decoder_attention_heads")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
# Config attributes that name a token standing for an image, video or audio clip in the text:
# such models take their media only together with that token laid out in input_ids.
_MEDIA_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index",
                 "audio_token_id", "audio_token_index", "image_token")


def base_architectures() -> list[str]:
    """model_type names of every base architecture of the installed transformers (those in
    transformers' MODEL_MAPPING_NAMES / CONFIG_MAPPING with a base model class), sorted."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(name for name in MODEL_MAPPING_NAMES if name in CONFIG_MAPPING_NAMES)


def tiny_config(model_type: str) -> PretrainedConfig:
    """The model_type's own config class, shrunk for a sweep: hidden sizes 64, 2 layers (each
    stage and tower too), 4 heads (2 per stage), vocabularies of 512, images of 64 pixels in
    patches of 8, 128 positions; sub-configs (text, vision, audio, encoder, decoder) likewise.
    Special token ids beyond the shrunk vocabulary move to its top; per-layer lists follow the
    layer count; head dims follow width / heads. ValueError naming model_type if unknown.
    """
    config_class = _config_class(model_type)
    try:
        raw = config_class().to_dict()
    except Exception as exc:  # a config class whose defaults do not build
        raise ValueError(f"model_type {model_type!r}: its default config does not build: "
                         f"{type(exc).__name__}: {exc}") from exc
    shrunk = _shrink(raw)
    vocab = _text_vocab(shrunk)
    _move_token_ids(shrunk, vocab, {})
    try:
        return config_class.from_dict(shrunk)
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as exc:
        raise ValueError(f"model_type {model_type!r}: its shrunk config is invalid: "
                         f"{' '.join(str(exc).split())}") from exc


def _config_class(model_type: str) -> type[PretrainedConfig]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown model_type {model_type!r} for transformers {transformers.__version__}")
    return CONFIG_MAPPING[model_type]


def _shrink(raw: dict[str, Any]) -> dict[str, Any]:
    """A config dict with its sizes shrunk by tiny_config's rules, sub-config dicts recursed."""
    out: dict[str, Any] = {}
    layers: dict[int, int] = {}  # original -> shrunk layer count, for per-layer lists
    # Fields named for no size but holding the width (a pooler's size defaulting to it) follow it.
    width = next((raw[k] for k in _WIDTH_KEYS if _is_int(raw.get(k))), None)
    for key, value in raw.items():
        if isinstance(value, dict) and value.get("model_type") == "timm_backbone":
            # timm is not a dependency (nor are its downloads): transformers' own ResNet, same stages out.
            from transformers import ResNetConfig

            out[key] = _shrink(ResNetConfig(out_indices=value.get("out_indices") or [4]).to_dict())
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("_config")) \
                and key != "quantization_config":
            out[key] = _shrink(value)
        elif _KEEP.search(key) or _TOKEN_ID.search(key):
            out[key] = value
        elif value is None and _kind(key) == "top_k" and any(_kind(k) == "experts" for k in raw):
            out[key] = TARGETS["top_k"]  # mixtures of experts whose defaults leave it unset
        elif _is_int(value) and _kind(key) is None and width is not None and value == width > TARGETS["width"]:
            out[key] = TARGETS["width"]
        elif _is_int(value):
            out[key] = _shrunk_int(key, value)
            if _kind(key) == "layers" and out[key] != value:
                layers[value] = out[key]
        elif _int_list(value) and ("layer" not in key or _STAGE_COUNTS.match(key)):
            out[key] = _shrunk_list(key, list(value))
        else:
            out[key] = value
    kept = min(layers.values(), default=None)
    for key, value in out.items():
        if kept is None or "layer" not in key or not isinstance(value, list) or _STAGE_COUNTS.match(key):
            continue
        if _int_list(value):
            # Layer indices (which layers are dense, global, ...): those of the remaining layers.
            out[key] = [v for v in value if 0 <= v < kept]
        elif len(value) in layers:
            # One entry per layer (layer_types): one per remaining layer.
            out[key] = value[: layers[len(value)]]
    if layers:
        # A backbone's stages are its layers: its default outputs (the last stage) follow the new count.
        for key in ("stage_names", "out_features", "out_indices"):
            out.pop(key, None)
        for key, value in out.items():
            if "layer" in key and isinstance(value, dict) and all(_layer_key(k) is not None for k in value):
                out[key] = {k: v for k, v in value.items() if _layer_key(k) < kept}
    # timm and pretrained backbones are downloads (and timm is not installed): transformers' own, random.
    for key in ("use_timm_backbone", "use_pretrained_backbone"):
        if out.get(key) is True:
            out[key] = False
    _fix_heads(out, raw)
    _fix_rope_sections(out)
    return out


def _takes_rope_sections(model_type: Any) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return False
    return "mrope_section" in (getattr(CONFIG_MAPPING[model_type], "ignore_keys_at_rope_validation", None) or ())


def _fix_rope_sections(config: dict[str, Any]) -> None:
    """Multimodal rotary sections (temporal, height, width) that add up to half the new head dim."""
    heads = next((config[k] for k in _HEAD_KEYS if _is_int(config.get(k)) and config[k] > 0), None)
    width = next((config[k] for k in _WIDTH_KEYS if _is_int(config.get(k))), None)
    head_dim = config.get("head_dim")
    if not _is_int(head_dim):
        head_dim = width // heads if width and heads else None
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "mrope_section" not in rope and _takes_rope_sections(config.get("model_type")):
        # Its model defaults them for the published head dim.
        rope["mrope_section"] = [2, 3, 3]
    for rope in (rope, config.get("rope_scaling")):
        sections = rope.get("mrope_section") if isinstance(rope, dict) else None
        if not head_dim or not _int_list(sections):
            continue
        # Partial rotary embeddings turn a fraction of each head.
        factor = config.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
        half = int(head_dim * factor) // 2
        if half and sum(sections) != half:
            scaled = [max(1, v * half // sum(sections)) for v in sections]
            scaled[-1] += half - sum(scaled)
            rope["mrope_section"] = scaled


def _layer_key(key: Any) -> int | None:
    """A per-layer dict's key as a layer index (JSON makes them strings), or None."""
    if _is_int(key):
        return key
    return int(key) if isinstance(key, str) and key.isdigit() else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_int(v) for v in value)


def _kind(key: str) -> str | None:
    return next((kind for pattern, kind in _KINDS if pattern.search(key)), None)


def _shrunk_int(key: str, value: int) -> int:
    kind = _kind(key)
    if kind is None or value <= 0 or (kind == "window" and value > WINDOW_IN_PATCHES):
        return value
    return min(value, TARGETS[kind])


def _shrunk_list(key: str, value: list[int]) -> list[int]:
    """Per-stage lists: widths scaled together to at most the width target (multiples of 8,
    their ratios kept), heads to at most STAGE_HEADS, the rest entry by entry."""
    kind = _kind(key)
    if kind is None or min(value) <= 0:
        return value
    if kind == "heads":
        return [min(v, STAGE_HEADS) for v in value]
    if kind == "width" and max(value) > TARGETS["width"]:
        scale = TARGETS["width"] / max(value)
        return [max(STAGE_WIDTH_STEP, round(v * scale / STAGE_WIDTH_STEP) * STAGE_WIDTH_STEP) for v in value]
    return [min(v, TARGETS[kind]) for v in value]


def _fix_heads(config: dict[str, Any], raw: dict[str, Any]) -> None:
    """Heads that divide the width, key/value heads that divide the heads (all of them where
    they were all of them: multi-head latent attention expands to every head), head dims that match."""
    width = next((config[k] for k in _WIDTH_KEYS if _is_int(config.get(k))), None)
    for key in _HEAD_KEYS:
        heads = config.get(key)
        if _is_int(heads) and width and heads > 0:
            while width % heads:
                heads -= 1
            config[key] = heads
    heads = next((config[k] for k in _HEAD_KEYS if _is_int(config.get(k)) and config[k] > 0), None)
    raw_heads = next((raw[k] for k in _HEAD_KEYS if _is_int(raw.get(k)) and raw[k] > 0), None)
    for key in _KV_KEYS:
        if heads and _is_int(config.get(key)) and config[key] > 0:
            config[key] = heads if raw.get(key) == raw_heads else math.gcd(heads, config[key])
        elif heads and key in config and config[key] is None:
            config[key] = heads  # unset means one per head, and some models divide by it as is
    if heads and width and "head_dim" in config and (config["head_dim"] is None or _is_int(config["head_dim"])):
        # An unset head dim is read as is by some models (None ** -0.5): set it.
        config["head_dim"] = width // heads
    if _is_int(config.get("qk_nope_head_dim")) and _is_int(config.get("qk_rope_head_dim")) and "qk_head_dim" in config:
        config["qk_head_dim"] = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]


def _text_vocab(config: dict[str, Any]) -> int:
    """The (shrunk) vocabulary size that token ids anywhere in the config must stay under."""
    sizes = [v for k, v in _walk(config) if k == "vocab_size" and _is_int(v) and v > 1]
    return min(sizes) if sizes else TARGETS["vocab"]


def _walk(config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        yield key, value
        if isinstance(value, dict):
            yield from _walk(value)


def _move_token_ids(config: dict[str, Any], vocab: int, moved: dict[int, int]) -> None:
    """Token ids at or beyond `vocab` move to its top, the same id to the same place everywhere
    (an image token named in the text config and the top-level config stays one token)."""
    def move(value: int) -> int:
        if value < vocab:
            return value
        if value not in moved:
            moved[value] = max(0, vocab - 1 - len(moved))
        return moved[value]

    for key, value in config.items():
        if not isinstance(key, str):  # id2label's keys
            continue
        if isinstance(value, dict):
            _move_token_ids(value, vocab, moved)
        elif _TOKEN_ID.search(key) and "layer" not in key:
            if _is_int(value):
                config[key] = move(value)
            elif isinstance(value, list) and value and all(_is_int(v) for v in value):
                config[key] = [move(v) for v in value]


# Task names: "base", "causal-lm", "seq2seq-lm", and one per AutoModelFor* mapping of the
# installed transformers ("image-classification", "audio-classification", "ctc", ...).
_TASK_ALIASES = {"seq2seq-lm": "seq-to-seq-causal-lm", "speech-seq2seq": "speech-seq-2-seq"}


def _task_mappings() -> dict[str, dict[str, Any]]:
    from transformers.models.auto import modeling_auto

    tasks = {"base": modeling_auto.MODEL_MAPPING_NAMES}
    for attr in dir(modeling_auto):
        match = re.fullmatch(r"MODEL_FOR_(\w+)_MAPPING_NAMES", attr)
        if match:
            tasks[match.group(1).lower().replace("_", "-")] = getattr(modeling_auto, attr)
    for alias, task in _TASK_ALIASES.items():
        tasks[alias] = tasks[task]
    return tasks


def tasks() -> tuple[str, ...]:
    """The task names `from_config` and `from_hf` take, sorted."""
    return tuple(sorted(_task_mappings()))


def _model_class(config: PretrainedConfig, task: str | None) -> type[torch.nn.Module]:
    """The class `task` names for the config's model_type; else its `architectures[0]` where
    transformers has that class; else its base class."""
    mappings = _task_mappings()
    if task is not None:
        if task not in mappings:
            raise ValueError(f"task {task!r} is unknown; choose one of {', '.join(sorted(mappings))}")
        names = mappings[task].get(config.model_type)
        if names is None:
            raise ValueError(f"task {task!r}: transformers {transformers.__version__} has no such model "
                             f"for model_type {config.model_type!r}")
    else:
        architecture = (config.architectures or [None])[0]
        cls = getattr(transformers, architecture, None) if isinstance(architecture, str) else None
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            return cls
        names = mappings["base"].get(config.model_type)
        if names is None:
            raise ValueError(f"model_type {config.model_type!r} has no base model class in transformers "
                             f"{transformers.__version__}; pass task=")
    name = names if isinstance(names, str) else names[0]
    cls = getattr(transformers, name, None)
    if cls is None:  # a mapping entry the installed transformers does not export
        raise ValueError(f"transformers {transformers.__version__} maps model_type {config.model_type!r} "
                         f"to {name}, which it does not have")
    return cls


def _configs(config: PretrainedConfig) -> Iterator[PretrainedConfig]:
    """The config and every config nested in it (text, vision, encoder, decoder...)."""
    seen: set[int] = set()
    stack = [config]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack.extend(v for v in vars(item).values() if isinstance(v, PretrainedConfig))


# Mixture-of-experts layers as transformers' batched matmuls over each token's experts: its
# default (grouped_mm) counts tokens per expert with aten.histc, which ExecuTorch's edge
# dialect refuses (every MoE router of the census stopped there), and its eager loop has
# data-dependent shapes. Models without experts ignore it.
EXPERTS = "batched_mm"


def _instantiate(cls: type, config: PretrainedConfig, seed: int) -> torch.nn.Module:
    """`cls` built from `config` with seeded random weights in eval mode: SDPA attention (one
    aten op per attention), eager where the class refuses SDPA; experts as EXPERTS."""
    # Made in float32 whatever dtype config.json names: weights are read into it, then cast once.
    torch.manual_seed(seed)
    try:
        model = cls._from_config(config, attn_implementation="sdpa", experts_implementation=EXPERTS,
                                 dtype=torch.float32)
    except ValueError as exc:
        if "attention" not in str(exc).lower() and "sdpa" not in str(exc).lower():
            raise
        torch.manual_seed(seed)
        model = cls._from_config(config, attn_implementation="eager", experts_implementation=EXPERTS,
                                 dtype=torch.float32)
    return model.eval()


class HFModule(torch.nn.Module):
    """A transformers model that takes its inputs positionally, in `input_names` order, and
    returns the tensors of its output as a flat tuple (nested outputs flattened, None dropped)."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.input_names):
            raise TypeError(f"takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                            f"got {len(inputs)}")
        output = self.model(**dict(zip(self.input_names, inputs)))
        flat: list[torch.Tensor] = []
        _flatten(output, flat)
        return tuple(flat)


def _flatten(value: Any, into: list[torch.Tensor]) -> None:
    # Caches, scalars and None carry nothing an exported program can return.
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, (ModelOutput, dict)):
        for item in value.values():
            _flatten(item, into)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _flatten(item, into)


def from_config(config: PretrainedConfig, *, task: str | None = None, seed: int = 0, dtype: str = "float32",
                inputs: str | os.PathLike | None = None, name: str | None = None) -> ModelSpec:
    """A transformers model built from `config` with seeded random weights, as a ModelSpec.

    task: "base", "causal-lm", "seq2seq-lm", "image-classification", ... (`tasks()`: one per
        AutoModelFor* mapping); default the config's `architectures[0]` where transformers has
        that class, else the base model (AutoModel's class).
    seed: seeds the weights and the example inputs.
    dtype: float32, float16 or bfloat16: the module and its floating-point inputs.
    inputs: a file torch.save'd with a dict input name -> tensor (or a tuple/list in the
        forward's parameter order) that replaces the built example inputs.
    name: the spec's name; default the config's model_type.
    The spec's module is an `HFModule` (positional inputs in `module.input_names` order, a flat
    tuple of tensors out); attention is SDPA where the class takes it, caches are off; the
    variant is "custom", the checkpoint None.
    """
    if not isinstance(config, PretrainedConfig):
        raise TypeError(f"config must be a transformers PretrainedConfig, got {type(config).__name__}")
    _check_dtype(dtype)
    return _build(copy.deepcopy(config), task, seed, dtype, inputs, name, None)


def _build(config: PretrainedConfig, task: str | None, seed: int, dtype: str,
           inputs: str | os.PathLike | None, name: str | None, loaded: _Loaded | None,
           directory: Path | None = None) -> ModelSpec:
    cls = _model_class(config, task)
    for item in _configs(config):
        # Exported programs return tensors only: no key/value caches.
        if hasattr(item, "use_cache"):
            item.use_cache = False
        item.return_dict = True
    model = _instantiate(cls, config, seed)
    if loaded is not None:
        loaded.load(model)
    model.to(getattr(torch, dtype))
    if loaded is not None:
        refuse_non_finite_parameters(model, loaded.shown, dtype, loaded.plan)
    if inputs is not None:
        named = read_inputs(inputs, model)
    else:
        named = example_inputs(model, model.config, seed=seed, directory=directory)
    names = tuple(named)
    values = tuple(x.to(getattr(torch, dtype)) if x.is_floating_point() else x for x in named.values())
    variant = CUSTOM_VARIANT if directory is None else HF_VARIANT if loaded is not None else RANDOM_VARIANT
    return ModelSpec(
        name=name or config.model_type,
        variant=variant,
        module=HFModule(model, names).eval(),
        example_inputs=values,
        dynamic_shapes=None,
        config=model.config,
        checkpoint=None if loaded is None else str(loaded.root),
        checkpoint_sha256=None if loaded is None else loaded.sha256,
        checkpoint_format=None if loaded is None else FORMAT,
        checkpoint_weights=None if loaded is None else loaded.stored,
        input_names=names,
    )


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _forward_parameters(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    """The forward's named parameters (no *args / **kwargs), in order."""
    return {name: p for name, p in inspect.signature(model.forward).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)}


def read_inputs(path: str | os.PathLike, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The inputs a `torch.save`'d file holds, by forward parameter name, in the forward's
    order: a dict name -> tensor, or a tuple/list matched to the forward's parameters in order.
    ValueError naming the file for anything else."""
    shown = f"inputs {path}"
    try:
        with open_torch_file(path) as f:  # no named pipe waited on, no archive inflated
            held = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{shown}: no such file") from None
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{shown}: unreadable (torch.save a dict name -> tensor): "
                         f"{' '.join(str(exc).split())[:300]}") from None
    parameters = list(_forward_parameters(model))
    if isinstance(held, (tuple, list)):
        if len(held) > len(parameters):
            raise ValueError(f"{shown}: {len(held)} tensors, but {type(model).__name__}.forward takes "
                             f"{len(parameters)} inputs")
        held = dict(zip(parameters, held))
    if not isinstance(held, dict):
        raise ValueError(f"{shown}: holds a {type(held).__name__}, not a dict input name -> tensor")
    if not held:
        raise ValueError(f"{shown}: holds an empty dict, not a dict input name -> tensor")
    unknown = [key for key in held if key not in parameters]
    if unknown:
        raise ValueError(f"{shown}: {type(model).__name__}.forward takes no {', '.join(map(repr, unknown))}; "
                         f"it takes {', '.join(parameters)}")
    bad = [key for key, value in held.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise ValueError(f"{shown}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a tensor")
    return {key: held[key] for key in parameters if key in held}


def example_inputs(model: torch.nn.Module, config: PretrainedConfig, *, seed: int = 0,
                   directory: str | os.PathLike | None = None) -> dict[str, torch.Tensor]:
    """Inputs for `model`, by forward parameter name in the forward's order, from its signature and config.

    The model's main input (input_ids, pixel_values, input_features, input_values), what the
    forward requires, and what goes with them: attention_mask, token_type_ids, bbox with
    input_ids; decoder_input_ids for encoder-decoders; both towers' inputs of a dual encoder
    (CLIP-like: input_ids and pixel_values). Models whose media must be laid out as tokens in the
    text (LLaVA-like) get text alone. A class's own `dummy_inputs` (where it defines one) choose
    the names and give their values. `directory`: a checkpoint directory whose tokenizer, when it
    has one, makes input_ids from text. ValueError naming what cannot be built.
    """
    parameters = _forward_parameters(model)
    own = _own_dummy_inputs(model, parameters)
    names = _input_names(model, config, parameters, own)
    generator = torch.Generator().manual_seed(seed)
    batch, sequence = BATCH, SEQUENCE
    if "input_ids" in own:
        batch, sequence = own["input_ids"].shape[:2]
    text = _tokenized(directory, config, names) if directory is not None else None
    if text is not None and "input_ids" in names:
        batch, sequence = text["input_ids"].shape
    built: dict[str, torch.Tensor] = {}
    missing = []
    patches = _patch_inputs(config, batch, generator, names)
    for name in names:
        if name in own:
            built[name] = own[name]
        elif text is not None and name in text:
            built[name] = text[name]
        elif name in patches:
            built[name] = patches[name]
        else:
            value = _make_input(name, config, batch, sequence, generator)
            if value is None:
                missing.append(name)
            else:
                built[name] = value
    if missing:
        raise ValueError(f"{type(model).__name__}: cannot build example inputs for {', '.join(missing)}; "
                         "pass --inputs FILE.pt (torch.save of a dict input name -> tensor)")
    return {name: built[name] for name in parameters if name in built}


def _own_dummy_inputs(model: torch.nn.Module, parameters: dict[str, inspect.Parameter]) -> dict[str, torch.Tensor]:
    """The class's own dummy_inputs (not PreTrainedModel's generic input_ids), those its forward takes."""
    from transformers import PreTrainedModel

    prop = inspect.getattr_static(type(model), "dummy_inputs", None)
    if prop is None or prop is inspect.getattr_static(PreTrainedModel, "dummy_inputs"):
        return {}
    try:
        dummy = model.dummy_inputs
    except Exception:  # a property that assumes a config field the model does not hold
        return {}
    if not isinstance(dummy, dict):
        return {}
    vocab = _vocab_size(model.config)
    kept = {k: v for k, v in dummy.items() if k in parameters and isinstance(v, torch.Tensor)}
    # Token ids must lie inside a shrunk vocabulary.
    if any(k.endswith("input_ids") and int(v.max()) >= vocab for k, v in kept.items()):
        return {}
    return kept


def _input_names(model: torch.nn.Module, config: PretrainedConfig, parameters: dict[str, inspect.Parameter],
                 own: dict[str, torch.Tensor]) -> list[str]:
    names = list(own)
    main = getattr(model, "main_input_name", "input_ids")
    names += [k for k in (main if isinstance(main, (list, tuple)) else [main]) if k in parameters and k not in names]
    names += [k for k, p in parameters.items() if p.default is inspect.Parameter.empty and k not in names]
    # Dual encoders (CLIP, CLAP) take both towers' inputs; LLaVA-like models would need their
    # media tokens laid out in the text, so they get text alone.
    media_tokens = any(getattr(c, attr, None) is not None for c in _configs(config) for attr in _MEDIA_TOKENS)
    if not media_tokens and not getattr(config, "is_encoder_decoder", False):
        towers = [k for k in ("input_ids", "pixel_values", "input_features") if k in parameters]
        if len(towers) > 1 and any(k in names for k in towers):
            names += [k for k in towers if k not in names]
    if "input_ids" in names:
        names += [k for k in ("attention_mask", "token_type_ids", "bbox") if k in parameters and k not in names]
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters \
            and "decoder_input_ids" not in names:
        names.append("decoder_input_ids")
    return names


def _vocab_size(config: PretrainedConfig, decoder: bool = False) -> int:
    candidates = []
    if decoder:
        candidates += [getattr(config, "decoder_vocab_size", None), getattr(getattr(config, "decoder", None),
                                                                             "vocab_size", None)]
    try:
        candidates.append(getattr(config.get_text_config(decoder=decoder), "vocab_size", None))
    except (AttributeError, TypeError, ValueError):
        pass
    candidates.append(getattr(config, "vocab_size", None))
    return next((v for v in candidates if _is_int(v) and v > 0), TARGETS["vocab"])


def _special_ids(config: PretrainedConfig) -> set[int]:
    ids: set[int] = set()
    for item in _configs(config):
        for key, value in vars(item).items():
            if _TOKEN_ID.search(key) and "layer" not in key:
                values = value if isinstance(value, (list, tuple)) else [value]
                ids.update(v for v in values if _is_int(v))
    return ids


def _token_ids(config: PretrainedConfig, shape: tuple[int, ...], generator: torch.Generator,
               decoder: bool = False) -> torch.Tensor:
    """Random ids under the vocabulary size, none of them a special token (an image token in
    the text would ask for an image)."""
    vocab = _vocab_size(config, decoder)
    special = _special_ids(config)
    allowed = torch.tensor([i for i in range(vocab) if i not in special] or [0])
    return allowed[torch.randint(len(allowed), shape, generator=generator)]


def _image_config(config: PretrainedConfig) -> PretrainedConfig:
    for key in ("vision_config", "image_config", "backbone_config", "encoder"):
        sub = getattr(config, key, None)
        if isinstance(sub, PretrainedConfig) and getattr(sub, "image_size", None) is not None:
            return sub
    return config


def _image_size(config: PretrainedConfig) -> tuple[int, int]:
    size = getattr(config, "image_size", None) or getattr(config, "img_size", None) \
        or getattr(config, "input_size", None) or 224
    if isinstance(size, dict):
        size = (size.get("height", 0), size.get("width", 0))
    if isinstance(size, (list, tuple)):
        return (int(size[0]), int(size[-1]))
    return (int(size), int(size))


def _make_input(name: str, config: PretrainedConfig, batch: int, sequence: int,
                generator: torch.Generator) -> torch.Tensor | None:
    """One example input by its forward parameter name; None where the name is not one we build."""
    if name == "input_ids":
        return _token_ids(config, (batch, sequence), generator)
    if name == "decoder_input_ids":
        return _token_ids(config, (batch, sequence), generator, decoder=True)
    if name in ("attention_mask", "decoder_attention_mask"):
        return torch.ones(batch, sequence, dtype=torch.long)
    if name == "token_type_ids":
        return torch.zeros(batch, sequence, dtype=torch.long)
    if name == "position_ids":
        return torch.arange(sequence).expand(batch, sequence).clone()
    if name == "bbox":
        # Boxes as (x0, y0, x1, y1) with x0 <= x1, y0 <= y1, inside the 2-d position tables.
        limit = min(1000, getattr(config, "max_2d_position_embeddings", 1024) - 1)
        corners = torch.randint(limit + 1, (batch, sequence, 2, 2), generator=generator)
        low, high = corners.min(dim=2).values, corners.max(dim=2).values
        return torch.stack([low[..., 0], low[..., 1], high[..., 0], high[..., 1]], dim=-1)
    if name == "pixel_values":
        vision = _image_config(config)
        height, width = _image_size(vision)
        channels = getattr(vision, "num_channels", 3) or 3
        frames = getattr(vision, "num_frames", None)
        shape = (batch, frames, channels, height, width) if _is_int(frames) else (batch, channels, height, width)
        return torch.randn(shape, generator=generator)
    if name == "pixel_mask":
        height, width = _image_size(_image_config(config))
        return torch.ones(batch, height, width, dtype=torch.long)
    if name == "past_values" and _is_int(getattr(config, "context_length", None)) \
            and _is_int(getattr(config, "num_input_channels", None)):
        # Patch-based time series (PatchTST, PatchTSMixer): (batch, context, channels).
        return torch.randn(batch, config.context_length, config.num_input_channels, generator=generator)
    if name == "input_features":
        return _features(config, batch, generator)
    if name == "input_values":
        return _waveform(config, batch, generator)
    return None


_GRIDS = ("grid_thw", "image_grid_thw")
PATCH_GRID = (1, 4, 4)  # frames, rows, columns of patches per image: rows and columns merge in pairs


def _patch_inputs(config: PretrainedConfig, batch: int, generator: torch.Generator,
                  names: list[str]) -> dict[str, torch.Tensor]:
    """Qwen-VL-like vision towers take images as flattened patches, all images' in one
    sequence ("hidden_states" or "pixel_values": patches x channels * frames * patch * patch),
    with each image's grid of patches (frames, rows, columns)."""
    grid_name = next((n for n in names if n in _GRIDS), None)
    vision = _image_config(config) if grid_name else None
    patch = getattr(vision, "patch_size", None)
    if grid_name is None or not _is_int(patch):
        return {}
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", None) or 3
    frames = getattr(vision, "temporal_patch_size", None) or 1
    grid = torch.tensor([PATCH_GRID] * batch)
    count = batch * math.prod(PATCH_GRID)
    values = torch.randn(count, channels * frames * patch * patch, generator=generator)
    flat = next((n for n in ("hidden_states", "pixel_values") if n in names), None)
    return {grid_name: grid, **({flat: values} if flat else {})}


def _audio_config(config: PretrainedConfig) -> PretrainedConfig:
    for key in ("audio_config", "encoder_config", "speech_config", "encoder"):
        sub = getattr(config, key, None)
        if isinstance(sub, PretrainedConfig):
            return sub
    return config


def _features(config: PretrainedConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Filter-bank features: whisper-like (batch, mel bins, 2 x source positions: its conv
    stride), else (batch, frames, features per frame)."""
    audio = _audio_config(config)
    mels = getattr(audio, "num_mel_bins", None)
    positions = getattr(audio, "max_source_positions", None)
    if _is_int(mels) and _is_int(positions):
        return torch.randn(batch, mels, 2 * positions, generator=generator)
    per_frame = getattr(audio, "input_feat_per_channel", None)
    if _is_int(per_frame):
        return torch.randn(batch, FRAMES, per_frame * getattr(audio, "input_channels", 1), generator=generator)
    for key in ("feature_size", "num_mel_bins", "input_dim", "n_mels", "spec_dim"):
        value = getattr(audio, key, None)
        if _is_int(value):
            return torch.randn(batch, FRAMES, value, generator=generator)
    return torch.randn(batch, FRAMES, 80, generator=generator)


def _waveform(config: PretrainedConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Waveforms (batch, samples), or (batch, channels, samples) for codecs; AST-like
    spectrogram models (mel bins and a max_length) take (batch, max_length, mel bins)."""
    audio = _audio_config(config)
    mels, length = getattr(audio, "num_mel_bins", None), getattr(audio, "max_length", None)
    if _is_int(mels) and _is_int(length) and getattr(audio, "model_type", "") == "audio-spectrogram-transformer":
        return torch.randn(batch, length, mels, generator=generator)
    channels = getattr(audio, "audio_channels", None)
    if _is_int(channels) or getattr(audio, "hop_length", None) is not None:
        # Codecs (EnCodec, DAC): (batch, channels, samples).
        return torch.randn(batch, channels if _is_int(channels) else 1, WAVEFORM, generator=generator)
    return torch.randn(batch, WAVEFORM, generator=generator)


def _tokenized(directory: str | os.PathLike, config: PretrainedConfig,
               names: list[str]) -> dict[str, torch.Tensor] | None:
    """input_ids (and attention_mask) of two short sentences, from the directory's own tokenizer
    where it holds one and its ids fit the model's vocabulary; None otherwise."""
    root = Path(directory)
    if "input_ids" not in names:
        return None
    present = _tokenizer_files(root)
    if not present & {"tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model"}:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
        sentences = ["The quick brown fox jumps over the lazy dog.", "A layer norm on a graphics card."]
        if tokenizer.pad_token is None:
            sentences = sentences[:1] * 2  # no padding token: equal lengths need no padding
        encoded = tokenizer(sentences, return_tensors="pt", padding=True)
    except Exception:  # tokenizer files of another library version or incomplete: random ids do
        return None
    ids = encoded["input_ids"]
    if ids.ndim != 2 or ids.shape[1] == 0 or int(ids.max()) >= _vocab_size(config):
        return None
    return {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded}


def _tokenizer_files(root: Path) -> set[str]:
    """The tokenizer files `root` holds: TOKENIZER_FILES, and where it holds any of them, every
    vocabulary file a tokenizer class of transformers names (Marian's source.spm, DeBERTa-v2's
    spm.model, XLM's bpe.codes, ...). CheckpointError naming one that is not a regular file
    (transformers would pass over a named pipe or folder as absent, or block on it) or is
    larger than TOKENIZER_MAX_BYTES (it would be read whole)."""
    present = {name for name in TOKENIZER_FILES if _tokenizer_file(root, name)}
    if present:
        present |= {name for name in _vocabulary_file_names() - set(TOKENIZER_FILES) if _tokenizer_file(root, name)}
    return present


def _tokenizer_file(root: Path, name: str) -> bool:
    """Whether `root` holds `name`, checked as _tokenizer_files says."""
    path, where = root / name, f"checkpoint {root}: {name}"
    if not os.path.lexists(path):
        return False
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise file_error(exc, where) from None
    if size > TOKENIZER_MAX_BYTES:
        raise CheckpointError(f"{where} is unreadable: larger than {TOKENIZER_MAX_BYTES} bytes")
    return True


@functools.cache
def _vocabulary_file_names() -> frozenset[str]:
    """The file names the installed transformers' tokenizer classes read (their
    `vocab_files_names`), about 1.5 s to import them all, once a process."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    names = set()
    for classes in TOKENIZER_MAPPING_NAMES.values():
        for name in filter(None, classes if isinstance(classes, (tuple, list)) else (classes,)):
            try:
                names.update(getattr(getattr(transformers, name), "vocab_files_names", {}).values())
            except Exception:  # a class needing a library not installed (sentencepiece, ...) reads nothing
                continue
    return frozenset(name for name in names if isinstance(name, str))


@dataclass
class _Loaded:
    """A directory's weights, checked against the model they are for, ready to load into it."""

    root: Path
    shown: str
    plan: dict[str, str]  # model state-dict key -> checkpoint tensor name
    read: Callable[[str], torch.Tensor]
    files: tuple[Path, ...]
    identities: tuple[tuple[int, int, int, int], ...]
    sha256: str
    stored: str  # the stored dtypes of the weights read ("float32", "bfloat16, float32")
    close: Callable[[], None]

    def load(self, model: torch.nn.Module) -> None:
        target = model.state_dict()
        try:
            state = {key: self.read(name).to(target[key].dtype) for key, name in self.plan.items()}
        finally:
            self.close()
        if tuple(file_identity(p) for p in self.files) != self.identities:
            raise CheckpointError(f"{self.shown}: its files changed while they were read; nothing was built")
        # Keys left missing are tied to loaded ones (`_plan` checked that).
        model.load_state_dict(state, strict=False)


def from_hf(directory: str | os.PathLike, *, task: str | None = None, seed: int = 0, dtype: str = "float32",
            inputs: str | os.PathLike | None = None) -> ModelSpec:
    """A Hugging Face model directory as users hold it, as a ModelSpec.

    It holds config.json and the weights as model.safetensors, pytorch_model.bin, or either
    sharded (with its *.index.json); or no weights at all: then the model has seeded random
    weights, its variant is "hf-random" and its checkpoint None. Weights must be exactly the
    model's: every parameter and persistent buffer present (tied ones once), none left over
    (a task's head when `task="base"` is not left over), shapes equal; pickled weights are read
    with `torch.load(weights_only=True)`. Its tokenizer, when it has one, makes the input_ids.
    The spec records the directory (absolute, symlinks resolved), the sha256 of config.json and
    the weight files, the format ("huggingface") and the stored dtypes. CheckpointError naming
    the directory for a missing directory, a missing or unreadable config.json, a model_type
    the installed transformers does not know, weights that do not fit or are not finite,
    unreadable weight files, a tokenizer file that is not a regular file or is larger than
    TOKENIZER_MAX_BYTES.
    task, seed, dtype, inputs: as for `from_config`.
    """
    _check_dtype(dtype)
    shown, root = checkpoint_root(directory)
    config_path = inside(root, CONFIG, shown)
    if not config_path.exists():
        raise CheckpointError(f"{shown}: no {CONFIG}")
    config_bytes, raw = read_config(config_path, shown)
    _check_label_counts(raw, f"{shown}: {CONFIG}")
    config = _hf_config(raw, shown)
    cls = _model_class(config, task)
    weights = _weight_files(root, shown)
    loaded = None
    if weights is not None:
        loaded = _plan(cls, config, root, shown, config_path, config_bytes, *weights)
    spec = _build(config, task, seed, dtype, inputs, None, loaded, directory=root)
    spec.config._name_or_path = str(root)
    return spec


def _hf_config(raw: dict[str, Any], shown: str) -> PretrainedConfig:
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise CheckpointError(f"{shown}: {CONFIG} names no model_type")
    try:
        config_class = _config_class(model_type)
    except ValueError:
        raise CheckpointError(f"{shown}: model_type {model_type!r} is unknown to the installed transformers "
                              f"{transformers.__version__}") from None
    try:
        return config_class.from_dict(copy.deepcopy(raw))
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as exc:
        raise CheckpointError(f"{shown}: {CONFIG} is not a valid {model_type} config: "
                              f"{' '.join(str(exc).split())}") from exc


# What a directory's weights are: their files (index first), shapes, stored dtype names, a reader.
_Weights = tuple[tuple[Path, ...], dict[Path, bytes], dict[str, tuple[int, ...]], dict[str, str],
                 Callable[[str], torch.Tensor], Callable[[], None]]


def _weight_files(root: Path, shown: str) -> _Weights | None:
    """The weights in `root`: safetensors (sharded or not) first, then PyTorch's pickles; None for none."""
    if os.path.lexists(root / SHARD_INDEX):
        index = inside(root, SHARD_INDEX, shown)
        return _safetensors(root, shown, index, *_shards(root, shown, index, SHARD_INDEX))
    if os.path.lexists(root / SINGLE_FILE):
        single = inside(root, SINGLE_FILE, shown)
        return _safetensors(root, shown, None, {single: None}, {})
    if os.path.lexists(root / BIN_INDEX):
        index = inside(root, BIN_INDEX, shown)
        return _pickles(root, shown, index, *_shards(root, shown, index, BIN_INDEX))
    if os.path.lexists(root / BIN_FILE):
        return _pickles(root, shown, None, {inside(root, BIN_FILE, shown): None}, {})
    return None


def _shards(root: Path, shown: str, index: Path, listed_in: str) -> tuple[dict[Path, set[str]], dict[Path, bytes]]:
    """Each shard an index lists -> the tensor names the index places in it; and the index's
    bytes as read (what the checkpoint's sha256 hashes: the bytes parsed, read once)."""
    data = read_small_file(index, f"{shown}: {listed_in}")
    weight_map = _weight_map(parse_json(data, f"{shown}: {listed_in}"), f"{shown}: {listed_in}")
    if not weight_map:
        raise CheckpointError(f"{shown}: {listed_in} is unreadable: its weight_map is empty")
    shards: dict[Path, set[str]] = {}
    for tensor, entry in weight_map.items():
        shards.setdefault(inside(root, entry, shown, listed_in), set()).add(tensor)
    absent = sorted(p.name for p in shards if not p.is_file())
    if absent:
        raise CheckpointError(f"{shown}: shard(s) listed but absent: {', '.join(absent)}")
    return shards, {index: data}


def _safetensors(root: Path, shown: str, index: Path | None, shards: dict[Path, set[str] | None],
                 held: dict[Path, bytes]) -> _Weights:
    shapes, dtypes, where = {}, {}, {}
    for path, listed in shards.items():
        if not path.is_file():
            raise CheckpointError(f"{shown}: {path.name} is not a regular file")
        header = _header(path, path.name, shown)
        for tensor in listed or header:
            if tensor not in header:
                raise CheckpointError(f"{shown}: {index.name} places {tensor} in {path.name}, which does not hold it")
            stored = header[tensor]
            shapes[tensor], where[tensor] = stored.shape, path
            dtypes[tensor] = FLOAT_DTYPES.get(stored.dtype) or OTHER_DTYPES.get(stored.dtype, stored.dtype)
    stack = ExitStack()
    handles: dict[Path, Any] = {}

    def read(tensor: str) -> torch.Tensor:
        path = where[tensor]
        try:
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            return handles[path].get_tensor(tensor)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{shown}: {path.name} is unreadable: {exc}") from exc

    return (*([index] if index else []), *shards), held, shapes, dtypes, read, stack.close


def _pickles(root: Path, shown: str, index: Path | None, shards: dict[Path, set[str] | None],
             held: dict[Path, bytes]) -> _Weights:
    """PyTorch's pickled weights, read with weights_only=True: tensors, nothing executable."""
    tensors: dict[str, torch.Tensor] = {}
    for path, listed in shards.items():
        try:
            with open_torch_file(path) as f:  # no named pipe waited on, no archive inflated
                state = torch.load(f, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{shown}: {path.name} is unreadable: {' '.join(str(exc).split())[:300]}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{shown}: {path.name} is unreadable: not a dict of tensor name -> tensor")
        for tensor in listed or state:
            if tensor not in state:
                raise CheckpointError(f"{shown}: {index.name} places {tensor} in {path.name}, which does not hold it")
            tensors[tensor] = state[tensor]
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()}
    return (*([index] if index else []), *shards), held, shapes, dtypes, tensors.__getitem__, lambda: None


def _plan(cls: type, config: PretrainedConfig, root: Path, shown: str, config_path: Path, config_bytes: bytes,
          files: tuple[Path, ...], held: dict[Path, bytes], shapes: dict[str, tuple[int, ...]],
          dtypes: dict[str, str], read: Callable[[str], torch.Tensor], close: Callable[[], None]) -> _Loaded:
    """The directory's weights held against the model `cls` builds (on the meta device: no memory).

    Its keys may carry the base model's prefix where the model does not (a task model's
    checkpoint read as the base model: the head's weights are then left aside), or lack it
    where the model has it (a base checkpoint read for a task: the head is then missing).
    """
    # Hashed first, loaded last: the files loaded must be the ones hashed.
    hashed = tuple(sorted({config_path, *files}, key=lambda p: p.relative_to(root).as_posix()))
    identities = tuple(file_identity(p) for p in hashed)
    digest = files_sha256(root, hashed, {config_path: config_bytes, **held})
    try:
        with torch.device("meta"):
            model = _instantiate(cls, copy.deepcopy(config), 0)
    except Exception as exc:  # whatever transformers raises for a config it cannot build
        close()
        raise CheckpointError(f"{shown}: {CONFIG}: no {cls.__name__} can be built from it: "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc
    state = model.state_dict(keep_vars=True)
    prefix = getattr(model, "base_model_prefix", "") or ""
    renamings: list[Callable[[str], str]] = [lambda k: k]
    if prefix:
        renamings += [lambda k: f"{prefix}.{k}", lambda k: k.removeprefix(f"{prefix}.")]
    rename = max(renamings, key=lambda f: sum(f(k) in shapes for k in state))
    plan = {key: rename(key) for key in state if rename(key) in shapes}
    # A tied weight (an output projection sharing the embedding) is saved once.
    found = {id(state[key]) for key in plan}
    ignored_missing = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]
    missing = [key for key in state if key not in plan and id(state[key]) not in found
               and not any(p.search(key) for p in ignored_missing)]
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    used = set(plan.values())
    head = rename("x") == f"{prefix}.x"  # keys outside the prefix are a task head's
    unexpected = [name for name in shapes if name not in used and not any(p.search(name) for p in ignored)
                  and not (head and not name.startswith(f"{prefix}."))]
    misshapen = [f"{name} {list(shapes[name])} (the model's {list(state[key].shape)})"
                 for key, name in plan.items() if tuple(state[key].shape) != shapes[name]]
    not_float = [f"{name} ({dtypes[name]})" for key, name in plan.items()
                 if state[key].is_floating_point() and dtypes[name] not in FLOAT_DTYPES.values()]
    problems = [f"{what} ({len(keys)}): {some(keys)}" for what, keys in (
        ("missing", missing), ("unexpected", unexpected), ("wrong shape", misshapen), ("not float", not_float))
        if keys]
    if problems:
        close()
        converted = _converted(cls, config, root, shown, hashed, identities, digest, dtypes)
        if converted is not None:
            return converted
        raise CheckpointError(f"{shown}: its weights do not match {cls.__name__} of its {CONFIG}: "
                              + "; ".join(problems))
    stored = ", ".join(sorted({dtypes[name] for name in used if dtypes[name] in FLOAT_DTYPES.values()}))
    return _Loaded(root, shown, plan, read, hashed, identities, digest, stored, close)


def _converted(cls: type, config: PretrainedConfig, root: Path, shown: str, hashed: tuple[Path, ...],
               identities: tuple, digest: str, dtypes: dict[str, str]) -> _Loaded | None:
    """The weights of a checkpoint saved under the names transformers renames on load (its
    conversion mappings: a ViT saved by `save_pretrained` holds `encoder.layer.N.attention...`
    for the module's `layers.N.attention...`), read by transformers' own loader; None unless
    every parameter is loaded and nothing is left over or misshapen."""
    try:
        model, info = cls.from_pretrained(root, config=copy.deepcopy(config), local_files_only=True,
                                          output_loading_info=True, dtype=torch.float32,
                                          experts_implementation=EXPERTS)
    except Exception:  # whatever transformers raises: the caller names the mismatch found first
        return None
    if any(info.get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        return None
    state = model.state_dict()
    stored = ", ".join(sorted({d for d in dtypes.values() if d in FLOAT_DTYPES.values()}))
    plan = {key: key for key in state}
    return _Loaded(root, shown, plan, state.__getitem__, hashed, identities, digest, stored, lambda: None)


def width(config: PretrainedConfig) -> int | None:
    """A config's model width, under the names architectures give it; None when it has none."""
    return next((v for k in _WIDTH_KEYS if _is_int(v := getattr(config, k, None))), None)




_MEDIA_INPUTS = ("pixel_values", "input_features", "input_values")


def towers(spec: ModelSpec) -> list[ModelSpec]:
    """The vision and audio towers of a multimodal spec (CLIP-like, LLaVA-like, speech-text),
    each as its own spec (name "<spec.name>.<sub-module path>", e.g. "clip.vision_model"), with
    the spec's weights: the LayerNorms a text-only input never reaches. Empty for one-tower models.

    A tower is a sub-model of the spec's model on a sub-config of its own that takes
    pixel_values, input_features or input_values (BLIP's vision model), else the base model of a sub-config
    (vision_config, audio_config, ...) whose weights all lie under one prefix in the spec's model
    (CLIP's vision transformer), filled from them. Inputs are built as `example_inputs` builds them.
    """
    if not isinstance(spec.module, HFModule):
        raise TypeError("towers() takes a spec from from_config or from_hf")
    from transformers import PreTrainedModel

    parent = spec.module.model
    dtype = next((p.dtype for p in parent.parameters() if p.is_floating_point()), torch.float32)
    found: dict[str, torch.nn.Module] = {}
    covered: set[int] = set()  # ids of the sub-configs whose tower was found
    for path, module in parent.named_modules():
        # A sub-model on the spec's own config (Whisper's encoder) is no tower: the spec's inputs reach it.
        if path and isinstance(module, PreTrainedModel) and module.config is not parent.config \
                and _takes_media(module) and not any(path.startswith(f"{p}.") for p in found):
            found[path] = module
            covered.add(id(module.config))
    parent_state = parent.state_dict()
    for key in sorted(vars(spec.config)):
        sub = getattr(spec.config, key)
        if not isinstance(sub, PretrainedConfig) or id(sub) in covered or key in ("text_config", "decoder"):
            continue
        try:
            model = _instantiate(_model_class(sub, "base"), copy.deepcopy(sub), 0)
        except Exception:  # a sub-config with no model of its own (or none that builds alone)
            continue
        state = model.state_dict()
        prefix = _tower_prefix(state, parent_state) if _takes_media(model) else None
        if prefix is None or any(prefix.startswith(f"{p}.") for p in found):
            continue
        model.load_state_dict({k: parent_state[prefix + k] for k in state}, strict=True)
        found[prefix.rstrip(".") or key] = model.to(dtype).eval()
    specs = []
    for path, model in found.items():
        inputs = example_inputs(model, model.config)
        names = tuple(inputs)
        specs.append(ModelSpec(
            name=f"{spec.name}.{path}", variant=spec.variant, module=HFModule(model, names).eval(),
            example_inputs=tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs.values()),
            dynamic_shapes=None, config=model.config, checkpoint=spec.checkpoint,
            checkpoint_sha256=spec.checkpoint_sha256, checkpoint_format=spec.checkpoint_format,
            checkpoint_weights=spec.checkpoint_weights, input_names=names,
        ))
    return specs


def _takes_media(model: torch.nn.Module) -> bool:
    """Whether `model` takes images or sound: as its main input, or as patches with their grid."""
    main = getattr(model, "main_input_name", None)
    parameters = _forward_parameters(model)
    return (isinstance(main, str) and main in parameters and main in _MEDIA_INPUTS) \
        or any(grid in parameters for grid in _GRIDS)


def _tower_prefix(state: dict[str, torch.Tensor], parent: dict[str, torch.Tensor]) -> str | None:
    """The prefix under which every tensor of `state` lies in `parent`, shapes equal; the
    shortest such sub-module path of the tower's own root, or None."""
    if not state:
        return None
    first = next(iter(state))
    # Towers nest their transformer one level down (CLIPVisionModel.vision_model): try
    # suffixes of each parent key that ends with the tower's first key.
    for parent_key in sorted((k for k in parent if k.endswith(first)), key=len):
        prefix = parent_key[: len(parent_key) - len(first)]
        if prefix and not prefix.endswith("."):
            continue
        if all(prefix + k in parent and parent[prefix + k].shape == v.shape for k, v in state.items()):
            return prefix
    return None
