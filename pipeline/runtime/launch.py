"""Launch the native_layer_norm WGSL kernel: torch tensors in, (out, mean, rstd) out, or
an RMSNorm's out.

Semantics, shapes and dtypes are those of torch.ops.aten.native_layer_norm.default (and
aten.rms_norm.default) for float32, float16 and bfloat16 input (weight and bias like the
input, or float32 with a half input): the trailing `normalized_shape` dims are flattened
into one row.
"""

from __future__ import annotations

import math
import numbers
import operator
import reprlib
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.runtime.device import STAGING, STORAGE, UNIFORM_BUFFER as UNIFORM, Gpu, Pipeline, gpu
from pipeline import wgsl
from pipeline.errors import ArgumentError
from pipeline.wgsl.config import MAX_GRID_X, PARAMS_BYTES, SHADER, KernelConfig, choose_config

# Inputs of at least this many bytes go to the GPU through a mapped staging buffer, copied
# over threads, instead of the queue's write (one thread's copy): docs/measurements.md, "The
# host path".
STAGED_UPLOAD_BYTES = 1 << 20

# The dtypes the kernel reads and writes, by their code in the kernel (HALF) and the blob.
DTYPES = {name: getattr(torch, name) for name in wgsl.DTYPES}
# The kernel's bindings: x, weight, bias, out, mean, rstd, params. With the buffer usages
# (STORAGE, UNIFORM, STAGING), pipeline.wgsl.config's KernelConfig and choose_config,
# compile_pipeline, grid and pack_params they are what a tool that launches the kernel
# itself (pipeline.benchmark) needs.
BINDINGS = ["read-only-storage"] * 3 + ["storage"] * 3 + ["uniform"]


def device_config(g: Gpu, width: int, has_weight: bool, has_bias: bool, dtype: str = "float32",
                  affine_dtype: str | None = None, *, rows: int = 0, write_stats: bool = True,
                  rms: bool = False) -> KernelConfig:
    """`choose_config` with what the device's probes found (subgroup size, float16 packing),
    in the layout tuned for this launch where `g`'s table has one: the configuration a
    launch of `rows` rows on `g` uses (an RMSNorm, `rms`, by the table's rms_norm entries)."""
    config = choose_config(width, has_weight, has_bias, g.subgroup_size, dtype, affine_dtype, g.pack2x16float,
                           rows=rows, write_stats=write_stats, rms=rms)
    return config if g.layouts is None else g.layouts.config(config, rows)


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


class EpsOverflowError(ValueError, OverflowError):
    """An integer eps past float64's range: a ValueError naming eps that is also the
    OverflowError aten's argument parser raises for it."""


def check_arguments(x: torch.Tensor, normalized_shape: Sequence[int], weight, bias, eps) -> tuple[tuple[int, ...], float]:
    """normalized_shape as ints and eps as a float, after checking every argument.

    eps may be any real number, as in aten: rstd is 1/sqrt(var + eps), NaN where var + eps is
    below 0 or NaN, 0 where it is inf."""
    given = [t for t in (x, weight, bias) if isinstance(t, torch.Tensor)]
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
            # float64 throughout is aten's to compute and the kernel's to refuse; the rest aten refuses too.
            error = ValueError if all(u.dtype == torch.float64 for u in given) else ArgumentError
            raise error(f"{name} must be float32, float16 or bfloat16 (weight and bias like the input, "
                        f"or float32 with a half input), got {t.dtype} with input {x.dtype}")
        # Meta tensors have no data and sparse ones no row-major rows to upload (aten computes
        # on meta tensors alone; it refuses sparse ones and a mix of devices).
        if t.is_meta or t.layout != torch.strided:
            error = ValueError if t.is_meta and all(u.is_meta for u in given) else ArgumentError
            raise error(f"{name} must be a dense tensor with data, got a {t.device.type} {t.layout} tensor")
    shape = _ints(normalized_shape)
    if not shape or any(d < 0 for d in shape):
        raise ArgumentError(f"normalized_shape must be non-empty with positive dims, got {list(shape)}")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ArgumentError(
            f"normalized_shape {list(shape)} does not match the trailing dims of input {list(x.shape)}"
        )
    if 0 in shape:  # rows of no values: aten's to compute, the kernel's to refuse
        raise ValueError(f"normalized_shape must be non-empty with positive dims, got {list(shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ArgumentError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise ArgumentError(f"bias must have weight's dtype {weight.dtype}, got {bias.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    try:
        value = float(eps)
    except OverflowError:
        raise EpsOverflowError(f"eps {_short(eps)} does not fit in a float") from None
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


# Values in messages: nesting cut at 6 levels (a list nested thousands deep is shown, not
# recursed into) and the text at 60 characters.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 6, 60, 60


def _short(value: object) -> str:
    text = _SHORT.repr(value)
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


def rms_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    poison: float | None = None,
    resident: bool = False,
) -> torch.Tensor:
    """RMSNorm over the trailing `normalized_shape` dims of `x`, on the GPU: aten.rms_norm's
    out, x * rsqrt(mean(x^2) + eps) * weight, shaped and typed like x. The statistic is taken
    in float32 whatever the dtype, and each output value is rounded once. eps None is aten's
    default, the machine epsilon of x's dtype. `poison` and `resident` as in
    `native_layer_norm`."""
    if eps is None and isinstance(x, torch.Tensor) and x.is_floating_point():
        eps = torch.finfo(x.dtype).eps
    shape, eps = check_arguments(x, normalized_shape, weight, None, eps)
    if not isinstance(resident, bool):
        raise TypeError(f"resident must be a bool, got {_short(resident)}")
    width = math.prod(shape)
    rows = math.prod(x.shape[: x.dim() - len(shape)])
    out = np.empty((rows, width), dtype=_STORED[x.dtype])
    if rows:
        src = _stored(x.detach().reshape(rows, width))
        g = gpu()
        with g.lock:
            _run(g, src, weight, None, eps, out, None, None, poison, resident, _name(x.dtype),
                 _name(x.dtype if weight is None else weight.dtype), rms=True)
    return torch.from_numpy(out).view(x.dtype).reshape(x.shape)


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


def binding_limit(g: Gpu) -> int:
    """The most bytes one binding holds on this adapter: a row of x must fit in one."""
    return min(g.limits["max-storage-buffer-binding-size"], g.limits["max-buffer-size"])


def _run(g: Gpu, src, weight, bias, eps, out, mean, rstd, poison, resident, dtype, affine_dtype,
         rms: bool = False) -> None:
    """Normalizes `src` into `out`, and into `mean` and `rstd` unless they are None (an
    RMSNorm's with `rms`)."""
    rows, width = src.shape
    row_bytes = width * src.itemsize
    limit = binding_limit(g)
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
                               rows=stop - start, write_stats=mean is not None, rms=rms)
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
    """The kernel's Params struct: rows (u32), eps, nan (f32), and zero (u32): 0, which the
    kernel xors into sums whose rounding it keeps (opaque in native_layer_norm.wgsl)."""
    packed = np.zeros(PARAMS_BYTES // 4, dtype=np.uint32)
    packed[0] = rows
    # An eps past float32's range becomes +-inf, as aten's float32 eps does (rstd 0 or NaN),
    # without numpy's overflow warning reaching the caller.
    with np.errstate(over="ignore"):
        packed[1:3] = np.array([eps, np.nan], dtype=np.float32).view(np.uint32)
    return packed
