"""The command-line scripts, run as a user runs them or loaded for in-process `main(argv)` calls."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def script_env() -> dict[str, str]:
    """This checkout's package, whatever is installed in the environment."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), *args], capture_output=True, text=True,
                          env=script_env(), timeout=300)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_cli", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
