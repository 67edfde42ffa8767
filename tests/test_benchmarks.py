"""The scripts in benchmarks/: each answers --help with its usage and does nothing else."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_benchmarks_are_found():
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints_usage_and_writes_nothing(script, tmp_path):
    # Run from an empty folder: --help must create no file there (nor measure anything).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {script.name}"), result.stdout[:200]
    assert not list(tmp_path.iterdir())
