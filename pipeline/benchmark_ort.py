"""ONNX Runtime's WebGPU LayerNormalization beside the kernel (bench_layer_norm.py --ort).

A benchmark tool, not part of the product: `onnxruntime-webgpu` (Dawn linked in) and `onnx`
come with the `bench` extra and are imported only when a session is made. Per shape and
dtype it builds the one-node model an exporter writes for a LayerNorm (LayerNormalization,
opset 17, axis -1, scale and bias as initializers) and runs it on ORT's WebGPU execution
provider in this process, beside our kernel:

- its kernel's GPU time, from ORT's own profiler: with profiling on, the provider writes
  timestamps around each dispatch (around the compute pass holding it where the adapter has
  no timestamps inside passes) and reports them as "Api" events in whole microseconds;
- `session.run` from host arrays to host arrays, wall time, without profiling.

A run that did not happen on the WebGPU provider is refused, never reported: sessions are
made with fallback to the CPU provider disabled (ORT's session config, and the Python
wrapper's retry on the CPU turned off), and every node of a profile must name the WebGPU
provider.

ORT's Dawn takes the first Vulkan adapter it accepts. Mesa 22.3's lavapipe, on which wgpu
runs here, is not one ("No supported adapters"), so SwiftShader (Debian's chromium-common)
is offered to the Vulkan loader while ORT makes its instance, as our Dawn device does
(`with_swiftshader`); wgpu keeps lavapipe. On a GPU host Dawn prefers the GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from pipeline.benchmark import Runner, warm_gpu, wall_us
from pipeline.environment import SWIFTSHADER_ICD, swiftshader_offered, with_swiftshader
from pipeline.runtime.launch import DTYPES

PROVIDER = "WebGpuExecutionProvider"
OPSET = 17
NODE = "layer_norm"  # the node's name: ORT names its GPU events "<node>&<op>&<program>"
# Provider options are session config entries under this prefix (the Python API's
# provider options dict does not reach the WebGPU provider).
OPTION_PREFIX = "ep.webgpuexecutionprovider."
# dtypes ORT's WebGPU LayerNormalization takes (float16 where the device has shader-f16).
ORT_DTYPES = ("float32", "float16")
WARMUP_RUNS = 3


class OrtFallbackError(RuntimeError):
    """ORT did not run (or would not have run) the LayerNorm on its WebGPU provider."""


def _ort():
    """(onnx, onnxruntime), or a RuntimeError saying how to get them."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise RuntimeError(f"the ORT column needs onnxruntime-webgpu and onnx ({exc}): "
                           "pip install -e '.[bench]'") from None
    if PROVIDER not in onnxruntime.get_available_providers():
        raise RuntimeError(f"onnxruntime {onnxruntime.__version__} has no {PROVIDER} (it comes with the "
                           "onnxruntime-webgpu wheel; another onnxruntime package installed over it hides it)")
    return onnx, onnxruntime


def _check_dtype(dtype: str) -> None:
    if dtype not in ORT_DTYPES:
        raise ValueError(f"dtype for ORT's WebGPU LayerNormalization must be one of {', '.join(ORT_DTYPES)}, "
                         f"got {dtype!r}")


