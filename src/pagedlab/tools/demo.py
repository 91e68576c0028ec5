"""Stage 1: `pagedlab demo`, the engine's step loop drawn live: queues, KV reserved vs used, block ids.

Builds on: llm.py, engine/engine.py (add_request, step, trace), engine/stats.py.
Read with: README.md, chapters/01-contiguous-static.md.

The demo drives `llm.engine` itself (add_request, then step() until nothing is
left), as `LLM.generate` does, so that it can draw the engine between steps:

    step 12 · stage 1 (contiguous) · 0/8 finished
    waiting   4 5 6 7
    running   0 1 2 3
     id  prompt    KV used / reserved            blocks  new  text so far
     0   ROMEO:    █░░░░░░░░░░░░░░░  18/1024     0-63    +1   ⏎What shall be th
    KV pool  ████████████░░░░  192/256 blocks (75%)

At stage 1 every running request reserves a whole region (max_model_len slots)
and uses a few dozen of them, and a new batch waits until the last request of
the current one finishes. Later stages shrink the grey part of the bars and
empty the waiting queue sooner; the summary table puts numbers on both. At
stage 5 a request preempted by a full pool waits again, marked * (its K/V
dropped, to be recomputed) or ~ (its K/V swapped out to the CPU pool).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pagedlab.engine.stats import StepTrace
from pagedlab.llm import LLM
from pagedlab.model.loader import BUNDLED_MODEL
from pagedlab.outputs import RequestOutput
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import SamplingParams

PROMPTS = (
    "ROMEO:",
    "JULIET:",
    "GLOUCESTER:",
    "DUKE VINCENTIO:",
    "MENENIUS:",
    "PETRUCHIO:",
    "ISABELLA:",
    "KING RICHARD III:",
)
TEXT_CHARS = 40  # the tail of each request's text shown live


@dataclass(frozen=True)
class DemoOptions:
    """What `pagedlab demo` runs; the CLI flags map one to one."""

    stage: int | str | None = None  # None = the default stage ("continuous")
    model: str = BUNDLED_MODEL  # the bundled model or a Hugging Face folder
    num_requests: int = 8  # prompts cycle through PROMPTS
    max_tokens: int = 32  # output tokens per request at most
    max_num_seqs: int = 4  # small, so that the waiting queue is visible
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None = the engine's default (room for max_num_seqs requests)
    temperature: float = 0.8  # 0 = greedy
    seed: int = 0  # request i samples with seed + i
    live: bool = True  # a live view; False = one log line per step
    delay: float = 0.05  # seconds per live frame, so that humans can watch
    figures_dir: str | None = "figures"  # None = make no figures


def run_demo(opts: DemoOptions, console: Console | None = None) -> LLM:
    """Run the requests step by step, drawing each step; then the summary, the texts and the figures."""
    console = console or Console()
    llm = LLM(
        opts.model,
        stage=opts.stage,
        max_num_seqs=opts.max_num_seqs,
        block_size=opts.block_size,
        num_kv_blocks=opts.num_kv_blocks,
        seed=opts.seed,
        record_trace=True,
    )
    prompts = add_requests(llm, opts)
    start = time.perf_counter()
    finals = drive(llm, prompts, opts, console)
    console.print(summary_table(llm, len(prompts), time.perf_counter() - start))
    print_texts(console, prompts, finals)
    if opts.figures_dir is not None:
        write_figures(opts.figures_dir, console)
    return llm


def add_requests(llm: LLM, opts: DemoOptions) -> dict[str, str]:
    """Queue opts.num_requests prompts, each with its own seed; returns request_id -> prompt."""
    prompts = {str(i): PROMPTS[i % len(PROMPTS)] for i in range(opts.num_requests)}
    for i, (request_id, prompt) in enumerate(prompts.items()):
        params = SamplingParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=opts.seed + i)
        llm.engine.add_request(request_id, prompt, params)
    return prompts


def drive(llm: LLM, prompts: dict[str, str], opts: DemoOptions, console: Console) -> dict[str, RequestOutput]:
    """step() until every request finished, drawing after every step that ran a batch."""
    engine, latest = llm.engine, {}
    live = Live(console=console, auto_refresh=False) if opts.live else nullcontext()
    with live:
        while engine.has_unfinished_requests():
            steps_before = engine.stats.num_steps
            latest |= {out.request_id: out for out in engine.step()}
            if engine.stats.num_steps == steps_before:  # nothing ran (only an abort was reported)
                continue
            if opts.live:
                live.update(render_step(llm, prompts, latest), refresh=True)
                time.sleep(opts.delay)
            else:
                console.print(log_line(llm), highlight=False, markup=False, soft_wrap=True)
    if opts.live and not console.is_terminal:
        console.line()  # off a terminal, rich leaves the last frame without its newline
    return latest


# --- one frame of the live view -------------------------------------------------------------------


def render_step(llm: LLM, prompts: dict[str, str], latest: dict[str, RequestOutput]) -> Group:
    engine = llm.engine
    trace = engine.trace[-1]
    done = sum(out.finished for out in latest.values())
    header = Text(f"step {trace.step} · stage {engine.config.stage} ({engine.config.stage_name}) · ", style="bold")
    header.append(f"{done}/{len(prompts)} finished")
    running = " ".join(r.request_id for r in engine.scheduler.running) or "-"
    queues = Text.assemble(
        ("waiting   ", "bold"), waiting_labels(llm, trace.waiting) or "-", "\n", ("running   ", "bold"), running
    )
    return Group(header, queues, request_table(llm, prompts, latest), pool_line(llm))


PREEMPTED_MARK = "*"  # stage 5: preempted, its K/V dropped (recompute)
SWAPPED_MARK = "~"  # stage 5: preempted, its K/V in the CPU swap pool


def waiting_labels(llm: LLM, request_ids: list[str]) -> str:
    """The waiting queue as ids; at stage 5 a preempted request is marked * (K/V dropped) or ~ (swapped out)."""
    queued = {r.request_id: r for r in llm.engine.scheduler.waiting}
    is_swapped = getattr(llm.engine.kv_manager, "is_swapped", lambda request: False)
    labels = []
    for request_id in request_ids:
        request = queued.get(request_id)
        mark = ""
        if request is not None and request.status == RequestStatus.PREEMPTED:
            mark = SWAPPED_MARK if is_swapped(request) else PREEMPTED_MARK
        labels.append(request_id + mark)
    return " ".join(labels)


def request_table(llm: LLM, prompts: dict[str, str], latest: dict[str, RequestOutput]) -> Table:
    """One row per request that ran this step or still runs; a finished one shows its KV as freed."""
    engine = llm.engine
    trace = engine.trace[-1]
    alive = {r.request_id: r for r in engine.scheduler.running}
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in [("id", "right"), ("prompt", "left"), ("KV used / reserved", "left")]:
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("blocks", no_wrap=True)
    table.add_column("new", justify="right", no_wrap=True)
    table.add_column("text so far", no_wrap=True, overflow="ellipsis")
    for request_id in dict.fromkeys([*trace.running, *alive]):
        request = alive.get(request_id)
        out = latest.get(request_id)
        blocks = block_ranges(engine.kv_manager.get_block_ids(request)) if request else "-"
        table.add_row(
            request_id,
            Text(prompts.get(request_id, "?")),
            kv_cell(llm, request, out),
            blocks,
            f"+{trace.scheduled.get(request_id, 0)}",
            Text(_tail(out.outputs[0].text if out else "")),
        )
    return table


def kv_cell(llm: LLM, request: Request | None, out: RequestOutput | None) -> Text:
    """A bar of the request's KV slots: computed tokens (used) out of the slots it holds (reserved)."""
    if request is None:
        reason = out.outputs[0].finish_reason if out else None
        return Text(f"finished ({reason}), KV freed", style="dim")
    held = llm.engine.kv_manager.slots_held(request)
    used = request.num_computed_tokens
    return bar(used / held if held else 0.0) + Text(f" {used}/{held}")


