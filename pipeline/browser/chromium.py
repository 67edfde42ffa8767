"""One headless Chromium with WebGPU, driven over the DevTools protocol on a pipe.

Chromium reads protocol commands from its fd 3 and writes replies and events to its fd 4
(`--remote-debugging-pipe`), each message one JSON object ended by a NUL byte: no port,
no extra package. Every launch gets a fresh profile in a temporary folder, and `close()`
ends the whole process group and removes the folder, whatever state the browser is in.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_ENV = "PIPELINE_CHROMIUM"
EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS = [
    "--headless=new",
    # Root in a container has no user namespaces for the sandbox.
    "--no-sandbox",
    # WebGPU on Linux is behind this flag; without a GPU it runs on SwiftShader's Vulkan.
    "--enable-unsafe-webgpu",
    # A closed network: nothing may try to reach Google's services at start-up or later.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--remote-debugging-pipe",
]

# Chromium's ends of the two pipes.
COMMANDS_FD, REPLIES_FD = 3, 4
# Our pipe ends sit above these, so that placing Chromium's onto 3 and 4 moves nothing else.
FIRST_FREE_FD = 10


class BrowserError(RuntimeError):
    """Chromium failed to start, to answer, or reported an error; the message says which."""


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable: $PIPELINE_CHROMIUM, else the first on PATH."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((path for path in map(shutil.which, EXECUTABLES) if path), None)


def _high_fd(fd: int) -> int:
    """`fd` moved to a number at or above FIRST_FREE_FD, close-on-exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FIRST_FREE_FD)
    os.close(fd)
    return moved


class Chromium:
    """A headless Chromium process and its DevTools pipe. Use as a context manager, or call
    `close()`: it always ends the browser and removes its profile."""

    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        self.executable = executable
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._pid: int | None = None
        self._write_fd = self._read_fd = -1
        self._folder = Path(tempfile.mkdtemp(prefix="pipeline-chromium-"))
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        commands_read, commands_write = map(_high_fd, os.pipe())
        replies_read, replies_write = map(_high_fd, os.pipe())
        self._write_fd, self._read_fd = commands_write, replies_read
        argv = [self.executable, *FLAGS, f"--user-data-dir={self._folder / 'profile'}", "about:blank"]
        log = str(self._folder / "chromium.log")
        # Chromium's other per-user folders (its crash reports among them) go inside ours too.
        env = {**os.environ, "XDG_CONFIG_HOME": str(self._folder / "config"),
               "XDG_CACHE_HOME": str(self._folder / "cache")}
        try:
            # Its own session: close() can end every process Chromium started, by group.
            self._pid = os.posix_spawn(self.executable, argv, env, setsid=True, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, commands_read, COMMANDS_FD),
                (os.POSIX_SPAWN_DUP2, replies_write, REPLIES_FD),
            ])
        finally:
            os.close(commands_read)
            os.close(replies_write)
        version = self.send("Browser.getVersion")
        self.version = version["product"]

    # The protocol: one JSON object per message, NUL-terminated.

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply; a protocol error raises BrowserError."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._write_fd, data):]
        except BrokenPipeError:
            raise BrowserError(f"Chromium has exited; it cannot take {method}{self._log_tail()}") from None
        wanted = self._next_id
        reply = self.wait_for(lambda m: m.get("id") == wanted, timeout, f"reply to {method}")
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')} {reply['error'].get('data', '')}".strip())
        return reply["result"]

    def wait_for(self, matches, timeout: float | None, what: str) -> dict[str, Any]:
        """The first message (an event already received, or the next ones) that `matches`."""
        for i, event in enumerate(self._events):
            if matches(event):
                return self._events.pop(i)
        seconds = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + seconds
        while True:
            message = self._receive(deadline, seconds, what)
            if matches(message):
                return message
            if "method" in message:
                self._events.append(message)

    def events(self, method: str) -> list[dict[str, Any]]:
        """Events of `method` received so far (and not yet waited for), oldest first."""
        return [e for e in self._events if e.get("method") == method]

    def _receive(self, deadline: float, seconds: float, what: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium sent no {what} within {seconds:g} s{self._log_tail()}")
            ready, _, _ = select.select([self._read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._read_fd, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its DevTools pipe, no {what}{self._log_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _log_tail(self, lines: int = 15) -> str:
        """The end of Chromium's output, without its complaints about the missing D-Bus."""
        try:
            text = (self._folder / "chromium.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        text = [line for line in text if line.strip() and ":ERROR:dbus/" not in line]
        return ("; its log ends:\n" + "\n".join(text[-lines:])) if text else ""

    # Pages.

    def open(self, url: str) -> Page:
        """A new tab showing `url`, loaded (its load event fired), attached for evaluation."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self.send("Runtime.enable", session=session)
        self.send("Page.enable", session=session)
        navigated = self.send("Page.navigate", {"url": url}, session=session)
        if navigated.get("errorText"):
            raise BrowserError(f"Chromium could not open {url}: {navigated['errorText']}")
        self.wait_for(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == session,
                      None, f"load event for {url}")
        return page

    # Ending.

    def close(self) -> None:
        """End Chromium (politely, then by signal to its process group) and remove its profile."""
        if self._pid is not None:
            try:
                if self._write_fd >= 0:
                    self.send("Browser.close", timeout=5)
            except (BrowserError, OSError, ValueError):
                pass
            # The browser is reaped only after its group is signalled: until then its pid,
            # and so the group's id, cannot be another process's.
            self._exited(within=5)
            self._kill_group()
            try:
                os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = None
        for fd in (self._write_fd, self._read_fd):
            if fd >= 0:
                os.close(fd)
        self._write_fd = self._read_fd = -1
        shutil.rmtree(self._folder, ignore_errors=True)

    def _exited(self, within: float) -> bool:
        """Whether the browser exited within `within` seconds (it is left unreaped)."""
        deadline = time.monotonic() + within
        while True:
            try:
                if os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _kill_group(self) -> None:
        """SIGKILL to every process left in the browser's group (its helpers, or all of it)."""
        try:
            os.killpg(self._pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One tab of a Chromium: JavaScript evaluated in it, promises awaited."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of `expression` (awaited if a promise), as JSON brings it back. A thrown
        exception raises BrowserError with its message and the page's console errors."""
        result = self.browser.send("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True,
        }, session=self.session, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserError(f"the page threw: {text}{self._console_errors()}")
        return result["result"].get("value")

    def _console_errors(self) -> str:
        lines = []
        for event in self.browser.events("Runtime.consoleAPICalled"):
            params = event["params"]
            if params.get("type") in ("error", "warning"):
                lines.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        return ("; console:\n" + "\n".join(lines)) if lines else ""
