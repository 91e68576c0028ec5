"""Incremental detokenization: text grown token by token equals decoding the whole output at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from pagedlab import load_model
from pagedlab.model.loader import bundled_model_path
from pagedlab.model.tokenizer import Tokenizer

TEXT = "Wherefore art thou, Roméo? Ça va — 日本語のテキスト, naïve café! 🙂 " * 20


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """A small byte-level BPE (GPT-2 / Llama 3 style) trained offline: one character can span tokens."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False)
    hf.train_from_iterator([TEXT], trainer=trainer)
    return Tokenizer(hf)


@pytest.fixture(scope="module")
def bundled() -> Tokenizer:
    return load_model(bundled_model_path()).tokenizer


def grow(tokenizer: Tokenizer, token_ids: list[int]) -> list[str]:
    """The detokenizer's text after each token arrives; the last update says the request finished."""
    detok, texts = tokenizer.detokenizer(), []
    for n in range(1, len(token_ids) + 1):
        texts.append(detok.update(token_ids[:n], finished=n == len(token_ids)))
    return texts


def check(tokenizer: Tokenizer, token_ids: list[int]) -> None:
    texts = grow(tokenizer, token_ids)
    final = tokenizer.decode(token_ids)
    assert texts[-1] == final
    assert all(final.startswith(t) for t in texts), "text was taken back"


def test_a_cut_character_shows_once_the_request_finishes(byte_level):
    ids = byte_level.encode("日")
    assert len(ids) > 1, "the fixture should split this character"
    detok = byte_level.detokenizer()
    assert detok.update(ids[:1]) == ""  # held back: half a character
    assert detok.update(ids[:1], finished=True) == byte_level.decode(ids[:1]) == "\ufffd"


def test_multi_byte_characters_are_held_back_until_whole(byte_level):
    ids = byte_level.encode("日本語 🙂")
    check(byte_level, ids)
    texts = grow(byte_level, ids)
    assert all("\ufffd" not in t for t in texts)  # never half a character
    assert len(set(texts)) < len(texts), "no token was held back: the fixture should split characters"


def test_several_tokens_per_update_and_special_tokens_skipped(bundled):
    ids = bundled.encode("ROMEO: But soft!") + [bundled.token_to_id("<eos>")]
    detok = bundled.detokenizer()
    assert detok.update(ids[:5]) == bundled.decode(ids[:5])
    assert detok.update(ids) == bundled.decode(ids) == "ROMEO: But soft!"


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_outputs_equal_a_whole_decode(byte_level, bundled, data):
    tokenizer = data.draw(st.sampled_from([byte_level, bundled]))
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), min_size=1, max_size=40))
    check(tokenizer, ids)


def test_a_prompt_before_the_output_is_skipped(bundled):
    prompt, output = bundled.encode("ROMEO:"), bundled.encode("But soft!")[1:]  # no second <bos>
    detok = bundled.detokenizer(skip=len(prompt))
    assert detok.update(prompt) == ""
    assert detok.update(prompt + output[:3]) == bundled.decode(output[:3])
    assert detok.update(prompt + output, finished=True) == bundled.decode(output) == "But soft!"
