"""Ctrl-C and SIGTERM end every script with one line and exit status 130, at any moment.

Each script calls `while_starting()` before it imports anything heavy (torch, ExecuTorch:
seconds), and hands its `main` to `run()`. While starting, nothing has been written, so a
signal ends the process at once: no library that catches exceptions during its import can
swallow it. From `run()` on, a signal raises KeyboardInterrupt, so `finally` blocks remove
temp files before the one line is printed. One that lands in a `__del__`, where Python
would print the exception and drop it, or while a set of files takes its names (which must
not stop half way), is delivered again shortly after.
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


def _inside_finalizer(frame) -> bool:
    """Whether `frame` is a `__del__`'s or below one: an exception raised there is printed
    and dropped ("Exception ignored in"), and the work goes on."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _renaming() -> bool:
    """Whether a set of files is taking its names (pipeline.ioutil, where it is loaded)."""
    ioutil = sys.modules.get("pipeline.ioutil")
    return ioutil is not None and ioutil.renaming()


def _raise_interrupt(signum, frame) -> None:
    if _inside_finalizer(frame) or _renaming():
        again = threading.Timer(AGAIN_SECONDS, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt(f"signal {signum}")


def while_starting() -> None:
    signal.signal(signal.SIGINT, _exit_at_once)
    signal.signal(signal.SIGTERM, _exit_at_once)


def run(main: Callable[[], int]) -> None:
    """sys.exit(main()), a signal turned into the script's one line and status 130."""
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{_name()}: interrupted; no file was left half-written", file=sys.stderr, flush=True)
        code = INTERRUPTED
    sys.exit(code)
