"""Launch the native_layer_norm WGSL kernel: torch tensors in, (out, mean, rstd) out.

Semantics, shapes and dtypes are those of torch.ops.aten.native_layer_norm.default for
float32 input: the trailing `normalized_shape` dims are flattened into one row.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import wgpu

from pipeline.runtime.device import Gpu, gpu

SHADER = "native_layer_norm.wgsl"
MIN_WORKGROUP = 64
MAX_THREADS_PER_ROW = 256
# Values of a row one thread holds in registers at most; wider rows are streamed.
MAX_HOLD = 8
# Values a streaming thread loads in one loop step.
STREAM_UNROLL = 4
MAX_GRID_X = 65535
PARAMS_BYTES = 16

# Per components in one load: the WGSL type of V and the sum of its components.
_V_TYPES = {4: ("vec4<f32>", "v.x + v.y + v.z + v.w"), 2: ("vec2<f32>", "v.x + v.y"), 1: ("f32", "v")}

# Buffer usages of the kernel's bindings and read-back. With KernelConfig, choose_config,
# compile_pipeline, grid and pack_params they are what a tool that launches the kernel
# itself (pipeline.benchmark) needs.
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
UNIFORM = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
STAGING = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST


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
            f"const WIDTH: u32 = {self.width}u;\n"
            f"const ROW_VECS: u32 = {self.row_vecs}u;\n"
            f"const HOLD: u32 = {self.hold}u;\n"
            f"const STEP: u32 = {self.unroll}u;\n"
        )

    def source(self, g: Gpu) -> str:
        """The WGSL module: the reduction file (it holds the entry point), constants, kernel
        with its per-value lines written out."""
        reduce = "reduce_subgroup.wgsl" if self.subgroup_size else "reduce_workgroup.wgsl"
        kernel = _written_out(g.shader_source(SHADER), "each held value", max(self.hold, 1))
        kernel = _written_out(kernel, "each step value", self.unroll)
        return g.shader_source(reduce) + self.prelude() + kernel


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


def choose_config(width: int, has_weight: bool, has_bias: bool, subgroup_size: int = 0) -> KernelConfig:
    """Loads as wide as the rows stay aligned (4, 2 or 1 floats). Rows held in registers
    when they fit: the most threads per row (a power of two) that leave each at least 4
    values, so 4 to 7 each, weight and bias loaded with x. Rows wider than MAX_HOLD values
    for each of MAX_THREADS_PER_ROW threads are streamed, 4 values a loop step. Workgroups
    of at least MIN_WORKGROUP threads (narrow rows share one).

    Chosen from the H200 sweep (benchmarks/NOTES.md). `subgroup_size` 0 means the adapter
    has no subgroup operations (workgroup-memory merges).
    """
    row_vecs = width // _vec(width)
    threads = min(MAX_THREADS_PER_ROW, _prev_pow2(max(1, row_vecs // 4)))
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
    )


def _vec(width: int) -> int:
    """Components in one load: the widest vector (4, 2 or 1 floats) a row start stays aligned to."""
    return 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def compile_pipeline(g: Gpu, config: KernelConfig) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]:
    """The compute pipeline for `config` and its bind group layout (x, weight, bias, out,
    mean, rstd, params), compiled once per config and cached on `g`."""
    known = g.pipelines.get((SHADER, config))
    if known is not None:
        return known
    source = config.source(g)
    try:
        module = g.device.create_shader_module(code=source, label=SHADER)
        # An explicit layout: unused weight/bias bindings must stay in it.
        read_only = wgpu.BufferBindingType.read_only_storage
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": t}}
            for i, t in enumerate(
                [read_only] * 3 + [wgpu.BufferBindingType.storage] * 3 + [wgpu.BufferBindingType.uniform]
            )
        ]
        layout = g.device.create_bind_group_layout(entries=entries)
        pipeline = g.device.create_compute_pipeline(
            layout=g.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"},
            label=f"{SHADER} {config}",
        )
    except Exception as exc:
        raise RuntimeError(f"compiling {SHADER} for {config} failed: {exc}") from exc
    g.pipelines[(SHADER, config)] = (pipeline, layout)
    g.stats.pipelines_compiled += 1
    return pipeline, layout


def grid(rows: int, config: KernelConfig) -> tuple[int, int]:
    """Workgroups in x and y; y carries what does not fit under 65,535 in x."""
    groups = max(1, math.ceil(rows / config.rows_per_workgroup))
    x = min(groups, MAX_GRID_X)
    return x, math.ceil(groups / x)


def _check(x: torch.Tensor, normalized_shape: Sequence[int], weight, bias, eps) -> tuple[tuple[int, ...], float]:
    """normalized_shape as ints and eps as a float, after checking every argument."""
    for name, t in (("input", x), ("weight", weight), ("bias", bias)):
        if t is None and name != "input":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{'' if name == 'input' else ' or None'}, "
                            f"got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the trailing `normalized_shape` dims of float32 `x`, on the GPU.

    Returns `(out, mean, rstd)` shaped like aten.native_layer_norm's: out like x, mean and
    rstd like x with the normalized dims set to 1. `poison` fills the output buffers with
    that value before each launch (to check that the kernel writes every element).
    """
    shape, eps = _check(x, normalized_shape, weight, bias, eps)
    width = math.prod(shape)
    lead = tuple(x.shape[: x.dim() - len(shape)])
    rows = math.prod(lead)
    stat_shape = lead + (1,) * len(shape)
    out = np.empty((rows, width), dtype=np.float32)
    mean = np.empty(rows, dtype=np.float32)
    rstd = np.empty(rows, dtype=np.float32)
    if rows:
        src = x.detach().reshape(rows, width).contiguous().cpu().numpy()
        g = gpu()
        with g.lock:
            _run(g, src, weight, bias, eps, out, mean, rstd, poison)
    return (
        torch.from_numpy(out).reshape(x.shape),
        torch.from_numpy(mean).reshape(stat_shape),
        torch.from_numpy(rstd).reshape(stat_shape),
    )


