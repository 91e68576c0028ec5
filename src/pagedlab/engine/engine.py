"""Stage 1: `LLMEngine`, one engine for every stage: schedule -> execute -> update.

Builds on: stages.py (the parts), worker/runner.py, engine/output_processor.py, engine/stats.py.
Read with: chapters/00-overview.md, chapters/01-contiguous-static.md.

    scheduler_output = scheduler.schedule()                         # who runs, how many tokens
    sampled          = runner.execute(scheduler_output)             # build tensors, forward, sample
    updated          = scheduler.update(scheduler_output, sampled)  # append tokens, stop, free blocks

Everything stage-specific hides behind the three parts the preset chose;
this file never looks at a stage number. vLLM: vllm/v1/engine/core.py (step),
vllm/v1/engine/llm_engine.py (add_request, abort_request).
"""

from __future__ import annotations

import time
from collections import deque
from itertools import chain

from pagedlab.attention.contiguous import allocate_kv_cache
from pagedlab.config import EngineConfig
from pagedlab.engine.output_processor import OutputProcessor
from pagedlab.engine.stats import EngineStats, StepTrace
from pagedlab.engine.validation import (
    check_beam_params,
    check_prompt,
    check_request_id,
    check_request_options,
    check_sampling_params,
)
from pagedlab.model.loader import LoadedModel
from pagedlab.oracle import max_output_tokens
from pagedlab.outputs import BeamSearchOutput, RequestOutput
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.sched.beam import BeamGroup, is_beam_id
from pagedlab.stages import get_preset, make_attention
from pagedlab.worker.runner import ModelRunner


