"""Stage 1: the keys of `pagedlab demo --step`: one key a step, read raw from a terminal or a line at a time.

Builds on: nothing.
Read with: README.md.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

NEXT, BACK, QUIT = "next", "back", "quit"
KEYS = {
    "\n": NEXT,
    "\r": NEXT,
    " ": NEXT,
    "n": NEXT,
    "\x1b[C": NEXT,
    "b": BACK,
    "\x1b[D": BACK,
    "\x7f": BACK,
    "q": QUIT,
    "\x03": QUIT,
    "\x04": QUIT,
}


HELP = "[Enter/space] next · [b] back · [q] quit"


@contextmanager
def key_reader(stream=None) -> Iterator[Callable[[], str]]:
    """`with key_reader() as read_key:` read_key() waits for one key and returns NEXT, BACK or QUIT.

    On a terminal (ssh and tmux too) the terminal is in cbreak mode for the whole `with`, so single keys
    arrive without Enter (arrows too) and a key pressed while a frame is drawn is not lost; from a pipe it
    reads a line per key (an empty line is Enter), and the end of input is q.
    """
    stream = stream or sys.stdin
    try:
        import termios
        import tty

        raw = stream.isatty()
    except (ImportError, AttributeError, ValueError):
        raw = False
    if not raw:
        yield lambda: _line_key(stream)
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)
    try:
        yield lambda: _raw_key(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _raw_key(fd: int) -> str:
    """One key at a time (keys typed ahead wait their turn); an arrow is ESC [ C or D, sent together."""
    while True:
        key = os.read(fd, 1).decode(errors="ignore")
        if key == "\x1b" and select.select([fd], [], [], 0.05)[0]:
            key += os.read(fd, 2).decode(errors="ignore")
        action = KEYS.get(key if len(key) > 1 else key.lower())  # b or B; an arrow as sent
        if action is not None:
            return action


def _line_key(stream) -> str:
    while True:
        line = stream.readline()
        if not line:
            return QUIT
        action = KEYS.get(line.rstrip("\n").lower()[:1] or "\n")
        if action is not None:
            return action
