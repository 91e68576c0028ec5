"""Stage 5: the vLLM driver: a recorded run replayed through vLLM 0.33.0's own v1 Scheduler, in vLLM's process.

Builds on: nothing of pagedlab (it runs in the environment `pagedlab fetch vllm` made, where pagedlab is not
installed): only the standard library, torch and vLLM's sources. lessons/vllm_peer.py starts it.
Read with: chapters/09-graduate-to-vllm.md.

    stdin   {"runs": [recording, ...]}            a recording: sched/replay.py's format (engine settings, each
                                                   request's prompt, arrival step and the tokens it sampled)
    stdout  {"vllm": "0.33.0", "runs": [{"steps": [step, ...], "error": null}, ...]}

One process replays every run: importing vLLM takes most of a minute, a run a fraction of a second. Per
step it calls `Scheduler.schedule()`, feeds back a hand-made `ModelRunnerOutput` holding the token each
request sampled at that position in pagedlab's run (as vLLM's own tests/v1/core/test_scheduler.py does),
then `update_from_output`, and writes vLLM's decisions as the steps of pagedlab's trace format
(viz/trace.py, version 1). The model never runs.

Block ids: vLLM's pool always holds block 0 back as the null block; pagedlab's only with a sliding window (or a
hybrid model's groups). Without them the pool is made one block larger and every id is written minus one, so
that equal decisions read as equal ids (chapter 5's ledger). A hybrid recording (`layer_windows`, one entry per
layer) gets one KV cache spec per layer and vLLM's own grouping of them; its tables are written one per group.
vLLM: vllm/v1/core/sched/scheduler.py (Scheduler), vllm/v1/core/kv_cache_manager.py, vllm/v1/core/block_pool.py.
"""

import json
import os
import sys
import tempfile
import traceback

# Run by path, Python puts this folder first on sys.path, where pagedlab's lessons would shadow what vLLM imports
# (its `kernels` package, for one): drop it. The driver needs nothing beside it.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

# Never a GPU here, and nothing vLLM does at import may reach the network.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

FINISH = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}
ENDS = {"stop": RequestStatus.FINISHED_STOPPED, "abort": RequestStatus.FINISHED_ABORTED}
init_none_hash(sha256)


def windowed_model_dir(window: int, into: str) -> str:
    """A config.json of a tiny Mistral with this window: vLLM reads the window from the model's config."""
    config = {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 128, "max_position_embeddings": 4096, "sliding_window": window, "rms_norm_eps": 1e-5,
        "torch_dtype": "float32", "head_dim": 16,
    }  # fmt: skip
    folder = os.path.join(into, f"mistral-window-{window}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def make_scheduler(config: dict, model_dir: str) -> Scheduler:
    """vLLM's Scheduler on pagedlab's settings; every other setting is vLLM 0.33.0's default."""
    window = config.get("sliding_window", 0)
    model_config = ModelConfig(
        model=model_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=config["max_model_len"],
        seed=0, enforce_eager=True,
    )  # fmt: skip
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"],
        max_num_batched_tokens=config["max_num_batched_tokens"],
        max_model_len=config["max_model_len"],
        long_prefill_token_threshold=config["long_prefill_token_threshold"],
        enable_chunked_prefill=True,
        policy=config["scheduling_policy"],
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["enable_prefix_caching"])
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    hybrid = is_hybrid(config)
    num_blocks = config["num_kv_blocks"] + (0 if window or hybrid else 1)  # vLLM's null block is always taken
    if hybrid:  # one spec per layer, grouped by vLLM's own rule (kv_cache_planning.py)
        specs = {f"model.layers.{i}.attn": layer_spec(config["block_size"], w or 0)
                 for i, w in enumerate(config["layer_windows"])}  # fmt: skip
        groups = _get_kv_cache_groups_uniform_page_size(specs)
    else:
        groups = [KVCacheGroupSpec(["layer"], layer_spec(config["block_size"], window))]
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=config["block_size"],
        log_stats=True,
    )


def is_hybrid(config: dict) -> bool:
    """Layers of more than one kind (pagedlab's layer_windows, None for full attention)."""
    return len(set(config.get("layer_windows") or ())) > 1