def _run(g: Gpu, src, weight, bias, eps, out, mean, rstd, poison) -> None:
    rows, width = src.shape
    row_bytes = width * 4
    limit = min(g.limits["max-storage-buffer-binding-size"], g.limits["max-buffer-size"])
    if row_bytes > limit:
        raise ValueError(f"a row of {width} floats exceeds the adapter's binding limit of {limit} bytes")
    config = choose_config(width, weight is not None, bias is not None, g.subgroup_size)
    pipeline, layout = compile_pipeline(g, config)

    # Absent weight/bias bind a small placeholder that the specialised kernel never reads.
    affine = []
    for role, t in (("weight", weight), ("bias", bias)):
        data = None if t is None else t.detach().reshape(-1).contiguous().cpu().numpy()
        buf = g.buffer(role, row_bytes if data is not None else 16, STORAGE)
        if data is not None:
            g.upload(buf, data)
        affine.append(buf)

    # Launches of at most `chunk` rows keep every binding under the adapter's limit.
    chunk = max(1, min(rows, limit // row_bytes))
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        _launch(g, pipeline, layout, config, src[start:stop], affine, eps, poison,
                out[start:stop], mean[start:stop], rstd[start:stop])


def _launch(g, pipeline, layout, config, src, affine, eps, poison, out, mean, rstd) -> None:
    rows, width = src.shape
    x_buf = g.buffer("x", src.nbytes, STORAGE)
    out_buf = g.buffer("out", src.nbytes, STORAGE)
    mean_buf = g.buffer("mean", rows * 4, STORAGE)
    rstd_buf = g.buffer("rstd", rows * 4, STORAGE)
    params = g.buffer("params", PARAMS_BYTES, UNIFORM)
    # One read-back: out, then mean, then rstd, each at a 16-byte aligned offset.
    stat_bytes = rows * 4
    mean_at = _align16(src.nbytes)
    rstd_at = mean_at + _align16(stat_bytes)
    staging = g.buffer("staging", rstd_at + stat_bytes, STAGING)

    g.upload(x_buf, src)
    g.upload(params, pack_params(rows, eps))
    if poison is not None:
        for buf, n in ((out_buf, src.size), (mean_buf, rows), (rstd_buf, rows)):
            g.upload(buf, np.full(n, poison, dtype=np.float32))

    bind_group = g.device.create_bind_group(
        layout=layout,
        entries=[
            {"binding": i, "resource": {"buffer": b}}
            for i, b in enumerate([x_buf, *affine, out_buf, mean_buf, rstd_buf, params])
        ],
    )
    encoder = g.device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, bind_group)
    compute.dispatch_workgroups(*grid(rows, config))
    compute.end()
    encoder.copy_buffer_to_buffer(out_buf, 0, staging, 0, src.nbytes)
    encoder.copy_buffer_to_buffer(mean_buf, 0, staging, mean_at, stat_bytes)
    encoder.copy_buffer_to_buffer(rstd_buf, 0, staging, rstd_at, stat_bytes)
    g.device.queue.submit([encoder.finish()])
    g.stats.dispatches += 1

    data = np.frombuffer(g.read(staging, rstd_at + stat_bytes), dtype=np.float32)
    out[...] = data[: src.size].reshape(rows, width)
    mean[...] = data[mean_at // 4 : mean_at // 4 + rows]
    rstd[...] = data[rstd_at // 4 : rstd_at // 4 + rows]


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def pack_params(rows: int, eps: float) -> np.ndarray:
    """The kernel's Params struct: rows (u32), eps, nan (f32), padded to 16 bytes."""
    packed = np.zeros(PARAMS_BYTES // 4, dtype=np.uint32)
    packed[0] = rows
    packed[1:3] = np.array([eps, np.nan], dtype=np.float32).view(np.uint32)
    return packed
