"""What the scripts share: argument types, and quiet output from the libraries we import.

The scripts' own progress and errors are what a user should see. ExecuTorch and
transformers import torchao, which logs a line per optional kernel library it cannot
load, and torch's pytree logs a deprecation per enum torchao registers; exports hit a
LeafSpec FutureWarning; Mesa's Vulkan drivers print a missing XDG_RUNTIME_DIR.
`quiet_dependencies` drops exactly those (by logger and message; a private empty
XDG_RUNTIME_DIR for the last), unless the user asked for `--verbose`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

# The model registry's names (pipeline.models.NAMES, which imports transformers), known to
# argument parsing before anything heavy is imported; tests/test_models.py holds them equal.
MODEL_NAMES = ("bart", "florence2", "whisper")
SEED_LIMIT = 2**64  # torch generators take seeds below this; numpy's take none below 0
# pipeline.models.audio.MAX_FILES, known to argument parsing likewise (tests/test_speech.py).
MAX_AUDIO_FILES = 16


def say(line: str, stream=None) -> None:
    """Write `line` and its newline in one write, then flush (stderr unless `stream` is given).

    `print` writes a line and its end in two calls, and a signal handled between them leaves
    the line open: the script's last line ("interrupted") would then be joined to it."""
    stream = sys.stderr if stream is None else stream
    stream.write(f"{line}\n")
    stream.flush()


def print_progress(line: str) -> None:
    """Say a progress line on stdout. Once stdout is a closed pipe (`| head -1`), the
    rest goes nowhere: the work and the files it writes carry on, and the process ends
    without a traceback."""
    try:
        say(line, sys.stdout)
    except BrokenPipeError:
        # Later prints, and the flush at exit, write to /dev/null instead of raising.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def seed(text: str) -> int:
    """argparse type: a seed from 0 to 2**64 - 1."""
    value = _int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"seed must be from 0 to 2**64 - 1, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an int of at least 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def audio_files(text: str) -> str:
    """argparse type: a `--audio A.wav[,B.wav]` value that names one to MAX_AUDIO_FILES files
    (split as `pipeline.models.audio.audio_paths` splits it: a name holding a comma is taken
    whole when it names a file)."""
    items = [text] if os.path.isfile(text) else [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"names no file: {text!r}")
    if len(items) > MAX_AUDIO_FILES:
        raise argparse.ArgumentTypeError(f"{len(items)} files; at most {MAX_AUDIO_FILES} are read in one call")
    return text


# What a benchmark shape may be: the kernel counts rows in a u32 and a row's bytes in a u32.
U32_MAX = 2**32 - 1


def check_bench_shapes(shapes: list[tuple[int, int]]) -> None:
    """ValueError (one line) for a ROWSxWIDTH the kernel cannot launch: rows beyond a u32,
    or a row of more than 2^32 - 1 bytes of float32."""
    for rows, width in shapes:
        if rows > U32_MAX or width * 4 > U32_MAX:
            raise ValueError(f"shape {rows}x{width}: rows must be at most {U32_MAX} and width at most "
                             f"{U32_MAX // 4} (the kernel counts in u32)")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def add_hf(parser: argparse.ArgumentParser) -> None:
    """--hf DIR (any Hugging Face model directory, instead of a model name), --task, --inputs."""
    parser.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory instead of a model name: "
                        "config.json, weights in safetensors or PyTorch's format (sharded or not; none: seeded "
                        "random weights, and the outputs say so), tokenizer files when present; any architecture "
                        "the installed transformers knows")
    parser.add_argument("--task", help="with --hf: the model class, e.g. base, causal-lm, seq2seq-lm, "
                        "image-classification (default: the config's architectures, else the base model)")
    parser.add_argument("--inputs", metavar="FILE.pt", help="with --hf: example inputs instead of the built ones, "
                        "torch.save'd as a dict forward argument name -> tensor")


def check_hf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad usage of --hf, --task, --inputs (exit 2): a model name or --hf, tasks by name."""
    hf = getattr(args, "hf", None)
    if hf is not None and getattr(args, "model", None) is not None:
        parser.error("argument --hf: give a model name or --hf DIR, not both")
    if hf is None and (args.task is not None or args.inputs is not None):
        parser.error(f"argument {'--task' if args.task is not None else '--inputs'}: only with --hf DIR")
    if hf is not None:
        for name in ("variant", "checkpoint", "audio"):
            if getattr(args, name, None) is not None:
                parser.error(f"argument --{name}: not with --hf (the directory is the model)")
        if getattr(args, "dynamic", False):
            parser.error("argument --dynamic: not with --hf")
    if args.task is not None:
        from pipeline.models.hf import tasks

        if args.task not in tasks():
            parser.error(f"argument --task: invalid choice {args.task!r} (choose from {', '.join(tasks())})")


def add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="cast the model and its inputs to this dtype (default float32)")


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="also show the warnings and log lines of the libraries this uses")


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


# logger name -> what its known-harmless lines contain
_NOISE = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
}


def quiet_dependencies(verbose: bool = False) -> None:
    """Drop the known import-time and export-time noise of our dependencies (not with `verbose`).
    Call it before importing ExecuTorch, transformers or torchao."""
    if verbose:
        return
    _quiet_wayland()
    for name, fragments in _NOISE.items():
        logging.getLogger(name).addFilter(_DropMessages(*fragments))
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)


def _quiet_wayland() -> None:
    """Mesa's Vulkan drivers (lavapipe here) look for a Wayland display when the device is
    created and print "XDG_RUNTIME_DIR is invalid or not set" to stderr from C when the
    variable is missing. Headless, a private empty directory for it says the same, quietly."""
    import os
    import tempfile
    from pathlib import Path

    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and Path(current).is_dir():
        return
    folder = Path(tempfile.gettempdir()) / f"pipeline-runtime-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return
    if folder.stat().st_uid == os.getuid():
        os.environ["XDG_RUNTIME_DIR"] = str(folder)
