"""Benchmarks: `pagedlab bench scheduler`, the cost of one schedule() + update() as the running batch grows.

Builds on: the stage-5 parts (sched/continuous.py, its KV manager), request.py, sched/output.py.
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md.

A fake model stands in for the forward pass (no tensors at all): every request
that reached the end of its known tokens samples the same token. N requests
are admitted and prefilled, then N-request decode steps are timed:

    prefill   schedule() -> fake model -> update()            (untimed: admits all N)
    decode    [schedule()] -> fake model -> [update()]  x STEPS  (timed: the bracketed calls)

The pool and the token budget are large enough that nothing is preempted and
nobody finishes, so every timed step schedules exactly N decodes: the cost is
the scheduler's and the KV manager's Python bookkeeping, the part of a step
that a faster model cannot shrink: on a GPU, where a decode step of a small
model takes milliseconds, this is the overhead continuous batching pays for
re-forming the batch every step.

With `--peer vllm` (after `pagedlab fetch vllm`) the same loop also runs on vLLM 0.33.0's own Scheduler, in
vLLM's environment (bench/vllm_scheduler_timer.py), at 64, 256 and 1024 running, taking turns size by size:

    round 1   pagedlab 64   vllm 64   pagedlab 256   vllm 256   pagedlab 1024   vllm 1024
    round 2   ...

and each row is the round with the lower median. The target: pagedlab no slower than vLLM per request and step
at 256 and 1024 running.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import TYPE_CHECKING

from pagedlab.bench.tables import Column, Table
from pagedlab.errors import check
from pagedlab.kv.block_pool import cdiv
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from rich.table import Table

RUNNING = (16, 32, 64, 128, 256, 512, 1024)
PEER_RUNNING = (64, 256, 1024)  # sizes timed beside vLLM
PEER_ROUNDS = 2
PEER_TARGET = 1.0  # pagedlab ÷ vLLM, microseconds per request and step, at 256 and 1024 running
STEPS = 64  # timed decode steps per size
PROMPT_LEN = 32  # tokens per prompt: two full blocks, hashed for the prefix cache as in a real run
BLOCK_SIZE = 16
STAGE = 5
SAMPLED_TOKEN = 7  # what the fake model samples, for everyone
EOS = 1


def make_scheduler(num_running: int, steps: int = STEPS, prompt_len: int = PROMPT_LEN, block_size: int = BLOCK_SIZE):
    """The stage-5 scheduler and KV manager, sized so that `num_running` requests decode `steps` tokens unhindered."""
    from pagedlab.stages import engine_config, get_preset, make_kv_manager, make_scheduler

    max_len = prompt_len + steps + 2
    blocks = num_running * cdiv(max_len, block_size)
    config = engine_config(
        STAGE,
        max_len,
        1,  # bytes per KV token: no cache is allocated, so any positive value
        block_size=block_size,
        max_model_len=max_len,
        num_kv_blocks=blocks,
        max_num_seqs=num_running,
        max_num_batched_tokens=num_running * prompt_len,  # the whole first step's prefill in one budget
    )
    preset = get_preset(STAGE)
    return make_scheduler(config, preset, make_kv_manager(config, preset))


def add_requests(scheduler, num_running: int, max_tokens: int, prompt_len: int = PROMPT_LEN) -> None:
    """`num_running` requests with distinct prompts (no prefix-cache hits between them), ignoring EOS."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_running):
        prompt = list(range(i * prompt_len + 2, (i + 1) * prompt_len + 2))
        scheduler.add_request([Request(f"r{i}", prompt, params, max_tokens, eos_token_ids=(EOS,))])


def fake_model(so: SchedulerOutput) -> ModelRunnerOutput:
    """Every request whose known tokens are all fed this step samples SAMPLED_TOKEN."""
    fed = so.num_scheduled_tokens
    samplers = [r.request_id for r in so.scheduled if r.num_computed_tokens + fed[r.request_id] == r.num_tokens]
    n = len(samplers)
    return ModelRunnerOutput(samplers, [SAMPLED_TOKEN] * n, [0.0] * n, [None] * n)


def time_decode_steps(num_running: int, steps: int = STEPS) -> dict:
    """Prefill `num_running` requests, then time `steps` decode steps; per-step medians in microseconds."""
    scheduler = make_scheduler(num_running, steps)
    add_requests(scheduler, num_running, max_tokens=steps + 2)
    so = scheduler.schedule()
    scheduler.update(so, fake_model(so))
    check(len(scheduler.running) == num_running, "the prefill step must admit every request")
    schedule_ns, update_ns = [], []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        so = scheduler.schedule()
        t1 = time.perf_counter_ns()
        sampled = fake_model(so)
        t2 = time.perf_counter_ns()
        scheduler.update(so, sampled)
        t3 = time.perf_counter_ns()
        check(list(so.num_scheduled_tokens.values()) == [1] * num_running, "every timed step is num_running decodes")
        schedule_ns.append(t1 - t0)
        update_ns.append(t3 - t2)
    check(scheduler.num_preemptions == 0 and len(scheduler.running) == num_running, "a timed step lost a request")
    return {"schedule_ns": schedule_ns, "update_ns": update_ns}