class LLMEngine:
    """Invariant: a request id is live (refused to a new request) from add_request until the step that
    reports its group finished; the request table `requests` is the one place that says which groups live."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel):
        preset = get_preset(config.stage)
        mc = loaded.config
        self.config, self.model_config, self.tokenizer = config, mc, loaded.tokenizer
        self.kv_manager = preset.kv_manager.from_config(config)
        self.scheduler = preset.scheduler(config, self.kv_manager)
        kv_cache = allocate_kv_cache(
            mc.num_hidden_layers,
            config.num_kv_blocks,
            config.block_size,
            mc.num_key_value_heads,
            mc.head_dim,
            loaded.model.lm_head.weight.dtype,
            config.device,
        )
        attention = make_attention(config, preset, kv_cache, mc.num_queries_per_kv, mc.head_dim)
        self.runner = ModelRunner(config, loaded.model, attention)
        self.output_processor = OutputProcessor(loaded.tokenizer)
        self.stats = EngineStats()
        self.trace: deque[StepTrace] = deque(maxlen=config.max_trace_steps)  # the last steps, when recorded
        self.requests: dict[str, tuple[Request, ...]] = {}  # live group id -> its children: the request table
        self._child_ids: dict[str, str] = {}  # child id "{i}_{id}" of a live n > 1 request -> its group id
        self._aborted: list[Request] = []  # ended outside a step (abort); reported by the next step
        self._beams: dict[str, BeamGroup] = {}  # live beam searches by request id
        self.beam_outputs: dict[str, BeamSearchOutput] = {}  # finished beam searches, until collected
        self._start = time.perf_counter()

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

    def process_inputs(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> tuple[Request, ...]:
        """Check a request and build its children, changing nothing (vLLM's input processor, process_inputs)."""
        check_request_id(request_id)
        params = check_sampling_params(params, self.config, self.model_config.vocab_size, self.tokenizer is not None)
        self._check_free(request_id, [f"{i}_{request_id}" for i in range(params.n)] if params.n > 1 else [])
        check_request_options(self.config, priority, cache_salt, arrival_time)
        text, token_ids = check_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.config.max_model_len)
        max_tokens = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        arrival = self._now() if arrival_time is None else float(arrival_time)
        eos = self.model_config.eos_token_ids
        children = Request.group(request_id, token_ids, params, max_tokens, eos, arrival, priority, cache_salt, text)
        self.scheduler.check_admissible(children)
        return children

    def add_processed(self, children: tuple[Request, ...]) -> None:
        """Queue a group built by process_inputs (nothing was queued in between: its ids are still free)."""
        self.scheduler.add_request(children)
        self.requests[children[0].group_id] = children
        self._child_ids.update({c.request_id: c.group_id for c in children if c.parent_id is not None})

    def add_beam_request(self, request_id: str, prompt: str | list[int], params: BeamSearchParams) -> None:
        """Queue a beam search (stage 3+); its result lands in `beam_outputs[request_id]`."""
        self.add_processed_beams(self.process_beam_inputs(request_id, prompt, params))

    def process_beam_inputs(self, request_id: str, prompt: str | list[int], params: BeamSearchParams) -> BeamGroup:
        """Check a beam search and build its first beam, changing nothing."""
        if not getattr(self.scheduler, "supports_beam_search", False):
            raise ValueError(
                f"beam_search: needs copy-on-write (stage 3, cow) or later; this engine is stage {self.config.stage}"
            )
        check_request_id(request_id)
        params = check_beam_params(params, self.config, self.model_config.vocab_size)
        self._check_free(request_id, [i for i in chain(self.requests, self._child_ids) if is_beam_id(i, request_id)])
        text, token_ids = check_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.config.max_model_len)
        steps = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        group = BeamGroup.start(
            request_id, token_ids, params, steps, self.model_config.eos_token_ids, self._now(), text
        )
        self.scheduler.check_admissible(group.live * params.beam_width)  # every beam may need its own blocks
        return group

    def add_processed_beams(self, group: BeamGroup) -> None:
        self._beams[group.request_id] = group
        self.scheduler.add_beam_group(group)

    def owner_of(self, request_id: str) -> str | None:
        """The live request or beam search that `request_id` belongs to (itself, a child, a beam), or None."""
        if request_id in self.requests or request_id in self._beams:
            return request_id
        if request_id in self._child_ids:
            return self._child_ids[request_id]
        return next((b for b in self._beams if is_beam_id(request_id, b)), None)

    def _check_free(self, request_id: str, reserved: list[str]) -> None:
        """`request_id` and the ids it reserves (its children's; for a search, its beams') belong to no live request."""
        if self.owner_of(request_id) == request_id:
            raise ValueError(f"request_id: {request_id!r} is already running")
        for rid in [request_id, *reserved]:
            owner = self.owner_of(rid)
            if owner is not None:
                raise ValueError(f"request_id: {request_id!r} collides with the live request {owner!r} (id {rid!r})")

    def abort_request(self, request_id: str | list[str]) -> None:
        """End requests (all their children or beams) now and free their KV; the next step() reports them.
        Takes one id or a list of ids; ids that are unknown or already finished are ignored, as in vLLM."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        if not isinstance(ids, (list, tuple, set)) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"request_id: expected a string or a list of strings, got {request_id!r}")
        members: list[Request] = []
        for i in ids:
            members += self._beams[i].live if i in self._beams else self.requests.get(i, ())
        self._aborted += self.scheduler.finish_requests([r.request_id for r in members], RequestStatus.FINISHED_ABORTED)

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
        snapshot = self._snapshot(scheduler_output) if self.config.record_trace else None
        updated = self.scheduler.update(scheduler_output, sampled)
        outputs = self._finish_step(scheduler_output, updated, snapshot)
        if scheduler_output.scheduled:
            self.stats.num_steps += 1
            self.stats.step_seconds += time.perf_counter() - start
            self.stats.forward_seconds += self.runner.forward_seconds - forward_before
        return outputs

    def _finish_step(self, scheduler_output, updated: list[Request], snapshot: StepTrace | None) -> list[RequestOutput]:
        now = self._now()
        for r in self.output_processor.find_stop_strings(updated):
            if r.status.is_finished():  # a stop string on the last allowed token is still a stop (as vLLM)
                r.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_STOPPED)
        for r in updated:
            r.first_token_time = r.first_token_time or now
            if r.status.is_finished():
                r.finished_time = now
        touched = dict.fromkeys(r.group_id for r in self._aborted + updated)  # beams report via beam_outputs
        self._aborted = []
        self._collect_beams()
        self._update_stats(scheduler_output, updated, snapshot)
        outputs = self.output_processor.make_outputs([self.requests[g] for g in touched if g in self.requests])
        for out in outputs:
            if out.finished:
                self._forget(out.request_id)
        return outputs

    def _forget(self, group_id: str) -> None:
        """A finished group leaves the request table: its ids are free again."""
        for child in self.requests.pop(group_id):
            self._child_ids.pop(child.request_id, None)

    def _collect_beams(self) -> None:
        groups = getattr(self.scheduler, "finished_beam_groups", None)
        for group in groups or ():
            best = group.best(self.model_config.eos_token_ids)
            best = self.output_processor.with_text(best, group.num_prompt_tokens)
            self.beam_outputs[group.request_id] = BeamSearchOutput(best)
            self._beams.pop(group.request_id, None)
        if groups:
            groups.clear()

    def _update_stats(self, scheduler_output, updated: list[Request], snapshot: StepTrace | None) -> None:
        self.stats.record_step(len(updated), self.kv_manager, self.scheduler)
        if self.config.debug_checks:
            self.scheduler.check_invariants()
        if snapshot is not None and scheduler_output.scheduled:
            snapshot.finished = [r.request_id for r in updated if r.status.is_finished()]
            self.trace.append(snapshot)

    def _snapshot(self, so) -> StepTrace:
        return StepTrace.capture(self.stats.num_steps + 1, self._now(), so, self.scheduler, self.kv_manager)

    def _now(self) -> float:
        return time.perf_counter() - self._start
