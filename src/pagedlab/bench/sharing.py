"""Benchmarks: `pagedlab bench sharing`, the vLLM paper's Figure 15 at our scale (what does sharing KV blocks save?).

Builds on: llm.py (the stage-3 engine: kv/cow.py behind sched/sharing.py and sched/beam.py), bench/workloads.py.
Read with: chapters/97-architecture.md (Benchmarks), chapters/03-copy-on-write.md.

The bundled model generates real samples (parallel sampling, n per request)
and real beams (beam search, beam_width per request) on the stage-3 engine,
all requests queued at t=0. After every step the bench reads two numbers off
the KV manager and sums them over the run:

    used    kv.num_used_blocks       physical blocks held: a block shared by k tables counts once
    needed  kv.num_table_blocks()    blocks the same block tables would hold without sharing

    saved = 1 - Σ_steps used / Σ_steps needed     (the paper: blocks saved by sharing ÷ blocks without it)

Read after a step, a request that finished in it holds nothing, and the
children of an n > 1 request hold no table until they fork from the leader's
prefill: both trim the very first and last step of a request, which matters
only for requests of a few tokens.

Parallel samples share only their prompt's full blocks (each child's first
token copies the partly filled last prompt block); beams also share the
output blocks of a common ancestor until they part, so they save far more:

    parallel sampling, n = 3                beam search, width 3
    child 0  [P0][P1][a0][a1]               beam 0  [P0][P1][x0][y0]
    child 1  [P0][P1][b0]                   beam 1  [P0][P1][x0][y1]
    child 2  [P0][P1][c0][c1]               beam 2  [P0][P1][x1]
    needed 11, used 7: saved 36 %           needed 11, used 6: saved 45 %

The paper (Kwon et al., SOSP 2023, §6.3, Fig. 15: OPT-13B, Alpaca) measured
6.09 / 8.53 / 9.79 % for n = 2 / 4 / 6 and 37.56 / 53.13 / 55.16 % for beam
width 2 / 4 / 6. For ShareGPT its text gives only ranges, 16.2-30.5 % and
44.3-66.3 %, shown here at widths 2 and 6 (the Alpaca ranges' ends are those).

Our scale: blocks of 16, max_num_seqs 48, a pool large enough that only
max_num_seqs bounds a static batch; one seeded stream per workload (the same
lengths and prompts, cut from the bundled corpus, for every mode and width);
the ShareGPT-like stream is short and capped at prompt + output <= 512 tokens
so that the whole bench takes a few minutes on two CPU cores.
Table and figure: bench/sharing_report.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedlab.bench.common import corpus_token_ids
from pagedlab.bench.workloads import RequestSpec, corpus_prompts, sample_requests
from pagedlab.errors import check
from pagedlab.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from pagedlab.engine.engine import LLMEngine

STAGE = 3  # fork and copy-on-write arrive with stage 3 (`cow`), which batches statically
MODES = ("parallel", "beam")
WIDTHS = (2, 4, 6)  # n for parallel sampling, beam_width for beam search (the paper's)
BLOCK_SIZE = 16  # vLLM's default, the paper's
MAX_NUM_SEQS = 48  # 8 requests of width 6 per static batch
SEED = 0


@dataclass(frozen=True, slots=True)
class Stream:
    """How much of a workload the bench runs."""

    num_requests: int  # requests in the seeded stream
    max_model_len: int  # prompt + output tokens at most (lengths clipped to it; the bundled model's limit is 1024)


STREAMS: dict[str, Stream] = {
    "alpaca": Stream(num_requests=48, max_model_len=1024),  # short requests: nothing is clipped
    "sharegpt": Stream(num_requests=8, max_model_len=512),  # long outputs: few, and capped, to keep CPU time in check
}

# Fig. 15 (Alpaca, bar labels); ShareGPT: the ends of the ranges in §6.3's text, so widths 2 and 6 only.
PAPER_SAVED: dict[tuple[str, str, int], float] = {
    ("alpaca", "parallel", 2): 0.0609,
    ("alpaca", "parallel", 4): 0.0853,
    ("alpaca", "parallel", 6): 0.0979,
    ("alpaca", "beam", 2): 0.3756,
    ("alpaca", "beam", 4): 0.5313,
    ("alpaca", "beam", 6): 0.5516,
    ("sharegpt", "parallel", 2): 0.162,
    ("sharegpt", "parallel", 6): 0.305,
    ("sharegpt", "beam", 2): 0.443,
    ("sharegpt", "beam", 6): 0.663,
}


@dataclass(frozen=True, slots=True)
class SharingCount:
    """Block counts of one run, summed over its steps."""

    used: int  # Σ physical blocks held (with sharing)
    needed: int  # Σ blocks the same block tables would hold without sharing
    steps: int  # engine steps run

    @property
    def saved(self) -> float:
        """1 - Σ used / Σ needed: the share of blocks that sharing saved."""
        return 1 - self.used / self.needed if self.needed else 0.0


def add_requests(
    engine: LLMEngine, mode: str, width: int, specs: list[RequestSpec], prompts: list[list[int]], seed: int = SEED
) -> None:
    """Queue the stream: `width` seeded samples per request, or one beam search of `width` beams per request."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    for i, (spec, prompt) in enumerate(zip(specs, prompts)):
        if mode == "beam":
            params = BeamSearchParams(beam_width=width, max_tokens=spec.output_len, ignore_eos=True)
            engine.add_beam_request(f"r{i}", prompt, params)
            continue
        request_seed = (seed * len(specs) + i) * width  # child j draws with request_seed + j: no two children alike
        params = SamplingParams(
            n=width, temperature=1.0, seed=request_seed, max_tokens=spec.output_len, ignore_eos=True
        )
        engine.add_request(f"r{i}", prompt, params)


