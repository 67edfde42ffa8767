"""CTranslate2 Whisper directories (faster-whisper's format), read as the whole Whisper model.

Such a directory holds `model.bin` (every weight, under CTranslate2's names), `config.json`
(decoding settings: suppressed tokens, language ids, alignment heads) and the vocabulary
(`vocabulary.json` or `vocabulary.txt`, the first found, as CTranslate2 reads it;
`tokenizer.json` may lie beside it). It is read in the order of the Hugging Face reader
(`pipeline.models.checkpoint`), so that nothing large is allocated for one that cannot be used:
1. model.bin's header: binary version 6, spec `WhisperSpec` revision 3, each variable's name,
   dims, dtype and byte count (its bytes skipped; every count held against what is left of the
   file before anything is allocated), then the aliases; config.json and the vocabulary with
   bounds on size; one sha256 over the files;
2. the Whisper config that those shapes, the two head counts and the vocabulary imply;
3. every weight of `WhisperForConditionalGeneration` (built on the meta device) mapped to the
   variable, or the part of a fused one, that holds it: a missing, misshapen, unknown or unused
   variable is refused by name (`read_ctranslate2`);
4. only then the weights, one variable at a time, int8 and int16 ones dequantized with their
   scales; the k parts of fused biases must be zero (`load_state`, `whole_model`).

model.bin, little-endian (CTranslate2's `ModelSpec._serialize` writes it, `models::Model::load`
reads it): u32 binary version; string spec name; u32 revision; u32 variable count, then per
variable: string name, u8 rank, u32 per dim, u8 dtype id, u32 byte count, the bytes; u32 alias
count, then per alias: string alias, string target. A string is a u16 length counting a closing
NUL, then its bytes and the NUL.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from pipeline.models.checkpoint import (
    checkpoint_root,
    file_error,
    file_identity,
    files_sha256,
    first_of,
    inside,
    open_checkpoint_file,
    parse_json,
    printable,
    read_config,
    read_small_file,
    some,
)
from pipeline.models.spec import CheckpointError
from pipeline.models.whisper import ENCODER_POSITIONS, MAX_HEADS

FORMAT = "ctranslate2"
MODEL_FILE = "model.bin"
CONFIG = "config.json"
VOCABULARIES = ("vocabulary.json", "vocabulary.txt")  # CTranslate2 takes the first one present
TOKENIZER = "tokenizer.json"
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
BINARY_VERSION = 6
SPEC = "WhisperSpec"
REVISION = 3
# CTranslate2's DataType enum: id -> (name, dtype, bytes per value).
DTYPES: dict[int, tuple[str, torch.dtype, int]] = {
    0: ("float32", torch.float32, 4),
    1: ("int8", torch.int8, 1),
    2: ("int16", torch.int16, 2),
    3: ("int32", torch.int32, 4),
    4: ("float16", torch.float16, 2),
    5: ("bfloat16", torch.bfloat16, 2),
}
FLOATS = ("float32", "float16", "bfloat16")
QUANTIZED = ("int8", "int16")  # read with their `<name>_scale`: int8 one per row, int16 one in all
# Published Whisper models hold about 1,300 variables (large-v3), none of rank above 3, with
# names under 60 characters.
MAX_VARIABLES = 100_000
MAX_RANK = 8
MAX_NAME_BYTES = 1024
# The fewest bytes a variable takes in the file (name length, a bare NUL, rank, dtype, count)
# and an alias (two bare strings): counts larger than the file could hold are refused first.
MIN_VARIABLE_BYTES = 2 + 1 + 1 + 1 + 4
MIN_ALIAS_BYTES = 2 * (2 + 1)
# The one alias that makes a weight serve twice: the output projection tied to the embedding.
TIED = ("decoder/projection/weight", "decoder/embeddings/weight")
# CTranslate2's Activation enum: Whisper's decoder runs GELU.
GELU = 3
END_OF_TEXT = "<|endoftext|>"
START_OF_TRANSCRIPT = "<|startoftranscript|>"
# Per encoder (decoder) layer, the variables a Whisper layer has: counted to bound layer
# indices by the variables that could fill them.
LAYER_VARIABLES = {"encoder": 12, "decoder": 20}


@dataclass(frozen=True)
class Variable:
    """A variable as model.bin's header declares it (a tensor's bytes are not read)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # float32, int8, int16, int32, float16, bfloat16
    offset: int  # of its bytes in model.bin
    nbytes: int
    value: int | float | None = None  # a scalar's value (rank 0)