def pool_line(llm: LLM) -> Text:
    used, total = llm.engine.kv_manager.num_used_blocks, llm.engine.config.num_kv_blocks
    return Text.assemble(
        ("KV pool   ", "bold"), bar(used / total, width=32), f" {used}/{total} blocks ({used / total:.0%})"
    )


def bar(fraction: float, width: int = 16) -> Text:
    """█ for the used share, ░ for the rest; any use at all shows at least one █."""
    filled = min(width, round(fraction * width))
    if fraction > 0:
        filled = max(filled, 1)
    return Text.assemble(("█" * filled, "green"), ("░" * (width - filled), "grey50"))


def block_ranges(block_ids: list[int], max_chars: int = 18) -> str:
    """[0, 1, 2, 3, 7, 9, 10] -> '0-3,7,9-10', cut with '…' beyond max_chars."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ids
    for block_id in block_ids:
        if runs and block_id == runs[-1][1] + 1:
            runs[-1][1] = block_id
        else:
            runs.append([block_id, block_id])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _tail(text: str) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= TEXT_CHARS else "…" + text[-(TEXT_CHARS - 1) :]


# --- logs, summary, figures --------------------------------------------------------------------------


def log_line(llm: LLM) -> str:
    """One step as one line, for logs and CI (`--no-live`)."""
    t = llm.engine.trace[-1]
    ran = " ".join(f"{rid}+{n}" for rid, n in t.scheduled.items())
    used, total = llm.engine.kv_manager.num_used_blocks, llm.engine.config.num_kv_blocks
    line = f"step {t.step:4d}  ran {ran}  waiting {waiting_labels(llm, t.waiting) or '-'}  KV {used}/{total} blocks"
    line += f", {used_share([t]):.0%} of reserved slots used"
    return line + (f"  finished {' '.join(t.finished)}" if t.finished else "")


def used_share(trace: list[StepTrace]) -> float:
    """Slots holding computed tokens / slots reserved, summed over the requests of the given steps."""
    held = sum(sum(t.kv_held.values()) for t in trace)
    used = sum(sum(t.kv_used.values()) for t in trace)
    return used / held if held else 0.0


def summary_table(llm: LLM, num_requests: int, wall_seconds: float) -> Table:
    engine, stats = llm.engine, llm.engine.stats
    total = engine.config.num_kv_blocks
    table = Table(title=f"pagedlab demo: stage {engine.config.stage} ({engine.config.stage_name})", box=box.SIMPLE)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rate = stats.num_generated_tokens / stats.step_seconds if stats.step_seconds else 0.0
    rows = [
        ("requests", f"{num_requests}"),
        ("engine steps", f"{stats.num_steps}"),
        ("generated tokens", f"{stats.num_generated_tokens}"),
        ("tokens/s (inside step())", f"{rate:.1f}"),
        ("wall time (with drawing)", f"{wall_seconds:.1f} s"),
        ("peak KV blocks used", f"{stats.peak_kv_blocks_used}/{total} ({stats.peak_kv_blocks_used / total:.0%})"),
        ("KV slots used / reserved", f"{used_share(engine.trace):.1%}"),
        ("preemptions", f"{stats.num_preemptions}"),
        ("overhead share (outside forward)", f"{stats.overhead_share:.1%}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_texts(console: Console, prompts: dict[str, str], finals: dict[str, RequestOutput]) -> None:
    for request_id, prompt in prompts.items():
        completion = finals[request_id].outputs[0]
        console.print(Text(f"--- {request_id}: {prompt!r} ({completion.finish_reason})", style="bold"))
        console.print(Text(prompt + completion.text))


def write_figures(out_dir: str, console: Console) -> list[Path]:
    """pagedlab.lessons.make_figures(out_dir), skipped with a message while that module is missing."""
    try:
        from pagedlab.lessons import make_figures
    except ImportError as e:
        console.print(Text(f"figures: skipped ({e})", style="yellow"))
        return []
    console.print(Text(f"figures: writing to {out_dir}/ ..."))
    paths = make_figures(out_dir)
    for path in paths:
        console.print(Text(f"  {path}"))
    return paths
