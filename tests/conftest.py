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


@contextlib.contextmanager
def made_once(tmp_path_factory, name: str):
    """A folder of this test run that every xdist worker shares, held under a lock: yields
    (folder, made); the caller fills it where `made` is False, and what it filled counts as
    made only when the block ends without an exception. So each worker's session fixture reads
    what the first one made instead of making it again."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' folders sit side by side in the run's own folder
    base = base / "made-once"
    base.mkdir(exist_ok=True)
    folder, mark = base / name, base / f"{name}.made"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = mark.exists()
        if not made:
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed to make it left this
            folder.mkdir()
        yield folder, made
        mark.touch()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, the transformers model saved there) for each family, shrunken
    (support.tiny_models, seeded: each worker builds the same model). Tests read them; one that
    damages a checkpoint copies it first."""
    from pipeline import models
    from support.tiny_models import tiny_full_model

    found = {}
    for name in models.NAMES:
        model = tiny_full_model(name)
        with made_once(tmp_path_factory, f"checkpoint-{name}") as (folder, made):
            if not made:
                model.save_pretrained(folder)
        found[name] = (folder, model)
    return found


@pytest.fixture(scope="session")
def exported(checkpoints, tmp_path_factory):
    """export(name, dynamic=False): the shrunken checkpoint of family `name` exported once per
    test run (by the first worker to ask; the others read its files) by
    scripts/export_model.py's main(), in this process (a new one would add ~10 s of imports to
    an export of seconds). Returns the output folder, the summary written there and what main()
    printed. Tests read the files; one that changes them copies them first."""
    from support.scripts import load_script

    cli = load_script("export_model")
    done = {}

    def export(name: str, dynamic: bool = False) -> SimpleNamespace:
        if (name, dynamic) not in done:
            with made_once(tmp_path_factory, f"{name}-export" + ("-dynamic" if dynamic else "")) as (out, made):
                printed = out.parent / f"{out.name}.stdout"  # beside the folder, which holds the export alone
                if not made:
                    stdout, stderr = io.StringIO(), io.StringIO()
                    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                        status = cli.main([name, "--checkpoint", str(checkpoints[name][0]), "--output-dir", str(out),
                                           *(["--dynamic"] if dynamic else [])])
                    assert status == 0, stderr.getvalue()
                    printed.write_text(stdout.getvalue())
            summary = json.loads(next(out.glob("*.coverage.json")).read_text())
            done[name, dynamic] = SimpleNamespace(out=out, summary=summary, stdout=printed.read_text())
        return done[name, dynamic]

    return export


@pytest.fixture(params=["subgroup", "workgroup"])
def reduction(request, monkeypatch):
    """Each row-merge path of the kernel in turn (support.gpu.use_merge_path)."""
    use_merge_path(request.param, monkeypatch)
    return request.param
