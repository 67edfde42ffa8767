"""A delegate's call from host tensors to host tensors, step by step, same run: what each
part of the host path costs.

Variants of the Python runtime's call (native_layer_norm, resident weight and bias, no
mean/rstd: as the models' delegates make it), on wgpu unless named:
- poll_thread   wgpu's map_sync (an empty submit before each read mapping, the wait handed to
                wgpu's poll thread), one-thread copies, the input written through the queue:
                the Python call as it was before 8d30518
- map_here      our map request, polled on the calling thread; copies as poll_thread
- threaded_read map_here, the read-back copied over torch's threads
- product       threaded_read, large inputs through a mapped staging buffer copied over threads
- dawn          the product on Dawn
- native        the delegate's call in one crossing into C++ (pipeline.runtime.native_call:
                the native backend's launch, built without ExecuTorch), what a delegate on
                wgpu makes now; the variants above are its Python launch
- native_block  native, its waits blocking at once (PIPELINE_POLL_SPIN_US=0) instead of spinning
                on non-blocking polls first
- from_256k, from_4m ...  the product with both size thresholds (threaded copies, staged
                upload) at that size instead of 1 MB
With --phases, where a small call's time goes instead (the product on each implementation):
the device operations it makes (queue writes, encoding, submit, waiting for the mapping,
copies), the Python around them, and the floor of one round trip (a 16-byte copy submitted
and its buffer mapped).

And, same run, the CUDA round trip (F.layer_norm(x.cuda()).cpu(), weights on the GPU,
pageable memory) and torch on the CPU. Each variant's output is checked against the
product's, bit for bit. Interleaved per shape (A B C ... C B A, the mean of both kept).

    OUT=dir python benchmarks/host_path.py [--shapes 16x768,model]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from pipeline.benchmark import layer_norm_delegate, parse_shapes, wall_us
from pipeline.runtime import device as runtime_device
from pipeline.runtime import wgpu_impl

# The module (the package exports its function under the same name).
runtime_kernel = importlib.import_module("pipeline.runtime.launch")

NEVER = 1 << 62


def _map_through_poll_thread(self, buffer, size, write=False):
    """The runtime's read mapping before: wgpu-py's map_sync and a view of its mapping (the
    variant that uses it has no staged upload, so nothing maps for writing)."""
    import wgpu

    assert not write, "poll_thread writes through the queue"
    buffer.map_sync(wgpu.MapMode.READ, 0, size)
    view = buffer.read_mapped(0, size, copy=False)
    return np.frombuffer(view, dtype=np.uint8)


def _unmap_through_wgpu(self, buffer):
    buffer.unmap()


@contextlib.contextmanager
def variant(name: str):
    os.environ[runtime_device.IMPLEMENTATION_ENV] = "dawn" if name == "dawn" else "wgpu"
    if name == "native_block":
        os.environ["PIPELINE_POLL_SPIN_US"] = "0"  # read by the library at each wait
    else:
        os.environ.pop("PIPELINE_POLL_SPIN_US", None)
    with contextlib.ExitStack() as stack:
        if name == "poll_thread":
            stack.enter_context(mock.patch.object(wgpu_impl.Device, "map", _map_through_poll_thread))
            stack.enter_context(mock.patch.object(wgpu_impl.Device, "unmap", _unmap_through_wgpu))
        if name in ("poll_thread", "map_here"):
            stack.enter_context(mock.patch.object(runtime_device, "THREADED_COPY_BYTES", NEVER))
        if name in ("poll_thread", "map_here", "threaded_read"):
            stack.enter_context(mock.patch.object(runtime_kernel, "STAGED_UPLOAD_BYTES", NEVER))
        if name.startswith("from_"):  # both thresholds at another size: from_256k, from_4m
            size = int(name[5:-1]) << (10 if name.endswith("k") else 20)
            stack.enter_context(mock.patch.object(runtime_device, "THREADED_COPY_BYTES", size))
            stack.enter_context(mock.patch.object(runtime_kernel, "STAGED_UPLOAD_BYTES", size))
        yield


VARIANTS = ("poll_thread", "map_here", "threaded_read", "product", "dawn", "native", "native_block")


class _Clock:
    """Wall time spent inside wrapped functions, by name."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start
        return timed


