"""Launch the native_layer_norm WGSL kernel: torch tensors in, (out, mean, rstd) out.

Semantics, shapes and dtypes are those of torch.ops.aten.native_layer_norm.default for
float32, float16 and bfloat16 input (weight and bias like the input, or float32 with a
half input): the trailing `normalized_shape` dims are flattened into one row.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.pte.blob import DTYPE_CODES
from pipeline.runtime.device import STAGING, STORAGE, UNIFORM_BUFFER as UNIFORM, Gpu, Pipeline, gpu
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
MAX_GRID_X = 65535
PARAMS_BYTES = 16
# Inputs of at least this many bytes go to the GPU through a mapped staging buffer, copied
# over threads, instead of the queue's write (one thread's copy): docs/measurements.md, "The
# host path".
STAGED_UPLOAD_BYTES = 1 << 20

# Per components in one load: the WGSL type of V and the sum of its components.
_V_TYPES = {4: ("vec4<f32>", "v.x + v.y + v.z + v.w"), 2: ("vec2<f32>", "v.x + v.y"), 1: ("f32", "v")}

# The dtypes the kernel reads and writes, by their code in the kernel (HALF) and the blob.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Half rows with an even width, per components in one V: the word type holding one V (u32
# pairs), V from a word and a word from V (half.wgsl's unpack_pair / pack_pair).
_HALF_WORDS = {
    4: ("vec2<u32>", "vec4<f32>(unpack_pair(w.x), unpack_pair(w.y))", "vec2<u32>(pack_pair(v.xy), pack_pair(v.zw))"),
    2: ("u32", "unpack_pair(w)", "pack_pair(v)"),
}

# The kernel's bindings: x, weight, bias, out, mean, rstd, params. With the buffer usages
# (STORAGE, UNIFORM, STAGING), KernelConfig, choose_config, compile_pipeline, grid and
# pack_params they are what a tool that launches the kernel itself (pipeline.benchmark) needs.
BINDINGS = ["read-only-storage"] * 3 + ["storage"] * 3 + ["uniform"]


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
    # its k values of the row (read once), weight and bias loaded with them.
    hold: int = 0
    unroll: int = 1
    dtype: str = "float32"  # of x and out
    affine_dtype: str = "float32"  # of weight and bias: dtype, or float32 with a half dtype
    # float16 stores through pack2x16float: only where the device probe saw it round as aten
    pack2x16float: bool = False
    # mean and rstd stored (a delegate whose program uses only the output does without)
    write_stats: bool = True

    @property
    def vec(self) -> int:
        return _vec(self.width)

    @property
    def row_vecs(self) -> int:
        return self.width // self.vec

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

    def prelude(self) -> str:
        """WGSL constant declarations that specialise the kernel file."""
        vtype, components = _V_TYPES[self.vec]
        return (
            f"alias V = {vtype};\n"
            f"fn hsum(v: V) -> f32 {{ return {components}; }}\n"
            f"const VEC: u32 = {self.vec}u;\n"
            f"const WORKGROUP: u32 = {self.workgroup}u;\n"
            f"const THREADS_PER_ROW: u32 = {self.threads_per_row}u;\n"
            f"const HAS_WEIGHT: bool = {str(self.has_weight).lower()};\n"
            f"const HAS_BIAS: bool = {str(self.has_bias).lower()};\n"
            f"const ROW_IN_SUBGROUP: bool = {str(self.row_in_subgroup).lower()};\n"
            f"const PARTS_TREE: bool = {str(self.parts_tree).lower()};\n"
            f"const WIDTH: u32 = {self.width}u;\n"
            f"const ROW_VECS: u32 = {self.row_vecs}u;\n"
            f"const HOLD: u32 = {self.hold}u;\n"
            f"const STEP: u32 = {self.unroll}u;\n"
            f"const WRITE_STATS: bool = {str(self.write_stats).lower()};\n"
        ) + self._storage_prelude()

    def _storage_prelude(self) -> str:
        """For half dtypes: which one, and the word types and conversions of the storage file."""
        if self.dtype == "float32":
            return ""
        params_half = self.affine_dtype != "float32"
        lines = [f"const HALF: u32 = {DTYPE_CODES[self.dtype]}u;",
                 f"const PARAMS_HALF: bool = {str(params_half).lower()};",
                 f"const PACK2X16FLOAT: bool = {str(self.pack2x16float).lower()};"]
        if self.vec == 1:
            lines += [f"alias PW = {'u32' if params_half else 'f32'};",
                      "fn param_at(w: PW, at: u32) -> f32 { return "
                      + ("unpack_pair(w)[at & 1u]" if params_half else "w") + "; }"]
        else:
            word, value, pack = _HALF_WORDS[self.vec]
            lines += [f"alias XW = {word};",
                      f"alias PW = {'XW' if params_half else 'V'};",
                      f"fn x_value(w: XW) -> V {{ return {value}; }}",
                      f"fn x_word(v: V) -> XW {{ return {pack}; }}",
                      "fn p_value(w: PW) -> V { return " + ("x_value(w)" if params_half else "w") + "; }"]
        return "\n".join(lines) + "\n"

    @property
    def storage(self) -> list[str]:
        """The WGSL files that declare x, weight, bias and out for these dtypes."""
        if self.dtype == "float32":
            return ["storage_float32.wgsl"]
        return ["half.wgsl", "storage_half.wgsl" if self.vec > 1 else "storage_half_odd.wgsl"]

    def source(self, files: ShaderFiles) -> str:
        """The WGSL module as `files.compiler` takes it: the directives it needs, the
        reduction file (it holds the entry point), constants, kernel with its per-value
        lines written out."""
        reduce = "reduce_subgroup.wgsl" if self.subgroup_size else "reduce_workgroup.wgsl"
        kernel = _written_out(files.shader_source(SHADER), "each held value", max(self.hold, 1))
        kernel = _written_out(kernel, "each step value", self.unroll)
        storage = "".join(files.shader_source(name) for name in self.storage)
        body = files.shader_source(reduce) + storage + self.prelude() + kernel
        return files.module(body, subgroups=self.subgroup_size > 0)


def _written_out(source: str, marker: str, count: int) -> str:
    """`source` with each line marked `// <marker>` repeated `count` times, its K (and the
    suffix _K of names) becoming 0, 1, ...: per-value statements without a loop."""
    lines = []
    for line in source.splitlines():
        if not line.endswith("// " + marker):
            lines.append(line)
            continue
        code = line[: -len(marker) - 3].rstrip()
        lines.extend(re.sub(r"_K\b", f"_{k}", re.sub(r"\bK\b", f"{k}u", code)) for k in range(count))
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=4096)  # a pure rule, asked once per launch
def choose_config(width: int, has_weight: bool, has_bias: bool, subgroup_size: int = 0,
                  dtype: str = "float32", affine_dtype: str | None = None,
                  pack2x16float: bool = False, *, rows: int = 0, write_stats: bool = True) -> KernelConfig:
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

    Chosen from the H200 sweeps (docs/measurements.md; with v5's row sums, 3 vec4 a thread
    where the rule gave 6 took 3-11% off the 384- and 768-wide float32 shapes, while 4 instead
    of 8 scalars or 3 instead of 6 half vec4 lost 6-10%). `subgroup_size` 0 means the adapter
    has no subgroup operations (workgroup-memory merges).
    """
    vec = _vec(width)
    row_vecs = width // vec
    least = MIN_HOLD if dtype == "float32" and vec > 1 else MIN_HOLD_NARROW_LOADS
    threads = min(MAX_THREADS_PER_ROW, _prev_pow2(max(1, row_vecs // least)))
    if (least == MIN_HOLD and row_vecs == 4 * threads and 2 * threads <= MAX_THREADS_PER_ROW
            and rows * threads >= WIDE_LAUNCH_THREADS):
        threads *= 2
    hold = math.ceil(row_vecs / threads)
    return KernelConfig(
        width=width,
        threads_per_row=threads,
        has_weight=has_weight,
        has_bias=has_bias,
        subgroup_size=subgroup_size,
        workgroup=max(MIN_WORKGROUP, threads),
        hold=hold if hold <= MAX_HOLD else 0,
        unroll=1 if hold <= MAX_HOLD else STREAM_UNROLL,
        dtype=dtype,
        affine_dtype=dtype if affine_dtype is None else affine_dtype,
        pack2x16float=pack2x16float and dtype == "float16",
        write_stats=write_stats,
    )


def device_config(g: Gpu, width: int, has_weight: bool, has_bias: bool, dtype: str = "float32",
                  affine_dtype: str | None = None, *, rows: int = 0, write_stats: bool = True) -> KernelConfig:
    """`choose_config` with what the device's probes found (subgroup size, float16 packing):
    the configuration a launch of `rows` rows on `g` uses."""
    return choose_config(width, has_weight, has_bias, g.subgroup_size, dtype, affine_dtype, g.pack2x16float,
                         rows=rows, write_stats=write_stats)


def _vec(width: int) -> int:
    """Components in one load: the widest vector (4, 2 or 1 floats) a row start stays aligned to."""
    return 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def compile_pipeline(g: Gpu, config: KernelConfig) -> Pipeline:
    """The compute pipeline for `config` with its bind group layout (BINDINGS: an explicit
    layout, since unused weight/bias bindings must stay in it), compiled once per config
    and cached on `g`."""
    key = (SHADER, config)
    if key in g.pipelines:
        return g.pipelines[key]
    try:
        return g.pipeline(key, config.source(g.files), BINDINGS, f"{SHADER} {config}")
    except Exception as exc:
        raise RuntimeError(f"compiling {SHADER} for {config} on {g.impl.name} failed: {exc}") from exc


def grid(rows: int, config: KernelConfig) -> tuple[int, int]:
    """Workgroups in x and y; y carries what does not fit under 65,535 in x."""
    groups = max(1, math.ceil(rows / config.rows_per_workgroup))
    x = min(groups, MAX_GRID_X)
    return x, math.ceil(groups / x)


def check_arguments(x: torch.Tensor, normalized_shape: Sequence[int], weight, bias, eps) -> tuple[tuple[int, ...], float]:
    """normalized_shape as ints and eps as a float, after checking every argument."""
    for name, t in (("input", x), ("weight", weight), ("bias", bias)):
        if t is None and name != "input":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{'' if name == 'input' else ' or None'}, "
                            f"got {type(t).__name__}")
        # aten's rule: weight and bias share one dtype, x's or (with a half x) float32.
        allowed = (x.dtype,) if x.dtype == torch.float32 or name == "input" else (x.dtype, torch.float32)
        if x.dtype not in DTYPES.values():
            allowed = ()
        if t.dtype not in allowed:
            raise ValueError(f"{name} must be float32, float16 or bfloat16 (weight and bias like the input, "
                             f"or float32 with a half input), got {t.dtype} with input {x.dtype}")
        # Meta tensors have no data and sparse ones no row-major rows to upload.
        if t.is_meta or t.layout != torch.strided:
            raise ValueError(f"{name} must be a dense tensor with data, got a {t.device.type} {t.layout} tensor")
    shape = _ints(normalized_shape)
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"normalized_shape must be non-empty with positive dims, got {list(shape)}")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} does not match the trailing dims of input {list(x.shape)}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise ValueError(f"bias must have weight's dtype {weight.dtype}, got {bias.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    try:
        value = float(eps)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"eps must be a finite non-negative number, got {_short(eps)}")
    return shape, value


