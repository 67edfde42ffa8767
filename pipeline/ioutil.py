"""Atomic file writes: a temp file in the target's folder, then rename over the target; several
files as a set (all written before any is renamed). Reads of regular files only, bounded."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO


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


# --- reading ---------------------------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """A path the product would read that is not a regular file: a directory, a named pipe,
    a device, a socket. `kind` says which; the message is one line naming the path."""

    def __init__(self, path: str | os.PathLike, mode: int) -> None:
        self.kind = file_kind(mode)
        what = "Is a directory" if stat.S_ISDIR(mode) else f"Not a regular file ({self.kind})"
        super().__init__(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, what, os.fspath(path))


class FileTooLarge(OSError):
    """A file larger than its reader's bound, refused before more than the bound is read."""

    def __init__(self, path: str | os.PathLike, limit: int) -> None:
        self.limit = limit
        super().__init__(errno.EFBIG, f"Larger than {limit} bytes", os.fspath(path))


class ArchiveTooLarge(OSError):
    """A zip archive (torch.save's format) whose entries declare more bytes than the file holds:
    compressed, or overlapping, they would load to more memory than its size bounds."""

    def __init__(self, path: str | os.PathLike, declared: int, size: int) -> None:
        super().__init__(errno.EFBIG, f"its zip entries declare at least {declared} bytes, more than the "
                         f"file's {size} (torch.save stores each uncompressed, once)", os.fspath(path))


def file_kind(mode: int) -> str:
    """What a path of this `st_mode` is, for messages: "a directory", "a named pipe", ..."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else
                "a special file")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The regular file at `path`, opened for reading in binary; NotRegularFile (an OSError)
    for a directory, a named pipe, a device or a socket, and the OSError of a path that cannot
    be opened. Opened without blocking, so a named pipe is refused rather than waited on: every
    file the product reads (checkpoints, vocabularies, layouts tables, audio, programs,
    inputs) is opened here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a device with no driver behind it
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise exc from None
            raise NotRegularFile(path, mode) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(path, mode)
    return open(fd, "rb")


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file at `path` (`open_regular`), at most `limit` of them:
    FileTooLarge (an OSError) for a longer file, of which no more than `limit` + 1 bytes
    are read (a file /proc makes claims 0 bytes, so its size is not trusted)."""
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise FileTooLarge(path, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, limit)
    return data


def open_torch_file(path: str | os.PathLike) -> BinaryIO:
    """The regular file at `path` (`open_regular`), for `torch.load`: a zip archive, torch.save's
    format, must declare no more bytes in its entries than the file holds (torch.load allocates
    what they declare and inflates compressed ones), else ArchiveTooLarge (an OSError) before
    anything is loaded. A file of torch's older format is its tensors' bytes as they are."""
    f = open_regular(path)
    try:
        size = os.fstat(f.fileno()).st_size
        if zipfile.is_zipfile(f):
            declared = 0
            with zipfile.ZipFile(f) as archive:  # a file passed in stays open
                for entry in archive.infolist():
                    declared += entry.file_size
                    if declared > size:
                        raise ArchiveTooLarge(path, declared, size)
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f


def sha256_regular(path: str | os.PathLike) -> str:
    """The sha256 of the regular file at `path` (`open_regular`), read in chunks."""
    with open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
