"""Stage 2: the live lab: the real engine, scheduler and KV manager on a seeded workload, with no model and no torch.

Builds on: engine/engine.py (LLMEngine, handed a runner), worker/token_source.py (TokenSourceRunner: seeded
tokens), lessons/lab_workload.py (the requests), viz/trace.py (the trace the step-through page reads).
Read with: chapters/05-continuous-batching.md (The live lab), chapters/97-architecture.md (Layout).

The lab page (`pagedlab lab`) runs this module in the browser, in Pyodide's CPython; `pagedlab trace --lab`
runs it on the desktop. Both start from the same knobs, written as a URL fragment:

    lab.html#stage=4&block_size=16&num_kv_blocks=40&seed=3      knobs not named keep their defaults (KNOBS)
    lab.html#sliding_window=16&layer_pattern=WF                 a hybrid model: a block table per KV cache group

    LabOptions.from_fragment(text) -> run_lab(options) -> a trace: the same JSON, step for step, in both places

What is real: every scheduling and block decision (admission, chunks, preemption, forks and copies, prefix-cache
hits, eviction, swaps), made by the engine's own classes. What is not: the tokens' values (TokenSourceRunner), and
so no text. A knob a stage does not read (the budget's chunking before stage 5, say) is kept in the fragment and
left out of the engine, as the demo does (lessons/demo.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, fields, replace

from pagedlab.engine.engine import LLMEngine
from pagedlab.kv.eviction import EVICTION_POLICIES
from pagedlab.lessons.lab_workload import MAX_MODEL_LEN, VOCAB_SIZE, LabRequest, make_workload
from pagedlab.model.config import ModelConfig
from pagedlab.sampling_params import SamplingParams
from pagedlab.sched.policies import POLICIES
from pagedlab.stages import engine_config, get_preset
from pagedlab.viz.trace import to_trace
from pagedlab.worker.token_source import TokenSourceRunner

STAGES = (2, 3, 4, 5)  # the lab's stages: paged blocks to continuous batching (1 has no pool; 6 needs a GPU)
EVICTIONS = ("lru", "fifo", "lfu", "slru")  # the prefix cache's online eviction policies (kv/eviction.py)
MAX_REQUESTS = 500  # a run of this many takes a few seconds in a browser tab
MAX_STEPS = 10_000  # the engine's trace keeps this many steps (EngineConfig.max_trace_steps): a run stops there
MAX_CELLS = 4_000_000  # steps x num_kv_blocks: the pool's cells a trace may hold (about 20 MB of JSON)
MAX_LAYERS = 12  # layer_pattern's letters: enough for gpt-oss's WF and Gemma 3's WWWWWF, and few tables to draw


@dataclass(frozen=True)
class LabOptions:
    """The lab's knobs, named as the engine's settings (config.py) where they are one; the defaults are a run of
    stage 5 with chunked prefills, prefix-cache hits, forks, copies and preemptions (RANGES bounds each)."""

    stage: int = 5  # 2 .. 5
    block_size: int = 8  # tokens per KV block
    num_kv_blocks: int = 48  # the pool: any one request of the workload fits it (n = 3 children, each its worst case)
    max_num_seqs: int = 8  # seats
    max_num_batched_tokens: int = 256  # the token budget of a step (stages 2-4: a group's whole prompts must fit)
    long_prefill_token_threshold: int = 32  # stage 5: a longer prompt is fed in chunks of this many
    enable_prefix_caching: bool = True  # stage 4+
    preemption_mode: str = "recompute"  # stage 5: "recompute" | "swap"
    scheduling_policy: str = "fcfs"  # stage 5: "fcfs" | "priority"
    eviction_policy: str = "lru"  # stage 4+: which cached free block is reused first (EVICTIONS)
    sliding_window: int = 0  # tokens each query sees (0: all): blocks behind it are freed (stage 2+)
    # a hybrid model's layers, one letter each: W sees the sliding window, F is full attention ("WF": gpt-oss,
    # "WWWWWF": Gemma 3); each KV cache group gets its own block table, and its own blocks of the one pool (WF
    # needs num_kv_blocks=64 for the default workload). "": every layer alike (sliding_window's), as before
    layer_pattern: str = ""
    num_requests: int = 24  # the workload's size
    seed: int = 0  # the workload's and the tokens' seed

    def __post_init__(self):
        _check_options(self)

    @classmethod
    def from_fragment(cls, text: str) -> LabOptions:
        """Knobs from a URL fragment ("stage=4&block_size=16", a leading "#" allowed; `step=` is the page's cursor,
        not a knob, and is skipped). A ValueError names the first bad field."""
        kinds = {f.name: f.type for f in fields(cls)}
        given = {}
        for part in filter(None, text.lstrip("#").split("&")):
            name, sep, value = part.partition("=")
            if name == "step":
                continue
            if name not in kinds or not sep:
                raise ValueError(f"{name or part}: not a knob of the lab (known: {', '.join(kinds)})")
            given[name] = _parse(name, value, kinds[name])
        return cls(**given)

    def fragment(self) -> str:
        """The knobs that differ from the defaults, in KNOBS order: the page's address, `pagedlab trace --lab`'s."""
        default = LabOptions()
        return "&".join(f"{k}={_show(v)}" for k, v in asdict(self).items() if v != getattr(default, k))


KNOBS = tuple(f.name for f in fields(LabOptions))


def _parse(name: str, value: str, kind: str):
    if kind == "bool":
        if value not in ("true", "false", "1", "0"):
            raise ValueError(f"{name}: expected true or false, got {value!r}")
        return value in ("true", "1")
    if kind == "int":
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    return value


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


RANGES = {"block_size": (1, 256), "num_kv_blocks": (1, 4096), "max_num_seqs": (1, 256),
          "max_num_batched_tokens": (1, 65_536), "long_prefill_token_threshold": (0, 65_536),
          "sliding_window": (0, MAX_MODEL_LEN), "num_requests": (1, MAX_REQUESTS), "seed": (0, 2**31 - 1)}  # fmt: skip


def _check_options(o: LabOptions) -> None:
    """The lab's own ranges, which keep a run and its trace small enough to draw (the engine checks the rest when
    the run starts, naming the field)."""
    if o.stage not in STAGES:
        raise ValueError(f"stage: the lab runs stages {STAGES[0]}-{STAGES[-1]}, got {o.stage!r}")
    if o.eviction_policy not in EVICTIONS:
        raise ValueError(f"eviction_policy: expected one of {', '.join(EVICTIONS)}, got {o.eviction_policy!r}")
    for name, (low, high) in RANGES.items():
        if not low <= getattr(o, name) <= high:
            raise ValueError(f"{name}: expected {low} to {high}, got {getattr(o, name)!r}")
    _check_pattern(o.layer_pattern, o.sliding_window)


def _check_pattern(pattern: str, window: int) -> None:
    """layer_pattern: "" or a mix of W and F, at most MAX_LAYERS letters; W layers need a window to see."""
    if not pattern:
        return
    if len(pattern) > MAX_LAYERS or set(pattern) - {"W", "F"}:
        raise ValueError(f"layer_pattern: expected up to {MAX_LAYERS} letters W (a sliding-window layer) and F (full "
                         f"attention), such as WF or WWWWWF; got {pattern!r:.40}")  # fmt: skip
    if set(pattern) != {"W", "F"}:
        raise ValueError(f"layer_pattern: a hybrid model mixes W and F layers; got {pattern!r} (leave it empty for "
                         "layers all alike)")  # fmt: skip
    if window == 0:
        raise ValueError("layer_pattern: its W layers see sliding_window tokens: set sliding_window above 0")


def layer_windows(options: LabOptions) -> tuple[int | None, ...]:
    """The model's window per layer (None: full attention) from layer_pattern; () for layers all alike."""
    return tuple(options.sliding_window if kind == "W" else None for kind in options.layer_pattern)


