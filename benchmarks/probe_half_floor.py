"""Where float16 stands against a copy (issue 30, item 3): the kernel beside variants that
each take one part of its work away, and the WGSL copy of the same bytes, in one process.

Per shape and dtype, every variant is a module the kernel's own config writes, edited:
- kernel: the runtime's choice for the launch (weight and bias, no mean and rstd stored).
- by_width: the config the width alone chooses, where the launch's size changes it
  (WIDE_LAUNCH_THREADS, and run 16's trial rule of half the threads, since reverted).
- packed_affine: weight and bias loaded with x and held as their stored words until the
  store (half rows): fewer registers a thread while the row sums run.
- packed_all: x too held as its words, unpacked where each use needs it.
- float32_affine: weight and bias stored as float32 (half rows): two conversions a value
  fewer, the same output (a half weight is exact in float32).
- no_affine: the kernel without weight and bias.
- twice_threads: twice the threads per row, half the values each (where that still holds).
- affine_late, affine_early: weight and bias of held rows loaded at the store, after the
  row sums, or with x, whatever the config's late_affine rule chooses (runs 1-3 in
  benchmarks/results/h200-half-floor/ predate the rule: their kernel loaded them with x).
- fused_output: the output as ((x * a - b) - c) * (r * weight) + bias, one operation a value
  fewer (rounds differently: timing only).
- late_fused: both.
- two_rows: each workgroup normalizes twice its rows, one after the other (weight and bias
  the same for both): half the workgroups.
- two_rows_late: both, weight and bias loaded late.
- no_correction: the share's mean without its correction pass (less exact: timing only).
- cached_reads: every row reads row 0's values (served from cache), stores as the kernel
  does: the kernel's work without its reads from memory.
- work_only: cached_reads with no stores (each value computed, stored only for an eps no
  launch passes): the kernel's instructions alone.
- held_copy: the held path's loads and stores with nothing between (x unpacked and packed
  again; no statistics): a copy in the kernel's access pattern.
- held_copy_words: the same, words copied as they are (half rows: no conversion).
- merged_squares, squares_after_mean: each thread's squares taken in the correction pass and
  moved to the row's mean (Chan et al.), or in a pass of their own after it, whatever the
  config's squares_with_correction rule chooses (runs 1-6 predate the rule: their kernel
  took them after the mean).
- near_store: rows not far from zero (the centring's a = 1, c = 0) store (x - mean) * r, a
  row-uniform branch: two operations a value fewer, the same bits.
- lean: merged_squares and near_store.
- one_sum: no second row sum (each thread's own second sums: wrong values, timing only):
  what a row with one butterfly could reach.
- lean_one_sum: lean and one_sum (timing only).
- half_threads: half the threads per row, twice the values each.
- lean_half_threads: lean and half_threads.
- shifted: each thread's centre is its first value of d instead of its share's first mean,
  its squares taken with the correction: one pass over the held values in all (the shifted
  two-sum: Chan et al.'s "shifted data"), the centre the same bits in every use.
- least: the least a LayerNorm of held rows computes, ONNX Runtime's way: one sum of x and
  x^2 over the row (var = E[x^2] - E[x]^2, wrong far from zero), then (x - mean) * rstd *
  weight + bias; no frame, no correction, no NaN handling (timing only).
- least_two_pass: the textbook two-pass (Triton's tutorial): the mean's sum, then the squares
  about it, then the same output (timing only).
- least_early, least_two_pass_early: the same with weight and bias loaded with x (least and
  least_two_pass load them at the store).
- wg128, wg256, wg512, wg1024: the kernel in workgroups of that many threads (more rows a
  workgroup).
  Run 8 also timed rows in their frame in turns (turns2, turns4, turns2_wg256: 2 or 4 blocks
  of rows a workgroup, weight and bias loaded once), since replaced by plain rows' prefetch
  and serial forms below.
- least_wg256, least_wg512: least in workgroups of 256 or 512 threads.
- framed: half rows in their frame, with a corrected two-pass a thread, as the kernel
  computed them before plain_two_pass (the other edited variants edit that path too).
  Run 9 also timed plain rows with weight and bias loaded at the store (plain_late) and
  with x (plain_early): with x won or tied at every shape, and is now the rule.
- plain_sum_x: plain rows' first row sum of x itself, mean_d = (sum - WIDTH * first) / WIDTH,
  first subtracted in the second pass only (the first value's load off the path to the first
  row sum); plain_rsqrt: plain rows' rstd as inverseSqrt(var + eps); plain_lean: both.
- plain_no_shift: the kernel's plain rows with first taken as 0: the textbook two-pass of x
  with the kernel's NaN handling (misses the constant and ulp rows, as least_two_pass does).
- least_two_pass_shifted: least_two_pass_early in d = x - first: the least LayerNorm as exact
  as the kernel's plain rows (`--check`: their errors on every row kind), no NaN handling.
- foldable: the kernel with its compensated sums not passed through opaque (timing only).
- pinned_squares: merged_squares with the share's first mean passed through opaque (one
  rounded value in every use); pinned_both: its correction `rest` too.
- plain: held half rows on the plain two-pass whatever the launch stores (run 18 timed it
  on bfloat16 rows beside `framed` before the kernel's rule took it for them).
- even_split: the kernel with the last held value's bounds test folded away where every
  thread's values all lie in the row (EVEN_SPLIT).
- t{threads}_wg{size} (`--variants grid`, with the others named): the kernel with its
  threads per row or half as many (at most MAX_HOLD loads a thread), in workgroups of 64,
  128 or 256 threads.
- floor_t{threads}_wg{size} (`--variants floor_grid`): least_two_pass_shifted in each of
  those layouts, and in the kernel's own (floor_kernel): the exact floor in every layout.
- prefetch{2,4,8}_t{threads}_wg{size}, serial{2,4,8}_t{threads}_wg{size} (`--variants
  prefetch2`, ...: each in the kernel's layout and every layout of the grid): plain rows in
  turns, each workgroup taking 2, 4 or 8 blocks of rows the grid's blocks apart, weight and
  bias loaded once before them; prefetched, each block's values load before the block ahead
  takes its row sums (run 23).
- wide_t{threads}_wg{size} (`--variants wide`): plain half rows loaded and stored 16 bytes
  (8 values) at a time, x, out, weight and bias bound as arrays of vec4<u32>, with the
  kernel's threads per row, half or a quarter as many (a whole number of words each, at
  most MAX_HOLD), in workgroups of 64 or 128 threads (run 26 also timed 256: never the
  best). wide_x_...: only x and out 16 bytes at a time, weight and bias loaded as the kernel
  loads them; floor_wide_...: wide without NaN handling, rstd as inverseSqrt (the exact
  floor's arithmetic in 16-byte loads) (run 27).
- bf16_truncate: bfloat16 stores truncated, without rounding or the NaN test (wrong values:
  a bound on the store's arithmetic). Run 25 also timed the stores a pair at a time in
  vector operations (bf16_pair_store, since the kernel's `bfloat16_pair`).
- copy: bench_copy.wgsl over the same bytes, 16-byte loads, 256 threads a workgroup.
The variants time in rounds, the order reversed every other round, so drift falls on all.
Only the kernel is a LayerNorm; the rest are for timing.

    python benchmarks/probe_half_floor.py --json OUT.json [--rounds 2] [--shapes model4mb]
    PIPELINE_WEBGPU=dawn python benchmarks/probe_half_floor.py --json OUT.json
    python benchmarks/probe_half_floor.py --tables WGPU.json,DAWN.json  (the layout tables of
        docs/measurements.md from two runs' results: best layouts, half the threads)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

import pipeline.runtime.launch as launch
from pipeline.benchmark import MODEL_SHAPES, parse_shapes, time_copy, time_kernel
from pipeline.ioutil import write_json_atomic
from pipeline.runtime.device import device_info, gpu
from pipeline.wgsl import ShaderFiles
from pipeline.wgsl.config import MAX_HOLD, MAX_THREADS_PER_ROW, MIN_WORKGROUP, KernelConfig
from pipeline.wgsl.layouts import Launch
from pipeline.wgsl.layouts import read as read_layouts

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def edited(source: str, pattern: str, replacement: str, count: int | None = None) -> str:
    """`source` with `pattern` replaced; fails when it is not found (`count`: exactly so often)."""
    text, found = re.subn(pattern, replacement, source, flags=re.S)
    if found == 0 or (count is not None and found != count):
        raise RuntimeError(f"probe edit {pattern!r} matched {found} times")
    return text


def held_start(text: str) -> int:
    return text.index("fn normalize_held(")


def held_span(text: str) -> tuple[int, int]:
    """Where normalize_held's text begins and ends (after its closing brace's line)."""
    start = held_start(text)
    return start, text.index("\n}\n", start) + 3


@dataclass(frozen=True)
class Variant(KernelConfig):
    """The kernel's module with the EDITS of the class and of its bases applied, bases first:
    each (pattern, replacement, count), count None for any number but at least one; and with
    the config's rules named in FORCED (late_affine, squares_with_correction, plain_two_pass)
    set (None: the config's own). Rows in their frame unless a class says otherwise: the edits
    are of normalize_held."""

    EDITS: ClassVar[tuple[tuple[str, str, int | None], ...]] = ()
    FORCED: ClassVar[dict[str, bool | None]] = {"plain_two_pass": False}

    def source(self, files: ShaderFiles) -> str:
        # The variants read no 16-byte words: without the kernel's normalize_wide (uncalled
        # here), an edit of the plain rows' lines finds normalize_plain's alone.
        text = super().source(files)
        start = text.index("fn normalize_wide(")
        text = text[:start] + text[text.index("\n}\n", start) + 3:]
        for cls in reversed(type(self).__mro__):
            for pattern, replacement, count in vars(cls).get("EDITS", ()):
                text = edited(text, pattern, replacement, count)
        return text

    def _rule(self, name: str) -> bool:
        forced = {}
        for cls in reversed(type(self).__mro__):
            forced |= vars(cls).get("FORCED", {})
        return forced[name] if forced.get(name) is not None else getattr(KernelConfig, name).fget(self)

    @property
    def late_affine(self) -> bool:
        return self._rule("late_affine")

    @property
    def squares_with_correction(self) -> bool:
        return self._rule("squares_with_correction")

    @property
    def plain_two_pass(self) -> bool:
        return self._rule("plain_two_pass")


def forcing(name: str, **rules: bool) -> type:
    """A Variant class that sets the config's rules `rules` and edits nothing."""
    return dataclass(frozen=True)(type(name, (Variant,), {"FORCED": rules}))


AffineLate = forcing("AffineLate", late_affine=True)
AffineEarly = forcing("AffineEarly", late_affine=False)
MergedSquares = forcing("MergedSquares", squares_with_correction=True)
SquaresAfterMean = forcing("SquaresAfterMean", squares_with_correction=False)
Framed = forcing("Framed")
PlainRows = forcing("PlainRows", plain_two_pass=True)


@dataclass(frozen=True)
class PackedAffine(AffineEarly):
    EDITS = ((r"let w_(\d+) = weight_at\(i_\1, in_\1\);", r"let w_\1 = weight[i_\1];", None),
             (r"let b_(\d+) = bias_at\(i_\1, in_\1\);", r"let b_\1 = bias[i_\1];", None),
             (r"store_out\(base, i_(\d+), in_\1, v_\1, c, w_\1, b_\1\);",
              r"store_out(base, i_\1, in_\1, v_\1, c, p_value(w_\1), p_value(b_\1));", None))


@dataclass(frozen=True)
class PackedAll(PackedAffine):
    EDITS = ((r"let v_(\d+) = load_x\(base, i_\1, in_\1\);", r"let v_\1 = x[base + i_\1];", None),
             (r"framed\(v_(\d+), ", r"framed(x_value(v_\1), ", None),
             (r"store_out\(base, i_(\d+), in_\1, v_\1, ", r"store_out(base, i_\1, in_\1, x_value(v_\1), ", None))


@dataclass(frozen=True)
class FusedOutput(Variant):
    EDITS = ((r"var y = \(\(v \* c\.x - V\(c\.y\)\) - V\(c\.z\)\) \* c\.w;[^\n]*\n"
              r"\s*if \(HAS_WEIGHT\) \{ y = y \* w; \}\n\s*if \(HAS_BIAS\) \{ y = y \+ b; \}",
              "let y = ((v * c.x - V(c.y)) - V(c.z)) * (c.w * w) + b;", 1),)


@dataclass(frozen=True)
class LateFused(AffineLate, FusedOutput):
    pass


@dataclass(frozen=True)
class Shifted(Variant):
    # The share's centre is its first value of d, not its first mean: no first pass, and the
    # squares with the correction, so one pass over the held values in all; the centre is
    # the same bits in every use.
    FORCED = {"squares_with_correction": True}
    EDITS = ((r"    sum \+= hsum\(framed\(v_\d+, in_\d+, frame\)\);\n", "", None),
             (r"let first_mean = select\(0\.0, sum / count, count > 0\.0\);",
              "let first_mean = first_value(framed(v_0, in_0, frame));", 1))


@dataclass(frozen=True)
class NoCorrection(Variant):
    EDITS = ((r"    shift \+= e_\d+\.x;\n", "", None),)


@dataclass(frozen=True)
class TwoRows(Variant):
    EDITS = ((r"\* ROWS_PER_WORKGROUP \+ tid / THREADS_PER_ROW;", "* (2u * ROWS_PER_WORKGROUP) + tid / THREADS_PER_ROW;", 1),
             (r"normalize_held\(tid, row, lanes\);",
              "normalize_held(tid, row, lanes);\n        normalize_held(tid, row + ROWS_PER_WORKGROUP, lanes);", 1))

    @property
    def rows_per_workgroup(self) -> int:
        return 2 * super().rows_per_workgroup


@dataclass(frozen=True)
class TwoRowsLate(TwoRows, AffineLate):
    pass


@dataclass(frozen=True)
class CachedReads(Variant):
    EDITS = ((r"(fn read_x\(at: u32\) -> V \{\n    return [^\n]*?)x\[at\]", r"\1x[at % ROW_VECS]", 1),)


@dataclass(frozen=True)
class WorkOnly(CachedReads):
    # Stored only for an eps no launch passes: every value is still computed.
    EDITS = ((r"(fn store_out\([^\n]*\n    if \(in_row)\)", r"\1 && params.eps == -1234.5)", 1),)


@dataclass(frozen=True)
class HeldCopy(Variant):
    # Between the loads and the stores: nothing but the row's bounds check.
    EDITS = ((r"(fn normalize_held.*?)    var count = 0\.0;.*?let c = centring\([^\n]*\n",
              r"\1    if (row >= params.rows) {\n        return;\n    }\n    let c = vec4<f32>(1.0);\n", 1),
             (r"var y = \(\(v \* c\.x - V\(c\.y\)\) - V\(c\.z\)\) \* c\.w;[^\n]*", "var y = v;", 1))


@dataclass(frozen=True)
class HeldCopyWords(HeldCopy):
    def source(self, files: ShaderFiles) -> str:
        s = super().source(files)
        if self.dtype == "float32":
            return s
        # V carries a word's bits in its first components: no conversion either way.
        if self.vec == 4:
            value, word = ("vec4<f32>(bitcast<f32>(w.x), bitcast<f32>(w.y), 0.0, 0.0)",
                           "vec2<u32>(bitcast<u32>(v.x), bitcast<u32>(v.y))")
        else:
            value, word = "bitcast<f32>(w)", "bitcast<u32>(v)"
        s = edited(s, r"fn x_value\(w: XW\) -> V \{ return [^\n]*", f"fn x_value(w: XW) -> V {{ return {value}; }}", 1)
        return edited(s, r"fn x_word\(v: V\) -> XW \{ return [^\n]*", f"fn x_word(v: V) -> XW {{ return {word}; }}", 1)


@dataclass(frozen=True)
class NearStore(Variant):
    def source(self, files: ShaderFiles) -> str:
        text = super().source(files)
        at = held_start(text)
        found = re.search(r"((?:    store_out\(base, i_\d+[^\n]*\n)+)}\n", text[at:])
        if found is None:
            raise RuntimeError("probe edit: the held stores not found")
        stores = found.group(1)
        near = stores.replace(", c, ", ", near, ").replace("    store_out", "        store_out")
        far = stores.replace("    store_out", "        store_out")
        branch = ("    let near = vec4<f32>(1.0, c.y, 0.0, c.w);\n    if (c.x == 1.0 && c.z == 0.0) {\n"
                  + near + "    } else {\n" + far + "    }\n")
        return text[:at + found.start(1)] + branch + text[at + found.end(1):]


@dataclass(frozen=True)
class Lean(MergedSquares, NearStore):
    pass


@dataclass(frozen=True)
class OneSum(Variant):
    EDITS = ((r"let sums = row_sum\((vec2<f32>\(gap \* share_of\(count\), squares\)), tid, lane, 1u, lanes\);",
              r"let sums = \1;", 1),)


@dataclass(frozen=True)
class LeanOneSum(Lean, OneSum):
    pass


@dataclass(frozen=True)
class Least(Variant):
    TWO_PASS: ClassVar[bool] = False
    EARLY: ClassVar[bool] = False  # weight and bias loaded with x (else at the store)
    SHIFT: ClassVar[bool] = False  # in d = x - first, the row's first value

    def source(self, files: ShaderFiles) -> str:
        text = super().source(files)
        start, end = held_span(text)
        each = range(self.hold)
        lines = ["fn normalize_held(tid: u32, row: u32, lanes: u32) {",
                 "    let lane = tid % THREADS_PER_ROW;", "    let base = row_base(row);"]
        value = "load_x(base, i_{k}, in_{k})"
        if self.SHIFT:
            value = f"select(V(0.0), {value} - V(first), in_{{k}})"
            lines.append("    let first = first_value(read_x(base));")
        lines += [f"    let i_{k} = lane + {k}u * THREADS_PER_ROW;\n    let in_{k} = held_in_row(i_{k}, {k}u);\n"
                  f"    let v_{k} = " + value.format(k=k) + ";" for k in each]
        affine = [(f"w_{k}", f"b_{k}") if self.EARLY else (f"weight_at(i_{k}, in_{k})", f"bias_at(i_{k}, in_{k})")
                  for k in each]
        if self.EARLY:
            lines += [f"    let w_{k} = weight_at(i_{k}, in_{k});\n    let b_{k} = bias_at(i_{k}, in_{k});" for k in each]
        if self.TWO_PASS:
            lines += ["    var s = 0.0;"] + [f"    s += hsum(v_{k});" for k in each]
            lines += ["    let mean = row_sum(vec2<f32>(s, 0.0), tid, lane, 0u, lanes).x * INV_WIDTH;",
                      "    var q = 0.0;"]
            lines += [f"    q += deviation_at(v_{k}, in_{k}, mean).y;" for k in each]
            lines += ["    let m2 = row_sum(vec2<f32>(q, 0.0), tid, lane, 1u, lanes).x;",
                      "    let r = inverseSqrt(m2 * INV_WIDTH + params.eps);"]
        else:
            lines += ["    var s = 0.0;", "    var q = 0.0;"]
            lines += [f"    s += hsum(v_{k});\n    q += hsum(v_{k} * v_{k});" for k in each]
            lines += ["    let sums = row_sum(vec2<f32>(s, q), tid, lane, 0u, lanes);",
                      "    let mean = sums.x * INV_WIDTH;",
                      "    let r = inverseSqrt(max(sums.y * INV_WIDTH - mean * mean, 0.0) + params.eps);"]
        lines += ["    if (row >= params.rows) {", "        return;", "    }",
                  "    let c = vec4<f32>(1.0, mean, 0.0, r);"]
        lines += [f"    store_out(base, i_{k}, in_{k}, v_{k}, c, {affine[k][0]}, {affine[k][1]});" for k in each]
        return text[:start] + "\n".join(lines) + "\n}\n\n" + text[end:]


@dataclass(frozen=True)
class LeastTwoPass(Least):
    TWO_PASS: ClassVar[bool] = True


@dataclass(frozen=True)
class LeastEarly(Least):
    EARLY: ClassVar[bool] = True


@dataclass(frozen=True)
class LeastTwoPassEarly(LeastTwoPass):
    EARLY: ClassVar[bool] = True


@dataclass(frozen=True)
class LeastTwoPassShifted(LeastTwoPassEarly):
    SHIFT: ClassVar[bool] = True


@dataclass(frozen=True)
class PlainSumX(Variant):
    # Plain rows whose first row sum is of x itself, mean_d = (sum - WIDTH * first) / WIDTH
    # (WIDTH * first exact: at most 13 + 11 bits), first subtracted only in the second pass:
    # the first value's load and the subtraction leave the path to the first row sum.
    FORCED = {"plain_two_pass": True}
    EDITS = ((r"let d_(\d+) = select\(V\(0\.0\), load_x\(base, i_\1, in_\1\) - V\(first\), in_\1\);",
              r"let v_\1 = load_x(base, i_\1, in_\1);", None),
             (r"sum \+= hsum\(d_(\d+)\);", r"sum += hsum(v_\1);", None),
             (r"let mean_d = row_sum\(vec2<f32>\(sum, 0\.0\), tid, lane, 0u, lanes\)\.x \* INV_WIDTH;",
              "let mean_d = (row_sum(vec2<f32>(sum, 0.0), tid, lane, 0u, lanes).x - f32(WIDTH) * first)"
              " * INV_WIDTH;", 1),
             (r"let e_(\d+) = select\(V\(0\.0\), d_\1 - V\(mean_d\), in_\1\);",
              r"let e_\1 = select(V(0.0), (v_\1 - V(first)) - V(mean_d), in_\1);", None))


@dataclass(frozen=True)
class PlainRsqrt(Variant):
    # Plain rows' rstd as inverseSqrt(var + eps), one instruction, not 1 / sqrt(var + eps).
    FORCED = {"plain_two_pass": True}
    EDITS = ((r"select\(params\.nan, 1\.0 / sqrt\(var_eps\), finite\)",
              "select(params.nan, inverseSqrt(var_eps), finite)", 1),)


@dataclass(frozen=True)
class PlainLean(PlainSumX, PlainRsqrt):
    pass


@dataclass(frozen=True)
class PlainNoShift(Variant):
    # Plain rows in x itself (first taken as 0): the kernel without the shift that keeps
    # constant rows and rows of values an ulp apart exact.
    FORCED = {"plain_two_pass": True}
    EDITS = ((r"let first = first_value\(read_x\(base\)\);(\n    let i_0 )", r"let first = 0.0;\1", 1),)


@dataclass(frozen=True)
class Foldable(Variant):
    # The compensated sums without opaque: the H200's compiler may fold what they keep.
    # Every rule the kernel's own (plain rows too).
    FORCED = {"plain_two_pass": None}
    EDITS = ((r"return bitcast<f32>\(bitcast<u32>\(v\) \^ params\.zero\);", "return v;", 1),)


@dataclass(frozen=True)
class PinnedSquares(Variant):
    # squares_with_correction with the share's first mean passed through opaque: one rounded
    # value in every use, whatever a compiler contracts (sum / count into a later subtraction).
    FORCED = {"squares_with_correction": True}
    EDITS = ((r"let first_mean = select\(0\.0, sum / count, count > 0\.0\);",
              "let first_mean = opaque(select(0.0, sum / count, count > 0.0));", 1),)


@dataclass(frozen=True)
class PinnedBoth(PinnedSquares):
    # ... and the correction `rest` too.
    EDITS = ((r"let rest = select\(0\.0, shift / count, count > 0\.0\);",
              "let rest = opaque(select(0.0, shift / count, count > 0.0));", 1),)


@dataclass(frozen=True)
class EvenSplit(Variant):
    # Held rows whose threads all hold HOLD values in the row (EVEN_SPLIT): the last value's
    # bounds test folds away at compile time. Every rule the kernel's own.
    FORCED = {"plain_two_pass": None}
    EDITS = ((r"return k \+ 1u < HOLD \|\| i < ROW_VECS;", "return k + 1u < HOLD || EVEN_SPLIT || i < ROW_VECS;", 1),)


@dataclass(frozen=True)
class BfloatTruncate(Variant):
    # bfloat16 stores truncated, no rounding and no NaN test (wrong values: a bound on what
    # the store's arithmetic costs).
    FORCED = {"plain_two_pass": None}
    EDITS = ((r"(fn pack_pair\(v: vec2<f32>\) -> u32 \{\n)",
              r"""\1    if (HALF == 2u) {
        return (bitcast<u32>(v.x) >> 16u) | (bitcast<u32>(v.y) & 0xffff0000u);
    }
""", 1),)


@dataclass(frozen=True)
class PlainTurns(Variant):
    """Plain rows in turns: each workgroup takes TURNS blocks of rows, the grid's blocks apart
    (a grid TURNS times smaller), its threads' weight and bias loaded once before them. With
    PREFETCH each block's values (and first value) load before the block ahead of it takes its
    row sums, so that their latency overlaps those sums and stores; without, each block loads
    in its turn. Each row's arithmetic is the kernel's plain rows', in the same order."""

    TURNS: ClassVar[int] = 2
    PREFETCH: ClassVar[bool] = True
    FORCED = {"plain_two_pass": True}
    EDITS = ((r"normalize_plain\(tid, row, lanes\);",
              "normalize_plain(tid, row, groups.x * groups.y * ROWS_PER_WORKGROUP, lanes);", 1),)

    @property
    def rows_per_workgroup(self) -> int:
        return self.TURNS * super().rows_per_workgroup

    def source(self, files: ShaderFiles) -> str:
        text = super().source(files)
        start = text.index("fn normalize_plain(")
        end = text.index("\n}\n", start) + 3
        each = range(self.hold)
        lines = ["fn normalize_plain(tid: u32, first_row: u32, stride: u32, lanes: u32) {",
                 "    let lane = tid % THREADS_PER_ROW;"]
        lines += [f"    let i_{k} = lane + {k}u * THREADS_PER_ROW;\n    let in_{k} = held_in_row(i_{k}, {k}u);\n"
                  f"    let w_{k} = weight_at(i_{k}, in_{k});\n    let b_{k} = bias_at(i_{k}, in_{k});" for k in each]

        def loads(t: int) -> list[str]:
            return ([f"    let row{t} = first_row + {t}u * stride;", f"    let base{t} = row_base(row{t});",
                     f"    let first{t} = first_value(read_x(base{t}));"]
                    + [f"    let x{t}_{k} = load_x(base{t}, i_{k}, in_{k});" for k in each])

        if self.PREFETCH:
            lines += loads(0)
        for t in range(self.TURNS):
            if not self.PREFETCH:
                lines += loads(t)
            elif t + 1 < self.TURNS:
                lines += loads(t + 1)
            lines += [f"    let d{t}_{k} = select(V(0.0), x{t}_{k} - V(first{t}), in_{k});" for k in each]
            lines += [f"    var sum{t} = 0.0;"] + [f"    sum{t} += hsum(d{t}_{k});" for k in each]
            lines.append(f"    let mean{t} = row_sum(vec2<f32>(sum{t}, 0.0), tid, lane, 0u, lanes).x * INV_WIDTH;")
            lines += [f"    let e{t}_{k} = select(V(0.0), d{t}_{k} - V(mean{t}), in_{k});" for k in each]
            lines += [f"    var squares{t} = 0.0;"] + [f"    squares{t} += hsum(e{t}_{k} * e{t}_{k});" for k in each]
            lines += [f"    let m2_{t} = clamp_m2(row_sum(vec2<f32>(squares{t}, 0.0), tid, lane, 1u, lanes).x);",
                      f"    if (row{t} < params.rows) {{",
                      f"        let r{t} = finish_row(row{t}, lane, vec2<f32>(first{t} + mean{t}, m2_{t})).y;"]
            lines += [f"        store_normalized(base{t}, i_{k}, in_{k}, e{t}_{k} * r{t}, w_{k}, b_{k});" for k in each]
            lines.append("    }")
        return text[:start] + "\n".join(lines) + "\n}\n\n" + text[end:]


@dataclass(frozen=True)
class PlainWide(Variant):
    """Plain half rows loaded and stored 16 bytes (8 values, a vec4<u32>) at a time: x and out
    (and with WIDE_AFFINE weight and bias) bound as arrays of vec4<u32>, each thread taking
    row_vecs / (2 x threads) such words (a whole number: every thread's words lie in the row,
    no bounds test), the kernel's plain two-pass on their values in the same order of
    operations. FLOOR: without NaN handling, rstd as inverseSqrt (least_two_pass_shifted's
    arithmetic). Needs a width that is a multiple of 8, and half weight and bias with
    WIDE_AFFINE."""

    WIDE_AFFINE: ClassVar[bool] = True
    FLOOR: ClassVar[bool] = False
    FORCED = {"plain_two_pass": True}
    EDITS = ((r"var<storage, read> x: array<XW>;", "var<storage, read> x: array<vec4<u32>>;", 1),
             (r"var<storage, read_write> out: array<XW>;", "var<storage, read_write> out: array<vec4<u32>>;", 1),
             (r"fn read_x\(at: u32\) -> V \{\n    return x_value\(x\[at\]\);",
              "fn read_x(at: u32) -> V {\n    return x_value(half_word(x[at >> 1u], at));", 1),
             (r"fn write_out\(at: u32, y: V\) \{\n    out\[at\] = x_word\(y\);",
              "fn write_out(at: u32, y: V) {\n    let w = x_word(y);\n    let k = (at & 1u) * 2u;\n"
              "    out[at >> 1u][k] = w.x;\n    out[at >> 1u][k + 1u] = w.y;", 1))
    AFFINE_EDITS = ((r"var<storage, read> weight: array<PW>;", "var<storage, read> weight: array<vec4<u32>>;", 1),
                    (r"var<storage, read> bias: array<PW>;", "var<storage, read> bias: array<vec4<u32>>;", 1),
                    (r"return p_value\(weight\[at\]\);", "return p_value(half_word(weight[at >> 1u], at));", 1),
                    (r"return p_value\(bias\[at\]\);", "return p_value(half_word(bias[at >> 1u], at));", 1))

    @property
    def words(self) -> int:
        return self.row_vecs // (2 * self.threads_per_row)

    def source(self, files: ShaderFiles) -> str:
        text = super().source(files)
        if self.WIDE_AFFINE:
            for pattern, replacement, count in self.AFFINE_EDITS:
                text = edited(text, pattern, replacement, count)
        text = text.replace("fn read_x(", "fn half_word(q: vec4<u32>, at: u32) -> vec2<u32> {\n"
                            "    return select(q.xy, q.zw, (at & 1u) != 0u);\n}\n\nfn read_x(", 1)
        start = text.index("fn normalize_plain(")
        end = text.index("\n}\n", start) + 3
        each = range(self.words)
        values = range(2 * self.words)
        lines = ["fn normalize_plain(tid: u32, row: u32, lanes: u32) {",
                 "    let lane = tid % THREADS_PER_ROW;", "    let base = row_base(row);",
                 "    let wide = base >> 1u;", "    let first = first_value(read_x(base));"]
        lines += [f"    let j_{m} = lane + {m}u * THREADS_PER_ROW;\n    let q_{m} = x[wide + j_{m}];" for m in each]
        if self.WIDE_AFFINE:
            lines += [f"    let wq_{m} = weight[j_{m}];\n    let bq_{m} = bias[j_{m}];" for m in each]
        for m in each:
            for k, half in ((2 * m, "xy"), (2 * m + 1, "zw")):
                lines.append(f"    let d_{k} = x_value(q_{m}.{half}) - V(first);")
                lines += ([f"    let w_{k} = p_value(wq_{m}.{half});", f"    let b_{k} = p_value(bq_{m}.{half});"]
                          if self.WIDE_AFFINE else
                          [f"    let w_{k} = read_weight(2u * j_{m} + {k % 2}u);",
                           f"    let b_{k} = read_bias(2u * j_{m} + {k % 2}u);"])
        lines += ["    var sum = 0.0;"] + [f"    sum += hsum(d_{k});" for k in values]
        lines += ["    let mean_d = row_sum(vec2<f32>(sum, 0.0), tid, lane, 0u, lanes).x * INV_WIDTH;"]
        lines += [f"    let e_{k} = d_{k} - V(mean_d);" for k in values]
        lines += ["    var squares = 0.0;"] + [f"    squares += hsum(e_{k} * e_{k});" for k in values]
        if self.FLOOR:
            lines += ["    let m2 = row_sum(vec2<f32>(squares, 0.0), tid, lane, 1u, lanes).x;",
                      "    if (row >= params.rows) {", "        return;", "    }",
                      "    let r = inverseSqrt(m2 * INV_WIDTH + params.eps);"]
        else:
            lines += ["    let m2 = clamp_m2(row_sum(vec2<f32>(squares, 0.0), tid, lane, 1u, lanes).x);",
                      "    if (row >= params.rows) {", "        return;", "    }",
                      "    let r = finish_row(row, lane, vec2<f32>(first + mean_d, m2)).y;"]
        lines += [f"    let y_{k} = e_{k} * r * w_{k} + b_{k};" for k in values]
        lines += [f"    out[wide + j_{m}] = vec4<u32>(x_word(y_{2 * m}), x_word(y_{2 * m + 1}));" for m in each]
        return text[:start] + "\n".join(lines) + "\n}\n\n" + text[end:]


@dataclass(frozen=True)
class PlainWideX(PlainWide):
    WIDE_AFFINE = False


@dataclass(frozen=True)
class FloorWide(PlainWide):
    FLOOR = True


# `--variants` names of the 16-byte forms, and their classes (run 26: wide; run 27: the rest).
WIDE = {"wide": PlainWide, "wide_x": PlainWideX, "floor_wide": FloorWide}


def wide_layouts(config: KernelConfig) -> dict[str, KernelConfig]:
    """The 16-byte forms (WIDE) with the kernel's threads per row, half or a quarter as
    many, where each thread then takes a whole number of 16-byte words, at most MAX_HOLD, in
    workgroups of 64 or 128 threads (256 was never the best in run 26): named
    {form}_t{threads}_wg{workgroup}."""
    found = {}
    if config.dtype == "float32" or config.width % 8:
        return found
    for threads in (config.threads_per_row, config.threads_per_row // 2, config.threads_per_row // 4):
        words, rest = divmod(config.row_vecs, 2 * threads) if threads else (0, 1)
        if rest or not 1 <= words <= MAX_HOLD:
            continue
        for size in (64, 128):
            for form, cls in WIDE.items():
                if size >= threads and (config.affine_dtype == config.dtype or not cls.WIDE_AFFINE):
                    # hold: the words a thread takes (PlainWide writes its own loads).
                    found[f"{form}_t{threads}_wg{size}"] = as_variant(
                        cls, config, threads_per_row=threads, workgroup=size, hold=words)
    return found


def plain_turns(turns: int, prefetch: bool) -> type:
    """The PlainTurns class of `turns` turns, prefetched or not."""
    name = f"PlainTurns{turns}{'' if prefetch else 'Serial'}"
    return dataclass(frozen=True)(type(name, (PlainTurns,), {"TURNS": turns, "PREFETCH": prefetch}))


TURNS = {f"{'prefetch' if prefetch else 'serial'}{turns}": plain_turns(turns, prefetch)
         for turns in (2, 4, 8) for prefetch in (True, False)}


def layouts(config: KernelConfig) -> dict[str, KernelConfig]:
    """The layout grid (`--variants grid`): `config` with its threads per row or half as many
    (where each then holds at most MAX_HOLD loads), in workgroups of 64, 128 or 256 threads;
    named t{threads}_wg{workgroup}, the config's own left out."""
    found = {}
    for threads in (config.threads_per_row, config.threads_per_row // 2):
        if threads < 1 or math.ceil(config.row_vecs / threads) > MAX_HOLD:
            continue
        for size in (64, 128, 256):
            if size >= threads and (threads, size) != (config.threads_per_row, config.workgroup):
                found[f"t{threads}_wg{size}"] = config.relaid(threads, size)
    return found


def half_threads(config: KernelConfig) -> KernelConfig | None:
    """`config` with half the threads per row, twice the values each (None where it has none)."""
    if not config.hold or config.threads_per_row < 2 or 2 * config.hold > 12:
        return None
    threads = config.threads_per_row // 2
    return config.relaid(threads, max(MIN_WORKGROUP, threads))


def as_variant(cls: type, config: KernelConfig, **changes) -> KernelConfig:
    """`config` as a variant of class `cls`, with `changes`: the variants edit the module of rows
    in 8-byte loads (PlainWide writes its own 16-byte ones)."""
    return cls(**{f.name: getattr(config, f.name) for f in fields(config)} | {"wide_words": False} | changes)


# The edited variants: name, class, which rows it applies to ("half", "held", both or any) and
# the config it edits (the kernel's, or "plain": without weight and bias).
EDITED = (
    ("packed_affine", PackedAffine, "half", "kernel"), ("packed_all", PackedAll, "half", "kernel"),
    ("affine_late", AffineLate, "", "kernel"), ("affine_early", AffineEarly, "", "kernel"),
    ("fused_output", FusedOutput, "", "kernel"), ("late_fused", LateFused, "", "kernel"),
    ("no_correction", NoCorrection, "held", "kernel"), ("two_rows", TwoRows, "held", "kernel"),
    ("two_rows_late", TwoRowsLate, "held", "kernel"), ("cached_reads", CachedReads, "", "kernel"),
    ("work_only", WorkOnly, "", "kernel"), ("held_copy", HeldCopy, "held", "plain"),
    ("held_copy_words", HeldCopyWords, "held half", "plain"),
    ("merged_squares", MergedSquares, "held", "kernel"),
    ("squares_after_mean", SquaresAfterMean, "held", "kernel"), ("near_store", NearStore, "held", "kernel"),
    ("lean", Lean, "held", "kernel"), ("one_sum", OneSum, "held", "kernel"),
    ("lean_one_sum", LeanOneSum, "held", "kernel"),
    ("least", Least, "held", "kernel"), ("least_two_pass", LeastTwoPass, "held", "kernel"),
    ("least_early", LeastEarly, "held", "kernel"), ("least_two_pass_early", LeastTwoPassEarly, "held", "kernel"),
    ("shifted", Shifted, "held", "kernel"), ("framed", Framed, "held half", "kernel"),
    ("plain_sum_x", PlainSumX, "held half", "kernel"), ("plain_rsqrt", PlainRsqrt, "held half", "kernel"),
    ("plain_lean", PlainLean, "held half", "kernel"), ("plain_no_shift", PlainNoShift, "held half", "kernel"),
    ("least_two_pass_shifted", LeastTwoPassShifted, "held", "kernel"), ("foldable", Foldable, "", "kernel"),
    ("pinned_squares", PinnedSquares, "held", "kernel"), ("pinned_both", PinnedBoth, "held", "kernel"),
    ("even_split", EvenSplit, "held", "kernel"), ("plain", PlainRows, "held half", "kernel"),
    ("bf16_truncate", BfloatTruncate, "bfloat16", "kernel"),
)
# Variants whose values are the kernel's to within rounding in float16 (checked by --check;
# in float32 `shifted` and `lean_half_threads` are not, the layouts are), and those
# whose errors --check reports beside them: what the least LayerNorms give up.
EXACT = ("by_width", "merged_squares", "squares_after_mean", "near_store", "lean", "half_threads", "lean_half_threads",
         "shifted", "framed", "plain_sum_x", "plain_rsqrt", "plain_lean", "wg128", "wg256", "wg512", "wg1024",
         "pinned_squares", "pinned_both", "even_split")
INEXACT = ("least", "least_two_pass", "least_early", "least_two_pass_early", "least_two_pass_shifted",
           "plain_no_shift", "plain", "bf16_truncate")


def variants(rows: int, width: int, dtype: str) -> dict[str, KernelConfig]:
    g = gpu()
    configs = {"kernel": launch.device_config(g, width, True, True, dtype, rows=rows, write_stats=False),
               "plain": launch.device_config(g, width, False, False, dtype, rows=rows, write_stats=False)}
    found = {"kernel": configs["kernel"]}
    by_width = launch.device_config(g, width, True, True, dtype, rows=0, write_stats=False)
    if by_width != configs["kernel"]:
        found["by_width"] = by_width
    # The other variants edit the kernel's module in its layout, its rows in 8-byte loads
    # (where the table reads them in 16-byte words, `wide` is that form).
    kernel = replace(configs["kernel"], wide_words=False)
    if dtype != "float32":
        found["float32_affine"] = replace(kernel, affine_dtype="float32")
    found["no_affine"] = configs["plain"]
    threads = 2 * kernel.threads_per_row
    if kernel.hold and threads <= MAX_THREADS_PER_ROW and math.ceil(kernel.row_vecs / threads) <= MAX_HOLD:
        found["twice_threads"] = kernel.relaid(threads, max(kernel.workgroup, threads))
    for name, cls, rows_taken, base in EDITED:
        if (("half" in rows_taken and dtype == "float32") or ("held" in rows_taken and not kernel.hold)
                or ("bfloat16" in rows_taken and dtype != "bfloat16")):
            continue
        found[name] = as_variant(cls, configs[base])
    if kernel.hold:
        most = g.limits["max-compute-invocations-per-workgroup"]
        sizes = [size for size in (128, 256, 512, 1024) if kernel.workgroup < size <= most]
        found |= {f"wg{size}": replace(kernel, workgroup=size) for size in sizes}
        found |= {f"least_wg{size}": as_variant(Least, kernel, workgroup=size) for size in sizes if size in (256, 512)}
    if kernel.hold:
        grid = layouts(kernel)
        found |= grid | {"floor_kernel": as_variant(LeastTwoPassShifted, kernel)}
        found |= {f"floor_{n}": as_variant(LeastTwoPassShifted, c) for n, c in grid.items()}
    if kernel.plain_two_pass:
        own = {f"t{kernel.threads_per_row}_wg{kernel.workgroup}": kernel} | layouts(kernel)
        found |= {f"{name}_{n}": as_variant(cls, c) for name, cls in TURNS.items() for n, c in own.items()}
    found |= wide_layouts(kernel)
    halved = half_threads(kernel)
    if halved is not None:
        found["half_threads"] = halved
        found["lean_half_threads"] = as_variant(Lean, halved)
    return found


# `--variants` names that take a whole grid, and the pattern of its variants' names.
GRIDS = {"grid": r"t\d+_wg\d+", "floor_grid": r"floor_(kernel|t\d+_wg\d+)",
         **{name: name + r"_t\d+_wg\d+" for name in (*WIDE, *TURNS)}}


def probe(shapes: list[tuple[int, int]], dtypes: list[str], rounds: int, repeats: int,
          only: set[str] | None = None, done: Callable[[list[dict]], None] = lambda results: None) -> list[dict]:
    """Times the variants shape by shape; `done(results so far)` after each shape."""
    results = []
    for dtype in dtypes:
        for rows, width in shapes:
            configs = {n: c for n, c in variants(rows, width, dtype).items()
                       if only is None or n in only or any(g in only and re.fullmatch(p, n) for g, p in GRIDS.items())}
            names = list(configs) + ["copy"]
            times: dict[str, list[float]] = {name: [] for name in names}
            for r in range(rounds):
                order = names if r % 2 == 0 else names[::-1]
                kernels = [n for n in order if n != "copy"]
                timed, _ = time_kernel(rows, width, [configs[n] for n in kernels], repeats=repeats, dtype=dtype)
                for name, (batched, _isolated) in zip(kernels, timed):
                    times[name].append(batched)
                times["copy"].append(time_copy(rows, width, repeats=repeats, itemsize=ITEMSIZE[dtype]))
            us = {name: statistics.mean(values) for name, values in times.items()}
            row = {"dtype": dtype, "rows": rows, "width": width, "mbytes": rows * width * ITEMSIZE[dtype] / 2**20,
                   "config": {n: [c.threads_per_row, c.hold, c.workgroup] for n, c in configs.items()},
                   "us": {n: round(v, 3) for n, v in us.items()},
                   "rounds_us": {n: [round(v, 3) for v in values] for n, values in times.items()},
                   "copy_over": {n: round(us["copy"] / v, 3) for n, v in us.items()}}
            print(f"{dtype} {rows}x{width}: " + " ".join(f"{n} {v:.2f} ({row['copy_over'][n]:.3f})"
                                                         for n, v in us.items()), flush=True)
            results.append(row)
            done(results)
    return results


@contextmanager
def launching(choose: Callable[[KernelConfig], KernelConfig]) -> Iterator[None]:
    """Within it, pipeline.runtime.launch launches `choose(the config it would choose)`."""
    chosen = launch.device_config
    launch.device_config = lambda *args, **kwargs: choose(chosen(*args, **kwargs))
    try:
        yield
    finally:
        launch.device_config = chosen


def check_rows(rows: int, width: int, seed: int = 0):
    """float64 rows of the kinds the kernel's exactness rests on: random, far from zero
    (1e4 + 1e-2 randn, 300 + randn), constant, a first value far out, halves apart, one value
    a float16 ulp from the rest at 1000."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    kinds = {"random": n, "1e4+1e-2": 1e4 + 1e-2 * n, "300+randn": 300 + n,
             "constant": torch.full((rows, width), 7.25, dtype=torch.float64)}
    outlier = n.clone()
    outlier[:, 0] = 1e3
    kinds["first_outlier"] = outlier
    halves = n.clone()
    halves[:, width // 2:] += 50.0
    kinds["halves_apart"] = halves
    # One value a float16 ulp above the rest, far from zero: the spread is 1/2000 of the mean.
    near = torch.full((rows, width), 1000.0, dtype=torch.float64)
    near[:, 1] = 1000.5
    kinds["one_ulp_apart"] = near
    return kinds


def exact(name: str) -> bool:
    """Whether variant `name` gives the kernel's values to within rounding: EXACT's, the
    kernel in another layout (`grid`) and its plain rows in turns (TURNS); the exact floor's
    layouts (`floor_grid`) are INEXACT's."""
    return name in EXACT or any(re.fullmatch(GRIDS[g], name) for g in ("grid", "wide", "wide_x", *TURNS))


def checked_names(configs: dict[str, KernelConfig]) -> list[str]:
    """The variants of `configs` that --check compares: the kernel, the exact ones and the
    least LayerNorms (INEXACT, and the exact floor in every layout)."""
    return [n for n in configs if n == "kernel" or exact(n) or n in INEXACT
            or re.fullmatch(GRIDS["floor_grid"], n) or re.fullmatch(GRIDS["floor_wide"], n)]


def check(shapes: list[tuple[int, int]], dtypes: list[str], rows_each: int = 256) -> list[dict]:
    """Max |out - float64| of the kernel and of each EXACT and INEXACT variant, per row kind: a
    variant that moves the kernel's values shows here before its times mean anything."""
    found = []
    for dtype in dtypes:
        for _rows, width in shapes:
            configs = variants(rows_each, width, dtype)
            gen = torch.Generator().manual_seed(1)
            w = torch.randn(width, generator=gen, dtype=torch.float64).to(getattr(torch, dtype))
            b = torch.randn(width, generator=gen, dtype=torch.float64).to(getattr(torch, dtype))
            errors: dict[str, dict[str, float]] = {}
            for kind, rows in check_rows(rows_each, width).items():
                x = rows.to(getattr(torch, dtype))
                want = F.layer_norm(x.double(), (width,), w.double(), b.double(), 1e-5)
                for name in checked_names(configs):
                    with launching(lambda _, chosen=configs[name]: chosen):
                        out, _, _ = launch.native_layer_norm(x, (width,), w, b, 1e-5, stats=False)
                    err = (out.double() - want).abs().max().item()
                    errors.setdefault(name, {})[kind] = err
            row = {"dtype": dtype, "width": width, "errors": errors}
            # Over the kinds where the kernel has an error; kinds where it is exact and the
            # variant is not are named instead (a ratio to 0 says nothing).
            kernel_err = errors["kernel"]
            worst = {n: max([e[k] / kernel_err[k] for k in e if kernel_err[k] > 0], default=1.0)
                     for n, e in errors.items()}
            inexact = {n: [k for k in e if kernel_err[k] == 0 and e[k] > 0] for n, e in errors.items()}
            print(f"check {dtype} width {width}: " + " ".join(
                f"{n} x{v:.2f}" + (f" (not exact: {', '.join(inexact[n])})" if inexact[n] else "")
                for n, v in worst.items()), flush=True)
            for name in [n for n in errors if n == "kernel" or not exact(n)]:
                print(f"  {name}: " + " ".join(f"{k} {e:.2g}" for k, e in errors[name].items()), flush=True)
            found.append(row | {"worst_over_kernel": worst, "not_exact_where_kernel_is": inexact})
    return found


def kernel_layout(row: dict, device: dict) -> str:
    """The kernel's layout in a result `row`, t{threads}_wg{workgroup}: its workgroup as
    recorded, or (results of runs up to 25 recorded none) the device's layouts table's for
    the launch, or the rule's."""
    threads, _hold, *recorded = row["config"]["kernel"]
    if recorded:
        return f"t{threads}_wg{recorded[0]}"
    if device.get("layouts"):
        launch = Launch(row["dtype"], row["dtype"], True, True, False, row["width"], row["rows"])
        tuned = read_layouts(device["layouts"]["file"]).entries.get(launch)
        if tuned is not None:
            return f"t{tuned.threads_per_row}_wg{tuned.workgroup}"
    return f"t{threads}_wg{max(MIN_WORKGROUP, threads)}"


LAYOUT_NAME = re.compile(r"t\d+_wg\d+$")


def best_of(row: dict, pattern: str, kernel: str = "kernel") -> tuple[float, str]:
    """The highest copy ratio among the variants whose names match `pattern`, and its layout:
    t{threads}_wg{workgroup} from the name, or `kernel` (the name the kernel's own layout goes
    by) for a variant in the kernel's layout."""
    name = max((n for n in row["copy_over"] if re.fullmatch(pattern, n)), key=row["copy_over"].get)
    layout = LAYOUT_NAME.search(name)
    return row["copy_over"][name], kernel if layout is None else layout.group()


def best_layouts_table(runs: list[tuple[list[dict], dict]]) -> str:
    """Copy over the kernel, the kernel in its best layout and the exact floor in its own and
    its best, the kernel's speed over the floor's best, and (where timed) the kernel without
    weight and bias, wgpu / Dawn, from two `--variants kernel,grid,floor_grid` runs (each
    results and device) of the same shapes."""
    (wgpu, wgpu_device), (dawn, dawn_device) = runs
    extra = "no_affine" in wgpu[0]["us"]
    # Each column's variants, and whether the cell names the layout that was best.
    columns = ((r"kernel", False), (rf"kernel|{GRIDS['grid']}", True), (r"floor_kernel", True), (r"floor_.*", True))
    lines = ["| shape (kernel's threads x loads) | kernel's layout | kernel | kernel, best layout "
             "| exact floor, kernel's layout | exact floor, best layout | kernel over the floor's best |"
             + (" no weight and bias |" if extra else ""), "|---|---|---|---|---|---|---|" + ("---|" if extra else "")]
    for a, b in zip(wgpu, dawn, strict=True):
        threads, hold = a["config"]["kernel"][:2]
        own = kernel_layout(a, wgpu_device), kernel_layout(b, dawn_device)
        cells = [f"{a['rows']}x{a['width']} ({threads}x{hold})", f"{own[0]} / {own[1]}"]
        for pattern, named in columns:
            found = [best_of(r, pattern, k) for r, k in ((a, own[0]), (b, own[1]))]
            cells.append(" / ".join(f"{v:.3f} {layout}" if named else f"{v:.3f}" for v, layout in found))
        over = [r["copy_over"]["kernel"] / best_of(r, r"floor_.*")[0] for r in (a, b)]
        cells.append(f"{over[0]:.3f} / {over[1]:.3f}")
        if extra:
            cells.append(f"{a['copy_over']['no_affine']:.3f} / {b['copy_over']['no_affine']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def turns_table(wgpu: list[dict], dawn: list[dict]) -> str:
    """Copy over the kernel, its best layout, the kernel without weight and bias (where timed),
    and the best layout of each form of rows in turns timed (run 23), wgpu / Dawn."""
    columns = [("kernel", r"kernel"), ("best layout", rf"kernel|{GRIDS['grid']}"), ("no weight and bias", "no_affine")]
    columns += [(name, GRIDS[name]) for name in TURNS]
    columns = [(title, p) for title, p in columns if any(re.fullmatch(p, n) for n in wgpu[0]["us"])]
    lines = ["| shape | " + " | ".join(title for title, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for a, b in zip(wgpu, dawn, strict=True):
        cells = [f"{best_of(a, p)[0]:.3f} / {best_of(b, p)[0]:.3f}" for _, p in columns]
        lines.append(f"| {a['rows']}x{a['width']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def wide_table(wgpu: list[dict], dawn: list[dict]) -> str:
    """Copy over the kernel, the exact floor in the kernel's layout and the best layout of each
    16-byte form timed (WIDE), then `wide`'s best over the kernel and, where floor_wide was
    timed, the better of the kernel and `wide` over the better floor of the two load widths,
    wgpu / Dawn (runs 26-27)."""
    forms = [name for name in WIDE if any(re.fullmatch(GRIDS[name], n) for n in wgpu[0]["us"])]
    floors = "floor_wide" in forms
    titles = ["kernel (table)", "exact floor, kernel's layout"] + [f"{name}, best layout" for name in forms]
    titles += ["wide over the kernel"] + (["better form over the better floor"] if floors else [])
    lines = ["| shape | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]

    def over(row: dict) -> tuple[float, float | None]:
        kernel, wide = row["copy_over"]["kernel"], best_of(row, GRIDS["wide"])[0]
        if not floors:
            return wide / kernel, None
        floor = max(row["copy_over"]["floor_kernel"], best_of(row, GRIDS["floor_wide"])[0])
        return wide / kernel, max(kernel, wide) / floor

    for a, b in zip(wgpu, dawn, strict=True):
        cells = [f"{a['copy_over'][n]:.3f} / {b['copy_over'][n]:.3f}" for n in ("kernel", "floor_kernel")]
        for name in forms:
            found = [best_of(r, GRIDS[name]) for r in (a, b)]
            cells.append(" / ".join(f"{v:.3f} {layout}" for v, layout in found))
        ratios = over(a), over(b)
        cells.append(f"{ratios[0][0]:.3f} / {ratios[1][0]:.3f}")
        if floors:
            cells.append(f"{ratios[0][1]:.3f} / {ratios[1][1]:.3f}")
        lines.append(f"| {a['rows']}x{a['width']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def half_threads_table(wgpu: list[dict], dawn: list[dict]) -> str:
    """Half the threads' speed over the width's layout (wgpu / Dawn), from two `--variants
    kernel,by_width,half_threads` runs: by_width over kernel where the launch's rule halved
    the kernel's threads (run 16's trial rule), kernel over half_threads elsewhere."""
    def speed(row: dict) -> tuple[float, list[int]]:
        us = row["us"]
        if "by_width" in us:
            return us["by_width"] / us["kernel"], row["config"]["by_width"]
        return us["kernel"] / us["half_threads"], row["config"]["kernel"]

    lines = ["| shape | threads x loads (width's rule) | launch threads | half the threads |", "|---|---|---|---|"]
    for a, b in zip(wgpu, dawn, strict=True):
        (s_wgpu, (threads, hold, *_)), (s_dawn, _) = speed(a), speed(b)
        lines.append(f"| {a['rows']}x{a['width']} | {threads}x{hold} | {a['rows'] * threads:,} | "
                     f"{s_wgpu:.3f} / {s_dawn:.3f} |")
    return "\n".join(lines)


def print_tables(files: str) -> None:
    """The tables whose variants both runs (wgpu, Dawn) timed."""
    runs = [(doc["results"], doc["device"]) for doc in (json.loads(Path(f).read_text()) for f in files.split(","))]
    timed = set(runs[0][0][0]["us"])
    wide = any(re.fullmatch(GRIDS["wide"], n) for n in timed)
    if wide:
        print(wide_table(runs[0][0], runs[1][0]))
    elif "floor_kernel" in timed:
        print(best_layouts_table(runs))
    if any(re.fullmatch(GRIDS[name], n) for name in TURNS for n in timed):
        print(turns_table(runs[0][0], runs[1][0]))
    if "half_threads" in timed or "by_width" in timed:
        print(half_threads_table(runs[0][0], runs[1][0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here (atomically, after every shape)")
    parser.add_argument("--tables", metavar="WGPU.json,DAWN.json",
                        help="print the layout tables of two runs' results instead of timing")
    parser.add_argument("--shapes", default="model4mb",
                        help="model4mb (model shapes of 4 MB or more in float16, default) or bench_layer_norm's --shapes")
    parser.add_argument("--dtypes", default="float16,float32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--variants", help="comma list of the variants to time (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="first compare the EXACT variants' values with the kernel's against float64")
    args = parser.parse_args()
    if args.tables:
        print_tables(args.tables)
        return
    if not args.json:
        parser.error("--json is required to time")
    shapes = ([s for s in MODEL_SHAPES if s[0] * s[1] * 2 >= 4 << 20] if args.shapes == "model4mb"
              else parse_shapes(args.shapes))
    checked = check(shapes, args.dtypes.split(",")) if args.check else None
    device = device_info()

    def save(results: list[dict]) -> None:  # after every shape: a run cut short keeps what it timed
        write_json_atomic(args.json, {"device": device, "rounds": args.rounds, "repeats": args.repeats,
                                      "results": results, "check": checked})

    probe(shapes, args.dtypes.split(","), args.rounds, args.repeats,
          set(args.variants.split(",")) if args.variants else None, save)


if __name__ == "__main__":
    main()
