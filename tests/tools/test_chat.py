"""`pagedlab chat` (tools/chat.py): streamed answers, each with its blocks, and the second turn's prefix hits.

On the tiny GGUF model the tests write (tests/model/gguf_files.py): its answers are noise, but the
engine does with them exactly what it does with SmolLM2's (tests/model/test_smollm2.py asks Paris).
"""

import pytest

from pagedlab import LLM, SamplingParams
from pagedlab.model.gguf import convert_gguf
from pagedlab.tools.chat import ChatSession, run_chat
from tests.model.gguf_files import write_tiny_gguf

pytest.importorskip("gguf")
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-cli")
    write_tiny_gguf(root / "tiny.gguf")
    return convert_gguf(root / "tiny.gguf", root / "hf")


def session(folder, **settings) -> ChatSession:
    llm = LLM(str(folder), stage=5, block_size=4, record_trace=True, max_trace_steps=1, **settings)
    return ChatSession(llm, PARAMS)


def test_an_answer_streams_and_reports_its_blocks(folder):
    chat = session(folder)
    pieces = []
    turn = chat.send("What is the capital of France?", on_text=pieces.append)
    assert "".join(pieces) == turn.text and len(pieces) > 1  # token by token, not at the end
    assert turn.num_output_tokens == 6 and turn.finish_reason == "length"
    tokens = turn.num_prompt_tokens + turn.num_output_tokens
    assert len(turn.block_ids) == -(-(tokens - 1) // 4)  # the last sampled token has no KV yet
    assert chat.llm.engine.kv_manager.num_used_blocks == 0  # the turn's request is over: its blocks are free
    assert turn.num_cached_tokens == 0 and turn.reused_from == {}


def test_the_second_turn_reuses_the_first_turns_blocks(folder):
    chat = session(folder)
    first = chat.send("What is the capital of France?")
    second = chat.send("And of Italy?")
    assert second.num_cached_tokens >= first.num_prompt_tokens // 4 * 4  # at least the first prompt's full blocks
    hit = second.block_ids[: second.num_cached_tokens // 4]
    assert hit == first.block_ids[: len(hit)] and second.reused_from == dict.fromkeys(hit, 1)
    lines = chat.describe(second)
    assert lines[0].startswith(f"blocks {hit[0]}") and f"in {len(second.block_ids)} blocks of 4" in lines[0]
    assert lines[1].endswith("from turn 1)") and lines[1].startswith(f"prefix cache: {second.num_cached_tokens} of")


def test_the_loop_reads_lines_until_quit_and_resets(folder):
    chat = session(folder)
    said = iter(["", "What is the capital of France?", "/reset", "Hi", "/quit", "never read"])
    out = []
    assert run_chat(chat, read_line=lambda prompt: next(said), write=out.append) == 0
    text = "".join(out)
    assert text.count("bot> ") == 2 and "(a new conversation)" in text
    assert len(chat.turns) == 1 and chat.messages[0]["content"] == "Hi"  # the reset forgot the first turn
    chat.reset()

    def eof(prompt):
        raise EOFError

    assert run_chat(chat, read_line=eof, write=out.append) == 0


def test_a_model_without_a_chat_template_is_refused():
    with pytest.raises(ValueError, match="model: this model has no chat template"):
        ChatSession(LLM(), PARAMS)
