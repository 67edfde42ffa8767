"""What the device layer asks of each WebGPU implementation (wgpu_impl.py, dawn_impl.py):
the adapter they open and the pipelines they return."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.environment import ADAPTER_ENV


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


def no_adapter_help(implementation: str) -> str:
    if implementation == "dawn":
        return ("Dawn found no GPU adapter. On a machine without a GPU it needs SwiftShader's Vulkan "
                "driver (Debian's chromium-common: /usr/lib/chromium/vk_swiftshader_icd.json): run "
                f"`make setup`. Set {ADAPTER_ENV} to part of an adapter's name to require one.")
    return ("wgpu found no GPU adapter. On a machine without a GPU install Mesa's lavapipe "
            "(Vulkan on the CPU): `apt-get install mesa-vulkan-drivers`, or run `make setup`. "
            f"Set {ADAPTER_ENV} to part of an adapter's name to choose among several.")


@dataclass(frozen=True)
class Pipeline:
    """A compute pipeline and the layout its bind groups follow."""

    pipeline: Any
    layout: Any
