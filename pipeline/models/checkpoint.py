"""Offline loading of a local Hugging Face checkpoint directory (config.json + safetensors).

A checkpoint is data from elsewhere, read in this order so that nothing large is allocated
for one that cannot be used:
1. its files, each required to lie inside the directory (symlinks resolved): config.json and
   the shard index read with bounds on size and nesting, the safetensors headers (names,
   shapes, dtypes; no data) of the shards, a whole model's tokenizer vocabulary where the
   family reads one (`ModelFamily.read_vocabulary`: whisper's, beside its decoder), and one
   sha256 over config.json, the safetensors files and the vocabulary's (what an export
   records, and its readers check);
2. the config, its sizes checked (`pipeline.models.sizes`) against what those headers hold;
3. the module built on the meta device (no memory): its weights held against the headers, so
   a missing, misshapen, non-float or unused tensor is refused by name (`plan_weights`);
4. only then the module itself, filled from the files (`load_weights`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import PretrainedConfig

from pipeline.ioutil import FileTooLarge, NotRegularFile, open_regular, read_regular
from pipeline.models.sizes import check_sizes, describe
from pipeline.models.spec import CheckpointError, ModelFamily

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# Full models nest the parts we build under `model.` (e.g. `model.decoder.layers.0...`). A
# module that nests its own parts there (Whisper's whole model) may be saved without it, as its
# inner model saves them (`WhisperModel`: `decoder.layers.0...`).
NESTED = "model."
KEY_PREFIXES = ("", NESTED)
# config.json and the shard index: published ones are a few kB (an index of thousands of
# tensors, a few hundred kB).
MAX_JSON_BYTES = 16 << 20
# Published configs nest 3 deep (config, vision_config, a list); Python's copy and
# transformers' parsing recurse once per level and would overflow long before the file's end.
MAX_JSON_DEPTH = 32
# transformers makes an id2label entry per label while it parses a config: 3 million take a
# minute. Published generation models have a handful.
MAX_LABELS = 100_000
# safetensors dtype codes of the weights that are read; torch's names for messages.
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
OTHER_DTYPES = {
    "I8": "int8", "U8": "uint8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "BOOL": "bool", "C64": "complex64", "C128": "complex128",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class StoredTensor:
    """A tensor as its safetensors header declares it (the file's data is not read)."""

    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors' code: F32, BF16, I8, ...

    @property
    def numel(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory as read before anything is built from it."""

    shown: str  # the directory as the caller named it, for messages
    directory: Path  # absolute, symlinks resolved
    config: PretrainedConfig  # its sizes checked against `tensors`
    tensors: dict[str, StoredTensor]  # by name, as the headers (and the shard index) declare them
    # config.json, the safetensors files and the vocabulary's, as `files_sha256` hashes them
    files: tuple[Path, ...]
    sha256: str
    # Identity (device, inode, size, mtime) of each file when hashed: the files loaded must
    # be the ones hashed.
    identities: tuple[tuple[int, int, int, int], ...]
    # The tokenizer vocabulary by id, where the family reads one and the checkpoint holds the
    # whole model and its vocabulary files (`ModelFamily.read_vocabulary`); None otherwise.
    tokens: tuple[str, ...] | None = None


def read_checkpoint(directory: str | os.PathLike, family: ModelFamily, sha256: str | None = None) -> Checkpoint:
    """Read `directory` as a `family` checkpoint: its config (sizes checked against the
    weights it holds), the tensors its safetensors headers declare, a whole model's tokenizer
    vocabulary (where `family` reads one), the sha256 of its files.

    `sha256`: the digest the files must have (an export's record of them). CheckpointError
    names the directory and the cause for anything that cannot be used.
    """
    shown, root = checkpoint_root(directory)
    config_path = inside(root, CONFIG, shown)
    if not config_path.exists():
        raise CheckpointError(f"{shown}: no {CONFIG}")
    config_bytes, raw = read_config(config_path, shown)
    model_type = raw.get("model_type")
    if model_type != family.model_type:
        raise CheckpointError(
            f"{shown}: model_type is {model_type!r}, not {family.model_type!r} as a {family.name} checkpoint needs"
        )
    _check_label_counts(raw, f"{shown}: {CONFIG}")
    tensors, weight_files = _tensor_table(root, shown)
    config = config_from_dict(raw, family, f"{shown}: {CONFIG}")
    check_sizes(config, family, f"{shown}: {CONFIG}", len(tensors), sum(t.numel for t in tensors.values()))
    vocabulary = None if family.read_vocabulary is None else family.read_vocabulary(root, shown, config, tensors.keys())
    # The files parsed are hashed from the bytes parsed: config.json and the vocabulary's.
    held = {config_path: config_bytes, **({} if vocabulary is None else vocabulary.files)}
    files = tuple(sorted({*weight_files, *held}, key=lambda p: p.relative_to(root).as_posix()))
    identities = tuple(file_identity(p) for p in files)
    digest = files_sha256(root, files, held, shown)
    if sha256 is not None and digest != sha256:
        raise CheckpointError(f"{shown}: its files' sha256 is {digest}, not {sha256} as the export recorded: "
                              "the checkpoint changed since; export again")
    return Checkpoint(shown, root, config, tensors, files, digest, identities,
                      None if vocabulary is None else vocabulary.tokens)


def checkpoint_root(directory: str | os.PathLike) -> tuple[str, Path]:
    """("checkpoint DIR" for messages, the directory absolute with symlinks resolved);
    CheckpointError unless it is a directory."""
    shown = f"checkpoint {directory}"
    try:
        root = Path(directory).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{shown}: cannot be resolved: {exc}") from None
    if not root.is_dir():
        raise CheckpointError(f"{shown}: not a directory")
    return shown, root


def config_from_dict(raw: dict[str, Any], family: ModelFamily, where: str) -> PretrainedConfig:
    try:
        # from_dict may consume keys of the dict it is given.
        return family.config_class.from_dict(copy.deepcopy(raw))
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as exc:
        # transformers' messages span lines; ours are one.
        raise CheckpointError(f"{where} is not a valid {family.name} config: {' '.join(str(exc).split())}") from exc


def read_config(path: Path, shown: str) -> tuple[bytes, dict[str, Any]]:
    """config.json's bytes as read (what the checkpoint's sha256 hashes) and the JSON object in
    them; CheckpointError (`shown`, "checkpoint DIR", first) for anything else."""
    data = read_small_file(path, f"{shown}: {CONFIG}")
    raw = parse_json(data, f"{shown}: {CONFIG}")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{shown}: {CONFIG} is not a JSON object")
    return data, raw


def read_json(path: Path, where: str) -> Any:
    """The JSON value in the regular file at `path`, refused (CheckpointError, `where` first)
    when it is larger than MAX_JSON_BYTES or nests deeper than MAX_JSON_DEPTH."""
    return parse_json(read_small_file(path, where), where)


def parse_json(data: bytes, where: str) -> Any:
    """The JSON value in `data` (bytes `read_small_file` read), refused (CheckpointError,
    `where` first) when it is not JSON or nests deeper than MAX_JSON_DEPTH."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise CheckpointError(f"{where} is unreadable: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError among them
        raise CheckpointError(f"{where} is unreadable: {exc}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise CheckpointError(f"{where} is unreadable: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_small_file(path: Path, where: str) -> bytes:
    """The bytes of the regular file at `path` (a config, an index, a vocabulary), refused
    (CheckpointError, `where` first) when it is not one or is larger than MAX_JSON_BYTES."""
    try:
        return read_regular(path, MAX_JSON_BYTES)
    except FileTooLarge:
        raise CheckpointError(f"{where} is unreadable: larger than {MAX_JSON_BYTES} bytes") from None
    except OSError as exc:
        raise file_error(exc, where) from None


def file_error(exc: OSError, where: str) -> CheckpointError:
    """The CheckpointError (`where` first) for a checkpoint file that could not be opened or
    read: one that is not a regular file says what it is."""
    if isinstance(exc, NotRegularFile):
        return CheckpointError(f"{where} is not a regular file ({exc.kind})")
    return CheckpointError(f"{where} is unreadable: {exc.strerror or exc}")


def open_checkpoint_file(path: Path, where: str) -> BinaryIO:
    """`path` opened by `pipeline.ioutil.open_regular`; CheckpointError (`file_error`) if not."""
    try:
        return open_regular(path)
    except OSError as exc:
        raise file_error(exc, where) from None


def files_sha256(root: Path, files: tuple[Path, ...], held: dict[Path, bytes] | None = None,
                 shown: str | None = None) -> str:
    """One sha256 over `files` (config.json, the safetensors files and a vocabulary's, in
    sorted order of their paths inside `root`): for each, its relative path, NUL, its size in decimal, NUL,
    then its bytes. `held`: files already read (config.json, a vocabulary), hashed from those
    bytes, so that the digest describes what was parsed. A file that is not a regular one is
    refused (CheckpointError, `shown` first: "checkpoint DIR")."""
    shown = shown or f"checkpoint {root}"
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(root).as_posix()
        if held is not None and path in held:
            data = held[path]
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
            continue
        with open_checkpoint_file(path, f"{shown}: {name}") as f:
            size = os.fstat(f.fileno()).st_size
            digest.update(f"{name}\0{size}\0".encode())
            try:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            except OSError as exc:
                raise file_error(exc, f"{shown}: {name}") from None
    return digest.hexdigest()


def plan_weights(checkpoint: Checkpoint, family: ModelFamily) -> dict[str, str]:
    """Module state-dict key -> checkpoint tensor name, for the module `family` builds from the
    checkpoint's config; CheckpointError unless the checkpoint holds exactly that module.

    The module is built on the meta device (shapes, no memory). Refused: a config whose module
    needs more values than the checkpoint holds in all, or that cannot be built; a weight the
    checkpoint lacks, holds in another shape or in a non-float dtype; and a weight of the
    built parts (e.g. `model.decoder.*`) that the module has no place for (a config with fewer
    layers than the checkpoint: a partly used checkpoint must never pass for it).
    """
    shown, where = checkpoint.shown, f"{checkpoint.shown}: {CONFIG}"
    try:
        with torch.device("meta"):
            module = family.make_module(checkpoint.config)
    except Exception as exc:  # whatever transformers raises for a config it cannot build
        raise CheckpointError(f"{where}: no {family.name} module can be built from it: "
                              f"{type(exc).__name__}: {exc}") from exc
    state = module.state_dict(keep_vars=True)
    wanted = {key: tuple(t.shape) for key, t in state.items()}
    # A tied weight (Whisper's output projection, its token embedding) is one tensor under two keys.
    needed = sum(t.numel() for t in {id(t): t for t in state.values()}.values())
    held = sum(t.numel for t in checkpoint.tensors.values())
    found = {key: next((c for c in _candidates(key, family) if c in checkpoint.tensors), None) for key in wanted}
    missing = [key for key, name in found.items() if name is None]
    if needed > held:
        # Where the sizes are right but weights are missing or smaller (a whole model's counts
        # match exactly), the message names them.
        unfit = [f"weights missing for {some(missing)}"] if missing else []
        unfit += [f"{name} has shape {checkpoint.tensors[name].shape}, the config implies {wanted[key]}"
                  for key, name in found.items()
                  if name is not None and checkpoint.tensors[name].shape != wanted[key]]
        raise CheckpointError(f"{where}: its sizes ({describe(checkpoint.config, family)}) make a module of "
                              f"{needed} weights, more than the {held} the checkpoint holds in all"
                              + "".join(f"; {line}" for line in unfit[:2]))
    plan: dict[str, str] = {}
    for key, shape in wanted.items():
        if found[key] is None:
            continue
        stored = checkpoint.tensors[found[key]]
        if stored.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{shown}: {found[key]} is {OTHER_DTYPES.get(stored.dtype, stored.dtype)}; only "
                                  f"{', '.join(FLOAT_DTYPES.values())} weights are read")
        if stored.shape != shape:
            raise CheckpointError(f"{shown}: {found[key]} has shape {stored.shape}, the config implies {shape}")
        plan[key] = found[key]
    if missing:
        raise CheckpointError(f"{shown}: weights missing for {some(missing)}")
    parts = {name for name, _ in module.named_children()}
    inner = {name for name, _ in module.get_submodule(NESTED[:-1]).named_children()} if NESTED[:-1] in parts else set()
    used = set(plan.values())
    unused = [name for name in checkpoint.tensors if name not in used and _under(name, parts, inner)]
    if unused:
        raise CheckpointError(f"{where}: its sizes ({describe(checkpoint.config, family)}) leave {len(unused)} of the "
                              f"checkpoint's {'/'.join(sorted(parts))} weights without a place in the module: "
                              f"{some(unused)}")
    return plan


def load_weights(module: torch.nn.Module, checkpoint: Checkpoint, plan: dict[str, str]) -> None:
    """Fill every parameter and buffer of `module` from the checkpoint, as `plan_weights` mapped them."""
    dtypes = {key: tensor.dtype for key, tensor in module.state_dict().items()}
    module.load_state_dict(read_weights(checkpoint, plan, dtypes), strict=True)


def read_weights(checkpoint: Checkpoint, plan: dict[str, str],
                 dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """The tensors `plan` maps (module state-dict key -> checkpoint tensor name), each cast to
    its key's dtype in `dtypes` as it is read, once for keys that share it (tied weights);
    CheckpointError when a file is unreadable, a weight holds NaN or inf once cast, or the
    files changed since they were hashed."""
    state: dict[str, torch.Tensor] = {}
    first: dict[str, str] = {}  # checkpoint tensor name -> the key it was read for
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for key, name in plan.items():
            if name in first and dtypes[first[name]] == dtypes[key]:
                state[key] = state[first[name]]
                continue
            first.setdefault(name, key)
            file = checkpoint.tensors[name].file
            try:
                if file not in handles:
                    handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
                tensor = handles[file].get_tensor(name)
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{checkpoint.shown}: {file.name} is unreadable: {exc}") from exc
            state[key] = tensor.to(dtypes[key])
            refuse_non_finite(state[key], f"{checkpoint.shown}: {name}")
    if tuple(file_identity(p) for p in checkpoint.files) != checkpoint.identities:
        raise CheckpointError(f"{checkpoint.shown}: its files changed while they were read; nothing was built")
    return state


def inside(root: Path, entry: str, shown: str, listed_in: str | None = None) -> Path:
    """`root / entry` with symlinks resolved, refused unless it lies inside `root`: an index
    naming `../other/w.safetensors` or `/etc/passwd`, or a link out of the directory."""
    source = f"{listed_in} entry {entry!r}" if listed_in else entry
    try:
        path = (root / entry).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL in the name
        raise CheckpointError(f"{shown}: {source} cannot be resolved: {exc}") from None
    if path == root or not path.is_relative_to(root):
        raise CheckpointError(f"{shown}: {source} lies outside the checkpoint directory ({path})")
    return path


def _tensor_table(root: Path, shown: str) -> tuple[dict[str, StoredTensor], set[Path]]:
    """Every tensor of the checkpoint by name, and the safetensors files holding them."""
    if os.path.lexists(root / SHARD_INDEX):  # a link out of the directory is refused, not passed over
        index = inside(root, SHARD_INDEX, shown)
        weight_map = _weight_map(read_json(index, f"{shown}: {SHARD_INDEX}"), f"{shown}: {SHARD_INDEX}")
        shards = {entry: inside(root, entry, shown, SHARD_INDEX) for entry in sorted(set(weight_map.values()))}
        absent = sorted(entry for entry, path in shards.items() if not os.path.lexists(path))
        if absent:
            raise CheckpointError(f"{shown}: shard(s) listed but absent: {', '.join(absent)}")
        headers = {path: _header(path, entry, shown) for entry, path in shards.items()}
        tensors = {}
        for name, entry in weight_map.items():
            stored = headers[shards[entry]].get(name)
            if stored is None:
                raise CheckpointError(f"{shown}: {SHARD_INDEX} places {name} in {entry}, which does not hold it")
            tensors[name] = stored
        return tensors, set(shards.values())
    single = inside(root, SINGLE_FILE, shown) if os.path.lexists(root / SINGLE_FILE) else None
    if single is None or not os.path.lexists(single):
        raise CheckpointError(f"{shown}: no {SINGLE_FILE} (only safetensors weights are read)")
    return _header(single, SINGLE_FILE, shown), {single}


def _weight_map(index: Any, where: str) -> dict[str, str]:
    if not isinstance(index, dict) or "weight_map" not in index:
        raise CheckpointError(f"{where} is unreadable: not a JSON object with a weight_map")
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{where} is unreadable: weight_map is {type(weight_map).__name__}, "
                              "not an object of tensor name -> file name")
    for name, entry in weight_map.items():
        if not isinstance(entry, str):
            raise CheckpointError(f"{where} is unreadable: weight_map[{name!r}] is {entry!r}, not a file name")
    return weight_map


def _header(path: Path, entry: str, shown: str) -> dict[str, StoredTensor]:
    """The tensors a safetensors file declares; safetensors checks that its data covers them."""
    open_checkpoint_file(path, f"{shown}: {entry}").close()  # safetensors would wait on a named pipe
    try:
        tensors = {}
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                piece = f.get_slice(name)
                tensors[name] = StoredTensor(path, tuple(piece.get_shape()), piece.get_dtype())
        return tensors
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{shown}: {entry} is unreadable: {exc}") from exc


def _check_label_counts(raw: dict[str, Any], where: str) -> None:
    for key, value in _items(raw):
        if key == "num_labels" and not (type(value) is int and 0 <= value <= MAX_LABELS):
            raise CheckpointError(f"{where}: num_labels is {value!r}; it must be an int from 0 to {MAX_LABELS}")


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of the objects in a JSON value, nested ones included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield from item.items()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _depth(value: Any) -> int:
    """How deep objects and lists nest in a JSON value (a scalar: 0); counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def file_identity(path: Path) -> tuple[int, int, int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _candidates(key: str, family: ModelFamily) -> list[str]:
    """The checkpoint names that may hold module state-dict `key`: its own and its aliases, bare
    or under `model.`, and those under `model.` without it (a save of the inner model)."""
    names = (key, *family.weight_aliases.get(key, ()))
    return [p + k for k in names for p in KEY_PREFIXES] + [k[len(NESTED):] for k in names if k.startswith(NESTED)]


def _under(name: str, parts: set[str], inner: set[str]) -> bool:
    """Whether checkpoint tensor `name` belongs to one of the module's top-level `parts`, by the
    names `_candidates` looks for: bare or under `model.`, or, without `model.`, to one of the
    `inner` parts the module nests there."""
    return name.split(".", 1)[0] in inner or any(
        name.startswith(prefix) and name[len(prefix):].split(".", 1)[0] in parts for prefix in KEY_PREFIXES)


def printable(value: Any, quoted: bool = False) -> str:
    """A name or value from a file, for a message, at most 80 characters: a printable string as
    it is, anything else (and anything `quoted`) as Python writes it."""
    text = value if isinstance(value, str) and value.isprintable() and not quoted else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def some(names: list[str]) -> str:
    """The first three of `names`, for a message, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def first_of(values: torch.Tensor, bad: torch.Tensor) -> str:
    """The first of `values` where `bad` holds, and how many there are, for a message."""
    count = int(bad.sum())
    return f"{values[bad].flatten()[0].item()}" + (f" ({count} such values)" if count > 1 else "")


def refuse_non_finite(tensor: torch.Tensor, where: str, cast: str | None = None) -> None:
    """CheckpointError (`where` first: "checkpoint DIR: NAME") when a float weight holds NaN or
    inf (once `cast` to that dtype, when given): a model built of it gives outputs that are not
    numbers, and an export would pass."""
    if tensor.is_floating_point():
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            raise CheckpointError(f"{where} holds {first_of(tensor, bad)}" + (f" as {cast}" if cast else "")
                                  + ": weights are finite")


def refuse_non_finite_parameters(module: torch.nn.Module, shown: str, dtype: str,
                                 names: dict[str, str] | None = None) -> None:
    """`refuse_non_finite` for each parameter of `module`, cast to `dtype` from the checkpoint
    `shown` (float32 weights past float16's range are inf in float16); `names` maps a
    parameter to its name in the checkpoint, for the message."""
    for key, parameter in module.named_parameters():
        refuse_non_finite(parameter.detach(), f"{shown}: {(names or {}).get(key, key)}",
                          None if dtype == "float32" else dtype)
