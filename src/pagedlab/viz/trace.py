"""Stage 1: one trace format: the engine's recorded steps as versioned JSON, for the HTML page and the tests.

Builds on: engine/stats.py (StepTrace, recorded with EngineConfig.record_trace=True), engine/events.py
(step_events: what changed in a step).
Read with: chapters/97-architecture.md (One engine step, Who owns what), chapters/05-continuous-batching.md.

`to_trace(llm)` turns `llm.engine.trace` into plain JSON values; `save` / `load` write and read it; `from_json`
and `validate` refuse anything else, naming the first bad field. Version 1, every field:

    {
      "version": 1,                  TRACE_VERSION; another version is refused
      "stage": 5, "stage_name": "continuous",
      "config": {                    the EngineConfig fields that shape a drawing
        "block_size": 8, "num_kv_blocks": 24, "max_num_seqs": 6, "max_num_batched_tokens": 96,
        "max_model_len": 96, "long_prefill_token_threshold": 16, "enable_prefix_caching": true,
        "preemption_mode": "recompute", "num_swap_blocks": 0, "scheduling_policy": "fcfs",
        "sliding_window": 0,         tokens (0: none; absent reads as 0); with one, block 0 is the null block:
                                     ref 0 yet never in the free queue, the tables' entry for blocks behind it
        "layer_windows": [],         a hybrid model's window per layer (null: full attention), [] otherwise
                                     (absent reads as []); with layers of two kinds, every request has one
                                     table per KV cache group (kv/cache_groups.py), block 0 is the null block
        "kv_cache_groups": [         a hybrid model's groups in table order, kv_cache_groups(layer_windows),
          {"kind": "sliding-8", "layers": [0, 2]},   so the page labels each table without vLLM's rule (here
          {"kind": "full", "layers": [1, 3]}]},      [8, null, 8, null]); absent for one group, and in older traces
      "requests": {                  every request a step names (children and beams too), and every id of the
                                     prompts given that is no group of children
        "5": {"group": "5",          the user request it belongs to (itself unless n > 1 or a beam)
              "prompt": "First...",  the prompt text given to to_trace (a child: its group's), or null
              "num_prompt_tokens": 77,   or null when no step ran it and no prompt was given
              "text": "...",         the output text given to to_trace, or null
              "first_step": 1, "last_step": 19,  first and last step naming it (null: none does)
              "finish_reason": "length"}},       "stop" | "length" | "abort", null while unfinished
      "hashes": ["3fa9c1d2e4b0"],    short names (12 hex digits) of the block hashes cached in any step,
                                     first seen first; pool.hash indexes this list (a hybrid model's
                                     also say the group: "1:3fa9c1d2e4b0", group 1's block of those tokens)
      "steps": [step, ...],          the recorded steps, oldest first (the ring keeps the last max_trace_steps)
      "recording": {...}             the run as data for a replay (engine/replay.py), or null (or absent)
    }

    step = {
      "step": 11, "time": 0.067829,  1-based engine step; seconds since the engine started
      "scheduled": {"0": 1, "5": 16},  request -> tokens fed this step
      "prefills": ["5"],             of those, the ones fed a prefill chunk (prompt or recompute); the rest decode
      "waiting": ["6", "7"],         waiting after scheduling, in queue order
      "running": ["0", "5"],         holding KV during the step (scheduled or not)
      "preempted": ["6"],            preempted while this step was scheduled (stage 5)
      "swapped": [],                 waiting requests whose K/V is in the CPU pool (stage 5, swap)
      "were_preempted": ["6"],       waiting requests preempted at some earlier step
      "finished": {"3": "length"},   request -> finish reason, for the requests that ended in this step
      "tables": {"0": [0, 16, 1]},   running request -> block table: physical block ids in logical order (a
                                     hybrid model's: a list of tables, one per group, [[5, 2, 9], [0, 6, 8]])
      "used": {"0": 17},             running request -> slots holding K/V after this step (the first `used`
                                     slots of its table; it holds len(table) * block_size)
      "groups": {"0_3": "3"},        running child (n > 1, beams) -> its user request
      "copies": [["0_3", 4, 9]],     copy-on-write: [request, source block, its private copy]
      "swap_out": [[7, 0]],          [GPU block, CPU block] copied out this step
      "swap_in": [[0, 4]],           [CPU block, GPU block] copied back this step
      "num_used_blocks": 24,         blocks held in the pool
      "num_cached_tokens": {"5": 48},  scheduled request -> prompt tokens cached at its first admission (or absent)
      "pool": {                      null at stage 1 (regions, no block pool)
        "free": [12, 3],             the free queue, head (allocated next) to tail
        "ref": [1, 2, 0, ...],       block_id -> ref_cnt (num_kv_blocks entries; the null block's is 0)
        "hash": [0, null, ...]},     block_id -> index into "hashes" of its cached hash, or null
      "events": [{"kind": "admit", "request": "3", "blocks": [4, 5], "text": "3 admitted (...)"}]
    }

Events are engine/events.py's (EVENT_KINDS, their `.text`), in its order, then "evict": a block whose cached hash
changed or went since the step before (reused for other tokens), told of the request now holding it (null if
none). The pool and the tables are taken after scheduling and the forward pass, before update frees anything.
"""

