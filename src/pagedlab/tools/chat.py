"""`pagedlab chat`: talk to a real model, and see under each answer where its KV went.

Builds on: llm.py (LLM, the chat template), engine/engine.py (step by step, for streaming).
Read with: chapters/07-real-model.md.

Each turn renders the whole conversation with the model's chat template and sends it as one new
request, as any OpenAI-style server does: the model keeps no state between turns. What makes the
second turn cheap is the prefix cache (stage 4+): the conversation so far is the prefix of the new
prompt, so its full blocks are found by hash and not computed again. Under each answer:

    blocks 0-3 · 59 prompt + 8 answer tokens in 5 blocks of 16 (KV 67/80 slots)
    prefix cache: 32 of 59 prompt tokens not recomputed (blocks 0-1, from turn 1)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pagedlab.engine.events import block_list
from pagedlab.kv.hybrid import one_table
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

COMMANDS = "/reset starts over, /quit (or Ctrl-D) ends"


@dataclass
class Turn:
    """One answered turn: the answer and where its KV lived."""

    text: str
    finish_reason: str | None
    block_ids: list[int]  # the request's block table when it finished
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens found in the prefix cache
    reused_from: dict[int, int] = field(default_factory=dict)  # block id -> the earlier turn (1-based) that held it


class ChatSession:
    """A conversation with `llm`, one engine request per turn, streamed token by token."""

    def __init__(self, llm: LLM, params: SamplingParams, system: str | None = None):
        if llm.get_tokenizer() is None or llm.get_tokenizer().chat_template is None:
            raise ValueError("model: this model has no chat template (tokenizer_config.json); chat needs a chat model")
        self.llm, self.params, self.system = llm, params, system
        self.messages: list[dict] = []
        self.turns: list[Turn] = []
        self._count = 0

    def reset(self) -> None:
        self.messages, self.turns = [], []

    def send(self, text: str, on_text=None) -> Turn:
        """Answer `text`; `on_text(delta)` receives the answer as it grows. Returns the turn's record."""
        engine, tokenizer = self.llm.engine, self.llm.get_tokenizer()
        system = [{"role": "system", "content": self.system}] if self.system else []
        conversation = system + self.messages + [{"role": "user", "content": text}]
        prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        self._count += 1
        request_id = f"chat-{self._count}"
        engine.add_request(request_id, {"prompt": prompt, "prompt_token_ids": ids}, self.params)
        shown, blocks, last = "", [], None
        try:
            while last is None or not last.finished:
                for out in self.llm._step_or_fail():
                    if out.request_id != request_id:
                        continue
                    last = out
                    delta, shown = out.outputs[0].text[len(shown) :], out.outputs[0].text
                    if delta and on_text:
                        on_text(delta)
                blocks = self._blocks_of(request_id, blocks)
        except BaseException:
            engine.abort_request(request_id)
            raise
        answer = last.outputs[0]
        turn = Turn(
            text=answer.text,
            finish_reason=answer.finish_reason,
            block_ids=blocks,
            num_prompt_tokens=len(last.prompt_token_ids),
            num_output_tokens=len(answer.token_ids),
            num_cached_tokens=last.num_cached_tokens,
            reused_from=self._reused(blocks, last.num_cached_tokens),
        )
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer.text}]
        self.turns.append(turn)
        return turn

    def _blocks_of(self, request_id: str, last_seen: list[int]) -> list[int]:
        """The request's block table after this step. With record_trace, the step's trace has it even for the
        step the request finishes in (taken before its blocks are freed); else the live request's, if any."""
        engine = self.llm.engine
        if engine.trace:  # (a hybrid model's: one table per group; its full-attention layers' is told)
            step = engine.trace[-1]
            tables = step.group_tables or step.block_tables
            return list(one_table(engine.kv_manager, tables[request_id])) if request_id in tables else last_seen
        group = engine.scheduler.requests.live.get(request_id)
        return one_table(engine.kv_manager, engine.kv_manager.get_block_ids(group[0])) if group else last_seen

    def _reused(self, blocks: list[int], num_cached_tokens: int) -> dict[int, int]:
        """Each prefix-cache hit block -> the first earlier turn (1-based) whose request held it."""
        hit = blocks[: num_cached_tokens // self.llm.engine.config.block_size]
        reused = {}
        for b in hit:
            turn = next((i + 1 for i, t in enumerate(self.turns) if b in t.block_ids), None)
            if turn is not None:
                reused[b] = turn
        return reused

    def describe(self, turn: Turn) -> list[str]:
        """The lines printed under an answer: its blocks, and what the prefix cache saved."""
        config = self.llm.engine.config
        tokens = turn.num_prompt_tokens + turn.num_output_tokens
        held = len(turn.block_ids) * config.block_size
        lines = [
            f"blocks {block_list(turn.block_ids)} · {turn.num_prompt_tokens} prompt + {turn.num_output_tokens} "
            f"answer tokens in {len(turn.block_ids)} blocks of {config.block_size} (KV {tokens}/{held} slots)"
        ]
        if config.enable_prefix_caching:
            hit = turn.block_ids[: turn.num_cached_tokens // config.block_size]
            earlier = sorted(set(turn.reused_from.values()))
            source = f", from turn {', '.join(map(str, earlier))}" if earlier else ""
            where = f" (blocks {block_list(hit)}{source})" if hit else ""
            lines.append(
                f"prefix cache: {turn.num_cached_tokens} of {turn.num_prompt_tokens} prompt tokens "
                f"not recomputed{where}"
            )
        return lines


def run_chat(session: ChatSession, read_line=input, write=None) -> int:
    """The interactive loop: read a line, stream the answer, print its blocks. EOF or /quit ends it."""
    write = write or _write
    write(f"pagedlab chat · {COMMANDS}\n")
    while True:
        try:
            text = read_line("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            write("\n")
            return 0
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            session.reset()
            write("(a new conversation)\n")
            continue
        if not text:
            continue
        write("bot> ")
        try:
            turn = session.send(text, on_text=write)
        except KeyboardInterrupt:
            write("\n(answer stopped)\n")
            continue
        if not turn.text.endswith("\n"):
            write("\n")
        for line in session.describe(turn):
            write(f"  {line}\n")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
