"""Foundation: a conversation rendered into one prompt string by the model's own chat template.

Builds on: nothing (jinja2).
Read with: chapters/07-real-model.md.

A chat model was trained on conversations written in one exact format (SmolLM2's is ChatML:
`<|im_start|>user\\n...<|im_end|>\\n`), and it ships that format as a Jinja template in
tokenizer_config.json. Rendering it is how `LLM.chat` turns messages into the prompt the engine
sees, so the engine itself never knows about roles. The template comes with the model, that is, from
whoever published it: it is rendered in jinja2's immutable sandbox, which refuses attribute access
to Python internals and any mutation of the objects passed in, as transformers does
(transformers/utils/chat_template_utils.py) and vLLM after it (vllm/renderers/chat_utils/chat_template.py).
"""

from __future__ import annotations

import json
from functools import lru_cache

ROLES = ("system", "user", "assistant", "tool")


def check_conversation(messages, name: str = "messages") -> list[dict]:
    """A conversation is a non-empty list of {"role": str, "content": str} dicts; anything else is a ValueError."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{name}: expected a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{name}[{i}]: expected a dict with 'role' and 'content', got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ValueError(f"{name}[{i}]: role {m['role']!r} is not one of {ROLES}")
        if not isinstance(m["content"], str):
            raise ValueError(f"{name}[{i}]: content must be a string, got {type(m['content']).__name__}")
    return [dict(m) for m in messages]


def render(template: str, messages: list[dict], add_generation_prompt: bool = False, **context) -> str:
    """The template applied to the messages (and any extra variables, e.g. bos_token), as text."""
    from jinja2 import TemplateError

    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **context)
    except TemplateError as e:
        raise ValueError(f"chat_template: {type(e).__name__}: {e}") from None


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # trim_blocks/lstrip_blocks: a template's own line breaks around {% ... %} are not output (as transformers).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise ValueError(f"chat_template: not a valid Jinja template (line {e.lineno}: {e.message})") from None


def _raise(message: str):
    from jinja2 import TemplateError

    raise TemplateError(message)
