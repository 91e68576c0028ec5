"""Stage 1: `LLMEngine`, one engine for every stage: schedule -> execute -> update.

Builds on: stages.py (the parts), runner.py, output_processor.py, stats.py.
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

from pagedlab.attention.contiguous import allocate_kv_cache
from pagedlab.config import EngineConfig
from pagedlab.model.loader import LoadedModel
from pagedlab.oracle import max_output_tokens
from pagedlab.output_processor import OutputProcessor
from pagedlab.outputs import BeamSearchOutput, RequestOutput
from pagedlab.request import Request, RequestStatus
from pagedlab.runner import ModelRunner
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.sched.beam import BeamGroup
from pagedlab.stages import get_preset, make_attention
from pagedlab.stats import EngineStats, StepTrace
from pagedlab.validation import check_prompt, check_request_options


class LLMEngine:
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
        self.trace: list[StepTrace] = []
        self._requests: dict[str, list[Request]] = {}  # live group id -> its children
        self._pending: list[Request] = []  # ended outside a step (abort); reported by the next step
        self._beams: dict[str, BeamGroup] = {}  # live beam searches by request id
        self.beam_outputs: dict[str, BeamSearchOutput] = {}  # finished beam searches, until collected
        self._start = time.perf_counter()

    @property
    def attention_backend(self) -> str:
        return self.runner.attention.name

    def add_request(
        self,
        request_id: str,
        prompt,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; every problem with it is a ValueError raised before any state changes."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        check_request_options(self.config, priority, cache_salt)
        text, token_ids = check_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.config.max_model_len)
        max_tokens = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        arrival = time.perf_counter() - self._start if arrival_time is None else arrival_time
        children = Request.group(
            request_id,
            token_ids,
            params,
            max_tokens,
            self.model_config.eos_token_ids,
            arrival,
            priority,
            cache_salt,
            text,
        )
        self.scheduler.check_admissible(children)
        self.scheduler.add_request(children)
        self.output_processor.add_group(children)
        self._requests[request_id] = children

    def add_beam_request(self, request_id: str, prompt, params: BeamSearchParams) -> None:
        """Queue a beam search (stage 3+); its result lands in `beam_outputs[request_id]`."""
        if not getattr(self.scheduler, "supports_beam_search", False):
            raise ValueError(
                f"beam_search: needs copy-on-write (stage 3, cow) or later; this engine is stage {self.config.stage}"
            )
        if request_id in self._requests or request_id in self._beams:
            raise ValueError(f"request_id: {request_id!r} is already running")
        text, token_ids = check_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.config.max_model_len)
        steps = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        arrival, eos = time.perf_counter() - self._start, self.model_config.eos_token_ids
        group = BeamGroup.start(request_id, token_ids, params, steps, eos, arrival, text)
        self.scheduler.check_admissible(group.live * params.beam_width)  # every beam may need its own blocks
        self._beams[request_id] = group
        self.scheduler.add_beam_group(group)

    def abort_request(self, request_id: str) -> None:
        """End a request (all its children) now and free its KV; the next step() reports it."""
        beams = self._beams.get(request_id)
        children = beams.live if beams is not None else self._requests.get(request_id, [])
        ended = self.scheduler.finish_requests([c.request_id for c in children], RequestStatus.FINISHED_ABORTED)
        self._pending.extend(ended)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending)

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
        now = time.perf_counter() - self._start
        for r in self.output_processor.find_stop_strings(updated):
            if r.status.is_finished():  # a stop string on the last allowed token is still a stop (as vLLM)
                r.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_STOPPED)
        for r in updated:
            r.first_token_time = r.first_token_time or now
            if r.status.is_finished():
                r.finished_time = now
        aborted = [r for r in self._pending if r.group_id not in self._beams]  # beams report via beam_outputs
        touched, self._pending = aborted + updated, []
        self._collect_beams()
        self._update_stats(scheduler_output, updated, snapshot)
        outputs = self.output_processor.make_outputs(touched)
        for out in outputs:
            if out.finished:
                self._requests.pop(out.request_id, None)
        return outputs

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
        now = time.perf_counter() - self._start
        return StepTrace.capture(self.stats.num_steps + 1, now, so, self.scheduler, self.kv_manager)
