"""The census: every architecture of the installed transformers, built tiny, through each stage of
the pipeline, each in its own process; which stage each reaches, why it stops there, and whose
the failure is (ours: partitioner, preprocess, runtime, native, coverage, accuracy).

    python scripts/census.py [NAME ...] [--sample] [--jobs N] [--ray ADDRESS]

`stages` runs one row in this process; `worker` is the child process around it; `pool` runs
the children (local processes or Ray tasks); `run` keeps the records (census.jsonl, resumed)
and `report` writes census.json, .md and .html.
"""

from pipeline.census.run import JSONL, SAMPLE, read_records, run_census
from pipeline.census.stages import OUR_STAGES, STAGES

__all__ = ["JSONL", "OUR_STAGES", "SAMPLE", "STAGES", "read_records", "run_census"]
