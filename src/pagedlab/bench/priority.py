"""Stage 5: latency by priority class, the table `pagedlab bench throughput` prints after its rows.

Builds on: bench/throughput.py (the stream and the pool), sched/queue.py (the priority heap).
Read with: chapters/05-continuous-batching.md.

The same stream is served twice on the stage-5 engine with a pool that binds
the batch: FCFS, then `scheduling_policy="priority"` with request i in class
i % 3 (0 = most urgent). Priority reorders admission (lowest value first) and
picks preemption victims from the least urgent, so class 0 should see shorter
time to first token and normalized latency than under FCFS, at class 2's cost.
"""

from __future__ import annotations

from pagedlab.bench.common import torch_threads
from pagedlab.bench.throughput import TORCH_THREADS, make_stream, pool_blocks
from pagedlab.sampling_params import SamplingParams

NUM_CLASSES = 3


def priority_latencies(stream, num_kv_blocks: int, max_num_seqs: int, block_size: int) -> list[dict]:
    """One dict per (policy, class): mean TTFT and mean normalized latency (s per output token)."""
    from pagedlab.llm import LLM

    classes = [i % NUM_CLASSES for i in range(len(stream))]
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in stream]
    prompts = [list(r.prompt_token_ids) for r in stream]
    out = []
    for policy in ("fcfs", "priority"):
        llm = LLM(
            stage="continuous",
            num_kv_blocks=num_kv_blocks,
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            scheduling_policy=policy,
        )
        done = llm.generate(prompts, params, priority=classes if policy == "priority" else None, use_tqdm=False)
        for c in range(NUM_CLASSES):
            mine = [(o, r) for o, r, k in zip(done, stream, classes) if k == c]
            ttft = [o.metrics["first_token_time"] - o.metrics["arrival_time"] for o, _ in mine]
            norm = [(o.metrics["finished_time"] - o.metrics["arrival_time"]) / r.max_tokens for o, r in mine]
            out.append(
                {
                    "policy": policy,
                    "priority": c,
                    "num_requests": len(mine),
                    "ttft_s": sum(ttft) / len(ttft),
                    "normalized_latency_s": sum(norm) / len(norm),
                    "preemptions": llm.engine.stats.num_preemptions,
                }
            )
    return out


def priority_table(rows: list[dict]):
    from rich.table import Table

    table = Table(
        title="Latency by priority class (stage 5, same stream and pool; class = request index % 3)",
        padding=(0, 1),
        show_edge=False,
    )
    for col in ("policy", "class", "requests", "TTFT s", "ms / token", "preemptions (run)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["policy"],
            str(r["priority"]),
            str(r["num_requests"]),
            f"{r['ttft_s']:.2f}",
            f"{1000 * r['normalized_latency_s']:.0f}",
            str(r["preemptions"]),
        )
    return table


def priority_section(row: dict):
    """Latency by priority class on the same stream and pool as the `continuous` row (one thread)."""
    from pagedlab.llm import LLM

    with torch_threads(TORCH_THREADS):
        tok = LLM(stage="continuous").get_tokenizer()
        stream = make_stream(tok, row["num_requests"], row["length_scale"], row["seed"])
        blocks = pool_blocks(stream, row["max_num_seqs"], row["block_size"])
        return priority_table(priority_latencies(stream, blocks, row["max_num_seqs"], row["block_size"]))
