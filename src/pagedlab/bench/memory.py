"""Benchmarks: `pagedlab bench memory`, the vLLM paper's Figure 2 at our scale (where does KV memory go?).

Builds on: bench/kv_spaces.py (first-fit regions, and the stage-2 manager used as is), request.py, bench/workloads.py.
Read with: chapters/97-architecture.md (Benchmarks), chapters/02-paged-blocks.md.

Tables and figure: bench/memory_report.py.

A fake model (no forward pass, no torch) runs a saturated stream of requests
over a fixed pool of KV slots. Every step, each running request computes its
next token (its first step computes the whole prompt), and each slot of the
pool is counted as exactly one of:

    request with final length 10, 6 tokens computed, holding 12 slots:
    | T T T T T T | R R R R | I I |       T token state           (holds a computed token)
                                          R reservation           (held for a token still to come)
                                          I internal fragmentation (held beyond the final length)
    slots nobody holds                    E external fragmentation & other

A request's final length is prompt + output tokens, all counted as token states
once computed. All requests are queued at t=0 and the batch is re-formed every
step (continuous batching, FCFS); only steps with requests still waiting are
measured, so the pool is always under pressure. Contiguous systems reserve a
region at admission (first fit); paged allocates blocks on demand and, when a
running request finds no free block, preempts the newest request (recompute:
it keeps its tokens, frees its blocks and goes back to the front of waiting).

The paper (Kwon et al., SOSP 2023, Fig. 2) measured 20.4 / 26.8 / 38.2 % token
states for Orca Max / Pow2 / Oracle, which reserve one contiguous region per
request, against 96.3 % for vLLM, which allocates blocks on demand.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pagedlab.bench.kv_spaces import SYSTEMS, KVSpace, make_space
from pagedlab.bench.workloads import RequestSpec, sample_requests
from pagedlab.errors import InvariantError, check
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import SamplingParams

PAPER_TOKEN_STATES = {"contiguous-max": 0.204, "contiguous-pow2": 0.268, "contiguous-oracle": 0.382, "paged": 0.963}
PAPER_BLOCK_SIZE = 16  # vLLM's default, the block size of the paper's 96.3 %
# Fig. 2 does not name its dataset, but it must be ShareGPT: an Alpaca request (~80 tokens) fills 4 % of a Max region.
PAPER_WORKLOAD = "sharegpt"
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
# Enough requests that the measured (saturated) steps far outnumber the start-up steps.
NUM_REQUESTS = {"sharegpt": 600, "alpaca": 2500}
SHARES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation")


@dataclass(frozen=True, slots=True)
class StepCounts:
    """One measured step: every slot of the pool in exactly one class (the four add up to the pool)."""

    token_states: int  # slots holding a computed token's K/V
    reservation: int  # slots held for tokens their request will still compute
    internal_fragmentation: int  # slots held beyond their request's final length
    external_fragmentation: int  # slots no request holds
    batched_requests: int  # requests running this step


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one simulated system did with one request stream."""

    steps: list[StepCounts]  # the measured steps: those with requests still waiting (the pool saturated)
    num_preemptions: int  # running requests sent back to waiting (paged only)
    num_finished: int  # requests that finished before the waiting queue emptied


def make_request(index: int, spec: RequestSpec) -> Request:
    params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
    return Request(f"r{index}", [0] * spec.prompt_len, params, max_tokens=spec.output_len)


def simulate(space: KVSpace, specs: list[RequestSpec]) -> SimResult:
    """Run all of `specs` (queued at t=0) with continuous batching until the waiting queue empties."""
    waiting, running = deque(make_request(i, s) for i, s in enumerate(specs)), []
    steps, num_preemptions, num_finished = [], 0, 0
    while waiting:
        preempted = _schedule_running(space, running, waiting)
        num_preemptions += preempted
        if not preempted:  # as vLLM v1: no admission in a step that had to preempt
            _schedule_waiting(space, running, waiting)
        if not running:
            raise InvariantError(f"{waiting[0].request_id} can never fit in {space.pool_slots} slots")
        for request in running:  # the fake forward pass: every scheduled token gets its K/V
            request.num_computed_tokens = request.num_tokens
        if waiting:
            steps.append(classify(space, running))
        num_finished += _update(space, running)
    return SimResult(steps, num_preemptions, num_finished)


def _schedule_running(space: KVSpace, running: list[Request], waiting: deque[Request]) -> int:
    """Room for each running request's next token, oldest first; when short, preempt the newest. Returns how many."""
    num_preempted, i = 0, 0
    while i < len(running):
        request = running[i]
        if space.allocate_slots(request, request.num_tokens - request.num_computed_tokens) is not None:
            i += 1
            continue
        victim = running.pop()  # the newest; may be `request` itself, which ends the loop
        space.free(victim)
        victim.num_computed_tokens, victim.status = 0, RequestStatus.PREEMPTED  # recompute: keep its tokens
        waiting.appendleft(victim)
        num_preempted += 1
    return num_preempted


def _schedule_waiting(space: KVSpace, running: list[Request], waiting: deque[Request]) -> None:
    """Admit FCFS while the head's tokens fit; the first that does not blocks the queue (head of line)."""
    while waiting and space.allocate_slots(waiting[0], waiting[0].num_tokens) is not None:
        request = waiting.popleft()
        request.status = RequestStatus.RUNNING
        running.append(request)


