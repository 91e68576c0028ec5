"""Course: each stage's written problems: short questions with points, graded by hand (the answer key is in
chapters/98-assignments.md, which no student copy holds).

Builds on: nothing.
Read with: chapters/98-assignments.md (Written problems: answer key).

As CS336's and CMU 11-868's hand-outs do, each stage asks a few questions whose
answers are numbers or one paragraph: they check that the reader can predict
what the code they wrote will do, and say why it is built that way.
"""

from __future__ import annotations

from dataclasses import dataclass

DELIVERABLE = (
    "Deliverable: `written.md` in the top folder of your workspace, one section per problem, headed by its id "
    "(for example `## w2-slot`); show the numbers you computed, and keep each answer under 150 words."
)


@dataclass(frozen=True)
class Problem:
    """One written question."""

    id: str  # "w2-slot": the heading of its answer, and of its key in chapter 98
    points: int
    question: str


WRITTEN: dict[int, tuple[Problem, ...]] = {
    1: (
        Problem("w1-waste", 5, "A contiguous cache reserves ceil(max_model_len / block_size) blocks per request. With "
                "max_model_len 2048 and block_size 16, a request has a 100-token prompt and stops after 50 output "
                "tokens. How many KV slots does it reserve, how many ever hold K/V, and what fraction is that?"),
        Problem("w1-static", 5, "max_num_seqs is 2. A (10-token prompt, 2 output tokens) and B (10-token prompt, 20 "
                "output tokens) arrive before step 1, C (2 output tokens) just after. In which step does C first "
                "run, and for how many steps does A's seat sit empty?"),
        Problem("w1-worst-case", 5, "Static admission reserves room for prompt + max_tokens, not for the tokens a "
                "request will actually produce. Why? Say exactly what would go wrong mid-batch otherwise."),
    ),
    2: (
        Problem("w2-fragmentation", 5, "With block_size 16, what is the most KV memory one request can leave unused, "
                "and how many slots does the request of w1-waste (100 + 50 tokens) waste here, against stage 1?"),
        Problem("w2-slot", 5, "A request's block table is [7, 3, 9] and block_size is 4. Which slot holds the K/V of "
                "position 6? Which position's K/V is in slot 37?"),
        Problem("w2-free-queue", 5, "Why is the free queue a doubly linked list threaded through the blocks rather "
                "than a deque? Name the operation that needs it and the stage that uses it."),
    ),
    3: (
        Problem("w3-shared", 5, "A request has a 37-token prompt, n = 4, block_size 16. After the leader's shared "
                "prefill and the fork, how many blocks do the four children share? Each child then writes its first "
                "token: how many block copies does that step make, and why not four?"),
        Problem("w3-worst-case", 5, "Compute CowKVCacheManager.worst_case_blocks for that group with max_tokens 10, "
                "and compare it with four unshared requests. Explain each term of shared + k * (max_blocks - shared)."),
        Problem("w3-beam", 5, "In a beam-search step, a beam chosen twice forks and a beam never chosen is freed. "
                "What does a fork cost in blocks and copies, against copying the beam's tokens into a new request?"),
    ),
    4: (
        Problem("w4-chain", 5, "Why does a block's hash fold in its parent's hash? Give two blocks with identical "
                "tokens that must not share K/V, and say what equal hashes guarantee."),
        Problem("w4-last-token", 5, "A prompt of 32 tokens is fully cached with block_size 16. How many tokens does "
                "the lookup serve from the cache, how many are computed, and why can it not serve all 32?"),
        Problem("w4-salt", 5, "What does cache_salt protect against, and why is it folded into block 0 only?"),
    ),
    5: (
        Problem("w5-budget", 5, "max_num_batched_tokens is 8. A (5-token prompt) and B (10-token prompt) wait before "
                "step 1, each wanting 3 output tokens. How many tokens does each get in steps 1, 2 and 3?"),
        Problem("w5-victim", 5, "Under FCFS, why is the victim the request admitted last rather than the one that "
                "cannot get a block, and why is nobody admitted in a step that preempted?"),
        Problem("w5-swap", 5, "When is preemption by recompute cheaper than by swap? Use the prefix cache in your "
                "answer, and say what vLLM v1 chose."),
    ),
    6: (
        Problem("w6-online-softmax", 5, "The decode tile keeps (m, l, acc) and rescales them by exp(m_old - m_new). "
                "Why is that exact, and why not first compute every score of the context?"),
        Problem("w6-v2", 5, "When does the launcher pick V2, and what does the reduce kernel combine from each "
                "partition? Why would 4 requests with 8 heads and 6000-token contexts want V2?"),
        Problem("w6-bytes", 5, "One decode step of one request, context 4096, 8 KV heads, head dim 128, fp16: how many "
                "bytes of K and V does one layer read? Why does that make decode memory-bound?"),
    ),
}  # fmt: skip


def handout_section(stage: int) -> list[str]:
    """The hand-out's written part: the total, each problem with its points, the deliverable."""
    problems = WRITTEN[stage]
    total = sum(p.points for p in problems)
    lines = [f"## Written problems ({total} points, graded by hand)", ""]
    lines += [f"{i}. **`{p.id}`** ({p.points} points). {p.question}" for i, p in enumerate(problems, 1)]
    return [*lines, "", DELIVERABLE, ""]