@dataclass(frozen=True)
class Source:
    """Where a Hugging Face weight lies in model.bin: part `part` of `parts` equal slices along
    the first dim of variable `name` (q, k, v fused in one variable: parts 3)."""

    name: str  # a variable of the file (aliases resolved)
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class CTranslate2Checkpoint:
    """A CTranslate2 Whisper directory as read and mapped before any weight is loaded."""

    shown: str  # "checkpoint DIR" as the caller named it, for messages
    directory: Path  # absolute, symlinks resolved
    model_file: Path  # model.bin, symlinks resolved (inside `directory`)
    config: WhisperConfig  # of the whole model: sizes from the shapes, token ids from the vocabulary
    variables: dict[str, Variable]
    aliases: dict[str, str]  # alias -> the variable it names
    sources: dict[str, Source]  # WhisperForConditionalGeneration state-dict key -> where it lies
    zero_biases: tuple[Source, ...]  # the k parts of fused biases: Whisper's k projections have none
    tokens: tuple[str, ...]  # the vocabulary, by token id
    lang_ids: tuple[int, ...]  # from config.json: the language tokens
    alignment_heads: tuple[tuple[int, int], ...]  # from config.json: (decoder layer, head) pairs
    files: tuple[Path, ...]  # what `files_sha256` hashes: model.bin, config.json, vocabulary, tokenizer
    sha256: str
    identities: tuple[tuple[int, int, int, int], ...]  # each file's (device, inode, size, mtime) when hashed
    weights: str  # how the weights are stored: "float16", "dequantized int8, float32", ...

    @property
    def description(self) -> str:
        """One line for reports: the format and how its weights were read."""
        return f"CTranslate2 {SPEC} (binary version {BINARY_VERSION}, revision {REVISION}), {self.weights} weights"


def holds_ctranslate2(directory: str | os.PathLike) -> bool:
    """Whether `directory` is a CTranslate2 model directory (a model.bin and no safetensors
    weights) rather than a Hugging Face one. Its model.bin's header then says which model it
    holds (`read_ctranslate2` reads Whisper's and refuses any other)."""
    path = Path(directory)
    return os.path.lexists(path / MODEL_FILE) and not any(os.path.lexists(path / name) for name in SAFETENSORS)


def read_ctranslate2(directory: str | os.PathLike, sha256: str | None = None) -> CTranslate2Checkpoint:
    """Read `directory` as a CTranslate2 Whisper model: the header of its model.bin, its
    config.json and vocabulary, the Whisper config they imply, each Hugging Face weight mapped
    to where it lies, and the sha256 of its files. No weight is read.

    `sha256`: the digest the files must have (an export's record of them). CheckpointError
    names the directory, the file and the variable for anything that cannot be used.
    """
    shown, root = checkpoint_root(directory)
    model_path = inside(root, MODEL_FILE, shown)
    if not os.path.lexists(model_path):  # one that is there but not a regular file is read, and refused so
        raise CheckpointError(f"{shown}: no {MODEL_FILE}")
    config_path = inside(root, CONFIG, shown)
    if not os.path.lexists(config_path):
        raise CheckpointError(f"{shown}: no {CONFIG}")
    variables, aliases = read_header(model_path, f"{shown}: {MODEL_FILE}")
    # config.json and the vocabulary are hashed from the bytes parsed: each file is read once.
    config_bytes, raw = read_config(config_path, shown)
    held = {config_path: config_bytes}
    vocabulary_name = next((name for name in VOCABULARIES if os.path.lexists(root / name)), None)
    if vocabulary_name is None:
        raise CheckpointError(f"{shown}: no {' or '.join(VOCABULARIES)} (a Whisper model is read with its vocabulary)")
    vocabulary_path = inside(root, vocabulary_name, shown)
    held[vocabulary_path] = read_small_file(vocabulary_path, f"{shown}: {vocabulary_name}")
    tokens = _vocabulary_tokens(held[vocabulary_path], vocabulary_name, f"{shown}: {vocabulary_name}")

    where = f"{shown}: {MODEL_FILE}"
    names = _Names(variables, aliases, where)
    config = _whisper_config(names, tokens, raw, f"{shown}: {vocabulary_name}", f"{shown}: {CONFIG}")
    sources, zero_biases = _plan(config, names, where)
    used_dtypes = {variables[s.name].dtype for s in sources.values()}
    weights = ", ".join([f"dequantized {d}" for d in QUANTIZED if d in used_dtypes]
                        + [d for d in FLOATS if d in used_dtypes])

    files = [model_path, config_path, vocabulary_path]
    if os.path.lexists(root / TOKENIZER):
        files.append(inside(root, TOKENIZER, shown))
    ordered = tuple(sorted(files, key=lambda p: p.relative_to(root).as_posix()))
    identities = tuple(file_identity(p) for p in ordered)
    digest = files_sha256(root, ordered, held, shown)
    if sha256 is not None and digest != sha256:
        raise CheckpointError(f"{shown}: its files' sha256 is {digest}, not {sha256} as the export recorded: "
                              "the checkpoint changed since; export again")
    lang_ids = _token_list(raw, "lang_ids", len(tokens), f"{shown}: {CONFIG}")
    heads = _alignment_heads(raw, config, f"{shown}: {CONFIG}")
    return CTranslate2Checkpoint(shown, root, model_path, config, variables, aliases, sources, zero_biases, tokens,
                                 lang_ids, heads, ordered, digest, identities, weights)


