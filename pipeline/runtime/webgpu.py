"""What the device layer asks of each WebGPU implementation (wgpu_impl.py, dawn_impl.py):
the adapter they open and the pipelines they return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.environment import ADAPTER_ENV


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
