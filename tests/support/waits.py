"""A bound on how long a block may wait: a reader that opens a named pipe blocking would wait
for a writer forever; under `within` it fails instead."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Run the block, raising TimeoutError in it once `seconds` have passed (main thread only)."""
    def expired(_signum, _frame):
        raise TimeoutError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
