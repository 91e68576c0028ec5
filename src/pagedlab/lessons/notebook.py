"""Stage 2: what the notebooks share: their knobs, and the "your turn" reruns that redraw a notebook's pictures.

Builds on: llm.py, viz/ (the drawings), viz/graphs.py (block sharing and hash chains).
Read with: notebooks/README.md, chapters/98-assignments.md (Prediction points).

Every notebook from 02 on starts from one cell of knobs and ends with a cell that changes them:

    K = knobs("02", block_size=4, num_kv_blocks=12)        the walk-through's settings (a test sets others through
                                                           PAGEDLAB_KNOBS='{"02": {"block_size": 8}}')
    ...every cell below computes what it says from the engine, so it holds for any knobs...
    your_turn("02", block_size=8, num_kv_blocks=20)        your turn: the same run with other knobs, redrawn,
                                                           with the same summary

A notebook's runs use other prompts than its chapter's walk-through, so that reading the chapter first does not
give the notebook's predictions away.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from pagedlab.sampling_params import SamplingParams

KNOBS_VARIABLE = "PAGEDLAB_KNOBS"  # JSON: {"02": {"block_size": 8, ...}, "05": {...}}, for tests and for you


def knobs(notebook: str, **defaults) -> dict:
    """The notebook's settings: `defaults`, overridden by PAGEDLAB_KNOBS[notebook] where it names one. Printed."""
    chosen = json.loads(os.environ.get(KNOBS_VARIABLE) or "{}").get(notebook, {})
    unknown = set(chosen) - set(defaults)
    if unknown:
        raise ValueError(
            f"{KNOBS_VARIABLE}: notebook {notebook} has no knob {sorted(unknown)}; its knobs: {sorted(defaults)}"
        )
    settings = {**defaults, **chosen}
    print("knobs:", ", ".join(f"{k}={v!r}" for k, v in settings.items()))
    return settings


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy, and every request makes exactly max_tokens tokens: the same steps on every machine."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# --- the notebooks' runs ----------------------------------------------------------------------------------------

# The Tempest's speakers: the chapters walk Romeo and Juliet's, so the notebooks' answers are theirs alone.
NB02_REQUESTS = {"A": ("MIRANDA:", 5), "B": ("ARIEL:", 3), "C": ("CALIBAN:", 6), "D": ("SEBASTIAN:", 4),
                 "E": ("FERDINAND:", 2)}  # fmt: skip
NB03_PROMPT = "STEPHANO:"  # 10 tokens with <bos>: the leader's prefill ends inside a block of 4
NB03_BEAM_PROMPT = "ARIEL:\nAll hail"
NB04_PREFIX = "PROSPERO:\nNow does "
NB04_SUFFIXES = {"A": "my p", "B": "my o", "C": "my p"}  # C is A again
NB05_PROMPTS = (
    "MIRANDA:\nIf by your art, my",
    "ARIEL:",
    "CALIBAN:\nThis island's",
    "Boatswain:",
    "PROSPERO:\nOur revels",
    "GONZALO:",
)
NB05_MAX_TOKENS = (18, 26, 16, 22, 12, 20)


def your_turn(notebook: str, **settings):
    """Rerun notebook `notebook`'s walk-through with these settings: the same pictures and the same summary."""
    if notebook not in RERUNS:
        raise ValueError(f"your_turn: no rerun for notebook {notebook!r}; there is one for {sorted(RERUNS)}")
    return RERUNS[notebook](**settings)


def rerun_02(block_size: int = 4, num_kv_blocks: int = 12, max_num_seqs: int = 8):
    from pagedlab import LLM, viz

    llm = LLM(stage="paged", block_size=block_size, num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs,
              record_trace=True)  # fmt: skip
    for rid, (prompt, n) in NB02_REQUESTS.items():
        llm.engine.add_request(rid, prompt, greedy(n))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    trace = llm.engine.trace
    print(f"{len(trace)} steps; at most {max(len(t.running) for t in trace)} requests at once; peak "
          f"{llm.engine.stats.peak_kv_blocks_used} of {num_kv_blocks} blocks held; "
          f"{viz.used_share(trace):.0%} of held slots hold a token")  # fmt: skip
    viz.plot_block_tables(trace[0], num_kv_blocks, block_size, pool_columns=4)  # after step 1
    viz.plot_pool_occupancy(trace, num_kv_blocks)
    return llm


def rerun_03(block_size: int = 4, num_kv_blocks: int = 16, n: int = 3, max_tokens: int = 6):
    from pagedlab import LLM
    from pagedlab.viz import graphs

    llm = LLM(stage="cow", block_size=block_size, num_kv_blocks=num_kv_blocks, max_num_seqs=8, record_trace=True)
    params = SamplingParams(n=n, temperature=1.0, seed=7, max_tokens=max_tokens, ignore_eos=True)
    llm.engine.add_request("A", NB03_PROMPT, params)
    for _ in range(2):
        llm.engine.step()
    kv, tables = llm.engine.kv_manager, graphs.live_tables(llm.engine)[0]
    entries, held = kv.num_table_blocks(), kv.num_used_blocks
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    print(
        f"after step 2: {n} children hold {entries} table entries in {held} blocks ({entries - held} saved by "
        f"sharing); {llm.engine.stats.num_steps} steps in all"
    )
    return graphs.block_sharing_graph(tables, title=f"after step 2: the {n} children of {NB03_PROMPT!r}")


