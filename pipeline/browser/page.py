"""The native_layer_norm kernel on a browser's own WebGPU (`navigator.gpu`).

page.html runs WebGPU's lifecycle and nothing else; everything it runs comes
from here: each WGSL module as the runtime assembles it for Tint (the compiler Chromium's
Dawn runs), chosen by the runtime's own rule for the browser adapter's subgroup size and
float16 packing (both probed in the page with the runtime's probe shaders), the rows as
the bytes the runtime uploads, and aten's float64 result as the expected values. Results
come back as the runtime reads them: out like x, mean and rstd in aten's dtypes.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import torch

from pipeline.browser.chromium import BrowserError, Chromium, Page, find_chromium
from pipeline.wgsl import ShaderFiles, f16_pack_cases, pack_matches_aten
from pipeline.runtime.launch import BINDINGS, DTYPES, _STORED, _stored, _words, grid, pack_params
from pipeline.wgsl.config import KernelConfig, choose_config

PAGE = "page.html"
# Chromium runs Dawn, whose shader compiler is Tint.
FILES = ShaderFiles("tint")
ATEN = torch.ops.aten.native_layer_norm.default


@dataclass(frozen=True)
class Launch:
    """One launch of the kernel over the rows of `x` (rows, width), as aten's
    native_layer_norm(x, [width], weight, bias, eps) defines it."""

    x: torch.Tensor
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-5
    subgroups: bool = True  # False: the workgroup-memory path, as on an adapter without subgroups
    write_stats: bool = True
    label: str = ""


@dataclass
class Outcome:
    """What the page returned for one launch: the outputs in aten's dtypes (mean and rstd
    None without write_stats), the compiler's warnings, the page's own comparison with
    the float64 values it was given (`checks[name]`: maxError, nanMismatches), or the
    error that stopped the launch."""

    launch: Launch
    config: KernelConfig
    out: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    rstd: torch.Tensor | None = None
    warnings: list[str] = field(default_factory=list)
    checks: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str | None = None


def _base64(data: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(data).tobytes()).decode("ascii")


def _array(text: str, dtype, count: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype, count=count).copy()


def _dtype_name(dtype: torch.dtype) -> str:
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise ValueError(f"x must be float32, float16 or bfloat16, got {dtype}")


def float64_reference(launch: Launch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_layer_norm in float64 on the launch's (possibly half) values."""
    double = lambda t: None if t is None else t.double()  # noqa: E731
    return ATEN(launch.x.double(), [launch.x.shape[-1]], double(launch.weight), double(launch.bias), launch.eps)


