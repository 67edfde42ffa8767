"""Fixtures. What is made once per test run (an exported file, a device, checkpoints) is made
here, session-scoped, for every test module that does not need its own; plain helpers live in
tests/support."""

import importlib
import json
import os
from types import SimpleNamespace

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


@pytest.fixture(scope="session")
def small_block(gpu_info, tmp_path_factory):
    """support.models.SmallBlock lowered once per test run: (module, inputs, program, its saved
    .pte, the inputs saved for worker processes)."""
    import torch

    import pipeline
    from support.inputs import randn
    from support.models import SmallBlock

    folder = tmp_path_factory.mktemp("small-block")
    module = SmallBlock().eval()
    inputs = (randn(2, 5, 12), randn(2, 6, 7, seed=1))
    program = pipeline.lower(module, inputs)
    program.save(folder / "small.pte")
    torch.save(inputs, folder / "inputs.pt")
    return module, inputs, program, folder / "small.pte", folder / "inputs.pt"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, the transformers model saved there) for each family, shrunken
    (support.tiny_models). Tests read them; one that damages a checkpoint copies it first."""
    from pipeline import models
    from support.tiny_models import write_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    return {name: (root / name, write_checkpoint(name, root / name)) for name in models.NAMES}


@pytest.fixture(scope="session")
def exported(checkpoints, tmp_path_factory):
    """export(name, dynamic=False): scripts/export_model.py run on the shrunken checkpoint of
    family `name` in a subprocess, as a user runs it, once per test run. Returns the finished
    process, its output folder and the summary it wrote. Tests read the files; one that
    changes them copies them first."""
    from support.scripts import run_script

    done = {}

    def export(name: str, dynamic: bool = False) -> SimpleNamespace:
        if (name, dynamic) not in done:
            out = tmp_path_factory.mktemp(f"{name}-export")
            process = run_script("export_model", name, "--checkpoint", str(checkpoints[name][0]), "--output-dir",
                                 str(out), *(["--dynamic"] if dynamic else []))
            assert process.returncode == 0, process.stderr
            coverage = next(out.glob("*.coverage.json"))
            done[name, dynamic] = SimpleNamespace(process=process, out=out, summary=json.loads(coverage.read_text()))
        return done[name, dynamic]

    return export