def rerun_04(block_size: int = 4, num_kv_blocks: int = 10, enable_prefix_caching: bool = True):
    from pagedlab import LLM
    from pagedlab.viz import graphs

    llm = LLM(stage="prefix", block_size=block_size, num_kv_blocks=num_kv_blocks, max_num_seqs=1,
              enable_prefix_caching=enable_prefix_caching, record_trace=True)  # fmt: skip
    requests = {}
    for rid, suffix in NB04_SUFFIXES.items():
        llm.engine.add_request(rid, NB04_PREFIX + suffix, greedy(2))
        (requests[rid],) = llm.engine.scheduler.requests.live[rid]
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    stats = llm.engine.stats
    print(
        f"prefix cache: {stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens hit "
        f"({stats.prefix_cache_hit_rate:.0%}) with blocks of {block_size}"
    )
    decode = llm.get_tokenizer().decode
    return graphs.hash_chain_tree(requests, llm.engine.kv_manager, decode, title="after A, B and C")


def rerun_05(
    block_size: int = 4,
    num_kv_blocks: int = 24,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 16,
    long_prefill_token_threshold: int = 6,
    scheduling_policy: str = "fcfs",
    preemption_mode: str = "recompute",
    num_swap_blocks: int = 0,
    enable_prefix_caching: bool = True,
):
    from pagedlab import LLM, viz

    swap = num_swap_blocks or (16 if preemption_mode == "swap" else 0)
    llm = LLM(stage="continuous", block_size=block_size, num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=max_num_batched_tokens, long_prefill_token_threshold=long_prefill_token_threshold,
              scheduling_policy=scheduling_policy, preemption_mode=preemption_mode, num_swap_blocks=swap,
              enable_prefix_caching=enable_prefix_caching, record_trace=True)  # fmt: skip
    outs = llm.generate(list(NB05_PROMPTS), [greedy(n) for n in NB05_MAX_TOKENS], use_tqdm=False)
    trace = llm.engine.trace
    print(
        f"{len(trace)} steps, {llm.engine.stats.num_preemptions} preemptions {viz.preemption_events(trace)}; "
        f"{llm.engine.stats.num_generated_tokens} tokens"
    )
    viz.plot_schedule_gantt(trace, viz.prompt_lens_of(outs), preemption_mode)
    viz.plot_tokens_per_step(trace, max_num_batched_tokens, viz.prompt_lens_of(outs))
    viz.plot_kv_over_steps(trace, num_kv_blocks, block_size, mark_preemptions=True)
    return llm


RERUNS: dict[str, Callable] = {"02": rerun_02, "03": rerun_03, "04": rerun_04, "05": rerun_05}


def rerun_06(block_size: int = 16, partition_size: int = 16, seq_lens=(37, 16, 5), num_heads: int = 4,
             num_kv_heads: int = 2, head_dim: int = 32):  # fmt: skip
    """Notebook 06's decode step with other shapes: V1 and V2 against torch, and the picture of its programs."""
    import torch

    from pagedlab.attention.triton.decode import paged_decode
    from pagedlab.lessons.kernel_cases import HeadShape, make_case, reference
    from pagedlab.lessons.kernels import kernel_device, launch_plan
    from pagedlab.viz.kernels import draw_decode_programs

    device, seq_lens = kernel_device(), list(seq_lens)
    shape = HeadShape(num_heads, num_kv_heads, head_dim, block_size, partition_size)
    case = make_case(len(seq_lens), max(seq_lens), shape, torch.float32, device)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator(device=device).manual_seed(1),
                    device=device)  # fmt: skip
    lens, rows = torch.tensor(seq_lens, device=device), torch.arange(len(seq_lens), device=device)
    want = reference(case, q, 1, seq_lens)
    for version in ("v1", "v2"):
        out = torch.empty_like(q)
        paged_decode(out, q, case.k_cache, case.v_cache, case.block_table, lens, rows, rows, head_dim**-0.5,
                     max_seq_len=max(seq_lens), partition_size=partition_size, version=version)  # fmt: skip
        print(f"{version}: max |err| vs torch {(out - want).abs().max().item():.1e}")
    plan = launch_plan(case, seq_lens, partition_size)
    print(f"V1 grid {plan.v1.grid}, V2 grid {plan.v2.grid}; the launcher picks {'v1' if plan.picks_v1 else 'v2'}")
    return draw_decode_programs(plan)


RERUNS["06"] = rerun_06
