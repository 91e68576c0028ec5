"""Chat templates: rendered as transformers renders them, sandboxed and bounded, and LLM.chat answers through
them."""

import os
import re
import subprocess
import sys
import threading

import pytest

from pagedlab import LLM, SamplingParams
from pagedlab.model import chat_template
from pagedlab.model.gguf import convert_gguf
from pagedlab.model.tokenizer import Tokenizer
from tests.model.gguf_files import CHATML, write_tiny_gguf

pytest.importorskip("gguf")

SMOLLM2 = (  # SmolLM2-135M-Instruct's own template (from its GGUF): a default system prompt when none is given
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FANCY = """{% set ns = namespace(n=0) %}
{% for m in messages %}
  {% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}
  {% set ns.n = ns.n + 1 %}
  {{- bos_token if loop.first else '' -}}
  [{{ m['role'] | upper }} {{ ns.n }}] {{ m['content'] | trim }}{{ eos_token if not loop.last else '' }}
{% endfor %}
{% if add_generation_prompt %}[ASSISTANT]{% endif %}
{{ {'turns': messages | length} | tojson }}"""
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "  4  "},
        {"role": "user", "content": "And 3+3? “quotes” and\nnew lines"},
    ],
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    write_tiny_gguf(root / "tiny.gguf")
    return convert_gguf(root / "tiny.gguf", root / "hf")


@pytest.mark.parametrize("template", [CHATML, SMOLLM2, FANCY], ids=["chatml", "smollm2", "fancy"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(folder, template, add_generation_prompt):
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)
    for conversation in CONVERSATIONS:
        kwargs = dict(chat_template=template, add_generation_prompt=add_generation_prompt)
        text = ours.apply_chat_template(conversation, tokenize=False, **kwargs)
        assert text == theirs.apply_chat_template(conversation, tokenize=False, **kwargs)
        ids = ours.apply_chat_template(conversation, tokenize=True, **kwargs)
        assert ids == list(theirs.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs))


def test_the_folder_template_is_the_default(folder):
    tok = Tokenizer.from_folder(folder)
    text = tok.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_templates_are_sandboxed_and_bad_ones_are_value_errors(folder):
    tok = Tokenizer.from_folder(folder)
    conversation = CONVERSATIONS[0]
    escapes = ["{{ ''.__class__.__mro__ }}", "{{ messages.append(1) }}", "{{ cycler.__init__.__globals__ }}"]
    for template in escapes:
        with pytest.raises(ValueError, match="chat_template: SecurityError"):
            tok.apply_chat_template(conversation, chat_template=template, tokenize=False)
    with pytest.raises(ValueError, match="chat_template: not a valid Jinja template"):
        tok.apply_chat_template(conversation, chat_template="{% for %}", tokenize=False)
    with pytest.raises(ValueError, match="chat_template: TemplateError: bad role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], chat_template=FANCY, tokenize=False)
    for bad, message in [
        ([], "conversation: expected a non-empty list"),
        ([{"role": "user"}], r"conversation\[0\]: expected a dict with 'role' and 'content'"),
        ([{"role": "", "content": "x"}], r"conversation\[0\]: role must be a non-empty string"),
        ([{"role": "user", "content": 3}], r"conversation\[0\]: content must be a string"),
        ([{"role": "user", "content": "x\ud800"}], r"conversation\[0\]: not valid Unicode text \(a lone surrogate"),
    ]:
        with pytest.raises(ValueError, match=message):
            tok.apply_chat_template(bad, tokenize=False)


def test_any_role_is_rendered_as_vllm_and_transformers_render_it(folder):
    from transformers import AutoTokenizer

    conversation = [{"role": "narrator", "content": "Enter ROMEO."}, {"role": "user", "content": "Hi"}]
    ours, theirs = Tokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)
    text = ours.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert text == theirs.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert "<|im_start|>narrator\nEnter ROMEO.<|im_end|>" in text


@pytest.mark.parametrize(
    "template, words",
    [
        ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "longer than 1 s"),
        ("{% for a in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "exceeds 4194304 characters"),
        ("{% set x = 'x' * 10**9 %}{{ x }}", "needed more than 512 MiB"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ 2.0 ** 10000 }}", "OverflowError"),
        ("{{ messages + 1 }}", "TypeError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    ],
)
def test_a_template_is_bounded_in_time_and_size_and_every_failure_names_chat_template(
    folder, monkeypatch, template, words
):
    """The template runs in a worker process of its own (model/template_worker.py); whatever it does, the
    caller gets a ValueError naming chat_template, and the next rendering works (a fresh worker if needed)."""
    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 1.0)
    tok = Tokenizer.from_folder(folder)
    with pytest.raises(ValueError, match=f"^chat_template: .*{re.escape(words)}"):
        tok.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)
    assert (
        tok.apply_chat_template(CONVERSATIONS[0], chat_template="{{ messages[0].content }}", tokenize=False)
        == (CONVERSATIONS[0][0]["content"])
    )
    assert chat_template._POOL.workers[0].proc.pid != os.getpid()


