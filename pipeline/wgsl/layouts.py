"""Layouts tuned on one device: for a launch that `choose_config` holds in registers, the
threads per row and workgroup size, and for plain half rows whether they are read in 16-byte
words, that timed fastest on one adapter through one WebGPU implementation (`pipeline.tune`,
scripts/tune_layouts.py). When they open their device, the Python runtime and the C++ backend
take the file that PIPELINE_LAYOUTS names, and refuse one tuned on another adapter or
implementation; unset, they take the table that ships with the package for the device's
adapter and implementation (pipeline/wgsl/tuned/, `shipped_for`), if one does; `none`, no
table. A launch without an entry keeps the rule.

Why a table and not a rule: on the H200 the fastest layout of a float16 launch follows how
full the GPU's last wave of workgroups is, and wgpu and Dawn disagree on it with the same
WGSL; a rule fitted to the launch's size lost up to 12% on shapes it was not fitted to
(docs/measurements.md, "Layouts tuned on the device"). Layouts change only the order of a
row's sums, so the values stay within the kernel's error bounds, and a given table gives the
same bits every run.

The file is lines of text, blank lines and lines from `#` skipped:

    pipeline-layouts 3
    adapter NVIDIA H200
    implementation wgpu
    layout layer_norm float16 float16 1 1 0 1024 4096 32 64 1 1.035

`layout` lines name a launch (the norm, layer_norm or rms_norm; dtype, weight and bias
dtype, weight, bias, stats stored, width, rows; flags 0 or 1), then its threads per row, its
workgroup size, whether its rows are read in 16-byte words (0 or 1: KernelConfig.wide_words),
and the gain measured when it was tuned (the rule's time over this layout's), which readers
check but do not use. An rms_norm launch has no bias and stores no stats. Version 2 had no
norm column: its files are read as tables of layer_norm launches. Version 1 had no words
column either; its files are refused, to be tuned again.

The C++ backend reads no text: beside each table lies its binary twin (`twin_path`: the
file's name and ".bin"), which `Layouts.write` writes with it and `write_twin` writes for a
table edited by hand. Little-endian u32 words: BINARY_MAGIC's 4 bytes, BINARY_VERSION, the
FNV-1a 64 hash of the text the twin was written from (low word first: a twin older than its
text is refused), the adapter's and the implementation's lengths in UTF-8 bytes, the count
of records; the two names, each padded with zeros to a multiple of 4 bytes; the records,
RECORD_FIELDS words each (norm code, dtype codes, flags, numbers); last, the FNV-1a 64 of
every byte before it. The shipped tables reach the C++ as the same bytes, generated into its
build (pipeline/native/generate.py), so one decoder reads both.

Imports no torch and no WebGPU implementation: the C++ build reads it.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass, field, replace
from importlib import resources

from pipeline.environment import LAYOUTS_MAX_BYTES
from pipeline.ioutil import read_regular, write_files_atomic
from pipeline.wgsl import DTYPES
from pipeline.wgsl.config import MAX_HOLD, MAX_THREADS_PER_ROW, MIN_WORKGROUP, KernelConfig, choose_config

MAGIC = "pipeline-layouts 3"
# Fields of a `layout` line after the word: the norm and the launch's 7, then threads,
# workgroup, words, gain; version 2's lines lack the norm.
LAYOUT_FIELDS = 12
V2_MAGIC = "pipeline-layouts 2"
NORMS = ("layer_norm", "rms_norm")  # KernelConfig.rms False, True
U32_MAX = 2**32 - 1
# Lines split at "\n", fields at ASCII blanks; unsigned integers, and a gain of digits with at
# most one point.
_BLANKS = " \t\r\v\f"
_FIELD = re.compile(r"[^ \t\r\v\f]+")
_INT = re.compile(r"[0-9]{1,18}")
_NUMBER = re.compile(r"[0-9]{1,18}(\.[0-9]{1,18})?")
# The first line of the version before, and what the reader says of a file that has it.
OLD_MAGIC = "pipeline-layouts 1"
OLD_VERSION = "a layouts file of version 1, without the words column: tune this device again (scripts/tune_layouts.py)"
# The tables that ship with the package, one a file named by `shipped_name`; messages name them
# by their place in the source tree, as the C++ backend (data generated from them) does.
SHIPPED_DIR = resources.files("pipeline.wgsl") / "tuned"
SHIPPED_SOURCE = "pipeline/wgsl/tuned"
# The binary twin (see above): its first bytes, version, a record's words, its name's suffix.
BINARY_MAGIC = b"PLYT"
BINARY_VERSION = 1
HEADER_WORDS = 6  # after the magic: version, text hash (2), the two names' lengths, records
RECORD_FIELDS = ("norm", "dtype", "affine_dtype", "has_weight", "has_bias", "write_stats", "width", "rows",
                 "threads_per_row", "workgroup", "wide_words")
TWIN_SUFFIX = ".bin"


class LayoutsError(ValueError):
    """A layouts file that cannot be read or used here: the message names the file, and the
    line where there is one."""


@dataclass(frozen=True, order=True)
class Launch:
    """What picks a layout: the launch's dtypes, affine parts, stats, width, rows and norm."""

    dtype: str
    affine_dtype: str
    has_weight: bool
    has_bias: bool
    write_stats: bool
    width: int
    rows: int
    norm: str = "layer_norm"  # one of NORMS

    def rule(self, subgroup_size: int = 0, pack2x16float: bool = False) -> KernelConfig:
        """The config `choose_config` gives this launch on a device with these probes."""
        return choose_config(self.width, self.has_weight, self.has_bias, subgroup_size, self.dtype,
                             self.affine_dtype, pack2x16float, rows=self.rows, write_stats=self.write_stats,
                             rms=self.norm == "rms_norm")

    @classmethod
    def of(cls, config: KernelConfig, rows: int) -> Launch:
        return cls(config.dtype, config.affine_dtype, config.has_weight, config.has_bias, config.write_stats,
                   config.width, rows, NORMS[config.rms])


