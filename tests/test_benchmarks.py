"""The scripts in benchmarks/: each answers --help with its usage and does nothing else."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

# Each script run as `python SCRIPT --help` runs it (its folder first on sys.path, its path as
# argv[0]), from an empty folder of its own, all in one child process: the imports they share
# (torch, ExecuTorch, transformers) load once rather than once a script.
HELP_CODE = """
import contextlib, io, json, os, runpy, sys
results = {}
for script, folder in json.loads(sys.argv[1]):
    os.chdir(folder)
    sys.argv, sys.path[0] = [script, "--help"], os.path.dirname(script)
    out, err, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = repr(exc)
    results[script] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def help_runs(tmp_path_factory):
    """script path -> (its folder, what `SCRIPT --help` did: exit code, stdout, stderr)."""
    folders = {str(script): tmp_path_factory.mktemp(script.stem) for script in SCRIPTS}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", HELP_CODE, json.dumps([[s, str(f)] for s, f in folders.items()])],
                         cwd=tmp_path_factory.mktemp("cwd"), env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.splitlines()[-1])
    return {script: (folders[script], results[script]) for script in folders}


def test_benchmarks_are_found():
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints_usage_and_writes_nothing(script, help_runs):
    # Run from an empty folder: --help must create no file there (nor measure anything).
    folder, result = help_runs[str(script)]
    assert result["code"] == 0, result["stderr"][-2000:] or result["code"]
    assert result["stdout"].startswith(f"usage: {script.name}"), result["stdout"][:200]
    assert not list(folder.iterdir())
