"""Benchmarks: what several benches share: the corpus their prompts are cut from, engines built for timing, and
the JSON rows written beside a figure.

Builds on: llm.py, attention/tiled.py, model/loader.py (corpus_path).
Read with: chapters/05-continuous-batching.md (Measurements), chapters/97-architecture.md (Benchmarks).

A bench that draws a figure writes its rows beside it in the same run, so that the numbers a chapter
quotes and the figure it shows cannot come from two different runs (bench/figures.py):

    figures/05_throughput.png    drawn from the rows below
    figures/05_throughput.json   {"bench": "throughput", "run": {how the run went}, "rows": [one per line]}
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from pagedlab.model.files import read_json_file

if TYPE_CHECKING:
    from pagedlab.llm import LLM


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block on `n` torch threads, then restore the caller's (benches time on one: see TORCH_THREADS)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def progress(console, total: int, what: str):
    """A progress bar on the bench's console (stderr) for `total` timed runs; yields `tick(label)`, called as each
    run starts: the bar shows what runs now and how many have finished, with the time so far."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task, started = bar.add_task(what, total=total), [0]

        def tick(label: str) -> None:
            bar.update(task, completed=started[0], description=f"{what}: {label}")
            started[0] += 1

        yield tick
        bar.update(task, completed=total)


def corpus_token_ids(tokenizer=None, num_chars: int | None = None) -> list[int]:
    """The bundled corpus (its first `num_chars` characters; all by default) as a tokenizer encodes it (the
    bundled one by default: <bos> first)."""
    from pagedlab.model.loader import bundled_model_path, corpus_path
    from pagedlab.model.tokenizer import Tokenizer

    tokenizer = tokenizer or Tokenizer.from_file(bundled_model_path() / "tokenizer.json")
    return tokenizer.encode(corpus_path().read_text(encoding="utf-8")[:num_chars])


def timing_llm(stage: int | str, **engine_args) -> LLM:
    """An LLM for a timed run: its torch attention is the tiled decode (attention/tiled.py) whatever the stage.

    Stages 1-4 read the reference attention, written to be obvious; the tiled one computes the same numbers
    with a few batched ops. Timing a static stage-4 engine against a continuous stage-5 one with two
    different attention implementations would measure the implementations, not the schedulers. The backend
    is chosen by name (attention/backends.py), so it is built as the engine builds any backend: with the
    model's per-layer windows.
    """
    from pagedlab.llm import LLM

    return LLM(stage=stage, attention_backend="tiled", **engine_args)


def write_rows_beside(result: dict, figure: Path, seconds: float) -> Path:
    """Write a bench's result as JSON beside its figure (02_memory.png -> 02_memory.json): the bench's name, how
    the run went (`run`: when, how long, the load on the machine), then its rows, one per line for readable diffs."""
    run = {
        "command": f"pagedlab bench {result['bench']}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(seconds, 1),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 minutes; the bench itself counts
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
    }
    rows = ",\n".join(f"  {json.dumps(row, allow_nan=False)}" for row in result["rows"])
    path = Path(figure).with_suffix(".json")
    head = f'{{"bench": {json.dumps(result["bench"])}, "run": {json.dumps(run)}, "rows": [\n'
    path.write_text(f"{head}{rows}\n]}}\n", encoding="utf-8")
    return path


def read_rows(path: str | Path) -> dict:
    """A result written by write_rows_beside: {"bench", "run", "rows"}."""
    result = read_json_file(path, "bench result")
    if not isinstance(result.get("rows"), list) or "bench" not in result:
        raise ValueError(f"{path}: not a bench's rows (no 'bench' and 'rows')")
    return result


def wrote_line(figure: Path, rows: Path) -> str:
    """The last word of a bench that drew a figure: where it went, and that the chapters quote the committed one."""
    return (
        f"wrote {figure} and {rows.name}; the chapters quote the committed figures/ (`git checkout figures/` "
        "restores them, `pagedlab figures` redraws from their JSON)"
    )


def rough_duration(seconds: float) -> str:
    """'about 40 s', 'about 2 min': an estimate, rounded as one."""
    if seconds >= 90:
        return f"about {seconds / 60:.0f} min"
    return f"about {max(1, round(seconds, -1 if seconds >= 10 else 0)):.0f} s"