def _update(space: KVSpace, running: list[Request]) -> int:
    """Free the requests that reached their final length; the others sample their next token. Returns how many."""
    still_running = []
    for request in running:
        if request.num_computed_tokens == request.max_num_tokens:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            space.free(request)
        else:
            request.append_output_token(0, 0.0)
            still_running.append(request)
    num_finished = len(running) - len(still_running)
    running[:] = still_running
    return num_finished


def classify(space: KVSpace, running: list[Request]) -> StepCounts:
    """Count every slot of the pool as token state, reservation, internal or external fragmentation."""
    tokens = reserved = internal = 0
    for request in running:
        held, computed, final = space.slots_held(request), request.num_computed_tokens, request.max_num_tokens
        if computed > held:
            raise InvariantError(f"{request.request_id} computed {computed} tokens into {held} slots")
        tokens += computed
        reserved += min(held, final) - computed
        internal += max(0, held - final)
    external = space.num_free_slots
    check(tokens + reserved + internal + external == space.pool_slots, "a slot is counted twice or leaked")
    return StepCounts(tokens, reserved, internal, external, len(running))


def memory_row(
    system: str, block_size: int | None, workload: str, specs: list[RequestSpec], result: SimResult, pool_slots: int
) -> dict:
    """One flat row of the bench's JSON (the row fields of chapters/97-architecture.md first, then extras)."""
    n = len(result.steps)
    if not n:
        raise InvariantError(f"{system} on {workload}: no measured step (use more requests or a smaller pool)")
    row = {"system": system, "block_size": block_size, "workload": workload, "num_requests": len(specs)}
    for share in SHARES:
        row[share] = sum(getattr(s, share) for s in result.steps) / (n * pool_slots)
    row["mean_batched_requests"] = sum(s.batched_requests for s in result.steps) / n
    paper = paper_token_states(system, block_size, workload)
    row |= {"pool_slots": pool_slots, "steps": n, "preemptions": result.num_preemptions, "paper_token_states": paper}
    return row


def paper_token_states(system: str, block_size: int | None, workload: str) -> float | None:
    """The paper's Fig. 2 value for this configuration, if it measured one."""
    measured = workload == PAPER_WORKLOAD and block_size in (None, PAPER_BLOCK_SIZE)
    return PAPER_TOKEN_STATES[system] if measured else None


def memory_rows(
    workload: str,
    num_requests: int,
    pool_slots: int = 16384,
    block_sizes=BLOCK_SIZES,
    seed: int = 0,
    max_model_len: int = 2048,
) -> list[dict]:
    """Every system (and every block size of paged) on one seeded stream of `workload`."""
    specs = sample_requests(workload, num_requests, seed=seed, max_model_len=max_model_len)
    configs = [(s, None) for s in SYSTEMS[:3]] + [("paged", b) for b in block_sizes]
    rows = []
    for system, block_size in configs:
        space = make_space(system, pool_slots, max_model_len, block_size)
        rows.append(memory_row(system, block_size, workload, specs, simulate(space, specs), pool_slots))
    return rows


def batch_gain(rows: list[dict], workload: str) -> float | None:
    """Mean batch of paged (block 16) ÷ that of contiguous-max, at equal KV memory."""
    batch = {(r["system"], r["block_size"]): r["mean_batched_requests"] for r in rows if r["workload"] == workload}
    paged, maximum = batch.get(("paged", PAPER_BLOCK_SIZE)), batch.get(("contiguous-max", None))
    return paged / maximum if paged and maximum else None


def measure_memory(console, pool_slots: int = 16384, num_requests: dict[str, int] | None = None,
                   block_sizes=BLOCK_SIZES, seed: int = 0, layouts: bool = False) -> list[dict]:  # fmt: skip
    """Every system on both workloads' saturated streams: the bench's rows; with `layouts` (--layouts), also the
    KV bytes a hybrid model's layouts hold for the same requests (layout_rows)."""
    rows = []
    for workload, n in (num_requests or NUM_REQUESTS).items():
        console.print(f"[dim]memory: {workload}, {n} requests, {pool_slots} slots …[/dim]")
        rows += memory_rows(workload, n, pool_slots, block_sizes, seed)
    if layouts:
        console.print("[dim]memory: hybrid layouts, 40 long requests through the KV managers …[/dim]")
        rows += layout_rows()
    return rows


def layout_rows() -> list[dict]:
    """KV bytes held at their peaks by the same 40 long requests under three layouts of two hybrid model shapes
    (lessons/hybrid.py: full-only, vLLM's KV cache groups through the coordinator, window-only). Rows of their own
    kind, `system` "kv-layout", with the memory rows' fields that do not apply null."""
    from pagedlab.lessons.hybrid import BLOCK_SIZE, saving_rows
    from pagedlab.lessons.hybrid import NUM_REQUESTS as LAYOUT_REQUESTS

    na = dict.fromkeys(("token_states", "reservation", "internal_fragmentation", "external_fragmentation",
                        "mean_batched_requests", "paper_token_states"))  # fmt: skip
    return [
        {"system": "kv-layout", "block_size": BLOCK_SIZE, "workload": "long-context", "num_requests": LAYOUT_REQUESTS,
         **na, "model": r["model"], "layout": r["layout"], "groups": r["groups"], "kv_bytes": round(r["gib"] * 2**30),
         "share_of_full": r["share_of_full"]}
        for r in saving_rows()
    ]  # fmt: skip
