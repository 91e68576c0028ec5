"""Drive headless Chromium from a test through the DevTools protocol (CDP), standard library only.

`serve_folder` serves a folder on 127.0.0.1; `Browser` starts Chromium with `--remote-debugging-pipe`: it reads
commands on its fd 3 and writes replies and events on its fd 4, each a JSON text ended by a NUL byte. A reader
thread sorts replies (by id) from events (console messages, uncaught exceptions, requests, failed loads), and
`eval`, `wait_for`, `set_value` and `click` turn a page's knobs and read its results. The browser reaches no
address but 127.0.0.1 (see `BLOCK_NETWORK`); every wait is bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_CHROMIUM = os.environ.get("PAGEDLAB_REQUIRE_CHROMIUM") == "1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Every host name (and IP literal) but 127.0.0.1 fails to resolve, and every request but 127.0.0.1's goes to a
# proxy on the discard port, where nobody listens: a page's fetch of http://example.com/ fails at once, with or
# without internet on the machine. "<-loopback>" drops Chromium's implicit proxy bypass of localhost, [::1] and
# 127.0.0.0/8; it must come before "127.0.0.1", as the later of two matching bypass rules wins.
BLOCK_NETWORK = [
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>;127.0.0.1",
]
QUIET = [  # no first-run dialogs, updates, syncing or other traffic of Chromium's own
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000", *QUIET, *BLOCK_NETWORK]
MIME_TYPES = {
    ".wasm": "application/wasm",  # WebAssembly.instantiateStreaming refuses any other type
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".json": "application/json",
    ".zip": "application/zip",
}


def need_chromium() -> str:
    """Chromium's path, or skip; under PAGEDLAB_REQUIRE_CHROMIUM=1 (CI) a missing browser fails the test."""
    if CHROMIUM is None:
        if REQUIRE_CHROMIUM:
            pytest.fail("PAGEDLAB_REQUIRE_CHROMIUM=1 but chromium is not on PATH")
        pytest.skip("chromium is not on PATH (apt-get install chromium)")
    return CHROMIUM


def only_local(urls: list[str], base_url: str) -> list[str]:
    """The URLs that are not under base_url, leaving out those that never leave the page (data:, blob: ...)."""
    inside = ("data:", "blob:", "about:", "chrome-error:", base_url)
    return [url for url in urls if not url.startswith(inside)]


# --- a folder over HTTP ------------------------------------------------------------------------------


@dataclass
class Served:
    """What serve_folder yields."""

    url: str  # "http://127.0.0.1:PORT/"
    paths: list[str] = field(default_factory=list)  # every path asked for, in order


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}

    def __init__(self, *args, served: Served, **kwargs):
        self.served = served
        super().__init__(*args, **kwargs)

    def send_head(self):
        self.served.paths.append(self.path)  # GET and HEAD both come here
        return super().send_head()

    def log_message(self, format, *args):
        pass  # a line on stderr per request would bury a failing test's output


@contextlib.contextmanager
def serve_folder(folder: str | os.PathLike, host: str = "127.0.0.1") -> Iterator[Served]:
    """Serve folder on host at a free port from a daemon thread, for as long as the with block runs."""
    served = Served(url="")
    handler = functools.partial(_Handler, served=served, directory=os.fspath(folder))
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    served.url = f"http://{host}:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()  # returns once serve_forever has seen the request to stop: one poll_interval
        server.server_close()
        thread.join(timeout=5)


# --- Chromium over a pipe ----------------------------------------------------------------------------


