"""Read a `.pte` file: check its framing, parse the program flatbuffer, check it
(`pipeline.pte.verify`), and address its segments in place — constants are views of
the program's bytes, never copies.

A file is read once into private memory: truncating or overwriting it afterwards cannot
reach a loaded program (a mapping of the file would fault on truncation and follow an
overwrite). Only regular files are read; a FIFO or a device is refused without blocking.
Its identifier and extended header are checked from its first bytes, and the file must be
exactly as long as the header accounts for, so no more than that is ever read.

Layout (ExecuTorch's): a flatbuffer whose identifier `ET12` sits at offset 4, an extended
header `eh00` at offset 8 (flatbuffer size, where the segments start and their size), then
the segments: the constant segment (every constant tensor, addressed by
`constant_segment.offsets[data_buffer_idx]`) and delegate segments (the blobs).

The flatbuffer is parsed with ExecuTorch's own (private) reader; executorch is pinned and
`tests/test_pte.py` fails loudly if that reader changes.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import struct
from dataclasses import dataclass

from executorch.exir import schema
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program

from pipeline.pte import verify

IDENTIFIER = b"ET12"
EXTENDED_MAGIC = b"eh00"
EXTENDED = struct.Struct("<4sIQQQ")  # magic, header length, program size, segment base, segment size
EXTENDED_AT = 8
EXTENDED_LENGTHS = (24, 32)  # the segment size field came later; older headers stop before it
HEAD = EXTENDED_AT + EXTENDED.size  # the identifier and the extended header: read before the rest
FLATBUFFER_LIMIT = 2**31 - 1  # a flatbuffer's offsets are 32-bit


class PteError(ValueError):
    """The bytes are not a `.pte` this product can run: foreign, truncated or corrupt."""


@dataclass(frozen=True)
class Segment:
    """A segment's place in the file, as absolute byte offsets."""

    start: int
    size: int


class PteFile:
    """A parsed `.pte`: `program` (ExecuTorch's schema dataclasses) and its bytes.

    `data` is the whole file's bytes (read once: nothing done to the file afterwards
    reaches a program built on them).
    """

    def __init__(self, data, source: str) -> None:
        self.data = data
        self.source = source
        self.program, self.segments = _parse(data, source)

    @classmethod
    def read(cls, path: str | os.PathLike) -> PteFile:
        """Read the file at `path` into private memory; raises FileNotFoundError or
        PermissionError as the OS does, PteError when it is not a regular file (a folder, a
        socket, a loop of links, a /proc file) or its contents are not a program."""
        return cls(read_private(path), str(path))

    @property
    def plan(self) -> schema.ExecutionPlan:
        return self.program.execution_plan[0]

    def constant(self, index: int, nbytes: int) -> tuple[object, int]:
        """(buffer, offset) of constant tensor data `index` (a tensor's data_buffer_idx)."""
        program = self.program
        if program.constant_buffer:  # older files keep constants inline in the flatbuffer
            if not 0 < index < len(program.constant_buffer):
                raise PteError(f"{self.source}: constant {index} of {len(program.constant_buffer)} does not exist")
            storage = program.constant_buffer[index].storage
            if len(storage) < nbytes:
                raise PteError(f"{self.source}: constant {index} holds {len(storage)} bytes, needs {nbytes}")
            return storage, 0
        offsets = program.constant_segment.offsets
        if not 0 < index < len(offsets):
            raise PteError(f"{self.source}: constant {index} of {len(offsets)} does not exist")
        segment = self._segment(program.constant_segment.segment_index, "constant")
        if offsets[index] + nbytes > segment.size:
            raise PteError(f"{self.source}: constant {index} ({nbytes} bytes at {offsets[index]}) runs past "
                           f"its segment of {segment.size} bytes")
        return self.data, segment.start + offsets[index]

    def delegate_bytes(self, delegate: schema.BackendDelegate) -> bytes:
        """The processed blob of `delegate`, inline or in its segment."""
        ref = delegate.processed
        if ref.location == schema.DataLocation.INLINE:
            inline = self.program.backend_delegate_data
            if not 0 <= ref.index < len(inline):
                raise PteError(f"{self.source}: delegate data {ref.index} of {len(inline)} does not exist")
            return bytes(inline[ref.index].data)
        segment = self._segment(ref.index, "delegate")
        return bytes(self.data[segment.start : segment.start + segment.size])

    def _segment(self, index: int, what: str) -> Segment:
        if not 0 <= index < len(self.segments):
            raise PteError(f"{self.source}: {what} segment {index} of {len(self.segments)} does not exist")
        return self.segments[index]