class BrowserKernel:
    """The page open in a browser tab, its WebGPU device made and probed."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.adapter: dict = page.evaluate("nativeLayerNorm.open()")
        self.subgroup_size = self._probe_subgroup_size() if self.adapter["subgroups"] else 0
        self.pack2x16float = self._probe_f16_pack()

    def _probe(self, shader: str, contents: list[np.ndarray], groups: int, read: int, subgroups: bool) -> bytes:
        """Run one of the runtime's probe shaders in the page, as the runtime runs it."""
        request = {"label": shader, "module": FILES.module(FILES.shader_source(shader), subgroups),
                   "contents": [_base64(c) for c in contents], "groups": groups, "read": read}
        return base64.b64decode(self.page.evaluate(f"nativeLayerNorm.probe({json.dumps(request)})"))

    def _probe_subgroup_size(self) -> int:
        """The smallest subgroup size of a 256-thread workgroup (subgroup_size.wgsl): the
        kernel's shuffles are sized by it."""
        data = self._probe("subgroup_size.wgsl", [np.array([0xFFFFFFFF], dtype=np.uint32)], 1, 0, True)
        size = int(np.frombuffer(data, dtype=np.uint32)[0])
        return size if 0 < size <= 256 and size & (size - 1) == 0 else 0

    def _probe_f16_pack(self) -> bool:
        """Whether pack2x16float rounds as aten does here (f16_pack_probe.wgsl)."""
        values = f16_pack_cases()
        data = self._probe("f16_pack_probe.wgsl", [values, np.zeros(values.size, dtype=np.uint16)],
                           (values.size // 2 + 63) // 64, 1, False)
        return pack_matches_aten(values, np.frombuffer(data, dtype=np.uint16, count=values.size))

    def config(self, launch: Launch) -> KernelConfig:
        """The runtime's configuration for `launch` on this browser's adapter."""
        x = launch.x
        if x.dim() != 2:
            raise ValueError(f"x must be (rows, width), got shape {list(x.shape)}")
        for name, t in (("weight", launch.weight), ("bias", launch.bias)):
            if t is not None and (tuple(t.shape) != (x.shape[1],) or t.dtype not in (x.dtype, torch.float32)):
                raise ValueError(f"{name} must have shape [{x.shape[1]}] and x's dtype or float32, "
                                 f"got {list(t.shape)} {t.dtype}")
        if x.numel() * x.element_size() > self.adapter["limits"]["maxStorageBufferBindingSize"]:
            raise ValueError(f"x of {list(x.shape)} exceeds the browser's storage binding limit")
        affine = next((t.dtype for t in (launch.weight, launch.bias) if t is not None), x.dtype)
        return choose_config(x.shape[-1], launch.weight is not None, launch.bias is not None,
                             self.subgroup_size if launch.subgroups else 0, _dtype_name(x.dtype),
                             _dtype_name(affine), self.pack2x16float, rows=x.shape[0],
                             write_stats=launch.write_stats)

    def request(self, launch: Launch) -> dict:
        """What the page's run() takes for `launch` (JSON): the module, buffers' bytes, grid."""
        config = self.config(launch)
        x = launch.x
        rows, width = x.shape
        out, mean, rstd = float64_reference(launch)
        return {
            "label": f"{launch.label or 'launch'}: {config}",
            "module": config.source(FILES),
            "bindings": BINDINGS,
            "dtype": config.dtype,
            "rows": rows,
            "width": width,
            "grid": grid(rows, config),
            "writeStats": launch.write_stats,
            "x": _base64(_words(_stored(x.detach()))),
            "weight": None if launch.weight is None else _base64(_words(_stored(launch.weight.detach()))),
            "bias": None if launch.bias is None else _base64(_words(_stored(launch.bias.detach()))),
            "params": _base64(pack_params(rows, launch.eps)),
            "expected": {name: _base64(t.reshape(-1).numpy()) for name, t in
                         (("out", out), ("mean", mean), ("rstd", rstd))},
        }

    def run(self, launches: list[Launch], timeout: float = 120.0) -> list[Outcome]:
        """Every launch in one evaluation in the page, in order. A launch the browser
        refuses (a compiler or validation error) has its message in `Outcome.error`; an
        error outside any launch (an uncaptured WebGPU error, a lost device) raises."""
        configs = [self.config(launch) for launch in launches]
        requests = [self.request(launch) for launch in launches]
        answer = self.page.evaluate(f"nativeLayerNorm.run({json.dumps(requests)})", timeout=timeout)
        if answer["uncaptured"]:
            raise BrowserError("WebGPU errors outside any launch: " + "; ".join(answer["uncaptured"]))
        return [self._outcome(launch, config, result)
                for launch, config, result in zip(launches, configs, answer["results"])]

    @staticmethod
    def _outcome(launch: Launch, config: KernelConfig, result: dict) -> Outcome:
        if "error" in result:
            return Outcome(launch, config, error=result["error"])
        x = launch.x
        affine = next((t.dtype for t in (launch.weight, launch.bias) if t is not None), x.dtype)
        out = torch.from_numpy(_array(result["out"], _STORED[x.dtype], x.numel())).view(x.dtype).reshape(x.shape)
        outcome = Outcome(launch, config, out=out, warnings=result["warnings"], checks=result["checks"])
        if launch.write_stats:
            # Computed in float32; a half dtype rounds them once here, as the runtime does.
            outcome.mean, outcome.rstd = (
                torch.from_numpy(_array(result[name], np.float32, len(x))).to(affine).reshape(len(x), 1)
                for name in ("mean", "rstd"))
        return outcome


@contextlib.contextmanager
def open_browser_kernel(executable: str | None = None, timeout: float = 30.0) -> Iterator[BrowserKernel]:
    """A headless Chromium (`executable`, else find_chromium()'s) showing the page, its
    device made and probed; the browser ends and its profile goes when the block exits."""
    executable = executable or find_chromium()
    if executable is None:
        raise BrowserError("no Chromium found: install Debian's chromium, or set PIPELINE_CHROMIUM to a "
                           "Chromium or Chrome executable")
    with resources.as_file(resources.files("pipeline.browser").joinpath(PAGE)) as page_file:
        with Chromium(executable, timeout) as browser:
            yield BrowserKernel(browser.open(page_file.resolve().as_uri()))