def layer_norm_model(rows: int, width: int, weight: np.ndarray, bias: np.ndarray | None, eps: float = 1e-5) -> bytes:
    """The serialized one-node model: y = LayerNormalization(x, weight, bias) over the last
    axis of x (rows, width), opset 17, x, weight, bias and y of weight's dtype; with `bias`
    None, an RMSNorm: SimplifiedLayerNormalization(x, weight), what ORT's transformer
    optimizer writes for one."""
    onnx, _ = _ort()
    from onnx import helper, numpy_helper

    if weight.shape != (width,) or (bias is not None and (bias.shape != (width,) or weight.dtype != bias.dtype)):
        raise ValueError(f"weight and bias must both be ({width},) of one dtype, got {weight.shape} "
                         f"{weight.dtype} and {getattr(bias, 'shape', None)} {getattr(bias, 'dtype', None)}")
    elem = helper.np_dtype_to_tensor_dtype(weight.dtype)
    op, inputs = ("SimplifiedLayerNormalization", ["x", "weight"]) if bias is None else \
        ("LayerNormalization", ["x", "weight", "bias"])
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name=NODE, axis=-1, epsilon=eps)],
        "layer_norm",
        [helper.make_tensor_value_info("x", elem, [rows, width])],
        [helper.make_tensor_value_info("y", elem, [rows, width])],
        [numpy_helper.from_array(weight, "weight")] + ([] if bias is None else [numpy_helper.from_array(bias, "bias")]),
    )
    opsets = [helper.make_opsetid("", OPSET)]
    # The IR version of the opset (a newer onnx writes a newer one by default than ORT may read).
    model = helper.make_model(graph, opset_imports=opsets, producer_name="pipeline",
                              ir_version=helper.find_min_ir_version_for(opsets))
    if bias is not None:  # SimplifiedLayerNormalization is ORT's own, which onnx's checker does not know
        onnx.checker.check_model(model)
    return model.SerializeToString()


class OrtLayerNorm:
    """One LayerNormalization node in an ORT session on the WebGPU provider, with CPU
    fallback disabled. `options`: provider options (keys without OPTION_PREFIX). With
    `profile_dir`, the session profiles (GPU timestamps included) into that folder."""

    def __init__(self, rows: int, width: int, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5,
                 options: dict[str, str] | None = None, profile_dir: str | os.PathLike | None = None) -> None:
        _, ort = _ort()
        self.dtype = str(weight.dtype).removeprefix("torch.")
        _check_dtype(self.dtype)
        model = layer_norm_model(rows, width, weight.detach().cpu().numpy(),
                                 None if bias is None else bias.detach().cpu().numpy(), eps)
        so = ort.SessionOptions()
        so.log_severity_level = 4  # its errors come back in the exception; Dawn warns of each driver it skips
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        for key, value in (options or {}).items():
            so.add_session_config_entry(OPTION_PREFIX + key, str(value))
        if profile_dir is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(Path(profile_dir) / "ort")
        try:
            with with_swiftshader():  # where ORT makes its one Dawn instance (the first session)
                self.session = ort.InferenceSession(model, so, providers=[PROVIDER], enable_fallback=0)
        except Exception as exc:  # ORT raises its own exception types, all with a message
            message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            if "fallback to CPU EP has been explicitly disabled" in message:
                raise OrtFallbackError(f"ORT would run LayerNormalization on its CPU provider, not on {PROVIDER}; "
                                       f"refused ({message})") from None
            raise RuntimeError(f"ORT's {PROVIDER} could not make a session: {message}. Without a GPU it needs "
                               f"SwiftShader's Vulkan driver (Debian's chromium-common)") from None

    def run(self, x: np.ndarray) -> np.ndarray:
        """session.run: a host array in, a host array out."""
        try:
            return self.session.run(None, {"x": x})[0]
        except Exception as exc:
            message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(f"ORT's {PROVIDER} failed to run LayerNormalization ({self.dtype}): {message}") from None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.run(x.detach().cpu().numpy()))

    def end_profiling(self) -> list[dict]:
        """The profile's events (the session stops profiling; its file is removed)."""
        path = Path(self.session.end_profiling())
        try:
            return json.loads(path.read_text())
        finally:
            path.unlink(missing_ok=True)


def check_webgpu_ran(events: list[dict]) -> None:
    """OrtFallbackError unless the profile holds node runs and every one ran on the WebGPU
    provider."""
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    if not nodes:
        raise OrtFallbackError("ORT's profile records no node run: cannot tell which provider ran LayerNormalization")
    elsewhere = sorted({f"{e['name'].removesuffix('_kernel_time')} on {e.get('args', {}).get('provider')}"
                        for e in nodes if e.get("args", {}).get("provider") != PROVIDER})
    if elsewhere:
        raise OrtFallbackError(f"ORT ran {', '.join(elsewhere)}, not on {PROVIDER}: refused")


