"""Foundation: text <-> token ids through the `tokenizers` library.

Builds on: nothing.
Read with: chapters/00-overview.md.

A thin wrapper over `tokenizer.json`. Whether a string prompt gets `<bos>` is the
tokenizer file's own decision (its post-processor), as with any Hugging Face
model: the bundled character-level tokenizer adds it, Llama 3's adds
`<|begin_of_text|>`, Qwen's adds nothing.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, processors
from tokenizers.decoders import DecodeStream

from pagedlab.model.files import TEMPLATE_LIMIT, TOKENIZER_LIMIT, read_model_json, read_model_text


class Tokenizer:
    """Encodes prompts and decodes outputs; special tokens are left out of decoded text.

    A chat model's folder also has tokenizer_config.json: its `chat_template` (and the special tokens'
    text the template may use) make `apply_chat_template` work; see model/chat_template.py.
    """

    def __init__(self, hf: _HFTokenizer, chat_template: str | None = None, special_tokens: dict | None = None):
        self._hf = hf
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # e.g. {"bos_token": "<|im_start|>", "eos_token": ...}

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """tokenizer.json of a model folder, with the chat template and special tokens of its tokenizer_config.json
        (or of chat_template.jinja, as newer Hugging Face folders keep it)."""
        path = Path(path)
        tok = cls.from_file(path / "tokenizer.json")
        config = read_model_json(path, "tokenizer_config.json", required=False)
        if config is not None:
            tok.chat_template = _template_of(config.get("chat_template"), path / "tokenizer_config.json")
            for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
                text = config.get(key)
                text = text.get("content") if isinstance(text, dict) else text
                if isinstance(text, str):
                    tok.special_tokens[key] = text
        jinja = read_model_text(path, "chat_template.jinja", "chat template", TEMPLATE_LIMIT, required=False)
        if jinja is not None:
            tok.chat_template = jinja
        return tok

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """A tokenizer.json, read (bounded, and only if a regular file inside its folder) by model/files.py."""
        path = Path(path)
        text = read_model_text(path.parent, path.name, "tokenizer file", TOKENIZER_LIMIT)
        try:
            return cls(_HFTokenizer.from_str(text))
        except Exception as e:  # the library raises a bare Exception on malformed files
            raise ValueError(f"{path}: not a readable tokenizer file ({e})") from None

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The longest token's text: a prompt of more than n times this many characters has more than n tokens
        (vLLM's bound, checked before tokenizing a prompt that cannot fit)."""
        return max(len(token) for token in self._hf.get_vocab(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens=False leaves out what the post-processor adds (a <bos>).

        Through encode_batch, which gives the same ids but releases the GIL while it works (the library's encode
        holds it; transformers' fast tokenizers encode one text through encode_batch too): the server tokenizes
        in its handlers' threads, and SmolLM2 takes about half a second over a prompt of 600,000 characters,
        during which the engine thread could not step nor the event loop answer."""
        return self._hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def apply_chat_template(
        self,
        conversation: list[dict],
        chat_template: str | None = None,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs,
    ) -> str | list[int]:
        """transformers' apply_chat_template: the conversation as the model's prompt, text or token ids.

        add_generation_prompt=True ends the text with the assistant's header, so the model answers
        instead of continuing the user's turn. The rendered text already holds the special tokens it
        needs, so tokenizing adds none.
        """
        from pagedlab.model import chat_template as chat

        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError(
                "chat_template: this tokenizer has none (no chat_template in tokenizer_config.json); pass one"
            )
        messages = chat.check_conversation(conversation, "conversation")
        text = chat.render(template, messages, add_generation_prompt, **(self.special_tokens | kwargs))
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def decode(self, token_ids: list[int]) -> str:
        return self._hf.decode(list(token_ids), skip_special_tokens=True)

    def detokenizer(self, skip: int = 0) -> IncrementalDetokenizer:
        """A fresh incremental detokenizer for one request's output: the tokens after the first `skip`."""
        return IncrementalDetokenizer(self._hf, skip)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def save(self, path: str | Path) -> None:
        self._hf.save(str(path))


def _template_of(value, source: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of {"name", "template"} (then "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(f"{source}: field 'chat_template' must be a string or a list of named templates with 'default'")


class IncrementalDetokenizer:
    """One request's output text, grown as its tokens arrive (vLLM's FastIncrementalDetokenizer).

    Decoding the whole output again every step costs O(length) per token; this
    decodes each token once. The library's `DecodeStream` keeps the few tokens of
    context a byte-level or SentencePiece decoder needs, and holds a token back
    while it ends in the middle of a multi-byte character.
    """

    def __init__(self, hf: _HFTokenizer, skip: int = 0):
        self._hf = hf
        self._stream = DecodeStream(skip_special_tokens=True)
        self.skip = skip  # leading tokens that are not output (the prompt)
        self.num_seen = skip  # tokens of the list decoded (or skipped) so far
        self.text = ""  # the output's text so far
        self.finished = False  # the text is final

    def update(self, token_ids: list[int], finished: bool = False) -> str:
        """Decode the tokens appended to `token_ids` since the last call; return the whole text so far.

        A token that ends inside a character is held back until the character is whole. When the
        request has finished nothing more will come, so the text becomes the whole output decoded at
        once (a cut character then shows as U+FFFD, as in `Tokenizer.decode`).
        """
        if self.finished:
            return self.text
        for i in range(self.num_seen, len(token_ids)):  # no slice: a step touches only its new tokens
            self.text += self._stream.step(self._hf, token_ids[i]) or ""
        self.num_seen = len(token_ids)
        if finished:
            self.text = self._hf.decode(token_ids[self.skip :], skip_special_tokens=True)
            self.finished = True
        return self.text


def build_char_tokenizer(chars: list[str], bos: str = "<bos>", eos: str = "<eos>", unk: str = "<unk>") -> Tokenizer:
    """A character-level tokenizer: ids 0-2 are <bos>, <eos>, <unk>, then one id per character.

    A BPE model with no merges splits text into single characters; `Fuse`
    joins them back without spaces; the template prepends <bos> to every prompt.
    """
    vocab = {bos: 0, eos: 1, unk: 2} | {c: i + 3 for i, c in enumerate(chars)}
    hf = _HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk))
    hf.add_special_tokens([bos, eos, unk])
    hf.decoder = decoders.Fuse()
    hf.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 0)])
    return Tokenizer(hf)
