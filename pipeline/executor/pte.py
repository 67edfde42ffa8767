"""Read a `.pte` file: check its framing, parse the program flatbuffer, and address its
segments in place — constants are views of the file's bytes (a memory map), never copies.

Layout (ExecuTorch's): a flatbuffer whose identifier `ET12` sits at offset 4, an extended
header `eh00` at offset 8 (flatbuffer size, where the segments start and their size), then
the segments: the constant segment (every constant tensor, addressed by
`constant_segment.offsets[data_buffer_idx]`) and delegate segments (the blobs).

The flatbuffer is parsed with ExecuTorch's own (private) reader; executorch is pinned and
`tests/test_pte.py` fails loudly if that reader changes.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from executorch.exir import schema
from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program

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

    `data` is a buffer over the whole file (a private copy-on-write memory map for files,
    so tensors built on it are writable without touching the file).
    """

    def __init__(self, data, source: str) -> None:
        self.data = data
        self.source = source
        self.program, self.segments = _parse(data, source)

    @classmethod
    def read(cls, path: str | os.PathLike) -> PteFile:
        """Map the file at `path`; raises FileNotFoundError/PermissionError/IsADirectoryError
        as the OS does, PteError when its contents are not a program."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise PteError(f"{path}: empty file, not an ExecuTorch program (.pte)")
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        return cls(data, str(path))

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
    if len(program.execution_plan) != 1:
        raise PteError(f"{source}: {len(program.execution_plan)} methods; only single-method programs run here")
    available = (segments_size if segments_size is not None else size - base) if base else 0
    segments = []
    for i, seg in enumerate(program.segments):
        if seg.offset + seg.size > available:
            raise PteError(f"{source}: truncated: segment {i} ends at {seg.offset + seg.size} of {available} bytes")
        segments.append(Segment(base + seg.offset, seg.size))
    return program, segments