def layer_spec(block_size: int, window: int):
    """One layer's KV cache spec: a window of that many tokens, or full attention (0). The sizes are dummies."""
    if window:
        return SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                 sliding_window=window)  # fmt: skip
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


def make_request(spec: dict, block_size: int, index: int) -> Request:
    params = SamplingParams(
        max_tokens=spec["max_tokens"], ignore_eos=spec["ignore_eos"], stop_token_ids=list(spec["stop_token_ids"]),
        temperature=0.0,
    )  # fmt: skip
    eos = spec["eos_token_ids"]
    if eos:  # as vLLM's input processor does: the first EOS id stops; others join the stop ids (unless ignored)
        params.update_from_generation_config({"eos_token_id": eos}, eos[0])
    return Request(
        request_id=spec["id"],
        prompt_token_ids=list(spec["prompt_token_ids"]),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(index),  # the order requests were added in (as pagedlab's replay): no two alike
        priority=spec["priority"],
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


class Replay:
    """One recorded run through one Scheduler, step by step."""

    def __init__(self, run: dict, model_dir: str, scratch: str):
        self.config = run["config"]
        window = self.config.get("sliding_window", 0)
        folder = windowed_model_dir(window, scratch) if window else model_dir
        self.scheduler = make_scheduler(self.config, folder)
        self.hybrid = is_hybrid(self.config)
        self.offset = 0 if window or self.hybrid else 1  # vLLM id - offset = pagedlab's id
        self.specs = {r["id"]: r for r in run["requests"]}
        self.order = [r["id"] for r in run["requests"]]
        self.ends = {}  # step -> [(request id, reason)] ended from outside after that step (stop strings, aborts)
        for step, rid, reason in run.get("ends", []):
            self.ends.setdefault(step, []).append((rid, reason))
        self.requests: dict[str, Request] = {}
        self.cached_reported: set[str] = set()
        self.were_preempted: set[str] = set()
        self.hashes: dict = {}

    def run(self, max_steps: int) -> list[dict]:
        """Every step until every request has ended. As in pagedlab's replay (engine/replay.py), a step that
        schedules nothing is no step: the next request to arrive is let in at once."""
        pending = sorted(self.order, key=lambda rid: self.specs[rid]["arrival_step"])  # stable: added order
        steps = []
        for _ in range(max_steps):
            while pending and self.specs[pending[0]]["arrival_step"] <= len(steps) + 1:
                self.add(pending.pop(0))
            if not pending and not self.scheduler.get_num_unfinished_requests():
                return steps
            snapshot = self.step(len(steps) + 1)
            if snapshot is not None:
                steps.append(snapshot)
            elif pending:
                self.add(pending.pop(0))
            else:
                raise RuntimeError(f"nothing can be scheduled after step {len(steps)}")
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")

    def add(self, rid: str) -> None:
        spec = self.specs[rid]
        request = make_request(spec, self.config["block_size"], len(self.requests))
        self.requests[rid] = request
        self.scheduler.add_request(request)

    def step(self, step: int) -> dict | None:
        before = {rid: self.block_ids(rid) for rid in self.requests}
        out = self.scheduler.schedule()
        if not out.num_scheduled_tokens:
            return None
        preempted = sorted(out.preempted_req_ids or ())
        self.were_preempted |= set(preempted)
        snapshot = self.snapshot(step, out, preempted, before)
        runner_output = self.runner_output(out)
        engine_outputs = self.scheduler.update_from_output(out, runner_output)
        finished = {}
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    finished[o.request_id] = str(o.finish_reason)
        for rid, reason in self.ends.get(step, []):  # a stop string ends it in this step; an abort after it
            if rid in self.requests and not self.requests[rid].is_finished():
                self.scheduler.finish_requests(rid, ENDS[reason])
                finished |= {rid: reason} if reason == "stop" else {}
        snapshot["finished"] = finished
        return snapshot

    def runner_output(self, out) -> ModelRunnerOutput:
        """Each request that reached the end of its known tokens samples what it sampled in pagedlab's run."""
        req_ids, sampled = list(out.num_scheduled_tokens), []
        for rid in req_ids:
            request = self.requests[rid]
            done = request.num_computed_tokens >= request.num_tokens  # schedule() has advanced it already
            position = request.num_tokens - request.num_prompt_tokens
            sampled.append([self.specs[rid]["output_token_ids"][position]] if done else [])
        return ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)}, sampled_token_ids=sampled
        )

    def block_ids(self, rid: str) -> list:
        """The request's table (a hybrid model's: one per KV cache group), in pagedlab's ids."""
        groups = len(self.scheduler.kv_cache_config.kv_cache_groups)
        if self.requests[rid].is_finished():
            return [[] for _ in range(groups)] if self.hybrid else []
        tables = [[b - self.offset for b in ids] for ids in self.scheduler.kv_cache_manager.get_block_ids(rid)]
        return tables if self.hybrid else tables[0]

    def snapshot(self, step: int, out, preempted: list[str], before: dict) -> dict:
        """The step in pagedlab's trace format, taken after scheduling (before the update frees anything)."""
        running = [r.request_id for r in self.scheduler.running]
        waiting = [r.request_id for r in self.scheduler.waiting]
        scheduled = dict(out.num_scheduled_tokens)
        tables = {rid: self.block_ids(rid) for rid in running}
        pool = self.scheduler.kv_cache_manager.block_pool
        return {
            "step": step,
            "time": float(step),
            "scheduled": scheduled,
            "prefills": [rid for rid, n in scheduled.items() if self.was_prefill(rid, n)],
            "waiting": waiting,
            "running": running,
            "preempted": preempted,
            "swapped": [],
            "were_preempted": [rid for rid in waiting if rid in self.were_preempted],
            "tables": tables,
            "used": {rid: self.requests[rid].num_computed_tokens for rid in running},
            **{"groups": {}, "copies": [], "swap_out": [], "swap_in": [], "events": []},
            "num_used_blocks": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),  # the null block is nobody's
            "pool": self.pool(),
            "num_cached_tokens": self.cached_tokens(scheduled),
            "new_blocks": {
                rid: self.new_blocks(before.get(rid), t) for rid, t in tables.items() if t != before.get(rid)
            },
        }

    def new_blocks(self, before: list | None, now: list) -> list:
        """The entries appended to a table since the step before (per group for a hybrid model)."""
        if not self.hybrid:
            return now[len(before or []) :]
        return [t[len(b) :] for b, t in zip(before or [[] for _ in now], now)]

    def was_prefill(self, rid: str, num_new: int) -> bool:
        """Fed more than the one last token (schedule() has already counted them as computed)."""
        request = self.requests[rid]
        return request.num_computed_tokens - num_new < request.num_tokens - 1

    def cached_tokens(self, scheduled: dict) -> dict:
        """Prompt tokens the prefix cache served each request at its first scheduling (vLLM's PrefillStats)."""
        cached = {}
        for rid in scheduled:
            stats = self.requests[rid].prefill_stats  # set at the first scheduling, taken by the update
            if rid not in self.cached_reported and stats is not None and stats.num_prompt_tokens:
                cached[rid] = stats.num_cached_tokens
                self.cached_reported.add(rid)
        return cached

    def pool(self) -> dict:
        bp = self.scheduler.kv_cache_manager.block_pool
        free = [b.block_id - self.offset for b in bp.free_block_queue.get_all_free_blocks()]
        blocks = bp.blocks[self.offset :]
        names = []
        for b in blocks:
            h = b.block_hash
            names.append(None if h is None else self.hashes.setdefault(h, len(self.hashes)))
        return {"free": free, "ref": [b.ref_cnt for b in blocks], "hash": names}


def main() -> None:
    job = json.load(sys.stdin)
    results = []
    with tempfile.TemporaryDirectory(prefix="pagedlab-vllm-") as scratch:
        for run in job["runs"]:
            try:
                replay = Replay(run, job["model_dir"], scratch)
                results.append({"steps": replay.run(job.get("max_steps", 10_000)), "error": None})
            except Exception as e:  # one bad run must not hide the others' results
                results.append({"steps": [], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    json.dump({"vllm": "0.33.0", "runs": results}, sys.stdout)


if __name__ == "__main__":
    main()
