"""Stage 1: `LLMEngine`, one engine for every stage: schedule -> execute -> update.

Builds on: stages.py (the parts), engine/validation.py (intake), worker/runner.py, engine/output_processor.py,
engine/stats.py.
Read with: chapters/00-overview.md, chapters/01-contiguous-static.md.

    scheduler_output = scheduler.schedule()                         # who runs, how many tokens
    sampled          = runner.execute(scheduler_output)             # build tensors, forward, sample
    update           = scheduler.update(scheduler_output, sampled)  # append tokens, stop, free blocks

Everything stage-specific hides behind the parts the preset chose; this file
never looks at a stage number. The scheduler owns every live request; the
engine keeps only what it still has to report (aborted groups, beam results). vLLM: vllm/v1/engine/core.py (step),
vllm/v1/engine/llm_engine.py (add_request, abort_request).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from pagedlab.config import EngineConfig
from pagedlab.engine.output_processor import OutputProcessor
from pagedlab.engine.replay import RunRecorder
from pagedlab.engine.stats import EngineStats, StepTrace
from pagedlab.engine.validation import InputProcessor
from pagedlab.outputs import BeamSearchOutput, RequestOutput
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.sched.beam import BeamGroup
from pagedlab.stages import get_preset, make_attention, make_kv_manager, make_scheduler

if TYPE_CHECKING:
    from pagedlab.model.loader import LoadedModel


class LLMEngine:
    """Invariant: a request id is live (refused to a new request) from add_request until the step that
    reports its group finished."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel,
        runner=None,
        kv_parts: dict | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """`runner`: what executes a step; by default a ModelRunner over `loaded.model`. The live lab passes a
        runner that samples seeded tokens instead (worker/token_source.py): no model, no torch, and the same
        scheduler, KV manager and engine around it. `kv_parts`: KV manager parts in place of the preset's (the
        lab's eviction policy). `clock`: seconds, read for arrival times and the trace (the lab counts steps)."""
        preset = get_preset(config.stage)
        if kv_parts:
            preset = replace(preset, kv_parts=preset.kv_parts | kv_parts)
        mc = loaded.config
        self.config, self.model_config, self.tokenizer = config, mc, loaded.tokenizer
        self.kv_manager = make_kv_manager(config, preset)
        self.scheduler = make_scheduler(config, preset, self.kv_manager)
        self.runner = runner if runner is not None else model_runner(config, loaded)
        self.inputs = InputProcessor(config, mc, loaded.tokenizer, self.scheduler, self.owner_of)
        self.output_processor = OutputProcessor(loaded.tokenizer)
        self.stats = EngineStats()
        self.trace: deque[StepTrace] = deque(maxlen=config.max_trace_steps)  # the last steps, when recorded
        self.recorder = RunRecorder() if config.record_trace else None  # the run as data, for a replay
        self._aborted: dict[str, tuple[Request, ...]] = {}  # aborted groups, until the next step reports them
        self.beam_outputs: dict[str, BeamSearchOutput] = {}  # finished beam searches, until collected
        self._clock = clock
        self._start = clock()

    @property
    def attention_backend(self) -> str:
        return self.runner.attention.name

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; every problem with it is a ValueError raised before any state changes."""
        self.add_processed(self.process_inputs(request_id, prompt, params, arrival_time, priority, cache_salt))

    def process_inputs(self, request_id, prompt, params=None, arrival_time=None, priority=0, cache_salt=None):
        """Check a request and build its children, changing nothing (engine/validation.py)."""
        return self.inputs.process(request_id, prompt, params, arrival_time, priority, cache_salt, self._now())

    def add_processed(self, children: tuple[Request, ...]) -> None:
        """Queue a group built by process_inputs (nothing was queued in between: its ids are still free)."""
        self.scheduler.add_request(children)
        if self.recorder is not None:
            self.recorder.add(children, self.stats.num_steps + 1)

    def add_beam_request(self, request_id: str, prompt: str | list[int], params: BeamSearchParams) -> None:
        """Queue a beam search (stage 3+); its result lands in `beam_outputs[request_id]`."""
        self.add_processed_beams(self.process_beam_inputs(request_id, prompt, params))

    def process_beam_inputs(self, request_id, prompt, params) -> BeamGroup:
        return self.inputs.process_beams(request_id, prompt, params, self._now())

    def add_processed_beams(self, group: BeamGroup) -> None:
        self.scheduler.add_beam_search(group)
        if self.recorder is not None:
            self.recorder.replayable = self.recorder.replayable or f"{group.request_id!r} is a beam search"

    def owner_of(self, request_id: str) -> str | None:
        """The live request or beam search `request_id` names (itself, a child, a beam), or None."""
        return self.scheduler.requests.owner_of(request_id) or (request_id if request_id in self._aborted else None)

    def abort_request(self, request_id: str | list[str]) -> None:
        """End requests (all their children or beams) now and free their KV; the next step() reports them.
        Takes one id or a list of ids; ids that are unknown or already finished are ignored, as in vLLM."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        if not isinstance(ids, (list, tuple, set)) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"request_id: expected a string or a list of strings, got {request_id!r}")
        groups = self.scheduler.requests
        members: list[Request] = []
        for i in ids:
            if i in groups.live:
                self._aborted[i] = groups.live[i]
                members += groups.live[i]
            elif i in groups.beams:
                members += groups.beams[i].live
        ended = self.scheduler.finish_requests([r.request_id for r in members], RequestStatus.FINISHED_ABORTED)
        for r in ended if self.recorder is not None else ():
            self.recorder.end(self.stats.num_steps, r.request_id, "abort")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block hash, as vLLM's; False (nothing done) while any block is in use."""
        return self.kv_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._aborted)

    def step(self) -> list[RequestOutput]:
        """Run one step; return a RequestOutput for every request that advanced or finished."""
        start = time.perf_counter()
        forward_before = self.runner.forward_seconds
        scheduler_output = self.scheduler.schedule()
        sampled = self.runner.execute(scheduler_output)
        if self.config.debug_checks and self.runner.block_tables is not None:
            self._check_runner_tables()
        snapshot = self._snapshot(scheduler_output) if self.config.record_trace else None
        update = self.scheduler.update(scheduler_output, sampled)
        outputs = self._finish_step(update.advanced, update.finished_beams)
        self._update_stats(scheduler_output, update.advanced, snapshot)
        if scheduler_output.scheduled:
            self.stats.num_steps += 1
            self.stats.step_seconds += time.perf_counter() - start
            self.stats.forward_seconds += self.runner.forward_seconds - forward_before
        return outputs

    def _finish_step(self, advanced: list[Request], finished_beams: list[BeamGroup]) -> list[RequestOutput]:
        now = self._now()
        for r in self.output_processor.find_stop_strings(advanced):
            if r.status.is_finished():  # a stop string on the last allowed token is still a stop (as vLLM)
                r.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_STOPPED)
                if self.recorder is not None:
                    self.recorder.end(self.stats.num_steps + 1, r.request_id, "stop")
        for r in advanced:
            r.first_token_time = r.first_token_time or now
            if r.status.is_finished():
                r.finished_time = now
        groups = self._aborted | {r.group_id: r.group for r in advanced}
        self._aborted = {}
        for beams in finished_beams:
            best = self.output_processor.with_text(beams.best(self.model_config.eos_token_ids), beams.num_prompt_tokens)
            self.beam_outputs[beams.request_id] = BeamSearchOutput(best)
        return self.output_processor.make_outputs(list(groups.values()))

    def _update_stats(self, scheduler_output, advanced: list[Request], snapshot: StepTrace | None) -> None:
        self.stats.record_step(len(advanced), self.kv_manager, self.scheduler)
        if self.config.debug_checks:
            self.scheduler.check_invariants()
        if snapshot is not None and scheduler_output.scheduled:
            snapshot.finished = [r.request_id for r in advanced if r.status.is_finished()]
            snapshot.finish_reasons = {r.request_id: r.status.finish_reason for r in advanced if r.status.is_finished()}
            self.trace.append(snapshot)

    def _check_runner_tables(self) -> None:
        """The tables the forward pass just used are the KV manager's, for every running request."""
        kv = self.kv_manager
        tables = {r.request_id: kv.get_block_ids(r) for r in self.scheduler.running}
        null_block = getattr(kv, "null_block", None)  # where a sliding window left a table's entry
        null = null_block.block_id if null_block is not None else None
        self.runner.block_tables.check_matches(tables, null)

    def _snapshot(self, so) -> StepTrace:
        return StepTrace.capture(self.stats.num_steps + 1, self._now(), so, self.scheduler, self.kv_manager)

    def _now(self) -> float:
        return self._clock() - self._start


def model_runner(config: EngineConfig, loaded: LoadedModel):
    """The ModelRunner of `loaded.model`, over a KV cache of the pool's size and the stage's attention backend.
    Imported here, not at the top: torch comes in with them, and the engine itself needs none (the live lab)."""
    from pagedlab.attention.base import allocate_kv_cache
    from pagedlab.worker.runner import ModelRunner

    mc = loaded.config
    dtype = loaded.model.lm_head.weight.dtype
    kv_cache = allocate_kv_cache(
        mc.num_hidden_layers, config.num_kv_blocks, config.block_size, mc.num_key_value_heads, mc.head_dim,
        dtype, config.device,
    )  # fmt: skip
    attention = make_attention(config, kv_cache, mc.num_queries_per_kv, mc.head_dim, mc.layer_windows)
    return ModelRunner(config, loaded.model, attention)
