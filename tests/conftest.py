"""Fixtures. What is made once per test run (an exported file, a device, checkpoints) is made
here, session-scoped, for every test module that does not need its own; plain helpers live in
tests/support."""

import contextlib
import importlib
import io
import json
import os
from types import SimpleNamespace

import pytest

from support.gpu import REQUIRE_GPU_ENV, missing_subgroups, use_merge_path


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
    """export(name, dynamic=False): the shrunken checkpoint of family `name` exported once per
    test run by scripts/export_model.py's main(), in this process (a new one would add ~10 s of
    imports to an export of seconds). Returns the output folder, the summary written there and
    what main() printed. Tests read the files; one that changes them copies them first."""
    from support.scripts import load_script

    cli = load_script("export_model")
    done = {}

    def export(name: str, dynamic: bool = False) -> SimpleNamespace:
        if (name, dynamic) not in done:
            out = tmp_path_factory.mktemp(f"{name}-export")
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                status = cli.main([name, "--checkpoint", str(checkpoints[name][0]), "--output-dir", str(out),
                                   *(["--dynamic"] if dynamic else [])])
            assert status == 0, stderr.getvalue()
            summary = json.loads(next(out.glob("*.coverage.json")).read_text())
            done[name, dynamic] = SimpleNamespace(out=out, summary=summary, stdout=stdout.getvalue())
        return done[name, dynamic]

    return export


@pytest.fixture(params=["subgroup", "workgroup"])
def reduction(request, monkeypatch):
    """Each row-merge path of the kernel in turn (support.gpu.use_merge_path)."""
    use_merge_path(request.param, monkeypatch)
    return request.param
