"""The demo's settings as command-line flags, shared by `pagedlab demo` and `pagedlab trace` (lessons/demo.py's
DemoOptions, one flag per field).

Builds on: lessons/demo.py (DemoOptions, whose fields these name).
Read with: README.md (The demo and the command line).
"""

from __future__ import annotations


def _on_off(text: str) -> bool:
    """A flag's on/off value: on, off, true, false, 1, 0."""
    words = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    if text.lower() not in words:
        raise ValueError(f"expected on or off, got {text!r}")
    return words[text.lower()]


_on_off.__name__ = "on/off"  # argparse and --compare name the kind in their errors

DEMO_SETTINGS = {
    "stage": (str, "number or name (default: continuous)"),
    "model": (str, "'tiny-shakespeare' (default) or a Hugging Face folder"),
    "num_requests": (int, "default 10; more repeat the scenario's prompts"),
    "max_tokens": (int, "the same output length for all (default: varied, 5 to 28)"),
    "max_num_seqs": (int, "seats: requests running at once (default 6)"),
    "block_size": (int, "tokens per KV block (default 8)"),
    "num_kv_blocks": (int, "the KV pool's size in blocks (default 24)"),
    "max_model_len": (int, "tokens per request at most; stage 1 reserves this many (default 96)"),
    "preemption_mode": (str, "stage 5: recompute (default) or swap"),
    "scheduling_policy": (str, "stage 5: fcfs (default) or priority (request i gets priority i % 3)"),
    "enable_prefix_caching": (_on_off, "stage 4+: on (default) or off"),
    "temperature": (float, "default 0.8; 0 = greedy"),
    "seed": (int, "request i samples with seed + i (default 0)"),
    "delay": (float, "seconds per live frame (default 0.3)"),
}


def add_demo_settings(parser, skip: tuple[str, ...] = ()) -> None:
    """A flag per DEMO_SETTINGS entry but `skip`. Their texts are plain prose ("i % 3"); argparse formats help
    with %, so a literal % is doubled here, where the text becomes a help string."""
    for name, (kind, help_text) in DEMO_SETTINGS.items():
        if name not in skip:
            flag, text = "--" + name.replace("_", "-"), help_text.replace("%", "%%")
            parser.add_argument(flag, type=kind, default=None, help=text)