def scheduler_row(num_running: int, timings: dict, system: str = "pagedlab") -> dict:
    """One flat row, the fields of chapters/97-architecture.md first, then extras. Medians: other work on the
    machine only adds outliers."""
    per_step = [s + u for s, u in zip(timings["schedule_ns"], timings["update_ns"])]
    us_per_step = statistics.median(per_step) / 1000
    return {
        "system": system,
        "running": num_running,
        "us_per_step": us_per_step,
        "us_per_request": us_per_step / num_running,
        "us_schedule": statistics.median(timings["schedule_ns"]) / 1000,
        "us_update": statistics.median(timings["update_ns"]) / 1000,
        "us_per_step_mean": statistics.fmean(per_step) / 1000,
        "steps": len(per_step),
        "stage": STAGE,
        "block_size": BLOCK_SIZE,
        "prompt_len": PROMPT_LEN,
    }


def scheduler_rows(running=RUNNING, steps: int = STEPS) -> list[dict]:
    return [scheduler_row(n, time_decode_steps(n, steps)) for n in running]


def measure_scheduler(console, running=None, steps: int = STEPS, peer: str | None = None) -> list[dict]:
    console.print(f"[dim]scheduler: stage {STAGE}, fake model, {steps} decode steps per size …[/dim]")
    if peer is None:
        return scheduler_rows(running or RUNNING, steps)
    if peer != "vllm":
        raise ValueError(f"--peer: only 'vllm' is a peer, got {peer!r}")
    return peer_rows(console, running or PEER_RUNNING, steps)


def peer_rows(console, running, steps: int, rounds: int = PEER_ROUNDS) -> list[dict]:
    """pagedlab and vLLM's Scheduler taking turns at each size, `rounds` times; each system's better round."""
    from pagedlab.bench.common import progress

    best: dict[tuple[str, int], dict] = {}
    with VllmTimer() as vllm, progress(console, rounds * len(running) * 2, "scheduler") as tick:
        for i in range(rounds):
            for n in running:
                for system, timer in (("pagedlab", time_decode_steps), ("vllm", vllm.time_decode_steps)):
                    tick(f"round {i + 1}, {system}, {n} running")
                    row = scheduler_row(n, timer(n, steps), system)
                    if (system, n) not in best or row["us_per_step"] < best[system, n]["us_per_step"]:
                        best[system, n] = row
    rows = [best[system, n] for n in running for system in ("pagedlab", "vllm")]
    for row in rows:
        ours, theirs = (best[system, row["running"]]["us_per_step"] for system in ("pagedlab", "vllm"))
        row |= {"pagedlab_vs_vllm": ours / theirs, "rounds": rounds}
    return rows


class VllmTimer:
    """bench/vllm_scheduler_timer.py in vLLM's environment, one job per line (vLLM is imported once)."""

    def __enter__(self):
        import subprocess
        from pathlib import Path

        from pagedlab.lessons import vllm_peer
        from pagedlab.model.loader import BUNDLED_MODEL, resolve_model_path

        vllm_peer.check_fetched()
        self.model_dir = str(resolve_model_path(BUNDLED_MODEL))
        env = vllm_peer.peer_environment()
        script = Path(__file__).with_name("vllm_scheduler_timer.py")
        self.process = subprocess.Popen([str(vllm_peer.venv_python()), str(script)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        self._read()  # {"ready": ...} once vLLM is imported
        return self

    def time_decode_steps(self, num_running: int, steps: int = STEPS) -> dict:
        job = {"running": num_running, "steps": steps, "prompt_len": PROMPT_LEN, "block_size": BLOCK_SIZE}
        self.process.stdin.write(json.dumps(job | {"model_dir": self.model_dir}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM's scheduler timer stopped (exit {self.process.wait()})")
        return json.loads(line)

    def __exit__(self, *exc):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _title(rows: list[dict]) -> str:
    r0 = rows[0]
    return (
        f"Stage-{r0['stage']} scheduler: schedule() + update() per decode step, fake model "
        f"(medians of {r0['steps']} steps; block {r0['block_size']}, prompts of {r0['prompt_len']} tokens)"
    )


TABLES = {
    "sizes": Table(
        (
            Column("system", lambda r: r.get("system", "pagedlab")),
            Column("running", lambda r: str(r["running"])),
            Column("µs / step", lambda r: f"{r['us_per_step']:.0f}"),
            Column("µs / request", lambda r: f"{r['us_per_request']:.2f}"),
            Column("schedule()", lambda r: f"{r['us_schedule']:.0f} µs"),
            Column("update()", lambda r: f"{r['us_update']:.0f} µs"),
        ),
        title=_title,
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    console.print(TABLES["sizes"].rich(rows))
    for line in peer_lines(rows):
        console.print(line)


def peer_lines(rows: list[dict]) -> list[str]:
    """pagedlab ÷ vLLM at each size, against the target at 256 and 1024 running, in words."""
    lines = []
    for row in (r for r in rows if r.get("system") == "pagedlab" and "pagedlab_vs_vllm" in r):
        ratio, n = row["pagedlab_vs_vllm"], row["running"]
        judged = n >= 256
        verdict = ("meets" if ratio <= PEER_TARGET else "misses") + f" the {PEER_TARGET:g}x target" if judged else ""
        lines.append(
            f"scheduler at {n} running: pagedlab {row['us_per_request']:.2f} µs per request and step, "
            f"{ratio:.2f}x vLLM 0.33.0's" + (f", which {verdict} on this run" if judged else " (no target here)")
        )
    return lines
