"""Time native_layer_norm on the GPU, and torch's layer_norm on the same shapes.

A tool beside the runtime, not part of it: it launches the kernel through the runtime's
public launch pieces (`compile_pipeline`, `pack_params`, `grid`, the buffer usages) on the
device layer, so it times whichever WebGPU implementation PIPELINE_WEBGPU chooses, and like
the runtime needs no ExecuTorch, so it runs on a GPU host.

GPU time comes from timestamp queries around each compute pass when the adapter has
`timestamp-query` (wall clock over a batch of dispatches otherwise). Inputs rotate over
enough copies to exceed the last-level cache, so a shape is not timed from cache. Outputs
are treated alike for every measurement (kernel, WGSL copy, torch eager, compiled and
copy): `outputs="rotating"` (the default) gives each launch its own output, as it gives
each its own input; `outputs="shared"` has every launch write the same output, which a
write-back cache may keep from reaching memory at all between launches.

`dtype` float16 or bfloat16 times the half kernel (weight and bias of the same dtype)
against torch at that dtype; bandwidth counts 2 bytes a value. On CUDA, torch.compile of
F.layer_norm (default mode, compiled and warmed before timing) is timed too, as eager is:
CUDA graph + events.

`accuracy` also measures each shape's errors against float64 (`layer_norm_errors`) on rows
where a one-pass variance loses its digits; `columns` adds another implementation's columns
(bench_layer_norm.py --ort: ONNX Runtime's WebGPU LayerNorm, pipeline/benchmark_ort.py),
timed and checked in the same run, on the same shapes.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Protocol

import numpy as np
import torch

from pipeline.runtime.device import COPY_SRC, QUERY_RESOLVE, Gpu, Pipeline, device_info, gpu, read_bytes
from pipeline.runtime.launch import (
    DTYPES,
    PARAMS_BYTES,
    STAGING,
    STORAGE,
    UNIFORM,
    compile_pipeline,
    device_config,
    grid,
    native_layer_norm,
    pack_params,
)
from pipeline.wgsl.config import MAX_GRID_X, MAX_HOLD, KernelConfig

# Rotate among at least this many bytes of input (the H200's L2 is 60 MB).
ROTATE_BYTES = 256 << 20
MAX_COPIES = 16
OUTPUTS = ("rotating", "shared")  # each launch its own output, or all of them one
# Timed launches per shape at most: their 2 * (batches + repeats) timestamps (batches up to
# repeats) fill one query set, which WebGPU caps at 4096 queries.
MAX_REPEATS = 1000
# Every timing starts after this long of the GPU kept busy (a large WGSL copy, back to back):
# after a pause on the host of a second or two (a float64 check, a compile) the H200 timed
# everything, a copy included, 2.5-3x slower, and 0.1 s of the timed launches themselves,
# synchronised one small batch at a time, did not bring it back (docs/measurements.md).
WARM_SECONDS = 0.25
WARM_BYTES = 64 << 20  # copied by each warm-up dispatch
COPY_SHADER = "bench_copy.wgsl"


def effective_gbps(rows: int, width: int, us: float, itemsize: int = 4) -> float:
    """Input read once + output written once, over the time."""
    return 2 * rows * width * itemsize / (us * 1e-6) / 1e9


def _values(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `values` as the kernel's buffers hold them in `dtype` (half ones as bits)."""
    if dtype == "float32":
        return values
    return torch.from_numpy(values).to(DTYPES[dtype]).view(torch.int16).numpy()


def _copies(nbytes: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def candidate_configs(default: KernelConfig) -> list[KernelConfig]:
    """`default` (the runtime's choice, dtype and float16 stores included) first; then rows
    held at half, the same and twice its threads per row where that leaves at most MAX_HOLD
    values a thread, in workgroups of 64-256 threads; then rows streamed at the default's
    threads per row, 1, 2 or 4 values a loop step."""
    configs = [default]

    def add(config: KernelConfig) -> None:
        if config not in configs:
            configs.append(config)

    base = default.threads_per_row
    for threads in (base // 2, base, base * 2):
        hold = math.ceil(default.row_vecs / max(threads, 1))
        if threads < 1 or hold > MAX_HOLD or threads > 1024:
            continue
        for workgroup in sorted({max(64, threads), max(128, threads), max(256, threads)}):
            add(replace(default.relaid(threads, workgroup), unroll=1))
    for unroll in (1, 2, 4):
        add(replace(default, hold=0, unroll=unroll))
    return configs


def _check_outputs(outputs: str) -> None:
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUTS)}, got {outputs!r}")