from __future__ import annotations

import json
from pathlib import Path

from pagedlab.engine.events import EVENT_KINDS, block_list, step_events
from pagedlab.engine.replay import config_fields, recording_of
from pagedlab.kv.cache_groups import kv_cache_groups
from pagedlab.model.files import read_json_file

TRACE_VERSION = 1
TRACE_EVENT_KINDS = (*EVENT_KINDS, "evict")
STEP_LISTS = ("prefills", "waiting", "running", "preempted", "swapped", "were_preempted")
STEP_MAPS = ("scheduled", "finished", "tables", "used", "groups")
STEP_PAIRS = ("copies", "swap_out", "swap_in")


def to_trace(llm_or_engine, prompts: dict | None = None, texts: dict | None = None) -> dict:
    """The engine's recorded steps as one JSON-able dict (the format above). `prompts`: request_id -> prompt
    (text or token ids); `texts`: request_id -> output text; both optional, for the labels."""
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    config, trace = engine.config, list(engine.trace)
    hashes: dict = {}  # block hash -> its index in "hashes"
    steps = [_step(t, _events(trace, i, config), hashes) for i, t in enumerate(trace)]
    return {
        "version": TRACE_VERSION,
        "stage": config.stage,
        "stage_name": config.stage_name,
        "config": _config(config),
        "requests": _requests(trace, prompts or {}, texts or {}, engine.tokenizer),
        "hashes": [_short_hash(h) for h in hashes],
        "steps": steps,
        "recording": recording_of(engine),
    }


def _config(config) -> dict:
    """The settings that shape a drawing; a hybrid model's also name its KV cache groups (the page's labels)."""
    fields = config_fields(config)
    if config.hybrid:
        fields["kv_cache_groups"] = group_labels(config.layer_windows)
    return fields


def group_labels(layer_windows) -> list[dict]:
    """Each KV cache group's kind and layers, in table order: [{"kind": "full", "layers": [1, 3]}, ...]."""
    return [{"kind": g.kind, "layers": list(g.layers)} for g in kv_cache_groups(layer_windows)]


def _step(t, events: list[dict], hashes: dict) -> dict:
    return {
        "step": t.step,
        "time": round(t.time, 6),
        "scheduled": dict(t.scheduled),
        **{name: list(getattr(t, name)) for name in STEP_LISTS},
        "finished": {rid: t.finish_reasons.get(rid) for rid in t.finished},
        "tables": {rid: list(map(list, t)) for rid, t in t.group_tables.items()}
        if t.group_tables
        else {rid: list(table) for rid, table in t.block_tables.items()},
        "used": dict(t.kv_used),
        "groups": dict(t.groups),
        **{name: [list(p) for p in getattr(t, name)] for name in STEP_PAIRS},
        "num_used_blocks": t.num_used_blocks,
        "num_cached_tokens": dict(t.num_cached_tokens),
        "pool": None if t.free_queue is None else _pool(t, hashes),
        "events": events,
    }


def _pool(t, hashes: dict) -> dict:
    names = [None if h is None else hashes.setdefault(h, len(hashes)) for h in t.block_hashes]
    return {"free": list(t.free_queue), "ref": list(t.ref_cnts), "hash": names}


def _short_hash(block_hash) -> str:
    """12 hex digits: enough to tell the hashes of one run apart. A hybrid model's blocks are cached under
    (group, hash) (kv/hybrid.py, vLLM's BlockHashWithGroupId): "1:" and the hash's digits, the same tokens' in
    every group (hash() of the pair would differ between two Pythons, and the lab's trace must not)."""
    if isinstance(block_hash, tuple):
        group, tokens_hash = block_hash
        return f"{group}:{_short_hash(tokens_hash)}"
    if isinstance(block_hash, bytes):
        return block_hash[:6].hex()
    return format(hash(block_hash) & 0xFFFF_FFFF_FFFF, "012x")  # hash_algo="builtin": an int


