"""Stage 5: a run as data (a recording), and its replay through pagedlab's scheduler with the tokens it sampled.

Builds on: engine/stats.py (StepTrace, the recorded steps), stages.py (the stage-5 parts), request.py,
worker/token_source.py (the runner that samples the recorded tokens).
Read with: chapters/09-graduate-to-vllm.md.

A recording holds what decides a schedule and nothing else: the engine settings, each request's prompt
(token ids), its sampling limits, the step it arrived before, and the token it sampled at each position.

    {"config": {"block_size": 8, "num_kv_blocks": 24, ...},        viz/trace.py's CONFIG_FIELDS
     "requests": [{"id": "3", "prompt_token_ids": [1, 40, ...], "output_token_ids": [52, 1, ...],
                   "max_tokens": 10, "arrival_step": 1, "priority": 0, "eos_token_ids": [2],
                   "ignore_eos": true, "stop_token_ids": []}, ...],     in the order they were added
     "ends": [[12, "5", "stop"]]}                                   ended from outside after that step:
                                                                    a stop string ("stop"), an abort ("abort")

`ReplayEngine` plays it back through the stage-5 scheduler and KV manager with a fake runner that
samples the recorded tokens: the same steps as the real run, with no model. lessons/vllm_peer.py plays
the same recording through vLLM's Scheduler, so the two schedules can be compared step by step.
A step's number counts the steps that scheduled something, as the engine's trace does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from pagedlab.engine.stats import StepTrace
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import SamplingParams
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput
from pagedlab.worker.token_source import TokenSourceRunner

CONFIG_FIELDS = ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                 "long_prefill_token_threshold", "enable_prefix_caching", "preemption_mode", "num_swap_blocks",
                 "scheduling_policy", "sliding_window", "layer_windows")  # fmt: skip
RECORDED_FIELDS = ("id", "prompt_token_ids", "output_token_ids", "max_tokens", "arrival_step", "priority",
                   "eos_token_ids", "ignore_eos", "stop_token_ids")  # fmt: skip
ENDS = {"stop": RequestStatus.FINISHED_STOPPED, "abort": RequestStatus.FINISHED_ABORTED}


class RunRecorder:
    """What the engine keeps, with record_trace=True, to make its recording: each request as it was added,
    the step it arrived before, and the requests ended from outside."""

    def __init__(self):
        self.requests: list[tuple[int, Request]] = []  # (arrival step, request), in the order added
        self.ends: list[list] = []  # [step, request id, "stop" | "abort"]
        self.replayable: str | None = None  # why not, once a request no replay can carry was added

    def add(self, group, step: int) -> None:
        if len(group) > 1:
            self.replayable = self.replayable or f"request {group[0].group_id!r} has n = {len(group)} children"
        if any(r.cache_salt is not None for r in group):
            self.replayable = self.replayable or f"request {group[0].group_id!r} has a cache_salt"
        self.requests += [(step, r) for r in group]

    def end(self, step: int, request_id: str, reason: str) -> None:
        self.ends.append([step, request_id, reason])

    def recording(self, config) -> dict:
        """The recording (the module docstring's format); a ValueError if a request cannot be replayed."""
        if self.replayable is not None:
            raise ValueError(f"replay: {self.replayable}; a replay carries single requests (n = 1) only")
        return {
            "config": config_fields(config),
            "requests": [recorded(r, step) for step, r in self.requests],
            "ends": [list(e) for e in self.ends],
        }


def recording_of(engine) -> dict | None:
    """The engine's run as a recording, when it kept one (record_trace=True) and every request can be replayed
    (single requests: no n > 1, no beams, no cache_salt); else None."""
    recorder = getattr(engine, "recorder", None)
    if recorder is None or recorder.replayable is not None:
        return None
    return recorder.recording(engine.config)


def config_fields(config) -> dict:
    """The settings a recording (and a trace) keeps, as JSON values (a hybrid model's layer_windows: a list)."""
    return {name: list(v) if isinstance(v := getattr(config, name), tuple) else v for name in CONFIG_FIELDS}


def recorded(r: Request, arrival_step: int) -> dict:
    p = r.sampling_params
    return {
        "id": r.request_id,
        "prompt_token_ids": list(r.prompt_token_ids),
        "output_token_ids": list(r.output_token_ids),
        "max_tokens": r.max_tokens,
        "arrival_step": arrival_step,
        "priority": r.priority,
        "eos_token_ids": list(r.eos_token_ids),
        "ignore_eos": p.ignore_eos,
        "stop_token_ids": list(p.stop_token_ids or ()),
    }


class ReplayEngine:
    """The stage-5 scheduler and KV manager replaying a recording; `trace` as the engine's (viz/trace.py reads
    it: `to_trace(ReplayEngine(recording).run())`). No model, no tensors: the sampled tokens are the recording's."""

    tokenizer = None

    def __init__(self, recording: dict, prefix_index: type | None = None):
        """`prefix_index`: another prefix index class for the KV manager (a test's), else the preset's."""
        from pagedlab.stages import engine_config, get_preset, make_kv_manager, make_scheduler

        c = recording["config"]
        fields = {k: v for k, v in c.items() if k not in ("sliding_window", "layer_windows", "num_swap_blocks")}
        if c["preemption_mode"] == "swap":
            fields["num_swap_blocks"] = c["num_swap_blocks"]
        config = engine_config(5, c["max_model_len"], 1, **fields)  # 1 byte per token: no cache is allocated
        windows = tuple(c.get("layer_windows") or ())  # a hybrid model's (absent in older recordings)
        self.config = replace(config, sliding_window=c.get("sliding_window", 0), layer_windows=windows,
                              record_trace=True)  # fmt: skip
        preset = get_preset(5)
        if prefix_index is not None:
            preset = replace(preset, kv_parts=preset.kv_parts | {"prefix_index": prefix_index})
        self.kv_manager = make_kv_manager(self.config, preset)
        self.scheduler = make_scheduler(self.config, preset, self.kv_manager)
        recorded = {r["id"]: r["output_token_ids"] for r in recording["requests"]}
        self.runner = TokenSourceRunner(vocab_size=1, recorded=recorded)  # the recording's tokens, never a seeded one
        self.pending = deque(sorted(recording["requests"], key=lambda r: r["arrival_step"]))  # stable: added order
        self.ends: dict[int, list] = {}
        for step, rid, reason in recording.get("ends", []):
            self.ends.setdefault(step, []).append((rid, reason))
        self.trace: deque[StepTrace] = deque()
        self.num_steps, self._added = 0, 0

    def run(self, max_steps: int = 100_000) -> ReplayEngine:
        """Every step until every request has ended; a ValueError after max_steps."""
        for _ in range(max_steps):
            if not self.pending and not self.scheduler.has_unfinished_requests():
                return self
            self.step()
        raise ValueError(f"max_steps: requests still unfinished after {max_steps} replayed steps")

    def step(self) -> None:
        """One step that schedules something. A step that would schedule nothing is no step (the engine's trace
        numbers only steps that ran): the next request to arrive is let in at once."""
        while self.pending and self.pending[0]["arrival_step"] <= self.num_steps + 1:
            self._add(self.pending.popleft())
        out = self.scheduler.schedule()
        if not out.scheduled:
            if not self.pending:
                raise ValueError(f"replay: nothing can be scheduled after step {self.num_steps}")
            self._add(self.pending.popleft())
            return
        self.num_steps += 1
        snapshot = StepTrace.capture(self.num_steps, float(self.num_steps), out, self.scheduler, self.kv_manager)
        self.scheduler.update(out, self._sampled(out))
        for rid, reason in self.ends.get(self.num_steps, []):
            if reason == "stop":  # a stop string, found in the text the step made: it ends in this step
                self.scheduler.finish_requests([rid], ENDS[reason])
        ended = [r for r in out.scheduled if r.status.is_finished()]
        snapshot.finished = [r.request_id for r in ended]
        snapshot.finish_reasons = {r.request_id: r.status.finish_reason for r in ended}
        self.trace.append(snapshot)
        for rid, reason in self.ends.get(self.num_steps, []):
            if reason == "abort":  # aborted between this step and the next: reported by none
                self.scheduler.finish_requests([rid], ENDS[reason])

    def _add(self, spec: dict) -> None:
        params = SamplingParams(
            temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=spec["ignore_eos"],
            stop_token_ids=list(spec["stop_token_ids"]) or None,
        )  # fmt: skip
        request = Request(
            spec["id"], list(spec["prompt_token_ids"]), params, spec["max_tokens"], tuple(spec["eos_token_ids"]),
            float(self._added), spec["priority"],
        )  # fmt: skip
        request.group = (request,)
        self._added += 1
        self.scheduler.add_request(request.group)

    def _sampled(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Every request whose known tokens are all fed this step samples its recorded next token."""
        return self.runner.execute(out)