def phases(rows: int, width: int, calls: int = 500) -> dict:
    """Mean microseconds a call spends in each device operation, in Python around them, and
    the floor of one submit-and-map round trip, on the implementation now chosen."""
    g = runtime_device.gpu()
    x = torch.randn(rows, width)
    w, b = torch.randn(width), torch.randn(width)

    def call():
        return runtime_kernel.native_layer_norm(x, (width,), w, b, stats=False, resident=True)

    for _ in range(20):
        call()
    clock = _Clock()
    impl = g.impl
    encoder_type = type(impl.encoder())
    with contextlib.ExitStack() as stack:
        for name in ("write", "submit", "map", "unmap", "encoder"):
            stack.enter_context(mock.patch.object(type(impl), name, clock.wrap(name, getattr(type(impl), name))))
        for name in ("compute", "copy"):
            stack.enter_context(mock.patch.object(encoder_type, name, clock.wrap(name, getattr(encoder_type, name))))
        stack.enter_context(mock.patch.object(runtime_device, "copy_bytes", clock.wrap("copy_bytes", runtime_device.copy_bytes)))
        start = time.perf_counter()
        for _ in range(calls):
            call()
        total = time.perf_counter() - start
    row = {f"{k}_us": round(v / calls * 1e6, 1) for k, v in clock.spent.items()}
    row["call_us"] = round(total / calls * 1e6, 1)
    row["python_us"] = round((total - sum(clock.spent.values())) / calls * 1e6, 1)
    # The floor: one 16-byte copy submitted and its staging buffer mapped.
    src = impl.buffer(16, runtime_device.STORAGE, "floor src")
    dst = impl.buffer(16, runtime_device.STAGING, "floor dst")
    times = []
    for i in range(calls + 20):
        start = time.perf_counter()
        encoder = impl.encoder()
        encoder.copy(src, 0, dst, 0, 16)
        impl.submit(encoder)
        impl.map(dst, 16)
        impl.unmap(dst)
        if i >= 20:
            times.append(time.perf_counter() - start)
    row["round_trip_floor_us"] = round(sorted(times)[len(times) // 2] * 1e6, 1)
    impl.destroy(src)
    impl.destroy(dst)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="16x768,model")
    parser.add_argument("--dtype", default="float32", choices=list(runtime_kernel.DTYPES))
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="which to time, in this order (also from_256k, from_4m...: both thresholds at that size)")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "."))
    if args.phases:
        rows = []
        for name in ("wgpu", "dawn"):
            with variant("dawn" if name == "dawn" else "product"):
                for rows_, width in parse_shapes(args.shapes):
                    rows.append({"implementation": name, "rows": rows_, "width": width, **phases(rows_, width)})
                    print(json.dumps(rows[-1]), flush=True)
        path = out / "host-path-phases.json"
        path.write_text(json.dumps({"torch_threads": torch.get_num_threads(), "results": rows}, indent=1))
        print(f"wrote {path}", file=sys.stderr)
        return 0
    shapes = parse_shapes(args.shapes)
    kind = runtime_kernel.DTYPES[args.dtype]
    info = {}
    for name in ("wgpu", "dawn"):
        with variant(name if name == "dawn" else "product"):
            info[name] = runtime_device.device_info()
    results = []
    start = time.time()
    for rows, width in shapes:
        gen = torch.Generator().manual_seed(rows * 7 + width)
        x = torch.randn(rows, width, generator=gen).to(kind)
        w, b = torch.randn(width, generator=gen).to(kind), torch.randn(width, generator=gen).to(kind)

        def python_call():
            return runtime_kernel.native_layer_norm(x, (width,), w, b, stats=False, resident=True)[0]

        names = args.variants.split(",")
        delegate = None
        if any(name.startswith("native") for name in names):
            with variant("native"):
                delegate = layer_norm_delegate(w, b)
            if delegate._native is None:
                raise SystemExit("the native call library is unavailable here")

        def call():
            return delegate(x)[0] if current[0].startswith("native") else python_call()

        current = ["product"]
        with variant("product"):
            want = call()
        row = {"rows": rows, "width": width, "mbytes": round(x.numel() * x.element_size() / 1e6, 2)}
        times = {name: [] for name in names}
        for order in (names, names[::-1]):
            for name in order:
                current[0] = name
                with variant(name):
                    got = call()
                    if name != "dawn" and not torch.equal(got.view(torch.int16 if kind != torch.float32 else torch.int32),
                                                          want.view(torch.int16 if kind != torch.float32 else torch.int32)):
                        raise SystemExit(f"{name} differs from the product at {rows}x{width}")
                    times[name].append(wall_us(call))
        for name in names:
            row[f"{name}_us"] = round(sum(times[name]) / 2, 1)
        row["torch_cpu_us"] = round(wall_us(lambda: torch.nn.functional.layer_norm(x, (width,), w, b)), 1)
        if torch.cuda.is_available():
            wc, bc = w.cuda(), b.cuda()
            row["cuda_roundtrip_us"] = round(wall_us(
                lambda: torch.nn.functional.layer_norm(x.cuda(), (width,), wc, bc).cpu()), 1)
        results.append(row)
        print(json.dumps(row), f"{time.time() - start:.0f} s", flush=True)
    data = {"dtype": args.dtype, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "devices": info, "results": results}
    path = out / f"host-path-variants-{args.dtype}{'' if args.variants == ','.join(VARIANTS) else '-thresholds'}.json"
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