def read_private(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at `path`, read into this process's memory.

    Opened without blocking (a FIFO would otherwise wait for a writer) and refused unless
    it is a regular file. The identifier and extended header are checked from the first
    bytes, before the rest is read, and no more than the header accounts for is read: a
    file larger than that (a program followed by other bytes) is refused unread, as is one
    that changes while it is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _not_openable(path, exc) from None
    before = os.fstat(fd)
    if not stat.S_ISREG(before.st_mode):  # checked before FileIO, which names a folder by its descriptor
        os.close(fd)
        raise PteError(f"{path}: {_not_regular(before.st_mode)}")
    with io.FileIO(fd, "rb") as f:
        size = before.st_size
        head = os.pread(fd, HEAD, 0)
        if size == 0:
            raise PteError(f"{path}: its size reads as 0 but it has contents: a file the kernel makes (/proc, "
                           "/sys), not a .pte" if head else f"{path}: empty file, not an ExecuTorch program (.pte)")
        end = extent(head, size, str(path))
        if end is None:  # an older header: the segments the program lists say where the file ends
            program_size = EXTENDED.unpack_from(head, EXTENDED_AT)[2]
            end = _checked_size(str(path), size, _segments_end(os.pread(fd, program_size, 0), head, str(path)))
        data = _read(f, end)
        after = os.fstat(fd)
    if len(data) != size or after.st_size != size or after.st_mtime_ns != before.st_mtime_ns:
        raise PteError(f"{path}: the file changed while it was read ({size} bytes, then {after.st_size})")
    return data


def _read(f: io.FileIO, n: int) -> bytes:
    """`n` bytes from the start of `f` (fewer only when it ends sooner): one read and no copy
    under 2 GiB, the most one read returns on Linux."""
    parts = []
    got = 0
    while got < n:
        chunk = f.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def extent(head: bytes, size: int, source: str) -> int | None:
    """How many bytes a `.pte` of `size` bytes that starts with `head` (its first HEAD bytes)
    has: what its extended header accounts for (the program, then its segments), or the
    whole file for a program without one (a flatbuffer alone); None for an older header that
    does not record the segments' size. PteError when the identifier or the header is wrong,
    or the file is not that size: shorter is truncated, longer carries bytes of no program."""
    if size < 8 or bytes(head[4:8]) != IDENTIFIER:
        found = bytes(head[4:8]) if size >= 8 else b""
        raise PteError(f"{source}: not an ExecuTorch program (.pte): identifier {found!r}, expected {IDENTIFIER!r}")
    if size < HEAD or bytes(head[EXTENDED_AT : EXTENDED_AT + 4]) != EXTENDED_MAGIC:
        if size > FLATBUFFER_LIMIT:
            raise PteError(f"{source}: {size} bytes and no extended header: a program without one is a "
                           f"flatbuffer alone, at most {FLATBUFFER_LIMIT} bytes")
        return size
    _, length, program_size, base, segments_size = EXTENDED.unpack_from(head, EXTENDED_AT)
    if length not in EXTENDED_LENGTHS:
        raise PteError(f"{source}: extended header length {length} is corrupt")
    if not 0 < program_size <= size:
        raise PteError(f"{source}: truncated: the program alone is {program_size} bytes, the file {size}")
    if base and (base < program_size or base > size):
        raise PteError(f"{source}: truncated or corrupt: segments start at {base}, the file is {size} bytes")
    if length < EXTENDED.size and base:
        return None
    return _checked_size(source, size, base + segments_size if base else program_size)


def _segments_end(program_bytes: bytes, head: bytes, source: str) -> int:
    """Where the last segment ends, for an older header that does not say."""
    base = EXTENDED.unpack_from(head, EXTENDED_AT)[3]
    program = _read_flatbuffer(program_bytes, source)
    return base + max((seg.offset + seg.size for seg in program.segments), default=0)


def _checked_size(source: str, size: int, end: int) -> int:
    if end > size:
        raise PteError(f"{source}: truncated: {size} bytes of {end}")
    if end < size:
        raise PteError(f"{source}: {size} bytes, but its header accounts for {end}: the {size - end} bytes "
                       "after the program's end are no part of it")
    return end


def _read_flatbuffer(program_bytes: bytes, source: str) -> schema.Program:
    try:
        return _flatbuffer_to_program(program_bytes)
    except Exception as exc:  # the flatbuffer reader raises whatever a bad offset leads to
        raise PteError(f"{source}: program flatbuffer corrupt: {type(exc).__name__}: {exc}") from None


def check_path(path: str | os.PathLike) -> None:
    """Nothing when `path` names a regular file (following links); FileNotFoundError or
    PermissionError as the OS says, PteError saying what it is otherwise (a folder, a
    socket, a named pipe, a device, a loop of links)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _not_openable(path, exc) from None
    if not stat.S_ISREG(mode):
        raise PteError(f"{path}: {_not_regular(mode)}")


def _not_openable(path: str | os.PathLike, exc: OSError) -> OSError | PteError:
    """What to raise for `path` that could not be opened or looked up."""
    if exc.errno == errno.ELOOP:
        return PteError(f"{path}: a loop of symbolic links, not a file")
    if exc.errno == errno.ENXIO:  # a socket, or a device with no driver behind it
        try:
            return PteError(f"{path}: {_not_regular(os.stat(path).st_mode)}")
        except OSError:
            pass
    return exc


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory, not a .pte file"
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"not a regular file ({name}); a .pte must be one"
    return "not a regular file; a .pte must be one"


def _parse(data, source: str) -> tuple[schema.Program, list[Segment]]:
    size = len(data)
    end = extent(bytes(data[:HEAD]), size, source)
    program_size, base, segments_size = size, 0, None
    if size >= HEAD and bytes(data[EXTENDED_AT : EXTENDED_AT + 4]) == EXTENDED_MAGIC:
        _, length, program_size, base, segments_size = EXTENDED.unpack_from(data, EXTENDED_AT)
        if length < EXTENDED.size:
            segments_size = None
    program = _read_flatbuffer(bytes(data[:program_size]), source)
    if end is None:
        _checked_size(source, size, base + max((seg.offset + seg.size for seg in program.segments), default=0))
    try:
        verify.check_structure(program)
    except verify.CheckError as exc:
        raise PteError(f"{source}: program flatbuffer corrupt: {exc}") from None
    if len(program.execution_plan) != 1:
        raise PteError(f"{source}: {len(program.execution_plan)} methods; only single-method programs run here")
    available = (segments_size if segments_size is not None else size - base) if base else 0
    segments = []
    for i, seg in enumerate(program.segments):
        if seg.offset + seg.size > available:
            raise PteError(f"{source}: truncated: segment {i} ends at {seg.offset + seg.size} of {available} bytes")
        segments.append(Segment(base + seg.offset, seg.size))
    constants = program.constant_segment
    constant_size = None
    if not program.constant_buffer and constants.offsets:
        if not 0 <= constants.segment_index < len(segments):
            raise PteError(f"{source}: constant segment {constants.segment_index} of {len(segments)} does not exist")
        constant_size = segments[constants.segment_index].size
    try:
        verify.check_plan(program.execution_plan[0])
        verify.check_constants(program, constant_size)
    except verify.CheckError as exc:
        raise PteError(f"{source}: {exc}") from None
    return program, segments
