"""What the census's fork server imports once, so that each row's process, forked from it, starts
with torch, transformers and ExecuTorch loaded (seconds a row) and nothing else begun: no
device, no thread pool, no model."""

from pipeline import cli

cli.quiet_dependencies()

import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
from executorch import exir  # noqa: E402,F401

from pipeline.aot import lowering  # noqa: E402,F401
from pipeline.evaluation import eager  # noqa: E402,F401
from pipeline.interpreter import program  # noqa: E402,F401
