"""Read a `.pte` file: check its framing, parse the program flatbuffer, check it
(`pipeline.pte.verify`), and address its segments in place — constants are views of
the program's bytes, never copies.

A file is read once into private memory: truncating or overwriting it afterwards cannot
reach a loaded program (a mapping of the file would fault on truncation and follow an
overwrite). Only regular files are read; a FIFO or a device is refused without blocking.

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
        """Read the file at `path` into private memory; raises FileNotFoundError,
        PermissionError or IsADirectoryError as the OS does, PteError when it is not a
        regular file or its contents are not a program."""
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
    it is a regular file; a file that changes while it is read is refused too.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with io.FileIO(fd, "rb") as f:
        before = os.fstat(fd)
        if stat.S_ISDIR(before.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(before.st_mode):
            raise PteError(f"{path}: not a regular file ({_file_kind(before.st_mode)}); a .pte must be one")
        if before.st_size == 0:
            raise PteError(f"{path}: empty file, not an ExecuTorch program (.pte)")
        data = f.readall()
        after = os.fstat(fd)
    if len(data) != before.st_size or after.st_size != before.st_size or after.st_mtime_ns != before.st_mtime_ns:
        raise PteError(f"{path}: the file changed while it was read ({before.st_size} bytes, then {after.st_size})")
    return data


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _parse(data, source: str) -> tuple[schema.Program, list[Segment]]:
    size = len(data)
    if size < 8 or bytes(data[4:8]) != IDENTIFIER:
        head = bytes(data[4:8]) if size >= 8 else b""
        raise PteError(f"{source}: not an ExecuTorch program (.pte): identifier {head!r}, expected {IDENTIFIER!r}")
    program_size, base, segments_size = size, 0, None
    if size >= EXTENDED_AT + EXTENDED.size and bytes(data[EXTENDED_AT : EXTENDED_AT + 4]) == EXTENDED_MAGIC:
        _, length, program_size, base, segments_size = EXTENDED.unpack_from(data, EXTENDED_AT)
        if length not in EXTENDED_LENGTHS:
            raise PteError(f"{source}: extended header length {length} is corrupt")
        if length < EXTENDED.size:
            segments_size = None
        if not 0 < program_size <= size:
            raise PteError(f"{source}: truncated: the program alone is {program_size} bytes, the file {size}")
        if base and (base < program_size or base > size):
            raise PteError(f"{source}: truncated or corrupt: segments start at {base}, the file is {size} bytes")
        if base and segments_size is not None and base + segments_size > size:
            raise PteError(f"{source}: truncated: {size} bytes of {base + segments_size}")
    try:
        program = _flatbuffer_to_program(bytes(data[:program_size]))
    except Exception as exc:  # the flatbuffer reader raises whatever a bad offset leads to
        raise PteError(f"{source}: program flatbuffer corrupt: {type(exc).__name__}: {exc}") from None
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
