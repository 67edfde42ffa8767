"""Hugging Face Whisper directories of the whole model as `save_pretrained` writes them, with the
tokenizer vocabulary in either form Whisper's tokenizer saves: vocab.json with added_tokens.json,
or tokenizer.json; the inner `WhisperModel` saved alone; and encoder-only ones."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file
from transformers import WhisperForConditionalGeneration

from support.ctranslate2_files import TOKENS

SPECIAL = TOKENS  # at ids 0, 1, 2: tiny_whisper's eos (and bos, pad) and decoder start ids


def whisper_tokens(vocab_size: int) -> tuple[str, ...]:
    """A vocabulary of `vocab_size` tokens by id: Whisper's special tokens first, at the ids
    `tiny_whisper`'s config gives them, then byte-level BPE pieces (Ġ: a leading space)."""
    return (*SPECIAL, *(f"Ġw{i}" for i in range(vocab_size - len(SPECIAL))))


def write_vocab_json(directory: Path, tokens: tuple[str, ...]) -> None:
    """vocab.json (the pieces, and <|endoftext|> as GPT-2's vocabulary holds it) and
    added_tokens.json (the special tokens), as Whisper's tokenizer saves them."""
    special = {t: i for i, t in enumerate(tokens) if t.startswith("<|")}
    vocab = {t: i for i, t in enumerate(tokens) if not t.startswith("<|")}
    vocab["<|endoftext|>"] = special["<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "added_tokens.json").write_text(json.dumps(special))


def write_tokenizer_json(directory: Path, tokens: tuple[str, ...]) -> None:
    """tokenizer.json: a BPE model's vocab (the pieces) and the special tokens as added tokens."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(tokens) if t.startswith("<|")]
    vocab = {t: i for i, t in enumerate(tokens) if not t.startswith("<|")}
    (directory / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab, "merges": []},
    }))


def write_whole(directory: Path, model: WhisperForConditionalGeneration, tokens: tuple[str, ...] | None,
                form: str = "vocab", max_shard_size: str | None = None) -> Path:
    """`model` saved whole (`save_pretrained`, safetensors; sharded with an index when
    `max_shard_size` is given) with `tokens` as vocab.json + added_tokens.json (`form`
    "vocab") or tokenizer.json ("tokenizer"); no vocabulary files when `tokens` is None."""
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    if tokens is not None:
        (write_vocab_json if form == "vocab" else write_tokenizer_json)(directory, tokens)
    return directory


def write_inner_model(directory: Path, model: WhisperForConditionalGeneration, tokens: tuple[str, ...]) -> Path:
    """`model`'s inner `WhisperModel` saved (`save_pretrained`: weights without `model.`, no
    output projection) with `tokens` as vocab.json + added_tokens.json."""
    model.model.save_pretrained(directory, safe_serialization=True)
    write_vocab_json(directory, tokens)
    return directory


def write_encoder_only(directory: Path, model: WhisperForConditionalGeneration, tokens: tuple[str, ...]) -> Path:
    """`model`'s config and its encoder's weights alone (no decoder), with vocabulary files."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(model.config.to_json_string())
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k.startswith("model.encoder.")}
    save_file(state, directory / "model.safetensors")
    write_vocab_json(directory, tokens)
    return directory