def _events(trace: list, index: int, config) -> list[dict]:
    events = [
        {"kind": e.kind, "request": e.request_id, "blocks": list(e.blocks), "text": e.text}
        for e in step_events(trace, index, config)
    ]
    return events + _evictions(trace[index - 1] if index else None, trace[index])


def _evictions(before, now) -> list[dict]:
    """Blocks cached in the step before whose hash is gone or changed: reused for other tokens."""
    if before is None or not before.block_hashes or not now.block_hashes:
        return []
    gone = [b for b, h in enumerate(before.block_hashes) if h is not None and now.block_hashes[b] is not h]
    holder = {b: rid for rid, table in now.block_tables.items() for b in table}
    by_request: dict = {}
    for b in gone:
        by_request.setdefault(holder.get(b), []).append(b)
    return [{"kind": "evict", "request": r, "blocks": b, "text": _evict_text(r, b)} for r, b in by_request.items()]


def _evict_text(rid: str | None, blocks: list[int]) -> str:
    who = "" if rid is None else f"{rid} "
    return f"{who}evicted {block_list(blocks)} from the prefix cache (reused for other tokens)"


def _requests(trace: list, prompts: dict, texts: dict, tokenizer) -> dict:
    """Every request id the steps name, and every id of `prompts` that is no group of children (those never
    ran: the ring dropped them, or they were still waiting), with what the trace and the caller know of it."""
    seen: dict[str, list[int]] = {}  # request_id -> [first step, last step]
    lengths, groups, reasons = {}, {}, {}
    for t in trace:
        for rid in (*t.waiting, *t.running, *t.preempted):
            seen.setdefault(rid, [t.step, t.step])[1] = t.step
        lengths |= t.num_prompt_tokens
        groups |= t.groups
        reasons |= t.finish_reasons
    return {
        rid: _request(
            rid, groups.get(rid, rid), seen.get(rid), lengths.get(rid), reasons.get(rid), prompts, texts, tokenizer
        )  # fmt: skip
        for rid in {**dict.fromkeys(p for p in prompts if p not in groups.values()), **seen}
    }


def _request(rid, group, steps, length, reason, prompts, texts, tokenizer) -> dict:
    prompt = prompts.get(rid, prompts.get(group))
    if length is None and prompt is not None:
        length = len(prompt) if not isinstance(prompt, str) else len(tokenizer.encode(prompt)) if tokenizer else None
    return {
        "group": group,
        "prompt": prompt if isinstance(prompt, str) else None,
        "num_prompt_tokens": length,
        "text": texts.get(rid),
        "first_step": steps[0] if steps else None,
        "last_step": steps[1] if steps else None,
        "finish_reason": reason,
    }


# --- reading back ------------------------------------------------------------------------------------


def dumps(trace: dict) -> str:
    """Compact JSON (no spaces): what save writes and what the size bound counts."""
    return json.dumps(trace, separators=(",", ":"), ensure_ascii=False)


def save(trace: dict, path) -> Path:
    validate(trace)
    path = Path(path)
    path.write_text(dumps(trace), encoding="utf-8")
    return path


TRACE_LIMIT = 1 << 30  # bytes: a trace of 10,000 steps of 64 requests is a few hundred MiB


def load(path) -> dict:
    return from_json(read_json_file(path, "trace", TRACE_LIMIT))


def from_json(text_or_dict) -> dict:
    """A trace from JSON text (or an already parsed dict), validated; a ValueError names the first bad field."""
    trace = json.loads(text_or_dict) if isinstance(text_or_dict, (str, bytes)) else text_or_dict
    validate(trace)
    return trace


# --- the schema, checked by hand (no dependency) -----------------------------------------------------

INT, NUM, STR, BOOL, NONE = (int,), (int, float), (str,), (bool,), (type(None),)
TOP_FIELDS = {"version": INT, "stage": INT, "stage_name": STR, "config": (dict,), "requests": (dict,),
              "hashes": (list,), "steps": (list,)}  # fmt: skip
