"""What CI requires of the adapter (PIPELINE_REQUIRE_GPU=1)."""

from __future__ import annotations

import os

REQUIRE_GPU_ENV = "PIPELINE_REQUIRE_GPU"


def missing_subgroups(info: dict, environ=os.environ) -> str | None:
    """Why CI must fail rather than skip the kernel's subgroup path, or None. Under
    PIPELINE_REQUIRE_GPU=1 (CI) an adapter without subgroups would silently test one
    reduction path only; PIPELINE_WGPU_SUBGROUPS=0 (the workgroup-memory path by choice) is exempt."""
    from pipeline.runtime.device import SUBGROUPS_ENV

    if environ.get(REQUIRE_GPU_ENV) != "1" or environ.get(SUBGROUPS_ENV, "1") == "0" or info["subgroup_size"]:
        return None
    return (f"{REQUIRE_GPU_ENV}=1 but adapter {info['adapter']!r} ({info['backend']}) has no subgroup "
            f"operations, so the subgroup path would be skipped: run scripts/setup.sh (installs lavapipe), "
            f"or set {SUBGROUPS_ENV}=0 to test the workgroup-memory path alone")


def use_merge_path(path: str, monkeypatch) -> None:
    """Runs the test on one row-merge path: "subgroup" (shuffles; skipped where the adapter
    has none, which CI refuses: missing_subgroups) or "workgroup" (the workgroup-memory path
    of adapters without the `subgroup` feature; the device reads PIPELINE_WGPU_SUBGROUPS once,
    when it is made, and this sets what that decides)."""
    import pytest

    from pipeline.runtime import device

    g = device.gpu()
    if path == "subgroup" and not g.subgroup_size:
        pytest.skip("adapter has no subgroup operations")
    if path == "workgroup":
        monkeypatch.setattr(g, "subgroup_size", 0)


def use_row_path(path: str, monkeypatch) -> str:
    """Runs the test on one of the kernel's row paths: "subgroup" or "workgroup" merges
    (`use_merge_path`), and "streamed" or "streamed-workgroup": rows streamed, the path of rows
    too wide to hold, forced at every width, merged either way. Returns `path`."""
    import dataclasses

    from pipeline.runtime import launch
    from pipeline.wgsl.config import STREAM_UNROLL

    use_merge_path("workgroup" if path.endswith("workgroup") else "subgroup", monkeypatch)
    if path.startswith("streamed"):
        chosen = launch.choose_config

        def streamed(*args, **kwargs):
            return dataclasses.replace(chosen(*args, **kwargs), hold=0, unroll=STREAM_UNROLL)

        monkeypatch.setattr(launch, "choose_config", streamed)
    return path
