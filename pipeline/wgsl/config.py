"""The native_layer_norm kernel's configuration and module text, shared by every runtime:
which variant serves a row width (`choose_config`), and the WGSL module written for it
(`KernelConfig.source`). The Python launch compiles these modules; the C++ build generates
its module pieces from the same functions and looks the rule up in its steps, evaluated from
`row_shape` (pipeline/native/generate.py): text and rule have one source.

Imports no torch and no WebGPU implementation: the C++ build reads it.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from pipeline.blob import DTYPE_CODES
from pipeline.wgsl import ShaderFiles

SHADER = "native_layer_norm.wgsl"
MIN_WORKGROUP = 64
MAX_THREADS_PER_ROW = 256
# Values of a row one thread holds in registers at most; wider rows are streamed.
MAX_HOLD = 8
# Loads a thread holds at least, where the row has them: the most threads per row that
# leave each this many. 3 for float32 rows loaded as vec4 or vec2 (3 to 6 each), 4 for
# scalar float32 rows and half rows (4 to 8 each): measured on the H200 (docs/measurements.md).
MIN_HOLD = 3
MIN_HOLD_NARROW_LOADS = 4
# A float32 launch whose rows split into exactly 4 vec4 loads a thread, and that has
# at least this many threads at that rule, takes twice the threads per row, 2 loads each:
# 1-8% faster on the H200 from 3 x 2^16 threads, 2-8% slower at 2^17 and fewer
# (docs/measurements.md, "How the kernel got here").
WIDE_LAUNCH_THREADS = 3 << 16
# Values a streaming thread loads in one loop step.
STREAM_UNROLL = 4
# Copies between host memory and mapped GPU memory of at least this many bytes run over
# threads where the machine has cores to spare: the Python runtime's device.copy_bytes and
# the C++ launch's HostCopy alike (docs/measurements.md, "The host path").
THREADED_COPY_BYTES = 1 << 20
# Workgroups in a grid's x dimension (WebGPU's default maxComputeWorkgroupsPerDimension):
# rows past it come through y.
MAX_GRID_X = 65535
# The kernel's Params struct (rows, eps, nan), padded to 16 bytes.
PARAMS_BYTES = 16

# Held rows in their frame whose threads hold this many values or more load weight and bias
# at the store, after the row sums, instead of with x, which would keep them in registers
# through the sums (KernelConfig.late_affine). On the H200, 12-14% faster at float32
# 1500x1280 and 10-11% at float16 4096x3072 (in the frame), from 2% faster to 3% slower at
# the other model shapes it covers; at the model shapes of fewer values a thread, late was up
# to 8% slower (docs/measurements.md, "How the kernel got here").
LATE_AFFINE_VALUES = 20

# Half rows take each thread's squares in its correction pass, about its share's first mean,
# and move them to the row's mean_d (KernelConfig.squares_with_correction); float32 rows take
# them in a pass of their own after mean_d. On the H200, over the 19 float16 model shapes, up
# to 7% less time (4096x3072), 2-4% at most, and within 1.5% slower at a few of width 1024 and
# 1280; in float32 from 3.5% faster to 3.5% slower, so float32 rows keep their own pass. Half
# rows whose mean is stored in float32 (float32 weight and bias, mean and rstd stored) keep the
# pass of their own too: with the squares in the correction pass, the H200's float32 mean of
# rows near zero came out 1.5-2.5x eager's error from float64 (median; 1x in their own pass),
# while out and rstd, and the mean rounded to a half dtype, did not move (docs/measurements.md,
# "How the kernel got here" and "Open questions").

# Held half rows of a launch that stores no mean and rstd (the models' delegates) take the
# textbook two-pass in d = x - first (KernelConfig.plain_two_pass, normalize_plain): half
# values make d exact where the spread is small beside the mean (within 2^12 of each other
# for float16, 2^16 for bfloat16). No float16 square overflows; bfloat16 rows whose squares
# pass float32's range give NaN, as they do in the frame (neither scales them).
# Its mean, first + mean_d, rounds at first's scale: stored, it came out up to 25x aten's
# error on rows of mean 0 (a float16 mean, rows of +-100 at width 1000) and 6.7x eager's in
# float32, so launches that store the mean keep rows in their frame.
# On the H200 the frame's path took 0.4-16% more time at the 9 float16 model shapes of 4 MB
# or more (wgpu and Dawn; most at width 1024), within 1.3% less at a few small ones; plain rows
# load weight and bias with x, which won or tied at every model shape. For bfloat16 rows the
# frame's path took 0.8-20% more time at all 19 model shapes (docs/measurements.md, "How the
# kernel got here").

# The markers of the kernel file's lines written out once per value (`written_out`). Held
# lines that load or use weight and bias come in two forms: with x, or at the store
# (`late_affine`); held lines that take the squares, in two: after the mean, or with the
# correction (`squares_with_correction`), whose lines marked SQUARES_WITH_CORRECTION are
# written once or not at all.
EACH_HELD_VALUE = "each held value"
EACH_HELD_AFFINE_WITH_X = "each held value, weight and bias with x"
EACH_HELD_AFFINE_AT_STORE = "each held value, weight and bias at the store"
EACH_HELD_SQUARES_AFTER_MEAN = "each held value, squares after the mean"
EACH_HELD_SQUARES_WITH_CORRECTION = "each held value, squares with the correction"
SQUARES_WITH_CORRECTION = "squares with the correction"
EACH_STEP_VALUE = "each step value"
ROWS_IN_THEIR_FRAME = "rows in their frame"
PLAIN_ROWS = "plain rows"
EACH_PLAIN_VALUE = "each plain value"
WIDE_ROWS = "plain rows in 16-byte words"
EACH_WIDE_WORD = "each 16-byte word"


class Written(NamedTuple):
    """How often a marker's lines are written out: `count` times ("once", "held": the values a
    thread holds, at least 1; "step": a loop step's; "words": held // 2, the 16-byte words)
    where every form in `when` holds and none in `unless` does, else not at all. The forms
    are KernelConfig's FORMS."""

    count: str
    when: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