CONFIG_TYPES = {"block_size": INT, "num_kv_blocks": INT, "max_num_seqs": INT, "max_num_batched_tokens": INT,
                "max_model_len": INT, "long_prefill_token_threshold": INT, "enable_prefix_caching": BOOL,
                "preemption_mode": STR, "num_swap_blocks": INT, "scheduling_policy": STR}  # fmt: skip
REQUEST_TYPES = {"group": STR, "prompt": STR + NONE, "num_prompt_tokens": INT + NONE, "text": STR + NONE,
                 "first_step": INT + NONE, "last_step": INT + NONE, "finish_reason": STR + NONE}  # fmt: skip
MAP_VALUES = {"scheduled": INT, "finished": STR + NONE, "tables": (list,), "used": INT, "groups": STR}
EVENT_TYPES = {"kind": STR, "request": STR + NONE, "blocks": (list,), "text": STR}


def validate(trace) -> None:
    """Raise ValueError naming the first field that breaks the format (see the module docstring)."""
    _expect(trace, (dict,), "trace")
    for key, kinds in TOP_FIELDS.items():
        _get(trace, key, kinds, "")
    if trace["version"] != TRACE_VERSION:
        raise ValueError(f"version: expected {TRACE_VERSION}, got {trace['version']!r}")
    config = trace["config"]
    for key, kinds in CONFIG_TYPES.items():
        _get(config, key, kinds, "config")
    if config["block_size"] < 1 or config["num_kv_blocks"] < 1:
        raise ValueError("config: block_size and num_kv_blocks must be >= 1")
    _expect(config.get("sliding_window", 0), INT, "config.sliding_window")  # absent in older traces: no window
    windows = _get(config, "layer_windows", (list,), "config") if "layer_windows" in config else []
    for i, w in enumerate(windows):
        _expect(w, INT + NONE, f"config.layer_windows[{i}]")
        if w is not None and w < 1:
            raise ValueError(f"config.layer_windows[{i}]: a window is >= 1 token, got {w}")
    if "kv_cache_groups" in config:  # the labels must be the groups of layer_windows, in their order
        expected = group_labels(windows) if trace_groups(config) > 1 else None
        if config["kv_cache_groups"] != expected:
            want = "none: the layers are all alike" if expected is None else f"{expected}, from config.layer_windows"
            raise ValueError(f"config.kv_cache_groups: expected {want}, got {config['kv_cache_groups']!r:.80}")
    for rid, request in trace["requests"].items():
        _expect(request, (dict,), f"requests[{rid!r}]")
        for key, kinds in REQUEST_TYPES.items():
            _get(request, key, kinds, f"requests[{rid!r}]")
    for i, name in enumerate(trace["hashes"]):
        _expect(name, STR, f"hashes[{i}]")
    for i, step in enumerate(trace["steps"]):
        _check_step(step, f"steps[{i}]", trace)
    _expect(trace.get("recording"), (dict,) + NONE, "recording")


def _check_step(step, where: str, trace: dict) -> None:
    _expect(step, (dict,), where)
    _get(step, "step", INT, where), _get(step, "time", NUM, where), _get(step, "num_used_blocks", INT, where)
    known, num_blocks = trace["requests"], trace["config"]["num_kv_blocks"]
    for name in STEP_LISTS:
        for j, rid in enumerate(_get(step, name, (list,), where)):
            _request_id(rid, known, f"{where}.{name}[{j}]")
    for name, kinds in (MAP_VALUES | {"num_cached_tokens": INT} if "num_cached_tokens" in step else MAP_VALUES).items():
        for rid, value in _get(step, name, (dict,), where).items():
            _request_id(rid, known, f"{where}.{name}")
            _expect(value, kinds, f"{where}.{name}[{rid!r}]")
    num_groups = trace_groups(trace["config"])
    for rid, table in step["tables"].items():
        if num_groups == 1:
            _blocks(table, num_blocks, f"{where}.tables[{rid!r}]")
            continue
        if len(table) != num_groups:  # a hybrid model's: one table per KV cache group
            raise ValueError(f"{where}.tables[{rid!r}]: expected {num_groups} tables (one per group), got {len(table)}")
        for g, group_table in enumerate(table):
            _blocks(group_table, num_blocks, f"{where}.tables[{rid!r}][{g}]")
    for j, copy in enumerate(_get(step, "copies", (list,), where)):
        _pair(copy, (STR, INT, INT), f"{where}.copies[{j}]")
        _blocks(copy[1:], num_blocks, f"{where}.copies[{j}]")
    num_cpu = trace["config"]["num_swap_blocks"]
    for name, (gpu, cpu) in {"swap_out": (0, 1), "swap_in": (1, 0)}.items():
        for j, pair in enumerate(_get(step, name, (list,), where)):
            _pair(pair, (INT, INT), f"{where}.{name}[{j}]")
            _blocks([pair[gpu]], num_blocks, f"{where}.{name}[{j}]")
            _blocks([pair[cpu]], num_cpu, f"{where}.{name}[{j}]", pool="CPU pool")
    pool = _get(step, "pool", (dict,) + NONE, where)
    if pool is not None:
        null = 0 if trace["config"].get("sliding_window") or num_groups > 1 else None
        _check_pool(pool, f"{where}.pool", num_blocks, len(trace["hashes"]), null)
    for j, event in enumerate(_get(step, "events", (list,), where)):
        _check_event(event, f"{where}.events[{j}]", num_blocks)


