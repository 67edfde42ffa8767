"""Offline loading of a local Hugging Face checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

import copy
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import PretrainedConfig

from pipeline.models.spec import CheckpointError, ModelFamily

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# Full models nest the parts we build under `model.` (e.g. `model.decoder.layers.0...`).
KEY_PREFIXES = ("", "model.")


def read_config(directory: Path, family: ModelFamily) -> PretrainedConfig:
    """The checkpoint's config, refused unless it is a `family` checkpoint."""
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory}: not a directory")
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory}: no config.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {directory}: config.json is unreadable: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"checkpoint {directory}: config.json is not a JSON object")
    model_type = raw.get("model_type")
    if model_type != family.model_type:
        raise CheckpointError(
            f"checkpoint {directory}: model_type is {model_type!r}, "
            f"not {family.model_type!r} as a {family.name} checkpoint needs"
        )
    return config_from_dict(raw, family, f"checkpoint {directory}: config.json")


def config_from_dict(raw: dict[str, Any], family: ModelFamily, where: str) -> PretrainedConfig:
    try:
        # from_dict may consume keys of the dict it is given.
        return family.config_class.from_dict(copy.deepcopy(raw))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{where} is not a valid {family.name} config: {exc}") from exc


def load_weights(module: torch.nn.Module, directory: Path, family: ModelFamily) -> None:
    """Fill every parameter and buffer of `module` from the directory's safetensors files.

    Refuses a checkpoint that lacks any of them or holds one of another shape: a partly
    random model must never pass for the checkpoint.
    """
    files = _weight_files(directory)
    wanted = module.state_dict()
    state: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for key, current in wanted.items():
            candidates = [p + k for k in (key, *family.weight_aliases.get(key, ())) for p in KEY_PREFIXES]
            found = next((c for c in candidates if c in files), None)
            if found is None:
                missing.append(key)
                continue
            file = files[found]
            try:
                if file not in handles:
                    handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
                tensor = handles[file].get_tensor(found)
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"checkpoint {directory}: {file.name} is unreadable: {exc}") from exc
            if tensor.shape != current.shape:
                raise CheckpointError(
                    f"checkpoint {directory}: {found} has shape {tuple(tensor.shape)}, "
                    f"the config implies {tuple(current.shape)}"
                )
            state[key] = tensor.to(current.dtype)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CheckpointError(f"checkpoint {directory}: weights missing for {shown}")
    module.load_state_dict(state, strict=True)


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = directory / SHARD_INDEX
    single = directory / SINGLE_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {directory}: {SHARD_INDEX} is unreadable: {exc}") from exc
        files = {name: directory / shard for name, shard in weight_map.items()}
        absent = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if absent:
            raise CheckpointError(f"checkpoint {directory}: shard(s) listed but absent: {', '.join(absent)}")
        return files
    if not single.is_file():
        raise CheckpointError(f"checkpoint {directory}: no {SINGLE_FILE} (only safetensors weights are read)")
    try:
        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"checkpoint {directory}: {SINGLE_FILE} is unreadable: {exc}") from exc