def _ints(normalized_shape: Sequence[int]) -> tuple[int, ...]:
    """Dims as ints; floats and bools are refused, not truncated (aten refuses them too)."""
    if isinstance(normalized_shape, (str, bytes)) or not isinstance(normalized_shape, Sequence):
        raise TypeError(f"normalized_shape must be a sequence of ints, got {_short(normalized_shape)}")
    dims = []
    for d in normalized_shape:
        if isinstance(d, bool):
            raise TypeError(f"normalized_shape must hold ints, got {_short(normalized_shape)}")
        try:
            dims.append(operator.index(d))
        except TypeError:
            raise TypeError(f"normalized_shape must hold ints, got {_short(normalized_shape)}") from None
    return tuple(dims)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def native_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    poison: float | None = None,
    stats: bool = True,
    resident: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """LayerNorm over the trailing `normalized_shape` dims of `x`, on the GPU.

    `x` is float32, float16 or bfloat16; weight and bias (each optional) share x's dtype,
    or are float32 with a half `x`, as aten allows. Statistics are computed in float32 and
    each output value is rounded once to its dtype. Returns `(out, mean, rstd)` shaped and
    typed like aten.native_layer_norm's: out like x; mean and rstd like x with the
    normalized dims set to 1, in the dtype of weight and bias (x's when both are None).
    `poison` fills the output buffers with that value before each launch (to check that
    the kernel writes every element). `stats` False: the kernel stores no mean and rstd, and
    they come back as None (a caller that uses only the output). `resident` True: weight and
    bias are constants that never change while these tensor objects live (a delegate's),
    uploaded once and kept on the device until they are garbage collected.
    """
    shape, eps = check_arguments(x, normalized_shape, weight, bias, eps)
    if not isinstance(stats, bool):
        raise TypeError(f"stats must be a bool, got {_short(stats)}")
    if not isinstance(resident, bool):
        raise TypeError(f"resident must be a bool, got {_short(resident)}")
    width = math.prod(shape)
    lead = tuple(x.shape[: x.dim() - len(shape)])
    rows = math.prod(lead)
    stat_shape = lead + (1,) * len(shape)
    affine = next((t.dtype for t in (weight, bias) if t is not None), x.dtype)
    out = np.empty((rows, width), dtype=_STORED[x.dtype])
    mean = np.empty(rows, dtype=np.float32)
    rstd = np.empty(rows, dtype=np.float32)
    if rows:
        src = _stored(x.detach().reshape(rows, width))
        g = gpu()
        with g.lock:
            _run(g, src, weight, bias, eps, out, mean if stats else None, rstd if stats else None, poison, resident,
                 _name(x.dtype), _name(affine))
    out_tensor = torch.from_numpy(out).view(x.dtype).reshape(x.shape)
    if not stats:
        return out_tensor, None, None
    # mean and rstd come back in float32; a half dtype rounds them once here, as aten does.
    return (
        out_tensor,
        torch.from_numpy(mean).to(affine).reshape(stat_shape),
        torch.from_numpy(rstd).to(affine).reshape(stat_shape),
    )


