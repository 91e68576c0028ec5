"""Stage 1: the teaching scenario of `pagedlab demo` and `pagedlab trace`: ten requests, six seats, 24 blocks.

Builds on: llm.py (LLM, llm.engine.add_request), stages.py (which settings a stage reads), viz/trace.py.
Read with: README.md, chapters/05-continuous-batching.md.

The scenario alone, with no drawing: the terminal demo (tools/demo.py) draws it
live, `demo_trace` runs it to the end for the step-through page, and the
chapters' figures replay it. Its settings are `DemoOptions`, the CLI flags one
to one: ten requests of different lengths, more of them than seats (6), and a
pool (24 blocks of 8 tokens) too small for all of them at once, so that a
chunked prefill, a prefix-cache hit, a preemption and a refilled seat all show
in the first steps of stage 5.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedlab.llm import LLM
from pagedlab.model.loader import BUNDLED_MODEL
from pagedlab.sampling_params import SamplingParams
from pagedlab.sched.policies import POLICIES
from pagedlab.stages import default_stage, get_preset
from pagedlab.viz.trace import to_trace

CITIZEN = "First Citizen:\nBefore we proceed any further, hear me speak.\n"  # two prompts share this line
SCENARIO = (  # (prompt, output tokens): varied, so that requests end at different steps
    ("ROMEO:", 28),
    ("JULIET:", 6),
    (CITIZEN + "All:", 10),
    ("GLOUCESTER:", 20),
    ("DUKE VINCENTIO:", 5),
    (CITIZEN + "Second Citizen:", 8),
    ("MENENIUS:", 24),
    ("PETRUCHIO:", 6),
    ("ISABELLA:", 18),
    ("KING RICHARD III:", 9),
)


@dataclass(frozen=True)
class DemoOptions:
    """What `pagedlab demo` runs; the CLI flags map one to one. The defaults are the teaching scenario."""

    stage: int | str | None = None  # None = the default stage ("continuous")
    model: str = BUNDLED_MODEL  # the bundled model or a Hugging Face folder
    num_requests: int = len(SCENARIO)  # more than the scenario's repeat its prompts
    max_tokens: int | None = None  # None = each request's own length in SCENARIO
    max_num_seqs: int = 6  # seats: fewer than requests, so the waiting queue shows
    block_size: int = 8  # tokens per KV block: small, so that blocks fill within a few steps
    num_kv_blocks: int = 24  # small: the pool runs out at stage 5 (stage 1 fits two 12-block regions)
    max_model_len: int = 96  # stage 1 reserves this many slots per request
    max_num_batched_tokens: int = 96  # the token budget of a step
    long_prefill_token_threshold: int = 16  # stage 5: longer prompts are fed in chunks of this many
    preemption_mode: str | None = None  # stage 5: "recompute" (None: the engine's default) or "swap"
    scheduling_policy: str | None = None  # stage 5: "fcfs" (None: the engine's default) or "priority"
    enable_prefix_caching: bool | None = None  # stage 4+: None = the stage's default (on)
    temperature: float = 0.8  # 0 = greedy
    seed: int = 0  # request i samples with seed + i
    mode: str = "live"  # "live": a live view; "step": a key per step; "log": a line per step
    delay: float = 0.3  # seconds per live frame, so that humans can watch
    figures_dir: str | None = None  # write the teaching figures there at the end
    as_json: bool = False  # stdout: one JSON summary; the tables go to stderr


MODES = ("live", "step", "log")


def check_options(opts: DemoOptions) -> None:
    """The demo's own settings (the engine checks the rest, naming the field)."""
    if opts.mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {opts.mode!r}")
    if not (isinstance(opts.num_requests, int) and opts.num_requests >= 1):
        raise ValueError(f"num_requests: must be an integer >= 1, got {opts.num_requests!r}")
    if not opts.delay >= 0:  # nan too
        raise ValueError(f"delay: must be >= 0 seconds, got {opts.delay!r}")


def make_llm(opts: DemoOptions) -> LLM:
    """The engine of opts.stage on the scenario's pool; stage-5 settings only where the stage reads them."""
    llm = LLM(
        opts.model,
        stage=opts.stage,
        max_num_seqs=opts.max_num_seqs,
        block_size=opts.block_size,
        num_kv_blocks=opts.num_kv_blocks,
        max_model_len=opts.max_model_len,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        seed=opts.seed,
        record_trace=True,
        **_stage_settings(opts),
    )
    return llm


def _stage_settings(opts: DemoOptions) -> dict:
    """The scenario's chunk size where the stage chunks prefills; a preemption mode only if one was given
    (the engine refuses it at a stage that never preempts)."""
    uses = get_preset(default_stage() if opts.stage is None else opts.stage).uses
    chunks = {"long_prefill_token_threshold": opts.long_prefill_token_threshold}
    optional = {name: getattr(opts, name) for name in ("preemption_mode", "scheduling_policy", "enable_prefix_caching")}
    given = {name: value for name, value in optional.items() if value is not None}
    return {name: value for name, value in chunks.items() if name in uses} | given


def add_requests(llm: LLM, opts: DemoOptions) -> dict[str, str]:
    """Queue opts.num_requests requests of the scenario, each with its own seed; returns request_id -> prompt."""
    prompts, uses_priority = {}, POLICIES[llm.engine.config.scheduling_policy].uses_priority
    for i in range(opts.num_requests):
        prompt, length = SCENARIO[i % len(SCENARIO)]
        length = length if opts.max_tokens is None else opts.max_tokens
        params = SamplingParams(temperature=opts.temperature, max_tokens=length, seed=opts.seed + i, ignore_eos=True)
        priority = i % 3 if uses_priority else 0  # a spread: lower is served first
        llm.engine.add_request(str(i), prompt, params, priority=priority)
        prompts[str(i)] = prompt
    return prompts


def demo_trace(opts: DemoOptions, max_steps: int = 10_000) -> dict:
    """Run the scenario to the end without drawing; its trace (viz/trace.py), with the prompts and output
    texts. A ValueError if requests are still unfinished after max_steps engine steps."""
    check_options(opts)
    llm = make_llm(opts)
    prompts, texts = add_requests(llm, opts), {}
    for _ in range(max_steps):
        if not llm.engine.has_unfinished_requests():
            return to_trace(llm, prompts, texts)
        texts |= {out.request_id: out.outputs[0].text for out in llm.engine.step()}
    raise ValueError(f"max_steps: requests still unfinished after {max_steps} engine steps")
