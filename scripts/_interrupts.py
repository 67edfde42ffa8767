"""Ctrl-C and SIGTERM end every script with one line and exit status 130, at any moment.

Each script calls `while_starting()` before it imports anything heavy (torch, ExecuTorch:
seconds), and hands its `main` to `run()`. While starting, nothing has been written, so a
signal ends the process at once: no library that catches exceptions during its import can
swallow it. From `run()` on, a signal raises KeyboardInterrupt, so `finally` blocks remove
temp files before the one line is printed. A signal is delivered again shortly after,
rather than raised, where raising would do harm: in a `__del__` (which closes a GPU handle),
while a set of files takes its names (which must not stop half way), and during an import
(the libraries import lazily, and an extension that imports from C++, as torch's op
registration does, cannot pass the exception back: the process aborts). One raised where
Python prints an exception and drops it (a weakref callback) reaches `sys.unraisablehook`:
it is not printed, and the signal is delivered again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

INTERRUPTED = 130
# How soon a signal that came at the wrong moment is sent again: finalizers here close a
# handle, and a set of files is renamed in microseconds.
AGAIN_SECONDS = 0.05


def _name() -> str:
    return os.path.splitext(os.path.basename(sys.argv[0]))[0]


def _exit_at_once(signum, frame) -> None:
    os.write(2, f"{_name()}: interrupted\n".encode())
    os._exit(INTERRUPTED)


def _finalizing_or_importing(frame) -> bool:
    """Whether `frame` is a `__del__`'s or an import's, or below one."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _renaming() -> bool:
    """Whether a set of files is taking its names (pipeline.ioutil, where it is loaded)."""
    ioutil = sys.modules.get("pipeline.ioutil")
    return ioutil is not None and ioutil.renaming()


def _again(signum: int) -> None:
    again = threading.Timer(AGAIN_SECONDS, os.kill, (os.getpid(), signum))
    again.daemon = True
    again.start()


class _Interrupt(KeyboardInterrupt):
    """A signal raised in the main thread; `signum` is what to send again if it is dropped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_interrupt(signum, frame) -> None:
    if _finalizing_or_importing(frame) or _renaming():
        _again(signum)
        return
    raise _Interrupt(signum)


def _dropped(unraisable, report=sys.unraisablehook) -> None:
    """sys.unraisablehook: our interrupt, dropped where it was raised, comes again."""
    if isinstance(unraisable.exc_value, _Interrupt):
        _again(unraisable.exc_value.signum)
        return
    report(unraisable)


def while_starting() -> None:
    signal.signal(signal.SIGINT, _exit_at_once)
    signal.signal(signal.SIGTERM, _exit_at_once)


def run(main: Callable[[], int]) -> None:
    """sys.exit(main()), a signal turned into the script's one line and status 130."""
    sys.unraisablehook = _dropped
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{_name()}: interrupted; no file was left half-written", file=sys.stderr, flush=True)
        code = INTERRUPTED
    sys.exit(code)
