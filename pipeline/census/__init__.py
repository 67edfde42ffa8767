"""The census: every architecture of the installed transformers, built tiny, through each stage of
the pipeline, each in its own process; which stage each reaches, why it stops there, and whose
the failure is (ours: partitioner, preprocess, runtime, native, coverage, accuracy).

    python scripts/census.py [NAME ...] [--sample] [--jobs N] [--ray ADDRESS]

`stages` runs one row in this process; `worker` is the child process around it; `pool` runs
the children (local processes or Ray tasks); `run` keeps the records (census.jsonl, resumed)
and `report` writes census.json, .md and .html.
"""

from __future__ import annotations

import importlib

# Loaded on first use, so that importing a module of this package (the fork server's
# pipeline.census.preload) imports nothing heavy before it has quieted the dependencies.
_EXPORTS = {"JSONL": "run", "SAMPLE": "run", "read_records": "run", "run_census": "run",
            "OUR_STAGES": "stages", "STAGES": "stages"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