@dataclass(frozen=True)
class Layout:
    threads_per_row: int
    workgroup: int
    wide_words: bool
    gain: float  # the rule's time over this layout's when tuned


@dataclass
class Layouts:
    """One device's table; `source` names where it came from, for messages."""

    adapter: str
    implementation: str
    entries: dict[Launch, Layout] = field(default_factory=dict)
    source: str = "<layouts>"

    def config(self, config: KernelConfig, rows: int) -> KernelConfig:
        """`config` (the rule's, for a launch of `rows` rows) in its tuned layout, if any."""
        layout = self.entries.get(Launch.of(config, rows))
        return config if layout is None else config.relaid(layout.threads_per_row, layout.workgroup,
                                                             layout.wide_words)

    def check_device(self, adapter: str, implementation: str) -> None:
        """LayoutsError unless this table was tuned on `adapter` through `implementation`."""
        if (adapter, implementation) != (self.adapter, self.implementation):
            raise LayoutsError(f"{self.source}: tuned on {self.adapter!r} through {self.implementation}; this "
                               f"device is {adapter!r} through {implementation}. Tune this device "
                               "(scripts/tune_layouts.py) or unset PIPELINE_LAYOUTS")

    def text(self) -> str:
        lines = [MAGIC, f"adapter {self.adapter}", f"implementation {self.implementation}",
                 "# layout norm dtype affine_dtype weight bias stats width rows threads_per_row workgroup wide_words "
                 "gain"]
        for launch, layout in sorted(self.entries.items(), key=lambda entry: entry[0]):
            flags = " ".join(str(int(f)) for f in (launch.has_weight, launch.has_bias, launch.write_stats))
            lines.append(f"layout {launch.norm} {launch.dtype} {launch.affine_dtype} {flags} {launch.width} "
                         f"{launch.rows} {layout.threads_per_row} {layout.workgroup} {int(layout.wide_words)} {layout.gain:.3f}")
        return "\n".join(lines) + "\n"

    def binary(self, text: bytes) -> bytes:
        """The binary twin of this table, written from `text` (its file's bytes)."""
        adapter, implementation = self.adapter.encode("utf-8"), self.implementation.encode("utf-8")
        words = [BINARY_VERSION, *_halves(fnv1a64(text)), len(adapter), len(implementation), len(self.entries)]
        for launch, layout in sorted(self.entries.items(), key=lambda entry: entry[0]):
            record = {**vars(launch), **vars(layout), "norm": NORMS.index(launch.norm),
                      "dtype": DTYPES.index(launch.dtype), "affine_dtype": DTYPES.index(launch.affine_dtype)}
            words.extend(int(record[name]) for name in RECORD_FIELDS)
        data = (BINARY_MAGIC + _u32s(words[:HEADER_WORDS]) + _padded(adapter) + _padded(implementation)
                + _u32s(words[HEADER_WORDS:]))
        return data + _u32s(_halves(fnv1a64(data)))

    def write(self, path: str | os.PathLike) -> None:
        """The table's text at `path` and its binary twin beside it, atomically as a pair."""
        text = self.text().encode("utf-8")
        write_files_atomic([(path, text, None), (twin_path(path), self.binary(text), None)])


