"""Foundation: the chat-template renderer's worker process (run as a script; it imports nothing of pagedlab).

Builds on: nothing (jinja2).
Read with: chapters/07-real-model.md (Chat templates), model/chat_template.py (the parent's side).

A chat template is code that came with a model. jinja2's immutable sandbox
stops it from reaching Python's internals, but not from looping for ever,
building a string of gigabytes or recursing until the stack is gone. So it runs
here, in a process of its own, with an address-space limit; the parent waits
with a deadline and kills this process if it passes. Frames on stdin and
stdout are a 4-byte big-endian length, then that many bytes of JSON:

    parent -> worker   {"template", "messages", "add_generation_prompt", "context", "max_chars"}
    worker -> parent   {"text": str}  or  {"error": "TypeError: ..."}

An end of stdin (the parent gone) ends the worker.
"""

from __future__ import annotations

import json
import struct
import sys
from datetime import datetime
from functools import lru_cache

MEMORY_LIMIT = 512 << 20  # bytes of address space; more is a MemoryError inside the template


class OutputTooLong(Exception):
    pass


@lru_cache(maxsize=8)
def compile_template(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # trim_blocks/lstrip_blocks: a template's own line breaks around {% ... %} are not output (as transformers).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # transformers offers it too
    return env.from_string(source)


def raise_exception(message: str):
    from jinja2 import TemplateError

    raise TemplateError(message)


def render(job: dict) -> str:
    """The template's output, streamed so that a runaway template stops at max_chars, not at the memory limit."""
    template = compile_template(job["template"])
    context = dict(job["context"], messages=job["messages"], add_generation_prompt=job["add_generation_prompt"])
    pieces, size, limit = [], 0, job["max_chars"]
    for piece in template.generate(**context):
        size += len(piece)
        if size > limit:
            raise OutputTooLong(f"the output exceeds {limit} characters")
        pieces.append(piece)
    return "".join(pieces)


def answer(job: dict) -> dict:
    from jinja2 import TemplateSyntaxError

    try:
        return {"text": render(job)}
    except TemplateSyntaxError as e:
        return {"error": f"not a valid Jinja template (line {e.lineno}: {e.message})"}
    except MemoryError:
        return {"error": f"the template needed more than {MEMORY_LIMIT >> 20} MiB", "fatal": True}
    except RecursionError:
        return {"error": "the template recursed too deeply"}
    except OutputTooLong as e:
        return {"error": str(e)}
    except Exception as e:  # anything a template can raise is the template's fault, reported to the caller
        return {"error": f"{type(e).__name__}: {e}"}


def read_frame(stream) -> dict | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return json.loads(stream.read(size))


def write_frame(stream, message: dict) -> None:
    data = json.dumps(message, ensure_ascii=True).encode()
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def main() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):  # not on this platform: the parent's deadline still holds
        pass
    sys.setrecursionlimit(2000)
    while (job := read_frame(sys.stdin.buffer)) is not None:
        reply = answer(job)
        write_frame(sys.stdout.buffer, reply)
        if reply.get("fatal"):
            return  # after a MemoryError nothing here is trusted: the parent starts a fresh worker


if __name__ == "__main__":
    main()
