"""Foundation: the one way a file of a model folder is opened.

Builds on: nothing.
Read with: chapters/97-architecture.md (The model and the oracle).

A model folder comes from whoever published it, so its names are not to be trusted:
`config.json -> /dev/zero` would be read until the memory is gone, a FIFO would block the
first `open` for ever, and `chat_template.jinja -> ~/notes.txt` would quietly become every
prompt. Every reader of a folder therefore asks `model_file` first, which refuses, before
anything is opened, a name that

- resolves (after its symlinks) outside the folder: a symlink to another file of the folder is
  fine, as is the Hugging Face hub cache's own layout, where each file of
  `models--org--name/snapshots/<rev>/` is a symlink into `models--org--name/blobs/`;
- is not a regular file (a folder, a FIFO, a device, a socket: `os.stat`, never `open`);

and the text readers bound what they read by the kind of file (`*_LIMIT`). Weights are not
read here: safetensors checks its own header, and the loader checks the memory they need.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

MiB = 1 << 20
JSON_LIMIT = 16 * MiB  # config.json: ~1 KiB; Llama 3.1 405B's shard index: ~100 KiB; tokenizer_config.json: < 1 MiB
TOKENIZER_LIMIT = 64 * MiB  # real tokenizer.json files: SmolLM2 3.4 MiB, Llama 3 8.7 MiB, Gemma 3 32 MiB
TEMPLATE_LIMIT = 1 * MiB  # a chat template is a few KiB
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def model_file(
    folder: str | Path, name: str, what: str = "file", required: bool = True, kind: str = "model folder"
) -> Path | None:
    """`folder / name`, once known to be a regular file that resolves inside `folder`.

    `what` names the kind of file in messages ("safetensors file"), `kind` the folder ("model folder", "workspace");
    a missing file is a ValueError, or None when not `required`. The path returned is the one asked for (symlinks
    unresolved), so that messages name the file the user knows.
    """
    path = Path(folder) / name
    if not os.path.lexists(path):
        if required:
            raise ValueError(f"{path}: {name} is missing")
        return None
    try:
        real = path.resolve()
        roots = _roots(Path(folder).resolve())
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise ValueError(f"{path}: {name} cannot be resolved ({e})") from None
    if not any(real.is_relative_to(root) for root in roots):
        raise ValueError(f"{path}: {name} resolves outside the {kind} (to {real})")
    regular_file(path, what)
    return path


def _roots(folder: Path) -> list[Path]:
    """Where the files of a (resolved) model folder may resolve to: the folder, and the hub cache's blobs."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return [folder, folder.parent.parent / "blobs"]
    return [folder]


def regular_file(path: Path, what: str = "file") -> os.stat_result:
    """`path`'s stat, refused unless a regular file: a stat, not an open, so a FIFO or a device never blocks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = " (a symlink to nothing)" if os.path.islink(path) else ""
        raise ValueError(f"{path}: {Path(path).name} is missing{dangling}") from None
    except OSError as e:
        raise ValueError(f"{path}: {what} cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a plain file")
        raise ValueError(f"{path}: not a readable {what} ({Path(path).name} is {kind}, not a regular file)")
    return st


def read_bounded(path: Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, refused beyond `limit` (checked before, and while, reading)."""
    size = regular_file(path, what).st_size
    if size > limit:
        raise ValueError(f"{path}: {Path(path).name} is {size} bytes, over the {_size(limit)} limit for a {what}")
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{path}: not a readable {what} (it stopped being a regular file)")
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"{path}: {what} cannot be read ({e.strerror})") from None
    if len(data) > limit:  # it grew after the stat
        raise ValueError(f"{path}: {Path(path).name} is over the {_size(limit)} limit for a {what}")
    return data


def read_model_text(folder, name: str, what: str, limit: int, required: bool = True) -> str | None:
    """A text file of the folder (UTF-8), checked by `model_file` and bounded by `limit`."""
    path = model_file(folder, name, what, required)
    if path is None:
        return None
    try:
        return read_bounded(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: {what} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_model_json(folder, name: str, required: bool = True) -> dict | None:
    """A JSON file of the folder that must hold an object; every way it is not one names the file."""
    text = read_model_text(folder, name, "JSON file", JSON_LIMIT, required)
    if text is None:
        return None
    return parse_json_object(text, Path(folder) / name)


def read_json_file(path, what: str, limit: int = JSON_LIMIT) -> dict:
    """A JSON object from any file a user names (a trace, a bench's rows, an assignment): a regular file,
    read no further than `limit`."""
    try:
        text = read_bounded(Path(path), what, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: {what} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_json_object(text, path)


def parse_json_object(text: str, path) -> dict:
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python converts
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit >= MiB else f"{limit} bytes"