def twin_path(path: str | os.PathLike) -> str:
    """Where the binary twin of the table at `path` lies: the C++ backend reads it."""
    return os.fspath(path) + TWIN_SUFFIX


def write_twin(path: str | os.PathLike) -> Layouts:
    """Write the binary twin of the table at `path` (one edited by hand: checked as `read`
    checks it); LayoutsError naming the line for a table that does not read."""
    table, text = _table_and_text(path)
    write_files_atomic([(twin_path(path), table.binary(text), None)])
    return table


def fnv1a64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of `data` (the C++ backend's `fnv1a64`)."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _u32s(words) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


def _halves(value: int) -> tuple[int, int]:
    return value & 0xFFFFFFFF, value >> 32


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


def unusable(config: KernelConfig, threads: int, workgroup: int, wide_words: bool = False) -> str | None:
    """Why `config` (the rule's) cannot take `threads` threads per row in workgroups of
    `workgroup`, in 16-byte words or not, or None: only held rows are relaid, to a power of
    two of threads that leaves each at most MAX_HOLD loads, in a power-of-two workgroup of
    MIN_WORKGROUP to MAX_THREADS_PER_ROW threads that holds whole rows; words where
    KernelConfig.unfit_for_words finds nothing against them."""
    if not config.hold:
        return f"rows of width {config.width} are streamed, not held: they keep the rule's layout"
    if not (1 <= threads <= MAX_THREADS_PER_ROW and threads & (threads - 1) == 0):
        return f"threads per row {threads} is not a power of two from 1 to {MAX_THREADS_PER_ROW}"
    if math.ceil(config.row_vecs / threads) > MAX_HOLD:
        return f"{threads} threads per row would each hold more than {MAX_HOLD} loads of a {config.width}-wide row"
    if not (max(MIN_WORKGROUP, threads) <= workgroup <= MAX_THREADS_PER_ROW and workgroup & (workgroup - 1) == 0):
        return (f"workgroup {workgroup} is not a power of two from {max(MIN_WORKGROUP, threads)} "
                f"to {MAX_THREADS_PER_ROW}")
    return replace(config, threads_per_row=threads).unfit_for_words() if wide_words else None


def parse(text: str, source: str = "<layouts>") -> Layouts:
    """The table in `text`; LayoutsError naming `source` and the line for anything else."""
    header: dict[str, str] = {}
    entries: dict[Launch, Layout] = {}
    first, version = True, 3
    for number, line in enumerate(text.split("\n"), 1):
        where = f"{source}:{number}"
        line = line.strip(_BLANKS)
        if not line or line.startswith("#"):
            continue
        if first:
            if line == V2_MAGIC:
                version = 2
            elif line != MAGIC:
                raise LayoutsError(f"{where}: " + (OLD_VERSION if line == OLD_MAGIC else
                                                   f"not a layouts file (its first line must be {MAGIC!r})"))
            first = False
            continue
        word, _, rest = line.partition(" ")
        if word in ("adapter", "implementation"):
            if word in header:
                raise LayoutsError(f"{where}: a second {word} line")
            header[word] = rest.strip(_BLANKS)
        elif word == "layout":
            launch, layout = _layout_line(_FIELD.findall(rest), where, version)
            if launch in entries:
                raise LayoutsError(f"{where}: a second layout for the same launch")
            entries[launch] = layout
        else:
            raise LayoutsError(f"{where}: unknown line {word!r} (adapter, implementation or layout)")
    if first:
        raise LayoutsError(f"{source}: empty; a layouts file starts with {MAGIC!r}")
    for word in ("adapter", "implementation"):
        if not header.get(word):
            raise LayoutsError(f"{source}: no {word} line")
    return Layouts(header["adapter"], header["implementation"], entries, source)


def _layout_line(values: list[str], where: str, version: int) -> tuple[Launch, Layout]:
    fields = LAYOUT_FIELDS if version == 3 else LAYOUT_FIELDS - 1
    if len(values) != fields:
        raise LayoutsError(f"{where}: a layout line of version {version} has {fields} fields after the word, "
                           f"this one {len(values)}")
    norm = values.pop(0) if version == 3 else "layer_norm"
    if norm not in NORMS:
        raise LayoutsError(f"{where}: {norm!r} is not one of {', '.join(NORMS)}")
    dtype, affine_dtype = values[0], values[1]
    for name in (dtype, affine_dtype):
        if name not in DTYPES:
            raise LayoutsError(f"{where}: {name!r} is not one of {', '.join(DTYPES)}")
    if affine_dtype not in (dtype, "float32"):
        raise LayoutsError(f"{where}: weight and bias of {affine_dtype} with rows of {dtype}: the kernel "
                           "takes them in the rows' dtype or float32")
    if not all(_INT.fullmatch(v) for v in values[2:10]) or not _NUMBER.fullmatch(values[10]):
        raise LayoutsError(f"{where}: flags, width, rows, threads, workgroup and words are unsigned integers and "
                           "gain a decimal number")
    flags = [int(v) for v in values[2:5]]
    width, rows, threads, workgroup, words = (int(v) for v in values[5:10])
    gain = float(values[10])
    if any(f not in (0, 1) for f in (*flags, words)):
        raise LayoutsError(f"{where}: weight, bias, stats and words are 0 or 1")
    if not (1 <= width <= U32_MAX and 1 <= rows <= U32_MAX):
        raise LayoutsError(f"{where}: width and rows are from 1 to {U32_MAX} (the kernel counts in u32)")
    if norm == "rms_norm" and (flags[1] or flags[2]):
        raise LayoutsError(f"{where}: an rms_norm launch has no bias and stores no stats")
    if gain <= 0:
        raise LayoutsError(f"{where}: gain {values[10]} is not positive")
    launch = Launch(dtype, affine_dtype, *(bool(f) for f in flags), width, rows, norm)
    why = unusable(launch.rule(), threads, workgroup, bool(words))
    if why:
        raise LayoutsError(f"{where}: {why}")
    return launch, Layout(threads, workgroup, bool(words), gain)


def read(path: str | os.PathLike, twin: bool = False) -> Layouts:
    """The table in the file at `path`, read as both runtimes read PIPELINE_LAYOUTS: only a
    regular file, opened without blocking, at most LAYOUTS_MAX_BYTES of it; LayoutsError when
    it cannot be read (a named pipe, /dev/zero, a larger file) or parsed. With `twin`, also
    refused unless its binary twin, which the C++ backend reads, is the one this text makes."""
    table, text = _table_and_text(path)
    if twin:
        where, remedy = twin_path(path), f"scripts/tune_layouts.py --twin {os.fspath(path)}"
        try:
            data = read_regular(where, LAYOUTS_MAX_BYTES)
        except OSError as exc:
            raise LayoutsError(f"{where}: cannot read the binary twin of {os.fspath(path)}, the table the C++ "
                               f"backend reads ({remedy} writes it): {exc.strerror or exc}") from None
        if data != table.binary(text):
            raise LayoutsError(f"{where}: not the binary twin of {os.fspath(path)} as it reads now (written from "
                               f"another version of it, or damaged): write it again ({remedy})")
    return table


def _table_and_text(path: str | os.PathLike) -> tuple[Layouts, bytes]:
    """The table at `path` and the file's bytes (decoded whole: line ends as they are in it)."""
    try:
        text = read_regular(path, LAYOUTS_MAX_BYTES)
        return parse(text.decode("utf-8"), os.fspath(path)), text
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutsError(f"{path}: cannot read the layouts file: {exc}") from None


def shipped_name(adapter: str, implementation: str) -> str:
    """The file name of the shipped table of `adapter` through `implementation`: the adapter's
    letters and digits in lower case, runs of anything else a dash ("NVIDIA H200", "wgpu":
    nvidia-h200-wgpu.txt)."""
    return "-".join(re.findall("[a-z0-9]+", adapter.lower()) + [implementation]) + ".txt"


def shipped() -> list[Layouts]:
    """The tables that ship with the package (SHIPPED_DIR), by file name."""
    files = sorted((f for f in SHIPPED_DIR.iterdir() if f.name.endswith(".txt")), key=lambda f: f.name)
    return [parse(f.read_bytes().decode("utf-8"), f"{SHIPPED_SOURCE}/{f.name}") for f in files]


def shipped_for(adapter: str, implementation: str) -> Layouts | None:
    """The shipped table tuned on `adapter` through `implementation` (both exactly as the table
    records them), or None: the one a device takes when PIPELINE_LAYOUTS is unset."""
    return next((t for t in shipped() if (t.adapter, t.implementation) == (adapter, implementation)), None)
