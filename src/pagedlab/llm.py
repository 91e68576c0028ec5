"""Stage 1: `LLM`, the offline API (vLLM's `LLM.generate`, same arguments, same return shape).

Builds on: engine/engine.py, config.py, model/loader.py.
Read with: chapters/01-contiguous-static.md.

    llm = LLM(stage="contiguous", block_size=16)
    outs = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(max_tokens=64, temperature=0.0))
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch
from tqdm import tqdm

from pagedlab.engine.engine import LLMEngine
from pagedlab.engine.validation import check_engine_memory
from pagedlab.model.loader import BUNDLED_MODEL, load_model, load_model_config
from pagedlab.outputs import BeamSearchOutput, RequestOutput
from pagedlab.sampling_params import BeamSearchParams
from pagedlab.stages import config_for_model, default_stage, parse_stage


class LLM:
    """Load a model and serve it with the engine of one stage."""

    def __init__(self, model: str = BUNDLED_MODEL, stage: int | str | None = None, **engine_args):
        stage = default_stage() if stage is None else parse_stage(stage)
        path, mc = load_model_config(model)  # config.json only: every size is checked before a weight is read
        config = config_for_model(stage, mc, **engine_args)
        check_engine_memory(config, mc)
        self.loaded = load_model(path, device=config.device, dtype=getattr(torch, config.dtype))
        self.engine = LLMEngine(config, self.loaded)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.loaded.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's LLM.reset_prefix_cache); False while requests hold blocks."""
        return self.engine.reset_prefix_cache()

    def generate(
        self, prompts, sampling_params=None, *, priority=None, cache_salt=None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        All or nothing: every prompt is checked before any is queued, so one bad prompt queues none.
        """
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params, len(prompts), "sampling_params")
        priorities = _per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        groups = [
            self.engine.process_inputs(self._fresh_id(), prompt, p, priority=prio, cache_salt=cache_salt)
            for prompt, p, prio in zip(prompts, params, priorities)
        ]
        ids = [g[0].group_id for g in groups]
        with self._aborting_on_failure(ids):
            for group in groups:
                self.engine.add_processed(group)
            return self._run(ids, use_tqdm)

    def chat(
        self,
        messages,
        sampling_params=None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"}) or a list of them, answered.

        Each conversation is rendered by the model's chat template (or `chat_template`) into one prompt,
        tokenized as it stands (the template writes the special tokens itself), then generated like any
        prompt: the engine never sees roles. Returns one RequestOutput per conversation, in order.
        """
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("messages: this model folder has no tokenizer.json, so it has no chat template")
        conversations = [messages] if _is_conversation(messages) else messages
        if not isinstance(conversations, (list, tuple)) or not conversations:
            raise ValueError("messages: expected a conversation (list of {'role', 'content'}) or a list of them")
        prompts = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation, chat_template=chat_template, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def beam_search(self, prompts, params: BeamSearchParams, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: one BeamSearchOutput per prompt, best sequences first."""
        prompts = _as_prompt_list(prompts)
        groups = [self.engine.process_beam_inputs(self._fresh_id("beam-"), p, params) for p in prompts]
        ids = [g.request_id for g in groups]
        with self._aborting_on_failure(ids):
            for group in groups:
                self.engine.add_processed_beams(group)
            with tqdm(total=len(ids), desc="beam_search", disable=not use_tqdm, unit="req") as bar:
                while not all(i in self.engine.beam_outputs for i in ids):
                    self._step_or_fail()
                    bar.n = sum(i in self.engine.beam_outputs for i in ids)
                    bar.refresh()
            return [self.engine.beam_outputs.pop(i) for i in ids]

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        wanted = set(ids)
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while not wanted <= finished.keys():
                for out in self._step_or_fail():
                    if out.finished and out.request_id in wanted:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[i] for i in ids]

    def _step_or_fail(self) -> list[RequestOutput]:
        if not self.engine.has_unfinished_requests():  # every request ends, so this is a bug, not a hang
            raise RuntimeError("the engine has no unfinished requests, but some of this call's never finished")
        return self.engine.step()

    def _fresh_id(self, prefix: str = "") -> str:
        """The next request id no live request uses (a script may add its own ids through llm.engine)."""
        while True:
            request_id = f"{prefix}{next(self._ids)}"
            if self.engine.owner_of(request_id) is None:
                return request_id

    @contextmanager
    def _aborting_on_failure(self, ids: list[str]):
        """If anything goes wrong (an error, Ctrl-C) once this call's requests are queued, abort them, so the
        next call does not run them and the KV they hold is freed; then let the exception through."""
        try:
            yield
        except BaseException:
            self.engine.abort_request([i for i in ids if self.engine.owner_of(i) == i])
            raise


def _is_conversation(messages) -> bool:
    return isinstance(messages, (list, tuple)) and bool(messages) and all(isinstance(m, dict) for m in messages)


def _as_prompt_list(prompts) -> list:
    """str | dict | list[int] | a list of those -> a list of prompts (a dict is vLLM's TextPrompt or TokensPrompt)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise ValueError(
        f"prompts: expected str, list[str], list[int], list[list[int]] or prompt dicts, got {type(prompts).__name__}"
    )


def _per_prompt(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n