def kernel_times(events: list[dict], runs: int) -> tuple[list[float], int]:
    """GPU microseconds of the LayerNorm node's dispatches in each of `runs` profiled runs
    (summed over the dispatches of a run), and dispatches a run; ([], 0) when the profile
    has no GPU timestamps (an adapter without timestamp queries)."""
    gpu = [e for e in events if e.get("cat") == "Api" and e.get("name", "").startswith(NODE + "&")]
    if not gpu:
        return [], 0
    gpu.sort(key=lambda e: e["ts"])
    per_run, rest = divmod(len(gpu), runs)
    if rest or not per_run:
        raise RuntimeError(f"ORT's profile has {len(gpu)} GPU events of {NODE!r} for {runs} runs")
    durations = [float(e["dur"]) for e in gpu]
    return [sum(durations[i:i + per_run]) for i in range(0, len(durations), per_run)], per_run


def time_ort(rows: int, width: int, dtype: str = "float32", repeats: int = 100, seed: int = 0,
             rms: bool = False) -> dict:
    """ORT's WebGPU LayerNormalization (SimplifiedLayerNormalization with `rms`) on rows x
    width at `dtype`:
    - ort_kernel_us: median GPU time of the node's dispatches in one run, from ORT's
      profiler (None where the adapter has no timestamps), over `repeats` runs after
      WARMUP_RUNS; ort_dispatches: its dispatches a run
    - ort_run_us: median wall time of session.run, host array to host array, unprofiled.
    Raises OrtFallbackError when anything ran elsewhere than on the WebGPU provider."""
    _check_dtype(dtype)
    kind = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    w, b = torch.randn(width, generator=gen).to(kind), torch.randn(width, generator=gen).to(kind)
    b = None if rms else b
    x = torch.randn(rows, width, generator=gen).to(kind).numpy()
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as folder:
        profiled = OrtLayerNorm(rows, width, w, b, profile_dir=folder)
        for _ in range(WARMUP_RUNS):
            profiled.run(x)
        warm_gpu()  # the GPU busy first, as before our timings (a different device, the same GPU)
        for _ in range(repeats):
            profiled.run(x)
        events = profiled.end_profiling()
    check_webgpu_ran(events)
    times, dispatches = kernel_times(events, WARMUP_RUNS + repeats)
    session = OrtLayerNorm(rows, width, w, b)
    run_us = wall_us(lambda: session.run(x))
    return {
        "ort_kernel_us": round(statistics.median(times[WARMUP_RUNS:]), 2) if times else None,
        "ort_dispatches": dispatches,
        "ort_run_us": round(run_us, 1),
    }


class OrtColumn:
    """ORT's WebGPU LayerNormalization as a column of bench_layer_norm (a benchmark.Column)."""

    name = "ort"

    def __init__(self, rms: bool = False) -> None:
        self._ort = _ort()[1]
        self.rms = rms  # SimplifiedLayerNormalization, an RMSNorm

    def describe(self) -> dict:
        return {
            "package": "onnxruntime-webgpu",
            "version": self._ort.__version__,
            "provider": PROVIDER,
            "op": "SimplifiedLayerNormalization" if self.rms else "LayerNormalization",
            "opset": OPSET,
            "kernel_clock": "ort-profiler-gpu-timestamps (whole microseconds, one run's dispatches)",
            "run_clock": "wall, session.run host to host",
            # ORT names no adapter. Its Dawn prefers a GPU to SwiftShader; without a GPU it ran
            # on SwiftShader, another device than the one our columns ran on.
            "vulkan_drivers": "the system's" + (f" and SwiftShader ({SWIFTSHADER_ICD})" if swiftshader_offered() else ""),
        }

    def time(self, rows: int, width: int, dtype: str, repeats: int) -> dict:
        return time_ort(rows, width, dtype, repeats, rms=self.rms)

    def runner(self, rows: int, width: int, dtype: str) -> Runner:
        _check_dtype(dtype)
        return lambda w, b: OrtLayerNorm(rows, width, w, b)

    def progress(self, result: dict) -> str:
        kernel = result["ort_kernel_us"]
        kernel_text = "no GPU timestamps" if kernel is None else f"{kernel:9.2f} us"
        return f"ORT kernel {kernel_text}, session.run {result['ort_run_us']:9.1f} us"