class Browser:
    """Headless Chromium with one page at a time; use as a context manager, or call close()."""

    def __init__(self, chromium: str | None = None, flags: Sequence[str] = ()):
        self._cond = threading.Condition()  # guards everything the reader thread writes
        self._replies: dict[int, dict] = {}
        self._next_id = 0
        self._loaded: set[str] = set()  # the loader ids of the current page's documents that fired load
        self._session: str | None = None
        self._target: str | None = None
        self._urls: dict[str, str] = {}  # request id -> URL, to name a failed load
        self.requests: list[str] = []  # every URL the page asked for, in order
        self.console: list[tuple[str, str]] = []  # (console.log's "log", "error", ... or "log.<level>", text)
        self.errors: list[str] = []  # uncaught exceptions and failed loads
        self._pipe_closed = False  # Chromium's end of fd 4 closed: it exited, or the reader thread failed
        self._reader_failed: BaseException | None = None
        self._write_lock = threading.Lock()  # one message at a time on fd 3, whole
        self._closed = False
        chromium = chromium or need_chromium()
        # The profile, Chromium's log and its crash database: all removed by close().
        self.folder = Path(tempfile.mkdtemp(prefix="pagedlab-chromium-"))
        self._log = open(self.folder / "chromium.log", "wb")
        try:
            self._proc, self._to, self._from = self._launch(chromium, list(flags))
        except BaseException:
            self._log.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self._stopping = False
        self._reader = threading.Thread(target=self._read, name="chromium-reader", daemon=True)
        self._reader.start()

    def _launch(self, chromium: str, flags: list[str]) -> tuple[subprocess.Popen, int, int]:
        """Start Chromium with our ends of two pipes on its fds 3 and 4."""
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()
        # Popen can only place fds 0, 1 and 2 (it dup2s them between fork and exec, in C). So the pipes go in as
        # stdin and stdout, and a shell moves them to 3 and 4 before it execs Chromium: no Python code runs in
        # the forked child (preexec_fn may deadlock beside threads) and no fd number can collide with another.
        move = 'exec "$@" 3<&0 4>&1 </dev/null >&2'
        profile = f"--user-data-dir={self.folder / 'profile'}"
        cmd = ["/bin/sh", "-c", move, "sh", chromium, *FLAGS, profile, "--remote-debugging-pipe", *flags]
        # The crash handler keeps its database under $XDG_CONFIG_HOME (not the profile): there, it is ours too.
        env = {**os.environ, "XDG_CONFIG_HOME": str(self.folder / "config")}
        try:
            # A session of its own, so that close() can end Chromium's helpers (zygote, renderers) with it.
            proc = subprocess.Popen(
                cmd, stdin=commands_r, stdout=replies_w, stderr=self._log, env=env, start_new_session=True
            )
        except BaseException:
            for fd in (commands_w, replies_r):
                os.close(fd)
            raise
        finally:
            os.close(commands_r)  # Chromium's ends: ours must go, or we would never see its end of file
            os.close(replies_w)
        os.set_blocking(commands_w, False)  # so that _write waits in select, with a deadline, never in write
        return proc, commands_w, replies_r

    @property
    def pid(self) -> int:
        """The browser process's id (its helpers are in the process group of that id)."""
        return self._proc.pid

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the pipe ---

    def _read(self) -> None:
        """Reader thread: split fd 4's bytes at NULs, file replies by id and hand events to _event."""
        buffer = b""
        try:
            while not self._stopping:
                ready, _, _ = select.select([self._from], [], [], 0.1)  # wakes to see _stopping
                if not ready:
                    continue
                chunk = os.read(self._from, 1 << 16)
                if not chunk:
                    break  # Chromium closed its end: it exited or is exiting
                *messages, buffer = (buffer + chunk).split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    with self._cond:
                        if "id" in message:
                            self._replies[message["id"]] = message
                        else:
                            self._event(message)
                        self._cond.notify_all()
        except BaseException as e:  # a message we cannot read: no reply can be trusted after it
            self._reader_failed = e
        finally:  # whatever ended the loop, a waiting call must not wait for a reply that cannot come
            with self._cond:
                self._pipe_closed = True
                self._cond.notify_all()

    def _event(self, message: dict) -> None:
        """Keep what a test may ask about: the current page's requests, console, errors and loads."""
        if message.get("sessionId") != self._session:
            return
        method, params = message["method"], message.get("params", {})
        if method == "Page.lifecycleEvent" and params["name"] == "load":  # Page.loadEventFired, with a loaderId
            self._loaded.add(params["loaderId"])
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
            self._urls[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFailed":
            url = self._urls.get(params["requestId"], "?")
            self.errors.append(f"failed to load {url}: {params.get('errorText')}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"])
            self.console.append((params["type"], text))
        elif method == "Runtime.exceptionThrown":
            self.errors.append(_exception_text(params["exceptionDetails"]))
        elif method == "Log.entryAdded":  # the browser's own words: "Failed to load resource", CSP, ...
            entry = params["entry"]
            self.console.append((f"log.{entry['level']}", f"{entry.get('url', '')} {entry['text']}".strip()))

    def _wait(self, ready, timeout: float, what: str):
        """Wait on the condition until ready() is true; fail if Chromium died or timeout seconds passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (found := ready()):
                if self._reader_failed:
                    raise RuntimeError(f"cannot read Chromium's messages while {what}") from self._reader_failed
                if self._pipe_closed:
                    status = self._proc.poll()
                    raise RuntimeError(f"Chromium is gone (exit status {status}) while {what}:\n{self.stderr_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer from Chromium in {timeout}s while {what}")
                self._cond.wait(left)
            return found

    def send(self, method: str, params: dict | None = None, timeout: float = 30, session: bool = True) -> dict:
        """Send one CDP command (to the page's session unless session=False) and return its result."""
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session and self._session:
            message["sessionId"] = self._session
        self._write(json.dumps(message).encode() + b"\0", timeout, method)
        reply = self._wait(lambda: self._replies.pop(ident, None), timeout, f"waiting for {method}")
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error'].get('message')} {reply['error'].get('data', '')}")
        return reply["result"]

    def _write(self, data: bytes, timeout: float, what: str) -> None:
        """Write data whole on fd 3 within timeout seconds (Chromium reads as it goes; a full pipe waits)."""
        deadline = time.monotonic() + timeout
        with self._write_lock:
            while data:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [self._to], [], left)[1]:
                    raise TimeoutError(f"Chromium took no command in {timeout}s while sending {what}")
                try:
                    data = data[os.write(self._to, data) :]  # non-blocking: as much as the pipe has room for
                except BlockingIOError:
                    continue
                except OSError as e:  # BrokenPipeError: it exited
                    raise RuntimeError(f"Chromium takes no commands ({e}):\n{self.stderr_tail()}") from e

    def stderr_tail(self, chars: int = 3000) -> str:
        """The end of what Chromium wrote on stderr (and stdout)."""
        self._log.flush()
        return (self.folder / "chromium.log").read_bytes()[-chars:].decode(errors="replace")

    # --- a page ---

    def open(self, url: str, timeout: float = 30) -> None:
        """Open url in a new page and wait for its load event; requests, console and errors start afresh."""
        if self._target:  # one page at a time: an old page's timers and fetches would only muddle the new one's
            self.send("Target.closeTarget", {"targetId": self._target}, timeout, session=False)
        blank = self.send("Target.createTarget", {"url": "about:blank"}, timeout, session=False)
        self._target = blank["targetId"]
        attach = {"targetId": self._target, "flatten": True}
        session = self.send("Target.attachToTarget", attach, timeout, session=False)["sessionId"]
        with self._cond:
            self._session, self._loaded, self._urls = session, set(), {}
            self.requests, self.console, self.errors = [], [], []
        for domain in ("Page", "Runtime", "Network", "Log"):  # before navigating, so no event is missed
            self.send(f"{domain}.enable", timeout=timeout)
        # Lifecycle events name the document they are about: the wait below is for url's load, not about:blank's.
        self.send("Page.setLifecycleEventsEnabled", {"enabled": True}, timeout)
        navigated = self.send("Page.navigate", {"url": url}, timeout)
        if navigated.get("errorText"):
            raise AssertionError(f"cannot open {url}: {navigated['errorText']}")
        self._wait(lambda: navigated["loaderId"] in self._loaded, timeout, f"loading {url}")

    def eval(self, expression: str, timeout: float = 30):
        """The value of a JavaScript expression in the page (a promise's, once resolved), as JSON gives it."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        result = self.send("Runtime.evaluate", params, timeout)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {_exception_text(result['exceptionDetails'])}")
        return result["result"].get("value")  # undefined has none

    def wait_for(self, expression: str, timeout: float = 60, interval: float = 0.05):
        """Evaluate expression until it is truthy and return its value; one that throws counts as not yet."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                value = self.eval(expression, timeout=max(deadline - time.monotonic(), 1))
                if value:
                    return value
                last = f"last value {value!r}"
            except AssertionError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression!r} not true after {timeout}s ({last})\n{self.report()}")
            time.sleep(interval)

    def report(self, last: int = 20) -> str:
        """The last console messages and errors, for a failing assertion's message."""
        with self._cond:
            lines = [f"console.{kind}: {text}" for kind, text in self.console[-last:]]
            lines += [f"error: {text}" for text in self.errors[-last:]]
        return "\n".join(lines) or "(no console messages, no errors)"

    def set_value(self, selector: str, value) -> None:
        """Set an <input>'s or <select>'s value and fire input and change, as a user's edit would."""
        script = """((el, value) => {
            if (!el) throw new Error("nothing matches " + SELECTOR);
            el.value = value;
            if (el.value !== value) throw new Error(SELECTOR + " refused the value " + value);
            el.dispatchEvent(new Event("input", {bubbles: true}));
            el.dispatchEvent(new Event("change", {bubbles: true}));
        })(document.querySelector(SELECTOR), VALUE)"""
        self.eval(script.replace("SELECTOR", json.dumps(selector)).replace("VALUE", json.dumps(str(value))))

    def click(self, selector: str) -> None:
        """Click the element that selector matches, as a user's click would (its click event, bubbling)."""
        script = """(el => {
            if (!el) throw new Error("nothing matches " + SELECTOR);
            el.click();
        })(document.querySelector(SELECTOR))"""
        self.eval(script.replace("SELECTOR", json.dumps(selector)))

    # --- the end ---

    def close(self) -> None:
        """Ask Chromium to close, then end it and its helpers for sure; remove the profile. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._proc.poll() is None and not self._pipe_closed:
            with contextlib.suppress(Exception):
                self.send("Browser.close", timeout=5, session=False)
        for stop in (None, signal.SIGTERM, signal.SIGKILL):  # each step waits a bounded time for the last
            if stop is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, stop)  # the whole session: helpers too
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
                break
        self._end_helpers()
        self._stopping = True
        self._reader.join(timeout=5)
        for fd in (self._to, self._from):
            os.close(fd)
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end_helpers(self, timeout: float = 5) -> None:
        """Wait for the helpers that outlive the browser process to go; kill those left at the deadline."""
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.05)  # the crash handlers see the browser go and exit within moments
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def processes(self) -> list[int]:
        """Chromium's live processes (zombies aside): those of its session, and those that name our folder."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]  # after "(name)"
            except OSError:
                continue  # gone while we looked
            # The crash handlers leave the session; their database, under XDG_CONFIG_HOME, names our folder.
            ours = int(group) == self._proc.pid or str(self.folder).encode() in cmdline
            if ours and state != "Z":
                found.append(int(entry.name))
        return found


def _exception_text(details: dict) -> str:
    """What a thrown exception says: its description (message and stack) or the protocol's summary."""
    exception = details.get("exception", {})
    return exception.get("description") or str(exception.get("value") or details.get("text", "exception"))