def count_sharing(engine: LLMEngine) -> SharingCount:
    """Step the engine until every request ends, summing used and needed blocks after each step."""
    kv = engine.kv_manager
    used = needed = steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        used, needed, steps = used + kv.num_used_blocks, needed + kv.num_table_blocks(), steps + 1
    engine.beam_outputs.clear()  # the beams' text is not what we measure
    check(kv.num_used_blocks == 0, "every block is free once every request has ended")
    return SharingCount(used, needed, steps)


def sharing_row(
    mode: str,
    width: int,
    workload: str,
    specs: list[RequestSpec],
    prompts: list[list[int]],
    *,
    max_model_len: int,
    block_size: int = BLOCK_SIZE,
    max_num_seqs: int = MAX_NUM_SEQS,
    seed: int = SEED,
) -> dict:
    """Run one stream in one mode and width on a fresh stage-3 engine; one flat row (the fields of
    chapters/97-architecture.md first)."""
    from pagedlab.llm import LLM

    # Admission counts a group's prompt once per sample or beam against max_num_batched_tokens: with the default
    # (2048), 6 x a long ShareGPT-like prompt would be rejected. Only max_num_seqs should bound a batch here.
    batched = max_num_seqs * max_model_len
    llm = LLM(
        stage=STAGE,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
    )
    start = time.perf_counter()
    add_requests(llm.engine, mode, width, specs, prompts, seed)
    count = count_sharing(llm.engine)
    row = {"mode": mode, "width": width, "workload": workload, "block_size": block_size, "saved": count.saved}
    row |= {"num_requests": len(specs), "max_model_len": max_model_len, "max_num_seqs": max_num_seqs}
    row |= {
        "mean_prompt_len": sum(s.prompt_len for s in specs) / len(specs),
        "mean_output_len": sum(s.output_len for s in specs) / len(specs),
    }
    row |= {"steps": count.steps, "used_blocks": count.used, "needed_blocks": count.needed}
    row |= {"paper_saved": paper_saved(workload, mode, width, block_size), "seconds": time.perf_counter() - start}
    return row


def paper_saved(workload: str, mode: str, width: int, block_size: int) -> float | None:
    """The paper's value for this configuration, if it reports one (it used blocks of 16)."""
    return PAPER_SAVED.get((workload, mode, width)) if block_size == BLOCK_SIZE else None


def sharing_rows(
    workload: str,
    stream: Stream,
    corpus_ids: list[int],
    widths=WIDTHS,
    modes=MODES,
    block_size: int = BLOCK_SIZE,
    max_num_seqs: int = MAX_NUM_SEQS,
    seed: int = SEED,
) -> list[dict]:
    """Every mode and width on one seeded stream of `workload` (the same lengths and prompts for all)."""
    specs = sample_requests(workload, stream.num_requests, seed=seed, max_model_len=stream.max_model_len)
    prompts = corpus_prompts(specs, corpus_ids, seed=seed)
    options = {"max_model_len": stream.max_model_len, "block_size": block_size, "max_num_seqs": max_num_seqs}
    return [sharing_row(m, w, workload, specs, prompts, seed=seed, **options) for m in modes for w in widths]


def measure_sharing(console, streams: dict[str, Stream] | None = None, widths=WIDTHS, block_size: int = BLOCK_SIZE,
                    max_num_seqs: int = MAX_NUM_SEQS, seed: int = SEED) -> list[dict]:  # fmt: skip
    """Both workloads' streams, every mode and width: the bench's rows."""
    corpus_ids, rows = corpus_token_ids(), []
    for workload, stream in (streams or STREAMS).items():
        console.print(
            f"[dim]sharing: {workload}, {stream.num_requests} requests, max_model_len {stream.max_model_len} …[/dim]"
        )
        rows += sharing_rows(workload, stream, corpus_ids, widths, MODES, block_size, max_num_seqs, seed)
    return rows