def load_state(checkpoint: CTranslate2Checkpoint, keys: Collection[str] | None = None) -> dict[str, torch.Tensor]:
    """The `WhisperForConditionalGeneration` state dict in float32, only `keys` of it if given
    (e.g. the encoder's), read from model.bin one variable at a time.

    Every k part of a fused bias is read and must be zero, whichever keys are asked for;
    CheckpointError names the variable otherwise, and when the files changed since they were
    hashed.
    """
    wanted = list(checkpoint.sources) if keys is None else list(keys)
    unknown = [k for k in wanted if k not in checkpoint.sources]
    if unknown:
        raise ValueError(f"keys: not weights of the Whisper model: {', '.join(unknown[:3])}")
    where = f"{checkpoint.shown}: {MODEL_FILE}"
    by_variable: dict[str, list[str]] = {}
    for key in wanted:
        by_variable.setdefault(checkpoint.sources[key].name, []).append(key)
    state: dict[str, torch.Tensor] = {}
    model_path = checkpoint.model_file
    with open_checkpoint_file(model_path, where) as f:
        if file_identity_of(f.fileno()) != checkpoint.identities[checkpoint.files.index(model_path)]:
            raise CheckpointError(f"{checkpoint.shown}: its files changed since they were read; nothing was built")
        for bias in checkpoint.zero_biases:
            values = _part(_read_float(f, checkpoint, bias.name, where), bias)
            if torch.any(values != 0):
                raise CheckpointError(
                    f"{where}: {bias.name} holds a nonzero k part (part {bias.part + 1} of {bias.parts}, "
                    f"max |x| {values.abs().max().item():.3g}): Whisper's k projection has no bias")
        for name, names in by_variable.items():
            tensor = _read_float(f, checkpoint, name, where)
            for key in names:
                state[key] = _part(tensor, checkpoint.sources[key]).contiguous()
    if tuple(file_identity(p) for p in checkpoint.files) != checkpoint.identities:
        raise CheckpointError(f"{checkpoint.shown}: its files changed while they were read; nothing was built")
    return state


def whole_model(checkpoint: CTranslate2Checkpoint) -> WhisperForConditionalGeneration:
    """The whole Whisper model (encoder, decoder, tied output projection) in float32, eval mode."""
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(checkpoint.config)
    state = load_state(checkpoint)
    # assign: the meta tensors are replaced by the loaded ones; ties are made again after.
    model.load_state_dict(state, strict=True, assign=True)
    if checkpoint.config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def read_header(path: Path, where: str) -> tuple[dict[str, Variable], dict[str, str]]:
    """The variables and aliases model.bin's header declares; CheckpointError (`where` first)
    for another spec, a count its bytes cannot hold, a truncated or damaged file."""
    with open_checkpoint_file(path, where) as f:
        try:
            return _parse(_Reader(f, os.fstat(f.fileno()).st_size, where), where)
        except OSError as exc:
            raise file_error(exc, where) from None


