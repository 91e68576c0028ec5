"""Benchmarks: `pagedlab bench scheduler --peer vllm`, the same timed loop on vLLM 0.33.0's own Scheduler.

Builds on: lessons/vllm_driver.py (the Scheduler built on pagedlab's settings), loaded by path: this script runs
in the environment `pagedlab fetch vllm` made, where pagedlab is not installed, and is started by
bench/scheduler.py (never imported into pagedlab's process).
Read with: chapters/97-architecture.md (Benchmarks), chapters/09-graduate-to-vllm.md.

    stdin   one job per line: {"running": N, "steps": 64, "prompt_len": 32, "block_size": 16, "model_dir": "..."}
    stdout  one answer per line: {"running": N, "schedule_ns": [...], "update_ns": [...]}, after a first line
            {"ready": "0.33.0"} once vLLM is imported

so the bench can take turns, pagedlab and vLLM at one size after another, while vLLM's import (most of a
minute) is paid once.

For each N it does what bench/scheduler.py does to pagedlab's stage 5: N requests with distinct prompts, a pool
and a budget that never bind, one untimed prefill step, then `steps` decode steps, each timed as
`schedule()` and `update_from_output()` around a hand-made ModelRunnerOutput in which every request samples the
same token (vLLM's own tests drive the Scheduler this way). The model never runs.
"""

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

# Run by path, Python puts this folder first on sys.path, where pagedlab's bench modules would shadow what vLLM
# imports: drop it. The driver is loaded from its file, never through sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)
_spec = importlib.util.spec_from_file_location("vllm_driver", Path(__file__).parents[1] / "lessons" / "vllm_driver.py")
vllm_driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_driver)  # sets vLLM's environment (CPU, offline, quiet) and imports it

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

SAMPLED_TOKEN = 7  # what the fake model samples, as bench/scheduler.py's


def config_for(num_running: int, steps: int, prompt_len: int, block_size: int) -> dict:
    """bench/scheduler.py's engine settings for N requests: nothing is preempted, nothing finishes."""
    max_len = prompt_len + steps + 2
    return {
        "max_model_len": max_len, "max_num_seqs": num_running, "max_num_batched_tokens": num_running * prompt_len,
        "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs", "block_size": block_size,
        "enable_prefix_caching": True, "num_kv_blocks": num_running * -(-max_len // block_size),
    }  # fmt: skip


def fake_output(out) -> ModelRunnerOutput:
    """Every scheduled request samples SAMPLED_TOKEN (each has fed all its known tokens in these runs)."""
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[SAMPLED_TOKEN] for _ in req_ids],
    )


def time_decode_steps(num_running: int, steps: int, prompt_len: int, block_size: int, model_dir: str) -> dict:
    scheduler = vllm_driver.make_scheduler(config_for(num_running, steps, prompt_len, block_size), model_dir)
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True, temperature=0.0)
    for i in range(num_running):
        prompt = list(range(i * prompt_len + 2, (i + 1) * prompt_len + 2))
        hasher = get_request_block_hasher(block_size, sha256)
        request = Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                          arrival_time=float(i), block_hasher=hasher)  # fmt: skip
        scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.update_from_output(out, fake_output(out))
    if len(scheduler.running) != num_running:  # not assert: `python -O` would drop it
        raise RuntimeError(f"the prefill step admitted {len(scheduler.running)} of {num_running} requests")
    schedule_ns, update_ns = [], []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        out = scheduler.schedule()
        t1 = time.perf_counter_ns()
        sampled = fake_output(out)
        t2 = time.perf_counter_ns()
        scheduler.update_from_output(out, sampled)
        t3 = time.perf_counter_ns()
        if list(out.num_scheduled_tokens.values()) != [1] * num_running:
            raise RuntimeError("a timed step was not one decode token for each running request")
        schedule_ns.append(t1 - t0)
        update_ns.append(t3 - t2)
    return {"running": num_running, "schedule_ns": schedule_ns, "update_ns": update_ns}


def main() -> None:
    print(json.dumps({"ready": "0.33.0", "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        row = time_decode_steps(job["running"], job["steps"], job["prompt_len"], job["block_size"], job["model_dir"])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
