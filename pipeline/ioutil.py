"""Atomic file writes: a temp file in the target's folder, then rename over the target; several
files as a set (all written before any is renamed)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


# True while a set of files takes its names: the scripts' interrupt handler
# (scripts/_interrupts.py) lets the renames finish first, so that no set is left part new.
_renaming = False


def renaming() -> bool:
    """Whether `write_files_atomic` is renaming a set of files into place right now."""
    return _renaming


def write_bytes_atomic(path: str | os.PathLike, data: bytes, check: Callable[[str], None] | None = None) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one.

    `check(temp_path)` runs on the complete file before it takes its name; whatever it
    raises leaves `path` as it was.
    """
    write_files_atomic([(path, data, check)])


def write_files_atomic(files: Sequence[tuple[str | os.PathLike, bytes | Callable[[], bytes],
                                             Callable[[str], None] | None]]) -> None:
    """Write several files, each `(path, data, check)` as `write_bytes_atomic` writes one,
    as a set: every file is written in full to a temp file beside its target (and checked)
    before any takes its name, so a full disk, a failed check or an interrupt on the way
    removes every temp file and leaves the previous files as they were. Then each temp
    file takes its name, in order (a rename writes no data; the scripts hold an interrupt
    until the last has, see `renaming`). `data` may be a function,
    called when the files before it are written and checked.
    """
    global _renaming
    temps: list[tuple[str, Path]] = []
    try:
        for path, data, check in files:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data() if callable(data) else data)
                f.flush()
                os.fsync(f.fileno())
            if check is not None:
                check(tmp)
            # mkstemp makes the file private (0600); give it the mode a plain open() would.
            os.chmod(tmp, 0o666 & ~_umask())
        _renaming = True
        try:
            while temps:
                tmp, path = temps[0]
                os.replace(tmp, path)
                temps.pop(0)
        finally:
            _renaming = False
    except BaseException:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    write_bytes_atomic(path, json_bytes(obj))


def json_bytes(obj: object) -> bytes:
    """`obj` as the JSON files are written: indented, one trailing newline."""
    return (json.dumps(obj, indent=2) + "\n").encode()


def check_output_file(path: str | os.PathLike) -> None:
    """Raise ValueError (one line) unless a file can be written at `path`: it is not a
    folder, and its folder exists or can be created, writable. Checked before long work."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a file")
    check_output_dir(path.parent)


def check_output_dir(path: str | os.PathLike) -> None:
    """Raise ValueError (one line) unless `path` is a writable folder or can be made one."""
    path = Path(path)
    existing = path
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"cannot write under {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write under {path}: {existing} is not writable")