def test_a_template_that_runs_to_its_bound_holds_one_worker_not_every_render(monkeypatch):
    """RENDER_WORKERS workers: while one template loops until it is killed, another conversation renders on the
    other worker (one worker made it wait for the kill), and the loop's render is charged its own time only."""
    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 3.0)
    loops = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    started, stopped = threading.Event(), []

    def slow():
        started.set()
        with pytest.raises(ValueError, match="longer than 3 s"):
            chat_template.render(loops, CONVERSATIONS[0])
        stopped.append(True)

    worker = threading.Thread(target=slow)
    worker.start()
    started.wait(30)
    assert chat_template.render("{{ messages[0].content }}", CONVERSATIONS[0]) == CONVERSATIONS[0][0]["content"]
    assert stopped == []  # rendered while the loop still ran
    worker.join(60)
    assert stopped == [True]


def test_llm_chat_answers_one_conversation_or_many_as_generate_would(folder):
    llm = LLM(str(folder), stage=5)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    one = llm.chat(CONVERSATIONS[0], params, use_tqdm=False)
    many = llm.chat(CONVERSATIONS, params, use_tqdm=False)
    assert len(one) == 1 and len(many) == 3 and many[0].outputs[0].token_ids == one[0].outputs[0].token_ids
    tok = llm.get_tokenizer()
    for conversation, out in zip(CONVERSATIONS, many):
        text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert out.prompt == text and out.prompt_token_ids == tok.encode(text, add_special_tokens=False)
        again = llm.generate({"prompt_token_ids": out.prompt_token_ids}, params, use_tqdm=False)[0]
        assert again.outputs[0].token_ids == out.outputs[0].token_ids
    custom = llm.chat(CONVERSATIONS[0], params, chat_template="{{ messages[0]['content'] }}", use_tqdm=False)
    assert custom[0].prompt == CONVERSATIONS[0][0]["content"]


def test_llm_chat_refuses_bad_input_before_queuing_anything(folder):
    llm = LLM(str(folder), stage=5)
    with pytest.raises(ValueError, match="messages: expected a conversation"):
        llm.chat([], use_tqdm=False)
    with pytest.raises(ValueError, match="content must be a string"):  # the second one is bad: none is queued
        llm.chat([CONVERSATIONS[0], [{"role": "user", "content": None}]], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="chat_template: this tokenizer has none"):
        LLM().chat(CONVERSATIONS[0], use_tqdm=False)  # the bundled model is not a chat model


def test_prompt_dicts_are_checked(folder):
    llm = LLM(str(folder), stage=5)
    params = SamplingParams(temperature=0, max_tokens=2)
    text = llm.generate({"prompt": "What is"}, params, use_tqdm=False)[0]
    assert text.prompt == "What is" and text.prompt_token_ids == llm.get_tokenizer().encode("What is")
    for bad, message in [
        ({"text": "x"}, "prompt: unknown key 'text'"),
        ({}, "prompt: a prompt dict needs 'prompt' or 'prompt_token_ids'"),
        ({"prompt_token_ids": "abc"}, "'prompt_token_ids' must be a list of ints"),
        ({"prompt_token_ids": [1, 10**6]}, "outside the vocabulary"),
        ({"prompt_token_ids": [1], "prompt": 5}, "'prompt' must be a string"),
    ]:
        with pytest.raises(ValueError, match=message):
            llm.generate(bad, params, use_tqdm=False)


def test_a_chat_template_argument_is_a_file_or_the_template_itself(tmp_path):
    """`--chat-template` as vLLM reads it: text with `{`, `}` or a line break is the template; anything else
    is a path, which must name a regular file of at most 1 MiB."""
    (tmp_path / "t.jinja").write_text(CHATML)
    assert chat_template.load_chat_template(str(tmp_path / "t.jinja")) == CHATML
    assert chat_template.load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    assert chat_template.load_chat_template(None) is None
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.jinja").write_bytes(b"x" * (chat_template.MAX_TEMPLATE_CHARS + 1))
    for path, words in [("missing.jinja", "is missing"), ("fifo", "a FIFO"), ("big.jinja", "over the 1 MiB limit")]:
        with pytest.raises(ValueError, match=f"^chat_template: .* looks like a file's path, but .*{words}"):
            chat_template.load_chat_template(str(tmp_path / path))


def test_the_worker_ends_with_its_process_and_leaves_nothing_open():
    """The worker lives as long as the process that started it; at exit it is ended and its pipes closed, so a
    program that rendered a template exits without a ResourceWarning (one showed at the end of the whole suite)."""
    code = (
        "from pagedlab.model.chat_template import render\n"
        "print(render('{{ messages[0].content }}', [{'role': 'user', 'content': 'hi'}]))\n"
    )
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "always", "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
