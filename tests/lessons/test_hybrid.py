"""lessons/hybrid.py: what KV cache groups save a hybrid model, counted by the real managers, and the chapter's
table is that count."""

from __future__ import annotations

from pathlib import Path

from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.cache_groups import kv_cache_groups
from pagedlab.lessons.hybrid import (
    BLOCK_SIZE,
    CHUNK,
    SHAPES,
    grow,
    hit_tokens,
    hybrid_peak_blocks,
    peak_blocks,
    picture_lines,
    saving_rows,
    table_lines,
)

CHAPTER = Path(__file__).resolve().parents[2] / "chapters" / "02-paged-blocks.md"


def test_a_full_layer_holds_the_whole_context_and_a_sliding_one_the_window_and_a_chunk():
    assert peak_blocks(None, 1000, 100) == cdiv(1000 + 100 - 1, BLOCK_SIZE)
    bound = cdiv(128 - 1 + CHUNK, BLOCK_SIZE) + 1  # kv/window.py's max_blocks_held: the window, a chunk, one more
    assert bound - 1 <= peak_blocks(128, 4000, 300) <= bound  # (the one more: a window need not start a block)
    assert peak_blocks(128, 100, 20) == cdiv(100 + 20 - 1, BLOCK_SIZE)  # a short request never passes its window


def test_a_hybrid_layout_lies_between_full_only_and_window_only():
    rows = saving_rows()
    for shape in SHAPES:
        share = {r["layout"]: r["share_of_full"] for r in rows if r["model"] == shape.name}
        assert share["full-only"] == 1.0 > share["hybrid"] > share["window-only"] > 0


def test_the_chapter_quotes_the_count():
    text = CHAPTER.read_text(encoding="utf-8")
    missing = [line for line in table_lines() if line not in text]
    assert not missing, f"chapters/02-paged-blocks.md: rerun lessons.hybrid.table_lines(): {missing}"


def test_the_chapters_two_tables_are_the_coordinators_own_run():
    text = CHAPTER.read_text(encoding="utf-8")
    picture = "\n".join(picture_lines())
    assert picture in text, f"chapters/02-paged-blocks.md: rerun lessons.hybrid.picture_lines():\n{picture}"


def test_the_coordinators_peak_is_at_most_the_groups_peaks_added():
    """Peaks of different groups fall in different steps (a window's in the biggest chunk, the full group's at the
    end), so the coordinator's peak, every group at once, is at most their sum; for a short request, equal."""
    groups = kv_cache_groups((128, None))
    for prompt, output in ((4000, 300), (100, 20)):
        apart = peak_blocks(128, prompt, output) + peak_blocks(None, prompt, output)
        together = hybrid_peak_blocks(groups, prompt, output)
        assert together <= apart and (together == apart) == (prompt + output <= 128)


def test_the_exercises_answers_come_from_the_coordinator():
    tables = grow([8, 8, 8, 6])
    assert [len(t) for t in tables[-1]] == [8, 8] and tables[-1][0][:4] == [0, 0, 0, 0]
    assert hit_tokens((0, 1, 2, 3, 4, 5, 6), (5, 6)) == 28  # the window needs only its last two blocks
