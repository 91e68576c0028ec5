"""Foundation: a conversation rendered into one prompt string by the model's own chat template.

Builds on: nothing (jinja2).
Read with: chapters/07-real-model.md.

A chat model was trained on conversations written in one exact format (SmolLM2's is ChatML:
`<|im_start|>user\\n...<|im_end|>\\n`), and it ships that format as a Jinja template in
tokenizer_config.json. Rendering it is how `LLM.chat` turns messages into the prompt the engine
sees, so the engine itself never knows about roles. The template comes with the model, that is, from
whoever published it: it is rendered in jinja2's immutable sandbox, which refuses attribute access
to Python internals and any mutation of the objects passed in, as transformers does
(transformers/utils/chat_template_utils.py) and vLLM after it (vllm/renderers/chat_utils/chat_template.py).

The sandbox does not bound time or size: two nested loops never end, and a loop of string
repetitions fills the memory. So the template runs in a worker process of its own
(model/template_worker.py), started on first use: limited to 512 MiB of address space and
MAX_RENDER_CHARS of output, and killed (then restarted on the next render) when it takes longer
than RENDER_TIMEOUT_S. Every failure, whatever the template did, is a ValueError that starts with
"chat_template:". A Python process has RENDER_WORKERS such workers, each rendering one template at
a time, so one template that runs to its bound holds one worker, not every render; a render's
deadline starts when its worker takes it, so its own time is all it is charged.

    render(template, messages) --frame--> an idle worker: compile (cached), generate, count characters
                   <--frame-- {"text"} | {"error"}     no frame before the deadline: kill
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from pagedlab.sampling_params import check_text

MAX_TEMPLATE_CHARS = 1 << 20  # a chat template's source; real ones are a few KB
MAX_RENDER_CHARS = 1 << 22  # a rendered prompt; far beyond any model's context
RENDER_TIMEOUT_S = 5.0  # a rendering takes milliseconds; past this it is killed
RENDER_WORKERS = 2  # worker processes per Python process; a render waits for an idle one


def load_chat_template(value: str | None) -> str | None:
    """A `--chat-template` argument, as vLLM reads it: a file's path, or (if it has `{`, `}` or a line break)
    the template itself. A path must name a regular file of at most MAX_TEMPLATE_CHARS bytes."""
    from pagedlab.model.files import read_bounded

    if value is None or any(c in value for c in "{}\n"):
        return value
    try:
        return read_bounded(Path(value), "chat template", MAX_TEMPLATE_CHARS).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"chat_template: {value!r} looks like a file's path, but cannot be read: {e}") from None


def check_conversation(messages, name: str = "messages") -> list[dict]:
    """A conversation is a non-empty list of {"role": str, "content": str} dicts; anything else is a ValueError.
    Any role is accepted, as vLLM and transformers accept it: the template decides what a role means."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{name}: expected a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{name}[{i}]: expected a dict with 'role' and 'content', got {m!r:.80}")
        if not isinstance(m["role"], str) or not m["role"]:
            raise ValueError(f"{name}[{i}]: role must be a non-empty string, got {m['role']!r:.80}")
        if not isinstance(m["content"], str):
            raise ValueError(f"{name}[{i}]: content must be a string, got {type(m['content']).__name__}")
        check_text(m["role"], f"{name}[{i}]")
        check_text(m["content"], f"{name}[{i}]")
    return [dict(m) for m in messages]


def render(template: str, messages: list[dict], add_generation_prompt: bool = False, **context) -> str:
    """The template applied to the messages (and any extra variables, e.g. bos_token), as text."""
    if not isinstance(template, str) or len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"chat_template: expected a string of at most {MAX_TEMPLATE_CHARS} characters")
    job = {"template": check_text(template, "chat_template"), "messages": messages, "context": context,
           "add_generation_prompt": add_generation_prompt, "max_chars": MAX_RENDER_CHARS}  # fmt: skip
    try:
        reply = _POOL.run(job, RENDER_TIMEOUT_S)
    except TypeError as e:  # a context value JSON cannot carry
        raise ValueError(f"chat_template: the template's variables must be plain data ({e})") from None
    if "error" in reply:
        raise ValueError(f"chat_template: {reply['error']}")
    return reply["text"]


class _Pool:
    """RENDER_WORKERS workers; a render takes an idle one, waiting if there is none (each is idle again within
    RENDER_TIMEOUT_S). The last one freed is taken first, so renders one at a time keep to one process."""

    def __init__(self, size: int):
        self.workers = [_Worker() for _ in range(size)]
        self.idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        for worker in reversed(self.workers):
            self.idle.put(worker)

    def run(self, job: dict, timeout: float) -> dict:
        worker = self.idle.get()
        try:
            return worker.run(job, timeout)
        finally:
            self.idle.put(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


class _Worker:
    """One worker process, rendering one template at a time. Invariant: `proc` is None or a live worker of this
    process waiting for its next frame."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()  # a forked child must not share its parent's worker
        self.lock = threading.Lock()

    def run(self, job: dict, timeout: float) -> dict:
        frame = json.dumps(job, ensure_ascii=True).encode()
        with self.lock:
            if self.proc is None or self.pid != os.getpid():
                self._start()
            try:
                self.proc.stdin.write(struct.pack(">I", len(frame)) + frame)
                self.proc.stdin.flush()
                reply = json.loads(self._read_frame(time.monotonic() + timeout))
            except TimeoutError:
                self._stop()
                raise ValueError(f"chat_template: rendering took longer than {timeout:g} s, stopped") from None
            except (OSError, EOFError) as e:
                self._stop()
                raise ValueError(f"chat_template: the renderer stopped ({e})") from None
            if reply.get("fatal"):
                self._stop()
            return reply

    def _start(self) -> None:
        script = Path(__file__).with_name("template_worker.py")
        # -I: no PYTHON* variables, no user site, not even the script's folder on sys.path
        self.proc = subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        self.pid = os.getpid()

    def _read_frame(self, deadline: float) -> bytes:
        (size,) = struct.unpack(">I", self._read(4, deadline))
        return self._read(size, deadline)

    def _read(self, n: int, deadline: float) -> bytes:
        """Exactly n bytes of the worker's stdout before `deadline`, or TimeoutError / EOFError."""
        fd, data = self.proc.stdout.fileno(), b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError(f"exit code {self.proc.poll()}")
            data += chunk
        return data

    def _stop(self) -> None:
        if self.proc is not None and self.pid == os.getpid():
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:  # a write that broke off left bytes that cannot be flushed to a dead worker
                    pass
        self.proc = None

    def close(self) -> None:
        """End the worker at interpreter exit: an end of stdin ends its loop; a worker that has not gone within a
        second is killed. Its pipes are closed either way."""
        with self.lock:
            if self.proc is None or self.pid != os.getpid():
                return
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._stop()


_POOL = _Pool(RENDER_WORKERS)
atexit.register(_POOL.close)
