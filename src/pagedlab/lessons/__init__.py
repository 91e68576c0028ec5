"""Stage 1: every scenario a chapter, a notebook or the demo runs, one module per chapter; their public names here.

Builds on: lessons/common.py (DPI, TracedRun), lessons/stage1.py to lessons/stage7.py and lessons/window.py (each
stage's workload, runs and figures), lessons/figures.py (FIGURES, make_figures: `pagedlab figures`).
Read with: chapters/97-architecture.md (Layout).

Every public name of the stage modules is importable from here (`from pagedlab.lessons import STAGE2_POOL`). A
name is imported when first asked for (PEP 562), and so is its module: `import pagedlab.lessons.lab` or
`pagedlab.lessons.predict` loads neither torch nor matplotlib, which is what lets the live lab run them in a
browser tab (lessons/lab.py).
"""

from __future__ import annotations

import importlib

_WHERE = {  # public name -> (its module under pagedlab.lessons, its name there)
    "BEAM_PARAMS": ("stage3", "BEAM_PARAMS"),
    "BEAM_PROMPT": ("stage3", "BEAM_PROMPT"),
    "BEAM_STEPS": ("stage3", "BEAM_STEPS"),
    "COW_BLOCK_SIZE": ("stage3", "COW_BLOCK_SIZE"),
    "COW_PARENT_TOKENS": ("stage3", "COW_PARENT_TOKENS"),
    "CacheRun": ("stage4", "CacheRun"),
    "ChatRun": ("stage7", "ChatRun"),
    "DPI": ("common", "DPI"),
    "FIGURES": ("figures", "FIGURES"),
    "KVSize": ("stage7", "KVSize"),
    "ModelNotFetched": ("stage7", "ModelNotFetched"),
    "STAGE1_MAX_TOKENS": ("stage1", "STAGE1_MAX_TOKENS"),
    "STAGE1_PROMPTS": ("stage1", "STAGE1_PROMPTS"),
    "STAGE2_MAX_TOKENS": ("stage2", "STAGE2_MAX_TOKENS"),
    "STAGE2_POOL": ("stage2", "STAGE2_POOL"),
    "STAGE2_PROMPTS": ("stage2", "STAGE2_PROMPTS"),
    "STAGE4_POOL": ("stage4", "STAGE4_POOL"),
    "STAGE4_PREFIX": ("stage4", "STAGE4_PREFIX"),
    "STAGE4_PROMPTS": ("stage4", "STAGE4_PROMPTS"),
    "STAGE4_STEPS": ("stage4", "STAGE4_STEPS"),
    "STAGE5_MAX_TOKENS": ("stage5", "STAGE5_MAX_TOKENS"),
    "STAGE5_POOL": ("stage5", "STAGE5_POOL"),
    "STAGE5_PROMPTS": ("stage5", "STAGE5_PROMPTS"),
    "STAGE5_SWAP_BLOCKS": ("stage5", "STAGE5_SWAP_BLOCKS"),
    "STAGE5_SWAP_STEP": ("stage5", "STAGE5_SWAP_STEP"),
    "STAGE7_FOLLOW_UP": ("stage7", "STAGE7_FOLLOW_UP"),
    "STAGE7_MAX_TOKENS": ("stage7", "STAGE7_MAX_TOKENS"),
    "STAGE7_MODEL": ("stage7", "STAGE7_MODEL"),
    "STAGE7_POOL": ("stage7", "STAGE7_POOL"),
    "STAGE7_QUESTIONS": ("stage7", "STAGE7_QUESTIONS"),
    "STAGE7_SYSTEM": ("stage7", "STAGE7_SYSTEM"),
    "STAGE7_TIGHT_POOL": ("stage7", "STAGE7_TIGHT_POOL"),
    "STATIC_VS_CONTINUOUS_POOL": ("stage5", "STATIC_VS_CONTINUOUS_POOL"),
    "ScheduleRun": ("stage5", "ScheduleRun"),
    "TightRun": ("stage7", "TightRun"),
    "TracedRun": ("common", "TracedRun"),
    "TritonCannotRun": ("stage6", "TritonCannotRun"),
    "WINDOW": ("window", "WINDOW"),
    "batching_run": ("stage5", "batching_run"),
    "beam_tree_tables": ("stage3", "beam_tree_tables"),
    "chat_run": ("stage7", "chat_run"),
    "cow_before_after": ("stage3", "cow_before_after"),
    "fig_01_batch_timeline": ("stage1", "fig_01_batch_timeline"),
    "fig_01_kv_over_steps": ("stage1", "fig_01_kv_over_steps"),
    "fig_01_reserved_vs_used": ("stage1", "fig_01_reserved_vs_used"),
    "fig_02_block_tables": ("stage2", "fig_02_block_tables"),
    "fig_02_pool_occupancy": ("stage2", "fig_02_pool_occupancy"),
    "fig_02_sliding_window": ("window", "fig_02_sliding_window"),
    "fig_02_hybrid_tables": ("hybrid", "fig_02_hybrid_tables"),
    "fig_03_beam_tree": ("stage3", "fig_03_beam_tree"),
    "fig_03_cow_before_after": ("stage3", "fig_03_cow_before_after"),
    "fig_04_block_tables_hits": ("stage4", "fig_04_block_tables_hits"),
    "fig_04_hash_chain": ("stage4", "fig_04_hash_chain"),
    "fig_05_gantt": ("stage5", "fig_05_gantt"),
    "fig_05_static_vs_continuous": ("stage5", "fig_05_static_vs_continuous"),
    "fig_05_swap_block_tables": ("stage5", "fig_05_swap_block_tables"),
    "fig_05_tokens_per_step": ("stage5", "fig_05_tokens_per_step"),
    "fig_06_decode_programs": ("stage6", "fig_06_decode_programs"),
    "fig_06_parity": ("stage6", "fig_06_parity"),
    "fig_07_kv_per_token": ("stage7", "fig_07_kv_per_token"),
    "fig_07_preemption": ("stage7", "fig_07_preemption"),
    "fig_07_second_turn": ("stage7", "fig_07_second_turn"),
    "fig_07_shared_prefix": ("stage7", "fig_07_shared_prefix"),
    "follow_up": ("stage7", "follow_up"),
    "kv_sizes": ("stage7", "kv_sizes"),
    "make_figures": ("figures", "make_figures"),
    "model_missing_line": ("stage7", "skipped_line"),
    "pool_comparison_run": ("stage2", "pool_comparison_run"),
    "prompt_blocks": ("stage7", "prompt_blocks"),
    "resumed_with": ("stage7", "resumed_with"),
    "stage1_run": ("stage1", "stage1_run"),
    "stage1_workload": ("stage1", "stage1_workload"),
    "stage2_block_table_run": ("stage2", "stage2_block_table_run"),
    "stage2_workload": ("stage2", "stage2_workload"),
    "stage4_cache_run": ("stage4", "stage4_cache_run"),
    "stage5_run": ("stage5", "stage5_run"),
    "stage5_workload": ("stage5", "stage5_workload"),
    "stage7_chats": ("stage7", "stage7_chats"),
    "stage7_params": ("stage7", "stage7_params"),
    "swap_tables_run": ("stage5", "swap_tables_run"),
    "tight_run": ("stage7", "tight_run"),
    "token_pieces": ("stage7", "token_pieces"),
    "triton_missing_line": ("stage6", "skipped_line"),
    "window_rows": ("window", "window_rows"),
    "windowed_bundled_model": ("window", "windowed_bundled_model"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pagedlab.lessons' has no attribute {name!r}")
    module, real = _WHERE[name]
    value = getattr(importlib.import_module(f"pagedlab.lessons.{module}"), real)
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
