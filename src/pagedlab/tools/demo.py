"""Stage 1: `pagedlab demo`, the teaching scenario (lessons/demo.py) live, a step at a time, or as a log.

Builds on: lessons/demo.py (the scenario), engine/engine.py (add_request, step, trace), engine/events.py,
tools/demo_keys.py, viz/terminal.py (the frame).
Read with: README.md, chapters/05-continuous-batching.md.

The demo drives `llm.engine` itself (add_request, then step() until nothing is
left), as `LLM.generate` does, so that it can draw the engine between steps.
Its scenario is built to teach: ten requests of different lengths, more of them
than seats (6), and a pool (24 blocks of 8 tokens) too small for all of them
at once. At the default stage (continuous batching) the first steps show

    a chunked prefill beside decodes   long prompts are fed 16 tokens a step while others decode
    a prefix-cache hit                 requests 2 and 5 start with the same line: 5 reuses 2's blocks
    a preemption                       the pool runs out; the newest request gives its seat back
    a seat refilled                    a request joins the step after another finishes
    recompute (or swap-in)             the preempted request returns, its blocks from the cache (or CPU)

`--stage contiguous` (or paged, cow, prefix) runs the same requests on the
same pool, so the difference is there to see: fewer requests at once, whole
batches that wait for their slowest member, and more steps.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from pagedlab.engine.events import step_events
from pagedlab.lessons.demo import DemoOptions, add_requests, check_options, make_llm
from pagedlab.llm import LLM
from pagedlab.outputs import RequestOutput
from pagedlab.tools.demo_keys import BACK, HELP, QUIT, key_reader
from pagedlab.viz.terminal import change_lines, pool_size, render_frame


def run_demo(opts: DemoOptions, console: Console | None = None, keys=None) -> LLM:
    """Run the scenario step by step, drawing each step; then the summary (and the figures, if asked)."""
    check_options(opts)
    console = console or Console(stderr=opts.as_json)
    llm = make_llm(opts)
    prompts = add_requests(llm, opts)
    if opts.mode != "log" and not opts.as_json:
        console.print(legend(llm, opts))
    start = time.perf_counter()
    if opts.mode == "step":
        with nullcontext(keys) if keys else key_reader() as read_key:
            finals = StepThrough(llm, prompts, console, read_key).run()
    else:
        finals = drive(llm, prompts, opts, console)
    summary = summarize(llm, len(prompts))
    console.print(summary_table(llm, summary, time.perf_counter() - start))
    if not opts.as_json:
        print_texts(console, prompts, finals)
    if opts.figures_dir is not None:
        write_figures(opts.figures_dir, console)
    if opts.as_json:
        print(json.dumps(summary))
    return llm


def legend(llm: LLM, opts: DemoOptions) -> Group:
    """One screen: the scenario, and what to watch at this stage."""
    cfg = llm.engine.config
    lines = [
        Text(f"pagedlab demo · stage {cfg.stage} ({cfg.stage_name})", style="bold"),
        Text(
            f"{opts.num_requests} requests of different lengths, {cfg.max_num_seqs} seats, a KV pool of "
            f"{cfg.num_kv_blocks} blocks of {cfg.block_size} tokens."
        ),
        Text("What to watch:"),
    ]
    watch = WATCH_CONTINUOUS if cfg.stage >= 5 else WATCH_STATIC
    lines += [Text.assemble(("  " + name.ljust(16), "bold"), what) for name, what in watch]
    if opts.mode == "step":
        lines.append(Text(f"Keys: {HELP}.", style="dim"))
    lines.append(Text("Each step lists what changed; --step goes by hand, --stage N compares.", style="dim"))
    return Group(*lines, Rule(style="dim"))


WATCH_CONTINUOUS = (
    ("chunked prefill", "long prompts fed 16 tokens a step, beside decodes"),
    ("prefix hit", "2 and 5 start alike: 5 reads 2's first blocks from the cache"),
    ("preemption", "the pool runs out: the newest gives its seat back (* or ~)"),
    ("refill", "a request takes a seat the step after another finishes"),
)
WATCH_STATIC = (
    ("static batch", "a batch runs until its longest request ends; seats wait empty"),
    ("KV held", "the bars show K/V written out of the slots a request holds"),
    ("compare", "run --stage continuous: the same requests in fewer steps"),
)


def drive(llm: LLM, prompts: dict[str, str], opts: DemoOptions, console: Console) -> dict[str, RequestOutput]:
    """step() until every request finished, drawing (or logging) every step that ran a batch."""
    engine, latest, steps = llm.engine, {}, []
    live = Live(console=console, auto_refresh=False) if opts.mode == "live" and not opts.as_json else nullcontext()
    with live:
        while engine.has_unfinished_requests():
            steps_before = engine.stats.num_steps
            latest |= {out.request_id: out for out in engine.step()}
            if engine.stats.num_steps == steps_before:  # nothing ran (only an abort was reported)
                continue
            steps.append(engine.trace[-1])
            if isinstance(live, Live):
                texts = {rid: out.outputs[0].text for rid, out in latest.items()}
                live.update(render_frame(steps, len(steps) - 1, engine.config, prompts, texts), refresh=True)
                time.sleep(opts.delay)
            elif opts.mode == "log":
                console.print(log_line(llm), highlight=False, markup=False, soft_wrap=True)
    if isinstance(live, Live) and not console.is_terminal:
        console.line()  # off a terminal, rich leaves the last frame without its newline
    return latest


class StepThrough:
    """`--step`: run one engine step per key, and go back and forth over the steps already run."""

    def __init__(self, llm: LLM, prompts: dict[str, str], console: Console, read_key):
        self.llm, self.prompts, self.console, self.read_key = llm, prompts, console, read_key
        self.steps: list = []  # the StepTrace of every step run so far
        self.texts: list[dict[str, str]] = []  # the requests' text after each of them
        self.latest: dict[str, RequestOutput] = {}

    def run(self) -> dict[str, RequestOutput]:
        shown = -1  # the step index on screen
        while True:
            if shown == len(self.texts) - 1 and not self._advance():
                break  # every request finished
            shown = min(shown + 1, len(self.texts) - 1)
            self._show(shown)
            while (key := self.read_key()) == BACK:
                shown = max(shown - 1, 0)
                self._show(shown)
            if key == QUIT:
                self.console.print(Text(f"stopped at step {len(self.texts)}", style="bold"))
                break
        return self.latest

    def _advance(self) -> bool:
        """One engine step that ran a batch; False when nothing is left to run."""
        engine = self.llm.engine
        while engine.has_unfinished_requests():
            steps_before = engine.stats.num_steps
            self.latest |= {out.request_id: out for out in engine.step()}
            if engine.stats.num_steps > steps_before:
                self.steps.append(engine.trace[-1])
                self.texts.append({rid: out.outputs[0].text for rid, out in self.latest.items()})
                return True
        return False

    def _show(self, index: int) -> None:
        if self.console.is_terminal:
            self.console.clear()
        else:
            self.console.print(Rule(style="dim"))
        config = self.llm.engine.config
        self.console.print(render_frame(self.steps, index, config, self.prompts, self.texts[index]))
        where = f"step {index + 1} of {len(self.texts)} run"
        self.console.print(Text(f"{HELP} · {where}", style="dim"))


# --- logs, summary, figures --------------------------------------------------------------------------


def log_line(llm: LLM) -> str:
    """One step as one line, then what changed in it (for logs and CI: `--no-live`)."""
    engine = llm.engine
    t = engine.trace[-1]
    ran = " ".join(f"{rid}+{n}" for rid, n in t.scheduled.items())
    line = f"step {t.step:3d}  ran {ran}  waiting {' '.join(t.waiting) or '-'}  "
    line += f"KV {t.num_used_blocks}/{pool_size(t, engine.config)} blocks"
    events = step_events(engine.trace, len(engine.trace) - 1, engine.config)
    return "\n".join([line] + [f"  {text.plain}" for text in change_lines(events) if events])


def summarize(llm: LLM, num_requests: int) -> dict:
    """The run in numbers: `pagedlab demo --json` prints this object."""
    engine, stats = llm.engine, llm.engine.stats
    trace = list(engine.trace)
    kinds = [e.kind for i in range(len(trace)) for e in step_events(trace, i, engine.config)]
    return {
        "stage": engine.config.stage,
        "stage_name": engine.config.stage_name,
        "num_requests": num_requests,
        "num_steps": stats.num_steps,
        "num_preemptions": stats.num_preemptions,
        "prefix_cache_hits": stats.prefix_cache_hits,  # prompt tokens served from the cache
        "max_running": max((len(t.running) for t in trace), default=0),
        "seat_refills": kinds.count("refill"),
        "mixed_steps": kinds.count("mixed"),  # steps with prefill chunks and decodes together
        "swap_ins": kinds.count("swap_in"),
        "peak_kv_blocks_used": stats.peak_kv_blocks_used,
        "num_kv_blocks": engine.config.num_kv_blocks,
        "num_generated_tokens": stats.num_generated_tokens,
        "finished": sum(len(t.finished) for t in trace),
    }


def summary_table(llm: LLM, summary: dict, wall_seconds: float) -> Table:
    stats = llm.engine.stats
    table = Table(title=f"stage {summary['stage']} ({summary['stage_name']})", box=box.SIMPLE)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rate = stats.num_generated_tokens / stats.step_seconds if stats.step_seconds else 0.0
    peak, total = summary["peak_kv_blocks_used"], summary["num_kv_blocks"]
    rows = [
        ("requests finished", f"{summary['finished']}/{summary['num_requests']}"),
        ("engine steps", f"{summary['num_steps']}"),
        ("most requests running at once", f"{summary['max_running']}"),
        ("seats refilled the step after a finish", f"{summary['seat_refills']}"),
        ("steps with prefill and decode together", f"{summary['mixed_steps']}"),
        ("preemptions", f"{summary['num_preemptions']}"),
        ("prompt tokens from the prefix cache", f"{summary['prefix_cache_hits']}"),
        ("peak KV blocks used", f"{peak}/{total} ({peak / total:.0%})"),
        ("generated tokens", f"{summary['num_generated_tokens']}"),
        ("tokens/s inside step()", f"{rate:.0f}"),
        ("wall time (with drawing)", f"{wall_seconds:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_texts(console: Console, prompts: dict[str, str], finals: dict[str, RequestOutput]) -> None:
    for request_id, prompt in prompts.items():
        if request_id not in finals:
            continue  # stopped (q) before it ran
        completion = finals[request_id].outputs[0]
        console.print(Text(f"--- {request_id} ({completion.finish_reason or 'unfinished'})", style="bold"))
        console.print(Text(prompt + completion.text))


def write_figures(out_dir: str, console: Console) -> list:
    """pagedlab.lessons.make_figures(out_dir): the chapters' teaching figures (`--figures DIR`)."""
    from pagedlab.lessons import make_figures

    console.print(Text(f"figures: writing to {out_dir}/ ..."))
    paths = make_figures(out_dir)
    for path in paths:
        console.print(Text(f"  {path}"))
    return paths