FORMS = ("late_affine", "squares_with_correction", "plain_two_pass", "wide_words")
COUNTS = ("once", "held", "step", "words")
# The one rule for every marker (`KernelConfig.marker_counts`; the C++ reads it generated).
WRITTEN = {
    EACH_HELD_VALUE: Written("held", unless=("plain_two_pass",)),
    EACH_HELD_AFFINE_WITH_X: Written("held", unless=("plain_two_pass", "late_affine")),
    EACH_HELD_AFFINE_AT_STORE: Written("held", when=("late_affine",), unless=("plain_two_pass",)),
    EACH_HELD_SQUARES_AFTER_MEAN: Written("held", unless=("plain_two_pass", "squares_with_correction")),
    EACH_HELD_SQUARES_WITH_CORRECTION: Written("held", when=("squares_with_correction",), unless=("plain_two_pass",)),
    SQUARES_WITH_CORRECTION: Written("once", when=("squares_with_correction",), unless=("plain_two_pass",)),
    EACH_STEP_VALUE: Written("step"),
    ROWS_IN_THEIR_FRAME: Written("once", unless=("plain_two_pass",)),
    PLAIN_ROWS: Written("once", when=("plain_two_pass",), unless=("wide_words",)),
    EACH_PLAIN_VALUE: Written("held", when=("plain_two_pass",), unless=("wide_words",)),
    WIDE_ROWS: Written("once", when=("wide_words",)),
    EACH_WIDE_WORD: Written("words", when=("wide_words",)),
}
# The most values `choose_config` writes each marker's lines out for.
MOST_VALUES = {marker: {"once": 1, "held": MAX_HOLD, "step": STREAM_UNROLL, "words": MAX_HOLD // 2}[rule.count]
               for marker, rule in WRITTEN.items()}

# Per components in one load: the WGSL type of V, the sum of its components and its first.
_V_TYPES = {4: ("vec4<f32>", "v.x + v.y + v.z + v.w", "v.x"), 2: ("vec2<f32>", "v.x + v.y", "v.x"),
            1: ("f32", "v", "v")}
# Half rows with an even width, per components in one V: the word type holding one V (u32
# pairs), V from a word and a word from V (half.wgsl's unpack_pair / pack_pair).
_HALF_WORDS = {
    4: ("vec2<u32>", "vec4<f32>(unpack_pair(w.x), unpack_pair(w.y))", "vec2<u32>(pack_pair(v.xy), pack_pair(v.zw))"),
    2: ("u32", "unpack_pair(w)", "pack_pair(v)"),
}


@dataclass(frozen=True)
class KernelConfig:
    """What is fixed per pipeline: chosen from the row width and which affine parts exist."""

    width: int  # elements per row, compiled in: a pipeline serves one width
    threads_per_row: int
    has_weight: bool
    has_bias: bool
    subgroup_size: int = 0  # the adapter's (0: no subgroup operations, workgroup-memory merges)
    workgroup: int = MIN_WORKGROUP
    # 0: rows streamed (read twice), `unroll` values a loop step; k > 0: each thread holds
    # its k values of the row (read once), weight and bias loaded with them or at the
    # store (`late_affine`).
    hold: int = 0
    unroll: int = 1
    dtype: str = "float32"  # of x and out
    affine_dtype: str = "float32"  # of weight and bias: dtype, or float32 with a half dtype
    # float16 stores through pack2x16float: only where the device probe saw it round as aten
    pack2x16float: bool = False
    # mean and rstd stored (a delegate whose program uses only the output does without)
    write_stats: bool = True
    # Plain half rows read and written in 16-byte words of eight values, HOLD / 2 a thread
    # (normalize_wide): a tuned layout's choice (pipeline.wgsl.layouts.unusable says where
    # it fits), never the rule's.
    wide_words: bool = False
    # RMSNorm (aten.rms_norm): rows not centred, rstd of the mean of squares; weight only, no
    # mean and rstd stored.
    rms: bool = False

    def __post_init__(self) -> None:
        why = self.wide_words and self.unfit_for_words()
        if why:
            raise ValueError(why)
        if self.rms and (self.has_bias or self.write_stats):
            raise ValueError("an RMSNorm launch takes no bias and stores no mean and rstd")

    def unfit_for_words(self) -> str | None:
        """Why these rows cannot be read in 16-byte words in this layout, or None."""
        if not self.plain_two_pass:
            return "only plain rows (held half rows, no mean and rstd stored) are read in 16-byte words"
        if self.affine_dtype != self.dtype:
            return f"16-byte words take weight and bias in the rows' dtype, not {self.affine_dtype}"
        if self.vec != 4 or self.row_vecs % (2 * self.threads_per_row):
            return (f"rows of width {self.width} do not split into whole 16-byte words (8 values) for each of "
                    f"{self.threads_per_row} threads")
        return None

    @property
    def vec(self) -> int:
        return _vec(self.width)

    @property
    def row_vecs(self) -> int:
        return self.width // self.vec

    @property
    def late_affine(self) -> bool:
        """Held rows in their frame of at least LATE_AFFINE_VALUES values a thread: weight and
        bias load at the store, after the row sums (plain rows load them with x)."""
        return self.hold * self.vec >= LATE_AFFINE_VALUES and not self.plain_two_pass

    @property
    def squares_with_correction(self) -> bool:
        """Half rows whose mean leaves the kernel in a half dtype or not at all: each held
        thread's squares come from its correction pass, moved to the row's mean, instead of a
        pass of their own after it."""
        return self.dtype != "float32" and not (self.write_stats and self.affine_dtype == "float32")

    @property
    def plain_two_pass(self) -> bool:
        """Held half rows of a launch that stores no mean and rstd: statistics by the
        textbook two-pass in d = x - first (normalize_plain), instead of in the row's frame
        with a corrected two-pass a thread."""
        return self.dtype != "float32" and self.hold > 0 and not self.write_stats

    @property
    def row_in_subgroup(self) -> bool:
        """All threads of a row share one subgroup: the row merges without barriers."""
        return 0 < self.threads_per_row <= self.subgroup_size

    @property
    def parts_tree(self) -> bool:
        """A row has more subgroup parts than a subgroup has lanes: the parts halve in a
        tree in workgroup memory before the last butterfly (reduce_subgroup.wgsl)."""
        return 0 < self.subgroup_size and self.threads_per_row > self.subgroup_size ** 2

    @property
    def rows_per_workgroup(self) -> int:
        return self.workgroup // self.threads_per_row

    def relaid(self, threads: int, workgroup: int, wide_words: bool = False) -> KernelConfig:
        """This config with `threads` threads per row in workgroups of `workgroup`, each
        holding its share of the row, in 16-byte words or not (a tuned layout:
        pipeline.wgsl.layouts)."""
        return replace(self, threads_per_row=threads, workgroup=workgroup, hold=math.ceil(self.row_vecs / threads),
                       wide_words=wide_words)

    def constants(self) -> list[tuple[str, int | bool]]:
        """The pipeline's WGSL constants in the prelude's order: u32 for ints, bool for bools
        (the half dtypes' HALF, PARAMS_HALF and PACK2X16FLOAT last)."""
        found = [("VEC", self.vec), ("WORKGROUP", self.workgroup), ("THREADS_PER_ROW", self.threads_per_row),
                 ("HAS_WEIGHT", self.has_weight), ("HAS_BIAS", self.has_bias),
                 ("ROW_IN_SUBGROUP", self.row_in_subgroup), ("PARTS_TREE", self.parts_tree),
                 ("WIDTH", self.width), ("ROW_VECS", self.row_vecs), ("HOLD", self.hold), ("STEP", self.unroll),
                 ("WRITE_STATS", self.write_stats), ("RMS", self.rms)]
        if self.dtype != "float32":
            found += [("HALF", DTYPE_CODES[self.dtype]), ("PARAMS_HALF", self.affine_dtype != "float32"),
                      ("PACK2X16FLOAT", self.pack2x16float)]
        return found

    def prelude(self) -> str:
        """WGSL declarations that specialise the kernel file: V's type, the constants, and
        for half dtypes the word types and conversions of the storage file."""
        text = vector_declarations(self.vec) + "".join(constant(name, value) for name, value in self.constants())
        if self.dtype != "float32":
            text += half_declarations(self.vec, self.affine_dtype != "float32")
        return text

    @property
    def storage(self) -> list[str]:
        """The WGSL files that declare x, weight, bias and out for these dtypes."""
        if self.dtype == "float32":
            return ["storage_float32.wgsl"]
        if self.wide_words:
            return ["half.wgsl", "storage_half_wide.wgsl"]
        return ["half.wgsl", "storage_half.wgsl" if self.vec > 1 else "storage_half_odd.wgsl"]

    def source(self, files: ShaderFiles) -> str:
        """The WGSL module as `files.compiler` takes it: the directives it needs, the
        reduction file (it holds the entry point), constants, kernel with its per-value
        lines written out."""
        reduce = "reduce_subgroup.wgsl" if self.subgroup_size else "reduce_workgroup.wgsl"
        kernel = written_out(files.shader_source(SHADER), self.marker_counts())
        storage = "".join(files.shader_source(name) for name in self.storage)
        body = files.shader_source(reduce) + storage + self.prelude() + kernel
        return files.module(body, subgroups=self.subgroup_size > 0)

    def marker_counts(self) -> dict[str, int]:
        """How often the kernel file's lines of each marker are written out (WRITTEN): held
        rows' lines of one path (in their frame, plain in V, or plain in 16-byte words), of
        one form each."""
        held = max(self.hold, 1)
        counts = {"once": 1, "held": held, "step": self.unroll, "words": held // 2}
        forms = {form for form in FORMS if getattr(self, form)}
        return {marker: counts[rule.count] if forms.issuperset(rule.when) and forms.isdisjoint(rule.unless) else 0
                for marker, rule in WRITTEN.items()}


def constant(name: str, value: int | bool) -> str:
    """One line of the prelude: a WGSL bool, or a u32 for an int."""
    if isinstance(value, bool):
        return f"const {name}: bool = {str(value).lower()};\n"
    return f"const {name}: u32 = {value}u;\n"


def vector_declarations(vec: int) -> str:
    """V, `vec` f32 components; hsum, the sum of a V's components in order; first_value, its first."""
    vtype, components, first = _V_TYPES[vec]
    return (f"alias V = {vtype};\nfn hsum(v: V) -> f32 {{ return {components}; }}\n"
            f"fn first_value(v: V) -> f32 {{ return {first}; }}\n")


def half_declarations(vec: int, params_half: bool) -> str:
    """For half dtypes: the storage file's word types and conversions, with weight and bias
    half (`params_half`) or float32."""
    if vec == 1:
        return (f"alias PW = {'u32' if params_half else 'f32'};\n"
                "fn param_at(w: PW, at: u32) -> f32 { return "
                + ("unpack_pair(w)[at & 1u]" if params_half else "w") + "; }\n")
    word, value, pack = _HALF_WORDS[vec]
    return (f"alias XW = {word};\n"
            f"alias PW = {'XW' if params_half else 'V'};\n"
            f"fn x_value(w: XW) -> V {{ return {value}; }}\n"
            f"fn x_word(v: V) -> XW {{ return {pack}; }}\n"
            "fn p_value(w: PW) -> V { return " + ("x_value(w)" if params_half else "w") + "; }\n")


@functools.lru_cache(maxsize=16)
def parts(source: str, markers: tuple[str, ...]) -> tuple[tuple[str | None, str], ...]:
    """`source` split into (None, a run of lines) and (marker, code) for each line that ends
    in `// <marker>` of one of `markers`: the code before that comment, to be written out."""
    found: list[tuple[str | None, str]] = []
    for line in source.splitlines():
        marker = next((m for m in markers if line.endswith("// " + m)), None)
        if marker is not None:
            found.append((marker, line[: -len(marker) - 3].rstrip()))
        elif found and found[-1][0] is None:
            found[-1] = (None, found[-1][1] + line + "\n")
        else:
            found.append((None, line + "\n"))
    return tuple(found)


def value_line(code: str, k: int) -> str:
    """A marked line's code for value `k`: K becomes `k`u, the suffix _K of names _`k`."""
    return re.sub(r"_K\b", f"_{k}", re.sub(r"\bK\b", f"{k}u", code)) + "\n"


def written_out(source: str, counts: dict[str, int]) -> str:
    """`source` with each line marked `// <marker>` written out `counts[marker]` times, for
    values 0, 1, ... (`value_line`): per-value statements without a loop."""
    return "".join(text if marker is None else "".join(value_line(text, k) for k in range(counts[marker]))
                   for marker, text in parts(source, tuple(counts)))


@functools.lru_cache(maxsize=4096)  # a pure rule, asked once per launch
def choose_config(width: int, has_weight: bool, has_bias: bool, subgroup_size: int = 0,
                  dtype: str = "float32", affine_dtype: str | None = None,
                  pack2x16float: bool = False, *, rows: int = 0, write_stats: bool = True,
                  rms: bool = False) -> KernelConfig:
    """Loads as wide as the rows stay aligned (4, 2 or 1 floats). Rows held in registers
    when they fit: the most threads per row (a power of two) that leave each at least
    MIN_HOLD loads (MIN_HOLD_NARROW_LOADS for scalar float32 rows and half rows), weight and
    bias loaded with x; a float32 launch of `rows` rows that this splits into exactly 4
    vec4 loads a thread, with at least WIDE_LAUNCH_THREADS threads, takes twice the
    threads, 2 loads each (`rows` 0: the rule by width alone). Rows wider than MAX_HOLD loads
    for each of MAX_THREADS_PER_ROW threads are streamed, 4 loads a loop step. Workgroups
    of at least MIN_WORKGROUP threads (narrow rows share one). Half dtypes take the same
    shapes: a V of 4 half values is 8 bytes, and rows stay aligned to whole u32 pairs.
    `affine_dtype` defaults to `dtype`. `pack2x16float` (the device probe's verdict on
    pack2x16float) matters for float16 only. `write_stats` False leaves mean and rstd unwritten.
    `rms`: an RMSNorm's launch (the same layouts: one statistic fewer to sum).

    Chosen from the H200 sweeps (docs/measurements.md; with v5's row sums, 3 vec4 a thread
    where the rule gave 6 took 3-11% off the 384- and 768-wide float32 shapes, while 4 instead
    of 8 scalars or 3 instead of 6 half vec4 lost 6-10%). `subgroup_size` 0 means the adapter
    has no subgroup operations (workgroup-memory merges).
    """
    vec = _vec(width)
    threads, workgroup, hold, unroll = row_shape(width // vec, least_loads(dtype, vec), rows)
    return KernelConfig(
        width=width,
        threads_per_row=threads,
        has_weight=has_weight,
        has_bias=has_bias,
        subgroup_size=subgroup_size,
        workgroup=workgroup,
        hold=hold,
        unroll=unroll,
        dtype=dtype,
        affine_dtype=dtype if affine_dtype is None else affine_dtype,
        pack2x16float=pack2x16float and dtype == "float16",
        write_stats=write_stats,
        rms=rms,
    )


def least_loads(dtype: str, vec: int) -> int:
    """The fewest loads the rule leaves each thread of a row of `dtype` in `vec`-value loads."""
    return MIN_HOLD if dtype == "float32" and vec > 1 else MIN_HOLD_NARROW_LOADS


def row_shape(row_vecs: int, least: int, rows: int) -> tuple[int, int, int, int]:
    """The rule's threads per row, workgroup, values held (0: streamed) and unroll for rows of
    `row_vecs` loads, at least `least` a thread, in a launch of `rows` rows (choose_config)."""
    threads = min(MAX_THREADS_PER_ROW, _prev_pow2(max(1, row_vecs // least)))
    if (least == MIN_HOLD and row_vecs == 4 * threads and 2 * threads <= MAX_THREADS_PER_ROW
            and rows * threads >= WIDE_LAUNCH_THREADS):
        threads *= 2
    hold = math.ceil(row_vecs / threads)
    return threads, max(MIN_WORKGROUP, threads), hold if hold <= MAX_HOLD else 0, 1 if hold <= MAX_HOLD else STREAM_UNROLL


def _vec(width: int) -> int:
    """Components in one load: the widest vector (4, 2 or 1 floats) a row start stays aligned to."""
    return 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)
