"""The environment variables that both the Python runtime and the C++ backend read, and the
bound on the file one names (the C++ gets them from a header generated from this module,
pipeline/native/generate.py); the WebGPU implementation both take (PIPELINE_WEBGPU: the C++
is built for each), and the Vulkan driver offered to Dawn's, in either, on a machine without
a GPU."""

import contextlib
import os
from pathlib import Path

# Part of an adapter's name: the one to use where several are offered.
ADAPTER_ENV = "PIPELINE_WGPU_ADAPTER"
# "0" turns subgroup reductions off (the workgroup-memory path is used, as without the feature).
SUBGROUPS_ENV = "PIPELINE_WGPU_SUBGROUPS"
# "0" keeps float16 stores on the kernel's integer rounding even where pack2x16float passed its probe.
F16_PACK_ENV = "PIPELINE_WGPU_PACK2X16FLOAT"

# A layouts file tuned on this device (pipeline.wgsl.layouts, scripts/tune_layouts.py): launches
# it names take its threads per row and workgroup size instead of the rule's. Unset, the table
# shipped for the device's adapter and implementation is taken where there is one
# (pipeline/wgsl/tuned/); LAYOUTS_NONE takes the rule everywhere.
LAYOUTS_ENV = "PIPELINE_LAYOUTS"
LAYOUTS_NONE = "none"
# The most bytes of that file either side reads (a tuned table is a few kB): a larger file, or
# one that is not a regular file (a named pipe, /dev/zero), is refused.
LAYOUTS_MAX_BYTES = 4 << 20

SHARED = ("ADAPTER_ENV", "SUBGROUPS_ENV", "F16_PACK_ENV", "LAYOUTS_ENV", "LAYOUTS_NONE", "LAYOUTS_MAX_BYTES")

# The WebGPU implementation: wgpu (wgpu-native; the default) or dawn (dawn-python's Dawn).
IMPLEMENTATION_ENV = "PIPELINE_WEBGPU"
IMPLEMENTATIONS = ("wgpu", "dawn")


def implementation() -> str:
    """The WebGPU implementation PIPELINE_WEBGPU names (default wgpu)."""
    name = os.environ.get(IMPLEMENTATION_ENV, "").strip().lower() or "wgpu"
    if name not in IMPLEMENTATIONS:
        raise RuntimeError(f"{IMPLEMENTATION_ENV}={name!r} is not a WebGPU implementation of ours; "
                           f"use one of {', '.join(IMPLEMENTATIONS)}")
    return name


# Where set-up puts a Vulkan driver Dawn accepts on a machine without a GPU: SwiftShader,
# from Debian's chromium-common (Mesa 22.3's lavapipe lacks features Dawn requires).
SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")


def swiftshader_offered() -> bool:
    """Whether `with_swiftshader` offers SwiftShader: it is installed, and no driver list was
    chosen explicitly (VK_ICD_FILENAMES, VK_DRIVER_FILES)."""
    return SWIFTSHADER_ICD.is_file() and not (os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES"))


@contextlib.contextmanager
def with_swiftshader():
    """While a Dawn (ours, or the one ONNX Runtime links in) makes its Vulkan instance:
    SwiftShader offered to the Vulkan loader beside the system's drivers (a GPU's among them,
    which Dawn prefers), unless the driver list was chosen explicitly. Only then: the
    process's other Vulkan users (wgpu, the native backend) keep the drivers they would find
    without Dawn."""
    before = os.environ.get("VK_ADD_DRIVER_FILES")
    if swiftshader_offered():
        extra = [p for p in (before or "").split(os.pathsep) if p]
        os.environ["VK_ADD_DRIVER_FILES"] = os.pathsep.join([*extra, str(SWIFTSHADER_ICD)])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VK_ADD_DRIVER_FILES", None)
        else:
            os.environ["VK_ADD_DRIVER_FILES"] = before
