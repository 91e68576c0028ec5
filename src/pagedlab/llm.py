"""Stage 1: `LLM`, the offline API (vLLM's `LLM.generate`, same arguments, same return shape).

Builds on: engine.py, config.py, model/loader.py.
Read with: chapters/01-contiguous-static.md.

    llm = LLM(stage="contiguous", block_size=16)
    outs = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(max_tokens=64, temperature=0.0))
"""

from __future__ import annotations

import itertools

import torch
from tqdm import tqdm

from pagedlab.config import EngineConfig, parse_stage
from pagedlab.engine import LLMEngine
from pagedlab.model.loader import BUNDLED_MODEL, load_model
from pagedlab.outputs import BeamSearchOutput, RequestOutput
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.stages import default_stage

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LLM:
    """Load a model and serve it with the engine of one stage."""

    def __init__(self, model: str = BUNDLED_MODEL, stage: int | str | None = None, **engine_args):
        stage = default_stage() if stage is None else parse_stage(stage)
        dtype = engine_args.get("dtype") or "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {tuple(_DTYPES)}")
        self.loaded = load_model(model, device=engine_args.get("device") or "cpu", dtype=_DTYPES[dtype])
        mc = self.loaded.config
        kv_bytes_per_token = 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * _DTYPES[dtype].itemsize
        config = EngineConfig.create(stage, mc.max_position_embeddings, kv_bytes_per_token, **engine_args)
        self.engine = LLMEngine(config, self.loaded)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.loaded.tokenizer

    def generate(
        self, prompts, sampling_params=None, *, priority=None, cache_salt=None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params or SamplingParams(), len(prompts), "sampling_params")
        priorities = _per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        ids = [str(next(self._ids)) for _ in prompts]
        for rid, prompt, p, prio in zip(ids, prompts, params, priorities):
            self.engine.add_request(rid, prompt, p, priority=prio, cache_salt=cache_salt)
        return self._run(ids, use_tqdm)

    def beam_search(self, prompts, params: BeamSearchParams, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: one BeamSearchOutput per prompt, best sequences first."""
        prompts = _as_prompt_list(prompts)
        ids = [f"beam-{next(self._ids)}" for _ in prompts]
        for rid, prompt in zip(ids, prompts):
            self.engine.add_beam_request(rid, prompt, params)
        with tqdm(total=len(ids), desc="beam_search", disable=not use_tqdm, unit="req") as bar:
            while not all(i in self.engine.beam_outputs for i in ids):
                self.engine.step()
                bar.n = sum(i in self.engine.beam_outputs for i in ids)
                bar.refresh()
        return [self.engine.beam_outputs.pop(i) for i in ids]

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        wanted = set(ids)
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished_requests() and not wanted <= finished.keys():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[i] for i in ids]


def _as_prompt_list(prompts) -> list:
    """str | list[str] | list[int] | list[list[int]] -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise ValueError(f"prompts: expected str, list[str], list[int] or list[list[int]], got {type(prompts).__name__}")


def _per_prompt(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n
