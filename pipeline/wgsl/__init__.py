"""The kernel: WGSL files shipped as package data (importlib.resources), and the few
decisions about their text that every runtime shares (the Python launch, the C++ backend
built from it, the browser page): the directives each shader compiler needs, and the cases
of the float16 pack probe; `config` holds the kernel's configuration rule and module text.

Imports numpy only: the C++ build reads it without a device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

# The kernel's storage types, as torch names them (the blob numbers them: pipeline.blob).
DTYPES = ("float32", "float16", "bfloat16")

# The shader compilers that need an `enable` directive before a module may use subgroup
# operations: Tint does (WGSL's rule); naga in wgpu 0.32 refuses the directive. The one
# place that decides it (the C++ backend's directive is generated from it).
NEEDS_ENABLE_SUBGROUPS = {"tint": True, "naga": False}


@functools.cache
def source(name: str) -> str:
    """The text of one of the package's WGSL files."""
    return resources.files("pipeline.wgsl").joinpath(name).read_text()


@dataclass(frozen=True)
class ShaderFiles:
    """The package's WGSL files, and modules assembled from them as `compiler` takes them."""

    compiler: str  # "naga" or "tint"

    def shader_source(self, name: str) -> str:
        return source(name)

    def module(self, body: str, subgroups: bool) -> str:
        """A complete module: the directives `compiler` needs for what `body` uses, then `body`."""
        return ("enable subgroups;\n" if subgroups and NEEDS_ENABLE_SUBGROUPS[self.compiler] else "") + body


def f16_pack_cases() -> np.ndarray:
    """float32 values whose float16 rounding the pack probe checks: ties to even in every
    binade's shape, the edges of float16's range (65504, 65519.99, 65520, subnormal
    halves, underflow), infinities, NaN, and seeded random values over the whole range."""
    edges = [0.0, 1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10 + 2**-11, 2049.0, 2051.0, 0.1, 1 / 3,
             65504.0, 65519.99, 65520.0, 1e5, 3.4e38, float("inf"), float("nan"),
             6.103515625e-05, 6.1e-5, 5.9604645e-08, 2.9802322e-08, 2.98e-8, 8.940697e-08, 1e-9]
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(4000) * np.exp2(rng.uniform(-26, 17, 4000))
    values = np.concatenate([edges, np.negative(edges), spread]).astype(np.float32)
    return values if values.size % 2 == 0 else np.append(values, np.float32(0))


def aten_f16_bits(values: np.ndarray) -> np.ndarray:
    """float32 `values` rounded to float16 as aten (and numpy, IEEE) rounds them, as bits."""
    with np.errstate(over="ignore"):
        return values.astype(np.float16).view(np.uint16)


def pack_matches_aten(values: np.ndarray, got: np.ndarray) -> bool:
    """Whether float16 bits `got` are `values` rounded as aten (and numpy, IEEE) rounds them."""
    want = aten_f16_bits(values)
    nan = np.isnan(values)
    got_nan = ((got & 0x7C00) == 0x7C00) & ((got & 0x03FF) != 0)
    return bool(np.array_equal(got[~nan], want[~nan]) and got_nan[nan].all())