# How tensors of each dtype travel as numpy arrays: float32 as is, half ones as their bits.
_STORED = {torch.float32: np.float32, torch.float16: np.int16, torch.bfloat16: np.int16}


def _stored(t: torch.Tensor) -> np.ndarray:
    """`t` as a contiguous CPU numpy array of `_STORED[t.dtype]` (half values as their bits)."""
    t = t.contiguous().cpu()
    return (t if t.dtype == torch.float32 else t.view(torch.int16)).numpy()


def _name(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def _words(data: np.ndarray) -> np.ndarray:
    """`data` as bytes padded to whole u32 words (an odd count of half values gains one)."""
    raw = data.reshape(-1).view(np.uint8)
    return raw if raw.size % 4 == 0 else np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])


def _run(g: Gpu, src, weight, bias, eps, out, mean, rstd, poison, resident, dtype, affine_dtype) -> None:
    """Normalizes `src` into `out`, and into `mean` and `rstd` unless they are None."""
    rows, width = src.shape
    row_bytes = width * src.itemsize
    limit = min(g.limits["max-storage-buffer-binding-size"], g.limits["max-buffer-size"])
    if row_bytes > limit:
        raise ValueError(f"a row of {width} values exceeds the adapter's binding limit of {limit} bytes")

    g.release_retired()
    # Absent weight/bias bind a small placeholder that the specialised kernel never reads.
    affine = []
    for role, t in (("weight", weight), ("bias", bias)):
        if t is not None and resident:
            affine.append(g.resident(t, lambda t=t: _words(_stored(t.detach().reshape(-1)))))
            continue
        data = None if t is None else _words(_stored(t.detach().reshape(-1)))
        buf = g.buffer(role, data.nbytes if data is not None else 16, STORAGE)
        if data is not None:
            g.upload(buf, data)
        affine.append(buf)

    # Launches of at most `chunk` rows keep every binding under the adapter's limit.
    chunk = max(1, min(rows, limit // row_bytes))
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        config = device_config(g, width, weight is not None, bias is not None, dtype, affine_dtype,
                               rows=stop - start, write_stats=mean is not None)
        _launch(g, config, src[start:stop], affine, eps, poison, out[start:stop],
                None if mean is None else mean[start:stop], None if rstd is None else rstd[start:stop])


def _launch(g, config, src, affine, eps, poison, out, mean, rstd) -> None:
    rows, width = src.shape
    pipeline = compile_pipeline(g, config)
    x_words = _words(src)
    x_buf = g.buffer("x", x_words.nbytes, STORAGE)
    out_buf = g.buffer("out", x_words.nbytes, STORAGE)
    mean_buf = g.buffer("mean", rows * 4, STORAGE)
    rstd_buf = g.buffer("rstd", rows * 4, STORAGE)
    params = g.buffer("params", PARAMS_BYTES, UNIFORM)
    # One read-back: out, then mean, then rstd, each at a 16-byte aligned offset.
    stat_bytes = rows * 4
    mean_at = _align16(x_words.nbytes)
    rstd_at = mean_at + _align16(stat_bytes)
    read_bytes = rstd_at + stat_bytes if config.write_stats else x_words.nbytes
    staging = g.buffer("staging", read_bytes, STAGING)

    encoder = g.impl.encoder()
    if x_words.nbytes >= STAGED_UPLOAD_BYTES:
        g.upload_staged(encoder, x_buf, x_words)
    else:
        g.upload(x_buf, x_words)
    if g.params_written != (params, rows, eps):  # a delegate's calls repeat theirs
        g.upload(params, pack_params(rows, eps))
        g.params_written = (params, rows, eps)
    if poison is not None:
        filled = torch.full((src.size,), poison, dtype=DTYPES[config.dtype])
        g.upload(out_buf, _words(_stored(filled)))
        for buf in (mean_buf, rstd_buf):
            g.upload(buf, np.full(rows, poison, dtype=np.float32))

    bind_group = g.bind_group(pipeline, [x_buf, *affine, out_buf, mean_buf, rstd_buf, params])
    encoder.compute(pipeline, [(bind_group, grid(rows, config))])
    encoder.copy(out_buf, 0, staging, 0, x_words.nbytes)
    if config.write_stats:
        encoder.copy(mean_buf, 0, staging, mean_at, stat_bytes)
        encoder.copy(rstd_buf, 0, staging, rstd_at, stat_bytes)
    g.impl.submit(encoder)
    g.stats.dispatches += 1

    # Straight from the mapped staging buffer into the arrays the caller gets back.
    into = [(0, out.reshape(-1).view(np.uint8))]
    if config.write_stats:
        into += [(mean_at, mean.view(np.uint8)), (rstd_at, rstd.view(np.uint8))]
    g.read(staging, read_bytes, into)


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def pack_params(rows: int, eps: float) -> np.ndarray:
    """The kernel's Params struct: rows (u32), eps, nan (f32), padded to 16 bytes."""
    packed = np.zeros(PARAMS_BYTES // 4, dtype=np.uint32)
    packed[0] = rows
    # An eps past float32's range becomes inf, as aten's float32 eps does (rstd 0), without
    # numpy's overflow warning reaching the caller.
    with np.errstate(over="ignore"):
        packed[1:3] = np.array([eps, np.nan], dtype=np.float32).view(np.uint32)
    return packed