class StepClock:
    """The engine's clock in the lab: the number of the step running, so that a trace's times are its steps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class _ModelFree:
    """What LLMEngine reads of a loaded model when the runner is not ModelRunner: its config, no tokenizer."""

    config: ModelConfig = ModelConfig(
        "LlamaForCausalLM", VOCAB_SIZE, 1, 1, 1, 1, 1, 1, MAX_MODEL_LEN, 1e-5, 1e4, eos_token_ids=(1,)
    )
    tokenizer: None = None


class LabRun:
    """One run of the lab: the stage's LLMEngine on the knobs, with TokenSourceRunner for a model and a StepClock
    for a clock, and the workload it is fed. `steps()` runs it; `trace()` is what the page draws."""

    def __init__(self, options: LabOptions, model=None, tokens: dict[str, list[int]] | None = None):
        """`model`: a LoadedModel to run instead of the token source (its vocabulary must cover VOCAB_SIZE, as the
        bundled model's does); `tokens`: request id -> output tokens a real run sampled, for the token source to
        replay. Either way the run is a real one: tests/lessons/test_lab.py shows the two give one trace."""
        self.options, self.clock = options, StepClock()
        self.workload = make_workload(options.num_requests, options.seed)
        runner = None if model is not None else TokenSourceRunner(VOCAB_SIZE, options.seed, tokens)
        self.engine = LLMEngine(
            lab_config(options), model or _ModelFree(), runner=runner, kv_parts=_kv_parts(options), clock=self.clock
        )
        self.pending = deque(self.workload)

    def steps(self, max_steps: int = MAX_STEPS):
        """Step the engine through the workload, yielding the number of each step that ran."""
        for _ in range(max_steps):
            if not self.arrive():
                return
            self.clock.now = float(self.engine.stats.num_steps + 1)
            self.engine.step()
            done = self.engine.stats.num_steps
            if done * self.options.num_kv_blocks > MAX_CELLS:
                raise ValueError(f"num_requests: past step {done} the trace would hold more than {MAX_CELLS} pool "
                                 "cells (steps x num_kv_blocks): ask for fewer requests or a smaller pool")  # fmt: skip
            yield done
        raise ValueError(f"num_requests: still unfinished after {max_steps} engine steps (the trace keeps no more)")

    def run_to(self, step: int) -> LabRun:
        """Run until `step` steps have run (or all have: the run is shorter), then queue the next step's arrivals:
        the state a question about the next step is asked in (lessons/lab_browser.py)."""
        if self.engine.stats.num_steps < step:
            for done in self.steps():
                if done >= step:
                    break
        self.arrive()
        return self

    def arrive(self) -> bool:
        """Queue the requests that arrive before the next step; when nothing is in flight the next one arrives at
        once (no idle steps). False when every request has ended."""
        step = self.engine.stats.num_steps + 1
        while self.pending and (self.pending[0].arrival_step <= step or not self.engine.has_unfinished_requests()):
            self._add(self.pending.popleft())
        return self.engine.has_unfinished_requests()

    def trace(self) -> dict:
        return to_trace(self.engine, prompts={r.request_id: r.label for r in self.workload})

    def _add(self, r: LabRequest) -> None:
        params = SamplingParams(n=r.n, max_tokens=r.max_tokens, ignore_eos=True, seed=int(r.request_id))
        priority = r.priority if POLICIES[self.engine.config.scheduling_policy].uses_priority else 0  # as vLLM
        self.engine.add_request(r.request_id, list(r.prompt_token_ids), params, priority=priority)


def lab_config(options: LabOptions):
    """The engine's settings: the knobs the stage reads (as the demo passes them: lessons/demo.py)."""
    preset = get_preset(options.stage)
    settings = {k: v for k, v in asdict(options).items() if k in preset.uses}
    config = engine_config(
        options.stage, MAX_MODEL_LEN, 1,  # 1 byte per token: nothing is allocated
        block_size=options.block_size, num_kv_blocks=options.num_kv_blocks, max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens, max_model_len=MAX_MODEL_LEN, seed=options.seed,
        record_trace=True, **settings,
    )  # fmt: skip
    # The model's, in a real run (config.json): every layer's window, or a hybrid model's window per layer
    if options.layer_pattern:
        return replace(config, sliding_window=0, layer_windows=layer_windows(options))
    return replace(config, sliding_window=options.sliding_window)


def _kv_parts(options: LabOptions) -> dict | None:
    """The eviction policy's free queue, in place of the preset's (lru: the preset's own, vLLM's)."""
    if options.stage < 4 or options.eviction_policy == "lru":
        return None
    return {"eviction": EVICTION_POLICIES[options.eviction_policy]}


def run_lab(options: LabOptions) -> dict:
    """The workload through the engine to its end; its trace (viz/trace.py), each prompt labelled."""
    run = LabRun(options)
    for _ in run.steps():
        pass
    return run.trace()
