import os

import pytest


@pytest.fixture(scope="session")
def gpu_info():
    """Device info, or a skip when wgpu has no adapter (a failure under PIPELINE_REQUIRE_GPU=1)."""
    from pipeline import runtime

    try:
        return runtime.device_info()
    except RuntimeError as exc:
        if os.environ.get("PIPELINE_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no wgpu adapter: {exc}")