def time_kernel(rows: int, width: int, configs: list[KernelConfig] | None = None, affine: bool = True,
                warmup: int = 10, repeats: int = 100, dtype: str = "float32",
                outputs: str = "rotating", stats: bool = False,
                rms: bool = False) -> tuple[list[tuple[float, float]], str]:
    """GPU microseconds of one launch over (rows, width) for each config (default: the
    runtime's own choice for this launch at `dtype`, storing mean and rstd with `stats`: a
    delegate that returns only the output, as the three models' do, stores none; an
    RMSNorm's, weight alone, with `rms`), as (batched, isolated) medians; returns (times, clock)."""
    _check_outputs(outputs)
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be from 1 to {MAX_REPEATS}, got {repeats!r}")
    g = gpu()
    impl = g.impl
    configs = configs or [device_config(g, width, affine, affine and not rms, dtype, rows=rows,
                                        write_stats=stats and not rms, rms=rms)]
    itemsize = DTYPES[dtype].itemsize
    nbytes = (rows * width * itemsize + 3) // 4 * 4  # whole u32 words
    copies = _copies(nbytes)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((2, width), dtype=np.float32)
    affine_bufs = {}  # weight and bias per affine dtype among the configs: float32 or `dtype`
    for name in {config.affine_dtype for config in configs}:
        affine_bufs[name] = []
        for values in weights:
            stored = _values(values, name)
            buf = impl.buffer(max(16, (stored.nbytes + 3) // 4 * 4), STORAGE)
            impl.write(buf, np.concatenate([stored.view(np.uint8), np.zeros(stored.nbytes % 4, np.uint8)]))
            affine_bufs[name].append(buf)
    params = impl.buffer(PARAMS_BYTES, UNIFORM)
    row = _values(rng.standard_normal(width, dtype=np.float32), dtype)
    # Inputs and outputs rotate; mean and rstd are shared, which orders the launches.
    stats = [impl.buffer(rows * 4, STORAGE) for _ in range(2)]
    shared_out = impl.buffer(nbytes, STORAGE) if outputs == "shared" else None
    sets = []
    for _ in range(copies):
        x = impl.buffer(nbytes, STORAGE)
        data = np.tile(row, rows).view(np.uint8)
        impl.write(x, np.concatenate([data, np.zeros(nbytes - data.size, np.uint8)]))
        sets.append((x, shared_out or impl.buffer(nbytes, STORAGE)))
    timed = _timestamped if "timestamp-query" in g.features else _wall_clock
    times = []
    for config in configs:
        pipeline = compile_pipeline(g, config)
        impl.write(params, pack_params(rows, 1e-5))
        bind_groups = [impl.bind_group(pipeline, [x, *affine_bufs[config.affine_dtype], out, *stats, params])
                       for x, out in sets]
        times.append(timed(g, pipeline, bind_groups, grid(rows, config), warmup, repeats))
    for buf in {id(b): b for pair in sets for b in pair}.values():
        impl.destroy(buf)
    clock = "gpu-timestamps" if "timestamp-query" in g.features else "wall-clock"
    return times, clock


def time_copy(rows: int, width: int, warmup: int = 10, repeats: int = 100, itemsize: int = 4,
              outputs: str = "rotating") -> float | None:
    """Batched GPU microseconds of bench_copy.wgsl over rows*width values of `itemsize` bytes
    (None when that is not whole vec4s or the adapter has no timestamps): the floor a WGSL
    kernel can reach."""
    _check_outputs(outputs)
    g = gpu()
    impl = g.impl
    nbytes = rows * width * itemsize
    if nbytes % 16 or "timestamp-query" not in g.features:
        return None
    pipeline = _copy_pipeline(g)
    copies = _copies(nbytes)
    sources = [impl.buffer(nbytes, STORAGE) for _ in range(copies)]
    dsts = [impl.buffer(nbytes, STORAGE) for _ in range(copies if outputs == "rotating" else 1)]
    order = impl.buffer(16, STORAGE)  # shared: orders the launches, as mean/rstd do the kernel's
    bind_groups = [impl.bind_group(pipeline, [src, dsts[i % len(dsts)], order]) for i, src in enumerate(sources)]
    groups = math.ceil(nbytes / 16 / 256)
    x = min(groups, MAX_GRID_X)
    us, _ = _timestamped(g, pipeline, bind_groups, (x, math.ceil(groups / x)), warmup, repeats)
    for buf in (*dsts, *sources, order):
        impl.destroy(buf)
    return us


def _copy_pipeline(g: Gpu) -> Pipeline:
    """bench_copy.wgsl's pipeline (its own layout), compiled once and cached on `g`."""
    return g.pipeline((COPY_SHADER,), g.files.module(g.files.shader_source(COPY_SHADER), subgroups=False),
                      None, COPY_SHADER)


def warm_gpu(seconds: float | None = None) -> None:
    """Keep the GPU busy for about `seconds` (default WARM_SECONDS) with copies of
    WARM_BYTES: each submission twice the dispatches of the last while it takes under 10 ms
    and twice it still fits in the time left."""
    seconds = WARM_SECONDS if seconds is None else seconds
    if seconds <= 0:
        return
    g = gpu()
    impl = g.impl
    pipeline = _copy_pipeline(g)
    bufs = [impl.buffer(size, STORAGE) for size in (WARM_BYTES, WARM_BYTES, 16)]
    bind_group = impl.bind_group(pipeline, bufs)
    groups = WARM_BYTES // 16 // 256
    dispatches, start = 1, time.perf_counter()
    while (left := seconds - (time.perf_counter() - start)) > 0:
        began = time.perf_counter()
        encoder = impl.encoder()
        encoder.compute(pipeline, [(bind_group, (min(groups, MAX_GRID_X), math.ceil(groups / MAX_GRID_X)))] * dispatches)
        impl.submit(encoder)
        _sync(g)
        took = time.perf_counter() - began
        if took < 0.01 and 2 * took < left - took:
            dispatches *= 2
    for buf in bufs:
        impl.destroy(buf)


def _sync(g: Gpu) -> None:
    """Wait for all submitted work: map a buffer that a new submission writes, which the
    queue runs after everything before it (wgpu 0.32.0's on_submitted_work_done_sync is
    broken). Mapping a buffer that no submission uses returns at once, without waiting."""
    probe = g.impl.buffer(16, STAGING)
    encoder = g.impl.encoder()
    encoder.clear(probe)
    g.impl.submit(encoder)
    read_bytes(g.impl, probe, 16)
    g.impl.destroy(probe)


def _timestamped(g: Gpu, pipeline, bind_groups, groups, warmup: int, repeats: int) -> tuple[float, float]:
    """(batched_us, isolated_us), medians per launch.

    Batched: timestamps around one compute pass holding a batch of launches, divided by the
    batch, as CUDA events around a graph of many kernels. The launches share the mean/rstd
    buffers, so each waits for the one before (a barrier between them, as on a CUDA stream).
    Isolated: timestamps around a pass holding a single launch (includes the pass's own cost).
    """
    impl = g.impl
    batch = len(bind_groups)
    batches = max(5, repeats // batch)
    count = 2 * (batches + repeats)
    queries = impl.query_set(count)
    resolved = impl.buffer(8 * count, QUERY_RESOLVE | COPY_SRC)
    staging = impl.buffer(8 * count, STAGING)

    def launches(n: int) -> list:
        return [(bind_groups[i % batch], groups) for i in range(n)]

    warm_gpu()
    encoder = impl.encoder()
    encoder.compute(pipeline, launches(warmup))
    for b in range(batches):
        encoder.compute(pipeline, launches(batch), (queries, 2 * b))
    for i in range(repeats):
        encoder.compute(pipeline, launches(1), (queries, 2 * (batches + i)))
    encoder.resolve(queries, count, resolved)
    encoder.copy(resolved, 0, staging, 0, 8 * count)
    impl.submit(encoder)
    stamps = np.frombuffer(read_bytes(impl, staging, 8 * count), dtype=np.uint64).reshape(-1, 2)
    for buf in (resolved, staging):
        impl.destroy(buf)
    ns = (stamps[:, 1] - stamps[:, 0]).astype(np.float64)  # both implementations report nanoseconds
    return float(np.median(ns[:batches])) / batch / 1e3, float(np.median(ns[batches:])) / 1e3


def _wall_clock(g: Gpu, pipeline, bind_groups, groups, warmup: int, repeats: int) -> tuple[float, float]:
    def batch(n: int) -> float:
        start = time.perf_counter()
        encoder = g.impl.encoder()
        encoder.compute(pipeline, [(bind_groups[i % len(bind_groups)], groups) for i in range(n)])
        g.impl.submit(encoder)
        _sync(g)
        return (time.perf_counter() - start) / n * 1e6

    batch(warmup)
    us = statistics.median(batch(max(1, repeats // 10)) for _ in range(5))
    return us, us


def rms_norm(x: torch.Tensor, shape: tuple[int, ...], w: torch.Tensor | None, b: torch.Tensor | None = None):
    """F.rms_norm at eps 1e-5 with F.layer_norm's arguments (`b` unused): the torch side of an
    RMSNorm benchmark."""
    return torch.nn.functional.rms_norm(x, shape, w, 1e-5)


def _torch_norm(rms: bool):
    return rms_norm if rms else torch.nn.functional.layer_norm


def time_torch(rows: int, width: int, affine: bool = True, warmup: int = 10, repeats: int = 100,
               dtype: str = "float32", outputs: str = "rotating", rms: bool = False) -> tuple[float, str]:
    """Median microseconds of torch.nn.functional.layer_norm (rms_norm with `rms`): CUDA
    graph + events, else CPU."""
    _check_outputs(outputs)
    if torch.cuda.is_available():
        return (_time_torch_cuda(rows, width, affine, warmup, repeats, dtype=dtype, outputs=outputs, rms=rms),
                "cuda-graph-events")
    norm = _torch_norm(rms)
    x = torch.randn(rows, width).to(DTYPES[dtype])
    w, b = (torch.randn(width).to(x.dtype), torch.randn(width).to(x.dtype)) if affine else (None, None)
    for _ in range(max(1, warmup // 5)):
        norm(x, (width,), w, b)
    times = []
    for _ in range(max(3, repeats // 10)):
        start = time.perf_counter()
        norm(x, (width,), w, b)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times), "cpu-wall-clock"


def wall_us(call, budget_s: float = 0.5, least: int = 5, most: int = 100) -> float:
    """Median wall microseconds of `call()` after two warm-up calls, over as many calls as
    fit in about `budget_s` (at least `least`, at most `most`)."""
    call()
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    times = []
    for _ in range(max(least, min(most, int(budget_s / max(first, 1e-6))))):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def layer_norm_delegate(weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5):
    """A LayerNorm delegate as the three models' are: constant weight and bias (of one
    dtype, also the input's), the output alone returned. Its call crosses into C++
    (pipeline.runtime.native_call, on wgpu or Dawn) and launches from Python with
    PIPELINE_NATIVE_CALL=0, as the process's setting says when it is made."""
    from pipeline import blob
    from pipeline.runtime.delegate import LayerNormDelegate

    def array(t: torch.Tensor) -> np.ndarray:
        t = t.detach().contiguous()
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

    dtype = next(name for name, kind in DTYPES.items() if kind == weight.dtype)
    params = blob.LayerNormParams((weight.numel(),), eps, 0, blob.Operand(blob.CONSTANT),
                                  blob.Operand(blob.CONSTANT), (0,), 1, dtype=dtype)
    return LayerNormDelegate(blob.encode(blob.DelegateBlob(params, {"weight": array(weight), "bias": array(bias)})))


def time_host_path(rows: int, width: int, dtype: str = "float32") -> dict[str, float | None]:
    """Wall microseconds from host tensors to host tensors, as a delegate is called:
    - call_us: a LayerNorm delegate's call (`layer_norm_delegate`: resident weight and
      bias, the output alone, as the three models' delegates are)
    - layer_norm_us: pipeline.layer_norm (weight and bias uploaded, mean and rstd returned)
    - cuda_roundtrip_us: F.layer_norm(x.cuda()).cpu() with weight and bias already on the GPU,
      from pageable memory (None without CUDA)
    - torch_cpu_us: F.layer_norm on the CPU tensors"""
    kind = DTYPES[dtype]
    x = torch.randn(rows, width).to(kind)
    w, b = torch.randn(width).to(kind), torch.randn(width).to(kind)
    delegate = layer_norm_delegate(w, b)
    result: dict[str, float | None] = {
        "call_us": wall_us(lambda: delegate(x)),
        "layer_norm_us": wall_us(lambda: native_layer_norm(x, (width,), w, b)),
        "cuda_roundtrip_us": None,
        "torch_cpu_us": wall_us(lambda: torch.nn.functional.layer_norm(x, (width,), w, b)),
    }
    if torch.cuda.is_available():
        wc, bc = w.cuda(), b.cuda()

        def roundtrip() -> torch.Tensor:
            return torch.nn.functional.layer_norm(x.cuda(), (width,), wc, bc).cpu()

        result["cuda_roundtrip_us"] = wall_us(roundtrip)
    return {k: None if v is None else round(v, 1) for k, v in result.items()}


def time_torch_copy(rows: int, width: int, warmup: int = 10, repeats: int = 100, dtype: str = "float32",
                    outputs: str = "rotating") -> float | None:
    """torch's device-to-device copy of the same bytes (CUDA graph + events); None without CUDA."""
    _check_outputs(outputs)
    if not torch.cuda.is_available():
        return None
    return _time_torch_cuda(rows, width, False, warmup, repeats, copy=True, dtype=dtype, outputs=outputs)


def time_torch_compiled(rows: int, width: int, affine: bool = True, warmup: int = 10, repeats: int = 100,
                        dtype: str = "float32", outputs: str = "rotating", rms: bool = False) -> float | None:
    """Median microseconds of torch.compile(F.layer_norm) (F.rms_norm with `rms`; default
    mode), compiled and warmed first, then timed as eager is (CUDA graph + events); None
    without CUDA."""
    _check_outputs(outputs)
    if not torch.cuda.is_available():
        return None
    return _time_torch_cuda(rows, width, affine, warmup, repeats, dtype=dtype, compiled=True, outputs=outputs,
                            rms=rms)


def compiled_layer_norm(x: torch.Tensor, width: int, w: torch.Tensor | None, b: torch.Tensor | None,
                        rms: bool = False):
    """torch.compile of F.layer_norm (F.rms_norm with `rms`; default mode), compiled and
    warmed on `x`: ready to time.

    Specialised to this shape, as a model's compiled graph would be: without a reset,
    dynamo marks the dims dynamic after the second shape and the generic kernel it then
    compiles is several times slower (measured on the H200: 142 us at 36864x128, where the
    static kernel takes 13).
    """
    torch._dynamo.reset()
    fn = torch.compile(_torch_norm(rms), dynamic=False)
    for _ in range(3):
        fn(x, (width,), w, b)
    if x.is_cuda:
        torch.cuda.synchronize()
    return fn


def _time_torch_cuda(rows: int, width: int, affine: bool, warmup: int, repeats: int, copy: bool = False,
                     dtype: str = "float32", compiled: bool = False, outputs: str = "rotating",
                     rms: bool = False) -> float:
    dev = torch.device("cuda")
    kind = DTYPES[dtype]
    copies = _copies(rows * width * kind.itemsize)
    xs = [torch.randn(rows, width, device=dev, dtype=kind) for _ in range(copies)]
    w, b = ((torch.randn(width, device=dev, dtype=kind), torch.randn(width, device=dev, dtype=kind)) if affine
            else (None, None))
    layer_norm = compiled_layer_norm(xs[0], width, w, b, rms) if compiled else _torch_norm(rms)

    dsts = [torch.empty_like(x) for x in (xs if outputs == "rotating" else xs[:1])]

    def body():
        # The graph's memory pool gives each output the same address on every replay: one
        # address for all of them when each is dropped before the next call ("shared"),
        # one per call while all are kept ("rotating").
        kept = []
        for i, x in enumerate(xs):
            if copy:
                dsts[i % len(dsts)].copy_(x)
            elif outputs == "rotating":
                kept.append(layer_norm(x, (width,), w, b))
            else:
                layer_norm(x, (width,), w, b)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    warm_gpu()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(max(5, repeats // copies)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    return statistics.median(times)


# Rows of mean + scale * randn, by name: plain random rows, and large-mean rows, where a
# variance taken in one pass as E[x^2] - mean^2 cancels away its digits: at mean 1e4 and
# spread 1e-2 the variance is 1e-12 of the mean square, below float32's resolution of it;
# at 300 + randn, 1e-5 of it, which leaves a few bits.
ACCURACY_ROWS: dict[str, tuple[float, float]] = {"random": (0.0, 1.0), "mean_1e4": (1e4, 1e-2), "mean_300": (300.0, 1.0)}

# name -> make(weight, bias) -> call(x) -> out: one implementation's LayerNorm over the last
# dim with that affine (eps 1e-5), host tensors in and out.
Runner = Callable[[torch.Tensor, torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def error_stats(out: torch.Tensor, reference: torch.Tensor) -> dict[str, float | int | None]:
    """max_abs and rel_l2 of `out` against the float64 `reference` over its finite values,
    and how many values are not finite (NaN or inf, counted apart: JSON has no NaN)."""
    out = out.detach().to("cpu", torch.float64)
    finite = torch.isfinite(out)
    diff = torch.where(finite, out - reference, torch.zeros((), dtype=torch.float64))
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite, reference, torch.zeros((), dtype=torch.float64))))
    return {
        "max_abs": float(diff.abs().max()) if bool(finite.any()) else None,
        "rel_l2": float(torch.linalg.vector_norm(diff)) / ref_norm if ref_norm else None,
        "nonfinite": int((~finite).sum()),
    }


def default_runners(width: int) -> dict[str, Runner]:
    """Ours (a LayerNorm delegate, as the models' are) and torch eager (on CUDA where there
    is CUDA, else the CPU); torch.compile on CUDA."""

    def ours(w: torch.Tensor, b: torch.Tensor):
        delegate = layer_norm_delegate(w, b)
        return lambda x: delegate(x)[0]

    def eager(w: torch.Tensor, b: torch.Tensor):
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        wd, bd = w.to(dev), b.to(dev)
        return lambda x: torch.nn.functional.layer_norm(x.to(dev), (width,), wd, bd).cpu()

    runners: dict[str, Runner] = {"ours": ours, "torch": eager}
    if torch.cuda.is_available():
        def compiled(w: torch.Tensor, b: torch.Tensor):
            wd, bd = w.cuda(), b.cuda()
            fn = None

            def call(x: torch.Tensor) -> torch.Tensor:
                nonlocal fn
                xd = x.cuda()
                fn = fn or compiled_layer_norm(xd, width, wd, bd)
                return fn(xd, (width,), wd, bd).cpu()

            return call

        runners["compiled"] = compiled
    return runners


def layer_norm_errors(rows: int, width: int, dtype: str = "float32", runners: dict[str, Runner] | None = None,
                      seed: int = 0) -> dict[str, dict[str, dict]]:
    """{row kind: {runner: error_stats}}: each runner's output on rows x width of each of
    ACCURACY_ROWS, at `dtype`, against float64 LayerNorm of the same (rounded) values; weight
    and bias random, the same for every runner and kind."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(width, generator=gen).to(kind)
    b = torch.randn(width, generator=gen).to(kind)
    calls = {name: make(w, b) for name, make in (runners or default_runners(width)).items()}
    errors = {}
    for name, (mean, scale) in ACCURACY_ROWS.items():
        x = (mean + scale * torch.randn(rows, width, generator=gen, dtype=torch.float64)).to(kind)
        reference = torch.nn.functional.layer_norm(x.double(), (width,), w.double(), b.double(), 1e-5)
        errors[name] = {runner: error_stats(call(x), reference) for runner, call in calls.items()}
    return errors


class Column(Protocol):
    """Another implementation's columns in the same run (bench_layer_norm.py --ort)."""

    name: str  # its key in `accuracy`

    def describe(self) -> dict:
        """What the result's top level says of it (version, clocks)."""

    def time(self, rows: int, width: int, dtype: str, repeats: int) -> dict:
        """Its timing columns for one shape, merged into the shape's result."""

    def runner(self, rows: int, width: int, dtype: str) -> Runner:
        """Its LayerNorm for `layer_norm_errors`."""

    def progress(self, result: dict) -> str:
        """Its part of the shape's progress line."""


def _max_abs_text(stats: dict) -> str:
    text = "none finite" if stats["max_abs"] is None else f"{stats['max_abs']:.2g}"
    return text + (f" ({stats['nonfinite']} not finite)" if stats["nonfinite"] else "")


# (rows, width) of the LayerNorms in the three models, plus two large generic shapes.
MODEL_SHAPES: list[tuple[int, int]] = (
    [(rows, w) for w in (768, 1024) for rows in (1024, 4096)]  # BART decoder: tokens x d_model
    + [(r * b, w) for b in (1, 2) for r, w in ((36864, 128), (9216, 256), (2304, 512), (576, 1024))]  # DaViT
    + [(1500, w) for w in (384, 512, 768, 1024, 1280)]  # Whisper encoder: 1500 frames
    + [(4096, 3072), (8192, 1024)]
)

# Widths that are not a multiple of 4, beside model shapes: vec2 loads (width = 2 mod 4) or scalar.
UNALIGNED_SHAPES: list[tuple[int, int]] = [
    (1024, 766), (1500, 383), (1500, 1281), (1500, 1282), (4096, 1022), (4096, 1023),
    (8192, 1021), (73728, 126), (73728, 127), (4096, 3071), (4096, 3070),
]


# The hidden sizes of LLMs whose norm is an RMSNorm (qwen2 0.5B 896, 1.5B 1536; llama 3.2 1B
# 2048; gemma 2 2B 2304; llama 3.2 3B 3072; llama 3 8B, mistral 7B 4096), at one token,
# 16 and a prompt of 2048.
LLM_SHAPES = [(rows, width) for rows in (1, 16, 2048) for width in (896, 1536, 2048, 2304, 3072, 4096)]


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """A comma list of ROWSxWIDTH shapes, 'model' (the model shapes), 'unaligned' (widths
    not a multiple of 4) and 'llm' (LLM RMSNorm widths at 1, 16 and 2048 rows), e.g.
    '4096x3072,model'."""
    named = {"model": MODEL_SHAPES, "unaligned": UNALIGNED_SHAPES, "llm": LLM_SHAPES}
    shapes = []
    for item in spec.split(","):
        if item in named:
            shapes.extend(named[item])
            continue
        try:
            rows, width = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {item!r} is not ROWSxWIDTH") from None
        if rows < 1 or width < 1:
            raise ValueError(f"shape {item!r} must have positive rows and width")
        shapes.append((rows, width))
    return shapes


def run_benchmark(shapes: list[tuple[int, int]], repeats: int = 100, sweep: bool = False, progress=print,
                  dtype: str = "float32", outputs: str = "rotating", stats: bool = False,
                  host_path: bool = False, accuracy: bool = False, columns: Sequence[Column] = (),
                  rounds: int = 1, rms: bool = False) -> dict:
    """Time kernel and torch (eager, and compiled on CUDA) on each shape at `dtype`; the
    JSON-ready result of bench_layer_norm.py. With `rms`, the norm is an RMSNorm with a
    weight (the kernel's and F.rms_norm) instead of a LayerNorm with weight and bias.

    The kernel and the WGSL copy are timed in `rounds` interleaved rounds (the copy first in
    every other one) and report their medians; each shape's copy_over_kernel is the median of
    the rounds' copy time over the kernel's, so that a drift of the GPU's clocks between
    rounds falls on both sides of it alike.

    With `sweep`, also time the candidate configs of each shape (under "sweep"). With
    `host_path`, also the wall time from host tensors to host tensors (`time_host_path`:
    call_us, cuda_roundtrip_us, torch_cpu_us). Each of `columns` adds its own timing columns
    to each shape after ours. With `accuracy`, each shape's "accuracy" holds
    `layer_norm_errors` of ours, torch eager, torch.compile on CUDA and each column.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds!r}")
    _check_outputs(outputs)
    if rms and (host_path or accuracy or stats or any(not getattr(c, "rms", False) for c in columns)):
        raise ValueError("an RMSNorm benchmark times the kernel, the copy, torch and ORT's RMSNorm column alone: "
                         "no host path, accuracy or stats")
    names = ["ours", "torch", "compiled", *(c.name for c in columns)]
    if len(set(names)) != len(names):
        raise ValueError(f"column names must differ from each other and from ours, got {names[3:]}")
    itemsize = DTYPES[dtype].itemsize
    info = device_info()
    results = []
    for rows, width in shapes:
        g = gpu()
        config = device_config(g, width, True, not rms, dtype, rows=rows, write_stats=stats and not rms, rms=rms)
        configs = candidate_configs(config) if sweep else [config]
        kernel_rounds, copy_rounds = [], []
        for r in range(rounds):
            for step in ("kernel", "copy") if r % 2 == 0 else ("copy", "kernel"):
                if step == "kernel":
                    timed, clock = time_kernel(rows, width, configs, repeats=repeats, dtype=dtype, outputs=outputs,
                                               stats=stats, rms=rms)
                    kernel_rounds.append(timed)
                else:
                    copy_rounds.append(time_copy(rows, width, repeats=repeats, itemsize=itemsize, outputs=outputs))
        # Each config's (batched, isolated) medians over the rounds.
        times = [tuple(statistics.median(t[i][part] for t in kernel_rounds) for part in range(2))
                 for i in range(len(configs))]
        wgpu_us, isolated_us = times[0]
        copy_us = None if None in copy_rounds else statistics.median(copy_rounds)
        torch_us, torch_clock = time_torch(rows, width, repeats=repeats, dtype=dtype, outputs=outputs, rms=rms)
        compiled_us = time_torch_compiled(rows, width, repeats=repeats, dtype=dtype, outputs=outputs, rms=rms)
        torch_copy_us = time_torch_copy(rows, width, repeats=repeats, dtype=dtype, outputs=outputs)
        result = {
            "rows": rows,
            "width": width,
            "mbytes": round(rows * width * itemsize / 1e6, 2),
            "wgpu_us": round(wgpu_us, 2),
            "wgpu_gbps": round(effective_gbps(rows, width, wgpu_us, itemsize), 1),
            "wgpu_isolated_us": round(isolated_us, 2),
            # The kernel's layout: threads per row and workgroup, and whether its plain half rows are
            # read in 16-byte words (a tuned one where the device's table has it).
            "layout": [config.threads_per_row, config.workgroup],
            "wide_words": config.wide_words,
            "torch_us": round(torch_us, 2),
            "torch_gbps": round(effective_gbps(rows, width, torch_us, itemsize), 1),
            "compiled_us": None if compiled_us is None else round(compiled_us, 2),
            "compiled_gbps": None if compiled_us is None else round(effective_gbps(rows, width, compiled_us, itemsize), 1),
            "wgsl_copy_us": None if copy_us is None else round(copy_us, 2),
            "copy_over_kernel": None if copy_us is None else round(statistics.median(
                c / k[0][0] for c, k in zip(copy_rounds, kernel_rounds)), 3),
            "torch_copy_us": None if torch_copy_us is None else round(torch_copy_us, 2),
        }
        if rounds > 1:
            result["wgpu_rounds_us"] = [round(t[0][0], 2) for t in kernel_rounds]
            result["wgsl_copy_rounds_us"] = [None if c is None else round(c, 2) for c in copy_rounds]
        if host_path:
            result.update(time_host_path(rows, width, dtype))
        for column in columns:
            result.update(column.time(rows, width, dtype, repeats))
        if accuracy:
            runners = default_runners(width)
            runners.update({c.name: c.runner(rows, width, dtype) for c in columns})
            result["accuracy"] = layer_norm_errors(rows, width, dtype, runners)
        if sweep:
            result["config"] = asdict(configs[0])
            result["sweep"] = sorted(
                ({"us": round(t[0], 2), "isolated_us": round(t[1], 2), "threads_per_row": c.threads_per_row,
                  "workgroup": c.workgroup, "hold": c.hold, "unroll": c.unroll}
                 for c, t in zip(configs, times)),
                key=lambda r: r["us"])
        results.append(result)
        best = f" | best of sweep {min(t[0] for t in times):9.2f} us" if sweep else ""
        if host_path:
            cuda = result["cuda_roundtrip_us"]
            best += (f" | call {result['call_us']:9.1f} us, torch cpu {result['torch_cpu_us']:9.1f} us"
                     + ("" if cuda is None else f", cuda round trip {cuda:9.1f} us"))
        compiled = "" if compiled_us is None else f" | compiled {compiled_us:9.2f} us {result['compiled_gbps']:8.1f} GB/s"
        if copy_us is not None:
            compiled += f" | WGSL copy {copy_us:9.2f} us, {result['copy_over_kernel']:.3f} of the kernel's time"
        extra = "".join(f" | {c.progress(result)}" for c in columns)
        if accuracy:
            extra += "".join(f" | {kind} max abs " + ", ".join(f"{name} {_max_abs_text(s)}" for name, s in errs.items())
                             for kind, errs in result["accuracy"].items())
        progress(f"{rows:>6}x{width:<5} {info['implementation']} {wgpu_us:9.2f} us {result['wgpu_gbps']:8.1f} GB/s | "
                 f"torch {torch_us:9.2f} us {result['torch_gbps']:8.1f} GB/s{compiled}{best}{extra}")
    return {
        "norm": "rms_norm" if rms else "layer_norm",
        "dtype": dtype,
        "outputs": outputs,
        "kernel_stores_stats": stats,
        "machine": platform.node() + " " + platform.machine(),
        "adapter": info["adapter"],
        "backend": info["backend"],
        # The kernel's columns (wgpu_us, ...) keep their names whichever implementation ran them.
        "implementation": info["implementation"],
        "kernel_clock": clock,
        "rounds": rounds,
        "torch_clock": torch_clock,
        "torch_device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "subgroup_size": gpu().subgroup_size,
        "layouts": info["layouts"],
        **({"accuracy_rows": {name: f"{mean:g} + {scale:g} * randn" for name, (mean, scale) in ACCURACY_ROWS.items()}}
           if accuracy else {}),
        **{c.name: c.describe() for c in columns},
        "results": results,
    }