def trace_groups(config: dict) -> int:
    """How many block tables each request has: one, or a hybrid model's KV cache groups (kv/cache_groups.py)."""
    windows = config.get("layer_windows") or []
    return len(kv_cache_groups(windows)) if len(set(windows)) > 1 else 1


def _check_pool(pool: dict, where: str, num_blocks: int, num_hashes: int, null: int | None) -> None:
    """`null`: the null block's id (a sliding window's), or None; it is never free and never held."""
    free, ref = _get(pool, "free", (list,), where), _get(pool, "ref", (list,), where)
    hashes = _get(pool, "hash", (list,), where)
    _blocks(free, num_blocks, f"{where}.free")
    for name, values in (("ref", ref), ("hash", hashes)):
        if len(values) != num_blocks:
            raise ValueError(f"{where}.{name}: expected {num_blocks} entries (one per block), got {len(values)}")
    for b, (count, name) in enumerate(zip(ref, hashes)):
        _expect(count, INT, f"{where}.ref[{b}]")
        _expect(name, INT + NONE, f"{where}.hash[{b}]")
        if name is not None and not 0 <= name < num_hashes:
            raise ValueError(f"{where}.hash[{b}]: {name} is not an index into hashes (0..{num_hashes - 1})")
    if null is not None and ref[null] != 0:
        raise ValueError(f"{where}.ref[{null}]: the null block is nobody's, got ref {ref[null]}")
    if sorted(free) != [b for b, count in enumerate(ref) if count == 0 and b != null]:
        raise ValueError(f"{where}.free: must hold exactly the blocks with ref 0 (but the null block), once each")


def _check_event(event, where: str, num_blocks: int) -> None:
    _expect(event, (dict,), where)
    for key, kinds in EVENT_TYPES.items():
        _get(event, key, kinds, where)
    if event["kind"] not in TRACE_EVENT_KINDS:
        raise ValueError(f"{where}.kind: {event['kind']!r} is not one of {', '.join(TRACE_EVENT_KINDS)}")
    _blocks(event["blocks"], num_blocks, f"{where}.blocks")


def _get(obj: dict, key: str, kinds: tuple, where: str):
    path = f"{where}.{key}" if where else key
    if key not in obj:
        raise ValueError(f"{path}: missing")
    _expect(obj[key], kinds, path)
    return obj[key]


def _expect(value, kinds: tuple, path: str) -> None:
    """isinstance, except that a bool is no int (JSON tells true from 1)."""
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ValueError(f"{path}: expected {names}, got {type(value).__name__} {value!r:.40}")


def _pair(value, kinds: tuple, path: str) -> None:
    _expect(value, (list,), path)
    if len(value) != len(kinds):
        raise ValueError(f"{path}: expected {len(kinds)} entries, got {len(value)}")
    for j, (item, k) in enumerate(zip(value, kinds)):
        _expect(item, k, f"{path}[{j}]")


def _blocks(block_ids, num_blocks: int, path: str, pool: str = "pool") -> None:
    _expect(block_ids, (list,), path)
    for j, b in enumerate(block_ids):
        _expect(b, INT, f"{path}[{j}]")
        if not 0 <= b < num_blocks:
            raise ValueError(f"{path}[{j}]: block id {b} outside the {pool} (0..{num_blocks - 1})")


def _request_id(rid, known: dict, path: str) -> None:
    _expect(rid, STR, path)
    if rid not in known:
        raise ValueError(f"{path}: request {rid!r} is not in requests")
