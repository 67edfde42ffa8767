"""A tokenizer vocabulary read from a Hugging Face checkpoint directory, in the files its
tokenizer saves:
- `vocab.json` (token -> id), with `added_tokens.json` (the added, special tokens -> id)
  beside it when present; or else
- `tokenizer.json`: `model.vocab` (token -> id) and `added_tokens` (a list of objects with
  `id` and `content`).

The vocabulary is the model's: each id from 0 to the config's vocab_size - 1 names exactly one
token. A file that is not JSON of that form, an id given to two tokens, an id outside the
model's vocabulary and an id that no file names are refused with a CheckpointError naming the
file. A token listed twice at the same id (GPT-2's <|endoftext|>, in both files) is one entry.
The files are read once, with the checkpoint reader's bounds; their bytes are hashed with the
checkpoint's files (`Vocabulary.files`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.models.checkpoint import CONFIG, inside, parse_json, printable, read_small_file
from pipeline.models.spec import CheckpointError, Vocabulary

VOCAB = "vocab.json"
ADDED_TOKENS = "added_tokens.json"
TOKENIZER = "tokenizer.json"


def vocabulary_files(root: Path) -> tuple[str, ...]:
    """The names of the vocabulary files in directory `root` that are read, in order: vocab.json
    (with added_tokens.json when present), else tokenizer.json; empty when there is neither."""
    # lexists: a link out of the directory is refused when it is read, not passed over.
    if os.path.lexists(root / VOCAB):
        return (VOCAB, ADDED_TOKENS) if os.path.lexists(root / ADDED_TOKENS) else (VOCAB,)
    if os.path.lexists(root / TOKENIZER):
        return (TOKENIZER,)
    return ()


def read_vocabulary(root: Path, shown: str, vocab_size: int, tail: tuple[str, ...] = ()) -> Vocabulary | None:
    """The vocabulary in checkpoint directory `root` (`vocabulary_files`), by id, for a model
    of `vocab_size` tokens; None where the directory holds no vocabulary files. `tail`: tokens
    that complete it where the files name exactly the ids before them (Whisper's timestamp
    tokens, which its tokenizer files saved before they were added lack).

    `shown`: the directory for messages ("checkpoint DIR"). CheckpointError names the file for
    one that is not a regular file, is larger than the reader's bound, is not JSON of its form
    or holds a token that is not a string or an id that is not an int; for an id given to two
    tokens, one outside 0 to vocab_size - 1, and ids that no file names.
    """
    names = vocabulary_files(root)
    if not names:
        return None
    if type(vocab_size) is not int or vocab_size < 1:
        raise CheckpointError(f"{shown}: {CONFIG}: vocab_size is {vocab_size!r}, not a positive int")
    files: dict[Path, bytes] = {}
    by_id: dict[int, tuple[str, str]] = {}  # id -> (token, the file that names it)
    for name in names:
        path = inside(root, name, shown)
        where = f"{shown}: {name}"
        files[path] = read_small_file(path, where)
        value = parse_json(files[path], where)
        entries = _tokenizer_entries(value, where) if name == TOKENIZER else _mapping_entries(value, where, "")
        for token, i in entries:
            if not 0 <= i < vocab_size:
                raise CheckpointError(f"{where}: {printable(token, quoted=True)} has id {i}, outside the model's "
                                      f"vocabulary (ids 0 to {vocab_size - 1}: vocab_size of {CONFIG})")
            held, source = by_id.setdefault(i, (token, name))
            if held != token:
                raise CheckpointError(f"{where}: id {i} is given to {printable(token, quoted=True)} and, in {source}, "
                                      f"to {printable(held, quoted=True)}: each id names one token")
    named = len(by_id)
    if tail and named + len(tail) == vocab_size and all(i < named for i in by_id):
        return Vocabulary(tuple(by_id[i][0] for i in range(named)) + tail, files)
    if named < vocab_size:
        # Every id is in range and held once: the first gap is among the first len(by_id) + 1.
        first = next(i for i in range(vocab_size) if i not in by_id)
        raise CheckpointError(f"{shown}: {' with '.join(names)}: no token for id {first} "
                              f"({vocab_size - len(by_id)} of the model's {vocab_size} ids have none)")
    return Vocabulary(tuple(by_id[i][0] for i in range(vocab_size)), files)


def _mapping_entries(value: Any, where: str, key: str) -> list[tuple[str, int]]:
    """(token, id) of a JSON object of token -> id; `key` names it inside its file ("" for the
    whole file)."""
    what = f"{where}: {key}" if key else where
    if not isinstance(value, dict):
        raise CheckpointError(f"{what} is {_kind(value)}, not a JSON object of token -> id")
    for token, i in value.items():
        # bool is an int to Python, not an id.
        if type(i) is not int:
            raise CheckpointError(f"{what}: the id of {printable(token, quoted=True)} is {printable(i, quoted=True)}, "
                                  "not an int")
    return list(value.items())


def _tokenizer_entries(value: Any, where: str) -> list[tuple[str, int]]:
    """(token, id) of tokenizer.json: its model's vocabulary, then its added tokens."""
    model = value.get("model") if isinstance(value, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(f"{where} is not a tokenizer: no model object")
    entries = _mapping_entries(model.get("vocab"), where, "model.vocab")
    added = value.get("added_tokens", [])
    if not isinstance(added, list):
        raise CheckpointError(f"{where}: added_tokens is {_kind(added)}, not a list")
    for n, item in enumerate(added):
        if not isinstance(item, dict):
            raise CheckpointError(f"{where}: added_tokens[{n}] is {_kind(item)}, not an object with id and content")
        token, i = item.get("content"), item.get("id")
        if not isinstance(token, str):
            raise CheckpointError(f"{where}: added_tokens[{n}]'s content is {printable(token, quoted=True)}, "
                                  "not a string")
        if type(i) is not int:
            raise CheckpointError(f"{where}: added_tokens[{n}]'s id is {printable(i, quoted=True)}, not an int")
        entries.append((token, i))
    return entries


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"
