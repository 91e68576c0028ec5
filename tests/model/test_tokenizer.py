"""The tokenizer's encode (model/tokenizer.py): the library's ids, computed without holding the GIL."""

from __future__ import annotations

import threading

import pytest

from pagedlab import load_model
from pagedlab.model.loader import bundled_model_path
from pagedlab.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def bundled() -> Tokenizer:
    return load_model(bundled_model_path()).tokenizer


@pytest.mark.parametrize("text", ["ROMEO:", "", "First Citizen:\nBefore we proceed", "Ça va? 🙂 <bos>", "x" * 5000])
def test_encode_gives_the_librarys_ids(bundled, text):
    for special in (True, False):
        assert bundled.encode(text, special) == bundled._hf.encode(text, add_special_tokens=special).ids


def test_other_threads_run_while_a_long_text_is_encoded(bundled):
    """The server tokenizes in its handlers' threads while the engine thread steps; the library's own encode
    held the GIL, so nothing else ran until it was done. Here the main thread counts to 300,000 (about a
    hundredth of a second alone) while another encodes 960,000 characters (about half a second alone): with the
    GIL held by the encoding, the count could not finish first."""
    text = "ROMEO: What light through yonder window breaks?\n" * 20_000
    started, done = threading.Event(), threading.Event()

    def encode():
        started.set()
        bundled.encode(text)
        done.set()

    worker = threading.Thread(target=encode)
    worker.start()
    started.wait(30)
    count = 0
    while count < 300_000 and not done.is_set():
        count += 1
    finished_first = not done.is_set()
    worker.join(60)
    assert finished_first and count == 300_000
