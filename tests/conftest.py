"""Fixtures; plain helpers live in tests/support."""

import importlib
import os

import pytest

from support.gpu import REQUIRE_GPU_ENV, missing_subgroups


@pytest.fixture(scope="session")
def gpu_info():
    """Device info, or a skip when wgpu has no adapter (a failure under PIPELINE_REQUIRE_GPU=1,
    as is an adapter without subgroups, see `missing_subgroups`)."""
    from pipeline import runtime

    try:
        info = runtime.device_info()
    except RuntimeError as exc:
        if os.environ.get(REQUIRE_GPU_ENV) == "1":
            raise
        pytest.skip(f"no wgpu adapter: {exc}")
    reason = missing_subgroups(info)
    if reason:
        pytest.fail(reason)
    return info


@pytest.fixture(scope="session")
def native():
    """pipeline.native with its library built and loaded; a skip only when no compiler exists."""
    from pipeline.native import build as native_build

    try:
        native_build.find_compiler()
    except native_build.BuildError as exc:
        pytest.skip(str(exc))
    module = importlib.import_module("pipeline.native")
    module.library()
    return module


@pytest.fixture(scope="session")
def native_runtime(native, gpu_info):
    """The backend registered in ExecuTorch's runtime, with a device."""
    available, reason = native.device()
    assert available, f"the native backend finds no device although wgpu does: {reason}"
    native.register()
    return native