def file_identity_of(fd: int) -> tuple[int, int, int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


class _Reader:
    """Reads model.bin forward, each read held against what is left of the file first."""

    def __init__(self, f: BinaryIO, size: int, where: str) -> None:
        self.f, self.size, self.where, self.pos = f, size, where, 0

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise CheckpointError(f"{self.where} is truncated: {what} needs {n} bytes at byte {self.pos}, "
                                  f"{self.left} are left")
        data = self.f.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.where} is truncated: it shrank while it was read")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.left:
            raise CheckpointError(f"{self.where} is truncated: {what} needs {n} bytes at byte {self.pos}, "
                                  f"{self.left} are left")
        self.f.seek(n, os.SEEK_CUR)
        self.pos += n

    def number(self, code: str, what: str) -> int:
        return struct.unpack("<" + code, self.take(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        length = self.number("H", f"{what}'s length")
        if length == 0 or length > MAX_NAME_BYTES:
            raise CheckpointError(f"{self.where}: {what} at byte {self.pos - 2} has a length of {length}; "
                                  f"a string here has 1 to {MAX_NAME_BYTES} bytes: damaged, or not a model.bin")
        data = self.take(length, what)
        if data[-1] != 0 or 0 in data[:-1]:
            raise CheckpointError(f"{self.where}: {what} at byte {self.pos - length} is not a NUL-terminated "
                                  "string: damaged, or not a model.bin")
        try:
            return data[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.where}: {what} at byte {self.pos - length} is not UTF-8: "
                                  "damaged, or not a model.bin") from None


def _parse(r: _Reader, where: str) -> tuple[dict[str, Variable], dict[str, str]]:
    version = r.number("I", "the binary version")
    if version != BINARY_VERSION:
        raise CheckpointError(f"{where}: binary version {version}; this reader reads CTranslate2's version "
                              f"{BINARY_VERSION} (or the file is not a CTranslate2 model.bin)")
    spec = r.string("the spec name")
    if spec != SPEC:
        raise CheckpointError(f"{where}: holds a {printable(spec)} model, not a {SPEC} "
                              "(only Whisper is read in CTranslate2's format)")
    revision = r.number("I", "the spec revision")
    if revision != REVISION:
        raise CheckpointError(f"{where}: {SPEC} revision {revision}; this reader reads revision {REVISION}")
    count = r.number("I", "the variable count")
    if count > min(MAX_VARIABLES, r.left // MIN_VARIABLE_BYTES):
        raise CheckpointError(f"{where}: declares {count} variables, more than its {r.left} bytes left could "
                              f"hold or than the {MAX_VARIABLES} this reader reads")
    variables: dict[str, Variable] = {}
    for i in range(count):
        name = r.string(f"variable {i}'s name")
        shown = printable(name)
        rank = r.number("B", f"{shown}'s rank")
        if rank > MAX_RANK:
            raise CheckpointError(f"{where}: {shown} has rank {rank}; at most {MAX_RANK} is read")
        shape = struct.unpack(f"<{rank}I", r.take(4 * rank, f"{shown}'s dims"))
        if 0 in shape:
            raise CheckpointError(f"{where}: {shown} has shape {list(shape)}: an empty tensor")
        type_id = r.number("B", f"{shown}'s dtype")
        if type_id not in DTYPES:
            raise CheckpointError(f"{where}: {shown} has dtype id {type_id}; CTranslate2's are 0 to {len(DTYPES) - 1}")
        dtype, torch_dtype, size = DTYPES[type_id]
        nbytes = r.number("I", f"{shown}'s byte count")
        if nbytes != math.prod(shape) * size:
            raise CheckpointError(f"{where}: {shown} declares {nbytes} bytes for a {dtype} tensor of shape "
                                  f"{list(shape)} ({math.prod(shape) * size} bytes)")
        if name in variables:
            raise CheckpointError(f"{where}: {shown} is declared twice")
        offset, value = r.pos, None
        if rank == 0:
            value = torch.frombuffer(bytearray(r.take(nbytes, f"{shown}'s value")), dtype=torch_dtype).item()
        else:
            r.skip(nbytes, f"{shown}'s data")
        variables[name] = Variable(name, shape, dtype, offset, nbytes, value)
    count = r.number("I", "the alias count")
    if count > r.left // MIN_ALIAS_BYTES:
        raise CheckpointError(f"{where}: declares {count} aliases, more than its {r.left} bytes left could hold")
    aliases: dict[str, str] = {}
    for i in range(count):
        alias, target = r.string(f"alias {i}"), r.string(f"alias {i}'s target")
        if alias in variables or alias in aliases:
            raise CheckpointError(f"{where}: alias {printable(alias)} names a variable declared before")
        if target not in variables:
            raise CheckpointError(f"{where}: alias {printable(alias)} names {printable(target)}, "
                                  "which it does not hold")
        aliases[alias] = target
    if r.left:
        raise CheckpointError(f"{where}: {r.left} bytes follow its last alias: damaged, or not a model.bin")
    return variables, aliases


class _Names:
    """The file's variables by name, aliases resolved; what is looked up is remembered as used."""

    def __init__(self, variables: dict[str, Variable], aliases: dict[str, str], where: str) -> None:
        self.variables, self.aliases, self.where = variables, aliases, where
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.variables or name in self.aliases

    def get(self, name: str) -> Variable:
        if not self.has(name):
            raise CheckpointError(f"{self.where}: missing variable {name}")
        self.used.add(name)
        return self.variables[self.aliases.get(name, name)]

    def dim(self, name: str, rank: int, axis: int) -> int:
        variable = self.get(name)
        if len(variable.shape) != rank:
            raise CheckpointError(f"{self.where}: {name} has shape {list(variable.shape)}; "
                                  f"a Whisper model's has {rank} dims")
        return variable.shape[axis]

    def scalar(self, name: str, dtypes: tuple[str, ...]) -> int | float:
        variable = self.get(name)
        if variable.shape != () or variable.dtype not in dtypes:
            raise CheckpointError(f"{self.where}: {name} is a {variable.dtype} tensor of shape "
                                  f"{list(variable.shape)}, not a {' or '.join(dtypes)} scalar")
        return variable.value


def _layer_count(names: _Names, stack: str) -> int:
    """Layers of `stack`, numbered from 0 without a gap (a gap is a missing variable)."""
    pattern = re.compile(rf"{stack}/layer_(\d+)/")
    indices = {int(m.group(1)) for name in (*names.variables, *names.aliases) if (m := pattern.match(name))}
    count = len(indices)
    # Each layer needs its own variables: more layers than could be filled are refused here,
    # before a module of them is built.
    if count * LAYER_VARIABLES[stack] > len(names.variables) + len(names.aliases):
        raise CheckpointError(f"{names.where}: names {count} {stack} layers, more than its variables could fill")
    return count


def _whisper_config(names: _Names, tokens: tuple[str, ...], raw: dict[str, Any], vocabulary: str,
                    config_where: str) -> WhisperConfig:
    """The config of the Whisper model that model.bin's shapes describe; its output projection
    is tied to the token embedding when the file aliases one to the other."""
    where = names.where
    d_model = names.dim("encoder/conv1/weight", 3, 0)
    mel_bins = names.dim("encoder/conv1/weight", 3, 1)
    layers = {stack: _layer_count(names, stack) for stack in ("encoder", "decoder")}
    for stack, count in layers.items():
        if count == 0:
            raise CheckpointError(f"{where}: missing variable {stack}/layer_0/ffn/linear_0/weight (no {stack} layers)")
    heads = {stack: names.scalar(f"{stack}/num_heads", ("int16", "int32", "int8")) for stack in ("encoder", "decoder")}
    for stack, count in heads.items():
        if count < 1 or d_model % count:
            raise CheckpointError(f"{where}: {stack}/num_heads is {count}; it must divide d_model ({d_model})")
        if count > MAX_HEADS:
            raise CheckpointError(f"{where}: {stack}/num_heads is {count}; at most {MAX_HEADS} are read (each head "
                                  "holds a score matrix of the window's positions squared)")
    positions = names.dim("encoder/position_encodings/encodings", 2, 0)
    if positions != ENCODER_POSITIONS:
        raise CheckpointError(f"{where}: encoder/position_encodings/encodings has {positions} rows; Whisper's "
                              f"encoder takes {ENCODER_POSITIONS} positions (its 30 s window)")
    vocab_size = names.dim("decoder/embeddings/weight", 2, 0)
    if len(tokens) != vocab_size:
        raise CheckpointError(f"{vocabulary} holds {len(tokens)} tokens, the model's embedding {vocab_size}")
    special = {}
    for token in (END_OF_TEXT, START_OF_TRANSCRIPT):
        if token not in tokens:
            raise CheckpointError(f"{vocabulary} has no {token} token: not a Whisper vocabulary")
        special[token] = tokens.index(token)
    # Settings of the decoder's spec that Whisper's converter fixes; any other value is another model.
    fixed = {"decoder/activation": (GELU, "GELU"), "decoder/pre_norm": (1, "true"), "decoder/alibi": (0, "off"),
             "decoder/start_from_zero_embedding": (0, "off")}
    for name, (wanted, meaning) in fixed.items():
        value = names.scalar(name, ("int8", "int16", "int32"))
        if value != wanted:
            raise CheckpointError(f"{where}: {name} is {value}; Whisper's is {meaning} ({wanted})")
    # Off as a flag (int8 0), or as a factor (float 1): true would scale by sqrt(d_model).
    scaling = names.get("decoder/scale_embeddings")
    value = names.scalar("decoder/scale_embeddings", ("int8", "float32"))
    if value != (0 if scaling.dtype == "int8" else 1.0):
        raise CheckpointError(f"{where}: decoder/scale_embeddings is {value}; Whisper does not scale its embeddings")
    # Word alignment and ALiBi settings that do not change the model when ALiBi is off.
    for name in ("decoder/alignment_layer", "decoder/alignment_heads", "decoder/alibi_use_positive_positions",
                 "decoder/scale_alibi"):
        if names.has(name):
            names.scalar(name, ("int8", "int16", "int32", "float32"))
    tied = names.aliases.get("decoder/projection/weight") == "decoder/embeddings/weight"
    suppress = list(_token_list(raw, "suppress_ids", vocab_size, config_where))
    begin_suppress = list(_token_list(raw, "suppress_ids_begin", vocab_size, config_where))
    # Read before the config is made: their own CheckpointErrors are not the config's.
    ffn = {stack: names.dim(f"{stack}/layer_0/ffn/linear_0/weight", 2, 0) for stack in ("encoder", "decoder")}
    target_positions = names.dim("decoder/position_encodings/encodings", 2, 0)
    try:
        config = WhisperConfig(
            vocab_size=vocab_size, num_mel_bins=mel_bins, d_model=d_model,
            encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
            encoder_attention_heads=heads["encoder"], decoder_attention_heads=heads["decoder"],
            encoder_ffn_dim=ffn["encoder"], decoder_ffn_dim=ffn["decoder"],
            max_source_positions=positions, max_target_positions=target_positions,
            activation_function="gelu", scale_embedding=False, tie_word_embeddings=tied,
            pad_token_id=special[END_OF_TEXT], bos_token_id=special[END_OF_TEXT], eos_token_id=special[END_OF_TEXT],
            decoder_start_token_id=special[START_OF_TRANSCRIPT],
            suppress_tokens=suppress, begin_suppress_tokens=begin_suppress,
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: its shapes make no valid Whisper config: {' '.join(str(exc).split())}") from exc
    return config


def _attention(hf: str, ct2: str, fused: bool) -> tuple[dict[str, Source], list[Source]]:
    """Sources of one attention block: self-attention fuses q, k, v in linear_0 (out: linear_1);
    cross-attention holds q in linear_0 and fuses k, v in linear_1 (out: linear_2)."""
    if fused:
        qkv = f"{ct2}/linear_0"
        parts = {"q": (qkv, 0, 3), "k": (qkv, 1, 3), "v": (qkv, 2, 3)}
        out = f"{ct2}/linear_1"
    else:
        parts = {"q": (f"{ct2}/linear_0", 0, 1), "k": (f"{ct2}/linear_1", 0, 2), "v": (f"{ct2}/linear_1", 1, 2)}
        out = f"{ct2}/linear_2"
    sources: dict[str, Source] = {}
    for proj, (name, part, count) in parts.items():
        sources[f"{hf}.{proj}_proj.weight"] = Source(f"{name}/weight", part, count)
        if proj != "k":
            sources[f"{hf}.{proj}_proj.bias"] = Source(f"{name}/bias", part, count)
    sources[f"{hf}.out_proj.weight"] = Source(f"{out}/weight")
    sources[f"{hf}.out_proj.bias"] = Source(f"{out}/bias")
    name, part, count = parts["k"]
    return sources, [Source(f"{name}/bias", part, count)]


def _linear(hf: str, ct2: str) -> dict[str, Source]:
    return {f"{hf}.weight": Source(f"{ct2}/weight"), f"{hf}.bias": Source(f"{ct2}/bias")}


def _norm(hf: str, ct2: str) -> dict[str, Source]:
    return {f"{hf}.weight": Source(f"{ct2}/gamma"), f"{hf}.bias": Source(f"{ct2}/beta")}


def sources_for(config: WhisperConfig) -> tuple[dict[str, Source], list[Source]]:
    """Each `WhisperForConditionalGeneration` state-dict key -> the CTranslate2 variable (before
    aliases) that holds it, and the fused biases' k parts, which must be zero."""
    sources: dict[str, Source] = {}
    zeros: list[Source] = []
    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        sources.update(_linear(f"{enc}.{conv}", f"encoder/{conv}"))
    sources[f"{enc}.embed_positions.weight"] = Source("encoder/position_encodings/encodings")
    sources.update(_norm(f"{enc}.layer_norm", "encoder/layer_norm"))
    sources[f"{dec}.embed_tokens.weight"] = Source("decoder/embeddings/weight")
    sources[f"{dec}.embed_positions.weight"] = Source("decoder/position_encodings/encodings")
    sources.update(_norm(f"{dec}.layer_norm", "decoder/layer_norm"))
    sources["proj_out.weight"] = Source("decoder/projection/weight")
    for stack, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            hf, ct2 = f"model.{stack}.layers.{i}", f"{stack}/layer_{i}"
            blocks = [("self_attn", "self_attention", True)]
            if stack == "decoder":
                blocks.append(("encoder_attn", "attention", False))
            for hf_block, ct2_block, fused in blocks:
                attention, k_biases = _attention(f"{hf}.{hf_block}", f"{ct2}/{ct2_block}", fused)
                sources.update(attention)
                zeros.extend(k_biases)
                sources.update(_norm(f"{hf}.{hf_block}_layer_norm", f"{ct2}/{ct2_block}/layer_norm"))
            sources.update(_linear(f"{hf}.fc1", f"{ct2}/ffn/linear_0"))
            sources.update(_linear(f"{hf}.fc2", f"{ct2}/ffn/linear_1"))
            sources.update(_norm(f"{hf}.final_layer_norm", f"{ct2}/ffn/layer_norm"))
    return sources, zeros


def _plan(config: WhisperConfig, names: _Names, where: str) -> tuple[dict[str, Source], tuple[Source, ...]]:
    """The sources of every weight of the module `config` makes, aliases resolved, shapes checked
    against the module built on the meta device; refused unless every variable is used."""
    sources, zeros = sources_for(config)
    missing = [s.name for s in (*sources.values(), *zeros) if not names.has(s.name)]
    if missing:
        raise CheckpointError(f"{where}: missing variable {some([printable(n) for n in sorted(set(missing))])}")
    resolved = {key: Source(names.aliases.get(s.name, s.name), s.part, s.parts) for key, s in sources.items()}
    _check_served_once(sources, resolved, names)
    zero_biases = tuple(Source(names.aliases.get(s.name, s.name), s.part, s.parts) for s in zeros)
    for s in (*sources.values(), *zeros):
        names.get(s.name)
    scales = set()
    for name in {s.name for s in (*resolved.values(), *zero_biases)}:
        scales |= _check_dtype(names, name)
    unused = sorted({*names.variables, *names.aliases} - names.used - scales)
    if unused:
        raise CheckpointError(f"{where}: unknown variable {some([printable(n) for n in unused])}: "
                              "not part of a Whisper model")
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    wanted = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    if set(wanted) != set(resolved):
        # The Hugging Face model changed its weights' names: nothing here may guess them.
        raise CheckpointError(f"{where}: transformers' Whisper has weights this reader does not map: "
                              f"{some(sorted(set(wanted) ^ set(resolved)))}")
    # A fused bias's k part shares the shape check of its q (self-attention) or v (cross) part.
    for key, shape in wanted.items():
        source = resolved[key]
        stored = names.variables[source.name].shape
        whole = (shape[0] * source.parts, *shape[1:])
        if stored != whole:
            raise CheckpointError(f"{where}: {source.name} has shape {list(stored)}, the Whisper model its "
                                  f"other variables describe needs {list(whole)}")
    return resolved, zero_biases


def _check_served_once(sources: dict[str, Source], resolved: dict[str, Source], names: _Names) -> None:
    """Refuse a matrix (a variable of rank 2 or more) that aliases make serve as two weights,
    but for the output projection tied to the embedding: CTranslate2 aliases variables of
    equal values, which a trained model's matrices never are, and a file whose aliases repeat
    its matrices would build a model larger than its bytes (layers of one layer's weights)."""
    first: dict[Source, str] = {}
    for key, source in resolved.items():
        if len(names.variables[source.name].shape) < 2:
            continue  # equal norms and biases are aliased by CTranslate2's converter
        named = sources[key].name
        if source in first and (named, source.name) != TIED:
            raise CheckpointError(f"{names.where}: {named} names {source.name}, which already serves as "
                                  f"{sources[first[source]].name}: a matrix of the file serves as one weight "
                                  f"(only {TIED[0]} may name {TIED[1]})")
        first.setdefault(source, key)


def _check_dtype(names: _Names, name: str) -> set[str]:
    """The scale variables `name` is read with (none for a float one); CheckpointError for a
    dtype that is not read, a missing or misshapen scale."""
    variable = names.variables[name]
    if variable.dtype in FLOATS:
        return set()
    if variable.dtype not in QUANTIZED:
        raise CheckpointError(f"{names.where}: {name} is {variable.dtype}; weights are read as "
                              f"{', '.join(FLOATS)} or {' or '.join(QUANTIZED)} with a scale")
    scale_name = f"{name}_scale"
    scale = names.variables.get(scale_name)
    if scale is None:
        raise CheckpointError(f"{names.where}: missing variable {scale_name} ({name} is {variable.dtype})")
    # int8: one scale per output row (a convolution's rows are its output channels); int16: one.
    shape = (variable.shape[0],) if variable.dtype == "int8" else ()
    if scale.shape != shape or scale.dtype not in FLOATS:
        raise CheckpointError(f"{names.where}: {scale_name} is a {scale.dtype} tensor of shape {list(scale.shape)}; "
                              f"a {variable.dtype} weight's scale is float of shape {list(shape)}")
    return {scale_name}


def _read_float(f: BinaryIO, checkpoint: CTranslate2Checkpoint, name: str, where: str) -> torch.Tensor:
    """Variable `name` as float32, dequantized (value / scale) when it is int8 or int16."""
    variable = checkpoint.variables[name]
    tensor = _read(f, variable, where).to(torch.float32)
    if variable.dtype in QUANTIZED:
        scale = _read(f, checkpoint.variables[f"{name}_scale"], where).to(torch.float32)
        bad = ~torch.isfinite(scale) | (scale == 0)
        if bool(bad.any()):
            raise CheckpointError(f"{where}: {name}_scale holds {first_of(scale, bad)}: a {variable.dtype} weight is "
                                  "divided by finite, nonzero scales")
        rows = variable.shape[0] if variable.dtype == "int8" else 1
        tensor = (tensor.reshape(rows, -1) / scale.reshape(-1, 1)).reshape(variable.shape)
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        raise CheckpointError(f"{where}: {name} holds {first_of(tensor, bad)}" +
                              (" once dequantized" if variable.dtype in QUANTIZED else "") + ": weights are finite")
    return tensor


def _read(f: BinaryIO, variable: Variable, where: str) -> torch.Tensor:
    if variable.value is not None:
        return torch.tensor(variable.value, dtype=DTYPES[_type_id(variable.dtype)][1])
    f.seek(variable.offset)
    data = bytearray(variable.nbytes)
    if f.readinto(data) != variable.nbytes:
        raise CheckpointError(f"{where} is truncated: it shrank since its header was read")
    dtype = DTYPES[_type_id(variable.dtype)][1]
    if variable.nbytes == 0:
        return torch.empty(variable.shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(variable.shape)


def _type_id(dtype: str) -> int:
    return next(i for i, (name, _, _) in DTYPES.items() if name == dtype)


def _part(tensor: torch.Tensor, source: Source) -> torch.Tensor:
    return tensor.chunk(source.parts, dim=0)[source.part] if source.parts > 1 else tensor


def _vocabulary_tokens(data: bytes, name: str, where: str) -> tuple[str, ...]:
    """The tokens in the bytes of vocabulary.json (a JSON list of strings) or vocabulary.txt
    (one a line), the file `name`."""
    if name.endswith(".json"):
        tokens = parse_json(data, where)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise CheckpointError(f"{where} is not a JSON list of token strings")
        return tuple(tokens)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{where} is not UTF-8: {exc}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(lines)


def _token_list(raw: dict[str, Any], key: str, vocab_size: int, where: str) -> tuple[int, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v < vocab_size for v in value):
        raise CheckpointError(f"{where}: {key} must be a list of token ids from 0 to {vocab_size - 1}")
    return tuple(value)


def _alignment_heads(raw: dict[str, Any], config: WhisperConfig, where: str) -> tuple[tuple[int, int], ...]:
    value = raw.get("alignment_heads", [])
    ok = isinstance(value, list) and all(
        isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)
        and 0 <= pair[0] < config.decoder_layers and 0 <= pair[1] < config.decoder_attention_heads
        for pair in value)
    if not ok:
        raise CheckpointError(f"{where}: alignment_heads must be a list of [decoder layer, head] pairs "
                              f"within {config.decoder_layers} layers of {config.decoder_attention_heads} heads")
    return tuple((layer, head) for layer, head in value)
